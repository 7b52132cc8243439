"""The joint multipliers of a mechanism: S λ = r with S = W̃ M⁻¹ W̃ᵀ, on the stacked joint rows.

In generalized velocities u (Möller & Glocker 2012 eq. (37)) the joints ċ = W u + c_t = 0 give

    M u̇ = f − h + Wᵀλ,      W u̇ = γ = −(∂ċ/∂q q̇ + ∂ċ/∂t)|_u        (rbjax/_engine/joints.py).

Rigid bodies: their normalisation constraint |A|² = 1 has W = e_ν exactly (Möller & Glocker 2012
eqs. (44), (89)-(90)), so it is eliminated in closed form: ν̇ = 0 and the joint multipliers solve
the Schur complement S λ = γ − W̃ a with W̃ = W with the ν columns of rigid bodies removed and
S = W̃ M⁻¹ W̃ᵀ (M⁻¹ block-diagonal and constant per body, Möller & Glocker 2012 eq. (64)). The
scaling multiplier then follows from the ν row: λ_ν = −(f − h)_ν − (Wᵀλ)_ν (eq. (96) with the
joint's scaling load). This is exactly the full KKT solution, with a smaller SPD system.

Every product with W̃ works on the stacked rows of :class:`~rbjax._engine.joints.JointTerms`
(R rows, each on two bodies, :func:`~rbjax._engine.joints.row_layout`): W̃ v is one gather of the
bodies' vectors per side, W̃ᵀλ one scatter-add onto the bodies. The program therefore has the
same size for 2 or 256 joints; only the factorisation of S depends on the joint graph:

* "dense": S assembled from four masked products of the stacked rows (from per-joint blocks up
  to DENSE_UNROLL_MAX_ROWS) and factored by one LAPACK Cholesky (small systems in small
  batches, and the one-shot analyses);
* "tree": the elimination along the joint graph (rbjax/_engine/elimination.py), a ``lax.scan``
  over the levels of the spanning tree, loops closed by a Schur complement on their rows;
* "block": the block-sparse Cholesky of S (rbjax/_engine/blockchol.py), unrolled joint by joint
  (its program grows with the joints): kept for the tiny systems in large batches where it
  measurably wins, and for graphs with many loops;
* "banded": S ordered by the levels of the joint graph is block-tridiagonal
  (:func:`~rbjax._engine.blockchol.level_groups`); its block Cholesky is one ``lax.scan`` over
  the levels (:class:`~rbjax._engine.blockchol.BlockTridiagonal`), loops included: large
  mechanisms in small batches, whatever their number of loops.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from . import rank
from .blockchol import (
    DENSE_MAX_BATCH,
    UNROLL_MAX_ROWS,
    BlockTridiagonal,
    dense_assemble,
    factor,
    level_groups,
    mm_t,
    prefers_dense,
)
from .elimination import TreeSchur, schedule
from .joints import JointTerms, row_layout
from .mass import blocks as mass_blocks, minv, minv_at

# Which factorisation solves S λ = r; tests and benchmarks set it to compare them (None: by
# :func:`method`).
FORCE_METHOD: str | None = None

# The elimination along the joint graph closes loops by a dense Schur complement on the closure
# rows, formed with one tree solve per row: with more loop-closing joints than this, the block
# Cholesky of S (which exploits the loops' sparsity) is used instead.
TREE_MAX_CLOSURES = 4

# Up to this many joint equations the dense Cholesky (small batches) assembles S from per-joint
# blocks and forms W̃v, W̃ᵀλ and M⁻¹W̃ᵀλ joint by joint, as the block solver does. On the
# stacked rows (gathers, four masked products) the RK4 step at B = 1 ran 1.55x slower for the
# double pendulum (10 rows) and 1.34x for the 4-link chain (20 rows), paired in one process
# (40 alternating calls), compiling as fast. The arm (30 rows) and the 8-link chain (40) gain
# 1.3x and 1.2x per step but compile 35-55 % longer (5.4-5.8 against 7.4-7.6 s and 4.6-5.0
# against 7.3-7.6 s): above this size the stacked forms keep the program flat.
DENSE_UNROLL_MAX_ROWS = 20


# The block-tridiagonal factorisation ("banded") is used for the large mechanisms in small
# batches when the widest level of the joint graph has at most this many equations (beyond, a
# level's dense m × m Cholesky approaches the cost of the dense Cholesky of S). fourbars_40
# (485 rows in 81 groups of at most 8), B = 1, Projected(RK4), 200 steps: the rollout compiled
# in 15 s against 157 s and stepped in 4.95 ms against 10.1 ms with the block Cholesky of one
# batched LAPACK call per joint block (its program: 27 879 jaxpr equations against 174 499);
# 20 s of motion (20 000 steps) in 149 s wall against 430 s, the same joint residual (9.8e-13)
# (benchmarks/elimination.py --linkage 40,20; 2-core CPU, float64).
BANDED_MAX_WIDTH = 48


class BandedLayout:
    """Where each joint equation sits in the block-tridiagonal order of
    :func:`~rbjax._engine.blockchol.level_groups` (numpy, once per topology): K groups padded
    to m slots each; ``slot_row`` (K, m) the stacked row in each slot (R: padding, reads 0),
    ``row_slot`` (R,) the flat slot of each row, ``pad`` (K, m) 1 on padding slots, ``body``
    (2, K, m) the bodies of each slot's row (``nb`` for the ground and for padding)."""

    def __init__(self, topology):
        lay = row_layout(topology)
        nb, off = topology.nb, lay.offsets
        groups = level_groups(lay.body, off, nb)
        rows = [
            np.concatenate([np.arange(int(off[k]), int(off[k + 1])) for k in g]) for g in groups
        ]
        self.width = max(len(r) for r in rows)
        self.slot_row = np.full((len(groups), self.width), lay.n, int)
        for k, r in enumerate(rows):
            self.slot_row[k, : len(r)] = r
        self.row_slot = np.argsort(self.slot_row.ravel(), kind="stable")[: lay.n]
        self.pad = (self.slot_row == lay.n).astype(float)
        ext = np.concatenate([lay.body, np.full((2, 1), nb, int)], axis=1)
        self.body = ext[:, self.slot_row]


