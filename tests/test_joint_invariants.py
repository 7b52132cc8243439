"""Bodies, energies and momenta of a JointModel (rbjax/_tree/bodies.py, rbjax/_tree/energy.py,
and the JointModel branch of rbjax/_analysis/invariants.py), against independent references:

* MuJoCo: ``xpos``/``xquat``/``xipos`` (mj_kinematics, mj_comPos), ``mj_objectVelocity``,
  ``energy`` (mjENBL_ENERGY: ½ q̇ᵀ M q̇ and gravity plus joint springs) and the whole-model
  momentum of ``mj_subtreeVel``, at random states with random springs and gravity
  compensation;
* the equations of motion: −∂V/∂q is the springs' and gravity's generalized force, and
  dE/dt along the dynamics (a jvp through M⁻¹(τ − b)) is the non-conservative power;
* conservation laws along RK4 rollouts: energy without damping, its decrease with damping,
  linear and angular momentum of a free-floating humanoid without gravity;
* the maximal-coordinate formulation of the same file (rbjax.load default).

Compile time dominates: each check group is one jitted program (per model), the models are
small or shared, and the rollouts share their program (a model's numbers are leaves).
"""

import functools
import pathlib
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close

import rbjax
from rbjax._tree import bodies, energy
from rbjax._tree.dynamics import qpos_rate

mujoco = pytest.importorskip("mujoco")
from rbjax._io.mujoco_tree import build_tree_from_mujoco  # noqa: E402

DATA = pathlib.Path(__file__).resolve().parent / "data"
MODELS = pathlib.Path(__file__).resolve().parents[1] / "examples" / "models"

_OFF = (
    int(mujoco.mjtDisableBit.mjDSBL_CONTACT)
    | int(mujoco.mjtDisableBit.mjDSBL_LIMIT)
    | int(mujoco.mjtDisableBit.mjDSBL_CONSTRAINT)
)


def _mujoco_model(path, rng=None):
    """The compiled file without contacts, limits and tendon springs (what the tree does not
    simulate), its energy on; with ``rng``: random joint stiffness, spring rest positions
    (unit quaternions for balls and free joints) and gravity compensation, so that every
    term of the potential takes part."""
    m = mujoco.MjModel.from_xml_path(str(path))
    m.opt.disableflags |= _OFF
    m.opt.enableflags |= int(mujoco.mjtEnableBit.mjENBL_ENERGY)
    m.tendon_stiffness[:] = 0.0
    if rng is not None:
        m.jnt_stiffness[:] = rng.uniform(0.5, 5.0, m.njnt)
        m.qpos_spring[:] = _random_state(m, rng)[0]
        m.body_gravcomp[1:] = rng.uniform(0.0, 1.5, m.nbody - 1)
    return m


def _joint_model(m, control=None):
    # the loader's warnings name what it does not simulate: contacts and limits (off in
    # MuJoCo too), actuators on balls and tendons, which no quantity here reads
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, _, _, _ = build_tree_from_mujoco(
            m, control=control, formulation=rbjax.JointCoordinates()
        )
    return model


def _random_state(m, rng, speed=1.0):
    """Random qpos (hinges and slides within ±1 of qpos0, unit quaternions, free positions
    ~N(0, 1)) and qvel ~N(0, speed²)."""
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
    return q, speed * rng.normal(size=m.nv)


def _random_states(m, rng, k):
    states = [_random_state(m, rng) for _ in range(k)]
    return np.stack([s[0] for s in states]), np.stack([s[1] for s in states])


@eqx.filter_jit
def _everything(model, state):
    """All the body quantities and invariants of a batch of states: one program per model."""
    xpos, xquat = bodies.natural_body_poses(model, state.qpos)
    com = bodies.natural_body_com(model, state.qpos)
    v, w = bodies.natural_body_velocities(model, state.qpos, state.qvel)
    return dict(
        xpos=xpos,
        xquat=xquat,
        com=com,
        v=v,
        w=w,
        kinetic=rbjax.kinetic_energy(model, state),
        potential=rbjax.potential_energy(model, state),
        total=rbjax.total_energy(model, state),
        p=rbjax.linear_momentum(model, state),
        L=rbjax.angular_momentum(model, state),
    )


