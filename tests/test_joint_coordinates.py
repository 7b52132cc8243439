"""The joint-coordinate formulation (rbjax.JointModel, rbjax.JointCoordinates) against MuJoCo,
against rbjax's maximal coordinates, against conservation of energy and finite differences.

MuJoCo is the reference for the mass matrix (``mj_fullM``), the bias forces (``qfrc_bias``),
the accelerations (``mj_forward``'s ``qacc``) and the RK4 trajectory (``mjINT_RK4``). Its
contacts, joint limits and constraints are switched off through ``m.opt.disableflags`` before
the compiled model is handed to the loader (rbjax/_io/mujoco_tree.py
``build_tree_from_mujoco``), so both engines integrate the same smooth tree. What the loader
does not simulate (tendons, actuators on ball/free joints or tendons) is removed from MuJoCo's
side too: tendon springs and dampers are zeroed and those actuators put in a disabled actuator
group, and the loader's warning is checked to name exactly these.

The test models: MuJoCo's MJX test files ``humanoid/humanoid.xml`` and ``pendula.xml``
(tests/data/README.md), which the maximal-coordinate loader refuses (several joints on one
body), and the examples arm7, humanoid, double_pendulum and cart_pole. The joint-coordinate
state IS MuJoCo's qpos/qvel, so hinge and slide trajectories agree with MuJoCo's RK4 to
round-off (same coordinates, same scheme); ball and free quaternions differ by RK4's O(h⁴),
because the two engines integrate them differently (the RK4 tests' docstrings).

Compile time dominates: each test compiles at most a few programs, the models are built once
per file (``_joint_model_of``, ``_loaded_tree``) so that tests with the same rollout share
its program, and checks are batched into one call where the API allows.
"""

import functools
import pathlib
import re
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

_OFF = (
    int(mujoco.mjtDisableBit.mjDSBL_CONTACT)
    | int(mujoco.mjtDisableBit.mjDSBL_LIMIT)
    | int(mujoco.mjtDisableBit.mjDSBL_CONSTRAINT)
)
_UNUSED_GROUP = 30  # the actuator group the tests disable in MuJoCo (0..30 are valid)
# what the loader names as not simulated, once the test has removed it from MuJoCo's side too
_NEUTRALISED = (
    "which is not a single hinge or slide",
    "transmission mjTRN_TENDON",
    "tendon(s)",
    "mocap bodies",
    "(actuatorgravcomp) is applied as a passive force",
)


def _mujoco_model(path):
    """The compiled file with contacts, limits and constraints off, tendon springs and dampers
    zeroed and the actuators rbjax does not simulate in a disabled group (module docstring)."""
    m = mujoco.MjModel.from_xml_path(str(path))
    m.opt.disableflags |= _OFF
    m.tendon_stiffness[:] = 0.0
    m.tendon_damping[:] = 0.0
    hinge_or_slide = (int(mujoco.mjtJoint.mjJNT_HINGE), int(mujoco.mjtJoint.mjJNT_SLIDE))
    for a in range(m.nu):
        on_joint = int(m.actuator_trntype[a]) == int(mujoco.mjtTrn.mjTRN_JOINT)
        if not on_joint or int(m.jnt_type[m.actuator_trnid[a, 0]]) not in hinge_or_slide:
            m.actuator_group[a] = _UNUSED_GROUP
    m.opt.disableactuator = 1 << _UNUSED_GROUP
    return m


@functools.cache
def _joint_model_of(path):
    """The JointModel of :func:`_mujoco_model` ``(path)``, built once per file: its static
    structure is then the same object in every test, so a rollout program compiled for one
    test is reused by the next (compile time dominates this file)."""
    return _joint_model(_mujoco_model(path))


def _joint_model(m):
    """The JointModel of ``m`` with its controls a ControlSequence (its ``values`` a leaf that
    :func:`_with_controls` replaces), and the loader's warning checked."""
    control = rbjax.ControlSequence(np.zeros((1, m.nu)), dt=1.0) if m.nu else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, _, _, _ = build_tree_from_mujoco(
            m, control=control, formulation=rbjax.JointCoordinates()
        )
    for w in caught:
        lines = str(w.message).splitlines()[1:]
        assert lines, str(w.message)
        for line in lines:
            assert any(s in line for s in _NEUTRALISED), line
    return model


def _with_controls(model, ctrl):
    """``model`` with MuJoCo's ctrl (nu,) as the value of its ControlSequence."""
    is_seq = lambda x: isinstance(x, rbjax.ControlSequence)  # noqa: E731
    return jax.tree.map(
        lambda x: eqx.tree_at(lambda c: c.values, x, jnp.asarray(ctrl)[None]) if is_seq(x) else x,
        model,
        is_leaf=is_seq,
    )


def _random_state(m, rng, speed=1.0):
    """Random qpos (hinges and slides within ±1 of qpos0, unit quaternions, free positions
    ~N(0, 1)), qvel ~N(0, speed²) and ctrl ~U(−1, 1)."""
    q = m.qpos0.copy()
    for j in range(m.njnt):
        a, kind = int(m.jnt_qposadr[j]), int(m.jnt_type[j])
        if kind == int(mujoco.mjtJoint.mjJNT_FREE):
            q[a : a + 3] = rng.normal(size=3)
            a += 3
        if kind in (int(mujoco.mjtJoint.mjJNT_FREE), int(mujoco.mjtJoint.mjJNT_BALL)):
            quat = rng.normal(size=4)
            q[a : a + 4] = quat / np.linalg.norm(quat)
        else:
            q[a] += rng.uniform(-1.0, 1.0)
    return q, speed * rng.normal(size=m.nv), rng.uniform(-1.0, 1.0, size=m.nu)


