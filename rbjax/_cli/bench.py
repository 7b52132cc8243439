"""``rbjax bench [MODEL]``: how fast rbjax integrates a model on this machine.

For each batch size B (``--batch``), B copies of the model start from random joint positions
and velocities (uniform, ±0.3 rad or m and ±0.5 rad/s or m/s about the initial state; seeded)
and are integrated together by one :func:`rbjax.rollout` of ``--steps`` steps. Reported per
configuration: the compile time (the first call minus the median warm call; it includes the
rollout's input checks and one run) and the run time (median of ``--repeats`` warm calls),
with steps/s = B × steps / run time (system-steps) and body-steps/s = steps/s × bodies.

An MJCF or URDF MODEL is measured in the coordinates the other commands choose
(``--coordinates``; joint coordinates for a tree: an rbjax.JointModel whose state is MuJoCo's
qpos/qvel, drawn the same way); ``--integrator implicitfast`` for joint coordinates only.
With an MJCF or URDF MODEL and the mujoco package installed, MuJoCo C integrates the same
initial states with the same step as a peer in the same run: its RK4 integrator, one thread
(``mujoco.rollout`` with one MjData), contacts and joint limits disabled because rbjax does
not simulate them; ``--no-mujoco`` skips it. MuJoCo integrates joint coordinates in float64
whatever ``--dtype`` says; its body-steps count rbjax's bodies of the same model.

Without MODEL the benchmark runs a model built in code, so that it works on an installed
package without the repository's example files (and without MuJoCo): ``--links`` N rods of
1 kg and 1 m hinged end to end about world y, the N-link pendulum of
benchmarks/mechanisms.py (N = 2 is its double pendulum), dt = 1e-3. It has no MJCF twin, so
no MuJoCo peer. A model file (.toml) without joint coordinates to perturb (loops, scalable
bodies, ball or free joints) starts every copy from the file's initial state.

The header names the device (``jax.devices()[0]``), the versions of rbjax, JAX, MuJoCo,
NumPy and Python, and the machine (platform, CPU, CPU count); numbers from different
machines are not comparable, ratios measured in one run are. ``--json FILE`` writes
``{"header": {...}, "rows": [...]}`` with one row per engine and batch size, rewritten after
every row so that a run cut short keeps what it measured. Exit code 1 when a configuration
failed (the row records the error and the others still run).
"""

from __future__ import annotations

import argparse
import copy
import importlib
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import __version__
from .._analysis.joint_space import JointSpace
from .._body import Body
from .._constraints import GROUND
from .._io.mujoco import _mujoco
from .._joints import Revolute
from .._model import Model, require_model
from .._rollout import _available_memory, rollout
from .._state import State, make_state
from .._tree.model import JointModel, JointState
from .arguments import MAX_COUNT, duration, integer, large, real, seed
from .common import (
    ALL_INTEGRATORS,
    JOINT_INTEGRATORS,
    MAXIMAL_INTEGRATORS,
    CliError,
    add_coordinates,
    add_meshes,
    add_progress,
    load_model,
    show_progress,
    writable,
    writing,
)

DTYPES = {"float64": jnp.float64, "float32": jnp.float32}
DEFAULT_DT = 1e-3
QPOS_SPREAD, QVEL_SPREAD = 0.3, 0.5  # uniform ± about the initial state [rad or m, per s]
MUJOCO_OUTPUT_BYTES = 64 * 2**20  # mujoco.rollout's state output per call (chunks of the batch)
MAX_STEPS = 10**9  # system-steps of all rollouts of one run, unless --max-steps says otherwise
RATES = (1e4, 1e6)  # steps/s of rbjax: one system on a CPU core to a large batch on a GPU
STATE_PEAK = 40  # peak host memory / bytes of the batch's states (q, u): see _sized

COLUMNS = (
    "engine",
    "model",
    "integrator",
    "dtype",
    "B",
    "compile s",
    "run s",
    "steps/s",
    "body-steps/s",
)


