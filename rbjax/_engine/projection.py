"""Projection onto the joint manifold in the component-first layout (the engine side of
:func:`rbjax.assemble`, :func:`rbjax.kinematic_analysis` and the ``Projected`` integrators).

Position corrections are measured in the kinetic-energy metric of Möller & Glocker 2012 eq. (64):
:func:`closest_point` is the configuration on Φ(q, t) = 0 CLOSEST to the input in that metric
(min ½δᵀMδ, δ the generalized displacement), :func:`driven_position` the unique nearby root of
a fully driven mechanism (DOF = 0, ME751's position analysis) and :func:`project_position` the
standard projection along the mass-weighted normal at the predicted point (Hairer, Lubich &
Wanner, Geometric Numerical Integration, §IV.4). Each is the root of a square system, found by
Newton iterations (which reuse the block-sparse Schur complement S = W̃M⁻¹W̃ᵀ of the dynamics)
and differentiated by the implicit function theorem (``implicit_root``, rbjax/_engine/newton.py),
never by unrolling the iterations. :func:`project_velocity` projects velocities M-orthogonally onto
W̃u + c_t = 0 (a linear solve).

``dense=True`` solves the Schur complement by one dense Cholesky factorisation instead of the
unrolled block elimination: the choice for one-shot analyses, whose compile time dominates
(rbjax/_engine/blockchol.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import kernels as cf, rank
from .joints import joint_terms, row_layout
from .mass import mvec
from .newton import (
    batch_jacobian,
    batched_solve,
    dense_tangent_solve,
    flatten,
    implicit_root,
    unflatten,
)
from .schur import SchurSystem, solve_multipliers


def norm_rows(model, x):
    """Max-abs per joint of stacked residuals (R, ...) -> (n_joints, ...): one gather of each
    joint's rows padded with zeros (rbjax/_engine/joints.py ``row_layout``)."""
    a = jnp.abs(x)
    a = jnp.concatenate([a, jnp.zeros((1,) + a.shape[1:], a.dtype)])
    return jnp.max(a[row_layout(model.topology).pad], axis=1)


def _renormalise(model, q):
    a = q[3:7]
    n = jnp.sqrt(cf.qnorm2(a))
    a = jnp.where(model.rigid, a / n, a)
    return jnp.concatenate([q[0:3], a], axis=0)


def residuals(model, t, q):
    """All joint residuals Φ(q, t) stacked, (m, ...)."""
    zero = jnp.zeros_like(q)
    kin = model.formulation._engine_kinematics
    return joint_terms(model, kin, t, q, zero, gamma=False, jacobian=False).c


def joint_errors(model, r):
    """Largest |Φ| per joint, (n_joints, ...), from stacked residuals (m, ...)."""
    return norm_rows(model, r)


# Why the Gauss–Newton iteration of :func:`_gauss_newton` stopped, per system (its 4th output).
CONVERGED, ITERATION_LIMIT, STALLED, NONFINITE, NOT_CLOSEST = 0, 1, 2, 3, 4
STOP_REASONS = {
    CONVERGED: "converged",
    ITERATION_LIMIT: "it reached the iteration limit while the residual was still decreasing "
    "(raise max_iters or start closer)",
    STALLED: "the residual stopped decreasing (no 0.1 % decrease in its last 10 iterations): "
    "a least-squares point, where the joint equations contradict each other (or the start is "
    "at a singular configuration)",
    NONFINITE: "a Newton step was not finite (a singular joint Jacobian); the last finite "
    "iterate is reported",
    NOT_CLOSEST: "it reached the joint manifold, but Newton's method on the closest-point "
    "conditions did not converge from there (start closer)",
}
STALL_ITERS = 10


