"""Issue 36's robot-file probes: nothing in an MJCF/URDF file is dropped without a word, a
floating base's joint coordinates are MuJoCo's, and inputs the model cannot use are refused.

* The joint-level actuator force cap (``actuatorfrcrange``) against MuJoCo's accelerations
  and trajectory, with several actuators on one joint and gears other than 1.
* The audit of ``mujoco.MjModel``'s fields (rbjax/_io/mujoco_fields.py): every field with a
  dynamics prefix is listed (a new MuJoCo field fails the test until it is), the docs table
  says the same, and each status is checked: ``simulated`` fields set to non-default values
  give MuJoCo's accelerations to round-off, ``named`` ones are named in the loader's warning,
  ``no effect`` ones leave MuJoCo's own accelerations unchanged.
* ``Loaded.joint_space()`` on a floating base whose inertial frame is offset and rotated from
  its body frame: MuJoCo's qpos/qvel both ways, mass matrix, bias, a Jacobian, joint forces.
* Controls, qpos and qvel the model cannot use are ValueErrors with "Fix:".

MuJoCo's side is cheap; the rbjax side compiles one joint-acceleration program per model
structure (the probes that only change values reuse it).
"""

import pathlib
import re
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rbjax

mujoco = pytest.importorskip("mujoco")

from rbjax._io import mujoco_fields as audit  # noqa: E402
from rbjax._io.mujoco import build_from_mujoco  # noqa: E402

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs" / "tutorials" / "import-mjcf.md"


@eqx.filter_jit
def _qacc(js, state):
    """rbjax's joint accelerations in the coordinates of ``js``: the rate of
    ``js.velocities`` along the motion (q̇, u̇), u̇ from rbjax.accelerations."""
    model = js.model
    udot, _ = rbjax.accelerations(model, state)
    a, w = state.q[:, 3:7], state.u[:, 4:7]
    zero = jnp.zeros(w.shape[:-1] + (1,), w.dtype)
    adot = 0.5 * jax.vmap(rbjax.quaternion.mul)(a, jnp.concatenate([zero, w], axis=-1))
    qdot = jnp.concatenate([state.u[:, 0:3], adot], axis=1)

    def velocities(q, u):
        return js.velocities(rbjax.State(t=state.t, q=q, u=u))

    return jax.jvp(velocities, (state.q, state.u), (qdot, udot))[1]


def _mujoco_qacc(m, qpos, qvel, ctrl=None):
    d = mujoco.MjData(m)
    d.qpos[:], d.qvel[:] = qpos, qvel
    if ctrl is not None:
        d.ctrl[:] = ctrl
    mujoco.mj_forward(m, d)
    return d.qacc.copy()


def _load(m, **options):
    """build_from_mujoco of a compiled model, its warning text ('' when none)."""
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        model, state, dt, source = build_from_mujoco(m, **options)
    texts = [str(w.message) for w in record if issubclass(w.category, UserWarning)]
    assert len(texts) <= 1, texts  # one warning at most
    return rbjax.Loaded(model, state, dt, source), (texts[0] if texts else "")


def _random_state(m, rng):
    qpos = m.qpos0 + rng.uniform(-0.4, 0.4, m.nq)
    for j in range(m.njnt):
        kind = int(m.jnt_type[j])
        a = m.jnt_qposadr[j] + (3 if kind == mujoco.mjtJoint.mjJNT_FREE else 0)
        if kind in (mujoco.mjtJoint.mjJNT_FREE, mujoco.mjtJoint.mjJNT_BALL):
            qpos[a : a + 4] /= np.linalg.norm(qpos[a : a + 4])
    return qpos, rng.uniform(-1.0, 1.0, m.nv)


# ---------------------------------------------------------------- the actuator force cap

CAPPED = """
<mujoco>
  <option timestep="0.001"><flag contact="disable"/></option>
  <worldbody>
    <body name="arm" pos="0 0 1">
      <joint name="shoulder" type="hinge" axis="0 1 0" actuatorfrcrange="-1 1"/>
      <geom type="capsule" fromto="0 0 0 .3 0 -.1" size=".03"/>
      <body name="cart" pos=".3 0 -.1">
        <joint name="rail" type="slide" axis=".6 0 .8" actuatorfrcrange="-0.5 2" damping="0.2"/>
        <geom type="box" size=".05 .04 .03"/>
        <body name="tip" pos="0 0 -.1">
          <joint name="wrist" type="hinge" axis="1 0 0"/>
          <geom type="capsule" fromto="0 0 0 0 .1 -.1" size=".02"/>
        </body>
      </body>
    </body>
  </worldbody>
  <actuator>
    <motor name="big" joint="shoulder" gear="2"/>
    <motor name="small" joint="shoulder" gear="0.5"/>
    <position name="servo" joint="shoulder" kp="3" kv="0.2" gear="1.5"/>
    <motor name="push" joint="rail" gear="-3"/>
    <motor name="free" joint="wrist" gear="2"/>
  </actuator>
</mujoco>
"""


