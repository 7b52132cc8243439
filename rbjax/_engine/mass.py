"""The constant mass matrix M = diag(mI, ½trΘ, Θ) (Möller & Glocker 2012 eq. (64)), component-first.

Shared by the formulations and the constraint machinery (joints.py).
"""

from __future__ import annotations

import jax.numpy as jnp

from . import kernels as cf
from .layout import inertia_components


def half_trace(model):
    th = model.inertia
    return 0.5 * (th[..., 0, 0] + th[..., 1, 1] + th[..., 2, 2])


def minv(model, x):
    """M⁻¹ x for the constant block-diagonal mass matrix M = diag(mI, ½trΘ, Θ) (Möller & Glocker 2012, eq. (64))."""
    thinv = cf.sym_inv(inertia_components(model))
    return jnp.concatenate(
        [x[0:3] / model.mass, (x[3] / half_trace(model))[None], cf.matvec(thinv, x[4:7])], axis=0
    )


def minv_at(model, x, index):
    """M_b⁻¹ x_r with b = index[r] for vectors x (7, ..., n) whose last axis is not the bodies
    but anything living on them (the rows of W̃, one body each); indices past the last body
    (the ground) read the last body and must come with x = 0 there. An int ``index``: one
    body for every slot, read by a static slice (no gather)."""
    if isinstance(index, int):
        at = lambda a: a[..., index, None]  # noqa: E731
    else:
        at = lambda a: jnp.take(a, index, axis=-1, mode="clip")  # noqa: E731
    thinv = at(cf.sym_inv(inertia_components(model)))
    return jnp.concatenate(
        [x[0:3] / at(model.mass), (x[3] / at(half_trace(model)))[None], cf.matvec(thinv, x[4:7])],
        axis=0,
    )


def mvec(model, x):
    """M x (Möller & Glocker 2012, eq. (64))."""
    th = inertia_components(model)
    return jnp.concatenate(
        [x[0:3] * model.mass, (x[3] * half_trace(model))[None], cf.matvec(th, x[4:7])], axis=0
    )


def blocks(model):
    """M as one 7 x 7 block per body, (7, 7, ..., nb) (Möller & Glocker 2012, eq. (64))."""
    th = inertia_components(model)
    m, ht = model.mass, half_trace(model)
    shape = jnp.broadcast_shapes(jnp.shape(m), jnp.shape(ht), th.shape[2:])
    z = jnp.zeros(shape, th.dtype)
    diag = [m, m, m, ht]
    rows = []
    for i in range(7):
        row = []
        for j in range(7):
            if i < 4 or j < 4:
                row.append(jnp.broadcast_to(diag[i], shape) if i == j else z)
            else:
                row.append(jnp.broadcast_to(th[i - 4, j - 4], shape))
        rows.append(jnp.stack(row))
    return jnp.stack(rows)
