"""The four basic constraints DP1, DP2, D, CD (Negrut ME751) against hand-written NumPy formulas.

rbjax derives Φ_q, [Φ_r, Φ_π̄] and γ by autodiff of the residual alone (rbjax/_constraints.py).
Here every reference is written out independently in plain NumPy in the ME751 notation of
Negrut ME751, without any rbjax function:

    A(p) = E(p) G(p)ᵀ,  E(p) = [−e, ẽ + e0 I],  G(p) = [−e, −ẽ + e0 I],
    B(p, ā) = ∂(A(p) ā)/∂p = 2 [(e0 I + ẽ) ā,  e āᵀ − (e0 I + ẽ) ã],
    a_i = A_i ā_i,  d_ij = r_j + A_j s̄_j − r_i − A_i s̄_i.

δp flavour (Negrut ME751, "the δp flavor" slides), δπ̄ flavour (δA = A δπ̄~, so δ(A s̄) = −A s̄~ δπ̄),
and γ = −Φ̈|_{q̈=0} written with B(ṗ, ·)ṗ, which is exact because A(p) s̄ is quadratic in p.

Discrepancies found in the seed text (OCR of the slides), checked numerically below:
* DP2, δπ̄ flavour: the seed prints the body-i rotational term as
  "(a_iᵀ A_i − d_ijᵀ A_i) s̃_i^P". From δ(a_iᵀ d) = a_iᵀ δd + dᵀ δa_i with
  δd ∋ +A_i s̃̄_i δπ̄_i and δa_i = −A_i ã̄_i δπ̄_i, the correct term is
  a_iᵀ A_i s̃̄_i − d_ijᵀ A_i ã̄_i (the d-term carries ā_i, not s̄_i). The corrected formulas
  are validated by finite rotations (``test_reference_pi_jacobian_matches_finite_rotations``);
  the printed one disagrees with both them and rbjax (``test_seed_printed_dp2_pi_term_is_wrong``).
* DP2, δp flavour: the seed prints "d_ijᵀ B(p_i, s̄_i^P) − a_iᵀ B(p_i, s̄_i^P)"; the first B must
  be B(p_i, ā_i) (the same ā ↔ s̄ slip). Checked in ``test_seed_printed_dp2_p_term_is_wrong``.
* Minor OCR garbling without consequence: DP1 δπ̄ prints "δπ̃_j δπ̄_j" for "ã̄_j δπ̄_j"; CD δπ̄
  prints s̃_i^Q for s̃_j^Q in its last line.
"""

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close

from rbjax import GROUND
from rbjax.advanced import (
    CD,
    DP1,
    DP2,
    D,
    constraint_gamma,
    constraint_jacobian,
    constraint_jacobian_pi,
    constraint_residual,
)

NB = 2
I3 = np.eye(3)
KINDS = ("DP1", "DP2", "D", "CD")
# (body_i, body_j) pairs. (GROUND, 0) leaves the LAST body unused, so a GROUND -> q[-1]
# indexing slip would show up (wrong residual and non-zero columns of body NB - 1).
PAIRS = [(0, 1), (1, 0), (GROUND, 0), (1, GROUND), (1, 1)]
N_CONFIGS = 20


# ------------------------------------------------------------------ NumPy reference (Negrut ME751)


def skew(x):
    return np.array([[0.0, -x[2], x[1]], [x[2], 0.0, -x[0]], [-x[1], x[0], 0.0]])


def E_np(p):
    return np.hstack([-p[1:, None], skew(p[1:]) + p[0] * I3])


def G_np(p):
    return np.hstack([-p[1:, None], -skew(p[1:]) + p[0] * I3])


def A_np(p):
    return E_np(p) @ G_np(p).T


def B_np(p, a):
    m = p[0] * I3 + skew(p[1:])
    return 2.0 * np.hstack([(m @ a)[:, None], np.outer(p[1:], a) - m @ skew(a)])


def qmul_np(a, b):
    """Hamilton product, scalar first: (a0 b0 − a·b, a0 b + b0 a + a × b)."""
    return np.concatenate(
        [[a[0] * b[0] - a[1:] @ b[1:]], a[0] * b[1:] + b[0] * a[1:] + np.cross(a[1:], b[1:])]
    )