_FILES = [MODELS / "arm7.xml", DATA / "mujoco_humanoid.xml", MODELS / "humanoid.xml"]


@pytest.mark.parametrize("seed, path", list(enumerate(_FILES)), ids=[p.name for p in _FILES])
def test_bodies_energies_and_momenta_match_mujoco(seed, path):
    """At 3 random states (hinges, stacked hinges, balls and a free joint; random springs on
    every joint and gravity compensation on every body): body poses, centres of mass and
    velocities equal MuJoCo's xpos, xquat (up to sign), xipos and mj_objectVelocity (at the
    centre of mass, world axes); T and V equal MuJoCo's energy, whose potential leaves out
    gravity compensation (added back here as −Σ gravcomp m gᵀc); p and L about the origin
    equal mj_subtreeVel's whole-model momentum (about the centre of mass, shifted)."""
    rng = np.random.default_rng(100 + seed)
    m = _mujoco_model(path, rng)
    model = _joint_model(m)
    qpos, qvel = _random_states(m, rng, 3)
    out = _everything(model, rbjax.JointState(np.zeros(3), qpos, qvel))
    nb = m.nbody - 1
    assert out["xpos"].shape == (3, nb, 3) and out["xquat"].shape == (3, nb, 4)
    assert out["v"].shape == out["w"].shape == out["com"].shape == (3, nb, 3)
    assert out["kinetic"].shape == out["potential"].shape == (3,)
    assert out["p"].shape == out["L"].shape == (3, 3)
    d = mujoco.MjData(m)
    res = np.zeros(6)
    for k in range(3):
        d.qpos[:], d.qvel[:] = qpos[k], qvel[k]
        mujoco.mj_forward(m, d)
        mujoco.mj_subtreeVel(m, d)
        assert_close(out["xpos"][k], d.xpos[1:], rtol=0.0, atol=1e-13, err_msg="xpos")
        sign = np.sign(np.sum(np.asarray(out["xquat"][k]) * d.xquat[1:], axis=1))
        assert_close(out["xquat"][k], sign[:, None] * d.xquat[1:], rtol=0.0, atol=1e-13)
        assert_close(out["com"][k], d.xipos[1:], rtol=0.0, atol=1e-13, err_msg="xipos")
        for b in range(1, m.nbody):
            mujoco.mj_objectVelocity(m, d, mujoco.mjtObj.mjOBJ_BODY, b, res, 0)
            assert_close(out["w"][k, b - 1], res[:3], rtol=0.0, atol=1e-12, err_msg="omega")
            assert_close(out["v"][k, b - 1], res[3:], rtol=0.0, atol=1e-12, err_msg="v")
        gravcomp = np.sum(m.body_gravcomp[1:] * m.body_mass[1:] * (d.xipos[1:] @ m.opt.gravity))
        assert_close(out["kinetic"][k], d.energy[1], rtol=1e-12, atol=1e-12, err_msg="T")
        assert_close(out["potential"][k], d.energy[0] + gravcomp, rtol=1e-12, atol=1e-12)
        assert_close(out["total"][k], d.energy.sum() + gravcomp, rtol=1e-12, atol=1e-12)
        mass = m.body_subtreemass[0]
        p = mass * d.subtree_linvel[0]
        L = d.subtree_angmom[0] + np.cross(d.subtree_com[0], p)
        assert_close(out["p"][k], p, rtol=1e-12, atol=1e-12, err_msg="p")
        assert_close(out["L"][k], L, rtol=1e-12, atol=1e-12, err_msg="L")


