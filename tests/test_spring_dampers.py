"""Spring–damper–actuators between bodies (ME751 TSDA/RSDA, Negrut ME751) against closed forms.

Two-body oscillators against the reduced-mass solution (undamped and underdamped), a torsional
oscillator on a hinge against θ0 cos(√(k/I) t) and its energy, resultants against PointForce /
hand-computed torques (Möller & Glocker 2012 eq. (75)) and virtual power, rates against central differences,
gradients of a rollout against central differences, the l = 0 singularity, and bad input.

Compile time dominates: the oscillator rollouts share one compiled function (same structure,
n_steps and dt; only array leaves differ). Measured errors are printed (run with ``-s``);
tolerances are the measured values with a margin of about 10x or more.
"""

from __future__ import annotations

import copy

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close
from numpy_quaternions import qmul, quat_axis, rotmat

import rbjax
from rbjax._engine.layout import to_components

GROUND = rbjax.GROUND
DT, STEPS, EVERY = 1e-3, 2000, 10  # 2 s: two periods of the 1 Hz oscillators below

# ------------------------------------------------------------------ numpy helpers


def unit(x):
    x = np.asarray(x, float)
    return x / np.linalg.norm(x)


def world_point(q, s):
    """r + s R s̄ (the material point of a possibly scalable body)."""
    a = q[3:7]
    return q[0:3] + (a @ a) * rotmat(a) @ s


def point_velocity(q, u, s):
    """v + R(ν s̄ + ω × s̄): velocity of the material point s̄ (ScalableDAE convention)."""
    return u[0:3] + rotmat(q[3:7]) @ (u[3] * s + np.cross(u[4:7], s))


def qdot_scalable(q, u):
    """q̇ = (v, A (ν, ω) / (2|A|²)) (Möller & Glocker 2012 eq. (93))."""
    a = q[3:7]
    return np.r_[u[0:3], qmul(a, u[3:7]) / (2 * (a @ a))]


def resultants(model, state):
    """Total applied wrench (F (nb, 3), S (nb,), M (nb, 3)) without gravity, from the natural
    per-system ``wrench`` of each force; checked against the engine's fast path too."""
    parts = [f.wrench(model, state.t, state) for f in model.forces]
    F = sum(np.asarray(p.force_world) for p in parts)
    S = sum(np.asarray(p.scaling) for p in parts)
    M = sum(np.asarray(p.moment_body) for p in parts)
    t, q, u = to_components(state)
    fast = [f._engine_resultants(model, t, q, u) for f in model.forces]
    assert_close(sum(np.asarray(p.F) for p in fast).T, F, rtol=1e-13, atol=1e-14)
    assert_close(sum(np.asarray(p.S) for p in fast), S, rtol=1e-13, atol=1e-14)
    assert_close(sum(np.asarray(p.M) for p in fast).T, M, rtol=1e-13, atol=1e-14)
    return F, S, M


class Push(eqx.Module):
    """Actuator h(t, x, ẋ) = a + b t with differentiable a, b."""

    a: jax.Array
    b: jax.Array

    def __call__(self, t, x, xdot):
        return self.a + self.b * t


# ------------------------------------------------- two free bodies: reduced-mass oscillator

M1, M2 = 1.0, 2.0
MU = M1 * M2 / (M1 + M2)
OMEGA = 2.0 * np.pi  # 1 Hz undamped
K = MU * OMEGA**2
L0, AMP = 1.0, 0.2
N = unit([1.0, 2.0, -0.5])  # spring direction


def two_body_oscillator(damping, push=0.0):
    """Bodies joined centre to centre, at rest, stretched by AMP along N (no gravity)."""
    bodies = [
        rbjax.Body(M1, [0.1, 0.2, 0.25], name="a"),
        rbjax.Body(M2, [0.3, 0.2, 0.4], name="b"),
    ]
    tsda = rbjax.TranslationalSpringDamper(
        0,
        [0.0, 0.0, 0.0],
        1,
        [0.0, 0.0, 0.0],
        stiffness=K,
        damping=damping,
        rest_length=L0,
        actuator=Push(jnp.asarray(push), jnp.asarray(0.0)),
    )
    model = rbjax.Model(bodies, forces=[tsda])
    c0 = np.array([0.3, -0.1, 0.2])
    r1 = c0 - M2 / (M1 + M2) * (L0 + AMP) * N
    r2 = c0 + M1 / (M1 + M2) * (L0 + AMP) * N
    quats = [quat_axis([1, 1, 0], 0.7), quat_axis([0, -1, 2], 1.9)]  # irrelevant: s̄ = 0
    state = rbjax.make_state(position=[r1, r2], quaternion=quats)
    return model, state, c0