def f_np(t):
    return 0.3 * np.sin(2.0 * t) + 0.1 * t**2


def fdd_np(t):
    return -1.2 * np.sin(2.0 * t) + 0.2


def f_jax(t):
    return 0.3 * jnp.sin(2.0 * t) + 0.1 * t**2


def body(q, k):
    """(r, p) of body k, with GROUND = world frame r = 0, p = (1, 0, 0, 0)."""
    if k == GROUND:
        return np.zeros(3), np.array([1.0, 0.0, 0.0, 0.0])
    return q[k, 0:3], q[k, 3:7]


def bvel(qd, k):
    if k == GROUND:
        return np.zeros(3), np.zeros(4)
    return qd[k, 0:3], qd[k, 3:7]


def random_config(seed, *, unit=True):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(NB, 7))
    q[:, 3:7] /= np.linalg.norm(q[:, 3:7], axis=1, keepdims=True)
    if not unit:
        q[:, 3:7] *= rng.uniform(0.5, 1.6, size=(NB, 1))
    bi, bj = PAIRS[seed % len(PAIRS)]
    return dict(
        q=q,
        bi=bi,
        bj=bj,
        a_i=rng.normal(size=3),
        a_j=rng.normal(size=3),
        s_i=rng.normal(size=3),
        s_j=rng.normal(size=3),
        c=rng.normal(size=3),
        t=float(rng.uniform(-2.0, 2.0)),
        rdot=rng.normal(size=(NB, 3)),
        pdot=rng.normal(size=(NB, 4)),
        omega=rng.normal(size=(NB, 3)),
    )


def make(kind, cfg, driven=False):
    kw = {"f": f_jax} if driven else {}
    bi, bj = cfg["bi"], cfg["bj"]
    if kind == "DP1":
        return DP1(bi, cfg["a_i"], bj, cfg["a_j"], **kw)
    if kind == "DP2":
        return DP2(bi, cfg["a_i"], cfg["s_i"], bj, cfg["s_j"], **kw)
    if kind == "D":
        return D(bi, cfg["s_i"], bj, cfg["s_j"], **kw)
    return CD(cfg["c"], bi, cfg["s_i"], bj, cfg["s_j"], **kw)


def geometry(cfg, q):
    ri, pi = body(q, cfg["bi"])
    rj, pj = body(q, cfg["bj"])
    Ai, Aj = A_np(pi), A_np(pj)
    ai, aj = Ai @ cfg["a_i"], Aj @ cfg["a_j"]
    d = rj + Aj @ cfg["s_j"] - ri - Ai @ cfg["s_i"]
    return ri, pi, rj, pj, Ai, Aj, ai, aj, d


def residual_np(kind, cfg, q, t, driven=False):
    *_, ai, aj, d = geometry(cfg, q)
    f = f_np(t) if driven else 0.0
    val = {"DP1": ai @ aj, "DP2": ai @ d, "D": d @ d, "CD": cfg["c"] @ d}[kind]
    return np.array([val - f])


def scatter(cfg, width, blocks):
    """Place the (1 x width) blocks (i-part, j-part) into an (1, NB, width) Jacobian."""
    out = np.zeros((1, NB, width))
    for k, blk in zip((cfg["bi"], cfg["bj"]), blocks, strict=True):
        if k != GROUND:
            out[0, k] += blk  # += so that body_i == body_j sums both contributions
    return out