def test_actuator_force_cap_matches_mujoco(tmp_path):
    """Issue 36: actuatorfrcrange was neither simulated nor named: a motor commanded to 100
    N·m against a 1 N·m cap ran uncapped (initial accelerations off by 1.5e4 rad/s² on this
    file). MuJoCo caps qfrc_actuator per joint after summing the actuators' gear·force
    (three on the shoulder, gears 2, 0.5, 1.5; a negative gear on the rail): rbjax's joint
    accelerations equal MuJoCo's to round-off, saturated and not, and a 0.3 s RK4 trajectory
    commanded beyond the caps follows MuJoCo's RK4 to the discretization difference."""
    path = tmp_path / "capped.xml"
    path.write_text(CAPPED)
    m = mujoco.MjModel.from_xml_path(str(path))
    assert list(m.jnt_actfrclimited) == [1, 1, 0]
    rng = np.random.default_rng(36)
    beyond = [100.0, -40.0, 0.3, 5.0, 0.01]  # shoulder and rail far beyond their caps
    loaded = rbjax.load(path, control=beyond, formulation=rbjax.ScalableDAE())
    js = loaded.joint_space()
    for ctrl in (beyond, [0.2, 0.1, 0.0, 0.05, -0.3], [-9.0, 0.0, 0.0, -1.0, 0.0]):
        qpos, qvel = _random_state(m, rng)
        src = rbjax.load(path, qpos=qpos, qvel=qvel, control=ctrl, formulation=rbjax.ScalableDAE())
        got = np.asarray(_qacc(src.joint_space(), src.state))  # one program: same structure
        want = _mujoco_qacc(m, qpos, qvel, ctrl)
        np.testing.assert_allclose(got, want, atol=1e-11 * np.abs(want).max())
    kinds = [type(f.actuator).__name__ for f in loaded.model.forces if f.actuator is not None]
    assert sorted(kinds) == ["Actuator", "JointActuators", "JointActuators"]
    # MuJoCo's side: the shoulder and the rail at their caps
    d = mujoco.MjData(m)
    d.ctrl[:] = beyond
    mujoco.mj_forward(m, d)
    assert d.qfrc_actuator[0] == pytest.approx(1.0) and d.qfrc_actuator[1] == pytest.approx(-0.5)
    # a trajectory commanded beyond the caps
    m.opt.integrator = mujoco.mjtIntegrator.mjINT_RK4
    d = mujoco.MjData(m)
    d.ctrl[:] = beyond
    for _ in range(300):
        mujoco.mj_step(m, d)
    traj = rbjax.rollout(
        loaded.model, loaded.state, 1e-3, 300, integrator=rbjax.RK4(), save_every=300
    )
    final = js.positions(rbjax.State(t=traj.t[-1], q=traj.q[-1], u=traj.u[-1]))
    np.testing.assert_allclose(np.asarray(final), d.qpos, atol=1e-9)


# ---------------------------------------------------------------- the audit of MjModel's fields

BASE = """
<mujoco>
  <option timestep="0.002"><flag contact="disable"/></option>
  <worldbody>
    <body name="pendulum" pos="0 0 1">
      <joint name="hinge" type="hinge" axis="0 1 0" stiffness="3" springref="0.2" damping="0.4"
             ref="0.1"/>
      <geom name="rod" type="capsule" fromto="0 0 0 .3 0 -.1" size=".03"/>
      <body name="tool" pos=".3 0 -.1">
        <geom name="tool" type="box" size=".03 .02 .01" pos=".02 0 0"/>
      </body>
      <body name="slider" pos=".3 0 -.1">
        <joint name="slide" type="slide" axis=".6 0 .8" stiffness="2" damping="0.3"/>
        <geom name="block" type="box" size=".05 .04 .03"/>
      </body>
    </body>
    <body name="base" pos=".5 .2 1" quat=".9 .1 .3 .2">
      <freejoint name="root"/>
      <inertial pos=".04 -.03 .05" quat=".8 .3 .1 .4" mass="2" diaginertia=".1 .2 .3"/>
      <body name="limb" pos=".1 0 0">
        <joint name="shoulder" type="ball"/>
        <inertial pos="0 0 -.2" mass="1" diaginertia=".02 .02 .01"/>
      </body>
    </body>
  </worldbody>
  <actuator>
    <motor name="motor" joint="hinge" gear="2" ctrlrange="-1 1"/>
    <position name="servo" joint="hinge" kp="4" kv="0.5" gear="0.5" forcerange="-3 3"/>
    <velocity name="push" joint="slide" kv="2" gear="-1.5"/>
  </actuator>
</mujoco>
"""
CTRL = np.array([3.0, 0.4, -0.2])  # the motor's control beyond its ctrlrange: MuJoCo clamps


def _base():
    return mujoco.MjModel.from_xml_string(BASE)


def _bit(name):
    flag = getattr(mujoco.mjtDisableBit, f"mjDSBL_{name}", None)
    return (
        ("disableflags", int(flag))
        if flag is not None
        else (
            "enableflags",
            int(getattr(mujoco.mjtEnableBit, f"mjENBL_{name}")),
        )
    )


def _set_flag(m, name):
    which, bit = _bit(name)
    setattr(m.opt, which, int(getattr(m.opt, which)) | bit)


def _dynamics_fields():
    """Every field the audit must classify: MjModel fields with a dynamics prefix, the
    options, the bits of the disable and enable flags."""
    m = _base()
    fields = {
        n
        for n in dir(m)
        if (n.startswith(audit.PREFIXES) or n in audit.EXACT) and not n.startswith("flex_")
    }
    fields |= {n for n in dir(m) if n.startswith("flex")}
    fields |= {f"opt.{n}" for n in dir(m.opt) if not n.startswith("_")}
    fields |= {
        f"flag.{n.split('_', 1)[1]}"
        for enum in (mujoco.mjtDisableBit, mujoco.mjtEnableBit)
        for n in dir(enum)
        if n.startswith(("mjDSBL_", "mjENBL_"))
    }
    return sorted(fields)


