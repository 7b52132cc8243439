"""rbjax.load (MJCF/URDF through MuJoCo's compiler) side by side with MuJoCo itself.

Every comparison is against MuJoCo's own simulation of the same file (contacts disabled in the
test models), stepped with MuJoCo's RK4 at the same step: the two engines share nothing but
the file (MuJoCo integrates joint coordinates with its recursive algorithms, rbjax maximal
coordinates with constraints). Both have RK4's O(h⁴) error, so their difference is the
difference of two discretisations; the steps are small enough that it is below 1e-8.
"""

import os
import pathlib
import re
import subprocess
import sys
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rbjax

mujoco = pytest.importorskip("mujoco")

MODELS = pathlib.Path(__file__).resolve().parents[1] / "examples" / "models"


def _random_qpos(m, rng, spread=0.4):
    qpos = m.qpos0.copy() + rng.uniform(-spread, spread, m.nq)
    for j in range(m.njnt):
        a = m.jnt_qposadr[j]
        if m.jnt_type[j] == mujoco.mjtJoint.mjJNT_BALL:
            qpos[a : a + 4] /= np.linalg.norm(qpos[a : a + 4])
        if m.jnt_type[j] == mujoco.mjtJoint.mjJNT_FREE:
            qpos[a + 3 : a + 7] /= np.linalg.norm(qpos[a + 3 : a + 7])
    return qpos


def _quat_equal_up_to_sign(a, b):
    sign = np.where(np.sum(a * b, axis=-1, keepdims=True) < 0, -1.0, 1.0)
    return np.abs(a - sign * b).max()


def _side_by_side(path, qpos, qvel, ctrl=None, dt=1e-3, t_end=1.0, every=100):
    """Errors (position, orientation, joint coordinates, velocities) of rbjax against MuJoCo
    RK4 at the same step, at every ``every``-th step over ``t_end``."""
    loaded = rbjax.load(path, qpos=qpos, qvel=qvel, control=ctrl, formulation=rbjax.ScalableDAE())
    m = loaded.source.mjmodel
    m.opt.timestep = dt
    m.opt.integrator = mujoco.mjtIntegrator.mjINT_RK4
    d = mujoco.MjData(m)
    d.qpos[:], d.qvel[:] = qpos, qvel
    if ctrl is not None:
        d.ctrl[:] = ctrl
    n = int(round(t_end / dt))
    ref_q, ref_u, ref_joint = [], [], []
    for k in range(n + 1):
        if k % every == 0:
            s = loaded.source.state(d.qpos, d.qvel)
            ref_q.append(np.asarray(s.q))
            ref_u.append(np.asarray(s.u))
            ref_joint.append(d.qpos.copy())
        if k < n:
            mujoco.mj_step(m, d)
    traj = rbjax.rollout(
        loaded.model, loaded.state, dt, n, integrator=rbjax.RK4(), save_every=every
    )
    q, u = np.asarray(traj.q), np.asarray(traj.u)
    ref_q, ref_u, ref_joint = np.array(ref_q), np.array(ref_u), np.array(ref_joint)
    assert q.shape == ref_q.shape
    js = loaded.joint_space()  # MuJoCo's qpos exactly (a free joint: the body frame's origin)
    states = rbjax.State(t=traj.t, q=traj.q, u=traj.u)
    joint = np.asarray(jax.jit(jax.vmap(js.positions))(states))
    # ball/free quaternions: equal up to sign
    joint_err = 0.0
    for jm in loaded.source.joints:
        a = jm.qpos
        if jm.type == "hinge":  # rbjax's angle is the principal value, MuJoCo's unwrapped
            diff = np.mod(joint[:, a] - ref_joint[:, a] + np.pi, 2 * np.pi) - np.pi
            joint_err = max(joint_err, np.abs(diff).max())
        elif jm.type == "slide":
            joint_err = max(joint_err, np.abs(joint[:, a] - ref_joint[:, a]).max())
        elif jm.type == "ball":
            joint_err = max(
                joint_err, _quat_equal_up_to_sign(joint[:, a : a + 4], ref_joint[:, a : a + 4])
            )
        else:  # free: the origin's position and the quaternion
            joint_err = max(
                joint_err,
                np.abs(joint[:, a : a + 3] - ref_joint[:, a : a + 3]).max(),
                _quat_equal_up_to_sign(joint[:, a + 3 : a + 7], ref_joint[:, a + 3 : a + 7]),
            )
    return {
        "position": np.abs(q[..., 0:3] - ref_q[..., 0:3]).max(),
        "orientation": _quat_equal_up_to_sign(q[..., 3:7], ref_q[..., 3:7]),
        "joint": joint_err,
        "velocity": np.abs(u - ref_u).max(),
        "loaded": loaded,
        "traj": traj,
    }


