"""Constraint machinery of a mechanism: W, γ, the Schur complement and reaction forces.

A model's joints are perfect bilateral constraints c(q, t) = 0 (Möller & Glocker 2012 eqs. (77)-(82)). In
generalized velocities u (Möller & Glocker 2012 eq. (37)), ċ = W u + c_t with W = c_q Q⁻¹, and

    M u̇ = f − h + Wᵀλ,      W u̇ = γ = −(∂ċ/∂q q̇ + ∂ċ/∂t)|_u.

W and γ come from automatic differentiation of each joint's residual alone: the 7 columns of W
for a body are jvps of c along q̇ = Q⁻¹(q) e_k (the formulation's kinematics), and γ is a nested
jvp; no Jacobian is written by hand.

Rigid bodies: their normalisation constraint |A|² = 1 has W = e_ν exactly (Möller & Glocker 2012 eqs. (44),
(89)-(90)), so it is eliminated in closed form: ν̇ = 0 and the joint multipliers solve the Schur
complement S λ = γ − W̃ a with W̃ = W with the ν columns of rigid bodies removed and
S = W̃ M⁻¹ W̃ᵀ (M⁻¹ block-diagonal and constant per body, Möller & Glocker 2012 eq. (64)). The scaling
multiplier then follows from the ν row: λ_ν = −(f − h)_ν − (Wᵀλ)_ν (eq. (96) with the joint's
scaling load). This is exactly the full KKT solution, with a smaller SPD system. S is factored
by a block-sparse Cholesky over joints (rbjax/_engine/blockchol.py): O(N) for a chain of N links.

Joints of the same type (and the same driver function) are stacked along a trailing axis and
evaluated together, so compile time grows with the number of joint TYPES, not joints.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._constraints import Frame
from .._topology import GROUND, stack_joints
from . import kernels as cf
from .blockchol import (
    DENSE_MAX_BATCH,
    UNROLL_MAX_ROWS,
    dense_factor,
    dense_solve,
    factor,
    mm_t,
    prefers_dense,
)
from .elimination import TreeSchur, schedule
from .layout import inertia_components
from .mass import blocks as mass_blocks, half_trace, minv


class Group:
    """Joints of one topology group stacked along a trailing axis (trace-time helper).

    ``joint`` evaluates all of them at once; ``bi`` / ``bj`` are their body columns in the
    extended layout (GROUND is the extra column nb); ``vectorised``: the residual broadcasts
    over trailing axes and accepts Frames (built-in constraints), else it is written for one
    system and is vmapped (:func:`_one_system`)."""

    def __init__(self, model, ids):
        topo = model.topology
        self.ids = ids
        joints = [model.joints[k] for k in ids]
        self.joint = stack_joints(joints)
        self.vectorised = type(joints[0])._vectorised
        nb = topo.nb
        self.bi = np.asarray(
            [nb if topo.joint_bodies[k][0] == GROUND else topo.joint_bodies[k][0] for k in ids]
        )
        self.bj = np.asarray(
            [nb if topo.joint_bodies[k][1] == GROUND else topo.joint_bodies[k][1] for k in ids]
        )


def groups(model):
    """The model's joints in their topology groups (same type and static data)."""
    return [Group(model, ids) for ids in model.topology.joint_groups]


def _one_system(joint):
    """The residual of a stacked group of joints written for ONE system, (q_i (7,), q_j (7,),
    t ()) -> (m,), evaluated on the engine's arrays q (7, g, *batch), t (1, *batch) ->
    (m, g, *batch): ``jax.vmap`` over the group (each joint with its own parameters, the
    trailing axis g of the stacked leaves) and over the flattened batch. This adapter is what
    lets a user constraint speak the natural layout."""
    arrays, static = eqx.partition(joint, eqx.is_array)

    def per_joint(arr, a, b, s):  # a, b (7, n), s (n,) -> (m, n)
        j = eqx.combine(arr, static)
        one = lambda x, y, z: jnp.atleast_1d(j.residual(x, y, z))
        return jax.vmap(one, in_axes=(1, 1, 0), out_axes=1)(a, b, s)

    def res(qi, qj, t):
        g = qi.shape[1]
        batch = jnp.broadcast_shapes(qi.shape[2:], qj.shape[2:], jnp.shape(t)[1:])
        a = jnp.broadcast_to(qi, (7, g) + batch).reshape(7, g, -1)
        b = jnp.broadcast_to(qj, (7, g) + batch).reshape(7, g, -1)
        s = jnp.broadcast_to(t, (g,) + batch).reshape(g, -1)
        out = jax.vmap(per_joint, in_axes=(-1, 1, 1, 0), out_axes=1)(arrays, a, b, s)
        return out.reshape(out.shape[:2] + batch)

    return res


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


