"""What a run file stores besides the states (rbjax/_cli/runfile.py): joint coordinates,
energies, momenta, constraint residuals and joint reactions at every saved time."""

from __future__ import annotations

import dataclasses
import sys

import jax
import jax.numpy as jnp
import numpy as np

from .._analysis.checks import _consistency
from .._analysis.invariants import (
    angular_momentum,
    kinetic_energy,
    linear_momentum,
    potential_energy,
)
from .._analysis.joint_space import JointSpace
from .._engine.monitors import cheaply_compiled
from .._reactions import Reactions, reactions
from .._state import saved_state

# Names of the coordinates of each JointSpace kind: (position names, velocity names); a free
# body's velocity is (v world, ω body axes), a spherical joint's the relative ω in frame j.
_NAMES = {
    "free": (("x", "y", "z", "qw", "qx", "qy", "qz"), ("vx", "vy", "vz", "wx", "wy", "wz")),
    "revolute": (("",), ("",)),
    "prismatic": (("",), ("",)),
    "cylindrical": (("angle", "slide"), ("angle", "slide")),
    "universal": (("angle1", "angle2"), ("angle1", "angle2")),
    "spherical": (("qw", "qx", "qy", "qz"), ("wx", "wy", "wz")),
    "fixed": ((), ()),
}


@dataclasses.dataclass(frozen=True)
class Layout:
    """Which joint coordinates the command line's qpos and qvel are (hashable: a static
    argument of the compiled programs). ``kind`` "mujoco": an MJCF or URDF file's own, MuJoCo's
    ``data.qpos``/``data.qvel`` (``Loaded.joint_space()``: its ``parents`` and its free bodies'
    ``origins``, the body frames' origins); "rbjax": ``rbjax.JointSpace(model)`` (a model
    file's, or a robot file whose joints rbjax holds in other coordinates)."""

    kind: str = "rbjax"
    parents: tuple | None = None
    origins: tuple | None = None  # (nb, 3) as nested tuples, or None (centres of mass)

    def options(self) -> dict:
        """``parents`` and ``origins`` for JointSpace, joint_coordinates and
        state_from_joint_coordinates."""
        origins = None if self.origins is None else np.asarray(self.origins, np.float64)
        return {"parents": self.parents, "origins": origins}

    def joint_space(self, model) -> JointSpace | None:
        """The model's JointSpace in these coordinates, or None where joint coordinates are
        not defined (scalable bodies)."""
        if any(model.scalable):
            return None
        return JointSpace(model, **self.options())


def layout(loaded) -> Layout:
    """The joint coordinates of a loaded file (:class:`Layout`): MuJoCo's for an MJCF or URDF
    file, with a note on stderr where rbjax cannot give them (three hinges in one body, a
    slide before a hinge, ``ref`` != 0: ``MujocoSource.joint_space``)."""
    if loaded.source is None or any(loaded.model.scalable):
        return Layout()
    try:
        js = loaded.joint_space()
    except ValueError as exc:
        print(
            f"note: qpos/qvel are rbjax.JointSpace coordinates, not MuJoCo's ({exc})",
            file=sys.stderr,
        )
        return Layout()
    origins = None if js.origins is None else tuple(map(tuple, np.asarray(js.origins).tolist()))
    return Layout("mujoco", js.parents, origins)


def coordinate_names(js: JointSpace) -> tuple[list[str], list[str]]:
    """Column names of qpos and qvel: ``joint`` for a one-number joint, ``joint.qw`` ... else."""
    pos, vel = [], []
    for name, kind, _, _ in js.coordinates:
        p, v = _NAMES[kind]
        pos += [f"{name}.{s}" if s else name for s in p]
        vel += [f"{name}.{s}" if s else name for s in v]
    return pos, vel


@cheaply_compiled  # once per run file: the monitors' cheap XLA options
def derive(model, t, q, u, lam, coordinates: Layout = Layout()):
    """Quantities of ONE system's saved states t (T,), q, u (T, nb, 7) and multipliers lam
    (T, nb + m) or None: a dict of arrays with a leading T axis (runfile.py lists them), the
    joint coordinates in ``coordinates``. The saved states of a failed run hold NaN from its
    failed step on (``saved_state``: not refused), and so do the quantities there."""
    states = saved_state(t, q, u)
    out = {
        "kinetic_energy": kinetic_energy(model, states),
        "potential_energy": potential_energy(model, states),
        "linear_momentum": linear_momentum(model, states),
        "angular_momentum": angular_momentum(model, states),
    }
    out["total_energy"] = out["kinetic_energy"] + out["potential_energy"]
    js = coordinates.joint_space(model)
    if js is not None and js.nq:
        out["qpos"] = jax.vmap(js.positions)(states)
        out["qvel"] = jax.vmap(js.velocities)(states)
    if model.joints:
        c, cd, _ = _consistency(model, states)
        out["position_residual"] = jnp.max(c, axis=0)
        out["velocity_residual"] = jnp.max(cd, axis=0)
        if lam is not None:
            r = reactions(model, states, lam)
            assert isinstance(r, Reactions)  # a maximal model's (a JointModel has no joints)
            out["reaction_force"] = r.force_j
            out["reaction_torque"] = r.torque_j
    return out
