"""``rbjax simulate MODEL``: integrate a model file and write a run file (runfile.py).

An MJCF/URDF tree is integrated in joint coordinates (``--coordinates``, default by
rbjax/_io/load.py ``default_coordinates``; rbjax/_cli/joint.py: MuJoCo's qpos/qvel, its
perturbations and run file); what follows is the maximal-coordinate run.

A single run starts from the file's initial state (MJCF/URDF: qpos0 at rest, or the keyframe
the loader was given; model file: its ``[initial]`` table). ``--batch N`` integrates N copies
at once, each perturbed independently (``--perturb NAME=SIZE``, Gaussian, seeded by
``--seed``, sample i reproducible from the seed):

* ``qpos=σ``: the joint coordinates (rbjax.JointSpace), displaced along the joint velocity
  directions by δ ~ N(0, σ²) per coordinate (radians for angles and ball/free rotations,
  metres for slides and free positions), q ← q + q̇(q, δ), quaternions renormalised;
* ``qvel=σ``: the joint velocities plus N(0, σ²);
* ``mass=σ``: every body's mass and inertia times exp(N(0, σ²)) (its density scaled).

Loops are put back onto their closures by :func:`rbjax.assemble` after perturbing. The time
span is integrated in about 20 segments with the same compiled program, so a progress bar
can follow; the first segment's time includes the compilation, reported separately.

Before anything is built, the run is sized: more than ``--max-steps`` system-steps (batch x
steps, default 10^9) is refused with an estimate of the time it would take, and so is a run
whose arrays would not fit in the memory available now (the peak is measured at 7-7.5 times
the run file's arrays). The output files are checked writable first.
"""

from __future__ import annotations

import argparse
import math
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._analysis.assembly import assemble
from .._analysis.checks import check_mechanism_state
from .._engine.monitors import cheaply_compiled
from .._model import require_model
from .._rollout import Trajectory, _available_memory, rollout
from . import joint, quantities, runfile
from .arguments import duration, integer, large, numbers, real, seed
from .common import (
    ALL_INTEGRATORS,
    CliError,
    add_coordinates,
    add_meshes,
    add_progress,
    integrator_for,
    key_values,
    load_model,
    output_path,
    print_run,
    run_meta,
    show_progress,
    writing,
)

PERTURB = {
    "qpos": "sd of the joint coordinates [rad or m]",
    "qvel": "sd of the joint velocities [rad/s or m/s]",
    "mass": "relative sd of every body's mass and inertia",
}
MAX_SAVES = 1000
MAX_STEPS = 10**9  # system-steps (batch x steps) of one run, unless --max-steps says otherwise
RATES = (1e4, 1e6)  # steps/s: one small mechanism on a CPU core (measured 7e3 for a double
# pendulum on the 2-core development machine) to a large batch on a GPU
PEAK = 8.0  # peak memory / the run file's arrays: measured 7.1 (1 body, B = 2000) and 7.4
# (2 bodies, B = 1000) on CPU, 1001 saved states: the segments, their concatenation, the
# derived quantities (vmapped over every saved state) and the compressed writer