def _gauss_newton(model, t, q, tol, max_iters, dense):
    """Path-following Gauss–Newton onto Φ(q, t) = 0: q ← N(q + Q⁻¹(q) δu) with the
    minimum-norm step δu = −M⁻¹W̃ᵀS⁻¹Φ re-linearised at every iterate (robust from far away;
    its end point depends on the path, so it only warm-starts :func:`closest_point`).

    Returns (q, largest |Φ| per joint at q, iterations, why it stopped per system: a key of
    :data:`STOP_REASONS`). A system whose step is not finite keeps its last finite iterate;
    one whose largest residual has not decreased by 0.1 % in :data:`STALL_ITERS` iterations
    is reported STALLED (the iteration itself runs on, as before, to ``tol`` or
    ``max_iters``)."""
    kin = model.formulation._engine_kinematics
    zero_u = jnp.zeros_like(q)

    def step(q):
        terms = joint_terms(model, kin, t, q, zero_u, gamma=False)
        _, du, _ = solve_multipliers(
            model, terms.with_gamma(-terms.c), jnp.zeros_like(q), dense=dense
        )
        return _renormalise(model, q + kin(q, du)), norm_rows(model, terms.c)

    def cond(carry):
        _, it, err, *_ = carry
        return (it < max_iters) & (jnp.max(err) > tol)

    def body(carry):
        q, it, _, best, stall, broke = carry
        q_new, err = step(q)  # err: the residual at q (before the step)
        worst = jnp.max(err, axis=0)
        better = worst < (1.0 - 1e-3) * best
        stall = jnp.where(better, 0, stall + 1)
        best = jnp.minimum(best, worst)
        finite = jnp.all(jnp.isfinite(q_new), axis=(0, -1))
        broke = broke | ~finite
        return jnp.where(broke[None, ..., None], q, q_new), it + 1, err, best, stall, broke

    batch = q.shape[1:-1]
    err0 = jnp.full((len(model.joints),) + batch, jnp.inf, q.dtype)
    carry = (
        q,
        jnp.asarray(0),
        err0,
        jnp.full(batch, jnp.inf, q.dtype),
        jnp.zeros(batch, jnp.int32),
        jnp.zeros(batch, bool),
    )
    q, it, _, _, stall, broke = jax.lax.while_loop(cond, body, carry)
    err = joint_errors(model, residuals(model, t, q))
    reason = jnp.where(
        jnp.max(err, axis=0) <= tol,
        CONVERGED,
        jnp.where(broke, NONFINITE, jnp.where(stall >= STALL_ITERS, STALLED, ITERATION_LIMIT)),
    )
    return q, err, it, reason


# ---------------------------------------------------------------- projection of a step


def _frozen_normal(model, t, qt):
    """W̃(q̃) and its Schur complement S(q̃) = W̃M⁻¹W̃ᵀ, factored (trace-time object)."""
    terms = joint_terms(
        model, model.formulation._engine_kinematics, t, qt, jnp.zeros_like(qt), gamma=False
    )
    return SchurSystem(model, terms, qt.dtype)


def _along(model, qt, schur, mu):
    """q(μ) = N(q̃ + Q⁻¹(q̃) M⁻¹W̃(q̃)ᵀ μ) for stacked multipliers μ (m, ...)."""
    du, _ = schur.correction(mu)
    return _renormalise(model, qt + model.formulation._engine_kinematics(qt, du))


def _precondition(model, schur, r):
    """S⁻¹ r for stacked right-hand sides (m, ...)."""
    return schur.solve(r)


def _projection_residual(mu, args):
    model, t, qt = args
    return residuals(model, t, _along(model, qt, _frozen_normal(model, t, qt), mu))