def separation(traj):
    d = np.asarray(traj.q[:, 1, 0:3] - traj.q[:, 0, 0:3])
    return d @ N, np.linalg.norm(d - np.outer(d @ N, N), axis=-1)


def test_tsda_two_free_bodies_oscillate_at_reduced_mass_frequency():
    model, state, c0 = two_body_oscillator(damping=0.0)
    traj = rbjax.rollout(model, state, DT, STEPS, save_every=EVERY)
    t = np.asarray(traj.t)
    x, off_axis = separation(traj)
    exact = L0 + AMP * np.cos(np.sqrt(K / MU) * t)
    err = np.max(np.abs(x - exact)) / AMP
    p = np.asarray(rbjax.linear_momentum(model, traj.states))
    com = np.asarray((M1 * traj.q[:, 0, 0:3] + M2 * traj.q[:, 1, 0:3]) / (M1 + M2))
    print(
        f"\nundamped: rel err {err:.2e}, |p|max {np.abs(p).max():.1e}, off-axis {off_axis.max():.1e}"
    )
    assert err < 2e-9  # measured 1.4e-10 (RK4, dt = 1e-3, 2 periods)
    assert np.abs(p).max() < 1e-13  # equal and opposite forces: momentum to roundoff
    assert_close(com, np.broadcast_to(c0, com.shape), atol=1e-13)
    assert off_axis.max() < 1e-13


def test_tsda_damped_two_body_oscillator_matches_underdamped_solution():
    zeta, push = 0.1, 1.5  # damping ratio; constant actuator force h = 1.5 N shifts the rest
    c = 2.0 * zeta * np.sqrt(K * MU)
    model, state, _ = two_body_oscillator(damping=c, push=push)
    traj = rbjax.rollout(model, state, DT, STEPS, save_every=EVERY)
    t = np.asarray(traj.t)
    x, _ = separation(traj)
    # μ ẍ = −f = −[k (x − l0) + c ẋ + h]: equilibrium x_eq = l0 − h/k
    x_eq = L0 - push / K
    w0 = np.sqrt(K / MU)
    wd = w0 * np.sqrt(1.0 - zeta**2)
    exact = x_eq + (L0 + AMP - x_eq) * np.exp(-zeta * w0 * t) * (
        np.cos(wd * t) + zeta * w0 / wd * np.sin(wd * t)
    )
    err = np.max(np.abs(x - exact)) / AMP
    p = np.asarray(rbjax.linear_momentum(model, traj.states))
    print(f"\ndamped: rel err {err:.2e}, |p|max {np.abs(p).max():.1e}")
    assert err < 2e-9  # measured 6.2e-11
    assert np.abs(p).max() < 1e-13
    late = t >= 1.0  # it did decay: envelope e^{−ζ ω0 t} ≤ 0.54 after 1 s
    assert np.max(np.abs(x[late] - x_eq)) < 0.6 * (x[0] - x_eq)


# ----------------------------------------------------------- torsional oscillator on a hinge


def test_rsda_on_revolute_is_a_torsional_oscillator_and_conserves_energy():
    inertia = np.array([0.3, 0.4, 0.5])  # the hinge is the body's third principal axis
    n = unit([0.2, -1.0, 0.6])  # world hinge axis through the centre of mass
    q_ref = np.r_[0.1, -0.2, 0.3, quat_axis(np.cross([0, 0, 1], n), np.arccos(n[2]))][None]
    assert_close(rotmat(q_ref[0, 3:7])[:, 2], n, atol=1e-15)
    k = inertia[2] * (2 * np.pi) ** 2  # 1 Hz
    th0 = 0.5
    hinge = rbjax.Revolute.at(q_ref, GROUND, 0, point=q_ref[0, 0:3], axis=n)
    rsda = rbjax.RotationalSpringDamper.at(
        q_ref, GROUND, 0, axis=n, ref=np.cross(n, [1.0, 0.0, 0.0]), stiffness=k
    )
    model = rbjax.Model([rbjax.Body(1.0, inertia)], joints=[hinge], forces=[rsda])
    q0 = qmul(quat_axis(n, th0), q_ref[0, 3:7])
    state = rbjax.make_state(position=q_ref[:, 0:3], quaternion=q0[None])
    traj = rbjax.rollout(model, state, DT, STEPS, save_every=EVERY)
    t = np.asarray(traj.t)
    rel = np.array(
        [qmul(p, q_ref[0, 3:7] * [1, -1, -1, -1]) for p in np.asarray(traj.q[:, 0, 3:7])]
    )
    theta = 2 * np.arctan2(rel[:, 1:] @ n, rel[:, 0])
    err = np.max(np.abs(theta - th0 * np.cos(np.sqrt(k / inertia[2]) * t))) / th0
    w_world = np.array(
        [
            rotmat(q[3:7]) @ u[4:7]
            for q, u in zip(np.asarray(traj.q[:, 0]), np.asarray(traj.u[:, 0]), strict=True)
        ]
    )
    theta_dot = w_world @ n
    energy = 0.5 * inertia[2] * theta_dot**2 + 0.5 * k * theta**2
    e_err = np.max(np.abs(energy - energy[0])) / energy[0]
    off = np.max(np.abs(w_world - np.outer(theta_dot, n)))
    print(f"\ntorsional: rel err {err:.2e}, energy drift {e_err:.2e}, off-axis ω {off:.1e}")
    assert err < 2e-9  # measured 1.5e-10
    assert e_err < 1e-10  # measured 2.3e-12
    assert off < 1e-12
    # θ of the force itself agrees with the closed form along the trajectory
    th_code, thd_code = rsda.angle_and_rate(model, traj.states)
    assert_close(th_code, theta, atol=1e-13)
    assert_close(thd_code, theta_dot, atol=1e-12)


