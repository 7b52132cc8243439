"""Kinematic analysis of a fully driven mechanism (DOF = 0): ME751's position, velocity and
acceleration analyses, with the inverse-dynamics efforts of the drivers."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._engine.layout import from_components, to_components
from .._engine.projection import driven_position, project_velocity
from .._errors import is_concrete
from .._oneshot import one_shot_jit
from .._state import State
from .assembly import require_joints
from .mobility import mobility


class KinematicResult(eqx.Module):
    """Result of :func:`kinematic_analysis`: ``t`` (T,), ``q``/``u``/``udot`` (T, nb, 7),
    ``lam`` (T, nb + m) the multipliers of the equations of motion along the prescribed motion
    (the driver rows are the actuator forces/torques of inverse dynamics), ``residual`` (T,) the
    largest position residual."""

    t: Float[Array, " T"]
    q: Float[Array, "T nb 7"]
    u: Float[Array, "T nb 7"]
    udot: Float[Array, "T nb 7"]
    lam: Float[Array, "T m"]
    residual: Float[Array, " T"]


@one_shot_jit
def _kinematic_scan(model, q0, times, tol, max_iters):
    def one(q_prev, t):
        tt = jnp.reshape(t, (1,))
        q, err, _ = driven_position(model, tt, q_prev, tol, max_iters, dense=True)
        u = project_velocity(model, tt, q, jnp.zeros_like(q), dense=True)
        # DOF = 0: the equations of motion determine the same u̇ as W̃u̇ = γ, and their
        # multipliers are the inverse-dynamics efforts (one W/γ evaluation for both).
        _, udot, lam = model.formulation._engine_derivatives(model, tt, q, u)
        st = from_components(tt, q, u)
        return q, (st.t, st.q, st.u, jnp.moveaxis(udot, 0, -1), lam, jnp.max(err))

    _, out = jax.lax.scan(one, q0, times)
    return out


def kinematic_analysis(
    model, state0: State, times, *, tol: float | None = None, max_iters: int = 50
) -> KinematicResult:
    """Position, velocity and acceleration analysis of a fully driven mechanism (DOF = 0).

    At each time in ``times`` (ascending), Newton–Raphson solves Φ(q, t) = 0 from the previous
    solution, then Φ_q q̇ = −Φ_t and Φ_q q̈ = γ (in generalized velocities: W̃u = −c_t,
    W̃u̇ = γ). The equations of motion along this motion give the multipliers, whose driver rows
    are the driving forces/torques (inverse dynamics; reactions via :func:`rbjax.reactions`).
    Raises ValueError if the mechanism is not fully driven (DOF ≠ 0) or a position solve fails
    (checked on concrete inputs). Differentiable in forward and reverse mode with respect to
    the model (geometry, driver parameters) by the implicit function theorem at every instant.
    """
    require_joints(model, "kinematic_analysis")
    times = jnp.asarray(times, state0.q.dtype)
    if times.ndim != 1 or times.shape[0] < 1:
        raise ValueError(
            f"kinematic_analysis: times has shape {times.shape}. Fix: pass a 1-D array of times."
        )
    if state0.q.ndim != 2:
        raise ValueError(
            f"kinematic_analysis: state0.q has shape {state0.q.shape}; pass ONE system (nb, 7) "
            "(use jax.vmap for batches)."
        )
    if tol is None:
        tol = 1e-12 if state0.q.dtype == jnp.float64 else 1e-5
    _, q0, _ = to_components(state0)
    t, q, u, udot, lam, res = _kinematic_scan(model, q0, times, float(tol), int(max_iters))
    # The mobility check needs values: it runs when the model and state are concrete (call
    # once outside jax.grad/jacfwd/jit to get it; under a transformation it is skipped). It
    # takes the configuration that the analysis's first solve put on the joints at times[0]
    # (the Gauss-Newton iteration that rbjax.assemble starts with, which ends on the joints
    # for any DOF) instead of assembling the start state in a program of its own (6 of the
    # 14 s that the slider-crank's analysis took to compile, measured on 2 cores).
    if is_concrete((model, state0, times)):
        mob = mobility(model, State(t=t[0], q=q[0], u=u[0]))
        if mob.dof != 0:
            raise ValueError(
                f"kinematic_analysis needs a fully driven mechanism (DOF = 0), but this one has "
                f"DOF = {mob.dof} ({mob.rows} joint equations of rank {mob.rank}). Fix: add "
                "drivers (RotationDriver, TranslationDriver or a driven DP1/DP2/D/CD) for the "
                "free coordinates, or use rbjax.rollout for dynamics."
            )
    if is_concrete(res) and not np.all(np.asarray(res) <= 100 * tol):
        k = int(np.argmax(~(np.asarray(res) <= 100 * tol)))
        raise ValueError(
            f"kinematic_analysis: the position analysis failed at times[{k}] = {float(times[k]):.6g}"
            f" (residual {float(res[k]):.3g}). The mechanism may pass a singular (lock-up) "
            "configuration there. Fix: check the driver functions and the geometry."
        )
    return KinematicResult(t=t, q=q, u=u, udot=udot, lam=lam, residual=res)
