"""Equations of motion in the engine's layout: the kernels behind rbjax's formulations.

Every kernel maps (model, t, q, u) with component-first q, u (7, *batch, nb) and t (*batch, 1)
to (q̇, u̇, λ); the public classes in rbjax/_dynamics.py document the equations (Möller & Glocker 2012
eqs. (93)-(96); Udwadia & Schutte 2010) and call these. λ has shape (*batch, nb) without joints and
(*batch, nb + m) with them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from .. import _quaternion as quat
from .._topology import GROUND
from . import kernels as cf, rank
from .forces import Resultants, total_resultants
from .joints import joint_terms
from .layout import inertia_components
from .mass import half_trace
from .schur import solve_multipliers


def constrained(model, kin, t, q, u, a, lam_nu_free):
    """Add the joint constraint forces to the unconstrained acceleration ``a`` (ν̇ = 0 set for
    rigid bodies). Returns (u̇, λ) with λ = (scaling multipliers (..., nb), joint multipliers
    (..., m)) concatenated on the last axis; see rbjax/_engine/joints.py for the elimination."""
    terms = joint_terms(model, kin, t, q, u)
    extra = None
    if model.baumgarte is not None:  # c̈ + 2α ċ + β² c = 0
        al, be = model.baumgarte
        extra = -2.0 * al * terms.cdot - be * be * terms.c
    lam, corr, fnu = solve_multipliers(model, terms, a, extra)
    lam_n = jnp.where(model.rigid, lam_nu_free - fnu, 0.0)
    lam_j = jnp.moveaxis(lam, 0, -1)
    lam_n = jnp.broadcast_to(lam_n, lam_j.shape[:-1] + lam_n.shape[-1:])
    return a + corr, jnp.concatenate([lam_n, lam_j], axis=-1)


def scalable_kinematics(
    q: Float[Array, "7 ..."], u: Float[Array, "7 ..."]
) -> Float[Array, "7 ..."]:
    """q̇ = Q⁻¹(q) u (Möller & Glocker 2012, eq. (84)) for components (7, ...) of any trailing
    shape (bodies, batch, or one body)."""
    qc, uc = cf.comps(q), cf.comps(u)
    return jnp.concatenate([cf.stack(*uc[0:3]), cf.kin_qdot(qc[3:7], uc[3], uc[4:7])], axis=0)


def normalisation(model, q):
    """c(q) = |A|² − 1 for rigid bodies, 0 for scalable bodies; shape (..., nb)."""
    return jnp.where(model.rigid, cf.qnorm2(q[3:7]) - 1.0, 0.0)


def free_parts(model, res: Resultants, q, u):
    th = inertia_components(model)
    qc, uc = cf.comps(q), cf.comps(u)
    a = qc[3:7]
    nu, w = uc[3], uc[4:7]
    s = cf.qnorm2(a)
    thw = cf.matvec(th, w)
    vdot = res.F / model.mass
    nudot = (res.S + cf.dot3(w, thw) / s) / half_trace(model)
    wdot = cf.matvec(cf.sym_inv(th), res.M - (nu * thw + cf.cross(w, thw)) / s)
    return vdot, nudot, wdot


def free_acceleration(model, res: Resultants, q, u):
    """u̇ of eq. (93) with λ = 0: the unconstrained scalable body."""
    vdot, nudot, wdot = free_parts(model, res, q, u)
    return jnp.concatenate([vdot, nudot[None], wdot], axis=0)


def normalisation_velocity(model, q, x):
    """ċ = W(q) x for a velocity x in u-space: jvp of c along q̇ = Q⁻¹ x."""
    return jax.jvp(lambda qq: normalisation(model, qq), (q,), (scalable_kinematics(q, x),))[1]


def normalisation_jacobian_autodiff(model, q):
    """W = c_q Q⁻¹ (Möller & Glocker 2012 eqs. (79), (85)) as a component-first array (7, ..., nb).

    Each constraint involves one body, so row W of body i is obtained for every body at
    once by seven jvps of c along q̇ = Q⁻¹ e_k (k = 0..6), one unit velocity per component.
    """
    eye = jnp.eye(7, dtype=q.dtype).reshape((7, 7) + (1,) * (q.ndim - 1))
    return jnp.stack(
        [normalisation_velocity(model, q, jnp.broadcast_to(eye[k], q.shape)) for k in range(7)]
    )


def normalisation_gamma(model, q, u):
    """γ = −(d/dt W) u = −∂(W(q) u)/∂q · q̇ (nested jvp), so that W u̇ = γ."""
    qdot = scalable_kinematics(q, u)
    return -jax.jvp(lambda qq: normalisation_velocity(model, qq, u), (q,), (qdot,))[1]


def normalisation_jacobian(model, q):
    """W of the normalisation constraint in closed form: the unit vector on ν, for every q.

    In generalized velocities ċ = d|A|²/dt = ν exactly (Möller & Glocker 2012, eqs. (44), (89)-(90)):
    the very reason the paper writes the DAE in u. So W = e_ν and γ = 0 for any A ≠ 0.
    :meth:`constraint_jacobian` and :meth:`gamma` derive the same W and γ by autodiff of c
    alone (tests check they agree); the closed form is used in the inner loop because the
    autodiff route costs ~10x the whole free-body right-hand side at large batches (RK4,
    B = 1024: 2 M vs 25 M body-steps/s measured). Joint constraints use autodiff.
    """
    e = jnp.zeros((7,) + (1,) * (q.ndim - 1), q.dtype).at[3].set(1.0)
    return jnp.where(model.rigid, e, 0.0) + jnp.zeros_like(q)


def scalable_dae_derivatives(
    model,
    t: Float[Array, "*batch 1"],
    q: Float[Array, "7 *batch nb"],
    u: Float[Array, "7 *batch nb"],
) -> tuple[Float[Array, "7 *batch nb"], Float[Array, "7 *batch nb"], Float[Array, "*batch k"]]:
    res = total_resultants(model, t, q, u)
    vdot, nudot, wdot = free_parts(model, res, q, u)
    qdot = scalable_kinematics(q, u)
    if model.joints:
        rigid = model.rigid
        a = jnp.concatenate([vdot, jnp.where(rigid, 0.0, nudot)[None], wdot], axis=0)
        udot, lam = constrained(model, scalable_kinematics, t, q, u, a, -nudot * half_trace(model))
        return qdot, udot, lam
    if all(model.scalable):
        return qdot, jnp.concatenate([vdot, nudot[None], wdot], axis=0), jnp.zeros_like(q[0])
    # Schur complement (W M⁻¹ Wᵀ) λ = γ − W a with W = e_ν, γ = 0 (one scalar per body):
    # λ = −½trΘ ν̇_free, and M⁻¹ Wᵀ λ = e_ν λ / (½trΘ) cancels ν̇ exactly for rigid bodies.
    rigid = model.rigid
    lam = jnp.where(rigid, -nudot * half_trace(model), 0.0)
    nudot = jnp.where(rigid, 0.0, nudot)
    return qdot, jnp.concatenate([vdot, nudot[None], wdot], axis=0), lam


def newton_euler_kinematics(
    q: Float[Array, "7 ..."], u: Float[Array, "7 ..."]
) -> Float[Array, "7 ..."]:
    qc, uc = cf.comps(q), cf.comps(u)
    w = uc[4:7]
    return jnp.concatenate(
        [cf.stack(*uc[0:3]), 0.5 * cf.qmul(qc[3:7], (jnp.zeros_like(w[0]), *w))], axis=0
    )


def newton_euler_derivatives(
    model,
    t: Float[Array, "*batch 1"],
    q: Float[Array, "7 *batch nb"],
    u: Float[Array, "7 *batch nb"],
) -> tuple[Float[Array, "7 *batch nb"], Float[Array, "7 *batch nb"], Float[Array, "*batch k"]]:
    res = total_resultants(model, t, q, u)
    th = inertia_components(model)
    w = cf.comps(u)[4:7]
    thw = cf.matvec(th, w)
    wdot = cf.matvec(cf.sym_inv(th), res.M - cf.cross(w, thw))
    udot = jnp.concatenate([res.F / model.mass, jnp.zeros_like(w[0])[None], wdot], axis=0)
    lam = -cf.dot3(w, thw) - res.S
    if model.joints:
        udot, lam = constrained(model, newton_euler_kinematics, t, q, u, udot, lam)
    return newton_euler_kinematics(q, u), udot, lam


def _us_E(p):
    """Udwadia–Schutte's 4x4 E = [pᵀ; E₁] with E₁ = G(p) of ME751 (Udwadia & Schutte 2010, eq. (2)); p (..., 4)."""
    return jnp.concatenate([p[..., None, :], quat.G(p)], axis=-2)