# ------------------------------------------------------------- resultants and rates, no rollout


def two_body_state(scalable_j=True):
    """Body 0 rigid, body 1 scalable (|A|² = 1.44, ν ≠ 0), both moving."""
    a_i = quat_axis([0.3, -1.0, 0.5], 0.8)
    a_j = 1.2 * quat_axis([1.0, 0.4, -0.2], -1.3)
    q = np.array([np.r_[0.1, 0.2, -0.3, a_i], np.r_[1.0, -0.5, 0.4, a_j]])
    u = np.array(
        [
            [0.3, -0.2, 0.5, 0.0, 0.7, -0.4, 1.1],
            [-0.6, 0.1, 0.2, 0.35 if scalable_j else 0.0, -0.5, 0.9, 0.3],
        ]
    )
    bodies = [
        rbjax.Body(1.0, [0.1, 0.2, 0.25], name="i"),
        rbjax.Body(2.0, [0.3, 0.2, 0.4], scalable=scalable_j, name="j"),
    ]
    return bodies, q, u


def test_tsda_resultants_equal_point_forces_and_rate_matches_finite_difference():
    bodies, q, u = two_body_state()
    s_i, s_j = np.array([0.2, -0.1, 0.3]), np.array([-0.15, 0.25, 0.05])
    k, c, l0, t = 30.0, 1.7, 0.6, 0.4
    push = Push(jnp.asarray(0.8), jnp.asarray(-0.5))
    tsda = rbjax.TranslationalSpringDamper(
        0, s_i, 1, s_j, stiffness=k, damping=c, rest_length=l0, actuator=push
    )
    model = rbjax.Model(bodies, forces=[tsda])
    state = rbjax.make_state(
        position=q[:, :3],
        quaternion=q[:, 3:],
        velocity=u[:, :3],
        nu=u[:, 3],
        omega_body=u[:, 4:],
        t=t,
    )

    # closed form
    d = world_point(q[1], s_j) - world_point(q[0], s_i)
    l = np.linalg.norm(d)
    e = d / l
    ldot = e @ (point_velocity(q[1], u[1], s_j) - point_velocity(q[0], u[0], s_i))
    f = k * (l - l0) + c * ldot + (0.8 - 0.5 * t)

    # the rate is the derivative of the length along q̇ (central difference, independent of rbjax)
    def length(qq):
        return np.linalg.norm(world_point(qq[1], s_j) - world_point(qq[0], s_i))

    qd = np.array([qdot_scalable(q[b], u[b]) for b in range(2)])
    eps = 1e-6
    ldot_fd = (length(q + eps * qd) - length(q - eps * qd)) / (2 * eps)
    l_code, ldot_code = tsda.length_and_rate(model, state)
    print(
        f"\nTSDA: l̇ closed form vs FD {abs(ldot - ldot_fd):.1e}, code vs closed form {abs(ldot_code - ldot):.1e}"
    )
    assert_close(ldot_fd, ldot, rtol=1e-8)  # measured 7e-11 absolute (FD truncation)
    assert_close(l_code, l, rtol=1e-14)
    assert_close(ldot_code, ldot, rtol=1e-13)

    # resultants = two PointForces with the same instantaneous force (Möller & Glocker 2012 eq. (75))
    ref = rbjax.Model(
        bodies,
        forces=[rbjax.PointForce(0, s_i, f * e), rbjax.PointForce(1, s_j, -f * e)],
    )
    got, want = resultants(model, state), resultants(ref, state)
    for g, w, name in zip(got, want, "FSM", strict=True):
        assert_close(g, w, rtol=1e-12, atol=1e-13, err_msg=name)
    assert_close(got[0][0], -got[0][1], rtol=1e-15)  # equal and opposite
    # virtual power: Σ F·v + S ν + M·ω = f e·(Ṗ_i − Ṗ_j) = −f l̇
    power = sum(got[0][b] @ u[b, :3] + got[1][b] * u[b, 3] + got[2][b] @ u[b, 4:] for b in range(2))
    assert_close(power, -f * ldot, rtol=1e-12)

    # to GROUND: one point force on body i; the ground point is a world point
    p_g = np.array([1.5, 0.5, -1.0])
    tsda_g = rbjax.TranslationalSpringDamper(
        0, s_i, GROUND, p_g, stiffness=k, damping=c, rest_length=l0
    )
    d = p_g - world_point(q[0], s_i)
    e = d / np.linalg.norm(d)
    f = k * (np.linalg.norm(d) - l0) + c * (e @ -point_velocity(q[0], u[0], s_i))
    got = resultants(rbjax.Model(bodies, forces=[tsda_g]), state)
    want = resultants(rbjax.Model(bodies, forces=[rbjax.PointForce(0, s_i, f * e)]), state)
    for g, w, name in zip(got, want, "FSM", strict=True):
        assert_close(g, w, rtol=1e-12, atol=1e-13, err_msg=name)

    # NewtonEuler (rigid bodies): same rate from its own kinematics Ȧ = ½ A (0, ω)
    bodies_r, q_r, u_r = two_body_state(scalable_j=False)
    q_r[1, 3:7] /= np.linalg.norm(q_r[1, 3:7])
    st_r = rbjax.make_state(
        position=q_r[:, :3], quaternion=q_r[:, 3:], velocity=u_r[:, :3], omega_body=u_r[:, 4:]
    )
    model_ne = rbjax.Model(bodies_r, forces=[tsda], formulation=rbjax.NewtonEuler())
    _, ldot_ne = tsda.length_and_rate(model_ne, st_r)
    d = world_point(q_r[1], s_j) - world_point(q_r[0], s_i)
    ldot_r = unit(d) @ (point_velocity(q_r[1], u_r[1], s_j) - point_velocity(q_r[0], u_r[0], s_i))
    assert_close(ldot_ne, ldot_r, rtol=1e-13)


