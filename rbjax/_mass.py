"""Layout conversion and the constant mass matrix M = diag(mI, ½trΘ, Θ) (seed 000 eq. (64)).

Shared by the formulations (rbjax/_dynamics.py) and the constraint machinery
(rbjax/_mechanics.py); component-first arrays (rbjax/_cf.py).
"""

from __future__ import annotations

import jax.numpy as jnp

from . import _cf as cf
from ._state import State


def to_cf(state):
    """Natural State -> (t (..., 1), q (7, ..., nb), u (7, ..., nb))."""
    return state.t[..., None], jnp.moveaxis(state.q, -1, 0), jnp.moveaxis(state.u, -1, 0)


def from_cf(t, q, u):
    return State(t=t[..., 0], q=jnp.moveaxis(q, 0, -1), u=jnp.moveaxis(u, 0, -1))


def inertia_cf(model):
    return jnp.moveaxis(model.inertia, (-2, -1), (0, 1))


def half_trace(model):
    th = model.inertia
    return 0.5 * (th[..., 0, 0] + th[..., 1, 1] + th[..., 2, 2])


def minv(model, x):
    """M⁻¹ x for the constant block-diagonal mass matrix M = diag(mI, ½trΘ, Θ) (seed 000, eq. (64))."""
    thinv = cf.sym_inv(inertia_cf(model))
    return jnp.concatenate(
        [x[0:3] / model.mass, (x[3] / half_trace(model))[None], cf.matvec(thinv, x[4:7])], axis=0
    )


def mvec(model, x):
    """M x (seed 000, eq. (64))."""
    th = inertia_cf(model)
    return jnp.concatenate(
        [x[0:3] * model.mass, (x[3] * half_trace(model))[None], cf.matvec(th, x[4:7])], axis=0
    )
