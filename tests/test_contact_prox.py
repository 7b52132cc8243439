"""The percussions of one Moreau–Jean step (rbjax/_contact/prox.py) against answers it did not
compute: scipy's bounded least squares for the frictionless problem (an LCP), the closed form
of one contact, the closed-form velocities of a box landing flat on four corners (a statically
indeterminate, redundant contact set), the laws themselves checked at the solution, and the
derivatives against the closed forms."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
import scipy.optimize

from rbjax._contact.prox import natural_map, percussions, prox_disc

jax.config.update("jax_enable_x64", True)


def _spd(rng, n, cond=30.0):
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return q @ np.diag(np.geomspace(1.0, cond, n)) @ q.T


def test_frictionless_contacts_solve_the_lcp_as_scipy_does():
    """μ = 0, e = 0: the normal percussions solve the LCP P ≥ 0, γ = G P + c ≥ 0, Pᵀγ = 0, which
    is the bounded least-squares problem min |Lᵀ P + L⁻¹ c|², P ≥ 0 (G = L Lᵀ): scipy's
    lsq_linear at 1e-12. Open contacts get nothing."""
    rng = np.random.default_rng(3)
    m = 5
    G = _spd(rng, 3 * m)
    c = rng.standard_normal((m, 3))
    closed = np.array([True, True, True, True, False])
    out = jax.jit(lambda g, c: percussions(g, c, c, 0.0, 0.0, closed, tol=1e-13, max_iter=2000))(
        G, c
    )
    assert bool(out.ok), out.residual
    rows = np.arange(0, 3 * m, 3)[closed]
    A, b = G[np.ix_(rows, rows)], c[closed, 0]
    L = scipy.linalg.cholesky(A, lower=True)
    ref = scipy.optimize.lsq_linear(
        L.T, -scipy.linalg.solve_triangular(L, b, lower=True), bounds=(0, np.inf), tol=1e-14
    ).x
    P = np.asarray(out.P)
    np.testing.assert_allclose(P[closed, 0], ref, atol=1e-9)
    assert np.all(P[:, 1:] == 0.0) and np.all(P[~closed] == 0.0)
    gamma_n = np.asarray(out.gamma)[closed, 0]
    assert np.all(gamma_n >= -1e-9) and abs(gamma_n @ P[closed, 0]) <= 1e-9
    pn = P[closed, 0]
    assert int(out.sweeps) >= 2 and np.any(pn == 0.0) and np.any(pn > 0.1)  # both kinds


@pytest.mark.parametrize(
    "case, gamma_t, e",
    [("stick", [0.3, -0.1], 0.0), ("slide", [2.0, 1.5], 0.0), ("bounce", [0.3, 0.0], 0.7)],
)
def test_one_contact_matches_the_closed_form(case, gamma_t, e):
    """One contact with G = g·1: P_N = max(0, −(1 + e)γ⁻_N/g) for γ_free = γ⁻; it sticks
    (P_T = −γ_T/g) when |γ_T| ≤ μ g P_N, else slides with P_T = −μ P_N γ_T/|γ_T|. A separating
    contact gets nothing."""
    g, mu = 2.0, 0.4
    gamma = np.array([[-1.5, *gamma_t]])
    out = percussions(np.eye(3) * g, gamma, gamma, mu, e, [True])
    pn = (1 + e) * 1.5 / g
    gt = np.asarray(gamma_t)
    pt = -gt / g if np.linalg.norm(gt) <= mu * g * pn else -mu * pn * gt / np.linalg.norm(gt)
    np.testing.assert_allclose(np.asarray(out.P)[0], [pn, *pt], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(np.asarray(out.gamma)[0, 0], e * 1.5, rtol=1e-12)
    apart = percussions(np.eye(3) * g, -gamma, -gamma, mu, e, [True])
    assert np.all(np.asarray(apart.P) == 0.0)


# ------------------------------------------------------------------ a box landing on 4 corners

MASS, HALF = 2.0, np.array([0.3, 0.2, 0.1])  # kg; half extents [m]
INERTIA = (
    MASS
    / 3.0
    * np.array(
        [HALF[1] ** 2 + HALF[2] ** 2, HALF[0] ** 2 + HALF[2] ** 2, HALF[0] ** 2 + HALF[1] ** 2]
    )
)


def _box(v_com, mu):
    """G, γ⁻ of a box (velocity (v, ω) of its centre of mass, M = diag(m 1, Θ)) touching a
    plane z = 0 with its four lower corners, normal +z, tangents x and y."""
    corners = [np.array([sx * HALF[0], sy * HALF[1], -HALF[2]]) for sx in (-1, 1) for sy in (-1, 1)]
    W = []
    for r in corners:
        for d in np.eye(3)[[2, 0, 1]]:  # normal z, tangents x, y
            W.append(np.concatenate([d, np.cross(r, d)]))  # contact velocity d·(v + ω × r)
    W = np.array(W).T  # (6, 12)
    Minv = np.diag(np.concatenate([np.full(3, 1 / MASS), 1 / INERTIA]))
    G = W.T @ Minv @ W
    u = jnp.concatenate([jnp.asarray(v_com, float), jnp.zeros(3)])
    gamma = (W.T @ u).reshape(4, 3)
    return G, gamma, W, Minv


@pytest.mark.parametrize("vx", [0.5, 3.0])  # sticks: μ v_z ≥ v_x; slides: μ v_z < v_x
def test_a_box_landing_flat_stops_and_slides_as_the_closed_form_says(vx):
    """A box falling flat (v_z = −2 m/s, no spin) and moving sideways lands on four corners, a
    redundant set (4 normal rows for 3 DOFs). Fully plastic (e = 0): it stops vertically and does
    not tilt (ω = 0 after), and its sideways speed becomes max(0, v_x − μ v_z), the total
    friction percussion being min(m v_x, μ m v_z), whatever the indeterminate split among the
    corners. The laws hold at every corner, and so does the solution under vmap."""
    mu, vz = 0.5, 2.0
    G, gamma, W, Minv = _box(np.array([vx, 0.0, -vz]), mu)
    out = jax.jit(
        lambda g, c: percussions(g, c, c, mu, 0.0, np.ones(4, bool), tol=1e-12, max_iter=5000)
    )(G, gamma)
    assert bool(out.ok), (out.residual, out.sweeps)
    P = np.asarray(out.P)
    u1 = np.concatenate([[vx, 0.0, -vz], np.zeros(3)]) + Minv @ W @ P.reshape(12)
    np.testing.assert_allclose(u1, [max(0.0, vx - mu * vz), 0, 0, 0, 0, 0], atol=1e-9)
    assert np.sum(P[:, 0]) == pytest.approx(MASS * vz, rel=1e-10)
    _laws_hold(P, np.asarray(out.gamma), mu)
    batch = jax.vmap(
        lambda c: percussions(G, c, c, mu, 0.0, np.ones(4, bool), tol=1e-12, max_iter=5000).gamma
    )(jnp.stack([gamma, 2 * gamma]))
    np.testing.assert_allclose(batch[0], out.gamma, atol=1e-9)


def _laws_hold(P, gamma, mu, tol=1e-8):
    """Signorini (e = 0) and Coulomb, checked as the laws, not as the iteration: P_N ≥ 0,
    γ_N ≥ 0, P_N γ_N = 0; |P_T| ≤ μ P_N; sticking (|P_T| < μ P_N) ⇒ γ_T = 0; sliding ⇒ P_T
    opposes γ_T."""
    pn, pt, gn, gt = P[:, 0], P[:, 1:], gamma[:, 0], gamma[:, 1:]
    assert np.all(pn >= -tol) and np.all(gn >= -tol) and np.all(np.abs(pn * gn) <= tol)
    size = np.linalg.norm(pt, axis=1)
    assert np.all(size <= mu * pn + tol)
    stick = size < mu * pn - 1e-6
    assert np.all(np.linalg.norm(gt[stick], axis=1) <= tol)
    slide = ~stick & (pn > tol)
    cross = gt[slide, 0] * pt[slide, 1] - gt[slide, 1] * pt[slide, 0]
    assert np.all(np.abs(cross) <= tol) and np.all(np.sum(gt[slide] * pt[slide], axis=1) <= tol)


def test_derivatives_follow_the_closed_form():
    """By the implicit function theorem through the fixed point: a sliding box's speed after
    landing, v_x − μ v_z, has d/dμ = −v_z and d/dv_z = −μ (through the redundant corner set,
    whose split is not unique: the tangent solve takes the least-squares solution); one
    contact's normal percussion (1 + e)|γ⁻|/g has d/de = |γ⁻|/g. Forward and reverse mode."""
    vx, vz, mu = 3.0, 2.0, 0.5
    closed = np.ones(4, bool)

    def speed(mu, vz):
        G, gamma, W, Minv = _box(jnp.array([vx, 0.0, -vz]), mu)
        out = percussions(G, gamma, gamma, mu, 0.0, closed, tol=1e-12, max_iter=5000)
        return vx + (Minv @ W @ out.P.reshape(12))[0]

    d_mu, d_vz = jax.jit(jax.grad(speed, argnums=(0, 1)))(mu, vz)
    assert float(d_mu) == pytest.approx(-vz, rel=1e-8)
    assert float(d_vz) == pytest.approx(-mu, rel=1e-8)
    tangent = jax.jit(lambda m: jax.jvp(lambda x: speed(x, vz), (m,), (1.0,))[1])(mu)
    assert float(tangent) == pytest.approx(-vz, rel=1e-8)

    gamma = jnp.array([[-1.5, 0.0, 0.0]])
    pn = lambda e: percussions(2.0 * jnp.eye(3), gamma, gamma, 0.3, e, [True]).P[0, 0]  # noqa: E731
    assert float(jax.jit(jax.grad(pn))(0.6)) == pytest.approx(1.5 / 2.0, rel=1e-10)


