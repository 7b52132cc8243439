"""MJCF and URDF import through MuJoCo's compiler (the optional ``mujoco`` extra).

MuJoCo compiles the file (MJCF or URDF) into an ``MjModel``: masses, inertias, joint frames and
the reference configuration ``qpos0`` with every default, include and unit applied. This module
maps that compiled model onto rbjax's maximal coordinates:

* every MuJoCo body that moves becomes an rbjax :class:`~rbjax.Body`; its frame is MuJoCo's body
  frame (so rbjax's quaternion is MuJoCo's ``xquat``) and its position is its centre of mass
  (MuJoCo's ``xipos``), its inertia the central inertia in body axes;
* a body without joints is welded to its parent: it is merged into it (masses, centres of mass
  and inertias combined by the parallel-axis theorem), or into the world;
* the joints of a body become one rbjax joint between the parent and the body, built in the
  reference configuration: hinge → :class:`~rbjax.Revolute`, slide → :class:`~rbjax.Translational`,
  ball → :class:`~rbjax.Spherical`, free → none; two perpendicular hinges through one point →
  :class:`~rbjax.Universal`, three independent hinges through one point → :class:`~rbjax.Spherical`,
  a hinge and a slide on one axis → :class:`~rbjax.Cylindrical`;
* ``equality`` connect → :class:`~rbjax.Spherical`, weld → :class:`~rbjax.Fixed`: exact bilateral
  constraints (MuJoCo enforces equalities softly, through ``solref``/``solimp``; rbjax holds them
  to round-off, so a loop drifts by the integrator's error only);
* joint stiffness and damping → :class:`~rbjax.RotationalSpringDamper` (hinge) or
  :class:`~rbjax.AxialSpringDamper` (slide); actuators with a fixed or affine gain and no or
  affine bias on a hinge or slide (transmission ``joint`` or ``jointinparent``) → the same
  forces with an :class:`~rbjax.Actuator`, the actuators of a joint with
  ``actuatorfrcrange`` summed and capped in one :class:`~rbjax.JointActuators` (MuJoCo's
  mj_fwdActuation: qfrc_actuator = Σ gear·clamp(force, forcerange), clamped per joint);
  actuators in a group of ``actuatorgroupdisable`` apply nothing, as in MuJoCo;
* body ``gravcomp`` → a :class:`~rbjax.PointForce` −gravcomp·m·g at the body's centre of mass;
* gravity, the timestep and the disable flags from ``<option>``.

Everything else with dynamics (contacts, joint limits, friction loss, armature, tendons,
actuators with activation dynamics, fluid forces, mocap bodies, ...) is listed by name and
value in ONE warning (or ValueError with ``unsupported="error"``), never dropped silently:
rbjax/_io/mujoco_fields.py goes through every field of MuJoCo's compiled model. The user's
``qpos``, ``qvel`` and ``control`` are checked against the model (sizes, finite values, a
model without actuators) and refused by name.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
import warnings
from typing import Any

import equinox as eqx
import jax
import numpy as np

from .._actuators import Actuator, JointActuators
from .._analysis.joint_space import JointSpace
from .._body import Body
from .._errors import _short, fail
from .._forces import PointForce
from .._joints import (
    Cylindrical,
    Fixed,
    Revolute,
    Spherical,
    Translational,
    Universal,
    _perpendicular,
)
from .._model import Model
from .._springs import AxialSpringDamper, RotationalSpringDamper
from .._state import State, make_state
from .._topology import GROUND


def _mujoco() -> Any:
    """The ``mujoco`` module (an optional extra, imported when a file is loaded)."""
    return importlib.import_module("mujoco")


@dataclasses.dataclass(frozen=True)
class JointMap:
    """Where a MuJoCo joint went: its ``name``, MuJoCo ``type`` ("hinge", "slide", "ball",
    "free"), the MuJoCo body it moves, the rbjax ``joint`` index in ``Model.joints`` (None for a
    free joint), the rbjax ``body`` index, its ``qpos``/``qvel`` addresses and its reference
    value ``ref`` (qpos0)."""

    name: str
    type: str
    body: int
    joint: int | None
    qpos: int
    qvel: int
    ref: Any


class MujocoSource:
    """The compiled MuJoCo model behind an imported rbjax model, with the maps between the
    two: ``mjmodel`` (``mujoco.MjModel``), ``body_of`` (MuJoCo body id → rbjax body index, −1 for
    the world and bodies welded to it), ``joints`` (a :class:`JointMap` per MuJoCo joint),
    ``actuators`` (MuJoCo actuator names in actuator order), ``parents`` (per rbjax body the
    index in ``Model.joints`` of the joint that places it, None for a free joint) and
    ``origins`` (nb, 3): per rbjax body, the origin of its MuJoCo body frame from its centre of
    mass, in body axes (rbjax's body position is the centre of mass, MuJoCo's free-joint
    ``qpos`` the body frame's origin; the axes are the same)."""

    def __init__(
        self, mjmodel, body_of, joints, actuators, movers, parents=None, frames=None, inexact=()
    ):
        self.mjmodel = mjmodel
        self.body_of = tuple(body_of)
        self.joints = tuple(joints)
        self.actuators = tuple(actuators)
        self._movers = tuple(movers)  # rbjax body index → MuJoCo body id
        self.parents = tuple(parents) if parents is not None else (None,) * len(movers)
        self._frames: tuple[Any, ...] = tuple(frames) if frames is not None else ()
        self.origins = np.array(
            [self._frames[b][2] for b in movers] if self._frames else np.zeros((len(movers), 3))
        ).reshape(len(movers), 3)
        self._inexact = tuple(inexact)

    def state(self, qpos=None, qvel=None, *, dtype=None) -> State:
        """The rbjax :class:`~rbjax.State` of MuJoCo's ``qpos``, ``qvel`` (default qpos0, rest):
        MuJoCo's own forward kinematics (``mj_kinematics``; ball and free-joint quaternions
        normalized as MuJoCo does), each body's centre of mass and its velocity (``mj_jac``
        there), attitude ``xquat`` and angular velocity in body axes."""
        mujoco = _mujoco()

        m = self.mjmodel
        d = mujoco.MjData(m)
        d.qpos[:] = m.qpos0 if qpos is None else _coordinates(m, "qpos", qpos)
        d.qvel[:] = 0.0 if qvel is None else _coordinates(m, "qvel", qvel)
        mujoco.mj_kinematics(m, d)
        mujoco.mj_comPos(m, d)
        pos, quat, vel, omega = [], [], [], []
        for b in self._movers:
            com = _composite(m, d, b, self.body_of)[1]
            jacp, jacr = np.zeros((3, m.nv)), np.zeros((3, m.nv))
            mujoco.mj_jac(m, d, jacp, jacr, com, b)
            rot = d.xmat[b].reshape(3, 3)
            pos.append(com)
            quat.append(np.array(d.xquat[b]))
            vel.append(jacp @ d.qvel)
            omega.append(rot.T @ (jacr @ d.qvel))
        return make_state(
            position=np.array(pos),
            quaternion=np.array(quat),
            velocity=np.array(vel),
            omega_body=np.array(omega),
            dtype=dtype,
        )

    def joint_space(self, model) -> JointSpace:
        """:class:`rbjax.JointSpace` of the imported ``model`` in MuJoCo's coordinates: its
        positions and velocities are MuJoCo's ``qpos`` and ``qvel`` (same order and size; a free
        joint's position is the body frame's origin and its velocity that origin's world
        velocity followed by the body-axes angular velocity; equality constraints are loops),
        so its mass matrix and bias are MuJoCo's ``mj_fullM`` and ``qfrc_bias``. Refused
        (ValueError naming the bodies) for bodies whose several joints rbjax holds in other
        coordinates: three hinges (a quaternion), a slide before a hinge, ``ref`` ≠ 0."""
        if self._inexact:
            raise ValueError(
                f"MujocoSource.joint_space: {'; '.join(self._inexact)}. Fix: use "
                "rbjax.JointSpace(model) (rbjax's own coordinates of these joints), or give "
                "each of these joints a body of its own in the file."
            )
        if model.nb != len(self._movers) or len(model.joints) < sum(
            p is not None for p in self.parents
        ):
            raise ValueError(
                f"MujocoSource.joint_space: the model has {model.nb} bodies and "
                f"{len(model.joints)} joints; the file's has {len(self._movers)} bodies. Fix: "
                "pass the model rbjax.load returned (its leaves may be changed, not its bodies "
                "and joints)."
            )
        return JointSpace(model, parents=self.parents, origins=self.origins)

    def body_point(self, body, point=(0.0, 0.0, 0.0)):
        """(rbjax body index, point in its body coordinates) of ``point`` given in the frame of
        MuJoCo body ``body`` (name or id): the arguments of :meth:`rbjax.JointSpace.point` and
        :meth:`rbjax.JointSpace.jacobian` for a MuJoCo point (MuJoCo measures from the body
        frame's origin, rbjax from the centre of mass of the body with everything welded to
        it). A body welded to the world gives (−1, the world point)."""
        mujoco = _mujoco()

        k = body
        if isinstance(body, str):
            k = mujoco.mj_name2id(self.mjmodel, mujoco.mjtObj.mjOBJ_BODY, body)
        if not 0 <= int(k) < self.mjmodel.nbody:
            raise ValueError(
                f"MujocoSource.body_point: body = {body!r} is not a MuJoCo body of this model. "
                "Fix: give a body name or id (0 <= id < nbody)."
            )
        i, axes, origin = self._frames[int(k)]
        return i, origin + axes @ np.asarray(point, dtype=float)


def _coordinates(m, field, x):
    """MuJoCo's ``qpos`` (nq,) or ``qvel`` (nv,) given by the user, as float64, refused by
    name when it is not that many finite numbers or a ball/free quaternion is zero (MuJoCo
    normalizes any other length, and so does the state built from it)."""
    n = m.nq if field == "qpos" else m.nv
    fix = f"pass {n} finite numbers in MuJoCo's {field} order ({_layout(m, field)})"
    try:
        arr = np.asarray(x, dtype=float)
    except (TypeError, ValueError):
        fail(f"load: {field}", x, "is not an array of numbers", fix)
    if arr.shape != (n,):
        fail(
            f"load: {field}",
            x,
            f"has shape {arr.shape}; the MuJoCo model has {field} of size {n}",
            fix,
        )
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        fail(f"load: {field}[{bad[0]}]", arr[bad[0]], "is not finite", fix)
    if field == "qpos":
        for j in range(m.njnt):
            kind = _KINDS[int(m.jnt_type[j])]
            if kind in ("ball", "free"):
                a = int(m.jnt_qposadr[j]) + (3 if kind == "free" else 0)
                if not np.linalg.norm(arr[a : a + 4]) > 1e-12:
                    name = _name(m, _mujoco().mjtObj.mjOBJ_JOINT, j, f"joint{j}")
                    fail(
                        f"load: qpos[{a}:{a + 4}]",
                        arr[a : a + 4],
                        f"(the quaternion of {kind} joint '{name}') is zero",
                        "give a rotation as a quaternion (w, x, y, z); MuJoCo normalizes it",
                    )
    return arr


def _layout(m, field) -> str:
    """MuJoCo's joints in qpos/qvel order with their sizes, for messages (the first 8)."""
    mujoco = _mujoco()

    sizes = {"free": (7, 6), "ball": (4, 3), "slide": (1, 1), "hinge": (1, 1)}
    parts = []
    for j in range(m.njnt):
        kind = _KINDS[int(m.jnt_type[j])]
        n = sizes[kind][0 if field == "qpos" else 1]
        parts.append(f"'{_name(m, mujoco.mjtObj.mjOBJ_JOINT, j, f'joint{j}')}' {kind} {n}")
    return "joints " + ", ".join(parts[:8]) + (", ..." if len(parts) > 8 else "")


def _controls(m, control):
    """(constant ctrl (nu,), signal u(t)) of ``control``: None, nu finite numbers or a function
    of time returning (nu,) (e.g. a ControlSequence of values (n, nu)); anything else is
    refused by name (a control the model cannot use is never ignored)."""
    if control is None:
        return None, None
    nu = int(m.nu)
    names = [f"'{n}'" for n in _control_names(m)]
    fix = (
        f"pass {nu} finite numbers, one per control in MuJoCo's ctrl order "
        f"({', '.join(names[:8])}{', ...' if len(names) > 8 else ''}), or a function of time "
        f"returning them (rbjax.ControlSequence with values of shape (n, {nu}))"
    )
    if nu == 0:
        shown = f"<{type(control).__name__}>" if callable(control) else _short(control)
        raise ValueError(
            f"load: control = {shown} is given, but the MuJoCo model has no actuators "
            "(nu = 0). Fix: remove control=, or add <actuator> elements to the file."
        )
    if callable(control):
        shape = jax.eval_shape(control, 0.0).shape
        if shape != (nu,):
            raise ValueError(
                f"load: control(t) = <{type(control).__name__}> returns shape {shape}, not "
                f"({nu},). Fix: {fix}."
            )
        return None, control
    try:
        arr = np.asarray(control, dtype=float)
    except (TypeError, ValueError):
        fail("load: control", control, "is not an array of numbers", fix)
    if arr.shape != (nu,):
        fail("load: control", control, f"has shape {arr.shape}, not ({nu},)", fix)
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        fail(f"load: control[{bad[0]}]", arr[bad[0]], "is not finite", fix)
    return arr, None


def _control_names(m) -> list[str]:
    """The name of each entry of MuJoCo's ctrl (an actuator with several controls: name[k])."""
    mujoco = _mujoco()

    out = []
    for a in range(_nactuator(m)):
        name = _name(m, mujoco.mjtObj.mjOBJ_ACTUATOR, a, f"actuator{a}")
        n = int(_field(m, "actuator_ctrlnum", a, 1))
        out += [name] if n == 1 else [f"{name}[{k}]" for k in range(n)]
    return out


def _nactuator(m) -> int:
    """Number of actuators (MuJoCo ≥ 3.12 counts them apart from their controls, ``nu``)."""
    return int(getattr(m, "nactuator", m.nu))


def _field(m, name, i, default):
    """``m.<name>[i]``, or ``default`` in a MuJoCo without that field."""
    return getattr(m, name)[i] if hasattr(m, name) else default


def _name(m, kind, i, default):
    mujoco = _mujoco()

    name = mujoco.mj_id2name(m, kind, i)
    return name if name else default


def _composite(m, d, b, body_of):
    """Mass, world centre of mass and world central inertia of mover ``b`` together with every
    body welded to it (parallel-axis theorem)."""
    members = [k for k in range(m.nbody) if _root_mover(m, k) == b]
    mass = sum(float(m.body_mass[k]) for k in members)
    if mass <= 0.0:
        return 0.0, np.array(d.xpos[b]), np.zeros((3, 3))
    com = sum(float(m.body_mass[k]) * d.xipos[k] for k in members) / mass
    inertia = np.zeros((3, 3))
    for k in members:
        rot = d.ximat[k].reshape(3, 3)
        r = d.xipos[k] - com
        inertia += rot @ np.diag(m.body_inertia[k]) @ rot.T
        inertia += m.body_mass[k] * (np.dot(r, r) * np.eye(3) - np.outer(r, r))
    return mass, np.array(com), inertia


def _root_mover(m, k) -> int:
    """The body that carries ``k``: k itself if it has joints, else its nearest ancestor with
    joints (0: the world)."""
    while k > 0 and m.body_jntnum[k] == 0:
        k = int(m.body_parentid[k])
    return k


_KINDS = {0: "free", 1: "ball", 2: "slide", 3: "hinge"}


def load_mujoco(path, **options):
    """Compile ``path`` (MJCF ``.xml`` or URDF) with MuJoCo and build the rbjax model (module
    docstring); ``options`` are :func:`build_from_mujoco`'s. Returns (model, state, timestep,
    source)."""
    try:
        mujoco = _mujoco()
    except ImportError as e:  # pragma: no cover - the extra is part of the test install
        raise ValueError(
            f"rbjax.load({str(path)!r}) needs the optional 'mujoco' package to read MJCF/URDF. "
            "Fix: pip install 'rbjax[mujoco]'."
        ) from e
    path = os.fspath(path)
    m = _compile(mujoco, path, options.pop("meshes", True))
    return build_from_mujoco(m, **options)


def _compile(mujoco, path: str, meshes: bool = True):
    """MuJoCo's compiled ``MjModel`` of the file at ``path``; its errors (a missing mesh, a
    ROS ``package://`` URI, malformed XML, a word in a numeric attribute) as ONE line of
    ValueError with a "Fix:". ``meshes=False`` compiles it without its mesh geoms (MjSpec:
    geoms of type mesh and the mesh assets deleted), which changes no mass or inertia when
    every body that carries one has an explicit ``<inertial>`` (URDF links usually do) and the
    compiler does not take inertias from geoms (``inertiafromgeom="true"``); otherwise refused."""
    try:
        if meshes:
            return mujoco.MjModel.from_xml_path(path)
        spec = mujoco.MjSpec.from_file(path)
        dropped = [g for g in spec.geoms if g.type == mujoco.mjtGeom.mjGEOM_MESH]
        from_geoms = spec.compiler.inertiafromgeom
        if dropped and from_geoms == mujoco.mjtInertiaFromGeom.mjINERTIAFROMGEOM_TRUE:
            who = 'every body (the file sets <compiler inertiafromgeom="true">)'
        else:
            who = ", ".join(
                dict.fromkeys(
                    repr(g.parent.name) if g.parent.name else "an unnamed body"
                    for g in dropped
                    if not g.parent.explicitinertial
                    and from_geoms == mujoco.mjtInertiaFromGeom.mjINERTIAFROMGEOM_AUTO
                )
            )
        if who:
            raise ValueError(
                f"load({path!r}, meshes=False): the mass and inertia of {who} come from the "
                "geoms, mesh geoms among them, so leaving the meshes out would change the "
                "dynamics. Fix: give those bodies an <inertial> element, or provide the mesh "
                "files and load with meshes=True."
            )
        for item in dropped + list(spec.meshes):
            spec.delete(item)
        return spec.compile()
    except ValueError as e:
        if str(e).startswith(f"load({path!r}, meshes=False)"):
            raise
        text = "; ".join(ln.strip().rstrip(":") for ln in str(e).splitlines() if ln.strip())
        opening = re.search(r"Error opening file '([^']*)'", text)
        if opening and opening.group(1).startswith("package:"):
            with open(path, "rb") as fh:
                found = re.findall(rb"package://([^/\"'<>\s]+)/", fh.read())
            pkgs = [p.decode(errors="replace") for p in dict.fromkeys(found)] or ["NAME"]
            name, ext = os.path.splitext(os.path.basename(path))
            fix = (
                "its mesh paths are ROS package:// URIs, which MuJoCo cannot resolve. Fix: "
                f"replace package://{pkgs[0]}/ in the file by the path of that package's folder "
                "(e.g. sed"
                + "".join(f" -e 's#package://{k}/#/path/to/{k}/#g'" for k in pkgs)
                + f" {name}{ext} > {name}_local{ext}), or load it without its mesh geoms, the "
                "inertias coming from the links' <inertial>: rbjax.load(path, meshes=False), on "
                "the command line --no-meshes"
            )
        elif opening:
            fix = (
                f"a file it names is missing. Fix: put {opening.group(1)!r} where the file "
                f"says (relative to {os.path.dirname(os.path.abspath(path))!r} and <compiler "
                "meshdir/assetdir>), or correct its file= path; a body whose mass comes from "
                "an <inertial> loads without its mesh geoms: rbjax.load(path, meshes=False), "
                "on the command line --no-meshes"
            )
        elif "XML parse error" in text or "empty file" in text:
            fix = (
                "it is not well-formed XML. Fix: give an MJCF or URDF text file (not empty, "
                "not binary)"
            )
        else:
            fix = (
                "Fix: correct the element and attribute it names (the format: "
                "https://mujoco.readthedocs.io/en/stable/XMLreference.html)"
            )
        raise ValueError(f"load: MuJoCo cannot compile {path!r}: {text}; {fix}.") from None


def build_from_mujoco(
    m, *, qpos=None, qvel=None, control=None, unsupported="warn", dtype=None, formulation=None
):
    """The rbjax model, state, timestep and source of a compiled ``mujoco.MjModel`` ``m``
    (module docstring; the options are :func:`rbjax.load`'s)."""
    from . import unsupported as features  # not simulated; it reads MuJoCo through this module

    if unsupported not in ("warn", "error"):
        raise ValueError(
            f"load: unsupported = {unsupported!r} is not a policy. Fix: use 'warn' or 'error'."
        )
    mujoco = _mujoco()
    # the user's inputs first: a wrong one is refused by name, never ignored
    qpos = None if qpos is None else _coordinates(m, "qpos", qpos)
    qvel = None if qvel is None else _coordinates(m, "qvel", qvel)
    ctrl, signal = _controls(m, control)

    off = disabled(m)
    problems: list[str] = []
    d = mujoco.MjData(m)
    d.qpos[:] = m.qpos0
    mujoco.mj_kinematics(m, d)
    body_name = [_name(m, mujoco.mjtObj.mjOBJ_BODY, k, f"body{k}") for k in range(m.nbody)]
    joint_name = [_name(m, mujoco.mjtObj.mjOBJ_JOINT, j, f"joint{j}") for j in range(m.njnt)]

    # --- bodies: movers (bodies with joints) carry their welded descendants
    movers = [k for k in range(1, m.nbody) if m.body_jntnum[k] > 0]
    index = {b: i for i, b in enumerate(movers)}
    body_of = [index.get(_root_mover(m, k), GROUND) for k in range(m.nbody)]
    bodies, q_ref = [], []
    for b in movers:
        mass, com, inertia_world = _composite(m, d, b, body_of)
        if not mass > 0.0:
            raise ValueError(
                f"load: MuJoCo body '{body_name[b]}' moves (joint "
                f"'{joint_name[m.body_jntadr[b]]}') but has mass {mass:g} with every body welded "
                "to it. rbjax's bodies need a positive mass (a regular mass matrix). Fix: give "
                "the body an <inertial> (or geoms with mass), or merge it into a neighbour."
            )
        rot = d.xmat[b].reshape(3, 3)
        inertia = rot.T @ inertia_world @ rot
        inertia = 0.5 * (inertia + inertia.T)
        bodies.append(Body(mass, inertia, name=body_name[b]))
        q_ref.append(np.concatenate([com, d.xquat[b]]))
    if not bodies:
        raise ValueError(
            "load: the MuJoCo model has no moving body (no joints). Fix: add a joint (e.g. "
            "<freejoint/>) to the bodies that should move."
        )
    q_ref = np.array(q_ref)

    def local(k, p_body):
        """rbjax body index and body coordinates of the point p_body of MuJoCo body k."""
        world = d.xpos[k] + d.xmat[k].reshape(3, 3) @ np.asarray(p_body, float)
        i = body_of[k]
        if i == GROUND:
            return i, world
        b = movers[i]
        return i, d.xmat[b].reshape(3, 3).T @ (world - q_ref[i, 0:3])

    def local_axes(k, rot_in_k):
        """Axes (columns) given in MuJoCo body k's frame, in its rbjax body's axes."""
        world = d.xmat[k].reshape(3, 3) @ rot_in_k
        i = body_of[k]
        return world if i == GROUND else d.xmat[movers[i]].reshape(3, 3).T @ world

    # every MuJoCo body's frame in its rbjax body: (index, axes, origin from the centre of mass)
    frames = [
        (body_of[k], local_axes(k, np.eye(3)), local(k, np.zeros(3))[1]) for k in range(m.nbody)
    ]

    # --- joints and their force elements
    joints, forces, maps = [], [], []
    spring_on = {j: not off["SPRING"] and m.jnt_stiffness[j] != 0.0 for j in range(m.njnt)}
    damp_on = {
        j: not off["DAMPER"] and m.dof_damping[m.jnt_dofadr[j]] != 0.0 for j in range(m.njnt)
    }
    actuated: dict[int, list[int]] = {}
    for a in range(_nactuator(m)):
        if _joint_transmission(m, a):
            actuated.setdefault(int(m.actuator_trnid[a, 0]), []).append(a)
    parents: list[int | None] = []  # per rbjax body: the rbjax joint that places it (None: free)
    inexact: list[str] = []  # bodies whose rbjax joint coordinates are not MuJoCo's qpos
    single = {}  # MuJoCo joint → (kind, rbjax joint index) when it is a hinge/slide alone
    for b in movers:
        i = index[b]
        parent = body_of[int(m.body_parentid[b])]
        js = list(range(m.body_jntadr[b], m.body_jntadr[b] + m.body_jntnum[b]))
        kinds = [_KINDS[int(m.jnt_type[j])] for j in js]
        anchors = [np.array(d.xanchor[j]) for j in js]
        axes = [np.array(d.xaxis[j]) for j in js]
        names = [joint_name[j] for j in js]
        where = f"MuJoCo body '{body_name[b]}' (joints {names})"
        same_point = all(np.allclose(p, anchors[0], atol=1e-12) for p in anchors)
        joint = None
        if kinds == ["free"]:
            pass
        elif kinds == ["hinge"]:  # frames such that the joint angle is MuJoCo's qpos
            x0 = _perpendicular(axes[0])
            ref = float(m.qpos0[m.jnt_qposadr[js[0]]])
            joint = Revolute.at(
                q_ref, parent, i, point=anchors[0], axis=axes[0], x=x0, name=names[0]
            )
            shifted = Revolute.at(
                q_ref, parent, i, point=anchors[0], axis=axes[0], x=_rotate(axes[0], -ref, x0)
            )
            joint = eqx.tree_at(lambda jt: jt.x_i, joint, shifted.x_i)
        elif kinds == ["slide"]:  # joint points such that the displacement is MuJoCo's qpos
            ref = float(m.qpos0[m.jnt_qposadr[js[0]]])
            joint = Translational.at(
                q_ref, parent, i, point=anchors[0], axis=axes[0], name=names[0]
            )
            shifted = Translational.at(
                q_ref, parent, i, point=anchors[0] - ref * axes[0], axis=axes[0]
            )
            joint = eqx.tree_at(lambda jt: jt.s_i, joint, shifted.s_i)
        elif kinds == ["ball"]:  # frames: the body's own axes, so Q is MuJoCo's ball qpos
            rot = d.xmat[b].reshape(3, 3)
            joint = Spherical.at(
                q_ref, parent, i, point=anchors[0], axis=rot[:, 2], x=rot[:, 0], name=names[0]
            )
        elif kinds == ["hinge", "hinge"] and same_point:
            if abs(np.dot(axes[0], axes[1])) > 1e-9:
                raise ValueError(
                    f"load: {where}: two hinges through one point with axes at "
                    f"{np.degrees(np.arccos(np.clip(np.dot(axes[0], axes[1]), -1, 1))):.4g}° "
                    "form a universal joint only when perpendicular. Fix: make the axes "
                    "perpendicular, or put the second hinge in a child body."
                )
            joint = Universal.at(
                q_ref, parent, i, point=anchors[0], axis=axes[0], x=axes[1], name="+".join(names)
            )
        elif kinds == ["hinge"] * 3 and same_point:
            if abs(np.linalg.det(np.array(axes))) < 1e-6:
                raise ValueError(
                    f"load: {where}: three hinges through one point with dependent axes. Fix: "
                    "give three independent axes (a ball joint), or fewer hinges."
                )
            joint = Spherical.at(q_ref, parent, i, point=anchors[0], name="+".join(names))
        elif sorted(kinds) == ["hinge", "slide"] and abs(np.dot(axes[0], axes[1])) > 1 - 1e-12:
            joint = Cylindrical.at(
                q_ref, parent, i, point=anchors[0], axis=axes[0], name="+".join(names)
            )
        else:
            raise ValueError(
                f"load: {where} of types {kinds} has no exact rbjax joint. rbjax maps one "
                "hinge/slide/ball/free joint per body, two perpendicular hinges or three "
                "hinges through one point, or a hinge and a slide on one axis. Fix: split the "
                "joints over child bodies (with mass) in the model file."
            )
        k = None
        if joint is not None:
            k = len(joints)
            joints.append(joint)
        parents.append(k)
        if len(js) > 1 and (
            kinds == ["hinge"] * 3
            or kinds == ["slide", "hinge"]
            or any(m.qpos0[m.jnt_qposadr[j]] != 0.0 for j in js)
        ):
            inexact.append(f"{where}: {_inexact_reason(kinds)}")
        for j, kind in zip(js, kinds, strict=True):
            maps.append(
                JointMap(
                    name=joint_name[j],
                    type=kind,
                    body=i,
                    joint=k,
                    qpos=int(m.jnt_qposadr[j]),
                    qvel=int(m.jnt_dofadr[j]),
                    ref=np.array(m.qpos0[m.jnt_qposadr[j] : m.jnt_qposadr[j] + _nq(kind)]),
                )
            )
            if len(js) == 1 and kind in ("hinge", "slide"):
                single[j] = (kind, anchors[0], axes[0], parent, i)
            elif spring_on[j] or damp_on[j] or j in actuated:
                what = "stiffness/damping" if (spring_on[j] or damp_on[j]) else "an actuator"
                problems.append(
                    f"{what} on {kind} joint '{joint_name[j]}' (rbjax drives single hinge and "
                    "slide joints only)"
                )

    def element(j, stiffness, damping, rest, actuator):
        kind, anchor, axis, parent, i = single[j]
        if kind == "hinge":
            return RotationalSpringDamper.at(
                q_ref,
                parent,
                i,
                axis=axis,
                ref=_perpendicular(axis),
                stiffness=stiffness,
                damping=damping,
                rest_angle=_wrap(rest),
                actuator=actuator,
            )
        return AxialSpringDamper.at(
            q_ref,
            parent,
            i,
            point=anchor,
            axis=axis,
            stiffness=stiffness,
            damping=damping,
            rest_length=rest,
            actuator=actuator,
        )

    for j in sorted(single):
        k_s = float(m.jnt_stiffness[j]) if spring_on[j] else 0.0
        c = float(m.dof_damping[m.jnt_dofadr[j]]) if damp_on[j] else 0.0
        if k_s or c:
            ref = float(m.qpos0[m.jnt_qposadr[j]])
            forces.append(element(j, k_s, c, float(m.qpos_spring[m.jnt_qposadr[j]]) - ref, None))

    # --- actuators (MuJoCo's mj_fwdActuation): each force clamp(gain·clamp(u) + bias,
    # forcerange) times its gear on its joint; a joint with actuatorfrclimited caps the sum
    actuator_names, on_joint = [], []
    for a in range(_nactuator(m)):
        name = _name(m, mujoco.mjtObj.mjOBJ_ACTUATOR, a, f"actuator{a}")
        actuator_names.append(name)
        problem = features.actuator_problem(m, a, single, joint_name)
        if problem:
            problems.append(f"actuator '{name}': {problem}")
            continue
        if off["ACTUATION"] or _group_disabled(m, a):
            continue  # MuJoCo applies no force: nothing to simulate
        on_joint.append(
            (int(m.actuator_trnid[a, 0]), joint_actuator(m, a, name, ctrl, signal, off))
        )
    capped = {j for j, _ in on_joint if m.jnt_actfrclimited[j]}
    for j, act in on_joint:
        if j not in capped:
            forces.append(element(j, 0.0, 0.0, 0.0, act))
        elif act is next(a for jj, a in on_joint if jj == j):  # the joint's first: all of them
            group = tuple(a for jj, a in on_joint if jj == j)
            cap = JointActuators(group, force_range=m.jnt_actfrcrange[j], name=joint_name[j])
            forces.append(element(j, 0.0, 0.0, 0.0, cap))

    # --- gravity compensation (body gravcomp, MuJoCo's mj_gravcomp): the force −c·m·g at the
    # centre of mass of each body, a passive force, or an actuator force on the DOFs of joints
    # with actuatorgravcomp, which mj_fwdActuation drops (no actuators, actuation disabled) or
    # caps (actuatorfrcrange): those cases are named instead
    forces += _gravcomp(m, off, problems, body_name, joint_name, local)

    # --- equality constraints
    for e in range(m.neq):
        name = _name(m, mujoco.mjtObj.mjOBJ_EQUALITY, e, f"equality{e}")
        kind = int(m.eq_type[e])
        if off["EQUALITY"] or off["CONSTRAINT"]:
            continue
        if not m.eq_active0[e]:
            problems.append(f"equality '{name}' is inactive at start (rbjax has no switching)")
            continue
        if kind not in (int(mujoco.mjtEq.mjEQ_CONNECT), int(mujoco.mjtEq.mjEQ_WELD)):
            problems.append(
                f"equality '{name}' of type {mujoco.mjtEq(kind).name} (rbjax imports connect "
                "and weld)"
            )
            continue
        joints.append(_equality(m, e, name, kind, local, local_axes, body_of))

    # --- everything else with dynamics
    problems += features.unsupported(m, off, body_name, joint_name)
    if problems:
        text = (
            f"load: {len(problems)} element(s) of the MuJoCo model have no rbjax counterpart "
            "and are NOT simulated:\n  - " + "\n  - ".join(problems)
        )
        if unsupported == "error":
            raise ValueError(text + "\nFix: remove them, or load with unsupported='warn'.")
        warnings.warn(text, UserWarning, stacklevel=3)

    gravity = np.zeros(3) if off["GRAVITY"] else np.array(m.opt.gravity)
    source = MujocoSource(m, body_of, maps, actuator_names, movers, parents, frames, inexact)
    state = source.state(qpos, qvel, dtype=dtype)
    rb_model = Model(bodies, gravity=gravity, joints=joints, forces=forces, formulation=formulation)
    if dtype is not None:  # the model in the state's dtype: one computation, one dtype
        rb_model = rb_model.astype(dtype)
    closes_loops = len(joints) > sum(1 for jm in maps if jm.joint is not None)
    if closes_loops:
        rb_model, state = _close_loops(rb_model, state)
    return rb_model, state, float(m.opt.timestep), source


def disabled(m) -> dict[str, bool]:
    """Which of MuJoCo's disable flags that change what rbjax simulates are set."""
    mujoco = _mujoco()
    dis = int(m.opt.disableflags)
    names = ("CONTACT", "LIMIT", "EQUALITY", "SPRING", "DAMPER", "GRAVITY", "ACTUATION")
    names += ("FRICTIONLOSS", "CONSTRAINT", "CLAMPCTRL")
    return {n: bool(dis & int(getattr(mujoco.mjtDisableBit, f"mjDSBL_{n}"))) for n in names}


def joint_actuator(m, a, name, ctrl, signal, off) -> Actuator:
    """The :class:`rbjax.Actuator` of MuJoCo's actuator ``a`` on a hinge or slide (MuJoCo's
    mj_fwdActuation: clamp(gain·clamp(u) + bias, forcerange) times its gear), its control the
    constant ``ctrl`` entry or the ``signal`` u(t)."""
    mujoco = _mujoco()
    j = int(m.actuator_trnid[a, 0])
    adr = int(_field(m, "actuator_ctrladr", a, a))
    fixed = int(m.actuator_gaintype[a]) == int(mujoco.mjtGain.mjGAIN_FIXED)
    return Actuator(
        gain=m.actuator_gainprm[a, 0:3] * (np.array([1.0, 0.0, 0.0]) if fixed else 1.0),
        bias=m.actuator_biasprm[a, 0:3] if int(m.actuator_biastype[a]) else np.zeros(3),
        gear=float(m.actuator_gear[a, 0]),
        control=signal if signal is not None else 0.0 if ctrl is None else float(ctrl[adr]),
        index=None if signal is None else adr,
        ctrl_range=m.actuator_ctrlrange[a]
        if _limited(m, a, "ctrl") and not off["CLAMPCTRL"]
        else None,
        force_range=m.actuator_forcerange[a] if _limited(m, a, "force") else None,
        offset=float(m.qpos0[m.jnt_qposadr[j]]),
        name=name,
    )


def _close_loops(model, state):
    """A model with equality constraints: put the initial state on the loop-closure manifold
    (MuJoCo's qpos, qvel need not satisfy a loop: its soft equality pulls it closed; rbjax's
    exact one must start closed) with :func:`rbjax.assemble`, warning when it had to move.
    Redundant loop equations (a planar loop closed by a connect: 3 equations where 2 are
    independent) need nothing special: every formulation runs them (rbjax/_engine/rank.py)."""
    from .._analysis.assembly import assemble
    from .._analysis.checks import _consistency

    c, cd, _ = _consistency(model, state)
    gap = float(max(np.max(np.asarray(c)), np.max(np.asarray(cd))))
    if gap <= 1e-12:  # closed already (MuJoCo's qpos0 of a file built closed): nothing to move
        return model, state
    fixed = assemble(model, state)
    moved = float(np.max(np.abs(np.asarray(fixed.q) - np.asarray(state.q))))
    if not gap <= 1e-10:
        warnings.warn(
            f"load: the initial state violates the loop closures by {gap:.3g}; it was "
            f"assembled (coordinates moved by up to {moved:.3g}, velocities projected).",
            UserWarning,
            stacklevel=4,
        )
    return model, fixed


def _nq(kind):
    return {"free": 7, "ball": 4, "slide": 1, "hinge": 1}[kind]


def _rotate(axis, angle, v):
    """v rotated by ``angle`` about the unit ``axis`` (Rodrigues)."""
    c, s = np.cos(angle), np.sin(angle)
    return c * v + s * np.cross(axis, v) + (1 - c) * np.dot(axis, v) * axis


def _wrap(angle):
    """An angle in (−π, π] (the RSDA's rest angle is a principal value)."""
    return float(np.pi - np.mod(np.pi - angle, 2 * np.pi))


def _limited(m, a, what):
    flag = int(getattr(m, f"actuator_{what}limited")[a])
    rng = getattr(m, f"actuator_{what}range")[a]
    return bool(flag) and rng[0] < rng[1]


def _joint_transmission(m, a) -> bool:
    """The actuator drives a joint: transmission ``joint``, or ``jointinparent``, which is the
    same for a hinge or slide (it differs for ball and free joints only)."""
    mujoco = _mujoco()

    return int(m.actuator_trntype[a]) in (
        int(mujoco.mjtTrn.mjTRN_JOINT),
        int(mujoco.mjtTrn.mjTRN_JOINTINPARENT),
    )


def _group_disabled(m, a) -> bool:
    """MuJoCo's ``mj_actuatorDisabled``: the actuator's group (0-30) is in ``disableactuator``."""
    group = int(m.actuator_group[a])
    return 0 <= group <= 30 and bool(int(getattr(m.opt, "disableactuator", 0)) & (1 << group))


def _inexact_reason(kinds) -> str:
    if kinds == ["hinge"] * 3:
        return "three hinges become one Spherical joint (a quaternion, MuJoCo: 3 angles)"
    if kinds == ["slide", "hinge"]:
        return "a slide before a hinge (a Cylindrical joint's coordinates are (angle, slide))"
    return "joints with ref != 0 (rbjax measures these joint coordinates from the reference)"


def _gravcomp(m, off, problems, body_name, joint_name, local) -> list:
    """PointForces −c·m_k·g at the centre of mass of every moving body k with ``gravcomp`` c
    (MuJoCo's mj_gravcomp, computed in mj_passive: with gravity on and nonzero, and not both
    springs and dampers disabled): a passive force on the DOFs of most joints, an actuator
    force on those of joints with ``actuatorgravcomp``, which mj_fwdActuation drops (no
    actuators, actuation disabled) or caps (``actuatorfrcrange``). Where that route differs from
    one body force, the bodies and joints are named in ``problems`` and nothing is added."""
    gravity = np.asarray(m.opt.gravity, dtype=float)
    comp = [k for k in range(1, m.nbody) if m.body_gravcomp[k] != 0.0]
    if not comp or off["GRAVITY"] or not np.any(gravity) or (off["SPRING"] and off["DAMPER"]):
        return []  # MuJoCo applies none
    split = [
        joint_name[j]
        for j in range(m.njnt)
        if _field(m, "jnt_actgravcomp", j, 0)
        and (_nactuator(m) == 0 or off["ACTUATION"] or m.jnt_actfrclimited[j])
    ]
    if split:
        problems.append(
            f"gravity compensation on bodies {[body_name[k] for k in comp]}: routed through "
            f"the actuators of joints {split} (actuatorgravcomp), where MuJoCo drops it (no "
            "actuators, actuation disabled) or caps it (actuatorfrcrange)"
        )
        return []
    out = []
    for k in comp:
        i, s = local(k, m.body_ipos[k])  # body k's centre of mass
        if i != GROUND:
            force = -float(m.body_gravcomp[k]) * float(m.body_mass[k]) * gravity
            out.append(PointForce(i, s, force))
    return out


def _equality(m, e, name, kind, local, local_axes, body_of):
    mujoco = _mujoco()

    data = np.asarray(m.eq_data[e])
    o1, o2 = int(m.eq_obj1id[e]), int(m.eq_obj2id[e])
    site = int(m.eq_objtype[e]) == int(mujoco.mjtObj.mjOBJ_SITE)
    if site:
        b1, b2 = int(m.site_bodyid[o1]), int(m.site_bodyid[o2])
        p1, p2 = np.array(m.site_pos[o1]), np.array(m.site_pos[o2])
        r1, r2 = _quat_matrix(m.site_quat[o1]), _quat_matrix(m.site_quat[o2])
    else:
        b1, b2 = o1, o2  # body2 = 0 (world) when omitted
        r1, r2 = np.eye(3), np.eye(3)
        if kind == int(mujoco.mjtEq.mjEQ_CONNECT):
            p1, p2 = data[0:3], data[3:6]
        else:  # weld: anchor on body2, the same point in body1, body2's attitude in body1
            p2, p1, r1 = data[0:3], data[3:6], _quat_matrix(data[6:10])
    i, s_i = local(b1, p1)
    j, s_j = local(b2, p2)
    if i == j:
        raise ValueError(
            f"load: equality '{name}' connects bodies welded together (both in rbjax body "
            f"{i}); it constrains nothing. Fix: remove it."
        )
    if kind == int(mujoco.mjtEq.mjEQ_CONNECT):
        e = np.eye(3)
        return Spherical(i, j, s_i=s_i, s_j=s_j, z_i=e[2], z_j=e[2], x_i=e[0], x_j=e[0], name=name)
    ai, aj = local_axes(b1, r1), local_axes(b2, r2)
    return Fixed(
        i, j, s_i=s_i, s_j=s_j, x_i=ai[:, 0], z_i=ai[:, 2], x_j=aj[:, 0], z_j=aj[:, 2], name=name
    )


def _quat_matrix(q):
    mujoco = _mujoco()

    out = np.zeros(9)
    mujoco.mju_quat2Mat(out, np.asarray(q, float) / np.linalg.norm(q))
    return out.reshape(3, 3)
