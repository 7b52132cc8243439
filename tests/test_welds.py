"""Welded bodies and point masses merged into the body that carries them (issue 18 §4).

Every merged model is checked against something the merge did not produce:
* the same mechanism with the weld kept as a six-row ``rbjax.Fixed`` constraint (a different
  system of equations: three bodies and their multipliers instead of two composite bodies),
  for the motion, the energy, the other joints' reactions and the weld's own reaction;
* the parallel-axis theorem in closed form for the composite inertia;
* MuJoCo's simulation of the same mechanism from an MJCF file (its compiler keeps the welded
  body and its recursive algorithm composes the inertia on its own);
* central finite differences for the gradient through the merge.
"""

import json

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rbjax
from rbjax import GROUND, Body, Fixed, Model, Revolute

C30, S30 = np.cos(np.pi / 6), np.sin(np.pi / 6)


def _weld(**kw):
    return Fixed(
        "l2",
        "pay",
        s_i=[0.4, 0.05, 0.02],
        s_j=[0.03, -0.01, 0.0],
        z_i=[0, 0, 1],
        x_i=[C30, S30, 0],
        z_j=[0, 0, 1],
        x_j=[1, 0, 0],
        name="weld",
        **kw,
    )


def _double_pendulum(merge, *, forces=(), payload=None, extra_joints=()):
    """Two links hinged to the ground and to each other (axes y), and a payload welded to
    the tip of the second, offset and turned 30° about z: a 3-D motion of the payload."""
    bodies = [
        Body(1.0, [0.01, 0.1, 0.1], name="l1"),
        Body(0.7, [0.007, 0.06, 0.06], name="l2"),
        payload or Body(0.4, [0.002, 0.003, 0.004], name="pay"),
    ]
    joints = [
        Revolute(GROUND, "l1", s_j=[-0.5, 0, 0], z_i=[0, 1, 0], name="hinge1"),
        Revolute("l1", "l2", s_i=[0.5, 0, 0], s_j=[-0.4, 0, 0], z_i=[0, 1, 0], name="hinge2"),
        _weld(),
        *extra_joints,
    ]
    return Model(bodies, joints=joints, gravity=[0, 0, -9.81], forces=forces, merge_welded=merge)


def _start(model):
    """Released at rest, links horizontal: a consistent state of the unmerged model."""
    q = np.zeros((3, 7))
    q[:, 3] = 1.0
    q[0, :3] = [0.5, 0, 0]
    q[1, :3] = [1.4, 0, 0]
    st = rbjax.make_state(position=q[:, :3], quaternion=q[:, 3:7], dtype=jnp.float64)
    return rbjax.assemble(model, st)


def _same_motion(merged, unmerged, state, *, n_steps=800, dt=1.25e-3):
    """(merged trajectory, unmerged trajectory, the merged one expanded to every body).

    The two are different equations (the unmerged one integrates the weld's six rows and
    drifts off them), so they agree to RK4's discretisation error: on the double pendulum
    over 1 s, 7.3e-7, 4.6e-8 and 2.9e-9 m at dt = 5, 2.5 and 1.25 ms (the h⁴ ratio 16)."""
    opts = dict(dt=dt, n_steps=n_steps, integrator=rbjax.RK4(), save_every=50)
    t3 = rbjax.rollout(unmerged, state, **opts)
    t2 = rbjax.rollout(merged, merged.merge_state(state), **opts)
    return t2, t3, merged.expand(t2.states)


def _assert_same_states(expanded, states, atol):
    q, q3 = np.asarray(expanded.q), np.asarray(states.q)
    np.testing.assert_allclose(q[..., 0:3], q3[..., 0:3], rtol=0, atol=atol)
    sign = np.sign(np.sum(q[..., 3:7] * q3[..., 3:7], -1, keepdims=True))  # A and −A: one attitude
    np.testing.assert_allclose(sign * q[..., 3:7], q3[..., 3:7], rtol=0, atol=atol)
    np.testing.assert_allclose(np.asarray(expanded.u), np.asarray(states.u), rtol=0, atol=10 * atol)


def _last(tr):
    return jax.tree.map(lambda x: x[-1], tr.states)


def _assert_reactions(merged_r, unmerged_r, rows, atol):
    for field in merged_r.__dataclass_fields__:
        np.testing.assert_allclose(
            np.asarray(getattr(merged_r, field)),
            np.asarray(getattr(unmerged_r, field))[..., rows, :],
            rtol=0,
            atol=atol,
            err_msg=field,
        )


