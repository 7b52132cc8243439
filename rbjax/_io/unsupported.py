"""MuJoCo features that rbjax does not simulate, named when a robot file uses them
(rbjax/_io/mujoco.py warns or raises with these lines; rbjax/_io/mujoco_fields.py is the
field-by-field audit that says which fields land here)."""

from __future__ import annotations

import numpy as np

from .mujoco import _field, _joint_transmission, _mujoco, _nactuator, _name


def unsupported(m, off, body_name, joint_name, *, armature: bool = False) -> list[str]:
    """What the compiled MuJoCo model ``m`` uses that rbjax does not simulate, one line each
    (contacts, limits, friction loss, armature, tendons, sensors, flex, mocap, fluid forces,
    plugins, nonlinear springs and dampers, soft equalities, sleeping), given the disabled
    flags ``off`` and the body and joint names: the loader warns or raises with them.
    ``armature=True``: the formulation simulates armature (joint coordinates), so it is not
    listed."""
    mujoco = _mujoco()

    out = []
    if not off["CONTACT"] and not off["CONSTRAINT"]:
        colliding = [
            _name(m, mujoco.mjtObj.mjOBJ_GEOM, g, f"geom{g}")
            for g in range(m.ngeom)
            if (m.geom_contype[g] or m.geom_conaffinity[g])
        ]
        if m.npair or len(colliding) > 1:
            shown = ", ".join(colliding[:8]) + (" ..." if len(colliding) > 8 else "")
            out.append(
                f"contacts: {len(colliding)} colliding geoms ({shown}) and {m.npair} explicit "
                "pairs (rbjax has no contact model; <option><flag contact='disable'/> silences this)"
            )
    if not off["LIMIT"] and not off["CONSTRAINT"]:
        lim = [joint_name[j] for j in range(m.njnt) if m.jnt_limited[j]]
        if lim:
            out.append(f"joint limits on {lim} (inequality constraints)")
    if not off["FRICTIONLOSS"]:
        fl = [joint_name[j] for j in range(m.njnt) if np.any(_dofs(m, j, m.dof_frictionloss))]
        if fl:
            out.append(f"friction loss on joints {fl}")
    arm = [joint_name[j] for j in range(m.njnt) if np.any(_dofs(m, j, m.dof_armature))]
    if arm and not armature:
        out.append(f"armature (rotor inertia) on joints {arm}")
    if m.ntendon:
        names = [_name(m, mujoco.mjtObj.mjOBJ_TENDON, t, f"tendon{t}") for t in range(m.ntendon)]
        out.append(f"{m.ntendon} tendon(s) {names}")
    if m.nsensor:
        names = [_name(m, mujoco.mjtObj.mjOBJ_SENSOR, s, f"sensor{s}") for s in range(m.nsensor)]
        out.append(f"sensors {names} (compute them from the trajectory)")
    if m.nflex:
        names = [_name(m, mujoco.mjtObj.mjOBJ_FLEX, f, f"flex{f}") for f in range(m.nflex)]
        out.append(f"{m.nflex} flex objects {names}")
    mocap = [body_name[k] for k in range(m.nbody) if m.body_mocapid[k] >= 0]
    if mocap:
        out.append(f"mocap bodies {mocap}")
    if m.opt.density or m.opt.viscosity or np.any(m.opt.wind):
        out.append(
            f"fluid forces (option density={m.opt.density:g}, viscosity={m.opt.viscosity:g}, "
            f"wind={np.asarray(m.opt.wind).tolist()})"
        )
    if hasattr(m, "nplugin") and m.nplugin:
        owners = [f"body '{body_name[k]}'" for k in range(m.nbody) if m.body_plugin[k] >= 0]
        owners += [
            f"actuator '{_name(m, mujoco.mjtObj.mjOBJ_ACTUATOR, a, f'actuator{a}')}'"
            for a in range(_nactuator(m))
            if _field(m, "actuator_plugin", a, -1) >= 0
        ]
        out.append(f"{m.nplugin} plugin(s) (on {', '.join(owners) or 'the model'})")
    # nonlinear joint springs and dampers, plasticity (MuJoCo >= 3.10)
    for field, what, on in (
        ("jnt_stiffnesspoly", "nonlinear stiffness (stiffness polynomial)", not off["SPRING"]),
        ("jnt_springyield", "plastic springs (springyield)", not off["SPRING"]),
    ):
        if hasattr(m, field) and on:
            vals = np.asarray(getattr(m, field)).reshape(m.njnt, -1)
            hit = {joint_name[j]: vals[j].tolist() for j in range(m.njnt) if np.any(vals[j])}
            if hit:
                out.append(f"{what} on joints {hit}")
    if hasattr(m, "dof_dampingpoly") and not off["DAMPER"]:
        vals = np.asarray(m.dof_dampingpoly).reshape(m.nv, -1)
        hit = {
            joint_name[j]: _dofs(m, j, vals).tolist()
            for j in range(m.njnt)
            if np.any(_dofs(m, j, vals))
        }
        if hit:
            out.append(f"nonlinear damping (damping polynomial) on joints {hit}")
    # equality softness: rbjax holds equalities exactly; MuJoCo's default softness is its
    # solver's regularization, a file that sets its own asks for a compliant element
    if not off["EQUALITY"] and not off["CONSTRAINT"]:
        soft = []
        for e in range(m.neq):
            weld = int(m.eq_type[e]) == int(mujoco.mjtEq.mjEQ_WELD)
            if (
                not np.allclose(m.eq_solref[e], _SOLREF)
                or not np.allclose(m.eq_solimp[e], _SOLIMP)
                or (weld and m.eq_data[e, 10] != 1.0)
            ):
                soft.append(_name(m, mujoco.mjtObj.mjOBJ_EQUALITY, e, f"equality{e}"))
        if soft:
            out.append(
                f"softness of equalities {soft} (solref/solimp/torquescale other than "
                "MuJoCo's defaults; rbjax holds them exactly)"
            )
    if int(m.opt.enableflags) & int(getattr(mujoco.mjtEnableBit, "mjENBL_SLEEP", 0)):
        out.append("sleeping (option flag sleep: MuJoCo freezes trees at rest)")
    return out


