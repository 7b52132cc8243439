"""The implicit midpoint step (rbjax.ImplicitMidpoint) in the engine's layout: its residual,
the simplified-Newton matrix that solves it in O(N) per iteration, and its derivatives.

Unknowns z = (q_{n+1}, u_{n+1}[, λ], Λ) flattened to (n, *batch) (rbjax/_engine/newton.py);
the residual is documented on rbjax.ImplicitMidpoint. Newton's method with the exact Jacobian
needs one jvp of the residual per unknown (15 N + m for N bodies and m joint rows) and a dense
LU per system, at every iteration; that cost does not shrink per system with the batch. The
iteration here is simplified Newton (Hairer & Wanner, Solving ODEs II, §IV.8) with the matrix

    P = [ I          −(h/2) K(q_n)      0         0      ]
        [ 0           I                 −M⁻¹Nᵀ    −M⁻¹Wᵀ ]
        [ N_q(q_n)    0                 0         0      ]
        [ C_q(q_n)    0                 0         0      ],

the Jacobian at h → 0 of every term but the constraint coupling (K = ∂q̇/∂u, N and W the
normalisation and joint Jacobians, C_q the joint position Jacobian, W = C_q K). P z = r is
solved by eliminating q and u: the joint impulses solve (h/2) S̃ Λ = ... with the Schur
complement S̃ = W̃M⁻¹W̃ᵀ of the explicit dynamics (its factorisation along the joint graph,
rbjax/_engine/joints.py), once per step. Each iteration then costs one residual and one solve
with the stored factor, and contracts the error by θ = O(h (|∂a/∂q| h + |∂a/∂u|)).

Stiff steps (stiff springs or dampers, fast spin at a large step: an update that grows twice
in a row, or no convergence within ``max_iters``) fall back to Newton with the exact Jacobian,
started where the simplified iteration stopped, under a ``lax.cond`` that skips it when every
system has converged.

Derivatives follow from the implicit function theorem (``implicit_root``): the tangent
system J ż = y is solved by iterative refinement ż ← ż + P⁻¹(y − J ż), a fixed number of
linear steps (reverse mode transposes them), when the primal iteration measured θ ≤
``FAST_THETA`` in every system (the refinement then gains that factor per step, and
``REFINE_STEPS`` steps reach roundoff); otherwise by a dense LU of the exact Jacobian.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from . import dynamics as dyn, kernels as cf, rank
from .forces import total_resultants
from .joints import joint_terms
from .mass import half_trace, minv
from .newton import (
    batch_jacobian,
    batched_solve,
    dense_tangent_solve,
    flatten,
    implicit_root,
    unflatten,
)
from .schur import SchurSystem, joint_force_correction

# A simplified iteration that grows its update (θ ≥ 1, twice in a row) hands the system to full
# Newton at once; one that contracts slowly does so when it runs out of iterations.
SLOW_THETA = 1.0
# Largest measured contraction for which derivatives use the refinement (else dense LU):
# FAST_THETA ** (REFINE_STEPS + 1) ≈ 5e-16.
FAST_THETA = 0.02
REFINE_STEPS = 8


def cayley_velocity(q0, q1, um):
    """u_m with ω_m scaled by ρ = (2 s_m − s̄) / s_m, s_m = |A_m|², s̄ = (|A_n|² + |A_{n+1}|²)/2.

    ρ = 1 + O(h²), so the kinematic update stays a second-order, symmetric discretisation of
    Ȧ = A(ν, ω)/(2s); but with it the rigid-body increment A_n⁻¹ A_{n+1} is exactly the Cayley
    rotation cay(h ω̃_m / s_m) that matches the midpoint update of Θω, so the world angular
    momentum of a torque-free rigid body is conserved exactly (the construction of Simo & Wong,
    Int. J. Numer. Meth. Eng. 31, 1991, written for quaternions). With plain ρ = 1 it drifts
    at O(h²) per unit time.
    """
    a0, a1 = q0[3:7], q1[3:7]
    sm = cf.qnorm2(0.5 * (a0 + a1))
    sbar = 0.5 * (cf.qnorm2(a0) + cf.qnorm2(a1))
    rho = (2.0 * sm - sbar) / sm
    return jnp.concatenate([um[0:4], rho * um[4:7]], axis=0)


def _per_body(model) -> int:
    """Unknowns per body: q, u (and the normalisation multiplier λ for DAE formulations)."""
    return 15 if model.formulation.is_dae else 14


def _split(model, zf):
    """(n, *batch) -> (per-body part (k, *batch, nb), stacked joint rows (m, *batch))."""
    k, nb = _per_body(model), model.nb
    return unflatten(zf[: k * nb], k, nb), zf[k * nb :]


def _join(body, joints=None):
    out = flatten(body)
    return out if joints is None else jnp.concatenate([out, joints], axis=0)


def residual(zf, args):
    """The midpoint residual F(z) (rows: q, u[, normalisation], joints), ``args`` =
    (model, t, q_n, u_n, h)."""
    model, t, q, u, h = args
    f = model.formulation
    z, lj = _split(model, zf)
    q1, u1 = z[0:7], z[7:14]
    qm, um = 0.5 * (q + q1), 0.5 * (u + u1)
    tm = t + 0.5 * h
    rq = q1 - q - h * f._engine_kinematics(qm, cayley_velocity(q, q1, um))
    if f.is_dae:
        lam = z[14]
        a = dyn.free_acceleration(model, total_resultants(model, tm, qm, um), qm, um)
        ru = u1 - u - h * a - minv(model, dyn.normalisation_jacobian(model, qm) * lam)
        rows = [rq, ru, jnp.where(model.rigid, dyn.normalisation(model, q1), lam)[None]]
    else:
        # free Newton–Euler acceleration (joints enter through Λ only)
        free = eqx.tree_at(lambda mm: mm.joints, model, ()) if model.joints else model
        _, udot, _ = f._engine_derivatives(free, tm, qm, um)
        rows = [rq, u1 - u - h * udot]
    if not model.joints:
        return _join(jnp.concatenate(rows, axis=0))
    kin = f._engine_kinematics
    terms = joint_terms(model, kin, tm, qm, um, gamma=False)
    rows[1] = rows[1] - joint_force_correction(model, terms, lj, reduced=not f.is_dae)
    end = joint_terms(model, kin, t + h, q1, um, gamma=False, jacobian=False)
    return _join(jnp.concatenate(rows, axis=0), end.c)


def _guess(model, q, u):
    parts = [q, u] + ([jnp.zeros_like(q[:1])] if model.formulation.is_dae else [])
    zf = flatten(jnp.concatenate(parts, axis=0))
    m = sum(model.joint_rows)
    return jnp.concatenate([zf, jnp.zeros((m,) + zf.shape[1:], zf.dtype)], 0) if m else zf


class Preconditioner:
    """P⁻¹ (see the module docstring), frozen at the start of the step (trace-time object).

    Solving P (δq, δu, δλ, δΛ) = (r_q, r_u, r_c, r_Λ): with δq = r_q + (h/2) K δu, the
    normalisation rows fix δν = (2/h)(r_c − N_q r_q) (rigid bodies; N K = e_ν, Möller & Glocker
    2012 eq. (89)), the joint rows read (h/2) W δu = r_Λ − C_q r_q, and δu = r_u + M⁻¹(Nᵀδλ +
    WᵀδΛ) gives S̃ δΛ = (2/h)(r_Λ − C_q r_q) − W δu₀ with δu₀ = r_u (δν set); δλ closes the
    ν rows. Linear in r."""

    def __init__(self, model, t, q, h):
        self.model, self.q, self.h = model, q, h
        self.kin = model.formulation._engine_kinematics
        self.t1 = t + h
        self.schur = None
        if model.joints:
            terms = joint_terms(model, self.kin, t + 0.5 * h, q, jnp.zeros_like(q), gamma=False)
            self.schur = SchurSystem(model, terms, q.dtype).factorise()

    def _position_rows(self, rq):
        """C_q(q_n) r_q per joint: the joint residuals' derivative along r_q."""
        zero = jnp.zeros_like(self.q)

        def c(qq):
            return joint_terms(
                self.model, self.kin, self.t1, qq, zero, gamma=False, jacobian=False
            ).c

        return jax.jvp(c, (self.q,), (rq,))[1]

    def __call__(self, r):
        model, q, half = self.model, self.q, 0.5 * self.h
        dae = model.formulation.is_dae
        body, rj = _split(model, r)
        rq, ru = body[0:7], body[7:14]
        du = ru
        if dae:
            rc = body[14]
            target = (rc - 2.0 * jnp.sum(q[3:7] * rq[3:7], axis=0)) / half
            du = du.at[3].set(jnp.where(model.rigid, target, ru[3]))
        fnu = 0.0
        lam = None
        schur = self.schur
        if schur is not None:
            rhs = (rj - self._position_rows(rq)) / half - schur.apply(du, reduced=False)
            lam = schur.solve(rhs)
            corr, fnu = schur.correction(lam)
            du = du + corr
        out = [rq + half * self.kin(q, du), du]
        if dae:
            # (the ν row's ∂ν̇/∂ω = 2Θω/(s ½trΘ) is left out too: with it the energy of the
            # tumbling body drifted by −0.24 ulp per step against 0.05 without)
            dlam = half_trace(model) * (du[3] - ru[3]) - fnu
            out.append(jnp.where(model.rigid, dlam, rc)[None])
        return _join(jnp.concatenate(out, axis=0), lam)