def _drag(t, state, params):
    """Vertical drag on the payload and a rotary damper in its own axes (row 2 only)."""
    on = jnp.asarray([0.0, 0.0, 1.0])[:, None]
    f = -params * state.u[:, 0:3] * jnp.asarray([0.0, 0.0, 1.0])[None] * on
    m = -0.3 * params * state.u[:, 4:7] * on
    return f, jnp.zeros(3, f.dtype), m


def _loads(scale: float):
    """A body-frame thruster and a world torque on the payload, a spring from the ground to
    it, and a user force law that sees the payload's own state, all times ``scale`` (0: no
    load, and the same compiled programs as with loads)."""
    return (
        rbjax.PointForce(2, [0.05, 0.02, 0.0], np.array([0.0, 1.5, 0.5]) * scale, frame="body"),
        rbjax.BodyTorque(2, np.array([0.1, -0.2, 0.3]) * scale, frame="world"),
        rbjax.TranslationalSpringDamper(
            GROUND, [1.5, 0.3, 0.2], 2, [0.02, 0.0, 0.01], stiffness=20.0 * scale,
            damping=0.3 * scale,
        ),
        rbjax.ForceFunction(_drag, jnp.asarray(0.8 * scale)),
    )  # fmt: skip


def test_welded_payload_moves_like_the_six_row_weld_and_reports_its_reaction():
    """Unloaded, then loaded (:func:`_loads`: the weld's reaction carries the payload's share
    of every load): merged and unmerged agree in motion, energy (unloaded: conserved) and
    every reaction. The loaded run reuses the unloaded run's compiled programs."""
    for scale in (0.0, 1.0):
        unmerged, merged = (_double_pendulum(m, forces=_loads(scale)) for m in (False, True))
        assert merged.names == ("l1", "l2") and merged.merged.merged == ("pay",)
        assert unmerged.nb == 3 and merged.nb == 2
        st = _start(unmerged)
        t2, t3, ex = _same_motion(merged, unmerged, st)
        _assert_same_states(ex, t3.states, 1e-8)
        if scale == 0.0:  # the composite's kinetic and potential energy are the three bodies'
            e2, e3 = rbjax.total_energy(merged, t2.states), rbjax.total_energy(unmerged, t3.states)
            np.testing.assert_allclose(np.asarray(e2), np.asarray(e3), rtol=0, atol=1e-8)
            assert float(jnp.ptp(e3)) < 1e-5  # and it is conserved (RK4 drift only)
        # reactions: the hinges as in the unmerged model, the weld as its six multipliers
        s2, s3 = _last(t2), _last(t3)
        r2, r3 = rbjax.reactions(merged, s2), rbjax.reactions(unmerged, s3)
        _assert_reactions(r2, r3, [0, 1], 1e-7)
        w = rbjax.weld_reactions(merged, s2)
        _assert_reactions(w, r3, [2], 1e-7)
        assert float(jnp.linalg.norm(w.force_j)) > 1.0  # a real load: the weight and more
    # every saved state at once (a time axis) gives the same as one at a time
    wall = rbjax.weld_reactions(merged, t2.states)
    np.testing.assert_allclose(np.asarray(wall.force_j[-1]), np.asarray(w.force_j), atol=1e-12)