def test_audit_lists_every_dynamics_field_of_mujoco_and_the_docs_agree():
    """A field of this MuJoCo that the audit does not list (a new MuJoCo version) fails here
    until it is classified; the tutorial's table gives every field the same status."""
    fields = _dynamics_fields()
    missing = []
    for f in fields:
        try:
            audit.status(f)
        except KeyError:
            missing.append(f)
    assert not missing, f"MjModel fields the import audit does not classify: {missing}"
    stale = [k for k in audit.FIELDS if not k.endswith("*") and k not in fields]
    assert not stale, f"the audit lists fields this MuJoCo does not have: {stale}"
    text = DOCS.read_text()
    table = {}
    for row in re.findall(r"^\| (`[^|]*) \| (simulated|named|no effect|derived) \|", text, re.M):
        for key in re.findall(r"`([^`]+)`", row[0]):
            table[key] = row[1]
    documented = {k: v[0] for k, v in audit.FIELDS.items()}
    assert table == documented


def _ids(m, kind, *names):
    return [mujoco.mj_name2id(m, getattr(mujoco.mjtObj, f"mjOBJ_{kind}"), n) for n in names]


def _unit(v):
    v = np.asarray(v, float)
    return v / np.linalg.norm(v)


# simulated fields set to non-default values on the compiled BASE; the rbjax model has the
# same structure as BASE's, so one compiled program checks them all
VALUES = {
    "body_pos": lambda m: m.body_pos.__setitem__(_ids(m, "BODY", "slider")[0], [0.32, 0.01, -0.07]),
    "body_quat": lambda m: m.body_quat.__setitem__(
        _ids(m, "BODY", "limb")[0], _unit([1, 0.2, -0.3, 0.1])
    ),
    "body_ipos": lambda m: m.body_ipos.__setitem__(
        _ids(m, "BODY", "pendulum")[0], [0.1, 0.02, -0.05]
    ),
    "body_iquat": lambda m: m.body_iquat.__setitem__(
        _ids(m, "BODY", "base")[0], _unit([1, 0.4, 0.1, -0.2])
    ),
    "body_mass": lambda m: m.body_mass.__setitem__(_ids(m, "BODY", "slider")[0], 1.7),
    "body_inertia": lambda m: m.body_inertia.__setitem__(
        _ids(m, "BODY", "base")[0], [0.15, 0.2, 0.25]
    ),
    "jnt_pos": lambda m: m.jnt_pos.__setitem__(_ids(m, "JOINT", "hinge")[0], [0.01, 0.0, 0.02]),
    "jnt_axis": lambda m: m.jnt_axis.__setitem__(
        _ids(m, "JOINT", "slide")[0], _unit([0.5, 0.1, 0.8])
    ),
    "jnt_stiffness": lambda m: m.jnt_stiffness.__setitem__(_ids(m, "JOINT", "hinge")[0], 5.0),
    "qpos_spring": lambda m: m.qpos_spring.__setitem__(0, -0.3),  # the hinge's springref
    "qpos0": lambda m: m.qpos0.__setitem__(0, 0.35),  # the hinge's ref
    "dof_damping": lambda m: m.dof_damping.__setitem__(1, 0.7),  # the slide's
    "actuator_gear": lambda m: m.actuator_gear.__setitem__((1, 0), 0.8),
    "actuator_gainprm": lambda m: m.actuator_gainprm.__setitem__((1, 0), 6.0),
    "actuator_biasprm": lambda m: m.actuator_biasprm.__setitem__((2, 2), -1.0),
    "actuator_ctrlrange": lambda m: m.actuator_ctrlrange.__setitem__(0, [-0.5, 2.0]),
    "actuator_forcerange": lambda m: m.actuator_forcerange.__setitem__(1, [-0.5, 0.4]),
    "actuator_trntype": lambda m: m.actuator_trntype.__setitem__(
        0, mujoco.mjtTrn.mjTRN_JOINTINPARENT
    ),
    "actuator_gaintype": lambda m: (
        m.actuator_gaintype.__setitem__(0, mujoco.mjtGain.mjGAIN_AFFINE),
        m.actuator_gainprm.__setitem__((0, slice(1, 3)), [0.3, -0.2]),
    ),
    "actuator_biastype": lambda m: (
        m.actuator_biastype.__setitem__(0, mujoco.mjtBias.mjBIAS_AFFINE),
        m.actuator_biasprm.__setitem__((0, slice(0, 3)), [0.1, -0.4, 0.2]),
    ),
    "opt.gravity": lambda m: m.opt.__setattr__("gravity", [0.5, -0.3, -9.0]),
    "flag.DAMPER": lambda m: _set_flag(m, "DAMPER"),
}
# simulated fields that change the rbjax model's structure (other force elements), set in the
# file (MuJoCo counts gravcomp bodies when compiling): one more program. The cap on a joint with
# two actuators (JointActuators), gravity compensation (PointForces, on a welded body too, and
# routed through the actuators of a ball joint), an actuator in a group disabled by
# actuatorgroupdisable, controls not clamped (CLAMPCTRL off)
STRUCTURE = {
    "jnt_actfrclimited": [('name="hinge"', 'name="hinge" actuatorfrcrange="-0.7 0.9"')],
    "jnt_actfrcrange": [('name="hinge"', 'name="hinge" actuatorfrcrange="-0.7 0.9"')],
    "body_gravcomp": [('name="tool" pos=".3 0 -.1"', 'name="tool" pos=".3 0 -.1" gravcomp="1"')],
    "jnt_actgravcomp": [  # on an uncapped joint: the same force as the passive one
        ('name="shoulder"', 'name="shoulder" actuatorgravcomp="true"'),
        ('name="limb" pos=".1 0 0"', 'name="limb" pos=".1 0 0" gravcomp="0.6"'),
    ],
    "actuator_group": [
        ('name="push"', 'name="push" group="3"'),
        ('timestep="0.002"', 'timestep="0.002" actuatorgroupdisable="3"'),
    ],
    "opt.disableactuator": [
        ('name="push"', 'name="push" group="3"'),
        ('timestep="0.002"', 'timestep="0.002" actuatorgroupdisable="3"'),
    ],
    "flag.CLAMPCTRL": [('contact="disable"', 'contact="disable" clampctrl="disable"')],
}
# disable flags with the elements they switch off present: nothing to name, MuJoCo applies none
FLAGS = {
    "flag.ACTUATION": ('contact="disable"', 'contact="disable" actuation="disable"'),
    "flag.SPRING": ('contact="disable"', 'contact="disable" spring="disable"'),
    "flag.GRAVITY": ('contact="disable"', 'contact="disable" gravity="disable"'),
    "flag.LIMIT": ('contact="disable"', 'contact="disable" limit="disable"'),
    "flag.FRICTIONLOSS": ('contact="disable"', 'contact="disable" frictionloss="disable"'),
    "_elements": ('ref="0.1"', 'ref="0.1" range="-0.01 0.01" limited="true" frictionloss="0.5"'),
    "_gravcomp": ('name="limb" pos=".1 0 0"', 'name="limb" pos=".1 0 0" gravcomp="0.6"'),
}
# fields BASE itself sets to non-default values, checked with it
IN_BASE = (
    "actuator_trnid",
    "actuator_ctrllimited",
    "actuator_forcelimited",
    "opt.timestep",
    "flag.CONTACT",
)


