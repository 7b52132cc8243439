"""rbjax.identify: recovery from synthetic data, Gauss–Newton covariance, identifiability.

References the identification code did not produce: the true parameters of the synthetic
data; the closed-form least-squares covariance σ²/Σt² of a linear problem (free fall, where
the position is linear in the initial velocity); the exact invariance of torque-free motion
under a uniform scaling of the inertia; a fine fixed-step rollout for irregular sample times.
"""

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest

import rbjax

INERTIA = np.diag([1.0, 2.0, 2.5])
W0 = np.array([0.3, 2.0, 0.1])


def _free_body(params):
    inertia = params["inertia"].matrix
    model = rbjax.Model(rbjax.Body(1.0, np.eye(3)))
    model = eqx.tree_at(lambda m: m.inertia, model, inertia[None])
    state = rbjax.make_state(omega_body=params["omega0"], nb=1)
    return model, state


def _spin_data(times, sigma=None, seed=0):
    model, state = _free_body(
        {"inertia": rbjax.PrincipalInertia.from_matrix(INERTIA), "omega0": jnp.asarray(W0)}
    )
    traj = rbjax.rollout(model, state, 1e-3, round(times[-1] / 1e-3))
    k = np.rint(np.asarray(times) / 1e-3).astype(int)
    w = np.asarray(traj.u[k, 0, 4:7])
    if sigma is not None:
        w = w + sigma * np.random.default_rng(seed).normal(size=w.shape)
    return w


def test_irregular_sample_times_are_hit_exactly():
    """Simulating at irregular sample times (the identify schedule) equals a fine fixed-step
    rollout at those times to the integrator's accuracy (RK4, 1e-9)."""
    times = np.array([0.0, 0.013, 0.2, 0.2071, 0.5, 0.911])
    model, state = _free_body(
        {"inertia": rbjax.PrincipalInertia.from_matrix(INERTIA), "omega0": jnp.asarray(W0)}
    )
    from rbjax._identify import _schedule, _trajectory

    hs, idx = _schedule(0.0, times, 0.01)
    assert abs(np.sum(hs) - times[-1]) <= 1e-15
    got = _trajectory(model, state, jnp.asarray(hs), jnp.asarray(idx), rbjax.RK4())
    fine = rbjax.rollout(model, state, 1e-4, 9110)
    k = np.rint(times / 1e-4).astype(int)
    err = np.max(np.abs(np.asarray(got.u[:, 0]) - np.asarray(fine.u[k, 0])))
    assert np.max(np.abs(np.asarray(got.t) - times)) <= 1e-14
    assert err <= 1e-9, f"irregular times vs fine rollout: {err:.3g}"


def test_recovers_inertia_ratios_and_spin_and_reports_the_scale():
    """Noise-free angular velocities over 1.5 s: L-BFGS recovers the moment ratios and ω0
    (1e-6), and reports the uniform inertia scaling, which torque-free motion cannot
    determine, by name instead of fitting it."""
    optimizer = "lbfgs"
    times = np.linspace(0.0, 1.5, 31)
    data = rbjax.Measurements(times, [rbjax.AngularVelocity(0, _spin_data(times), 0.01)])
    guess = {
        "inertia": rbjax.PrincipalInertia.from_matrix(np.diag([1.2, 1.9, 2.7])),
        "omega0": jnp.asarray([0.25, 2.1, 0.12]),
    }
    free = {"inertia": rbjax.PrincipalInertia(True, False), "omega0": True}  # axes fixed
    res = rbjax.identify(
        _free_body,
        guess,
        data,
        dt=0.01,
        free=free,
        optimizer=optimizer,
        max_steps=120,
    )
    est = res.params
    ratios = np.asarray(est["inertia"].ratios)
    true = np.diag(INERTIA) / (0.5 * np.trace(INERTIA))
    tol = 1e-6
    err = max(np.max(np.abs(ratios - true)), np.max(np.abs(np.asarray(est["omega0"]) - W0)))
    assert err <= tol, f"{optimizer}: ratios/omega0 error {err:.3g}\n{res.summary()}"
    assert len(res.unidentifiable) == 1, res.summary()
    assert "raw_moments" in res.unidentifiable[0]
    # the scale direction moves all three raw second moments together
    assert res.unidentifiable[0].count("raw_moments") == 3
    assert np.all(np.isinf(np.asarray(res.std_errors["inertia"].raw_moments)))
    assert np.all(np.isfinite(np.asarray(res.std_errors["omega0"])))


