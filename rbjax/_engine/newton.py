"""Dense Newton linear algebra for batches of independent small systems.

Unknowns of an implicit step or a projection are flattened to ``(n, *batch)`` (component and
body axes first, the batch behind, as everywhere in the engine). Systems in a batch never
interact, so one jvp per system coordinate, seeded with the same unit vector in every system,
gives every system's full Jacobian at once (:func:`batch_jacobian`).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np


def flatten(z):
    """(k, *batch, nb) -> (k*nb, *batch): one row per (component, body) of a system."""
    z = jnp.moveaxis(z, -1, 1)
    return z.reshape((z.shape[0] * z.shape[1],) + z.shape[2:])


def unflatten(zf, k, nb):
    """Inverse of :func:`flatten`."""
    z = zf.reshape((k, nb) + zf.shape[1:])
    return jnp.moveaxis(z, 1, -1)


def batch_jacobian(g, zf):
    """Jacobian of a batch-separable map g: (n, *batch) -> (n', *batch), as (*batch, n', n)."""
    n = zf.shape[0]
    eye = jnp.eye(n, dtype=zf.dtype).reshape((n, n) + (1,) * (zf.ndim - 1))
    cols = jax.vmap(lambda e: jax.jvp(g, (zf,), (jnp.broadcast_to(e, zf.shape),))[1])(eye)
    # cols[k, i, ...] = dg_i / dz_k  ->  (..., i, k)
    return jnp.moveaxis(jnp.moveaxis(cols, 0, -1), 0, -2)


def batched_solve(jac, rhs):
    """Solve jac x = rhs per system; jac (*batch, n, n), rhs (n, *batch)."""
    x = jnp.linalg.solve(jac, jnp.moveaxis(rhs, 0, -1)[..., None])[..., 0]
    return jnp.moveaxis(x, -1, 0)


def dense_tangent_solve(g, y, *_):
    """Exact tangent solve of :func:`implicit_root` with the dense Jacobian of the linear map
    g (one jvp per unknown) and one LU per system."""
    return batched_solve(batch_jacobian(g, y), y)


@eqx.filter_custom_jvp
def implicit_root(args, *, residual, solve, tangent_solve):
    """The root z* of F(z, args) = ``residual(z, args)`` that ``solve(args)`` returns (as
    ``(z*, aux)``), with derivatives by the implicit function theorem:

        ∂F/∂z · ż = −∂F/∂args · ȧrgs,

    solved by ``tangent_solve(g, y, z*, args, aux)`` for the linear map g = ∂F/∂z at z*. Neither the
    iterations of ``solve`` nor ``aux`` are differentiated. Unlike ``jax.lax.custom_root`` the
    derivative is traced only when something is differentiated (``equinox.filter_custom_jvp``),
    which keeps the compile time of undifferentiated calls down. The tangent computation is
    linear in the tangents, so reverse mode transposes it. ``residual``, ``solve`` and
    ``tangent_solve`` must not close over traced values: pass them in ``args``.
    """
    return solve(args)


@implicit_root.def_jvp
def _implicit_root_jvp(primals, tangents, *, residual, solve, tangent_solve):
    (args,) = primals
    (targs,) = tangents
    z, aux = implicit_root(args, residual=residual, solve=solve, tangent_solve=tangent_solve)
    z = jax.lax.stop_gradient(z)
    spec = jax.tree.map(lambda t: t is not None, targs, is_leaf=lambda x: x is None)
    dyn, rest = eqx.partition(args, spec)
    tdyn, _ = eqx.partition(targs, spec, is_leaf=lambda x: x is None)
    _, rhs = jax.jvp(lambda d: residual(z, eqx.combine(d, rest)), (dyn,), (tdyn,))

    def g(v):
        return jax.jvp(lambda zz: residual(zz, args), (z,), (v,))[1]

    dz = -tangent_solve(g, rhs, z, args, jax.lax.stop_gradient(aux))
    return (z, aux), (dz, jax.tree.map(_zero_tangent, aux))


def _zero_tangent(x):
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.zeros_like(x)
    return np.zeros(x.shape, jax.dtypes.float0)
