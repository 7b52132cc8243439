"""Bad input for mechanisms gives clear errors naming the joint / field and the fix (issue 3 §8),
plus the redundant-constraint and drift-control paths that only make sense next to them."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rbjax
from rbjax._engine.joints import joint_terms
from rbjax._engine.layout import to_components

I_ROD = np.diag([1e-3, 1.0 / 12.0, 1.0 / 12.0])
Q0 = np.array([[0.5, 0, 0, 1, 0, 0, 0], [1.5, 0, 0, 1, 0, 0, 0]], float)


def rods():
    return [rbjax.Body(1.0, I_ROD, name="rod1"), rbjax.Body(1.0, I_ROD, name="rod2")]


def hinges(q=Q0):
    return [
        rbjax.Revolute.at(q, rbjax.GROUND, 0, point=[0, 0, 0], axis=[0, 1, 0], name="pivot"),
        rbjax.Revolute.at(q, 0, 1, point=[1, 0, 0], axis=[0, 1, 0], name="elbow"),
    ]


def state(q=Q0):
    return rbjax.make_state(position=q[:, :3], quaternion=q[:, 3:])


def residual_max(model, states):
    t, q, u = to_components(states)
    terms = joint_terms(model, model.formulation._engine_kinematics, t, q, u, jacobian=False)
    return max(float(jnp.max(jnp.abs(c))) for c in terms.c), max(
        float(jnp.max(jnp.abs(c))) for c in terms.cdot
    )


def test_unknown_body_name_names_joint_and_bodies():
    j = rbjax.Spherical("rod1", "rod3", name="knee")
    with pytest.raises(ValueError, match=r"joint 'knee'.*unknown body.*'rod3'.*\['rod1', 'rod2'\]"):
        rbjax.Model(rods(), joints=[j])


def test_body_index_out_of_range():
    with pytest.raises(ValueError, match=r"joint 'hip'.*body_j = 5.*bodies 0..1"):
        rbjax.Model(rods(), joints=[rbjax.Spherical(0, 5, name="hip")])


def test_joint_to_itself_and_non_joint():
    with pytest.raises(ValueError, match=r"joint 'weld'.*to itself"):
        rbjax.Model(rods(), joints=[rbjax.Fixed(1, "rod2", name="weld")])
    with pytest.raises(ValueError, match=r"joints\[0\].*not an rbjax joint"):
        rbjax.Model(rods(), joints=["hinge"])


def test_massless_body_points_to_ground():
    with pytest.raises(ValueError, match=r"mass.*rbjax.GROUND"):
        rbjax.Body(0.0, I_ROD, name="support")


def test_custom_constraint_that_cannot_be_traced():
    bad = rbjax.CustomConstraint(lambda qi, qj, t, p: qi[:3] @ np.ones((4, 4)), 0, 1, name="oops")
    with pytest.raises(ValueError, match=r"joint 'oops'.*residual cannot be evaluated"):
        rbjax.Model(rods(), joints=[bad])


def test_axis_validation_names_joint():
    with pytest.raises(ValueError, match=r"slider.*zero length"):
        rbjax.Translational(0, 1, z_i=[0, 0, 0], name="slider")
    with pytest.raises(ValueError, match=r"slider.*not perpendicular"):
        rbjax.Translational(0, 1, z_i=[0, 0, 1], x_i=[0, 1, 1], name="slider")
    with pytest.raises(ValueError, match=r"rope.length"):
        rbjax.Distance(0, 1, length=-1.0, name="rope")


@pytest.mark.parametrize("cls", ["Revolute", "Universal", "Perpendicular", "Fixed", "Cylindrical"])
def test_joint_built_with_at_holds_in_its_configuration(cls):
    """``.at(q, i, j, point, axis, x)`` gives a joint whose residual is zero in q (for the
    two-pin joints the pins are ``axis`` on body i and ``x`` on body j), in a configuration
    with turned bodies, and its frames differ from a joint that does not hold."""
    turn = np.array([np.cos(0.4), 0.3 * np.sin(0.4), 0.5 * np.sin(0.4), 0.0])
    q = Q0.copy()
    q[1, 3:7] = turn / np.linalg.norm(turn)
    joint = getattr(rbjax, cls).at(q, 0, 1, point=[1.0, 0.2, 0], axis=[0, 1, 0], x=[0, 0, 1])
    model = rbjax.Model(rods(), joints=[joint])
    c, _ = residual_max(model, state(q))
    assert c < 1e-14, (cls, c)
    moved = q.copy()
    moved[1, 3:7] = Q0[1, 3:7]
    assert residual_max(model, state(moved))[0] > 1e-2  # the check can fail


def test_assembly_that_cannot_succeed_names_the_joint():
    # rod2 is hinged at x = 1 and ALSO held at distance 5 from the origin: impossible (max 2).
    far = rbjax.Distance(rbjax.GROUND, 1, length=5.0, s_j=[0.5, 0, 0], name="tether")
    model = rbjax.Model(rods(), joints=hinges() + [far], gravity=[0, 0, -9.81])
    with pytest.raises(ValueError, match=r"cannot all be satisfied.*'tether'"):
        rbjax.assemble(model, state(), max_iters=30)


def test_impossible_assembly_reports_the_least_squares_residual_and_why():
    """A rod of length 2 held by ball joints at both ends to ground points 1 m apart: no
    configuration closes both. The Gauss–Newton iteration ends at the least-squares point (the
    rod centred between the anchors, each end 0.5 m off along the rod: closed form), reports
    that finite residual (it was "nan") and says why it stopped. A batch names the failing
    systems."""
    rod = rbjax.Body(1.0, np.diag([0.01, 0.1, 0.1]), name="rod")
    joints = [
        rbjax.Spherical(rbjax.GROUND, 0, s_i=[0.0, 0, 0], s_j=[-1.0, 0, 0], name="left"),
        rbjax.Spherical(rbjax.GROUND, 0, s_i=[1.0, 0, 0], s_j=[1.0, 0, 0], name="right"),
    ]
    model = rbjax.Model([rod], joints=joints)
    start = rbjax.make_state(position=[[0.7, 0.1, 0.0]], quaternion=[[1.0, 0, 0, 0]])
    with pytest.raises(ValueError) as info:
        rbjax.assemble(model, start)
    msg = str(info.value)
    assert "'left' (residual 0.5)" in msg and "'right' (residual 0.5)" in msg, msg
    assert "nan" not in msg and "stopped decreasing" in msg and "contradict" in msg, msg
    batch = jax.tree.map(lambda x: jnp.stack([x, x]), start)
    with pytest.raises(ValueError, match=r"in 2 of 2 systems \(first: batch index 0\)"):
        rbjax.assemble(model, batch)


def test_assembly_repairs_a_perturbed_state():
    model = rbjax.Model(rods(), joints=hinges(), gravity=[0, 0, -9.81])
    q = Q0.copy()
    q[1, 0] += 0.05
    q[1, 2] -= 0.03
    q[0, 3:] = [np.cos(0.05), 0, np.sin(0.05), 0]
    st = rbjax.make_state(
        position=q[:, :3], quaternion=q[:, 3:], velocity=[[0, 0, 0.3], [0.1, 0, 0]]
    )
    fixed = rbjax.assemble(model, st)
    c, cd = residual_max(model, fixed)
    assert c < 1e-12 and cd < 1e-12, (c, cd)
    # minimum-norm correction: the perturbed coordinates move, the rest barely
    assert np.abs(np.asarray(fixed.q) - q).max() < 0.1
    # one Newton iteration is not enough: the error says so, with a finite residual
    with pytest.raises(ValueError, match=r"after 1 Newton iteration;.*iteration limit") as info:
        rbjax.assemble(model, st, max_iters=1)
    assert "nan" not in str(info.value)


def test_rollout_rejects_inconsistent_initial_state():
    model = rbjax.Model(rods(), joints=hinges(), gravity=[0, 0, -9.81])
    q = Q0.copy()
    q[1, 0] += 0.01
    with pytest.raises(
        ValueError, match=r"violates the position equations of joints 'elbow'.*assemble"
    ):
        rbjax.rollout(model, state(q), 1e-3, 2)
    st = rbjax.make_state(
        position=Q0[:, :3], quaternion=Q0[:, 3:], velocity=[[0, 1.0, 0], [0, 0, 0]]
    )
    with pytest.raises(ValueError, match=r"violates the velocity equations.*'pivot'"):
        rbjax.rollout(model, st, 1e-3, 2)


def four_bar(joint_types):
    """Planar four-bar in the xz-plane, all hinge axes along world y: ground link 0→(2, 0, 0),
    crank (length 1) from the origin, coupler (2.2) and rocker (1.5). Returns (bodies, q0, joints)."""
    crank_tip = np.array([0.0, 0.0, 1.0])
    # rocker pivot at (2, 0, 0); solve the coupler/rocker tip by circle intersection in xz
    p0, r0, p1, r1 = crank_tip[[0, 2]], 2.2, np.array([2.0, 0.0]), 1.5
    d = np.linalg.norm(p1 - p0)
    a = (r0**2 - r1**2 + d**2) / (2 * d)
    h = np.sqrt(r0**2 - a**2)
    mid = p0 + a * (p1 - p0) / d
    tip2 = mid + h * np.array([-(p1 - p0)[1], (p1 - p0)[0]]) / d
    tip = np.array([tip2[0], 0.0, tip2[1]])

    def link(a_pt, b_pt):
        c = 0.5 * (a_pt + b_pt)
        ang = np.arctan2(-(b_pt - a_pt)[2], (b_pt - a_pt)[0])  # rotation about y taking x to b-a
        return np.r_[c, np.cos(ang / 2), 0, np.sin(ang / 2), 0]

    o, r_piv = np.zeros(3), np.array([2.0, 0, 0])
    q0 = np.stack([link(o, crank_tip), link(crank_tip, tip), link(r_piv, tip)])
    bodies = [
        rbjax.Body(1.0, np.diag([1e-3, 1 / 12, 1 / 12]), name="crank"),
        rbjax.Body(2.2, np.diag([1e-3, 2.2**3 / 12, 2.2**3 / 12]), name="coupler"),
        rbjax.Body(1.5, np.diag([1e-3, 1.5**3 / 12, 1.5**3 / 12]), name="rocker"),
    ]
    y = [0, 1, 0]
    pts = [(rbjax.GROUND, 0, o), (0, 1, crank_tip), (1, 2, tip), (rbjax.GROUND, 2, r_piv)]
    joints = []
    for kind, (i, j, p) in zip(joint_types, pts, strict=True):
        name = f"J{len(joints)}"
        if kind == "R":
            joints.append(rbjax.Revolute.at(q0, i, j, point=p, axis=y, name=name))
        elif kind == "S":
            joints.append(rbjax.Spherical.at(q0, i, j, point=p, name=name))
        elif kind == "U":  # pins: along y on body i, along the coupler's length on body j
            base = rbjax.Revolute.at(q0, i, j, point=p, axis=y)
            rot_j = q0[j, 3:]
            from rbjax import quaternion as quat

            pin_j = np.asarray(quat.rotate_inverse(jnp.asarray(rot_j), jnp.asarray([1.0, 0, 0])))
            joints.append(
                rbjax.Universal(
                    i, j, s_i=base.s_i, s_j=base.s_j, z_i=np.asarray(base.z_i), z_j=pin_j, name=name
                )
            )
    return bodies, q0, joints


def test_redundant_four_bar_is_detected_and_named():
    """The dependent equations are named by row: the out-of-plane ones (translation along y,
    rotations about x and z) of the hinge that closes the loop. (Every formulation runs such a
    model: tests/test_redundant_loops.py.)"""
    bodies, q0, joints = four_bar("RRRR")
    model = rbjax.Model(bodies, joints=joints, gravity=[0, 0, -9.81])
    mob = rbjax.mobility(model, state(q0))
    assert mob.rows == 20 and mob.rank == 17 and mob.dof == 1, mob
    assert mob.redundant == ("J3[row 1]", "J3[row 3]", "J3[row 4]")


def test_udwadia_kalaba_independent_of_J0_and_equal_to_schur():
    model = rbjax.Model(rods(), joints=hinges(), gravity=[0, 0, -9.81])
    st = rbjax.assemble(
        model,
        rbjax.make_state(
            position=Q0[:, :3], quaternion=Q0[:, 3:], omega_body=[[0, 0.7, 0], [0, -1.1, 0]]
        ),
    )
    ref, lam_ref = rbjax.accelerations(model, st)
    for j0 in (0.3, 1.0, 25.0):
        m = rbjax.Model(
            rods(), joints=hinges(), gravity=[0, 0, -9.81], formulation=rbjax.UdwadiaSchutte(j0)
        )
        a, lam = rbjax.accelerations(m, st)
        np.testing.assert_allclose(a, ref, atol=1e-11)
        np.testing.assert_allclose(lam[2:], lam_ref[2:], atol=1e-10)  # joint multipliers


def test_divergence_inside_rollout_reports_the_step():
    """A force law that turns NaN at t = 0.0105 s: the rollout names step 10 (dt = 1e-3)."""

    def bad(t, st, p):
        f = jnp.where(t > 0.0105, jnp.nan, 0.0)
        return jnp.zeros((2, 3)) + f, jnp.zeros(2), jnp.zeros((2, 3))

    model = rbjax.Model(
        rods(), joints=hinges(), gravity=[0, 0, -9.81], forces=[rbjax.ForceFunction(bad)]
    )
    with pytest.raises(eqx.EquinoxRuntimeError, match=r"non-finite.*at step 10 "):
        rbjax.rollout(model, state(), 1e-3, 40, save_every=20)
    tr = rbjax.rollout(model, state(), 1e-3, 40, save_every=20, throw=False)
    assert int(tr.result) == rbjax.RESULTS.nonfinite and int(tr.failed_step) == 10


def test_kinematic_analysis_requires_dof_zero():
    model = rbjax.Model(rods(), joints=hinges(), gravity=[0, 0, -9.81])
    with pytest.raises(ValueError, match=r"fully driven.*DOF = 2.*add drivers"):
        rbjax.kinematic_analysis(model, state(), np.linspace(0, 1, 5))


def test_projection_and_implicit_midpoint_hold_the_constraints():
    """Drift control: the chaotic double pendulum over 10 s at a coarse dt = 1e-2. Plain RK4
    drifts (residual ~1e-3), Projected(RK4) and ImplicitMidpoint (index-3, constraints solved
    at every end point) stay ≤ 1e-8 (issue 3 §5), and energy stays close."""
    model = rbjax.Model(rods(), joints=hinges(), gravity=[0, 0, -9.81])
    st = state()
    plain = rbjax.rollout(model, st, 1e-2, 1000, save_every=10)
    c_plain, _ = residual_max(model, plain.states)
    assert c_plain > 1e-5
    for integ in (rbjax.Projected(rbjax.RK4()), rbjax.ImplicitMidpoint()):
        tr = rbjax.rollout(model, st, 1e-2, 1000, integrator=integ, save_every=10)
        c, _ = residual_max(model, tr.states)
        assert c <= 1e-8, (integ, c)
        e = np.asarray(rbjax.total_energy(model, tr.states))
        assert np.abs(e - e[0]).max() < 0.05 * 9.81, (integ, np.abs(e - e[0]).max())