def _edited(edits):
    xml = BASE
    for old, new in edits:
        assert xml.count(old) == 1, old
        xml = xml.replace(old, new)
    return mujoco.MjModel.from_xml_string(xml)


def _compare(m, rng, n=2):
    """rbjax's joint accelerations against MuJoCo's at n random states, BASE's controls."""
    for _ in range(n):
        qpos, qvel = _random_state(m, rng)
        loaded, text = _load(m, qpos=qpos, qvel=qvel, control=CTRL)
        assert text == ""
        got = np.asarray(_qacc(loaded.joint_space(), loaded.state))
        want = _mujoco_qacc(m, qpos, qvel, CTRL)
        np.testing.assert_allclose(got, want, atol=1e-10 * max(1.0, np.abs(want).max()))


def test_simulated_fields_match_mujoco():
    """Every 'simulated' field set to a non-default value (each one alone changes MuJoCo's
    accelerations, so the probe is not empty): rbjax's joint accelerations equal MuJoCo's
    to round-off, with no warning. Two rbjax programs: BASE's structure, and the structure
    with the cap, gravity compensation and a disabled actuator group."""
    simulated = {k for k, (s, _) in audit.FIELDS.items() if s == audit.SIMULATED}
    eq_fields = {"eq_type", "eq_obj1id", "eq_obj2id", "eq_objtype", "eq_data"}
    flags_eq = {"flag.EQUALITY", "flag.CONSTRAINT"}  # test_equalities_are_exact_...
    covered = set(VALUES) | set(STRUCTURE) | set(FLAGS) | set(IN_BASE) | eq_fields | flags_eq
    assert simulated <= covered, simulated - covered
    rng = np.random.default_rng(7)
    base = _base()
    qpos, qvel = _random_state(base, rng)
    before = _mujoco_qacc(base, qpos, qvel, CTRL)
    for name, edit in VALUES.items():  # each one matters (jointinparent on a hinge is joint)
        m = _base()
        edit(m)
        change = np.abs(_mujoco_qacc(m, qpos, qvel, CTRL) - before).max()
        assert (change == 0.0) if name == "actuator_trntype" else (change > 1e-6), name
    m = _base()
    for edit in VALUES.values():
        edit(m)
    _compare(m, rng)
    loaded, _ = _load(_base())
    assert loaded.timestep == 0.002
    every = [e for edits in STRUCTURE.values() for e in dict.fromkeys(edits)]
    every = list(dict.fromkeys(every))
    for name, edits in STRUCTURE.items():
        change = np.abs(_mujoco_qacc(_edited(edits), qpos, qvel, CTRL) - before).max()
        assert change > 1e-6, name
    _compare(_edited(every), rng)
    kinds = sorted(type(f).__name__ for f in _load(_edited(every))[0].model.forces)
    assert kinds.count("PointForce") == 2  # tool (welded into pendulum) and limb
    m = _edited(FLAGS.values())
    loaded, text = _load(m)
    assert text == ""  # limits, friction loss, contacts: switched off, nothing to name
    assert not any(f.actuator for f in loaded.model.forces if hasattr(f, "actuator"))
    assert not np.any(np.asarray(loaded.model.gravity))
    _compare(m, rng, n=1)


def _joint(m, name):
    return _ids(m, "JOINT", name)[0]


