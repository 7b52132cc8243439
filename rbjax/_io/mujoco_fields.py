"""What the MJCF/URDF import does with every field of MuJoCo's compiled model that can change
the dynamics: the audit behind ``rbjax.load`` (rbjax/_io/mujoco.py), mirrored in the table of
docs/tutorials/import-mjcf.md and enforced by tests/test_reliability_import.py, which lists
``mujoco.MjModel``'s fields and fails on one that is not here.

Each entry is (status, why):

* ``simulated``: imported, and the loaded model's accelerations equal MuJoCo's to round-off
  with the field set to a non-default value (the test's probes);
* ``named``: not simulated; a non-default value is named, with the element and the value, in
  the loader's one warning (a ValueError with ``unsupported="error"``);
* ``no effect``: does not change MuJoCo's accelerations in what the loader imports (contacts
  off, or it acts only through an element that is itself named); the test checks that MuJoCo's
  own accelerations do not change;
* ``derived``: computed by MuJoCo's compiler from other fields, or an address, count, id or
  structure the loader reads to build the model.

Keys are ``mjModel`` field names, ``opt.<name>`` for ``mjOption``, ``flag.<NAME>`` for the bits
of ``disableflags`` / ``enableflags``, and ``prefix*`` for a whole family (every ``tendon_``
field: a tendon is named as a whole).
"""

from __future__ import annotations

SIMULATED = "simulated"
NAMED = "named"
NO_EFFECT = "no effect"
DERIVED = "derived"

_STRUCTURE = (DERIVED, "the tree the loader builds (bodies, joints, addresses)")
_COMPILED = (DERIVED, "computed by MuJoCo's compiler from the fields it is derived from")
_CONTACT = (NO_EFFECT, "contacts only (named when contacts are on: rbjax has no contact model)")
_USER = (NO_EFFECT, "user data or visual grouping")
_LIMIT = (NO_EFFECT, "acts only with a joint limit, which is named")
_ACTIVATION = (NO_EFFECT, "acts only with activation dynamics (dyntype), which are named")
_SOLVER = (NO_EFFECT, "MuJoCo's constraint solver or collision detection; rbjax's are exact")