def _projection_solver(tol, max_iters):
    def solve(args):
        model, t, qt = args
        schur = _frozen_normal(model, t, qt).factorise()

        def cond(carry):
            _, _, err, it = carry
            return (it < max_iters) & (jnp.max(err) > tol)

        def body(carry):
            mu, r, _, it = carry
            mu = mu - _precondition(model, schur, r)
            r = residuals(model, t, _along(model, qt, schur, mu))
            return mu, r, joint_errors(model, r), it + 1

        mu0 = jnp.zeros((sum(model.joint_rows),) + qt.shape[1:-1], qt.dtype)
        r0 = residuals(model, t, qt)
        init = (mu0, r0, joint_errors(model, r0), jnp.asarray(0))
        mu, _, err, it = jax.lax.while_loop(cond, body, init)
        return mu, (err, it)

    return solve


_REFINE_STEPS = 4


def _projection_tangent_solve(g, y, mu, args, aux):
    """Solve g(x) = y, g = ∂Φ(q(μ))/∂μ at the solution, by iterative refinement
    x ← x + S⁻¹(y − g(x)). g = S + O(|μ|) (μ is of the size of the integrator's local error),
    so each step gains a factor O(|μ|); a fixed number of steps keeps the solve linear in y,
    which reverse mode needs (it transposes this function)."""
    model, t, qt = args
    schur = _frozen_normal(model, t, qt).factorise()

    def body(_, x):
        return x + _precondition(model, schur, y - g(x))

    return jax.lax.fori_loop(0, _REFINE_STEPS, body, _precondition(model, schur, y))


def project_position(model, t, qt, tol, max_iters):
    """Projection of q̃ onto Φ(q, t) = 0 along the mass-weighted normal AT q̃ (the standard
    projection of Hairer, Lubich & Wanner, Geometric Numerical Integration, §IV.4, in the
    metric of Möller & Glocker 2012 eq. (64)):

        q(μ) = N(q̃ + Q⁻¹(q̃) M⁻¹W̃(q̃)ᵀ μ),      Φ(q(μ), t) = 0,

    m equations for the m multipliers μ (N renormalises rigid quaternions). Solved by
    simplified Newton with S(q̃) = W̃M⁻¹W̃ᵀ factored once (the Jacobian at μ = 0). Because μ
    is the root of a square system, the projection is a function of q̃ and of the model, and
    its derivatives follow from the implicit function theorem (:func:`implicit_root`).
    Returns (q, largest |Φ| per joint, iterations)."""
    args = (model, t, qt)
    mu, (err, it) = implicit_root(
        args,
        residual=_projection_residual,
        solve=_projection_solver(tol, max_iters),
        tangent_solve=_projection_tangent_solve,
    )
    return _along(model, qt, _frozen_normal(model, t, qt), mu), err, it


# ---------------------------------------------------------------- closest point (assembly)


def _nu_rows(model, dtype, ndim):
    """Mask (7, 1…, nb): 1 at the scaling rate ν of rigid bodies (a coordinate they lack)."""
    mask = np.zeros((7, model.nb))
    mask[3] = [0.0 if s else 1.0 for s in model.scalable]
    return jnp.asarray(mask.reshape((7,) + (1,) * (ndim - 2) + (model.nb,)), dtype)


def _retract(model, q0, d):
    """R(q0, δ) = N(q0 + Q⁻¹(q0) δ): the configuration reached from q0 by the generalized
    displacement δ (7, ..., nb) (Möller & Glocker 2012 eq. (37); rigid quaternions renormalised, ν of rigid
    bodies ignored)."""
    d = d * (1.0 - _nu_rows(model, q0.dtype, q0.ndim))
    return _renormalise(model, q0 + model.formulation._engine_kinematics(q0, d))


def _inverse_retract(model, q0, q):
    """The δ with R(q0, δ) = q (rigid bodies: ν = 0 and the rotation within ±180°)."""
    a0, a = q0[3:7], q[3:7]
    s0 = cf.qnorm2(a0)
    p = cf.qmul(cf.qconj(a0), a)  # rigid: ∝ (1, ω/(2 s0)), sign-invariant below
    rigid = jnp.concatenate([jnp.zeros_like(p[:1]), 2.0 * s0 * p[1:4] / p[0]], axis=0)
    scalable = 2.0 * cf.qmul(cf.qconj(a0), a - a0)  # (ν, ω) = 2 A0* (A − A0)
    rot = jnp.where(model.rigid, rigid, scalable)
    return jnp.concatenate([q[0:3] - q0[0:3], rot], axis=0)