@eqx.filter_jit
def _forces_and_rate(model, qpos, qvel):
    """For one state: the generalized forces of the model, of its springs and gravity as
    −∂V/∂q (autodiff of the potential, mapped to the velocity coordinates by q̇ = ∂q/∂u),
    the non-conservative power and forces, dE/dt along the equations of motion, and the
    gradient of V at the springs' rest position."""
    q, u = qpos[:, None], qvel[:, None]
    rate = lambda x: qpos_rate(model.topology, q, x)  # noqa: E731  (linear in u)
    grad_v = jax.grad(lambda x: energy.potential(model, x)[0])(q)
    dv = jax.vjp(rate, u)[1](grad_v)[0][:, 0]  # ∂V/∂q in the velocity coordinates
    tau = model.generalized_forces(jnp.zeros(1), q, u)[:, 0]
    tau_nc = energy.nonconservative_forces(model, jnp.zeros(1), q, u)[:, 0]
    _, b = model.mass_and_bias(q, jnp.zeros_like(u))  # gravity and its compensation at rest

    def total(x, y):
        return energy.kinetic(model, x, y) + energy.potential(model, x)

    qacc = model.accelerations(jnp.zeros(1), q, u)
    dE = jax.jvp(total, (q, u), (qpos_rate(model.topology, q, u), qacc))[1][0]
    power = energy.nonconservative_power(model, jnp.zeros(1), q, u)[0]
    rest = model.qpos_spring[:, None]
    grad_rest = jax.grad(lambda x: energy.spring_potential(model, x)[0])(rest)
    return dict(
        dv=dv,
        spring=tau - tau_nc,
        gravity=b[:, 0],
        dE=dE,
        power=power,
        grad_rest=grad_rest,
        v_rest=energy.spring_potential(model, rest)[0],
    )


def test_potential_is_the_potential_of_the_springs_and_gravity_and_power_closes_the_balance():
    """pendula.xml (a free body, balls, slides, hinges, stacked joints, armature, gravity
    compensation) with random springs on every joint, random damping, controls on its
    actuators and a user force: at a random state

    * the springs' and gravity's generalized force (``generalized_forces`` less the
      non-conservative terms, plus the bias at rest, which is gravity less its compensation)
      is ∂V/∂q by autodiff of the potential: V is the potential of exactly those forces;
    * dE/dt along the equations of motion (jvp of T + V through q̈ = M⁻¹(τ − b)) is the
      non-conservative power q̇ᵀ τ_nc of damping, actuators and the user force;
    * at the springs' rest position V_s = 0 and its gradient is 0 (finite: the rotation
      angle of a ball or free joint has a removable singularity there)."""
    rng = np.random.default_rng(3)
    m = _mujoco_model(DATA / "pendula.xml", rng)
    m.dof_damping[:] = rng.uniform(0.1, 1.0, m.nv)
    control = rbjax.ControlSequence(rng.uniform(-1.0, 1.0, (1, m.nu)), dt=1.0)
    model = _joint_model(m, control)
    assert model.actuators, "the test needs actuators"
    gains = jnp.asarray(rng.uniform(-1.0, 1.0, model.nv))
    model = eqx.tree_at(lambda t: t.forces, model, (lambda t, q, v: gains * jnp.tanh(v),))
    qpos, qvel = _random_state(m, rng)
    out = _forces_and_rate(model, jnp.asarray(qpos), jnp.asarray(qvel))
    scale = float(np.abs(out["gravity"]).max() + np.abs(out["spring"]).max())
    assert_close(out["dv"], out["gravity"] - out["spring"], rtol=0.0, atol=1e-12 * scale)
    assert float(np.abs(out["spring"]).max()) > 0.1  # the springs take part
    assert abs(float(out["power"])) > 0.1  # and so do the non-conservative forces
    assert_close(out["dE"], out["power"], rtol=1e-11, atol=1e-11)
    assert np.all(np.isfinite(np.asarray(out["grad_rest"])))
    assert_close(out["grad_rest"], 0.0, rtol=0.0, atol=1e-14)
    assert_close(out["v_rest"], 0.0, rtol=0.0, atol=1e-14)


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


