"""Constraint machinery of a mechanism: W, γ, the Schur complement and reaction forces.

A model's joints are perfect bilateral constraints c(q, t) = 0 (seed 000 eqs. (77)-(82)). In
generalized velocities u (seed 000 eq. (37)), ċ = W u + c_t with W = c_q Q⁻¹, and

    M u̇ = f − h + Wᵀλ,      W u̇ = γ = −(∂ċ/∂q q̇ + ∂ċ/∂t)|_u.

W and γ come from automatic differentiation of each joint's residual alone: the 7 columns of W
for a body are jvps of c along q̇ = Q⁻¹(q) e_k (the formulation's kinematics), and γ is a nested
jvp (DESIGN.md); no Jacobian is written by hand.

Rigid bodies: their normalisation constraint |A|² = 1 has W = e_ν exactly (seed 000 eqs. (44),
(89)-(90)), so it is eliminated in closed form: ν̇ = 0 and the joint multipliers solve the Schur
complement S λ = γ − W̃ a with W̃ = W with the ν columns of rigid bodies removed and
S = W̃ M⁻¹ W̃ᵀ (M⁻¹ block-diagonal and constant per body, seed 000 eq. (64)). The scaling
multiplier then follows from the ν row: λ_ν = −(f − h)_ν − (Wᵀλ)_ν (eq. (96) with the joint's
scaling load). This is exactly the full KKT solution, with a smaller SPD system. S is factored
by a block-sparse Cholesky over joints (rbjax/_blockchol.py): O(N) for a chain of N links.

Joints of the same type (and the same driver function) are stacked along a trailing axis and
evaluated together, so compile time grows with the number of joint TYPES, not joints.
"""

from __future__ import annotations

import copy

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from . import _cf as cf
from ._blockchol import BlockCholesky, mm_t
from ._constraints import GROUND
from ._mass import half_trace, inertia_cf, minv


def _neutral(joint):
    j = copy.copy(joint)
    object.__setattr__(j, "body_i", 0)
    object.__setattr__(j, "body_j", 0)
    object.__setattr__(j, "name", "")
    return j


class Group:
    """Joints of one type stacked along a trailing axis (trace-time helper)."""

    def __init__(self, joints, ids, nb):
        self.ids = ids
        parts = [eqx.partition(_neutral(j), eqx.is_array) for j in joints]
        static = parts[0][1]
        if len(joints) == 1:
            arrays = jax.tree.map(lambda x: x[..., None], parts[0][0])
        else:
            arrays = jax.tree.map(lambda *xs: jnp.stack(xs, axis=-1), *[p[0] for p in parts])
        self.joint = eqx.combine(arrays, static)
        # GROUND is the extra column nb of the extended coordinates.
        self.bi = np.asarray([nb if j.body_i == GROUND else j.body_i for j in joints])
        self.bj = np.asarray([nb if j.body_j == GROUND else j.body_j for j in joints])


def _key(joint):
    arrays, static = eqx.partition(_neutral(joint), eqx.is_array)
    shapes = tuple((x.shape, str(x.dtype)) for x in jax.tree_util.tree_leaves(arrays))
    try:
        hash(static)
        return (type(joint), jax.tree_util.tree_structure(arrays), shapes, static)
    except TypeError:
        return ("unique", id(joint))


def groups(model):
    """Group the model's joints by type (and static data)."""
    by_key: dict = {}
    order = []
    for k, j in enumerate(model.joints):
        key = _key(j)
        if key not in by_key:
            by_key[key] = []
            order.append(key)
        by_key[key].append(k)
    return [Group([model.joints[k] for k in by_key[key]], by_key[key], model.nb) for key in order]


def _extend(x, ground):
    """Append the ground as an extra body column: (7, ..., nb) -> (7, ..., nb + 1)."""
    g = jnp.broadcast_to(
        jnp.asarray(ground, x.dtype).reshape((7,) + (1,) * (x.ndim - 1)), x.shape[:-1] + (1,)
    )
    return jnp.concatenate([x, g], axis=-1)


_GROUND_Q = (0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0)
_ZERO_U = (0.0,) * 7