# --------------------------------------------------------------------------- what is measured
@dataclass
class Case:
    """A model to measure: its ``name``, rbjax ``model`` and initial ``state`` (in ``dtype``),
    step ``dt`` [s], the :class:`~rbjax.advanced.MujocoSource` of an MJCF/URDF model, and how
    random initial states are drawn around ``state`` (:func:`initial_states`): MuJoCo's
    coordinates (``source``), the chain's angles (``links``), the joint coordinates of a model
    file (``joints``: a float64 JointSpace whose coordinates are all angles or displacements),
    or none of these: copies of ``state``."""

    name: str
    model: Any
    state: State | JointState
    dt: float
    dtype: Any
    source: Any = None
    links: int | None = None
    joints: JointSpace | None = None
    mjmodel: Any = None  # the compiled MjModel of an MJCF/URDF file (either coordinates)

    @property
    def tree(self) -> bool:
        """Joint coordinates (an rbjax.JointModel, MuJoCo's qpos/qvel as the state)."""
        return isinstance(self.model, JointModel)

    @property
    def bodies(self) -> int:
        return int(self.model.nb)


def chain(n_links: int):
    """The built-in model: ``n_links`` rods of 1 kg, 1 m along x, hinged end to end about
    world y (the first at the origin), gravity −z; released horizontal at rest."""
    rod_inertia = np.diag([1e-3, 1.0 / 12.0, 1.0 / 12.0])
    q0 = np.array([[k + 0.5, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0] for k in range(n_links)])
    bodies = [Body(1.0, rod_inertia, name=f"rod{k + 1}") for k in range(n_links)]
    joints = [
        Revolute.at(q0, k - 1 if k else GROUND, k, point=[k, 0, 0], axis=[0, 1, 0])
        for k in range(n_links)
    ]
    model = Model(bodies, joints=joints, gravity=[0.0, 0.0, -9.81])
    rest = chain_state(np.zeros((1, n_links)), np.zeros((1, n_links)))
    return model, _single(rest)


def chain_state(angles, rates) -> State:
    """States of the built-in chain from its hinge angles and rates (B, N) [rad, rad/s]: the
    absolute angle about y of rod k is φ_k = θ_1 + … + θ_k, its axis d_k = (cos φ_k, 0,
    −sin φ_k), its centre the joint point plus d_k / 2; velocities by ω × d along the chain."""
    phi, w = np.cumsum(angles, axis=1), np.cumsum(rates, axis=1)
    d = np.stack([np.cos(phi), np.zeros_like(phi), -np.sin(phi)], axis=-1)  # (B, N, 3)
    wxd = w[..., None] * np.stack([d[..., 2], np.zeros_like(phi), -d[..., 0]], axis=-1)
    joint_pos = np.cumsum(d, axis=1) - d  # Σ_{j<k} d_j
    joint_vel = np.cumsum(wxd, axis=1) - wxd
    quat = np.stack([np.cos(phi / 2), np.zeros_like(phi), np.sin(phi / 2), np.zeros_like(phi)], -1)
    omega = np.stack([np.zeros_like(w), w, np.zeros_like(w)], axis=-1)  # body frame = world y
    return make_state(
        position=joint_pos + 0.5 * d,
        quaternion=quat,
        velocity=joint_vel + 0.5 * wxd,
        omega_body=omega,
    )


def cast(tree, dtype):
    """Every floating array leaf of ``tree`` (a Model or State) in ``dtype``."""

    def leaf(x):
        if eqx.is_array(x) and jnp.issubdtype(x.dtype, jnp.floating):
            return jnp.asarray(x, dtype)
        return x

    return jax.tree.map(leaf, tree)


