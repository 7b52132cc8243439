r"""The percussions of one Moreau–Jean step: Signorini, Newton's impact law and Coulomb friction
as proximal maps, solved by a projected Gauss–Seidel fixed point.

**The step** (Moreau 1988; Jean 1999; Studer 2009, *Numerics of Unilateral Contacts and
Friction*, §4.2; Acary & Brogliato 2008, §10.1). Over a step of length h from (q_k, v_k), with
the contacts closed at the midpoint q_M, the velocity jumps by the percussions P:

    M (v⁺ − v_k) = h f + W P,     γ⁺ = Wᵀ v⁺ = γ_free + G P,    G = Wᵀ M⁻¹ W  (Delassus),

where γ_free = Wᵀ (v_k + h M⁻¹ f) is the contact velocity without percussion and W holds, per
contact, the generalized force directions of its normal and its two tangents (3 columns).

**The laws** (Studer 2009, §4.3, eqs. (4.36)–(4.40); Glocker 2001): for each closed contact,
with ξ = γ⁺ + e γ⁻ the velocity that Newton's impact law weights by the restitution e (normal
e_N, tangential e_T; γ⁻ = Wᵀ v_k),

    P_N = prox_{ℝ⁺}(P_N − r ξ_N),                        (Signorini–Newton)
    P_T = prox_{D(μ P_N)}(P_T − r ξ_T),   D(ρ) = {x ∈ ℝ² : |x| ≤ ρ}   (Coulomb)

for every r > 0: the fixed points are exactly the percussions that satisfy the laws, whatever r
(r only changes how an iteration approaches them). An open contact has P = 0.

**The iteration.** Projected Gauss–Seidel over the contacts (Studer 2009, §5.3, Alg. 5.2;
Jean 1999's NSCD): each contact's normal, then its tangents, is updated with the others
fixed, with r = 1/G_NN for the normal and r = 1/max(G_T1T1, G_T2T2) for the tangents. For
the frictionless problem (an LCP with a symmetric positive definite G) this is projected SOR
with ω = 1 and converges from any start (Cottle, Pang & Stone 1992, §5.2). With friction
the law is not associated and convergence is not guaranteed: a Painlevé-like configuration
(a large μ and a strongly coupled G) may have no solution or several. Gauss–Seidel's rate
falls with G's conditioning (a thin box on its edge, a stack), so the solve has three phases:

1. sweeps from the warm start (the caller's last percussions), until they are slow (the
   residual keeps more than ``_SLOW`` of itself over ``_WINDOW`` sweeps) or ``_SWEEPS_FIRST``;
2. semi-smooth Newton steps on the natural map F (Alart & Curnier 1991; Studer 2009, §5.4):
   the least-squares solution of ∂F/∂P · s = F on the closed contacts (∂F/∂P in closed form
   from the prox's derivative; least squares because redundant contacts make it singular),
   the best step length of 1, 1/2, …, 1/2¹¹ by the residual, then ``_RESWEEP`` sweeps to
   settle which contacts stick, slide or open; a step that does not lower the residual is
   not kept, and one that removes less than a tenth of it ends the phase;
3. sweeps again, while the residual is above ``accept`` or they still converge (Newton
   stalls on an active set it cannot settle; measured: three stacked cubes at 3.5e-4 of the
   largest percussion, which sweeps then bring below 1e-5), ending where they are slow below
   ``accept`` (a contact on the boundary of stick and slip in a stack stalls both methods
   near 1.6e-6 of the largest percussion; running such solves to ``max_iter`` took 10 ms a
   step on two resting cubes).

Where the active set is right the Newton step is exact (a resting thin box: from 1e-4 to
3e-16 in one step). The iteration stops when the natural-map residual

    ‖P − prox(P − r ξ(P))‖_∞ ≤ tol · (‖P‖_∞ + h-scale)

holds (h-scale from the closed contacts only), or after ``max_iter`` sweeps (a Newton step
counts as 1 + ``_RESWEEP``); ``Percussions.ok`` is False then, unless the residual is below
``accept`` (a looser bound: a contact on the stick–slip boundary of a stack stalls both methods
near 1e-6 of the largest percussion), and the caller returns the result code.

**Derivatives.** The fixed point is differentiated by the implicit function theorem on the
natural map F(P) = P − prox(P − r ξ(P)) (``rbjax._engine.newton.implicit_root``): where no
contact switches (strictly sticking or sliding, strictly open or closed), F is smooth in P and
in the data and the derivative is the one of the exact solution; on a switch (P_N = 0 = ξ_N,
or |P_T| = μ P_N with ξ_T = 0) the solution is not differentiable and the derivative returned is
the one-sided one JAX's conventions for max and the norm pick.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._engine.newton import implicit_root

_TINY = 1e-300
_SWEEPS_FIRST = 50  # Gauss–Seidel sweeps before the Newton steps begin
_RESWEEP = 10  # Gauss–Seidel sweeps after each Newton step
_STALL = 0.9  # a Newton step that keeps more than this share of the residual ends the solve
_NEWTON_MAX = 16  # the closed contacts a Newton step solves for, at most (_newton_step)
_WINDOW, _SLOW = 5, 0.5  # Gauss–Seidel hands over to Newton when a window of sweeps ...
# ... keeps more than this share of the residual (measured: two resting cubes, whose contacts
# on the stick-slip boundary stall the sweeps, spent 50 sweeps in 17 % of their steps)
_BACKTRACK = 0.5 ** np.arange(12.0)


def prox_normal(x):
    """prox onto ℝ⁺: max(x, 0)."""
    return jnp.maximum(x, 0.0)


def prox_disc(x, radius):
    """The closest point of the disc |y| ≤ radius (radius ≥ 0) to x (..., 2): x itself inside,
    x · radius/|x| outside. The norm is taken safely (finite derivative at x = 0)."""
    sq = jnp.sum(x * x, axis=-1, keepdims=True)
    norm = jnp.sqrt(jnp.where(sq > 0, sq, 1.0))
    r = jnp.asarray(radius)[..., None]
    return jnp.where((sq > 0) & (norm > r), x * (r / jnp.where(sq > 0, norm, 1.0)), x)


class Percussions(eqx.Module):
    """The solution of one contact problem: ``P`` (m, 3) the percussions (normal, tangent 1,
    tangent 2) of each contact, ``gamma`` (m, 3) the contact velocities after the step,
    ``residual`` the natural-map residual it stopped at, ``sweeps`` the Gauss–Seidel sweeps,
    ``ok`` whether the residual met the tolerance."""

    P: jax.Array
    gamma: jax.Array
    residual: jax.Array
    sweeps: jax.Array
    ok: jax.Array


class _Data(eqx.Module):
    G: jax.Array  # (3m, 3m)
    gamma_free: jax.Array  # (m, 3)
    gamma_minus: jax.Array  # (m, 3)
    mu: jax.Array  # (m,)
    e_n: jax.Array  # (m,)
    e_t: jax.Array  # (m,)
    closed: jax.Array  # (m,) bool


def _xi(d: _Data, P):
    """ξ = γ⁺ + e γ⁻ (m, 3) for percussions P (m, 3)."""
    m = P.shape[0]
    gamma = d.gamma_free + (d.G @ P.reshape(3 * m)).reshape(m, 3)
    e = jnp.stack([d.e_n, d.e_t, d.e_t], axis=-1)
    return gamma + e * d.gamma_minus, gamma


def _steps(d: _Data):
    """r (m, 2): 1/G_NN and 1/max(G_T1T1, G_T2T2) per contact."""
    diag = jnp.diagonal(d.G).reshape(-1, 3)
    tangent = jnp.maximum(diag[:, 1], diag[:, 2])
    # a frictionless row set (a joint limit) has no tangent directions: G_TT = 0, P_T = 0
    # and a contact that no motion of the system moves (two shapes on the world, or on a body
    # fixed to it) has G_NN = 0: it takes no percussion either (r = 0 keeps P = 0)
    inv = lambda x: jnp.where(x > 0, 1.0 / jnp.where(x > 0, x, 1.0), 0.0)  # noqa: E731
    return jnp.stack([inv(diag[:, 0]), inv(tangent)], axis=-1)


def _prox_one(z, mu, closed):
    """The laws' prox for ONE contact at z = P − r ξ (3,): (prox_ℝ⁺(z_N), prox_D(μ P_N)(z_T)),
    0 for an open contact."""
    pn = prox_normal(z[0])
    out = jnp.concatenate([pn[None], prox_disc(z[1:], mu * pn)])
    return jnp.where(closed, out, 0.0)


def _z(d: _Data, P, r):
    """z = P − r ξ(P) (m, 3): the normal scaled by r_N, the tangents by r_T."""
    xi, _ = _xi(d, P)
    return P - jnp.concatenate([r[:, :1], r[:, 1:2], r[:, 1:2]], axis=-1) * xi


def _prox_all(d: _Data, P, r):
    """prox(P − r ξ(P)) for every contact at once (open contacts: 0)."""
    return jax.vmap(_prox_one)(_z(d, P, r), d.mu, d.closed)


def natural_map(P, d: _Data):
    """F(P) = P − prox(P − r ξ(P)): zero exactly at the percussions that satisfy the laws."""
    return P - _prox_all(d, P, _steps(d))


def _sweep(d: _Data, P, r, order):
    """One projected Gauss–Seidel sweep over the contacts (module docstring), the closed ones
    in ``order`` (``_closed_order``, computed once per solve: the closed set does not change
    within it, and XLA recomputed the ordering's running count at every sweep)."""
    m = P.shape[0]
    e = jnp.stack([d.e_n, d.e_t, d.e_t], axis=-1)
    G = d.G.reshape(m, 3, m, 3)

    def one(i, P):
        gamma = d.gamma_free[i] + jnp.einsum("ajb,jb->a", G[i], P)
        xi = gamma + e[i] * d.gamma_minus[i]
        pn = prox_normal(P[i, 0] - r[i, 0] * xi[0])
        # the tangents with the new normal percussion in place
        gamma_t = xi[1:] + G[i, 1:, i, 0] * (pn - P[i, 0])
        pt = prox_disc(P[i, 1:] - r[i, 1] * gamma_t, d.mu[i] * pn)
        new = jnp.where(d.closed[i], jnp.concatenate([pn[None], pt]), 0.0)
        return P.at[i].set(new)

    # over the closed contacts only, in their order (an open one keeps P = 0, set by _solve):
    # most candidates of a scene are open, and each visit is a sequential step (measured: two
    # resting cubes, 13 of 42 candidates closed)
    return jax.lax.fori_loop(0, jnp.sum(d.closed), lambda j, P: one(order[j], P), P)


def _closed_order(d: _Data):
    """The indices of the closed contacts first, in their order (m,): the j-th closed contact
    is the one whose running count of closed contacts reaches j + 1 (a one-hot sum, not a sort:
    XLA's sort of a batch of flags took 56 µs a step at B = 64, measured)."""
    m = d.closed.shape[0]
    rank = jnp.cumsum(d.closed) - 1  # the place of each closed contact among them
    hit = d.closed[None, :] & (rank[None, :] == jnp.arange(m)[:, None])  # (place, contact)
    return jnp.sum(jnp.where(hit, jnp.arange(m)[None, :], 0), axis=1)


def _newton_step(d: _Data, P, r, residual, closed_order):
    """One semi-smooth Newton step on the natural map from P (module docstring): the
    least-squares step of its generalized Jacobian (redundant contacts make it singular), the
    best of the step lengths 1, 1/2, …, 1/2¹¹ by the residual, then ``_RESWEEP`` sweeps.

    The step is solved on the closed contacts only (an open one has F = P = 0 and an identity
    row, so its step is 0 and the others' least-squares problem is the closed block's): the
    first ``_NEWTON_MAX`` of them, in a padded block of static size (measured: two cubes'
    126 × 126 SVD took 2.5 ms, 13 of 42 contacts closed). Beyond that many closed contacts
    the step leaves the others alone, which the residual test of the step lengths and the
    sweeps after it absorb."""
    m = P.shape[0]
    K = min(m, _NEWTON_MAX)
    F = natural_map(P, d)
    order = closed_order[:K]
    valid = jnp.arange(K) < jnp.sum(d.closed)
    J = _natural_jacobian(d, P, r, order)  # (K, 3, K, 3)
    eye = jnp.eye(3 * K, dtype=P.dtype).reshape(K, 3, K, 3)
    J = jnp.where(valid[:, None, None, None] & valid[None, None, :, None], J, eye)
    Fc = jnp.where(valid[:, None], F[order], 0.0)
    sc = jnp.linalg.lstsq(J.reshape(3 * K, 3 * K), Fc.reshape(3 * K))[0].reshape(K, 3)
    step = jnp.zeros_like(P).at[order].add(jnp.where(valid[:, None], sc, 0.0))
    trials = P - jnp.asarray(_BACKTRACK, P.dtype)[:, None, None] * step
    best = trials[jnp.argmin(jax.vmap(residual)(trials))]
    return jax.lax.fori_loop(0, _RESWEEP, lambda _, x: _sweep(d, x, r, closed_order), best)


def _natural_jacobian(d: _Data, P, r, idx):
    """∂F_i/∂P_j (K, 3, K, 3) of the natural map F(P) = P − prox(z(P)), z = P − r ξ(P), for
    the contacts i, j in ``idx`` (K,), in closed form: I − D (I − r G) with D the
    block-diagonal derivative of the prox at z (3 × 3 per contact, by forward mode: the
    generalized Jacobian JAX's max and norm pick). Not the Jacobian of the whole map by forward
    mode: that multiplies G by a 3m × 3m identity, a product XLA hoists out of the loop and
    ran every step (measured: 1/5 of a resting box's step at B = 64)."""
    m, K = P.shape[0], idx.shape[0]
    D = jax.vmap(jax.jacfwd(_prox_one))(_z(d, P, r)[idx], d.mu[idx], d.closed[idx])
    rows = jnp.concatenate([r[:, :1], r[:, 1:2], r[:, 1:2]], axis=-1)[idx]  # (K, 3)
    rG = rows[:, :, None, None] * d.G.reshape(m, 3, m, 3)[idx][:, :, idx]  # r G
    eye = jnp.eye(3 * K, dtype=P.dtype).reshape(K, 3, K, 3)
    return eye - jnp.einsum("iab,ibjc->iajc", D, eye - rG)


def _solve(d: _Data, P0, tol, max_iter, accept=None, floor=0.0):
    r = _steps(d)
    order = _closed_order(d)
    # the size of the percussions that the data ask for, from the closed contacts only (an
    # open candidate far away must not loosen the tolerance)
    closed = d.closed[:, None]
    diag = jnp.diagonal(d.G).reshape(-1, 3)
    data = jnp.maximum(jnp.max(jnp.where(closed, jnp.abs(d.gamma_free), 0.0)), floor)
    scale = data / (jnp.max(jnp.where(closed, diag, 0.0)) + _TINY) + _TINY

    def residual(P):
        return jnp.max(jnp.abs(natural_map(P, d)))

    def unmet(P, res):
        return res > tol * (jnp.max(jnp.abs(P)) + scale)

    bound = tol if accept is None else max(tol, accept)

    def acceptable(P, res):
        return res <= bound * (jnp.max(jnp.abs(P)) + scale)

    def sweeps(carry):
        P, _, k, anchor, _ = carry
        P = _sweep(d, P, r, order)
        res, k = residual(P), k + 1
        # slow: the residual fell by less than half over the last _WINDOW sweeps (a rate
        # worse than 0.87 a sweep)
        check = k % _WINDOW == 0
        return P, res, k, jnp.where(check, res, anchor), check & (res > _SLOW * anchor)

    def gauss_seidel(P, res, k, cap, stop_when_slow):
        return jax.lax.while_loop(
            lambda c: unmet(c[0], c[1]) & (c[2] < cap) & ~(c[4] & stop_when_slow(c[0], c[1])),
            sweeps,
            (P, res, k, res, jnp.asarray(False)),
        )[:3]

    # 1. sweeps, until they are slow (then Newton takes over) or _SWEEPS_FIRST
    P0 = jnp.where(d.closed[:, None], P0, 0.0)  # an open contact has none (the sweeps skip it)
    if P0.ndim == 3:  # candidate starts: the one nearest to solving the laws
        P0 = P0[jnp.argmin(jax.vmap(residual)(P0))]
    carry = gauss_seidel(
        P0, residual(P0), jnp.asarray(0), min(max_iter, _SWEEPS_FIRST), lambda P, res: True
    )

    def polish(carry):
        P, res, k, _ = carry
        trial = _newton_step(d, P, r, residual, order)
        res_trial = residual(trial)
        better = res_trial < res
        # stalled: a Newton step and its sweeps took off less than a tenth of the residual
        new = jnp.where(better, trial, P)
        return new, jnp.minimum(res, res_trial), k + 1 + _RESWEEP, res_trial > _STALL * res

    # 2. Newton steps while each takes off a tenth of the residual
    P, res, k, _ = jax.lax.while_loop(
        lambda c: unmet(c[0], c[1]) & (c[2] < max_iter) & ~c[3],
        polish,
        (*carry, jnp.asarray(False)),
    )
    # 3. sweeps again where Newton stalled above ``accept`` (an active set it cannot settle:
    # three cubes stacked stalled at 3.5e-4 of the largest percussion, and the sweeps then
    # reach 1e-5 in about 600); they end where they are slow below ``accept`` (a contact on
    # the stick-slip boundary of a stack stalls both methods near 1.6e-6, measured)
    P, res, k = gauss_seidel(P, res, k, max_iter, acceptable)
    return P, (res, k, acceptable(P, res))


def percussions(
    G,
    gamma_free,
    gamma_minus,
    mu,
    restitution,
    closed,
    *,
    tangential_restitution: jax.typing.ArrayLike = 0.0,
    tol: float = 1e-10,
    max_iter: int = 200,
    accept: float | None = None,
    floor: float = 0.0,
    initial=None,
) -> Percussions:
    """The percussions of one Moreau–Jean step of ONE system (module docstring).

    ``G`` (3m, 3m) the Delassus matrix, rows and columns ordered (normal, tangent 1, tangent 2)
    per contact; ``gamma_free`` and ``gamma_minus`` (m, 3) the contact velocities without
    percussion and before the step; ``mu``, ``restitution`` (normal) and
    ``tangential_restitution`` per contact (m,) or scalars; ``closed`` (m,) which contacts take
    part (the others get P = 0); ``initial`` (m, 3) a warm start (default 0), or (c, m, 3)
    candidate starts, of which the solve begins at the one with the least natural-map
    residual. ``tol`` the
    natural-map tolerance, relative to the percussions' size; ``max_iter`` the sweeps at most;
    ``accept`` (≥ tol; default tol) the residual, relative as tol, below which a solve that
    stopped at ``max_iter`` still counts as converged (``ok``); ``floor`` the least size of
    γ_free the tolerance is relative to (a problem whose data are rounding noise, the
    projection of a resting body with gaps of ±1 ulp, is solved to tol·floor, not to ulps).
    Differentiable by the implicit function theorem (module docstring)."""
    gamma_free = jnp.asarray(gamma_free)
    m = gamma_free.shape[0]
    dt = gamma_free.dtype
    vec = lambda x: jnp.broadcast_to(jnp.asarray(x, dt), (m,))  # noqa: E731
    d = _Data(
        jnp.asarray(G, dt),
        gamma_free,
        jnp.asarray(gamma_minus, dt),
        vec(mu),
        vec(restitution),
        vec(tangential_restitution),
        jnp.broadcast_to(jnp.asarray(closed, bool), (m,)),
    )
    P0 = jnp.zeros((m, 3), dt) if initial is None else jnp.asarray(initial, dt)
    P, (res, k, ok) = implicit_root(
        (d, jax.lax.stop_gradient(P0)),
        residual=_residual,
        solve=lambda args: _solve(args[0], args[1], tol, max_iter, accept, floor),
        tangent_solve=_tangent_solve,
    )
    _, gamma = _xi(d, P)
    return Percussions(P, gamma, res, k, ok)


def _residual(P, args):
    return natural_map(P, args[0])


def _tangent_solve(g, y, z, args, aux):
    """Solve g(x) = y for the linear map g = ∂F/∂P at the solution, densely (3m unknowns), in
    the least-squares sense: a redundant contact set (a box on four corners: four normal rows
    for three DOFs) makes ∂F/∂P singular, its split of the percussions is not unique, and the
    minimum-norm tangent is the one whose generalized-force and velocity derivatives are
    right (W dP is unique where dP is not)."""
    n = z.size
    basis = jnp.eye(n, dtype=z.dtype).reshape((n,) + z.shape)
    J = jax.vmap(g)(basis).reshape(n, n).T  # column k = g(e_k)
    return jnp.linalg.lstsq(J, y.reshape(n))[0].reshape(z.shape)