class JointTerms(eqx.Module):
    """Per-joint constraint terms (lists indexed by joint, component-first, batch trailing).

    ``c`` (m_k, ...) residual; ``cdot`` (m_k, ...) = W u + c_t; ``gamma`` (m_k, ...);
    ``W`` per joint a pair (W_i, W_j) of (m_k, 7, ...) blocks; for a ground side the block is
    the Jacobian with respect to a virtual motion of the ground frame (used for its reaction).
    """

    c: list
    cdot: list
    gamma: list
    W: list


def joint_terms(model, kin, t, q, u, *, jacobian=True, gamma=True, cdot=False):
    """Evaluate every joint's residual, W blocks and γ (autodiff of the residual only).

    ``kin(q, u)`` is the formulation's q̇ = Q⁻¹(q) u (component-first, linear in u); ``t`` has
    shape (..., 1) or (...,); q, u (7, ..., nb).
    """
    nj = len(model.joints)
    c: list = [None] * nj
    cdot_k: list = [None] * nj
    gam: list = [None] * nj
    W: list = [None] * nj
    # Inside, bodies/joints go BEFORE the batch axes so that the batch stays the minor
    # (contiguous, vectorised) axis: (7, nb + 1, *batch); parameters (k, g) broadcast along it.
    nbatch = q.ndim - 2
    tt = (t[..., 0] if t.ndim == q.ndim - 1 else t)[None]  # (1, *batch)
    qx = jnp.moveaxis(_extend(q, _GROUND_Q), -1, 1)
    ux = jnp.moveaxis(_extend(u, _ZERO_U), -1, 1)
    eye = jnp.eye(7, dtype=q.dtype)
    for grp in groups(model):
        joint = jax.tree.map(
            lambda x: x.reshape(x.shape + (1,) * nbatch) if eqx.is_array(x) else x, grp.joint
        )
        qi, qj = qx[:, grp.bi], qx[:, grp.bj]
        ui, uj = ux[:, grp.bi], ux[:, grp.bj]

        def res(a, b, s, joint=joint):
            return joint.residual(a, b, s)

        ones = jnp.ones_like(tt)
        val = res(qi, qj, tt)
        if gamma:
            qdi, qdj = kin(qi, ui), kin(qj, uj)

            def cd(a, b, s, ui=ui, uj=uj, res=res, ones=ones):
                return jax.jvp(res, (a, b, s), (kin(a, ui), kin(b, uj), ones))[1]

            cdv, cdd = jax.jvp(cd, (qi, qj, tt), (qdi, qdj, ones))
            gv = -cdd
        elif cdot:  # ċ = W u + c_t only (one jvp)
            qdi, qdj = kin(qi, ui), kin(qj, uj)
            cdv = jax.jvp(res, (qi, qj, tt), (qdi, qdj, ones))[1]
            gv = jnp.zeros(())
        else:
            cdv = gv = jnp.zeros(())
        if jacobian:

            def col(e, side, qi=qi, qj=qj, res=res):
                q_s = qi if side == 0 else qj
                d = kin(q_s, jnp.broadcast_to(e.reshape((7,) + (1,) * (q_s.ndim - 1)), q_s.shape))
                z = jnp.zeros_like(d)
                tang = (d, z) if side == 0 else (z, d)
                return jax.jvp(lambda a, b: res(a, b, tt), (qi, qj), tang)[1]

            wi = jax.vmap(lambda e: col(e, 0))(eye)  # (7, m, g, *batch)
            wj = jax.vmap(lambda e: col(e, 1))(eye)
        for p, k in enumerate(grp.ids):
            c[k] = val[:, p]
            if gamma:
                cdot_k[k], gam[k] = cdv[:, p], gv[:, p]
            elif cdot:
                cdot_k[k] = cdv[:, p]
            if jacobian:
                W[k] = (jnp.moveaxis(wi[:, :, p], 0, 1), jnp.moveaxis(wj[:, :, p], 0, 1))
    return JointTerms(c=c, cdot=cdot_k, gamma=gam, W=W)


def _minv_rows(mass_b, ht_b, thinv_b, w):
    """M_b⁻¹ applied to every row of w (m, 7, ...) (seed 000 eq. (64))."""
    lin = w[:, 0:3] / mass_b
    nu = (w[:, 3] / ht_b)[:, None]
    rot = jnp.moveaxis(cf.matvec(thinv_b, jnp.moveaxis(w[:, 4:7], 1, 0)), 0, 1)
    return jnp.concatenate([lin, nu, rot], axis=1)


