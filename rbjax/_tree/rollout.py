"""The time loop of a :class:`rbjax.JointModel`: :func:`rbjax.rollout` on joint coordinates.

The engine's loop (rbjax/_engine/rollout.py: the scan over saved chunks, the failure codes and
the located failing step, checkpointed groups, batch chunking) runs unchanged: it sees the
coordinates as component-first arrays q (nq, *batch, 1), u (nv, *batch, 1), the trailing axis
standing where a maximal-coordinate model has its bodies, and the model's formulation is
:class:`rbjax.JointCoordinates`, whose derivatives are M⁻¹(τ − b) (rbjax/_tree/dynamics.py).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from .._engine.rollout import DEFAULT_CHUNK, chunked, integrate
from .._errors import check_finite, is_concrete
from .._integrators import AbstractExplicitRK, SemiImplicitEuler
from .._results import RESULTS
from .implicit import ImplicitFast
from .model import JointModel, JointState


class JointTrajectory(eqx.Module):
    """Saved states of a rollout of a :class:`rbjax.JointModel`, the initial one first:
    ``t`` (*batch, T), ``qpos`` (*batch, T, nq), ``qvel`` (*batch, T, nv) with
    T = n_steps // save_every + 1; ``result`` and ``failed_step`` (*batch,) as
    :class:`rbjax.Trajectory`'s."""

    t: Float[Array, "*batch T"]
    qpos: Float[Array, "*batch T nq"]
    qvel: Float[Array, "*batch T nv"]
    result: Int[Array, "*batch"]
    failed_step: Int[Array, "*batch"]

    def __getitem__(self, i) -> JointState:
        """The i-th saved state of every batch member."""
        return jax.tree.unflatten(
            jax.tree.structure(JointState(0.0, jnp.zeros(1), jnp.zeros(1))),
            (self.t[..., i], self.qpos[..., i, :], self.qvel[..., i, :]),
        )

    @property
    def final(self) -> JointState:
        """The state after the last step."""
        return self[-1]


def check_joint_state(model: JointModel, state: JointState) -> None:
    """Shapes and finiteness of an initial state (ValueError naming the field)."""
    nq, nv = model.nq, model.nv
    if state.qpos.shape[-1:] != (nq,) or state.qvel.shape[-1:] != (nv,):
        raise ValueError(
            f"state0 has qpos {tuple(state.qpos.shape)} and qvel {tuple(state.qvel.shape)}; the "
            f"model has nq = {nq}, nv = {nv}. Fix: build the state with rbjax.JointState(t, "
            "qpos (..., nq), qvel (..., nv)), e.g. from rbjax.load's state."
        )
    fix = "start from finite coordinates"
    check_finite("state0.qpos", state.qpos, fix)
    check_finite("state0.qvel", state.qvel, fix)
    topo = model.topology
    if is_concrete(state.qpos) and topo.quat_rows.any():
        q = np.asarray(state.qpos)
        for j, k in enumerate(topo.joint_types):
            if k in ("ball", "free"):
                a = topo.qposadr[j] + (3 if k == "free" else 0)
                n = np.linalg.norm(q[..., a : a + 4], axis=-1).reshape(-1)
                tol = 1e-6 if q.dtype == np.float64 else 1e-3
                bad = np.flatnonzero(np.abs(n - 1.0) > tol)
                if bad.size:
                    i = int(bad[0])
                    system = f" (system {i}, flat index)" if n.size > 1 else ""
                    raise ValueError(
                        f"state0.qpos[..., {a}:{a + 4}] (the quaternion of {k} joint "
                        f"{topo.joint_names[j]!r}){system} has length {float(n[i]):.6g}, "
                        "not 1. Fix: normalise it (q / |q|)."
                    )