def test_the_natural_map_vanishes_at_the_solution_and_a_short_budget_is_flagged():
    """F(P) = 0 at the solution (to the tolerance), whatever r; one sweep of the coupled box
    problem is not enough, and ``ok`` says so. The disc's prox keeps inside points and scales
    outside ones onto the rim."""
    G, gamma, _, _ = _box(np.array([3.0, 0.0, -2.0]), 0.5)
    from rbjax._contact.prox import _Data

    full = percussions(G, gamma, gamma, 0.5, 0.0, np.ones(4, bool), tol=1e-12, max_iter=5000)
    d = _Data(
        jnp.asarray(G),
        jnp.asarray(gamma),
        jnp.asarray(gamma),
        jnp.full(4, 0.5),
        jnp.zeros(4),
        jnp.zeros(4),
        jnp.ones(4, bool),
    )
    assert float(jnp.max(jnp.abs(natural_map(full.P, d)))) <= 1e-10
    short = percussions(G, gamma, gamma, 0.5, 0.0, np.ones(4, bool), tol=1e-12, max_iter=1)
    assert not bool(short.ok) and int(short.sweeps) == 1
    np.testing.assert_allclose(prox_disc(jnp.array([3.0, 4.0]), 2.5), [1.5, 2.0], rtol=1e-15)
    np.testing.assert_allclose(prox_disc(jnp.array([0.3, 0.4]), 2.5), [0.3, 0.4], rtol=1e-15)