def _body_frames(kin, qx, ux, *, jacobian, gamma, cdot):
    """Per-body Frame data in the extended layout (…, nb + 1, *batch) (ground included).

    Returns A (3, 3, …), the direction tangents dA[l] = ∂A/∂p · q̇_p(e_{3+l}) (4, 3, 3, …) for the
    rotational velocity directions, Ȧ along u and Ä = d/dt Ȧ at fixed u. All by jvp of A(p)
    along the formulation's kinematics. This uses the engine-wide convention that q̇ = kin(q, u)
    has ṙ = u[0:3] and that ṗ depends on (p, u[3:7]) only (true for every formulation).
    """
    p = qx[3:7]
    T = cf.transform_matrix(p)
    out = {"T": T}

    def pdot(pp, uu):
        return kin(jnp.concatenate([qx[0:3], pp], axis=0), uu)[3:7]

    if jacobian:
        eye = jnp.eye(7, dtype=qx.dtype)

        def direction(e):
            e = jnp.broadcast_to(e.reshape((7,) + (1,) * (qx.ndim - 1)), qx.shape)
            return jax.jvp(cf.transform_matrix, (p,), (pdot(p, e),))[1]

        out["dT"] = jax.vmap(direction)(eye[3:7])
    if gamma or cdot:

        def tdot(pp):
            return jax.jvp(cf.transform_matrix, (pp,), (pdot(pp, ux),))[1]

        if gamma:
            out["Td"], out["Tdd"] = jax.jvp(tdot, (p,), (pdot(p, ux),))
        else:
            out["Td"] = tdot(p)
    return out


def _frame_group(res, fr, qx, ux, bi, bj, tt, *, jacobian, gamma, cdot):
    """c, ċ, γ and W of one group of frame-capable joints (see :func:`joint_terms`)."""
    ri, rj = qx[0:3][:, bi], qx[0:3][:, bj]
    Ti, Tj = fr["T"][:, :, bi], fr["T"][:, :, bj]
    Fi, Fj = Frame(ri, Ti), Frame(rj, Tj)
    val = res(Fi, Fj, tt)
    cdv = gv = jnp.zeros(())
    if gamma or cdot:
        vi, vj = ux[0:3][:, bi], ux[0:3][:, bj]
        Tdi, Tdj = fr["Td"][:, :, bi], fr["Td"][:, :, bj]
        if gamma:
            Tddi, Tddj = fr["Tdd"][:, :, bi], fr["Tdd"][:, :, bj]
        else:
            Tddi = Tddj = jnp.zeros_like(Ti)

        def path(tau):
            # second-order Taylor path of the frames at fixed u (r̈ = 0 since ṙ = v)
            h = 0.5 * tau * tau
            a = Frame(ri + tau * vi, Ti + tau * Tdi + h * Tddi)
            b = Frame(rj + tau * vj, Tj + tau * Tdj + h * Tddj)
            return res(a, b, tt + tau)

        def first(tau):
            return jax.jvp(path, (tau,), (jnp.ones_like(tau),))[1]

        zero = jnp.zeros((), qx.dtype)
        if gamma:
            cdv, cdd = jax.jvp(first, (zero,), (jnp.ones_like(zero),))
            gv = -cdd
        else:
            cdv = first(zero)
    wi = wj = None
    if jacobian:
        eye3 = jnp.eye(3, dtype=qx.dtype)

        def trans(e, side):
            r0 = ri if side == 0 else rj
            d = jnp.broadcast_to(e.reshape((3,) + (1,) * (r0.ndim - 1)), r0.shape)
            if side == 0:
                return jax.jvp(lambda r: res(Frame(r, Ti), Fj, tt), (ri,), (d,))[1]
            return jax.jvp(lambda r: res(Fi, Frame(r, Tj), tt), (rj,), (d,))[1]

        def rot(dT, side):
            if side == 0:
                return jax.jvp(lambda T: res(Frame(ri, T), Fj, tt), (Ti,), (dT[:, :, bi],))[1]
            return jax.jvp(lambda T: res(Fi, Frame(rj, T), tt), (Tj,), (dT[:, :, bj],))[1]

        wi = jnp.concatenate(
            [jax.vmap(lambda e: trans(e, 0))(eye3), jax.vmap(lambda d: rot(d, 0))(fr["dT"])]
        )
        wj = jnp.concatenate(
            [jax.vmap(lambda e: trans(e, 1))(eye3), jax.vmap(lambda d: rot(d, 1))(fr["dT"])]
        )
    return val, cdv, gv, wi, wj


