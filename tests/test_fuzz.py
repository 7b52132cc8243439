"""Fuzzing (issue 18 §5): invalid input gives a named error or a result code, never a silent
result; valid input gives a result whose invariants hold. Every verdict is recomputed here with
NumPy, independently of rbjax's checks. Plus a 10⁶-step soak (``slow``)."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import rbjax

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

finite = st.floats(-10.0, 10.0, allow_nan=False, allow_infinity=False)
anything = st.one_of(
    finite,
    st.sampled_from([0.0, -0.0, np.nan, np.inf, -np.inf, 1e-300, 1e300, -1.0]),
)


def _physical_inertia(th: np.ndarray) -> bool:
    """Symmetric, positive definite beyond rounding, triangle inequality: NumPy's verdict."""
    if not np.all(np.isfinite(th)):
        return False
    scale = np.abs(th).max()
    if scale == 0 or np.abs(th - th.T).max() > 1e-12 * scale:
        return False
    w = np.linalg.eigvalsh(th)
    return bool(w[0] > 2.3e-13 * w[2] and w[0] + w[1] >= w[2] - 1e-12 * w.sum())


@SETTINGS
@given(mass=anything, entries=st.lists(anything, min_size=6, max_size=6))
def test_body_construction_is_valid_or_a_named_error(mass, entries):
    a, b, c, d, e, f = entries
    th = np.array([[a, d, e], [d, b, f], [e, f, c]])
    valid = np.isfinite(mass) and mass > 0 and _physical_inertia(th)
    try:
        body = rbjax.Body(mass, th)
    except ValueError as err:
        assert not valid, err
        assert "Fix:" in str(err) and str(err).startswith("body.")
        return
    assert valid
    assert float(body.mass) == mass and np.array_equal(np.asarray(body.inertia), th)


@SETTINGS
@given(
    quat=st.lists(anything, min_size=4, max_size=4),
    nu=anything,
    rows=st.integers(0, 3),
)
def test_state_checks_are_a_result_or_a_named_error(quat, nu, rows):
    model = rbjax.Model(rbjax.Body(1.0, np.diag([1.0, 2.0, 2.5])))
    q = np.zeros((rows, 7)) if rows != 1 else np.array([[0.0, 0.0, 0.0, *quat]])
    u = np.zeros((rows, 7))
    if rows == 1:
        u[0, 3] = nu
    with np.errstate(over="ignore", invalid="ignore"):
        a2 = np.sum(np.asarray(quat) ** 2) if rows == 1 else np.nan
    valid = rows == 1 and np.isfinite(a2) and abs(a2 - 1) <= 1e-9 and np.isfinite(nu) and nu == 0
    try:
        state = rbjax.State(t=0.0, q=q, u=u)
        model.check_state(state)
    except ValueError as err:
        assert not valid, err
        assert "Fix:" in str(err)
        return
    assert valid


@jax.jit
def _traced_run(mass, moments, dt, scale, nu):
    model = rbjax.Model(rbjax.Body(1.0, np.diag([1.0, 2.0, 2.5])), gravity=[0, 0, -9.81])
    model = eqx.tree_at(lambda m: (m.mass, m.inertia), model, (mass[None], jnp.diag(moments)[None]))
    q = jnp.asarray([[0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]]) * jnp.where(
        jnp.arange(7) >= 3, scale, 1.0
    )
    u = jnp.asarray([[0.0, 0.0, 0.0, 0.0, 0.3, 2.0, 0.1]]).at[0, 3].set(nu)
    traj = rbjax.rollout(model, rbjax.State(t=0.0, q=q, u=u), dt, 20, throw=False)
    return traj.result, traj.q[-1]


@SETTINGS
@given(
    mass=anything,
    moments=st.lists(
        st.one_of(st.floats(-1.0, 4.0), st.sampled_from([0.0, np.nan])), min_size=3, max_size=3
    ),
    dt=st.one_of(st.floats(-0.01, 0.05), st.sampled_from([0.0, np.nan])),
    scale=st.sampled_from([1.0, 1.0, 2.0, 0.5, 1.0 + 1e-12]),
    nu=st.sampled_from([0.0, 0.0, 0.5, 1e-12]),
)
def test_traced_inputs_give_a_result_code_never_a_silent_result(mass, moments, dt, scale, nu):
    """Under jax.jit the eager checks cannot see the values: an invalid traced input must come
    back as RESULTS.invalid_input, a valid one as successful (or implausible when the step is
    too large for the monitors), with a finite state."""
    th = np.diag(moments)
    valid = (
        np.isfinite(mass)
        and mass > 0
        and _physical_inertia(th)
        and np.isfinite(dt)
        and dt > 0
        and abs(scale**2 - 1) <= 1e-9
        and nu == 0
    )
    code, q = _traced_run(
        jnp.asarray(mass),
        jnp.asarray(moments),
        jnp.asarray(dt),
        jnp.asarray(scale),
        jnp.asarray(nu),
    )
    code = int(code)
    if not valid:
        assert code == rbjax.RESULTS.invalid_input
    else:
        assert code in (rbjax.RESULTS.successful, rbjax.RESULTS.implausible)
        assert np.all(np.isfinite(np.asarray(q)))


@pytest.mark.slow
def test_soak_a_million_steps_of_a_tumbling_body():
    """10⁶ RK4 steps (1000 s at 1 ms) of a body tumbling about its unstable intermediate axis:
    the run succeeds, the monitors stay at the integrator's drift, and the energy and the
    angular momentum (both conserved, torque-free) drift by less than 1e-9 (recomputed from
    the saved states)."""
    model = rbjax.Model(rbjax.Body(1.0, np.diag([1.0, 2.0, 2.9])))
    s0 = rbjax.make_state(omega_body=[0.01, 3.0, 0.02])
    traj = rbjax.rollout(model, s0, 1e-3, 10**6, save_every=10**4)
    assert int(traj.result) == rbjax.RESULTS.successful
    e = np.asarray(rbjax.total_energy(model, traj.states))
    h = np.asarray(rbjax.angular_momentum(model, traj.states))
    assert np.max(np.abs(e - e[0])) / e[0] < 1e-9
    assert np.max(np.abs(h - h[0])) / np.linalg.norm(h[0]) < 1e-9
    assert float(traj.monitors["unit_length"]) < 1e-9
    # it flipped: the intermediate-axis spin reverses many times over 1000 s
    assert np.min(np.asarray(traj.u[:, 0, 5])) < -2.5
