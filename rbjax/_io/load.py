"""``rbjax.load``: a model file in, an rbjax model and initial state out."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from .._state import State
from .._tree.model import JointCoordinates, JointModel, maximal_only


@dataclasses.dataclass(frozen=True)
class Loaded:
    """What :func:`rbjax.load` returns: the ``model`` (:class:`rbjax.Model`), its initial
    ``state`` (:class:`rbjax.State`), the file's ``timestep`` [s] and the ``source``
    (for MJCF/URDF a :class:`~rbjax.advanced.MujocoSource` with the compiled ``MjModel`` and the
    maps between MuJoCo's joints and rbjax's bodies and joints)."""

    model: Any
    state: Any  # State, or JointState for a JointModel (None: a model file without one)
    timestep: float | None
    source: Any = None

    def joint_space(self):
        """The :class:`rbjax.JointSpace` of the loaded model in the file's own joint
        coordinates: for MJCF/URDF exactly MuJoCo's ``qpos`` and ``qvel`` (order, sizes, a free
        joint's body-frame origin; :meth:`~rbjax.advanced.MujocoSource.joint_space`), for an
        rbjax model file ``rbjax.JointSpace(model)``. A :class:`rbjax.JointModel` is already in
        those coordinates: its state is qpos/qvel (ValueError)."""
        if isinstance(self.model, JointModel):
            raise ValueError(
                "Loaded.joint_space(): the model was loaded in joint coordinates; its state "
                "already holds MuJoCo's qpos/qvel. Fix: read state.qpos and state.qvel."
            )
        if self.source is None:
            from .._analysis.joint_space import JointSpace

            return JointSpace(self.model)
        return self.source.joint_space(self.model)


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
) -> Loaded:
    """Load a mechanism from an MJCF (``.xml``), URDF (``.urdf``) or rbjax model file
    (``.toml``, written by hand or by :func:`rbjax.save`; it carries its own initial state
    and timestep, or None).

    The file is compiled by MuJoCo (the optional ``mujoco`` extra) and mapped onto rbjax's
    maximal coordinates (rbjax/_io/mujoco.py says how each element maps): moving bodies with
    their inertials, hinge/slide/ball/free joints as rbjax joints built in the reference
    configuration ``qpos0``, bodies without joints merged into their parent, equality connect
    and weld as exact constraints, joint stiffness/damping and motor/position/velocity
    actuators as force elements with :class:`rbjax.Actuator` (a joint's ``actuatorfrcrange``
    as :class:`rbjax.JointActuators`), gravity compensation, gravity and the timestep
    (docs/tutorials/import-mjcf.md has the audit of every MuJoCo field).
    :meth:`Loaded.joint_space` gives MuJoCo's own ``qpos``/``qvel`` coordinates.

    ``qpos``, ``qvel``: MuJoCo's generalized coordinates of the initial state (default: qpos0
    at rest; ``nq`` and ``nv`` finite numbers, ball and free quaternions normalized as MuJoCo
    does). ``control``: the actuators' controls in MuJoCo's ctrl order: a constant vector
    (``nu`` finite numbers; default 0) or a function of time returning that vector, such as
    :class:`rbjax.ControlSequence` ((n, nu) samples; its values are differentiable); clamped
    to each actuator's ``ctrlrange`` as MuJoCo does. An input the model cannot use (a control
    for a model without actuators, a wrong size, NaN) is a ValueError naming it.
    ``unsupported``: elements with dynamics rbjax does not model (contacts, joint limits,
    tendons, ...) are listed by name in one warning (``"warn"``) or a ValueError
    (``"error"``). ``formulation=rbjax.JointCoordinates()`` loads the file's kinematic tree
    in joint coordinates instead: a :class:`rbjax.JointModel` whose state is MuJoCo's
    qpos/qvel, any number and order of hinge, slide and ball joints per body, armature
    simulated, MuJoCo's connect, weld and joint equalities held exactly by multipliers
    (rbjax/_io/mujoco_tree.py, rbjax/_tree/equality.py; an initial state that opens them is
    assembled, with a warning). Otherwise ``formulation``: default :class:`rbjax.ScalableDAE` (loop closures whose equations are
    redundant, as a planar loop closed by a connect, run in every formulation); the initial state is assembled onto the loop closures if
    it violates them (with a warning saying by how much). ``meshes=False`` compiles the file
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
    if ext in (".xml", ".mjcf", ".urdf") and isinstance(formulation, JointCoordinates):
        from .mujoco import _compile, _mujoco
        from .mujoco_tree import build_tree_from_mujoco

        m = _compile(_mujoco(), path, meshes)
        model, state, timestep, source = build_tree_from_mujoco(
            m,
            qpos=qpos,
            qvel=qvel,
            control=control,
            unsupported=unsupported,
            dtype=dtype,
            formulation=formulation,
        )
        return Loaded(model, state, timestep, source)
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


def save(path, model, state: State | None = None, *, timestep: float | None = None) -> None:
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