def _solver(tol, max_iters, exact):
    def solve(args):
        model, t, q, u, h = args
        fn = lambda z: residual(z, args)  # noqa: E731
        rank_test = rank.may_be_redundant(model)  # singular Newton matrices (newton.py)
        z0 = _guess(model, q, u)
        batch = z0.shape[1:]
        eps = float(jnp.finfo(z0.dtype).eps)

        def update(z, dz, it, prev, est_tol, theta_prev=0.0):
            """Size of dz relative to z and the stopping tests of the contraction estimate
            (Hairer & Wanner II, §IV.8): with θ = |Δz_k| / |Δz_{k−1}|, the remaining error is
            about θ/(1−θ) |Δz_k|. With quadratic convergence this stops one iteration BEFORE
            the update reaches the roundoff floor. Iterating into the floor is not harmless:
            the last corrections are then computed from roundoff and bias the energy
            (measured: a linear drift of −1.3e-17 per step over 1e5 steps, against a bounded
            ~1e-14 when stopping early)."""
            scale = 1.0 + jnp.max(jnp.abs(z), axis=0)
            size = jnp.max(jnp.abs(dz), axis=0) / scale
            theta = jnp.maximum(size / prev, theta_prev)
            contracted = (it >= 1) & (theta < 0.5) & (theta / (1.0 - theta) * size <= est_tol)
            stalled = (it >= 1) & (size >= 0.5 * prev) & (size <= 1e3 * tol)
            return size, size / prev, theta, (size <= est_tol) | contracted | stalled, stalled

        false = jnp.zeros(batch, dtype=bool)
        inf = jnp.full(batch, jnp.inf, z0.dtype)

        def n_cond(carry):
            _, it, done, _ = carry
            return (it < max_iters) & ~jnp.all(done)

        def n_body(carry):
            z, it, done, prev = carry
            dz = batched_solve(batch_jacobian(fn, z), -fn(z), rank_test=rank_test)
            dz = jnp.where(done, 0.0, dz)  # converged systems stay put
            z = z + dz
            size, _, _, now, _ = update(z, dz, it, prev, tol)
            done = done | now
            return z, it + 1, done, jnp.where(done, prev, size)

        def newton(z, done):
            z, _, done, _ = jax.lax.while_loop(n_cond, n_body, (z, jnp.asarray(0), done, inf))
            return z, done

        if exact:
            z, done = newton(z0, false)
            return z, (done, false)

        precondition = Preconditioner(model, t, q, h)
        # The simplified iteration converges linearly, its error estimate is sharp and its
        # remaining error lies along a fixed direction: stopped when the estimate is below tol
        # it biases the energy (tumbling body, 1e5 steps: 0.6 ulp per step), so the estimate
        # must fall to tol / 1000, one machine epsilon by default (0.05 ulp per step; exact
        # Newton 0.003).

        def s_cond(carry):
            _, it, done, slow, _, _, _ = carry
            return (it < max_iters) & ~jnp.all(done | slow)

        def s_body(carry):
            z, it, done, slow, prev, theta_prev, theta_last = carry
            dz = -precondition(fn(z))
            # The max-norm contracts unevenly: the normalisation rows (their gradient frozen
            # at A_n) lag the quaternion, and an update can stall for one iteration before
            # dropping by θ² (measured on a spinning body: 1.3e-5, 1.0e-7, 1.0e-7, 1.7e-10).
            # So the stopping estimate takes the larger of the last two ratios, a system is
            # slow after two ratios ≥ SLOW_THETA in a row, and the rate that decides the
            # derivative solve is the geometric mean of the last two.
            size, ratio, theta, now, stalled = update(z, dz, it, prev, 1e-3 * tol, theta_prev)
            measured = (it >= 1) & (prev > jnp.sqrt(eps))  # updates well above roundoff
            is_slow = measured & (ratio >= SLOW_THETA) & (theta_prev >= SLOW_THETA) & ~now
            active = ~(done | slow)
            z = z + jnp.where(active & ~is_slow & ~stalled, dz, 0.0)  # a stalled update is roundoff
            rate = jnp.sqrt(ratio * theta_prev)
            theta_last = jnp.where(active & measured & (it >= 2), rate, theta_last)
            done = done | (active & now)
            slow = slow | (active & is_slow)
            prev = jnp.where(active, size, prev)
            return z, it + 1, done, slow, prev, jnp.where(active, ratio, theta_prev), theta_last

        unmeasured = jnp.full(batch, -1.0, z0.dtype)
        init = (z0, jnp.asarray(0), false, false, inf, jnp.zeros_like(inf), unmeasured)
        z, _, done, _, _, _, theta_last = jax.lax.while_loop(s_cond, s_body, init)
        fast = done & (theta_last >= 0.0) & (theta_last <= FAST_THETA)
        # Newton with the exact Jacobian for the systems the simplified iteration left, under
        # a cond: XLA hoists loop-invariant parts of the Jacobian out of the while loop, which
        # then cost even when it runs no iteration (measured: 27 against 5.6 µs per
        # system-step, double pendulum, B = 256)
        z, done = jax.lax.cond(jnp.all(done), lambda z, d: (z, d), newton, z, done)
        return z, (done, fast)

    return solve