# named fields: an edit of the compiled BASE (or a file with the element) and what the warning
# must say (the element's name and, where it has one, the value)
NAMED = {
    "jnt_stiffnesspoly": (
        lambda m: m.jnt_stiffnesspoly.__setitem__(_joint(m, "hinge"), [0.5, 0.1]),
        "nonlinear stiffness (stiffness polynomial) on joints {'hinge': [0.5, 0.1]}",
    ),
    "jnt_springyield": (
        lambda m: m.jnt_springyield.__setitem__(_joint(m, "slide"), 0.3),
        "plastic springs (springyield) on joints {'slide': [0.3]}",
    ),
    "jnt_limited": (
        lambda m: (m.jnt_limited.__setitem__(0, 1), m.jnt_range.__setitem__(0, [-1, 1])),
        "joint limits on ['hinge']",
    ),
    "jnt_range": (
        lambda m: (m.jnt_limited.__setitem__(0, 1), m.jnt_range.__setitem__(0, [-1, 1])),
        "joint limits on ['hinge']",
    ),
    "dof_dampingpoly": (
        lambda m: m.dof_dampingpoly.__setitem__(0, [0.2, 0.0]),
        "nonlinear damping (damping polynomial) on joints {'hinge': [[0.2, 0.0]]}",
    ),
    "dof_armature": (
        lambda m: m.dof_armature.__setitem__(1, 0.05),
        "armature (rotor inertia) on joints ['slide']",
    ),
    "dof_frictionloss": (
        lambda m: m.dof_frictionloss.__setitem__(0, 0.2),
        "friction loss on joints ['hinge']",
    ),
    "actuator_dyntype": (
        lambda m: m.actuator_dyntype.__setitem__(1, mujoco.mjtDyn.mjDYN_FILTER),
        "actuator 'servo': activation dynamics",
    ),
    "actuator_damping": (
        lambda m: m.actuator_damping.__setitem__(0, 0.3),
        "actuator 'motor': damping = 0.3 is not modelled",
    ),
    "actuator_dampingpoly": (
        lambda m: m.actuator_dampingpoly.__setitem__(0, [0.1, 0.0]),
        "; dampingpoly = [0.1 0. ] is not modelled",
    ),
    "actuator_armature": (
        lambda m: m.actuator_armature.__setitem__(2, 0.01),
        "actuator 'push': armature = 0.01 is not modelled",
    ),
    "actuator_delay": (
        lambda m: m.actuator_delay.__setitem__(0, 0.02),
        "; a control delay of 0.02 s is not modelled",
    ),
    "opt.density": (lambda m: setattr(m.opt, "density", 1.2), "density=1.2"),
    "opt.viscosity": (lambda m: setattr(m.opt, "viscosity", 0.01), "viscosity=0.01"),
    "opt.wind": (lambda m: setattr(m.opt, "wind", [1.0, 0, 0]), "wind=[1.0, 0.0, 0.0]"),
    "flag.SLEEP": (lambda m: _set_flag(m, "SLEEP"), "sleeping"),
}
# named elements MuJoCo must compile into the file (counts and addresses)
PLUGIN = """<mujoco><option><flag contact="disable"/></option>
<extension><plugin plugin="mujoco.pid"><instance name="pid1"><config key="kp" value="4"/></instance>
</plugin></extension><worldbody><body name="b"><joint name="j"/><geom size=".1"/></body></worldbody>
<actuator><plugin name="pid" joint="j" plugin="mujoco.pid" instance="pid1"/></actuator></mujoco>"""
FILES = {
    "body_mocapid": (
        BASE.replace("<worldbody>", '<worldbody><body name="target" mocap="true"/>'),
        "mocap bodies ['target']",
    ),
    "tendon_*": (
        BASE.replace(
            "<actuator>",
            '<tendon><fixed name="t"><joint joint="hinge" coef="1"/></fixed></tendon><actuator>',
        ),
        "1 tendon(s) ['t']",
    ),
    "flex*": (
        BASE.replace(
            '<geom name="block"',
            '<flexcomp name="cloth" type="grid" count="2 2 1" '
            'spacing=".1 .1 .1" radius=".01" dim="2" rigid="true"/><geom name="block"',
        ),
        "flex objects ['cloth']",
    ),
    "actuator_plugin": (PLUGIN, "actuator 'pid': an actuator plugin"),
    "body_plugin": (PLUGIN, "plugin"),
    "eq_active0": (
        BASE.replace(
            "<actuator>",
            '<equality><connect name="c" body1="pendulum" body2="limb" '
            'anchor="0 0 0" active="false"/></equality><actuator>',
        ),
        "equality 'c' is inactive at start",
    ),
    "eq_solref": (
        BASE.replace(
            "<actuator>",
            '<equality><weld name="w" body1="slider" body2="limb" '
            'solref="0.05 1"/></equality><actuator>',
        ),
        "softness of equalities ['w']",
    ),
    "eq_solimp": (
        BASE.replace(
            "<actuator>",
            '<equality><weld name="w" body1="slider" body2="limb" '
            'solimp="0.8 0.9 0.01"/></equality><actuator>',
        ),
        "softness of equalities ['w']",
    ),
    "jnt_actgravcomp (capped)": (
        BASE.replace(
            'name="hinge"', 'name="hinge" actuatorgravcomp="true" actuatorfrcrange="-1 1"'
        ).replace('name="tool" pos', 'name="tool" gravcomp="1" pos'),
        "gravity compensation on bodies ['tool']: routed through the actuators of joints ['hinge']",
    ),
}


def test_named_fields_are_named_in_the_one_warning():
    """Every 'named' field set to a non-default value: the loader's one warning names the
    element (and the value), and unsupported='error' refuses the file with the same text."""
    named = {k for k, (s, _) in audit.FIELDS.items() if s == audit.NAMED}
    assert named <= set(NAMED) | set(FILES), named - set(NAMED) - set(FILES)
    m = _base()  # every edit at once: one warning lists them all
    for edit, _ in NAMED.values():
        edit(m)
    _, text = _load(m)
    for name, (_, needle) in NAMED.items():
        assert needle in text, (name, text)
    with pytest.raises(ValueError, match="(?s)" + re.escape(needle) + ".*Fix: remove them"):
        build_from_mujoco(m, unsupported="error")
    for name, (xml, needle) in FILES.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # MuJoCo's own compiler warnings (a loose flex)
            m = mujoco.MjModel.from_xml_string(xml)
        _, text = _load(m)
        assert needle in text, (name, text)


# fields whose values cannot be perturbed safely on a compiled model (addresses, ids, types,
# counts): their status rests on the reason in the audit
_NOT_PERTURBED = ("adr", "num", "id", "type", "dim", "sameframe", "bvh", "aabb", "rbound")