def jac_p_np(kind, cfg, q, *, seed_typo=False):
    """Φ_q in the δp flavour (Negrut ME751): per body [Φ_r (3), Φ_p (4)]."""
    _, pi, _, pj, _, _, ai, aj, d = geometry(cfg, q)
    c, abi, abj, si, sj = cfg["c"], cfg["a_i"], cfg["a_j"], cfg["s_i"], cfg["s_j"]
    z3 = np.zeros(3)
    if kind == "DP1":
        bi, bj = (z3, aj @ B_np(pi, abi)), (z3, ai @ B_np(pj, abj))
    elif kind == "DP2":
        # seed prints d_ijᵀ B(p_i, s̄_i) here; the correct vector is ā_i
        first = d @ B_np(pi, si if seed_typo else abi)
        bi, bj = (-ai, first - ai @ B_np(pi, si)), (ai, ai @ B_np(pj, sj))
    elif kind == "D":
        bi, bj = (-2 * d, -2 * d @ B_np(pi, si)), (2 * d, 2 * d @ B_np(pj, sj))
    else:
        bi, bj = (-c, -c @ B_np(pi, si)), (c, c @ B_np(pj, sj))
    return scatter(cfg, 7, [np.concatenate(bi), np.concatenate(bj)])


def jac_pi_np(kind, cfg, q, *, seed_typo=False):
    """[Φ_r, Φ_π̄] in the δπ̄ flavour: δA = A δπ̄~, hence δ(A s̄) = −A s̄~ δπ̄."""
    _, _, _, _, Ai, Aj, ai, aj, d = geometry(cfg, q)
    c, abi, abj, si, sj = cfg["c"], cfg["a_i"], cfg["a_j"], cfg["s_i"], cfg["s_j"]
    z3 = np.zeros(3)
    if kind == "DP1":
        bi, bj = (z3, -aj @ Ai @ skew(abi)), (z3, -ai @ Aj @ skew(abj))
    elif kind == "DP2":
        # δ(a_iᵀd) = a_iᵀ δd + dᵀ δa_i = a_iᵀ[δr_j − A_j s̃_j δπ̄_j − δr_i + A_i s̃_i δπ̄_i]
        #                               − dᵀ A_i ã_i δπ̄_i
        # Negrut ME751 prints (a_iᵀ A_i − d_ijᵀ A_i) s̃_i: the d-term with s̄_i instead of ā_i.
        dterm = d @ Ai @ skew(si if seed_typo else abi)
        bi, bj = (-ai, ai @ Ai @ skew(si) - dterm), (ai, -ai @ Aj @ skew(sj))
    else:
        w = 2 * d if kind == "D" else c
        bi, bj = (-w, w @ Ai @ skew(si)), (w, -w @ Aj @ skew(sj))
    return scatter(cfg, 6, [np.concatenate(bi), np.concatenate(bj)])


def gamma_np(kind, cfg, q, qd, t, driven=False):
    """γ with Φ_q q̈ = γ; ä = B(ṗ, ā) ṗ exactly since A(p) ā is quadratic in p."""
    _, pi, _, pj, _, _, ai, aj, d = geometry(cfg, q)
    rdi, pdi = bvel(qd, cfg["bi"])
    rdj, pdj = bvel(qd, cfg["bj"])
    c, abi, abj, si, sj = cfg["c"], cfg["a_i"], cfg["a_j"], cfg["s_i"], cfg["s_j"]
    adi, adj = B_np(pi, abi) @ pdi, B_np(pj, abj) @ pdj
    dd = rdj + B_np(pj, sj) @ pdj - rdi - B_np(pi, si) @ pdi
    if kind == "DP1":
        g = -ai @ B_np(pdj, abj) @ pdj - aj @ B_np(pdi, abi) @ pdi - 2 * adi @ adj
    elif kind == "DP2":
        g = (
            -ai @ B_np(pdj, sj) @ pdj
            + ai @ B_np(pdi, si) @ pdi
            - d @ B_np(pdi, abi) @ pdi
            - 2 * adi @ dd
        )
    elif kind == "D":
        g = -2 * d @ B_np(pdj, sj) @ pdj + 2 * d @ B_np(pdi, si) @ pdi - 2 * dd @ dd
    else:
        g = c @ B_np(pdi, si) @ pdi - c @ B_np(pdj, sj) @ pdj
    return np.array([g + (fdd_np(t) if driven else 0.0)])


