"""Block-sparse Cholesky of the Schur complement of a mechanism.

S = W M⁻¹ Wᵀ is a matrix of small blocks, one block row per joint; block (k, l) is non-zero only
when joints k and l share a body (plus fill-in). Its sparsity is known at trace time, so the
factorisation visits the structurally non-zero blocks only: a chain of N links costs O(N) block
operations instead of O(N³) for a dense factorisation.

Every block operation is unrolled into scalar operations on batch-last arrays (*batch): a block
row of 1-6 equations is far too small for LAPACK (call overhead dominated: ~4x slower at
B = 1024), and XLA fuses the scalar operations into a few vectorised loops over the batch.
Without a batch to vectorise over (fewer than DENSE_MAX_BATCH systems) one dense LAPACK
Cholesky is faster and compiles in half the time (:func:`prefers_dense`); above
UNROLL_MAX_ROWS equations each block operation is one batched LAPACK call (smaller programs).
Derivatives never go through these eliminations: SchurSystem.solve in rbjax/_engine/joints.py
wraps them in ``jax.lax.custom_linear_solve``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import rank


def mm_t(a, b):
    """a @ bᵀ for blocks a (p, k, ...) and b (r, k, ...) -> (p, r, ...). Columns are read
    with one ``unstack`` each (see rbjax/_engine/kernels.py ``comps``: cheap to transpose)."""
    ac, bc = jnp.unstack(a, axis=1), jnp.unstack(b, axis=1)
    out = ac[0][:, None] * bc[0][None, :]
    for l in range(1, len(ac)):
        out = out + ac[l][:, None] * bc[l][None, :]
    return out


def _cut(x):
    """Materialise a factor block between block steps. Without it XLA fuses each block's
    scalar operations into the consumers of later blocks and recomputes them, so a chain of N
    blocks cost O(N²) (and compile time exploded); with it the cost is O(N)."""
    return jax.lax.optimization_barrier(x)


def _entries(blk):
    """A block (p, r, *batch) as a nested list of (*batch) arrays."""
    return [list(jnp.unstack(row, axis=0)) for row in jnp.unstack(blk, axis=0)]


def _chol(a):
    """Lower Cholesky factor of a nested-list SPD matrix (entries (*batch) arrays)."""
    m = len(a)
    L: list[list] = [[None] * m for _ in range(m)]
    for j in range(m):
        s = a[j][j]
        for k in range(j):
            s = s - L[j][k] * L[j][k]
        d = jnp.sqrt(s)
        L[j][j] = d
        inv = 1.0 / d
        for i in range(j + 1, m):
            s = a[i][j]
            for k in range(j):
                s = s - L[i][k] * L[j][k]
            L[i][j] = s * inv
    return L


def _fwd(L, b):
    """x with L x = b (L lower nested list, b list of entries)."""
    x = []
    for i in range(len(L)):
        s = b[i]
        for k in range(i):
            s = s - L[i][k] * x[k]
        x.append(s / L[i][i])
    return x


def _bwd(L, b):
    """x with Lᵀ x = b."""
    m = len(L)
    x: list = [None] * m
    for i in reversed(range(m)):
        s = b[i]
        for k in range(i + 1, m):
            s = s - L[k][i] * x[k]
        x[i] = s / L[i][i]
    return x


def _sub_mm_t(acc, a, b):
    """acc − a bᵀ on nested lists."""
    return [
        [acc[i][j] - sum(a[i][r] * b[j][r] for r in range(len(a[i]))) for j in range(len(b))]
        for i in range(len(a))
    ]


# Up to this many joint equations the Schur solve is unrolled into scalar operations (fastest
# run time); above it, one batched operation per block (fewer operations to compile). Measured
# on a 16-link chain (80 rows, RK4, B = 64): unrolled 53 µs per step per system and 23 s
# compile, batched 139 µs and 9 s.
UNROLL_MAX_ROWS = 80


# Below this many systems per block (the batch the engine sees, per chunk), a mechanism of at
# most DENSE_MAX_ROWS joint equations is solved by ONE dense LAPACK Cholesky: there is no batch
# for the unrolled scalar operations to vectorise over. Measured (RK4, 2-core CPU, float64),
# 6-joint arm (30 rows): B = 1 dense 80 µs per system-step and 6.6 s compile against unrolled
# 271 µs and 13.5 s; B = 8 dense 67 µs / 6.6 s, unrolled 50 µs / 12.2 s; B = 64 dense 49 µs,
# unrolled 22 µs. 16-link chain (80 rows), B = 1, 100 steps: dense 27 ms and 4.8 s compile,
# per-block batched 45 ms / 5.4 s, unrolled 74 ms / 19 s.
# 32-link chain (160 rows), B = 1: dense 0.94 ms per step, per-block batched 0.63 ms
# (benchmarks/elimination.py).
DENSE_MAX_BATCH = 4
DENSE_MAX_ROWS = 120


def prefers_dense(rows: int, batch: int) -> bool:
    """Whether one dense Cholesky beats the block factorisations for this size (see above)."""
    return batch < DENSE_MAX_BATCH and rows <= DENSE_MAX_ROWS


def factor(blocks: dict, n: int, rows: int):
    """The block Cholesky suited to ``rows`` joint equations (see UNROLL_MAX_ROWS)."""
    if rows <= UNROLL_MAX_ROWS:
        return BlockCholesky(blocks, n)
    return BlockCholeskyBatched(blocks, n)


class BlockCholesky:
    """Factor S given as {(k, l): block (m_k, m_l, *batch)} for k ≥ l (lower blocks only).

    Trace-time object: the Python dict of blocks is the sparsity pattern (fill-in is tracked).
    ``solve(b)`` takes and returns a list of per-block vectors (m_k, *batch).
    """

    def __init__(self, blocks: dict, n: int):
        self.n = n
        S = {key: _entries(blk) for key, blk in blocks.items()}
        L: dict = {}
        flags = []
        for k in range(n):
            acc = S[(k, k)]
            for l in range(k):
                if (k, l) in L:
                    acc = _sub_mm_t(acc, L[(k, l)], L[(k, l)])
            L[(k, k)] = _cut(_chol(acc))
            # pivot of each row against its diagonal entry of S (rbjax/_engine/rank.py)
            flags += [
                rank.deficient(L[(k, k)][j][j] * L[(k, k)][j][j], S[(k, k)][j][j])
                for j in range(len(acc))
            ]
            for i in range(k + 1, n):
                acc = S.get((i, k))
                for l in range(k):
                    if (i, l) in L and (k, l) in L:
                        if acc is None:
                            acc = [[0.0] * len(L[(k, l)]) for _ in L[(i, l)]]
                        acc = _sub_mm_t(acc, L[(i, l)], L[(k, l)])
                if acc is not None:
                    # L_ik = S_ik L_kk⁻ᵀ: each row r of L_ik solves L_kk x = S_ik[r]ᵀ
                    L[(i, k)] = _cut([_fwd(L[(k, k)], row) for row in acc])
        self.L = L
        self.below = {k: [i for i in range(k + 1, n) if (i, k) in L] for k in range(n)}
        self.deficient = rank.any_deficient(*flags)

    def solve(self, b: list) -> list:
        n, L = self.n, self.L
        y = []
        for k in range(n):
            acc = list(jnp.unstack(b[k], axis=0))
            for l in range(k):
                if (k, l) in L:
                    blk = L[(k, l)]
                    acc = [
                        acc[r] - sum(blk[r][c] * y[l][c] for c in range(len(y[l])))
                        for r in range(len(acc))
                    ]
            y.append(_cut(_fwd(L[(k, k)], acc)))
        x: list = [None] * n
        for k in reversed(range(n)):
            acc = list(y[k])
            for i in self.below[k]:
                blk = L[(i, k)]
                acc = [
                    acc[c] - sum(blk[r][c] * x[i][r] for r in range(len(x[i])))
                    for c in range(len(acc))
                ]
            x[k] = _cut(_bwd(L[(k, k)], acc))
        return [jnp.stack(v) for v in x]


def dense_assemble(blocks: dict, sizes):
    """S batch-first (*batch, R, R) assembled from its lower blocks {(k, l): (m_k, m_l, ...)}
    (absent blocks are zero); ``sizes``: the rows of each joint."""
    n = len(sizes)
    batch = jnp.broadcast_shapes(*(v.shape[2:] for v in blocks.values()))
    dtype = next(iter(blocks.values())).dtype
    rows = []
    for k in range(n):
        row = []
        for l in range(n):
            if (k, l) in blocks:
                blk = blocks[(k, l)]
            elif (l, k) in blocks:
                blk = jnp.swapaxes(blocks[(l, k)], 0, 1)
            else:
                blk = jnp.zeros((sizes[k], sizes[l]) + batch, dtype)
            row.append(jnp.broadcast_to(blk, (sizes[k], sizes[l]) + batch))
        rows.append(jnp.concatenate(row, axis=1))
    return jnp.moveaxis(jnp.concatenate(rows, axis=0), (0, 1), (-2, -1))


def dense_factor(blocks: dict, sizes) -> tuple:
    """ONE dense batched Cholesky (LAPACK) of the assembled S, for :func:`dense_solve`.

    Slower per call than :class:`BlockCholesky` for small blocks but compiles to a handful of
    operations; used for small batches of small systems and inside one-shot analyses
    (assembly, kinematic analysis), where compile time dominates (``SchurSystem(...,
    dense=True)`` in rbjax/_engine/schur.py). ``sizes``: the rows of each joint.
    """
    return jax.scipy.linalg.cho_factor(dense_assemble(blocks, sizes), lower=True)


def dense_solve(chol: tuple, b: list) -> list:
    """S⁻¹ b for per-joint right-hand sides with the factor of :func:`dense_factor`."""
    sizes = [v.shape[0] for v in b]
    rhs = jnp.moveaxis(jnp.concatenate(b, axis=0), 0, -1)[..., None]
    x = jnp.moveaxis(jax.scipy.linalg.cho_solve(chol, rhs)[..., 0], -1, 0)
    offs = [0]
    for m in sizes:
        offs.append(offs[-1] + m)
    return [x[offs[k] : offs[k + 1]] for k in range(len(b))]


class BlockCholeskyBatched:
    """The same factorisation with each block operation (Cholesky of a diagonal block,
    triangular solve, Schur update) as ONE batched XLA/LAPACK operation on batch-first copies of
    the blocks. Slower per block than :class:`BlockCholesky` (call overhead per small matrix) but
    a constant number of operations per block, so large mechanisms compile in reasonable time:
    used above :data:`UNROLL_MAX_ROWS` joint equations."""

    def __init__(self, blocks: dict, n: int):
        self.n = n
        bf = {key: jnp.moveaxis(blk, (0, 1), (-2, -1)) for key, blk in blocks.items()}
        L: dict = {}
        flags = []
        for k in range(n):
            acc = bf[(k, k)]
            for l in range(k):
                if (k, l) in L:
                    acc = acc - L[(k, l)] @ jnp.swapaxes(L[(k, l)], -1, -2)
            L[(k, k)] = jnp.linalg.cholesky(acc)
            flags.append(
                rank.deficient(
                    jnp.diagonal(L[(k, k)], axis1=-2, axis2=-1) ** 2,
                    jnp.diagonal(bf[(k, k)], axis1=-2, axis2=-1),
                )
            )
            for i in range(k + 1, n):
                acc = bf.get((i, k))
                for l in range(k):
                    if (i, l) in L and (k, l) in L:
                        term = L[(i, l)] @ jnp.swapaxes(L[(k, l)], -1, -2)
                        acc = -term if acc is None else acc - term
                if acc is not None:
                    # L_ik = S_ik L_kk⁻ᵀ  <=>  L_kk L_ikᵀ = S_ikᵀ
                    xt = jax.scipy.linalg.solve_triangular(
                        L[(k, k)], jnp.swapaxes(acc, -1, -2), lower=True
                    )
                    L[(i, k)] = jnp.swapaxes(xt, -1, -2)
        self.L = L
        self.below = {k: [i for i in range(k + 1, n) if (i, k) in L] for k in range(n)}
        self.deficient = rank.any_deficient(*flags)

    def solve(self, b: list) -> list:
        n, L = self.n, self.L
        bf = [jnp.moveaxis(v, 0, -1)[..., None] for v in b]
        y = []
        for k in range(n):
            acc = bf[k]
            for l in range(k):
                if (k, l) in L:
                    acc = acc - L[(k, l)] @ y[l]
            y.append(jax.scipy.linalg.solve_triangular(L[(k, k)], acc, lower=True))
        x: list = [None] * n
        for k in reversed(range(n)):
            acc = y[k]
            for i in self.below[k]:
                acc = acc - jnp.swapaxes(L[(i, k)], -1, -2) @ x[i]
            x[k] = jax.scipy.linalg.solve_triangular(L[(k, k)], acc, lower=True, trans="T")
        return [jnp.moveaxis(v[..., 0], -1, 0) for v in x]


# ---------------------------------------------------------------- block-tridiagonal ordering


def level_groups(body, offsets, nb: int) -> list:
    """Joints in groups g_0, g_1, … such that two joints that share a body lie in the same or
    in adjacent groups, so S ordered group by group is block-tridiagonal (static, numpy).

    The groups are the breadth-first levels of the joint graph (joints adjacent when they share
    a non-ground body; the ground carries no inertia, so it couples nothing in S = W̃M⁻¹W̃ᵀ),
    from a pseudo-peripheral joint of each connected component (George & Liu, Computer
    Solution of Large Sparse Positive Definite Systems, 1981, §4.3: the level structure of
    largest depth keeps the levels narrow), components one after another. Adjacent levels are
    then merged while the merged group has no more equations than the widest level: fewer,
    equally wide blocks. ``body`` (2, R) per row the body of each side (``nb``: ground),
    ``offsets`` (n_joints + 1,) the first row of each joint. Returns a list of lists of joints."""
    nj = len(offsets) - 1
    rows = np.diff(offsets)
    on: list = [set() for _ in range(nb)]
    for k in range(nj):
        for side in (0, 1):
            b = int(body[side][offsets[k]])
            if b < nb:
                on[b].add(k)
    nbr: list = []
    for k in range(nj):
        sides = [int(body[side][offsets[k]]) for side in (0, 1)]
        nbr.append(sorted(set().union(*(on[b] for b in sides if b < nb)) - {k}))

    def bfs(start, allowed):
        levels, seen = [[start]], {start}
        while True:
            nxt = sorted({l for k in levels[-1] for l in nbr[k] if l in allowed and l not in seen})
            if not nxt:
                return levels
            seen.update(nxt)
            levels.append(nxt)

    levels: list = []
    left = set(range(nj))
    while left:
        comp = {k for lev in bfs(min(left), left) for k in lev}
        start = min(comp, key=lambda k: (len(nbr[k]), k))
        best = bfs(start, comp)
        for _ in range(4):  # move to a joint of the last level while the depth grows
            cand = min(best[-1], key=lambda k: (len(nbr[k]), k))
            trial = bfs(cand, comp)
            if len(trial) <= len(best):
                break
            best = trial
        levels += best
        left -= comp
    width = max(int(sum(rows[k] for k in lev)) for lev in levels)
    groups: list = [list(levels[0])]
    for lev in levels[1:]:
        if sum(rows[k] for k in groups[-1] + lev) <= width:
            groups[-1] = groups[-1] + lev
        else:
            groups.append(list(lev))
    return groups


class BlockTridiagonal:
    """Cholesky factorisation of a block-tridiagonal SPD matrix with K diagonal blocks D_k and
    sub-diagonal blocks B_k = S[k, k−1], all m × m (block LU of Golub & Van Loan, Matrix
    Computations, 4th ed., §4.5.3, in its symmetric form):

        L_0 = chol(D_0),   C_k = B_k L_{k−1}⁻ᵀ,   L_k = chol(D_k − C_k C_kᵀ)   (k ≥ 1),

    then L y = b by y_k = L_k⁻¹(b_k − C_k y_{k−1}) and Lᵀx = y by
    x_k = L_k⁻ᵀ(y_k − C_{k+1}ᵀ x_{k+1}). Each recursion is ONE ``lax.scan`` over the blocks,
    so the program does not grow with the mechanism; a chain of loops costs K·O(m³).

    On a CPU a tiny block operation costs its call overhead, about 1.5 µs per scan step: for
    fourbars_40 (81 blocks of 8) 0.41 ms per factorisation and 0.27 ms per solve. Block cyclic
    reduction (log₂K levels of operations batched over the blocks) solved in 0.06 ms but
    factored in 0.86 ms (batched LAPACK calls loop over the blocks) and its rollout stepped
    10 % slower (5.4 against 4.95 ms) and compiled in 37 s against 15 s (measured, float64,
    2-core CPU): the sequential recursion is kept.

    ``D``, ``B`` (K, *batch, m, m), batch-first per block (B_0 is not read). ``solve(b)``:
    b (K, *batch, m) -> x, same layout."""

    def __init__(self, D, B):
        mt = lambda x: jnp.swapaxes(x, -1, -2)  # noqa: E731
        self.batch = D.shape[1:-2]
        l0 = jnp.linalg.cholesky(D[0])

        def step(lp, db):
            d, b = db
            c = mt(jax.scipy.linalg.solve_triangular(lp, mt(b), lower=True))
            lk = jnp.linalg.cholesky(d - c @ mt(c))
            return lk, (lk, c)

        _, (L, C) = jax.lax.scan(step, l0, (D[1:], B[1:]))
        self.L = jnp.concatenate([l0[None], L])
        self.C = jnp.concatenate([jnp.zeros_like(l0)[None], C])  # C_0: nothing above block 0
        # pivots against S's own diagonal (rbjax/_engine/rank.py)
        self.deficient = rank.any_deficient(
            rank.deficient(
                jnp.diagonal(self.L, axis1=-2, axis2=-1) ** 2,
                jnp.diagonal(D, axis1=-2, axis2=-1),
            )
        )

    def solve(self, b):
        def fwd(yp, lcb):
            lk, ck, bk = lcb
            rhs = bk - (ck @ yp[..., None])[..., 0]
            yk = jax.scipy.linalg.solve_triangular(lk, rhs[..., None], lower=True)[..., 0]
            return yk, yk

        _, y = jax.lax.scan(fwd, jnp.zeros_like(b[0]), (self.L, self.C, b))
        # C_{k+1} beside block k (nothing below the last block)
        c_next = jnp.concatenate([self.C[1:], jnp.zeros_like(self.C[:1])])

        def bwd(xn, lcy):
            lk, cn, yk = lcy
            rhs = yk - (jnp.swapaxes(cn, -1, -2) @ xn[..., None])[..., 0]
            xk = jax.scipy.linalg.solve_triangular(lk, rhs[..., None], lower=True, trans="T")
            return xk[..., 0], xk[..., 0]

        _, x = jax.lax.scan(bwd, jnp.zeros_like(b[0]), (self.L, c_next, y), reverse=True)
        return x
