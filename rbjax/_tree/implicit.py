"""Implicit in velocity: MuJoCo's ``implicitfast`` step for trees in joint coordinates.

Position servos without armature and stiff joint dampers make M⁻¹ ∂τ/∂q̇ large: at a robot
file's own timestep explicit RK4 is unstable there (and MuJoCo's own RK4 with it). MuJoCo's
answer, ``integrator="implicitfast"``, treats the velocity derivative of the passive and
actuator forces implicitly and everything else explicitly (Todorov 2014, "Convex and analytically
invertible dynamics"; MuJoCo documentation, "Numerical integration"):

    (M − h D) q̈ = τ(t, q, q̇) − b(q, q̇),   D = ∂τ/∂q̇  (damping, actuator velocity gains),
    q̇⁺ = q̇ + h q̈,   q⁺ = q ⊕ h q̇⁺,

where ⊕ adds hinge and slide displacements and a free joint's position, and turns a ball's or
free joint's quaternion by the rotation h ω (q ⊗ exp(h ω / 2) after normalising q, MuJoCo's
``mju_quatIntegrate``). The Coriolis terms' velocity derivative is left out, as in
``implicitfast``. D comes from forward-mode derivatives of τ (one jvp per DOF), so any
differentiable force, the actuator force ranges included, gets its exact derivative.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .._engine.kernels import qmul
from .._integrators import AbstractIntegrator
from .topology import TreeTopology


def integrate_positions(topo: TreeTopology, qpos, qvel, h):
    """q ⊕ h q̇ (module docstring): (nq, ...) from qpos (nq, ...) and qvel (nv, ...)."""
    out = qpos
    lin_q, lin_d, quat_q, quat_d = topo.rate_rows()
    if lin_q.size:
        out = out.at[lin_q].add(h * qvel[lin_d])
    if quat_q.size:
        qq, dd = quat_q, quat_d
        q = jnp.stack([qpos[qq + i] for i in range(4)])
        q = q / jnp.linalg.norm(q, axis=0, keepdims=True)
        w = jnp.stack([qvel[dd + i] for i in range(3)])
        # |ω| through a safe square root: the norm's derivative at ω = 0 is 0/0 (NaN in every
        # gradient of a step where a ball or free joint stops turning)
        sq = jnp.sum(w * w, axis=0)
        speed = jnp.where(sq > 0, jnp.sqrt(jnp.where(sq > 0, sq, 1.0)), 0.0)
        half = 0.5 * h * speed
        # sin(h|ω|/2)/|ω|, with its limit h/2 at ω = 0 (a safe denominator keeps the
        # derivative finite there)
        safe = jnp.where(speed > 0, speed, 1.0)
        s = jnp.where(speed > 0, jnp.sin(half) / safe, 0.5 * h)
        turn = (jnp.cos(half), s * w[0], s * w[1], s * w[2])
        q1 = qmul(q, turn)
        for i in range(4):
            out = out.at[qq + i].set(q1[i])
    return out


def implicit_fast_step(model, t, q, u, h):
    """One step (module docstring) on the engine's arrays t (*batch, 1), q (nq, *batch, 1),
    u (nv, *batch, 1)."""
    topo = model.topology
    q0, u0, t0 = q[..., 0], u[..., 0], t[..., 0]
    M, b = model.mass_and_bias(q0, u0)

    def forces(v):
        return model.generalized_forces(t0, q0, v)

    nv = topo.nv
    basis = jnp.eye(nv, dtype=u0.dtype).reshape((nv, nv) + (1,) * (u0.ndim - 1))
    tau, D = jax.vmap(
        lambda e: jax.jvp(forces, (u0,), (jnp.broadcast_to(e, u0.shape),)), out_axes=(None, 1)
    )(basis)
    qacc = model.solve(M - h * D, tau - b, q0, u0)[0]  # equalities held, if any
    u1 = u0 + h * qacc
    q1 = integrate_positions(topo, q0, u1, h)
    ok = jnp.all(jnp.isfinite(qacc), axis=0)
    return t + h, q1[..., None], u1[..., None], ok


class ImplicitFast(AbstractIntegrator):
    """MuJoCo's ``implicitfast`` for a :class:`rbjax.JointModel` (rbjax/_tree/implicit.py):
    semi-implicit Euler with the damping and actuator velocity gains taken implicitly,
    (M − h ∂τ/∂q̇) q̈ = τ − b. First order; stable at a robot file's own timestep where
    explicit RK4 is not (position servos without armature). Joint coordinates only."""

    @property
    def order(self) -> int:
        return 1

    def step(self, model, state, dt):
        raise ValueError(
            "ImplicitFast.step: one step is taken by rbjax.rollout(model, state, dt, 1, "
            "integrator=rbjax.ImplicitFast()). Fix: call rollout with n_steps=1."
        )

    def _engine_step(self, model, t, q, u, h):
        if not hasattr(model, "topology") or not hasattr(model, "generalized_forces"):
            raise ValueError(
                "integrator = ImplicitFast() integrates joint coordinates only. Fix: load "
                "the model with formulation=rbjax.JointCoordinates(), or use RK4()."
            )
        return implicit_fast_step(model, t, q, u, h)