def velocities(cfg, consistent):
    q = cfg["q"]
    if consistent:  # ṗ = ½ p ⊗ (0, ω̄): tangent to the unit sphere
        pdot = np.stack(
            [0.5 * qmul_np(q[k, 3:7], np.concatenate([[0.0], cfg["omega"][k]])) for k in range(NB)]
        )
    else:
        pdot = cfg["pdot"]
    return np.concatenate([cfg["rdot"], pdot], axis=1)


def assert_close_rel(actual, expected, rtol, err_msg=""):
    expected = np.asarray(expected)
    scale = max(1.0, float(np.max(np.abs(expected))))
    assert_close(actual, expected, rtol=rtol, atol=rtol * scale, err_msg=err_msg)


def rotate_body(p, v):
    """p ⊗ exp(v/2): a finite body-frame rotation by the rotation vector v."""
    th = np.linalg.norm(v)
    dq = np.concatenate([[np.cos(th / 2)], np.sin(th / 2) * v / th]) if th else np.eye(4)[0]
    return qmul_np(p, dq)


SEEDS = list(range(N_CONFIGS))


# ------------------------------------------------------- checks of the NumPy reference itself


@pytest.mark.parametrize("seed", SEEDS[:5])
def test_reference_B_is_jacobian_of_A_sbar(seed):
    """My B(p, s̄) against central differences of A(p) s̄ (any p, unit or not)."""
    rng = np.random.default_rng(100 + seed)
    p, s = rng.normal(size=4), rng.normal(size=3)
    h = 1e-6
    fd = np.stack([(A_np(p + h * e) @ s - A_np(p - h * e) @ s) / (2 * h) for e in np.eye(4)], 1)
    assert_close_rel(B_np(p, s), fd, 1e-6)
    # Euler's theorem for the quadratic A(p)s̄: B(p, s̄) p = 2 A(p) s̄
    assert_close_rel(B_np(p, s) @ p, 2 * A_np(p) @ s, 1e-13)
    # for unit p, A = E Gᵀ is a proper rotation and equals the quaternion sandwich p (0,s) p*
    pu = p / np.linalg.norm(p)
    Au = A_np(pu)
    assert_close_rel(Au.T @ Au, I3, 1e-13)
    assert_close_rel(np.linalg.det(Au), 1.0, 1e-13)
    conj = pu * np.array([1.0, -1.0, -1.0, -1.0])
    sandwich = qmul_np(qmul_np(pu, np.concatenate([[0.0], s])), conj)
    assert_close_rel(Au @ s, sandwich[1:], 1e-13)
    # ½ G(p)ᵀ ω̄ = ½ p ⊗ (0, ω̄) (the ṗ used for consistent velocities)
    w = rng.normal(size=3)
    assert_close_rel(0.5 * G_np(pu).T @ w, 0.5 * qmul_np(pu, np.concatenate([[0.0], w])), 1e-13)


@pytest.mark.parametrize("kind", KINDS)
def test_reference_pi_jacobian_matches_finite_rotations(kind):
    """My δπ̄ formulas against central differences under body-frame rotations p ⊗ exp(hε/2)."""
    h = 1e-5
    for seed in SEEDS[:6]:
        cfg = random_config(seed)
        q, t = cfg["q"], cfg["t"]
        fd = np.zeros((1, NB, 6))
        for k in range(NB):
            for m in range(6):
                qp, qm = q.copy(), q.copy()
                if m < 3:
                    qp[k, m] += h
                    qm[k, m] -= h
                else:
                    qp[k, 3:7] = rotate_body(q[k, 3:7], h * I3[m - 3])
                    qm[k, 3:7] = rotate_body(q[k, 3:7], -h * I3[m - 3])
                diff = residual_np(kind, cfg, qp, t) - residual_np(kind, cfg, qm, t)
                fd[0, k, m] = diff[0] / (2 * h)
        assert_close_rel(jac_pi_np(kind, cfg, q), fd, 1e-6, err_msg=f"{kind} seed {seed}")