@pytest.mark.parametrize("name", ["double_pendulum.xml", "double_pendulum.urdf"])
def test_double_pendulum_matches_mujoco(name):
    rng = np.random.default_rng(0)
    m = mujoco.MjModel.from_xml_path(str(MODELS / name))
    out = _side_by_side(MODELS / name, _random_qpos(m, rng, 1.0), rng.uniform(-2, 2, m.nv))
    assert out["position"] < 1e-8 and out["orientation"] < 1e-8 and out["joint"] < 1e-8
    assert out["velocity"] < 1e-7
    if name.endswith(".urdf"):  # the URDF's joint damping became a spring-damper
        assert [type(f).__name__ for f in out["loaded"].model.forces] == ["RotationalSpringDamper"]


def test_cart_pole_slide_spring_damper_motor_and_servo_match_mujoco():
    """A slide joint with stiffness (about springref), damping and a motor, a hinge with a
    position servo: every force element of the loader against MuJoCo."""
    out = _side_by_side(MODELS / "cart_pole.xml", [0.05, 0.4], [0.3, -1.0], ctrl=[0.5, 0.2])
    assert max(out["position"], out["orientation"], out["joint"]) < 1e-8
    assert out["velocity"] < 1e-8
    loaded = out["loaded"]
    kinds = sorted(type(f).__name__ for f in loaded.model.forces)
    assert kinds == ["AxialSpringDamper"] * 2 + ["RotationalSpringDamper"] * 2
    rail = next(f for f in loaded.model.forces if type(f).__name__ == "AxialSpringDamper")
    x, x_dot = rail.displacement_and_rate(loaded.model, loaded.state)  # MuJoCo's qpos − ref, qvel
    assert float(x) == pytest.approx(0.05, abs=1e-15) and float(x_dot) == pytest.approx(
        0.3, abs=1e-15
    )


def test_seven_dof_arm_matches_mujoco():
    """7 hinges (one with ref ≠ 0, one on a rotated body, one off its body origin), joint
    damping, a joint spring, two motors, a position and a velocity servo; the tool is merged
    into link7. The wrist is light and fast: RK4's error at dt = 1 ms is 2e-7 in either
    engine (measured: the difference falls 16x per halving of dt), so the step is 0.25 ms."""
    rng = np.random.default_rng(0)
    out = _side_by_side(
        MODELS / "arm7.xml",
        rng.uniform(-0.5, 0.5, 7),
        rng.uniform(-0.5, 0.5, 7),
        ctrl=[0.3, 0.5, 0.1, 0.4],
        dt=2.5e-4,
        every=400,
    )
    assert max(out["position"], out["orientation"], out["joint"]) < 1e-8
    assert out["velocity"] < 1e-7


def test_humanoid_tree_matches_mujoco():
    """A free root, a two-hinge universal waist, ball hips and shoulders (one on a rotated
    body), hinge knees with damping and elbows, and a head welded to the torso (merged)."""
    rng = np.random.default_rng(3)
    m = mujoco.MjModel.from_xml_path(str(MODELS / "humanoid.xml"))
    out = _side_by_side(
        MODELS / "humanoid.xml", _random_qpos(m, rng, 0.3), rng.uniform(-1, 1, m.nv)
    )
    assert max(out["position"], out["orientation"], out["joint"]) < 1e-8
    assert out["velocity"] < 1e-8
    loaded = out["loaded"]
    assert loaded.model.nb == 10 and "head" not in loaded.model.names  # merged into torso
    assert loaded.model.joint_names[0] == "waist_y+waist_x"
    assert type(loaded.model.joints[0]).__name__ == "Universal"