def _generic_group(res, kin, qx, ux, bi, bj, tt, *, jacobian, gamma, cdot):
    """c, ċ, γ and W of a group of joints by jvps of the residual along kin(q, ·) in q."""
    qi, qj = qx[:, bi], qx[:, bj]
    ui, uj = ux[:, bi], ux[:, bj]
    ones = jnp.ones_like(tt)
    val = res(qi, qj, tt)
    cdv = gv = jnp.zeros(())
    if gamma:

        def cd(a, b, s):
            return jax.jvp(res, (a, b, s), (kin(a, ui), kin(b, uj), ones))[1]

        cdv, cdd = jax.jvp(cd, (qi, qj, tt), (kin(qi, ui), kin(qj, uj), ones))
        gv = -cdd
    elif cdot:
        cdv = jax.jvp(res, (qi, qj, tt), (kin(qi, ui), kin(qj, uj), ones))[1]
    wi = wj = None
    if jacobian:
        eye = jnp.eye(7, dtype=qx.dtype)

        def col(e, side):
            q_s = qi if side == 0 else qj
            d = kin(q_s, jnp.broadcast_to(e.reshape((7,) + (1,) * (q_s.ndim - 1)), q_s.shape))
            z = jnp.zeros_like(d)
            tang = (d, z) if side == 0 else (z, d)
            return jax.jvp(lambda a, b: res(a, b, tt), (qi, qj), tang)[1]

        wi = jax.vmap(lambda e: col(e, 0))(eye)  # (7, m, g, *batch)
        wj = jax.vmap(lambda e: col(e, 1))(eye)
    return val, cdv, gv, wi, wj