def prepare(
    path: str | None,
    *,
    links: int = 2,
    dtype: str = "float64",
    dt=None,
    meshes: bool = True,
    coordinates: str | None = None,
) -> Case:
    """The :class:`Case` of a model file (MJCF, URDF, .toml) or, for ``path`` None, the
    built-in chain of ``links`` rods. ``dt`` overrides the file's timestep (default: the
    file's, else 1e-3); ``meshes=False`` loads an MJCF/URDF without its mesh geoms."""
    source, joints, mjmodel = None, None, None
    if path is None:
        name = f"chain{links} (built in)"
        model, state = chain(links)
        step = DEFAULT_DT
    else:
        name = os.path.basename(path)
        loaded = load_model(path, meshes=meshes, coordinates=coordinates)
        model, state, step, source = loaded.model, loaded.state, loaded.timestep, loaded.source
        mjmodel = loaded.mjmodel
        if state is None:
            raise CliError(
                f"MODEL {path!r} has no initial state. Fix: add an [initial] table to the "
                "model file (docs: 'Write a model file')."
            )
        if mjmodel is None:  # a model file: its joint coordinates, if all are scalar
            try:
                js = JointSpace(require_model(model))
            except ValueError:  # scalable bodies: no joint coordinates
                js = None
            kinds = {kind for _, kind, _, _ in js.coordinates} if js is not None else set()
            if js is not None and not js.loops and kinds <= {"revolute", "prismatic"}:
                joints = js
    step = float(dt if dt is not None else (step or DEFAULT_DT))
    target = DTYPES[dtype]
    return Case(
        name,
        cast(model, target),
        cast(state, target),
        step,
        target,
        source=source,
        links=links if path is None else None,
        joints=joints,
        mjmodel=mjmodel,
    )


def _single(state: State) -> State:
    """The first system of ``state``, without batch axes: t (), q and u (nb, 7)."""
    lead = jnp.ndim(state.q) - 2
    return jax.tree.map(lambda x: jnp.reshape(x, (-1,) + jnp.shape(x)[lead:])[0], state)


@eqx.filter_jit
def _joint_states(js: JointSpace, one: State, d_pos, qvel):
    """States at the joint positions of ``one`` plus ``d_pos`` (B, nq), velocities ``qvel``."""
    return jax.vmap(js.state)(js.positions(one) + d_pos, qvel)


def initial_states(case: Case, batch: int, rng: np.random.Generator):
    """``batch`` random initial states: the rbjax :class:`State` (leading axis ``batch``, in
    the case's dtype) and, for a MuJoCo model, MuJoCo's (qpos (B, nq), qvel (B, nv))."""
    if case.mjmodel is not None:
        m = case.mjmodel
        qpos = m.qpos0 + rng.uniform(-QPOS_SPREAD, QPOS_SPREAD, (batch, m.nq))
        for j in range(m.njnt):
            a, kind = int(m.jnt_qposadr[j]), int(m.jnt_type[j])
            if kind in (0, 1):  # free, ball: unit quaternions
                o = a + 3 if kind == 0 else a
                qpos[:, o : o + 4] /= np.linalg.norm(qpos[:, o : o + 4], axis=1, keepdims=True)
        qvel = rng.uniform(-QVEL_SPREAD, QVEL_SPREAD, (batch, m.nv))
        if case.tree:  # joint coordinates: the state is MuJoCo's
            return cast(JointState(jnp.zeros(batch), qpos, qvel), case.dtype), (qpos, qvel)
        st = [case.source.state(q, v) for q, v in zip(qpos, qvel, strict=True)]
        state = State(
            t=jnp.zeros(batch),
            q=jnp.stack([s.q for s in st]),
            u=jnp.stack([s.u for s in st]),
        )
        return cast(state, case.dtype), (qpos, qvel)
    if case.links is not None:
        shape = (batch, case.links)
        angles = rng.uniform(-QPOS_SPREAD, QPOS_SPREAD, shape)
        state = chain_state(angles, rng.uniform(-QVEL_SPREAD, QVEL_SPREAD, shape))
        return cast(state, case.dtype), None
    one = _single(case.state)  # pyright: ignore[reportArgumentType]  (a model file: State)
    if case.joints is not None:
        js = case.joints
        d_pos = rng.uniform(-QPOS_SPREAD, QPOS_SPREAD, (batch, js.nq))
        qvel = rng.uniform(-QVEL_SPREAD, QVEL_SPREAD, (batch, js.nv))
        state = _joint_states(js, cast(one, jnp.float64), jnp.asarray(d_pos), jnp.asarray(qvel))
        return cast(state, case.dtype), None
    state = jax.tree.map(lambda x: jnp.broadcast_to(x, (batch,) + x.shape), one)
    return state, None


def _nothing():
    pass


