"""Kinematic analysis of a fully driven mechanism (DOF = 0): ME751's position, velocity and
acceleration analyses, with the inverse-dynamics efforts of the drivers."""

from __future__ import annotations

import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float

from .._engine.layout import from_components, to_components
from .._engine.projection import _renormalise, driven_position, project_velocity
from .._errors import is_concrete, validates_inputs
from .._model import Model
from .._oneshot import one_shot_jit
from .._state import State
from .._tree.model import maximal_only
from .change_points import (
    SingularConfigurationWarning,
    first_time,
    jacobian_now,
    passages,
    path_message,
    track,
    track_init,
)
from .mobility import mobility


class KinematicResult(eqx.Module):
    """Result of :func:`kinematic_analysis`: ``t`` (T,), ``q``/``u``/``udot`` (T, nb, 7),
    ``lam`` (T, nb + m) the multipliers of the equations of motion along the prescribed motion
    (the driver rows are the actuator forces/torques of inverse dynamics), ``residual`` (T,) the
    largest position residual.

    Singular configurations (change points, rbjax/_analysis/change_points.py): ``conditioning``
    (T,) the smallest singular value of the joint Jacobian W̃ relative to the largest (1/its
    condition number); ``singular`` (T,) True at tₖ if the mechanism is AT a singular
    configuration there (conditioning ≤ 1e-9, 1000 ε in float32) or crossed one since tₖ₋₁
    (the smallest singular value changed sign); ``singular_time`` (T,) the estimated time of
    that configuration (tₖ, or interpolated between tₖ₋₁ and tₖ), NaN elsewhere;
    :attr:`first_singular` the first of them (NaN if none)."""

    t: Float[Array, " T"]
    q: Float[Array, "T nb 7"]
    u: Float[Array, "T nb 7"]
    udot: Float[Array, "T nb 7"]
    lam: Float[Array, "T m"]
    residual: Float[Array, " T"]
    conditioning: Float[Array, " T"]
    singular: Bool[Array, " T"]
    singular_time: Float[Array, " T"]

    @property
    def first_singular(self) -> Array:
        """The estimated time [s] of the first singular configuration passed, NaN if none."""
        return first_time(self.singular, self.singular_time)


def _predict(model, q1, q2, t1, t2, t, k):
    """The Newton start at time t: the secant (tangent) predictor of continuation methods
    (Allgower & Georg, Introduction to Numerical Continuation Methods, 2003, §2.2 and §6.1)
    q₂ + (t − t₂)/(t₂ − t₁) (q₂ − q₁) from the two previous solutions (q₁ at t₁, q₂ at t₂;
    rigid quaternions renormalised); the previous solution before two exist.

    Why: at a change point the Newton start decides the branch. Started from the previous
    solution, a solve whose previous time lies exactly on the change point of a slider-crank
    with r = l fell onto the folded branch (x = 0, measured: |x − 2r cos θ| up to 2r beyond
    it); the secant start lies O(h²) from the smooth continuation and O(h) from the other
    branch, so Newton converges to the smooth one. The start carries no derivative
    (``stop_gradient``): a DOF = 0 root does not depend on where Newton starts."""
    gap = t2 - t1
    scale = jnp.where((k >= 2) & (gap > 0), (t - t2) / jnp.where(gap > 0, gap, 1.0), 0.0)
    return jax.lax.stop_gradient(_renormalise(model, q2 + scale * (q2 - q1)))


@one_shot_jit
def _kinematic_scan(model, q0, times, tol, max_iters):
    def one(carry, t):
        q1, q2, t1, t2, k, path = carry
        tt = jnp.reshape(t, (1,))
        start = _predict(model, q1, q2, t1, t2, t, k)
        q, err, _ = driven_position(model, tt, start, tol, max_iters, dense=True)
        u = project_velocity(model, tt, q, jnp.zeros_like(q), dense=True)
        # DOF = 0: the equations of motion determine the same u̇ as W̃u̇ = γ, and their
        # multipliers are the inverse-dynamics efforts (one W/γ evaluation for both).
        _, udot, lam = model.formulation._engine_derivatives(model, tt, q, u)
        # the rank test of the joint Jacobian (change points, rbjax/_analysis/change_points.py):
        # 3 % of the slider-crank's run time, 1-2 s of its compile time (2 cores, measured)
        mat = jax.lax.stop_gradient(jacobian_now(model, tt, q))
        path, sing = track(path, t, mat, min(mat.shape) - 1)  # DOF = 0: rank = columns
        st = from_components(tt, q, u)
        new = (q2, q, t2, t, k + 1, path)
        return new, (st.t, st.q, st.u, jnp.moveaxis(udot, 0, -1), lam, jnp.max(err), sing)

    zero = jnp.zeros((), times.dtype)
    init = (q0, q0, zero, zero, jnp.asarray(0), track_init(model, q0.dtype))
    _, (t, q, u, udot, lam, res, sing) = jax.lax.scan(one, init, times)
    ratio, at, crossed, t_cross = sing
    singular, when = passages(times, at, crossed, t_cross)
    return t, q, u, udot, lam, res, ratio, singular, when


