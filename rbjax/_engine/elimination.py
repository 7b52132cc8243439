"""Linear-time elimination of a mechanism's constraint equations along its joint graph.

The multipliers of a mechanism solve S λ = r with S = W̃ M⁻¹ W̃ᵀ (rbjax/_engine/joints.py).
Equivalently, they are part of the solution of the sparse symmetric KKT system

    [ M   W̃ᵀ ] [ x ]   [ f ]
    [ W̃   0  ] [ y ] = [ g ],          f = 0, g = −r  ⇒  y = S⁻¹ r,

whose graph has one node per body (7 unknowns) and one per joint (its rows), a joint adjacent to
the bodies it connects. When the joints form a tree (a spanning tree of the joint graph, rooted
at the ground), eliminating the nodes leaves first creates no fill-in (Baraff 1996, "Linear-time
dynamics using Lagrange multipliers", SIGGRAPH, §5-7): with each body b paired with the tree joint
j that connects it to its parent body p ("link" b), the factorisation is, leaves first,

    D_b = M_b + Σ_{child links c} U_c                                  (7 x 7, SPD)
    E_j = W_jb D_b⁻¹ W_jbᵀ                                             (m_j x m_j, SPD)
    U_b = W_jpᵀ E_j⁻¹ W_jp                                             (passed to p)

and a solve is one sweep leaves → root (f̃_b = f_b + Σ_c W_cpᵀ E_c⁻¹ h_c, h_j = g_j − W_jb D_b⁻¹ f̃_b)
and one sweep root → leaves (y_j = E_j⁻¹ (W_jp x_p − h_j), x_b = D_b⁻¹ (f̃_b − W_jbᵀ y_j)), with
x = 0 for the ground. Every step costs O(1), so a mechanism of N bodies costs O(N).

The sweeps run as ``jax.lax.scan`` over a static schedule of *levels* (all links at one depth
of the spanning tree, eliminated together and padded to the widest level), so the program has
the same size for a chain of 4 or of 256 links. The small dense blocks are unrolled into scalar
operations on batch-last arrays, which XLA vectorises over the level and the batch. (Batched
LAPACK calls per block instead compiled 3x faster but ran 3x slower from B = 64 on, and at
B = 1 lost to the block Cholesky of S: measured on a 16-link chain, benchmarks/elimination.py.)

Joints that close loops (not in the spanning tree) are handled by a Schur complement on their
rows: with G their rows of W̃ and H_T the tree KKT matrix, P = G H_T⁻¹ Gᵀ (SPD when the loop
equations are independent) is formed column by column with the tree solve and factored densely.
This is exact; its cost grows with the number of loop-closure rows, so it is chosen only where it
measurably wins (rbjax/_engine/joints.py).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from .._topology import GROUND
from . import rank
from .blockchol import _bwd, _chol, _cut, _fwd


class Schedule:
    """The static elimination schedule of a topology (numpy, built once per topology).

    ``tree_joint[b]``: the joint linking body b to its parent (−1 for a floating root);
    ``child_side[b]``: which side (0 = body_i, 1 = body_j) of that joint body b is;
    ``parent[b]``: the parent body (``nb`` for the ground, ``nb + 1`` for a floating root);
    ``closures``: joints not in the spanning tree; ``levels`` (n_levels, width) the bodies of
    each depth, deepest first, padded with the dummy body ``nb + 1``; ``pslot`` / ``child``:
    per slot its parent's slot in the next level / its children's slots in the previous one;
    ``m``: the most rows of a tree joint; ``tree_index``, ``closure_index``, ``back_index``:
    static row maps between per-joint vectors and the tree layout (m, nb).
    """

    def __init__(self, topology):
        nb = topology.nb
        jb = topology.joint_bodies
        self.nb = nb
        adj: dict[int, list] = {b: [] for b in range(-1, nb)}
        for k, (i, j) in enumerate(jb):
            if i == j:
                continue
            adj[i].append((k, j))
            adj[j].append((k, i))
        tree_joint = [-1] * nb
        parent = [nb + 1] * nb
        depth = [-1] * nb
        in_tree = set()
        seen = {GROUND}
        roots = [GROUND] + list(range(nb))
        for root in roots:
            if root in seen and root != GROUND:
                continue
            if root != GROUND:
                seen.add(root)
                depth[root] = 0
            frontier = [root]
            while frontier:
                nxt = []
                for a in frontier:
                    for k, b in adj[a]:
                        if b in seen:
                            continue
                        seen.add(b)
                        in_tree.add(k)
                        tree_joint[b] = k
                        parent[b] = nb if a == GROUND else a
                        depth[b] = 0 if a == GROUND else depth[a] + 1
                        nxt.append(b)
                frontier = nxt
        self.tree_joint = np.asarray(tree_joint)
        self.parent = np.asarray(parent)
        self.child_side = np.asarray(
            [0 if k < 0 or jb[k][0] == b else 1 for b, k in enumerate(tree_joint)]
        )
        self.closures = tuple(k for k in range(len(jb)) if k not in in_tree)
        rows = topology.joint_rows
        self.m = max([rows[k] for k in in_tree], default=1)
        n_levels = max(depth) + 1 if nb else 0
        by_level = [[b for b in range(nb) if depth[b] == d] for d in reversed(range(n_levels))]
        width = max((len(lv) for lv in by_level), default=1)
        self.levels = np.asarray([lv + [nb + 1] * (width - len(lv)) for lv in by_level], int)
        # slot of each body within its level; per slot the parent's slot in the NEXT level
        # (``width`` = none: the ground, a floating root or padding) and the slots of its
        # children in the PREVIOUS level (padded with ``width``)
        slot = {int(b): s for lv in self.levels for s, b in enumerate(lv) if b < nb}
        n_levels = len(self.levels)
        self.pslot = np.full((n_levels, width), width, int)
        kids: list = [[[] for _ in range(width)] for _ in range(n_levels)]
        for l, lv in enumerate(self.levels):
            for s, b in enumerate(lv):
                if b < nb and parent[b] < nb:
                    self.pslot[l, s] = slot[parent[b]]
                    kids[l + 1][slot[parent[b]]].append(s)
        cmax = max([len(k) for lv in kids for k in lv] + [1])
        self.child = np.full((n_levels, width, cmax), width, int)
        for l in range(n_levels):
            for t in range(width):
                self.child[l, t, : len(kids[l][t])] = kids[l][t]
        self.joint_rows = rows
        self.topology_bodies = jb
        # Row maps between the per-joint vectors (concatenated in joint order, R rows, index R
        # reading 0) and the tree layout (m, nb) / the loop-closure rows (nc,).
        off = list(topology.row_offsets)
        self.row_offsets = off
        R = int(off[-1])
        self.tree_index = np.full((self.m, nb), R, int)
        back = np.zeros(R, int)
        for b, k in enumerate(tree_joint):
            if k >= 0:
                self.tree_index[: rows[k], b] = np.arange(off[k], off[k + 1])
                back[off[k] : off[k + 1]] = np.arange(rows[k]) * nb + b
        self.closure_index = np.concatenate(
            [np.arange(off[k], off[k + 1]) for k in self.closures] + [np.zeros(0, int)]
        )
        back[self.closure_index] = self.m * nb + np.arange(len(self.closure_index))
        self.back_index = back


@functools.lru_cache(maxsize=64)
def schedule(topology) -> Schedule:
    return Schedule(topology)


def _entries(a, lead):
    """An array (*shape, *rest) as nested lists over its first ``lead`` axes (1 or 2)."""
    if lead == 1:
        return list(jnp.unstack(a, axis=0))
    return [list(jnp.unstack(r, axis=0)) for r in jnp.unstack(a, axis=0)]


def _tril(L):
    """The lower triangle of a nested-list matrix as a flat list (row-major)."""
    return [L[i][j] for i in range(len(L)) for j in range(i + 1)]


def _untril(flat, m):
    """Inverse of :func:`_tril` (upper entries None: never read by the triangular solves)."""
    L: list = [[None] * m for _ in range(m)]
    o = 0
    for i in range(m):
        for j in range(i + 1):
            L[i][j] = flat[o]
            o += 1
    return L


def _sym(flat, m):
    """A symmetric nested-list matrix from its lower triangle."""
    L = _untril(flat, m)
    return [[L[i][j] if j <= i else L[j][i] for j in range(m)] for i in range(m)]


def _pull(x, idx):
    """x[idx] along the slot axis with out-of-range indices (the sink, = width) reading 0."""
    return jnp.take(x, idx, axis=0, mode="fill", fill_value=0)


class TreeFactor:
    """The level-scheduled LDLᵀ of the tree KKT matrix (see the module docstring).

    ``M`` (7, 7, nb, *batch) body mass blocks; ``Wc``/``Wp`` (m, 7, nb, *batch) per body the
    rows of its tree joint on the body itself / on its parent (zeros for the ground, for a
    floating root and for padded rows, which get a unit diagonal in E).

    Inside the sweeps every block is a nested list of (width, *batch) arrays, one per entry,
    and a level's links receive their children's contributions by a gather from the previous
    level's slots: stacking the entries into one array per step, or scattering into a carry
    indexed by body, made each step 3-6x slower (measured, 7 x 7 Cholesky of 1024 systems per
    level: 450 µs stacked against 86 µs as separate entries).
    """

    def __init__(self, sched: Schedule, M, Wc, Wp):
        self.sched = sched
        pad = (sched.tree_index == sched.row_offsets[-1]).astype(float)  # (m, nb)
        m = sched.m
        batch = M.shape[3:]
        dtype = M.dtype
        lv = sched.levels
        self.batch, self.dtype = batch, dtype

        def per_level(x, axis, fill):  # (..., nb, *batch) -> (..., L, w, *batch)
            shape = list(x.shape)
            shape[axis] = 1
            dummy = jnp.broadcast_to(jnp.asarray(fill, dtype), shape)
            return jnp.take(jnp.concatenate([x, dummy, dummy], axis=axis), lv, axis=axis)

        eye = jnp.eye(7, dtype=dtype).reshape((7, 7, 1) + (1,) * len(batch))
        self.Wc = _entries(per_level(Wc, 2, 0.0), 2)
        self.Wp = _entries(per_level(Wp, 2, 0.0), 2)
        Ml = _entries(
            jnp.take(
                jnp.concatenate([M, jnp.broadcast_to(eye, (7, 7, 2) + batch)], axis=2), lv, axis=2
            ),
            2,
        )
        padl = np.concatenate([pad, np.ones((m, 2))], axis=1)[:, lv]  # (m, L, w)
        padl = [
            jnp.asarray(padl[r].reshape(padl[r].shape + (1,) * len(batch)), dtype) for r in range(m)
        ]
        self.child, self.pslot = jnp.asarray(sched.child), jnp.asarray(sched.pslot)
        width = lv.shape[1]

        def step(U, xs):
            Mb, wc, wp, pd, child = xs
            Us = _sym(U, 7)
            D = [
                [
                    Mb[i][j] + sum(_pull(Us[i][j], child[:, c]) for c in range(child.shape[1]))
                    for j in range(7)
                ]
                for i in range(7)
            ]
            Lb = _untril(_cut(_tril(_chol(D))), 7)
            X = _cut([_fwd(Lb, wc[r]) for r in range(m)])  # Lb⁻¹ W_jbᵀ, column r
            E = [
                [
                    sum(X[r][c] * X[s][c] for c in range(7)) + (pd[r] if r == s else 0.0)
                    for s in range(m)
                ]
                for r in range(m)
            ]
            Lj = _untril(_cut(_tril(_chol(E))), m)
            Y = _cut([_fwd(Lj, [wp[r][c] for r in range(m)]) for c in range(7)])  # Lj⁻¹ W_jp
            Unew = [
                sum(Y[c][r] * Y[d][r] for r in range(m)) for c in range(7) for d in range(c + 1)
            ]
            # a tree joint whose own equations are dependent (rbjax/_engine/rank.py)
            bad = rank.any_deficient(
                *(rank.deficient(Lj[r][r] * Lj[r][r], E[r][r]) for r in range(m))
            )
            return Unew, (_tril(Lb), _tril(Lj), bad)

        U0 = [jnp.zeros((width,) + batch, dtype) for _ in range(28)]
        _, (self.Lb, self.Lj, bad) = jax.lax.scan(
            step, U0, (Ml, self.Wc, self.Wp, padl, self.child)
        )
        self.deficient = jnp.any(bad)

    def solve(self, f, g):
        """x, y of the tree KKT system for f (7, nb, *b) and g (m, nb, *b) per body's joint."""
        sched = self.sched
        nb, m = sched.nb, sched.m
        batch = jnp.broadcast_shapes(self.batch, f.shape[2:], g.shape[2:])
        lv = sched.levels
        width = lv.shape[1]
        z2 = jnp.zeros((7, 2) + batch, f.dtype)
        fl = _entries(
            jnp.take(
                jnp.concatenate([jnp.broadcast_to(f, (7, nb) + batch), z2], axis=1), lv, axis=1
            ),
            1,
        )
        gl = _entries(
            jnp.take(
                jnp.concatenate([jnp.broadcast_to(g, (m, nb) + batch), z2[:m]], axis=1), lv, axis=1
            ),
            1,
        )

        def up(acc, xs):
            lb, lj, wc, wp, fb, gb, child = xs
            Lb, Lj = _untril(lb, 7), _untril(lj, m)
            ft = [
                fb[c] + sum(_pull(acc[c], child[:, k]) for k in range(child.shape[1]))
                for c in range(7)
            ]
            v = _bwd(Lb, _fwd(Lb, ft))  # D_b⁻¹ f̃
            h = [gb[r] - sum(wc[r][c] * v[c] for c in range(7)) for r in range(m)]
            e = _bwd(Lj, _fwd(Lj, h))  # E⁻¹ h
            return [sum(wp[r][c] * e[r] for r in range(m)) for c in range(7)], (ft, h)

        acc0 = [jnp.zeros((width,) + batch, f.dtype) for _ in range(7)]
        xs = (self.Lb, self.Lj, self.Wc, self.Wp, fl, gl, self.child)
        _, (ft, h) = jax.lax.scan(up, acc0, xs)

        def down(x, xs):
            lb, lj, wc, wp, ftb, hb, pslot = xs
            Lb, Lj = _untril(lb, 7), _untril(lj, m)
            xp = [_pull(x[c], pslot) for c in range(7)]
            rhs = [sum(wp[r][c] * xp[c] for c in range(7)) - hb[r] for r in range(m)]
            y = _bwd(Lj, _fwd(Lj, rhs))
            sv = [ftb[c] - sum(wc[r][c] * y[r] for r in range(m)) for c in range(7)]
            xb = _bwd(Lb, _fwd(Lb, sv))
            return xb, (xb, y)

        x0 = [jnp.zeros((width,) + batch, f.dtype) for _ in range(7)]
        xs = (self.Lb, self.Lj, self.Wc, self.Wp, ft, h, self.pslot)
        _, (xl, yl) = jax.lax.scan(down, x0, xs, reverse=True)
        # back from (L, w, *batch) per level to per body
        order = np.argsort(lv.reshape(-1), kind="stable")[:nb]
        xb = jnp.stack([c.reshape((-1,) + batch)[order] for c in xl])
        yb = jnp.stack([c.reshape((-1,) + batch)[order] for c in yl])
        return xb, yb


