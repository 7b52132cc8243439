"""Joint-space dynamics of a tree: M(q) q̈ = τ − b(q, q̇) (Featherstone 2008, eq. (6.1)).

Spatial vectors are (angular; linear) about each tree's reference point O, in world axes
(rbjax/_tree/kinematics.py). A body's spatial inertia about O is held as (m, h, Iₒ): its mass,
h = m r (r from O to the centre of mass) and Iₒ = R Θ Rᵀ + m (|r|² 1 − r rᵀ) (Θ the inertia
about the centre of mass in body axes; parallel-axis theorem). Applied to a motion (ω, v):

    I (ω, v) = (Iₒ ω + h × v,  m v − h × ω)                      (Featherstone 2008, eq. (2.63))

**Mass matrix (composite-rigid-body algorithm, Featherstone 2008, §6.2).** With Iᶜᵢ the sum of
the inertias of body i's subtree and S_d the motion subspace of DOF d,
M_ab = S_aᵀ Iᶜ_body(a) S_b when DOF b acts before (or with) DOF a, its transpose when a acts
before b, 0 otherwise; plus the joint armature on the diagonal. The subtree sums are products
with the tree's 0/1 subtree mask, so the whole matrix is three vectorised operations.

**Bias forces (recursive Newton–Euler with q̈ = 0, Featherstone 2008, §5.3, Table 5.1).** The
velocity after each DOF is V_d = Σ_{b ⪯ d} S_b q̇_b, each DOF's velocity-product
acceleration is c_d = V_d ×ₘ S_d q̇_d (Ṡ = V × S for an axis fixed in the frame it moves),
a body's acceleration is a_i = −a_g + Σ_{d ⪯ i} c_d (gravity as an acceleration of the base),
its force f_i = I_i a_i + v_i ×* I_i v_i − f_ext,i, and the bias on DOF d is
b_d = S_dᵀ Σ_{k ∈ subtree(body(d))} f_k.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .._engine.kernels import cross, qmul
from .kinematics import Frames, frames, matmul, matvec, motion_subspace
from .topology import TreeTopology


def masked_sum(x, mask: np.ndarray):
    """y[:, a] = Σ_n mask[a, n] x[:, n] for a component-first (c, n, ...) array."""
    m = jnp.asarray(mask, x.dtype)
    return jnp.einsum("cn...,an->ca...", x, m)


def cross_motion(v, s):
    """v ×ₘ s for spatial motions (6, ...) (Featherstone 2008, eq. (2.31))."""
    w, u, sw, su = v[:3], v[3:], s[:3], s[3:]
    return jnp.concatenate([cross(w, sw), cross(w, su) + cross(u, sw)], axis=0)


def cross_force(v, f):
    """v ×* f for a spatial motion v and force f (Featherstone 2008, eq. (2.32))."""
    w, u, n, fl = v[:3], v[3:], f[:3], f[3:]
    return jnp.concatenate([cross(w, n) + cross(u, fl), cross(w, fl)], axis=0)


def apply_inertia(inert, v):
    """I v for body inertias (m, h, Iₒ) about O (module docstring)."""
    m, h, io = inert
    w, u = v[:3], v[3:]
    return jnp.concatenate([matvec(io, w) + cross(h, u), m * u - cross(h, w)], axis=0)


def body_inertias(topo: TreeTopology, model, f: Frames):
    """(m (nb, ...), h (3, nb, ...), Iₒ (3, 3, nb, ...)) of each body about its tree's O."""
    tail = f.p.shape[2:]
    bc = (slice(None),) * 2 + (None,) * len(tail)
    com = f.p + matvec(f.R, jnp.broadcast_to(model.com.T[bc], f.p.shape))
    r = com - f.origin
    m = model.mass.reshape((-1,) + (1,) * len(tail))
    theta = jnp.moveaxis(model.inertia, 0, -1)[(slice(None),) * 3 + (None,) * len(tail)]
    iw = matmul(matmul(f.R, jnp.broadcast_to(theta, f.R.shape)), jnp.swapaxes(f.R, 0, 1))
    rr = jnp.sum(r * r, axis=0)
    eye = jnp.eye(3, dtype=r.dtype).reshape((3, 3) + (1,) * (r.ndim - 1))
    io = iw + m * (rr * eye - r[:, None] * r[None, :])
    return m, m * r, io


