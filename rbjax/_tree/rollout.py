"""The time loop of a :class:`rbjax.JointModel`: :func:`rbjax.rollout` on joint coordinates.

The engine's loop (rbjax/_engine/rollout.py: the scan over saved chunks, the failure codes and
the located failing step, checkpointed groups, batch chunking) runs unchanged: it sees the
coordinates as component-first arrays q (nq, *batch, 1), u (nv, *batch, 1), the trailing axis
standing where a maximal-coordinate model has its bodies, and the model's formulation is
:class:`rbjax.JointCoordinates`, whose derivatives are M⁻¹(τ − b) (rbjax/_tree/dynamics.py).

Measures (rbjax/_measures.py) run in the same loop: their functions see ONE system's
:class:`rbjax.JointState` (rbjax/_tree/model.py ``per_joint_system``), and events and located extrema are found
on the same cubic Hermite dense output of (qpos, q̇pos) and (qvel, q̈). The plausibility
monitors are rbjax/_tree/monitors.py's, evaluated on the saved states by a second program
(as for maximal coordinates: the loop's program, and so its bits, is the same with or
without them).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer
from jaxtyping import Array, Float, Int

from .._abstract import AbstractTrajectory
from .._contact.stepping import MoreauJean
from .._engine.measures import Natural
from .._engine.monitors import cheaply_compiled
from .._engine.rollout import _WORK, DEFAULT_CHUNK, chunked, integrate
from .._errors import check_finite, is_concrete
from .._gradient_guard import GuardedSteps, guard_inputs, guard_output
from .._integrators import AbstractExplicitRK, SemiImplicitEuler
from .._results import RESULTS
from .._state import fresh_tolerances
from .equality import violations
from .implicit import ImplicitFast
from .model import JointModel, JointState, per_joint_system
from .monitors import QUANTITY, evaluate, joint_spec


class JointTrajectory(AbstractTrajectory):
    """Saved states of a rollout of a :class:`rbjax.JointModel`, the initial one first (an
    :class:`rbjax.AbstractTrajectory`):
    ``t`` (*batch, T), ``qpos`` (*batch, T, nq), ``qvel`` (*batch, T, nv) with
    T = n_steps // save_every + 1; ``result`` and ``failed_step`` (*batch,) as
    :class:`rbjax.Trajectory`'s; ``measures`` (dict name -> (*batch, ...)) the values of
    ``rollout(..., measures=...)`` or None; ``monitors`` (dict name -> (*batch,)) the worst
    value of each watched plausibility quantity ("unit_length", "energy";
    rbjax/_tree/monitors.py) or None; ``lam`` (*batch, T, m) with
    ``rollout(..., multipliers=True)``, else None: the equalities' multipliers at each saved
    state, one column per equality row in ``model.equalities`` order (the values of
    :meth:`rbjax.JointModel.equality_forces`, concatenated: a connect's force and a weld's
    force and torque on body 1, a joint coupling's generalized force on joint 1;
    minimum-norm where the rows are redundant; m = 0 without equalities), the field and
    layout of :class:`rbjax.Trajectory`'s ``lam``."""

    t: Float[Array, "*batch T"]
    qpos: Float[Array, "*batch T nq"]
    qvel: Float[Array, "*batch T nv"]
    result: Int[Array, "*batch"]
    failed_step: Int[Array, "*batch"]
    measures: dict[str, Array] | None = None
    monitors: dict[str, Array] | None = None
    lam: Float[Array, "*batch T m"] | None = None

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
    # Skipped with Baumgarte terms, which are there to pull an open loop closed, and when
    # what it reads is traced: the state and the kinematics (body and joint frames, qpos0,
    # the equalities; rbjax/_tree/kinematics.py ``frames``, equality.py ``rows``). A traced
    # mass, inertia, damping or force (jax.grad in an identification) does not prevent it:
    # those leaves get stand-ins, as the maximal check does (rbjax/_analysis/checks.py
    # ``check_mechanism_state``).
    read = (state, model.body_pos, model.body_quat, model.joint_pos, model.joint_axis)
    read = read + (model.qpos0, model.equalities)
    if model.equalities and model.baumgarte is None and is_concrete(read):
        model = jax.tree.map(
            lambda x: np.zeros(x.shape, x.dtype) if isinstance(x, Tracer) else x, model
        )
        tol = fresh_tolerances(state.qpos.dtype)[1]
        with jax.ensure_compile_time_eval():  # evaluated now, also inside a caller's jit
            found = violations(model, state.qpos, state.qvel)
        bad = [
            f"{name!r} (position {gap:.3g}, velocity {rate:.3g})"
            for name, gap, rate in found
            if not (gap <= tol and rate <= tol)
        ]
        if bad:
            raise ValueError(
                f"state0 violates the equalities {', '.join(bad)} (tolerance {tol:g}); held "
                "exactly, they would stay open and their forces would do work. Fix: "
                "state0 = rbjax.assemble(model, state0) (rbjax.load assembles the file's "
                "initial state)."
            )


