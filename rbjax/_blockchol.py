"""Block-sparse Cholesky on component-first blocks (batch axes trailing).

The Schur complement S = W M⁻¹ Wᵀ of a mechanism is a matrix of small blocks, one block row per
joint; block (k, l) is non-zero only when joints k and l share a body (plus fill-in). Its
sparsity is known at trace time, so the factorisation is unrolled over the structurally non-zero
blocks only: a chain of N links costs O(N) block operations instead of O(N³) for dense. Every
block is an array (a, b, *batch) and every operation is elementwise over the batch (no batched
LAPACK calls), which is what keeps large batches fast on CPU (see rbjax/_cf.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def mm_t(a, b):
    """a @ bᵀ for blocks a (p, k, ...) and b (r, k, ...) -> (p, r, ...)."""
    out = a[:, 0][:, None] * b[:, 0][None, :]
    for l in range(1, a.shape[1]):
        out = out + a[:, l][:, None] * b[:, l][None, :]
    return out


def mv(a, v):
    """a @ v for a (p, k, ...) and v (k, ...)."""
    out = a[:, 0] * v[0]
    for l in range(1, a.shape[1]):
        out = out + a[:, l] * v[l]
    return out


def mtv(a, v):
    """aᵀ @ v for a (p, k, ...) and v (p, ...) -> (k, ...)."""
    out = a[0] * v[0]
    for l in range(1, a.shape[0]):
        out = out + a[l] * v[l]
    return out


def _chol_dense(s):
    """Lower Cholesky factor of a small SPD block s (n, n, ...), unrolled; returns (L, 1/diag)."""
    n = s.shape[0]
    rows = [[None] * n for _ in range(n)]
    inv = []
    for j in range(n):
        acc = s[j, j]
        for k in range(j):
            acc = acc - rows[j][k] * rows[j][k]
        d = jnp.sqrt(acc)
        rows[j][j] = d
        inv.append(1.0 / d)
        for i in range(j + 1, n):
            acc = s[i, j]
            for k in range(j):
                acc = acc - rows[i][k] * rows[j][k]
            rows[i][j] = acc * inv[j]
    zero = jnp.zeros_like(s[0, 0])
    lower = jnp.stack(
        [jnp.stack([rows[i][j] if j <= i else zero for j in range(n)]) for i in range(n)]
    )
    return lower, jnp.stack(inv)


def _forward(lower, inv, b):
    """Solve L y = b for a dense lower block."""
    n = lower.shape[0]
    y = []
    for i in range(n):
        acc = b[i]
        for k in range(i):
            acc = acc - lower[i, k] * y[k]
        y.append(acc * inv[i])
    return jnp.stack(y)


def _backward(lower, inv, y):
    """Solve Lᵀ x = y for a dense lower block."""
    n = lower.shape[0]
    x: list = [None] * n
    for i in reversed(range(n)):
        acc = y[i]
        for k in range(i + 1, n):
            acc = acc - lower[k, i] * x[k]
        x[i] = acc * inv[i]
    return jnp.stack(x)


def _trsm(s, lower, inv):
    """X with X Lᵀ = s, for s (p, n, ...): each row solves L x = s_row (forward substitution)."""
    n = lower.shape[0]
    cols = []
    for j in range(n):
        acc = s[:, j]
        for k in range(j):
            acc = acc - cols[k] * lower[j, k]
        cols.append(acc * inv[j])
    return jnp.stack(cols, axis=1)


class BlockCholesky:
    """Factor S given as {(k, l): block (m_k, m_l, ...)} for k ≥ l (lower blocks only).

    Trace-time object: the Python dict of blocks is the sparsity pattern. ``solve(b)`` takes and
    returns a list of per-block vectors (m_k, ...).
    """

    def __init__(self, blocks: dict, n: int):
        self.n = n
        L: dict = {}
        inv: dict = {}
        for k in range(n):
            acc = blocks[(k, k)]
            for l in range(k):
                if (k, l) in L:
                    acc = acc - mm_t(L[(k, l)], L[(k, l)])
            L[(k, k)], inv[k] = _chol_dense(acc)
            for i in range(k + 1, n):
                acc = blocks.get((i, k))
                for l in range(k):
                    if (i, l) in L and (k, l) in L:
                        term = mm_t(L[(i, l)], L[(k, l)])
                        acc = -term if acc is None else acc - term
                if acc is not None:
                    L[(i, k)] = _trsm(acc, L[(k, k)], inv[k])
        # Materialise the factor: otherwise XLA fuses the factorisation into every scalar of the
        # triangular solves and recomputes it there (measured 3x slower for 2 blocks of 5).
        self.L, self.inv = jax.lax.optimization_barrier((L, inv))
        self.below = {k: [i for i in range(k + 1, n) if (i, k) in L] for k in range(n)}

    def solve(self, b: list) -> list:
        n, L, inv = self.n, self.L, self.inv
        y = []
        for k in range(n):
            acc = b[k]
            for l in range(k):
                if (k, l) in L:
                    acc = acc - mv(L[(k, l)], y[l])
            y.append(_forward(L[(k, k)], inv[k], acc))
        y = jax.lax.optimization_barrier(y)
        x: list = [None] * n
        for k in reversed(range(n)):
            acc = y[k]
            for i in self.below[k]:
                acc = acc - mtv(L[(i, k)], x[i])
            x[k] = _backward(L[(k, k)], inv[k], acc)
        return x