def test_rsda_resultants_closed_form_and_rate_matches_finite_difference():
    """Body j turned by φ about the common axis from body i; the pair tumbles as a whole
    (rotation G) and body j is scalable: θ = φ, θ̇ = φ̇, torques ±τ z, power τ θ̇."""
    bodies, _, _ = two_body_state()
    n = unit([0.3, 0.4, -1.0])
    a_i0, a_j0 = quat_axis([1.0, 0.0, 0.5], 0.4), quat_axis([0.0, 1.0, 0.2], -2.0)
    q_ref = np.array([np.r_[0, 0, 0, a_i0], np.r_[1, 0, 0, a_j0]])
    x = unit(np.cross(n, [0.0, 1.0, 0.0]))
    k, c, th0, t = 3.0, 0.4, -0.3, 0.7
    push = Push(jnp.asarray(0.25), jnp.asarray(0.1))
    rsda = rbjax.RotationalSpringDamper.at(
        q_ref, 0, 1, axis=n, ref=x, stiffness=k, damping=c, rest_angle=th0, actuator=push
    )
    model = rbjax.Model(bodies, forces=[rsda])
    G = quat_axis([0.5, -0.2, 1.0], 1.1)
    phi, phi_dot, s_j, nu_j = 2.2, -0.8, 1.44, 0.3
    a_i = qmul(G, a_i0)
    a_j = np.sqrt(s_j) * qmul(G, qmul(quat_axis(n, phi), a_j0))
    big_w = np.array([0.4, -1.2, 0.7])  # world angular velocity of body i
    z = rotmat(G) @ n
    w_i = rotmat(a_i).T @ big_w
    w_j = s_j * rotmat(a_j).T @ (big_w + phi_dot * z)  # ω̄ is the body angular velocity × s
    q = np.array([np.r_[0.1, 0.2, -0.3, a_i], np.r_[1.0, -0.5, 0.4, a_j]])
    u = np.array([np.r_[0.3, -0.2, 0.5, 0.0, w_i], np.r_[-0.6, 0.1, 0.2, nu_j, w_j]])
    state = rbjax.make_state(
        position=q[:, :3],
        quaternion=q[:, 3:],
        velocity=u[:, :3],
        nu=u[:, 3],
        omega_body=u[:, 4:],
        t=t,
    )

    th, thd = rsda.angle_and_rate(model, state)
    qd = np.array([qdot_scalable(q[b], u[b]) for b in range(2)])
    eps = 1e-6

    def angle(qq):
        st = rbjax.State(t=jnp.zeros(()), q=jnp.asarray(qq), u=jnp.zeros((2, 7)))
        return float(rsda.angle_and_rate(model, st)[0])

    thd_fd = (angle(q + eps * qd) - angle(q - eps * qd)) / (2 * eps)
    print(
        f"\nRSDA: θ err {abs(th - phi):.1e}, θ̇ err {abs(thd - phi_dot):.1e}, FD {abs(thd_fd - phi_dot):.1e}"
    )
    assert_close(th, phi, rtol=1e-13)
    assert_close(thd, phi_dot, rtol=1e-13)
    assert_close(thd_fd, phi_dot, rtol=1e-8)  # measured 2.3e-11 absolute

    tau = -(k * (phi - th0) + c * phi_dot) + (0.25 + 0.1 * t)
    F, S, M = resultants(model, state)
    assert_close(F, np.zeros((2, 3)), atol=0.0)
    assert_close(S, np.zeros(2), atol=0.0)
    assert_close(M[0], -rotmat(a_i).T @ (tau * z), rtol=1e-13)
    assert_close(M[1], rotmat(a_j).T @ (tau * z) / s_j, rtol=1e-13)
    assert_close(np.sum(M * u[:, 4:]), tau * phi_dot, rtol=1e-13)  # power τ θ̇

    # the same RSDA to GROUND (body i = world frame) acts on body j only
    rsda_g = rbjax.RotationalSpringDamper(
        GROUND, 1, axis_i=z, axis_j=rsda.axis_j, ref_i=rotmat(G) @ x, ref_j=rsda.ref_j, stiffness=k
    )
    F, S, M = resultants(rbjax.Model(bodies, forces=[rsda_g]), state)
    thd_g = z @ (big_w + phi_dot * z)
    assert_close(M[0], np.zeros(3), atol=0.0)
    assert_close(M[1], rotmat(a_j).T @ (-k * phi * z) / s_j, rtol=1e-13)
    assert_close(rsda_g.angle_and_rate(model, state)[1], thd_g, rtol=1e-13)


