"""Conversions between the natural layout and the engine's component-first layout.

Natural (what users see): ``State.q`` (*batch, nb, 7), forces (nb, 3). Component-first (what
the kernels run on, see README.md beside this file): ``q`` (7, *batch, nb), ``t`` (*batch, 1).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from .._state import State


def to_components(
    state: State,
) -> tuple[Float[Array, "*batch 1"], Float[Array, "7 *batch nb"], Float[Array, "7 *batch nb"]]:
    """Natural State -> (t (*batch, 1), q (7, *batch, nb), u (7, *batch, nb))."""
    return state.t[..., None], jnp.moveaxis(state.q, -1, 0), jnp.moveaxis(state.u, -1, 0)


def from_components(
    t: Float[Array, "*batch 1"], q: Float[Array, "7 *batch nb"], u: Float[Array, "7 *batch nb"]
) -> State:
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


_MODEL_BATCHED = (("mass", 1), ("inertia", 3), ("gravity", 1))  # leaf, per-system rank


def per_system(fn, model, t, q, u):
    """``fn(model, t, state)`` written for ONE system, evaluated on the engine's arrays.

    ``t`` (*batch, 1), ``q``, ``u`` (7, *batch, nb): the state is moved to the natural layout
    and ``fn`` is ``jax.vmap``-ed over every batch axis. The model's mass (*b, nb), inertia
    (*b, nb, 3, 3) and gravity (*b, 3) may carry leading batch axes (broadcast against the
    state's); they are broadcast to the batch and mapped with it. Returns ``fn``'s outputs with
    the batch axes in front. This is the adapter that lets extension points (forces,
    formulations, integrators) be written in the natural layout.
    """
    batch = q.shape[1:-1]
    state = State(t=t[..., 0], q=jnp.moveaxis(q, 0, -1), u=jnp.moveaxis(u, 0, -1))
    if not batch:
        return fn(model, state.t, state)
    leaves = {name: getattr(model, name) for name, _ in _MODEL_BATCHED}
    mapped = {}
    for name, rank in _MODEL_BATCHED:
        x = leaves[name]
        if x.ndim > rank:  # carries batch axes: broadcast to the full batch, then map
            mapped[name] = jnp.broadcast_to(x, batch + x.shape[x.ndim - rank :])
    if mapped:
        model = eqx.tree_at(
            lambda m: tuple(getattr(m, k) for k in mapped), model, tuple(mapped.values())
        )
    axes = jax.tree.map(lambda _: None, model)
    if mapped:
        axes = eqx.tree_at(
            lambda m: tuple(getattr(m, k) for k in mapped),
            axes,
            (0,) * len(mapped),
            is_leaf=lambda x: x is None,
        )
    f = fn
    for _ in batch:
        f = jax.vmap(f, in_axes=(axes, 0, 0))
    return f(model, state.t, state)
