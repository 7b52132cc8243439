"""The ``[[parameters]]`` tables of an ``rbjax identify`` configuration: what is fitted
(:class:`Param`, read by :func:`parameter`) and how ``build(params) -> (model, state0)`` puts
the fitted values into the model and the initial state (:class:`Build`), of an
:class:`rbjax.Model` or an :class:`rbjax.JointModel` (whose dampers and springs are its
per-joint ``damping`` and ``stiffness``, MuJoCo's). The format: rbjax/_cli/identify.py."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .._tree.model import JointModel
from .._tree.topology import SIZES
from .config import array, fail, resolve, string, table
from .quantities import Layout

KINDS = (
    "mass",
    "inertia",
    "damping",
    "stiffness",
    "gravity",
    "joint_position",
    "joint_velocity",
)
KEYS = {  # the keys of each kind besides kind and initial
    "mass": ("body",),
    "inertia": ("body",),
    "damping": ("force", "joint"),
    "stiffness": ("force", "joint"),
    "gravity": (),
    "joint_position": ("coordinate",),
    "joint_velocity": ("coordinate",),
}
FULL = ((0, 0), (1, 1), (2, 2), (0, 1), (0, 2), (1, 2))  # a full inertia's six entries


@dataclasses.dataclass(frozen=True)
class Param:
    """One fitted quantity: ``kind``, ``target`` (body index, force index, a JointModel's
    joint index, or coordinate offset), ``size`` scalars, fitted as logarithms when ``log``;
    ``labels`` name the physical scalars; ``full`` for a full inertia matrix; ``bounds``
    (low, high): every scalar stays in that interval, fitted as rbjax.Bounded's raw value
    (in place of the logarithm). The interval is data of the fit (``params["bounds"]``), not
    part of the compiled program: a configuration that changes only its bounds reuses it."""

    kind: str
    target: int
    size: int
    log: bool
    labels: tuple[str, ...]
    full: bool = False
    bounds: tuple[float, float] | None = dataclasses.field(default=None, compare=False)
    bounded: bool = False  # bounds is not None (compared: it changes the program)

    def value(self, raw, bounds=None):
        """The physical scalars of the raw fitted array (jnp or NumPy); ``bounds`` the
        (low, high) pair to use (default :attr:`bounds`; traced inside the fit)."""
        import jax.numpy as jnp

        from .._params import bounded_value

        if self.bounded:
            low, high = self.interval if bounds is None else bounds
            return bounded_value(jnp.asarray(raw), low, high)
        return jnp.exp(raw) if self.log else raw

    def raw(self, value: np.ndarray) -> np.ndarray:
        """The raw fitted array of the physical scalars (the inverse of :meth:`value`)."""
        if self.bounded:
            low, high = self.interval
            return np.asarray(np.log(value - low) - np.log(high - value))
        return np.asarray(np.log(value)) if self.log else value

    def slope(self, value: np.ndarray) -> np.ndarray:
        """d value/d raw at the physical scalars ``value``, for the delta method."""
        if self.bounded:
            low, high = self.interval
            return (value - low) * (high - value) / (high - low)
        return value if self.log else np.ones_like(value)

    @property
    def interval(self) -> tuple[float, float]:
        """(low, high) of a bounded parameter; (−inf, inf) otherwise."""
        return self.bounds if self.bounds is not None else (-np.inf, np.inf)

    @property
    def coordinate(self) -> str:
        """What the fit moves, for messages: "logit " (bounded), "log " or ""."""
        return "logit " if self.bounded else "log " if self.log else ""


@dataclasses.dataclass(frozen=True)
class Build:
    """``build(params) -> (model, state0)`` for rbjax.identify: hashable and equal for equal
    configurations, so a second run of the same configuration reuses the compiled residuals.
    ``params``: {"fit": tuple of raw arrays (one per Param), "model": the loaded model,
    "state0": its initial state, "qpos0"/"qvel0": initial joint coordinates, "t0", and
    optionally "bounds": per Param its (low, high) array or None, default the Params' own}.
    On a JointModel qpos0/qvel0 are its own coordinates, the initial JointState itself."""

    specs: tuple[Param, ...]
    joint_state: bool
    layout: Layout = Layout()  # which joint coordinates qpos0/qvel0 are

    def __call__(self, p) -> tuple[Any, Any]:  # (Model, State) or (JointModel, JointState)
        import equinox as eqx
        import jax.numpy as jnp

        from .. import state_from_joint_coordinates
        from .._tree.model import JointModel, JointState

        model, qpos, qvel = p["model"], p["qpos0"], p["qvel0"]
        joint = isinstance(model, JointModel)
        intervals = p.get("bounds", (None,) * len(self.specs))  # default: each Param's own
        for spec, raw, bounds in zip(self.specs, p["fit"], intervals, strict=True):
            value = spec.value(raw, bounds)
            k = spec.target
            if spec.kind == "mass":
                model = eqx.tree_at(lambda m: m.mass, model, model.mass.at[k].set(value))
            elif spec.kind == "inertia":
                if spec.full:
                    mat = jnp.zeros((3, 3), value.dtype)
                    for (i, j), v in zip(FULL, value, strict=True):
                        mat = mat.at[i, j].set(v).at[j, i].set(v)
                else:
                    mat = jnp.diag(value)
                model = eqx.tree_at(lambda m: m.inertia, model, model.inertia.at[k].set(mat))
            elif spec.kind == "damping" and joint:  # every DOF of joint k (MuJoCo's)
                d, nv = model.topology.dofadr[k], SIZES[model.topology.joint_types[k]][1]
                model = eqx.tree_at(
                    lambda m: m.damping, model, model.damping.at[d : d + nv].set(value)
                )
            elif spec.kind == "stiffness" and joint:
                model = eqx.tree_at(lambda m: m.stiffness, model, model.stiffness.at[k].set(value))
            elif spec.kind == "damping":
                model = eqx.tree_at(lambda m, k=k: m.forces[k].damping, model, value)
            elif spec.kind == "stiffness":
                model = eqx.tree_at(lambda m, k=k: m.forces[k].stiffness, model, value)
            elif spec.kind == "gravity":
                model = eqx.tree_at(lambda m: m.gravity, model, value)
            elif spec.kind == "joint_position":
                qpos = qpos.at[k : k + spec.size].set(value)
            else:
                qvel = qvel.at[k : k + spec.size].set(value)
        if self.joint_state and joint:
            return model, JointState(p["t0"], qpos, qvel)
        if self.joint_state:
            return model, state_from_joint_coordinates(
                model, qpos, qvel, t=p["t0"], **self.layout.options()
            )
        return model, p["state0"]


def _joint_spring(path: str, p: dict, model: JointModel, kind: str) -> tuple[int, str, float]:
    """The joint index, label and current value of a JointModel's ``damping`` or
    ``stiffness`` a parameter names (``joint``; its dampers are not forces: ``force`` is
    refused)."""
    if "force" in p:
        fail(
            f"{path}.force",
            f"is {p['force']!r}: in joint coordinates a joint's {kind} is the joint's own "
            "(MuJoCo's), not one of the model's forces",
            "give joint = the joint's name, or run with --coordinates maximal",
        )
    if "joint" not in p:
        fail(
            path,
            "names no joint",
            f"give joint = a joint name ({', '.join(model.joint_names) or 'none'})",
        )
    j = resolve(f"{path}.joint", p["joint"], model.joint_names, "joint")
    topo = model.topology
    current = model.damping[topo.dofadr[j]] if kind == "damping" else model.stiffness[j]
    return j, str(p["joint"]), float(current)


def _spring_damper(path: str, p: dict, model) -> tuple[int, str]:
    """The index and label of the spring-damper a parameter names (``force`` or ``joint``)."""
    forces = model.forces

    def describe(k):
        f = forces[k]
        ends = [("ground" if b < 0 else model.names[b]) for b in f.bodies()]
        return f"{k}: {type(f).__name__} {'-'.join(ends)}"

    listed = "; ".join(describe(k) for k in range(len(forces))) or "none"
    if ("force" in p) == ("joint" in p):
        fail(
            path,
            "names no spring-damper" if "force" not in p else "has both force and joint",
            f"give force = its index in the model's forces ({listed}) or joint = a joint name",
        )
    if "force" in p:
        k = p["force"]
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < len(forces):
            fail(
                f"{path}.force",
                f"is {k!r}, not an index of the model's forces ({listed})",
                "give one of these indices",
            )
        label = f"forces[{k}]"
        where = f"{path}.force"
    else:
        j = resolve(f"{path}.joint", p["joint"], model.joint_names, "joint")
        pair = set(model.topology.joint_bodies[j])
        hits = [
            k
            for k in range(len(forces))
            if hasattr(forces[k], "damping") and set(forces[k].bodies()) == pair
        ]
        if len(hits) != 1:
            fail(
                f"{path}.joint",
                f"{len(hits)} spring-dampers act across joint {p['joint']!r} (forces: {listed})",
                "give force = the index of the one to fit",
            )
        k, label, where = hits[0], str(p["joint"]), f"{path}.joint"
    if not hasattr(forces[k], "damping"):
        fail(
            where,
            f"forces[{k}] is a {type(forces[k]).__name__}, not a spring-damper",
            "name a TranslationalSpringDamper, RotationalSpringDamper or AxialSpringDamper",
        )
    return k, label


def parameter(i: int, p, model, start_value, coords_of):
    """(Param, raw initial array, initial physical values) of ``[[parameters]]`` entry i.

    ``start_value(velocity, start, n)``: the initial joint coordinates [start:start+n] that
    [state] or the model gives, or None; ``coords_of(path)``: the model's
    :class:`~rbjax._cli.coordinates.Coordinates` (errors naming ``path``)."""
    path = f"parameters[{i}]"
    every = ("kind", *dict.fromkeys(k for ks in KEYS.values() for k in ks), "initial", "bounds")
    kind = string(f"{path}.kind", table(path, p, every, ("kind",))["kind"], KINDS)
    required = () if kind in ("damping", "stiffness") else KEYS[kind][:1]
    table(path, p, ("kind", *KEYS[kind], "initial", "bounds"), required)
    init = p.get("initial")
    if kind == "mass":
        b = resolve(f"{path}.body", p["body"], model.names, "body")
        value = (
            np.asarray(model.mass[b], float)
            if init is None
            else array(f"{path}.initial", init, (), "a mass in kg")
        )
        spec = Param(kind, b, 1, True, (f"{model.names[b]}.mass",))
    elif kind == "inertia":
        b = resolve(f"{path}.body", p["body"], model.names, "body")
        nm = model.names[b]
        if init is None:
            mat = np.asarray(model.inertia[b], float)
            diagonal = np.allclose(
                mat, np.diag(np.diag(mat)), rtol=0, atol=1e-12 * np.abs(mat).max()
            )
            init = np.diag(mat).tolist() if diagonal else mat.tolist()
        full = isinstance(init, list) and bool(init) and isinstance(init[0], list)
        if full:
            mat = array(f"{path}.initial", init, (3, 3), "a symmetric 3x3 inertia in kg m^2")
            if not np.allclose(mat, mat.T):
                fail(f"{path}.initial", "is not symmetric", "write a symmetric 3x3 matrix")
            value = np.asarray([mat[a, c] for a, c in FULL])
            labels = tuple(f"{nm}.I{'xyz'[a]}{'xyz'[c]}" for a, c in FULL)
        else:
            value = array(
                f"{path}.initial",
                init,
                (3,),
                "three principal moments [Ixx, Iyy, Izz] in kg m^2, or a 3x3 matrix",
            )
            labels = tuple(f"{nm}.I{a}{a}" for a in "xyz")
        spec = Param(kind, b, value.size, not full, labels, full)
    elif kind in ("damping", "stiffness"):
        if isinstance(model, JointModel):
            k, label, current = _joint_spring(path, p, model, kind)
        else:
            k, label = _spring_damper(path, p, model)
            current = getattr(model.forces[k], kind)
        value = (
            np.asarray(current, float)
            if init is None
            else array(f"{path}.initial", init, (), f"the {kind} as a number")
        )
        spec = Param(kind, k, 1, True, (f"{label}.{kind}",))
    elif kind == "gravity":
        value = (
            np.asarray(model.gravity, float)
            if init is None
            else array(f"{path}.initial", init, (3,), "a vector [gx, gy, gz] in m/s^2")
        )
        spec = Param(kind, 0, 3, False, ("gravity.x", "gravity.y", "gravity.z"))
    else:
        velocity = kind == "joint_velocity"
        coords = coords_of(f"{path}.coordinate")
        start, n = coords.find(f"{path}.coordinate", p["coordinate"], velocity)
        shape = () if n == 1 else (n,)
        if init is None:
            known = start_value(velocity, start, n)
            if known is None:
                fail(
                    f"{path}.initial",
                    "is missing, and neither [state] nor the model's initial state gives it",
                    "give the starting value",
                )
            value = known.reshape(shape)
        else:
            value = array(f"{path}.initial", init, shape, f"{n} number(s)")
        name = f"{p['coordinate']}.{'qvel0' if velocity else 'qpos0'}"
        labels = (name,) if n == 1 else tuple(f"{name}[{c}]" for c in range(n))
        spec = Param(kind, start, n, False, labels)
    value = np.asarray(value, float)
    if "bounds" in p:
        bounds = _bounds(f"{path}.bounds", p["bounds"], spec)
        spec = dataclasses.replace(spec, bounds=bounds, bounded=True)
        low, high = bounds
        if not np.all((value > low) & (value < high)):
            fail(
                f"{path}.initial",
                f"is {value.tolist()}, not strictly inside bounds = [{low:g}, {high:g}]",
                "start inside the interval, or widen the bounds",
            )
    elif spec.log and not np.all(value > 0):
        fail(
            f"{path}.initial",
            f"is {value.tolist()}: a {kind} is fitted as a logarithm and must start > 0",
            f"give a positive starting guess for the {kind}",
        )
    return spec, spec.raw(value), value.reshape(-1)


def _bounds(path: str, v, spec: Param) -> tuple[float, float]:
    """``bounds = [low, high]``: finite, low < high; low ≥ 0 for a quantity fitted as a
    logarithm (mass, principal moments, damping, stiffness): it must stay positive."""
    low, high = array(path, v, (2,), "the interval [low, high] the value must stay in")
    if not low < high:
        fail(path, f"is {v!r}: low >= high", "write [low, high] with low < high")
    if spec.full:
        fail(
            path,
            "bounds a full 3x3 inertia entry by entry, which does not keep it physical",
            "fit three principal moments (initial = [Ixx, Iyy, Izz]) to bound them",
        )
    if spec.log and low < 0:
        fail(
            path,
            f"is {v!r}: a {spec.kind} must stay positive",
            f"give low >= 0, e.g. bounds = [0, {high:g}]",
        )
    return float(low), float(high)