def _perturb(m, key) -> bool:
    """Set a 'no effect' field of ``m`` to another value; False when it has none to change."""
    if key.startswith("opt."):
        value = getattr(m.opt, key[4:])
        setattr(m.opt, key[4:], np.asarray(value) + 1 if np.ndim(value) else type(value)(value + 1))
        return True
    if any(s in key for s in _NOT_PERTURBED):
        return False
    arr = getattr(m, key)
    if arr.size == 0:
        return False
    arr[...] = arr + (1 if np.issubdtype(arr.dtype, np.integer) else 0.37)
    return True


def test_no_effect_fields_do_not_change_mujocos_accelerations():
    """Every 'no effect' field (and each one of a 'no effect' family) that holds numbers, and
    every 'no effect' flag: set on BASE (contacts off; with an explicit contact pair), MuJoCo's
    own accelerations do not change; with all of them set at once the loader names nothing."""
    xml = BASE.replace(
        "<actuator>", '<contact><pair geom1="rod" geom2="block"/></contact><actuator>'
    )
    base = mujoco.MjModel.from_xml_string(xml)
    rng = np.random.default_rng(3)
    qpos, qvel = _random_state(base, rng)
    before = _mujoco_qacc(base, qpos, qvel, CTRL)
    no_effect = [k for k in _dynamics_fields() if audit.status(k)[0] == audit.NO_EFFECT]
    every = mujoco.MjModel.from_xml_string(xml)
    checked = []
    for key in (k for k in no_effect if not k.startswith("flag.")):
        m = mujoco.MjModel.from_xml_string(xml)
        if _perturb(m, key):
            np.testing.assert_array_equal(_mujoco_qacc(m, qpos, qvel, CTRL), before, err_msg=key)
            _perturb(every, key)
            checked.append(key)
    assert _load(every)[1] == ""
    flags = mujoco.MjModel.from_xml_string(xml)
    for key in (k for k in no_effect if k.startswith("flag.")):
        m = mujoco.MjModel.from_xml_string(xml)
        want = before
        if key == "flag.IPC":  # MuJoCo: "flag ipc requires integrator='discrete'", whose
            # qacc holds implicit damping (a discretization): compared with discrete alone
            m.opt.integrator = mujoco.mjtIntegrator.mjINT_DISCRETE
            want = _mujoco_qacc(m, qpos, qvel, CTRL)
        _set_flag(m, key[5:])
        np.testing.assert_array_equal(_mujoco_qacc(m, qpos, qvel, CTRL), want, err_msg=key)
        _set_flag(flags, key[5:])
        checked.append(key)
    assert _load(flags)[1] == ""
    assert len(checked) > 60


EQUALITIES = """
<mujoco>
  <option><flag contact="disable"/></option>
  <worldbody>
    <site name="w" pos=".3 .2 1"/>
    <body name="a" pos="0 0 1">
      <joint name="ja" type="hinge" axis="0 1 0"/>
      <geom type="capsule" fromto="0 0 0 .3 0 0" size=".02"/>
    </body>
    <body name="b" pos=".3 0 1" quat=".8 .2 .1 .3">
      <freejoint/>
      <geom type="capsule" fromto="0 0 0 0 .2 -.1" size=".02"/>
    </body>
    <body name="c" pos=".3 .2 1" quat=".9 .1 -.2 .3">
      <freejoint/>
      <geom type="box" size=".05 .04 .03"/>
      <site name="sc" quat=".9 .3 .1 .2"/>
    </body>
  </worldbody>
  <equality>
    <connect name="pin" body1="a" body2="b" anchor=".3 0 0"/>
    <weld name="glue" body1="c" body2="b"/>
    <connect name="hook" site1="sc" site2="w"/>
  </equality>
</mujoco>
"""


def test_equalities_are_exact_at_mujocos_anchors_and_switched_off_by_their_flags():
    """connect (bodies; sites, one on the world) and weld, built where MuJoCo's anchors say:
    at a random configuration each rbjax loop joint's position residual is MuJoCo's
    constraint violation (efc_pos of that equality), and the weld holds at the reference;
    equality or constraint disabled: no loop joint, nothing named, no MuJoCo constraint."""
    m = mujoco.MjModel.from_xml_string(EQUALITIES)
    loaded, text = _load(m)
    assert text == ""  # consistent at qpos0: nothing to assemble
    model, source = loaded.model, loaded.source
    names = list(model.joint_names)
    assert [type(j).__name__ for j in model.joints] == [
        "Revolute",
        "Spherical",
        "Fixed",
        "Spherical",
    ]
    ground = np.array([0.0, 0, 0, 1, 0, 0, 0])

    def residual(name, q):
        k = names.index(name)
        i, j = model.topology.joint_bodies[k]
        qi, qj = (ground if b < 0 else q[b] for b in (i, j))
        return np.asarray(model.joints[k].residual(qi, qj, 0.0))

    qpos, _ = _random_state(m, np.random.default_rng(5))
    q = np.asarray(source.state(qpos).q)
    d = mujoco.MjData(m)
    d.qpos[:] = qpos
    mujoco.mj_forward(m, d)
    eq = d.efc_type == mujoco.mjtConstraint.mjCNSTR_EQUALITY
    for e, name in enumerate(("pin", "glue", "hook")):
        rows = d.efc_pos[eq & (d.efc_id == e)]
        assert np.abs(rows[0:3]).max() > 1e-3  # violated here
        np.testing.assert_allclose(residual(name, q)[0:3], -rows[0:3], atol=1e-12, err_msg=name)
    q0 = np.asarray(source.state().q)
    assert max(np.abs(residual(n, q0)).max() for n in ("pin", "glue", "hook")) < 1e-12
    for flag in ("EQUALITY", "CONSTRAINT"):
        m = mujoco.MjModel.from_xml_string(EQUALITIES)
        _set_flag(m, flag)
        loaded, text = _load(m)
        assert text == "" and len(loaded.model.joints) == 1  # the hinge
        d = mujoco.MjData(m)
        mujoco.mj_forward(m, d)
        assert d.nefc == 0


