"""rbjax.identify on a JointModel (joint coordinates): every observation and sensor, fits,
standard errors, multiple shooting with a ball joint, build-time validation.

References the code under test did not produce: the maximal-coordinate formulation of the
same file (rbjax.load(path), an independent engine) at the mapped states; MuJoCo's own
simulation (mj_step, RK4) for the synthetic data of the fits; the true parameters.
The models are small (a hinge–ball–slide arm of three bodies, a body on a ball joint) and each
group of checks shares one compiled program.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rbjax

mujoco = pytest.importorskip("mujoco")

# a hinge, a ball and a slide (damped and sprung), centres of mass off the joint axes
ARM = """<mujoco model="arm3"><option gravity="0 0 -9.81" integrator="RK4" timestep="0.001">
<flag contact="disable"/></option><worldbody>
<body name="l1" pos="0 0 1"><joint name="j1" type="hinge" axis="0 0 1" damping="0.2"/>
<geom type="capsule" fromto="0 0 0 0.4 0 0" size="0.04"/>
<body name="l2" pos="0.4 0 0"><joint name="j2" type="ball"/>
<geom type="box" size="0.05 0.03 0.2" pos="0.02 0.01 -0.2"/>
<body name="l3" pos="0 0 -0.4">
<joint name="j3" type="slide" axis="0.3 0 1" damping="0.3" stiffness="2"/>
<geom type="sphere" size="0.06" pos="0.05 0 0"/></body></body></body></worldbody></mujoco>"""

# one body on a ball joint, spinning, with its centre of mass below the joint
TOP = """<mujoco model="top"><option gravity="0 0 -9.81" integrator="RK4" timestep="0.001">
<flag contact="disable"/></option><worldbody>
<body name="top" pos="0 0 1"><joint name="ball" type="ball" damping="0.02"/>
<geom type="box" size="0.08 0.05 0.03" pos="0.01 0.02 -0.15"/></body></worldbody></mujoco>"""


@pytest.fixture(scope="module")
def arm(tmp_path_factory):
    path = tmp_path_factory.mktemp("arm") / "arm3.xml"
    path.write_text(ARM)
    maximal = rbjax.load(path, formulation=rbjax.ScalableDAE())
    joint = rbjax.load(path, formulation=rbjax.JointCoordinates())
    return maximal, joint


def _random_states(joint, k, seed):
    """k joint states (hinge and slide displaced, a random ball rotation, random qvel)."""
    rng = np.random.default_rng(seed)
    qpos = np.tile(np.asarray(joint.state.qpos), (k, 1))
    qpos[:, 0] = rng.uniform(-2, 2, k)
    a = rng.normal(size=(k, 4))
    qpos[:, 1:5] = a / np.linalg.norm(a, axis=1, keepdims=True)
    qpos[:, 5] = rng.uniform(-0.2, 0.2, k)
    qvel = rng.normal(size=(k, joint.model.nv))
    return qpos, qvel


def _observations(k, rng):
    """Every observation and sensor type, with parameter references (keys of PARAMS)."""
    y = lambda d: rng.normal(size=(k, d))  # noqa: E731
    mask = np.ones(k, bool)
    mask[1] = False
    return [
        rbjax.Position("l2", y(3), 0.01, point="marker"),
        rbjax.Orientation("l3", np.tile([0.6, 0.0, 0.8, 0.0], (k, 1)), 0.01, mounting="mount"),
        rbjax.AngularVelocity("l2", y(3), 0.1),
        rbjax.AngularVelocity("l3", y(3), 0.1, frame="world", mask=mask),
        rbjax.Velocity("l3", y(3), 0.1),
        # the child's force, the parent's force and the parent's torque about its own point
        # of a slide (which the child's anchor has moved away from)
        rbjax.ReactionForce("j1", y(3), 1.0, bias="fbias"),
        rbjax.ReactionForce("j2", y(3), 1.0, side="i"),
        rbjax.ReactionForce("j3", y(3), 1.0, side="i", torque=True),
        rbjax.Gyro("l2", y(3), 0.1, bias="gbias", scale=(0.01, -0.02, 0.0), misalignment="mis"),
        # an accelerometer and a gyro at a lever arm on the ball joint's body (the
        # Accelerometer alone: the next test)
        rbjax.IMU("l2", y(6), (0.1, 0.2), point="lever", misalignment="mis"),
        rbjax.JointEncoder("j1", y(1), 0.01, offset="zero"),
        rbjax.JointEncoder("j3", y(1), 0.01),
        rbjax.Custom(_com_of_l3, y(3), 0.01),
    ]


def _com_of_l3(model, state):
    """The centre of mass of body l3 from either formulation (a Custom observation)."""
    if isinstance(state, rbjax.JointState):
        return model.body_com(state.qpos)[2]
    return state.q[2, 0:3]


PARAMS = {
    "marker": jnp.asarray([0.1, -0.05, 0.2]),
    "mount": jnp.asarray([0.1, 0.2, -0.3]),
    "fbias": jnp.asarray([0.5, 0.0, -0.5]),
    "gbias": jnp.asarray([0.01, 0.02, 0.03]),
    "mis": jnp.asarray([0.02, -0.01, 0.03]),
    "lever": jnp.asarray([0.03, 0.0, 0.05]),
    "zero": jnp.asarray([0.1]),
}


@eqx.filter_jit
def _residuals(model, states, obs, params):
    return [o.residual(model, states, params) for o in obs]


def test_every_observation_matches_maximal_coordinates_at_mapped_states(arm):
    """At 5 random states of the arm (a hinge, a ball and a slide), every observation and
    sensor type on the JointModel gives the whitened residuals of the maximal model of the
    same file at the mapped states (rbjax.load(path).joint_space()), to 1e-9."""
    maximal, joint = arm
    k = 5
    qpos, qvel = _random_states(joint, k, 0)
    js = maximal.joint_space()
    mapped = [js.state(jnp.asarray(qpos[i]), jnp.asarray(qvel[i]), 0.0) for i in range(k)]
    smax = jax.tree.map(lambda *a: jnp.stack(a), *mapped)
    sjoint = rbjax.JointState(jnp.zeros(k), qpos, qvel)
    obs = _observations(k, np.random.default_rng(1))
    for i, o in enumerate(obs):  # build-time checks pass on both formulations
        o.check(joint.model, joint.state, PARAMS, f"obs[{i}]")
        o.check(maximal.model, maximal.state, PARAMS, f"obs[{i}]")
    rj = _residuals(joint.model, sjoint, obs, PARAMS)
    rm = _residuals(maximal.model, smax, obs, PARAMS)
    for o, a, b in zip(obs, rj, rm, strict=True):
        assert a.shape == b.shape == (k, o.dim)
        assert np.max(np.abs(np.asarray(b))) > 0.1, type(o).__name__  # not trivially zero
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-9, err_msg=type(o).__name__)


def test_residuals_of_identify_match_maximal_coordinates_with_delays_and_masks():
    """rbjax.residuals (identify's residual vector: simulation at irregular sample times,
    delays interpolated on the step grid, masks) of the double pendulum in joint coordinates
    equals the maximal model's from the mapped initial state: the two engines integrate the
    same motion (RK4, dt = 1e-3; their discretisations differ by ~1e-11 over 0.1 s)."""
    path = "examples/models/double_pendulum.xml"
    maximal = rbjax.load(path, formulation=rbjax.ScalableDAE())
    joint = rbjax.load(path, formulation=rbjax.JointCoordinates())
    qpos, qvel = np.array([0.7, -1.1]), np.array([2.0, -3.0])
    s_joint = rbjax.JointState(0.0, qpos, qvel)
    s_max = maximal.joint_space().state(jnp.asarray(qpos), jnp.asarray(qvel), 0.0)
    times = np.array([0.0, 0.013, 0.05, 0.051, 0.1])
    rng = np.random.default_rng(2)
    y = lambda d: rng.normal(size=(times.size, d))  # noqa: E731
    obs = [
        rbjax.Position("lower", y(3), 1e-3, point=(0.0, 0.0, -0.2), delay="tau"),
        rbjax.Gyro("upper", y(3), 1e-2, delay=0.004),
        rbjax.Accelerometer(
            "lower", y(3), 1e-2, point="lever", mask=np.array([1, 1, 0, 1, 1], bool)
        ),
        rbjax.JointEncoder("elbow", y(1), 1e-3, delay="tau"),
    ]
    data = rbjax.Measurements(times, obs)
    params = {"tau": jnp.asarray(0.007), "lever": jnp.asarray([0.02, 0.01, -0.1])}

    def residuals(model, s0):  # one program each; the state's time must be concrete
        return np.asarray(
            jax.jit(lambda p: rbjax.residuals(lambda _: (model, s0), p, data, dt=1e-3))(params)
        )

    rj, rm = residuals(joint.model, s_joint), residuals(maximal.model, s_max)
    assert np.max(np.abs(rm)) > 10
    assert np.all(rj[30:45].reshape(5, 3)[2] == 0)  # the masked accelerometer sample
    scale = np.concatenate([np.tile(np.asarray(o.sigma), times.size) for o in obs])
    np.testing.assert_allclose(rj * scale, rm * scale, rtol=0, atol=1e-9)


def test_a_joint_model_build_is_validated_as_a_maximal_one(arm, tmp_path):
    """Unknown names, a free joint's reaction, the maximal joint frame, an encoder on a ball
    joint, an integrator that does not take joint coordinates, and multiple shooting with
    equalities: ValueError at build time naming the field and the fix."""
    maximal, joint = arm
    times = np.array([0.0, 0.01])
    y3 = np.zeros((2, 3))

    def first_error(L, obs, **kw):
        data = rbjax.Measurements(times, [obs])
        with pytest.raises(ValueError) as e:
            rbjax.identify(lambda p: (L.model, L.state), {"x": jnp.asarray(1.0)}, data, **kw)
        return str(e.value)

    unknown = rbjax.Position("nope", y3, 0.01)
    msg_j, msg_m = first_error(joint, unknown, dt=1e-3), first_error(maximal, unknown, dt=1e-3)
    assert msg_j == msg_m and "Fix:" in msg_j and "'nope'" in msg_j
    cases = [
        (rbjax.ReactionForce("j1", y3, 1.0, frame="joint"), {}, "frame"),
        (rbjax.JointEncoder("j2", np.zeros((2, 1)), 0.01), {}, "ball joint"),
        (rbjax.JointEncoder("j1", np.zeros((2, 2)), 0.01), {}, "1 coordinate"),
        (rbjax.Position("l1", y3, 0.01), {"integrator": rbjax.ImplicitMidpoint()}, "integrator"),
    ]
    for obs, kw, word in cases:
        msg = first_error(joint, obs, dt=1e-3, **kw)
        assert word in msg and "Fix:" in msg, msg
    free = tmp_path / "free.xml"
    free.write_text(
        '<mujoco><worldbody><body name="b"><freejoint name="f"/><geom size="0.1"/></body>'
        "</worldbody></mujoco>"
    )
    fj = rbjax.load(free, formulation=rbjax.JointCoordinates())
    msg = first_error(fj, rbjax.ReactionForce("f", y3, 1.0), dt=1e-3)
    assert "free joint" in msg and "Fix:" in msg
    four = rbjax.load("examples/models/four_bar.xml", formulation=rbjax.JointCoordinates())
    body = four.model.names[-1]
    msg = first_error(
        four, rbjax.Position(body, y3, 0.01), dt=1e-3, shooting=rbjax.Shooting(segments=2)
    )
    assert "equalities" in msg and "Fix:" in msg


# ----------------------------------------------------------------------- fits to MuJoCo data


def _mujoco_run(xml, qpos0, qvel0, times, edit=None):
    """MuJoCo's own RK4 (the file's timestep 1e-3) sampled at ``times`` (on its grid):
    qpos, qvel, xquat and xipos of every body, and each body's angular velocity in body
    axes."""
    m = mujoco.MjModel.from_xml_string(xml)
    if edit is not None:
        edit(m)
    d = mujoco.MjData(m)
    d.qpos[:], d.qvel[:] = qpos0, qvel0
    mujoco.mj_forward(m, d)
    out = {"qpos": [], "qvel": [], "xquat": [], "xipos": [], "omega": []}
    steps = np.rint(np.asarray(times) / m.opt.timestep).astype(int)
    n = 0
    for s in steps:
        while n < s:
            mujoco.mj_step(m, d)
            n += 1
        mujoco.mj_forward(m, d)
        out["qpos"].append(d.qpos.copy())
        out["qvel"].append(d.qvel.copy())
        out["xquat"].append(d.xquat[1:].copy())
        out["xipos"].append(d.xipos[1:].copy())
        w = np.zeros((m.nbody - 1, 3))
        for b in range(1, m.nbody):
            res = np.zeros(6)
            mujoco.mj_objectVelocity(m, d, mujoco.mjtObj.mjOBJ_BODY, b, res, 1)
            w[b - 1] = res[:3]
        out["omega"].append(w)
    return {k: np.asarray(v) for k, v in out.items()}


def _arm_build(base, qvel0):
    def build(p):
        model = eqx.tree_at(lambda m: m.damping, base.model, base.model.damping.at[0].set(p["d"]))
        qvel = jnp.asarray(qvel0).at[1:4].set(p["w0"])
        return model, rbjax.JointState(0.0, base.state.qpos, qvel)

    return build


def test_fit_recovers_damping_and_initial_spin_from_mujoco_data(arm):
    """Noisy marker positions and encoder readings of MuJoCo's simulation of the arm (hinge
    damping 0.35, ball spinning at w0): the JointModel fit recovers both within 4 standard
    errors, and the reduced chi² is ~1."""
    _, joint = arm
    true_d, true_w = 0.35, np.array([0.8, -0.5, 1.2])
    times = np.round(np.linspace(0.0, 0.6, 31), 3)
    qpos0 = np.asarray(joint.state.qpos)
    qvel0 = np.zeros(joint.model.nv)
    qvel0[0], qvel0[1:4] = 1.5, true_w

    def edit(m):
        m.dof_damping[0] = true_d

    ref = _mujoco_run(ARM, qpos0, qvel0, times, edit)
    rng = np.random.default_rng(7)
    sig_x, sig_e = 1e-3, 2e-3
    data = rbjax.Measurements(
        times,
        [
            rbjax.Position("l3", ref["xipos"][:, 2] + sig_x * rng.normal(size=(31, 3)), sig_x),
            rbjax.JointEncoder("j1", ref["qpos"][:, :1] + sig_e * rng.normal(size=(31, 1)), sig_e),
        ],
    )
    p0 = {"d": jnp.asarray(0.1), "w0": jnp.asarray([0.5, 0.0, 0.8])}
    res = rbjax.identify(_arm_build(joint, qvel0), p0, data, dt=2e-3)
    assert res.converged, res.message
    est = np.concatenate([[float(res.params["d"])], np.asarray(res.params["w0"])])
    std = np.concatenate([[float(res.std_errors["d"])], np.asarray(res.std_errors["w0"])])
    err = est - np.concatenate([[true_d], true_w])
    assert np.all(np.isfinite(std)) and np.all(std > 0)
    assert np.all(np.abs(err) < 4 * std), (err, std)
    assert 0.5 < res.reduced_chi2 < 1.6


def test_multiple_shooting_with_a_ball_joint_converges(tmp_path):
    """A body spinning on a damped ball joint (MuJoCo's simulation, noisy attitude and gyro
    readings): multiple shooting over 3 segments on the JointModel (segment starts in the
    tangent space: the quaternion turned by exp) converges to the true damping and initial
    spin within 4 standard errors, with the continuity gaps closed."""
    path = tmp_path / "top.xml"
    path.write_text(TOP)
    true_d, true_w = 0.05, np.array([1.0, -0.6, 6.0])
    times = np.round(np.linspace(0.0, 0.9, 31), 3)
    qpos0 = np.array([1.0, 0.0, 0.0, 0.0])

    def edit(m):
        m.dof_damping[:] = true_d

    ref = _mujoco_run(TOP, qpos0, true_w, times, edit)
    ref_qvel = ref["qvel"]
    rng = np.random.default_rng(11)
    sig_q, sig_w = 2e-3, 5e-3
    noisy = ref["xquat"][:, 0] + 0.5 * sig_q * rng.normal(size=(31, 4))
    data = rbjax.Measurements(
        times,
        [
            rbjax.Orientation("top", noisy / np.linalg.norm(noisy, axis=1)[:, None], sig_q),
            rbjax.Gyro("top", ref["omega"][:, 0] + sig_w * rng.normal(size=(31, 3)), sig_w),
        ],
    )
    base = rbjax.load(path, formulation=rbjax.JointCoordinates())

    def build(p):
        model = eqx.tree_at(lambda m: m.damping, base.model, jnp.broadcast_to(p["d"], (3,)))
        return model, rbjax.JointState(0.0, base.state.qpos, p["w0"])

    p0 = {"d": jnp.asarray(0.02), "w0": jnp.asarray([0.8, -0.4, 5.5])}
    res = rbjax.identify(build, p0, data, dt=2e-3, shooting=rbjax.Shooting(segments=3))
    assert res.converged, res.message
    assert isinstance(res.segment_states, rbjax.JointState)
    assert res.segment_states.qpos.shape == (2, 4)
    # the gaps close to well below the noise (the default weight: a 1e-3 gap costs one σ)
    assert np.max(res.continuity_gaps) < 0.5 * sig_q
    # the fitted segment starts are MuJoCo's states at those times
    rows = np.searchsorted(times, np.asarray(res.segment_states.t))
    a = np.asarray(res.segment_states.qpos)
    b = ref["qpos"][rows]
    e_rot = 2 * np.arccos(np.minimum(1.0, np.abs(np.sum(a * b, axis=1))))
    e_w = np.abs(np.asarray(res.segment_states.qvel) - ref_qvel[rows])
    print(f"segment starts: rotation {e_rot.max():.3g} rad, qvel {e_w.max():.3g} rad/s")
    assert e_rot.max() < 2 * sig_q and e_w.max() < 2 * sig_w
    # the segment starts begun at guesses (MuJoCo's states, as if read off the data): the
    # same minimum (the compiled program is reused)
    guesses = rbjax.JointState(times, ref["qpos"], ref_qvel)
    res2 = rbjax.identify(
        build, p0, data, dt=2e-3, shooting=rbjax.Shooting(segments=3, states0=guesses)
    )
    assert res2.converged
    np.testing.assert_allclose(res2.estimate, res.estimate, rtol=1e-6)
    est = np.concatenate([[float(res.params["d"])], np.asarray(res.params["w0"])])
    std = np.concatenate([[float(res.std_errors["d"])], np.asarray(res.std_errors["w0"])])
    err = est - np.concatenate([[true_d], true_w])
    assert np.all(np.abs(err) < 4 * std), (err, std)


class _RootSpring(eqx.Module):
    """τ = −k sign(x) √|x| on the slide: an infinite derivative at x = 0 (the issue-36
    probe, in joint coordinates)."""

    k: jax.Array

    def __call__(self, t, qpos, qvel):
        return -self.k * jnp.sign(qpos[:1]) * jnp.sqrt(jnp.abs(qpos[:1]))


def test_a_nonfinite_gradient_is_diagnosed_on_the_joint_coordinates():
    """A slider on the spring τ = −k sign(x) √|x| started at x = 0: identify stops at the
    initial guess and its diagnosis (the backward pass replayed on the JointModel's own
    steps) names step 0 and the slide's coordinate."""
    base = rbjax.JointModel(
        names=("slider",),
        parent=(-1,),
        body_pos=[[0.0, 0.0, 0.0]],
        body_quat=[[1.0, 0.0, 0.0, 0.0]],
        mass=[1.0],
        com=[[0.0, 0.0, 0.0]],
        inertia=[np.eye(3)],
        joint_types=("slide",),
        joint_body=(0,),
        joint_names=("x",),
        joint_axis=[[1.0, 0.0, 0.0]],
        gravity=(0.0, 0.0, 0.0),
    )

    def build(p):
        model = eqx.tree_at(lambda m: m.forces, base, (_RootSpring(p["k"]),))
        return model, rbjax.JointState(0.0, jnp.zeros(1), jnp.ones(1))

    times = np.linspace(0.0, 0.2, 5)
    data = rbjax.Measurements(times, [rbjax.JointEncoder("x", times[:, None], 1e-3)])
    p0 = {"k": jnp.asarray(1.5)}
    sie = rbjax.SemiImplicitEuler()
    with pytest.raises(rbjax.NonfiniteGradientError) as info:
        rbjax.identify(build, p0, data, dt=0.01, integrator=sie)
    assert "Fix:" in str(info.value) and "at the initial guess params0" in str(info.value)
    d = info.value.diagnosis
    assert (d.step, d.time) == (0, 0.0)  # x = 0 at the start of the first step
    assert "qpos[0] (joint 'x')" in d.where, d.where
    res = rbjax.identify(build, p0, data, dt=0.01, integrator=sie, nonfinite="result")
    assert res.criterion == "nonfinite gradient" and not res.converged