def _mujoco_forward(m, q, v, ctrl):
    d = mujoco.MjData(m)
    d.qpos[:], d.qvel[:], d.ctrl[:] = q, v, ctrl
    mujoco.mj_forward(m, d)
    M = np.zeros((m.nv, m.nv))
    mujoco.mj_fullM(m, d, M)
    return M, d.qfrc_bias.copy(), d.qacc.copy()


def _mujoco_rk4(m, q, v, ctrl, dt, n):
    m.opt.integrator = mujoco.mjtIntegrator.mjINT_RK4
    m.opt.timestep = dt
    d = mujoco.MjData(m)
    d.qpos[:], d.qvel[:], d.ctrl[:] = q, v, ctrl
    for _ in range(n):
        mujoco.mj_step(m, d)
    return d.qpos.copy(), d.qvel.copy()


def _close_to_scale(actual, expected, rel, what):
    """|actual − expected| ≤ rel · max(1, max|expected|) elementwise."""
    expected = np.asarray(expected)
    scale = max(1.0, float(np.abs(expected).max(initial=0.0)))
    assert_close(actual, expected, rtol=0.0, atol=rel * scale, err_msg=what)


_FILES = [
    DATA / "mujoco_humanoid.xml",
    DATA / "pendula.xml",
    MODELS / "arm7.xml",
    MODELS / "humanoid.xml",
    MODELS / "double_pendulum.xml",
    MODELS / "cart_pole.xml",
]


@eqx.filter_jit
def _dynamics(model, qpos, qvel, ctrl):
    """M, b of a batch (K, nq), (K, nv) through the batched natural layout, and q̈ with one
    control per system through vmap: one program per model."""
    M, b = model.mass_matrix(qpos), model.bias(qpos, qvel)
    qacc = jax.vmap(lambda u, q, v: _with_controls(model, u).qacc(0.0, q, v))(ctrl, qpos, qvel)
    return M, b, qacc


@pytest.mark.parametrize("seed, path", list(enumerate(_FILES)), ids=[p.name for p in _FILES])
def test_mass_matrix_bias_and_accelerations_match_mujoco(seed, path):
    """M(q) = mj_fullM, b(q, q̇) = qfrc_bias and q̈ = mj_forward's qacc (damping, stiffness
    of hinges, slides, balls and free joints, armature, gravity compensation and actuators
    included) at three random states with random controls, to 1e-10 of each quantity's
    scale (measured: at most 1.3e-13, arm7's qacc)."""
    m = _mujoco_model(path)
    model = _joint_model_of(path)
    rng = np.random.default_rng(seed)
    qs, vs, us = (np.stack(x) for x in zip(*[_random_state(m, rng) for _ in range(3)], strict=True))
    M, b, qacc = _dynamics(model, qs, vs, us)
    assert M.shape == (3, m.nv, m.nv) and b.shape == qacc.shape == (3, m.nv)
    for k in range(3):
        M_mj, b_mj, qacc_mj = _mujoco_forward(m, qs[k], vs[k], us[k])
        _close_to_scale(M[k], M_mj, 1e-10, f"mass matrix, state {k}")
        _close_to_scale(b[k], b_mj, 1e-10, f"bias, state {k}")
        _close_to_scale(qacc[k], qacc_mj, 1e-10, f"qacc, state {k}")


_DT, _STEPS, _SAVE = 2e-3, 500, 50  # 1 s of RK4; shared by the rollouts of pendula.xml


def _quaternion_rows(m):
    """The qpos rows of every ball and free joint's quaternion, as (start, stop) pairs."""
    rows = []
    for j in range(m.njnt):
        a, kind = int(m.jnt_qposadr[j]), int(m.jnt_type[j])
        if kind == int(mujoco.mjtJoint.mjJNT_FREE):
            rows.append((a + 3, a + 7))
        elif kind == int(mujoco.mjtJoint.mjJNT_BALL):
            rows.append((a, a + 4))
    return rows


def _assert_matches_mujoco_rk4(m, q, v, ctrl, qpos, qvel):
    """rbjax's final (qpos, qvel) against MuJoCo's RK4 from (q, v) over _STEPS steps of _DT,
    to 1e-8 of each one's scale: quaternions compared as q/|q| after checking |q| − 1 (test
    docstrings)."""
    qpos_mj, qvel_mj = _mujoco_rk4(m, q, v, ctrl, _DT, _STEPS)
    qpos = np.array(qpos)
    for a, b in _quaternion_rows(m):
        norm = np.linalg.norm(qpos[a:b])
        assert abs(norm - 1.0) < 1e-8, (a, norm)
        qpos[a:b] /= norm
    _close_to_scale(qpos, qpos_mj, 1e-8, "qpos")
    _close_to_scale(qvel, qvel_mj, 1e-8, "qvel")


