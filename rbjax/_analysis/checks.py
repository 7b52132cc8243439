"""The checks every mechanism rollout runs before its first step: the initial state satisfies
the joints' position and velocity equations. (Redundant joint equations are not an error: every
formulation runs them, with the minimum-norm multipliers, rbjax/_engine/rank.py.)"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer

from .._body import definite_rtol, rounding_tol
from .._engine.joints import joint_terms
from .._engine.layout import to_components
from .._engine.projection import norm_rows
from .._engine.rank import may_be_redundant
from .._errors import declared, declared_violations, is_concrete
from .._oneshot import one_shot_jit
from .._state import State, fresh_tolerances
from .change_points import check_singular_start


@one_shot_jit
def _consistency(model, state):
    """Residuals and velocity residuals of every batch member, and the W blocks of the first
    (one compiled function: these checks run before every rollout's first call)."""
    t, q, u = to_components(state)
    terms = joint_terms(
        model, model.formulation._engine_kinematics, t, q, u, cdot=True, gamma=False
    )
    first = [tuple(w.reshape(w.shape[:2] + (-1,))[..., 0] for w in pair) for pair in terms.W]
    return norm_rows(model, terms.c), norm_rows(model, terms.cdot), first


def check_mechanism_state(model, state: State, *, tol: float | None = None) -> None:
    """Build-time checks of a mechanism's initial state (skipped when the state, the joints or
    the formulation are traced, e.g. under ``jax.grad`` with respect to a joint point).

    The joints must hold (|Φ| ≤ tol) and their velocity equations too (|W u + Φ_t| ≤ tol),
    otherwise ValueError naming the joints and suggesting :func:`rbjax.assemble`. A model whose
    equations can be dependent (loops, user constraints) warns when the configuration (of the
    first system of a batch) is singular, a change point
    (:class:`rbjax.SingularConfigurationWarning`, rbjax/_analysis/change_points.py).
    """
    # Only what the checks read must be concrete: the state and the joints (and the
    # formulation's kinematics). A traced mass or force (e.g. under jax.grad in an
    # identification) does not prevent them.
    if not model.joints or not is_concrete((state, model.joints, model.formulation)):
        return
    # the checks never read masses, inertias, gravity or forces: stand-ins for traced ones
    model = jax.tree.map(
        lambda x: np.zeros(x.shape, x.dtype) if isinstance(x, Tracer) else x, model
    )
    if tol is None:
        tol = fresh_tolerances(state.q.dtype)[1]
    # evaluated now even when called inside an outer jit/grad trace (the inputs are concrete)
    with jax.ensure_compile_time_eval():
        c, cd, first = _consistency(model, state)
    for what, val, fix in (
        ("position", c, "rbjax.assemble(model, state)"),
        ("velocity", cd, "rbjax.assemble(model, state) (it also projects the velocities)"),
    ):
        val = np.asarray(val).reshape(len(model.joints), -1).max(axis=1)
        bad = [(n, e) for n, e in zip(model.joint_names, val, strict=True) if not e <= tol]
        if bad:
            worst = ", ".join(f"'{n}' ({e:.3g})" for n, e in bad)
            raise ValueError(
                f"The initial state violates the {what} equations of joints {worst} "
                f"(tolerance {tol:.1g}). Fix: make the state consistent with {fix}; to "
                "continue a rollout, pass its Trajectory as the initial state (rollout accepts "
                "the drift its integrator left)."
            )
    if may_be_redundant(model):  # a change point at the start (the first system of a batch)
        q, u = (np.asarray(x).reshape((-1,) + np.shape(x)[-2:])[0] for x in (state.q, state.u))
        blocks = [np.concatenate([np.asarray(w[side]) for w in first]) for side in (0, 1)]
        with jax.ensure_compile_time_eval():  # State converts its fields with jnp
            one = State(t=np.reshape(np.asarray(state.t), -1)[0], q=q, u=u)
            check_singular_start(model, one, *blocks)


# The in-program twins of the build-time checks, in the order they are reported: (field,
# problem, fix); None: the generic fix (call rollout outside the transformation). The rules
# that objects declare on their parameters (rbjax/_errors.py Rule) follow the model's checks.
MODEL_CHECKS: tuple[tuple[str, str, str | None], ...] = (
    ("dt", "is not a positive finite step (dt <= 0 freezes or runs backwards)", None),
    ("model.mass", "holds a mass that is not positive and finite", None),
    (
        "model.inertia",
        "holds an inertia that is not finite, symmetric and positive definite, or violates "
        "the triangle inequality I1 + I2 >= I3",
        None,
    ),
    ("model.gravity", "is not finite", None),
)
STATE_CHECKS: tuple[tuple[str, str, str | None], ...] = (
    (
        "state0",
        "is a Trajectory whose system failed (Trajectory.result != RESULTS.successful): its "
        "states are NaN or implausible from the failed step on",
        "continue only the successful systems, or rerun with a smaller dt",
    ),
    ("state0", "is not finite (NaN or inf)", None),
    ("state0.q", "gives a rigid body |A|² != 1 (Möller & Glocker 2012, eq. (77))", None),
    ("state0.u", "gives a rigid body a scaling rate ν != 0", None),
    ("state0", "violates the joints' position or velocity equations (see rbjax.assemble)", None),
)


def model_rules(model):
    """``(path, object, rule)`` of every rule declared on the model's parameters: its own
    (Baumgarte's gains), its forces' (and their actuators'), its joints' and its
    formulation's (rbjax/_errors.py :func:`declared`)."""
    return declared(model, "model", fields=("forces", "joints", "formulation"))


def _per_system(bad, batch):
    """A violation of one object's parameters as a flag per system of the rollout: broadcast
    over the batch (a force's parameters belong to every system; under ``jax.vmap`` each
    system sees its own)."""
    bad = jnp.asarray(bad)
    try:
        return jnp.broadcast_to(bad, batch)
    except ValueError:  # axes that are not the rollout's batch: the object as a whole
        return jnp.broadcast_to(jnp.any(bad), batch)


def input_violations(model, state: State, dt, batch, *, fresh: bool, prior=None):
    """The build-time checks of :func:`rbjax.rollout` evaluated INSIDE the program, for inputs
    traced by ``jax.jit``, ``jax.vmap`` or ``jax.grad`` (whose values the eager checks cannot
    see). Returns (per system, shape ``batch``, the index of the first violated check or −1;
    the checks as (field, problem, fix or None)). Same conditions and tolerances as the eager
    checks (:func:`rbjax._body.validate_inertia`, the rules the model's parts declare,
    ``Model.check_state``, :func:`check_mechanism_state`). ``fresh=False`` (a continued
    Trajectory, which carries its integrator's drift) checks the state's finiteness only, and
    ``prior`` (the trajectory's result codes) that none of its systems failed.

    Computed on ``stop_gradient`` of the inputs: the checks never enter a derivative (the
    eigenvalues of a repeated principal moment have no derivative)."""
    dyn, static = eqx.partition((model, state, dt), eqx.is_inexact_array)
    model, state, dt = eqx.combine(jax.lax.stop_gradient(dyn), static)
    dtype = state.q.dtype
    h = jnp.asarray(dt, dtype)
    fails = [~(jnp.isfinite(h) & (h > 0))]
    m = model.mass
    fails.append(jnp.any(~(jnp.isfinite(m) & (m > 0)), axis=-1))
    th = model.inertia
    scale = jnp.max(jnp.abs(th), axis=(-2, -1))
    rounding = rounding_tol(th.dtype)
    sym = jnp.max(jnp.abs(th - jnp.swapaxes(th, -1, -2)), axis=(-2, -1)) <= rounding * scale
    finite = jnp.all(jnp.isfinite(th), axis=(-2, -1))
    w = jnp.linalg.eigvalsh(jnp.where(finite[..., None, None], th, jnp.eye(3, dtype=th.dtype)))
    definite = (w[..., 0] > definite_rtol(th.dtype) * w[..., 2]) & (w[..., 2] > 0)
    triangle = w[..., 0] + w[..., 1] >= w[..., 2] - rounding * jnp.sum(w, axis=-1)
    fails.append(jnp.any(~(finite & sym & definite & triangle), axis=-1))
    fails.append(~jnp.all(jnp.isfinite(model.gravity), axis=-1))
    checks = list(MODEL_CHECKS)
    for field, problem, fix, bad in declared_violations(model_rules(model)):
        checks.append((field, problem, fix))
        fails.append(_per_system(bad, batch))
    checks += STATE_CHECKS
    fails.append(jnp.asarray(False) if prior is None else prior != 0)
    fails.append(
        ~(
            jnp.all(jnp.isfinite(state.q), axis=(-2, -1))
            & jnp.all(jnp.isfinite(state.u), axis=(-2, -1))
            & jnp.isfinite(state.t)
        )
    )
    atol, tol = fresh_tolerances(dtype)
    rigid = model.rigid
    a2 = jnp.sum(state.q[..., 3:7] ** 2, axis=-1)
    fails.append(fresh & jnp.any(rigid & ~(jnp.abs(a2 - 1) <= atol), axis=-1))
    fails.append(fresh & jnp.any(rigid & ~(jnp.abs(state.u[..., 3]) <= atol), axis=-1))
    if fresh and model.joints:
        t, q, u = to_components(state)
        terms = joint_terms(
            model, model.formulation._engine_kinematics, t, q, u, cdot=True, gamma=False
        )
        worst = jnp.maximum(jnp.max(jnp.abs(terms.c), axis=0), jnp.max(jnp.abs(terms.cdot), 0))
        fails.append(~(worst <= tol))
    first = jnp.full(batch, -1, jnp.int32)
    for k in reversed(range(len(fails))):
        first = jnp.where(jnp.broadcast_to(fails[k], batch), k, first)
    return first, tuple(checks)