# ---------------------------------------------------------------- floating-base coordinates

FLOATING = """
<mujoco>
  <option><flag contact="disable"/></option>
  <worldbody>
    <body name="post" pos="-1 0 1">
      <joint name="swing" type="hinge" axis="1 0 0"/>
      <geom type="capsule" fromto="0 0 0 0 0 -.3" size=".02"/>
    </body>
    <body name="base" pos=".1 .2 1" quat=".9 .1 .2 .3">
      <freejoint name="root"/>
      <inertial pos=".04 -.03 .05" quat=".8 .3 .1 .4" mass="2" diaginertia=".1 .2 .3"/>
      <body name="battery" pos="-.05 .02 .01" quat=".7 .7 0 0">
        <inertial pos=".01 0 -.02" quat=".9 0 .4 0" mass=".5" diaginertia=".01 .02 .025"/>
      </body>
      <body name="thigh" pos=".1 0 0">
        <joint name="hip" type="hinge" axis="0 1 0"/>
        <inertial pos="0 .02 -.2" quat=".9 .2 0 .1" mass="1" diaginertia=".02 .025 .01"/>
        <body name="shin" pos="0 0 -.3" euler=".3 0 .2">
          <joint name="knee" type="ball"/>
          <inertial pos=".01 0 -.15" mass=".6" diaginertia=".01 .01 .004"/>
        </body>
      </body>
    </body>
  </worldbody>
</mujoco>
"""


def test_loaded_joint_space_is_mujocos_qpos_and_qvel_on_an_offset_floating_base(tmp_path):
    """Issue 36: JointSpace gave a free body's centre of mass as its position (0.05 m from
    MuJoCo's qpos, the body frame's origin, on this file; 0.1 m/s in the velocity). A base
    whose inertial frame is offset and rotated, with a welded battery (the composite centre of
    mass moves again) and a fixed-base pendulum before it in the file (MuJoCo's qpos order):
    Loaded.joint_space() gives MuJoCo's qpos/qvel both ways, mj_fullM, qfrc_bias, mj_jac at a
    MuJoCo body point, and joint forces dual to its velocities (the free joint's force acts at
    the origin); the loader's state is mj_forward's; the default JointSpace (no origins) gives
    the centre of mass, as its docstring says."""
    path = tmp_path / "floating.xml"
    path.write_text(FLOATING)
    m = mujoco.MjModel.from_xml_path(str(path))
    rng = np.random.default_rng(36)
    qpos, qvel = _random_state(m, rng)
    loaded = rbjax.load(
        path,
        qpos=qpos * np.r_[1.0, 1, 1, 1, 2, 2, 2, 2, 1, 1, 1, 1, 1],
        qvel=qvel,
        formulation=rbjax.ScalableDAE(),
    )
    state = loaded.state  # a free quaternion of length 2: normalized, as MuJoCo does
    js = loaded.joint_space()
    assert [c[1] for c in js.coordinates] == ["revolute", "free", "revolute", "spherical"]
    assert (js.nq, js.nv) == (m.nq, m.nv)
    d = mujoco.MjData(m)
    d.qpos[:], d.qvel[:] = qpos, qvel
    mujoco.mj_forward(m, d)
    shin = _ids(m, "BODY", "shin")[0]
    mover, local = loaded.source.body_point("shin", [0.05, -0.02, 0.03])
    world = d.xpos[shin] + d.xmat[shin].reshape(3, 3) @ [0.05, -0.02, 0.03]
    tau = rng.uniform(-2.0, 2.0, m.nv)
    force = rbjax.JointForces(lambda t, s: tau, parents=js.parents, origins=js.origins)
    default = rbjax.JointSpace(loaded.model)

    @jax.jit
    def everything(state, qpos, qvel):
        back = js.state(qpos, qvel)
        w = force.wrench(loaded.model, 0.0, state)
        power = jnp.sum(w.force_world * state.u[:, 0:3]) + jnp.sum(w.moment_body * state.u[:, 4:7])
        return (
            js.positions(state),
            js.velocities(state),
            back,
            js.mass_matrix(state),
            js.bias(state),
            js.point(state, mover, local),
            js.jacobian(state, mover, local),
            power,
            default.positions(state),
        )

    qp, qv, back, mass, bias, where, jac, power, com = everything(state, qpos, qvel)
    qp = np.array(qp)
    qp[4:8] *= np.sign(qp[4:8] @ qpos[4:8])
    qp[9:13] *= np.sign(qp[9:13] @ qpos[9:13])
    np.testing.assert_allclose(qp, qpos, atol=1e-13)
    np.testing.assert_allclose(qv, qvel, atol=1e-13)
    np.testing.assert_allclose(back.q, state.q, atol=1e-13)
    np.testing.assert_allclose(back.u, state.u, atol=1e-13)
    full = np.zeros((m.nv, m.nv))
    mujoco.mj_fullM(m, d, full)
    np.testing.assert_allclose(mass, full, atol=1e-13 * np.abs(full).max())
    np.testing.assert_allclose(bias, d.qfrc_bias, atol=1e-12 * np.abs(d.qfrc_bias).max())
    jacp, jacr = np.zeros((3, m.nv)), np.zeros((3, m.nv))
    mujoco.mj_jac(m, d, jacp, jacr, world, shin)
    np.testing.assert_allclose(where, world, atol=1e-14)
    np.testing.assert_allclose(jac, np.vstack([jacp, jacr]), atol=1e-13)
    np.testing.assert_allclose(power, tau @ qvel, rtol=1e-13)
    # the loader's state is mj_forward's: the shin's centre of mass, attitude and velocities
    b = loaded.source.body_of[shin]
    vel = np.zeros(6)
    mujoco.mj_objectVelocity(m, d, mujoco.mjtObj.mjOBJ_BODY, shin, vel, 1)  # at xipos, local
    np.testing.assert_allclose(state.q[b, 0:3], d.xipos[shin], atol=1e-14)
    np.testing.assert_allclose(state.q[b, 3:7], d.xquat[shin], atol=1e-14)
    np.testing.assert_allclose(state.u[b, 4:7], vel[0:3], atol=1e-13)
    np.testing.assert_allclose(state.u[b, 0:3], d.xmat[shin].reshape(3, 3) @ vel[3:6], atol=1e-13)
    # the default JointSpace: free bodies first, at their centre of mass (not MuJoCo's qpos)
    np.testing.assert_allclose(np.asarray(com)[0:3], state.q[1, 0:3], atol=1e-15)
    assert np.linalg.norm(np.asarray(com)[0:3] - qpos[1:4]) > 0.02