def test_batched_resultants_equal_single_systems():
    """Batch axes between the component and body axes (7, B, nb), as in batched rollouts."""
    bodies, q, u = two_body_state()
    forces = [
        rbjax.TranslationalSpringDamper(
            0, [0.2, -0.1, 0.3], 1, [-0.15, 0.25, 0.05], stiffness=40.0, damping=0.8,
            rest_length=0.7, actuator=Push(jnp.asarray(0.3), jnp.asarray(-0.2)),
        ),
        rbjax.TranslationalSpringDamper(1, [0.1, 0.0, 0.0], GROUND, [2.0, 1.0, 0.0], stiffness=5.0),
        rbjax.RotationalSpringDamper.at(q, 0, 1, axis=[0.0, 0.3, 1.0], stiffness=2.0, damping=0.1),
        rbjax.RotationalSpringDamper.at(q, GROUND, 1, axis=[1.0, 0.0, 0.0], stiffness=3.0),
    ]  # fmt: skip
    model = rbjax.Model(bodies, forces=forces)
    qs = np.stack([q, q + [0.1, -0.2, 0.3, 0.05, -0.1, 0.2, 0.1]])
    us = np.stack([u, 0.5 * u[::-1] * [1, 1, 1, 0, 1, 1, 1]])
    us[:, 0, 3] = 0.0  # body 0 is rigid
    ts = np.array([0.2, 0.9])
    batch = rbjax.make_state(
        position=qs[..., :3], quaternion=qs[..., 3:], velocity=us[..., :3], nu=us[..., 3],
        omega_body=us[..., 4:], t=ts,
    )  # fmt: skip
    t, qc, uc = to_components(batch)
    for f in forces:
        rb = f._engine_resultants(model, t, qc, uc)
        assert rb.F.shape == (3, 2, 2) and rb.S.shape == (2, 2) and rb.M.shape == (3, 2, 2)
        for b in range(2):
            r1 = f._engine_resultants(model, t[b], qc[:, b], uc[:, b])
            for x_b, x_1 in zip((rb.F[:, b], rb.S[b], rb.M[:, b]), (r1.F, r1.S, r1.M), strict=True):
                assert_close(x_b, x_1, rtol=1e-15, atol=1e-15)


# ---------------------------------------------------------------------------- gradients


