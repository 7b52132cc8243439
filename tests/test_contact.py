"""Contact with friction in joint coordinates (rbjax.MoreauJean, rbjax.Contacts) against closed
forms of rigid-body mechanics with perfect unilateral constraints and Coulomb friction: a
ball's apex heights e^{2k} h₀, a block sliding to rest at v₀²/(2μg), a sphere launched
sliding that starts rolling at 2v₀/(7μg) with 5v₀/7, a block on an incline that sticks iff
tan θ ≤ μ (and slides with g(sin θ − μ cos θ) otherwise), and the derivatives of the apex in
e and of the stopping distance in μ. Moreau–Jean is first order, so the tolerances are a few
steps' worth; with the position projection a resting body does not sink."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rbjax

G = 9.81
H = 1e-3  # s


def _free_body(shape, mass, inertia, **contact):
    return rbjax.JointModel(
        names=["body"],
        parent=[-1],
        body_pos=np.zeros((1, 3)),
        body_quat=[[1.0, 0.0, 0.0, 0.0]],
        mass=[mass],
        com=np.zeros((1, 3)),
        inertia=[np.diag(inertia)],
        joint_types=["free"],
        joint_body=[0],
        contacts=rbjax.Contacts([shape], **contact),
    )


def _state(pos, vel=(0.0, 0.0, 0.0), omega=(0.0, 0.0, 0.0)):
    return rbjax.JointState(0.0, np.array([*pos, 1.0, 0.0, 0.0, 0.0]), np.array([*vel, *omega]))


R_BALL = 0.1
BALL_I = 0.4 * R_BALL**2  # solid sphere, per kg
HALF = (0.3, 0.2, 0.1)
BOX_I = [
    (HALF[1] ** 2 + HALF[2] ** 2) / 3,
    (HALF[0] ** 2 + HALF[2] ** 2) / 3,
    (HALF[0] ** 2 + HALF[1] ** 2) / 3,
]


def _ball(**contact):
    return _free_body(rbjax.Sphere("body", R_BALL), 1.0, [BALL_I] * 3, **contact)


def _block(**contact):
    return _free_body(rbjax.Box("body", HALF), 2.0, [2.0 * i for i in BOX_I], **contact)


def _apexes(z):
    inner = (z[1:-1] > z[:-2]) & (z[1:-1] >= z[2:])
    return z[1:-1][inner]


def test_a_ball_bounces_to_e_squared_heights_and_smooth_integrators_refuse_contacts():
    """Dropped from h₀ = 1 m (its lowest point) with e = 0.8, the apexes are e^{2k} h₀
    (1 % for the first four at h = 1 ms); the ball never sinks more than |v| h into the plane,
    and the default monitors (energy may only fall) pass. RK4 refuses the model."""
    model, e, h0 = _ball(restitution=0.8), 0.8, 1.0
    traj = rbjax.rollout(model, _state((0, 0, h0 + R_BALL)), H, 2600, integrator=rbjax.MoreauJean())
    assert int(traj.result) == 0
    z = np.asarray(traj.qpos)[:, 2] - R_BALL
    apex = _apexes(z)[:4]
    np.testing.assert_allclose(apex, [e ** (2 * k) * h0 for k in range(1, 5)], rtol=1e-2)
    assert z.min() > -np.sqrt(2 * G * h0) * H
    with pytest.raises(ValueError, match=r"would ignore the model's 1 contact point.*MoreauJean"):
        rbjax.rollout(model, _state((0, 0, 1.0)), H, 10, integrator=rbjax.RK4())


def test_a_sliding_block_stops_at_the_closed_form_distance_and_sticks():
    """A block resting flat on its four lower corners, launched at v₀ = 2 m/s with μ = 0.5,
    slides to rest at v₀²/(2μg) (0.5 %) after v₀/(μg) (two steps' worth), does not tip (its
    quaternion stays the identity to 1e-9), and then sticks: its velocity is zero to the
    contact solver's tolerance. The stopping
    distance's derivative in μ is −v₀²/(2μ²g) (1 %). The contact solver starts each step from
    the last step's percussions (MoreauJean's warm start): a rollout restarted mid-slide, from
    zero percussions, takes the same steps to the solver's tolerance."""
    v0, mu = 2.0, 0.5
    model = _block(friction=mu)
    state = jax.tree.map(jnp.asarray, _state((0.0, 0.0, HALF[2]), vel=(v0, 0.0, 0.0)))
    run = eqx.filter_jit(
        lambda m, s=state: rbjax.rollout(m, s, H, 600, integrator=rbjax.MoreauJean(), monitors=None)
    )
    traj = run(model)
    cold = run(model, traj[250])  # t = 0.25 s: sliding; it stops at 0.41 s and sticks
    for a, b in ((traj.qpos, cold.qpos), (traj.qvel, cold.qvel)):
        np.testing.assert_allclose(np.asarray(b)[:351], np.asarray(a)[250:], rtol=0, atol=1e-9)
    x, v = np.asarray(traj.qpos)[:, 0], np.asarray(traj.qvel)[:, 0]
    stop = v0**2 / (2 * mu * G)
    assert x[-1] == pytest.approx(stop, rel=5e-3)
    t_stop = np.asarray(traj.t)[np.argmax(v <= 1e-9)]
    assert abs(t_stop - v0 / (mu * G)) <= 2 * H
    assert np.all(np.abs(np.asarray(traj.qvel)[-100:]) <= 1e-9)  # the solver's tolerance
    np.testing.assert_allclose(np.asarray(traj.qpos)[:, 3:], [[1, 0, 0, 0]] * len(x), atol=1e-9)

    def distance(mu):
        m = eqx.tree_at(lambda m: m.contacts.mu, model, jnp.full(4 * 2, mu))
        return run(m).qpos[-1, 0]

    assert float(jax.jit(jax.grad(distance))(mu)) == pytest.approx(
        -(v0**2) / (2 * mu**2 * G), rel=1e-2
    )