def batched_parameters(model: JointModel) -> list[str]:
    """The names of the JointModel's parameters that carry batch axes."""
    return [
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
    measures: dict | None = None,
    monitors=None,
    multipliers: bool = False,
    check_gradients: bool = False,
) -> JointTrajectory:
    """:func:`rbjax.rollout` of a JointModel (the checks of dt, n_steps, save_every and
    measures are the caller's; ``monitors`` a :class:`rbjax.Plausibility` or None;
    ``multipliers``: save the equalities' multipliers, :attr:`JointTrajectory.lam`;
    ``check_gradients``: rbjax/_gradient_guard.py, the step named in the program)."""
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
    if not isinstance(
        integrator, (AbstractExplicitRK, SemiImplicitEuler, ImplicitFast, MoreauJean)
    ):
        raise ValueError(
            f"integrator = {type(integrator).__name__}() does not integrate joint coordinates "
            "yet. Fix: use rbjax.RK4(), rbjax.ExplicitRK(tableau), rbjax.SemiImplicitEuler(), "
            "rbjax.ImplicitFast() or rbjax.MoreauJean()."
        )
    unilateral = [
        f"{s.count} {what}"
        for s, what in (
            (model.contacts, "contact point(s)"),
            (model.limits, "limited joint coordinate(s)"),
        )
        if s is not None
    ]
    if unilateral and not isinstance(integrator, MoreauJean):
        raise ValueError(
            f"integrator = {type(integrator).__name__}() would ignore the model's "
            f"{' and '.join(unilateral)}: a smooth integrator has no unilateral "
            "constraints. Fix: integrator=rbjax.MoreauJean(), or a model without them."
        )
    check_joint_state(model, state0)
    batched = batched_parameters(model)
    if batched:
        raise ValueError(
            f"rollout: the JointModel's {', '.join(batched)} carry batch axes; a JointModel's "
            "parameters are one system's. Fix: map the rollout over the parameters with "
            "jax.vmap(lambda m: rbjax.rollout(m, state0, dt, n_steps))(models), or sample "
            "them with rbjax.monte_carlo."
        )
    if batch_chunk is None:
        batch_chunk = DEFAULT_CHUNK if jax.default_backend() == "cpu" else 0
    measures = {} if measures is None else measures
    spec = joint_spec(monitors, model, integrator, state0.qpos.dtype)
    traced = not is_concrete((model, state0, dt))
    if check_gradients:
        integrator, batch_chunk = _guarded(integrator, state0, int(n_steps), batch_chunk)
        model, state0 = guard_inputs((model, state0))
    traj = run_joint(
        model,
        state0,
        dt,
        integrator,
        int(n_steps),
        int(save_every),
        int(batch_chunk),
        int(checkpoint),
        measures,
        spec,
        bool(multipliers),
    )
    if throw and traced:
        traj = eqx.error_if(
            traj,
            jnp.any(traj.result != int(RESULTS.successful)),
            "rollout of a JointModel failed (a non-finite state, or a plausibility monitor "
            "exceeded its limit); rerun with throw=False to see result and failed_step",
        )
    elif throw and is_concrete(traj.result):
        _raise_on_failure(traj, spec, integrator)
    return guard_output(traj) if check_gradients else traj


def _guarded(integrator, state0: JointState, n_steps: int, batch_chunk: int):
    """(integrator, batch_chunk) of ``check_gradients=True``: the integrator's steps checked
    in reverse mode (:class:`GuardedSteps`: step k starts at t0 + k·dt). Systems that start
    at different (or traced) times carry their own t0, which pieces of a chunked batch
    would not see: such a batch runs unchunked (equal to rounding, ``rollout``'s
    ``batch_chunk``)."""
    t0 = state0.t
    if jnp.ndim(t0) and is_concrete(t0) and np.ptp(np.asarray(t0)) == 0:
        t0 = jnp.reshape(t0, (-1,))[0]
    elif jnp.ndim(t0):
        batch_chunk = 0
    return GuardedSteps(integrator, jnp.asarray(t0), n_steps), batch_chunk


def run_joint(
    model,
    state0,
    dt,
    integrator,
    n_steps,
    save_every,
    batch_chunk,
    checkpoint,
    measures,
    spec,
    multipliers=False,
) -> JointTrajectory:
    """The rollout without checks and without raising (also :func:`rbjax.monte_carlo`'s,
    under its ``jax.vmap`` over sampled parameters): the loop, then the monitors."""
    args = (n_steps, save_every, batch_chunk, checkpoint, measures, spec, multipliers)
    traj = _run(model, state0, dt, integrator, *args)
    if spec is not None:
        traj = _monitored(traj, model, spec, save_every, jnp.asarray(dt, traj.qpos.dtype))
    return traj


