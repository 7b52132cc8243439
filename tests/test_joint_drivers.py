"""Drivers attached to an existing joint: ``RotationDriver.on(hinge, q0, f)`` and
``TranslationDriver.on(slider, q0, f)`` (angle / displacement measured from q0).

A driven rod on a hinge whose axis and body axes are aligned with nothing in the world follows
f(t) (angle read from the body's quaternion), and the driver's reaction torque equals the
closed form I_O θ̈ − nᵀ(c × m g) of a uniform rod; the same for a slider (m ẍ − m gᵀn); the
drivers equal hand-aligned ``.at`` drivers (a second formulation); bad input names the fix.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close
from numpy_quaternions import qmul, quat_axis, rotmat

import rbjax

GROUND = rbjax.GROUND
GRAVITY = np.array([0.0, 0.0, -9.81])


# a body orientation and a joint axis aligned with no world axis (nor with each other's axes)
A0 = quat_axis([0.3, -0.7, 0.5], 1.1)
R0 = rotmat(A0)
R_0 = np.array([0.2, -0.1, 0.4])


def theta(t):
    return 0.8 * jnp.sin(2.0 * t) + 0.3 * t**2  # θ(0) = 0: start from q0


def theta_dd(t):
    return -3.2 * np.sin(2.0 * t) + 0.6


def rod_on_hinge():
    """Uniform rod (length L along body x) hinged at one end about n ⟂ rod, n tilted."""
    m, length = 1.3, 0.8
    n = np.cos(0.6) * R0[:, 1] + np.sin(0.6) * R0[:, 2]
    hinge_point = R_0 - length / 2 * R0[:, 0]
    q0 = np.r_[R_0, A0][None]
    rod = rbjax.Body(m, [m * length**2 / 1200, m * length**2 / 12, m * length**2 / 12])
    hinge = rbjax.Revolute.at(q0, GROUND, 0, point=hinge_point, axis=n, name="hinge")
    return m, length, n, hinge_point, q0, rod, hinge


def test_rotation_driver_on_hinge_follows_f_and_its_torque_is_the_rod_closed_form():
    m, length, n, hinge_point, q0, rod, hinge = rod_on_hinge()
    driver = rbjax.RotationDriver.on(hinge, q0, theta)
    assert driver.name == "hinge_driver"
    model = rbjax.Model([rod], joints=[hinge, driver], gravity=GRAVITY)
    w0 = 1.6 * n  # θ̇(0) n: the initial velocity on the driver
    state = rbjax.make_state(
        position=R_0[None],
        quaternion=A0[None],
        velocity=np.cross(w0, R_0 - hinge_point)[None],
        omega_body=(R0.T @ w0)[None],
    )
    tr = rbjax.rollout(model, state, 1e-3, 1000, save_every=10, multipliers=True)
    t = np.asarray(tr.t)
    # the angle of the body about n since q0, from its quaternion: A(t) A0* = (cos θ/2, sin θ/2 n)
    rel = np.array([qmul(a, A0 * [1, -1, -1, -1]) for a in np.asarray(tr.q[:, 0, 3:7])])
    angle = 2 * np.arctan2(rel[:, 1:] @ n, rel[:, 0])
    off_axis = np.max(np.linalg.norm(rel[:, 1:] - np.outer(rel[:, 1:] @ n, n), axis=1))
    err = np.max(np.abs(angle - np.asarray(theta(jnp.asarray(t)))))
    # driver torque about n: I_O θ̈ = τ + nᵀ(c × m g), c = Rot(n, θ) c0 (hinge → centre of mass)
    reactions = rbjax.reactions(model, tr.states, tr.lam)
    torque = np.asarray(reactions.torque_j)[:, 1] @ n
    c = np.array([rotmat(quat_axis(n, a)) @ (R_0 - hinge_point) for a in angle])
    expected = m * length**2 / 3 * theta_dd(t) - np.cross(c, m * GRAVITY) @ n
    hinge_about_n = np.max(np.abs(np.asarray(reactions.torque_j)[:, 0] @ n))
    print(
        f"\nangle err {err:.1e}, off-axis {off_axis:.1e}, torque err "
        f"{np.max(np.abs(torque - expected)):.1e} of {np.max(np.abs(expected)):.2f} N m"
    )
    assert err < 1e-8  # measured 1.7e-14
    assert off_axis < 1e-10
    assert_close(torque, expected, rtol=1e-9, atol=1e-9)  # measured 2.8e-14
    assert hinge_about_n < 1e-10  # the hinge itself takes no torque about its axis


def test_translation_driver_on_slider_follows_f_and_its_force_is_m_a_minus_m_g():
    m = 2.1
    n = np.cos(0.4) * R0[:, 0] + np.sin(0.4) * R0[:, 2]  # slide axis: no world axis
    q0 = np.r_[R_0, A0][None]
    slider = rbjax.Translational.at(q0, GROUND, 0, point=R_0 + 0.3 * R0[:, 1], axis=n)

    def x(t):
        return 0.2 * jnp.sin(3.0 * t) - 0.1 * t

    driver = rbjax.TranslationDriver.on(slider, q0, x, name="push")
    model = rbjax.Model([rbjax.Body(m, [0.1, 0.2, 0.3])], joints=[slider, driver], gravity=GRAVITY)
    state = rbjax.make_state(position=R_0[None], quaternion=A0[None], velocity=(0.5 * n)[None])
    tr = rbjax.rollout(model, state, 1e-3, 1000, save_every=10, multipliers=True)
    t = np.asarray(tr.t)
    r = np.asarray(tr.q[:, 0, 0:3])
    err = np.max(np.abs((r - R_0) @ n - np.asarray(x(jnp.asarray(t)))))
    sideways = np.max(np.linalg.norm((r - R_0) - np.outer((r - R_0) @ n, n), axis=1))
    turned = np.max(np.abs(np.asarray(tr.q[:, 0, 3:7]) - A0))
    force = np.asarray(rbjax.reactions(model, tr.states, tr.lam).force_j)[:, 1] @ n
    expected = m * (-1.8 * np.sin(3.0 * t)) - m * GRAVITY @ n
    print(
        f"\nslide err {err:.1e}, sideways {sideways:.1e}, force err "
        f"{np.max(np.abs(force - expected)):.1e}"
    )
    assert err < 1e-8
    assert sideways < 1e-10 and turned < 1e-10
    assert_close(force, expected, rtol=1e-9, atol=1e-9)


def test_drivers_built_on_joints_equal_hand_aligned_drivers():
    """.on against .at with hand-aligned world data (a second formulation): equal residuals at
    random configurations of two moving bodies (body j scalable off q0)."""
    q0 = np.array(
        [
            np.r_[0.1, 0.2, -0.3, quat_axis([1.0, 2.0, 0.5], 0.7)],
            np.r_[0.6, -0.4, 0.2, quat_axis([-0.3, 0.4, 1.0], 2.1)],
        ]
    )
    point, axis = np.array([0.4, 0.1, 0.0]), np.array([0.2, -0.5, 1.0])
    hinge = rbjax.Revolute.at(q0, 0, 1, point=point, axis=axis)  # its x: whatever .at picks
    slide = rbjax.Translational.at(q0, 0, 1, point=point, axis=axis)
    on = [
        rbjax.RotationDriver.on(hinge, q0, jnp.sin),
        rbjax.TranslationDriver.on(slide, q0, jnp.cos),
    ]
    # by hand: the angle from the hinge's own reference direction, in world axes in q0
    x_world = rotmat(q0[0, 3:7]) @ np.asarray(hinge.x_i)
    at = [
        rbjax.RotationDriver.at(q0, 0, 1, point=point, axis=axis, x=x_world, f=jnp.sin),
        rbjax.TranslationDriver.at(q0, 0, 1, point=point, axis=axis, f=jnp.cos),
    ]
    key = jax.random.PRNGKey(0)
    qs = q0[None] + 0.3 * np.asarray(jax.random.normal(key, (6, 2, 7)))
    ts = np.linspace(-1.0, 2.0, 6)
    for a, b in zip(on, at, strict=True):
        got = np.array([a.residual(q[0], q[1], t) for q, t in zip(qs, ts, strict=True)])
        want = np.array([b.residual(q[0], q[1], t) for q, t in zip(qs, ts, strict=True)])
        assert np.max(np.abs(want)) > 0.1  # off the drivers: the comparison is not trivial
        assert_close(got, want, rtol=1e-12, atol=1e-13, err_msg=type(a).__name__)
    # in q0 itself φ = 0 and x = 0: the residuals are sin(0 − f(t)) and 0 − f(t)
    assert_close(on[0].residual(q0[0], q0[1], 0.3), [np.sin(-np.sin(0.3))], atol=1e-14)
    assert_close(on[1].residual(q0[0], q0[1], 0.3), [-np.cos(0.3)], atol=1e-14)


def test_drivers_on_a_cylindrical_joint_and_by_body_name():
    """Both drivers on one Cylindrical joint (named bodies, resolved by names=): rotating body j
    by α about the axis and sliding it by s along it zeroes the drivers with f = α and f = s."""
    q0 = np.array([np.r_[0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0], np.r_[0.3, 0.2, 0.1, A0]])
    names = ("base", "sleeve")
    axis, point = np.array([0.3, 1.0, -0.4]), np.array([0.1, -0.2, 0.5])
    ref = rbjax.Cylindrical.at(q0, 0, 1, point=point, axis=axis)
    joint = rbjax.Cylindrical(
        "base",
        "sleeve",
        s_i=ref.s_i,
        s_j=ref.s_j,
        z_i=ref.z_i,
        z_j=ref.z_j,
        x_i=ref.x_i,
        x_j=ref.x_j,
    )
    alpha, s = 0.7, -0.25
    turn = rbjax.RotationDriver.on(joint, q0, lambda t: alpha * t, names=names)
    slide = rbjax.TranslationDriver.on(joint, q0, lambda t: s * t, names=names)
    n = axis / np.linalg.norm(axis)
    rot = quat_axis(n, alpha)
    moved = np.r_[point + rotmat(rot) @ (q0[1, 0:3] - point) + s * n, qmul(rot, q0[1, 3:7])]
    assert_close(turn.residual(q0[0], moved, 1.0), [0.0], atol=1e-14)
    assert_close(slide.residual(q0[0], moved, 1.0), [0.0], atol=1e-14)
    assert_close(turn.residual(q0[0], moved, 0.0), [np.sin(alpha)], atol=1e-14)  # sin(φ − 0)
    assert_close(slide.residual(q0[0], moved, 0.0), [s], atol=1e-14)
    model = rbjax.Model(
        [rbjax.Body(1.0, np.eye(3), name="base"), rbjax.Body(1.0, np.eye(3), name="sleeve")],
        joints=[joint, turn, slide],
    )
    assert model.topology.joint_bodies[1:] == ((0, 1), (0, 1))


@pytest.mark.parametrize(
    "build, match",
    [
        (
            lambda h, s, q: rbjax.RotationDriver.on(s, q, jnp.sin),
            r"RotationDriver.on: joint = Translational .*Fix: pass a rbjax.Revolute",
        ),
        (
            lambda h, s, q: rbjax.TranslationDriver.on(h, q, jnp.sin),
            r"TranslationDriver.on: joint = Revolute .*Fix: pass a rbjax.Translational",
        ),
        (
            lambda h, s, q: rbjax.RotationDriver.on(
                rbjax.Spherical.at(q, GROUND, 0, point=[0.0, 0.0, 0.0]), q
            ),
            r"joint = Spherical .* is not a hinge",
        ),
        (
            lambda h, s, q: rbjax.RotationDriver.on(h, q[0], jnp.sin),
            r"q0 has shape \(7,\), expected \(nb, 7\)\. Fix: pass one system's coordinates",
        ),
        (
            lambda h, s, q: rbjax.TranslationDriver.on(s, np.zeros((1, 6)), jnp.sin),
            r"q0 has shape \(1, 6\), expected \(nb, 7\)",
        ),
        (
            lambda h, s, q: rbjax.RotationDriver.on(
                h, np.r_[q[0, :3], quat_axis([1, 0, 0], 0.5)][None]
            ),
            r"q0 does not satisfy joint 'hinge'.*differ by 28\.6 degrees.*Fix: .*rbjax.assemble",
        ),
        (
            lambda h, s, q: rbjax.RotationDriver.on(
                rbjax.Revolute("ground_link", "crank"), np.tile(q, (2, 1))
            ),
            r"joint.body_i = 'ground_link' is a body name, .*Fix: pass names=model.names",
        ),
        (
            lambda h, s, q: rbjax.RotationDriver.on(h, np.tile(q, (1, 1)), 3.0),
            r"hinge_driver.f = 3.0 is not callable",
        ),
    ],
)
def test_bad_input_to_on_names_the_field_and_fix(build, match):
    q0 = np.r_[0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0][None]
    hinge = rbjax.Revolute.at(
        q0, GROUND, 0, point=[0.0, 0.0, 0.0], axis=[0.0, 0.0, 1.0], name="hinge"
    )
    slide = rbjax.Translational.at(q0, GROUND, 0, point=[0.0, 0.0, 0.0], axis=[0.0, 0.0, 1.0])
    with pytest.raises(ValueError, match=match):
        build(hinge, slide, q0)