def _falling(params):
    model = rbjax.Model(rbjax.Body(1.0, INERTIA), gravity=[0.0, 0.0, -9.81])
    return model, rbjax.make_state(velocity=params["v0"], nb=1)


def test_covariance_matches_closed_form_linear_least_squares():
    """Free fall observed through noisy positions: z(t) = v0 t − g t²/2 is linear in v0, so
    the estimate is the least-squares solution and its standard error is σ/√Σt² exactly
    (RK4 integrates the quadratic exactly). Checked: estimate vs closed-form least squares
    (1e-9), standard error vs σ/√Σt² (1e-9 relative), reduced χ² near 1."""
    sigma = 0.02
    times = np.array([0.05, 0.11, 0.2, 0.37, 0.5, 0.61, 0.8, 0.93, 1.0])  # irregular
    v0 = np.array([0.5, -0.3, 4.0])
    rng = np.random.default_rng(3)
    clean = v0[None] * times[:, None] + np.array([0, 0, -0.5 * 9.81])[None] * times[:, None] ** 2
    meas = clean + sigma * rng.normal(size=clean.shape)
    data = rbjax.Measurements(times, [rbjax.Position(0, meas, sigma)])
    res = rbjax.identify(_falling, {"v0": jnp.zeros(3)}, data, dt=0.1)
    g = np.array([0, 0, -0.5 * 9.81])
    ls = np.sum((meas - g[None] * times[:, None] ** 2) * times[:, None], 0) / np.sum(times**2)
    std = sigma / np.sqrt(np.sum(times**2))
    err = np.max(np.abs(np.asarray(res.params["v0"]) - ls))
    err_std = np.max(np.abs(np.asarray(res.std_errors["v0"]) / std - 1.0))
    assert err <= 1e-9, f"estimate vs closed-form least squares {err:.3g}"
    assert err_std <= 1e-9, f"standard error vs σ/√Σt² {err_std:.3g}"
    assert 0.2 < res.reduced_chi2 < 3.0
    assert res.unidentifiable == ()


def test_masked_samples_and_orientation_observation():
    """Orientation observations with half the samples masked (the masked rows hold garbage)
    still recover ω0 from noise-free data (Adam, 1e-5); the masked values cannot matter."""
    times = np.linspace(0.0, 1.0, 21)
    model, state = _free_body(
        {"inertia": rbjax.PrincipalInertia.from_matrix(INERTIA), "omega0": jnp.asarray(W0)}
    )
    traj = rbjax.rollout(model, state, 1e-3, 1000)
    quats = np.array(traj.q[np.rint(times / 1e-3).astype(int), 0, 3:7])
    mask = np.arange(21) % 2 == 0
    quats[~mask] = [0.0, 1.0, 0.0, 0.0]
    data = rbjax.Measurements(times, [rbjax.Orientation(0, quats, 1e-3, mask=mask)])
    guess = {
        "inertia": rbjax.PrincipalInertia.from_matrix(INERTIA),
        "omega0": jnp.asarray([0.2, 1.8, 0.0]),
    }
    free = {"inertia": rbjax.PrincipalInertia(False, False), "omega0": True}
    res = rbjax.identify(
        _free_body,
        guess,
        data,
        dt=0.02,
        free=free,
        optimizer="adam",
        learning_rate=1e-2,
        max_steps=800,
    )
    err = np.max(np.abs(np.asarray(res.params["omega0"]) - W0))
    assert err <= 1e-5, f"omega0 from masked orientations {err:.3g}"