def check_derivatives(fn, x0, names, mode):
    """Derivatives of the scalar ``fn(xs)`` in every entry of the leaves ``x0`` against central
    differences; one compile serves both (the primal comes with the derivative). ``mode``:
    "reverse" (jax.value_and_grad) or "forward" (one jax.jvp per entry). Returns the worst
    relative error."""
    x0 = tuple(jnp.asarray(np.asarray(x, float)) for x in x0)  # strong float64: no re-tracing
    if mode == "reverse":
        value_and_grad = jax.jit(jax.value_and_grad(fn))
        value = lambda xs: value_and_grad(xs)[0]
        g_ad = [np.asarray(g) for g in value_and_grad(x0)[1]]
    else:
        jvp = jax.jit(lambda xs, dxs: jax.jvp(fn, (xs,), (dxs,)))
        zeros = tuple(jnp.zeros_like(x) for x in x0)
        value = lambda xs: jvp(xs, zeros)[0]
        g_ad = []
        for k, x in enumerate(x0):
            g = np.zeros(x.shape)
            for i in np.ndindex(x.shape):
                dxs = list(zeros)
                dxs[k] = dxs[k].at[i].set(1.0)
                g[i] = jvp(x0, tuple(dxs))[1]
            g_ad.append(g)
    worst = 0.0
    for k, name in enumerate(names):
        x = np.asarray(x0[k])
        g_fd = np.zeros_like(x)
        for i in np.ndindex(x.shape):
            h = 1e-5 * max(1.0, abs(float(x[i])))
            e = np.zeros_like(x)
            e[i] = h
            xs_p, xs_m = list(x0), list(x0)
            xs_p[k], xs_m[k] = jnp.asarray(x + e), jnp.asarray(x - e)
            g_fd[i] = (value(tuple(xs_p)) - value(tuple(xs_m))) / (2 * h)
        assert np.all(np.abs(g_fd) > 1e-6), name  # every parameter matters
        assert np.all(np.isfinite(g_ad[k])), name
        worst = max(worst, float(np.max(np.abs(g_ad[k] - g_fd) / np.abs(g_fd))))
        assert_close(g_ad[k], g_fd, rtol=1e-6, atol=0.0, err_msg=name)
    return worst


def test_rollout_derivatives_in_tsda_parameters_match_finite_differences():
    """Forward mode through the rollout (compiles in about half the time of reverse mode);
    reverse mode of the same force code is checked on the resultants below, and reverse mode
    through rollouts in general in tests/test_forces.py."""
    bodies, q, u = two_body_state(scalable_j=False)
    q[1, 3:7] /= np.linalg.norm(q[1, 3:7])
    tsda = rbjax.TranslationalSpringDamper(
        0, [0.2, -0.1, 0.3], 1, [-0.15, 0.25, 0.05], stiffness=40.0, damping=0.8,
        rest_length=0.7, actuator=Push(jnp.asarray(0.3), jnp.asarray(-0.2)),
    )  # fmt: skip
    model = rbjax.Model(bodies, forces=[tsda])
    state = rbjax.make_state(
        position=q[:, :3], quaternion=q[:, 3:], velocity=u[:, :3], omega_body=u[:, 4:]
    )
    where = {
        "stiffness": lambda m: m.forces[0].stiffness,
        "damping": lambda m: m.forces[0].damping,
        "rest_length": lambda m: m.forces[0].rest_length,
        "actuator.b": lambda m: m.forces[0].actuator.b,
        "s_i": lambda m: m.forces[0].s_i,
    }
    getters = list(where.values())
    everything = lambda m: tuple(g(m) for g in getters)
    w = jnp.asarray([0.3, -0.7, 0.5])

    def loss(xs):
        traj = rbjax.rollout(eqx.tree_at(everything, model, xs), state, 1e-2, 100, save_every=100)
        qf = traj.q[-1]
        return qf[0, 0:3] @ w + qf[1, 0:3] @ w + qf[1, 3:7] @ jnp.asarray([0.2, 0.4, -0.3, 0.1])

    worst = check_derivatives(loss, everything(model), where, "forward")
    print(f"\nrollout derivatives: worst rel err vs central differences {worst:.1e}")
    assert worst <= 1e-6  # (check_derivatives also asserts per parameter)


