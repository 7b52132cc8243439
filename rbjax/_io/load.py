"""``rbjax.load``: a model file in, an rbjax model and initial state out."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from .._abstract import AbstractModel, AbstractState
from .._errors import validates_inputs
from .._model import Model, require_model
from .._state import State
from .._tree.model import JointCoordinates, JointModel, maximal_only


@dataclasses.dataclass(frozen=True)
class Loaded:
    """What :func:`rbjax.load` returns: the ``model`` (:class:`rbjax.JointModel` or
    :class:`rbjax.Model`, :attr:`coordinates`), its initial ``state`` (:class:`rbjax.JointState`
    or :class:`rbjax.State`), the file's ``timestep`` [s] and the ``source``
    (for MJCF/URDF a :class:`~rbjax.advanced.MujocoSource` with the compiled ``MjModel`` and the
    maps between MuJoCo's joints and rbjax's bodies and joints)."""

    model: AbstractModel
    state: AbstractState | None  # None: a model file without one
    timestep: float | None
    source: Any = None

    @property
    def coordinates(self) -> str:
        """``"joint"`` (a :class:`rbjax.JointModel`, MuJoCo's qpos/qvel) or ``"maximal"`` (an
        :class:`rbjax.Model`, every body's pose): which formulation :func:`rbjax.load` chose
        (:func:`default_coordinates`) or was asked for."""
        return "joint" if isinstance(self.model, JointModel) else "maximal"

    def joint_space(self):
        """The :class:`rbjax.JointSpace` of the loaded model in the file's own joint
        coordinates: for MJCF/URDF exactly MuJoCo's ``qpos`` and ``qvel`` (order, sizes, a free
        joint's body-frame origin; :meth:`~rbjax.advanced.MujocoSource.joint_space`), for an
        rbjax model file ``rbjax.JointSpace(model)``. A :class:`rbjax.JointModel` is already in
        those coordinates: its state is qpos/qvel (ValueError)."""
        if isinstance(self.model, JointModel):
            raise ValueError(
                "Loaded.joint_space(): the model was loaded in joint coordinates; its state "
                "already holds MuJoCo's qpos/qvel. Fix: read state.qpos and state.qvel, or load "
                "the file in maximal coordinates: rbjax.load(path, "
                "formulation=rbjax.ScalableDAE())."
            )
        if self.source is None:
            from .._analysis.joint_space import JointSpace

            return JointSpace(require_model(self.model))
        return self.source.joint_space(self.model)


def default_coordinates(m) -> tuple[str, str]:
    """(coordinates, why) that :func:`rbjax.load` and the command line give a compiled MJCF/URDF
    model ``m`` when no formulation is asked for: ``"joint"`` when its joints form a tree,
    ``"maximal"`` when an active connect or weld equality closes a loop (the tree of MuJoCo's
    bodies is then not the mechanism's; maximal coordinates hold the closure as exact joint
    equations and their reactions). A joint equality (a coupling of two joint coordinates)
    keeps the tree: joint coordinates hold it exactly, maximal coordinates do not import it."""
    from .mujoco import _mujoco

    mujoco = _mujoco()
    loops = (int(mujoco.mjtEq.mjEQ_CONNECT), int(mujoco.mjtEq.mjEQ_WELD))
    disabled = int(m.opt.disableflags)
    off = disabled & (
        int(mujoco.mjtDisableBit.mjDSBL_EQUALITY) | int(mujoco.mjtDisableBit.mjDSBL_CONSTRAINT)
    )
    closing = [
        e for e in range(m.neq) if not off and m.eq_active0[e] and int(m.eq_type[e]) in loops
    ]
    if closing:
        return (
            "maximal",
            f"{len(closing)} connect/weld equalit{'y closes' if len(closing) == 1 else 'ies close'} a loop",
        )
    return "joint", "its joints form a tree"


def load(
    path,
    *,
    qpos=None,
    qvel=None,
    control=None,
    unsupported: str = "warn",
    formulation=None,
    dtype=None,
    meshes: bool = True,
    contacts: bool = False,
) -> Loaded:
    """Load a mechanism from an MJCF (``.xml``), URDF (``.urdf``) or rbjax model file
    (``.toml``, written by hand or by :func:`rbjax.save`; it carries its own initial state
    and timestep, or None).

    **Which coordinates.** An MJCF/URDF file whose joints form a tree (every robot arm, hand,
    quadruped and humanoid) loads in joint coordinates by default: a :class:`rbjax.JointModel`
    whose state is MuJoCo's qpos/qvel (:class:`rbjax.JointState`), any number and order of
    hinge, slide, ball and free joints per body, armature simulated, MuJoCo's connect, weld and
    joint equalities held exactly by multipliers (rbjax/_io/mujoco_tree.py,
    rbjax/_tree/equality.py; an initial state that opens them is assembled, with a warning).
    It integrates nv coordinates with Featherstone's recursive algorithms where maximal
    coordinates carry 7 per body and 5 joint equations per hinge. A file where an active
    connect or weld equality closes a loop loads in maximal coordinates
    (:func:`default_coordinates`; ``Loaded.coordinates`` says which was chosen). Ask for the
    other explicitly: ``formulation=rbjax.JointCoordinates()`` for joint coordinates (loops
    closed by multipliers), or a maximal formulation, ``formulation=rbjax.ScalableDAE()``
    (the maximal default; also :class:`rbjax.NewtonEuler`, :class:`rbjax.UdwadiaSchutte`),
    for maximal coordinates: every body's pose, exact joint reactions, scalable bodies, and
    the analyses that need them; it is also the independent second formulation of a tree.

    In maximal coordinates the file is mapped as rbjax/_io/mujoco.py says: moving bodies with
    their inertials, hinge/slide/ball/free joints as rbjax joints built in the reference
    configuration ``qpos0``, bodies without joints merged into their parent, equality connect
    and weld as exact constraints, joint stiffness/damping and motor/position/velocity
    actuators as force elements with :class:`rbjax.Actuator` (a joint's ``actuatorfrcrange``
    as :class:`rbjax.JointActuators`), gravity compensation, gravity and the timestep
    (docs/tutorials/import-mjcf.md has the audit of every MuJoCo field); a body with several
    joints loads only in the combinations that have an exact rbjax joint, and loop closures
    whose equations are redundant (a planar loop closed by a connect) run in every maximal
    formulation; an initial state that violates them is assembled (with a warning saying by
    how much). :meth:`Loaded.joint_space` gives MuJoCo's own ``qpos``/``qvel`` coordinates.

    ``qpos``, ``qvel``: MuJoCo's generalized coordinates of the initial state (default: qpos0
    at rest; ``nq`` and ``nv`` finite numbers, ball and free quaternions normalized as MuJoCo
    does). ``control``: the actuators' controls in MuJoCo's ctrl order: a constant vector
    (``nu`` finite numbers; default 0) or a function of time returning that vector, such as
    :class:`rbjax.ControlSequence` ((n, nu) samples; its values are differentiable); clamped
    to each actuator's ``ctrlrange`` as MuJoCo does. An input the model cannot use (a control
    for a model without actuators, a wrong size, NaN) is a ValueError naming it.
    ``contacts=True`` (joint coordinates): the spheres, capsules and boxes of the moving
    bodies that can collide with the world's plane become :class:`rbjax.Contacts`
    (rbjax/_io/mujoco_contacts.py: MuJoCo's collision filter and friction, no restitution),
    and the ranges of limited hinges and slides become ``JointModel`` limits (perfect
    unilateral constraints, no bounce), simulated by
    ``rbjax.rollout(..., integrator=rbjax.MoreauJean())``; what it leaves out
    (contacts between the bodies' own geoms, other geom types) stays in the warning. Off by
    default until contacts between bodies exist: a robot whose feet stood on the floor while
    its links passed through each other would look right and be wrong.
    ``unsupported``: elements with dynamics rbjax does not model (contacts, joint limits,
    tendons, ...) are listed by name in one warning (``"warn"``) or a ValueError
    (``"error"``). ``meshes=False`` compiles the file
    without its mesh geoms (a URDF whose ``package://`` meshes are not at hand): allowed when
    every body that carries one takes its mass and inertia from an ``<inertial>``, as URDF
    links do, so the dynamics are the same; refused (ValueError) otherwise. These options apply to MJCF/URDF
    files only: a model file carries its own state, formulation and controls, and giving them
    for a ``.toml`` is a ValueError rather than silently ignored. Returns a :class:`Loaded`
    (model, state, timestep, source).
    """
    path = os.fspath(path)
    ext = os.path.splitext(path)[1].lower()
    if not os.path.isfile(path):
        raise ValueError(f"load: {path!r} is not a file. Fix: give the path of a model file.")
    m = None
    if ext in (".xml", ".mjcf", ".urdf") and formulation is None:
        from .mujoco import _compile, _mujoco

        m = _compile(_mujoco(), path, meshes)
        if default_coordinates(m)[0] == "joint":
            formulation = JointCoordinates()
    if ext in (".xml", ".mjcf", ".urdf") and isinstance(formulation, JointCoordinates):
        from .mujoco import _compile, _mujoco
        from .mujoco_tree import build_tree_from_mujoco

        m = _compile(_mujoco(), path, meshes) if m is None else m
        model, state, timestep, source = build_tree_from_mujoco(
            m,
            qpos=qpos,
            qvel=qvel,
            control=control,
            unsupported=unsupported,
            dtype=dtype,
            formulation=formulation,
            contacts=contacts,
        )
        return Loaded(model, state, timestep, source)
    if contacts:
        raise ValueError(
            f"load: contacts=True needs joint coordinates and an MJCF/URDF file ({path!r}). Fix: "
            "load an MJCF/URDF tree with formulation=rbjax.JointCoordinates() (the default "
            "for trees), or contacts=False."
        )
    if ext in (".xml", ".mjcf", ".urdf"):
        from .mujoco import load_mujoco

        model, state, timestep, source = load_mujoco(
            path,
            qpos=qpos,
            qvel=qvel,
            control=control,
            unsupported=unsupported,
            dtype=dtype,
            formulation=formulation,
            meshes=meshes,
        )
        return Loaded(model, state, timestep, source)
    if ext == ".toml":
        from .modelfile import read

        given = [
            k for k, v in (("qpos", qpos), ("qvel", qvel), ("control", control)) if v is not None
        ]
        given += [k for k, v in (("formulation", formulation), ("dtype", dtype)) if v is not None]
        given += [] if meshes else ["meshes=False"]
        if given or unsupported != "warn":
            raise ValueError(
                f"load: {', '.join(given) or 'unsupported'} apply to MJCF/URDF files; a model "
                f"file ({path!r}) carries its own initial state, formulation and actuator "
                "controls. Fix: write them in the file, or change the loaded model and state "
                "(equinox.tree_at)."
            )

        model, state, timestep = read(path)
        return Loaded(model, state, timestep, None)
    raise ValueError(
        f"load: {path!r} has extension {ext!r}. Fix: load an MJCF (.xml), URDF (.urdf) or "
        "rbjax model file (.toml)."
    )


@validates_inputs
def save(path, model: Model, state: State | None = None, *, timestep: float | None = None) -> None:
    """Write ``model`` (and an initial ``state``, a ``timestep``) to an rbjax model file
    (``.toml``; the format is in rbjax/_io/modelfile.py and the tutorial). Numbers are written
    with their shortest round-trip representation, so ``load(save(...))`` gives the same
    arrays bit for bit. Elements that hold Python functions (ForceFunction, CustomConstraint,
    a driver that is not an :class:`rbjax.Expression`) raise ValueError naming them."""
    maximal_only(model, "rbjax.save")
    from .modelfile import write

    path = os.fspath(path)
    if os.path.splitext(path)[1].lower() != ".toml":
        raise ValueError(f"save: {path!r} is not a .toml path. Fix: name the file model.toml.")
    write(path, model, state, timestep)
