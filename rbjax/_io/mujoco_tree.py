"""MJCF/URDF onto joint coordinates: a compiled ``mujoco.MjModel`` as a :class:`rbjax.JointModel`.

The map is one to one: every MuJoCo body but the world is a body of the tree (its parent, its
frame ``body_pos``/``body_quat`` at qpos0, its inertial frame ``body_ipos``/``body_iquat`` with
the principal moments ``body_inertia``), every joint a joint of the same type in the same
order (``jnt_pos``, ``jnt_axis``, ``qpos0``), so the state IS MuJoCo's qpos/qvel and any number
and order of hinge, slide and ball joints per body loads. Passive forces as MuJoCo's
mj_passive (``jnt_stiffness`` about ``qpos_spring``, ``dof_damping``, ``body_gravcomp``),
``dof_armature`` added to the mass matrix as in mj_crb, actuators on joints as
:class:`rbjax.Actuator` (rbjax/_io/mujoco.py, ``joint_actuator``), gravity. A free joint's body
offset is not used (MuJoCo sets that body's pose from qpos).
"""

from __future__ import annotations

import warnings

import numpy as np

from .._actuators import JointActuators
from .._tree.equality import Connect, JointCoupling, Weld, assemble
from .._tree.model import JointModel, JointState
from .mujoco import (
    _controls,
    _coordinates,
    _mujoco,
    _nactuator,
    _name,
    _quat_matrix,
    disabled,
    joint_actuator,
)

_TYPES = {0: "free", 1: "ball", 2: "slide", 3: "hinge"}


