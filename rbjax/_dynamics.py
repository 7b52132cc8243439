"""Equations of motion: one body or nb bodies, three formulation classes covering the four
formulations of the core issue (the free scalable body is ScalableDAE with scalable bodies).

Every formulation maps (model, t, q, u) to (q̇, u̇, λ) in the one state convention
(rbjax/_state.py), so integrators and rollouts never know which one they run:

=====================  ==========================================  ===============================
formulation            equations                                   λ returned
=====================  ==========================================  ===============================
ScalableDAE, scalable  seed 000 eq. (93) with λ = 0, no constraint 0 (7-DOF scalable body)
ScalableDAE, rigid     eq. (93) + perfect constraint |A|² = 1      scaling force, = eq. (96)
                       (eqs. (77)-(82)); W = e_ν, γ = 0 (checked
                       against autodiff of c)
NewtonEuler            eq. (95): Θω̇ + ω̃Θω = M_C, Ȧ = ½A(0,ω)      eq. (96) evaluated
UdwadiaSchutte(J0)     seed 001 eqs. (39), (43)-(45): M_u = 4EᵀJE,  quaternion multiplier μ with
                       fundamental equation, Moore–Penrose inverse  Q_c = 2pμ (depends on J0)
=====================  ==========================================  ===============================

Internally everything is component-first (rbjax/_engine/kernels.py): q, u have shape (7, ..., nb).
"""

from __future__ import annotations

import abc
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from . import _quaternion as quat
from ._constraints import GROUND
from ._engine import kernels as cf
from ._engine.joints import joint_terms, solve_multipliers
from ._engine.layout import inertia_components, to_components
from ._engine.mass import half_trace, mvec
from ._forces import Resultants, total_resultants

# ------------------------------------------------------------------------ formulations


def constrained(model, kin, t, q, u, a, lam_nu_free):
    """Add the joint constraint forces to the unconstrained acceleration ``a`` (ν̇ = 0 set for
    rigid bodies). Returns (u̇, λ) with λ = (scaling multipliers (..., nb), joint multipliers
    (..., m)) concatenated on the last axis; see rbjax/_engine/joints.py for the elimination."""
    terms = joint_terms(model, kin, t, q, u)
    extra = None
    if model.baumgarte is not None:  # c̈ + 2α ċ + β² c = 0
        al, be = model.baumgarte
        extra = [-2.0 * al * cd - be * be * c for c, cd in zip(terms.c, terms.cdot, strict=True)]
    lam, corr, fnu = solve_multipliers(model, terms, a, extra)
    lam_n = jnp.where(model.rigid, lam_nu_free - fnu, 0.0)
    lam_j = jnp.moveaxis(jnp.concatenate(lam, axis=0), 0, -1)
    lam_n = jnp.broadcast_to(lam_n, lam_j.shape[:-1] + lam_n.shape[-1:])
    return a + corr, jnp.concatenate([lam_n, lam_j], axis=-1)


class AbstractFormulation(eqx.Module):
    """How the equations of motion are written. Concrete formulations are final."""

    is_dae: ClassVar[bool] = False

    def check_model(self, model) -> None:  # noqa: B027 - optional hook
        """Raise ValueError at build time if this formulation cannot run ``model``."""

    @abc.abstractmethod
    def kinematics(self, q, u):
        """q̇ as a function of (q, u), component-first."""

    @abc.abstractmethod
    def derivatives(self, model, t, q, u):
        """(q̇, u̇, λ) component-first; λ has shape (..., nb)."""


def _rigid_only(name, model):
    bad = [n for n, s in zip(model.names, model.scalable, strict=True) if s]
    if bad:
        raise ValueError(
            f"{name} describes rigid bodies only, but bodies {bad} are declared scalable=True. "
            "Fix: use formulation=ScalableDAE() for scalable bodies."
        )