def test_four_bar_closed_by_equality_is_exact_where_mujoco_is_soft():
    """A four-bar closed by an equality connect: MuJoCo enforces it softly (solref), rbjax
    exactly. The planar loop's connect has 3 equations of which 2 are independent (the default
    formulation runs them, with minimum-norm multipliers); the inconsistent initial qvel is
    projected onto the loop (with a warning). Reported: both engines' loop-closure drift over
    1 s."""
    path = MODELS / "four_bar.xml"
    with pytest.warns(UserWarning, match="violates the loop closures"):
        loaded = rbjax.load(path, qvel=[2.0, 0.0, 0.0], formulation=rbjax.ScalableDAE())
    assert isinstance(loaded.model.formulation, rbjax.ScalableDAE)
    assert rbjax.mobility(loaded.model, loaded.state).redundant == ("loop[row 1]",)
    m = loaded.source.mjmodel
    js = rbjax.JointSpace(loaded.model)
    assert js.loops == ("loop",)
    qvel = np.asarray(js.velocities(loaded.state))  # consistent joint rates for MuJoCo
    d = mujoco.MjData(m)
    d.qvel[:] = qvel
    dt, n = 1e-3, 1000
    gap_mj = 0.0
    for _ in range(n):
        mujoco.mj_step(m, d)
        mujoco.mj_kinematics(m, d)
        p1 = d.xpos[2] + d.xmat[2].reshape(3, 3) @ m.eq_data[0, 0:3]
        p2 = d.xpos[3] + d.xmat[3].reshape(3, 3) @ m.eq_data[0, 3:6]
        gap_mj = max(gap_mj, np.linalg.norm(p1 - p2))
    traj = rbjax.rollout(loaded.model, loaded.state, dt, n, integrator=rbjax.RK4(), save_every=10)
    loop = loaded.model.joints[-1]
    res = jax.vmap(lambda q: loop.residual(q[1], q[2], 0.0))(traj.q)
    gap_rb = float(jnp.abs(res).max())
    print(f"four-bar loop-closure drift over 1 s: MuJoCo {gap_mj:.2e} m, rbjax {gap_rb:.2e} m")
    assert gap_rb < 1e-8
    # the motion agrees to the size of MuJoCo's softness
    final = loaded.source.state(d.qpos, d.qvel)
    assert np.abs(np.asarray(traj.q[-1, :, 0:3]) - np.asarray(final.q[:, 0:3])).max() < 20 * gap_mj


def test_composite_bodies_and_state_map_conserve_momentum_and_mass():
    """Merged bodies (the tool into link7, the base into the ground) and the state map: total
    mass, centre of mass, linear and angular momentum of the rbjax state equal MuJoCo's
    (mj_subtreeVel) at a random state."""
    rng = np.random.default_rng(5)
    for name in ("arm7.xml", "humanoid.xml"):
        m = mujoco.MjModel.from_xml_path(str(MODELS / name))
        qpos, qvel = _random_qpos(m, rng), rng.uniform(-1, 1, m.nv)
        loaded = rbjax.load(MODELS / name, qpos=qpos, qvel=qvel, formulation=rbjax.ScalableDAE())
        d = mujoco.MjData(m)
        d.qpos[:], d.qvel[:] = qpos, qvel
        mujoco.mj_forward(m, d)
        mujoco.mj_subtreeVel(m, d)
        # the subtree of the first moving body holds every moving body in both models
        root = min(k for k in range(1, m.nbody) if loaded.source.body_of[k] >= 0)
        mass = float(np.sum(loaded.model.mass))
        np.testing.assert_allclose(mass, m.body_subtreemass[root], rtol=1e-14)
        com = (
            np.sum(np.asarray(loaded.model.mass)[:, None] * np.asarray(loaded.state.q[:, 0:3]), 0)
            / mass
        )
        np.testing.assert_allclose(com, d.subtree_com[root], atol=1e-14)
        p = np.asarray(rbjax.linear_momentum(loaded.model, loaded.state))
        np.testing.assert_allclose(p, mass * d.subtree_linvel[root], atol=1e-12)
        h_origin = np.asarray(rbjax.angular_momentum(loaded.model, loaded.state))
        h_com = h_origin - np.cross(com, p)  # MuJoCo's subtree_angmom is about the subtree COM
        np.testing.assert_allclose(h_com, d.subtree_angmom[root], atol=1e-12)


