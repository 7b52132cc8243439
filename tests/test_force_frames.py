"""Torques fixed in the world and forces fixed in the body: ``BodyTorque(..., frame="world")``
and ``PointForce(..., frame="body")``.

Against closed forms (a symmetric top spun up about its fixed axis; the hodograph of a body
pushed by a force that turns with it), the momentum balance dL/dt = τ of a tumbling body, a
second formulation (a ForceFunction that rotates the vector by hand), hand resultants on a batch
of scalable bodies (Möller & Glocker 2012, eqs. (49), (75)), gradients against central
differences, the model file, and bad input.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close
from numpy_quaternions import qmul, quat_axis, rotmat

import rbjax
from rbjax._engine.forces import total_resultants
from rbjax._engine.layout import to_components

DT, STEPS, EVERY = 1e-3, 1000, 20


def rotmat_jnp(a):
    """The same R(a) in jax.numpy for a ForceFunction, written out (Möller & Glocker 2012, eq. (23))."""
    a = a / jnp.sqrt(jnp.sum(a * a))
    w, x, y, z = a
    return jnp.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ]
    )


INERTIA = np.array([0.4, 0.9, 1.3])  # asymmetric: the tumbling body
A0 = quat_axis([0.3, -1.0, 0.4], 1.2)
TAU_WORLD = np.array([0.3, -0.5, 0.8])
F_BODY, RHO = np.array([0.7, -0.2, 0.4]), np.array([0.15, 0.3, -0.1])


def tumbling_state():
    return rbjax.make_state(
        position=[[0.1, -0.2, 0.3]],
        quaternion=A0[None],
        velocity=[[0.2, 0.1, -0.3]],
        omega_body=[[1.5, -0.7, 2.1]],
    )


@pytest.fixture(scope="module")
def tumbling():
    """Rollouts of one tumbling body under (world torque + body force), and under the same
    loads written by hand as a ForceFunction (one compiled program: same structure)."""
    body = rbjax.Body(1.7, INERTIA)
    builtin = rbjax.Model(
        body,
        forces=[
            rbjax.BodyTorque(0, TAU_WORLD, frame="world"),
            rbjax.PointForce(0, RHO, F_BODY, frame="body"),
        ],
    )

    def by_hand(t, state, p):
        rot = rotmat_jnp(state.q[0, 3:7])
        tau_world, f_body, rho = p
        force_world = (rot @ f_body)[None]  # the force turns with the body
        moment_body = (rot.T @ tau_world + jnp.cross(rho, f_body))[None]
        return force_world, jnp.dot(rho, f_body)[None], moment_body

    params = (jnp.asarray(TAU_WORLD), jnp.asarray(F_BODY), jnp.asarray(RHO))
    hand = rbjax.Model(body, forces=[rbjax.ForceFunction(by_hand, params)])
    state = tumbling_state()
    return (
        builtin,
        rbjax.rollout(builtin, state, DT, STEPS, save_every=EVERY),
        rbjax.rollout(hand, state, DT, STEPS, save_every=EVERY),
    )


def test_world_torque_and_body_force_equal_a_force_function_rotating_them_by_hand(tumbling):
    _, mine, hand = tumbling
    print(f"\nmax |Δq| {np.max(np.abs(np.asarray(mine.q - hand.q))):.1e}")
    assert_close(mine.q, hand.q, rtol=0, atol=1e-12)
    assert_close(mine.u, hand.u, rtol=0, atol=1e-12)
    assert float(np.max(np.abs(np.asarray(mine.q[-1, 0, 3:7]) - A0))) > 0.5  # it did tumble


def test_world_torque_momentum_balance_dL_dt_equals_tau(tumbling):
    """About the world origin dL/dt = τ + Σ r_P × F: with the body force removed the balance
    is L(t) − L(0) = τ t exactly; with it, the force's moment is integrated from the saved
    states (trapezoid over the saved steps, an independent quadrature)."""
    model, traj, _ = tumbling
    torque_only = rbjax.Model(rbjax.Body(1.7, INERTIA), forces=[model.forces[0]])
    tr = rbjax.rollout(torque_only, tumbling_state(), DT, STEPS, save_every=EVERY)
    t = np.asarray(tr.t)
    L = np.asarray(rbjax.angular_momentum(torque_only, tr.states))
    err = np.max(np.abs(L - L[0] - np.outer(t, TAU_WORLD)))
    print(f"\nL(t) − L(0) − τ t: {err:.1e}")
    assert err < 1e-11  # measured: rounding
    # with the body-frame force too: dL/dt = τ + (r + R ϱ) × R f̄, and dp/dt = R f̄
    q = np.asarray(traj.q[:, 0])
    rot = np.array([rotmat(a) for a in q[:, 3:7]])
    f_world = rot @ F_BODY
    moment = TAU_WORLD + np.cross(q[:, 0:3] + rot @ RHO, f_world)
    L = np.asarray(rbjax.angular_momentum(model, traj.states))
    p = np.asarray(rbjax.linear_momentum(model, traj.states))
    h = np.diff(t)[:, None]
    assert_close(np.diff(L, axis=0), 0.5 * h * (moment[1:] + moment[:-1]), atol=2e-4)
    assert_close(np.diff(p, axis=0), 0.5 * h * (f_world[1:] + f_world[:-1]), atol=2e-4)


def test_world_torque_spins_up_a_symmetric_top_about_its_fixed_axis():
    """A symmetric top (Θ = diag(a, a, c)) spinning about its symmetry axis n with a world
    torque τ n: the axis stays fixed and A(t) = Rot(n, ω0 t + τ t²/(2c)) A0, ω3 = ω0 + τ t/c.
    The body-frame torque τ e3 gives the same motion (n = R e3 throughout)."""
    a, c, w0, tau = 0.5, 0.8, 3.0, 0.6
    n = rotmat(A0)[:, 2]
    state = rbjax.make_state(quaternion=A0[None], omega_body=[[0.0, 0.0, w0]])
    body = rbjax.Body(1.0, [a, a, c])
    runs = [
        rbjax.rollout(
            rbjax.Model(body, forces=[rbjax.BodyTorque(0, vec, frame=frame)]),
            state,
            DT,
            STEPS,
            save_every=EVERY,
        )
        for vec, frame in ((tau * n, "world"), (np.array([0.0, 0.0, tau]), "body"))
    ]
    t = np.asarray(runs[0].t)
    phase = w0 * t + tau * t**2 / (2 * c)
    attitude = np.array([qmul(quat_axis(n, ph), A0) for ph in phase])
    for tr in runs:
        assert_close(tr.q[:, 0, 3:7], attitude, atol=1e-11)
        assert_close(tr.u[:, 0, 6], w0 + tau * t / c, atol=1e-11)
        assert_close(tr.u[:, 0, 4:6], np.zeros((len(t), 2)), atol=1e-12)


def test_body_force_turning_with_a_spinning_body_traces_the_closed_form_hodograph():
    """A force f̄ fixed in a body that spins steadily about its principal axis n (no moment:
    at the centre of mass) is F(t) = f∥ + Rot(n, Ω t) f⊥, so
    v(t) = v0 + [f∥ t + sin(Ω t)/Ω f⊥ + (1 − cos Ω t)/Ω n × f⊥] / m and
    r(t) = r0 + v0 t + [f∥ t²/2 + (1 − cos Ω t)/Ω² f⊥ + (Ω t − sin Ω t)/Ω² n × f⊥] / m."""
    m, omega = 1.4, 5.0
    rot0 = rotmat(A0)
    n = rot0[:, 1]  # spin about the body's y axis (principal)
    f0 = rot0 @ F_BODY
    f_par = (f0 @ n) * n
    f_perp = f0 - f_par
    r0, v0 = np.array([0.1, 0.2, -0.3]), np.array([0.5, -0.1, 0.2])
    model = rbjax.Model(
        rbjax.Body(m, INERTIA), forces=[rbjax.PointForce(0, np.zeros(3), F_BODY, frame="body")]
    )
    state = rbjax.make_state(
        position=r0[None], quaternion=A0[None], velocity=v0[None], omega_body=[[0.0, omega, 0.0]]
    )
    tr = rbjax.rollout(model, state, DT, STEPS, save_every=EVERY)
    t = np.asarray(tr.t)[:, None]
    s, cth = np.sin(omega * t), np.cos(omega * t)
    nxf = np.cross(n, f_perp)
    v = v0 + (f_par * t + s / omega * f_perp + (1 - cth) / omega * nxf) / m
    r = (
        r0
        + v0 * t
        + (f_par * t**2 / 2 + (1 - cth) / omega**2 * f_perp + (omega * t - s) / omega**2 * nxf) / m
    )
    print(f"\nhodograph: max |Δv| {np.max(np.abs(np.asarray(tr.u[:, 0, 0:3]) - v)):.1e}")
    assert_close(tr.u[:, 0, 0:3], v, atol=1e-11)
    assert_close(tr.q[:, 0, 0:3], r, atol=1e-11)
    assert float(np.max(np.linalg.norm(v - v0 - np.outer(t[:, 0], f0) / m, axis=1))) > 0.1


def test_resultants_of_both_frames_by_hand_on_a_batch_of_scalable_bodies():
    """F = R f̄, S_C = ϱᵀ f̄, M_C = ϱ × f̄ (body force) and M_C = Rᵀ τ / s (world torque), hand
    formulas with s = |A|² ≠ 1 (Möller & Glocker 2012, eqs. (49), (75)); the same forces
    grouped with others of their type and frame, and the natural ``wrench`` (per system)."""
    key = jax.random.PRNGKey(11)
    bodies = [rbjax.Body(1.0, np.diag([1.0, 2.0, 3.0]), scalable=True) for _ in range(3)]
    forces = [
        rbjax.PointForce(0, RHO, F_BODY, frame="body"),
        rbjax.PointForce(2, -RHO, 2 * F_BODY, frame="body"),
        rbjax.BodyTorque(1, TAU_WORLD, frame="world"),
        rbjax.BodyTorque(2, -TAU_WORLD, frame="world"),
        rbjax.PointForce(1, RHO, F_BODY),  # defaults: other groups
        rbjax.BodyTorque(0, TAU_WORLD),
    ]
    model = rbjax.Model(bodies, forces=forces)
    q = jax.random.normal(key, (4, 3, 7))  # |A|² ≠ 1
    state = rbjax.State(t=jnp.zeros(4), q=q, u=jnp.zeros_like(q))
    res = total_resultants(model, *to_components(state))
    F = np.moveaxis(np.asarray(res.F), 0, -1)
    S = np.asarray(res.S)
    M = np.moveaxis(np.asarray(res.M), 0, -1)
    F_want, S_want, M_want = np.zeros((4, 3, 3)), np.zeros((4, 3)), np.zeros((4, 3, 3))
    for k in range(4):
        rots = [rotmat(a) for a in np.asarray(q[k, :, 3:7])]
        s = np.sum(np.asarray(q[k, :, 3:7]) ** 2, axis=-1)
        for b, rho, fb in ((0, RHO, F_BODY), (2, -RHO, 2 * F_BODY)):
            F_want[k, b] += rots[b] @ fb
            S_want[k, b] += rho @ fb
            M_want[k, b] += np.cross(rho, fb)
        for b, tau in ((1, TAU_WORLD), (2, -TAU_WORLD)):
            M_want[k, b] += rots[b].T @ tau / s[b]
        fw = F_BODY  # world force on body 1 at ϱ: F = f, S = ϱᵀRᵀf, M = ϱ × Rᵀf
        F_want[k, 1] += fw
        S_want[k, 1] += RHO @ rots[1].T @ fw
        M_want[k, 1] += np.cross(RHO, rots[1].T @ fw)
        M_want[k, 0] += TAU_WORLD
    assert_close(F, F_want, rtol=1e-13, atol=1e-13)
    assert_close(S, S_want, rtol=1e-13, atol=1e-13)
    assert_close(M, M_want, rtol=1e-13, atol=1e-13)
    for k in range(4):  # the natural per-system path agrees
        one = rbjax.State(t=state.t[k], q=q[k], u=jnp.zeros_like(q[k]))
        w = [f.wrench(model, one.t, one) for f in forces]
        assert_close(sum(np.asarray(x.force_world) for x in w), F_want[k], atol=1e-13)
        assert_close(sum(np.asarray(x.scaling) for x in w), S_want[k], atol=1e-13)
        assert_close(sum(np.asarray(x.moment_body) for x in w), M_want[k], atol=1e-13)


def test_gradients_in_the_vectors_of_both_frames_match_finite_differences():
    model = rbjax.Model(
        rbjax.Body(1.2, INERTIA),
        forces=[
            rbjax.BodyTorque(0, TAU_WORLD, frame="world"),
            rbjax.PointForce(0, RHO, F_BODY, frame="body"),
        ],
    )
    where = lambda m: (m.forces[0].torque_body, m.forces[1].force_world, m.forces[1].point_body)
    state = tumbling_state()

    @jax.jit
    def loss(xs):
        tr = rbjax.rollout(eqx.tree_at(where, model, xs), state, 1e-2, 40, save_every=40)
        qf = tr.q[-1, 0]
        return jnp.sum(qf[0:3] ** 2) + jnp.sum(qf[3:7] * jnp.array([0.3, -0.1, 0.7, 0.2]))

    x0 = where(model)
    grads = jax.grad(loss)(x0)
    eps = 1e-6
    for k, name in enumerate(("torque (world)", "force (body)", "point")):
        fd = np.zeros(3)
        for i in range(3):
            plus = [jnp.asarray(x) for x in x0]
            minus = [jnp.asarray(x) for x in x0]
            plus[k] = plus[k].at[i].add(eps)
            minus[k] = minus[k].at[i].add(-eps)
            fd[i] = (loss(tuple(plus)) - loss(tuple(minus))) / (2 * eps)
        assert np.max(np.abs(fd)) > 1e-3, name  # the loss does depend on it
        assert_close(grads[k], fd, rtol=1e-6, atol=1e-8, err_msg=name)


def test_model_file_keeps_the_frames_and_writes_defaults_as_before(tmp_path):
    bodies = [rbjax.Body(1.0, [0.1, 0.2, 0.3], name="a")]
    forces = [
        rbjax.BodyTorque(0, TAU_WORLD, frame="world"),
        rbjax.PointForce(0, RHO, F_BODY, frame="body"),
        rbjax.BodyTorque(0, TAU_WORLD),
        rbjax.PointForce(0, RHO, F_BODY),
    ]
    rbjax.save(tmp_path / "m.toml", rbjax.Model(bodies, forces=forces))
    text = (tmp_path / "m.toml").read_text()
    assert text.count("frame = ") == 2  # only the non-default frames are written
    loaded = rbjax.load(tmp_path / "m.toml").model
    assert [f.frame for f in loaded.forces] == ["world", "body", "body", "world"]
    for a, b in zip(loaded.forces, forces, strict=True):
        assert type(a) is type(b)
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
            assert np.array_equal(np.asarray(x), np.asarray(y))
    bad = text.replace('frame = "world"', 'frame = "space"', 1)
    (tmp_path / "bad.toml").write_text(bad)
    with pytest.raises(
        ValueError, match=r'forces\[0\]\.frame = "space" is not one of .*Fix: write frame = "world"'
    ):
        rbjax.load(tmp_path / "bad.toml")
    (tmp_path / "bad2.toml").write_text(text.replace('frame = "world"', "frame = 1", 1))
    with pytest.raises(
        ValueError, match=r"forces\[0\]\.frame = 1 is an integer, not a string\. Fix:"
    ):
        rbjax.load(tmp_path / "bad2.toml")


@pytest.mark.parametrize(
    "build, match",
    [
        (
            lambda: rbjax.BodyTorque(0, TAU_WORLD, frame="global"),
            r"BodyTorque.frame = 'global' is not a frame\. Fix: frame=\"body\" .* or "
            r"frame=\"world\"",
        ),
        (
            lambda: rbjax.PointForce(0, RHO, F_BODY, frame="Body"),
            r"PointForce.frame = 'Body' is not a frame\. Fix: frame=\"world\"",
        ),
        (lambda: rbjax.PointForce(0, RHO, F_BODY, frame=None), r"PointForce.frame = None"),
    ],
)
def test_bad_frame_names_the_field_value_and_fix(build, match):
    with pytest.raises(ValueError, match=match):
        build()
