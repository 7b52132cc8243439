"""The model: bodies stacked as arrays, gravity, forces and a formulation (docs/architecture.md).

Static structure (body count, which bodies are scalable, names, force types) drives tracing;
physical parameters (masses, inertias, gravity, force parameters) are array leaves, so
``jax.grad`` reaches exactly them and ``jax.vmap`` over them gives a batch of different bodies.
"""

from __future__ import annotations

from collections.abc import Sequence

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ._body import Body
from ._dynamics import AbstractFormulation, ScalableDAE
from ._errors import check_finite, check_shape, fail, is_concrete
from ._forces import AbstractForce
from ._state import State


class Model(eqx.Module):
    """A system of nb bodies (one body is the case nb = 1).

    Fields: ``mass`` (nb,) [kg], ``inertia`` (nb, 3, 3) [kg m²] about each centre of mass in
    body axes, ``gravity`` (3,) [m/s²] world frame, ``forces`` (tuple of forces),
    ``formulation`` (how the equations of motion are written; default :class:`ScalableDAE`).
    Leaves may carry leading batch axes (e.g. ``mass`` (B, nb)) for batched rollouts.
    """

    mass: Float[Array, "*batch nb"]
    inertia: Float[Array, "*batch nb 3 3"]
    gravity: Float[Array, "*batch 3"]
    forces: tuple[AbstractForce, ...]
    formulation: AbstractFormulation
    scalable: tuple[bool, ...] = eqx.field(static=True)
    names: tuple[str, ...] = eqx.field(static=True)

    def __init__(
        self,
        bodies: Body | Sequence[Body],
        *,
        gravity=(0.0, 0.0, 0.0),
        forces: Sequence[AbstractForce] = (),
        formulation: AbstractFormulation | None = None,
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
        self.mass = jnp.stack([jnp.asarray(b.mass, dtype) for b in bodies])
        self.inertia = jnp.stack([jnp.asarray(b.inertia, dtype) for b in bodies])
        check_shape("Model.gravity", gravity, (3,))
        check_finite("Model.gravity", gravity, "give a finite gravity vector in m/s^2")
        self.gravity = jnp.asarray(gravity, dtype)
        forces = tuple(forces)
        for i, f in enumerate(forces):
            if not isinstance(f, AbstractForce):
                raise ValueError(
                    f"Model(forces[{i}]) = {f!r} is not an rbjax force. Fix: use PointForce, BodyTorque or ForceFunction."
                )
            body = getattr(f, "body", None)
            if body is not None and not 0 <= body < len(bodies):
                fail(
                    f"forces[{i}].body",
                    body,
                    f"is not a body index in [0, {len(bodies)})",
                    "index the bodies list of the Model",
                )
        self.forces = forces
        formulation = ScalableDAE() if formulation is None else formulation
        if not isinstance(formulation, AbstractFormulation):
            raise ValueError(
                f"Model(formulation={formulation!r}) is not a formulation. Fix: use ScalableDAE(), NewtonEuler() or UdwadiaSchutte()."
            )
        self.scalable = tuple(b.scalable for b in bodies)
        self.names = names
        self.formulation = formulation
        formulation.check_model(self)

    @property
    def nb(self) -> int:
        return len(self.scalable)

    @property
    def rigid(self):
        """Boolean mask (nb,) of bodies that carry the unit-length constraint |A|² = 1."""
        return jnp.asarray([not s for s in self.scalable])

    def check_state(self, state: State, *, atol: float | None = None) -> State:
        """Validate a state against this model (body count; rigid bodies: |A|² = 1 and ν = 0)."""
        if state.q.shape[-2] != self.nb:
            raise ValueError(
                f"State.q has {state.q.shape[-2]} bodies but the model has nb = {self.nb}. "
                "Fix: build the state with one row per body."
            )
        if atol is None:  # 1e-9 in float64; 1e-5 (≈ 100 ulp) in float32
            atol = max(1e-9, 100.0 * float(jnp.finfo(jnp.result_type(state.q)).eps))
        if is_concrete(state.q):
            a2 = np.sum(np.asarray(state.q, dtype=np.float64)[..., 3:7] ** 2, axis=-1)
            bad = np.abs(a2 - 1.0) > atol
            bad = bad & np.asarray([not s for s in self.scalable])
            if np.any(bad):
                where = tuple(int(k) for k in np.argwhere(bad)[0])
                i = where[-1]
                fail(
                    f"State.q[{', '.join(map(str, where))}, 3:7] (quaternion of rigid body '{self.names[i]}')",
                    np.asarray(state.q)[where][3:7],
                    f"has |A|² = {a2[where]:.12g}, not 1",
                    "divide the quaternion by its norm, or declare the body scalable=True",
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
                    "is not 0: a rigid body cannot change size (ν = ds/dt = 0, seed 000 eq. (94))",
                    "set nu=0 for rigid bodies, or declare the body scalable=True",
                )
        return state
