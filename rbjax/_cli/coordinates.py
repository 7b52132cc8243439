"""The joint coordinates that an ``rbjax identify`` configuration names: the model file's
own (MuJoCo's qpos/qvel for an MJCF or URDF file, rbjax.JointSpace's for a model file) by
joint name (a free body by its body name), found with errors naming the
field path, and the rbjax.Custom observation function that reads one of them."""

from __future__ import annotations

import dataclasses

from .._analysis.joint_space import JointSpace
from .common import CliError
from .config import resolve
from .quantities import Layout


class Coordinates:
    """The joint coordinates of the model in ``layout`` (the file's own: MuJoCo's qpos/qvel
    for an MJCF or URDF file, rbjax/_cli/quantities.py): name -> (q offset, nq, v offset,
    nv)."""

    def __init__(self, model, path: str, layout: Layout):
        self.layout = layout
        try:
            js = JointSpace(model, **layout.options())
        except ValueError as exc:
            raise CliError(f"{path}: {exc}") from None
        self.offsets: dict[str, tuple[int, int, int, int]] = {}
        oq = ov = 0
        for name, _kind, nq, nv in js.coordinates:
            self.offsets[name] = (oq, nq, ov, nv)
            oq, ov = oq + nq, ov + nv
        self.nq, self.nv = oq, ov

    def find(self, path: str, name, velocity: bool) -> tuple[int, int]:
        """(offset, count) of coordinate ``name`` in the positions (velocities if
        ``velocity``); ``path`` is the field that names it."""
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
    ``layout``'s coordinates."""

    start: int
    stop: int
    velocity: bool
    layout: Layout = Layout()

    def __call__(self, model, state):
        js = JointSpace(model, **self.layout.options())
        x = js.velocities(state) if self.velocity else js.positions(state)
        return x[self.start : self.stop]