class ScalableDAE(AbstractFormulation):
    """Möller–Glocker's scalable body in generalized velocities (seed 000, eq. (93)).

    Each body has 7 velocities u = (v, ν, ω) and the constant regular mass matrix
    M = diag(mI, ½trΘ, Θ) (eq. (64)):

        m v̇ = F,
        ½ trΘ ν̇ − ωᵀΘω / |A|² = S_C + λ,
        Θ ω̇ + (νI + ω̃) Θω / |A|² = M_C,
        ṙ = v,   Ȧ = A (ν, ω) / (2|A|²).

    A scalable body (``Body(scalable=True)``) has λ = 0 and no constraint: the free 7-DOF body,
    which grows when it spins. A rigid body adds the perfect bilateral constraint
    c = |A|² − 1 = 0 (eq. (77)) with generalized force Wᵀλ (eq. (81)), W = c_q Q⁻¹, and
    λ solves the Schur complement (W M⁻¹ Wᵀ) λ = γ − W M⁻¹ (f − h). In u-coordinates W = e_ν
    and γ = 0 exactly (see :meth:`normalisation_jacobian`); :meth:`constraint_jacobian` and
    :meth:`gamma` obtain them by autodiff of c alone (jvp, nested jvp), the route joints take.
    Each constraint involves one body, so W M⁻¹ Wᵀ is diagonal; along any trajectory λ equals
    −ωᵀΘω − S_C (eq. (96)), the physical force that keeps the body from growing.
    """

    is_dae: ClassVar[bool] = True

    def kinematics(self, q, u):
        qc, uc = cf.comps(q), cf.comps(u)
        return jnp.concatenate([cf.stack(*uc[0:3]), cf.kin_qdot(qc[3:7], uc[3], uc[4:7])], axis=0)

    def constraint(self, model, q):
        """c(q) = |A|² − 1 for rigid bodies, 0 for scalable bodies; shape (..., nb)."""
        return jnp.where(model.rigid, cf.qnorm2(q[3:7]) - 1.0, 0.0)

    def _free_parts(self, model, res: Resultants, q, u):
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

    def free_acceleration(self, model, res: Resultants, q, u):
        """u̇ of eq. (93) with λ = 0: the unconstrained scalable body."""
        vdot, nudot, wdot = self._free_parts(model, res, q, u)
        return jnp.concatenate([vdot, nudot[None], wdot], axis=0)

    def constraint_velocity(self, model, q, x):
        """ċ = W(q) x for a velocity x in u-space: jvp of c along q̇ = Q⁻¹ x."""
        return jax.jvp(lambda qq: self.constraint(model, qq), (q,), (self.kinematics(q, x),))[1]

    def constraint_jacobian(self, model, q):
        """W = c_q Q⁻¹ (seed 000 eqs. (79), (85)) as a component-first array (7, ..., nb).

        Each constraint involves one body, so row W of body i is obtained for every body at
        once by seven jvps of c along q̇ = Q⁻¹ e_k (k = 0..6), one unit velocity per component.
        """
        eye = jnp.eye(7, dtype=q.dtype).reshape((7, 7) + (1,) * (q.ndim - 1))
        return jnp.stack(
            [
                self.constraint_velocity(model, q, jnp.broadcast_to(eye[k], q.shape))
                for k in range(7)
            ]
        )

    def gamma(self, model, q, u):
        """γ = −(d/dt W) u = −∂(W(q) u)/∂q · q̇ (nested jvp), so that W u̇ = γ."""
        qdot = self.kinematics(q, u)
        return -jax.jvp(lambda qq: self.constraint_velocity(model, qq, u), (q,), (qdot,))[1]

    def normalisation_jacobian(self, model, q):
        """W of the normalisation constraint in closed form: the unit vector on ν, for every q.

        In generalized velocities ċ = d|A|²/dt = ν exactly (seed 000, eqs. (44), (89)-(90)):
        the very reason the paper writes the DAE in u. So W = e_ν and γ = 0 for any A ≠ 0.
        :meth:`constraint_jacobian` and :meth:`gamma` derive the same W and γ by autodiff of c
        alone (tests check they agree); the closed form is used in the inner loop because the
        autodiff route costs ~10x the whole free-body right-hand side at large batches (RK4,
        B = 1024: 2 M vs 25 M body-steps/s measured). Joint constraints use autodiff.
        """
        e = jnp.zeros((7,) + (1,) * (q.ndim - 1), q.dtype).at[3].set(1.0)
        return jnp.where(model.rigid, e, 0.0) + jnp.zeros_like(q)

    def derivatives(self, model, t, q, u):
        res = total_resultants(model, t, q, u)
        vdot, nudot, wdot = self._free_parts(model, res, q, u)
        qdot = self.kinematics(q, u)
        if model.joints:
            rigid = model.rigid
            a = jnp.concatenate([vdot, jnp.where(rigid, 0.0, nudot)[None], wdot], axis=0)
            udot, lam = constrained(model, self.kinematics, t, q, u, a, -nudot * half_trace(model))
            return qdot, udot, lam
        if all(model.scalable):
            return qdot, jnp.concatenate([vdot, nudot[None], wdot], axis=0), jnp.zeros_like(q[0])
        # Schur complement (W M⁻¹ Wᵀ) λ = γ − W a with W = e_ν, γ = 0 (one scalar per body):
        # λ = −½trΘ ν̇_free, and M⁻¹ Wᵀ λ = e_ν λ / (½trΘ) cancels ν̇ exactly for rigid bodies.
        rigid = model.rigid
        lam = jnp.where(rigid, -nudot * half_trace(model), 0.0)
        nudot = jnp.where(rigid, 0.0, nudot)
        return qdot, jnp.concatenate([vdot, nudot[None], wdot], axis=0), lam