def test_a_sphere_launched_sliding_starts_rolling_at_the_closed_form_time():
    """A solid sphere launched at v₀ = 3 m/s without spin on a plane with μ = 0.3: friction
    spins it up until it rolls, at t = 2v₀/(7μg) with v = 5v₀/7 (Routh); afterwards it rolls
    (ω r = v) at constant speed."""
    v0, mu = 3.0, 0.3
    traj = rbjax.rollout(
        _ball(friction=mu),
        _state((0.0, 0.0, R_BALL), vel=(v0, 0.0, 0.0)),
        H,
        600,
        integrator=rbjax.MoreauJean(),
        monitors=None,
    )
    t = np.asarray(traj.t)
    v = np.asarray(traj.qvel)[:, 0]
    wy = np.asarray(traj.qvel)[:, 4]  # body axes = world axes: the ball rolls about y
    slip = v - wy * R_BALL
    t_roll = t[np.argmax(np.abs(slip) <= 1e-9)]
    assert abs(t_roll - 2 * v0 / (7 * mu * G)) <= 2 * H
    after = t > t_roll + 0.01
    np.testing.assert_allclose(v[after], 5 * v0 / 7, rtol=1e-3)
    assert np.max(np.abs(slip[after])) <= 1e-9


@pytest.mark.parametrize("theta_deg", [25.0, 30.0])
def test_a_block_on_an_incline_sticks_iff_tan_theta_below_mu(theta_deg):
    """Gravity tilted by θ against the block's plane (μ = 0.5, tan θ = 0.466 or 0.577): at 25°
    it stays where it is put; at 30° it slides with a = g(sin θ − μ cos θ) (1 %). The block
    stays on the plane (depth ≤ 1e-9 m: the position projection) without drift over 2000
    steps."""
    mu, theta = 0.5, np.deg2rad(theta_deg)
    model = eqx.tree_at(
        lambda m: m.gravity,
        _block(friction=mu),
        jnp.array([G * np.sin(theta), 0.0, -G * np.cos(theta)]),
    )
    traj = rbjax.rollout(
        model, _state((0.0, 0.0, HALF[2])), H, 2000, integrator=rbjax.MoreauJean(), monitors=None
    )
    x = np.asarray(traj.qpos)[:, 0]
    depth = HALF[2] - np.asarray(traj.qpos)[:, 2]
    assert depth.max() <= 1e-9  # the position projection (rbjax/_contact/stepping.py)
    if np.tan(theta) <= mu:
        assert np.max(np.abs(x)) <= 1e-9
        assert depth[-1] <= depth[100] + 1e-12  # no drift
    else:
        a = G * (np.sin(theta) - mu * np.cos(theta))
        assert x[-1] == pytest.approx(0.5 * a * 2.0**2, rel=1e-2)


