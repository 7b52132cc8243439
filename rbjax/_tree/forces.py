"""The generalized forces of a tree in joint coordinates: τ = τ_s(q) + τ_nc(t, q, q̇).

τ_s, the joints' springs, derives from the potential V_s of rbjax/_tree/energy.py
(τ_s = −∂V_s/∂q along each joint's motion): −k (q − q_s) on a hinge or slide; on a ball, and
on a free joint's rotation, −k θ with θ the rotation vector of q_s⁻¹ q/|q| (MuJoCo's
``mj_passive``); −k (p − p_s) on a free joint's position. τ_nc has no potential: joint
damping −b q̇, MuJoCo's joint actuators, and the user's generalized forces τ(t, qpos, qvel) of
one system. Component-first: q (nq, *batch), u (nv, *batch) -> (nv, *batch).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._engine.kernels import qconj, qmul
from .topology import BALL, FREE, HINGE, SLIDE


def spring_forces(model, q: Float[Array, " nq *batch"]) -> Array:
    """τ_s (nv, *batch) (module docstring)."""
    topo = model.topology
    tail = q.shape[1:]
    col = lambda x: x.reshape((-1,) + (1,) * len(tail))  # noqa: E731
    tau = jnp.zeros((topo.nv,) + tail, q.dtype)
    one = [j for j, k in enumerate(topo.joint_types) if k in (HINGE, SLIDE)]
    if one:
        qa = np.asarray(topo.qposadr)[one]
        da = np.asarray(topo.dofadr)[one]
        k = model.stiffness[np.asarray(one)]
        tau = tau.at[da].add(-col(k) * (q[qa] - col(model.qpos_spring[qa])))
    for j, kind in enumerate(topo.joint_types):
        if kind not in (BALL, FREE):
            continue
        k = model.stiffness[j]
        qa, da = topo.qposadr[j], topo.dofadr[j]
        if kind == FREE:
            p_s = col(model.qpos_spring[qa : qa + 3])
            tau = tau.at[da : da + 3].add(-k * (q[qa : qa + 3] - p_s))
            qa, da = qa + 3, da + 3
        theta = rotation_vector(q[qa : qa + 4], model.qpos_spring[qa : qa + 4])
        tau = tau.at[da : da + 3].add(-k * theta)
    return tau


def rotation_vector(q: Float[Array, " 4 *batch"], q_s: Float[Array, "4"]) -> Array:
    """θ (3, *batch), the rotation vector of d = q_s⁻¹ q/|q| (q_s unit) with its angle
    φ = |θ| in [0, π] (d's sign chosen with d₀ ≥ 0): in the frame the rotation leaves, so
    that −k θ is MuJoCo's spring torque of a ball joint (``mj_passive``, ``mju_subQuat``).

    θ = 2 d⃗ atan2(s, c)/s with s = |d⃗|, c = |d₀|, and atan2(s, c)/s = (1 − s²/(3c²))/c + O(s⁴)
    below s² < √eps (an error below eps): value and gradient are finite at d = ±1, where
    φ = 0 (the spring's rest, where a rollout usually starts; 2 d⃗ atan2(s, c)/s with s a
    norm has a NaN gradient there)."""
    tail = q.shape[1:]
    d = qmul(qconj(q_s.reshape((4,) + (1,) * len(tail))), q / jnp.linalg.norm(q, axis=0))
    v = jnp.where(d[0] < 0, -d[1:], d[1:])
    s2 = jnp.sum(v * v, axis=0)
    c = jnp.abs(d[0])
    small = s2 < float(np.sqrt(np.finfo(np.dtype(q.dtype)).eps))
    s = jnp.sqrt(jnp.where(small, 1.0, s2))
    c_safe = jnp.where(small, jnp.maximum(c, 0.5), 1.0)  # c > 0.99 where s is small
    ratio = jnp.where(small, (1.0 - s2 / (3.0 * c_safe**2)) / c_safe, jnp.arctan2(s, c) / s)
    return 2.0 * ratio * v


def nonconservative_forces(model, t, q: Float[Array, " nq *batch"], u: Float[Array, " nv *batch"]):
    """τ_nc (nv, *batch): the terms of ``JointModel.generalized_forces`` without a potential,
    joint damping −b q̇, the actuators and the user's generalized forces (the springs are
    −∂V_s/∂q, :func:`spring_potential`)."""
    topo = model.topology
    tail = u.shape[1:]
    tau = -model.damping.reshape((-1,) + (1,) * len(tail)) * u
    for j, act in zip(model.actuator_joints, model.actuators, strict=True):
        qa, da = topo.qposadr[j], topo.dofadr[j]
        f = act(t, q[qa] - model.qpos0[qa], u[da])
        tau = tau.at[da].add(jnp.broadcast_to(f, tail))
    for force in model.forces:
        tau = tau + _per_system(force, t, q, u, model.nv)
    return tau


def _per_system(f: Callable, t, qpos, qvel, nv: int):
    """A user's τ(t, qpos, qvel) of ONE system on component-first arrays (vmapped)."""
    tail = qvel.shape[1:]
    q = jnp.moveaxis(qpos.reshape(qpos.shape[:1] + (-1,)), 0, -1)
    v = jnp.moveaxis(qvel.reshape(qvel.shape[:1] + (-1,)), 0, -1)
    tt = jnp.broadcast_to(t, tail).reshape(-1)
    out = jax.vmap(f)(tt, q, v)
    if out.shape != (q.shape[0], nv):
        raise ValueError(
            f"a generalized force returned shape {out.shape[1:]}, expected ({nv},). Fix: "
            "return one number per velocity coordinate."
        )
    return jnp.moveaxis(out, -1, 0).reshape((nv,) + tail)