def _not_driven(mob) -> ValueError:
    """The error of :func:`kinematic_analysis` for a mechanism with DOF != 0."""
    return ValueError(
        f"kinematic_analysis needs a fully driven mechanism (DOF = 0), but this one has "
        f"DOF = {mob.dof} ({mob.rows} joint equations of rank {mob.rank}). Fix: add "
        "drivers (RotationDriver, TranslationDriver or a driven DP1/DP2/D/CD) for the "
        "free coordinates, or use rbjax.rollout for dynamics."
    )


@validates_inputs
def kinematic_analysis(
    model: Model, state0: State, times, *, tol: float | None = None, max_iters: int = 50
) -> KinematicResult:
    """Position, velocity and acceleration analysis of a fully driven mechanism (DOF = 0).

    At each time in ``times`` (ascending), Newton–Raphson solves Φ(q, t) = 0 from the linear
    extrapolation of the two previous solutions (the secant predictor of continuation methods;
    from the previous solution at the second time, from ``state0`` at the first), then
    Φ_q q̇ = −Φ_t and Φ_q q̈ = γ (in generalized velocities: W̃u = −c_t, W̃u̇ = γ). The
    equations of motion along this motion give the multipliers, whose driver rows are the
    driving forces/torques (inverse dynamics; reactions via :func:`rbjax.reactions`).
    Raises ValueError if the mechanism is not fully driven (DOF ≠ 0) or a position solve fails
    (checked on concrete inputs). Differentiable in forward and reverse mode with respect to
    the model (geometry, driver parameters) by the implicit function theorem at every instant.

    Singular configurations (change points): the rank of the joint Jacobian is tested at every
    time inside the same compiled program (``result.conditioning``, ``result.singular``,
    ``result.singular_time``, ``result.first_singular``; :class:`KinematicResult`), and a
    concrete call that passes one warns (:class:`rbjax.SingularConfigurationWarning`, naming
    the times). There the equations do not determine the branch the motion continues on;
    the analysis follows the smooth continuation (the secant start lies on it to second order
    in the time step), and at a time exactly on the singular configuration returns the velocity
    of least kinetic energy and the minimum-norm multipliers (docs/guide/mechanisms.md, "Change
    points").
    """
    maximal_only(model, "rbjax.kinematic_analysis")
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
    if not model.joints:  # free bodies are never driven: nothing to solve
        raise _not_driven(mobility(model, state0))
    if tol is None:
        tol = 1e-12 if state0.q.dtype == jnp.float64 else 1e-5
    _, q0, _ = to_components(state0)
    out = _kinematic_scan(model, q0, times, float(tol), int(max_iters))
    t, q, u, udot, lam, res, ratio, singular, when = out
    # The mobility check needs values: it runs when the model and state are concrete (call
    # once outside jax.grad/jacfwd/jit to get it; under a transformation it is skipped). It
    # takes the configuration that the analysis's first solve put on the joints at times[0]
    # (the Gauss-Newton iteration that rbjax.assemble starts with, which ends on the joints
    # for any DOF) instead of assembling the start state in a program of its own (6 of the
    # 14 s that the slider-crank's analysis took to compile, measured on 2 cores).
    if is_concrete((model, state0, times)):
        mob = mobility(model, State(t=t[0], q=q[0], u=u[0]))
        if mob.dof - mob.rank_drop != 0:  # DOF around the start (a change point adds some)
            raise _not_driven(mob)
    if is_concrete(res) and not np.all(np.asarray(res) <= 100 * tol):
        k = int(np.argmax(~(np.asarray(res) <= 100 * tol)))
        raise ValueError(
            f"kinematic_analysis: the position analysis failed at times[{k}] = {float(times[k]):.6g}"
            f" (residual {float(res[k]):.3g}). The mechanism may pass a singular (lock-up) "
            "configuration there. Fix: check the driver functions and the geometry."
        )
    if is_concrete(singular) and np.any(np.asarray(singular)):
        k = np.flatnonzero(np.asarray(singular))
        at_sample = np.asarray(when)[k] == np.asarray(times)[k]
        start = (
            "The analysis STARTS on one: with no earlier motion to continue, the branch it "
            "takes beyond is whichever Newton reaches from there. "
            if k[0] == 0
            else ""
        )
        warnings.warn(
            path_message(
                "rbjax.kinematic_analysis",
                np.asarray(when)[k],
                at_sample,
                start
                + "rbjax followed the branch that continues the motion smoothly: each position "
                "solve starts from the linear extrapolation of the two previous solutions (the "
                "secant predictor of continuation methods); from the previous solution alone, "
                "Newton can fold onto the other branch. At a singular time itself the velocity, "
                "acceleration and multipliers (driver efforts) are not unique: rbjax returns "
                "the minimum-norm ones. result.singular marks the times, result.singular_time "
                "estimates each passage, result.conditioning is the smallest singular value of "
                "the joint Jacobian relative to the largest.",
            ),
            SingularConfigurationWarning,
            stacklevel=2,
        )
    return KinematicResult(
        t=t,
        q=q,
        u=u,
        udot=udot,
        lam=lam,
        residual=res,
        conditioning=ratio,
        singular=singular,
        singular_time=when,
    )
