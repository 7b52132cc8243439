"""Conversions between the natural layout and the engine's component-first layout.

Natural (what users see): ``State.q`` (*batch, nb, 7), forces (nb, 3). Component-first (what
the kernels run on, see README.md beside this file): ``q`` (7, *batch, nb), ``t`` (*batch, 1).
"""

from __future__ import annotations

import jax.numpy as jnp

from .._state import State


def to_components(state: State):
    """Natural State -> (t (*batch, 1), q (7, *batch, nb), u (7, *batch, nb))."""
    return state.t[..., None], jnp.moveaxis(state.q, -1, 0), jnp.moveaxis(state.u, -1, 0)


def from_components(t, q, u) -> State:
    """Inverse of :func:`to_components`."""
    return State(t=t[..., 0], q=jnp.moveaxis(q, 0, -1), u=jnp.moveaxis(u, 0, -1))


def inertia_components(model):
    """Θ (*batch, nb, 3, 3) -> (3, 3, *batch, nb)."""
    return jnp.moveaxis(model.inertia, (-2, -1), (0, 1))


def system_vector(x, like):
    """A per-system vector x (..., 3) as a component-first array broadcastable against ``like``.

    ``like`` is a component-first per-body array (k, *batch, nb); the result has shape
    (3, *batch', 1) with singleton axes inserted so that leading batch axes of x line up.
    """
    y = jnp.moveaxis(x, -1, 0)[..., None]
    missing = like.ndim - y.ndim
    return y.reshape(y.shape[:1] + (1,) * missing + y.shape[1:]) if missing > 0 else y