def test_resultant_gradients_in_all_parameters_match_finite_differences():
    """Every leaf of both forces (incl. actuator parameters and body vectors), reverse mode,
    at a state with a scalable body: cheap, so it covers what the rollout test does not."""
    bodies, q, u = two_body_state()
    tsda = rbjax.TranslationalSpringDamper(
        0, [0.2, -0.1, 0.3], 1, [-0.15, 0.25, 0.05], stiffness=40.0, damping=0.8,
        rest_length=0.7, actuator=Push(jnp.asarray(0.3), jnp.asarray(-0.2)),
    )  # fmt: skip
    rsda = rbjax.RotationalSpringDamper.at(
        q, 0, 1, axis=[0.0, 0.3, 1.0], stiffness=2.0, damping=0.1, rest_angle=0.2,
        actuator=Push(jnp.asarray(0.1), jnp.asarray(0.4)),
    )  # fmt: skip
    model = rbjax.Model(bodies, forces=[tsda, rsda])
    state = rbjax.make_state(
        position=q[:, :3], quaternion=q[:, 3:], velocity=u[:, :3], nu=u[:, 3],
        omega_body=u[:, 4:], t=0.3,
    )  # fmt: skip
    state = eqx.tree_at(lambda s: s.q, state, state.q.at[1, 3:7].multiply(1.1))  # tilt θ ≠ 0
    t, qc, uc = to_components(state)
    leaves = ["stiffness", "damping", "actuator.a", "actuator.b"]
    where = {f"tsda.{k}": k for k in leaves + ["rest_length", "s_i", "s_j"]}
    where |= {f"rsda.{k}": k for k in leaves + ["rest_angle", "axis_i", "ref_i", "ref_j"]}

    def get(m, name):
        obj = m.forces[0] if name.startswith("tsda") else m.forces[1]
        for part in name.split(".")[1:]:
            obj = getattr(obj, part)
        return obj

    everything = lambda m: tuple(get(m, name) for name in where)
    wf, ws, wm = (
        jnp.asarray([0.3, -0.7, 0.5]),
        jnp.asarray([1.3, -0.4]),
        jnp.asarray([0.2, 0.9, -0.6]),
    )

    def loss(xs):
        m = eqx.tree_at(everything, model, xs)
        r = m.forces[0]._engine_resultants(m, t, qc, uc) + m.forces[1]._engine_resultants(
            m, t, qc, uc
        )
        return jnp.sum(wf @ r.F) + jnp.sum(r.S * ws) + jnp.sum(wm @ r.M * jnp.asarray([1.0, -2.0]))

    worst = check_derivatives(loss, everything(model), where, "reverse")
    print(f"\nresultant gradients: worst rel err vs central differences {worst:.1e}")
    assert worst <= 1e-6  # (check_derivatives also asserts per parameter)


# ------------------------------------------------------------------ singularity at l = 0


def test_tsda_coincident_points_give_no_nan_in_value_or_gradient():
    bodies, q, u = two_body_state(scalable_j=False)
    q[1, 3:7] /= np.linalg.norm(q[1, 3:7])
    q[0] = [0.5, 0.25, -0.125, 1.0, 0.0, 0.0, 0.0]  # P_i = r + s̄_i exactly in binary
    s_i = np.array([0.25, -0.125, 0.375])
    s_j = q[0, 0:3] + s_i  # a ground point exactly at P_i (ω_i ≠ 0, so l̇ would need e)

    def build(l0, c, actuator):
        tsda = rbjax.TranslationalSpringDamper(
            0, s_i, GROUND, s_j, stiffness=25.0, damping=c, rest_length=l0, actuator=actuator
        )
        return rbjax.Model(bodies, forces=[tsda])

    state = rbjax.make_state(
        position=q[:, :3], quaternion=q[:, 3:], velocity=u[:, :3], omega_body=u[:, 4:]
    )
    t, qc, uc = to_components(state)
    for l0, c, act in [
        (0.0, 0.0, None),
        (0.0, 1.5, Push(jnp.asarray(0.3), jnp.asarray(1.0))),
        (0.4, 1.5, None),
    ]:
        model = build(l0, c, act)
        force = model.forces[0]
        l, ldot = force.length_and_rate(model, state)
        assert float(l) == 0.0 and float(ldot) == 0.0
        res = force._engine_resultants(model, t, qc, uc)
        for x in (res.F, res.S, res.M):
            assert_close(x, jnp.zeros_like(x), atol=0.0)  # direction undefined: force 0 at l = 0

        def scalar(f, qq, uu, model=model):
            r = f._engine_resultants(model, t, qq, uu)
            return jnp.sum(r.F * 1.3) + jnp.sum(r.S) - jnp.sum(r.M * 0.7)

        grads = jax.grad(scalar, argnums=(0, 1, 2))(force, qc, uc)
        leaves = jax.tree_util.tree_leaves(grads)
        assert all(bool(jnp.all(jnp.isfinite(x))) for x in leaves), (l0, c)
    # rest length 0, no damping: the spring is k d, smooth through d = 0 with ∂F_i/∂r_i = −k I
    model = build(0.0, 0.0, None)
    force = model.forces[0]
    jac = jax.jacfwd(lambda qq: force._engine_resultants(model, t, qq, uc).F[:, 0])(qc)
    assert_close(jac[:, 0:3, 0], -25.0 * np.eye(3), rtol=1e-14)


# ------------------------------------------------------------------------------ bad input


