"""The joint coordinates that an ``rbjax identify`` configuration names: the model file's
own (MuJoCo's qpos/qvel for an MJCF or URDF file, rbjax.JointSpace's for a model file, a
:class:`rbjax.JointModel`'s qpos/qvel) by joint name (a free body also by its body name),
found with errors naming the field path, and the rbjax.Custom observation function that
reads one of them."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from .._analysis.joint_space import JointSpace
from .._tree.model import JointModel, JointState
from .._tree.topology import SIZES
from .common import CliError
from .config import resolve
from .quantities import Layout


class Coordinates:
    """The joint coordinates of the model in ``layout`` (the file's own: MuJoCo's qpos/qvel
    for an MJCF or URDF file, rbjax/_cli/quantities.py), or of a JointModel (its qpos/qvel,
    MuJoCo's for a file): name -> (q offset, nq, v offset, nv). A JointModel's free joint is
    also found by its body's name, as maximal coordinates name it (``aliases``)."""

    def __init__(self, model, path: str, layout: Layout):
        self.layout = layout
        self.offsets: dict[str, tuple[int, int, int, int]] = {}
        self.aliases: dict[str, str] = {}
        if isinstance(model, JointModel):
            topo = model.topology
            for j, (name, kind) in enumerate(zip(topo.joint_names, topo.joint_types, strict=True)):
                nq, nv = SIZES[kind]
                self.offsets[name] = (topo.qposadr[j], nq, topo.dofadr[j], nv)
                if kind == "free":
                    self.aliases[topo.names[topo.joint_body[j]]] = name
            self.aliases = {b: j for b, j in self.aliases.items() if b not in self.offsets}
            self.nq, self.nv = model.nq, model.nv
            return
        try:
            js = JointSpace(model, **layout.options())
        except ValueError as exc:
            raise CliError(f"{path}: {exc}") from None
        oq = ov = 0
        for name, _kind, nq, nv in js.coordinates:
            self.offsets[name] = (oq, nq, ov, nv)
            oq, ov = oq + nq, ov + nv
        self.nq, self.nv = oq, ov

    def find(self, path: str, name, velocity: bool) -> tuple[int, int]:
        """(offset, count) of coordinate ``name`` in the positions (velocities if
        ``velocity``); ``path`` is the field that names it."""
        name = self.aliases.get(name, name) if isinstance(name, str) else name
        k = resolve(
            path,
            name,
            self.offsets,
            "coordinate",
            "use a joint name (or a free body's name) of the model",
        )
        oq, nq, ov, nv = self.offsets[list(self.offsets)[k]]
        return (ov, nv) if velocity else (oq, nq)


@dataclasses.dataclass(frozen=True)
class JointCoordinate:
    """``fn(model, state)`` of rbjax.Custom: joint positions (or velocities) [start:stop] in
    ``layout``'s coordinates; of a JointState its qpos (ball and free quaternions read as
    q/|q|: they are never renormalised) or qvel."""

    start: int
    stop: int
    velocity: bool
    layout: Layout = Layout()

    def __call__(self, model, state):
        if isinstance(state, JointState):
            if self.velocity:
                return state.qvel[self.start : self.stop]
            _, _, quat_q, _ = model.topology.rate_rows()
            qpos = state.qpos
            if quat_q.size:
                rows = quat_q[:, None] + np.arange(4)  # (n, 4)
                a = qpos[rows]
                qpos = qpos.at[rows].set(a / jnp.linalg.norm(a, axis=-1, keepdims=True))
            return qpos[self.start : self.stop]
        js = JointSpace(model, **self.layout.options())
        x = js.velocities(state) if self.velocity else js.positions(state)
        return x[self.start : self.stop]