# every joint kind rbjax maps, in one small tree: a free base (centre of mass at its origin,
# so that the default JointSpace's coordinates are MuJoCo's; an offset one is in
# test_reliability_import.py), a two-hinge universal waist, a ball shoulder on a rotated
# body, a hinge elbow, and a slide under the free base
TREE = """
<mujoco>
  <option><flag contact="disable"/></option>
  <worldbody>
    <body name="base" pos="0 0 1">
      <freejoint/>
      <geom type="box" size=".1 .1 .1"/>
      <body name="torso" pos="0 0 .15">
        <joint name="waist_y" type="hinge" axis="0 1 0"/>
        <joint name="waist_x" type="hinge" axis="1 0 0"/>
        <geom type="capsule" fromto="0 0 0 0 0 .3" size=".05"/>
        <body name="arm" pos="0 .1 .3" euler="0.3 0 0.2">
          <joint name="shoulder" type="ball"/>
          <geom type="capsule" fromto="0 0 0 0 .05 -.25" size=".03"/>
          <body name="forearm" pos="0 .05 -.25">
            <joint name="elbow" type="hinge" axis="0 1 0"/>
            <geom type="capsule" fromto="0 0 0 .2 0 0" size=".03"/>
          </body>
        </body>
      </body>
      <body name="leg" pos="0 0 -.1">
        <joint name="extend" type="slide" axis="0.6 0 0.8"/>
        <geom type="box" size=".05 .05 .1" pos="0 0 -.1"/>
      </body>
    </body>
  </worldbody>
</mujoco>
"""


@pytest.fixture
def tree_path(tmp_path):
    path = tmp_path / "tree.xml"
    path.write_text(TREE)
    return path


# ------------------------------------------------------------------ joint space vs MuJoCo


def test_joint_space_matches_mujoco_kinematics_jacobian_mass_matrix_and_bias(tree_path):
    """Joint coordinates both ways, a body point's Jacobian (mj_jac), the joint-space mass
    matrix (mj_fullM) and the bias forces (qfrc_bias = mj_rne at zero acceleration), at a
    random state, to round-off."""
    rng = np.random.default_rng(11)
    m = mujoco.MjModel.from_xml_path(str(tree_path))
    qpos, qvel = _random_qpos(m, rng), rng.uniform(-1, 1, m.nv)
    loaded = rbjax.load(tree_path, qpos=qpos, qvel=qvel, formulation=rbjax.ScalableDAE())
    js = rbjax.JointSpace(loaded.model)
    kinds = [c[1] for c in js.coordinates]
    assert kinds == ["free", "universal", "spherical", "revolute", "prismatic"]
    assert (js.nq, js.nv) == (m.nq, m.nv)
    state = loaded.state
    d = mujoco.MjData(m)
    d.qpos[:], d.qvel[:] = qpos, qvel
    mujoco.mj_forward(m, d)
    qacc = rng.uniform(-1, 1, m.nv)
    b = m.nbody - 1
    mover = loaded.source.body_of[b]
    point = d.xpos[b] + np.array([0.05, -0.02, 0.03])
    q = np.asarray(state.q[mover])
    local = np.asarray(rbjax.quaternion.rotate_inverse(q[3:7], point - q[0:3]))

    @jax.jit  # one program for everything below (each function is a JAX function of the state)
    def everything(state, qpos, qvel, qacc):
        qp, qv = rbjax.joint_coordinates(loaded.model, state)
        back = rbjax.state_from_joint_coordinates(loaded.model, qpos, qvel)
        return (
            qp,
            qv,
            back,
            js.mass_matrix(state),
            js.inverse_dynamics(state, qacc),
            js.point(state, mover, local),
            js.jacobian(state, mover, local),
        )

    qp, qv, back, mass, tau, where, jac = everything(state, qpos, qvel, qacc)
    for jm in loaded.source.joints:
        a = jm.qpos
        n = {"hinge": 1, "slide": 1, "ball": 4, "free": 7}[jm.type]
        got, want = qp[a : a + n], qpos[a : a + n]
        if jm.type == "ball":
            got = got * np.sign(got @ want)
        np.testing.assert_allclose(got, want, atol=1e-13, err_msg=jm.name)
    np.testing.assert_allclose(qv, qvel, atol=1e-13)
    np.testing.assert_allclose(back.q, state.q, atol=1e-13)
    np.testing.assert_allclose(back.u, state.u, atol=1e-13)
    full = np.zeros((m.nv, m.nv))
    mujoco.mj_fullM(m, d, full)
    np.testing.assert_allclose(mass, full, atol=1e-12 * np.abs(full).max())
    bias = tau - mass @ qacc  # inverse dynamics = M q̈ + C q̇ + g
    np.testing.assert_allclose(bias, d.qfrc_bias, atol=1e-11 * np.abs(d.qfrc_bias).max())
    d.qacc[:] = qacc
    mujoco.mj_inverse(m, d)
    # qfrc_inverse = M q̈ + bias − passive (no constraints in a tree); JointSpace: M q̈ + bias
    want = d.qfrc_inverse + d.qfrc_passive
    np.testing.assert_allclose(tau, want, atol=1e-12 * np.abs(want).max())
    jacp, jacr = np.zeros((3, m.nv)), np.zeros((3, m.nv))
    mujoco.mj_jac(m, d, jacp, jacr, point, b)
    np.testing.assert_allclose(where, point, atol=1e-14)
    np.testing.assert_allclose(jac[:3], jacp, atol=1e-13)
    np.testing.assert_allclose(jac[3:], jacr, atol=1e-13)