class NewtonEuler(AbstractFormulation):
    """Newton–Euler equations of a rigid body (seed 000, eq. (95)):

        m v̇ = F,   Θ ω̇ + ω̃ Θ ω = M_C,   ṙ = v,   Ȧ = ½ A (0, ω),

    with ν ≡ 0 (eq. (94)) and the scaling constraint force reported from eq. (96),
    λ = −ωᵀΘω − S_C. |A|² is a first integral of Ȧ = ½A(0, ω); explicit integrators drift
    from it at their truncation order.
    """

    def check_model(self, model):
        _rigid_only("NewtonEuler", model)

    def kinematics(self, q, u):
        qc, uc = cf.comps(q), cf.comps(u)
        w = uc[4:7]
        return jnp.concatenate(
            [cf.stack(*uc[0:3]), 0.5 * cf.qmul(qc[3:7], (jnp.zeros_like(w[0]), *w))], axis=0
        )

    def derivatives(self, model, t, q, u):
        res = total_resultants(model, t, q, u)
        th = inertia_components(model)
        w = cf.comps(u)[4:7]
        thw = cf.matvec(th, w)
        wdot = cf.matvec(cf.sym_inv(th), res.M - cf.cross(w, thw))
        udot = jnp.concatenate([res.F / model.mass, jnp.zeros_like(w[0])[None], wdot], axis=0)
        lam = -cf.dot3(w, thw) - res.S
        if model.joints:
            udot, lam = constrained(model, self.kinematics, t, q, u, udot, lam)
        return self.kinematics(q, u), udot, lam


def _us_E(p):
    """Udwadia–Schutte's 4x4 E = [pᵀ; E₁] with E₁ = G(p) of ME751 (seed 001, eq. (2)); p (..., 4)."""
    return jnp.concatenate([p[..., None, :], quat.G(p)], axis=-2)


