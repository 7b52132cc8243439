"""The rollout's plausibility monitors (rbjax/_monitors.py), evaluated after the time loop
on every saved state at once: the saved-time axis is one more batch axis of the engine's
component-first layout, so the loop body is unchanged and the check is one vectorised pass.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from . import kernels as cf
from .layout import system_vector
from .mass import mvec
from .projection import residuals


@dataclasses.dataclass(frozen=True)
class Spec:
    """Static description of what a rollout watches (a static argument of the compiled
    rollout): the three limits (None: not watched) and the model's energy balance
    ("conservative", "dissipative"; None: energy not watched)."""

    unit: float | None
    joints: float | None
    energy: float | None
    balance: str | None

    @classmethod
    def of(cls, limits, balance) -> Spec:
        unit, joints, energy = limits
        watch = energy is not None and balance is not None
        return cls(unit, joints, energy if watch else None, balance if watch else None)

    @property
    def watched(self) -> tuple[str, ...]:
        names = ("unit_length", "joints", "energy")
        limits = (self.unit, self.joints, self.energy)
        return tuple(n for n, v in zip(names, limits, strict=True) if v is not None)


def kinetic(model, u):
    """T = ½ uᵀ M u per system (Möller & Glocker 2012, eqs. (60), (64)), (*batch,)."""
    return 0.5 * jnp.sum(jnp.sum(u * mvec(model, u), axis=0), axis=-1)


def potential(model, t, q):
    """V = −Σ m gᵀ r plus the potentials of the model's springs, (*batch,)."""
    g = system_vector(model.gravity, q)
    v = -jnp.sum(model.mass * jnp.sum(g * q[0:3], axis=0), axis=-1)
    for f in model.forces:
        vf = f._engine_potential(model, t, q)
        if vf is not None:
            v = v + vf
    return v


def evaluate(spec: Spec, model, t, q, u, save_every: int):
    """The monitors on every saved state at once, after the time loop (vectorised over the
    saved states, nothing added to the loop body). ``t`` (T, *batch), ``q``, ``u``
    (T, *batch, nb, 7) as the rollout saves them, index 0 the initial state.

    Returns (step (*batch,) int32: the last step of the first saved chunk where a limit is
    exceeded, −1 if none; worst: dict name -> (*batch,), the worst finite value)."""
    tc = t[..., None]  # (T, *batch, 1): the saved times as one more batch axis
    qc, uc = jnp.moveaxis(q, -1, 0), jnp.moveaxis(u, -1, 0)  # (7, T, *batch, nb)
    shape = t.shape
    values = {}
    if spec.unit is not None:
        a2 = cf.qnorm2(qc[3:7])
        values["unit_length"] = jnp.max(jnp.where(model.rigid, jnp.abs(a2 - 1), 0), axis=-1)
    if spec.joints is not None:
        r = residuals(model, tc, qc)
        values["joints"] = jnp.max(jnp.abs(r), axis=0)
    if spec.energy is not None:
        kin, pot = kinetic(model, uc), potential(model, tc, qc)
        e = kin + pot
        eps = jnp.finfo(q.dtype).eps
        # rounding: 10³ ε of the energies, and 10² ε more per step taken (a model at rest
        # accumulates ~ε|V| per step: 1.2e-13 J of 12.8 J in 100 steps of a resting four-bar)
        steps = jnp.arange(e.shape[0], dtype=e.dtype) * save_every
        steps = steps.reshape((-1,) + (1,) * (e.ndim - 1))
        magnitude = jnp.abs(e[0]) + kin[0] + jnp.abs(pot[0])
        floor = eps * magnitude * (1e3 + 1e2 * steps) + jnp.finfo(q.dtype).tiny
        scale = jax.lax.cummax(kin + jnp.abs(pot - pot[0]), axis=0) + floor
        change = e - e[0]
        change = jnp.abs(change) if spec.balance == "conservative" else jnp.maximum(change, 0)
        values["energy"] = change / scale
    named = {"unit_length": spec.unit, "joints": spec.joints, "energy": spec.energy}
    limits = {k: float(v) for k, v in named.items() if v is not None}
    exceeded = jnp.zeros(shape, bool)
    worst = {}
    for k, v in values.items():
        v = jnp.broadcast_to(v, shape)
        exceeded = exceeded | (v > limits[k])
        worst[k] = jnp.max(jnp.where(jnp.isfinite(v), v, 0), axis=0)
    first = jnp.argmax(exceeded, axis=0)
    step = jnp.where(jnp.any(exceeded, axis=0), first * save_every - 1, -1)
    return step.astype(jnp.int32), worst