# ------------------------------------------------------------------ what the loader refuses


UNSUPPORTED = """
<mujoco>
  <option timestep="0.002"/>
  <worldbody>
    <geom name="floor" type="plane" size="1 1 .1"/>
    <body name="a" pos="0 0 1">
      <joint name="hinge_a" type="hinge" range="-1 1" limited="true" armature="0.1" frictionloss="0.2"/>
      <geom name="ball_a" size=".1"/>
      <site name="s"/>
      <body name="b" pos="0 0 -.3">
        <joint name="ball_b" type="ball" damping="0.3"/>
        <geom name="ball_b" size=".1"/>
      </body>
    </body>
  </worldbody>
  <tendon><fixed name="t"><joint joint="hinge_a" coef="1"/></fixed></tendon>
  <actuator>
    <general name="filtered" joint="hinge_a" dyntype="filter" dynprm="0.1"/>
    <motor name="on_ball" joint="ball_b"/>
  </actuator>
  <sensor><framepos name="where" objtype="site" objname="s"/></sensor>
</mujoco>
"""


def test_unsupported_elements_are_named_in_one_warning_or_error(tmp_path):
    path = tmp_path / "unsupported.xml"
    path.write_text(UNSUPPORTED)
    with pytest.warns(UserWarning) as record:
        loaded = rbjax.load(path, formulation=rbjax.ScalableDAE())
    assert len(record) == 1
    text = str(record[0].message)
    for needle in (
        "contacts",
        "floor",
        "joint limits on ['hinge_a']",
        "friction loss on joints ['hinge_a']",
        "armature (rotor inertia) on joints ['hinge_a']",
        "1 tendon",
        "sensors ['where']",
        "stiffness/damping on ball joint 'ball_b'",
        "actuator 'filtered': activation dynamics",
        "actuator 'on_ball': drives joint 'ball_b'",
    ):
        assert needle in text, needle
    assert loaded.model.nb == 2
    with pytest.raises(
        ValueError, match=r"element\(s\) of the MuJoCo model have no rbjax counterpart"
    ):
        rbjax.load(path, unsupported="error", formulation=rbjax.ScalableDAE())


