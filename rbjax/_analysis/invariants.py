"""Invariants of the motion: kinetic and potential energy, linear and angular momentum (the
conservation laws the validation tests check), for single systems or batches."""

from __future__ import annotations

import jax.numpy as jnp

from .._engine import kernels as cf
from .._engine.layout import inertia_components, to_components
from .._engine.mass import mvec


def kinetic_energy(model, state):
    """T = ½ uᵀ M u summed over bodies (Möller & Glocker 2012, eqs. (60), (64)); valid for scalable bodies."""
    _, _, u = to_components(state)
    return 0.5 * jnp.sum(jnp.sum(u * mvec(model, u), axis=0), axis=-1)


def potential_energy(model, state):
    """V = −Σ m gᵀ r (uniform gravity)."""
    g = jnp.asarray(model.gravity)[..., None, :]
    return -jnp.sum(model.mass * jnp.sum(g * state.q[..., 0:3], axis=-1), axis=-1)


def total_energy(model, state):
    """T + V [J]; conserved for torque-free and gravity-only motion."""
    return kinetic_energy(model, state) + potential_energy(model, state)


def linear_momentum(model, state):
    """Σ m v, world frame [kg m/s]."""
    return jnp.sum(model.mass[..., None] * state.u[..., 0:3], axis=-2)


def angular_momentum(model, state):
    """Angular momentum about the world origin, world frame: Σ m r × v + s R Θ ω.

    For a scalable body, ∫ ξ × ξ̇ dm = m r × v + s R Θ ω (ν contributes nothing since
    ϱ × ϱ = 0); s R x is the quaternion transform A (0, x) A* (Möller & Glocker 2012, eq. (27)).
    """
    _, q, u = to_components(state)
    th = inertia_components(model)
    spin = cf.transform(q[3:7], cf.matvec(th, u[4:7]))
    orbital = model.mass * cf.cross(q[0:3], u[0:3])
    return jnp.moveaxis(jnp.sum(spin + orbital, axis=-1), 0, -1)
