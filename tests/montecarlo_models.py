"""Samplers shared by tests/test_montecarlo.py and the processes it starts
(tests/montecarlo_worker.py): (sample, measures, dt, n_steps) per case."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import rbjax

# ---------------------------------------------------------------- tumbling bodies
BODY = rbjax.Model(rbjax.Body(1.0, np.diag([1.0, 2.0, 2.8])), formulation=rbjax.NewtonEuler())


def body_sample(key, i):
    """Inertia ±1 %, spin (0.01, 5, 0) + noise about the intermediate axis. I₃ = 2.8 keeps the
    triangle inequality I₁ + I₂ ≥ I₃ 5.5 standard deviations away (with 2.9, 8 samples in
    3000 were not physical; the runner now reports those as invalid_input)."""
    k1, k2 = jax.random.split(key)
    inertia = jnp.array([1.0, 2.0, 2.8]) * (1 + 0.01 * jax.random.normal(k1, (3,)))
    model = eqx.tree_at(lambda m: m.inertia, BODY, jnp.diag(inertia)[None])
    w = jnp.array([0.01, 5.0, 0.0]) + jnp.array([0.005, 0.2, 0.0]) * jax.random.normal(k2, (3,))
    q = jnp.array([[0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]])
    u = jnp.concatenate([jnp.zeros(4), w])[None]
    return model, rbjax.State(t=jnp.zeros(()), q=q, u=u)


BODY_MEASURES = {
    "flip": rbjax.Event(lambda m, s: s.u[0, 5], direction=-1, bins=np.linspace(0.0, 4.0, 41)),
    "w_max": rbjax.Maximum(lambda m, s: s.u[0, 4:7]),
    "energy": rbjax.Drift(lambda m, s: rbjax.kinetic_energy(m, s), limit=1e-6),
}

# ---------------------------------------------------------------- heavy tops
TOP_G, TOP_M, TOP_L, TOP_I1, TOP_I3, TOP_SPIN = 9.81, 1.0, 0.02, 2e-3, 4e-3, 20.0
TOP = rbjax.Model(
    [rbjax.Body(TOP_M, np.diag([TOP_I1, TOP_I1, TOP_I3]), name="top")],
    joints=[
        rbjax.Spherical.at(
            np.array([[0.0, 0.0, TOP_L, 1.0, 0.0, 0.0, 0.0]]), rbjax.GROUND, 0, point=[0, 0, 0]
        )
    ],
    gravity=[0.0, 0.0, -TOP_G],
)


def top_sample(key, i):
    """Tilt 30° ± 3°, spin, inertia and mass ±5 %; tip on the origin, the centre of mass moving
    with the spin about the symmetry axis (the joint's velocity equations hold)."""
    k = jax.random.split(key, 4)
    theta = jnp.radians(30.0) + 0.05 * jax.random.normal(k[0])
    spin = TOP_SPIN * (1 + 0.05 * jax.random.normal(k[1]))
    inertia = jnp.array([TOP_I1, TOP_I1, TOP_I3]) * (1 + 0.05 * jax.random.normal(k[2]))
    mass = TOP_M * (1 + 0.05 * jax.random.normal(k[3]))
    model = eqx.tree_at(lambda m: (m.mass, m.inertia), TOP, (mass[None], jnp.diag(inertia)[None]))
    axis = jnp.stack([jnp.zeros(()), -jnp.sin(theta), jnp.cos(theta)])
    r = TOP_L * axis
    quat = jnp.stack([jnp.cos(theta / 2), jnp.sin(theta / 2), jnp.zeros(()), jnp.zeros(())])
    v = jnp.cross(spin * axis, r)
    w = jnp.stack([jnp.zeros(()), jnp.zeros(()), spin])
    q = jnp.concatenate([r, quat])[None]
    u = jnp.concatenate([v, jnp.zeros(1), w])[None]
    return model, rbjax.State(t=jnp.zeros(()), q=q, u=u)


def nutation(model, state):
    """Angle between the symmetry axis and the vertical [rad]."""
    a = state.q[0, 3:7] / jnp.linalg.norm(state.q[0, 3:7])
    return jnp.arccos(jnp.clip(a[0] ** 2 - a[1] ** 2 - a[2] ** 2 + a[3] ** 2, -1.0, 1.0))


TOP_MEASURES = {
    "max_nutation": rbjax.Maximum(nutation),
    "energy": rbjax.Drift(lambda m, s: rbjax.total_energy(m, s), limit=1e-6),
}

CASES = {
    "body": (body_sample, BODY_MEASURES, 1e-2, 300),
    "top": (top_sample, TOP_MEASURES, 1e-3, 200),
}