@functools.lru_cache(maxsize=64)
def banded_layout(topology) -> BandedLayout:
    return BandedLayout(topology)


def method(topology, rows: int, batch: int) -> str:
    """How S λ = r is solved for ``rows`` joint equations and ``batch`` systems per call:
    "dense" (one LAPACK Cholesky), "block" (block Cholesky of S, rbjax/_engine/blockchol.py),
    "banded" (block-tridiagonal in the joint graph's levels, the same module) or "tree"
    (elimination along the joint graph, rbjax/_engine/elimination.py).

    Small batches are compile-bound (a rollout of a few systems runs for milliseconds and
    compiles for seconds): below DENSE_MAX_BATCH systems and up to DENSE_MAX_ROWS equations the
    dense Cholesky, on the stacked rows above DENSE_UNROLL_MAX_ROWS, whose program does not
    grow with the joints (16-link chain, B = 1: 1.8 s to compile the rollout against 5.6 s per
    joint), with per-joint products below it (faster steps at the same compile time; see
    DENSE_UNROLL_MAX_ROWS). Large batches are run-bound: up to
    UNROLL_MAX_ROWS equations the block Cholesky unrolled joint by joint (B = 64, 16 links: 56
    µs per system-step against 134-155 for the elimination, which compiles in 11 s against
    28 s), above it the elimination (32 links: 258 against 354 µs; 64 links: level). At
    B = 1 above DENSE_MAX_ROWS the block Cholesky with one LAPACK call per block (64 links:
    1.8 ms per step against 5.8 ms for the elimination, whose levels are sequential scan
    steps of scalar operations with no batch to vectorise over; it compiles in 8 s against
    15 s). Small batches above DENSE_MAX_ROWS whose joint graph has levels of at most
    BANDED_MAX_WIDTH equations now take the block-tridiagonal factorisation ("banded", one
    ``lax.scan`` whatever the number of loops; see BANDED_MAX_WIDTH), the block Cholesky
    otherwise. Measured with benchmarks/elimination.py on a 2-core CPU, float64."""
    if FORCE_METHOD is not None:
        return FORCE_METHOD
    if prefers_dense(rows, batch):
        return "dense"
    if batch < DENSE_MAX_BATCH and banded_layout(topology).width <= BANDED_MAX_WIDTH:
        return "banded"
    if batch < DENSE_MAX_BATCH or rows <= UNROLL_MAX_ROWS:
        return "block"
    if len(schedule(topology).closures) > TREE_MAX_CLOSURES:
        return "block"
    return "tree"