def build_tree_from_mujoco(
    m,
    *,
    qpos=None,
    qvel=None,
    control=None,
    unsupported="warn",
    dtype=None,
    formulation=None,
    contacts: bool = False,
):
    """(JointModel, JointState, timestep, None) of the compiled model ``m`` (module
    docstring); the options are :func:`rbjax.load`'s."""
    from . import unsupported as features

    if unsupported not in ("warn", "error"):
        raise ValueError(
            f"load: unsupported = {unsupported!r} is not a policy. Fix: use 'warn' or 'error'."
        )
    mujoco = _mujoco()
    qpos = None if qpos is None else _coordinates(m, "qpos", qpos)
    qvel = None if qvel is None else _coordinates(m, "qvel", qvel)
    ctrl, signal = _controls(m, control)
    off = disabled(m)
    body_name = [_name(m, mujoco.mjtObj.mjOBJ_BODY, k, f"body{k}") for k in range(m.nbody)]
    joint_name = [_name(m, mujoco.mjtObj.mjOBJ_JOINT, j, f"joint{j}") for j in range(m.njnt)]
    if m.njnt == 0:
        raise ValueError(
            "load: the MuJoCo model has no moving body (no joints). Fix: add a joint (e.g. "
            "<freejoint/>) to the bodies that should move."
        )
    nb = m.nbody - 1
    types = [_TYPES[int(t)] for t in m.jnt_type]
    body_pos = np.array(m.body_pos[1:], dtype=float)
    body_quat = np.array(m.body_quat[1:], dtype=float)
    for j, k in enumerate(types):
        if k == "free":  # MuJoCo sets a free body's pose from qpos, its offset unused
            b = int(m.jnt_bodyid[j]) - 1
            body_pos[b] = 0.0
            body_quat[b] = (1.0, 0.0, 0.0, 0.0)
    inertia = np.zeros((nb, 3, 3))
    for b in range(nb):
        rot = _quat_matrix(np.asarray(m.body_iquat[b + 1], float))
        inertia[b] = rot @ np.diag(m.body_inertia[b + 1]) @ rot.T
    com = np.array(m.body_ipos[1:], dtype=float)
    # the inertia about the body origin's frame axes: Θ = R_i diag(I) R_iᵀ about the centre
    # of mass, with the centre of mass at body_ipos
    stiffness = np.zeros(m.njnt) if off["SPRING"] else np.array(m.jnt_stiffness, float)
    damping = np.zeros(m.nv) if off["DAMPER"] else np.array(m.dof_damping, float)
    gravcomp = np.array(m.body_gravcomp[1:], float)
    gravity = np.zeros(3) if off["GRAVITY"] else np.array(m.opt.gravity, float)
    problems: list[str] = []
    if np.any(gravcomp) and (off["GRAVITY"] or not np.any(gravity)):
        gravcomp[:] = 0.0
    acts = []
    if not off["ACTUATION"]:
        from .mujoco import _group_disabled

        single = {j for j, k in enumerate(types) if k in ("hinge", "slide")}
        on_joint = []
        for a in range(_nactuator(m)):
            name = _name(m, mujoco.mjtObj.mjOBJ_ACTUATOR, a, f"actuator{a}")
            problem = features.actuator_problem(m, a, single, joint_name)
            if problem:
                problems.append(f"actuator '{name}': {problem}")
                continue
            if _group_disabled(m, a):
                continue
            on_joint.append(
                (int(m.actuator_trnid[a, 0]), joint_actuator(m, a, name, ctrl, signal, off))
            )
        for j in dict.fromkeys(jj for jj, _ in on_joint):
            group = tuple(a for jj, a in on_joint if jj == j)
            if m.jnt_actfrclimited[j]:
                acts.append(
                    (j, JointActuators(group, force_range=m.jnt_actfrcrange[j], name=joint_name[j]))
                )
            else:
                acts += [(j, a) for a in group]
    act_gravcomp = [
        joint_name[j]
        for j in range(m.njnt)
        if getattr(m, "jnt_actgravcomp", np.zeros(m.njnt))[j] and np.any(gravcomp)
    ]
    if act_gravcomp:
        problems.append(
            f"gravity compensation through the actuators of joints {act_gravcomp} "
            "(actuatorgravcomp) is applied as a passive force, without the actuators' caps"
        )
    equalities = []
    if not (off["EQUALITY"] or off["CONSTRAINT"]):
        for e in range(m.neq):
            name = _name(m, mujoco.mjtObj.mjOBJ_EQUALITY, e, f"equality{e}")
            eq = _equality(m, e, name)
            if isinstance(eq, str):
                problems.append(eq)
            else:
                equalities.append(eq)
    contact_set, limits = None, None
    if contacts and not (off["CONTACT"] or off["CONSTRAINT"]):
        from .mujoco_contacts import contacts_from_mujoco

        contact_set, missing = contacts_from_mujoco(m, body_name)
        problems += missing
        off = dict(off, CONTACT=True)  # listed above, not again as "contacts"
    if contacts and not (off["LIMIT"] or off["CONSTRAINT"]):
        limits = {
            joint_name[j]: tuple(float(x) for x in m.jnt_range[j])
            for j in range(m.njnt)
            if m.jnt_limited[j] and types[j] in ("hinge", "slide")
        }
        cones = [joint_name[j] for j in range(m.njnt) if m.jnt_limited[j] and types[j] == "ball"]
        if cones:
            problems.append(f"the cone limits of ball joints {cones}")
        off = dict(off, LIMIT=True)  # simulated, or listed above
    problems += features.unsupported(m, off, body_name, joint_name, armature=True)
    if problems:
        text = (
            f"load: {len(problems)} element(s) of the MuJoCo model have no rbjax counterpart "
            "and are NOT simulated:\n  - " + "\n  - ".join(problems)
        )
        if unsupported == "error":
            raise ValueError(text + "\nFix: remove them, or load with unsupported='warn'.")
        warnings.warn(text, UserWarning, stacklevel=4)
    model = JointModel(
        names=body_name[1:],
        parent=[int(p) - 1 for p in m.body_parentid[1:]],
        body_pos=body_pos,
        body_quat=body_quat,
        mass=np.array(m.body_mass[1:], float),
        com=com,
        inertia=inertia,
        joint_types=types,
        joint_body=[int(b) - 1 for b in m.jnt_bodyid],
        joint_names=joint_name,
        joint_pos=np.array(m.jnt_pos, float),
        joint_axis=np.array(m.jnt_axis, float),
        qpos0=np.array(m.qpos0, float),
        damping=damping,
        armature=np.array(m.dof_armature, float),
        stiffness=stiffness,
        qpos_spring=np.array(m.qpos_spring, float),
        gravcomp=gravcomp,
        gravity=gravity,
        actuators=acts,
        equalities=equalities,
        formulation=formulation,
        contacts=contact_set,
        limits=limits,
    )
    q0 = np.array(m.qpos0 if qpos is None else qpos, float)  # a copy: normalised below
    for j, k in enumerate(types):  # MuJoCo normalizes ball and free quaternions
        if k in ("ball", "free"):
            a = int(m.jnt_qposadr[j]) + (3 if k == "free" else 0)
            q0[a : a + 4] /= np.linalg.norm(q0[a : a + 4])
    v0 = np.zeros(m.nv) if qvel is None else qvel
    if equalities:  # MuJoCo's soft equalities pull an open loop closed; exact ones start closed
        q0, v0, gap = assemble(model, q0, np.asarray(v0, float))
        if not gap <= 1e-10:
            warnings.warn(
                f"load: the initial state violates the equalities by {gap:.3g}; it was "
                "assembled (Gauss-Newton steps in the kinetic-energy metric to a closed "
                "configuration near it, velocities projected).",
                UserWarning,
                stacklevel=4,
            )
    state = JointState(0.0, q0, v0)
    if dtype is not None:
        import jax

        model = jax.tree.map(lambda x: x.astype(dtype) if hasattr(x, "astype") else x, model)
        state = jax.tree.map(lambda x: x.astype(dtype), state)
    return model, state, float(m.opt.timestep), None