def test_multiple_shooting_recovers_the_same_parameters():
    """S = 3 segments on the spin data give the same ratios and ω0 as single shooting
    (1e-6), with continuity gaps closed."""
    times = np.linspace(0.0, 1.5, 31)
    data = rbjax.Measurements(times, [rbjax.AngularVelocity(0, _spin_data(times), 0.01)])
    guess = {
        "inertia": rbjax.PrincipalInertia.from_matrix(np.diag([1.1, 2.0, 2.6])),
        "omega0": jnp.asarray([0.28, 2.05, 0.1]),
    }
    free = {"inertia": rbjax.PrincipalInertia(True, False), "omega0": True}
    res = rbjax.identify(_free_body, guess, data, dt=0.05, free=free, shooting=3, max_steps=300)
    ratios = np.asarray(res.params["inertia"].ratios)
    true = np.diag(INERTIA) / (0.5 * np.trace(INERTIA))
    err = max(np.max(np.abs(ratios - true)), np.max(np.abs(np.asarray(res.params["omega0"]) - W0)))
    assert err <= 1e-6, f"multiple shooting error {err:.3g}\n{res.summary()}"
    assert res.segment_states is not None and res.segment_states.q.shape == (2, 1, 7)


def test_bad_input_raises_naming_the_field():
    """Every static mistake raises ValueError naming the field."""
    t = np.linspace(0, 1, 5)
    ok = rbjax.AngularVelocity(0, np.zeros((5, 3)), 0.1)
    with pytest.raises(ValueError, match="Measurements.times"):
        rbjax.Measurements([0.0, 0.5, 0.5, 1.0, 2.0], [ok])
    with pytest.raises(ValueError, match="AngularVelocity.values"):
        rbjax.AngularVelocity(0, np.zeros((5, 2)), 0.1)
    with pytest.raises(ValueError, match="AngularVelocity.sigma"):
        rbjax.AngularVelocity(0, np.zeros((5, 3)), -1.0)
    with pytest.raises(ValueError, match="mask"):
        rbjax.AngularVelocity(0, np.zeros((5, 3)), 0.1, mask=np.ones(4, bool))
    with pytest.raises(ValueError, match="does not match the 4 sample times"):
        rbjax.Measurements(t[:4], [ok])
    params = {"inertia": rbjax.PrincipalInertia.from_matrix(INERTIA), "omega0": jnp.asarray(W0)}
    data = rbjax.Measurements(t, [rbjax.AngularVelocity("nope", np.zeros((5, 3)), 0.1)])
    with pytest.raises(ValueError, match="observation body"):
        rbjax.identify(_free_body, params, data, dt=0.1)
    data = rbjax.Measurements(t, [rbjax.ReactionForce(0, np.zeros((5, 3)), 0.1)])
    with pytest.raises(ValueError, match="has no joints"):
        rbjax.identify(_free_body, params, data, dt=0.1)
    data = rbjax.Measurements(t, [ok])
    with pytest.raises(ValueError, match="identify\\(dt\\)"):
        rbjax.identify(_free_body, params, data, dt=0.0)
    with pytest.raises(ValueError, match="identify\\(shooting\\)"):
        rbjax.identify(_free_body, params, data, dt=0.1, shooting=9)
    with pytest.raises(ValueError, match="identify\\(optimizer\\)"):
        rbjax.identify(_free_body, params, data, dt=0.1, optimizer="sgd")
    with pytest.raises(ValueError, match="selects no floating-point leaf"):
        rbjax.identify(_free_body, params, data, dt=0.1, free=lambda x: False)
    with pytest.raises(ValueError, match="non-finite at optimiser step"):
        boom = {"inertia": params["inertia"], "omega0": jnp.asarray([0.0, 2.0, 0.0])}
        bad = rbjax.Measurements(t, [rbjax.AngularVelocity(0, np.full((5, 3), 1e300), 1e-300)])
        rbjax.identify(_free_body, boom, bad, dt=0.1, max_steps=3)