class UdwadiaSchutte(AbstractFormulation):
    """Udwadia–Schutte quaternion equations via the fundamental equation (seed 001).

    The rotational coordinates p = A are treated as unconstrained with the positive definite
    M_u = 4EᵀJE, J = diag(J0, Θ) for an ARBITRARY J0 > 0 (seed 001, eqs. (4), (10); Θ may be
    a full inertia, which generalises diag(J1, J2, J3)). The impressed force is
    Q = −8ĖᵀJEṗ − 4J0 N(ṗ) p + 2EᵀΓ_B (eqs. (39), (43)-(44)) and the unit-norm constraint
    pᵀp̈ = −N(ṗ) (eq. (11)) is enforced by the fundamental equation of constrained motion with
    the Moore–Penrose inverse (eqs. (12), (45)):

        p̈ = a + L⁻ᵀ (A_u L⁻ᵀ)⁺ (b_u − A_u a),   a = M_u⁻¹ Q,   M_u = L Lᵀ.

    Seed 001 writes M_u^{1/2}; any factor M_u = L Lᵀ gives the same p̈ (it is the minimiser of
    Gauss's function (p̈ − a)ᵀ M_u (p̈ − a) subject to the constraint, Udwadia & Kalaba 1996),
    and the Cholesky factor stays differentiable where a symmetric square root is not
    (repeated eigenvalues). The result does not depend on J0 (eq. (42)); this is a test.
    ω̇ = 2 G(p) p̈ converts back to the state convention; translation is m v̇ = F.
    """

    J0: float | Float[Array, ""] = 1.0

    def __check_init__(self):
        if isinstance(self.J0, (int, float)) and not self.J0 > 0:
            raise ValueError(
                f"UdwadiaSchutte.J0 = {self.J0} is not > 0. Fix: J0 is an arbitrary positive inertia, e.g. 1.0."
            )

    def check_model(self, model):
        _rigid_only("UdwadiaSchutte", model)

    def kinematics(self, q, u):
        return NewtonEuler().kinematics(q, u)

    def derivatives(self, model, t, q, u):
        res = total_resultants(model, t, q, u)
        qdot = self.kinematics(q, u)
        p = jnp.moveaxis(q[3:7], 0, -1)
        pd = jnp.moveaxis(qdot[3:7], 0, -1)
        mc = jnp.moveaxis(res.M, 0, -1)
        dtype = p.dtype
        th = jnp.broadcast_to(model.inertia, p.shape[:-1] + (3, 3))
        J = jnp.zeros(p.shape[:-1] + (4, 4), dtype)
        J = J.at[..., 0, 0].set(jnp.asarray(self.J0, dtype)).at[..., 1:, 1:].set(th)
        E = _us_E(p)
        Ed = _us_E(pd)
        Mu = 4.0 * jnp.swapaxes(E, -1, -2) @ J @ E
        gamma_b = jnp.concatenate([jnp.zeros_like(mc[..., :1]), mc], axis=-1)
        npd = jnp.sum(pd * pd, axis=-1)
        Q = (
            -8.0 * (jnp.swapaxes(Ed, -1, -2) @ (J @ (E @ pd[..., None])))[..., 0]
            - 4.0 * self.J0 * npd[..., None] * p
            + 2.0 * (jnp.swapaxes(E, -1, -2) @ gamma_b[..., None])[..., 0]
        )
        L = jnp.linalg.cholesky(Mu)
        if model.joints:
            return self._mechanism(model, t, q, u, qdot, res, p, pd, npd, Mu, L, Q)
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
        # μ with Q_c = M_u (p̈ − a) = 2 p μ (cf. seed 000 eq. (81)).
        qc = (Mu @ corr[..., None])[..., 0]
        mu = jnp.sum(p * qc, axis=-1) / (2.0 * jnp.sum(p * p, axis=-1))
        pdd_cf = jnp.moveaxis(pdd, -1, 0)
        wdot = 2.0 * cf.qmul(cf.qconj(q[3:7]), pdd_cf)[1:4] / cf.qnorm2(q[3:7])
        udot = jnp.concatenate([res.F / model.mass, jnp.zeros_like(u[3])[None], wdot], axis=0)
        return qdot, udot, mu

    def _mechanism(self, model, t, q, u, qdot, res, p, pd, npd, Mu, L, Q):
        """The fundamental equation for a whole mechanism in x = (r, p) per body (seed 001
        eq. (12) with all constraints stacked): M_x = blockdiag(mI, M_u), constraint rows
        A = [normalisation pᵀ per body (eq. (11)); Φ_x of the joints], right-hand side
        b = [−|ṗ|²; γ_x] (q-space γ by nested jvp), and

            ẍ = a + L_x⁻ᵀ (A L_x⁻ᵀ)⁺ (b − A a),   a = M_x⁻¹ Q_x,

        with the Moore–Penrose inverse computed by SVD: it stays valid when joint equations are
        redundant (rank-deficient A). The multipliers returned are the minimum-norm ones,
        μ = (B Bᵀ)⁺ (b − A a); normalisation entries are halved to match c = |p|² − 1.
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
        gam = jnp.moveaxis(jnp.concatenate(terms.gamma, axis=0), 0, -1)
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
        Bp = jnp.linalg.pinv(B)
        z = (Bp @ resid[..., None])[..., 0].reshape(batch + (nb, 7))
        corr = jax.scipy.linalg.solve_triangular(
            jnp.swapaxes(lx, -1, -2), z[..., None], lower=False
        )[..., 0]
        xdd = a.reshape(batch + (nb, 7)) + corr
        mu = (jnp.linalg.pinv(B @ jnp.swapaxes(B, -1, -2), hermitian=True) @ resid[..., None])[
            ..., 0
        ]
        lam = jnp.concatenate([0.5 * mu[..., :nb], mu[..., nb:]], axis=-1)
        pdd_cf = jnp.moveaxis(xdd[..., 3:7], -1, 0)
        wdot = 2.0 * cf.qmul(cf.qconj(q[3:7]), pdd_cf)[1:4] / cf.qnorm2(q[3:7])
        vdot = jnp.moveaxis(xdd[..., 0:3], -1, 0)
        udot = jnp.concatenate([vdot, jnp.zeros_like(u[3])[None], wdot], axis=0)
        return qdot, udot, lam


# ------------------------------------------------------------- public natural-layout API


def accelerations(model, state):
    """(u̇, λ) of ``model.formulation`` at ``state``; u̇ has the shape of ``state.u``."""
    t, q, u = to_components(state)
    _, udot, lam = model.formulation.derivatives(model, t, q, u)
    return jnp.moveaxis(udot, 0, -1), lam


def mass_matrix(model):
    """M = diag(mI, ½trΘ, Θ) per body, shape (..., nb, 7, 7) (seed 000, eq. (64))."""
    m = model.mass
    dtype = model.inertia.dtype
    out = jnp.zeros(m.shape + (7, 7), dtype)
    out = out.at[..., 0:3, 0:3].set(m[..., None, None] * jnp.eye(3, dtype=dtype))
    out = out.at[..., 3, 3].set(half_trace(model))
    return out.at[..., 4:7, 4:7].set(model.inertia)


def kinetic_energy(model, state):
    """T = ½ uᵀ M u summed over bodies (seed 000, eqs. (60), (64)); valid for scalable bodies."""
    _, _, u = to_components(state)
    return 0.5 * jnp.sum(jnp.sum(u * mvec(model, u), axis=0), axis=-1)


def potential_energy(model, state):
    """V = −Σ m gᵀ r (uniform gravity)."""
    g = jnp.asarray(model.gravity)[..., None, :]
    return -jnp.sum(model.mass * jnp.sum(g * state.q[..., 0:3], axis=-1), axis=-1)


def total_energy(model, state):
    """T + V [J]; conserved for torque-free and gravity-only motion."""
    return kinetic_energy(model, state) + potential_energy(model, state)


def linear_momentum(model, state):
    """Σ m v, world frame [kg m/s]."""
    return jnp.sum(model.mass[..., None] * state.u[..., 0:3], axis=-2)


def angular_momentum(model, state):
    """Angular momentum about the world origin, world frame: Σ m r × v + s R Θ ω.

    For a scalable body, ∫ ξ × ξ̇ dm = m r × v + s R Θ ω (ν contributes nothing since
    ϱ × ϱ = 0); s R x is the quaternion transform A (0, x) A* (seed 000, eq. (27)).
    """
    _, q, u = to_components(state)
    th = inertia_components(model)
    spin = cf.transform(q[3:7], cf.matvec(th, u[4:7]))
    orbital = model.mass * cf.cross(q[0:3], u[0:3])
    return jnp.moveaxis(jnp.sum(spin + orbital, axis=-1), 0, -1)


def scaling_force_closed_form(model, state):
    """λ = −ωᵀΘω − S_C (seed 000, eq. (96)), the scaling constraint force of a rigid body."""
    t, q, u = to_components(state)
    res = total_resultants(model, t, q, u)
    th = inertia_components(model)
    w = u[4:7]
    return -cf.dot3(w, cf.matvec(th, w)) - res.S


def velocity_transform(q):
    """Q(q) of seed 000 eq. (38), u = Q q̇: blockdiag(I, 2φ(A*)); q (..., 7) -> (..., 7, 7)."""
    out = jnp.zeros(q.shape + (7,), q.dtype)
    out = out.at[..., 0:3, 0:3].set(jnp.eye(3, dtype=q.dtype))
    return out.at[..., 3:7, 3:7].set(2.0 * quat.phi(quat.conjugate(q[..., 3:7])))


def velocity_transform_inverse(q):
    """Q⁻¹(q) of seed 000 eq. (85): blockdiag(I, φ(A) / (2|A|²))."""
    a = q[..., 3:7]
    out = jnp.zeros(q.shape + (7,), q.dtype)
    out = out.at[..., 0:3, 0:3].set(jnp.eye(3, dtype=q.dtype))
    return out.at[..., 3:7, 3:7].set(quat.phi(a) / (2.0 * quat.norm2(a)[..., None, None]))