@pytest.mark.parametrize(
    ("xml", "match"),
    [
        (
            '<body name="light"><joint name="j" type="hinge"/><body name="heavy" pos="0 0 -1"><joint type="hinge"/><geom size=".1"/></body></body>',
            r"(?s)MuJoCo cannot compile .*moving bodies must be larger.*'light'",  # MuJoCo's own check
        ),
        (
            '<body name="b"><joint name="h1" type="hinge" axis="1 0 0"/><joint name="h2" type="hinge" axis="1 1 0"/><geom size=".1"/></body>',
            "form a universal joint only when perpendicular",
        ),
        (
            '<body name="b"><joint name="h" type="hinge" axis="1 0 0"/><joint name="s" type="slide" axis="0 1 0"/><geom size=".1"/></body>',
            r"types \['hinge', 'slide'\] has no exact rbjax joint",
        ),
        ('<body name="b"><geom size=".1"/></body>', "has no moving body"),
    ],
)
def test_models_the_loader_cannot_map_raise_naming_the_body(tmp_path, xml, match):
    path = tmp_path / "bad.xml"
    path.write_text(
        f'<mujoco><option><flag contact="disable"/></option><worldbody>{xml}</worldbody></mujoco>'
    )
    with pytest.raises(ValueError, match=match):
        rbjax.load(path, formulation=rbjax.ScalableDAE())


def test_bad_arguments_raise_naming_the_fix(tmp_path):
    with pytest.raises(ValueError, match="is not a file"):
        rbjax.load(tmp_path / "missing.xml")
    (tmp_path / "m.txt").write_text("x")
    with pytest.raises(ValueError, match=r"extension '.txt'"):
        rbjax.load(tmp_path / "m.txt")
    (tmp_path / "broken.xml").write_text(
        "<mujoco><worldbody><body><joint type='hinge'/></worldbody></mujoco>"
    )
    with pytest.raises(ValueError, match="MuJoCo cannot compile"):
        rbjax.load(tmp_path / "broken.xml", formulation=rbjax.ScalableDAE())
    with pytest.raises(ValueError, match=r"qpos = .* has shape \(3,\).*size 2"):
        rbjax.load(
            MODELS / "double_pendulum.xml", qpos=[0.0, 0.0, 0.0], formulation=rbjax.ScalableDAE()
        )
    with pytest.raises(ValueError, match=r"control = \[1.\] has shape \(1,\), not \(2,\)"):
        rbjax.load(MODELS / "cart_pole.xml", control=[1.0], formulation=rbjax.ScalableDAE())
    with pytest.raises(ValueError, match="is not a policy"):
        rbjax.load(MODELS / "cart_pole.xml", unsupported="ignore", formulation=rbjax.ScalableDAE())


WELD = """
<mujoco>
  <option><flag contact="disable"/></option>
  <worldbody>
    <site name="anchor" pos="0.3 0 1.2"/>
    <body name="free" pos="0.3 0.1 1" quat="0.9 0.1 0.3 0.2">
      <freejoint/>
      <geom type="box" size=".1 .05 .02"/>
    </body>
    <body name="pendulum" pos="0 0 1">
      <joint name="pin" type="hinge" axis="0 1 0"/>
      <geom type="capsule" fromto="0 0 0 0.3 0 0.2" size=".02"/>
      <site name="tip" pos="0.3 0 0.2"/>
    </body>
  </worldbody>
  <equality>
    <weld body1="free"/>
    <connect site1="tip" site2="anchor"/>
  </equality>
</mujoco>
"""


def test_weld_to_world_and_site_connect_hold_exactly(tmp_path):
    """A free body welded to the world stays where it is under gravity; a pendulum whose tip
    is connected (by sites) to a world point cannot move: both equalities are exact, so
    their accelerations vanish."""
    path = tmp_path / "weld.xml"
    path.write_text(WELD)
    loaded = rbjax.load(path, formulation=rbjax.ScalableDAE())
    kinds = [type(j).__name__ for j in loaded.model.joints]
    assert kinds == ["Revolute", "Fixed", "Spherical"]
    udot, _ = jax.jit(rbjax.accelerations)(loaded.model, loaded.state)
    np.testing.assert_allclose(udot, 0.0, atol=1e-9)  # under gravity, held still by the two