def _raise_on_failure(traj: JointTrajectory, spec, integrator=None) -> None:
    """EquinoxRuntimeError naming the first failing system, its step and what failed (for
    an implausible one the quantity, its worst value and the limit)."""
    codes = np.asarray(traj.result).reshape(-1)
    bad = np.flatnonzero(codes != int(RESULTS.successful))
    if not bad.size:
        return
    k = int(bad[0])
    step = int(np.asarray(traj.failed_step).reshape(-1)[k])
    system = f" (system {k}, flat index)" if codes.size > 1 else ""
    code = RESULTS(int(codes[k]))
    if code == RESULTS.implausible and spec is not None and traj.monitors:
        limits = {"unit_length": spec.unit, "energy": spec.energy}
        worst = {n: float(np.asarray(v).reshape(-1)[k]) for n, v in traj.monitors.items()}
        name = max(worst, key=lambda n: worst[n] / float(limits[n]))
        raise eqx.EquinoxRuntimeError(
            f"rbjax.rollout: implausible result by step {step}{system} of a JointModel: "
            f"{QUANTITY[name]} reached {worst[name]:.3g} (limit {float(limits[name]):.3g}). "
            "Fix: reduce dt (or use rbjax.ImplicitFast() for stiff damping), check forces and "
            "initial conditions; loosen a limit knowingly with monitors=rbjax.Plausibility(...) "
            "or disable them with monitors=None; or pass throw=False and inspect "
            "JointTrajectory.result / monitors."
        )
    if code == RESULTS.solver_failed and type(integrator).__name__ == "MoreauJean":
        raise eqx.EquinoxRuntimeError(
            f"rbjax.rollout: the contact solver (MoreauJean) did not reach its tolerance at "
            f"step {step}{system} of a JointModel. Fix: raise MoreauJean(max_iter=...) or "
            "accept=... (a stack, or a contact on the stick-slip boundary, converges slowly: "
            "docs/guide/contact.md), reduce dt, or pass throw=False and inspect "
            "JointTrajectory.result / failed_step."
        )
    raise eqx.EquinoxRuntimeError(
        f"rbjax.rollout: {code.message} at step {step}{system} of a JointModel. Fix: reduce "
        "dt, or pass throw=False and inspect JointTrajectory.result / failed_step."
    )


@eqx.filter_jit
def _run(
    model,
    state0,
    dt,
    integrator,
    n_steps,
    save_every,
    batch_chunk,
    checkpoint,
    measures,
    spec,
    multipliers,
):
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
    natural = tuple(Natural(m, per_joint_system) for m in measures.values())
    # the loop accumulates the work of the forces without a potential (a deferred Spec:
    # integrate returns it, _monitored judges it); a conservative tree needs nothing there
    work = spec if spec is not None and spec.balance == "work" else None
    args = (integrator, h, n_steps, save_every, multipliers, checkpoint, natural, work)
    B = batch[0] if len(batch) == 1 else 0
    if batch_chunk and B > batch_chunk:
        saved, code, step, values, work = chunked(model, t, q, u, batch, batch_chunk, args)
    else:
        saved, code, step, values, work = integrate(model, t, q, u, batch, *args)
    nb = len(batch)
    ts, qs, us = (jnp.moveaxis(x, 0, nb) for x in saved[:3])
    return JointTrajectory(
        t=ts,
        qpos=qs[..., 0, :],
        qvel=us[..., 0, :],
        result=code,
        failed_step=step,
        measures=dict(zip(measures, values, strict=True)) if measures else None,
        monitors=work or None,  # the loop's work series (T, *batch), for _monitored
        lam=jnp.moveaxis(saved[3], 0, nb) if multipliers else None,
    )


@cheaply_compiled
def _monitored(traj: JointTrajectory, model, spec, save_every: int, h) -> JointTrajectory:
    """The plausibility monitors of a finished rollout (rbjax/_tree/monitors.py): a system
    becomes implausible where it had not failed, or had failed only later; ``monitors``
    (the loop's work series) is replaced by the monitors' worst values."""
    nbatch = traj.result.ndim
    t, qpos, qvel = (jnp.moveaxis(x, nbatch, 0) for x in (traj.t, traj.qpos, traj.qvel))
    work = None
    if spec.balance == "work" and traj.monitors is not None:
        work = tuple(traj.monitors[k] for k in _WORK)
    # the monitors judge the computed trajectory; they are no differentiable output (under
    # jax.grad nothing of them is linearised, and no 0 · inf of theirs reaches a gradient)
    sg = lambda x: jax.lax.stop_gradient(x) if eqx.is_array(x) else x  # noqa: E731
    model, t, qpos, qvel, work, h = jax.tree.map(sg, (model, t, qpos, qvel, work, h))
    step, worst = evaluate(spec, model, t, qpos, qvel, save_every, h, work)
    code, fail_step = traj.result, traj.failed_step
    earlier = (step >= 0) & ((code == int(RESULTS.successful)) | (step < fail_step))
    code = jnp.where(earlier, int(RESULTS.implausible), code)
    fail_step = jnp.where(earlier, step, fail_step)
    return eqx.tree_at(
        lambda tr: (tr.result, tr.failed_step, tr.monitors),
        traj,
        (code, fail_step, worst),
        is_leaf=lambda x: x is None,
    )
