"""Sensor models with identifiable parameters (issue 17 §3).

The measurements are synthesised WITHOUT the code under test: a fine rbjax rollout gives the
true motion, and each sensor reading is computed here in NumPy/SciPy from its textbook
definition (SciPy rotations for the misalignments and mountings, central differences of the
fine trajectory for accelerations, the hinge force m(a_c − g) of a single pendulum, the
pendulum angle from the rod's direction, the fine trajectory sampled at t − τ for a delay).
Then rbjax.identify fits the physical and the sensor parameters together, and every
parameter must come back within 3 standard errors, with finite correlations.
"""

from __future__ import annotations

import functools
from typing import Any

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.spatial.transform import Rotation

import rbjax
from rbjax import quaternion as quat

# ------------------------------------------------------------------ pendulum with sensors
D, I_C, G, MASS = 0.5, 0.02, 9.81, 1.2  # pivot to centre [m], inertia about centre, g, kg
THETA0, OMEGA0 = 1.0, 0.0  # rad from the downward vertical, rad/s
FINE, RATE, T_END = 1e-3, 100, 3.0
TIMES = np.arange(0.0, T_END + 1e-9, 1.0 / RATE)

TRUTH = {
    "mass": MASS,
    "theta0": THETA0,
    "imu_px": -0.2,
    "imu_pz": 0.03,
    "gyro_bias": np.array([0.01, -0.02, 0.005]),
    "accel_bias": np.array([0.05, -0.1, 0.08]),
    "imu_mis": np.array([0.02, -0.01, 0.03]),
    "enc_offset": np.array([0.05]),
    "enc_delay": 0.012,
    "force_bias": np.array([0.3, -0.2, 0.1]),
    "marker": np.array([0.3, 0.02, -0.01]),
    "gain": 2.0,
}
IMU_PY = 0.01  # along the hinge axis: invisible to the IMU of a planar pendulum, so known
SIG = {"gyro": 0.002, "accel": 0.02, "enc": 0.002, "force": 0.02, "marker": 0.001, "custom": 0.01}


def pendulum(p):
    """A rod (mass p["mass"], a Positive) on a revolute joint about y at the origin, the
    centre of mass D from the pivot along body x, released at rest from p["theta0"]."""
    q0 = np.array([[D, 0, 0, 1, 0, 0, 0.0]])
    hinge = rbjax.Revolute.at(q0, rbjax.GROUND, 0, point=[0, 0, 0], axis=[0, 1, 0], name="pivot")
    rod = rbjax.Body(1.0, np.diag([0.001, I_C, I_C]), name="rod")
    model = rbjax.Model([rod], joints=[hinge], gravity=[0, 0, -G])
    model = eqx.tree_at(lambda m: m.mass, model, p["mass"].value[None])
    th = p["theta0"]
    e = jnp.stack([jnp.sin(th), 0.0 * th, -jnp.cos(th)])
    beta = np.pi / 2 - th
    a = jnp.stack([jnp.cos(beta / 2), 0.0 * th, jnp.sin(beta / 2), 0.0 * th])
    return model, rbjax.make_state(position=D * e, quaternion=a, nb=1)


def _truth_params():
    p: dict[str, Any] = {k: jnp.asarray(v, dtype=jnp.float64) for k, v in TRUTH.items()}
    p["mass"] = rbjax.Positive.from_value(MASS)
    return p


@functools.lru_cache(maxsize=1)
def _fine():
    """The true motion at FINE steps: t, r (n,3), R body→world (n,3,3), v, ω body (n,3)."""
    model, state = pendulum(_truth_params())
    n = round((T_END + 0.05) / FINE)
    traj = rbjax.rollout(model, state, FINE, n)
    q, u = np.asarray(traj.q[:, 0]), np.asarray(traj.u[:, 0])
    rot = Rotation.from_quat(q[:, [4, 5, 6, 3]])  # scipy: scalar last
    return np.asarray(traj.t), q[:, 0:3], rot.as_matrix(), u[:, 0:3], u[:, 4:7]