def udwadia_schutte_derivatives(
    J0,
    model,
    t: Float[Array, "*batch 1"],
    q: Float[Array, "7 *batch nb"],
    u: Float[Array, "7 *batch nb"],
) -> tuple[Float[Array, "7 *batch nb"], Float[Array, "7 *batch nb"], Float[Array, "*batch k"]]:
    res = total_resultants(model, t, q, u)
    qdot = newton_euler_kinematics(q, u)
    p = jnp.moveaxis(q[3:7], 0, -1)
    pd = jnp.moveaxis(qdot[3:7], 0, -1)
    mc = jnp.moveaxis(res.M, 0, -1)
    dtype = p.dtype
    th = jnp.broadcast_to(model.inertia, p.shape[:-1] + (3, 3))
    J = jnp.zeros(p.shape[:-1] + (4, 4), dtype)
    J = J.at[..., 0, 0].set(jnp.asarray(J0, dtype)).at[..., 1:, 1:].set(th)
    E = _us_E(p)
    Ed = _us_E(pd)
    Mu = 4.0 * jnp.swapaxes(E, -1, -2) @ J @ E
    gamma_b = jnp.concatenate([jnp.zeros_like(mc[..., :1]), mc], axis=-1)
    npd = jnp.sum(pd * pd, axis=-1)
    Q = (
        -8.0 * (jnp.swapaxes(Ed, -1, -2) @ (J @ (E @ pd[..., None])))[..., 0]
        - 4.0 * J0 * npd[..., None] * p
        + 2.0 * (jnp.swapaxes(E, -1, -2) @ gamma_b[..., None])[..., 0]
    )
    L = jnp.linalg.cholesky(Mu)
    if model.joints:
        return _us_mechanism(model, t, q, u, qdot, res, p, pd, npd, Mu, L, Q)
    a = jax.scipy.linalg.cho_solve((L, True), Q[..., None])[..., 0]
    # B = A_u L^{-T} (1 x 4); its transpose is L^{-1} A_uᵀ.
    bt = jax.scipy.linalg.solve_triangular(L, p[..., None], lower=True)
    B = jnp.swapaxes(bt, -1, -2)
    b_minus = (-npd - jnp.sum(p * a, axis=-1))[..., None, None]
    # Moore–Penrose inverse of the nonzero 1x4 row B: B⁺ = Bᵀ / (B Bᵀ) (exact, not a
    # regularisation; an SVD-based pinv gives the same to roundoff at ~50x the cost).
    z = jnp.swapaxes(B, -1, -2) / jnp.sum(B * B, axis=(-1, -2), keepdims=True) @ b_minus
    corr = jax.scipy.linalg.solve_triangular(jnp.swapaxes(L, -1, -2), z, lower=False)[..., 0]
    pdd = a + corr
    # μ with Q_c = M_u (p̈ − a) = 2 p μ (cf. Möller & Glocker 2012 eq. (81)).
    qc = (Mu @ corr[..., None])[..., 0]
    mu = jnp.sum(p * qc, axis=-1) / (2.0 * jnp.sum(p * p, axis=-1))
    pdd_cf = jnp.moveaxis(pdd, -1, 0)
    wdot = 2.0 * cf.qmul(cf.qconj(q[3:7]), pdd_cf)[1:4] / cf.qnorm2(q[3:7])
    udot = jnp.concatenate([res.F / model.mass, jnp.zeros_like(u[3])[None], wdot], axis=0)
    return qdot, udot, mu