FIELDS: dict[str, tuple[str, str]] = {
    # ------------------------------------------------------------------ bodies
    "body_pos": (SIMULATED, "body frames, the joints' places"),
    "body_quat": (SIMULATED, "body frames; rbjax's attitude is MuJoCo's xquat"),
    "body_ipos": (SIMULATED, "centre of mass (rbjax's body position)"),
    "body_iquat": (SIMULATED, "principal axes: the inertia in body axes"),
    "body_mass": (SIMULATED, "mass (welded bodies merged)"),
    "body_inertia": (SIMULATED, "central inertia (parallel-axis theorem for welded bodies)"),
    "body_gravcomp": (SIMULATED, "the force −c·m·g at the centre of mass (PointForce)"),
    "body_mocapid": (NAMED, "mocap bodies (moved by the user, welded to the world in rbjax)"),
    "body_plugin": (NAMED, "plugins"),
    "body_parentid": _STRUCTURE,
    "body_rootid": _STRUCTURE,
    "body_weldid": _STRUCTURE,
    "body_treeid": _STRUCTURE,
    "body_jntnum": _STRUCTURE,
    "body_jntadr": _STRUCTURE,
    "body_dofnum": _STRUCTURE,
    "body_dofadr": _STRUCTURE,
    "body_geomnum": _STRUCTURE,
    "body_geomadr": _STRUCTURE,
    "body_sameframe": _COMPILED,
    "body_simple": _COMPILED,
    "body_subtreemass": _COMPILED,
    "body_invweight0": _COMPILED,
    "body_bvhadr": _CONTACT,
    "body_bvhnum": _CONTACT,
    "body_contype": _CONTACT,
    "body_conaffinity": _CONTACT,
    "body_margin": _CONTACT,
    "body_user": _USER,
    # ------------------------------------------------------------------ joints
    "jnt_type": _STRUCTURE,
    "jnt_bodyid": _STRUCTURE,
    "jnt_qposadr": _STRUCTURE,
    "jnt_dofadr": _STRUCTURE,
    "jnt_pos": (SIMULATED, "joint anchor"),
    "jnt_axis": (SIMULATED, "joint axis"),
    "jnt_stiffness": (SIMULATED, "linear spring of a hinge or slide (ball, free: named)"),
    "jnt_stiffnesspoly": (NAMED, "nonlinear spring terms"),
    "jnt_springyield": (NAMED, "plastic springs"),
    "jnt_plasticadr": (DERIVED, "address of the plastic state (springyield is named)"),
    "jnt_actfrclimited": (SIMULATED, "cap on the joint's total actuator force (JointActuators)"),
    "jnt_actfrcrange": (SIMULATED, "cap on the joint's total actuator force (JointActuators)"),
    "jnt_actgravcomp": (
        SIMULATED,
        "gravity compensation through the actuators: the same force; named where MuJoCo "
        "drops it (no actuators, actuation disabled) or caps it",
    ),
    "jnt_actuatorid": (DERIVED, "the actuator whose damping the joint inherits (named)"),
    "jnt_limited": (NAMED, "joint limits (inequality constraints)"),
    "jnt_range": (NAMED, "joint limits (inequality constraints)"),
    "jnt_margin": _LIMIT,
    "jnt_solref": _LIMIT,
    "jnt_solimp": _LIMIT,
    "jnt_group": _USER,
    "jnt_user": _USER,
    # ------------------------------------------------------------------ degrees of freedom
    "dof_damping": (SIMULATED, "linear damper of a hinge or slide (ball, free: named)"),
    "dof_dampingpoly": (NAMED, "nonlinear damping terms"),
    "dof_armature": (NAMED, "rotor inertia added to the joint-space mass matrix"),
    "dof_frictionloss": (NAMED, "dry friction (a constraint)"),
    "dof_solref": (NO_EFFECT, "acts only with friction loss, which is named"),
    "dof_solimp": (NO_EFFECT, "acts only with friction loss, which is named"),
    "dof_bodyid": _STRUCTURE,
    "dof_jntid": _STRUCTURE,
    "dof_parentid": _STRUCTURE,
    "dof_treeid": _STRUCTURE,
    "dof_Madr": _STRUCTURE,
    "dof_simplenum": _COMPILED,
    "dof_M0": _COMPILED,
    "dof_invweight0": _COMPILED,
    "dof_length": _COMPILED,
    # ------------------------------------------------------------------ actuators
    "actuator_trntype": (SIMULATED, "joint and jointinparent on a hinge or slide; others named"),
    "actuator_trnid": (SIMULATED, "the joint driven"),
    "actuator_gear": (SIMULATED, "gear (length = gear · qpos, force on the joint gear · f)"),
    "actuator_gaintype": (SIMULATED, "fixed and affine gains; others (muscle, ...) named"),
    "actuator_gainprm": (SIMULATED, "gain parameters (fixed: the first only, as MuJoCo)"),
    "actuator_biastype": (SIMULATED, "none and affine bias; others named"),
    "actuator_biasprm": (SIMULATED, "bias parameters"),
    "actuator_ctrllimited": (SIMULATED, "control clamped to ctrlrange, as MuJoCo"),
    "actuator_ctrlrange": (SIMULATED, "control clamped to ctrlrange, as MuJoCo"),
    "actuator_forcelimited": (SIMULATED, "force clamped to forcerange"),
    "actuator_forcerange": (SIMULATED, "force clamped to forcerange"),
    "actuator_group": (SIMULATED, "an actuator in a group of opt.disableactuator applies nothing"),
    "actuator_dyntype": (NAMED, "activation dynamics"),
    "actuator_dynprm": _ACTIVATION,
    "actuator_actlimited": _ACTIVATION,
    "actuator_actrange": _ACTIVATION,
    "actuator_actearly": _ACTIVATION,
    "actuator_actadr": _ACTIVATION,
    "actuator_actnum": _ACTIVATION,
    "actuator_damping": (NAMED, "actuator damping"),
    "actuator_dampingpoly": (NAMED, "actuator damping"),
    "actuator_armature": (NAMED, "actuator armature"),
    "actuator_delay": (NAMED, "control delay"),
    "actuator_history": (DERIVED, "the delay's buffer (delay is named)"),
    "actuator_historyadr": (DERIVED, "the delay's buffer (delay is named)"),
    "actuator_plugin": (NAMED, "actuator plugins"),
    "actuator_cranklength": (NO_EFFECT, "slider-crank transmission only, which is named"),
    "actuator_lengthrange": (NO_EFFECT, "muscles only (gain type muscle is named)"),
    "actuator_ctrladr": (DERIVED, "where the actuator's controls sit in ctrl"),
    "actuator_ctrlnum": (DERIVED, "controls per actuator; more than one is named"),
    "actuator_ctrlspec": (DERIVED, "control chart of SO3 and DC-motor gains (named)"),
    "actuator_outadr": (DERIVED, "where the actuator's forces sit"),
    "actuator_outnum": (DERIVED, "forces per actuator (one for a joint transmission)"),
    "actuator_acc0": _COMPILED,
    "actuator_length0": _COMPILED,
    "actuator_user": _USER,
    # ------------------------------------------------------------------ tendons, flex, contacts
    "tendon_*": (NAMED, "every tendon is named"),
    "flex*": (NAMED, "every flex object is named (flex_ and flexedge_ fields)"),
    "geom_*": (
        NO_EFFECT,
        "contacts (named when on) and visuals; geom masses are compiled into body_mass and "
        "body_inertia",
    ),
    "geom_fluid": (NO_EFFECT, "acts only with fluid forces (opt.density/viscosity), named"),
    "pair_*": _CONTACT,
    # ------------------------------------------------------------------ equality constraints
    "eq_type": (SIMULATED, "connect and weld, exact; other types named"),
    "eq_obj1id": (SIMULATED, "the constrained bodies or sites"),
    "eq_obj2id": (SIMULATED, "the constrained bodies or sites"),
    "eq_objtype": (SIMULATED, "bodies or sites"),
    "eq_data": (SIMULATED, "anchors and relative pose (weld torquescale other than 1: named)"),
    "eq_active0": (NAMED, "an equality inactive at the start"),
    "eq_solref": (NAMED, "softness other than MuJoCo's default (rbjax holds equalities exactly)"),
    "eq_solimp": (NAMED, "softness other than MuJoCo's default (rbjax holds equalities exactly)"),
    # ------------------------------------------------------------------ reference configuration
    "qpos0": (SIMULATED, "reference configuration and joint ref (the default initial state)"),
    "qpos_spring": (SIMULATED, "spring rest positions (springref)"),
    # ------------------------------------------------------------------ options
    "opt.timestep": (SIMULATED, "Loaded.timestep"),
    "opt.gravity": (SIMULATED, "Model.gravity"),
    "opt.density": (NAMED, "fluid forces"),
    "opt.viscosity": (NAMED, "fluid forces"),
    "opt.wind": (NAMED, "fluid forces"),
    "opt.disableactuator": (SIMULATED, "actuators of the disabled groups apply nothing"),
    "opt.disableflags": (DERIVED, "its bits are listed as flag.*"),
    "opt.enableflags": (DERIVED, "its bits are listed as flag.*"),
    "opt.integrator": (
        NO_EFFECT,
        "the discretization, not the equations of motion (rbjax's integrator is an argument "
        "of rollout); MuJoCo's 'discrete' integrator also puts implicit damping into qacc",
    ),
    "opt.magnetic": (NO_EFFECT, "magnetometer sensors only"),
    "opt.sleep_tolerance": (NO_EFFECT, "acts only with flag SLEEP, which is named"),
    "opt.o_margin": _CONTACT,
    "opt.o_solref": _CONTACT,
    "opt.o_solimp": _CONTACT,
    "opt.o_friction": _CONTACT,
    "opt.impratio": _SOLVER,
    "opt.cone": _SOLVER,
    "opt.jacobian": _SOLVER,
    "opt.solver": _SOLVER,
    "opt.iterations": _SOLVER,
    "opt.tolerance": _SOLVER,
    "opt.ls_iterations": _SOLVER,
    "opt.ls_tolerance": _SOLVER,
    "opt.noslip_iterations": _SOLVER,
    "opt.noslip_tolerance": _SOLVER,
    "opt.ccd_iterations": _SOLVER,
    "opt.ccd_tolerance": _SOLVER,
    "opt.sdf_iterations": _SOLVER,
    "opt.sdf_initpoints": _SOLVER,
    # ------------------------------------------------------------------ flags
    "flag.CONSTRAINT": (SIMULATED, "no equalities, limits, friction loss or contacts"),
    "flag.EQUALITY": (SIMULATED, "no equalities"),
    "flag.FRICTIONLOSS": (SIMULATED, "no friction loss (nothing to name)"),
    "flag.LIMIT": (SIMULATED, "no joint limits (nothing to name)"),
    "flag.CONTACT": (SIMULATED, "no contacts (nothing to name)"),
    "flag.SPRING": (SIMULATED, "no joint springs"),
    "flag.DAMPER": (SIMULATED, "no joint dampers"),
    "flag.GRAVITY": (SIMULATED, "no gravity, no gravity compensation"),
    "flag.ACTUATION": (SIMULATED, "no actuator forces"),
    "flag.CLAMPCTRL": (SIMULATED, "controls not clamped to ctrlrange"),
    "flag.WARMSTART": _SOLVER,
    "flag.FILTERPARENT": _CONTACT,
    "flag.MIDPHASE": _CONTACT,
    "flag.NATIVECCD": _CONTACT,
    "flag.MULTICCD": _CONTACT,
    "flag.ISLAND": _SOLVER,
    "flag.REFSAFE": _SOLVER,
    "flag.SENSOR": (NO_EFFECT, "sensors only (they are named)"),
    "flag.EULERDAMP": (NO_EFFECT, "Euler's implicit damping: the discretization"),
    "flag.AUTORESET": (NO_EFFECT, "MuJoCo's reset of a diverged state; rbjax reports RESULTS"),
    "flag.OVERRIDE": _CONTACT,
    "flag.ENERGY": (NO_EFFECT, "energy bookkeeping"),
    "flag.FWDINV": (NO_EFFECT, "a forward/inverse comparison"),
    "flag.INVDISCRETE": (NO_EFFECT, "inverse dynamics only"),
    "flag.DIAGEXACT": _SOLVER,
    "flag.IPC": _CONTACT,
    "flag.SPECULATIVE": _CONTACT,
    "flag.SLEEP": (NAMED, "sleeping: MuJoCo freezes trees at rest"),
}

# MjModel fields whose prefixes make them part of the dynamics audit
PREFIXES = ("body_", "jnt_", "dof_", "actuator_", "tendon_", "eq_", "geom_", "flex", "pair_")
EXACT = ("qpos0", "qpos_spring")


def status(key: str) -> tuple[str, str]:
    """(status, why) of a field, ``opt.`` option or ``flag.`` bit: its own entry, else its
    family's (``prefix*``); KeyError when the audit does not list it."""
    if key in FIELDS:
        return FIELDS[key]
    family = [k for k in FIELDS if k.endswith("*") and key.startswith(k[:-1])]
    if family:
        return FIELDS[max(family, key=len)]
    raise KeyError(key)