def test_actuator_laws_against_mujoco_force_formula():
    """Actuator.motor/position/velocity give gear·(gain·u + bias) with MuJoCo's clamps."""
    u = 3.0
    motor = rbjax.Actuator.motor(gear=2.0, control=u, ctrl_range=(-1.0, 1.0))
    assert float(motor(0.0, 0.4, 0.1)) == pytest.approx(2.0 * 1.0)
    servo = rbjax.Actuator.position(5.0, kv=0.5, control=0.7, offset=0.2, force_range=(-1.0, 1.0))
    assert float(servo(0.0, 0.1, 0.3)) == pytest.approx(
        np.clip(5.0 * (0.7 - 0.3) - 0.5 * 0.3, -1, 1)
    )
    vel = rbjax.Actuator.velocity(2.0, gear=3.0, control=lambda t: 1.0 + t)
    assert float(vel(1.0, 0.0, 0.5)) == pytest.approx(3.0 * 2.0 * (2.0 - 3.0 * 0.5))
    seq = rbjax.ControlSequence([0.0, 1.0, 4.0], dt=0.5)
    np.testing.assert_allclose([seq(0.49), seq(0.5), seq(10.0)], [0.0, 1.0, 4.0])
    lin = rbjax.ControlSequence([0.0, 1.0, 4.0], dt=0.5, hold="linear")
    np.testing.assert_allclose([lin(0.25), lin(0.75), lin(-1.0)], [0.5, 2.5, 0.0])
    with pytest.raises(ValueError, match=r"ctrl_range = .* lower bound > upper bound"):
        rbjax.Actuator.motor(ctrl_range=(1.0, -1.0))
    with pytest.raises(ValueError, match="is not a hold rule"):
        rbjax.ControlSequence([1.0], dt=0.1, hold="cubic")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert re.search("Actuator", repr(motor))


def test_joint_forces_do_the_work_of_their_joint_torques(tree_path):
    """JointForces' wrenches are the dual of JointSpace's velocities: their power on any
    admissible motion (from random joint velocities) is τᵀq̇ (free, universal, spherical,
    revolute and prismatic shares), so they act on the dynamics as MuJoCo's qfrc_applied."""
    loaded = rbjax.load(tree_path, formulation=rbjax.ScalableDAE())
    model = loaded.model
    js = rbjax.JointSpace(model)
    rng = np.random.default_rng(8)
    tau = jnp.asarray(rng.uniform(-2, 2, js.nv))
    qvel = jnp.asarray(rng.uniform(-1, 1, js.nv))
    force = rbjax.JointForces(lambda t, s: tau)

    @jax.jit
    def power(qpos, qvel):
        state = js.state(qpos, qvel)
        w = force.wrench(model, 0.0, state)
        u = state.u
        return jnp.sum(w.force_world * u[:, 0:3]) + jnp.sum(w.moment_body * u[:, 4:7])

    m = loaded.source.mjmodel
    p = power(jnp.asarray(_random_qpos(m, rng)), qvel)
    np.testing.assert_allclose(p, tau @ qvel, rtol=1e-13)
    with pytest.raises(ValueError, match="is not callable"):
        rbjax.JointForces(3.0)


def test_time_varying_controls_reach_each_actuator():
    """control=ControlSequence((n, nu)): every actuator reads its own column (MuJoCo's ctrl
    order), clamped to its ctrlrange."""
    seq = rbjax.ControlSequence([[0.5, 0.1], [2.0, -0.3], [-0.2, 0.4]], dt=0.1)
    loaded = rbjax.load(MODELS / "cart_pole.xml", control=seq, formulation=rbjax.ScalableDAE())
    acts = {f.actuator.name: f.actuator for f in loaded.model.forces if f.actuator is not None}
    assert sorted(acts) == ["push", "servo"]
    for t, (push, servo) in ((0.05, (0.5, 0.1)), (0.15, (1.0, -0.3)), (0.25, (-0.2, 0.4))):
        assert float(acts["push"].signal(t)) == pytest.approx(push)  # clamped to [-1, 1]
        assert float(acts["servo"].signal(t)) == pytest.approx(servo)