def mass_matrix_from(topo: TreeTopology, model, S, inert):
    """M (nv, nv, ...) by the composite-rigid-body algorithm (module docstring)."""
    m, h, io = inert
    nb = topo.nb
    comp = (
        masked_sum(m[None], topo.subtree)[0],
        masked_sum(h, topo.subtree),
        masked_sum(io.reshape((9, nb) + io.shape[3:]), topo.subtree).reshape(io.shape),
    )
    db = topo.dof_body
    F = apply_inertia((comp[0][db], comp[1][:, db], comp[2][:, :, db]), S)
    # G_ab = F_a · S_b as six broadcast products (2x faster than one einsum, whose batch
    # axes XLA's dot moves in front: talos, nv = 32, B = 64)
    G = F[0][:, None] * S[0][None, :]
    for c in range(1, 6):
        G = G + F[c][:, None] * S[c][None, :]
    lower = topo.dof_before.reshape(topo.dof_before.shape + (1,) * (G.ndim - 2))
    upper = np.swapaxes(lower, 0, 1)
    M = jnp.where(lower, G, jnp.where(upper, jnp.swapaxes(G, 0, 1), 0.0))
    arm = model.armature.reshape((-1,) + (1,) * (G.ndim - 2))
    eye = np.eye(topo.nv, dtype=bool).reshape(lower.shape)
    return jnp.where(eye, M + arm, M)


def body_motion(topo: TreeTopology, S, qvel):
    """(v, a) (6, nb, ...): each body's spatial velocity v_i = Σ_{d ⪯ i} S_d q̇_d and its
    velocity-product acceleration a_i = Σ_{d ⪯ i} c_d (its acceleration at q̈ = 0, without
    gravity; module docstring), about its tree's O."""
    Sq = S * qvel[None]
    V = masked_sum(Sq, topo.dof_before)  # velocity after each DOF
    c = cross_motion(V, Sq)
    return masked_sum(Sq, topo.body_dofs), masked_sum(c, topo.body_dofs)


def bias_from(topo: TreeTopology, model, S, inert, qvel, f_ext=None):
    """b (nv, ...) = C(q, q̇) q̇ + g(q) − Jᵀ f_ext by recursive Newton–Euler (module
    docstring); ``f_ext`` (6, nb, ...) spatial forces on the bodies about O, or None."""
    v, a = body_motion(topo, S, qvel)
    tail = qvel.shape[1:]
    g = jnp.concatenate([jnp.zeros(3, qvel.dtype), -model.gravity])
    a = a + g.reshape((6, 1) + (1,) * len(tail))
    fb = apply_inertia(inert, a) + cross_force(v, apply_inertia(inert, v))
    if f_ext is not None:
        fb = fb - f_ext
    fc = masked_sum(fb, topo.subtree)
    return jnp.sum(S * fc[:, topo.dof_body], axis=0)


def mass_matrix(topo: TreeTopology, model, qpos):
    f = frames(topo, model, qpos)
    S = motion_subspace(topo, f)
    return mass_matrix_from(topo, model, S, body_inertias(topo, model, f))


def bias(topo: TreeTopology, model, qpos, qvel):
    f = frames(topo, model, qpos)
    S = motion_subspace(topo, f)
    return bias_from(topo, model, S, body_inertias(topo, model, f), qvel)


def solve_spd(M, rhs):
    """x = M⁻¹ rhs by Cholesky, M (n, n, ...), rhs (n, ...)."""
    n = M.shape[0]
    if n == 0:
        return rhs
    Mb = jnp.moveaxis(jnp.moveaxis(M, 0, -1), 0, -1)  # (..., n, n)
    rb = jnp.moveaxis(rhs, 0, -1)[..., None]
    L = jax.lax.linalg.cholesky(Mb, symmetrize_input=False)
    y = jax.lax.linalg.triangular_solve(L, rb, left_side=True, lower=True)
    x = jax.lax.linalg.triangular_solve(L, y, left_side=True, lower=True, transpose_a=True)
    return jnp.moveaxis(x[..., 0], -1, 0)


def qpos_rate(topo: TreeTopology, qpos, qvel):
    """q̇ of the position coordinates: qvel for hinges, slides and a free joint's position;
    ½ q ⊗ (0, ω) for a ball's or free joint's quaternion (ω in the frame the rotation leaves),
    which keeps |q| constant (seed 000: the scaling rate ν = 0)."""
    out = jnp.zeros_like(qpos)
    lin_q, lin_d, quat_q, quat_d = topo.rate_rows()
    if lin_q.size:
        out = out.at[lin_q].set(qvel[lin_d])
    if quat_q.size:
        qq, dd = quat_q, quat_d
        q = jnp.stack([qpos[qq + i] for i in range(4)])
        w = jnp.stack([qvel[dd + i] for i in range(3)])
        qd = 0.5 * qmul(q, (jnp.zeros_like(w[0]), w[0], w[1], w[2]))
        for i in range(4):
            out = out.at[qq + i].set(qd[i])
    return out