def _at(k_fine, *arrays):
    return [a[k_fine] for a in arrays]


def _synthesise(rng):
    """The readings of every sensor at TIMES (independent of rbjax's sensor code)."""
    t, r, rmat, v, w = _fine()
    step = round(1.0 / (RATE * FINE))
    k = np.arange(TIMES.size) * step
    # accelerations by central differences of the fine trajectory (O(FINE²))
    kk = np.maximum(k, 1)
    a_c = (v[kk + 1] - v[kk - 1]) / (2 * FINE)
    alpha = (w[kk + 1] - w[kk - 1]) / (2 * FINE)
    a_c[0] = (-3 * v[0] + 4 * v[1] - v[2]) / (2 * FINE)
    alpha[0] = (-3 * w[0] + 4 * w[1] - w[2]) / (2 * FINE)
    g = np.array([0.0, 0.0, -G])
    mis = Rotation.from_rotvec(TRUTH["imu_mis"]).as_matrix()
    p = np.array([TRUTH["imu_px"], IMU_PY, TRUTH["imu_pz"]])
    rk, wk = rmat[k], w[k]
    gyro = (wk @ mis) + TRUTH["gyro_bias"]  # R(m)ᵀ ω as row vectors: ω @ R(m)
    f_body = (
        np.einsum("kji,kj->ki", rk, a_c - g) + np.cross(alpha, p) + np.cross(wk, np.cross(wk, p))
    )
    accel = f_body @ mis + TRUTH["accel_bias"]
    kd = k - round(TRUTH["enc_delay"] / FINE)
    valid = kd >= 0
    rd = r[np.maximum(kd, 0)]
    # the joint angle is 0 where Revolute.at defined the hinge (rod along +x, horizontal)
    # and positive about +y, which turns x towards −z: φ = π/2 − θ, θ from the downward vertical
    enc = np.pi / 2 - np.arctan2(rd[:, 0], -rd[:, 2])[:, None] + TRUTH["enc_offset"]
    force = MASS * (a_c - g) + TRUTH["force_bias"]
    marker = r[k] + np.einsum("kij,j->ki", rk, TRUTH["marker"])
    custom = TRUTH["gain"] * wk[:, 1:2]
    noisy = lambda x, s: x + s * rng.normal(size=x.shape)
    return {
        "imu": np.concatenate([noisy(gyro, SIG["gyro"]), noisy(accel, SIG["accel"])], axis=1),
        "enc": (noisy(enc, SIG["enc"]), valid),
        "force": noisy(force, SIG["force"]),
        "marker": noisy(marker, SIG["marker"]),
        "custom": noisy(custom, SIG["custom"]),
    }


def _gain_rate(model, state, params):
    """A custom sensor with a fitted gain: gain × ω_y."""
    return params["gain"] * state.u[0, 5:6]


def _observations(y):
    imu_point = lambda p: jnp.stack([p["imu_px"], jnp.asarray(IMU_PY), p["imu_pz"]])
    enc, valid = y["enc"]
    return [
        rbjax.IMU(
            "rod",
            y["imu"],
            (SIG["gyro"], SIG["accel"]),
            point=imu_point,
            misalignment="imu_mis",
            gyro_bias="gyro_bias",
            accel_bias="accel_bias",
        ),
        rbjax.JointEncoder(
            "pivot", enc, SIG["enc"], offset="enc_offset", delay="enc_delay", mask=valid
        ),
        rbjax.ReactionForce("pivot", y["force"], SIG["force"], bias="force_bias"),
        rbjax.Position("rod", y["marker"], SIG["marker"], point="marker"),
        rbjax.Custom(_gain_rate, y["custom"], SIG["custom"]),
    ]


def _guess():
    p = {
        "mass": rbjax.Positive.from_value(1.0),
        "theta0": jnp.asarray(0.9),
        "imu_px": jnp.asarray(-0.1),
        "imu_pz": jnp.asarray(0.0),
        "gyro_bias": jnp.zeros(3),
        "accel_bias": jnp.zeros(3),
        "imu_mis": jnp.zeros(3),
        "enc_offset": jnp.zeros(1),
        "enc_delay": jnp.asarray(0.0),
        "force_bias": jnp.zeros(3),
        "marker": jnp.asarray([0.2, 0.0, 0.0]),
        "gain": jnp.asarray(1.5),
    }
    return p