def time_rollout(
    case: Case,
    state: State | JointState,
    steps: int,
    repeats: int,
    integrator,
    batch_chunk=None,
    tick=_nothing,
):
    """(compile s, median run s, every run s) of ``rollout`` of ``state``: compile time is the
    first call minus the median of ``repeats`` warm calls; ``tick()`` after every call."""

    def call():
        traj = rollout(
            case.model,
            state,
            case.dt,
            steps,
            integrator=integrator,
            save_every=steps,
            batch_chunk=batch_chunk,
        )
        jax.block_until_ready(traj)

    t0 = time.perf_counter()
    call()
    first = time.perf_counter() - t0
    tick()
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        runs.append(time.perf_counter() - t0)
        tick()
    run = statistics.median(runs)
    return max(first - run, 0.0), run, runs


def mujoco_peer(case: Case):
    """A copy of the case's MjModel set up as rbjax's peer: RK4, the case's step, contacts and
    joint limits disabled (rbjax does not simulate them)."""
    mujoco = _mujoco()
    m = copy.copy(case.mjmodel)
    m.opt.integrator = mujoco.mjtIntegrator.mjINT_RK4
    m.opt.timestep = case.dt
    m.opt.disableflags |= int(mujoco.mjtDisableBit.mjDSBL_CONTACT) | int(
        mujoco.mjtDisableBit.mjDSBL_LIMIT
    )
    return m