def _phi(model, t, q0, zf):
    """Φ(R(q0, δ), t) for the flattened displacement δ (7·nb, ...), (m, ...)."""
    return residuals(model, t, _retract(model, q0, unflatten(zf, 7, model.nb)))


def _pinned(model, q0):
    """(7·nb, ...) bool: the ν rows of rigid bodies in a flattened displacement."""
    return flatten(jnp.broadcast_to(_nu_rows(model, q0.dtype, q0.ndim), q0.shape)) > 0


def _metric(model, q0, zf):
    """Mδ for a flattened δ, with the identity on the pinned ν rows of rigid bodies."""
    nb = model.nb
    mass = flatten(mvec(model, unflatten(zf, 7, nb) * (1.0 - _nu_rows(model, zf.dtype, q0.ndim))))
    return jnp.where(_pinned(model, q0), zf, mass)


def _driven_residual(zf, args):
    model, t, q0 = args
    return jnp.concatenate([_phi(model, t, q0, zf), zf[_nu_index(model)]], axis=0)


def _nu_index(model):
    return np.asarray([3 * model.nb + b for b in range(model.nb) if not model.scalable[b]], int)


def _gauss_newton_solver(tol, max_iters, dense):
    def solve(args):
        model, t, q0 = args
        qa, _, it, _ = _gauss_newton(model, t, q0, tol, max_iters, dense)
        return flatten(_inverse_retract(model, q0, qa)), it

    return solve


def driven_position(model, t, q0, tol, max_iters, *, dense=False):
    """The root of Φ(q, t) = 0 near q0 for a fully driven mechanism (DOF = 0, ME751's position
    analysis): q = R(q0, δ) with δ the root of the square system [Φ(R(q0, δ), t); δ_ν] = 0
    (δ_ν of rigid bodies pinned to 0). Found by :func:`_gauss_newton` (whose end point is that
    root when DOF = 0) and differentiated by the implicit function theorem with a dense
    Jacobian of the square system. Returns (q, largest |Φ| per joint, iterations)."""
    z, it = implicit_root(
        (model, t, q0),
        residual=_driven_residual,
        solve=_gauss_newton_solver(tol, max_iters, dense),
        tangent_solve=dense_tangent_solve,
    )
    q = _retract(model, q0, unflatten(z, 7, model.nb))
    return q, joint_errors(model, residuals(model, t, q)), it


def _kkt_residual(z, args):
    """Mδ − J(δ)ᵀμ (ν rows of rigid bodies: δ_ν) and Φ(R(q0, δ), t), J = ∂Φ∘R/∂δ."""
    model, t, q0 = args
    n = 7 * model.nb
    c, pull = jax.vjp(lambda d: _phi(model, t, q0, d), z[:n])
    (jt_mu,) = pull(z[n:])
    r1 = _metric(model, q0, z[:n]) - jnp.where(_pinned(model, q0), 0.0, jt_mu)
    return jnp.concatenate([r1, c], axis=0)