def _us_mechanism(model, t, q, u, qdot, res, p, pd, npd, Mu, L, Q):
    """The fundamental equation for a whole mechanism in x = (r, p) per body (Udwadia & Schutte 2010
    eq. (12) with all constraints stacked): M_x = blockdiag(mI, M_u), constraint rows
    A = [normalisation pᵀ per body (eq. (11)); Φ_x of the joints], right-hand side
    b = [−|ṗ|²; γ_x] (q-space γ by nested jvp), and

        ẍ = a + L_x⁻ᵀ (A L_x⁻ᵀ)⁺ (b − A a),   a = M_x⁻¹ Q_x,

    with the Moore–Penrose inverse computed by SVD: it stays valid when joint equations are
    redundant (rank-deficient A). Singular values of B = A L_x⁻ᵀ at most 64·√eps times the
    largest count as zero (the cutoff of rbjax/_engine/rank.py, the same as the Schur
    complement's on the eigenvalues of B Bᵀ): off the joint manifold, drift makes redundant
    equations nearly independent, and inverting those directions creates spurious forces. The
    multipliers returned are the minimum-norm ones, μ = (B Bᵀ)⁺ (b − A a) = (B⁺)ᵀ B⁺ (b − A a);
    normalisation entries are halved to match c = |p|² − 1.
    """
    nb = model.nb
    batch = p.shape[:-2]
    dtype = p.dtype
    terms = joint_terms(model, lambda qq, x: x, t, q, qdot)
    rows = model.joint_rows
    m = sum(rows)
    # dense constraint matrix A (…, nb + m, 7 nb), batch-first
    A = jnp.zeros(batch + (nb + m, 7 * nb), dtype)
    eye = jnp.eye(nb, dtype=dtype)
    norm_rows = (
        eye[:, :, None]
        * jnp.concatenate([jnp.zeros(batch + (nb, 3), dtype), p], -1)[..., None, :, :]
    )
    A = A.at[..., :nb, :].set(norm_rows.reshape(batch + (nb, 7 * nb)))
    r0 = nb
    for k, bodies in enumerate(model.topology.joint_bodies):
        for side, b in enumerate(bodies):
            if b == GROUND:
                continue
            w = jnp.moveaxis(terms.W[k][side], (0, 1), (-2, -1))  # (…, m_k, 7)
            A = A.at[..., r0 : r0 + rows[k], 7 * b : 7 * b + 7].add(w)
        r0 += rows[k]
    gam = jnp.moveaxis(terms.gamma, 0, -1)
    bvec = jnp.concatenate([-npd, gam], axis=-1)
    # L_x and a = M_x⁻¹ Q_x per body
    mass = jnp.broadcast_to(model.mass, batch + (nb,))
    lx = jnp.zeros(batch + (nb, 7, 7), dtype)
    lx = lx.at[..., 0:3, 0:3].set(jnp.sqrt(mass)[..., None, None] * jnp.eye(3, dtype=dtype))
    lx = lx.at[..., 3:7, 3:7].set(L)
    f_lin = jnp.moveaxis(res.F, 0, -1)
    qx = jnp.concatenate([f_lin, Q], axis=-1)
    a_lin = f_lin / mass[..., None]
    a_rot = jax.scipy.linalg.cho_solve((L, True), Q[..., None])[..., 0]
    a = jnp.concatenate([a_lin, a_rot], axis=-1).reshape(batch + (7 * nb,))
    del qx
    # B = A L_x⁻ᵀ: solve L_x Z = Aᵀ per body block
    At = jnp.swapaxes(A, -1, -2).reshape(batch + (nb, 7, nb + m))
    Bt = jax.scipy.linalg.solve_triangular(lx, At, lower=True)
    B = jnp.swapaxes(Bt.reshape(batch + (7 * nb, nb + m)), -1, -2)
    resid = bvec - (A @ a[..., None])[..., 0]
    # One truncated Moore–Penrose inverse (singular values ≤ 64·√eps times the largest are
    # zero: rbjax/_engine/rank.py says why the default cutoff is not enough), and μ from it:
    # (B Bᵀ)⁺ = (B⁺)ᵀ B⁺, so μ = (B⁺)ᵀ z with z = B⁺ (b − A a).
    Bp = jnp.linalg.pinv(B, rtol=rank.pinv_rtol(B))
    zf = (Bp @ resid[..., None])[..., 0]
    z = zf.reshape(batch + (nb, 7))
    corr = jax.scipy.linalg.solve_triangular(jnp.swapaxes(lx, -1, -2), z[..., None], lower=False)[
        ..., 0
    ]
    xdd = a.reshape(batch + (nb, 7)) + corr
    mu = (jnp.swapaxes(Bp, -1, -2) @ zf[..., None])[..., 0]
    lam = jnp.concatenate([0.5 * mu[..., :nb], mu[..., nb:]], axis=-1)
    pdd_cf = jnp.moveaxis(xdd[..., 3:7], -1, 0)
    wdot = 2.0 * cf.qmul(cf.qconj(q[3:7]), pdd_cf)[1:4] / cf.qnorm2(q[3:7])
    vdot = jnp.moveaxis(xdd[..., 0:3], -1, 0)
    udot = jnp.concatenate([vdot, jnp.zeros_like(u[3])[None], wdot], axis=0)
    return qdot, udot, lam