def rollout_tree(
    model: JointModel,
    state0,
    dt,
    n_steps: int,
    *,
    integrator,
    save_every: int,
    throw: bool,
    batch_chunk,
    checkpoint: int,
) -> JointTrajectory:
    """:func:`rbjax.rollout` of a JointModel (the checks of dt, n_steps and save_every are
    the caller's)."""
    if isinstance(state0, JointTrajectory):
        codes = np.asarray(state0.result) if is_concrete(state0.result) else None
        if codes is not None and np.any(codes != int(RESULTS.successful)):
            raise ValueError(
                "state0 is a JointTrajectory with failed systems; it cannot be continued. Fix: "
                "continue only the successful systems, or rerun with a smaller dt."
            )
        state0 = state0.final
    if not isinstance(state0, JointState):
        raise ValueError(
            f"state0 = {type(state0).__name__} is not an rbjax.JointState. Fix: a JointModel "
            "integrates joint coordinates: pass rbjax.JointState(t, qpos, qvel) (rbjax.load "
            "returns one with the model)."
        )
    if not isinstance(integrator, (AbstractExplicitRK, SemiImplicitEuler, ImplicitFast)):
        raise ValueError(
            f"integrator = {type(integrator).__name__}() does not integrate joint coordinates "
            "yet. Fix: use rbjax.RK4(), rbjax.ExplicitRK(tableau), rbjax.SemiImplicitEuler() "
            "or rbjax.ImplicitFast()."
        )
    check_joint_state(model, state0)
    batched = [
        name
        for name, leaf in (
            ("mass", model.mass),
            ("inertia", model.inertia),
            ("gravity", model.gravity),
            ("body_pos", model.body_pos),
            ("damping", model.damping),
        )
        if jnp.ndim(leaf) != {"inertia": 3, "body_pos": 2}.get(name, 1)
    ]
    if batched:
        raise ValueError(
            f"rollout: the JointModel's {', '.join(batched)} carry batch axes; a JointModel's "
            "parameters are one system's. Fix: map the rollout over the parameters with "
            "jax.vmap(lambda m: rbjax.rollout(m, state0, dt, n_steps))(models)."
        )
    if batch_chunk is None:
        batch_chunk = DEFAULT_CHUNK if jax.default_backend() == "cpu" else 0
    traced = not is_concrete((model, state0, dt))
    traj = _run(
        model,
        state0,
        dt,
        integrator,
        int(n_steps),
        int(save_every),
        bool(throw) and not is_concrete((model, state0, dt)),
        int(batch_chunk),
        int(checkpoint),
    )
    if throw and not traced and is_concrete(traj.result):
        codes = np.asarray(traj.result).reshape(-1)
        bad = np.flatnonzero(codes != int(RESULTS.successful))
        if bad.size:
            k = int(bad[0])
            step = int(np.asarray(traj.failed_step).reshape(-1)[k])
            system = f" (system {k}, flat index)" if codes.size > 1 else ""
            raise eqx.EquinoxRuntimeError(
                f"rbjax.rollout: {RESULTS(int(codes[k])).message} at step {step}{system} of a "
                "JointModel. Fix: reduce dt, or pass throw=False and inspect "
                "JointTrajectory.result / failed_step."
            )
    return traj


@eqx.filter_jit
def _run(model, state0, dt, integrator, n_steps, save_every, throw, batch_chunk, checkpoint):
    batch = tuple(
        jnp.broadcast_shapes(
            state0.qpos.shape[:-1],
            state0.qvel.shape[:-1],
            jnp.shape(state0.t),
        )
    )
    dtype = state0.qpos.dtype
    q = jnp.broadcast_to(jnp.moveaxis(state0.qpos, -1, 0)[..., None], (model.nq,) + batch + (1,))
    u = jnp.broadcast_to(jnp.moveaxis(state0.qvel, -1, 0)[..., None], (model.nv,) + batch + (1,))
    t = jnp.broadcast_to(jnp.asarray(state0.t, dtype)[..., None], batch + (1,))
    h = jnp.asarray(dt, dtype)
    args = (integrator, h, n_steps, save_every, False, checkpoint, (), None)
    B = batch[0] if len(batch) == 1 else 0
    if batch_chunk and B > batch_chunk:
        saved, code, step, _, _ = chunked(model, t, q, u, batch, batch_chunk, args)
    else:
        saved, code, step, _, _ = integrate(model, t, q, u, batch, *args)
    nb = len(batch)
    ts, qs, us = (jnp.moveaxis(x, 0, nb) for x in saved[:3])
    traj = JointTrajectory(
        t=ts, qpos=qs[..., 0, :], qvel=us[..., 0, :], result=code, failed_step=step
    )
    if throw:
        traj = eqx.error_if(
            traj,
            jnp.any(code != int(RESULTS.successful)),
            "rollout of a JointModel failed (non-finite state); rerun with throw=False to see "
            "result and failed_step",
        )
    return traj
