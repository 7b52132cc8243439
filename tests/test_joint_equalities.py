"""Loops and couplings in joint coordinates (rbjax.Connect, rbjax.Weld, rbjax.JointCoupling on a
rbjax.JointModel) against rbjax's maximal coordinates, MuJoCo and a reduced ODE solved by scipy.

* A planar four-bar closed by a ``connect`` (examples/models/four_bar.xml): three equations, two
  independent. Its motion and the loop's force equal those of the maximal-coordinate
  formulation (bodies and joint equations, an independent program) from the same state.
* MJX's ``constraints.xml`` (tests/data/mjx_constraints.xml): connects and welds between free
  bodies, the world and a ball-jointed beam, by bodies and by sites; their multipliers equal
  the maximal formulation's reactions and MuJoCo's ``efc_force`` with its constraints made as
  hard as MuJoCo allows (solimp 0.9999).
* Joint reactions (``rbjax.reactions`` on a JointModel, recursive Newton–Euler over the
  subtrees) equal the maximal formulation's (its joints' multipliers) on hinges, balls and a
  loop, with actuators, damping and springs driving the joints.
* A joint equality q₁ = p(q₂) between two pendulums: the motion and the multiplier equal those
  of the reduced one-DOF equation (I₂ + I₁p′²) q̈₂ = τ₂ + p′τ₁ − I₁p′p″q̇₂², integrated by
  scipy at rtol 1e-12.
"""

import pathlib
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close

import rbjax

mujoco = pytest.importorskip("mujoco")
from rbjax._io.mujoco_tree import build_tree_from_mujoco  # noqa: E402

DATA = pathlib.Path(__file__).resolve().parent / "data"
MODELS = pathlib.Path(__file__).resolve().parents[1] / "examples" / "models"