def add_parser(sub):
    p = sub.add_parser(
        "simulate",
        help="integrate a model and write a run file (.npz, optionally .csv)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "model", metavar="MODEL", help="MJCF (.xml), URDF (.urdf) or rbjax model file (.toml)"
    )
    p.add_argument(
        "--t",
        type=real("--t", "a positive number of seconds", "2", positive=True),
        default=1.0,
        metavar="SECONDS",
        help="time span (default 1 s)",
    )
    p.add_argument(
        "--dt",
        type=real("--dt", "a positive number of seconds", "1e-3", positive=True),
        default=None,
        help="step [s] (default: the file's timestep, else 1e-3)",
    )
    p.add_argument(
        "--integrator",
        choices=sorted(ALL_INTEGRATORS),
        default=None,
        help="default rk4; implicitfast (joint coordinates only) when the MJCF asks for "
        "MuJoCo's implicit or implicitfast integrator",
    )
    p.add_argument(
        "--save-every",
        type=integer("--save-every", "10"),
        default=None,
        metavar="K",
        help=f"save every K-th step (must divide the steps; default: at most {MAX_SAVES} saves)",
    )
    p.add_argument(
        "--batch",
        type=integer("--batch", "100"),
        default=None,
        metavar="N",
        help="integrate N perturbed copies",
    )
    p.add_argument(
        "--perturb",
        action="append",
        metavar="NAME=SIZE",
        help="with --batch: "
        + "; ".join(f"{k}: {v}" for k, v in PERTURB.items())
        + " (repeatable)",
    )
    p.add_argument(
        "--seed", type=seed(), default=0, help="random seed of the perturbations (default 0)"
    )
    p.add_argument(
        "--ctrl",
        type=numbers("--ctrl", "a comma-separated list of numbers", "0.5,0"),
        default=None,
        metavar="C1,C2,...",
        help="constant actuator controls in MuJoCo's ctrl order (MJCF/URDF models)",
    )
    p.add_argument("--out", default="run.npz", help="run file to write (default run.npz)")
    p.add_argument(
        "--csv", default=None, metavar="FILE", help="also write a CSV of the per-time quantities"
    )
    p.add_argument(
        "--no-reactions",
        dest="reactions",
        action="store_false",
        help="do not compute joint reactions (saves memory on long batches)",
    )
    p.add_argument(
        "--max-steps",
        type=integer("--max-steps", "10000000000"),
        default=MAX_STEPS,
        metavar="N",
        help="refuse runs of more than N system-steps, batch x steps (default 10^9: hours)",
    )
    add_coordinates(p)
    add_meshes(p)
    add_progress(p)
    p.set_defaults(run=run)


