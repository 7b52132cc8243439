"""Energy of a tree in joint coordinates: kinetic, potential, and the power of the other forces.

Component-first like the engine: q (nq, *batch), u (nv, *batch) -> (*batch).

**Kinetic energy.** T = ½ q̇ᵀ M(q) q̇ with M the joint-space mass matrix including armature
(rbjax/_tree/dynamics.py), evaluated as the sum over bodies

    T = Σ_i ½ m_i |v_i|² + ½ ω_iᵀ R_i Θ_i R_iᵀ ω_i + Σ_d ½ a_d q̇_d²

(v_i, ω_i the velocity of body i's centre of mass and its angular velocity,
rbjax/_tree/bodies.py; Θ_i its inertia about the centre of mass in body axes; a_d the
armature of DOF d: a rotor inertia on the joint coordinate, as MuJoCo's ``mj_crb`` adds it).
The two are equal (Featherstone 2008, eq. (6.12)); the body sum costs one kinetic pass
(O(nb nv)) where the mass matrix is O(nv²) (MuJoCo's ``mj_energyVel`` computes ½ q̇ᵀ M q̇).

**Potential energy.** V = V_g + V_s: uniform gravity on every centre of mass c_i, less the
share ``gravcomp`` of it that gravity compensation cancels,

    V_g = −Σ_i (1 − gravcomp_i) m_i gᵀ c_i,

and the joints' springs, each the potential of the force ``JointModel.generalized_forces``
applies (so that −∂V/∂q is that force; MuJoCo's ``mj_energyPos``):

    hinge, slide:  ½ k (q − q_s)²,
    ball:          ½ k φ²,  φ ∈ [0, π] the angle of the rotation q_s⁻¹ q/|q|,
    free:          ½ k |p − p_s|² + ½ k φ² (the same k for position and rotation).

Gravity compensation −gravcomp·m·g is a uniform field, so it has a potential and is counted
in V (MuJoCo's energy leaves it out: its ``energy[0]`` is V − Σ gravcomp_i m_i gᵀ c_i).

**Power of the other forces.** Joint damping, actuators and the user's generalized forces
derive from no potential: P = q̇ᵀ τ_nc, so that dE/dt = P along every motion of a model
without equality constraints (and with them while Baumgarte terms are zero: a scleronomic
constraint's force does no work).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .bodies import com_from, velocities_from
from .forces import nonconservative_forces, rotation_vector
from .kinematics import Frames, frames, matvec
from .topology import BALL, FREE, HINGE, SLIDE


def kinetic(model, q: Float[Array, " nq *batch"], u: Float[Array, " nv *batch"]) -> Array:
    """T = ½ q̇ᵀ M q̇ [J] (module docstring), shape (*batch,)."""
    f = frames(model.topology, model, q)
    return kinetic_from(model, f, com_from(model, f), u)


def kinetic_from(model, f: Frames, com, u: Float[Array, " nv *batch"]) -> Array:
    """:func:`kinetic` from a forward-kinematics pass ``f`` and its centres of mass ``com``
    (one pass shared with :func:`potential_from`, as the monitors use them)."""
    v, w = velocities_from(model, f, com, u)
    tail = u.shape[1:]
    m = model.mass.reshape((-1,) + (1,) * len(tail))
    w_body = matvec(jnp.swapaxes(f.R, 0, 1), w)
    theta = jnp.moveaxis(model.inertia, 0, -1)[(slice(None),) * 3 + (None,) * len(tail)]
    spin = jnp.sum(w_body * matvec(jnp.broadcast_to(theta, f.R.shape), w_body), axis=0)
    arm = model.armature.reshape((-1,) + (1,) * len(tail))
    bodies = jnp.sum(m * jnp.sum(v * v, axis=0) + spin, axis=0)
    return 0.5 * (bodies + jnp.sum(arm * u * u, axis=0))


def potential(model, q: Float[Array, " nq *batch"]) -> Array:
    """V = V_g + V_s [J] (module docstring), shape (*batch,)."""
    return potential_from(model, q, com_from(model, frames(model.topology, model, q)))


def potential_from(model, q: Float[Array, " nq *batch"], com) -> Array:
    """:func:`potential` with the centres of mass ``com`` (3, nb, *batch) given."""
    tail = q.shape[1:]
    weight = ((1.0 - model.gravcomp) * model.mass).reshape((-1,) + (1,) * len(tail))
    g = model.gravity.reshape((3, 1) + (1,) * len(tail))
    return -jnp.sum(weight * jnp.sum(g * com, axis=0), axis=0) + spring_potential(model, q)


def spring_potential(model, q: Float[Array, " nq *batch"]) -> Array:
    """V_s, the joints' springs (module docstring), shape (*batch,)."""
    topo = model.topology
    tail = q.shape[1:]
    col = lambda x: x.reshape((-1,) + (1,) * len(tail))  # noqa: E731
    k, q_s = model.stiffness, model.qpos_spring
    v = jnp.zeros(tail, q.dtype)
    one = np.array([j for j, t in enumerate(topo.joint_types) if t in (HINGE, SLIDE)], int)
    if one.size:
        a = np.asarray(topo.qposadr)[one]
        x = q[a] - col(q_s[a])
        v = v + 0.5 * jnp.sum(col(k[one]) * x * x, axis=0)
    for j, t in enumerate(topo.joint_types):
        if t not in (BALL, FREE):
            continue
        a = topo.qposadr[j]
        if t == FREE:
            x = q[a : a + 3] - col(q_s[a : a + 3])
            v = v + 0.5 * k[j] * jnp.sum(x * x, axis=0)
            a += 3
        v = v + 0.5 * k[j] * rotation_angle_squared(q[a : a + 4], q_s[a : a + 4])
    return v


def rotation_angle_squared(q: Float[Array, " 4 *batch"], q_s: Float[Array, "4"]) -> Array:
    """φ² = |θ|² (*batch), the squared angle of the rotation q_s⁻¹ q/|q| (:func:`rotation_vector`)."""
    theta = rotation_vector(q, q_s)
    return jnp.sum(theta * theta, axis=0)


def nonconservative_power(
    model, t, q: Float[Array, " nq *batch"], u: Float[Array, " nv *batch"]
) -> Array:
    """P = q̇ᵀ τ_nc [W], shape (*batch,): the power of the forces :func:`potential` does not
    account for (:func:`nonconservative_forces`); dE/dt = P (module docstring)."""
    return jnp.sum(u * nonconservative_forces(model, t, q, u), axis=0)