def test_point_mass_merges_by_default_with_the_parallel_axis_inertia():
    """A rod (mass 2, length 1) with a 0.5 kg point mass welded 0.3 m beyond its tip and 0.1 m
    to the side: the composite is checked against the closed form and its motion against a
    single body built by hand with those numbers."""
    m1, m2 = 2.0, 0.5
    rod_inertia = np.diag([0.002, m1 / 12, m1 / 12])
    p = np.array([0.8, 0.1, 0.0])  # point mass in rod axes, from the rod's centre of mass
    weld = Fixed("rod", "bob", s_i=p, name="bob weld")
    hinge = Revolute(GROUND, "rod", s_j=[-0.5, 0, 0], z_i=[0, 1, 0], name="hinge")
    model = Model(
        [Body(m1, rod_inertia, name="rod"), Body.point_mass(m2, name="bob")],
        joints=[hinge, weld],
        gravity=[0, 0, -9.81],
    )
    assert model.names == ("rod",) and model.joint_names == ("hinge",)
    mass = m1 + m2
    c = m2 * p / mass  # composite centre of mass in rod axes
    d1, d2 = -c, p - c

    def steiner(m, d):
        return m * (d @ d * np.eye(3) - np.outer(d, d))

    inertia = rod_inertia + steiner(m1, d1) + steiner(m2, d2)
    np.testing.assert_allclose(float(model.mass[0]), mass, rtol=1e-15)
    np.testing.assert_allclose(np.asarray(model.inertia[0]), inertia, rtol=1e-14, atol=1e-16)
    np.testing.assert_allclose(np.asarray(model.joints[0].s_j), [-0.5, 0, 0] - c, atol=1e-15)

    by_hand = Model(
        Body(mass, inertia, name="rod"),
        joints=[Revolute(GROUND, 0, s_j=np.array([-0.5, 0, 0]) - c, z_i=[0, 1, 0])],
        gravity=[0, 0, -9.81],
    )
    q0 = np.array([[0.5, 0, 0, 1, 0, 0, 0], [1.3, 0.1, 0, 1, 0, 0, 0]])
    st = model.merge_state(rbjax.make_state(position=q0[:, :3], dtype=jnp.float64))
    assert np.allclose(np.asarray(st.q[0, :3]), [0.5, 0, 0] + c)
    opts = dict(dt=5e-3, n_steps=200, integrator=rbjax.RK4(), save_every=200)
    a = rbjax.rollout(model, st, **opts).states.q
    b = rbjax.rollout(by_hand, st, **opts).states.q
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-13)
    # the bob rides at p on the rod: its world position from expand
    ex = model.expand(jax.tree.map(lambda x: x[-1], rbjax.rollout(model, st, **opts).states))
    rod_r, rod_a = ex.q[0, 0:3], ex.q[0, 3:7]
    np.testing.assert_allclose(
        np.asarray(ex.q[1, 0:3]), np.asarray(rod_r + rbjax.quaternion.rotate(rod_a, p)), atol=1e-14
    )


def test_point_mass_pendulum_matches_mujoco():
    """A spherical pendulum: a rod on a ball joint carrying a point mass offset from its axis,
    started spinning. MuJoCo keeps the massless-inertia body as its own body (no joint) and
    composes it in its recursive algorithm; rbjax merges it at build."""
    mujoco = pytest.importorskip("mujoco")
    xml = """<mujoco><option timestep="1e-3" integrator="RK4" gravity="0 0 -9.81">
      <flag contact="disable"/></option><worldbody>
      <body name="rod"><joint name="ball" type="ball"/>
        <inertial pos="0 0 -0.5" mass="1" diaginertia="0.08 0.09 0.01"/>
        <body name="bob" pos="0.1 0.05 -1"><inertial pos="0 0 0" mass="0.5" diaginertia="0 0 0"/>
        </body></body></worldbody></mujoco>"""
    m = mujoco.MjModel.from_xml_string(xml)
    d = mujoco.MjData(m)
    tilt = np.array([np.cos(0.2), np.sin(0.2), 0.0, 0.0])
    d.qpos[:] = tilt
    d.qvel[:] = [0.3, -0.2, 2.0]  # body-frame angular velocity
    mujoco.mj_forward(m, d)
    rod_r, bob_r = d.xipos[1].copy(), d.xipos[2].copy()
    omega = d.xmat[1].reshape(3, 3) @ d.qvel
    model = Model(
        [Body(1.0, [0.08, 0.09, 0.01], name="rod"), Body.point_mass(0.5, name="bob")],
        joints=[
            rbjax.Spherical(GROUND, "rod", s_j=[0, 0, 0.5], name="ball"),
            Fixed("rod", "bob", s_i=[0.1, 0.05, -0.5], name="bob weld"),
        ],
        gravity=[0, 0, -9.81],
    )
    st = rbjax.make_state(
        position=[rod_r, bob_r],
        quaternion=[tilt, tilt],
        velocity=[np.cross(omega, rod_r), np.cross(omega, bob_r)],
        omega_body=[d.qvel, d.qvel],
        dtype=jnp.float64,
    )
    steps = 500
    traj = rbjax.rollout(
        model, model.merge_state(st), dt=1e-3, n_steps=steps, integrator=rbjax.RK4()
    )
    bob = []
    for _ in range(steps):
        mujoco.mj_step(m, d)
        bob.append(d.xipos[2].copy())
    ours = np.asarray(model.expand(traj.states).q[1:, 1, 0:3])
    # the two discretisations of the rotation (MuJoCo's RK4 steps the ball joint on the
    # quaternion group) differ by 3.6e-9 m here; test_load.py's side-by-sides use 1e-8 too
    np.testing.assert_allclose(ours, np.array(bob), rtol=0, atol=1e-8)
    assert np.ptp(np.array(bob)[:, 0]) > 0.05  # it does move


