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

from . import rank


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


def batched_solve(jac, rhs, *, rank_test: bool = True):
    """Solve jac x = rhs per system; jac (*batch, n, n), rhs (n, *batch).

    LU with partial pivoting. With ``rank_test`` (:func:`rbjax._engine.rank.may_be_redundant`
    of the model), a batch where some pivot is at most
    :func:`rbjax._engine.rank.singular_rtol` (64·√eps) times the largest of its system takes
    the minimum-norm solution instead. With redundant joint equations the Newton matrices of
    the implicit midpoint step and of the projections are singular to rounding (the iterate
    satisfies the joint equations, so the dependent rows are dependent and the multipliers
    have a null space; pivots ~1e-20 of the largest measured on a four-bar), and the LU
    solution of such a consistent system carries a huge null-space part that rounding spreads
    into every unknown (NaN at the first exact-Newton step, and a gradient off by 1e130,
    measured). The pseudo-inverse (SVD) cuts singular values at the rounding level (NumPy's
    10·n·eps of the largest), not at rbjax/_engine/rank.py's cutoff: the legitimate small
    singular values of these matrices shrink with the step (3e-9 of the largest at h = 1e-4,
    same four-bar, independent joints), those of redundant rows sit at 1e-19. A pivot test
    that fires on a regular matrix only costs time: its pseudo-inverse is its inverse."""
    b = jnp.moveaxis(rhs, 0, -1)[..., None]
    if not rank_test:
        return jnp.moveaxis(jnp.linalg.solve(jac, b)[..., 0], -1, 0)
    lu, pivots, _ = jax.lax.linalg.lu(jac)
    d = jnp.abs(jnp.diagonal(lu, axis1=-2, axis2=-1))
    bad = jnp.any(~(d > rank.singular_rtol(d.dtype) * jnp.max(d, axis=-1, keepdims=True)))
    x = jax.lax.cond(
        bad,
        lambda bb: jnp.linalg.pinv(jac) @ bb,
        lambda bb: jax.scipy.linalg.lu_solve((lu, pivots), bb),
        b,
    )
    return jnp.moveaxis(x[..., 0], -1, 0)


def dense_tangent_solve(g, y, z, args, aux):
    """Exact tangent solve of :func:`implicit_root` with the dense Jacobian of the linear map
    g (one jvp per unknown) and one LU per system (``args[0]``: the model, whose structure
    decides the rank test of :func:`batched_solve`)."""
    return batched_solve(batch_jacobian(g, y), y, rank_test=rank.may_be_redundant(args[0]))


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
