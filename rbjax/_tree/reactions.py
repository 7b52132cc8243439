"""Reaction forces of a tree's joints in joint coordinates (Featherstone 2008, §5.3).

A joint carries the wrench its child's subtree needs: with q̈ from the equations of motion
(equalities held, rbjax/_tree/equality.py), recursive Newton–Euler gives every body's spatial
acceleration a_k = a_g + Σ_{d ⪯ k} (S_d q̈_d + V_d ×ₘ S_d q̇_d) and force
f_k = I_k a_k + v_k ×* I_k v_k − f_ext,k (f_ext: gravity compensation and the equalities'
forces on their bodies), and the wrench the parent exerts across body i's joints is the sum
over its subtree, W_i = Σ_{k ∈ subtree(i)} f_k (Featherstone 2008, Table 5.1, the backward
pass). Every joint of body i carries that W (the frames between a body's joints are massless).

Part of W is what drives the joint's own motion, S_dᵀW = τ_d − armature_d q̈_d (springs,
dampers, actuators, user forces): it is not a reaction (maximal coordinates apply it as a
force element). The reaction is W without it, the force of the perfect joint, S_dᵀW_c = 0:

* hinge (axis a through c): the torque about c loses its component along a;
* slide (axis a): the force loses its component along a;
* ball (centre c): no torque about c, only the force;
* free: no reaction (zero).

Reported on the child body, world axes, the force and the torque about the joint's point (a
hinge's or ball's centre, a slide's anchor), as :class:`rbjax.Reactions`' ``force_j`` /
``torque_j`` of the same joint in maximal coordinates.
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._engine.kernels import cross
from .dynamics import apply_inertia, body_inertias, cross_force, cross_motion, masked_sum
from .kinematics import frames, motion_subspace
from .model import _gravcomp_forces
from .topology import BALL, FREE, HINGE, SLIDE


class JointReactions(eqx.Module):
    """Reactions of a :class:`rbjax.JointModel`'s joints (rbjax/_tree/reactions.py), arrays
    (..., nj, 3) in joint order: ``force`` [N] and ``torque`` [N m] about the joint's point,
    that the parent side exerts on the joint's body through the joint, world axes; the drive
    along the joint's own DOFs (springs, dampers, actuators) excluded. Zero for a free joint."""

    force: Float[Array, "... nj 3"]
    torque: Float[Array, "... nj 3"]


def joint_reactions(model, t, q, u):
    """(force (3, nj, *batch), torque (3, nj, *batch)) on component-first q, u (module
    docstring)."""
    topo = model.topology
    tail = u.shape[1:]
    f = frames(topo, model, q)
    S = motion_subspace(topo, f)
    inert = body_inertias(topo, model, f)
    M, b = model.mass_and_bias(q, u)
    qacc, lam = model.solve(M, model.generalized_forces(t, q, u) - b, q, u)
    f_ext = _gravcomp_forces(model, inert)
    if lam is not None:
        k = 0
        for e in model.equalities:
            f_ext = f_ext + e.body_forces(model, q, f, lam[k : k + e.rows])
            k += e.rows
    Sq = S * u[None]
    c = cross_motion(masked_sum(Sq, topo.dof_before), Sq)
    g = jnp.concatenate([jnp.zeros(3, u.dtype), -model.gravity]).reshape((6, 1) + (1,) * len(tail))
    a = masked_sum(c + S * qacc[None], topo.body_dofs) + g
    v = masked_sum(Sq, topo.body_dofs)
    fb = apply_inertia(inert, a) + cross_force(v, apply_inertia(inert, v)) - f_ext
    W = masked_sum(fb, topo.subtree)  # (6, nb, ...) about each tree's O

    jb = np.asarray(topo.joint_body)
    Wj = W[:, jb]  # (6, nj, ...)
    origin = f.origin[:, jb]
    first = np.asarray(topo.dofadr)
    anchor = f.anchor[:, first] if topo.nv else origin
    axis = f.axis[:, first] if topo.nv else origin
    force = Wj[3:]
    torque = Wj[:3] - cross(anchor - origin, force)  # about the joint's point
    kinds = np.asarray(topo.joint_types)
    shape = (1, -1) + (1,) * len(tail)
    hinge = (kinds == HINGE).reshape(shape)
    slide = (kinds == SLIDE).reshape(shape)
    ball = (kinds == BALL).reshape(shape)
    free = (kinds == FREE).reshape(shape)
    torque = jnp.where(hinge, torque - jnp.sum(torque * axis, 0) * axis, torque)
    force = jnp.where(slide, force - jnp.sum(force * axis, 0) * axis, force)
    torque = jnp.where(ball | free, 0.0, torque)
    force = jnp.where(free, 0.0, force)
    return force, torque


def reactions(model, state) -> JointReactions:
    """:class:`JointReactions` of a JointModel at a :class:`rbjax.JointState` (one system or
    batch-leading)."""
    q = jnp.moveaxis(jnp.asarray(state.qpos), -1, 0)
    u = jnp.moveaxis(jnp.asarray(state.qvel), -1, 0)
    force, torque = joint_reactions(model, jnp.asarray(state.t), q, u)
    return JointReactions(
        force=jnp.moveaxis(jnp.moveaxis(force, 0, -1), 0, -2),
        torque=jnp.moveaxis(jnp.moveaxis(torque, 0, -1), 0, -2),
    )
