"""What a run file stores besides the states (rbjax/_cli/runfile.py): joint coordinates,
energies, momenta, constraint residuals and joint reactions at every saved time."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from .._analysis.checks import _consistency
from .._analysis.invariants import (
    angular_momentum,
    kinetic_energy,
    linear_momentum,
    potential_energy,
)
from .._analysis.joint_space import JointSpace
from .._reactions import reactions
from .._state import State

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


def joint_space(model) -> JointSpace | None:
    """The model's joint coordinates, or None where they are not defined (scalable bodies)."""
    if any(model.scalable):
        return None
    return JointSpace(model)


def coordinate_names(js: JointSpace) -> tuple[list[str], list[str]]:
    """Column names of qpos and qvel: ``joint`` for a one-number joint, ``joint.qw`` ... else."""
    pos, vel = [], []
    for name, kind, _, _ in js.coordinates:
        p, v = _NAMES[kind]
        pos += [f"{name}.{s}" if s else name for s in p]
        vel += [f"{name}.{s}" if s else name for s in v]
    return pos, vel


@eqx.filter_jit
def derive(model, t, q, u, lam):
    """Quantities of ONE system's saved states t (T,), q, u (T, nb, 7) and multipliers lam
    (T, nb + m) or None: a dict of arrays with a leading T axis (runfile.py lists them)."""
    states = State(t=t, q=q, u=u)
    out = {
        "kinetic_energy": kinetic_energy(model, states),
        "potential_energy": potential_energy(model, states),
        "linear_momentum": linear_momentum(model, states),
        "angular_momentum": angular_momentum(model, states),
    }
    out["total_energy"] = out["kinetic_energy"] + out["potential_energy"]
    js = joint_space(model)
    if js is not None and js.nq:
        out["qpos"] = jax.vmap(js.positions)(states)
        out["qvel"] = jax.vmap(js.velocities)(states)
    if model.joints:
        c, cd, _ = _consistency(model, states)
        out["position_residual"] = jnp.max(c, axis=0)
        out["velocity_residual"] = jnp.max(cd, axis=0)
        if lam is not None:
            r = reactions(model, states, lam)
            out["reaction_force"] = r.force_j
            out["reaction_torque"] = r.torque_j
    return out
