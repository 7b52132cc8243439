"""``rbjax simulate`` and ``rbjax check`` on joint coordinates (an :class:`rbjax.JointModel`,
``--coordinates joint``, the default for an MJCF/URDF tree).

The state is MuJoCo's qpos/qvel. A batch's perturbations (``--perturb``, Gaussian, seeded
by ``--seed``) act on those coordinates:

* ``qpos=σ``: δ ~ N(0, σ²) per velocity coordinate, q ← q ⊕ δ: hinge and slide coordinates
  and a free joint's position plus δ, a ball's or free joint's quaternion turned by the
  rotation vector δ (q ⊗ exp(δ/2), in the joint's child frame: MuJoCo's
  ``mj_integratePos`` with h = 1, rbjax/_tree/implicit.py ``integrate_positions``);
* ``qvel=σ``: qvel plus N(0, σ²);
* ``mass=σ``: every body's mass and inertia times exp(N(0, σ²)) (its density scaled); the
  rollout is then mapped over the sampled models (a JointModel's parameters are one
  system's).

A model with equalities (connects, welds, joint couplings) has every perturbed sample put
back onto them by :func:`rbjax.assemble` (Gauss–Newton steps in the kinetic-energy metric
of the file's masses to a closed state near the sample), as the maximal path does for
loops: rollout refuses a start that opens them.

The run file holds qpos/qvel, the bodies' world poses (MuJoCo's ``xpos``/``xquat``) and
centres of mass (``xipos``), the energies (rbjax/_tree/energy.py) and momenta
(rbjax/_tree/bodies.py) at every saved time; its ``meta`` says ``"formulation": "joint"``.
"""

from __future__ import annotations

import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._analysis.assembly import assemble
from .._engine.monitors import cheaply_compiled
from .._results import RESULTS
from .._rollout import _available_memory, rollout
from .._tree.bodies import body_com, body_poses, momenta
from .._tree.energy import kinetic, potential
from .._tree.implicit import integrate_positions
from .._tree.model import JointModel, JointState
from . import runfile
from .common import ALL_INTEGRATORS, CliError, print_run, run_meta, show_progress, writing

PEAK = 8.0  # peak memory / the run file's arrays, as for maximal coordinates (simulate.py)

# Names of a joint's coordinates in MuJoCo's qpos and qvel (a free joint's velocity: the body
# frame origin's world velocity, then ω in body axes; a ball's: ω in the child's axes).
NAMES = {
    "free": (("x", "y", "z", "qw", "qx", "qy", "qz"), ("vx", "vy", "vz", "wx", "wy", "wz")),
    "ball": (("qw", "qx", "qy", "qz"), ("wx", "wy", "wz")),
    "hinge": (("",), ("",)),
    "slide": (("",), ("",)),
}


def coordinate_names(model: JointModel) -> tuple[list[str], list[str]]:
    """Column names of qpos and qvel: ``joint`` for a hinge or slide, ``joint.qw`` ... else."""
    pos, vel = [], []
    for name, kind in zip(model.joint_names, model.topology.joint_types, strict=True):
        p, v = NAMES[kind]
        pos += [f"{name}.{s}" if s else name for s in p]
        vel += [f"{name}.{s}" if s else name for s in v]
    return pos, vel


def _nq(model: JointModel) -> list[int]:
    """qpos entries of each joint."""
    return [len(NAMES[k][0]) for k in model.topology.joint_types]