def test_seed_printed_dp2_pi_term_is_wrong():
    """Seed 004 prints (a_iᵀA_i − d_ijᵀA_i) s̃_i for DP2's Φ_π̄i: it differs from the truth."""
    cfg = random_config(0)  # bodies (0, 1), generic vectors
    good = jac_pi_np("DP2", cfg, cfg["q"])
    typo = jac_pi_np("DP2", cfg, cfg["q"], seed_typo=True)
    assert np.max(np.abs(good - typo)) > 1e-2
    got = np.asarray(constraint_jacobian_pi(make("DP2", cfg), jnp.asarray(cfg["q"]), cfg["t"]))
    assert np.max(np.abs(got - typo)) > 1e-2


def test_seed_printed_dp2_p_term_is_wrong():
    """Seed 004 prints d_ijᵀ B(p_i, s̄_i) for DP2's Φ_pi; it must be d_ijᵀ B(p_i, ā_i)."""
    cfg = random_config(0)
    good = jac_p_np("DP2", cfg, cfg["q"])
    typo = jac_p_np("DP2", cfg, cfg["q"], seed_typo=True)
    assert np.max(np.abs(good - typo)) > 1e-2
    got = np.asarray(constraint_jacobian(make("DP2", cfg), jnp.asarray(cfg["q"]), cfg["t"]))
    assert np.max(np.abs(got - typo)) > 1e-2


# ------------------------------------------------------------------------- rbjax vs reference

VEC_KEYS = ("a_i", "a_j", "s_i", "s_j", "c")


def rb_batch(fn, kind, cases, driven=False):
    """Evaluate ``fn(con, q, qd, t)`` for many (cfg, q, qd, t) cases with rbjax.

    The eager functions dispatch op by op (constraint_jacobian_pi: ~0.25 s a call), so the
    cases are grouped by their (static) body pair and evaluated by ONE eager ``jax.vmap`` per
    group, the constraint being rebuilt inside from the batched vectors. Unbatched and jitted
    calls are compared with the same references in ``test_unbatched_and_jit_calls``.
    """
    out = [None] * len(cases)
    groups = {}
    for n, case in enumerate(cases):
        groups.setdefault((case[0]["bi"], case[0]["bj"]), []).append(n)
    for (bi, bj), idx in groups.items():
        vec = np.stack([np.stack([cases[n][0][k] for k in VEC_KEYS]) for n in idx])
        q = np.stack([cases[n][1] for n in idx])
        qd = np.stack([cases[n][2] for n in idx])
        t = np.array([cases[n][3] for n in idx])

        def one(v, q, qd, t, bi=bi, bj=bj):
            cfg = dict(bi=bi, bj=bj, **{k: v[m] for m, k in enumerate(VEC_KEYS)})
            return fn(make(kind, cfg, driven), q, qd, t)

        res = np.asarray(jax.vmap(one)(*map(jnp.asarray, (vec, q, qd, t))))
        for m, n in enumerate(idx):
            out[n] = res[m]
    return out


def RES(con, q, qd, t):
    return constraint_residual(con, q, t)


def JAC(con, q, qd, t):
    return constraint_jacobian(con, q, t)


def JAC_PI(con, q, qd, t):
    return constraint_jacobian_pi(con, q, t)


def GAMMA(con, q, qd, t):
    return constraint_gamma(con, q, qd, t)


def cases_for(unit=True, consistent=False):
    out = []
    for seed in SEEDS:
        cfg = random_config(seed, unit=unit)
        out.append((cfg, cfg["q"], velocities(cfg, consistent), cfg["t"]))
    return out


