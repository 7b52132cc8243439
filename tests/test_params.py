"""Physically consistent parameterisations: every raw value is a physical body; round trips.

References: numpy eigen-decompositions and the triangle inequalities (not the code under
test), central finite differences for gradients.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rbjax
from rbjax import quaternion as quat


def _random_rotation(rng):
    a = rng.normal(size=4)
    return np.asarray(quat.rotation_matrix(jnp.asarray(a / np.linalg.norm(a))))


@pytest.mark.parametrize("kind", ["softplus", "log"])
def test_positive_round_trip_and_gradient(kind):
    """from_value ∘ value is the identity (1e-13) from 1e-8 to 1e8, and d value/d raw equals
    a central difference (step scaled with |raw|)."""
    x = np.array([1e-8, 1e-3, 0.7, 3.0, 1e3, 1e8])
    p = rbjax.Positive.from_value(x, kind=kind)
    err = np.max(np.abs(np.asarray(p.value) - x) / x)
    assert err <= 1e-13, err
    v = lambda r: rbjax.Positive(r, kind=kind).value  # noqa: E731 (elementwise)
    g = np.asarray(jax.jvp(v, (p.raw,), (jnp.ones_like(p.raw),))[1])
    h = 1e-6 * np.maximum(1.0, np.abs(np.asarray(p.raw)))
    fd = (np.asarray(v(p.raw + h)) - np.asarray(v(p.raw - h))) / (2 * h)
    err_fd = np.max(np.abs(g - fd) / np.abs(fd))
    assert err_fd <= 1e-6, f"gradient vs central differences {err_fd:.3g}"


def test_positive_floor_and_errors():
    """A floor shifts the range; values at or below it, or non-finite, raise naming the field."""
    p = rbjax.Positive.from_value(2.5, floor=1.0)
    assert abs(float(p.value) - 2.5) <= 1e-14
    assert float(rbjax.Positive(jnp.asarray(-5.0), floor=1.0).value) > 1.0
    for bad in (0.5, np.nan, -1.0):
        with pytest.raises(ValueError, match=r"Positive.from_value\(x\)"):
            rbjax.Positive.from_value(bad, floor=1.0 if bad == 0.5 else 0.0)
    with pytest.raises(ValueError, match="Positive.kind"):
        rbjax.Positive.from_value(1.0, kind="exp")


def test_principal_inertia_round_trip_random_bodies():
    """from_matrix(Θ).matrix == Θ to 1e-12 relative for random physical inertias with random
    axes, for an axisymmetric body (equal moments: axes not unique, matrix must still round
    trip) and for a near-lamina (I3 ≈ I1 + I2)."""
    rng = np.random.default_rng(0)
    cases = []
    for _ in range(20):
        s = rng.uniform(0.01, 2.0, size=3)  # second moments -> physical moments
        moments = s.sum() - s
        r = _random_rotation(rng)
        cases.append(r @ np.diag(moments) @ r.T)
    r = _random_rotation(rng)
    cases.append(r @ np.diag([1.0, 1.0, 1.5]) @ r.T)  # axisymmetric
    cases.append(np.diag([1.0, 2.0, 3.0 - 1e-9]))  # near-lamina
    worst = 0.0
    for th in cases:
        out = np.asarray(rbjax.PrincipalInertia.from_matrix(th).matrix)
        worst = max(worst, np.max(np.abs(out - th)) / np.max(np.abs(th)))
    assert worst <= 1e-12, f"round trip {worst:.3g}"
    lam = rbjax.PrincipalInertia.from_moments([1.0, 2.0, 3.0])  # exact lamina: finite raw
    assert np.all(np.isfinite(np.asarray(lam.raw_moments)))
    assert np.max(np.abs(np.asarray(lam.moments) - [1.0, 2.0, 3.0])) <= 1e-11


@settings(max_examples=40)
@given(
    st.lists(st.floats(-30, 30), min_size=3, max_size=3),
    st.lists(st.floats(-5, 5), min_size=4, max_size=4).filter(lambda a: np.linalg.norm(a) > 1e-3),
)
def test_every_raw_value_is_a_physical_inertia(raw_m, raw_q):
    """For any raw values: Θ symmetric, positive semi-definite, triangle inequalities hold to
    rounding (numpy eigvalsh), and the gradient of a function of Θ is finite."""
    p = rbjax.PrincipalInertia(jnp.asarray(raw_m), jnp.asarray(raw_q))
    th = np.asarray(p.matrix)
    assert np.allclose(th, th.T, atol=1e-12 * np.abs(th).max())
    w = np.linalg.eigvalsh(0.5 * (th + th.T))
    tol = 1e-10 * w.sum()
    assert w[0] >= -tol and w[0] + w[1] >= w[2] - tol, w
    g = jax.grad(lambda pp: jnp.sum(jnp.sin(pp.matrix)))(p)
    assert np.all(np.isfinite(np.asarray(g.raw_moments)))
    assert np.all(np.isfinite(np.asarray(g.raw_rotation)))


def test_principal_inertia_gradient_matches_finite_differences_and_batches():
    """jax.grad of a function of Θ w.r.t. both raw leaves equals central differences (1e-7),
    and a batch of raw leaves gives the batch of matrices (vmap equality)."""
    p = rbjax.PrincipalInertia(jnp.asarray([0.3, -0.2, 1.1]), jnp.asarray([0.9, 0.2, -0.3]))
    f = lambda m, q: jnp.sum(
        jnp.cos(rbjax.PrincipalInertia(m, q).matrix) * jnp.arange(9.0).reshape(3, 3)
    )  # noqa: E731
    gm, gq = jax.grad(f, argnums=(0, 1))(p.raw_moments, p.raw_rotation)
    h = 1e-6
    for x, g, arg in ((p.raw_moments, gm, 0), (p.raw_rotation, gq, 1)):
        for i in range(x.shape[0]):
            args_p = [p.raw_moments, p.raw_rotation]
            args_m = [p.raw_moments, p.raw_rotation]
            args_p[arg] = x.at[i].add(h)
            args_m[arg] = x.at[i].add(-h)
            fd = (f(*args_p) - f(*args_m)) / (2 * h)
            assert abs(float(g[i]) - float(fd)) <= 1e-7 * max(1.0, abs(float(fd)))
    rng = np.random.default_rng(1)
    rm, rq = jnp.asarray(rng.normal(size=(5, 3))), jnp.asarray(rng.normal(size=(5, 3)))
    batched = np.asarray(rbjax.PrincipalInertia(rm, rq).matrix)
    single = np.asarray(jax.vmap(lambda a, b: rbjax.PrincipalInertia(a, b).matrix)(rm, rq))
    assert np.max(np.abs(batched - single)) <= 1e-14


def test_principal_inertia_ratios_scale_and_errors():
    """ratios = I / (½ tr Θ) is scale-free; non-physical inputs raise naming the field."""
    p = rbjax.PrincipalInertia.from_moments([1.0, 2.0, 2.5])
    q = rbjax.PrincipalInertia.from_moments([10.0, 20.0, 25.0])
    assert np.max(np.abs(np.asarray(p.ratios) - np.asarray(q.ratios))) <= 1e-13
    assert abs(float(q.scale) / float(p.scale) - 10.0) <= 1e-12
    with pytest.raises(ValueError, match="triangle inequality"):
        rbjax.PrincipalInertia.from_moments([1.0, 1.0, 3.0])
    with pytest.raises(ValueError, match="positive definite"):
        rbjax.PrincipalInertia.from_matrix(np.diag([1.0, -1.0, 1.0]))
    with pytest.raises(ValueError, match="PrincipalInertia moments"):
        rbjax.PrincipalInertia.from_moments([1.0, np.nan, 1.0])


def test_float32_works():
    """float32 raw leaves give a float32 matrix that round-trips to float32 precision."""
    p = rbjax.PrincipalInertia.from_moments([1.0, 2.0, 2.5], dtype=jnp.float32)
    assert p.matrix.dtype == jnp.float32
    assert np.max(np.abs(np.asarray(p.moments) - [1.0, 2.0, 2.5])) <= 1e-5