@pytest.fixture(scope="module")
def pendulum_fit():
    y = _synthesise(np.random.default_rng(0))
    data = rbjax.Measurements(TIMES, _observations(y))
    fit = rbjax.identify(pendulum, _guess(), data, dt=1.0 / RATE, max_steps=100)
    print(fit.summary())
    return fit


def _z(fit, name, truth) -> np.ndarray:
    """(estimate − truth)/σ of the quantities named ``name`` (every σ finite and > 0)."""
    q = fit.quantities()
    truth = np.atleast_1d(np.asarray(truth, dtype=np.float64))
    names = [n for n in q.names if n == name or n.startswith(name + "[")]
    assert len(names) == truth.size, (name, names)
    z = []
    for n, t in zip(names, truth, strict=True):
        e = q[n]
        assert np.isfinite(e.std) and e.std > 0
        z.append((e.value - t) / e.std)
    print(name, "z =", np.round(z, 2))
    return np.asarray(z)


def test_the_pendulum_fit_converges_with_white_residuals(pendulum_fit):
    fit = pendulum_fit
    assert fit.converged and fit.unidentifiable == ()
    nu = sum(int(np.sum(np.isfinite(b))) for b in fit.residuals) - len(fit.names)
    assert abs(fit.reduced_chi2 - 1.0) < 5.0 * np.sqrt(2.0 / nu)
    assert np.all(np.abs(_z(fit, "['mass']", MASS)) <= 3.0)
    assert np.all(np.abs(_z(fit, "['theta0']", THETA0)) <= 3.0)


def test_imu_lever_arm_biases_and_misalignment(pendulum_fit):
    for key in ("imu_px", "imu_pz", "gyro_bias", "accel_bias", "imu_mis"):
        assert np.all(np.abs(_z(pendulum_fit, f"['{key}']", TRUTH[key])) <= 3.0)


def test_encoder_offset_and_delay(pendulum_fit):
    assert np.all(np.abs(_z(pendulum_fit, "['enc_offset']", TRUTH["enc_offset"])) <= 3.0)
    assert np.all(np.abs(_z(pendulum_fit, "['enc_delay']", TRUTH["enc_delay"])) <= 3.0)


def test_force_sensor_bias_and_marker_point(pendulum_fit):
    assert np.all(np.abs(_z(pendulum_fit, "['force_bias']", TRUTH["force_bias"])) <= 3.0)
    assert np.all(np.abs(_z(pendulum_fit, "['marker']", TRUTH["marker"])) <= 3.0)


def test_custom_observation_sees_the_parameters(pendulum_fit):
    assert np.all(np.abs(_z(pendulum_fit, "['gain']", TRUTH["gain"])) <= 3.0)


def test_correlations_are_reported(pendulum_fit):
    """The correlation matrix of all physical and sensor parameters: symmetric, unit
    diagonal, entries in [−1, 1]; the mass and the force bias are correlated (both shift the
    measured hinge force) and the summary prints the table."""
    q = pendulum_fit.quantities()
    c = q.correlation
    assert np.all(np.isfinite(c)) and np.allclose(c, c.T) and np.allclose(np.diag(c), 1.0)
    assert np.all(np.abs(c) <= 1.0 + 1e-12)
    i, j = q.names.index("['mass']"), q.names.index("['force_bias'][2]")
    assert abs(c[i, j]) > 0.05
    assert "['enc_delay']" in pendulum_fit.summary()


