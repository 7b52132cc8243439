"""Tests of rbjax.quaternion against Möller & Glocker 2012 (Sects. 2-3, eqs. (1)-(31), (67)) and Negrut ME751.

Reference formulas are written out independently here (NumPy block matrices, jnp.cross,
Rodrigues' formula, scipy's Rotation) rather than re-using the module under test.
Samples cover batch shapes (), (3,), (2, 5) and near-singular inputs: tiny quaternions
(~1e-6), near-identity, exactly 180° about random and coordinate axes.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close
from hypothesis import given, settings, strategies as st
from jax.test_util import check_grads
from scipy.spatial.transform import Rotation

from rbjax import quaternion as Q

SHAPES = [(), (3,), (2, 5)]
KINDS = ["generic", "unit", "tiny", "near_identity", "half_turn", "axis_half_turn", "big"]
I3 = np.eye(3)


# ------------------------------------------------------------------------------ samples


def _unit3(rng, shape):
    v = rng.normal(size=shape + (3,))
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def _make_quat(kind, shape, rng):
    if kind == "generic":
        return rng.normal(size=shape + (4,))
    if kind == "unit":
        q = rng.normal(size=shape + (4,))
        return q / np.linalg.norm(q, axis=-1, keepdims=True)
    if kind == "tiny":
        return 1e-6 * rng.normal(size=shape + (4,))
    if kind == "big":
        return 1e3 * rng.normal(size=shape + (4,))
    s = rng.uniform(0.5, 2.0, size=shape + (1,))
    if kind == "near_identity":
        q = np.concatenate([np.ones(shape + (1,)), 1e-9 * rng.normal(size=shape + (3,))], -1)
        return s * q
    if kind == "half_turn":
        return s * np.concatenate([np.zeros(shape + (1,)), _unit3(rng, shape)], -1)
    if kind == "axis_half_turn":
        k = rng.integers(0, 3, size=shape)
        q = np.zeros(shape + (4,))
        np.put_along_axis(q, (k + 1)[..., None], 1.0, axis=-1)
        return s * q
    raise ValueError(kind)


@st.composite
def quat_batch(draw, n=1, kinds=tuple(KINDS)):
    """``n`` quaternion arrays of one common batch shape, each of a drawn kind."""
    shape = draw(st.sampled_from(SHAPES))
    out = []
    for _ in range(n):
        kind = draw(st.sampled_from(kinds))
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        out.append(jnp.asarray(_make_quat(kind, shape, rng)))
    return out[0] if n == 1 else tuple(out)


@st.composite
def vec_batch(draw, shape, scale=1.0):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return jnp.asarray(scale * rng.normal(size=tuple(shape) + (3,)))


def _n(q):
    """|q| as a NumPy array with a trailing axis (for scale-relative comparisons)."""
    return np.linalg.norm(np.asarray(q), axis=-1, keepdims=True)


# ------------------------------------------------------------ independent NumPy references


def skew_np(x):
    x = np.asarray(x)
    z = np.zeros_like(x[..., 0])
    return np.stack(
        [
            np.stack([z, -x[..., 2], x[..., 1]], -1),
            np.stack([x[..., 2], z, -x[..., 0]], -1),
            np.stack([-x[..., 1], x[..., 0], z], -1),
        ],
        -2,
    )


def mul_ref(a, b):
    """eq. (5) in vector form: (a0 b0 - a.b, a0 b + b0 a + a x b)."""
    a, b = np.asarray(a), np.asarray(b)
    a0, av, b0, bv = a[..., :1], a[..., 1:], b[..., :1], b[..., 1:]
    s = a0 * b0 - np.sum(av * bv, -1, keepdims=True)
    v = a0 * bv + b0 * av + np.cross(av, bv)
    return np.concatenate([s, v], -1)


def phi_ref(a):
    """eq. (10) assembled from blocks."""
    a = np.asarray(a)
    a0, av = a[..., 0], a[..., 1:]
    top = np.concatenate([a0[..., None, None], -av[..., None, :]], -1)
    bot = np.concatenate([av[..., :, None], a0[..., None, None] * I3 + skew_np(av)], -1)
    return np.concatenate([top, bot], -2)


def R_ref(a):
    """eq. (23): R = (a  a0 I + ã)(a^T ; a0 I + ã) / |A|^2 from blocks."""
    a = np.asarray(a)
    a0, av = a[..., 0], a[..., 1:]
    blk = a0[..., None, None] * I3 + skew_np(av)
    left = np.concatenate([av[..., :, None], blk], -1)  # (..., 3, 4)
    right = np.concatenate([av[..., None, :], blk], -2)  # (..., 4, 3)
    return (left @ right) / np.sum(a * a, -1)[..., None, None]


def rodrigues(n, ang):
    """eq. (28): R = I + ñ sin φ + ñ² (1 - cos φ), |n| = 1."""
    nt = skew_np(n)
    ang = np.asarray(ang)[..., None, None]
    return I3 + nt * np.sin(ang) + nt @ nt * (1.0 - np.cos(ang))


def E_ref(p):
    p = np.asarray(p)
    e0, e = p[..., 0], p[..., 1:]
    return np.concatenate([-e[..., :, None], skew_np(e) + e0[..., None, None] * I3], -1)


def G_ref(p):
    p = np.asarray(p)
    e0, e = p[..., 0], p[..., 1:]
    return np.concatenate([-e[..., :, None], -skew_np(e) + e0[..., None, None] * I3], -1)


def B_ref(p, s):
    """Negrut ME751: B(p, s̄) = 2 [(e0 I + ẽ) s̄,  e s̄^T - (e0 I + ẽ) s̄̃]."""
    p, s = np.asarray(p), np.asarray(s)
    e0, e = p[..., 0], p[..., 1:]
    M = e0[..., None, None] * I3 + skew_np(e)
    col0 = (M @ s[..., :, None])[..., :, :]
    rest = e[..., :, None] * s[..., None, :] - M @ skew_np(s)
    return 2.0 * np.concatenate([col0, rest], -1)


def quat_angle(x, y):
    """Angle between unit quaternions on S³ (stable formula)."""
    x, y = np.asarray(x), np.asarray(y)
    return 2.0 * np.arctan2(np.linalg.norm(x - y, axis=-1), np.linalg.norm(x + y, axis=-1))


def assert_equal_up_to_sign(actual, expected, atol=1e-10):
    actual, expected = np.asarray(actual), np.asarray(expected)
    sgn = np.where(np.sum(actual * expected, -1, keepdims=True) < 0, -1.0, 1.0)
    assert_close(actual, sgn * expected, atol=atol, rtol=0)


def pure(x):
    x = jnp.asarray(x)
    return jnp.concatenate([jnp.zeros_like(x[..., :1]), x], -1)


# ----------------------------------------------------------------------- §2: the algebra


@given(quat_batch(2))
def test_mul_eq5_and_conjugate_eq6(ab):
    a, b = ab
    sc = _n(a) * _n(b)
    assert Q.mul(a, b).shape == a.shape
    assert_close(Q.mul(a, b) / sc, mul_ref(a, b) / sc)
    assert_close(Q.conjugate(a), np.asarray(a) * np.array([1.0, -1.0, -1.0, -1.0]), rtol=0, atol=0)
    # eq. (6): (AB)* = B* A*
    assert_close(Q.conjugate(Q.mul(a, b)) / sc, Q.mul(Q.conjugate(b), Q.conjugate(a)) / sc)


@given(quat_batch(3))
def test_mul_associative_not_commutative(abc):
    a, b, c = abc
    sc = _n(a) * _n(b) * _n(c)
    lhs = Q.mul(Q.mul(a, b), c) / sc
    rhs = Q.mul(a, Q.mul(b, c)) / sc
    assert_close(lhs, rhs, atol=1e-12)
    # the commutator is 2 (0, a x b): explicitly not zero in general
    comm = Q.mul(a, b) - Q.mul(b, a)
    expected = 2.0 * np.concatenate(
        [
            np.zeros(np.shape(a)[:-1] + (1,)),
            np.cross(np.asarray(a)[..., 1:], np.asarray(b)[..., 1:]),
        ],
        -1,
    )
    assert_close(comm / (_n(a) * _n(b)), expected / (_n(a) * _n(b)), atol=1e-12)


@given(quat_batch())
def test_norm_eq7_eq8_inverse_eq9(a):
    s = np.sum(np.asarray(a) ** 2, -1)
    assert_close(Q.norm2(a), s)
    assert_close(Q.scale(a), s)
    assert_close(Q.norm(a), np.sqrt(s))
    # eq. (8): A A* = (|A|², 0)
    expected = np.zeros(np.shape(a))
    expected[..., 0] = s
    assert_close(Q.mul(a, Q.conjugate(a)) / s[..., None], expected / s[..., None], atol=1e-14)
    # eq. (9): A A^{-1} = A^{-1} A = 1
    one = np.broadcast_to(np.array([1.0, 0.0, 0.0, 0.0]), np.shape(a))
    assert_close(Q.mul(a, Q.inverse(a)), one, atol=1e-13)
    assert_close(Q.mul(Q.inverse(a), a), one, atol=1e-13)


def test_norm_at_zero_value_and_gradient():
    z = jnp.zeros(4)
    assert float(Q.norm(z)) == 0.0
    g = jax.grad(Q.norm)(z)
    assert np.all(np.isfinite(g))
    assert_close(g, np.zeros(4), atol=0)


@given(quat_batch(2))
def test_phi_eqs_10_to_15(ab):
    a, b = ab
    sa, sb = _n(a)[..., None], _n(b)[..., None]
    P = Q.phi(a)
    assert P.shape == np.shape(a)[:-1] + (4, 4)
    assert_close(P, phi_ref(a), rtol=0, atol=0)  # eq. (10), exact
    assert_close(Q.phi(Q.conjugate(a)), np.swapaxes(np.asarray(P), -1, -2), atol=0)  # eq. (11)
    assert_close(Q.phi(Q.mul(a, b)) / (sa * sb), (P @ Q.phi(b)) / (sa * sb))  # eq. (12)
    # eq. (13): phi^{-1}(A) = phi(A^{-1}) = phi(A)^T / |A|^2
    Pinv = np.linalg.inv(np.asarray(P) / sa) / sa
    assert_close(Q.phi(Q.inverse(a)) * sa, Pinv * sa, atol=1e-10)
    assert_close(
        Q.phi(Q.inverse(a)) * sa, np.swapaxes(np.asarray(P), -1, -2) / sa, atol=1e-12, rtol=1e-12
    )
    # eq. (14)-(15): psi(AB) = phi(A) psi(B); psi is the identity on the array
    assert Q.psi(a) is not None
    assert_close(Q.psi(a), a, atol=0, rtol=0)
    lhs = Q.psi(Q.mul(a, b)) / (sa[..., 0] * sb[..., 0])
    rhs = (P @ np.asarray(b)[..., None])[..., 0] / (sa[..., 0] * sb[..., 0])
    assert_close(lhs, rhs)


@given(quat_batch(2))
def test_phi_right(ab):
    a, b = ab
    sc = _n(a) * _n(b)
    Pr = np.asarray(Q.phi_right(a))
    # psi(BA) = phi_right(A) psi(B)
    assert_close(Q.mul(b, a) / sc, (Pr @ np.asarray(b)[..., None])[..., 0] / sc)
    # T phi(A) T = phi_right(A*)  (the building block of eq. (21))
    T = np.asarray(Q.T_MATRIX)
    assert_close(T @ np.asarray(Q.phi(a)) @ T, Q.phi_right(Q.conjugate(a)), atol=0)
    # left and right multiplications commute (associativity)
    sa2 = _n(a)[..., None] ** 2
    assert_close((np.asarray(Q.phi(a)) @ Pr) / sa2, (Pr @ np.asarray(Q.phi(a))) / sa2, atol=1e-13)


@given(quat_batch())
def test_T_matrix_eq16_eq17(a):
    T = Q.T_MATRIX
    assert_close(T, np.diag([1.0, -1.0, -1.0, -1.0]), atol=0)
    assert not T.flags.writeable
    # eq. (17): psi(A*) = T psi(A)
    assert_close(Q.psi(Q.conjugate(a)), (T @ np.asarray(a)[..., None])[..., 0], atol=0)


@given(quat_batch(2))
def test_eq67_phiT_psi_identity(ab):
    a, b = ab
    sc = _n(a) * _n(b)
    T = np.asarray(Q.T_MATRIX)
    lhs = np.swapaxes(np.asarray(Q.phi(a)), -1, -2) @ np.asarray(b)[..., None]
    rhs = T @ np.swapaxes(np.asarray(Q.phi(b)), -1, -2) @ np.asarray(a)[..., None]
    assert_close(lhs[..., 0] / sc, rhs[..., 0] / sc)
    # first equality of eq. (67): phi^T(A) psi(B) = psi(A* B)
    assert_close(lhs[..., 0] / sc, Q.mul(Q.conjugate(a), b) / sc)


def test_skew_and_identity():
    x = jnp.array([0.3, -1.2, 2.0])
    y = jnp.array([-0.7, 0.4, 1.5])
    assert_close(Q.skew(x) @ y, np.cross(x, y))
    assert_close(Q.skew(x), -Q.skew(x).T, atol=0)
    assert_close(Q.skew(jnp.stack([x, y])), skew_np(np.stack([x, y])), atol=0)
    q = Q.identity()
    assert q.shape == (4,)
    assert q.dtype == jnp.float64
    assert_close(q, [1.0, 0.0, 0.0, 0.0], atol=0)
    assert Q.identity(jnp.float32).dtype == jnp.float32


# ----------------------------------------------------------- §3: rotation and scaling


@given(quat_batch())
def test_rotation_matrix_eq23_eq25(a):
    R = np.asarray(Q.rotation_matrix(a))
    assert R.shape == np.shape(a)[:-1] + (3, 3)
    assert_close(R, R_ref(a), atol=1e-13)
    # eq. (25): R R^T = R^T R = I, det R = 1, for NON-unit A too
    assert_close(R @ np.swapaxes(R, -1, -2), np.broadcast_to(I3, R.shape), atol=1e-13)
    assert_close(np.swapaxes(R, -1, -2) @ R, np.broadcast_to(I3, R.shape), atol=1e-13)
    assert_close(np.linalg.det(R), np.ones(R.shape[:-2]), atol=1e-13)
    assert_close(Q.to_matrix(a), R, atol=0)
    R2, s = Q.rotation_and_scale(a)
    assert_close(R2, R, atol=0)
    assert_close(s, np.sum(np.asarray(a) ** 2, -1), atol=0)
    # A and -A give the same rotation (remark after eq. (31))
    assert_close(Q.rotation_matrix(-a), R, atol=0)


@given(quat_batch(), st.data())
def test_transform_eq27(a, data):
    x = data.draw(vec_batch(np.shape(a)[:-1]))
    s = np.sum(np.asarray(a) ** 2, -1)[..., None]
    R = np.asarray(Q.rotation_matrix(a))
    Rx = (R @ np.asarray(x)[..., None])[..., 0]
    # eq. (27): A (0, x) A* = (0, s R x), product computed with mul
    prod = Q.mul(Q.mul(a, pure(x)), Q.conjugate(a))
    assert_close(prod[..., 0] / s[..., 0], np.zeros(s.shape[:-1]), atol=1e-13)
    assert_close(prod[..., 1:] / s, Q.transform(a, x) / s, atol=1e-13)
    assert_close(Q.transform(a, x) / s, Rx, atol=1e-13)
    assert_close(Q.rotate(a, x), Rx, atol=1e-13)
    Rtx = (np.swapaxes(R, -1, -2) @ np.asarray(x)[..., None])[..., 0]
    assert_close(Q.rotate_inverse(a, x), Rtx, atol=1e-13)
    assert_close(Q.rotate_inverse(a, Q.rotate(a, x)), x, atol=1e-13)


@given(quat_batch(kinds=("generic", "unit", "big", "half_turn")), st.data())
def test_from_axis_angle_eq28_eq30(q, data):
    shape = np.shape(q)[:-1]
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    axis = rng.normal(size=shape + (3,)) * rng.uniform(0.1, 10.0, size=shape + (1,))
    ang = rng.uniform(-2 * np.pi, 2 * np.pi, size=shape)
    s = rng.uniform(0.2, 5.0, size=shape)
    n = axis / np.linalg.norm(axis, axis=-1, keepdims=True)
    A = Q.from_axis_angle(jnp.asarray(axis), jnp.asarray(ang), jnp.asarray(s))
    # eq. (30) literally
    expected = np.sqrt(s)[..., None] * np.concatenate(
        [np.cos(ang / 2)[..., None], n * np.sin(ang / 2)[..., None]], -1
    )
    assert_close(A, expected)
    # eq. (29)-(30): A (0, x) A* = (0, s R x) with R of Rodrigues' formula eq. (28)
    sR = s[..., None, None] * rodrigues(n, ang)
    assert_close(Q.A_matrix(A), sR, atol=1e-12)
    assert_close(Q.rotation_matrix(A), rodrigues(n, ang), atol=1e-13)
    assert_close(Q.scale(A), s)
    # the default scale is 1: a unit quaternion
    assert_close(Q.norm(Q.from_axis_angle(jnp.asarray(axis), jnp.asarray(ang))), np.ones(shape))


def test_from_axis_angle_zero_axis_gives_identity_with_finite_gradients():
    z = jnp.zeros(3)
    assert_close(Q.from_axis_angle(z, 0.0), [1.0, 0.0, 0.0, 0.0], atol=0)
    g_axis = jax.grad(lambda ax: jnp.sum(Q.from_axis_angle(ax, 0.0)))(z)
    g_ang = jax.grad(lambda t: jnp.sum(Q.from_axis_angle(z, t)))(0.0)
    assert np.all(np.isfinite(g_axis))
    assert np.isfinite(g_ang)
    # d/dφ of (cos φ/2, 0) at 0 is 0, and the zero axis contributes nothing
    assert_close(g_ang, 0.0, atol=0)


@given(quat_batch())
def test_to_axis_angle_roundtrip(a):
    axis, ang = Q.to_axis_angle(a)
    assert axis.shape == np.shape(a)[:-1] + (3,)
    assert_close(np.linalg.norm(np.asarray(axis), axis=-1), np.ones(ang.shape), atol=1e-14)
    assert np.all((np.asarray(ang) >= 0) & (np.asarray(ang) <= np.pi + 1e-15))
    back = Q.from_axis_angle(axis, ang, Q.scale(a))
    assert_equal_up_to_sign(back / _n(a), np.asarray(a) / _n(a), atol=1e-12)
    # same rotation through Rodrigues' formula, eq. (28)
    assert_close(Q.rotation_matrix(a), rodrigues(np.asarray(axis), np.asarray(ang)), atol=1e-12)


def test_to_axis_angle_special_values():
    axis, ang = Q.to_axis_angle(Q.identity())
    assert_close(axis, [1.0, 0.0, 0.0], atol=0)
    assert float(ang) == 0.0
    axis, ang = Q.to_axis_angle(jnp.array([0.0, 0.0, 0.0, 2.0]))
    assert_close(axis, [0.0, 0.0, 1.0], atol=0)
    assert_close(ang, np.pi)
    axis, ang = Q.to_axis_angle(jnp.array([-np.cos(0.2), 0.0, -np.sin(0.2), 0.0]))
    assert_close(axis, [0.0, 1.0, 0.0])
    assert_close(ang, 0.4)


# --------------------------------------------------------------------- from_matrix / scipy


@given(quat_batch())
def test_from_matrix_roundtrip(a):
    u = np.asarray(a) / _n(a)
    q = Q.from_matrix(Q.to_matrix(a))
    assert_close(np.linalg.norm(np.asarray(q), axis=-1), np.ones(q.shape[:-1]), atol=1e-14)
    assert_equal_up_to_sign(q, u, atol=1e-12)
    # a0 >= 0 wherever a0 is not (numerically) zero
    assert np.all(np.asarray(q)[..., 0] >= -1e-12)


@settings(max_examples=25)
@given(st.integers(0, 2**32 - 1), st.sampled_from(SHAPES))
def test_from_matrix_exact_half_turns(seed, shape):
    rng = np.random.default_rng(seed)
    n = _unit3(rng, shape)
    R = rodrigues(n, np.full(shape, np.pi))  # exactly-180° matrix from Rodrigues, trace = -1
    q = Q.from_matrix(jnp.asarray(R))
    assert_equal_up_to_sign(q, np.concatenate([np.zeros(shape + (1,)), n], -1), atol=1e-12)
    assert_close(Q.to_matrix(q), R, atol=1e-12)


@pytest.mark.parametrize("k", [0, 1, 2])
def test_from_matrix_coordinate_half_turns(k):
    R = -np.eye(3)
    R[k, k] = 1.0
    q = Q.from_matrix(jnp.asarray(R))
    expected = np.zeros(4)
    expected[k + 1] = 1.0
    assert_equal_up_to_sign(q, expected, atol=0)
    assert_close(Q.from_matrix(jnp.eye(3)), [1.0, 0.0, 0.0, 0.0], atol=0)


@given(quat_batch())
def test_matrix_against_scipy(a):
    a_np = np.asarray(a)
    flat = a_np.reshape(-1, 4)
    rot = Rotation.from_quat(flat[:, [1, 2, 3, 0]])  # scipy: scalar LAST (x, y, z, w)
    assert_close(Q.to_matrix(a), rot.as_matrix().reshape(a_np.shape[:-1] + (3, 3)), atol=1e-13)
    q_sp = rot.as_quat()[:, [3, 0, 1, 2]].reshape(a_np.shape)
    assert_equal_up_to_sign(
        Q.from_matrix(jnp.asarray(rot.as_matrix()).reshape(a_np.shape[:-1] + (3, 3))),
        q_sp,
        atol=1e-12,
    )
    # 2 log(A) is scipy's rotation vector (angle in [0, pi])
    rv = rot.as_rotvec().reshape(a_np.shape[:-1] + (3,))
    lg2 = 2.0 * np.asarray(Q.log(a))
    # at exactly pi the rotation vectors n*pi and -n*pi are the same rotation
    half_turn = np.linalg.norm(rv, axis=-1, keepdims=True) > np.pi - 1e-9
    flip = half_turn & (np.sum(lg2 * rv, -1, keepdims=True) < 0)
    assert_close(lg2, np.where(flip, -rv, rv), atol=1e-11)


# ---------------------------------------------------------------------- exp / log / slerp


@given(
    st.sampled_from(SHAPES),
    st.integers(0, 2**32 - 1),
    st.sampled_from([1e-12, 1e-6, 1e-4, 0.1, 1.0, 1.5]),
)
def test_exp_log_roundtrip(shape, seed, mag):
    rng = np.random.default_rng(seed)
    v = mag * _unit3(rng, shape) * rng.uniform(0.5, 1.0, size=shape + (1,))
    q = Q.exp(jnp.asarray(v))
    th = np.linalg.norm(v, axis=-1, keepdims=True)
    expected = np.concatenate([np.cos(th), v * np.sin(th) / th], -1)
    assert_close(q, expected, atol=1e-15, rtol=1e-14)
    assert_close(Q.norm(q), np.ones(shape), atol=1e-15)
    # |v| < pi/2: log is the exact inverse
    assert_close(Q.log(q), v, atol=1e-15, rtol=1e-12)


@given(quat_batch())
def test_log_exp_roundtrip_and_branch(a):
    lg = Q.log(a)
    assert np.all(np.linalg.norm(np.asarray(lg), axis=-1) <= np.pi / 2 + 1e-12)
    assert_equal_up_to_sign(Q.exp(lg), np.asarray(a) / _n(a), atol=1e-12)
    # shortest branch: A and -A have the same log
    assert_close(Q.log(-a), lg, atol=0)
    # scale invariant: log of A/|A|
    assert_close(Q.log(3.0 * a), lg, atol=1e-14)


def test_exp_log_special_values():
    assert_close(Q.exp(jnp.zeros(3)), [1.0, 0.0, 0.0, 0.0], atol=0)
    assert_close(Q.log(Q.identity()), np.zeros(3), atol=0)
    assert_close(Q.log(-Q.identity()), np.zeros(3), atol=0)
    assert_close(Q.log(jnp.array([0.0, 1.0, 0.0, 0.0])), [np.pi / 2, 0.0, 0.0])
    assert_close(Q.exp(jnp.array([0.0, 0.0, np.pi / 2])), [0.0, 0.0, 0.0, 1.0], atol=1e-16)


def exp_jac_ref(v):
    """d exp(v)/dv = [-sinc(θ) v^T ; sinc(θ) I + (cos θ - sinc θ)/θ² v v^T]."""
    th = np.linalg.norm(v)
    sinc = np.sin(th) / th
    return np.vstack([-sinc * v, sinc * I3 + (np.cos(th) - sinc) / th**2 * np.outer(v, v)])


def log_jac_ref(q):
    """d log(q)/dq for log = f a, f = atan2(n, a0)/n, n = |a| (a0 > 0)."""
    a0, a = q[0], q[1:]
    n = np.linalg.norm(a)
    f = np.arctan2(n, a0) / n
    r2 = a0**2 + n**2
    df_dn = (a0 / r2 - f) / n
    return np.hstack([(-a / r2)[:, None], f * I3 + df_dn / n * np.outer(a, a)])


@pytest.mark.parametrize("r", [0.5, 0.99, 1.0, 1.01, 2.0])
def test_exp_log_continuous_across_taylor_threshold(r):
    """Value and Jacobian just below/above the dtype-aware Taylor threshold θ = eps^(1/4)."""
    thr = np.finfo(np.float64).eps ** 0.25
    n = np.array([0.6, -0.8, 0.0])
    v = r * thr * n
    th = r * thr
    q = Q.exp(jnp.asarray(v))
    assert_close(q, np.concatenate([[np.cos(th)], n * np.sin(th)]), atol=1e-16, rtol=1e-15)
    assert_close(jax.jacfwd(Q.exp)(jnp.asarray(v)), exp_jac_ref(v), atol=1e-12)
    assert_close(Q.log(q), v, atol=1e-19, rtol=1e-13)
    qs = 1.7 * np.asarray(q)  # non-unit: the Taylor test of log is scale-relative
    assert_close(jax.jacfwd(Q.log)(jnp.asarray(qs)), log_jac_ref(qs), atol=1e-12)


@given(quat_batch(kinds=("unit", "near_identity", "half_turn", "axis_half_turn")), st.data())
def test_slerp_follows_geodesic(a, data):
    a = a / jnp.linalg.norm(a, axis=-1, keepdims=True)
    shape = np.shape(a)[:-1]
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    mag = data.draw(st.sampled_from([1e-12, 1e-7, 1e-4, 1e-2, 0.5, 1.5]))
    w = mag * _unit3(rng, shape)  # |w| < pi/2: a·b > 0, the shortest path is unambiguous
    b = Q.mul(a, Q.exp(jnp.asarray(w)))
    t = jnp.asarray(rng.uniform(-0.2, 1.2, size=shape))
    expected = Q.mul(a, Q.exp(t[..., None] * w))
    assert_close(Q.slerp(a, b, t), expected, atol=2e-15 * 4, rtol=0)
    # shortest path: B and -B give the same curve
    assert_close(Q.slerp(a, -b, t), expected, atol=1e-14, rtol=0)
    assert_close(Q.norm(Q.slerp(a, b, t)), np.ones(shape), atol=1e-14)


@given(quat_batch(2, kinds=("unit", "half_turn", "axis_half_turn", "near_identity")))
def test_slerp_endpoints_and_constant_speed(ab):
    a, b = ab
    a = a / jnp.linalg.norm(a, axis=-1, keepdims=True)
    b = b / jnp.linalg.norm(b, axis=-1, keepdims=True)
    assert_close(Q.slerp(a, b, 0.0), a, atol=1e-15)
    assert_equal_up_to_sign(Q.slerp(a, b, 1.0), b, atol=1e-12)
    total = quat_angle(
        a, np.where(np.sum(np.asarray(a) * np.asarray(b), -1, keepdims=True) < 0, -b, b)
    )
    assert np.all(total <= np.pi / 2 + 1e-12)  # shortest path on S³
    ts = np.linspace(0.0, 1.0, 6)
    pts = [np.asarray(Q.slerp(a, b, t)) for t in ts]
    for t, p in zip(ts, pts, strict=True):
        assert_close(quat_angle(a, p), t * total, atol=1e-7)
    steps = [quat_angle(p, r) for p, r in zip(pts[:-1], pts[1:], strict=True)]
    for s in steps:
        assert_close(s, total / 5, atol=1e-7)


# ---------------------------------------------------------------- Negrut ME751: E, G, A, B


@given(quat_batch(), st.data())
def test_E_G_A_B_against_me751_formulas(p, data):
    sbar = data.draw(vec_batch(np.shape(p)[:-1], scale=2.0))
    sc = _n(p)[..., None]
    E, G = np.asarray(Q.E(p)), np.asarray(Q.G(p))
    assert E.shape == np.shape(p)[:-1] + (3, 4)
    assert_close(E, E_ref(p), atol=0)
    assert_close(G, G_ref(p), atol=0)
    # A = E G^T = s R (a transform matrix for a non-unit p)
    A = np.asarray(Q.A_matrix(p))
    assert_close(A / sc**2, (E @ np.swapaxes(G, -1, -2)) / sc**2, atol=1e-14)
    assert_close(A / sc**2, np.asarray(Q.rotation_matrix(p)), atol=1e-14)
    # E E^T = G G^T = |p|^2 I,  E p = G p = 0
    eye = np.broadcast_to(I3, A.shape)
    assert_close(E @ np.swapaxes(E, -1, -2) / sc**2, eye, atol=1e-14)
    assert_close(G @ np.swapaxes(G, -1, -2) / sc**2, eye, atol=1e-14)
    zero = np.zeros(np.shape(p)[:-1] + (3,))
    assert_close((E @ np.asarray(p)[..., None])[..., 0] / sc[..., 0], zero, atol=1e-14)
    assert_close((G @ np.asarray(p)[..., None])[..., 0] / sc[..., 0], zero, atol=1e-14)
    # B against its written-out formula
    Bq = np.asarray(Q.B(p, sbar))
    assert Bq.shape == np.shape(p)[:-1] + (3, 4)
    assert_close(Bq / sc, B_ref(p, sbar) / sc, atol=1e-13)


@settings(max_examples=25)
@given(quat_batch(), st.data())
def test_B_is_jacobian_of_A_sbar(p, data):
    sbar = data.draw(vec_batch(np.shape(p)[:-1], scale=2.0))
    shape = np.shape(p)[:-1]

    # forward-mode Jacobian of the batched map, one basis tangent per column (= jacfwd)
    def column(k):
        tangent = jnp.zeros_like(p).at[..., k].set(1.0)
        return jax.jvp(lambda q: Q.transform(q, sbar), (p,), (tangent,))[1]

    J = jnp.stack([column(k) for k in range(4)], -1)
    assert J.shape == shape + (3, 4)
    # and literally jax.jacfwd of p -> E(p) G(p)^T s̄ for the first sample
    p0, s0 = p.reshape(-1, 4)[0], sbar.reshape(-1, 3)[0]
    J0 = jax.jacfwd(lambda q: Q.A_matrix(q) @ s0)(p0)
    assert_close(Q.B(p0, s0) / jnp.linalg.norm(p0), J0 / jnp.linalg.norm(p0), atol=1e-13)
    sc = _n(p)[..., None]
    assert_close(Q.B(p, sbar) / sc, J / sc, atol=1e-13)


# ---------------------------------------------------------------------- gradients


W4 = jnp.array([0.3, -1.1, 0.7, 0.2])
W3 = jnp.array([0.5, 1.3, -0.4])
W33 = jnp.array([[0.2, -0.5, 1.0], [0.7, 0.1, -0.3], [0.9, -1.2, 0.4]])

GRAD_FUNS = {
    "norm": lambda q: Q.norm(q),
    "inverse": lambda q: Q.inverse(q) @ W4,
    "rotation_matrix": lambda q: jnp.sum(W33 * Q.rotation_matrix(q)),
    "from_matrix": lambda q: Q.from_matrix(Q.rotation_matrix(q)) @ W4,
    "to_axis_angle": lambda q: Q.to_axis_angle(q)[0] @ W3 + Q.to_axis_angle(q)[1],
    "log": lambda q: Q.log(q) @ W3,
    "exp": lambda q: Q.exp(2.0 * Q.log(q)) @ W4,
    "slerp_from_identity": lambda q: Q.slerp(Q.identity(), q, 0.3) @ W4,
    "slerp_to_self": lambda q: Q.slerp(q, q, 0.3) @ W4,
    "slerp_antipodal": lambda q: Q.slerp(q, -q, 0.7) @ W4,
}

GRAD_POINTS = {
    "identity": [1.0, 0.0, 0.0, 0.0],
    "minus_identity": [-1.0, 0.0, 0.0, 0.0],
    "half_turn_x": [0.0, 1.0, 0.0, 0.0],
    "half_turn_z": [0.0, 0.0, 0.0, 1.0],
    "half_turn_oblique": [0.0, 0.48, 0.6, 0.64],
    "generic": [0.5, -0.5, 0.1, 0.7],
}


@pytest.mark.parametrize("point", list(GRAD_POINTS))
@pytest.mark.parametrize("name", list(GRAD_FUNS))
def test_gradients_finite_at_identity_and_half_turns(name, point):
    q = jnp.asarray(GRAD_POINTS[point])
    q = q / jnp.linalg.norm(q)
    g = jax.grad(GRAD_FUNS[name])(q)
    assert g.shape == (4,)
    assert np.all(np.isfinite(np.asarray(g))), (name, point, g)


@pytest.mark.parametrize(
    "R",
    [np.eye(3), np.diag([1.0, -1.0, -1.0]), np.diag([-1.0, 1.0, -1.0]), np.diag([-1.0, -1.0, 1.0])],
    ids=["identity", "x180", "y180", "z180"],
)
def test_from_matrix_gradient_wrt_matrix_finite(R):
    g = jax.grad(lambda m: Q.from_matrix(m) @ W4)(jnp.asarray(R))
    assert g.shape == (3, 3)
    assert np.all(np.isfinite(np.asarray(g)))


def test_exp_gradient_finite_at_zero_and_half_turn():
    for v in (jnp.zeros(3), jnp.array([0.0, 0.0, np.pi / 2])):
        J = jax.jacrev(Q.exp)(v)
        assert np.all(np.isfinite(np.asarray(J)))
    # at 0: d exp(v)/dv = [0; I]
    assert_close(jax.jacfwd(Q.exp)(jnp.zeros(3)), np.vstack([np.zeros(3), I3]), atol=0)
    # at the identity: d log(q)/dq = [0, I]
    assert_close(jax.jacfwd(Q.log)(Q.identity()), np.hstack([np.zeros((3, 1)), I3]), atol=0)


def _central_diff(f, x, h=1e-6):
    x = np.asarray(x, dtype=np.float64)
    g = np.zeros_like(x)
    for i in range(x.size):
        e = np.zeros_like(x)
        e.flat[i] = h
        g.flat[i] = (float(f(jnp.asarray(x + e))) - float(f(jnp.asarray(x - e)))) / (2 * h)
    return g


def test_gradient_matches_central_differences():
    q = jnp.array([0.9, -0.3, 0.5, 0.4])  # non-unit

    def f(q):
        b = Q.from_axis_angle(jnp.array([0.1, 0.7, -0.2]), 2.0)
        return (
            jnp.sum(W33 * Q.rotation_matrix(q))
            + Q.log(q) @ W3
            + Q.slerp(q / Q.norm(q), b, 0.35) @ W4
            + Q.to_axis_angle(q)[1]
            + Q.from_matrix(Q.to_matrix(q)) @ W4
        )

    f = jax.jit(f)
    assert_close(jax.jit(jax.grad(f))(q), _central_diff(f, q), rtol=1e-7, atol=1e-8)
    # forward and reverse modes (jvp / vjp) against jax's own numerical checker
    check_grads(Q.log, (q,), order=1, modes=["fwd", "rev"])
    check_grads(lambda t: Q.slerp(q / Q.norm(q), Q.identity(), t) @ W4, (0.4,), order=1)


# ----------------------------------------------------------- transformations and layouts


def test_jit_vmap_jvp_composition():
    rng = np.random.default_rng(0)
    qs = jnp.asarray(rng.normal(size=(7, 4)))
    xs = jnp.asarray(rng.normal(size=(7, 3)))
    assert_close(jax.jit(Q.mul)(qs, qs[::-1]), Q.mul(qs, qs[::-1]), atol=1e-15)
    assert_close(jax.vmap(Q.rotation_matrix)(qs), Q.rotation_matrix(qs), atol=1e-15)
    assert_close(jax.jit(jax.vmap(Q.transform))(qs, xs), Q.transform(qs, xs), atol=1e-14)
    assert_close(
        jax.vmap(Q.from_matrix)(Q.to_matrix(qs)), Q.from_matrix(Q.to_matrix(qs)), atol=1e-15
    )
    assert_close(jax.jit(Q.B)(qs, xs), Q.B(qs, xs), atol=1e-15)
    # jvp of exp: tangent equals the directional derivative from the closed form
    v = jnp.array([0.3, -0.2, 0.5])
    dv = jnp.array([0.1, 0.4, -0.3])
    _, tang = jax.jvp(Q.exp, (v,), (dv,))
    h = 1e-6
    assert_close(tang, (Q.exp(v + h * dv) - Q.exp(v - h * dv)) / (2 * h), rtol=1e-8, atol=1e-10)


def test_mixed_batch_broadcasting():
    rng = np.random.default_rng(1)
    a = jnp.asarray(rng.normal(size=(2, 5, 4)))
    b = jnp.asarray(rng.normal(size=(5, 4)))
    x = jnp.asarray(rng.normal(size=(3,)))
    assert Q.mul(a, b).shape == (2, 5, 4)
    assert_close(Q.mul(a, b)[1], Q.mul(a[1], b), atol=0)
    assert Q.transform(a, x).shape == (2, 5, 3)
    assert_close(Q.transform(a, x)[1, 2], Q.transform(a[1, 2], x), atol=0)
    assert_close(Q.rotate(b[0], jnp.stack([x, 2 * x]))[1], 2 * Q.rotate(b[0], x), atol=1e-15)
    assert Q.B(b[:1], jnp.stack([x, x, x])).shape == (3, 3, 4)
    t = jnp.linspace(0.0, 1.0, 5)
    bu = b / jnp.linalg.norm(b, axis=-1, keepdims=True)
    out = Q.slerp(bu[0], bu[1], t[:, None])
    assert out.shape == (5, 1, 4)
    assert_close(out[:, 0][2], Q.slerp(bu[0], bu[1], t[2]), atol=0)


@pytest.mark.parametrize(
    "fn",
    [
        lambda q: Q.exp(q[1:]),
        lambda q: Q.log(q),
        lambda q: Q.slerp(q, Q.identity(q.dtype), 0.3),
        lambda q: Q.from_matrix(Q.to_matrix(q)),
        lambda q: Q.to_axis_angle(q)[0],
        lambda q: Q.norm(q),
        lambda q: Q.B(q, q[1:]),
        lambda q: Q.from_axis_angle(q[1:], q[0]),
    ],
    ids=["exp", "log", "slerp", "from_matrix", "to_axis_angle", "norm", "B", "from_axis_angle"],
)
def test_float32_stays_float32(fn):
    q64 = jnp.array([0.8, 0.1, -0.5, 0.3])
    q32 = q64.astype(jnp.float32)
    out32 = fn(q32)
    assert out32.dtype == jnp.float32
    assert_close(out32, fn(q64), rtol=1e-5, atol=1e-6)


def test_public_names():
    from rbjax import _quaternion

    public = {
        n for n in dir(_quaternion) if not n.startswith("_") and callable(getattr(_quaternion, n))
    }
    public -= {"annotations", "Array", "ArrayLike", "Float"}
    public = {
        n
        for n in public
        if getattr(getattr(_quaternion, n), "__module__", "") == _quaternion.__name__
    }
    assert public, "no public functions found"
    assert public | {"T_MATRIX"} == set(Q.__all__)
    for name in Q.__all__:
        assert getattr(Q, name) is getattr(_quaternion, name)
    assert math.isclose(float(Q.T_MATRIX[1, 1]), -1.0)