def _every_builtin_on_the_payload():
    """One of each built-in joint (but Fixed, which welds it), basic constraint and force
    that rbjax moves onto a carrier, attached to the welded payload ("pay", body 2) on side
    i or j or alone."""
    f = lambda t: 0.1 * t  # noqa: E731
    frames = dict(s_i=[0.02, -0.03, 0.01], s_j=[0.1, 0.02, -0.04], z_i=[0, 0.6, 0.8])
    frames |= dict(x_i=[1, 0, 0], z_j=[0.8, 0, 0.6], x_j=[0, 1, 0])
    kinds = (rbjax.Spherical, Revolute, rbjax.Universal, rbjax.Cylindrical)
    kinds += (rbjax.Translational, rbjax.Parallel, rbjax.Perpendicular)
    joints = [k("pay", "l1", **frames, name=k.__name__) for k in kinds]
    joints += [
        rbjax.PointOnLine("l1", "pay", **frames, name="PointOnLine"),
        rbjax.Distance("pay", "l1", length=0.3, s_i=[0.1, 0.0, 0.02], name="Distance"),
        rbjax.RotationDriver("l1", "pay", f, **frames, name="RotationDriver"),
        rbjax.TranslationDriver("pay", GROUND, f, **frames, name="TranslationDriver"),
        rbjax.advanced.DP1("pay", [0, 1.0, 0], "l1", [1.0, 0, 0], f, name="DP1"),
        rbjax.advanced.DP2("l1", [0, 0, 1.0], [0.1, 0, 0], "pay", [0.0, 0.05, 0.02], name="DP2"),
        rbjax.advanced.D("pay", [0.02, 0.0, 0.03], GROUND, [1.0, 0.5, 0.0], f, name="D"),
        rbjax.advanced.CD([0.6, 0, 0.8], "pay", [0.01, 0.02, 0.0], "l1", [0.1, 0, 0], name="CD"),
    ]
    forces = [
        rbjax.PointForce(2, [0.05, 0.02, 0.0], [0.0, 1.5, 0.5], frame="body"),
        rbjax.PointForce(2, [0.01, -0.02, 0.03], [0.7, -0.2, 0.4]),
        rbjax.BodyTorque(2, [0.1, -0.2, 0.3], frame="world"),
        rbjax.BodyTorque(2, [0.3, 0.1, -0.2]),
        rbjax.TranslationalSpringDamper(
            2, [0.02, 0.0, 0.01], 0, [0.1, 0, 0], stiffness=20.0, damping=0.3, rest_length=0.1
        ),
        rbjax.RotationalSpringDamper(
            0,
            2,
            axis_i=[0, 1, 0],
            axis_j=[0, 0, 1],
            ref_i=[1, 0, 0],
            ref_j=[1, 0, 0],
            stiffness=3.0,
            damping=0.2,
            actuator=lambda t, x, v: 0.5 * x,
        ),
        rbjax.AxialSpringDamper(
            2,
            GROUND,
            s_i=[0.0, 0.01, 0.0],
            s_j=[1.0, 0.2, 0.1],
            axis_i=[0, 0, 1],
            stiffness=5.0,
            damping=0.1,
            rest_length=0.05,
        ),
    ]
    return joints, forces


def _engine_and_user_states(merge, nb):
    rng = np.random.default_rng(3)
    q = rng.normal(size=(nb, 7))
    q[:, 3:7] /= np.linalg.norm(q[:, 3:7], axis=-1, keepdims=True)
    u = rng.normal(size=(nb, 7))
    u[:, 3] = 0.0  # rigid bodies: no scaling rate
    q, u = jnp.asarray(q), jnp.asarray(u)
    return q, u, merge.expand(q, u)[0]