# MuJoCo's default constraint softness (mj_defaultSolRefImp)
_SOLREF = (0.02, 1.0)
_SOLIMP = (0.9, 0.95, 0.001, 0.5, 2.0)


def _dofs(m, j, field):
    n = {0: 6, 1: 3, 2: 1, 3: 1}[int(m.jnt_type[j])]
    a = int(m.jnt_dofadr[j])
    return np.asarray(field[a : a + n])


def actuator_problem(m, a, single, joint_name):
    """What of actuator ``a`` rbjax does not simulate ("; "-joined), or None."""
    mujoco = _mujoco()

    if not _joint_transmission(m, a):
        return f"transmission {mujoco.mjtTrn(int(m.actuator_trntype[a])).name} (rbjax: joints)"
    j = int(m.actuator_trnid[a, 0])
    if j not in single:
        return f"drives joint '{joint_name[j]}', which is not a single hinge or slide"
    out = []
    if int(_field(m, "actuator_ctrlnum", a, 1)) != 1:
        out.append(f"{int(m.actuator_ctrlnum[a])} controls (rbjax: one per actuator)")
    if int(m.actuator_dyntype[a]) != int(mujoco.mjtDyn.mjDYN_NONE):
        out.append(
            f"activation dynamics (dyntype {mujoco.mjtDyn(int(m.actuator_dyntype[a])).name}) "
            "are not modelled"
        )
    if int(m.actuator_gaintype[a]) not in (
        int(mujoco.mjtGain.mjGAIN_FIXED),
        int(mujoco.mjtGain.mjGAIN_AFFINE),
    ):
        out.append(f"gain type {mujoco.mjtGain(int(m.actuator_gaintype[a])).name}")
    if int(m.actuator_biastype[a]) not in (
        int(mujoco.mjtBias.mjBIAS_NONE),
        int(mujoco.mjtBias.mjBIAS_AFFINE),
    ):
        out.append(f"bias type {mujoco.mjtBias(int(m.actuator_biastype[a])).name}")
    if int(_field(m, "actuator_plugin", a, -1)) >= 0:
        out.append("an actuator plugin")
    for field in ("actuator_damping", "actuator_armature", "actuator_dampingpoly"):
        if hasattr(m, field) and np.any(np.asarray(getattr(m, field))[a] != 0):
            value = np.asarray(getattr(m, field))[a]
            out.append(f"{field.split('_', 1)[1]} = {value} is not modelled")
    if float(_field(m, "actuator_delay", a, 0.0)) != 0.0:
        out.append(f"a control delay of {float(m.actuator_delay[a]):g} s is not modelled")
    return "; ".join(out) or None