def _quiet_load(path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return rbjax.load(path, **kw)


@eqx.filter_jit
def _forces(model, t, qpos, qvel):
    return model.equality_forces(t, qpos, qvel)


def _joint_coordinates_of(maximal):
    """qpos, qvel of a maximal-coordinate state (rbjax's JointSpace, not the code under test)."""
    space = maximal.joint_space()
    return np.asarray(space.positions(maximal.state)), np.asarray(space.velocities(maximal.state))


def test_four_bar_moves_and_pulls_as_in_maximal_coordinates():
    """2 s of RK4 at 1 ms from a moving state that closes the loop (assembled by the maximal
    loader): the joint angles agree with the maximal trajectory's to 1e-7 rad (RK4's O(h⁴) in
    two coordinate systems), the connect's force equals the maximal joint's reaction on the
    coupler, the redundant out-of-plane row carries no force (minimum norm), the loop stays
    closed to 1e-7 m, and the energy of this conservative mechanism is kept to 1e-8."""
    path = MODELS / "four_bar.xml"
    maximal = _quiet_load(
        path, qpos=[0.3, -0.2, 0.1], qvel=[2.0, 0.0, 0.0], formulation=rbjax.ScalableDAE()
    )
    q, v = _joint_coordinates_of(maximal)
    jm = rbjax.load(path, formulation=rbjax.JointCoordinates()).model
    assert [type(e).__name__ for e in jm.equalities] == ["Connect"]
    s0 = rbjax.JointState(0.0, q, v)
    steps, every = 2000, 500
    joint = rbjax.rollout(jm, s0, 1e-3, steps, save_every=every, multipliers=True)
    traj = rbjax.rollout(
        maximal.model, maximal.state, 1e-3, steps, save_every=every, multipliers=True
    )
    space = maximal.joint_space()
    qpos = np.asarray(eqx.filter_jit(jax.vmap(lambda s: space.positions(s)))(traj.states))
    wrapped = (qpos - np.asarray(joint.qpos) + np.pi) % (2 * np.pi) - np.pi
    assert_close(wrapped, 0.0, rtol=0.0, atol=1e-7, err_msg="joint angles")

    k = [j.name for j in maximal.model.joints].index("loop")
    # the rollout's multipliers at every saved state: the connect's 3 rows, equal to the
    # maximal rollout's multipliers of the same loop joint (as the force on the coupler)
    assert joint.lam is not None and joint.lam.shape == (steps // every + 1, 3)
    pulled = rbjax.reactions(maximal.model, traj.states, lam=traj.lam).force_i[:, k]
    scale = np.abs(np.asarray(pulled)).max()
    assert_close(joint.lam, pulled, rtol=0.0, atol=1e-6 * scale, err_msg="rollout multipliers")
    for i in (0, -1):
        lam = np.asarray(_forces(jm, joint.t[i], joint.qpos[i], joint.qvel[i])["loop"])
        assert_close(joint.lam[i], lam, rtol=0.0, atol=1e-12 * scale)  # equality_forces'
        reaction = rbjax.reactions(maximal.model, jax.tree.map(lambda x, i=i: x[i], traj.states))
        assert_close(lam, reaction.force_i[k], rtol=0.0, atol=1e-6 * np.abs(lam).max())
        assert lam[1] == pytest.approx(0.0, abs=1e-9)  # the dependent y row: no force
        # the three hinges' reactions too (test_joint_reactions_equal_maximal_reactions)
        mine = rbjax.reactions(jm, joint[i])
        hinges = np.array([[j.name for j in maximal.model.joints].index(n) for n in jm.joint_names])
        scale = np.abs(np.asarray(reaction.force_j)).max()
        assert_close(mine.force, reaction.force_j[hinges], rtol=0.0, atol=1e-6 * scale)
        assert_close(mine.torque, reaction.torque_j[hinges], rtol=0.0, atol=1e-6 * scale)

    m = mujoco.MjModel.from_xml_path(str(path))
    d = mujoco.MjData(m)
    gaps, energy = [], []
    for qq, vv in zip(np.asarray(joint.qpos), np.asarray(joint.qvel), strict=True):
        d.qpos[:], d.qvel[:] = qq, vv
        mujoco.mj_kinematics(m, d)
        p1 = d.xpos[m.body("coupler").id] + d.xmat[m.body("coupler").id].reshape(3, 3) @ [
            0.8,
            0.0,
            0.2,
        ]
        p2 = d.xpos[m.body("rocker").id] + d.xmat[m.body("rocker").id].reshape(3, 3) @ [
            0.0,
            0.0,
            0.5,
        ]
        gaps.append(np.abs(p1 - p2).max())
        Mq = np.asarray(jm.mass_matrix(qq))
        com = sum(m.body_mass[b] * d.xipos[b][2] for b in range(1, m.nbody))
        energy.append(0.5 * vv @ Mq @ vv + 9.81 * com)
    assert max(gaps) < 1e-7
    assert np.ptp(energy) < 1e-8 * max(1.0, abs(energy[0]))


def test_an_open_loop_is_assembled_at_load_with_a_warning():
    """MuJoCo's qpos need not close an equality (its soft one pulls it closed); the exact one
    must start closed. Loading the four-bar in joint coordinates at angles that open the loop
    and a crank speed that moves it apart warns with the gap (1.81 m/s), and returns a state
    MuJoCo's own kinematics finds closed: the coupler's and rocker's tips coincide (1e-10 m) and move together (mj_jac,
    1e-10 m/s); the crank, with the largest share of the kinetic-energy metric, moved least."""
    path = MODELS / "four_bar.xml"
    q_open, v_open = [0.3, -0.2, 0.1], [2.0, 0.0, 0.0]
    with pytest.warns(UserWarning, match=r"violates the equalities by 1\.81; it was assembled"):
        loaded = rbjax.load(path, qpos=q_open, qvel=v_open, formulation=rbjax.JointCoordinates())
    q, v = np.asarray(loaded.state.qpos), np.asarray(loaded.state.qvel)
    m = mujoco.MjModel.from_xml_path(str(path))
    d = mujoco.MjData(m)
    d.qpos[:], d.qvel[:] = q, v
    mujoco.mj_forward(m, d)
    tips, jacs = [], []
    for body, local in (("coupler", [0.8, 0.0, 0.2]), ("rocker", [0.0, 0.0, 0.5])):
        b = m.body(body).id
        p = d.xpos[b] + d.xmat[b].reshape(3, 3) @ local
        jac = np.zeros((3, m.nv))
        mujoco.mj_jac(m, d, jac, None, p, b)
        tips.append(p)
        jacs.append(jac)
    assert np.abs(tips[0] - tips[1]).max() < 1e-10
    assert np.abs((jacs[0] - jacs[1]) @ v).max() < 1e-10
    moved = np.abs(q - q_open)
    assert moved[0] < moved[1:].max()
    # the open state itself is refused by rollout, and rbjax.assemble closes it as load did
    open_state = rbjax.JointState(0.0, q_open, v_open)
    with pytest.raises(ValueError, match=r"violates the equalities 'loop'.*Fix: .*assemble"):
        rbjax.rollout(loaded.model, open_state, 1e-3, 10)
    closed = rbjax.assemble(loaded.model, open_state)
    assert_close(closed.qpos, q, rtol=0.0, atol=1e-14)
    assert_close(closed.qvel, v, rtol=0.0, atol=1e-14)


@pytest.mark.parametrize(
    "name, qpos, qvel",
    [
        ("arm7.xml", None, None),  # 7 hinges, actuators, damping
        ("humanoid.xml", None, None),  # free root, balls and hinges
        ("cart_pole.xml", [0.1, 0.5], [0.3, -1.0]),  # a slide
    ],
)
def test_joint_reactions_equal_maximal_reactions(name, qpos, qvel):
    """At a random state (the four-bar's loop: in its own test above, which compiles the
    maximal reactions of that file once), the force and the torque about the joint point that every joint exerts on its body equal the
    maximal formulation's (``Reactions.force_j``/``torque_j``), to 1e-9 of the largest. The
    maximal reactions come from the multipliers of the joint equations; these from the
    subtree sums of recursive Newton–Euler, with the drive along each joint's own DOFs taken
    out (rbjax/_tree/reactions.py). A free joint has none."""
    path = MODELS / name
    m = mujoco.MjModel.from_xml_path(str(path))
    rng = np.random.default_rng(3)
    if qpos is None:
        q0, v0 = m.qpos0.copy(), rng.uniform(-1.0, 1.0, m.nv)
        d = mujoco.MjData(m)
        mujoco.mj_integratePos(m, q0, rng.uniform(-0.5, 0.5, m.nv), 1.0)
        qpos, qvel = q0, v0
        del d
    ctrl = rng.uniform(-1.0, 1.0, m.nu) if m.nu else None
    maximal = _quiet_load(path, qpos=qpos, qvel=qvel, control=ctrl, formulation=rbjax.ScalableDAE())
    q, v = _joint_coordinates_of(maximal)
    joint = _quiet_load(path, qpos=q, qvel=v, control=ctrl, formulation=rbjax.JointCoordinates())
    mine = rbjax.reactions(joint.model, joint.state)
    theirs = rbjax.reactions(maximal.model, maximal.state)
    names = [j.name for j in maximal.model.joints]
    force, torque, f_ref, t_ref = [], [], [], []
    bodies = list(joint.model.topology.joint_body)
    for k, (jn, kind) in enumerate(
        zip(joint.model.joint_names, joint.model.topology.joint_types, strict=True)
    ):
        if kind == "free":
            assert np.all(np.asarray(mine.force[k]) == 0.0)
            continue
        # two hinges on one body are one Universal joint in maximal coordinates: the force
        # is the same, the torques differ by definition (each hinge here keeps the torque
        # along the other's axis, which it does constrain)
        kx = next(i for i, n in enumerate(names) if jn in n.split("+"))
        force.append(mine.force[k])
        f_ref.append(theirs.force_j[kx])
        if bodies.count(bodies[k]) == 1:
            torque.append(mine.torque[k])
            t_ref.append(theirs.torque_j[kx])
    scale = max(np.abs(np.asarray(f_ref)).max(), np.abs(np.asarray(t_ref)).max())
    assert scale > 1.0
    assert_close(force, f_ref, rtol=0.0, atol=1e-9 * scale, err_msg="force")
    assert_close(torque, t_ref, rtol=0.0, atol=1e-9 * scale, err_msg="torque")


def _constraints_model():
    """MJX's constraints.xml (tendons removed, tests/data/README.md) with contacts, limits and
    friction loss off, the ball joint's actuator (which rbjax does not simulate) disabled, the
    welds' torquescale 1 and every equality as hard as MuJoCo allows."""
    m = mujoco.MjModel.from_xml_path(str(DATA / "mjx_constraints.xml"))
    m.opt.disableflags |= (
        int(mujoco.mjtDisableBit.mjDSBL_CONTACT)
        | int(mujoco.mjtDisableBit.mjDSBL_LIMIT)
        | int(mujoco.mjtDisableBit.mjDSBL_FRICTIONLOSS)
    )
    m.actuator_group[m.actuator("act1").id] = 30
    m.opt.disableactuator = 1 << 30
    for e in range(m.neq):
        if int(m.eq_type[e]) == int(mujoco.mjtEq.mjEQ_WELD):
            m.eq_data[e, 10] = 1.0
    m.eq_solimp[:] = [0.9999, 0.9999, 0.001, 0.5, 2.0]
    return m


def test_connects_and_welds_match_maximal_reactions_and_mujoco():
    """At a state on the constraints (qpos0 with keyframe 0's velocities, assembled by the
    maximal loader): every
    multiplier equals the maximal formulation's reaction on body 1 (force, and a weld's torque
    about its point), and the connects' equal MuJoCo's efc_force to MuJoCo's softness (1e-4).

    One exception, explained: the ``connect`` ties a beam that already turns on a ball joint
    at its origin. Along the line through the two points the force can be shared between the
    ball and the connect in any proportion (only their sum is determined). Both formulations
    return minimum-norm multipliers, but over different sets (the ball's reaction is a
    multiplier in maximal coordinates, a coordinate here), so only the component across that
    line is compared."""
    m = _constraints_model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        jm, _, _, _ = build_tree_from_mujoco(m, formulation=rbjax.JointCoordinates())
        xml = DATA / "mjx_constraints.xml"
        maximal = rbjax.load(xml, qvel=m.key_qvel[0], formulation=rbjax.ScalableDAE())
    kinds = {e.name: type(e).__name__ for e in jm.equalities}
    assert kinds == {
        "c_site": "Connect",
        "connect": "Connect",
        "w_site": "Weld",
        "weld": "Weld",
        "joint": "JointCoupling",
    }
    q, v = _joint_coordinates_of(maximal)
    lam = {k: np.asarray(x) for k, x in _forces(jm, 0.0, q, v).items()}
    reaction = rbjax.reactions(maximal.model, maximal.state)
    names = [j.name for j in maximal.model.joints]
    for name in ("c_site", "w_site", "weld"):
        k = names.index(name)
        expected = np.asarray(reaction.force_i[k])
        if name != "c_site":
            expected = np.concatenate([expected, np.asarray(reaction.torque_i[k])])
        assert_close(
            lam[name], expected, rtol=0.0, atol=1e-9 * np.abs(expected).max(), err_msg=name
        )
    k = names.index("connect")
    line = np.array([1.0, 0.0, -1.0]) / np.sqrt(2.0)  # ball centre to connect point
    across = lambda f: f - (f @ line) * line  # noqa: E731
    assert_close(across(lam["connect"]), across(np.asarray(reaction.force_i[k])), atol=1e-8)

    d = mujoco.MjData(m)
    d.qpos[:], d.qvel[:] = q, v
    mujoco.mj_forward(m, d)
    for e, name in ((0, "c_site"), (1, "connect")):
        rows = np.flatnonzero(
            (d.efc_type == int(mujoco.mjtConstraint.mjCNSTR_EQUALITY)) & (d.efc_id == e)
        )
        efc = d.efc_force[rows]
        assert_close(lam[name], efc, rtol=0.0, atol=1e-3 * np.abs(efc).max(), err_msg=name)


_COUPLED = """
<mujoco>
  <option timestep="0.001" integrator="RK4"/>
  <worldbody>
    <body name="a">
      <joint name="qa" type="hinge" axis="0 1 0"/>
      <inertial pos="0 0 -0.25" mass="1.5" diaginertia="0.02 0.03 0.01"/>
    </body>
    <body name="b" pos="1 0 0">
      <joint name="qb" type="hinge" axis="0 1 0"/>
      <inertial pos="0 0 -0.4" mass="0.7" diaginertia="0.04 0.05 0.02"/>
    </body>
  </worldbody>
  <equality>
    <joint name="gear" joint1="qa" joint2="qb" polycoef="0.1 -0.8 0.3 0 0"/>
  </equality>
</mujoco>
"""
_I1, _I2 = 0.03 + 1.5 * 0.25**2, 0.05 + 0.7 * 0.4**2  # about the pivots, y axis
_T1, _T2 = 1.5 * 9.81 * 0.25, 0.7 * 9.81 * 0.4  # m g l


def _poly(x):
    return 0.1 - 0.8 * x + 0.3 * x**2, -0.8 + 0.6 * x, 0.6


def _reduced(t_eval, x0, v0):
    """q₂(t), q̇₂(t), q̈₂(t) of the reduced equation (module docstring), scipy at rtol 1e-12."""
    from scipy.integrate import solve_ivp

    def acc(x, v):
        p, dp, ddp = _poly(x)
        return (-_T2 * np.sin(x) - dp * _T1 * np.sin(p) - _I1 * dp * ddp * v * v) / (
            _I2 + _I1 * dp * dp
        )

    sol = solve_ivp(
        lambda t, y: [y[1], acc(y[0], y[1])],
        (0.0, t_eval[-1]),
        [x0, v0],
        t_eval=t_eval,
        rtol=1e-12,
        atol=1e-13,
        method="DOP853",
    )
    return sol.y[0], sol.y[1], acc(sol.y[0], sol.y[1])


@pytest.fixture(scope="module")
def coupled(tmp_path_factory):
    path = tmp_path_factory.mktemp("coupled") / "coupled.xml"
    path.write_text(_COUPLED)
    with pytest.warns(UserWarning, match="violates the equalities by 0.1"):  # qpos0 = 0
        jm = rbjax.load(path, formulation=rbjax.JointCoordinates()).model
    x0, v0 = 0.2, 1.0
    p, dp, _ = _poly(x0)
    return jm, rbjax.JointState(0.0, [p, x0], [dp * v0, v0])


def test_velocity_products_equal_the_time_derivative_of_the_constraint_velocity():
    """The closed-form J̇ q̇ of every equality type (connects and welds between bodies of a
    ball/hinge/slide tree and the world, a quartic joint coupling; rbjax/_tree/equality.py)
    equals d/dt (J(q) q̇) at fixed q̇, a forward-mode derivative of J(q) q̇ along q̇pos, at
    random states off the constraints (the identity holds everywhere)."""
    from rbjax._tree.dynamics import qpos_rate
    from rbjax._tree.equality import constraint_rhs, rows
    from rbjax._tree.kinematics import frames, motion_subspace

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        jm, _, _, _ = build_tree_from_mujoco(
            _constraints_model(), formulation=rbjax.JointCoordinates()
        )
    topo = jm.topology
    rng = np.random.default_rng(3)
    q = np.asarray(jm.qpos0)[:, None] + rng.uniform(-0.4, 0.4, (topo.nq, 3))
    u = jnp.asarray(rng.uniform(-2.0, 2.0, (topo.nv, 3)))

    def both(q, u):
        f = frames(topo, jm, q)
        _, r = constraint_rhs(jm, q, u, f, motion_subspace(topo, f))

        def velocity(x):
            fx = frames(topo, jm, x)
            return jnp.sum(rows(jm, x, fx, motion_subspace(topo, fx))[1] * u[None], axis=1)

        return r, jax.jvp(velocity, (q,), (qpos_rate(topo, q, u),))[1]

    r, gamma = jax.jit(both)(jnp.asarray(q), u)
    assert {type(e).__name__ for e in jm.equalities} == {"Connect", "Weld", "JointCoupling"}
    assert float(jnp.max(jnp.abs(gamma))) > 1.0  # the states do turn the constraints
    assert_close(r, -gamma, atol=1e-11, rtol=1e-11)


def test_joint_coupling_follows_the_reduced_equation(coupled):
    """1 s of RK4 at 1 ms: q₂ within 1e-10 rad of scipy's reduced solution, q₁ = p(q₂), and
    the multiplier (rollout(..., multipliers=True)) at every saved state equal to the torque
    the coupling must supply, I₁q̈₁ − τ₁ (closed form from the reduced solution).
    ImplicitFast (first order) keeps the coupling too: within 1e-2 rad of the same solution
    at the same step."""
    jm, s0 = coupled
    traj = rbjax.rollout(jm, s0, 1e-3, 1000, save_every=100, multipliers=True)
    x, xd, xdd = _reduced(np.asarray(traj.t), 0.2, 1.0)
    assert_close(traj.qpos[:, 1], x, rtol=0.0, atol=1e-10, err_msg="q2")
    p, dp, ddp = _poly(x)
    assert_close(traj.qpos[:, 0], p, rtol=0.0, atol=1e-10, err_msg="q1 = p(q2)")
    assert traj.lam is not None and traj.lam.shape == (11, 1)  # the rollout's multipliers
    lam = traj.lam[:, 0]
    expected = _I1 * (dp * xdd + ddp * xd * xd) + _T1 * np.sin(p)
    assert_close(lam, expected, rtol=0.0, atol=1e-8 * np.abs(expected).max(), err_msg="force")

    semi = rbjax.rollout(jm, s0, 1e-3, 1000, save_every=100, integrator=rbjax.ImplicitFast())
    assert_close(semi.qpos[:, 1], x, rtol=0.0, atol=1e-2, err_msg="ImplicitFast q2")
    pe, _, _ = _poly(np.asarray(semi.qpos[:, 1]))
    assert_close(semi.qpos[:, 0], pe, rtol=0.0, atol=1e-2, err_msg="ImplicitFast q1 = p(q2)")


def test_gradient_through_a_coupled_rollout_matches_finite_differences(coupled):
    """d q₂(0.3 s) / d m_a through a rollout that holds the coupling, against central
    differences of the same rollout (float64, step 1e-5 kg)."""
    jm, s0 = coupled

    @jax.jit
    def final(mass_a):
        model = eqx.tree_at(lambda mm: mm.mass, jm, jm.mass.at[0].set(mass_a))
        return rbjax.rollout(model, s0, 1e-3, 300, save_every=300).qpos[-1, 1]

    g = jax.grad(final)(1.5)
    h = 1e-5
    fd = (final(1.5 + h) - final(1.5 - h)) / (2 * h)
    assert abs(float(fd)) > 1e-4
    assert_close(g, fd, rtol=1e-6, atol=0.0)


def test_baumgarte_pulls_a_drifted_loop_back(coupled):
    """From a state that violates the coupling by 1e-3 rad (at rest): the unstabilised
    equations would keep the violation (they only hold its second derivative), so rollout
    refuses that start by name; baumgarte=(10, 10) [1/s] is there to close it, and brings it
    below 1e-5 within 1 s."""
    jm, s0 = coupled
    off = rbjax.JointState(0.0, s0.qpos.at[0].add(1e-3), s0.qvel * 0.0)

    def gap(model):
        f = rbjax.rollout(model, off, 1e-3, 1000, save_every=1000).final
        return abs(float(f.qpos[0] - _poly(float(f.qpos[1]))[0]))

    stabilised = eqx.tree_at(
        lambda mm: mm.baumgarte,
        jm,
        (jnp.asarray(10.0), jnp.asarray(10.0)),
        is_leaf=lambda x: x is None,
    )
    with pytest.raises(ValueError, match=r"violates the equalities 'gear' \(position 0\.001"):
        gap(jm)
    assert gap(stabilised) < 1e-5


def test_bad_equalities_are_refused_by_name(coupled):
    jm, _ = coupled
    tree = dict(
        names=["a", "b"],
        parent=[-1, -1],
        body_pos=np.zeros((2, 3)),
        body_quat=np.tile([1.0, 0, 0, 0], (2, 1)),
        mass=np.ones(2),
        com=np.zeros((2, 3)),
        inertia=np.tile(np.eye(3), (2, 1, 1)),
        joint_types=["hinge", "ball"],
        joint_body=[0, 1],
    )
    with pytest.raises(ValueError, match=r"Connect\('c'\)\.body2 = 5 is not a body.*Fix:"):
        rbjax.JointModel(
            **tree, equalities=[rbjax.Connect(0, 5, np.zeros(3), np.zeros(3), name="c")]
        )
    with pytest.raises(ValueError, match=r"JointCoupling\('j'\)\.joint2 = 1 is not a hinge.*Fix:"):
        rbjax.JointModel(**tree, equalities=[rbjax.JointCoupling(0, 1, np.zeros(5), name="j")])
    with pytest.raises(ValueError, match=r"equalities\[0\] = Spherical is not an equality.*Fix:"):
        rbjax.JointModel(**tree, equalities=[rbjax.Spherical(0, 1)])
    with pytest.raises(ValueError, match=r"JointModel\.baumgarte.*negative.*Fix:"):
        rbjax.JointModel(**tree, baumgarte=(-1.0, 1.0))
    with pytest.raises(
        ValueError, match=r"Weld\('w'\)\.frame1 = .* has shape \(3,\), expected \(3, 3\).*Fix:"
    ):
        rbjax.Weld(0, 1, np.zeros(3), np.zeros(3), frame1=np.zeros(3), name="w")


def test_non_finite_equality_parameters_are_refused_by_name():
    """An anchor, frame or polynomial coefficient with NaN or inf is refused when the
    equality is built, naming the field (as every JointModel array is)."""
    nan = [np.nan, 0.0, 0.0]
    with pytest.raises(ValueError, match=r"Connect\('c'\)\.anchor1.*non-finite.*Fix:"):
        rbjax.Connect(0, 1, nan, np.zeros(3), name="c")
    with pytest.raises(ValueError, match=r"Weld\('w'\)\.anchor2.*non-finite.*Fix:"):
        rbjax.Weld(0, 1, np.zeros(3), jnp.asarray(nan), name="w")
    with pytest.raises(ValueError, match=r"Weld\('w'\)\.frame2.*non-finite.*Fix:"):
        rbjax.Weld(0, 1, np.zeros(3), np.zeros(3), frame2=np.diag([1.0, np.inf, 1.0]), name="w")
    with pytest.raises(ValueError, match=r"JointCoupling\('j'\)\.polycoef.*non-finite.*Fix:"):
        rbjax.JointCoupling(0, 1, [0.0, 1.0, np.nan, 0.0, 0.0], name="j")


def test_an_open_start_is_refused_under_a_gradient_with_respect_to_a_mass(coupled):
    """The open-equality check of rollout's initial state reads only the state and the
    kinematics (body and joint frames, qpos0, the equalities): under jax.grad (and
    jax.jit(jax.grad)) with respect to a mass, the traced mass does not switch it off, and
    the open start is refused by name as it is without a trace."""
    jm, s0 = coupled
    off = rbjax.JointState(0.0, s0.qpos.at[0].add(1e-3), s0.qvel)

    def loss(mass_a):
        model = eqx.tree_at(lambda mm: mm.mass, jm, jm.mass.at[0].set(mass_a))
        return rbjax.rollout(model, off, 1e-3, 10, save_every=10).qpos[-1, 1]

    for transform in (jax.grad, lambda f: jax.jit(jax.grad(f))):
        with pytest.raises(ValueError, match=r"violates the equalities 'gear' \(position 0\.001"):
            transform(loss)(1.5)