def tsda(**kw):
    args = dict(body_i=0, s_i=[0, 0, 0], body_j=1, s_j=[0, 0, 0], stiffness=1.0)
    args.update(kw)
    return rbjax.TranslationalSpringDamper(
        args.pop("body_i"), args.pop("s_i"), args.pop("body_j"), args.pop("s_j"), **args
    )


def rsda(**kw):
    args = dict(
        body_i=0, body_j=1, axis_i=[0, 0, 1], axis_j=[0, 0, 1], ref_i=[1, 0, 0], ref_j=[1, 0, 0],
        stiffness=1.0,
    )  # fmt: skip
    args.update(kw)
    return rbjax.RotationalSpringDamper(args.pop("body_i"), args.pop("body_j"), **args)


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: tsda(s_i=[0, 0]), r"TranslationalSpringDamper.s_i has shape \(2,\)"),
        (lambda: tsda(s_j=[0, np.nan, 0]), r"TranslationalSpringDamper.s_j .*non-finite"),
        (lambda: tsda(stiffness=[1.0, 2.0]), r"TranslationalSpringDamper.stiffness .*not a scalar"),
        (lambda: tsda(damping=np.inf), r"TranslationalSpringDamper.damping .*non-finite"),
        (lambda: tsda(rest_length=-0.1), r"TranslationalSpringDamper.rest_length .*negative"),
        (lambda: tsda(actuator=3.0), r"TranslationalSpringDamper.actuator = 3.0 is not callable"),
        (lambda: tsda(body_j=0), r"connects body 0 to itself"),
        (lambda: tsda(body_i="a"), r"TranslationalSpringDamper.body_i = 'a' is not a body index"),
        (lambda: rsda(axis_i=[0, 1]), r"RotationalSpringDamper.axis_i has shape \(2,\)"),
        (lambda: rsda(axis_j=[0, 0, 0]), r"RotationalSpringDamper.axis_j .*zero length"),
        (lambda: rsda(ref_i=[np.nan, 0, 0]), r"RotationalSpringDamper.ref_i .*non-finite"),
        (lambda: rsda(ref_j=[1, 0, 0.1]), r"RotationalSpringDamper.ref_j .*not perpendicular"),
        (lambda: rsda(stiffness=np.ones(3)), r"RotationalSpringDamper.stiffness .*not a scalar"),
        (lambda: rsda(damping=np.nan), r"RotationalSpringDamper.damping .*non-finite"),
        (lambda: rsda(rest_angle=4.0), r"RotationalSpringDamper.rest_angle .*not in \(−π, π\]"),
        (lambda: rsda(actuator="h"), r"RotationalSpringDamper.actuator = 'h' is not callable"),
        (lambda: rsda(body_i=GROUND, body_j=GROUND), r"connects body -1 to itself"),
        (
            lambda: rbjax.RotationalSpringDamper.at(np.zeros(7), 0, 1, stiffness=1.0),
            r"RotationalSpringDamper.at: q0 has shape \(7,\)",
        ),
        (
            lambda: rbjax.RotationalSpringDamper.at(
                np.tile([0, 0, 0, 1.0, 0, 0, 0], (2, 1)),
                0,
                1,
                axis=[0, 0, 1],
                ref=[0, 1, 1],
                stiffness=1.0,
            ),
            r"ref = .* is not perpendicular to axis",
        ),
        (
            lambda: rbjax.RotationalSpringDamper.at(
                np.tile([0, 0, 0, 1.0, 0, 0, 0], (2, 1)), 0, 2, stiffness=1.0
            ),
            r"body 2 is not an index into q0",
        ),
    ],
)
def test_bad_constructor_input_raises_naming_the_field(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_model_rejects_spring_damper_body_indices():
    bodies = [rbjax.Body(1.0, [1.0, 1.0, 1.0], name=n) for n in "ab"]
    with pytest.raises(
        ValueError,
        match=r"forces\[1\].body_j = 2 is not a body index in \[0, 2\) or rbjax.GROUND .*Fix:",
    ):
        rbjax.Model(bodies, forces=[tsda(), tsda(body_j=2)])
    with pytest.raises(ValueError, match=r"forces\[0\].body_i = -2 is not a body index"):
        rbjax.Model(bodies, forces=[rsda(body_i=-2)])
    same = copy.copy(tsda())
    object.__setattr__(same, "body_j", 0)  # bypasses the constructor's own check
    with pytest.raises(ValueError, match=r"forces\[0\].body_j = 0 equals body_i"):
        rbjax.Model(bodies, forces=[same])
    rbjax.Model(bodies, forces=[tsda(body_i=GROUND), rsda(body_j=GROUND)])  # GROUND is fine