class SchurSystem:
    """S = W̃ M⁻¹ W̃ᵀ of ``terms`` (stacked rows), factored once (trace-time object).

    ``solve(r)`` returns S⁻¹ r for stacked right-hand sides r (R, ...); a projection that
    iterates with a frozen W̃ (rbjax/_engine/projection.py) factors S only once. ``dense=True``
    solves by one dense LAPACK Cholesky whatever the size: analyses that run once (assembly,
    kinematic analysis) trade run time, irrelevant there, for a smaller program to compile.
    """

    def __init__(self, model, terms: JointTerms, dtype, *, dense: bool = False):
        lay = row_layout(model.topology)
        self.model, self.terms, self.layout, self.dtype = model, terms, lay, dtype
        batch = terms.Wi.shape[2:]
        keep = np.asarray(lay.keep).reshape(lay.keep.shape + (1,) * len(batch))
        keep = jnp.asarray(keep, terms.Wi.dtype)  # a float64 constant would promote float32
        self.w = (terms.Wi * keep[0], terms.Wj * keep[1])
        self.batch, self.n = batch, lay.n
        self.dense = dense
        self.method = (
            "dense" if dense else method(model.topology, lay.n, int(np.prod(batch, dtype=int)))
        )
        # products with W̃ joint by joint with the unrolled block Cholesky and with the dense
        # Cholesky of small systems (see :meth:`_per_joint`), on the stacked rows otherwise
        self._unrolled = self.method == "block" or (
            self.method == "dense" and lay.n <= DENSE_UNROLL_MAX_ROWS
        )
        self._solve = None  # built on the first solve: a projection's residual needs none

    # -- products with W̃ on the stacked rows ---------------------------------------------------

    def apply(self, v, *, reduced: bool = True):
        """W̃ v (R, ...) for per-body vectors v (7, ..., nb); ``reduced=False``: the full W
        (ν columns kept) on the non-ground sides."""
        w = self.w if reduced else (self.terms.Wi, self.terms.Wj)
        if self._unrolled:  # per joint (see :meth:`_per_joint`)
            vt = jnp.moveaxis(v, -1, 1)  # (7, nb, ...)
            return jnp.concatenate(
                [
                    sum(jnp.sum(w[side][sl] * vt[:, b][None], axis=1) for side, b in on)
                    for sl, on in self._per_joint()
                ]
            )
        vt = jnp.moveaxis(v, -1, 0)  # bodies first: each row reads one contiguous slice
        vt = jnp.concatenate([vt, jnp.zeros((1,) + vt.shape[1:], vt.dtype)])  # the ground
        out = 0.0
        for side in (0, 1):
            out = out + jnp.sum(w[side] * vt[self.layout.body[side]], axis=1)
        return out

    def scatter(self, lam, *, reduced: bool = True):
        """Wᵀλ summed onto the bodies, (7, ..., nb), for stacked λ (R, ...) (the ground's share
        dropped); ``reduced``: W̃ (ν columns of rigid bodies removed)."""
        w = self.w if reduced else (self.terms.Wi, self.terms.Wj)
        batch = jnp.broadcast_shapes(self.batch, lam.shape[1:])
        if self._unrolled:
            acc: list = [jnp.zeros((7,) + batch, lam.dtype)] * self.model.nb
            for sl, on in self._per_joint():
                for side, b in on:
                    acc[b] = acc[b] + jnp.sum(w[side][sl] * lam[sl][:, None], axis=0)
            return jnp.stack(acc, axis=-1)
        contrib = jnp.concatenate(
            [
                jnp.broadcast_to(w[0] * lam[:, None], (self.n, 7) + batch),
                jnp.broadcast_to(w[1] * lam[:, None], (self.n, 7) + batch),
                jnp.zeros((1, 7) + batch, lam.dtype),
            ]
        )
        # a sum of gathers (each body's rows, padded with the zero row) rather than a
        # scatter-add, which XLA runs as a serial loop on CPU
        return jnp.moveaxis(jnp.sum(contrib[self.layout.onto], axis=0), 0, -1)

    def _per_joint(self) -> list:
        """Per joint its rows (a slice) and its non-ground sides [(side, body)]. With the block
        Cholesky, whose program is unrolled joint by joint anyway (and the dense Cholesky of
        the smallest systems, DENSE_UNROLL_MAX_ROWS), W̃ v, W̃ᵀλ and M⁻¹W̃ᵀ
        (:meth:`_minv_joint`) are unrolled the same way, with static bodies: the stacked forms
        (gathers of the bodies' vectors and of their inertias per row) made the small batched
        systems about 1.3× slower (double pendulum and slider-crank at B = 64, RK4; the
        inertia gathers were most of it)."""
        off, nb = self.layout.offsets, self.model.nb
        body = self.layout.body
        return [
            (
                slice(int(off[k]), int(off[k + 1])),
                [(s, int(body[s][off[k]])) for s in (0, 1) if body[s][off[k]] < nb],
            )
            for k in range(len(off) - 1)
        ]

    def correction(self, lam):
        """(M⁻¹W̃ᵀλ (7, ..., nb), (Wᵀλ)_ν (..., nb)) for stacked λ (R, ...)."""
        F = self.scatter(lam, reduced=False)
        reduced = F.at[3].set(jnp.where(self.model.rigid, 0.0, F[3]))
        return minv(self.model, reduced), F[3]

    def matvec(self, lam):
        """S λ = W̃ M⁻¹ W̃ᵀ λ for stacked λ (R, ...)."""
        if self.method == "tree":
            return self._elimination().matvec(lam)
        return self.apply(minv(self.model, self.scatter(lam)))

    # -- factorisations ------------------------------------------------------------------------

    def _minv_rows(self, side):
        """M_b⁻¹ W̃_r for every row r and its body b on ``side``, (R, 7, ...): one gather of
        the bodies' inertias (Möller & Glocker 2012 eq. (64))."""
        x = jnp.moveaxis(self.w[side], 0, -1)  # (7, ..., R): one row per "body" slot
        return jnp.moveaxis(minv_at(self.model, x, self.layout.body[side]), -1, 0)

    def _minv_joint(self, w, b: int):
        """M_b⁻¹ applied to every row of w (m, 7, ...), body b static (:func:`minv_at`)."""
        return jnp.moveaxis(minv_at(self.model, jnp.moveaxis(w, 0, -1), b), -1, 0)

    def assemble(self):
        """S (R, R, ...): Σ over the sides (α, β) of W̃_α M⁻¹ W̃_βᵀ where the rows' bodies
        coincide (four products of the stacked rows, masked by the joint graph)."""
        body, nb = self.layout.body, self.model.nb
        x = (self._minv_rows(0), self._minv_rows(1))
        S = 0.0
        for a in (0, 1):
            for b in (0, 1):
                mask = (body[a][:, None] == body[b][None, :]) & (body[a][:, None] < nb)
                if not mask.any():
                    continue
                prod = jnp.einsum("rc...,sc...->rs...", self.w[a], x[b])
                S = S + prod * jnp.asarray(mask, prod.dtype).reshape(
                    mask.shape + (1,) * len(self.batch)
                )
        return S

    def _blocks(self) -> dict:
        """The structurally non-zero lower blocks {(k, l): (m_k, m_l, ...)} of S (block method)."""
        model = self.model
        nb = model.nb
        touching: dict = {b: [] for b in range(nb)}
        for k, (sl, on) in enumerate(self._per_joint()):
            for side, b in on:
                w = self.w[side][sl]
                x = self._minv_joint(w, b)
                touching[b].append((k, w, x))
        blocks: dict = {}
        for b in range(nb):
            for k, wk, _ in touching[b]:
                for l, _, xl in touching[b]:
                    if l > k:
                        continue
                    blk = mm_t(wk, xl)
                    blocks[(k, l)] = blk if (k, l) not in blocks else blocks[(k, l)] + blk
        return blocks

    def _banded_blocks(self):
        """The diagonal blocks D_k and sub-diagonal blocks B_k = S[k, k−1] of S in the order of
        :class:`BandedLayout`, each (K, *batch, m, m): S_rs = Σ over the sides (α, β) of
        W̃_α,r M⁻¹ W̃_β,sᵀ where the rows' bodies coincide (as :meth:`assemble`, on the
        blocks only). Padding slots get D = 1 on the diagonal, B = 0."""
        bl, nb = banded_layout(self.model.topology), self.model.nb
        nbatch = len(self.batch)

        def slots(x):  # (R, 7, ...) -> (K, m, 7, ...), padding reading zeros
            x = jnp.concatenate([x, jnp.zeros((1,) + x.shape[1:], x.dtype)])
            return x[bl.slot_row]

        w = [slots(self.w[a]) for a in (0, 1)]
        x = [slots(self._minv_rows(a)) for a in (0, 1)]
        shift = lambda v: jnp.concatenate([jnp.zeros_like(v[:1]), v[:-1]])  # noqa: E731
        prev = np.concatenate([np.full_like(bl.body[:, :1], nb), bl.body[:, :-1]], axis=1)
        D = B = 0.0
        for a in (0, 1):
            for b in (0, 1):
                for other, xb, body_b in ((False, x[b], bl.body[b]), (True, shift(x[b]), prev[b])):
                    mask = (bl.body[a][:, :, None] == body_b[:, None, :]) & (
                        bl.body[a][:, :, None] < nb
                    )
                    if not mask.any():
                        continue
                    prod = jnp.einsum("kic...,kjc...->kij...", w[a], xb)
                    term = prod * jnp.asarray(mask, prod.dtype).reshape(mask.shape + (1,) * nbatch)
                    if other:
                        B = B + term
                    else:
                        D = D + term
        eye = np.eye(bl.width)[None] * bl.pad[:, :, None]
        D = D + jnp.asarray(eye.reshape(eye.shape + (1,) * nbatch), self.w[0].dtype)
        B = jnp.broadcast_to(B, jnp.shape(D))
        return jnp.moveaxis(D, (1, 2), (-2, -1)), jnp.moveaxis(B, (1, 2), (-2, -1))

    def _banded_solve(self, fac: BlockTridiagonal):
        """S⁻¹ r for stacked r (R, ...) with the block-tridiagonal factor: the rows gathered
        into the slots of :class:`BandedLayout` and back."""
        bl = banded_layout(self.model.topology)

        def solve(r):
            rp = jnp.concatenate([r, jnp.zeros((1,) + r.shape[1:], r.dtype)])
            rs = jnp.moveaxis(rp[bl.slot_row], 1, -1)  # (K, *batch, m)
            bshape = rs.shape[:1] + jnp.broadcast_shapes(rs.shape[1:-1], fac.batch) + rs.shape[-1:]
            xs = jnp.moveaxis(fac.solve(jnp.broadcast_to(rs, bshape)), -1, 1)
            return xs.reshape((-1,) + xs.shape[2:])[bl.row_slot]

        return solve

    def _elimination(self) -> TreeSchur:
        if not hasattr(self, "_tree"):
            model, batch, nb = self.model, self.batch, self.model.nb

            def per_body(mb):  # (7, 7, ..., nb) -> (7, 7, nb, *batch)
                mb = jnp.moveaxis(mb, -1, 2)
                mb = mb.reshape((7, 7, nb) + (1,) * (len(batch) + 3 - mb.ndim) + mb.shape[3:])
                return jnp.broadcast_to(mb, (7, 7, nb) + batch)

            def apply_minv(F):  # (7, nb, *batch) -> M⁻¹ F, same layout
                return jnp.moveaxis(minv(model, jnp.moveaxis(F, 1, -1)), -1, 1)

            self._tree = TreeSchur(
                schedule(model.topology),
                per_body(mass_blocks(model)),
                apply_minv,
                *self.w,
                self.layout.body,
            )
        return self._tree

    def _solver(self):
        """The factorised solve of stacked right-hand sides (built once, in the caller's
        trace, outside any solve).

        Every factorisation is a Cholesky factorisation that also reports whether a pivot
        was deficient (a joint equation that is, to rbjax/_engine/rank.py's cutoff, a linear
        combination of earlier ones: redundant equations); the solve then switches to the
        minimum-norm solution S⁺ r of the assembled S (:func:`rank.guarded`). Models whose
        equations cannot be dependent (:func:`rank.may_be_redundant`) skip the test."""
        if self._solve is not None:
            return self._solve
        n = self.n
        test = rank.may_be_redundant(self.model)
        if self.method == "dense":
            if self._unrolled:
                S = dense_assemble(self._blocks(), self.terms.rows)
            else:
                S = jnp.moveaxis(self.assemble(), (0, 1), (-2, -1))
            chol = jax.scipy.linalg.cho_factor(S, lower=True)
            bad = rank.deficient(
                jnp.diagonal(chol[0], axis1=-2, axis2=-1) ** 2,
                jnp.diagonal(S, axis1=-2, axis2=-1),
            )

            def fast(r):
                rhs = jnp.moveaxis(r, 0, -1)[..., None]
                return jnp.moveaxis(jax.scipy.linalg.cho_solve(chol, rhs)[..., 0], -1, 0)

            def assemble():
                return S

        elif self.method == "banded":
            fac = BlockTridiagonal(*self._banded_blocks())
            bad = fac.deficient
            fast = self._banded_solve(fac)

            def assemble():
                return jnp.moveaxis(self.assemble(), (0, 1), (-2, -1))

        else:
            if self.method == "tree":
                tree = self._elimination()
                tree.factor()
                fast, bad = tree.solve, tree.deficient
            else:
                fac = factor(self._blocks(), len(self.terms.rows), n)
                bad = fac.deficient

                def fast(r):
                    return jnp.concatenate(fac.solve(self.terms.split(r)), axis=0)

            def assemble():
                return jnp.moveaxis(self.assemble(), (0, 1), (-2, -1))

        if test:
            fast = rank.guarded(rank.any_deficient(bad), fast, assemble)
        self._solve = fast
        return fast

    def factorise(self) -> SchurSystem:
        """Factor S now, in the caller's trace. A solver that iterates with a frozen S calls
        this before its loop: otherwise the first solve, traced inside the loop body, would put
        the factorisation in the body and repeat it every iteration."""
        self._solver()
        return self

    def solve(self, rhs):
        """S⁻¹ rhs for stacked rhs (R, ...), differentiated as a linear solve
        (``jax.lax.custom_linear_solve``).

        The tangent of λ = S⁻¹ r is S⁻¹ (ṙ − Ṡ λ) and its transpose is S⁻¹ again (S is
        symmetric): derivatives reuse the forward factorisation through ``solve`` and
        differentiate only the product S λ, never the elimination itself. This keeps forward-
        and reverse-mode programs small."""
        solve = self._solver()
        return jax.lax.custom_linear_solve(self.matvec, rhs, lambda _, b: solve(b), symmetric=True)