def time_mujoco(m, qpos, qvel, steps: int, repeats: int, tick=_nothing):
    """(median run s, every run s) of MuJoCo C stepping every (qpos, qvel) ``steps`` times with
    ``mujoco.rollout`` on one thread (one MjData), controls 0; the batch goes in pieces whose
    state output stays under 64 MB; ``tick()`` after every run."""
    mujoco = _mujoco()
    mj_rollout = importlib.import_module("mujoco.rollout")
    d = mujoco.MjData(m)
    spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
    size = mujoco.mj_stateSize(m, spec)
    init = np.empty((len(qpos), size))
    for i, (q, v) in enumerate(zip(qpos, qvel, strict=True)):
        d.qpos[:], d.qvel[:] = q, v
        mujoco.mj_getState(m, d, init[i], spec)
    piece = max(1, min(len(qpos), MUJOCO_OUTPUT_BYTES // (8 * size * steps)))
    out = np.empty((piece, steps, size))
    control = np.zeros((piece, 1, m.nu))
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for s in range(0, len(qpos), piece):
            n = min(piece, len(qpos) - s)
            mj_rollout.rollout(m, d, init[s : s + n], control[:n], nstep=steps, state=out[:n])
        runs.append(time.perf_counter() - t0)
        tick()
    return statistics.median(runs), runs


def _row(case, engine, integrator, dtype, batch, steps, repeats, compile_s, run_s, runs):
    """One JSON row; steps/s = batch × steps / run_s (None when the run failed)."""
    sps = None if run_s is None else batch * steps / run_s
    return {
        "engine": engine,
        "model": case.name,
        "integrator": integrator,
        "dtype": dtype,
        "batch": batch,
        "steps": steps,
        "dt": case.dt,
        "bodies": case.bodies,
        "repeats": repeats,
        "compile_s": compile_s,
        "run_s": run_s,
        "runs_s": runs,
        "steps_per_s": sps,
        "body_steps_per_s": None if sps is None else sps * case.bodies,
    }


def measure(
    case: Case,
    batches,
    *,
    steps: int,
    repeats: int,
    integrator: str = "rk4",
    mujoco: bool = True,
    mujoco_max_batch: int | None = None,
    batch_chunk: int | None = None,
    seed: int = 0,
    on_row=None,
    progress: bool = False,
) -> list[dict]:
    """Measure ``case`` at every batch size: one rbjax row per B and, when ``mujoco`` and the
    case came from MJCF/URDF (and B ≤ ``mujoco_max_batch``), one MuJoCo C row on the same
    initial states. ``on_row(row)`` is called after each row. A failed rbjax rollout gives a
    row with ``error`` (its message) instead of times."""
    rng = np.random.default_rng(seed)
    peer = mujoco_peer(case) if mujoco and case.mjmodel is not None else None
    dtype = jnp.dtype(case.dtype).name
    integ = ALL_INTEGRATORS[integrator]()
    label = type(integ).__name__
    peer_batches = (
        []
        if peer is None
        else [b for b in batches if mujoco_max_batch is None or b <= mujoco_max_batch]
    )
    bar = _Bar(len(batches) * (1 + repeats) + len(peer_batches) * repeats, progress)
    rows = []

    def done(row):
        rows.append(row)
        if on_row is not None:
            on_row(row)

    try:
        for batch in batches:
            state, mj_states = initial_states(case, batch, rng)
            bar.stage(f"rbjax B={batch}")
            try:
                compile_s, run_s, runs = time_rollout(
                    case, state, steps, repeats, integ, batch_chunk, bar.tick
                )
                row = _row(
                    case, "rbjax", label, dtype, batch, steps, repeats, compile_s, run_s, runs
                )
            except Exception as exc:  # noqa: BLE001 -- recorded; the other rows still run
                row = _row(case, "rbjax", label, dtype, batch, steps, repeats, None, None, [])
                row["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
            row["batch_chunk"] = batch_chunk
            done(row)
            if batch in peer_batches and mj_states is not None:
                bar.stage(f"MuJoCo C B={batch}")
                run_s, runs = time_mujoco(peer, *mj_states, steps, repeats, bar.tick)
                row = _row(
                    case, "mujoco-c", "RK4", "float64", batch, steps, repeats, None, run_s, runs
                )
                row["threads"] = 1
                done(row)
    finally:
        bar.close()
    return rows


class _Bar:
    """A tqdm bar (on stderr) counting rollout calls, or nothing when ``on`` is false."""

    def __init__(self, total: int, on: bool):
        self.bar = None
        if on:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, unit="call", desc="bench", leave=False)

    def stage(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_description(text)

    def tick(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# --------------------------------------------------------------------------- the header
def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def header() -> dict:
    """Versions, device and machine of this run."""
    device = jax.devices()[0]
    try:
        import mujoco

        mujoco_version = mujoco.__version__
    except ImportError:
        mujoco_version = None
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count()
    return {
        "rbjax": __version__,
        "jax": jax.__version__,
        "jaxlib": _jaxlib_version(),
        "mujoco": mujoco_version,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "device": f"{device.platform}: {device.device_kind}",
        "devices": jax.device_count(),
        "backend": jax.default_backend(),
        "platform": platform.platform(),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
    }


def _jaxlib_version():
    try:
        return importlib.metadata.version("jaxlib")
    except importlib.metadata.PackageNotFoundError:
        return None


def header_lines(h: dict) -> list[str]:
    return [
        f"device: {h['device']} ({h['devices']} device(s), backend {h['backend']})",
        f"machine: {h['cpu']}, {h['cpu_count']} CPUs ({h['cpus_usable']} usable), {h['platform']}",
        f"versions: rbjax {h['rbjax']}, JAX {h['jax']}, MuJoCo {h['mujoco'] or '(not installed)'}, "
        f"NumPy {h['numpy']}, Python {h['python']}",
    ]


# --------------------------------------------------------------------------- the table
def table_head() -> str:
    return "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS)


def table_line(row: dict) -> str:
    if "error" in row:
        cells = ["failed: " + row["error"]] + ["–"] * 4
    else:
        comp = "–" if row["compile_s"] is None else f"{row['compile_s']:.1f}"
        cells = [
            comp,
            f"{row['run_s']:.3g}",
            f"{row['steps_per_s']:.3g}",
            f"{row['body_steps_per_s']:.3g}",
        ]
    engine = row["engine"] + (" (1 thread)" if row["engine"] == "mujoco-c" else "")
    head = [engine, row["model"], row["integrator"], row["dtype"], str(row["batch"])]
    return "| " + " | ".join(head + cells) + " |"


def ratio_line(rows: list[dict]) -> str | None:
    """rbjax steps/s over MuJoCo C's at each batch size measured by both, or None."""
    ours = {r["batch"]: r for r in rows if r["engine"] == "rbjax" and "error" not in r}
    theirs = {r["batch"]: r for r in rows if r["engine"] == "mujoco-c"}
    both = [b for b in ours if b in theirs]
    if not both:
        return None
    parts = [f"B = {b}: {ours[b]['steps_per_s'] / theirs[b]['steps_per_s']:.2g}×" for b in both]
    return "rbjax steps/s / MuJoCo C steps/s: " + ", ".join(parts)


# --------------------------------------------------------------------------- command line
def _batches(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        values = []
    if not values or any(not 1 <= v <= MAX_COUNT for v in values):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of batch sizes from 1 to 10^12. Fix: e.g. "
            "--batch 1,64,1024."
        )
    return list(dict.fromkeys(values))


def _positive(option: str, example: str, maximum: int = MAX_COUNT):
    return integer(option, example, maximum=maximum)


def _sized(case: Case, batches, steps: int, repeats: int, max_steps: int) -> None:
    """Refuse, before any state is built, a run of more than ``max_steps`` system-steps
    (with the time it would take) or a batch whose states cannot fit in the host memory
    available now: the peak was measured at 33x the bytes of q and u (B = 10^6 chains of 2
    links, float64, 10 steps, 7.5 GB over the 0.5 GB of a run with B = 1: the random angles,
    the states, the rollout's RK4 stages and copies) and is taken as :data:`STATE_PEAK` x."""
    total = sum(batches) * steps * (1 + repeats)
    if total > max_steps:
        slow, fast = (duration(total / rate) for rate in RATES)
        raise CliError(
            f"--batch {','.join(map(str, batches))} x --steps {steps} x (1 + --repeats "
            f"{repeats}) is {large(total)} system-steps, more than the {large(max_steps)} of "
            f"--max-steps: at {large(RATES[0])} to {large(RATES[1])} steps/s it would run {fast} to "
            f"{slow}. Fix: fewer --steps or --repeats, smaller --batch sizes, or raise "
            "--max-steps if you mean it."
        )
    state = max(batches) * case.bodies * 14 * jnp.dtype(case.dtype).itemsize
    available = _available_memory(host=True)
    if available is not None and STATE_PEAK * state > available:
        raise CliError(
            f"--batch {max(batches)} of {case.bodies} bodies takes about "
            f"{STATE_PEAK * state / 2**30:.3g} GiB at its peak ({STATE_PEAK} x the "
            f"{state / 2**30:.3g} GiB of its states), more than the {available / 2**30:.3g} GiB "
            "of memory available now. Fix: smaller --batch sizes."
        )


def add_parser(sub):
    p = sub.add_parser(
        "bench",
        help="measure rbjax's compile time and throughput on a model (and MuJoCo C's)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "model",
        metavar="MODEL",
        nargs="?",
        default=None,
        help="MJCF (.xml), URDF (.urdf) or rbjax model file (.toml); default: the built-in "
        "chain of --links rods",
    )
    p.add_argument(
        "--batch",
        type=_batches,
        default=[1, 64, 1024],
        metavar="B1,B2,...",
        help="batch sizes (default 1,64,1024)",
    )
    p.add_argument(
        "--steps",
        type=_positive("--steps", "1000"),
        default=1000,
        help="steps per rollout (default 1000)",
    )
    p.add_argument(
        "--repeats",
        type=_positive("--repeats", "3", maximum=1000),
        default=3,
        metavar="R",
        help="warm runs per configuration; the median is reported (default 3)",
    )
    p.add_argument("--dtype", choices=tuple(DTYPES), default="float64", help="default float64")
    p.add_argument(
        "--integrator",
        choices=[k for k in ALL_INTEGRATORS if k != "projected-rk4"],  # the peer runs RK4
        default="rk4",
        help="default rk4",
    )
    p.add_argument(
        "--dt",
        type=real("--dt", "a positive number of seconds", "1e-3", positive=True),
        default=None,
        help="step [s] (default: the file's timestep, else 1e-3)",
    )
    p.add_argument(
        "--links",
        type=_positive("--links", "4", maximum=1000),
        default=None,
        metavar="N",
        help="without MODEL: rods in the built-in chain (default 2)",
    )
    p.add_argument(
        "--batch-chunk",
        type=integer("--batch-chunk", "64", minimum=0),
        default=None,
        metavar="N",
        help="rollout's batch_chunk (default: rollout's own choice; 0 disables chunking)",
    )
    p.add_argument(
        "--no-mujoco",
        dest="mujoco",
        action="store_false",
        help="skip the MuJoCo C peer of an MJCF/URDF model",
    )
    p.add_argument(
        "--seed", type=seed(), default=0, help="seed of the random initial states (default 0)"
    )
    p.add_argument("--json", default=None, metavar="FILE", help="write the rows as JSON to FILE")
    p.add_argument(
        "--max-steps",
        type=integer("--max-steps", "10000000000"),
        default=MAX_STEPS,
        metavar="N",
        help="refuse runs of more than N system-steps in all (default 10^9)",
    )
    add_coordinates(p)
    add_meshes(p)
    add_progress(p)
    p.set_defaults(run=run)


def json_path(path: str | None) -> str | None:
    """``--json`` checked before any work: a file that can be written (common.writable)."""
    return None if path is None else writable(path, "--json", "bench.json")


def write_json(path: str, head: dict, rows: list[dict]) -> None:
    with writing(path, "--json"), open(path, "w") as fh:
        json.dump({"header": head, "rows": rows}, fh, indent=1)


def run(args) -> int:
    out = json_path(args.json)  # the numbers are checked when parsed (rbjax/_cli/arguments.py)
    if args.model is not None and args.links is not None:
        raise CliError(
            "--links sets the size of the built-in chain and MODEL was given. Fix: drop --links "
            "or MODEL."
        )
    case = prepare(
        args.model,
        links=args.links or 2,
        dtype=args.dtype,
        dt=args.dt,
        meshes=args.meshes,
        coordinates=args.coordinates,
    )
    allowed = JOINT_INTEGRATORS if case.tree else MAXIMAL_INTEGRATORS
    if args.integrator not in allowed:
        other = "--coordinates maximal" if case.tree else "an MJCF/URDF tree in joint coordinates"
        raise CliError(
            f"--integrator {args.integrator} does not integrate "
            f"{'joint' if case.tree else 'maximal'} coordinates (those that do: "
            f"{', '.join(k for k in allowed if k != 'projected-rk4')}). Fix: choose one of "
            f"them, or {other}."
        )
    _sized(case, args.batch, args.steps, args.repeats, args.max_steps)
    head = header() | {
        "model": case.name,
        "bodies": case.bodies,
        "dt": case.dt,
        "steps": args.steps,
        "repeats": args.repeats,
        "integrator": args.integrator,
        "dtype": args.dtype,
        "seed": args.seed,
    }
    if case.tree:
        head["coordinates"] = "joint"
    if case.mjmodel is not None and not args.mujoco:
        head["mujoco_peer"] = "skipped (--no-mujoco)"
    elif case.mjmodel is not None:
        head["mujoco_peer"] = "RK4, 1 thread (mujoco.rollout), contacts and joint limits disabled"
    else:
        head["mujoco_peer"] = "none (not an MJCF/URDF model)"
    progress = show_progress(args.progress)
    for line in header_lines(head):
        print(line)
    print(
        f"model: {case.name}, {case.bodies} bodies, "
        f"{'joint' if case.tree else 'maximal'} coordinates, dt = {case.dt:g} s, {args.steps} steps, "
        f"median of {args.repeats}; MuJoCo peer: {head['mujoco_peer']}"
    )
    print()
    print(table_head(), flush=True)
    rows: list[dict] = []

    def on_row(row):
        rows.append(row)
        line = table_line(row)
        if progress:
            from tqdm.auto import tqdm

            tqdm.write(line)
        else:
            print(line, flush=True)
        if out is not None:
            write_json(out, head, rows)

    measure(
        case,
        args.batch,
        steps=args.steps,
        repeats=args.repeats,
        integrator=args.integrator,
        mujoco=args.mujoco,
        batch_chunk=args.batch_chunk,
        seed=args.seed,
        on_row=on_row,
        progress=progress,
    )
    print()
    if (ratio := ratio_line(rows)) is not None:
        print(ratio)
    print(
        "steps/s: systems × steps / median run time; body-steps/s: steps/s × bodies; compile s: "
        "first call − median run."
    )
    if out is not None:
        print(f"wrote {out}")
    failed = [r for r in rows if "error" in r]
    for r in failed:
        print(f"rbjax bench: B = {r['batch']} failed: {r['error']}", file=sys.stderr)
    return 1 if failed else 0