# ---------------------------------------------------------------- inputs the model cannot use

MODELS = pathlib.Path(__file__).resolve().parents[1] / "examples" / "models"


@pytest.mark.parametrize(
    ("file", "options", "match"),
    [  # issue 36: the first three were silently ignored
        ("double_pendulum.xml", {"control": [1.0, 2.0, 3.0]}, r"no actuators \(nu = 0\)"),
        ("double_pendulum.xml", {"control": [np.nan]}, r"no actuators \(nu = 0\)"),
        (
            "double_pendulum.xml",
            {"control": rbjax.ControlSequence([[1.0]], dt=0.1)},
            r"control = <ControlSequence> is given, but the MuJoCo model has no actuators",
        ),
        ("cart_pole.xml", {"control": [1.0]}, r"has shape \(1,\), not \(2,\).*'push', 'servo'"),
        ("cart_pole.xml", {"control": [0.5, np.inf]}, r"control\[1\] = inf is not finite"),
        ("cart_pole.xml", {"control": ["a", 1.0]}, r"is not an array of numbers"),
        (
            "cart_pole.xml",
            {"control": rbjax.ControlSequence([[1.0, 2.0, 3.0]], dt=0.1)},
            r"control\(t\) = <ControlSequence> returns shape \(3,\), not \(2,\)",
        ),
        (
            "double_pendulum.xml",
            {"qpos": [0.0, 0.0, 0.0]},
            r"qpos = \[0., 0., 0.\] has shape \(3,\); the MuJoCo model has qpos of size 2.*"
            r"'shoulder' hinge 1, 'elbow' hinge 1",
        ),
        ("double_pendulum.xml", {"qpos": [0.1, np.nan]}, r"qpos\[1\] = nan is not finite"),
        ("double_pendulum.xml", {"qvel": [[0.1, 0.2]]}, r"qvel = .* has shape \(1, 2\)"),
        ("humanoid.xml", {"qpos": np.r_[0, 0, 1, 0, 0, 0, 0, np.zeros(23)]}, None),
    ],
)
def test_inputs_the_model_cannot_use_are_refused(file, options, match):
    """Issue 36: control=[1, 2, 3] (or [nan]) on a model without actuators was ignored without a
    word; a control vector of the wrong length, non-finite, a qpos/qvel of the wrong length or
    non-finite, a zero free-joint quaternion: each a ValueError naming the input, the value
    and the fix (the CLI turns it into exit code 2)."""
    path = MODELS / file
    if match is None:  # the humanoid's free-joint quaternion is zero: no rotation
        m = mujoco.MjModel.from_xml_path(str(path))
        qpos = np.r_[0.0, 0, 1, 0, 0, 0, 0, m.qpos0[7:]]
        options = {"qpos": qpos}
        match = r"qpos\[3:7\] = \[0., 0., 0., 0.\] \(the quaternion of free joint '.*'\) is zero"
    with pytest.raises(ValueError, match=match) as info:
        rbjax.load(path, **options, formulation=rbjax.ScalableDAE())
    assert "Fix:" in str(info.value)


def test_joint_space_refuses_joints_whose_coordinates_are_not_mujocos(tmp_path):
    """Three hinges through one point become one Spherical joint (a quaternion where MuJoCo
    has three angles), a slide before a hinge a Cylindrical joint (angle first), joints with
    ref != 0 on one body are measured from the reference: Loaded.joint_space() names them
    rather than returning coordinates that are not MuJoCo's qpos; rbjax.JointSpace(model)
    still gives rbjax's own."""
    path = tmp_path / "gimbal.xml"
    path.write_text(
        '<mujoco><option><flag contact="disable"/></option><worldbody><body name="gimbal">'
        '<joint name="rx" axis="1 0 0"/><joint name="ry" axis="0 1 0"/>'
        '<joint name="rz" axis="0 0 1"/><geom size=".1"/></body></worldbody></mujoco>'
    )
    loaded = rbjax.load(path, formulation=rbjax.ScalableDAE())
    with pytest.raises(ValueError, match=r"body 'gimbal' .*three hinges.*Fix:"):
        loaded.joint_space()
    assert rbjax.JointSpace(loaded.model).nq == 4
    with pytest.raises(ValueError, match=r"body = 'nope' is not a MuJoCo body.*Fix:"):
        loaded.source.body_point("nope")