def body_of(model, k, side):
    j = model.joints[k]
    return j.body_i if side == 0 else j.body_j


def solve_multipliers(model, terms: JointTerms, a, rhs_extra=None):
    """Solve S λ = γ − W̃ a (+ rhs_extra) and return (λ per joint, M⁻¹W̃ᵀλ, (Wᵀλ)_ν).

    ``a`` (7, ..., nb) is the unconstrained acceleration with ν̇ = 0 already set for rigid
    bodies. Returns λ as a list of (m_k, ...), the correction (7, ..., nb) to add to a, and the
    scaling component of the joint forces per body (..., nb).
    """
    nb, nj = model.nb, len(model.joints)
    rigid = [not s for s in model.scalable]
    thinv = cf.sym_inv(inertia_cf(model))
    ht = half_trace(model)
    nu_mask = jnp.asarray([0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0], a.dtype)

    wt, x = {}, {}
    for k in range(nj):
        for side in (0, 1):
            b = body_of(model, k, side)
            if b == GROUND:
                continue
            w = terms.W[k][side]
            if rigid[b]:
                w = w * (1.0 - nu_mask).reshape((1, 7) + (1,) * (w.ndim - 2))
            wt[(k, side)] = w
            x[(k, side)] = _minv_rows(model.mass[..., b], ht[..., b], thinv[..., b], w)
    touching = {b: [] for b in range(nb)}
    for k, side in wt:
        touching[body_of(model, k, side)].append((k, side))
    blocks: dict = {}
    for b in range(nb):
        for k, sk in touching[b]:
            for l, sl in touching[b]:
                if l > k:
                    continue
                blk = mm_t(wt[(k, sk)], x[(l, sl)])
                blocks[(k, l)] = blk if (k, l) not in blocks else blocks[(k, l)] + blk
    a_t = jnp.moveaxis(a, -1, 1)  # (7, nb, ...): bodies before the batch (contiguous slices)
    rhs = []
    for k in range(nj):
        r = terms.gamma[k]
        for side in (0, 1):
            if (k, side) in wt:
                b = body_of(model, k, side)
                r = r - jnp.sum(wt[(k, side)] * a_t[:, b][None], axis=1)
        if rhs_extra is not None:
            r = r + rhs_extra[k]
        rhs.append(r)
    lam = BlockCholesky(blocks, nj).solve(rhs)
    corr = [jnp.zeros_like(a_t[:, 0]) for _ in range(nb)]
    fnu = [jnp.zeros_like(a_t[0, 0]) for _ in range(nb)]
    for k, side in wt:
        b = body_of(model, k, side)
        corr[b] = corr[b] + jnp.sum(x[(k, side)] * lam[k][:, None], axis=0)
        fnu[b] = fnu[b] + jnp.sum(terms.W[k][side][:, 3] * lam[k], axis=0)
    return lam, jnp.stack(corr, axis=-1), jnp.stack(fnu, axis=-1)


def joint_force_correction(model, terms: JointTerms, lam, *, reduced: bool):
    """M⁻¹ Wᵀ λ (7, ..., nb) for per-joint multipliers ``lam`` (list of (m_k, ...)).

    ``reduced``: use W̃ (ν columns of rigid bodies removed), as in the Schur complement;
    otherwise the full W (the implicit DAE scheme, where ν is an unknown of its own).
    """
    like = terms.c[0]
    nb = model.nb
    acc = [jnp.zeros((7,) + like.shape[1:], like.dtype) for _ in range(nb)]
    for k in range(len(model.joints)):
        for side in (0, 1):
            b = body_of(model, k, side)
            if b == GROUND:
                continue
            w = terms.W[k][side]
            if reduced and not model.scalable[b]:
                w = w.at[:, 3].set(0.0)
            acc[b] = acc[b] + jnp.sum(w * lam[k][:, None], axis=0)
    return minv(model, jnp.stack(acc, axis=-1))


def generalized_forces(terms: JointTerms, lam):
    """Per joint and side the generalized force Wᵀλ: (F world, S_C, M_C body axes) (7, ...)."""
    return [
        tuple(jnp.sum(terms.W[k][side] * lam[k][:, None], axis=0) for side in (0, 1))
        for k in range(len(lam))
    ]
