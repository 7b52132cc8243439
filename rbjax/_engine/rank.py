"""Redundant joint equations: the rank decision and the minimum-norm multipliers.

A closed loop can have linearly dependent joint equations (a planar four-bar closed by four
revolute joints: 20 equations, rank 17). Then the Schur complement S = W̃M⁻¹W̃ᵀ of the
multipliers (rbjax/_engine/schur.py) is singular: the constraint forces W̃ᵀλ are determined,
the multipliers λ only up to the left null space of W̃. rbjax returns the minimum-norm ones,

    λ = S⁺ r,

the Moore–Penrose solution of the fundamental equation of constrained motion (Udwadia &
Kalaba 1996; Udwadia & Schutte 2010, seed 001, eqs. (12), (45)), which does not depend on the
order of the joints or on which of the dependent equations one would remove.

**Why a cutoff.** Exactly dependent equations are dependent only ON the joint manifold. A state
that an integrator moved slightly off it (drift, and rounding) makes them nearly independent:
S gets an eigenvalue ε that is tiny but not zero, and its inverse turns the tiny inconsistency
of the right-hand side along that direction into a spurious force of size (inconsistency)/√ε.
The two are unrelated (a planar loop's redundant rows are its out-of-plane ones, lifted by
out-of-plane rounding alone, while the inconsistency is the in-plane velocity drift), so the
force is arbitrary. Measured: the Cholesky factorisation of S fails at the first step (a
non-finite state); the Moore–Penrose inverse with jnp.linalg.pinv's default cutoff
(10·max(m, n)·eps) took 10 J out of a four-bar within 0.05 s once, after 7 s of RK4, the
lifted singular value (2.6e-12 of the largest) passed that cutoff, and 9.5 J out of a door on
two hinges (2.4 J of kinetic energy) over 10 s. So directions of S below a
cutoff are treated as exactly null.

**The cutoff.** A direction counts as dependent when its eigenvalue of S is at most
:func:`rtol` = 4096·eps ≈ 9.1e-13 times the scale (float64), i.e. its singular value of the
mass-weighted Jacobian W̃M^{-1/2} at most :func:`singular_rtol` = 64·√eps ≈ 9.5e-7 times the
scale: the row lies within 1e-6 rad of the span of the others. Three facts bound it:

* S = W̃M⁻¹W̃ᵀ is formed in floating point, so its eigenvalues and Cholesky pivots carry
  errors of order (rows)·eps·|S| (Weyl's theorem, Golub & Van Loan, Matrix Computations,
  4th ed., §8.1; Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., §10.3):
  exactly dependent rows give pivots of ±(a few eps)·S_jj, which the cutoff must exceed by a
  margin (4096 covers a hundred rows forty times over). Through S nothing below √eps in the
  singular values can be told from zero, so the cutoff cannot be "√eps on the singular
  values" (that is eps on S, the rounding level itself).
* Drift lifts the singular values of dependent rows far less (largest ratio to the largest
  singular value of W̃ over 10 s at dt = 1e-3, measured): 1e-11 and 4e-10 in the
  parallelogram and the crank-rocker four-bar with RK4, 1.4e-8 in the latter with
  SemiImplicitEuler, 6e-14 for a door on two coaxial hinges (tests/test_redundant_loops.py).
* Independent equations near a singular configuration of the mechanism must keep their
  own, small singular value: an R-S-U-R four-bar passes 1.7e-5 of the largest, and a cutoff
  of √eps on S (eps^{1/4} ≈ 1.2e-4 on the singular values) dropped that equation there and
  the rollout blew up (3.6 J gained in one step). Only a configuration within 1e-6 rad of a
  singularity is truncated now; its multipliers would carry no more than 4 digits anyway.

**Where.** The factorisations of S (dense, block and tree Cholesky) are unpivoted: their j-th
pivot d_j is the squared distance of the j-th (mass-weighted) row of W̃ from the span of the
earlier rows (the Cholesky factor of a Gram matrix is the R factor of the QR factorisation of
its rows, Golub & Van Loan §5.2), so d_j ≤ rtol · S_jj says exactly "row j is, to the cutoff,
a linear combination of earlier rows" (:func:`deficient`). Every factorisation reports that;
when it happens anywhere in the batch, the solve switches (``jax.lax.cond``, a value test,
never a host decision) to the pseudo-inverse of the assembled S by a symmetric
eigendecomposition (:func:`guarded`): as many of its smallest eigenvalues are dropped as the
Jacobi-scaled S, D^{-1/2} S D^{-1/2}, has at most rtol times its largest (the pivots' own
diagonal-relative test; :func:`pinv_factor`). Independent equations never take that branch.
Models whose equations cannot be dependent skip the test altogether
(:func:`may_be_redundant`, static). UdwadiaSchutte's SVD of B = A L⁻ᵀ (not squared) uses
:func:`pinv_rtol`.

**float32.** rtol is 4.9e-4 there. Over 2 s of RK4 at 1 ms the redundant four-bar keeps its
joints to 4e-4 m (its non-redundant twin: 1e-3 m; tests/test_redundant_loops.py). Over 10 s,
plain RK4's float32 drift (1e-2) lifts the dependent equations past the cutoff and the loop
comes apart (joint residual 0.96 m, measured), while Projected(RK4()) holds it to 9e-6 m:
in float32 a redundant loop needs a projecting (or an implicit) integrator for long runs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def may_be_redundant(model) -> bool:
    """Whether the joint equations of ``model`` can be dependent, a static fact of its
    structure: only when the joint graph has a loop (a joint that closes one) or a joint
    states its own equations (a user constraint: a built-in joint's equations are
    independent on its manifold, and along a tree the Jacobian is block-triangular with one
    such block per joint). Models without (every open chain, arm or free body) skip the test
    and the branch of :func:`guarded`: the test and its branch cost 5-10 % of an RK4 step of
    the double pendulum (1.2-1.7 µs of 21 µs measured, B = 1)."""
    from .elimination import schedule

    user = any(not type(j)._vectorised for j in model.joints)
    return bool(model.joints) and (user or bool(schedule(model.topology).closures))


def rtol(dtype) -> float:
    """The relative cutoff on the eigenvalues and pivots of S (squared singular values):
    4096·eps (9.1e-13 in float64, 4.9e-4 in float32; module docstring)."""
    return 4096.0 * float(jnp.finfo(dtype).eps)


def singular_rtol(dtype) -> float:
    """The same cutoff on singular values (of the mass-weighted constraint matrix, e.g.
    Udwadia–Schutte's B = A L⁻ᵀ in rbjax/_engine/dynamics.py): √rtol = 64·√eps."""
    return rtol(dtype) ** 0.5


def deficient(pivot, diag):
    """True where a Cholesky pivot d_j (the squared diagonal entry of the factor) is at most
    :func:`rtol` times the diagonal entry S_jj of the matrix factored, or not finite (a failed
    factorisation). Arrays of one shape; the result has it too."""
    return ~(pivot > rtol(pivot.dtype) * diag)


def any_deficient(*flags):
    """One scalar: whether any of the boolean arrays ``flags`` is True anywhere."""
    out = jnp.asarray(False)
    for f in flags:
        out = out | jnp.any(f)
    return out


def pinv_factor(S):
    """The truncated eigendecomposition of symmetric positive semidefinite S (..., n, n):
    (V (..., n, n), w⁺ (..., n)) with S⁺ = V diag(w⁺) Vᵀ.

    How many directions are dependent is decided on the Jacobi-scaled D^{-1/2} S D^{-1/2}
    (D = diag S): its eigenvalues at most :func:`rtol` times the largest, the same
    diagonal-relative test as :func:`deficient` on the pivots, blind to the scale of the
    masses and lengths. That many of the smallest eigenvalues of S itself are set to zero (and
    any at the rounding level, n·eps of the largest), so λ = S⁺ r stays the minimum-norm
    solution. (A cutoff relative to S's largest eigenvalue also dropped legitimate directions
    whenever the mass matrix is ill-conditioned: in float32, a rod's small axial inertia put an
    independent direction of the parallelogram below 4096 ε, and the joints drifted apart.)"""
    S = 0.5 * (S + jnp.swapaxes(S, -1, -2))
    n = S.shape[-1]
    d = jnp.diagonal(S, axis1=-2, axis2=-1)
    dinv = jnp.where(d > 0, 1.0 / jnp.sqrt(jnp.where(d > 0, d, 1.0)), 0.0)
    scaled = jnp.linalg.eigvalsh(S * dinv[..., :, None] * dinv[..., None, :])
    dependent = jnp.sum(~(scaled > rtol(S.dtype) * scaled[..., -1:]), axis=-1)
    w, v = jnp.linalg.eigh(S)
    floor = n * float(jnp.finfo(S.dtype).eps) * w[..., -1:]
    keep = (jnp.arange(n) >= dependent[..., None]) & (w > floor)
    return v, jnp.where(keep, 1.0 / jnp.where(keep, w, 1.0), 0.0)


def pinv_rtol(B) -> float:
    """The relative cutoff of ``jnp.linalg.pinv(B, rtol=...)`` for a mass-weighted constraint
    matrix B (..., rows, cols) (Udwadia–Schutte's B = A L⁻ᵀ, whose singular values are not
    squared as the Schur complement's eigenvalues are): the float64 cutoff
    :func:`singular_rtol` (64·√eps ≈ 9.5e-7, above the drift-lifted singular values measured
    in the module docstring), but at least 100 times the rounding level max(rows, cols)·eps
    (float32, 23 rows: 2.7e-4; with 64·√eps32 = 0.022 every float32 four-bar, redundant or
    not, lost independent directions and drifted apart within 2 s, measured)."""
    eps = float(jnp.finfo(B.dtype).eps)
    return max(singular_rtol(jnp.float64), 100.0 * max(B.shape[-2:]) * eps)


def pinv_solve(fac, r):
    """S⁺ r for stacked right-hand sides r (n, ...) with the factor of :func:`pinv_factor`."""
    v, winv = fac
    rb = jnp.moveaxis(r, 0, -1)[..., None]
    y = winv[..., None] * (jnp.swapaxes(v, -1, -2) @ rb)
    return jnp.moveaxis((v @ y)[..., 0], -1, 0)


def guarded(bad, fast, assemble):
    """The solve r ↦ S⁻¹ r of a Cholesky factorisation (``fast``), replaced by the truncated
    pseudo-inverse S⁺ r of S when ``bad`` (a scalar: some pivot was deficient,
    :func:`deficient`). ``assemble()`` returns S batch-first (*batch, n, n).

    One ``jax.lax.cond`` per solve, the eigendecomposition inside its branch: a batch whose
    equations are independent never computes it (nor S, for the block and tree
    factorisations). Both branches are linear in r, as ``jax.lax.custom_linear_solve`` needs.
    (Factoring S⁺ once in a separate cond and passing it to the solves made the unrolled block
    Cholesky 6 % slower at B = 64: its zero stand-in, (B, n, n), is written every step.)"""

    def robust(r):
        return pinv_solve(pinv_factor(assemble()), r)

    def solve(r):
        return jax.lax.cond(bad, robust, fast, r)

    return solve