def _tangent_solve(g, y, _, args, aux):
    """Solve J x = y (g = J at the root): iterative refinement with P when every system's
    simplified iteration contracted by at most FAST_THETA, else a dense LU of J."""
    model, t, q, _, h = args
    _, fast = aux

    def refine(y):
        precondition = Preconditioner(model, t, q, h)
        step = lambda _, x: x + precondition(y - g(x))  # noqa: E731
        return jax.lax.fori_loop(0, REFINE_STEPS, step, precondition(y))

    return jax.lax.cond(
        jnp.all(fast), refine, lambda y: dense_tangent_solve(g, y, None, args, aux), y
    )


def implicit_midpoint_step(model, t, q, u, h, tol, max_iters, exact=False):
    """One step of the implicit midpoint rule (rbjax.ImplicitMidpoint); see the module
    docstring. ``exact``: Newton with the exact Jacobian from the start (no simplified
    iteration). Returns (t + h, q_{n+1}, u_{n+1}, converged)."""
    tol = 1e3 * float(jnp.finfo(q.dtype).eps) if tol is None else tol
    z, (done, _) = implicit_root(
        (model, t, q, u, h),
        residual=residual,
        solve=_solver(tol, max_iters, exact),
        tangent_solve=_tangent_solve,
    )
    z = unflatten(z[: _per_body(model) * model.nb], _per_body(model), model.nb)
    return t + h, z[0:7], z[7:14], done