def _assert_moved_joints(model, joints):
    """Each joint's copy in ``model`` has its type, the carriers as bodies, and on random
    engine coordinates the residual of the original on the expanded (user) coordinates."""
    merge = model.merged
    q, _, qx = _engine_and_user_states(merge, model.nb)
    moved = {j.name: j for j in model.joints}
    ground = jnp.asarray([0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    t = jnp.asarray(0.7)

    def user(b):
        return GROUND if b == GROUND else merge.names.index(b)

    for joint in joints:
        m = moved[joint.name]
        assert type(m) is type(joint)
        sides = [user(b) for b in (joint.body_i, joint.body_j)]
        assert (m.body_i, m.body_j) == tuple(
            GROUND if b == GROUND else merge.carrier[b] for b in sides
        )
        qi, qj = (ground if b == GROUND else qx[b] for b in sides)
        ei, ej = (ground if b == GROUND else q[b] for b in (m.body_i, m.body_j))
        expected = joint.residual(qi, qj, t)
        assert float(jnp.max(jnp.abs(expected))) > 1e-2, joint.name  # a test that can fail
        np.testing.assert_allclose(m.residual(ei, ej, t), expected, rtol=0, atol=1e-13)


def test_every_builtin_joint_and_force_is_moved_onto_the_carrier():
    """Each built-in joint, ME751 constraint, point force, torque and spring on a welded body
    becomes an object of the same type on its carrier, rebuilt through its constructor, whose
    residual (joints) or wrench (forces) on the engine bodies equals the original's evaluated
    on the user's bodies (the states expanded from random engine states; forces: the
    original's wrench on the user's bodies folded onto the carriers, Merge.fold)."""
    joints, forces = _every_builtin_on_the_payload()
    model = _double_pendulum(True, forces=forces, extra_joints=joints)
    _assert_moved_joints(model, joints)
    unmerged = _double_pendulum(False, forces=forces)  # the user's layout, three bodies
    q, u, qx = _engine_and_user_states(model.merged, model.nb)
    ux = model.merged.expand(q, u)[1]
    t = jnp.asarray(0.7)
    for original, m in zip(forces, model.forces, strict=True):
        assert type(m) is type(original)
        assert getattr(m, "frame", None) == getattr(original, "frame", None)
        got = m.wrench(model, t, rbjax.State(t=t, q=q, u=u))
        own = original.wrench(unmerged, t, rbjax.State(t=t, q=qx, u=ux))
        want = model.merged.fold(q, own)
        assert float(jnp.max(jnp.abs(want.force_world) + jnp.abs(want.moment_body))) > 1e-2
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)
    # a Fixed joint that is not merged (merge_welded=False) on the carrier of a point mass
    frames = dict(s_i=[0.02, -0.03, 0.01], s_j=[0.1, 0.02, -0.04], z_i=[0, 0.6, 0.8])
    kept = [Fixed("l1", "l2", **frames, x_i=[1, 0, 0], name="kept")]
    model = _double_pendulum(False, payload=Body.point_mass(0.4, name="pay"), extra_joints=kept)
    assert model.merged.carrier == (0, 1, 1)
    _assert_moved_joints(model, kept)


class _MyHinge(Revolute):
    """A user subclass of a built-in joint: its constructor is not rbjax's to call."""


def test_a_subclass_of_a_builtin_joint_is_carried_on_its_own_bodies():
    """rbjax does not rebuild a user's subclass (its constructor may differ): it evaluates
    the joint on the welded body's own coordinates instead (rbjax.advanced.CarriedConstraint),
    with the same residual as the original on the expanded coordinates."""
    mine = _MyHinge("pay", "l1", s_i=[0.02, -0.03, 0.01], z_i=[0, 0.6, 0.8], name="mine")
    model = _double_pendulum(True, extra_joints=[mine])
    (carried,) = [j for j in model.joints if j.name == "mine"]
    assert isinstance(carried, rbjax.advanced.CarriedConstraint)
    assert (carried.body_i, carried.body_j) == (1, 0)
    q, _, qx = _engine_and_user_states(model.merged, model.nb)
    t = jnp.asarray(0.3)
    expected = mine.residual(qx[2], qx[0], t)
    assert float(jnp.max(jnp.abs(expected))) > 1e-2
    np.testing.assert_allclose(carried.residual(q[1], q[0], t), expected, rtol=0, atol=1e-13)


def test_bodies_welded_to_the_ground_leave_the_model():
    """merge_welded=True on a bracket welded to the world (offset and turned) and a payload
    welded to the pendulum: the bracket is no body of the merged model, the hinge on it is
    re-expressed on the ground, and the ground weld reports the bracket's support force."""

    def build(merge):
        bodies = [
            Body(2.0, [0.02, 0.03, 0.04], name="bracket"),
            Body(1.0, [0.01, 0.1, 0.1], name="arm"),
            Body(0.3, [0.001, 0.002, 0.002], name="tool"),
        ]
        joints = [
            Fixed(
                GROUND,
                "bracket",
                s_i=[0.1, 0.2, 1.0],
                z_i=[0, 0, 1],
                x_i=[C30, S30, 0],
                name="mount",
            ),
            Revolute(
                "bracket",
                "arm",
                s_i=[0.05, 0.0, -0.1],
                s_j=[-0.5, 0, 0],
                z_i=[0, 1, 0],
                name="hinge",
            ),
            Fixed("arm", "tool", s_i=[0.5, 0.0, 0.05], s_j=[0.0, 0.0, -0.02], name="tool weld"),
        ]
        return Model(bodies, joints=joints, gravity=[0, 0, -9.81], merge_welded=merge)

    unmerged, merged = build(False), build(True)
    assert merged.names == ("arm",)
    assert merged.merged.carrier == (GROUND, 0, 0)
    assert merged.joints[0].body_i == GROUND
    q = np.zeros((3, 7))
    q[:, 3] = 1.0
    q[1, :3] = [0.6, 0.2, 0.9]
    st = rbjax.assemble(unmerged, rbjax.make_state(position=q[:, :3], dtype=jnp.float64))
    t2, t3, ex = _same_motion(merged, unmerged, st)
    _assert_same_states(ex, t3.states, 1e-8)
    s2, s3 = _last(t2), _last(t3)
    _assert_reactions(rbjax.reactions(merged, s2), rbjax.reactions(unmerged, s3), [1], 1e-7)
    _assert_reactions(rbjax.weld_reactions(merged, s2), rbjax.reactions(unmerged, s3), [0, 2], 1e-7)


def test_custom_constraint_on_a_welded_body_sees_its_own_coordinates():
    """A CustomConstraint written on the payload's coordinates (a point of the payload held on
    a vertical line through the origin) keeps its meaning once the payload is merged."""
    point = jnp.asarray([0.03, 0.0, 0.0])

    def on_line(qi, qj, t, params):
        p = qj[0:3] + rbjax.quaternion.rotate(qj[3:7], point)
        return p[0:2]

    def build(merge):
        bodies = [
            Body(1.0, [0.01, 0.1, 0.1], name="l2"),
            Body(0.4, [0.002, 0.003, 0.004], name="pay"),
        ]
        joints = [
            rbjax.Spherical(GROUND, "l2", s_i=[0.0, 0.0, 1.0], s_j=[-0.4, 0, 0], name="ball"),
            _weld(),
            rbjax.CustomConstraint(on_line, GROUND, "pay", name="line"),
        ]
        return Model(bodies, joints=joints, gravity=[0, 0, -9.81], merge_welded=merge)

    unmerged, merged = build(False), build(True)
    assert isinstance(merged.joints[1], rbjax.advanced.CarriedConstraint)
    q = np.array([[0.3, 0.0, 0.7, 1, 0, 0, 0], [0.7, 0.05, 0.72, 1, 0, 0, 0]])
    st = rbjax.assemble(unmerged, rbjax.make_state(position=q[:, :3], dtype=jnp.float64))
    opts = dict(dt=1.25e-3, n_steps=400, integrator=rbjax.RK4(), save_every=50)
    t3 = rbjax.rollout(unmerged, st, **opts)
    t2 = rbjax.rollout(merged, merged.merge_state(st), **opts)
    _assert_same_states(merged.expand(t2.states), t3.states, 1e-8)
    line = jax.vmap(lambda s: on_line(None, s.q[1], None, None))(merged.expand(t2.states))
    assert float(jnp.abs(line).max()) < 1e-6


def test_gradient_through_the_merge_matches_finite_differences():
    """d(final height of the payload)/d(payload mass), the model built inside the function
    (the composite is computed in the program): equal to central differences."""
    base = _double_pendulum(False)
    st = _start(base)

    def height(mass, merge):
        model = _double_pendulum(merge, payload=Body(mass, [0.002, 0.003, 0.004], name="pay"))
        start = model.merge_state(st)
        tr = rbjax.rollout(model, start, dt=5e-3, n_steps=60, integrator=rbjax.RK4(), save_every=60)
        return model.expand(jax.tree.map(lambda x: x[-1], tr.states)).q[2, 2]

    # one compiled program for the gradient and both evaluations of the differences
    value_and_grad = jax.jit(jax.value_and_grad(lambda m: height(m, True)))
    g = value_and_grad(jnp.asarray(0.4))[1]
    h = 1e-5
    fd = (value_and_grad(jnp.asarray(0.4 + h))[0] - value_and_grad(jnp.asarray(0.4 - h))[0]) / (
        2 * h
    )
    assert abs(float(g)) > 1e-3
    np.testing.assert_allclose(float(g), float(fd), rtol=1e-6)


def test_merged_model_builds_under_jit_with_traced_masses():
    def composite(mass):
        model = Model(
            [Body(1.0, [0.1, 0.1, 0.1], name="a"), Body.point_mass(mass, name="p")],
            joints=[Fixed("a", "p", s_i=[0.2, 0.0, 0.0])],
        )
        return model.mass[0], model.inertia[0, 2, 2]

    m, izz = jax.jit(composite)(jnp.asarray(0.5))
    assert float(m) == 1.5
    np.testing.assert_allclose(float(izz), 0.1 + 1.0 * 0.5 / 1.5 * 0.2**2, rtol=1e-14)


# ---------------------------------------------------------------------------------- errors


def _raises(match, fn):
    with pytest.raises(ValueError, match=match):
        fn()


def test_a_point_mass_nothing_welds_is_refused_naming_the_fix():
    _raises(
        r"'bob' \(bodies\[1\]\) is a point mass.*Fix: weld it",
        lambda: Model(
            [Body(1.0, [1, 1, 1], name="a"), Body.point_mass(1.0, name="bob")],
            joints=[rbjax.Spherical("a", "bob")],
        ),
    )
    _raises(r"point=True declares a point mass", lambda: Body(1.0, [1, 1, 1], point=True))
    _raises(r"Body.point_mass", lambda: Body(1.0, [0.0, 0.0, 0.0]))
    # two point masses alone make no body
    _raises(
        r"merged body 'a' \(a, b\) inertia.*not positive definite",
        lambda: Model(
            [Body.point_mass(1.0, name="a"), Body.point_mass(1.0, name="b")],
            joints=[Fixed("a", "b", s_i=[1.0, 0, 0])],
        ),
    )


def test_weld_structure_mistakes_are_named():
    a, b, c = (Body(1.0, [1, 1, 1], name=n) for n in "abc")
    _raises(
        r"joint 'w3' .* a loop of welds",
        lambda: Model(
            [a, b, c],
            joints=[
                Fixed("a", "b", name="w1"),
                Fixed("b", "c", name="w2"),
                Fixed("c", "a", name="w3"),
            ],
            merge_welded=True,
        ),
    )
    _raises(
        r"joint 'hinge' .* connects 'a' and 'b', which welds merge into one body 'a'",
        lambda: Model(
            [a, b], joints=[Fixed("a", "b"), Revolute("a", "b", name="hinge")], merge_welded=True
        ),
    )
    _raises(
        r"scalable and welded",
        lambda: Model(
            [a, Body(1.0, [1, 1, 1], name="s", scalable=True)],
            joints=[Fixed("a", "s")],
            merge_welded=True,
        ),
    )
    _raises(
        r"forces\[0\] \(TranslationalSpringDamper\) connects 'a' and 'b'.*Fix: remove it",
        lambda: Model(
            [a, b],
            joints=[Fixed("a", "b")],
            forces=[rbjax.TranslationalSpringDamper(0, [0, 0, 0], 1, [1, 0, 0], stiffness=1.0)],
            merge_welded=True,
        ),
    )
    _raises(
        r"forces\[0\] \(PointForce\) acts on 'b', which is welded to the world",
        lambda: Model(
            [a, b],
            joints=[Fixed(GROUND, "b")],
            forces=[rbjax.PointForce(1, [0, 0, 0], [1.0, 0, 0])],
            merge_welded=True,
        ),
    )

    class Push(rbjax.AbstractForce):
        def wrench(self, model, t, state):
            return rbjax.Wrench.zeros(model.nb, state.q.dtype)

    _raises(
        r"forces\[0\] \(Push\) .*Fix: write it as an rbjax.ForceFunction",
        lambda: Model([a, b], joints=[Fixed("a", "b")], forces=[Push()], merge_welded=True),
    )
    _raises(r"merge_welded", lambda: Model([a], merge_welded="yes"))


def test_states_in_the_wrong_layout_are_named():
    unmerged, merged = _double_pendulum(False), _double_pendulum(True)
    st = _start(unmerged)
    _raises(
        r"lists the 3 bodies given to the Model, but welds merged \['pay'\].*model.merge_state",
        lambda: rbjax.rollout(merged, st, dt=1e-3, n_steps=2),
    )
    moved = rbjax.State(t=st.t, q=st.q.at[2, 0].add(1e-3), u=st.u)
    _raises(r"row 2 \(body 'pay'\): its position is not", lambda: merged.merge_state(moved))
    spun = rbjax.State(t=st.t, q=st.q, u=st.u.at[2, 4].add(0.1))
    _raises(r"row 2 \(body 'pay'\): its angular velocity", lambda: merged.merge_state(spun))
    _raises(r"the model merged no weld", lambda: rbjax.weld_reactions(unmerged, st))
    heavier = eqx.tree_at(lambda m: m.mass, merged, merged.mass * 1.1)
    _raises(
        r"model.mass = .* is not the sum of the merged bodies' masses.*build the Model again",
        lambda: rbjax.weld_reactions(heavier, merged.merge_state(st)),
    )
    # a merged state expands back to exactly where it came from
    back = merged.expand(merged.merge_state(st))
    _assert_same_states(back, st, 1e-14)
    # and a model without merges converts nothing
    assert unmerged.merge_state(st) is st and unmerged.expand(st) is st


def test_merged_model_is_an_equinox_pytree_that_jits_and_vmaps():
    merged = _double_pendulum(True)
    st = merged.merge_state(_start(_double_pendulum(False)))
    batch = jax.tree.map(lambda x: jnp.stack([x, x]), st)
    tr = jax.jit(lambda m, s: rbjax.rollout(m, s, dt=1e-3, n_steps=5))(merged, batch)
    assert tr.states.q.shape[-2:] == (2, 7)
    expanded = merged.expand(tr.states)
    assert expanded.q.shape[-2:] == (3, 7)
    leaves = eqx.filter(merged, eqx.is_array)
    assert jax.tree.leaves(leaves)  # arrays only: every leaf differentiable


def test_model_file_keeps_point_masses_and_welds(tmp_path, capsys):
    """rbjax.save writes the bodies as given (the point mass, the weld) and the state of every
    body; rbjax.load merges again: the same composite and the same state, bit for bit."""
    model = Model(
        [Body(2.0, [0.002, 0.17, 0.17], name="rod"), Body.point_mass(0.5, name="bob")],
        joints=[
            Revolute(GROUND, "rod", s_j=[-0.5, 0, 0], z_i=[0, 1, 0], name="hinge"),
            Fixed("rod", "bob", s_i=[0.8, 0.1, 0.0], name="bob weld"),
        ],
        gravity=[0, 0, -9.81],
    )
    q0 = np.array([[0.5, 0, 0, 1, 0, 0, 0], [1.3, 0.1, 0, 1, 0, 0, 0]])
    st = model.merge_state(rbjax.make_state(position=q0[:, :3], dtype=jnp.float64))
    path = tmp_path / "bob.toml"
    rbjax.save(path, model, st)
    text = path.read_text()
    assert "point = true" in text and 'type = "Fixed"' in text and text.count("[[bodies]]") == 2
    loaded = rbjax.load(path)
    assert loaded.model.names == ("rod",) and loaded.model.merged.merged == ("bob",)
    np.testing.assert_array_equal(np.asarray(loaded.model.inertia), np.asarray(model.inertia))
    np.testing.assert_array_equal(np.asarray(loaded.state.q), np.asarray(st.q))
    # the command line's check loads it and says what was merged
    from rbjax._cli import main

    assert main(["check", str(path), "--json", "--steps", "20"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["merged"] == {"bob": "rod"} and rep["bodies"] == ["rod"] and rep["failures"] == []