def joint_terms(model, kin, t, q, u, *, jacobian=True, gamma=True, cdot=False):
    """Evaluate every joint's residual, W blocks and γ (autodiff of the residual only).

    ``kin(q, u)`` is the formulation's q̇ = Q⁻¹(q) u (component-first, linear in u); ``t`` has
    shape (..., 1) or (...,); q, u (7, ..., nb).

    Built-in joints (``_vectorised`` constraint types) read q only through world points r + A s̄ and vectors A ā.
    Their W is obtained by the chain rule split at the body Frame (r, A): ∂A/∂p along each of
    the 4 rotational velocity directions is ONE jvp of A(p) per body, shared by all joints on the
    body; each joint then costs a jvp of its residual with respect to (r, A), which is linear in
    (r, A). γ is the second derivative of the residual along the Taylor path of the frames at
    fixed u. Other constraints (CustomConstraint, user subclasses) take jvps of the residual in
    q directly. Both routes are autodiff of the residual alone; tests compare them.
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
    grps = groups(model)
    fr = None
    if any(_fast_path(g) for g in grps):
        fr = _body_frames(kin, qx, ux, jacobian=jacobian, gamma=gamma, cdot=cdot)
    for grp in grps:
        if _fast_path(grp):
            joint = jax.tree.map(
                lambda x: x.reshape(x.shape + (1,) * nbatch) if eqx.is_array(x) else x, grp.joint
            )
            res = joint.residual  # vectorised: the same code takes the engine's arrays
        else:
            res = _one_system(grp.joint)

        flags = dict(jacobian=jacobian, gamma=gamma, cdot=cdot)
        if _fast_path(grp):
            val, cdv, gv, wi, wj = _frame_group(res, fr, qx, ux, grp.bi, grp.bj, tt, **flags)
        else:
            val, cdv, gv, wi, wj = _generic_group(res, kin, qx, ux, grp.bi, grp.bj, tt, **flags)
        for p, k in enumerate(grp.ids):
            c[k] = val[:, p]
            if gamma:
                cdot_k[k], gam[k] = cdv[:, p], gv[:, p]
            elif cdot:
                cdot_k[k] = cdv[:, p]
            if wi is not None and wj is not None:
                W[k] = (jnp.moveaxis(wi[:, :, p], 0, 1), jnp.moveaxis(wj[:, :, p], 0, 1))
    return JointTerms(c=c, cdot=cdot_k, gamma=gam, W=W)


def _fast_path(grp) -> bool:
    """Whether a group takes the vectorised frame route (else the one-system adapter)."""
    return grp.vectorised


def _minv_rows(mass_b, ht_b, thinv_b, w):
    """M_b⁻¹ applied to every row of w (m, 7, ...) (Möller & Glocker 2012 eq. (64))."""
    lin = w[:, 0:3] / mass_b
    nu = (w[:, 3] / ht_b)[:, None]
    rot = jnp.moveaxis(cf.matvec(thinv_b, jnp.moveaxis(w[:, 4:7], 1, 0)), 0, 1)
    return jnp.concatenate([lin, nu, rot], axis=1)


# Which factorisation solves S λ = r; tests and benchmarks set it to compare them (None: by
# :func:`method`).
FORCE_METHOD: str | None = None

# The elimination along the joint graph closes loops by a dense Schur complement on the closure
# rows, formed with one tree solve per row: with more loop-closing joints than this, the block
# Cholesky of S (which exploits the loops' sparsity) is used instead.
TREE_MAX_CLOSURES = 4


def method(topology, rows: int, batch: int) -> str:
    """How S λ = r is solved for ``rows`` joint equations and ``batch`` systems per call:
    "dense" (one LAPACK Cholesky), "block" (block Cholesky of S, rbjax/_engine/blockchol.py) or
    "tree" (elimination along the joint graph, rbjax/_engine/elimination.py). Measured
    (benchmarks/elimination.py, N-link chains, RK4): the elimination is ahead or level from B = 64 above
    80 rows (32 links: 258 against 354 µs per system-step; 64 links: 694 against 666, 128
    links: 1419 against 1538); at B = 1 the block Cholesky of S with one LAPACK call per block
    beat it (64 links: 1.4 ms per step against 2.3 ms for the elimination's LAPACK variant)."""
    if FORCE_METHOD is not None:
        return FORCE_METHOD
    if prefers_dense(rows, batch):
        return "dense"
    if batch < DENSE_MAX_BATCH or rows <= UNROLL_MAX_ROWS:
        return "block"
    if len(schedule(topology).closures) > TREE_MAX_CLOSURES:
        return "block"
    return "tree"


def body_of(model, k, side):
    return model.topology.joint_bodies[k][side]


class SchurSystem:
    """S = W̃ M⁻¹ W̃ᵀ of ``terms.W`` assembled and factored once (trace-time object).

    ``solve(rhs)`` returns S⁻¹ rhs for per-joint right-hand sides (list of (m_k, ...)); a
    projection that iterates with a frozen W̃ (rbjax/_engine/projection.py) factors S only once.
    ``dense=True`` solves by one dense LAPACK Cholesky instead of the unrolled block
    factorisation: analyses that run once (assembly, kinematic analysis) trade run time,
    irrelevant there, for a much smaller program to compile.
    """

    def __init__(self, model, terms: JointTerms, dtype, *, dense: bool = False):
        nj = len(model.joints)
        rigid = [not s for s in model.scalable]
        thinv = cf.sym_inv(inertia_components(model))
        ht = half_trace(model)
        nu_mask = jnp.asarray([0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0], dtype)
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
        self.model, self.terms, self.wt, self.x = model, terms, wt, x
        self.n, self.dense = nj, dense
        rows = sum(model.joint_rows)
        batch = int(np.prod(next(iter(wt.values())).shape[2:], dtype=int)) if wt else 1
        self.method = "dense" if dense else method(model.topology, rows, batch)
        self._blocks = None
        self._tree = None
        self._factor = None  # built on the first solve: a projection's residual needs none
        self._chol = None  # the same for the dense method

    @property
    def blocks(self) -> dict:
        """The structurally non-zero lower blocks {(k, l): (m_k, m_l, ...)} of S (built once)."""
        if self._blocks is None:
            nb = self.model.nb
            touching = {b: [] for b in range(nb)}
            for k, side in self.wt:
                touching[body_of(self.model, k, side)].append((k, side))
            blocks: dict = {}
            for b in range(nb):
                for k, sk in touching[b]:
                    for l, sl in touching[b]:
                        if l > k:
                            continue
                        blk = mm_t(self.wt[(k, sk)], self.x[(l, sl)])
                        blocks[(k, l)] = blk if (k, l) not in blocks else blocks[(k, l)] + blk
            self._blocks = blocks
        return self._blocks

    def _elimination(self) -> TreeSchur:
        if self._tree is None:
            model = self.model
            w = next(iter(self.wt.values()))
            batch, nb = w.shape[2:], model.nb

            def per_body(mb):  # (7, 7, ..., nb) -> (7, 7, nb, *batch)
                mb = jnp.moveaxis(mb, -1, 2)
                mb = mb.reshape((7, 7, nb) + (1,) * (len(batch) + 3 - mb.ndim) + mb.shape[3:])
                return jnp.broadcast_to(mb, (7, 7, nb) + batch)

            def apply_minv(F):  # (7, nb, *batch) -> M⁻¹ F, same layout
                return jnp.moveaxis(minv(model, jnp.moveaxis(F, 1, -1)), -1, 1)

            self._tree = TreeSchur(
                schedule(model.topology), per_body(mass_blocks(model)), apply_minv, self.wt
            )
        return self._tree

    def _solver(self):
        """The factorised solve (built once, in the caller's trace, outside any solve): by
        :func:`method`, one dense Cholesky, the elimination along the joint graph
        (rbjax/_engine/elimination.py) or the block Cholesky of S."""
        if self.method == "dense":
            if self._chol is None:
                self._chol = dense_factor(self.blocks, self.model.joint_rows)
            chol = self._chol
            return lambda rhs: dense_solve(chol, rhs)
        if self.method == "tree":
            tree = self._elimination()
            tree.factor()
            return tree.solve
        if self._factor is None:
            self._factor = factor(self.blocks, self.n, sum(self.model.joint_rows))
        return self._factor.solve

    def factorise(self) -> SchurSystem:
        """Factor S now, in the caller's trace. A solver that iterates with a frozen S calls
        this before its loop: otherwise the first solve, traced inside the loop body, would put
        the factorisation in the body and repeat it every iteration."""
        self._solver()
        return self

    def matvec(self, lam: list) -> list:
        """S λ for per-joint λ (list of (m_k, ...)), from the stored lower blocks (S = Sᵀ);
        one pass over the structurally non-zero blocks."""
        if self.method == "tree":
            return self._elimination().matvec(lam)
        out: list = [None] * self.n

        def add(k, term):
            out[k] = term if out[k] is None else out[k] + term

        for (k, l), blk in self.blocks.items():
            add(k, jnp.sum(blk * lam[l][None], axis=1))
            if k != l:
                add(l, jnp.sum(blk * lam[k][:, None], axis=0))
        return out

    def solve(self, rhs: list) -> list:
        """S⁻¹ rhs, differentiated as a linear solve (``jax.lax.custom_linear_solve``).

        The tangent of λ = S⁻¹ r is S⁻¹ (ṙ − Ṡ λ) and its transpose is S⁻¹ again (S is
        symmetric): derivatives reuse the forward factorisation through ``solve`` and
        differentiate only the product S λ, never the elimination itself. This keeps forward-
        and reverse-mode programs small (the factorisation is unrolled block by block)."""
        solve = self._solver()
        return jax.lax.custom_linear_solve(
            self.matvec, list(rhs), lambda _, b: solve(b), symmetric=True
        )

    def correction(self, lam: list, like):
        """(M⁻¹W̃ᵀλ (7, ..., nb), (Wᵀλ)_ν (..., nb)) for per-joint λ; ``like`` (7, nb, ...)."""
        nb = self.model.nb
        corr = [jnp.zeros_like(like[:, 0]) for _ in range(nb)]
        fnu = [jnp.zeros_like(like[0, 0]) for _ in range(nb)]
        for k, side in self.wt:
            b = body_of(self.model, k, side)
            corr[b] = corr[b] + jnp.sum(self.x[(k, side)] * lam[k][:, None], axis=0)
            fnu[b] = fnu[b] + jnp.sum(self.terms.W[k][side][:, 3] * lam[k], axis=0)
        return jnp.stack(corr, axis=-1), jnp.stack(fnu, axis=-1)


def solve_multipliers(model, terms: JointTerms, a, rhs_extra=None, *, dense: bool = False):
    """Solve S λ = γ − W̃ a (+ rhs_extra) and return (λ per joint, M⁻¹W̃ᵀλ, (Wᵀλ)_ν).

    ``a`` (7, ..., nb) is the unconstrained acceleration with ν̇ = 0 already set for rigid
    bodies. Returns λ as a list of (m_k, ...), the correction (7, ..., nb) to add to a, and the
    scaling component of the joint forces per body (..., nb). ``dense``: see
    :class:`SchurSystem`.
    """
    schur = SchurSystem(model, terms, a.dtype, dense=dense)
    a_t = jnp.moveaxis(a, -1, 1)  # (7, nb, ...): bodies before the batch (contiguous slices)
    rhs = []
    for k in range(len(model.joints)):
        r = terms.gamma[k]
        for side in (0, 1):
            if (k, side) in schur.wt:
                b = body_of(model, k, side)
                r = r - jnp.sum(schur.wt[(k, side)] * a_t[:, b][None], axis=1)
        if rhs_extra is not None:
            r = r + rhs_extra[k]
        rhs.append(r)
    lam = schur.solve(rhs)
    corr, fnu = schur.correction(lam, a_t)
    return lam, corr, fnu


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
