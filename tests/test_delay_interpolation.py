"""A delayed sensor whose reading jumps by a period between two integration steps.

identify predicts a delayed observation at every integration step and interpolates between
steps (rbjax/_identify/problem.py ``delayed``). Maximal coordinates read a revolute angle
wrapped to (−π, π]; a pendulum swinging over the top jumps by 2π between two steps. Each
test compares with something the interpolation did not produce: the joint-coordinate
formulation of the same file (its encoder reads qpos, which does not wrap) and central
finite differences in the delay.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rbjax

# a pendulum on a hinge about y, started fast enough to go over the top (it turns through
# ±π about every 0.35 s)
PENDULUM = """<mujoco model="spinner"><option gravity="0 0 -9.81" timestep="0.002">
<flag contact="disable"/></option><worldbody>
<body name="rod" pos="0 0 1"><joint name="hinge" type="hinge" axis="0 1 0"/>
<inertial pos="0 0 -0.5" mass="1" diaginertia="0.01 0.01 0.002"/></body></worldbody></mujoco>"""

DT, SIGMA, DELAY = 0.01, 0.01, 0.004  # the delay puts each sample 0.6 of a step past a grid point


@pytest.fixture(scope="module")
def spinner(tmp_path_factory):
    path = tmp_path_factory.mktemp("spinner") / "spinner.xml"
    path.write_text(PENDULUM)
    times = DT * np.arange(1, 121)
    data = rbjax.Measurements(
        times, [rbjax.JointEncoder("hinge", np.zeros((times.size, 1)), SIGMA, delay="delay")]
    )
    out = {}
    for name, formulation in (
        ("maximal", rbjax.ScalableDAE()),
        ("joint", rbjax.JointCoordinates()),
    ):
        loaded = rbjax.load(path, qvel=[12.0], formulation=formulation)
        out[name] = lambda p, m=loaded.model, s=loaded.state: (m, s)
    return out, data


def _residuals(build, data, delay):
    return rbjax.residuals(build, {"delay": delay}, data, dt=DT)


def test_delayed_angle_is_interpolated_along_the_motion_not_across_the_wrap(spinner):
    builds, data = spinner
    delay = jnp.asarray(DELAY)
    r_max = np.asarray(_residuals(builds["maximal"], data, delay))
    r_joint = np.asarray(_residuals(builds["joint"], data, delay))
    # the same readings: the wrapped residuals of both formulations agree to their RK4
    # errors at this step (measured: 4e-4 σ after 1.2 s, growing smoothly); across a wrap
    # the interpolation of the wrapped angle was off by up to π (300 σ)
    d = np.arctan2(np.sin(SIGMA * (r_max - r_joint)), np.cos(SIGMA * (r_max - r_joint))) / SIGMA
    assert np.max(np.abs(r_joint)) > 100  # the data are zeros: the pendulum turns through ±π
    assert np.max(np.abs(d)) < 1e-2


@pytest.mark.parametrize("delay", [0.0, DELAY])
def test_delay_derivative_matches_the_other_formulation_and_differences(spinner, delay):
    builds, data = spinner
    jac = {
        name: np.asarray(jax.jacfwd(lambda d, b=b: _residuals(b, data, d))(jnp.asarray(delay)))
        for name, b in builds.items()
    }
    eps = 1e-6
    up, down = (
        np.asarray(_residuals(builds["joint"], data, jnp.asarray(delay + e))) for e in (eps, -eps)
    )
    fd = (up - down) / (2 * eps)
    # dr/dτ = −θ̇(t − τ)/σ, about 1200 per second of delay here; where the interpolation
    # crossed a wrap of the maximal encoder's angle it gained ±2π/(Δt σ) ≈ 6e4 (at τ = 0
    # too, where the value itself was right)
    assert np.max(np.abs(fd)) > 500
    scale = np.max(np.abs(fd))
    np.testing.assert_allclose(jac["joint"], fd, rtol=0, atol=1e-5 * scale)
    np.testing.assert_allclose(jac["maximal"], jac["joint"], rtol=0, atol=1e-3 * scale)


def test_delayed_attitude_is_interpolated_along_the_motion_not_across_a_sign_flip(spinner):
    # joint coordinates compute each body's quaternion from its rotation matrix, whose sign
    # flips once per turn; maximal coordinates integrate a continuous one
    builds, data = spinner
    times = np.asarray(data.times)
    attitude = rbjax.Measurements(
        times,
        [rbjax.Orientation("rod", np.tile([1.0, 0, 0, 0], (times.size, 1)), SIGMA, delay="delay")],
    )
    r = {
        name: np.asarray(_residuals(b, attitude, jnp.asarray(DELAY))) for name, b in builds.items()
    }
    assert np.max(np.abs(r["joint"])) > 100  # the rod turns through ±π
    # agreement to the two formulations' RK4 errors (a crossed flip was off by up to π)
    assert np.max(np.abs(r["maximal"] - r["joint"])) < 1e-2