def test_loads_in_float32_when_jax_runs_in_float32():
    """Regression: with JAX in float32 (x64 off, the default), joint frames built through jnp
    lost perpendicularity (xᵀz = 3e-8 on the arm) and the 1e-9 frame check refused the file.
    A fresh interpreter without x64 loads the arm and the humanoid in float32."""
    code = (
        "import warnings; warnings.simplefilter('ignore'); import rbjax\n"
        "for f in ('arm7.xml', 'humanoid.xml'):\n"
        f"    m = rbjax.load(r'{MODELS}/' + f, formulation=rbjax.ScalableDAE())\n"
        "    print(f, m.model.mass.dtype, m.state.q.dtype)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [
        "arm7.xml",
        "float32",
        "float32",
        "humanoid.xml",
        "float32",
        "float32",
    ]


def test_load_with_a_dtype_converts_the_model_too():
    """load(dtype=float32) used to convert only the state, so the rollout mixed a float64 model
    with a float32 state (now refused: one computation, one dtype). The model comes in the
    requested dtype and its rollout follows the float64 one to float32 accuracy."""
    l32 = rbjax.load(MODELS / "arm7.xml", dtype=jnp.float32, formulation=rbjax.ScalableDAE())
    l64 = rbjax.load(MODELS / "arm7.xml", formulation=rbjax.ScalableDAE())
    leaves = [x for x in jax.tree.leaves(l32.model) if eqx.is_array(x)]
    assert all(x.dtype == jnp.float32 for x in leaves if jnp.issubdtype(x.dtype, jnp.floating))
    assert l32.state.q.dtype == jnp.float32
    tr32 = rbjax.rollout(l32.model, l32.state, 1e-3, 50, save_every=50)
    tr64 = rbjax.rollout(l64.model, l64.state, 1e-3, 50, save_every=50)
    assert np.max(np.abs(np.asarray(tr32.q, np.float64) - np.asarray(tr64.q))) < 1e-4


def test_the_default_coordinates_follow_the_file():
    """rbjax.load without a formulation: a file whose joints form a tree loads in joint
    coordinates (MuJoCo's qpos/qvel, the state MuJoCo's keyframe-free qpos0), a file whose
    connect equality closes a loop in maximal coordinates; a maximal formulation or
    JointCoordinates() asks for the other; MuJoCo's MJX humanoid (several hinges on one body,
    which maximal coordinates refuse) loads by default, with one warning naming what is not
    simulated."""
    mujoco = pytest.importorskip("mujoco")
    tree = MODELS / "double_pendulum.xml"
    loaded = rbjax.load(tree)
    assert isinstance(loaded.model, rbjax.JointModel) and loaded.coordinates == "joint"
    m = mujoco.MjModel.from_xml_path(str(tree))
    np.testing.assert_array_equal(np.asarray(loaded.state.qpos), m.qpos0)
    maximal = rbjax.load(tree, formulation=rbjax.NewtonEuler())
    assert isinstance(maximal.model, rbjax.Model) and maximal.coordinates == "maximal"
    assert isinstance(maximal.model.formulation, rbjax.NewtonEuler)
    loop = rbjax.load(MODELS / "four_bar.xml")
    assert isinstance(loop.model, rbjax.Model) and loop.coordinates == "maximal"
    closed = rbjax.load(MODELS / "four_bar.xml", formulation=rbjax.JointCoordinates())
    assert isinstance(closed.model, rbjax.JointModel) and len(closed.model.equalities) == 1
    with pytest.raises(ValueError, match="joint coordinates.*Fix:.*ScalableDAE"):
        loaded.joint_space()
    with pytest.raises(ValueError, match=r"formulation=rbjax.ScalableDAE\(\)"):
        rbjax.save("m.toml", loaded.model, None)
    humanoid = pathlib.Path(__file__).parent / "data" / "mujoco_humanoid.xml"
    for formulation in (None, rbjax.ScalableDAE()):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                got = rbjax.load(humanoid, formulation=formulation)
            except ValueError as err:  # maximal coordinates: several hinges on one body
                assert formulation is not None and "has no exact rbjax joint" in str(err)
                continue
        assert isinstance(got.model, rbjax.JointModel)
        notes = [w for w in caught if "NOT simulated" in str(w.message)]
        assert len(notes) == 1, [str(w.message) for w in caught]