def test_the_apex_derivative_in_e_is_the_closed_form():
    """d(first apex)/de = 2 e h₀ (the apex e² h₀), through the percussions' implicit
    derivative and the rollout, in reverse mode (2 %)."""
    e, h0 = 0.7, 0.5
    model = _ball(restitution=e)
    state = _state((0.0, 0.0, h0 + R_BALL))

    def apex(e):
        m = eqx.tree_at(lambda m: m.contacts.restitution, model, jnp.full(1, e))
        traj = rbjax.rollout(m, state, H, 900, integrator=rbjax.MoreauJean(), monitors=None)
        return jnp.max(traj.qpos[400:, 2]) - R_BALL  # after the first impact (t ≈ 0.32 s)

    value, slope = jax.jit(jax.value_and_grad(apex))(e)
    assert float(value) == pytest.approx(e**2 * h0, rel=1e-2)
    assert float(slope) == pytest.approx(2 * e * h0, rel=2e-2)


def _pendulum(limit_restitution):
    """A rod of 1 kg hanging from a hinge about y, centre of mass 0.5 m below it; its angle
    θ (qpos) limited to [−0.3, 2.0] rad."""
    return rbjax.JointModel(
        names=["rod"],
        parent=[-1],
        body_pos=np.zeros((1, 3)),
        body_quat=[[1.0, 0.0, 0.0, 0.0]],
        mass=[1.0],
        com=[[0.0, 0.0, -0.5]],
        inertia=[np.diag([1.0 / 12, 1.0 / 12, 1e-3])],
        joint_types=["hinge"],
        joint_body=[0],
        joint_names=["hinge"],
        joint_axis=[[0.0, 1.0, 0.0]],
        limits={"hinge": (-0.3, 2.0)},
        limit_restitution=limit_restitution,
    )


@pytest.mark.parametrize("e", [0.0, 1.0])
def test_a_pendulum_stops_at_its_joint_limit(e):
    """Released at θ = 1 rad, the pendulum swings into its limit θ = −0.3. Plastic (e = 0): it
    stops there, loses its kinetic energy, and swings afterwards between −0.3 and 0.3 (energy
    from rest at the limit); elastic (e = 1): it bounces back up to 1 rad (1 %). It never
    passes the limit (the projection), and RK4 refuses the limited model."""
    model = _pendulum(e)
    state = rbjax.JointState(0.0, np.array([1.0]), np.array([0.0]))
    traj = rbjax.rollout(model, state, H, 3000, integrator=rbjax.MoreauJean(), monitors=None)
    theta = np.asarray(traj.qpos)[:, 0]
    assert theta.min() >= -0.3 - 1e-9
    hit = np.argmax(theta <= -0.29)  # the first impact (it may close a step early, at −0.2995)
    assert hit > 0
    later = theta[hit + 50 :]
    expected = 0.3 if e == 0.0 else 1.0
    assert later.max() == pytest.approx(expected, rel=1e-2)
    with pytest.raises(ValueError, match="would ignore the model's 1 limited joint coordinate"):
        rbjax.rollout(model, state, H, 10, integrator=rbjax.RK4())
