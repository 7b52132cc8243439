"""The checks every mechanism rollout runs before its first step: the initial state satisfies
the joints' position and velocity equations. (Redundant joint equations are not an error: every
formulation runs them, with the minimum-norm multipliers, rbjax/_engine/rank.py.)"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer

from .._body import definite_rtol
from .._engine.joints import joint_terms
from .._engine.layout import to_components
from .._engine.projection import norm_rows
from .._errors import is_concrete
from .._oneshot import one_shot_jit
from .._state import State, fresh_tolerances


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
    otherwise ValueError naming the joints and suggesting :func:`rbjax.assemble`.
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
        c, cd, _ = _consistency(model, state)
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


# The in-program twins of the build-time checks, in the order they are reported.
INPUT_CHECKS = (
    ("dt", "is not a positive finite step (dt <= 0 freezes or runs backwards)"),
    ("model.mass", "holds a mass that is not positive and finite"),
    (
        "model.inertia",
        "holds an inertia that is not finite, symmetric and positive definite, or violates "
        "the triangle inequality I1 + I2 >= I3",
    ),
    ("model.gravity", "is not finite"),
    ("state0.q", "gives a rigid body |A|² != 1 (Möller & Glocker 2012, eq. (77))"),
    ("state0.u", "gives a rigid body a scaling rate ν != 0"),
    ("state0", "violates the joints' position or velocity equations (see rbjax.assemble)"),
)


def input_violations(model, state: State, dt, batch, *, joints: bool):
    """The build-time checks of :func:`rbjax.rollout` evaluated INSIDE the program, for inputs
    traced by ``jax.jit``, ``jax.vmap`` or ``jax.grad`` (whose values the eager checks cannot
    see): per system (shape ``batch``), the index into :data:`INPUT_CHECKS` of the first
    violated check, or −1. Same conditions and tolerances as the eager checks
    (:func:`rbjax._body.validate_inertia`, ``Model.check_state``, :func:`check_mechanism_state`);
    ``joints=False`` skips the joint equations (a continued Trajectory carries drift).

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
    sym = jnp.max(jnp.abs(th - jnp.swapaxes(th, -1, -2)), axis=(-2, -1)) <= 1e-12 * scale
    finite = jnp.all(jnp.isfinite(th), axis=(-2, -1))
    w = jnp.linalg.eigvalsh(jnp.where(finite[..., None, None], th, jnp.eye(3, dtype=th.dtype)))
    definite = (w[..., 0] > definite_rtol(th.dtype) * w[..., 2]) & (w[..., 2] > 0)
    triangle = w[..., 0] + w[..., 1] >= w[..., 2] - 1e-12 * jnp.sum(w, axis=-1)
    fails.append(jnp.any(~(finite & sym & definite & triangle), axis=-1))
    fails.append(~jnp.all(jnp.isfinite(model.gravity), axis=-1))
    atol, tol = fresh_tolerances(dtype)
    rigid = model.rigid
    a2 = jnp.sum(state.q[..., 3:7] ** 2, axis=-1)
    fails.append(jnp.any(rigid & ~(jnp.abs(a2 - 1) <= atol), axis=-1))
    fails.append(jnp.any(rigid & ~(jnp.abs(state.u[..., 3]) <= atol), axis=-1))
    if joints and model.joints:
        t, q, u = to_components(state)
        terms = joint_terms(
            model, model.formulation._engine_kinematics, t, q, u, cdot=True, gamma=False
        )
        worst = jnp.maximum(jnp.max(jnp.abs(terms.c), axis=0), jnp.max(jnp.abs(terms.cdot), 0))
        fails.append(~(worst <= tol))
    first = jnp.full(batch, -1, jnp.int32)
    for k in reversed(range(len(fails))):
        first = jnp.where(jnp.broadcast_to(fails[k], batch), k, first)
    return first
