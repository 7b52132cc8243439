"""The one state convention of rbjax (docs/conventions.md).

``State(t, q, u)`` for a system of nb bodies, any leading batch axes allowed:

* ``t`` (...)       -- time [s];
* ``q`` (..., nb, 7) -- generalized coordinates q = (r, a0, a) of Möller & Glocker 2012 eq. (35): centre of
  mass position r in the world frame [m] and the UNCONSTRAINED quaternion A, scalar first;
* ``u`` (..., nb, 7) -- generalized velocities u = (v, ν, ω) of Möller & Glocker 2012 eq. (38): centre of mass
  velocity v (world) [m/s], scaling rate ν = ds/dt [1/s] and ω = 2 Im(A* Ȧ) (eq. (37)), which is
  the BODY-frame angular velocity scaled by s = |A|² (eq. (49)); for a rigid body s = 1.

Positions are world frame; ω is body frame; forces are world frame; torques are body frame.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ._abstract import AbstractState
from ._errors import check_finite, check_shape, fail, is_concrete, validates_inputs


def _real(field: str):
    """Converter of a State field: integers (and Python numbers) become JAX's default float,
    as in :class:`rbjax.Body`; floating arrays (and tracers) pass unchanged; anything else
    (strings, booleans, complex numbers, objects) is a ValueError naming the field."""

    def convert(x) -> Any:
        kind = getattr(x, "dtype", None)
        if kind is None:
            try:
                kind = np.asarray(x).dtype
            except Exception:  # noqa: BLE001 - reported below as not numeric
                kind = np.dtype(object)
        if np.issubdtype(kind, np.floating):
            return x
        if np.issubdtype(kind, np.integer) and not np.issubdtype(kind, np.bool_):
            return jnp.asarray(x, jnp.result_type(float))
        raise ValueError(
            f"State.{field} = {_short_repr(x)} has dtype {kind}, not a real number. Fix: pass "
            "floating-point arrays (build states with rbjax.make_state)."
        )

    return convert


def _short_repr(x) -> str:
    text = repr(x)
    return text if len(text) <= 60 else text[:57] + "..."


def fresh_tolerances(dtype) -> tuple[float, float]:
    """What a FRESH initial state must satisfy, one policy for every entry point (rollout,
    the checks of traced inputs, the Monte-Carlo runner): (tolerance on a rigid body's
    |A|² − 1 and ν, tolerance on the joints' position and velocity equations) = (1e-9, 1e-8)
    in float64 and (100 ε, 1e-3) in float32. A state an integrator produced carries more
    drift (RK4 at 10 ms: |A|² − 1 ≈ 1e-8 after 10⁴ steps); continuing a Trajectory skips
    these and the runtime monitors (rbjax.Plausibility) judge it instead."""
    eps = float(jnp.finfo(dtype).eps)
    return max(1e-9, 100.0 * eps), (1e-8 if jnp.dtype(dtype) == jnp.float64 else 1e-3)


@validates_inputs
class State(AbstractState):
    """Time, coordinates and generalized velocities of a system in maximal coordinates (see
    module docstring; an :class:`rbjax.AbstractState`).

    q and u have shape (*batch, nb, 7) and one dtype; t has shape ``batch`` (or () for every
    member at the same time). Integer inputs are converted to the default float."""

    t: Float[Array, "*batch"]
    q: Float[Array, "*batch nb 7"]
    u: Float[Array, "*batch nb 7"]

    def __init__(self, t, q, u):
        self.q, self.u = _real("q")(q), _real("u")(u)
        if isinstance(t, (int, float)) and not isinstance(t, bool):
            t = jnp.asarray(t, jnp.result_type(self.q))  # a Python number takes q's dtype
        self.t = _real("t")(t)

    def __check_init__(self):
        for name in ("q", "u"):
            if np.ndim(getattr(self, name)) < 2:
                raise ValueError(
                    f"State.{name} has shape {np.shape(getattr(self, name))}: one row per body "
                    "is needed. Fix: pass shape (nb, 7), e.g. q[None] for one body (or build "
                    "the state with rbjax.make_state)."
                )
        check_shape("State.q", self.q, (7,))
        check_shape("State.u", self.u, (7,))
        if np.shape(self.q) != np.shape(self.u):
            raise ValueError(
                f"State.q has shape {np.shape(self.q)} but State.u has shape {np.shape(self.u)}. "
                "Fix: q and u must both be (..., nb, 7)."
            )
        dtypes = {k: np.dtype(jnp.result_type(getattr(self, k))) for k in ("t", "q", "u")}
        if len(set(dtypes.values())) > 1:
            raise ValueError(
                f"State mixes dtypes ({', '.join(f'{k}: {v}' for k, v in dtypes.items())}). "
                "Fix: give t, q and u one dtype (rbjax.make_state(..., dtype=...))."
            )
        batch = np.shape(self.q)[:-2]
        if np.shape(self.t) not in ((), batch):
            raise ValueError(
                f"State.t has shape {np.shape(self.t)} but the state's batch shape is {batch}. "
                "Fix: pass one time per system (shape batch) or one scalar time."
            )
        check_finite("State.t", self.t, "give a finite time")
        check_finite("State.q", self.q, "positions and quaternions must be finite")
        check_finite("State.u", self.u, "velocities must be finite")
        if is_concrete(self.q):
            if np.any(np.all(np.asarray(self.q)[..., 3:7] == 0.0, axis=-1)):
                fail(
                    "State.q[..., 3:7] (quaternion)",
                    np.asarray(self.q)[..., 3:7],
                    "has a zero quaternion",
                    "a body's quaternion must be nonzero; use (1, 0, 0, 0) for no rotation",
                )

    @property
    def nb(self) -> int:
        return self.q.shape[-2]

    @property
    def position(self):
        return self.q[..., 0:3]

    @property
    def quaternion(self):
        return self.q[..., 3:7]

    @property
    def velocity(self):
        return self.u[..., 0:3]

    @property
    def nu(self):
        return self.u[..., 3]

    @property
    def omega_body(self):
        return self.u[..., 4:7]


@functools.cache
def _state_treedef():
    q = np.asarray([[0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]])
    return jax.tree.structure(State(t=np.zeros(()), q=q, u=np.zeros((1, 7))))


def saved_state(t, q, u) -> State:
    """A :class:`State` of values an rbjax computation produced (a trajectory's saved states,
    a state expanded from one), built without the checks of ``State(...)``: after a failure
    (``rollout(..., throw=False)``) the states from the failed step on hold its NaN or inf,
    and they stay readable as they are. A State a user builds is still checked. (An equinox
    Module rebuilt from its leaves, as ``jax.tree.unflatten`` does, runs neither ``__init__``
    nor ``__check_init__``.)"""
    return jax.tree.unflatten(_state_treedef(), (t, q, u))


def make_state(
    *,
    position=None,
    quaternion=None,
    velocity=None,
    omega_body=None,
    nu=None,
    t=0.0,
    nb: int | None = None,
    dtype=None,
) -> State:
    """Build a validated :class:`State` from named parts (missing parts default to rest/identity).

    Shapes: position, velocity, omega_body (..., nb, 3) or (3,) for one body; quaternion
    (..., nb, 4) or (4,); nu (..., nb). The quaternion is NOT normalised: a scalable body may
    start with |A|² ≠ 1; rigid bodies are checked by the model (``Model.check_state``).
    """
    parts = {
        "position": position,
        "quaternion": quaternion,
        "velocity": velocity,
        "omega_body": omega_body,
    }
    given = [np.shape(v) for v in parts.values() if v is not None]
    if nb is None:
        nb = 1
        for shp in given:
            if len(shp) >= 2:
                nb = shp[-2]
                break
    if dtype is None:
        dtype = jnp.result_type(float)

    def part(name, value, width, default):
        if value is None:
            arr = jnp.broadcast_to(jnp.asarray(default, dtype), (nb, width))
        else:
            arr = jnp.asarray(value, dtype)
            check_shape(f"make_state({name}=...)", arr, (width,))
            check_finite(f"make_state({name}=...)", arr, f"{name} must be finite")
            if arr.ndim == 1:
                arr = jnp.broadcast_to(arr, (nb, width))
        return arr

    r = part("position", position, 3, [0.0, 0.0, 0.0])
    a = part("quaternion", quaternion, 4, [1.0, 0.0, 0.0, 0.0])
    v = part("velocity", velocity, 3, [0.0, 0.0, 0.0])
    w = part("omega_body", omega_body, 3, [0.0, 0.0, 0.0])
    n = jnp.zeros(w.shape[:-1], dtype) if nu is None else jnp.asarray(nu, dtype)
    shapes = [r.shape[:-1], a.shape[:-1], v.shape[:-1], w.shape[:-1], n.shape]
    try:
        lead = np.broadcast_shapes(*shapes)
    except ValueError:
        raise ValueError(
            f"make_state: parts have incompatible shapes {shapes}. Fix: use (..., nb, k) for all parts."
        ) from None
    r, a, v, w = (jnp.broadcast_to(x, lead + x.shape[-1:]) for x in (r, a, v, w))
    n = jnp.broadcast_to(n, lead)
    q = jnp.concatenate([r, a], axis=-1)
    u = jnp.concatenate([v, n[..., None], w], axis=-1)
    tt = jnp.broadcast_to(jnp.asarray(t, dtype), lead[:-1])
    return State(t=tt, q=q, u=u)