# ------------------------------------------------------------------ predictions alone
def test_accelerometer_at_the_pivot_reads_minus_gravity():
    """At the pivot (body point (−D, 0, 0)) the acceleration is zero: the specific force is
    −g in body axes, whatever the swing (closed form, at a moving state)."""
    model, state = pendulum(_truth_params())
    data = rbjax.Measurements(
        [0.0], [rbjax.Accelerometer("rod", np.zeros((1, 3)), 1.0, point=(-D, 0, 0))]
    )
    pred = np.asarray(rbjax.residuals(pendulum, _truth_params(), data, dt=0.01))
    rmat = Rotation.from_quat(np.asarray(state.q[0, [4, 5, 6, 3]])).as_matrix()
    assert np.allclose(pred, rmat.T @ np.array([0.0, 0.0, G]), atol=1e-12)


def test_delay_interpolation_matches_the_delayed_trajectory():
    """An AngularVelocity with a delay of 7.3 ms (not a multiple of any step) against the fine
    trajectory interpolated at t − τ: the cubic Hermite interpolation on the 10 ms grid is
    accurate to O(Δt³) (≤ 2e-4 rad/s here, with |ω̈| ≈ 200 rad/s³)."""
    t, _, _, _, w = _fine()
    tau = 0.0073
    zeros = np.zeros((TIMES.size, 3))
    obs = rbjax.AngularVelocity("rod", zeros, 1.0, delay=tau)
    pred = np.asarray(
        rbjax.residuals(pendulum, _truth_params(), rbjax.Measurements(TIMES, [obs]), dt=0.01)
    ).reshape(-1, 3)
    exact = np.stack([np.interp(np.maximum(TIMES - tau, 0.0), t, w[:, i]) for i in range(3)], 1)
    err = np.max(np.abs(pred - exact)[TIMES >= tau])
    print(f"delay interpolation error {err:.3g} rad/s")
    assert err <= 2e-4


# ------------------------------------------------------------------ gyro and star tracker
I_SAT = np.array([[4.0, -0.3, 0.2], [-0.3, 3.0, 0.1], [0.2, 0.1, 2.5]])
W_SAT = np.array([0.4, -0.3, 0.5])
TORQUE = np.array([0.3, -0.2, 0.25])
SAT_TIMES = np.arange(0.0, 10.0 + 1e-9, 0.05)
SAT = {
    "gyro_bias": np.array([0.004, -0.003, 0.002]),
    "gyro_scale": np.array([0.01, -0.02, 0.015]),
    "gyro_mis": np.array([0.01, 0.02, -0.015]),
    "mounting": np.array([0.3, -0.2, 0.5]),
}


def satellite(p):
    model = rbjax.Model(
        rbjax.Body(1.0, np.eye(3), name="sat"), forces=[rbjax.BodyTorque(0, TORQUE)]
    )
    model = eqx.tree_at(lambda m: m.inertia, model, p["inertia"].matrix[None])
    att = quat.exp(0.5 * p["attitude0"])
    return model, rbjax.make_state(quaternion=att[None], omega_body=p["omega0"][None], nb=1)