def solve_multipliers(model, terms: JointTerms, a, rhs_extra=None, *, dense: bool = False):
    """Solve S λ = γ − W̃ a (+ rhs_extra) and return (λ (R, ...), M⁻¹W̃ᵀλ, (Wᵀλ)_ν).

    ``a`` (7, ..., nb) is the unconstrained acceleration with ν̇ = 0 already set for rigid
    bodies; ``rhs_extra`` stacked rows (R, ...) or None. Returns the stacked multipliers, the
    correction (7, ..., nb) to add to a, and the scaling component of the joint forces per body
    (..., nb). ``dense``: see :class:`SchurSystem`.
    """
    schur = SchurSystem(model, terms, a.dtype, dense=dense)
    rhs = terms.gamma - schur.apply(a)
    if rhs_extra is not None:
        rhs = rhs + rhs_extra
    lam = schur.solve(rhs)
    corr, fnu = schur.correction(lam)
    return lam, corr, fnu


def joint_force_correction(model, terms: JointTerms, lam, *, reduced: bool):
    """M⁻¹ Wᵀ λ (7, ..., nb) for stacked multipliers ``lam`` (R, ...).

    ``reduced``: use W̃ (ν columns of rigid bodies removed), as in the Schur complement;
    otherwise the full W (the implicit DAE scheme, where ν is an unknown of its own).
    """
    schur = SchurSystem(model, terms, lam.dtype, dense=True)
    return minv(model, schur.scatter(lam, reduced=reduced))