def perturbed(model: JointModel, state: JointState, n: int, seed: int, perturb: dict):
    """(mass, inertia) of n sampled models (None without ``mass``), the n initial states and
    the perturbation arrays each sample received (module docstring). The keys are drawn as
    for maximal coordinates: key(seed) split in three, for qpos, qvel and mass."""
    keys = jax.random.split(jax.random.key(seed), 3)
    dtype = state.qpos.dtype
    record = {}
    d_pos = perturb.get("qpos", 0.0) * jax.random.normal(keys[0], (n, model.nv), dtype)
    d_vel = perturb.get("qvel", 0.0) * jax.random.normal(keys[1], (n, model.nv), dtype)
    qpos = integrate_positions(
        model.topology,
        jnp.broadcast_to(state.qpos[:, None], (model.nq, n)),
        d_pos.T,
        jnp.asarray(1.0, dtype),
    ).T
    states = JointState(jnp.broadcast_to(state.t, (n,)), qpos, state.qvel + d_vel)
    if model.equalities:  # every sample back onto its equalities, as maximal loops are
        states = assemble(model, states)
    record |= {f"perturb_{k}": d for k, d in (("qpos", d_pos), ("qvel", d_vel)) if k in perturb}
    params = None
    if "mass" in perturb:
        f = jnp.exp(perturb["mass"] * jax.random.normal(keys[2], (n, model.nb), dtype))
        params = (model.mass * f, model.inertia * f[..., None, None])
        record["perturb_mass"] = f
    return params, states, record


def _with(model: JointModel, params):
    return eqx.tree_at(lambda m: (m.mass, m.inertia), model, params)


@eqx.filter_jit
def _sampled_rollout(model, params, state, dt, n_steps, integrator, save_every):
    """One rollout per sampled model (mass and inertia), mapped over the batch."""

    def one(p, s):
        return rollout(
            _with(model, p), s, dt, n_steps, integrator=integrator, save_every=save_every,
            throw=False,
        )  # fmt: skip

    return jax.vmap(one)(params, state)


def integrate(model, params, state, dt, n_steps, save_every, integrator, n_seg, progress):
    """Integrate in ``n_seg`` equal segments (one compiled program, a progress bar between
    them); a failed system restarts from its initial state in the next segment, its later
    values discarded (the result code keeps the first failure). Returns the saved arrays
    (t, qpos, qvel with the time axis after the batch), result, failed step, timings."""
    seg = n_steps // n_seg
    lead = state.qpos.shape[:-1]
    result = np.zeros(lead, np.int32)
    failed = np.full(lead, -1, np.int64)
    parts: list[tuple] = []
    times = []
    cur = state
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n_steps, unit="step", unit_scale=True, desc="simulate")
    try:
        for s in range(n_seg):
            t0 = time.perf_counter()
            if params is None:
                traj = rollout(
                    model, cur, dt, seg, integrator=integrator, save_every=save_every, throw=False
                )
            else:
                traj = _sampled_rollout(model, params, cur, dt, seg, integrator, save_every)
            jax.block_until_ready(traj.qpos)
            times.append(time.perf_counter() - t0)
            codes = np.asarray(traj.result)
            new = (codes != 0) & (result == 0)
            result = np.where(new, codes, result)
            failed = np.where(new, s * seg + np.asarray(traj.failed_step), failed)
            first = 0 if s == 0 else 1  # a continued segment repeats the previous last state
            parts.append(
                (
                    np.asarray(traj.t)[..., first:],
                    np.asarray(traj.qpos)[..., first:, :],
                    np.asarray(traj.qvel)[..., first:, :],
                )
            )
            if np.all(result != 0):
                break
            dead = jnp.asarray(result != 0)
            cur = JointState(
                jnp.where(dead, state.t, traj.t[..., -1]),
                jnp.where(dead[..., None], state.qpos, traj.qpos[..., -1, :]),
                jnp.where(dead[..., None], state.qvel, traj.qvel[..., -1, :]),
            )
            if bar is not None:
                bar.update(seg)
    finally:
        if bar is not None:
            bar.close()
    axis = len(lead)
    t, qpos, qvel = (np.concatenate([p[k] for p in parts], axis=axis) for k in range(3))
    return {"t": t, "qpos": qpos, "qvel": qvel}, result, failed, times


def derive(model: JointModel, qpos, qvel) -> dict:
    """What the run file stores of ONE system's saved states qpos (T, nq), qvel (T, nv):
    body poses ``xpos`` (T, nb, 3), ``xquat`` (T, nb, 4), centres of mass ``xipos``
    (T, nb, 3), energies (T,) and momenta (T, 3) (module docstring)."""
    q, u = qpos.T, qvel.T
    xpos, xquat = body_poses(model, q)
    p, L = momenta(model, q, u)
    out = {
        "xpos": jnp.moveaxis(xpos, -1, 0).swapaxes(1, 2),
        "xquat": jnp.moveaxis(xquat, -1, 0).swapaxes(1, 2),
        "xipos": jnp.moveaxis(body_com(model, q), -1, 0).swapaxes(1, 2),
        "kinetic_energy": kinetic(model, q, u),
        "potential_energy": potential(model, q),
        "linear_momentum": p.T,
        "angular_momentum": L.T,
    }
    out["total_energy"] = out["kinetic_energy"] + out["potential_energy"]
    return out