@eqx.filter_jit
def _invariants(model, state):
    """(T, V) (2, *batch) and (p, L) (2, *batch, 3) in one program per model and shape."""
    return jnp.stack(
        [rbjax.kinetic_energy(model, state), rbjax.potential_energy(model, state)]
    ), jnp.stack([rbjax.linear_momentum(model, state), rbjax.angular_momentum(model, state)])


@functools.cache
def _pendula_without_actuators():
    """pendula.xml without its actuators and tendons (MjSpec), so that only springs, gravity,
    gravity compensation and damping act: (MjModel, JointModel with its own damping and
    springs, the same undamped)."""
    spec = mujoco.MjSpec.from_file(str(DATA / "pendula.xml"))
    for element in list(spec.actuators) + list(spec.tendons):
        spec.delete(element)
    m = spec.compile()
    m.opt.disableflags |= _OFF
    damped = _joint_model(m)
    undamped = eqx.tree_at(lambda t: t.damping, damped, jnp.zeros_like(damped.damping))
    return m, damped, undamped


_DT, _STEPS, _SAVE = 1e-3, 1000, 50  # 1 s of RK4, shared by the pendula rollouts


def test_energy_is_conserved_without_damping_and_decreases_with_it():
    """pendula.xml without actuators (a free body, balls, slides, stacked joints, armature,
    gravity compensation and a spring on every joint, the free and ball joints' included,
    at rest in the initial configuration), 1 s of RK4 at dt = 1 ms from a random state:
    rbjax.energy_balance says "conservative" without damping and the total energy of the
    saved states (a batched JointState) drifts by less than 2e-9 of its scale (the sum of
    the magnitudes of T and V; measured 4.7e-10, and 3.0e-11 at dt = 0.5 ms: RK4's O(h⁴));
    with the file's damping it says "dissipative" and the energy never increases between
    saved states and falls by more than 1 %. One rollout program for both.

    The start is one whose ball and free rotations stay below 3 rad from their springs' rest
    (asserted): MuJoCo's rotational spring τ = −k φ n reverses at φ = π, where its potential
    ½ k φ² has a kink, and RK4 stepping across it makes an energy error of O(h) per crossing
    (measured on other starts: jumps of 3.7e-4 J, 3e-7 of the scale, at dt = 1 and 0.5 ms)."""
    m, damped, undamped = _pendula_without_actuators()
    assert rbjax.energy_balance(undamped) == "conservative"
    assert rbjax.energy_balance(damped) == "dissipative"
    q, v = _random_state(m, np.random.default_rng(26))
    rest = lambda t: t.qpos_spring  # noqa: E731
    damped, undamped = (eqx.tree_at(rest, x, jnp.asarray(q)) for x in (damped, undamped))
    start = rbjax.JointState(0.0, q, v)
    energies = {}
    for name, model in (("undamped", undamped), ("damped", damped)):
        traj = rbjax.rollout(model, start, _DT, _STEPS, save_every=_SAVE)
        assert np.all(np.asarray(traj.result) == int(rbjax.RESULTS.successful))
        kinetic_potential, _ = _invariants(model, rbjax.JointState(traj.t, traj.qpos, traj.qvel))
        energies[name] = np.asarray(kinetic_potential.sum(axis=0))
        assert energies[name].shape == (_STEPS // _SAVE + 1,)
        for a, b in _quaternion_rows(m):  # the angle of q_s⁻¹ q: 2 acos |q_s · q/|q||
            quats = np.asarray(traj.qpos[:, a:b])
            cosine = np.abs(quats @ q[a:b]) / np.linalg.norm(quats, axis=-1)
            assert 2.0 * np.arccos(min(cosine.min(), 1.0)) < 3.0, (name, a)
    scale = float(np.abs(kinetic_potential[:, 0]).sum())
    drift = np.abs(energies["undamped"] - energies["undamped"][0]).max() / scale
    assert drift < 2e-9, drift
    change = np.diff(energies["damped"])
    assert np.all(change <= 1e-12 * scale), change.max()
    assert energies["damped"][-1] < energies["damped"][0] - 0.01 * scale


def test_energy_balance_of_joint_models():
    """The verdict from the model's structure and concrete values: a negative damping, an
    actuator or a user force leave no statement (None); a traced damping counts as positive."""
    _, damped, undamped = _pendula_without_actuators()
    negative = eqx.tree_at(lambda t: t.damping, undamped, undamped.damping.at[0].set(-0.1))
    assert rbjax.energy_balance(negative) is None
    forced = eqx.tree_at(lambda t: t.forces, undamped, (lambda t, q, v: jnp.zeros_like(v),))
    assert rbjax.energy_balance(forced) is None
    actuated = rbjax.load(MODELS / "arm7.xml", formulation=rbjax.JointCoordinates()).model
    assert actuated.actuators and rbjax.energy_balance(actuated) is None
    verdict = jax.jit(
        lambda d: jnp.asarray(
            rbjax.energy_balance(eqx.tree_at(lambda t: t.damping, undamped, d)) == "dissipative"
        )
    )(undamped.damping)
    assert bool(verdict)


_com = eqx.filter_jit(bodies.natural_body_com)


def test_momenta_of_a_free_floating_humanoid_are_conserved():
    """examples/models/humanoid.xml (a free torso, ball hips and shoulders, damped hinge
    knees) without gravity: every force is internal, so the bodies' linear and angular
    momentum about the origin stay constant along an RK4 rollout of a batch of two random
    states (0.2 s, dt = 1 ms; RK4 conserves neither exactly, p and L not being linear in the
    state: measured 1.1e-12 and 8e-13 of their size, 16x less at dt = 0.5 ms), and the
    whole-model centre of mass moves on the line c(t) = c(0) + t p / M.

    (MuJoCo's humanoid, with stiff springs and dampers on light limbs, drifts by 2e-6 at
    dt = 1 ms for the same reason, 1.1e-7 at 0.5 ms.)"""
    rng = np.random.default_rng(5)
    m = _mujoco_model(MODELS / "humanoid.xml")
    m.opt.gravity[:] = 0.0
    assert m.dof_damping.any() and not m.dof_damping[:6].any() and not m.jnt_stiffness[0]
    model = _joint_model(m)
    qpos, qvel = _random_states(m, rng, 2)
    start = rbjax.JointState(np.zeros(2), qpos, qvel)
    traj = rbjax.rollout(model, start, 1e-3, 200, save_every=20)
    _, (p, L) = _invariants(model, rbjax.JointState(traj.t, traj.qpos, traj.qvel))
    assert p.shape == L.shape == (2, 11, 3)
    mass = float(np.sum(m.body_mass))
    com = np.einsum("b,ktbc->ktc", model.mass, _com(model, traj.qpos)) / mass
    p0, L0 = jnp.broadcast_to(p[:, :1], p.shape), jnp.broadcast_to(L[:, :1], L.shape)
    assert_close(p, p0, rtol=0.0, atol=1e-10 * float(np.abs(p0).max()), err_msg="p")
    assert_close(L, L0, rtol=0.0, atol=1e-10 * float(np.abs(L0).max()), err_msg="L")
    line = com[:, :1] + traj.t[..., None] * p[:, :1] / mass
    assert_close(com, line, rtol=0.0, atol=1e-12, err_msg="centre of mass")


def test_both_formulations_give_the_same_energies_and_momenta():
    """examples/models/humanoid.xml (a free torso, ball hips and shoulders, hinges) loaded
    in maximal coordinates (rbjax.load's default, bodies' centres of mass and joints) and in
    joint coordinates, at the same random qpos/qvel: the same T, V, p and L (round-off), and
    the same verdict of energy_balance (its knees are damped)."""
    path = MODELS / "humanoid.xml"
    m = _mujoco_model(path)
    q, v = _random_state(m, np.random.default_rng(8))
    maximal = rbjax.load(path, qpos=q, qvel=v, formulation=rbjax.ScalableDAE())
    joint = rbjax.load(path, qpos=q, qvel=v, formulation=rbjax.JointCoordinates())
    energies_max, momenta_max = _invariants(maximal.model, maximal.state)
    energies, momenta = _invariants(joint.model, joint.state)
    assert_close(energies, energies_max, rtol=1e-12, atol=1e-12, err_msg="T, V")
    assert_close(momenta, momenta_max, rtol=1e-12, atol=1e-12, err_msg="p, L")
    assert rbjax.energy_balance(joint.model) == rbjax.energy_balance(maximal.model)
    assert rbjax.energy_balance(joint.model) == "dissipative"


def test_float32_invariants_follow_float64():
    """The double pendulum in float32 (rbjax.load(dtype=float32)): energies and momenta in
    float32, within float32 round-off of the float64 values."""
    path = MODELS / "double_pendulum.xml"
    q, v = np.array([0.7, -0.4]), np.array([1.3, -0.8])
    f64 = rbjax.load(path, qpos=q, qvel=v, formulation=rbjax.JointCoordinates())
    f32 = rbjax.load(path, qpos=q, qvel=v, formulation=rbjax.JointCoordinates(), dtype=jnp.float32)
    e64, m64 = _invariants(f64.model, f64.state)
    e32, m32 = _invariants(f32.model, f32.state)
    assert e32.dtype == m32.dtype == jnp.float32
    assert_close(e32.astype(jnp.float64), e64, rtol=1e-5, atol=1e-5)
    assert_close(m32.astype(jnp.float64), m64, rtol=1e-5, atol=1e-5)


def test_invariants_refuse_a_state_of_the_other_formulation_by_name():
    L = rbjax.load(MODELS / "double_pendulum.xml", formulation=rbjax.JointCoordinates())
    maximal_state = rbjax.load(
        MODELS / "double_pendulum.xml", formulation=rbjax.ScalableDAE()
    ).state
    with pytest.raises(
        ValueError,
        match="rbjax.kinetic_energy: the model is a JointModel but the state is a State.*Fix:",
    ):
        rbjax.kinetic_energy(L.model, maximal_state)
    wrong = rbjax.JointState(0.0, np.zeros(3), np.zeros(2))
    with pytest.raises(
        ValueError, match=r"rbjax.angular_momentum: the state has qpos \(3,\).*nq = 2.*Fix:"
    ):
        rbjax.angular_momentum(L.model, wrong)


def test_gradients_are_finite_where_a_ball_spring_is_at_rest():
    """At the humanoid's load state every ball and free joint sits at its spring's rest
    (q = q_spring): the spring torque −k θ(q) has its value and its derivative there (θ's
    Taylor branch, rbjax/_tree/forces.py), so reverse mode through the accelerations is finite
    (the norm of θ's vector part had a NaN gradient at zero), and it equals forward mode."""
    joint = rbjax.load(MODELS / "humanoid.xml", formulation=rbjax.JointCoordinates())
    model, s = joint.model, joint.state

    def f(q):
        return jnp.sum(model.qacc(0.0, q, s.qvel) ** 2)

    rev = jax.jit(jax.grad(f))(s.qpos)
    fwd = jax.jit(jax.jacfwd(f))(s.qpos)
    assert np.all(np.isfinite(np.asarray(rev)))
    assert_close(rev, fwd, rtol=1e-10, atol=1e-12)