def test_rk4_trajectory_of_the_mjx_humanoid_matches_mujoco_rk4():
    """qpos and qvel after 1 s of RK4 (dt = 2 ms, random state and controls; two rollouts of
    0.5 s, the second continuing the first's JointTrajectory) equal MuJoCo's RK4
    (``mjINT_RK4``) to 1e-8 of their scale (max(1, max |x|)).

    Hinges and slides are the same coordinates integrated by the same scheme: they agree to
    round-off. A ball's or free joint's quaternion is not: MuJoCo's RK4 moves it on the unit
    sphere (``mj_integratePos``) and normalises it, rbjax integrates q̇ = ½ q ⊗ (0, ω) in R⁴
    and reads q/|q| (rbjax/_tree/model.py), so |q| drifts by O(h⁴) and the two rotations
    differ by O(h⁴). The rotations are compared as q/|q|, and |q| − 1 is checked separately.
    The controls are 0.1 of their range: at full range the torso spins at up to 76 rad/s and
    that O(h⁴) difference is 3.0e-7 in qpos at dt = 2 ms, 1.8e-8 at 1 ms (measured; 1.8e-12
    with these controls)."""
    path = DATA / "mujoco_humanoid.xml"
    m = _mujoco_model(path)
    q, v, ctrl = _random_state(m, np.random.default_rng(7), speed=0.5)
    ctrl = 0.1 * ctrl
    model = _with_controls(_joint_model_of(path), ctrl)
    half = _STEPS // 2
    first = rbjax.rollout(model, rbjax.JointState(0.0, q, v), _DT, half, save_every=_SAVE)
    traj = rbjax.rollout(model, first, _DT, half, save_every=_SAVE)
    assert traj.qpos.shape == (half // _SAVE + 1, m.nq)
    assert traj.qvel.shape == (half // _SAVE + 1, m.nv)
    assert int(traj.result) == int(rbjax.RESULTS.successful) and int(traj.failed_step) == -1
    assert_close(traj.t[0], 0.5, rtol=0.0, atol=1e-12)
    assert_close(traj.t[-1], 1.0, rtol=0.0, atol=1e-12)
    _assert_matches_mujoco_rk4(m, q, v, ctrl, traj.final.qpos, traj.final.qvel)


def _pendula_batch(seed, speed):
    """Two random states of pendula.xml as one batched JointState, and the states."""
    m = _mujoco_model(DATA / "pendula.xml")
    rng = np.random.default_rng(seed)
    states = [_random_state(m, rng, speed=speed) for _ in range(2)]
    qs, vs = np.stack([s[0] for s in states]), np.stack([s[1] for s in states])
    return m, rbjax.JointState(np.zeros(2), qs, vs), states


def test_rk4_trajectories_of_a_batch_of_pendula_match_mujoco_rk4():
    """pendula.xml (free bodies, balls, slides, stacked joints, branches, armature, gravity
    compensation, springs and dampers on every joint): a batch of two random states with
    full-range random controls, integrated in chunks of one system (batch_chunk=1), each
    equal to MuJoCo's RK4 after 1 s to 1e-8 of the scale, as in the humanoid's test. The
    largest difference is a ball's angular velocity (|q̇| ≤ 22 rad/s): 1.3e-8 at dt = 2 ms,
    8.2e-10 at 1 ms, 5.1e-11 at 0.5 ms (measured): RK4's O(h⁴) on the quaternion, not
    round-off."""
    m, state, states = _pendula_batch(7, 0.5)
    ctrl = states[0][2]
    model = _with_controls(_joint_model_of(DATA / "pendula.xml"), ctrl)
    traj = rbjax.rollout(model, state, _DT, _STEPS, save_every=_SAVE, batch_chunk=1)
    assert traj.qpos.shape == (2, _STEPS // _SAVE + 1, m.nq)
    assert traj.t.shape == (2, _STEPS // _SAVE + 1)
    assert np.all(np.asarray(traj.result) == int(rbjax.RESULTS.successful))
    for k, (q, v, _) in enumerate(states):
        _assert_matches_mujoco_rk4(m, q, v, ctrl, traj.final.qpos[k], traj.final.qvel[k])


def test_energy_of_a_conservative_tree_is_conserved():
    """pendula.xml without damping, springs and controls is conservative (gravity and gravity
    compensation: a constant force −c m g at each centre of mass, potential (1 − c) m |g| z):
    E = ½ q̇ᵀ M q̇ + Σ (1 − c_b) m_b |g| z_b, evaluated by MuJoCo (mj_fullM, xipos) at the
    saved states of 1 s RK4 rollouts from two random states, drifts by less than 1e-7 of the
    energy's scale (the sum of the magnitudes of its terms; measured 6e-10). Free bodies,
    balls, slides, stacked joints, armature and gravity compensation all take part."""
    m, state, _ = _pendula_batch(11, 1.0)
    m.dof_damping[:] = 0.0
    m.jnt_stiffness[:] = 0.0
    model = _joint_model_of(DATA / "pendula.xml")  # the batched test's program: no compilation
    model = eqx.tree_at(
        lambda t: (t.damping, t.stiffness),
        model,
        (jnp.zeros_like(model.damping), jnp.zeros_like(model.stiffness)),
    )
    model = _with_controls(model, np.zeros(m.nu))
    traj = rbjax.rollout(model, state, _DT, _STEPS, save_every=_SAVE, batch_chunk=1)
    d = mujoco.MjData(m)
    weight = (1.0 - m.body_gravcomp) * m.body_mass * np.linalg.norm(m.opt.gravity)
    for qpos_k, qvel_k in zip(np.array(traj.qpos), np.array(traj.qvel), strict=True):
        energies, scales = [], []
        for qpos, qvel in zip(qpos_k, qvel_k, strict=True):
            for a, b in _quaternion_rows(m):
                qpos[a:b] /= np.linalg.norm(qpos[a:b])
            d.qpos[:], d.qvel[:] = qpos, qvel
            mujoco.mj_forward(m, d)
            M = np.zeros((m.nv, m.nv))
            mujoco.mj_fullM(m, d, M)
            kinetic, potential = 0.5 * qvel @ M @ qvel, weight * d.xipos[:, 2]
            energies.append(kinetic + potential.sum())
            scales.append(kinetic + np.abs(potential).sum())
        drift = np.abs(np.array(energies) - energies[0]).max() / scales[0]
        assert drift < 1e-7, drift


@functools.cache
def _loaded_tree(name):
    """rbjax.load(examples/models/<name>, formulation=JointCoordinates()).model, once per file
    (the public loading path; one static structure, so its rollout compiles once)."""
    return rbjax.load(MODELS / name, formulation=rbjax.JointCoordinates()).model


_SHORT = (200, 20)  # steps, save_every of the rollouts of the double pendulum and arm7


def _start(name, seed):
    """A random (qpos, qvel) of an examples/models file (hinges only)."""
    m = mujoco.MjModel.from_xml_path(str(MODELS / name))
    q, v, _ = _random_state(m, np.random.default_rng(seed))
    return q, v, m.opt.timestep


@pytest.mark.parametrize("name, tol", [("double_pendulum.xml", 1e-11), ("arm7.xml", 1e-8)])
def test_joint_coordinates_and_maximal_coordinates_give_the_same_motion(name, tol):
    """The same file loaded both ways (rbjax.load default: bodies with joint constraints;
    formulation=JointCoordinates(): the tree's coordinates), the same initial qpos/qvel,
    200 RK4 steps: the joint coordinates of the maximal trajectory
    (``Loaded.joint_space()``) equal the JointModel's qpos/qvel at every saved state.

    Both are RK4 discretisations of the same motion in different coordinates, so they differ
    by RK4's O(h⁴), not by round-off: measured on arm7 (random state, |q̇| ~ 1 rad/s) 4.6e-9
    at dt = 1 ms and 2.8e-10 at 0.5 ms (ratio 16.6), while the JointModel matches MuJoCo's
    RK4 to 5e-15 at both steps; 5.7e-13 on the double pendulum."""
    q, v, dt = _start(name, 5)
    steps, every = _SHORT
    maximal = rbjax.load(MODELS / name, qpos=q, qvel=v, formulation=rbjax.ScalableDAE())
    joint = rbjax.rollout(
        _loaded_tree(name), rbjax.JointState(0.0, q, v), dt, steps, save_every=every
    )
    traj = rbjax.rollout(maximal.model, maximal.state, dt, steps, save_every=every)
    space = maximal.joint_space()
    qpos, qvel = eqx.filter_jit(jax.vmap(lambda s: (space.positions(s), space.velocities(s))))(
        traj.states
    )
    angle = np.asarray(qpos) - np.asarray(joint.qpos)
    angle = (angle + np.pi) % (2 * np.pi) - np.pi  # the maximal state holds principal values
    assert_close(angle, 0.0, rtol=0.0, atol=tol, err_msg="qpos")
    assert_close(qvel, joint.qvel, rtol=0.0, atol=10 * tol, err_msg="qvel")
    assert_close(joint.t, traj.t, rtol=0.0, atol=1e-15)


def test_gradients_through_a_rollout_match_finite_differences():
    """d(loss)/d(body masses, initial qvel) of a 100-step RK4 rollout of the double pendulum:
    reverse mode (jit(grad)) and forward mode (jvp along each parameter) equal central
    differences of the loss. One program, jit(vmap(jvp(loss))), evaluates the forward-mode
    derivatives at p₀ and the loss at the perturbed parameters p₀ ± ε eᵢ together."""
    model = _loaded_tree("double_pendulum.xml")
    q, v, dt = _start("double_pendulum.xml", 9)

    def loss(p):
        m = eqx.tree_at(lambda t: t.mass, model, p[:2])
        traj = rbjax.rollout(m, rbjax.JointState(0.0, q, p[2:]), dt, 100, save_every=100)
        final = traj.final
        weights = jnp.array([1.0, -0.5])
        return jnp.sum(jnp.sin(final.qpos) * weights) + 0.1 * jnp.sum(final.qvel**2)

    p0 = jnp.concatenate([model.mass, jnp.asarray(v)])
    reverse = jax.jit(jax.grad(loss))(p0)
    eps, eye = 1e-5, jnp.eye(4)
    points = jnp.concatenate([jnp.tile(p0, (4, 1)), p0 + eps * eye, p0 - eps * eye])
    tangents = jnp.concatenate([eye, jnp.zeros((8, 4))])
    values, derivatives = jax.jit(jax.vmap(lambda p, t: jax.jvp(loss, (p,), (t,))))(
        points, tangents
    )
    forward = derivatives[:4]
    central = (values[4:8] - values[8:]) / (2 * eps)
    assert np.all(np.abs(np.asarray(reverse)) > 1e-3)  # every parameter matters
    assert_close(reverse, central, rtol=1e-7, atol=1e-9, err_msg="reverse mode")
    assert_close(forward, reverse, rtol=1e-11, atol=1e-13, err_msg="forward mode")


def _free_box():
    """One free body, built by hand (nq = 7, nv = 6)."""
    return rbjax.JointModel(
        names=("box",),
        parent=(-1,),
        body_pos=np.zeros((1, 3)),
        body_quat=[[1.0, 0.0, 0.0, 0.0]],
        mass=[1.0],
        com=np.zeros((1, 3)),
        inertia=[np.diag([1.0, 2.0, 3.0])],
        joint_types=("free",),
        joint_body=(0,),
    )


def test_bad_states_and_options_are_refused_by_name():
    """ValueError with "Fix:" before anything is compiled: a state of the wrong size, a
    non-unit quaternion (its length named, also when it is a later member of a batch), a
    non-finite coordinate, a maximal-coordinate State, an integrator that joint coordinates
    do not have."""
    model = _free_box()
    good = rbjax.JointState(0.0, model.qpos0, np.zeros(6))
    cases = [
        ((rbjax.JointState(0.0, np.zeros(6), np.zeros(6)), {}), "the model has nq = 7, nv = 6"),
        ((rbjax.JointState(0.0, np.zeros(7), np.zeros(7)), {}), "qvel (7,)"),
        (
            (rbjax.JointState(0.0, [0.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0], np.zeros(6)), {}),
            "quaternion of free joint 'joint0') has length 2, not 1",
        ),
        (  # the offending member of a batch, not the first one
            (rbjax.JointState(0.0, [model.qpos0, [0, 0, 0, 0, 3.0, 0, 0]], np.zeros((2, 6))), {}),
            "has length 3, not 1",
        ),
        (
            (rbjax.JointState(0.0, [0.0, 0.0, 0.0, np.nan, 0.0, 0.0, 0.0], np.zeros(6)), {}),
            "state0.qpos",
        ),
        ((rbjax.make_state(), {}), "is not an rbjax.JointState"),
        ((good, {"integrator": rbjax.ImplicitMidpoint()}), "ImplicitMidpoint()"),
    ]
    for (state, options), message in cases:
        with pytest.raises(ValueError, match=re.escape(message)) as err:
            rbjax.rollout(model, state, 1e-3, 10, **options)
        assert "Fix:" in str(err.value)


def test_joint_model_refuses_bad_structure_by_name():
    """JointModel(...) raises ValueError with "Fix:" naming the field: a parent listed after
    its child, a free joint on a child body, an unknown joint type, joints out of body order,
    an array of the wrong shape, a zero hinge axis."""

    def two_bodies(parent=(-1, 0), types=("hinge", "hinge"), bodies=(0, 1), **kw):
        fields = dict(
            names=("a", "b"),
            parent=parent,
            body_pos=np.zeros((2, 3)),
            body_quat=[[1.0, 0.0, 0.0, 0.0]] * 2,
            mass=[1.0, 1.0],
            com=np.zeros((2, 3)),
            inertia=[np.eye(3)] * 2,
            joint_types=types,
            joint_body=bodies,
        )
        return rbjax.JointModel(**(fields | kw))

    two_bodies()  # the valid model
    cases = [
        ({"parent": (1, -1)}, "parent[0] = 1 ('a') is not the world"),
        ({"types": ("hinge", "free")}, "joint 'joint1' is free on body 'b', which has a parent"),
        ({"types": ("hinge", "screw")}, "joint_types[1] = 'screw'"),
        ({"parent": (-1, -1), "bodies": (1, 0)}, "joint_body is not in body order"),
        ({"mass": [1.0, 2.0, 3.0]}, "mass = [1., 2., 3.] has shape (3,), expected (2,)"),
        ({"joint_axis": [[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]}, "joint_axis[1]"),
    ]
    for kw, message in cases:
        with pytest.raises(ValueError, match=re.escape(message)) as err:
            two_bodies(**kw)
        assert "Fix:" in str(err.value)


def _spring_slide(stiffness, damping=0.0, armature=0.0):
    """A body of mass 1 on a slide along x with a spring to 0: ẍ = −(k x + c ẋ)/(1 + a)."""
    return rbjax.JointModel(
        names=("cart",),
        parent=(-1,),
        body_pos=np.zeros((1, 3)),
        body_quat=[[1.0, 0.0, 0.0, 0.0]],
        mass=[1.0],
        com=np.zeros((1, 3)),
        inertia=[np.eye(3)],
        joint_types=("slide",),
        joint_body=(0,),
        joint_axis=[[1.0, 0.0, 0.0]],
        stiffness=[stiffness],
        damping=[damping],
        armature=[armature],
        gravity=(0.0, 0.0, 0.0),
    )


def test_a_blow_up_is_reported_at_its_step():
    """RK4 at dt = 1 s on an oscillator of ω = 100 rad/s grows by |R(100 i)| ≈ 4e6 per step
    until it overflows. A batch of two systems, one at rest at x = 0 (it stays there) and one
    from x₀ = 1e-3: with throw=False the second reports RESULTS.nonfinite at the step where
    NumPy's RK4 of ẍ = −ω² x first overflows and the first succeeds, its states all finite;
    with throw=True (the default) the rollout raises EquinoxRuntimeError naming that step and
    the system. (x₀ = 1e-3 puts the last finite step four decades below overflow and the
    failing one two above: no rounding can move it.) monitors=None: with them, the energy
    monitor reports the growth as implausible at the first saved state (step 9), before the
    overflow this test locates."""
    model, omega2, h = _spring_slide(1e4), 1e4, 1.0
    state = rbjax.JointState(np.zeros(2), [[0.0], [1e-3]], [[0.0], [0.0]])
    traj = rbjax.rollout(model, state, h, 60, save_every=10, throw=False, monitors=None)
    x, expected = np.array([1e-3, 0.0]), None
    f = lambda y: np.array([y[1], -omega2 * y[0]])  # noqa: E731
    with np.errstate(over="ignore", invalid="ignore"):
        for k in range(60):
            k1 = f(x)
            k2 = f(x + h / 2 * k1)
            k3 = f(x + h / 2 * k2)
            k4 = f(x + h * k3)
            x = x + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
            if not np.all(np.isfinite(x)):
                expected = k
                break
    assert expected is not None
    nonfinite = int(rbjax.RESULTS.nonfinite)
    assert np.asarray(traj.result).tolist() == [int(rbjax.RESULTS.successful), nonfinite]
    assert np.asarray(traj.failed_step).tolist() == [-1, expected]
    assert np.all(np.asarray(traj.qpos[0]) == 0.0)
    assert np.all(np.isfinite(np.asarray(traj.qpos[1, : expected // 10 + 1])))
    assert not np.all(np.isfinite(np.asarray(traj.qpos[1, -1])))
    with pytest.raises(eqx.EquinoxRuntimeError, match=rf"at step {expected} \(system 1") as err:
        rbjax.rollout(model, state, h, 60, save_every=10, monitors=None)
    assert "Fix:" in str(err.value)


def test_semi_implicit_euler_is_the_symplectic_euler_recurrence():
    """rbjax.SemiImplicitEuler on a damped spring with armature is v⁺ = v + h (−k x − c v)/(m
    + a), x⁺ = x + h v⁺, step by step (the recurrence in NumPy). Asked for multipliers, a
    tree without equalities has none: ``lam`` has zero columns at every saved state."""
    k, c, a, h, n = 100.0, 0.3, 0.25, 0.01, 20
    model = _spring_slide(k, c, a)
    traj = rbjax.rollout(
        model,
        rbjax.JointState(0.0, [0.2], [-1.0]),
        h,
        n,
        save_every=1,
        integrator=rbjax.SemiImplicitEuler(),
        multipliers=True,
    )
    assert traj.lam is not None and traj.lam.shape == (n + 1, 0)
    x, v, xs, vs = 0.2, -1.0, [0.2], [-1.0]
    for _ in range(n):
        v = v + h * (-k * x - c * v) / (1.0 + a)
        x = x + h * v
        xs.append(x)
        vs.append(v)
    assert_close(traj.qpos[:, 0], xs, rtol=1e-13, atol=1e-15)
    assert_close(traj.qvel[:, 0], vs, rtol=1e-13, atol=1e-15)


def test_float32_rollout_follows_float64():
    """The double pendulum loaded with dtype=float32: the model's arrays, the state and the
    whole trajectory are float32, and 200 RK4 steps stay within 1e-3 of float64."""
    q, v, dt = _start("double_pendulum.xml", 5)
    steps, every = _SHORT
    single = rbjax.load(
        MODELS / "double_pendulum.xml",
        qpos=q,
        qvel=v,
        dtype=jnp.float32,
        formulation=rbjax.JointCoordinates(),
    )
    floats = [x for x in jax.tree.leaves(single.model) if jnp.issubdtype(x.dtype, jnp.floating)]
    assert floats and all(x.dtype == jnp.float32 for x in floats)
    assert single.state.qpos.dtype == single.state.qvel.dtype == jnp.float32
    traj32 = rbjax.rollout(single.model, single.state, dt, steps, save_every=every)
    traj64 = rbjax.rollout(
        _loaded_tree("double_pendulum.xml"),
        rbjax.JointState(0.0, q, v),
        dt,
        steps,
        save_every=every,
    )
    assert traj32.qpos.dtype == traj32.qvel.dtype == traj32.t.dtype == jnp.float32
    assert int(traj32.result) == int(rbjax.RESULTS.successful)
    assert_close(traj32.qpos, traj64.qpos, rtol=0.0, atol=1e-3)
    assert_close(traj32.qvel, traj64.qvel, rtol=0.0, atol=1e-3)


def test_loading_a_file_the_maximal_loader_refuses():
    """MuJoCo's MJX humanoid has two and three hinges on one body (ankles, hips, shoulders):
    the maximal-coordinate loader refuses it ("has no exact rbjax joint"), while joint
    coordinates (the default for a tree, or formulation=JointCoordinates()) load it with MuJoCo's qpos/qvel as the state, its
    timestep, and a warning naming what is not simulated (contacts, joint limits)."""
    path = DATA / "mujoco_humanoid.xml"
    with pytest.raises(ValueError, match="has no exact rbjax joint") as err:
        rbjax.load(path, formulation=rbjax.ScalableDAE())
    assert "Fix:" in str(err.value)
    with pytest.warns(UserWarning, match="contacts") as caught:
        loaded = rbjax.load(path, formulation=rbjax.JointCoordinates())
    assert "joint limits" in str(caught[0].message)
    m = mujoco.MjModel.from_xml_path(str(path))
    assert isinstance(loaded.model, rbjax.JointModel)
    assert (loaded.model.nq, loaded.model.nv, loaded.model.nb) == (m.nq, m.nv, m.nbody - 1)
    assert isinstance(loaded.state, rbjax.JointState)
    assert_close(loaded.state.qpos, m.qpos0, rtol=0.0, atol=0.0)
    assert_close(loaded.state.qvel, np.zeros(m.nv), rtol=0.0, atol=0.0)
    assert loaded.timestep == m.opt.timestep
    names = [mujoco.mj_id2name(m, mujoco.mjtObj.mjOBJ_JOINT, j) for j in range(m.njnt)]
    assert list(loaded.model.joint_names) == names
    with pytest.raises(ValueError, match="no rbjax counterpart") as err:
        rbjax.load(path, formulation=rbjax.JointCoordinates(), unsupported="error")
    assert "Fix:" in str(err.value)


def test_batched_parameters_are_refused_and_equal_trees_share_a_program():
    """A JointModel's parameters are one system's: a leading batch axis on them is refused by
    name (with the jax.vmap fix) instead of failing inside the dynamics; two loads of one file
    have equal (hashable) structure, so their rollouts share one compiled program."""
    a = rbjax.load(MODELS / "double_pendulum.xml", formulation=rbjax.JointCoordinates())
    b = rbjax.load(MODELS / "double_pendulum.xml", formulation=rbjax.JointCoordinates())
    assert a.model.topology == b.model.topology
    assert hash(a.model.topology) == hash(b.model.topology)
    two = eqx.tree_at(lambda m: m.mass, a.model, jnp.stack([a.model.mass, 2 * a.model.mass]))
    with pytest.raises(ValueError, match=r"mass carry batch axes.*Fix: .*jax\.vmap"):
        rbjax.rollout(two, a.state, 1e-3, 2)


# A light three-link arm on stiff position servos without armature, at a robot file's usual
# 2 ms step: M⁻¹ ∂τ/∂q̇ of the last link is about 1.5e4 1/s, so h·|λ| ≈ 30 and RK4 diverges.
_STIFF_ARM = """
<mujoco model="stiff servo arm">
  <option timestep="0.002" integrator="implicitfast"><flag contact="disable"/></option>
  <worldbody>
    <body name="l1" pos="0 0 0.3">
      <joint name="j1" axis="0 0 1" damping="0.5"/>
      <geom type="capsule" fromto="0 0 0 0.2 0 0" size="0.03" mass="0.3"/>
      <body name="l2" pos="0.2 0 0">
        <joint name="j2" axis="0 1 0" damping="0.2"/>
        <geom type="capsule" fromto="0 0 0 0.15 0 0" size="0.02" mass="0.1"/>
        <body name="l3" pos="0.15 0 0">
          <joint name="j3" axis="1 0 0" damping="0.05"/>
          <geom type="box" size="0.02 0.01 0.01" mass="0.02"/>
        </body>
      </body>
    </body>
  </worldbody>
  <actuator>
    <position name="p1" joint="j1" kp="400" kv="20"/>
    <position name="p2" joint="j2" kp="200" kv="10"/>
    <position name="p3" joint="j3" kp="50" kv="2" forcerange="-3 3"/>
  </actuator>
</mujoco>
"""


def _mujoco_steps(m, q, v, ctrl, integrator, n):
    m.opt.integrator = integrator
    d = mujoco.MjData(m)
    d.qpos[:], d.qvel[:], d.ctrl[:] = q, v, ctrl
    for _ in range(n):
        mujoco.mj_step(m, d)
    return d.qpos.copy(), d.qvel.copy()


def test_implicit_fast_runs_stiff_servos_at_their_timestep_as_mujoco_does(tmp_path):
    """rbjax.ImplicitFast is MuJoCo's implicitfast ((M − h ∂τ/∂q̇) q̈ = τ − b, semi-implicit
    Euler, quaternions turned by exp(h ω/2)): on a stiff servo arm at its own 2 ms step, 1 s
    from a random state with a clamped actuator force, it follows MuJoCo's implicitfast to
    round-off, where RK4 at the same step turns non-finite (MuJoCo's RK4 diverges too: it
    reports instability and resets). On MJX's humanoid (ball and free joints, motors) it
    follows MuJoCo's implicitfast over 0.2 s."""
    path = tmp_path / "stiff_arm.xml"
    path.write_text(_STIFF_ARM)
    m = _mujoco_model(path)
    rng = np.random.default_rng(11)
    q = m.qpos0 + rng.uniform(-0.3, 0.3, m.nq)
    v, ctrl = rng.normal(size=m.nv), rng.uniform(-0.5, 0.5, m.nu)
    L = rbjax.load(path, qpos=q, qvel=v, control=ctrl, formulation=rbjax.JointCoordinates())
    dt, n = 0.002, 500
    tr = rbjax.rollout(L.model, L.state, dt, n, save_every=n, integrator=rbjax.ImplicitFast())
    qm, vm = _mujoco_steps(m, q, v, ctrl, mujoco.mjtIntegrator.mjINT_IMPLICITFAST, n)
    _close_to_scale(tr.qpos[-1], qm, 1e-12, "qpos")
    _close_to_scale(tr.qvel[-1], vm, 1e-12, "qvel")
    rk = rbjax.rollout(L.model, L.state, dt, n, save_every=n, throw=False)
    assert int(rk.result) == int(rbjax.RESULTS.nonfinite) and int(rk.failed_step) < 50

    m = _mujoco_model(DATA / "mujoco_humanoid.xml")
    q, v, ctrl = _random_state(m, np.random.default_rng(12), speed=0.5)
    ctrl = 0.1 * ctrl
    model = _with_controls(_joint_model_of(DATA / "mujoco_humanoid.xml"), ctrl)
    m.opt.timestep = dt = 0.005
    tr = rbjax.rollout(
        model, rbjax.JointState(0.0, q, v), dt, 40, save_every=40, integrator=rbjax.ImplicitFast()
    )
    qm, vm = _mujoco_steps(m, q, v, ctrl, mujoco.mjtIntegrator.mjINT_IMPLICITFAST, 40)
    _close_to_scale(tr.qpos[-1], qm, 1e-10, "qpos")
    _close_to_scale(tr.qvel[-1], vm, 1e-10, "qvel")


def test_implicit_fast_is_refused_by_maximal_coordinates():
    L = rbjax.load(MODELS / "double_pendulum.xml", formulation=rbjax.ScalableDAE())
    with pytest.raises(ValueError, match="ImplicitFast.*joint coordinates only.*Fix:"):
        rbjax.rollout(L.model, L.state, 1e-3, 2, integrator=rbjax.ImplicitFast())


def test_analyses_on_maximal_coordinates_refuse_a_joint_model_by_name(tmp_path):
    """Every public function that reads bodies' maximal coordinates refuses a JointModel with
    a ValueError naming it and the fix, instead of an AttributeError from deep inside (the
    energies, momenta and energy_balance take a JointModel: tests/test_joint_invariants.py)."""
    L = rbjax.load(MODELS / "double_pendulum.xml", formulation=rbjax.JointCoordinates())
    # a maximal State of the same file: the state arguments pass their type checks, so that
    # what is refused is the model
    m, s = (
        L.model,
        rbjax.load(MODELS / "double_pendulum.xml", formulation=rbjax.ScalableDAE()).state,
    )
    calls = {
        "rbjax.change_points": lambda: rbjax.change_points(m, s),
        "rbjax.gradient_health": lambda: rbjax.gradient_health(
            m, s, 1e-3, 2, lambda tr: tr.t.sum()
        ),
        "rbjax.nonfinite_gradient": lambda: rbjax.nonfinite_gradient(
            m, s, 1e-3, 2, lambda tr: tr.t.sum()
        ),
        "rbjax.JointSpace": lambda: rbjax.JointSpace(m),
        "rbjax.joint_coordinates": lambda: rbjax.joint_coordinates(m, s),
        "rbjax.state_from_joint_coordinates": lambda: rbjax.state_from_joint_coordinates(
            m, L.state.qpos, L.state.qvel
        ),
        "rbjax.kinematic_analysis": lambda: rbjax.kinematic_analysis(m, s, np.zeros(2)),
        "rbjax.mobility": lambda: rbjax.mobility(m, s),
        "rbjax.accelerations": lambda: rbjax.accelerations(m, s),
        "rbjax.weld_reactions": lambda: rbjax.weld_reactions(m, s),
        "rbjax.save": lambda: rbjax.save(tmp_path / "x.toml", m, s),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError, match=rf"{re.escape(name)}: model is a JointModel.*Fix:"):
            call()
    with pytest.raises(ValueError, match="JointModel is not an rbjax.Model. Fix: .*maximal"):
        rbjax.step(m, s, 1e-3)
    with pytest.raises(ValueError, match="reactions: model is a JointModel but state is a State"):
        rbjax.reactions(m, s)
    with pytest.raises(ValueError, match="assemble: model is a JointModel but state is a State"):
        rbjax.assemble(m, s)


class _Kink(eqx.Module):
    """τ = c (|x| − |x|) with |x| = √(x²): zero everywhere, its derivative NaN at x = 0
    (JAX differentiates √ at 0 as ∞; ∞ − ∞), finite elsewhere."""

    c: jax.Array

    def __call__(self, t, qpos, qvel):
        r = jnp.sqrt(qpos * qpos)
        return self.c * (r - r)


def test_check_gradients_names_the_step_of_a_nonfinite_gradient():
    """A slide at constant speed (dyadic numbers: x_k = −0.5 + k/8 exactly) under a force
    whose value is zero and whose derivative is NaN only at x = 0, reached at step 4 (the
    semi-implicit Euler step that starts there). Plain jax.grad of the final position with
    respect to the force's parameter is NaN; with check_gradients=True the rollout's backward
    pass raises naming step 4 (also under jax.jit); a NaN from the loss itself (√0 of the
    final position's distance to 0.5) is named as the loss's. Where the motion misses the
    kink (x₀ = −0.45) the checked gradient equals the unchecked one: 0 (the force does
    nothing)."""
    model = eqx.tree_at(lambda m: m.forces, _spring_slide(0.0), (_Kink(jnp.asarray(1.0)),))
    s0 = rbjax.JointState(0.0, [-0.5], [1.0])
    semi = rbjax.SemiImplicitEuler()

    def final(check, state, loss=lambda tr: tr.final.qpos[0]):
        def f(c):
            m = eqx.tree_at(lambda mm: mm.forces[0].c, model, c)
            tr = rbjax.rollout(
                m, state, 0.125, 8, integrator=semi, monitors=None, check_gradients=check
            )
            return loss(tr)

        return f

    c = jnp.asarray(1.0)
    assert np.isnan(float(jax.grad(final(False, s0))(c)))
    # raised inside the compiled backward pass of the rollout's loop: JAX's runtime error,
    # carrying equinox's message
    errors = (eqx.EquinoxRuntimeError, jax.errors.JaxRuntimeError)
    for transform in (jax.grad, lambda f: jax.jit(jax.grad(f))):
        with pytest.raises(errors, match=r"backward pass of step 4 \(of 8;"):
            transform(final(True, s0))(c)
    root = lambda tr: jnp.sqrt(tr.final.qpos[0] - 0.5)  # noqa: E731  (x_8 = 0.5)
    with pytest.raises(eqx.EquinoxRuntimeError, match="derivative of the loss with respect"):
        jax.grad(final(True, s0, root))(c)
    off = rbjax.JointState(0.0, [-0.45], [1.0])
    g = jax.grad(final(True, off))(c)
    assert float(g) == float(jax.grad(final(False, off))(c)) == 0.0


def test_position_update_is_differentiable_where_a_free_joint_stops_turning():
    """ImplicitFast's q ⊕ h q̇ (rbjax/_tree/implicit.py) at ω = 0 of a free joint: its
    derivative with respect to q̇ is finite and equals central differences (the rotation
    q ⊗ exp(hω/2) turns at h/2 per unit ω there; the norm's derivative was 0/0, NaN)."""
    from rbjax._tree.implicit import integrate_positions

    model = _free_box()
    h = 0.01
    qpos = jnp.asarray(model.qpos0)[:, None]
    step = lambda v: integrate_positions(model.topology, qpos, v[:, None], h)[:, 0]  # noqa: E731
    jac = np.asarray(jax.jacfwd(step)(jnp.zeros(6)))
    eps = 1e-6
    fd = np.stack(
        [(step(jnp.eye(6)[k] * eps) - step(-jnp.eye(6)[k] * eps)) / (2 * eps) for k in range(6)],
        axis=1,
    )
    assert np.all(np.isfinite(jac))
    np.testing.assert_allclose(jac, fd, rtol=0, atol=1e-9)
    assert np.abs(jac[3:, 3:]).max() == pytest.approx(0.5 * h)