# Run once per run file: compiled with the monitors' cheap XLA options (rbjax/_engine/monitors.py
# CHEAP): arm7's quantities 2.3-3.0 -> 1.2-1.4 s after the run, energies equal to 1 ulp.
_derive_one = cheaply_compiled(derive)


@cheaply_compiled
def _derive_many(model: JointModel, params, qpos, qvel) -> dict:
    return jax.vmap(lambda p, a, b: derive(_with(model, p), a, b))(params, qpos, qvel)


def _derived(model, params, arrays) -> dict:
    qpos, qvel = arrays["qpos"], arrays["qvel"]
    if qpos.ndim == 2:
        return {k: np.asarray(v) for k, v in _derive_one(model, qpos, qvel).items()}
    n = qpos.shape[0]
    if params is None:
        params = (
            jnp.broadcast_to(model.mass, (n, model.nb)),
            jnp.broadcast_to(model.inertia, (n, model.nb, 3, 3)),
        )
    out = _derive_many(model, params, qpos, qvel)
    return {k: np.asarray(v) for k, v in out.items()}


def memory(model: JointModel, systems: int, saves: int, save_every: int) -> int:
    """Bytes of a run's arrays (t, qpos, qvel, the body poses and centres of mass, energies
    and momenta per saved state); a CliError when :data:`PEAK` times that exceeds the host
    memory available now."""
    per = 1 + model.nq + model.nv + 10 * model.nb + 9
    arrays = systems * saves * per * 8
    available = _available_memory(host=True)
    if available is None or PEAK * arrays <= available:
        return arrays
    gib = 2.0**30
    raise CliError(
        f"{systems} system(s) x {saves} saved states x {per} numbers are {arrays / gib:.3g} GiB "
        f"of arrays, about {PEAK * arrays / gib:.3g} GiB at the peak, more than the "
        f"{available / gib:.3g} GiB of memory available now. Fix: a smaller --batch, fewer saved "
        f"states (--save-every K, now {save_every}), or statistics without trajectories from "
        "Python (rbjax.monte_carlo)."
    )