def _kkt_solver(tol, max_iters, dense):
    def solve(args):
        # Newton's method on the KKT system :func:`_kkt_residual` (which defines the result and
        # its derivatives), from the end point of the Gauss–Newton iteration with μ = 0. The
        # Jacobian is exact (second derivatives of Φ in the μᵀΦ'' block): the Gauss–Newton
        # KKT matrix [[M, −Jᵀ], [J, 0]] converges only linearly, at a rate of the order of the
        # curvature of the joint manifold times the distance moved, and diverges beyond rate 1
        # (MJX constraints.xml's keyframe 0, a free body 3.3 away in the metric from its
        # closest point: residual 0.83 after 20 steps, where exact Newton converges in 5).
        model, t, q0 = args
        n = 7 * model.nb
        m = sum(model.joint_rows)
        qa, err_gn, it, reason = _gauss_newton(model, t, q0, tol, max_iters, dense)
        d0 = flatten(_inverse_retract(model, q0, qa))
        z = jnp.concatenate([d0, jnp.zeros((m,) + d0.shape[1:], d0.dtype)], axis=0)
        eps = jnp.finfo(z.dtype).eps

        def cond(carry):
            _, size, k = carry
            return (k < max_iters) & jnp.any(size > 64 * eps)

        def body(carry):
            z, _, k = carry
            res = _kkt_residual(z, args)
            kkt = batch_jacobian(lambda zz: _kkt_residual(zz, args), z)
            dz = batched_solve(kkt, -res, rank_test=rank.may_be_redundant(model))
            z = z + dz
            size = jnp.max(jnp.abs(dz), axis=0) / (1.0 + jnp.max(jnp.abs(z), axis=0))
            return z, size, k + 1

        inf = jnp.full(z.shape[1:], jnp.inf, z.dtype)
        z1, size, _ = jax.lax.while_loop(cond, body, (z, inf, jnp.asarray(0)))
        # Where Newton did not converge (or Gauss–Newton did not reach the manifold, where the
        # KKT system may have no root) its iterate is kept only where it lowered the residual,
        # otherwise the Gauss–Newton end point is returned, and a Gauss–Newton "converged" is
        # reported as NOT_CLOSEST: assemble raises rather than return a point of the manifold
        # that is not the closest one (its derivatives would be those of another function).
        q1 = _retract(model, q0, unflatten(z1[:n], 7, model.nb))
        err1 = jnp.max(joint_errors(model, residuals(model, t, q1)), axis=0)
        done = size <= 64 * eps
        keep = (done & (reason == CONVERGED)) | (err1 <= jnp.max(err_gn, axis=0))
        reason = jnp.where((reason == CONVERGED) & ~done, NOT_CLOSEST, reason)
        return jnp.where(keep, z1, z), (it, reason)

    return solve


def closest_point(model, t, q0, tol, max_iters, *, dense=False):
    """The configuration on Φ(q, t) = 0 closest to q0 in the kinetic-energy metric:

        min ½ δᵀMδ   subject to   Φ(R(q0, δ), t) = 0,

    with M of Möller & Glocker 2012 eq. (64) and R the retraction of :func:`_retract`. Its KKT system
    (:func:`_kkt_residual`; ν ≡ 0 for rigid bodies) is square, so the result is a function of q0
    and of the model, differentiated by the implicit function theorem (dense tangent solves).
    Returns (q, largest |Φ| per joint, Gauss–Newton iterations, why Gauss–Newton stopped per
    system: a key of :data:`STOP_REASONS`; where it did not converge, q is its end point)."""
    z, (it, reason) = implicit_root(
        (model, t, q0),
        residual=_kkt_residual,
        solve=_kkt_solver(tol, max_iters, dense),
        tangent_solve=dense_tangent_solve,
    )
    q = _retract(model, q0, unflatten(z[: 7 * model.nb], 7, model.nb))
    return q, joint_errors(model, residuals(model, t, q)), it, reason


def project_velocity(model, t, q, u, *, dense=False):
    """u ← u − M⁻¹W̃ᵀ(W̃M⁻¹W̃ᵀ)⁻¹(W u + c_t): the M-orthogonal projection onto ċ = 0."""
    kin = model.formulation._engine_kinematics
    terms = joint_terms(model, kin, t, q, u, gamma=False, cdot=True)
    _, du, _ = solve_multipliers(
        model, terms.with_gamma(-terms.cdot), jnp.zeros_like(u), dense=dense
    )
    return u + du