class TreeSchur:
    """S⁻¹ r and S r for S = W̃ M⁻¹ W̃ᵀ by the tree elimination, loops closed by a Schur
    complement on their rows.

    ``M`` (7, 7, nb, *batch) the body mass blocks; ``minv`` applies M⁻¹ to per-body vectors
    (7, nb, *batch); ``wi``, ``wj`` (R, 7, *batch) the stacked rows of W̃ on each side (zero on
    a ground side) and ``body`` (2, R) their bodies (rbjax/_engine/joints.py ``row_layout``).
    ``solve`` and ``matvec`` take and return stacked vectors (R, *batch).
    """

    def __init__(self, sched: Schedule, M, minv, wi, wj, body):
        self.sched, self.minv = sched, minv
        nb = sched.nb
        batch = M.shape[3:]
        dtype = M.dtype
        self.batch, self.dtype, self.M = batch, dtype, M
        R = int(sched.row_offsets[-1])
        # per body the rows of its tree joint on itself (Wc) and on its parent (Wp), padded to
        # m rows: one gather from both sides' rows and a zero row (index 2R)
        both = jnp.concatenate(
            [
                jnp.broadcast_to(wi, (R, 7) + batch),
                jnp.broadcast_to(wj, (R, 7) + batch),
                jnp.zeros((1, 7) + batch, dtype),
            ]
        )
        pad = sched.tree_index == R
        cs = sched.child_side[None, :]
        own = np.where(pad, 2 * R, sched.tree_index + cs * R)
        other = np.where(pad, 2 * R, sched.tree_index + (1 - cs) * R)
        self.Wc = jnp.moveaxis(both[own], 2, 1)  # (m, 7, nb, *batch)
        self.Wp = jnp.moveaxis(both[other], 2, 1)
        self.closures = sched.closures
        self.tree = None
        if self.closures:
            # one right-hand side f (7, nb, *batch) per loop-closure row: its W̃ row scattered
            # onto its two bodies (a ground side is zero and lands in the dropped column nb)
            cr = sched.closure_index
            nc = len(cr)
            G = jnp.zeros((nc, 7, nb + 1) + batch, dtype)
            for side, w in enumerate((wi, wj)):
                rows = jnp.broadcast_to(w, (R, 7) + batch)[cr]
                G = G.at[np.arange(nc), :, body[side][cr]].add(rows)
            self.G = G[:, :, :nb]  # (nc, 7, nb, *batch)

    def factor(self) -> TreeFactor:
        """Factor the tree and, with loops, the Schur complement on the closure rows (once)."""
        if self.tree is not None:
            return self.tree
        sched, nb, m, batch = self.sched, self.sched.nb, self.sched.m, self.batch
        tree = self.tree = TreeFactor(sched, self.M, self.Wc, self.Wp)
        if self.closures:
            zg = jnp.zeros((m, nb) + batch, self.dtype)
            self.Zx, self.Zy = jax.vmap(lambda f: tree.solve(f, zg))(self.G)
            P = jnp.einsum(
                "ai...,bi...->ab...",
                self.G.reshape(self.G.shape[0], 7 * nb, *batch),
                self.Zx.reshape(self.Zx.shape[0], 7 * nb, *batch),
            )
            P = jnp.moveaxis(P, (0, 1), (-2, -1))
            self.Pf = jax.scipy.linalg.cho_factor(0.5 * (P + jnp.swapaxes(P, -1, -2)), lower=True)
            # P is the Schur complement of the closure rows in S: a pivot is compared with
            # the closure row's own diagonal entry of S, G M⁻¹ Gᵀ, so that a closure row
            # that depends on tree rows (P_aa ≈ 0, a redundant loop) is caught
            s_cc = jnp.einsum("acb...,acb...->a...", self.G, jax.vmap(self.minv)(self.G))
            closure_bad = rank.deficient(
                jnp.diagonal(self.Pf[0], axis1=-2, axis2=-1) ** 2, jnp.moveaxis(s_cc, 0, -1)
            )
            self.deficient = rank.any_deficient(tree.deficient, closure_bad)
        else:
            self.deficient = tree.deficient
        return tree

    def _split(self, r):
        """Stacked rows (R, *b) → (tree layout (m, nb, *batch), closure rows (nc, *batch))."""
        batch = jnp.broadcast_shapes(self.batch, r.shape[1:])
        flat = jnp.concatenate(
            [jnp.broadcast_to(r, r.shape[:1] + batch), jnp.zeros((1,) + batch, r.dtype)]
        )
        return flat[self.sched.tree_index], flat[self.sched.closure_index], batch

    def _join(self, tree, closure, batch):
        """Inverse of :meth:`_split`: tree layout and closure rows → stacked rows."""
        m, nb = self.sched.m, self.sched.nb
        flat = jnp.concatenate([tree.reshape((m * nb,) + batch), closure])
        return flat[self.sched.back_index]

    def matvec(self, lam):
        """S λ = W̃ M⁻¹ W̃ᵀ λ for stacked λ (R, *batch), vectorised over bodies."""
        nb = self.sched.nb
        lt, lc, batch = self._split(lam)
        F = jnp.einsum("rcb...,rb...->cb...", self.Wc, lt)
        Fp = jnp.einsum("rcb...,rb...->cb...", self.Wp, lt)
        par = self.sched.parent  # nb (ground) or nb + 1 (floating root): dropped
        F = jnp.concatenate([F, jnp.zeros((7, 2) + batch, F.dtype)], axis=1).at[:, par].add(Fp)
        F = F[:, :nb]
        if self.closures:
            F = F + jnp.einsum("acb...,a...->cb...", self.G, lc)
        a = self.minv(F)
        ax = jnp.concatenate([a, jnp.zeros((7, 2) + batch, a.dtype)], axis=1)
        st = jnp.einsum("rcb...,cb...->rb...", self.Wc, a) + jnp.einsum(
            "rcb...,cb...->rb...", self.Wp, ax[:, par]
        )
        sc = jnp.einsum("acb...,cb...->a...", self.G, a) if self.closures else lc
        return self._join(st, sc, batch)

    def solve(self, r):
        """S⁻¹ r: the tree KKT solve with f = 0, g = −r (module docstring), then the loop
        closures: P y_C = G x₀ + r_C, y = y₀ − Z_y y_C."""
        tree = self.factor()
        nb = self.sched.nb
        rt, rc, batch = self._split(r)
        x, y = tree.solve(jnp.zeros((7, nb) + batch, self.dtype), -rt)
        if not self.closures:
            return self._join(y, rc, batch)
        nc = self.G.shape[0]
        G = self.G.reshape((nc, 7 * nb) + self.G.shape[3:])
        gx = jnp.einsum("ai...,i...->a...", G, x.reshape((7 * nb,) + batch))
        rhs = jnp.moveaxis(gx + rc, 0, -1)[..., None]
        yc = jnp.moveaxis(jax.scipy.linalg.cho_solve(self.Pf, rhs)[..., 0], -1, 0)
        return self._join(y - jnp.einsum("a...,am...->m...", yc, self.Zy), yc, batch)
