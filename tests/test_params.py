"""Physically consistent parameterisations: every raw value is a physical body; round trips.

References the code under test did not produce: numpy eigen-decompositions (symmetry,
definiteness, triangle inequalities); bodies assembled from random principal moments and random
rotations; the parallel-axis theorem and the pseudo-inertia written out by hand; the
log-Cholesky map from the 10 parameters to the dynamic parameters as printed in Rucker &
Wensing (2022) (entry by entry, as also implemented in pinocchio's LogCholeskyParametersTpl);
central finite differences for gradients; ``rbjax.Body``'s validation for optimiser iterates.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import assert_close
from hypothesis import given, settings, strategies as st

import rbjax
from rbjax import Bounded, LogCholeskyInertia, Positive, PrincipalInertia

F64 = jnp.float64
RAW = st.floats(-30.0, 30.0, allow_nan=False)


def _f64(x):
    return jnp.asarray(x, dtype=F64)


def _random_rotation(rng):
    """A uniformly random proper rotation (numpy QR with the sign convention fixed)."""
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    return q * np.linalg.det(q)


def _rodrigues(v):
    """The rotation matrix of the rotation vector v (Rodrigues' formula), and its quaternion."""
    v = np.asarray(v, dtype=np.float64)
    angle = np.linalg.norm(v)
    k = np.array([[0.0, -v[2], v[1]], [v[2], 0.0, -v[0]], [-v[1], v[0], 0.0]]) / angle
    r = np.eye(3) + np.sin(angle) * k + (1.0 - np.cos(angle)) * k @ k
    return r, np.concatenate([[np.cos(angle / 2)], np.sin(angle / 2) * v / angle])


def _random_inertia(rng, lo=0.01, hi=2.0):
    """A physical inertia: random second moments (hence moments obeying the triangle
    inequalities) about random axes."""
    s = rng.uniform(lo, hi, size=3)
    r = _random_rotation(rng)
    return r @ np.diag(s.sum() - s) @ r.T


def _rel(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def _is_physical_inertia(th, rtol):
    """Symmetric, positive semi-definite and triangle inequalities, to rtol of the trace."""
    th = np.asarray(th)
    w = np.linalg.eigvalsh(th)
    tol = rtol * w.sum()
    return (
        bool(np.all(th == np.swapaxes(th, -1, -2))) and w[0] >= -tol and w[0] + w[1] >= w[2] - tol
    )


def _central_difference(f, x, h=1e-6):
    x = np.asarray(x, dtype=np.float64)
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = h
        g[i] = (float(f(_f64(x + e))) - float(f(_f64(x - e)))) / (2 * h)
    return g


# --------------------------------------------------------------------------- Positive


@pytest.mark.parametrize("kind", ["softplus", "log"])
def test_positive_round_trip_and_gradient(kind):
    """value ∘ from_value is the identity (1e-13 relative) from 1e-8 to 1e8, and d value/d raw
    (jvp and grad) equals central differences to 1e-7."""
    x = np.array([1e-8, 1e-3, 0.7, 3.0, 1e3, 1e8])
    p = Positive.from_value(x, kind=kind)
    assert p.raw.dtype == F64
    err = np.max(np.abs(np.asarray(p.value) - x) / x)
    assert err <= 1e-13, err

    value = jax.jit(lambda r: Positive(r, kind=kind).value)
    jvp = np.asarray(jax.jvp(value, (p.raw,), (jnp.ones_like(p.raw),))[1])
    grad = np.asarray(jax.grad(lambda r: jnp.sum(value(r)))(p.raw))
    h = 1e-6 * np.maximum(1.0, np.abs(np.asarray(p.raw)))
    fd = (np.asarray(value(p.raw + h)) - np.asarray(value(p.raw - h))) / (2 * h)
    assert np.max(np.abs(jvp - fd) / np.abs(fd)) <= 1e-7
    assert np.max(np.abs(grad - fd) / np.abs(fd)) <= 1e-7


def test_positive_floor_batch_jit_vmap_and_float32():
    """A floor shifts the range (every raw value stays above it); values of any shape; jit,
    vmap and grad of the value; from_value under jit (checks skipped on tracers); float32."""
    p = Positive.from_value(2.5, floor=1.0)
    assert abs(float(p.value) - 2.5) <= 1e-14
    raws = _f64([-700.0, -30.0, 0.0, 30.0])
    for kind in ("softplus", "log"):
        v = np.asarray(Positive(raws, floor=1.0, kind=kind).value)
        assert np.all(v >= 1.0) and np.all(np.isfinite(v))
    x = np.random.default_rng(0).uniform(0.1, 5.0, size=(4, 3))
    b = Positive.from_value(x)
    assert b.raw.shape == (4, 3)
    vm, g, traced = jax.jit(
        lambda q, y: (
            jax.vmap(lambda r: r.value)(q),
            jax.grad(lambda r: jnp.sum(r.value**2))(q),
            Positive.from_value(y, floor=0.05).raw,
        )
    )(b, _f64(x))
    assert_close(vm, x, rtol=1e-14, atol=0.0)
    assert np.all(np.isfinite(np.asarray(g.raw)))
    assert_close(traced, Positive.from_value(x, floor=0.05).raw, rtol=1e-14, atol=0.0)
    p32 = Positive.from_value([0.5, 2.0], dtype=jnp.float32, kind="log")
    assert p32.raw.dtype == jnp.float32 and p32.value.dtype == jnp.float32
    assert_close(p32.value, [0.5, 2.0], rtol=1e-6, atol=0.0)
    from_f32 = Positive.from_value(jnp.asarray([0.5, 2.0], dtype=jnp.float32))
    assert from_f32.raw.dtype == jnp.float32  # dtype follows a float32 input


def test_positive_errors():
    """Values at or below the floor, non-finite values, an unknown kind, a bad floor or an
    integer dtype raise ValueError naming the field and the fix."""
    for bad, floor in ((0.5, 1.0), (1.0, 1.0), (-1.0, 0.0), (0.0, 0.0), (np.nan, 0.0)):
        with pytest.raises(ValueError, match=r"Positive.from_value\(x\) = .* Fix: "):
            Positive.from_value(bad, floor=floor)
    with pytest.raises(ValueError, match=r"Positive.from_value\(x\)"):
        Positive.from_value([1.0, np.inf])
    with pytest.raises(ValueError, match="Positive.kind = 'exp'"):
        Positive.from_value(1.0, kind="exp")
    with pytest.raises(ValueError, match="Positive.kind"):
        Positive(_f64(0.0), kind="exp")
    for floor in (-1.0, np.nan):
        with pytest.raises(ValueError, match="Positive.floor"):
            Positive.from_value(1.0, floor=floor)
        with pytest.raises(ValueError, match="Positive.floor"):
            Positive(_f64(0.0), floor=floor)
    with pytest.raises(ValueError, match="dtype"):
        Positive.from_value(1.0, dtype=jnp.int32)


# --------------------------------------------------------------------------- Bounded


def test_bounded_round_trip_gradient_range_and_transforms():
    """value ∘ from_value is the identity (1e-12 of the interval) across (low, high), close to
    both bounds too; d value/d raw (jvp, grad) equals the closed form (v − low)(high − v)/(high −
    low) and central differences to 1e-7; every raw value, however large, gives a finite value
    in [low, high] (in the open interval while sigmoid does not round to 0 or 1); jit, vmap,
    from_value under jit, float32."""
    low, high = -0.05, 0.1
    width = high - low
    x = np.array([low + 1e-9, -0.049, -0.01, 0.0, 0.015, 0.0999, high - 1e-9])
    b = Bounded.from_value(x, low, high)
    assert b.raw.dtype == F64 and (b.low, b.high) == (low, high)
    assert np.max(np.abs(np.asarray(b.value) - x)) <= 1e-12 * width

    value = jax.jit(lambda r: Bounded(r, low, high).value)
    r = b.raw[1:-1]  # inside, where central differences are well conditioned
    v = np.asarray(value(r))
    closed = (v - low) * (high - v) / width
    jvp = np.asarray(jax.jvp(value, (r,), (jnp.ones_like(r),))[1])
    grad = np.asarray(jax.grad(lambda q: jnp.sum(value(q)))(r))
    h = 1e-6 * np.maximum(1.0, np.abs(np.asarray(r)))
    fd = (np.asarray(value(r + h)) - np.asarray(value(r - h))) / (2 * h)
    for d in (jvp, grad, fd):
        assert np.max(np.abs(d - closed) / closed) <= 1e-7

    extreme = np.asarray(value(_f64([-1e4, -800.0, -30.0, 0.0, 30.0, 800.0, 1e4])))
    assert np.all(np.isfinite(extreme)) and np.all((extreme >= low) & (extreme <= high))
    assert low < extreme[2] < extreme[3] < extreme[4] < high  # strictly monotone inside
    assert extreme[3] == low + 0.5 * width

    y = np.random.default_rng(1).uniform(0.2, 0.8, size=(4, 3))
    batch = Bounded.from_value(y, 0.0, 1.0)
    vm, traced = jax.jit(
        lambda q, z: (jax.vmap(lambda e: e.value)(q), Bounded.from_value(z, 0.0, 1.0).raw)
    )(batch, _f64(y))
    assert_close(vm, y, rtol=1e-14, atol=0.0)
    assert_close(traced, batch.raw, rtol=1e-14, atol=0.0)
    b32 = Bounded.from_value([0.25, 0.5], 0.0, 1.0, dtype=jnp.float32)
    assert b32.raw.dtype == jnp.float32 and b32.value.dtype == jnp.float32
    assert_close(b32.value, [0.25, 0.5], rtol=1e-6, atol=0.0)


def test_bounded_errors():
    """A value on or outside the interval, a non-finite value, an empty or non-finite interval,
    or an integer dtype raise ValueError naming the field and the fix."""
    for bad in (-0.05, 0.1, 0.2, -1.0, np.nan):
        with pytest.raises(ValueError, match=r"Bounded.from_value\(x\) = .* Fix: start inside"):
            Bounded.from_value(bad, -0.05, 0.1)
    with pytest.raises(ValueError, match=r"Bounded.from_value\(x\)"):
        Bounded.from_value([0.0, np.inf], -1.0, 1.0)
    for low, high in ((1.0, 1.0), (1.0, 0.0), (0.0, np.inf), (np.nan, 1.0)):
        with pytest.raises(ValueError, match=r"Bounded.from_value\(low, high\) = .* Fix: "):
            Bounded.from_value(0.5, low, high)
        with pytest.raises(ValueError, match=r"Bounded\(low, high\)"):
            Bounded(_f64(0.0), low, high)
    with pytest.raises(ValueError, match="dtype"):
        Bounded.from_value(0.5, 0.0, 1.0, dtype=jnp.int32)


# --------------------------------------------------------------------------- PrincipalInertia


def _principal_cases(rng):
    cases = [_random_inertia(rng) for _ in range(30)]
    r = _random_rotation(rng)
    cases += [
        r @ np.diag([1.0, 1.0, 1.5]) @ r.T,  # axisymmetric (two equal moments)
        r @ np.diag([1.0, 1.5, 1.5]) @ r.T,
        2.0 * np.eye(3),  # sphere: any axes
        r @ np.diag([1.0, 1.0 + 1e-9, 1.5]) @ r.T,  # near-axisymmetric
        r @ np.diag([1.0, 2.0, 3.0 - 1e-9]) @ r.T,  # near-lamina
        r @ np.diag([1e-6, 1.0, 1.0]) @ r.T,  # near-rod
        r @ np.diag([1e3, 2e3, 2.5e3]) @ r.T * 1e-4,  # other scales
        np.diag([3.0, 1.0, 2.5]),  # unsorted diagonal
    ]
    return cases


def test_principal_inertia_round_trip():
    """from_matrix(Θ).matrix == Θ to 1e-12 relative for random physical inertias with random
    axes, axisymmetric bodies and a sphere (axes not unique, the matrix still round-trips),
    near-degenerate bodies; one batched call equals the single calls; the axes are principal
    axes (Θ R = R diag(I)), a proper rotation; the exact lamina I₃ = I₁ + I₂ has finite raw
    values and round-trips to 1e-12 of ½ tr Θ."""
    rng = np.random.default_rng(0)
    cases = _principal_cases(rng)
    worst = 0.0
    for th in cases:
        p = PrincipalInertia.from_matrix(th)
        worst = max(worst, _rel(p.matrix, th))
        r, m = np.asarray(p.axes), np.asarray(p.moments)
        assert_close(th @ r, r * m[None, :], rtol=0.0, atol=1e-12 * np.abs(th).max())
        assert abs(np.linalg.det(r) - 1.0) <= 1e-13
    assert worst <= 1e-12, f"round trip {worst:.3g}"
    batched = PrincipalInertia.from_matrix(np.stack(cases))
    assert batched.raw_moments.shape == (len(cases), 3)
    assert _rel(batched.matrix, np.stack(cases)) <= 1e-12
    r = _random_rotation(rng)
    lamina = r @ np.diag([1.0, 2.0, 3.0]) @ r.T
    p = PrincipalInertia.from_matrix(lamina)
    assert np.all(np.isfinite(np.asarray(p.raw_moments)))
    assert float(np.min(p.raw_moments)) < -25.0  # softplus⁻¹(1e-12 · 3)
    assert np.max(np.abs(np.asarray(p.matrix) - lamina)) <= 1e-12 * 3.0 * 1.01
    q = PrincipalInertia.from_moments([1.0, 2.0, 3.0])
    assert np.max(np.abs(np.asarray(q.moments) - [1.0, 2.0, 3.0])) <= 1e-12 * 3.0 * 1.01


def test_principal_inertia_from_moments_rotation_forms_and_ratios():
    """A rotation vector and a quaternion of any norm (and of either sign) for the same
    rotation give the same Θ; None means the body axes; the raw rotation is a 3-vector; ratios
    = I/(½ tr Θ) are scale-free and sum to 2; scale = ½ tr Θ."""
    moments = np.array([1.0, 2.0, 2.5])
    rotvec = np.array([0.3, -1.2, 2.0])
    r, a = _rodrigues(rotvec)
    ref = PrincipalInertia.from_moments(moments, rotvec)
    assert ref.raw_rotation.shape == (3,)
    assert_close(ref.matrix, r @ np.diag(moments) @ r.T, rtol=0.0, atol=1e-14)
    for q in (a, 3.0 * a, -0.2 * a):
        got = PrincipalInertia.from_moments(moments, q)
        assert got.raw_rotation.shape == (3,)
        assert_close(got.matrix, ref.matrix, rtol=0.0, atol=1e-14)
    plain = PrincipalInertia.from_moments(moments)
    assert_close(plain.matrix, np.diag(moments), rtol=0.0, atol=1e-15)
    big = PrincipalInertia.from_moments(10.0 * moments, rotvec)
    assert_close(big.ratios, ref.ratios, rtol=1e-13, atol=0.0)
    assert_close(ref.ratios, moments / (0.5 * moments.sum()), rtol=1e-13, atol=0.0)
    assert abs(float(jnp.sum(ref.ratios)) - 2.0) <= 1e-14
    assert abs(float(big.scale) - 0.5 * np.trace(np.asarray(big.matrix))) <= 1e-13 * 25


_principal_check = jax.jit(
    lambda rm, rr: (
        PrincipalInertia(rm, rr).matrix,
        jax.grad(
            lambda m, r: jnp.sum(
                jnp.sin(PrincipalInertia(m, r).matrix) * jnp.arange(9.0, dtype=F64).reshape(3, 3)
            ),
            argnums=(0, 1),
        )(rm, rr),
    )
)


@settings(max_examples=40)
@given(st.lists(RAW, min_size=3, max_size=3), st.lists(RAW, min_size=3, max_size=3))
def test_every_raw_value_is_a_physical_principal_inertia(raw_m, raw_r):
    """For any raw values in [-30, 30]: Θ exactly symmetric, positive definite and the
    triangle inequalities hold to rounding (numpy eigvalsh), and jax.grad of a function of Θ
    is finite."""
    th, (gm, gr) = _principal_check(_f64(raw_m), _f64(raw_r))
    assert _is_physical_inertia(th, 1e-12), np.linalg.eigvalsh(np.asarray(th))
    assert np.all(np.isfinite(np.asarray(gm))) and np.all(np.isfinite(np.asarray(gr)))


def test_principal_inertia_gradient_jvp_batch_and_vmap():
    """jax.grad and jax.jvp of a function of Θ w.r.t. both raw leaves equal central
    differences (1e-7), also at the rotation vector 0; batched leaves (also with different
    leading shapes, broadcast) equal vmap, under jit."""
    w = _f64(np.arange(9.0).reshape(3, 3))

    def f(m, r):
        return jnp.sum(jnp.cos(PrincipalInertia(m, r).matrix) * w)

    derivatives = jax.jit(
        lambda m, r, tm, tr: (jax.grad(f, argnums=(0, 1))(m, r), jax.jvp(f, (m, r), (tm, tr))[1])
    )
    f = jax.jit(f)
    tm, tr = _f64([0.2, -0.7, 0.4]), _f64([-0.3, 0.5, 0.8])
    for rm, rr in (([0.3, -0.2, 1.1], [0.9, 0.2, -0.3]), ([0.5, 2.0, -1.0], [0.0, 0.0, 0.0])):
        rm, rr = _f64(rm), _f64(rr)
        (gm, gr), jv = derivatives(rm, rr, tm, tr)
        fdm = _central_difference(lambda x, r=rr: f(x, r), rm)
        fdr = _central_difference(lambda x, m=rm: f(m, x), rr)
        assert np.max(np.abs(np.asarray(gm) - fdm) / np.maximum(1.0, np.abs(fdm))) <= 1e-7
        assert np.max(np.abs(np.asarray(gr) - fdr) / np.maximum(1.0, np.abs(fdr))) <= 1e-7
        fd = (f(rm + 1e-6 * tm, rr + 1e-6 * tr) - f(rm - 1e-6 * tm, rr - 1e-6 * tr)) / 2e-6
        assert abs(float(jv) - float(fd)) <= 1e-7 * max(1.0, abs(float(fd)))

    rng = np.random.default_rng(1)
    rm, rr = _f64(rng.normal(size=(5, 3))), _f64(rng.normal(size=(5, 3)))
    batched, shared = PrincipalInertia(rm, rr), PrincipalInertia(rm, rr[0])
    shapes = {"matrix": (5, 3, 3), "axes": (5, 3, 3), "scale": (5,), "moments": (5, 3)}
    shapes |= {"ratios": (5, 3), "second_moments": (5, 3)}
    for name, shape in shapes.items():
        assert jax.eval_shape(lambda p, n=name: getattr(p, n), batched).shape == shape, name
        shared_shape = (3, 3) if name == "axes" else shape  # the axes depend on the rotation
        assert jax.eval_shape(lambda p, n=name: getattr(p, n), shared).shape == shared_shape

    @jax.jit
    def matrices(p, shared):
        one = jax.vmap(lambda m, r: PrincipalInertia(m, r).matrix, in_axes=(0, None))
        return p.matrix, jax.vmap(lambda q: q.matrix)(p), shared.matrix, one(rm, rr[0])

    got, ref, got_shared, ref_shared = matrices(batched, shared)
    assert_close(got, ref, rtol=0.0, atol=1e-14)
    assert_close(got_shared, ref_shared, rtol=0.0, atol=1e-14)  # (5, 3) moments, one rotation


def test_principal_inertia_errors():
    """Non-physical or malformed input raises ValueError naming the field and the fix."""
    fm = r"PrincipalInertia.from_moments\(moments\)"
    for bad, what in (
        ([1.0, 1.0, 3.0], "triangle inequality"),
        ([0.0, 1.0, 1.0], "> 0"),
        ([-1.0, 2.0, 2.0], "> 0"),
        ([1.0, np.nan, 1.0], "non-finite"),
        ([1.0, 2.0], "shape"),
    ):
        with pytest.raises(ValueError, match=f"{fm}.*{what}|{fm} has shape"):
            PrincipalInertia.from_moments(bad)
    fr = r"PrincipalInertia.from_moments\(rotation\)"
    for bad, what in (
        ([0.0, 0.0, 0.0, 0.0], "zero quaternion"),
        ([1.0, 2.0], "has shape"),
        ([0.1, np.inf, 0.0], "non-finite"),
    ):
        with pytest.raises(ValueError, match=f"{fr}.*{what}"):
            PrincipalInertia.from_moments([1.0, 2.0, 2.5], bad)
    fx = r"PrincipalInertia.from_matrix\(inertia\)"
    for bad, what in (
        (np.diag([1.0, -1.0, 1.0]), "positive definite"),
        (np.diag([1.0, 1.0, 3.0]), "triangle inequality"),
        (np.array([[1.0, 0.1, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]), "not symmetric"),
        (np.full((3, 3), np.nan), "non-finite"),
        (np.eye(2), "shape"),
    ):
        with pytest.raises(ValueError, match=f"{fx}.*{what}"):
            PrincipalInertia.from_matrix(bad)
    with pytest.raises(ValueError, match="dtype"):
        PrincipalInertia.from_moments([1.0, 2.0, 2.5], dtype=jnp.int32)


# --------------------------------------------------------------------------- LogCholeskyInertia


def _paper_dynamic_parameters(theta):
    """(m, h, Ī) from θ = (α, d1, d2, d3, s12, s23, s13, t1, t2, t3), Rucker & Wensing (2022),
    written out entry by entry (independent of U Uᵀ)."""
    a, d1, d2, d3, s12, s23, s13, t1, t2, t3 = np.asarray(theta, dtype=np.float64)
    e1, e2, e3, k = np.exp(d1), np.exp(d2), np.exp(d3), np.exp(2 * a)
    ixx = s23**2 + t2**2 + t3**2 + e2**2 + e3**2
    ixy = -s12 * e2 - s13 * s23 - t1 * t2
    iyy = s12**2 + s13**2 + t1**2 + t3**2 + e1**2 + e3**2
    ixz = -s13 * e3 - t1 * t3
    iyz = -s23 * e3 - t2 * t3
    izz = s12**2 + s13**2 + s23**2 + t1**2 + t2**2 + e1**2 + e2**2
    ibar = k * np.array([[ixx, ixy, ixz], [ixy, iyy, iyz], [ixz, iyz, izz]])
    return k, k * np.array([t1, t2, t3]), ibar


def _pseudo_by_hand(m, c, th):
    """J from (m, c, Θ_c): parallel-axis theorem, then Σ = ½ tr(Ī) 1 − Ī."""
    ibar = th + m * (np.dot(c, c) * np.eye(3) - np.outer(c, c))
    sig = 0.5 * np.trace(ibar) * np.eye(3) - ibar
    j = np.zeros((4, 4))
    j[:3, :3], j[:3, 3], j[3, :3], j[3, 3] = sig, m * c, m * c, m
    return j, ibar


def test_log_cholesky_matches_the_paper_and_round_trips():
    """The layout of U and the parameter order are the paper's (dynamic parameters entry by
    entry); from_physical(m, c, Θ) reproduces m, c and Θ to 1e-12 and the pseudo-inertia built
    by hand (parallel-axis theorem); U is upper triangular with positive diagonal and J = U Uᵀ;
    theta / from_theta round-trip; near-degenerate, axisymmetric and lamina bodies; one batched
    call equals the single calls."""
    rng = np.random.default_rng(2)
    for _ in range(5):
        theta = rng.normal(size=10)
        p = LogCholeskyInertia.from_theta(theta)
        m, h, ibar = _paper_dynamic_parameters(theta)
        assert abs(float(p.mass) - m) <= 1e-14 * m
        assert_close(p.com * p.mass, h, rtol=1e-14, atol=1e-14)
        assert_close(p.inertia_origin, ibar, rtol=0.0, atol=1e-13 * np.abs(ibar).max())
        assert_close(p.theta, theta, rtol=0.0, atol=0.0)
    lamina = np.diag([1.0, 2.0, 3.0])  # I₃ = I₁ + I₂: Σ_c singular, lifted by 1e-12 tr Σ_c
    cases = _principal_cases(rng) + [lamina]
    masses = rng.uniform(0.05, 20.0, size=len(cases))
    coms = rng.normal(size=(len(cases), 3))
    errors = []
    for th, m, c in zip(cases, masses, coms, strict=True):
        p = LogCholeskyInertia.from_physical(m, c, th)
        j, ibar = _pseudo_by_hand(m, c, th)
        errors.append(
            max(_rel(p.inertia_com, th), _rel(p.pseudo_inertia, j), _rel(p.inertia_origin, ibar))
        )
        assert abs(float(p.mass) - m) <= 1e-14 * m
        assert_close(p.com, c, rtol=0.0, atol=0.0)
        u = np.asarray(p.factor)
        assert np.all(np.tril(u, -1) == 0.0) and np.all(np.diag(u) > 0.0)
        assert_close(u @ u.T, p.pseudo_inertia, rtol=0.0, atol=1e-13 * np.abs(j).max())
        assert np.all(np.isfinite(np.asarray(p.theta)))
    assert max(errors[:-1]) <= 1e-12, f"round trip {max(errors[:-1]):.3g}"
    assert errors[-1] <= 2.1e-12, f"lamina {errors[-1]:.3g}"  # Θ += 2e-12 tr(Σ_c) 1, tr Σ_c = 3
    batched = LogCholeskyInertia.from_physical(masses, coms, np.stack(cases))
    assert batched.theta.shape == (len(cases), 10)
    assert _rel(batched.inertia_com[:-1], np.stack(cases[:-1])) <= 1e-12
    again = LogCholeskyInertia.from_theta(batched.theta)
    assert_close(again.pseudo_inertia, batched.pseudo_inertia, rtol=0.0, atol=0.0)


_cholesky_check = jax.jit(
    lambda th: (
        LogCholeskyInertia.from_theta(th).pseudo_inertia,
        LogCholeskyInertia.from_theta(th).inertia_com,
        jax.grad(
            lambda x: (
                jnp.sum(
                    jnp.sin(LogCholeskyInertia.from_theta(x).pseudo_inertia)
                    * jnp.arange(16.0, dtype=F64).reshape(4, 4)
                )
                + jnp.sum(jnp.cos(LogCholeskyInertia.from_theta(x).inertia_com))
            )
        )(th),
    )
)


@settings(max_examples=40)
@given(st.lists(RAW, min_size=10, max_size=10))
def test_every_raw_value_is_a_physical_log_cholesky_body(theta):
    """For any θ in [-30, 30]^10: mass > 0, J symmetric positive definite (to rounding, relative
    to its largest eigenvalue), Θ about the centre of mass symmetric, positive semi-definite with
    the triangle inequalities (to rounding), and a finite gradient of a function of both."""
    j, th, g = _cholesky_check(_f64(theta))
    j = np.asarray(j)
    assert np.all(j == j.T)
    w = np.linalg.eigvalsh(j)
    assert j[3, 3] > 0.0 and w[0] >= -1e-12 * w[-1], w
    assert _is_physical_inertia(th, 1e-12), np.linalg.eigvalsh(np.asarray(th))
    assert np.all(np.isfinite(np.asarray(g)))


def test_log_cholesky_gradient_jvp_batch_and_vmap():
    """jax.grad and jax.jvp of a function of (m, c, Θ_c) w.r.t. every raw leaf equal central
    differences (1e-7); leaves with different leading shapes broadcast; batched properties
    equal vmap; from_physical under jit (tracers: checks skipped) equals the eager result."""
    rng = np.random.default_rng(3)
    theta0 = _f64(rng.normal(size=10) * 0.5)
    tangent = _f64(rng.normal(size=10))
    w = _f64(rng.normal(size=(3, 3)))

    def f(th):
        p = LogCholeskyInertia.from_theta(th)
        return jnp.sum(jnp.sin(p.inertia_com) * w) + p.mass * jnp.sum(p.com**2)

    derivatives = jax.jit(
        lambda th, dt: (
            jax.grad(f)(th),
            jax.jvp(f, (th,), (dt,))[1],
            jax.grad(lambda p: jnp.sum(p.inertia_com * w))(LogCholeskyInertia.from_theta(th)),
        )
    )
    f = jax.jit(f)
    g, jv, gl = derivatives(theta0, tangent)
    fd = _central_difference(f, theta0)
    assert np.max(np.abs(np.asarray(g) - fd) / np.maximum(1.0, np.abs(fd))) <= 1e-7
    fdt = (f(theta0 + 1e-6 * tangent) - f(theta0 - 1e-6 * tangent)) / 2e-6
    assert abs(float(jv) - float(fdt)) <= 1e-7 * max(1.0, abs(float(fdt)))
    assert gl.alpha.shape == () and gl.d.shape == gl.s.shape == gl.t.shape == (3,)  # the leaves

    shapes = {
        "mass": (2, 4),
        "com": (2, 4, 3),
        "inertia_com": (2, 4, 3, 3),
        "inertia_origin": (2, 4, 3, 3),
        "pseudo_inertia": (2, 4, 4, 4),
        "factor": (2, 4, 4, 4),
        "theta": (2, 4, 10),
    }

    batched = LogCholeskyInertia.from_theta(_f64(rng.normal(size=(2, 4, 10))))
    for name, shape in shapes.items():
        assert jax.eval_shape(lambda p, n=name: getattr(p, n), batched).shape == shape, name
    shared = LogCholeskyInertia(
        _f64(0.1), _f64(rng.normal(size=(5, 3))), _f64([0.1, 0.2, 0.3]), _f64([0.0, 0.0, 1.0])
    )
    assert jax.eval_shape(lambda p: p.pseudo_inertia, shared).shape == (5, 4, 4)
    assert jax.eval_shape(lambda p: p.theta, shared).shape == (5, 10)

    @jax.jit
    def matrices(p):
        got = (p.pseudo_inertia, p.inertia_com, p.inertia_origin)
        ref = jax.vmap(jax.vmap(lambda q: (q.pseudo_inertia, q.inertia_com, q.inertia_origin)))(p)
        return got, ref

    got, ref = matrices(batched)
    for a, b in zip(got, ref, strict=True):
        assert_close(a, b, rtol=0.0, atol=1e-13)
    th = _random_inertia(rng)
    eager = LogCholeskyInertia.from_physical(1.3, [0.1, -0.2, 0.3], th)
    jitted = jax.jit(LogCholeskyInertia.from_physical)(_f64(1.3), _f64([0.1, -0.2, 0.3]), _f64(th))
    assert_close(jitted.theta, eager.theta, rtol=0.0, atol=1e-13)


def test_log_cholesky_errors():
    """Non-physical or malformed input raises ValueError naming the field and the fix."""
    th = np.diag([1.0, 2.0, 2.5])
    c = [0.0, 0.0, 0.1]
    field = r"LogCholeskyInertia.from_physical"
    for m, what in ((0.0, "> 0"), (-2.0, "> 0"), (np.nan, "non-finite")):
        with pytest.raises(ValueError, match=rf"{field}\(mass\).*{what}"):
            LogCholeskyInertia.from_physical(m, c, th)
    for bad, what in (([0.0, 1.0], "shape"), ([0.0, np.nan, 0.0], "non-finite")):
        with pytest.raises(ValueError, match=rf"{field}\(com\).*{what}"):
            LogCholeskyInertia.from_physical(1.0, bad, th)
    for bad, what in (
        (np.diag([1.0, 1.0, 3.0]), "triangle inequality"),
        (np.diag([1.0, 0.0, 1.0]), "positive definite"),
        (np.array([[1.0, 0.2, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]), "not symmetric"),
        (np.ones(3), "shape"),
    ):
        with pytest.raises(ValueError, match=rf"{field}\(inertia_com\).*{what}"):
            LogCholeskyInertia.from_physical(1.0, c, bad)
    with pytest.raises(ValueError, match=r"from_theta\(theta\).*shape"):
        LogCholeskyInertia.from_theta(np.zeros(9))
    with pytest.raises(ValueError, match=r"from_theta\(theta\).*non-finite"):
        LogCholeskyInertia.from_theta(np.full(10, np.inf))


# --------------------------------------------------------------------------- all classes


def test_float32_everywhere():
    """float32 raw leaves give float32 values, matrices and gradients (jit), and round-trip to
    float32 precision; the raw dtype follows a float32 input."""
    th = np.diag([1.0, 2.0, 2.5])
    p = PrincipalInertia.from_matrix(th, dtype=jnp.float32)
    lc = LogCholeskyInertia.from_physical(1.5, [0.1, 0.0, -0.2], th, dtype=jnp.float32)
    pos = Positive.from_value(jnp.asarray([0.5, 2.0], dtype=jnp.float32))
    assert p.raw_moments.dtype == p.raw_rotation.dtype == pos.raw.dtype == jnp.float32
    assert lc.alpha.dtype == lc.d.dtype == lc.s.dtype == lc.t.dtype == jnp.float32

    @jax.jit
    def evaluate(p, lc, pos):
        values = (p.matrix, p.ratios, p.scale, lc.mass, lc.com, lc.inertia_com)
        values += (lc.pseudo_inertia, lc.theta, pos.value)
        g_lc = jax.grad(lambda q: jnp.sum(q.inertia_com) + q.mass)(lc)
        g_p = jax.grad(lambda q: jnp.sum(q.matrix**2))(p)
        return values, jax.tree.leaves((g_lc, g_p))

    values, grads = evaluate(p, lc, pos)
    for x in values + tuple(grads):
        assert x.dtype == jnp.float32
        assert np.all(np.isfinite(np.asarray(x)))
    assert_close(values[0], th, rtol=0.0, atol=1e-5)
    assert_close(values[5], th, rtol=0.0, atol=1e-5)
    assert_close(values[-1], [0.5, 2.0], rtol=1e-6, atol=0.0)


def test_every_optax_iterate_is_a_physical_body():
    """Adam with a large learning rate on the raw leaves, fitting an UNphysical target (negative
    mass, an inertia violating the triangle inequality, an indefinite one): every iterate is
    accepted by rbjax.Body (positive mass, symmetric positive definite, triangle
    inequalities)."""
    mass = Positive.from_value(1.0)
    principal = PrincipalInertia.from_moments([1.0, 2.0, 2.5], [0.1, 0.2, 0.3])
    cholesky = LogCholeskyInertia.from_physical(1.0, [0.0, 0.0, 0.0], np.diag([1.0, 2.0, 2.5]))
    params = (mass, principal, cholesky)
    target = _f64(np.diag([0.1, 0.1, 5.0]))
    indefinite = _f64(np.diag([-1.0, 2.0, 2.0]))

    def loss(ps):
        m, pi, lc = ps
        return (
            (m.value + 1.0) ** 2
            + jnp.sum((pi.matrix - target) ** 2)
            + jnp.sum((lc.inertia_com - indefinite) ** 2)
            + (lc.mass + 2.0) ** 2
        )

    opt = optax.adam(0.5)
    state = opt.init(params)

    @jax.jit
    def step(ps, st):
        g = jax.grad(loss)(ps)
        with jax.numpy_dtype_promotion("standard"):  # optax mixes int32 counters and floats
            upd, st = opt.update(g, st, ps)
        return optax.apply_updates(ps, upd), st

    losses = []
    for _ in range(40):
        params, state = step(params, state)
        m, pi, lc = params
        rbjax.Body(m.value, pi.matrix)
        rbjax.Body(lc.mass, lc.inertia_com)
        losses.append(float(loss(params)))
    assert losses[-1] < losses[0]
    assert float(params[0].value) > 0.0 and float(params[2].mass) > 0.0
