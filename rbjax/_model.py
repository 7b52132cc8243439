"""The model: bodies stacked as arrays, gravity, forces and a formulation (docs/devdocs/architecture.md).

Static structure (body count, which bodies are scalable, names, force types) drives tracing;
physical parameters (masses, inertias, gravity, force parameters) are array leaves, so
``jax.grad`` reaches exactly them and ``jax.vmap`` over them gives a batch of different bodies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ._abstract import AbstractModel
from ._body import Body
from ._constraints import AbstractConstraint
from ._dynamics import AbstractFormulation, ScalableDAE
from ._errors import (
    Rule,
    check_finite,
    check_shape,
    enforce,
    fail,
    is_concrete,
    validates_inputs,
)
from ._forces import AbstractForce, ForceFunction, Wrench
from ._state import State, fresh_tolerances, saved_state
from ._topology import GROUND, Topology, group_joints
from ._welds import Merge, plan


@validates_inputs
class Model(AbstractModel):
    """A system of nb bodies (one body is the case nb = 1), in maximal coordinates (an
    :class:`rbjax.AbstractModel`).

    Fields: ``mass`` (nb,) [kg], ``inertia`` (nb, 3, 3) [kg m²] about each centre of mass in
    body axes, ``gravity`` (3,) [m/s²] world frame, ``forces`` (tuple of forces),
    ``formulation`` (how the equations of motion are written; default :class:`ScalableDAE`).
    Leaves may carry leading batch axes (e.g. ``mass`` (B, nb)) for batched rollouts.

    **Welded bodies.** A point mass (:meth:`rbjax.Body.point_mass`) welded by a
    :class:`rbjax.Fixed` joint, and with ``merge_welded=True`` every body a ``Fixed`` joint
    welds, is merged at build into the body that carries it (or removed, when welded to the
    ground): one rigid body with the composite mass, centre of mass and parallel-axis inertia
    (rbjax/_welds.py). The model's bodies (``names``, ``nb``, ``mass``, states, trajectories)
    are then the merged ones; ``merged`` (:class:`rbjax.advanced.Merge`) says where every
    body given here sits, :meth:`merge_state` converts a state listing them all, and
    :meth:`expand` gives every body's motion back; :func:`rbjax.weld_reactions` reports the
    merged welds' reactions. Joints and built-in forces on a merged body are re-expressed on
    its carrier; a :class:`rbjax.ForceFunction` still sees every body given here.
    """

    mass: Float[Array, "*batch nb"]
    inertia: Float[Array, "*batch nb 3 3"]
    gravity: Float[Array, "*batch 3"]
    forces: tuple[AbstractForce, ...]
    formulation: AbstractFormulation
    joints: tuple[AbstractConstraint, ...]
    baumgarte: tuple[Float[Array, ""], Float[Array, ""]] | None
    topology: Topology
    merged: Merge | None

    # checked at build time and, traced, inside a rollout's program: Baumgarte's
    # stabilisation c̈ + 2α ċ + β² c = 0 (rbjax/_engine/dynamics.py) damps the drift for
    # α >= 0; β enters squared, and is asked >= 0 like α, one convention for both
    _rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            ("baumgarte",),
            lambda xp, ab: ~((ab[..., 0] < 0) | (ab[..., 1] < 0)),
            "has a negative gain (alpha < 0 drives the drift away from the joints)",
            "pass e.g. baumgarte=(10.0, 10.0) [1/s], alpha and beta >= 0, or None",
        ),
    )

    def __init__(
        self,
        bodies: Body | Sequence[Body],
        *,
        gravity=(0.0, 0.0, 0.0),
        forces: Sequence[AbstractForce] = (),
        joints: Sequence[AbstractConstraint] = (),
        formulation: AbstractFormulation | None = None,
        baumgarte: tuple[float, float] | None = None,
        merge_welded: bool = False,
    ):
        if isinstance(bodies, Body):
            bodies = [bodies]
        bodies = list(bodies)
        if not bodies:
            raise ValueError("Model(bodies=[]) has no bodies. Fix: pass at least one rbjax.Body.")
        for i, b in enumerate(bodies):
            if not isinstance(b, Body):
                raise ValueError(
                    f"Model(bodies[{i}]) = {b!r} is not an rbjax.Body. Fix: build it with rbjax.Body(mass, inertia)."
                )
        names = tuple(
            b.name if b.name != "body" or len(bodies) == 1 else f"body{i}"
            for i, b in enumerate(bodies)
        )
        if len(set(names)) != len(names):
            raise ValueError(
                f"Model bodies have duplicate names {names}. Fix: give each Body a unique name=."
            )
        dtype = jnp.result_type(*[b.inertia.dtype for b in bodies])
        check_shape("Model.gravity", gravity, (3,))
        check_finite("Model.gravity", gravity, "give a finite gravity vector in m/s^2")
        self.gravity = jnp.asarray(gravity, dtype)
        forces = tuple(forces)
        for i, f in enumerate(forces):
            if not isinstance(f, AbstractForce):
                raise ValueError(
                    f"Model(forces[{i}]) = {f!r} is not an rbjax force. Fix: use PointForce, "
                    "BodyTorque, ForceFunction, TranslationalSpringDamper or RotationalSpringDamper."
                )
            acts_on = tuple(f.bodies())
            sides = {1: ("body",), 2: ("body_i", "body_j")}.get(
                len(acts_on), tuple(f"bodies()[{k}]" for k in range(len(acts_on)))
            )
            for side, b in zip(sides, acts_on, strict=True):
                ground_ok = len(acts_on) > 1  # a side of a two-body force may be the world
                if not ((ground_ok and b == GROUND) or 0 <= b < len(bodies)):
                    fail(
                        f"forces[{i}].{side}",
                        b,
                        f"is not a body index in [0, {len(bodies)})"
                        + (" or rbjax.GROUND (-1)" if ground_ok else ""),
                        "index the bodies list of the Model"
                        + (", or use rbjax.GROUND" if ground_ok else ""),
                    )
            if len(acts_on) == 2 and acts_on[0] == acts_on[1]:
                fail(
                    f"forces[{i}].body_j",
                    acts_on[1],
                    "equals body_i: the force connects a body to itself",
                    "connect two different bodies (or a body and rbjax.GROUND)",
                )
        for i, f in enumerate(forces):
            _check_force_output(i, f, len(bodies), dtype)
        if not isinstance(merge_welded, bool):
            fail("Model.merge_welded", merge_welded, "is not True or False", "pass a bool")
        bodies, joints, forces, self.merged = plan(
            bodies, names, tuple(joints), forces, merge_welded, dtype
        )
        if self.merged is not None:
            names = tuple(b.name for b in bodies)
        self.mass = jnp.stack([jnp.asarray(b.mass, dtype) for b in bodies])
        self.inertia = jnp.stack([jnp.asarray(b.inertia, dtype) for b in bodies])
        self.forces = tuple(forces)
        formulation = ScalableDAE() if formulation is None else formulation
        if not isinstance(formulation, AbstractFormulation):
            raise ValueError(
                f"Model(formulation={formulation!r}) is not a formulation. Fix: use ScalableDAE(), NewtonEuler() or UdwadiaSchutte()."
            )
        self.joints = tuple(joints)
        self.topology = _topology(self.joints, names, tuple(b.scalable for b in bodies), dtype)
        if baumgarte is not None:
            if np.shape(baumgarte) != (2,) or not np.all(np.isfinite(baumgarte)):
                fail(
                    "Model.baumgarte",
                    baumgarte,
                    "is not a pair (alpha, beta) of finite numbers >= 0",
                    "pass e.g. baumgarte=(10.0, 10.0) [1/s], or None",
                )
            self.baumgarte = (jnp.asarray(baumgarte[0], dtype), jnp.asarray(baumgarte[1], dtype))
        else:
            self.baumgarte = None
        self.formulation = formulation
        enforce(self, "Model")
        formulation.check_model(self)

    def merge_state(self, state: State, *, atol: float | None = None) -> State:
        """The model's state from ``state`` listing every body given to the constructor (with
        welds merged, rows of merged bodies must sit where their welds put them: checked to
        ``atol``, :meth:`rbjax.advanced.Merge.merge_state`). Without merged welds: ``state``."""
        if self.merged is None:
            return state
        return self.merged.merge_state(state, atol=atol)

    def expand(self, state: State) -> State:
        """``state`` (any batch or time axes, e.g. ``Trajectory.states``) with one row per body
        given to the constructor: merged bodies ride on their carriers (welded to the ground:
        at rest). Without merged welds: ``state``. The states of a failed trajectory expand
        to NaN as they are (:meth:`rbjax.Trajectory.states`)."""
        if self.merged is None:
            return state
        q, u = self.merged.expand(state.q, state.u)
        return saved_state(state.t, q, u)

    @property
    def names(self) -> tuple[str, ...]:
        """Body names, in body order."""
        return self.topology.names

    @property
    def scalable(self) -> tuple[bool, ...]:
        """Which bodies are scalable (Möller & Glocker 2012 §4), in body order."""
        return self.topology.scalable

    @property
    def joint_names(self) -> tuple[str, ...]:
        """Unique joint names, in ``joints`` order."""
        return self.topology.joint_names

    @property
    def joint_rows(self) -> tuple[int, ...]:
        """Number of equations of each joint, in ``joints`` order."""
        return self.topology.joint_rows

    @property
    def nb(self) -> int:
        return self.topology.nb

    @property
    def rigid(self):
        """Boolean mask (nb,) of bodies that carry the unit-length constraint |A|² = 1."""
        return jnp.asarray([not s for s in self.scalable])

    def astype(self, dtype) -> Model:
        """This model with every floating-point array (masses, inertias, gravity, force and
        joint parameters) converted to ``dtype``: the way to run a float64-built model in
        float32 (a state must have the model's dtype; docs/conventions.md)."""
        dtype = jnp.dtype(dtype)
        if not jnp.issubdtype(dtype, jnp.floating):
            raise ValueError(
                f"Model.astype(dtype={dtype}) is not a floating-point dtype. Fix: pass "
                "jnp.float32 or jnp.float64."
            )

        def convert(x):
            floating = eqx.is_array(x) and jnp.issubdtype(x.dtype, jnp.floating)
            return jnp.asarray(x, dtype) if floating else x

        return jax.tree.map(convert, self)

    def check_state(self, state: State, *, atol: float | None = None) -> State:
        """Validate a state against this model (body count; one dtype; rigid bodies: |A|² = 1
        and ν = 0)."""
        if not isinstance(state, State):
            raise ValueError(
                f"state = {type(state).__name__} is not an rbjax.State. Fix: build it with "
                "rbjax.make_state(...) or rbjax.State(t, q, u)."
            )
        if jnp.result_type(state.q) != jnp.result_type(self.mass):
            raise ValueError(
                f"State.q has dtype {jnp.result_type(state.q)} but the model's arrays are "
                f"{jnp.result_type(self.mass)}: one computation has one dtype "
                "(docs/conventions.md). Fix: convert the model with "
                f"model.astype({jnp.result_type(state.q)}) or build the state with "
                f"rbjax.make_state(..., dtype={jnp.result_type(self.mass)})."
            )
        if (
            self.merged is not None
            and state.q.shape[-2] == len(self.merged.names)
            and state.q.shape[-2] != self.nb
        ):
            raise ValueError(
                f"State.q lists the {len(self.merged.names)} bodies given to the Model, but "
                f"welds merged {list(self.merged.merged)} into the bodies that carry them: the "
                f"model has nb = {self.nb} ({list(self.names)}). Fix: convert it with "
                "model.merge_state(state) (and back with model.expand)."
            )
        if state.q.shape[-2] != self.nb:
            raise ValueError(
                f"State.q has {state.q.shape[-2]} bodies but the model has nb = {self.nb}. "
                "Fix: build the state with one row per body."
            )
        if atol is None:  # 1e-9 in float64; 1e-5 (≈ 100 ulp) in float32
            atol = fresh_tolerances(jnp.result_type(state.q))[0]
        if is_concrete(state.q):
            with np.errstate(over="ignore"):  # |A|² = inf for a huge quaternion: refused below
                a2 = np.sum(np.asarray(state.q, dtype=np.float64)[..., 3:7] ** 2, axis=-1)
            bad = np.abs(a2 - 1.0) > atol
            bad = bad & np.asarray([not s for s in self.scalable])
            if np.any(bad):
                where = tuple(int(k) for k in np.argwhere(bad)[0])
                i = where[-1]
                fail(
                    f"State.q[{', '.join(map(str, where))}, 3:7] (quaternion of rigid body '{self.names[i]}')",
                    np.asarray(state.q)[where][3:7],
                    f"has |A|² = {a2[where]:.12g}, not 1 (tolerance {atol:.1g})",
                    "divide the quaternion by its norm, or declare the body scalable=True; to "
                    "continue a rollout, pass its Trajectory as the initial state",
                )
        if is_concrete(state.u):
            nu = np.asarray(state.u)[..., 3]
            bad = (np.abs(nu) > atol) & np.asarray([not s for s in self.scalable])
            if np.any(bad):
                where = tuple(int(k) for k in np.argwhere(bad)[0])
                i = where[-1]
                fail(
                    f"State.u[{', '.join(map(str, where))}, 3] (scaling rate ν of rigid body '{self.names[i]}')",
                    nu[where],
                    "is not 0: a rigid body cannot change size (ν = ds/dt = 0, Möller & Glocker 2012 eq. (94))",
                    "set nu=0 for rigid bodies, or declare the body scalable=True",
                )
        return state


def _check_force_output(i: int, force, nb: int, dtype) -> None:
    """A user force law (:class:`rbjax.ForceFunction`) must return the resultants of ONE
    system, (F (nb, 3), S_C (nb,), M_C (nb, 3)) in the model's dtype: checked once at build
    time on abstract values (``jax.eval_shape``), so a wrong shape or dtype is a ValueError
    naming the force instead of a broadcasting error deep in a rollout."""
    if not isinstance(force, ForceFunction):
        return
    spec = jax.ShapeDtypeStruct((nb, 7), dtype)
    scalar = jax.ShapeDtypeStruct((), dtype)

    def call(t, q, u):
        out = force.fn(t, State(t=t, q=q, u=u), force.params)
        if isinstance(out, Wrench):
            return (out.force_world, out.scaling, out.moment_body)
        return tuple(out)

    where = f"forces[{i}] (ForceFunction {getattr(force.fn, '__name__', 'fn')})"
    try:
        out = jax.eval_shape(call, scalar, spec, spec)
    except Exception as e:  # noqa: BLE001 - reported with the force named
        raise ValueError(
            f"{where} cannot be evaluated on one system's state (q, u of shape ({nb}, 7)): "
            f"{type(e).__name__}: {e}. Fix: fn(t, state, params) must return (F (nb, 3), "
            "S_C (nb,), M_C (nb, 3)) or an rbjax.Wrench."
        ) from e
    expected = ((nb, 3), (nb,), (nb, 3))
    names = ("F", "S_C", "M_C")
    if len(out) != 3:
        raise ValueError(
            f"{where} returned {len(out)} values, not 3. Fix: return (F (nb, 3), S_C (nb,), "
            "M_C (nb, 3)) or an rbjax.Wrench."
        )
    for name, got, shape in zip(names, out, expected, strict=True):
        if tuple(got.shape) != shape:
            raise ValueError(
                f"{where} returned {name} of shape {tuple(got.shape)}, expected {shape} for a "
                f"model of {nb} bodies. Fix: return one row per body of the model (zeros for "
                "the bodies the force does not act on)."
            )
        if got.dtype != dtype:
            raise ValueError(
                f"{where} returned {name} of dtype {got.dtype}, but the model is {dtype}. "
                "Fix: build the arrays from the state (e.g. jnp.zeros_like(state.q[:, :3])) or "
                "with dtype=state.q.dtype."
            )


def require_model(model, field: str = "model") -> Model:
    """``model``, or a ValueError unless it is an rbjax.Model (a Body, a tuple of bodies, a
    loaded file's bundle or a JointModel passed by mistake get the fix)."""
    if isinstance(model, Model):
        return model
    hint = {
        "Body": "wrap it: rbjax.Model(body, gravity=...)",
        "Loaded": "pass loaded.model (and loaded.state)",
        "JointModel": "this function works on maximal coordinates for now: load the file "
        "in maximal coordinates: rbjax.load(path, formulation=rbjax.ScalableDAE())",
    }.get(type(model).__name__, "build one with rbjax.Model(bodies, ...)")
    raise ValueError(f"{field} = {type(model).__name__} is not an rbjax.Model. Fix: {hint}.")


def _rows(joint, dtype) -> int:
    """The number of equations of ``joint``, from its residual traced on abstract values
    (55 ms a joint). rbjax's own joints and basic constraints (rbjax/_joints.py,
    rbjax/_constraints.py; not the drivers and CustomConstraint, which call the user's
    functions) have as many equations as their type says, so one trace per type serves them
    all: the 121 joints of benchmarks/models.py fourbars_40 took 5.0 s to build, 3 traces
    now."""
    cls = type(joint)
    if cls.__module__ not in _OWN or cls.__name__ not in _FIXED_ROWS:
        return _trace_rows(joint, dtype)
    key = (cls, np.dtype(dtype))
    if key not in _ROWS:
        _ROWS[key] = _trace_rows(joint, dtype)
    return _ROWS[key]


_OWN = ("rbjax._joints", "rbjax._constraints")
_FIXED_ROWS = {
    "Spherical", "Revolute", "Universal", "Cylindrical", "Translational", "Fixed",
    "Parallel", "Perpendicular", "PointOnLine", "Distance", "DP1", "DP2", "D", "CD",
}  # fmt: skip
_ROWS: dict = {}


def _trace_rows(joint, dtype) -> int:
    q = jax.ShapeDtypeStruct((7,), dtype)
    t = jax.ShapeDtypeStruct((), dtype)
    return int(jax.eval_shape(joint.residual, q, q, t).shape[0])


def _topology(joints, names, scalable, dtype) -> Topology:
    """Check each joint and resolve its bodies (names or indices) and rows once, at build time
    (ValueError naming the joint)."""
    nb = len(names)
    bodies, joint_names, rows = [], [], []
    seen: set[str] = set()
    for k, j in enumerate(joints):
        if not isinstance(j, AbstractConstraint):
            raise ValueError(
                f"Model(joints[{k}]) = {j!r} is not an rbjax joint or constraint. "
                "Fix: use rbjax.Revolute, Spherical, ..., DP1/DP2/D/CD or CustomConstraint."
            )
        resolved = []
        for side in ("body_i", "body_j"):
            b = getattr(j, side)
            if isinstance(b, str):
                if b not in names:
                    raise ValueError(
                        f"joint '{j.name}' (joints[{k}]) names unknown body {side} = '{b}'. "
                        f"The bodies are {list(names)}. Fix: use one of these names, a body "
                        "index or rbjax.GROUND."
                    )
                b = names.index(b)
            elif isinstance(b, (int, np.integer)) and not isinstance(b, bool):
                if not (b == GROUND or 0 <= b < nb):
                    raise ValueError(
                        f"joint '{j.name}' (joints[{k}]) has {side} = {b}, which is not a body: "
                        f"the model has bodies 0..{nb - 1}. Fix: use a body index, a body name "
                        "or rbjax.GROUND (-1)."
                    )
                b = int(b)
            else:
                raise ValueError(
                    f"joint '{j.name}' (joints[{k}]) has {side} = {b!r}. Fix: use a body index, a "
                    "body name or rbjax.GROUND."
                )
            resolved.append(b)
        if resolved[0] == resolved[1]:
            raise ValueError(
                f"joint '{j.name}' (joints[{k}]) connects body {resolved[0]} to itself. "
                "Fix: a joint connects two different bodies (or a body and rbjax.GROUND)."
            )
        name = j.name if j.name not in seen else f"{j.name}[{k}]"
        seen.add(name)
        try:
            m = _rows(j, dtype)
        except Exception as e:  # a user residual that cannot be traced
            raise ValueError(
                f"joint '{name}' (joints[{k}]): its residual cannot be evaluated on q_i, q_j of "
                f"shape (7,) ({type(e).__name__}: {e}). Fix: return a 1-D array of residuals."
            ) from e
        if m < 1:
            raise ValueError(
                f"joint '{name}' (joints[{k}]) has no equations. Fix: return >= 1 rows."
            )
        bodies.append((resolved[0], resolved[1]))
        joint_names.append(name)
        rows.append(m)
    return Topology(
        names=tuple(names),
        scalable=tuple(scalable),
        joint_bodies=tuple(bodies),
        joint_names=tuple(joint_names),
        joint_rows=tuple(rows),
        joint_groups=group_joints(joints),
    )