def test_the_newton_jacobian_in_closed_form_is_forward_modes():
    """The Newton step's ∂F/∂P, I − D (I − r G) from the prox's 3 × 3 derivatives, equals the
    forward-mode Jacobian of the whole natural map, on random data with open, sticking and
    sliding contacts, for every contact and for a subset in another order."""
    from rbjax._contact import prox

    rng = np.random.default_rng(3)
    m = 6
    A = rng.normal(size=(3 * m, 5))
    d = prox._Data(
        jnp.asarray(A @ A.T),
        jnp.asarray(rng.normal(size=(m, 3))),
        jnp.asarray(rng.normal(size=(m, 3))),
        jnp.full(m, 0.4),
        jnp.full(m, 0.3),
        jnp.zeros(m),
        jnp.asarray([True, True, False, True, True, False]),
    )
    P = jnp.asarray(np.abs(rng.normal(size=(m, 3))))
    r = prox._steps(d)
    full = jax.jacfwd(prox.natural_map)(P, d)  # (m, 3, m, 3)
    np.testing.assert_allclose(prox._natural_jacobian(d, P, r, jnp.arange(m)), full, atol=1e-14)
    idx = jnp.asarray([4, 0, 3])
    np.testing.assert_allclose(
        prox._natural_jacobian(d, P, r, idx), full[idx][:, :, idx], atol=1e-14
    )
    np.testing.assert_array_equal(prox._closed_order(d)[:4], [0, 1, 3, 4])