def _equality(m, e: int, name: str):
    """MuJoCo's equality e as a tree equality (rbjax/_tree/equality.py), or the text naming why
    it is not simulated. MuJoCo's eq_data: connect (anchor on body 1, anchor on body 2), weld
    (anchor on body 2, the same point on body 1, body 2's attitude in body 1's frame), joint
    (polycoef); a site-based connect or weld uses the sites' positions and frames."""
    mujoco = _mujoco()
    kind = int(m.eq_type[e])
    if not m.eq_active0[e]:
        return f"equality '{name}' is inactive at start (rbjax has no switching)"
    data = np.asarray(m.eq_data[e], float)
    o1, o2 = int(m.eq_obj1id[e]), int(m.eq_obj2id[e])
    if kind == int(mujoco.mjtEq.mjEQ_JOINT):
        return JointCoupling(o1, o2, data[0:5], name=name)
    if kind not in (int(mujoco.mjtEq.mjEQ_CONNECT), int(mujoco.mjtEq.mjEQ_WELD)):
        return (
            f"equality '{name}' of type {mujoco.mjtEq(kind).name} (joint coordinates import "
            "connect, weld and joint equalities)"
        )
    if int(m.eq_objtype[e]) == int(mujoco.mjtObj.mjOBJ_SITE):
        b1, b2 = int(m.site_bodyid[o1]) - 1, int(m.site_bodyid[o2]) - 1
        p1, p2 = np.array(m.site_pos[o1], float), np.array(m.site_pos[o2], float)
        f1 = _quat_matrix(np.asarray(m.site_quat[o1], float))
        f2 = _quat_matrix(np.asarray(m.site_quat[o2], float))
    elif kind == int(mujoco.mjtEq.mjEQ_CONNECT):
        b1, b2, p1, p2 = o1 - 1, o2 - 1, data[0:3], data[3:6]
        f1 = f2 = np.eye(3)
    else:
        b1, b2, p2, p1 = o1 - 1, o2 - 1, data[0:3], data[3:6]
        f1, f2 = _quat_matrix(data[6:10] / np.linalg.norm(data[6:10])), np.eye(3)
    if kind == int(mujoco.mjtEq.mjEQ_CONNECT):
        return Connect(b1, b2, p1, p2, name=name)
    return Weld(b1, b2, p1, p2, f1, f2, name=name)