def _steps(
    t_span: float, dt: float, save_every: int | None, systems: int = 1, max_steps: int = MAX_STEPS
) -> tuple[int, int]:
    """(steps, save_every): the span in whole steps, refused past ``max_steps`` system-steps
    before any search; the default stride the smallest divisor of the steps that keeps at
    most MAX_SAVES saves."""
    if not (dt > 0 and np.isfinite(dt)):  # a file's timestep (--dt is checked when parsed)
        raise CliError(f"--dt {dt!r} is not a positive step. Fix: e.g. --dt 1e-3.")
    ratio = t_span / dt
    if not ratio * systems <= max_steps:  # inf and nan too
        total = ratio * systems
        of = "" if systems == 1 else f" of {systems} systems"
        slow, fast = (duration(total / rate) for rate in RATES)
        raise CliError(
            f"--t {t_span:g} s in steps of {dt:g} s is {large(ratio)} steps{of}, more than the "
            f"{large(max_steps)} system-steps of --max-steps: at {large(RATES[0])} to "
            f"{large(RATES[1])} steps/s (a small mechanism on one CPU core, a large batch on a "
            f"GPU) it would run {fast} to {slow}. Fix: a larger --dt or a shorter --t"
            + (", a smaller --batch" if systems > 1 else "")
            + ", or raise --max-steps if you mean it."
        )
    n = round(ratio)
    if n < 1 or abs(n * dt - t_span) > 1e-9 * max(1.0, t_span):
        raise CliError(
            f"--t {t_span:g} is not a whole number of steps of --dt {dt:g} ({t_span / dt:.6g}). "
            f"Fix: choose --t as a multiple of --dt, e.g. --t {max(n, 1) * dt:g}."
        )
    if save_every is None:
        save_every = min(d for d in _divisors(n) if n // d <= MAX_SAVES)
    elif save_every < 1 or n % save_every:
        raise CliError(
            f"--save-every {save_every} does not divide the {n} steps. Fix: use a divisor of {n}."
        )
    return n, save_every


def _divisors(n: int) -> list[int]:
    """The divisors of ``n`` in ascending order, by trial division up to √n (10^6 trials at
    the largest step count --max-steps admits)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _segments(n_saves: int) -> int:
    """The divisor of the number of saves closest to 20: equal segments, one compilation."""
    return min(_divisors(n_saves), key=lambda d: abs(d - 20))


def _memory(
    model, systems: int, saves: int, multipliers: bool, save_every: int, coords=None
) -> int:
    """The bytes of the run's arrays, counted from the model's size before anything is
    built: per saved state and system t, q and u (14 nb + 1), the multipliers (nb + joint
    rows), energies, momenta, residuals (11), joint coordinates (nq + nv) and reactions (6 per
    joint). A CliError when about :data:`PEAK` times that, the peak, exceeds the host memory
    available now."""
    js = (quantities.Layout() if coords is None else coords).joint_space(model)
    per = 14 * model.nb + 12 + (js.nq + js.nv if js is not None else 0)
    if multipliers:
        per += model.nb + sum(model.joint_rows) + 6 * len(model.joints)
    arrays = systems * saves * per * 8
    available = _available_memory(host=True)
    if available is None or PEAK * arrays <= available:
        return arrays
    gib = 2.0**30
    raise CliError(
        f"{systems} system(s) x {saves} saved states x {per} numbers are {arrays / gib:.3g} GiB "
        f"of arrays, about {PEAK * arrays / gib:.3g} GiB at the peak, more than the "
        f"{available / gib:.3g} GiB of memory available now. Fix: a smaller --batch, fewer saved "
        f"states (--save-every K, now {save_every}), --no-reactions, or statistics without "
        "trajectories from Python (rbjax.monte_carlo)."
    )


def _initial(loaded, args, perturb, coords):
    """The model (batched mass/inertia with mass=σ) and initial state(s), and the arrays of
    the perturbations each sample received."""
    model, state = loaded.model, loaded.state
    if state is None:
        raise CliError(
            f"MODEL {args.model!r} has no initial state. Fix: add an [initial] table to the model "
            "file (docs: 'Write a model file')."
        )
    if args.batch is None:
        if perturb:
            raise CliError(
                "--perturb needs --batch N (how many perturbed copies). Fix: add e.g. --batch 100."
            )
        return model, state, {}
    n = args.batch
    keys = jax.random.split(jax.random.key(args.seed), 3)
    record = {}
    js = coords.joint_space(model) if {"qpos", "qvel"} & set(perturb) else None
    if js is None and ({"qpos", "qvel"} & set(perturb)):
        raise CliError(
            "--perturb qpos/qvel needs joint coordinates, which are not defined for scalable "
            "bodies. Fix: perturb mass only, or use rigid bodies."
        )
    if js is not None:
        qpos0, qvel0 = js.positions(state), js.velocities(state)
        d_pos = perturb.get("qpos", 0.0) * jax.random.normal(keys[0], (n, js.nv), qpos0.dtype)
        d_vel = perturb.get("qvel", 0.0) * jax.random.normal(keys[1], (n, js.nv), qpos0.dtype)
        quats = _quaternion_slices(js)

        def one(dp, dv):
            x = qpos0 + js._tangent(qpos0, dp)
            for s in quats:
                x = x.at[s].set(x[s] / jnp.linalg.norm(x[s]))
            return js.state(x, qvel0 + dv, state.t)

        state = eqx.filter_jit(jax.vmap(one))(d_pos, d_vel)
        if js.loops:
            state = assemble(model, state)  # every sample onto the loop closures
        record |= {f"perturb_{k}": d for k, d in (("qpos", d_pos), ("qvel", d_vel)) if k in perturb}
    else:  # the file's state, once per sample
        state = jax.tree.map(lambda x: jnp.broadcast_to(x, (n,) + x.shape), state)
    if "mass" in perturb:
        f = jnp.exp(perturb["mass"] * jax.random.normal(keys[2], (n, model.nb), model.mass.dtype))
        model = eqx.tree_at(
            lambda m: (m.mass, m.inertia),
            model,
            (model.mass * f, model.inertia * f[..., None, None]),
        )
        record["perturb_mass"] = f
    return model, state, record


def _quaternion_slices(js):
    out, o = [], 0
    for _, kind, nq, _ in js.coordinates:
        if kind == "free":
            out.append(slice(o + 3, o + 7))
        elif kind == "spherical":
            out.append(slice(o, o + 4))
        o += nq
    return out


def _integrate(model, state, dt, n_steps, save_every, integrator, multipliers, progress):
    """Integrate in equal segments (one compilation); returns the concatenated arrays, the
    per-sample result code and failed step, and the timings."""
    n_seg = _segments(n_steps // save_every)
    seg = n_steps // n_seg
    model.check_state(state)  # what rollout checks in a State it starts from
    check_mechanism_state(model, state)
    parts, cur, times = [], _as_trajectory(model, state, multipliers), []
    lead = state.q.shape[:-2]
    result = np.zeros(lead, np.int32)
    failed = np.full(lead, -1, np.int64)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n_steps, unit="step", unit_scale=True, desc="simulate")
    try:
        for s in range(n_seg):
            t0 = time.perf_counter()
            traj = rollout(
                model,
                cur,
                dt,
                seg,
                integrator=integrator,
                save_every=save_every,
                multipliers=multipliers,
                throw=False,
            )
            jax.block_until_ready(traj.q)
            times.append(time.perf_counter() - t0)
            codes = np.asarray(traj.result)
            new = (codes != 0) & (result == 0)
            result = np.where(new, codes, result)
            failed = np.where(new, s * seg + np.asarray(traj.failed_step), failed)
            parts.append(traj if s == 0 else _drop_first(traj))
            if np.all(result != 0):
                break
            cur = _continuable(traj, result != 0, state)
            if bar is not None:
                bar.update(seg)
    finally:
        if bar is not None:
            bar.close()
    arrays = {
        k: np.concatenate([np.asarray(getattr(p, k)) for p in parts], axis=len(lead))
        for k in ("t", "q", "u") + (("lam",) if multipliers else ())
    }
    return arrays, result, failed, times


def _as_trajectory(model, state, multipliers) -> Trajectory:
    """The checked initial state as a one-state Trajectory, so that every segment continues a
    Trajectory and all of them run ONE compiled program (a State would compile another)."""
    lead = state.q.shape[:-2]
    one = lambda x: jnp.expand_dims(x, len(lead))  # noqa: E731
    lam = None
    if multipliers:
        lam = jnp.zeros(lead + (1, model.nb + sum(model.joint_rows)), state.q.dtype)
    return Trajectory(
        t=one(jnp.broadcast_to(jnp.asarray(state.t, state.q.dtype), lead)),  # strong: no recompile
        q=one(state.q),
        u=one(state.u),
        lam=lam,
        result=jnp.zeros(lead, jnp.int32),
        failed_step=jnp.full(lead, -1, jnp.int32),
    )


def _drop_first(traj: Trajectory) -> Trajectory:
    """A continued segment starts with the previous segment's last state: drop it."""
    lead = traj.t.ndim - 1  # the time axis of every saved array

    def cut(x):
        return jax.lax.slice_in_dim(x, 1, None, axis=lead)

    return Trajectory(
        t=cut(traj.t),
        q=cut(traj.q),
        u=cut(traj.u),
        lam=None if traj.lam is None else cut(traj.lam),
        result=traj.result,
        failed_step=traj.failed_step,
    )


def _continuable(traj: Trajectory, dead, state0):
    """The segment's trajectory with failed samples reset to their initial state and a
    success code, so the others continue; the failed samples' later values are discarded."""
    if not np.any(dead):
        return traj
    keep = lambda a, a0: jnp.where(dead[..., None, None, None], a0[..., None, :, :], a)  # noqa: E731
    return eqx.tree_at(
        lambda tr: (tr.q, tr.u, tr.result),
        traj,
        (keep(traj.q, state0.q), keep(traj.u, state0.u), jnp.zeros_like(traj.result)),
    )


def run(args) -> int:
    perturb = key_values(args.perturb, "--perturb", PERTURB)
    output_path(args.out, (".npz",), "run file")
    if args.csv is not None:
        if not args.csv.lower().endswith(".csv"):
            raise CliError(f"--csv {args.csv!r} does not end in .csv. Fix: e.g. --csv run.csv.")
        output_path(args.csv, (".csv",), "table", "--csv")
    control = None if args.ctrl is None else np.asarray(args.ctrl)
    loaded = load_model(
        args.model, control=control, meshes=args.meshes, coordinates=args.coordinates
    )
    args.integrator = integrator_for(args.integrator, loaded)
    dt = args.dt if args.dt is not None else (loaded.timestep or 1e-3)
    systems = 1 if args.batch is None else args.batch
    n_steps, save_every = _steps(args.t, dt, args.save_every, systems, args.max_steps)
    if loaded.coordinates == "joint":  # rbjax/_cli/joint.py
        n_seg = _segments(n_steps // save_every)
        return joint.simulate(args, loaded, perturb, dt, n_steps, save_every, n_seg, control)
    multipliers = bool(args.reactions and require_model(loaded.model).joints)
    coords = quantities.layout(loaded)  # MuJoCo's qpos/qvel for an MJCF or URDF file
    _memory(loaded.model, systems, n_steps // save_every + 1, multipliers, save_every, coords)
    model, state, record = _initial(loaded, args, perturb, coords)
    integrator = ALL_INTEGRATORS[args.integrator]()
    arrays, result, failed, times = _integrate(
        model, state, dt, n_steps, save_every, integrator, multipliers, show_progress(args.progress)
    )
    arrays |= _derived(model, arrays, args.batch is not None, coords)
    arrays |= {
        "body_names": np.array(model.names),
        "joint_names": np.array(model.joint_names, dtype=str),
        "result": result,
        "failed_step": failed,
    }
    js = coords.joint_space(model)
    if js is not None and js.nq:
        pos, vel = quantities.coordinate_names(js)
        arrays |= {"qpos_names": np.array(pos), "qvel_names": np.array(vel)}
    arrays |= {k: np.asarray(v) for k, v in record.items()}
    if args.batch is not None:  # every sample has the same times
        arrays["t"] = arrays["t"][0]
    meta = run_meta(args, dt, n_steps, save_every, perturb, control, times, arrays["q"].dtype)
    meta |= {
        "coordinates": coords.kind,  # qpos/qvel: "mujoco" (the file's own) or "rbjax"
    }
    with writing(args.out):
        runfile.write(args.out, arrays, meta)
    if args.csv is not None:
        with writing(args.csv, "--csv"):
            runfile.write_csv(args.csv, runfile.read(args.out))
    return _report(args, model, arrays, meta, result, failed)


def _derived(model, arrays, batched, coords):
    lam = arrays.get("lam")
    if not batched:
        out = quantities.derive(model, arrays["t"], arrays["q"], arrays["u"], lam, coords)
        return {k: np.asarray(v) for k, v in out.items()}
    n = arrays["q"].shape[0]
    mass = jnp.broadcast_to(model.mass, (n, model.nb))  # one row per sample (perturbed or not)
    inertia = jnp.broadcast_to(model.inertia, (n, model.nb, 3, 3))
    out = _derive_many(model, mass, inertia, arrays["t"], arrays["q"], arrays["u"], lam, coords)
    return {k: np.asarray(v) for k, v in out.items()}


@cheaply_compiled  # once per run file: the monitors' cheap XLA options
def _derive_many(model, mass, inertia, t, q, u, lam, coords):
    def one(m, i, t, q, u, lam_):
        return quantities.derive(
            eqx.tree_at(lambda x: (x.mass, x.inertia), model, (m, i)), t, q, u, lam_, coords
        )

    return jax.vmap(one)(mass, inertia, t, q, u, lam)


def _report(args, model, arrays, meta, result, failed) -> int:
    n_sys = 1 if args.batch is None else args.batch
    header = (
        f"{args.model}: {model.nb} bodies, {len(model.joints)} joints; {n_sys} system(s) x "
        f"{meta['n_steps']} steps of {meta['dt']:g} s ({args.integrator})"
    )
    return print_run(
        args, header, arrays, meta, result, failed, "a smaller --dt or another integrator"
    )