def simulate(args, loaded, perturb: dict, dt, n_steps, save_every, n_seg, control) -> int:
    """``rbjax simulate`` of a JointModel: integrate, derive, write the run file, report."""
    model, state = loaded.model, loaded.state
    systems = 1 if args.batch is None else args.batch
    memory(model, systems, n_steps // save_every + 1, save_every)
    params, record = None, {}
    if args.batch is not None:
        params, state, record = perturbed(model, state, args.batch, args.seed, perturb)
    elif perturb:
        raise CliError(
            "--perturb needs --batch N (how many perturbed copies). Fix: add e.g. --batch 100."
        )
    arrays, result, failed, times = integrate(
        model,
        params,
        state,
        dt,
        n_steps,
        save_every,
        ALL_INTEGRATORS[args.integrator](),
        n_seg,
        show_progress(args.progress),
    )
    arrays |= _derived(model, params, arrays)
    pos, vel = coordinate_names(model)
    arrays |= {
        "body_names": np.array(model.names),
        "joint_names": np.array(model.joint_names, dtype=str),
        "qpos_names": np.array(pos),
        "qvel_names": np.array(vel),
        "qpos_kinds": np.array(
            [
                k
                for k, n in zip(model.topology.joint_types, _nq(model), strict=True)
                for _ in range(n)
            ]
        ),
        "result": result,
        "failed_step": failed,
    }
    arrays |= {k: np.asarray(v) for k, v in record.items()}
    if args.batch is not None:  # every sample has the same times
        arrays["t"] = arrays["t"][0]
    meta = run_meta(args, dt, n_steps, save_every, perturb, control, times, arrays["qpos"].dtype)
    meta |= {
        "formulation": "joint",  # the state is qpos/qvel; no maximal q, u
        "coordinates": "mujoco",  # qpos/qvel are MuJoCo's data.qpos/data.qvel
    }
    with writing(args.out):
        runfile.write(args.out, arrays, meta)
    if args.csv is not None:
        with writing(args.csv, "--csv"):
            runfile.write_csv(args.csv, runfile.read(args.out))
    return report(args, model, loaded, arrays, meta, result, failed)


def report(args, model, loaded, arrays, meta, result, failed) -> int:
    n_sys = 1 if args.batch is None else args.batch
    header = (
        f"{args.model}: {model.nb} bodies, {len(model.joint_names)} joints, nq = {model.nq}, "
        f"nv = {model.nv}, joint coordinates ({loaded.why}); {n_sys} system(s) x "
        f"{meta['n_steps']} steps of {meta['dt']:g} s ({args.integrator})"
    )
    fix = "a smaller --dt or --integrator implicitfast"
    return print_run(args, header, arrays, meta, result, failed, fix)


def check_report(loaded, dt: float, steps: int) -> dict:
    """``rbjax check`` of a JointModel: bodies and their mass, joints by type, degrees of
    freedom (nv) and nq, the equalities held, what the loader does not simulate, the
    energies and the largest |q̈| at the initial state, and ``steps`` RK4 steps of ``dt``
    (finite, the energy change, the quaternions' length). ``failures`` lists (what, fix)."""
    import collections

    model, state = loaded.model, loaded.state
    out: dict = {
        "bodies": list(model.names),
        "total_mass": float(np.sum(np.asarray(model.mass))),
        "joints": dict(collections.Counter(model.topology.joint_types)),
        "formulation": "JointCoordinates",
        "coordinates_choice": loaded.why,
        "dof": model.nv,
        "coordinates": {"nq": model.nq, "nv": model.nv, "kind": "mujoco"},
        "equalities": [e.name for e in model.equalities],
        "not_simulated": loaded.not_simulated,
        "gravity": np.asarray(model.gravity).tolist(),
    }
    q, u = state.qpos[:, None], state.qvel[:, None]
    out["kinetic_energy"] = float(kinetic(model, q, u)[0])
    out["potential_energy"] = float(potential(model, q)[0])
    out["total_energy"] = out["kinetic_energy"] + out["potential_energy"]
    qacc = np.asarray(eqx.filter_jit(model.qacc)(state.t, state.qpos, state.qvel))
    out["max_acceleration"] = float(np.max(np.abs(qacc))) if qacc.size else 0.0
    failures = []
    if not np.all(np.isfinite(qacc)):
        failures.append(
            "the accelerations at the initial state are not finite (a singular mass matrix). "
            "Fix: check the bodies' masses and inertias and the joints' armature."
        )
    if steps and not failures:
        traj = rollout(model, state, dt, steps, save_every=steps, throw=False)
        trial: dict = {"dt": dt, "steps": steps, "finite": int(traj.result) == 0}
        if trial["finite"]:
            qf, uf = traj.qpos[-1][:, None], traj.qvel[-1][:, None]
            e1 = float(kinetic(model, qf, uf)[0] + potential(model, qf)[0])
            trial["energy_change"] = e1 - out["total_energy"]
            rows = np.flatnonzero(model.topology.quat_rows)
            if rows.size:
                quat = np.asarray(traj.qpos[-1])[rows].reshape(-1, 4)
                trial["quaternion_drift"] = float(np.max(np.abs(np.linalg.norm(quat, axis=1) - 1)))
        else:
            failures.append(
                f"the trial integration failed at step {int(traj.failed_step)} of {steps} "
                f"(dt = {dt:g} s): {RESULTS(int(traj.result)).message}. Fix: a smaller step "
                "(--dt), or check masses, inertias, dampers and servo gains (rbjax simulate "
                "--integrator implicitfast for stiff ones)."
            )
        out["trial"] = trial
    out["failures"] = failures
    return out