@pytest.mark.parametrize("driven", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_residual(kind, driven):
    """Φ = a_i·a_j − f, a_i·d − f, d·d − f, c·d − f, for unit and non-unit p."""
    cases = cases_for(unit=True) + cases_for(unit=False)
    got = rb_batch(RES, kind, cases, driven)
    for (cfg, q, _, t), g in zip(cases, got, strict=True):
        assert g.shape == (1,)
        assert_close_rel(
            g, residual_np(kind, cfg, q, t, driven), 1e-12, f"{kind} {cfg['bi'], cfg['bj']}"
        )


@pytest.mark.parametrize("kind", KINDS)
def test_jacobian_p_flavour(kind):
    """Φ_q (δp flavour) = ME751 B-matrix formulas; exact for unit and non-unit p."""
    cases = cases_for(unit=True) + cases_for(unit=False)
    got = rb_batch(JAC, kind, cases, driven=True)
    for (cfg, q, _, _), g in zip(cases, got, strict=True):
        assert g.shape == (1, NB, 7)
        assert_close_rel(g, jac_p_np(kind, cfg, q), 1e-12, f"{kind} {cfg['bi'], cfg['bj']}")


@pytest.mark.parametrize("kind", KINDS)
def test_jacobian_pi_flavour(kind):
    """[Φ_r, Φ_π̄] (δπ̄ flavour) = formulas from δA = A δπ̄~ (unit quaternions). Also: columns
    of bodies outside the constraint vanish, and Φ_p ṗ = Φ_π̄ ω̄ for ṗ = ½ p ⊗ (0, ω̄)."""
    cases = cases_for(unit=True, consistent=True)
    got = rb_batch(JAC_PI, kind, cases, driven=True)
    got_p = rb_batch(JAC, kind, cases, driven=True)
    for (cfg, q, qd, _), g, gp in zip(cases, got, got_p, strict=True):
        msg = f"{kind} {cfg['bi'], cfg['bj']}"
        assert g.shape == (1, NB, 6)
        assert_close_rel(g, jac_pi_np(kind, cfg, q), 1e-12, msg)
        for k in set(range(NB)) - {cfg["bi"], cfg["bj"]}:
            assert np.all(g[:, k] == 0.0) and np.all(gp[:, k] == 0.0), msg
        nu = np.concatenate([cfg["rdot"], cfg["omega"]], axis=1)
        assert_close_rel(np.einsum("mbk,bk->m", gp, qd), np.einsum("mbk,bk->m", g, nu), 1e-12, msg)


@pytest.mark.parametrize("kind", KINDS)
def test_gamma(kind):
    """γ = ME751 B(ṗ, ·)ṗ formulas (+ f̈ for a driver), for random ṗ, unit-consistent
    ṗ = ½ p ⊗ (0, ω̄), and non-unit p (exact there too: A(p) s̄ = E Gᵀ s̄ is quadratic in p)."""
    cases = (
        cases_for(unit=True)
        + cases_for(unit=True, consistent=True)
        + cases_for(unit=False, consistent=False)
    )
    free = rb_batch(GAMMA, kind, cases, driven=False)
    driven = rb_batch(GAMMA, kind, cases, driven=True)
    for (cfg, q, qd, t), g0, g1 in zip(cases, free, driven, strict=True):
        msg = f"{kind} {cfg['bi'], cfg['bj']}"
        assert g0.shape == (1,) and g1.shape == (1,)
        assert_close_rel(g0, gamma_np(kind, cfg, q, qd, t, False), 1e-12, msg)
        assert_close_rel(g1, gamma_np(kind, cfg, q, qd, t, True), 1e-12, msg)
        assert_close_rel(g1 - g0, [fdd_np(t)], 1e-12, msg)  # the driver only adds f̈(t)


@pytest.mark.parametrize("kind", KINDS)
def test_gamma_finite_difference(kind):
    """γ = −d²/dτ² Φ(q + q̇τ, t + τ) at τ = 0 (NumPy residual, Richardson central difference)."""
    cases = cases_for(unit=True) + cases_for(unit=True, consistent=True)
    got = rb_batch(GAMMA, kind, cases, driven=True)
    h = 1e-2
    for (cfg, q, qd, t), g in zip(cases, got, strict=True):

        def d2(h, cfg=cfg, q=q, qd=qd, t=t):
            phi = [residual_np(kind, cfg, q + s * qd, t + s, driven=True) for s in (h, 0.0, -h)]
            return (phi[0] - 2 * phi[1] + phi[2]) / h**2

        fd = -(4 * d2(h / 2) - d2(h)) / 3
        assert_close_rel(g, fd, 1e-6, f"{kind} {cfg['bi'], cfg['bj']}")


def test_unbatched_and_jit_calls():
    """Plain (unbatched, eager) and jitted calls agree with the references too."""
    for kind in KINDS:
        for seed in (0, 2, 3):  # free-free, GROUND as body i, GROUND as body j
            cfg = random_config(seed)
            con = make(kind, cfg, driven=True)
            q, t = cfg["q"], cfg["t"]
            qd = velocities(cfg, True)
            qj, qdj = jnp.asarray(q), jnp.asarray(qd)
            assert_close_rel(
                constraint_residual(con, qj, t), residual_np(kind, cfg, q, t, True), 1e-12
            )
            assert_close_rel(constraint_jacobian(con, qj, t), jac_p_np(kind, cfg, q), 1e-12)
            assert_close_rel(
                constraint_gamma(con, qj, qdj, t), gamma_np(kind, cfg, q, qd, t, True), 1e-12
            )
    cfg = random_config(2)  # (GROUND, 0)
    con = make("DP2", cfg, driven=True)
    q, t = cfg["q"], cfg["t"]
    qd = velocities(cfg, True)
    assert_close_rel(
        constraint_jacobian_pi(con, jnp.asarray(q), t), jac_pi_np("DP2", cfg, q), 1e-12
    )
    # f(t) is a callable field: filter_jit treats it as static (plain jax.jit would reject it).
    jitted = eqx.filter_jit(constraint_gamma)(con, jnp.asarray(q), jnp.asarray(qd), jnp.asarray(t))
    assert_close_rel(jitted, gamma_np("DP2", cfg, q, qd, t, True), 1e-12)


# ------------------------------------------------------------------------------- validation


FIELDS = [
    ("DP1.a_i", lambda v, ok: DP1(0, v, 1, ok)),
    ("DP1.a_j", lambda v, ok: DP1(0, ok, 1, v)),
    ("DP2.a_i", lambda v, ok: DP2(0, v, ok, 1, ok)),
    ("DP2.s_i", lambda v, ok: DP2(0, ok, v, 1, ok)),
    ("DP2.s_j", lambda v, ok: DP2(0, ok, ok, 1, v)),
    ("D.s_i", lambda v, ok: D(0, v, 1, ok)),
    ("D.s_j", lambda v, ok: D(0, ok, 1, v)),
    ("CD.c", lambda v, ok: CD(v, 0, ok, 1, ok)),
    ("CD.s_i", lambda v, ok: CD(ok, 0, v, 1, ok)),
    ("CD.s_j", lambda v, ok: CD(ok, 0, ok, 1, v)),
]


@pytest.mark.parametrize("bad", [np.ones(2), np.ones(4), np.float64(1.0)], ids=["2", "4", "scalar"])
@pytest.mark.parametrize("field,build", FIELDS, ids=[f for f, _ in FIELDS])
def test_wrong_shape_raises_naming_field(field, build, bad):
    with pytest.raises(ValueError, match=re.escape(field)):
        build(bad, np.ones(3))


@pytest.mark.parametrize("field,build", FIELDS, ids=[f for f, _ in FIELDS])
def test_non_finite_raises_naming_field(field, build):
    with pytest.raises(ValueError, match=re.escape(field)):
        build(np.array([1.0, np.nan, 0.0]), np.ones(3))


def test_batched_vector_rejected():
    """A (2, 3) array is not a 3-vector (regression: only the trailing shape used to be checked,
    so DP1 silently became a 2-row constraint)."""
    with pytest.raises(ValueError, match=re.escape("DP1.a_i")):
        DP1(0, np.ones((2, 3)), 1, np.ones(3))


def test_integer_vectors_accepted():
    """Integer vectors are cast to float (regression: CD's jnp.dot(c, d) raised a
    TypePromotionError under strict promotion when c was an int array)."""
    cfg = random_config(0)
    con = CD([1, 0, 0], 0, [0, 1, 0], 1, [0, 0, 1])
    cfg.update(c=np.array([1.0, 0, 0]), s_i=np.array([0, 1.0, 0]), s_j=np.array([0, 0, 1.0]))
    got = constraint_residual(con, jnp.asarray(cfg["q"]), 0.0)
    assert_close_rel(got, residual_np("CD", cfg, cfg["q"], 0.0), 1e-12)