def test_gyro_and_star_tracker_calibrate_with_the_inertia():
    """A satellite with a known torque, a gyro (unknown bias and scale factors, a known
    misalignment) and a star tracker with an unknown mounting: inertia, ω0, attitude and the
    sensor parameters are fitted together and recovered within 3 σ. (The gyro's known
    misalignment anchors the body frame: with every sensor's mounting free, a rotation of the
    body frame about the constant torque would leave all readings unchanged, and identify
    reports that direction by name.)"""
    truth = {
        "inertia": rbjax.PrincipalInertia.from_matrix(I_SAT),
        "attitude0": jnp.zeros(3),
        "omega0": jnp.asarray(W_SAT),
    }
    model, state = satellite(truth)
    traj = rbjax.rollout(model, state, 0.005, 2000, save_every=10)
    w = np.asarray(traj.u[:, 0, 4:7])
    a = Rotation.from_quat(np.asarray(traj.q[:, 0, 3:7])[:, [1, 2, 3, 0]])
    rng = np.random.default_rng(3)
    sig_w, sig_a = 0.001, 1e-4
    mis = Rotation.from_rotvec(SAT["gyro_mis"]).as_matrix()
    gyro = (
        (1.0 + SAT["gyro_scale"]) * (w @ mis) + SAT["gyro_bias"] + sig_w * rng.normal(size=w.shape)
    )
    tracker = (
        a
        * Rotation.from_rotvec(SAT["mounting"])
        * Rotation.from_rotvec(sig_a * rng.normal(size=w.shape))
    )
    tq = tracker.as_quat()[:, [3, 0, 1, 2]]
    data = rbjax.Measurements(
        SAT_TIMES,
        [
            rbjax.Gyro(
                "sat",
                gyro,
                sig_w,
                bias="gyro_bias",
                scale="gyro_scale",
                misalignment=SAT["gyro_mis"],
            ),
            rbjax.Orientation("sat", tq, sig_a, mounting="mounting"),
        ],
    )
    guess = {
        "inertia": rbjax.PrincipalInertia.from_matrix(np.diag([3.5, 3.5, 3.0])),
        "attitude0": jnp.zeros(3),
        "omega0": jnp.asarray(gyro[0]),
        "gyro_bias": jnp.zeros(3),
        "gyro_scale": jnp.zeros(3),
        "mounting": jnp.asarray([0.25, -0.15, 0.45]),
    }
    fit = rbjax.identify(satellite, guess, data, dt=0.05, max_steps=100)
    print(fit.summary())
    assert fit.converged and fit.unidentifiable == ()
    for key in ("gyro_bias", "gyro_scale", "mounting"):
        assert np.all(np.abs(_z(fit, f"['{key}']", SAT[key])) <= 3.0)
    assert np.all(np.abs(_z(fit, "['omega0']", W_SAT)) <= 3.0)
    entries = ("I_xx", "I_yy", "I_zz", "I_xy", "I_xz", "I_yz")
    idx = ((0, 0), (1, 1), (2, 2), (0, 1), (0, 2), (1, 2))
    for e, ij in zip(entries, idx, strict=True):
        assert np.all(np.abs(_z(fit, f"['inertia'].{e}", I_SAT[ij])) <= 3.0)


# ------------------------------------------------------------------ validation
def test_bad_sensor_references_raise_naming_the_field():
    y = np.zeros((TIMES.size, 3))
    cases = [
        (lambda: rbjax.Gyro("rod", y, 0.1, bias=[1.0, 2.0]), "Gyro.bias"),
        (lambda: rbjax.IMU("rod", np.zeros((TIMES.size, 5)), 0.1), "IMU.values"),
    ]
    for make, field in cases:
        with pytest.raises(ValueError, match=field.replace(".", r"\.")):
            make()
    fit = lambda obs: rbjax.identify(
        pendulum, _guess(), rbjax.Measurements(TIMES, [obs]), dt=0.01, max_steps=0
    )
    with pytest.raises(ValueError, match=r"\(Gyro\)\.bias.*not a key of params"):
        fit(rbjax.Gyro("rod", y, 0.1, bias="no_such_key"))
    with pytest.raises(ValueError, match=r"\(Position\)\.point.*shape"):
        fit(rbjax.Position("rod", y, 0.1, point="enc_offset"))
    with pytest.raises(ValueError, match=r"\(JointEncoder\)\.values"):
        fit(rbjax.JointEncoder("pivot", np.zeros((TIMES.size, 2)), 0.1))


def test_noise_levels_are_identified(pendulum_fit):
    """The noise each sensor's residuals imply (IdentificationResult.noise): within the
    sampling error of a standard deviation estimate (1/√(2n) relative, 5 of them) of the
    noise used to make the data."""
    est = pendulum_fit.noise()
    stated = [
        np.array([SIG["gyro"]] * 3 + [SIG["accel"]] * 3),
        np.array([SIG["enc"]]),
        np.array([SIG["force"]] * 3),
        np.array([SIG["marker"]] * 3),
        np.array([SIG["custom"]]),
    ]
    for e, s, block in zip(est, stated, pendulum_fit.residuals, strict=True):
        n = np.sum(np.isfinite(block), axis=0)
        print(np.round(e / s, 3))
        assert np.all(np.abs(e / s - 1.0) <= 5.0 / np.sqrt(2.0 * n))
