"""Joint coordinates against MuJoCo C: the same MJCF/URDF files, the same step, one run.

For each model, B copies start from random joint positions and velocities (uniform, ±0.3 rad
or m and ±0.5 rad/s or m/s about qpos0, ball and free quaternions normalised; seeded, the same
states for every engine) and are integrated ``steps`` RK4 steps of the file's timestep (1e-3
when it has none; URDF: MuJoCo's default 2e-3), the same dt for every engine:

* rbjax, joint coordinates: ``rbjax.load(path, formulation=rbjax.JointCoordinates())`` and
  one ``rbjax.rollout`` of the batch (a ``JointState`` with leading axis B; B = 1: one
  unbatched system), ``save_every=steps`` (B = 1: steps / 10, for the check below);
* rbjax, maximal coordinates (today's default ``rbjax.load``), B ≤ 64 and only with
  ``--with-maximal [NAME ...]`` (it compiles slowly); a file it refuses is skipped with a
  note;
* MuJoCo C: RK4, contacts, joint limits, equalities and every other constraint disabled
  (rbjax's joint coordinates simulate none of them), tendon springs and the actuators that do
  not drive a hinge or slide zeroed (:func:`peer_model`), controls 0, ``mujoco.rollout`` on
  ONE thread and, for B > 1, on 2 threads (one MjData per thread).

Compile time = first call − median warm call; run time = median of ``--repeats`` warm calls,
the engines' warm calls interleaved (rbjax, MuJoCo 1 thread, MuJoCo 2 threads, rbjax, ...) so
that the load of a shared machine falls on all of them alike. Reported per row: µs per
system-step (run time / (B × steps)), system-steps/s, and the ratio rbjax µs / MuJoCo µs
(> 1: rbjax slower). The number of steps is ``--steps`` at the first batch size; at larger B
it is cut to a run of about ``--run-s`` seconds (estimated from the smaller B's slower engine,
at least 10 steps), so the full run stays within minutes; each row says its steps. At B = 1 the
states of rbjax and MuJoCo after steps / 10 and after all steps are compared (max |Δqpos|,
|Δqvel|, quaternions normalised; rbjax saves those two states there): a check that both
integrate the same equations. Expect round-off (1e-13) on hinge and slide trees; on ball and
free joints MuJoCo's RK4 integrates the quaternion on the manifold and rbjax the quaternion
ODE, two fourth-order schemes whose states differ by O(h⁴) (MJX's pendula at h = 0.02 s: 3e-5
rad/s after 20 steps, 16x less per halving of h); chaotic models amplify either over the full
horizon.

Gradient (``--grad-models``, B = 1): the loss ½|qpos_N|² + ½|qvel_N|² after ``steps`` steps;
its value alone (eval) against its gradient with respect to the initial qvel (rev,
``jax.value_and_grad``, rollout's default checkpointing), compile and run time of each and
rev/eval; the peer is MuJoCo C's central-difference gradient (2·nv rollouts of the same
length, one thread, ε = 1e-6), whose values check rbjax's.

Models: examples/models (double_pendulum, arm7, humanoid), tests/data (MJX's humanoid and
pendula), hinge chains of 16 and 64 capsule links (generated MJCF), and, when found under an
``--extra-dir`` (searched recursively, also inside .whl archives such as example-robot-data's),
MJX's test files and example-robot-data URDFs (ur10 and panda fixed; solo12, talos and g1 given
a free base; their mesh geoms dropped, masses from their <inertial>). Absent files are skipped.

    python benchmarks/joint_coordinates.py [--quick] [--with-maximal [NAME ...]] [--extra-dir DIR]
        [--models NAME ...] [--batches 1 64 1024] [--json PATH]

JSON: ``{"meta": {...}, "rows": [...], "gradients": [...], "skipped": [...]}``, rewritten
after every row.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
import zipfile

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import rbjax  # noqa: E402
from rbjax._cli import bench  # noqa: E402
from rbjax._io.mujoco import _compile, _mujoco  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
GRAD_EPS = 1e-6
MIN_STEPS = 10


# --------------------------------------------------------------------------- the models
def chain_xml(n: int) -> str:
    """``n`` capsule links of 0.3 m (radius 0.03 m, MuJoCo's default density), each hinged
    about y at its parent's tip, the first at the origin; contacts off, dt = 1e-3."""
    body = "".join(
        f'<body name="link{k}" pos="{0.0 if k == 0 else 0.3} 0 0">'
        f'<joint name="hinge{k}" type="hinge" axis="0 1 0"/>'
        '<geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.03"/>'
        for k in range(n)
    )
    return (
        f'<mujoco model="chain{n}"><option timestep="0.001"><flag contact="disable"/>'
        f"</option><worldbody>{body}{'</body>' * n}</worldbody></mujoco>"
    )


# name, repository path (or None), suffix searched under --extra-dir, free base (URDF)
MODELS = [
    ("double_pendulum", "examples/models/double_pendulum.xml", None, False),
    ("arm7", "examples/models/arm7.xml", None, False),
    ("humanoid", "examples/models/humanoid.xml", None, False),
    (
        "mjx_humanoid",
        "tests/data/mujoco_humanoid.xml",
        "mjx/test_data/humanoid/humanoid.xml",
        False,
    ),
    ("mjx_pendula", "tests/data/pendula.xml", "mjx/test_data/pendula.xml", False),
    ("four_bar", "examples/models/four_bar.xml", None, False),  # a loop: one connect
    ("chain16", "chain:16", None, False),
    ("chain64", "chain:64", None, False),
    ("ur10", None, "ur_description/urdf/ur10_robot.urdf", False),
    ("panda", None, "panda_description/urdf/panda.urdf", False),
    ("solo12", None, "solo_description/robots/solo12.urdf", True),
    ("go1", None, "go1_description/urdf/go1.urdf", True),
    ("talos", None, "talos_data/robots/talos_reduced.urdf", True),
    ("g1", None, "g1_description/urdf/g1_29dof_rev_1_0.urdf", True),
]


def find_extra(suffix: str, dirs: list[str], tmp: str) -> str | None:
    """The first file whose path ends with ``suffix`` under one of ``dirs`` (recursively),
    or inside a .whl (zip) archive there (extracted to ``tmp``)."""
    for top in dirs:
        for here, _, files in os.walk(top):
            for f in files:
                path = os.path.join(here, f)
                if path.replace(os.sep, "/").endswith("/" + suffix):
                    return path
                if f.endswith(".whl"):
                    with zipfile.ZipFile(path) as z:
                        for member in z.namelist():
                            if member.endswith("/" + suffix):
                                return z.extract(member, tmp)
    return None


def free_base_mjcf(urdf: str, tmp: str) -> str:
    """An MJCF of ``urdf`` with a free joint on its root body and its mesh geoms dropped (their
    files are ROS package:// URIs); refused (ValueError) when a body's mass comes from a mesh."""
    mujoco = _mujoco()
    spec = mujoco.MjSpec.from_file(urdf)
    dropped = [g for g in spec.geoms if g.type == mujoco.mjtGeom.mjGEOM_MESH]
    implicit = [g.parent.name for g in dropped if not g.parent.explicitinertial]
    if implicit:
        raise ValueError(f"bodies {implicit[:3]} take their inertia from mesh geoms")
    for item in dropped + list(spec.meshes):
        spec.delete(item)
    spec.worldbody.first_body().add_freejoint()
    spec.compile()  # the file's own errors (e.g. an inertia that is not positive definite)
    out = os.path.join(tmp, os.path.splitext(os.path.basename(urdf))[0] + "_free.xml")
    with open(out, "w") as fh:
        fh.write(spec.to_xml())
    return out


def resolve(name, repo_path, suffix, free, extra_dirs, tmp):
    """(path, meshes, how it was found) of a model, or (None, None, why not)."""
    if repo_path is not None and repo_path.startswith("chain:"):
        path = os.path.join(tmp, f"{name}.xml")
        with open(path, "w") as fh:
            fh.write(chain_xml(int(repo_path.split(":")[1])))
        return path, True, "generated"
    if repo_path is not None and os.path.isfile(os.path.join(ROOT, repo_path)):
        return os.path.normpath(os.path.join(ROOT, repo_path)), True, repo_path
    found = find_extra(suffix, extra_dirs, tmp) if suffix and extra_dirs else None
    if found is None:
        where = repo_path or f"*/{suffix} under --extra-dir"
        return None, None, f"not found ({where})"
    if free:
        return free_base_mjcf(found, tmp), True, f"{suffix}, free base, no meshes"
    return found, not found.endswith(".urdf"), suffix + (", no meshes" * found.endswith(".urdf"))


def peer_model(path: str, meshes: bool, dt: float):
    """MuJoCo's model of the file as rbjax compiles it, set up as the peer: RK4, step ``dt``,
    contacts, limits, equalities and all other constraints disabled; and, so that both engines
    integrate the same equations, the two passive forces rbjax's joint coordinates leave out
    set to zero: tendon springs and dampers, and the actuators that do not drive one hinge or
    slide joint (on a ball or free joint, a tendon, a site: rbjax.load reports them as not
    simulated; with controls 0 only their bias term acts)."""
    mujoco = _mujoco()
    m = copy.copy(_compile(mujoco, path, meshes))
    m.opt.integrator = mujoco.mjtIntegrator.mjINT_RK4
    m.opt.timestep = dt
    for flag in ("CONTACT", "LIMIT", "EQUALITY", "FRICTIONLOSS", "CONSTRAINT"):
        m.opt.disableflags |= int(getattr(mujoco.mjtDisableBit, f"mjDSBL_{flag}"))
    m.tendon_stiffness[:] = 0.0
    m.tendon_damping[:] = 0.0
    on_joint = int(mujoco.mjtTrn.mjTRN_JOINT)
    for a in range(m.nu):
        j = int(m.actuator_trnid[a, 0])
        if int(m.actuator_trntype[a]) != on_joint or int(m.jnt_type[j]) not in (2, 3):
            m.actuator_gainprm[a] = 0.0
            m.actuator_biasprm[a] = 0.0
    return m


def quaternion_slices(m) -> list[slice]:
    """qpos slices of the ball and free joints' quaternions."""
    out = []
    for j in range(m.njnt):
        a, kind = int(m.jnt_qposadr[j]), int(m.jnt_type[j])
        if kind in (0, 1):  # free, ball
            o = a + 3 if kind == 0 else a
            out.append(slice(o, o + 4))
    return out


def random_states(m, batch: int, rng: np.random.Generator):
    """(qpos (B, nq), qvel (B, nv)): qpos0 + U(±0.3), quaternions normalised; qvel U(±0.5)."""
    qpos = m.qpos0 + rng.uniform(-bench.QPOS_SPREAD, bench.QPOS_SPREAD, (batch, m.nq))
    for s in quaternion_slices(m):
        qpos[:, s] /= np.linalg.norm(qpos[:, s], axis=1, keepdims=True)
    return qpos, rng.uniform(-bench.QVEL_SPREAD, bench.QVEL_SPREAD, (batch, m.nv))


def load_notes(caught) -> list[str]:
    """The elements rbjax.load reported as not simulated, one short line each."""
    notes = []
    for w in caught:
        for line in str(w.message).splitlines()[1:]:
            line = line.strip().lstrip("- ")
            notes.append(line if len(line) < 110 else line[:107] + "...")
    return notes


# --------------------------------------------------------------------------- the engines
def rbjax_call(model, qpos, qvel, dt, steps, batch_chunk, save_every=None):
    """A function running rbjax.rollout of the systems (qpos, qvel) (B = 1: unbatched),
    saving every ``save_every``-th state (default: the final one); its trajectory in box."""
    if len(qpos) == 1:
        state = rbjax.JointState(jnp.asarray(0.0), jnp.asarray(qpos[0]), jnp.asarray(qvel[0]))
    else:
        state = rbjax.JointState(jnp.zeros(len(qpos)), jnp.asarray(qpos), jnp.asarray(qvel))
    box = {}

    def call():
        traj = rbjax.rollout(
            model,
            state,
            dt,
            steps,
            integrator=rbjax.RK4(),
            save_every=save_every or steps,
            batch_chunk=batch_chunk,
        )
        box["traj"] = jax.block_until_ready(traj)

    return call, box


def maximal_call(case, qpos, qvel, steps, batch_chunk):
    """A function running rbjax.rollout of the maximal-coordinate model (bench.Case)."""
    st = [case.source.state(q, v) for q, v in zip(qpos, qvel, strict=True)]
    state = rbjax.State(
        t=jnp.zeros(len(st)), q=jnp.stack([s.q for s in st]), u=jnp.stack([s.u for s in st])
    )

    def call():
        traj = rbjax.rollout(
            case.model,
            state,
            case.dt,
            steps,
            integrator=rbjax.RK4(),
            save_every=steps,
            batch_chunk=batch_chunk,
        )
        jax.block_until_ready(traj.q)

    return call


def mujoco_call(m, qpos, qvel, steps, nthread):
    """A function stepping every (qpos, qvel) ``steps`` times with mujoco.rollout on
    ``nthread`` threads (one MjData each), controls 0; the batch goes in pieces whose state
    output stays under 64 MB. Returns (call, states): states(k) the (qpos (n, nq), qvel (n,
    nv)) after step k of the n systems of the last piece stepped (all, when one piece)."""
    mujoco = _mujoco()
    from mujoco import rollout as mj_rollout

    datas = [mujoco.MjData(m) for _ in range(nthread)]
    d = datas[0]
    spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
    size = mujoco.mj_stateSize(m, spec)
    init = np.empty((len(qpos), size))
    for i, (q, v) in enumerate(zip(qpos, qvel, strict=True)):
        d.qpos[:], d.qvel[:] = q, v
        mujoco.mj_getState(m, d, init[i], spec)
    piece = max(1, min(len(qpos), bench.MUJOCO_OUTPUT_BYTES // (8 * size * steps)))
    out = np.empty((piece, steps, size))
    control = np.zeros((piece, 1, m.nu))
    data = datas if nthread > 1 else d

    def call():
        for s in range(0, len(qpos), piece):
            n = min(piece, len(qpos) - s)
            mj_rollout.rollout(m, data, init[s : s + n], control[:n], nstep=steps, state=out[:n])

    def states(k: int):
        check, qs, vs = mujoco.MjData(m), [], []
        for s in out[: len(qpos) - (len(qpos) - 1) // piece * piece, k - 1]:
            mujoco.mj_setState(m, check, s, spec)
            qs.append(np.array(check.qpos))
            vs.append(np.array(check.qvel))
        return np.array(qs), np.array(vs)

    return call, states


def interleaved(calls: dict, repeats: int) -> dict:
    """{name: (compile s, median run s, runs)}: each call once (compiling), then ``repeats``
    rounds of every call in turn; compile = first − median run."""
    first = {}
    for name, call in calls.items():
        t0 = time.perf_counter()
        call()
        first[name] = time.perf_counter() - t0
    runs = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            t0 = time.perf_counter()
            call()
            runs[name].append(time.perf_counter() - t0)
    out = {}
    for name in calls:
        run = statistics.median(runs[name])
        out[name] = (max(first[name] - run, 0.0), run, runs[name])
    return out


def nice_steps(target: float) -> int:
    """The largest of 10, 20, 50, 100, 200, 500, 1000, ... not above ``target`` (≥ 10)."""
    best = MIN_STEPS
    for decade in (10, 100, 1000, 10000):
        for k in (1, 2, 5):
            if k * decade <= target:
                best = k * decade
    return best


# --------------------------------------------------------------------------- one model
def measure_model(name, path, meshes, found, args, emit, skipped):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = rbjax.load(path, formulation=rbjax.JointCoordinates(), meshes=meshes)
    notes = load_notes(caught)
    model = loaded.model
    dt = float(loaded.timestep or bench.DEFAULT_DT)
    m = peer_model(path, meshes, dt)
    maximal = None
    if args.with_maximal is not None and (not args.with_maximal or name in args.with_maximal):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                maximal = bench.prepare(path, dt=dt, meshes=meshes)
        except ValueError as exc:
            reason = str(exc).strip().splitlines()[0]
            skipped.append({"model": name, "engine": "rbjax maximal", "reason": reason})
            print(f"  ({name}: maximal coordinates skipped: {reason[:150]})", flush=True)
    rng = np.random.default_rng(args.seed)
    cost = None  # s per system-step of the slower engine at the last B
    for batch in args.batches:
        steps = (
            args.steps if cost is None else min(args.steps, nice_steps(args.run_s / (batch * cost)))
        )
        qpos, qvel = random_states(m, batch, rng)
        if model.equalities:  # both engines start on the loop (MuJoCo's soft one too)
            closed = rbjax.assemble(model, rbjax.JointState(0.0, qpos, qvel))
            qpos, qvel = np.asarray(closed.qpos), np.asarray(closed.qvel)
        calls, box = {}, None
        # B = 1: the states after steps / 10 and steps saved, for the check against MuJoCo
        every = steps // 10 if batch == 1 and steps % 10 == 0 else steps
        calls["rbjax"], box = rbjax_call(model, qpos, qvel, dt, steps, args.batch_chunk, every)
        calls["mujoco_1"], mj_states = mujoco_call(m, qpos, qvel, steps, 1)
        if batch > 1:
            calls["mujoco_2"], _ = mujoco_call(m, qpos, qvel, steps, 2)
        if maximal is not None and batch <= 64:
            calls["maximal"] = maximal_call(maximal, qpos, qvel, steps, args.batch_chunk)
        load0 = os.getloadavg()[0]
        try:
            times = interleaved(calls, args.repeats)
        except Exception as exc:  # noqa: BLE001 -- recorded; the other rows still run
            row = {
                "model": name,
                "batch": batch,
                "steps": steps,
                "error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}",
            }
            emit(row)
            continue
        row = {
            "model": name,
            "file": found,
            "nq": int(m.nq),
            "nv": int(m.nv),
            "bodies": int(m.nbody - 1),
            "dt": dt,
            "batch": batch,
            "steps": steps,
            "load_avg": [load0, os.getloadavg()[0]],
            "not_simulated": notes,
        }
        for engine, (compile_s, run_s, runs) in times.items():
            us = run_s / (batch * steps) * 1e6
            row[engine] = {
                "compile_s": compile_s if engine in ("rbjax", "maximal") else None,
                "run_s": run_s,
                "runs_s": runs,
                "us_per_step": us,
                "steps_per_s": 1e6 / us,
            }
        for peer in ("mujoco_1", "mujoco_2"):
            if peer in row:
                row[f"ratio_{peer}"] = row["rbjax"]["us_per_step"] / row[peer]["us_per_step"]
        if batch == 1:  # max |Δqpos|, |Δqvel| after steps / 10 and after steps
            traj, diff = box["traj"], {}
            for i, k in ((1, every), (-1, steps)):
                qm, vm = (x[0] for x in mj_states(k))
                qr, vr = np.array(traj.qpos[i]), np.array(traj.qvel[i])
                for s in quaternion_slices(m):
                    qr[s] /= np.linalg.norm(qr[s])
                diff[str(k)] = [float(np.max(np.abs(qr - qm))), float(np.max(np.abs(vr - vm)))]
            row["state_diff_vs_mujoco"] = diff
        cost = max(row["rbjax"]["us_per_step"], row["mujoco_1"]["us_per_step"]) * 1e-6
        emit(row)


def measure_gradient(name, path, args):
    """B = 1: eval vs rev of ½|qpos_N|² + ½|qvel_N|² w.r.t. qvel0, and MuJoCo's central
    differences of the same loss."""
    import equinox as eqx

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = rbjax.load(path, formulation=rbjax.JointCoordinates())
    model, steps = loaded.model, args.steps
    dt = float(loaded.timestep or bench.DEFAULT_DT)
    m = peer_model(path, True, dt)
    mujoco = _mujoco()
    qpos, qvel = random_states(m, 1, np.random.default_rng(args.seed))
    q0 = jnp.asarray(qpos[0])

    def loss(v0):
        state = rbjax.JointState(jnp.asarray(0.0), q0, v0)
        fin = rbjax.rollout(model, state, dt, steps, integrator=rbjax.RK4(), save_every=steps).final
        return 0.5 * (jnp.sum(fin.qpos**2) + jnp.sum(fin.qvel**2))

    f_eval = eqx.filter_jit(loss)
    f_rev = eqx.filter_jit(jax.value_and_grad(loss))
    v0 = jnp.asarray(qvel[0])
    box = {}
    # central differences: 2·nv systems stepped by one mujoco.rollout call on one thread
    dv = GRAD_EPS * np.eye(m.nv)
    plus_minus = np.concatenate([qvel[0] + dv, qvel[0] - dv])
    if 2 * m.nv * steps * mujoco.mj_stateSize(m, mujoco.mjtState.mjSTATE_FULLPHYSICS) * 8 > (
        bench.MUJOCO_OUTPUT_BYTES
    ):
        raise ValueError(f"{name}: 2·nv = {2 * m.nv} rollouts of {steps} steps exceed one piece")
    fd_call, fd_states = mujoco_call(m, np.repeat(qpos, 2 * m.nv, axis=0), plus_minus, steps, 1)

    def run_rev():
        box["rev"] = jax.block_until_ready(f_rev(v0))

    times = interleaved(
        {
            "eval": lambda: jax.block_until_ready(f_eval(v0)),
            "rev": run_rev,
            "mujoco_fd": fd_call,
        },
        args.repeats,
    )
    # the finite-difference gradient from the final states of the 2·nv systems
    qs, vs = fd_states(steps)
    losses = 0.5 * (np.sum(qs**2, axis=1) + np.sum(vs**2, axis=1))
    fd = (losses[: m.nv] - losses[m.nv :]) / (2 * GRAD_EPS)
    grad = np.asarray(box["rev"][1])
    return {
        "model": name,
        "nv": int(m.nv),
        "steps": steps,
        "dt": dt,
        "eval_compile_s": times["eval"][0],
        "eval_s": times["eval"][1],
        "rev_compile_s": times["rev"][0],
        "rev_s": times["rev"][1],
        "rev_over_eval": times["rev"][1] / times["eval"][1],
        "mujoco_fd_s": times["mujoco_fd"][1],
        "rev_over_mujoco_fd": times["rev"][1] / times["mujoco_fd"][1],
        "runs_s": {k: v[2] for k, v in times.items()},
        "grad_rel_diff_vs_mujoco_fd": float(np.max(np.abs(grad - fd)) / np.max(np.abs(fd))),
    }


# --------------------------------------------------------------------------- output
def fmt(x, spec=".3g"):
    return "–" if x is None else format(x, spec)


TABLE_HEAD = (
    "| model | nq / nv | B | steps | rbjax compile s | rbjax µs/step | rbjax steps/s | "
    "MuJoCo 1 thread µs/step | rbjax / MuJoCo 1 thread | MuJoCo 2 threads µs/step | "
    "rbjax / MuJoCo 2 threads | maximal µs/step (compile s) |\n" + "|---" * 12 + "|"
)


def table_line(r: dict) -> str:
    if "error" in r:
        return f"| {r['model']} | | {r['batch']} | {r['steps']} | failed: {r['error']} |"
    mx = r.get("maximal")
    cells = [
        r["model"],
        f"{r['nq']} / {r['nv']}",
        str(r["batch"]),
        str(r["steps"]),
        fmt(r["rbjax"]["compile_s"], ".1f"),
        fmt(r["rbjax"]["us_per_step"]),
        fmt(r["rbjax"]["steps_per_s"]),
        fmt(r["mujoco_1"]["us_per_step"]),
        fmt(r.get("ratio_mujoco_1"), ".2f"),
        fmt(r.get("mujoco_2", {}).get("us_per_step")),
        fmt(r.get("ratio_mujoco_2"), ".2f"),
        "–" if mx is None else f"{mx['us_per_step']:.3g} ({mx['compile_s']:.1f})",
    ]
    return "| " + " | ".join(cells) + " |"


GRAD_HEAD = (
    "| model | nv | steps | eval s | rev s | **rev/eval** | compile s eval / rev | "
    "MuJoCo central FD s | rev / MuJoCo FD | ‖∇ − ∇_FD‖∞ / ‖∇_FD‖∞ |\n" + "|---" * 10 + "|"
)


def grad_line(g: dict) -> str:
    return (
        f"| {g['model']} | {g['nv']} | {g['steps']} | {g['eval_s']:.3g} | {g['rev_s']:.3g} | "
        f"**{g['rev_over_eval']:.1f}** | {g['eval_compile_s']:.1f} / {g['rev_compile_s']:.1f} | "
        f"{g['mujoco_fd_s']:.3g} | {g['rev_over_mujoco_fd']:.2f} | "
        f"{g['grad_rel_diff_vs_mujoco_fd']:.1e} |"
    )


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    names = [n for n, *_ in MODELS]
    ap.add_argument("--models", nargs="*", default=names, choices=names, metavar="NAME")
    ap.add_argument("--batches", nargs="*", type=int, default=[1, 64, 1024])
    ap.add_argument("--steps", type=int, default=1000, help="steps at the first batch size")
    ap.add_argument("--run-s", type=float, default=1.0, help="target run time at larger B [s]")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-chunk", type=int, default=None, help="rollout's batch_chunk")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--with-maximal",
        nargs="*",
        default=None,
        choices=names,
        metavar="NAME",
        help="add maximal coordinates at B ≤ 64 (for the models named; none named: all)",
    )
    ap.add_argument("--grad-models", nargs="*", default=["double_pendulum", "arm7"], choices=names)
    ap.add_argument(
        "--extra-dir", action="append", default=[], help="where to look for extra models"
    )
    ap.add_argument("--quick", action="store_true", help="B = 1, 64; 100 steps; 1 repeat")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.batches, args.steps, args.repeats = [1, 64], 100, 1
    head = bench.header()
    meta = {
        "machine": f"{head['cpu']}, {head['cpu_count']} cores",
        "jax": head["jax"],
        "mujoco": head["mujoco"],
        "device": head["device"],
        "header": head,
        "steps": args.steps,
        "run_s": args.run_s,
        "repeats": args.repeats,
        "seed": args.seed,
        "batches": args.batches,
        "batch_chunk": args.batch_chunk,
        "load_avg_start": list(os.getloadavg()),
    }
    out = {"meta": meta, "rows": [], "gradients": [], "skipped": []}
    started = time.perf_counter()

    def save():
        if args.json:
            meta["load_avg_end"] = list(os.getloadavg())
            meta["wall_s"] = time.perf_counter() - started
            with open(args.json, "w") as fh:
                json.dump(out, fh, indent=1)

    def emit(row):
        out["rows"].append(row)
        print(table_line(row), flush=True)
        save()

    print("\n".join(bench.header_lines(head)))
    print(f"RK4, {args.steps} steps at the first B, median of {args.repeats}\n")
    print(TABLE_HEAD, flush=True)
    paths = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, repo_path, suffix, free in MODELS:
            if name not in args.models and name not in args.grad_models:
                continue
            try:
                path, meshes, found = resolve(name, repo_path, suffix, free, args.extra_dir, tmp)
            except ValueError as exc:
                path, found = None, f"refused: {str(exc).strip().splitlines()[0]}"
            if path is None:
                out["skipped"].append({"model": name, "engine": "all", "reason": found})
                continue
            paths[name] = (path, meshes)
            if name in args.models:
                measure_model(name, path, meshes, found, args, emit, out["skipped"])
        print("\n" + GRAD_HEAD, flush=True)
        for name in args.grad_models:
            if name in paths:
                g = measure_gradient(name, paths[name][0], args)
                out["gradients"].append(g)
                print(grad_line(g), flush=True)
                save()
    for r in out["rows"]:
        if "state_diff_vs_mujoco" in r:
            parts = [
                f"after {k} steps {q:.1e} / {v:.1e}"
                for k, (q, v) in r["state_diff_vs_mujoco"].items()
            ]
            print(
                f"B = 1, rbjax vs MuJoCo, max |Δqpos| / |Δqvel|, {r['model']}: {'; '.join(parts)}"
            )
    for s in out["skipped"]:
        print(f"skipped {s['model']} ({s['engine']}): {s['reason']}")
    print(
        "\nµs/step: run time / (B × steps), median of the warm calls; ratio: rbjax µs / MuJoCo "
        f"µs (> 1: rbjax slower); wall {time.perf_counter() - started:.0f} s"
    )
    save()
    return out


if __name__ == "__main__":
    result = main()
    sys.exit(1 if any("error" in r for r in result["rows"]) else 0)
