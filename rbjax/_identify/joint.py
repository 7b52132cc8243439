"""Identification on a :class:`rbjax.JointModel` (joint coordinates, MuJoCo's qpos/qvel): what
the observations, the simulation and multiple shooting read from a :class:`rbjax.JointState`.

Observations see the bodies as maximal coordinates do (rbjax/_io/mujoco.py maps a file's
bodies so): each body's centre of mass c_i (MuJoCo ``xipos``) and the attitude of its body
frame A_i (``xquat``); u = (v_i, 0, ω̄_i), v_i the velocity of the centre of mass (world
axes), ω̄_i = R_iᵀ ω_i the angular velocity in body axes (rbjax/_tree/bodies.py:
V_i = Σ_{d ⪯ i} S_d q̇_d, Featherstone 2008, eq. (3.33)). So an observation defined on the
maximal state (q, u) of a body predicts the same number from either formulation of a file.

Accelerations (the accelerometer): q̈ from the equations of motion (equalities held), then
(a_c, ω̄̇) = d/dt (v_i, ω̄_i) by one Jacobian–vector product of the body velocities along
(q̇pos, q̈) — the exact time derivative, as maximal coordinates' u̇ (d/dt R_iᵀω_i = R_iᵀ ω̇_i
because Ṙᵀω = −ω̄ × ω̄ = 0).

Multiple shooting: a segment start is the reference (qpos_ref, qvel_ref) moved by δ ∈ ℝ^nv in
the tangent space, qpos = qpos_ref ⊕ δ (hinge and slide coordinates added, a ball's or free
joint's quaternion q ⊗ exp(δ_ω/2), the rotation in the joint's own frame as MuJoCo's
``mj_integratePos``) and qvel = qvel_ref + δ̇: every value is a valid state and there are
exactly 2 nv unknowns per segment (a tree has no redundant coordinates). The continuity gap
is the inverse map: linear coordinates subtracted, the quaternion's rotation vector
2 log(conj(q_start) ⊗ q_end).
"""

from __future__ import annotations

from typing import TypeGuard

import jax
import jax.numpy as jnp
import numpy as np

from .. import _quaternion as quat
from .._errors import fail
from .._integrators import AbstractExplicitRK, SemiImplicitEuler
from .._state import State
from .._tree.bodies import com_from, velocities_from
from .._tree.dynamics import qpos_rate
from .._tree.implicit import ImplicitFast
from .._tree.kinematics import frames
from .._tree.model import JointModel, JointState
from .._tree.reactions import joint_reactions
from .._tree.topology import HINGE, SLIDE


def is_joint(model) -> TypeGuard[JointModel]:
    """Whether ``model`` is in joint coordinates."""
    return isinstance(model, JointModel)


def arrays(state):
    """(q, u) of a State (q, u) or a JointState (qpos, qvel)."""
    if isinstance(state, JointState):
        return state.qpos, state.qvel
    return state.q, state.u


def like(state, t, q, u):
    """A state of ``state``'s kind with the arrays t, q, u."""
    if isinstance(state, JointState):
        out = jax.tree.unflatten(jax.tree.structure(state), (t, q, u))
        return out
    return State(t=t, q=q, u=u)


def dtype_of(state):
    return arrays(state)[0].dtype


def _maximal(model: JointModel, qpos, qvel):
    """(q (nb, 7, K), u (nb, 7, K)): (c_i, A_i) and (v_i, 0, ω̄_i) of every body from
    component-first qpos (nq, K), qvel (nv, K) (module docstring)."""
    f = frames(model.topology, model, qpos)
    com = com_from(model, f)  # (3, nb, K)
    v, w = velocities_from(model, f, com, qvel)
    R = jnp.moveaxis(f.R, (0, 1), (-2, -1))  # (nb, K, 3, 3)
    a = quat.from_matrix(R)  # (nb, K, 4)
    w_body = jnp.einsum("...ji,...j->...i", R, jnp.moveaxis(w, 0, -1))  # R_iᵀ ω_i
    q = jnp.concatenate([jnp.moveaxis(com, 0, -1), a], axis=-1)
    u = jnp.concatenate([jnp.moveaxis(v, 0, -1), jnp.zeros_like(a[..., :1]), w_body], axis=-1)
    return q, u  # (nb, K, 7)


def body_states(model: JointModel, states: JointState):
    """(q (K, nb, 7), u (K, nb, 7)): the maximal coordinates of every body at the K states
    (module docstring), the arrays a maximal observation reads."""
    q, u = _maximal(model, states.qpos.T, states.qvel.T)
    return jnp.swapaxes(q, 0, 1), jnp.swapaxes(u, 0, 1)


def body_accelerations(model: JointModel, states: JointState, b: int):
    """(a_c (K, 3) world acceleration of body b's centre of mass, ω̄̇ (K, 3) its angular
    acceleration in body axes) from q̈ of the equations of motion (module docstring)."""
    q, v = states.qpos.T, states.qvel.T
    qacc = model.accelerations(states.t, q, v)
    qdot = qpos_rate(model.topology, q, v)

    def vel(qq, vv):
        return _maximal(model, qq, vv)[1][b]  # (K, 7)

    _, du = jax.jvp(vel, (q, v), (qdot, qacc))
    return du[:, 0:3], du[:, 4:7]


def reactions(model: JointModel, states: JointState):
    """(force (K, nj, 3), torque (K, nj, 3)) of :func:`rbjax.reactions` on a JointModel:
    on each joint's body, about the joint's point, world axes."""
    force, torque = joint_reactions(model, states.t, states.qpos.T, states.qvel.T)
    return jnp.moveaxis(force, (0, 1), (-1, -2)), jnp.moveaxis(torque, (0, 1), (-1, -2))


def encoder_rows(model: JointModel, k: int, where: str, key) -> tuple[int, bool]:
    """(qpos row, angular) of the hinge or slide joint k that an encoder reads (ValueError for
    a ball or free joint, as maximal coordinates refuse a spherical one)."""
    kind = model.topology.joint_types[k]
    if kind not in (HINGE, SLIDE):
        fail(
            where,
            key,
            f"is a {kind} joint; an encoder reads a hinge or slide joint (one coordinate)",
            "measure a hinge or slide joint, or write a Custom observation of the quaternion",
        )
    return model.topology.qposadr[k], kind == HINGE


def check_integrator(integrator, who: str) -> None:
    if not isinstance(integrator, (AbstractExplicitRK, SemiImplicitEuler, ImplicitFast)):
        fail(
            f"{who}(integrator)",
            f"{type(integrator).__name__}()",
            "does not integrate joint coordinates",
            "pass rbjax.RK4(), rbjax.ExplicitRK(tableau), rbjax.SemiImplicitEuler() or "
            "rbjax.ImplicitFast()",
        )


def retract(model: JointModel, ref_q, ref_u, dq, du):
    """Segment starts (qpos (S, nq), qvel (S, nv)) = (ref_q ⊕ dq, ref_u + du) (module
    docstring); ref_q (S, nq), dq, du, ref_u (S, nv). The quaternion exponential is
    rbjax.quaternion's, whose derivative is finite at δ = 0, where every segment starts
    (rbjax/_tree/implicit.py ``integrate_positions`` differentiates |δ| there: NaN)."""
    lin_q, lin_d, quat_q, quat_d = model.topology.rate_rows()
    qpos = ref_q
    if lin_q.size:
        qpos = qpos.at[..., lin_q].add(dq[..., lin_d])
    if quat_q.size:
        rows = np.stack([quat_q + i for i in range(4)], axis=-1)  # (n, 4)
        cols = np.stack([quat_d + i for i in range(3)], axis=-1)  # (n, 3)
        a = ref_q[..., rows]
        a = a / jnp.linalg.norm(a, axis=-1, keepdims=True)  # a reference: |a| ≈ 1, never 0
        qpos = qpos.at[..., rows].set(quat.mul(a, quat.exp(0.5 * dq[..., cols])))
    return qpos, ref_u + du


def tangent_gap(model: JointModel, end_q, start_q):
    """end ⊖ start (..., nv) of qpos (..., nq): linear coordinates subtracted, quaternions as
    the rotation vector 2 log(conj(start) ⊗ end) (the inverse of :func:`retract`)."""
    from .observations import rotvec_between

    lin_q, lin_d, quat_q, quat_d = model.topology.rate_rows()
    out = jnp.zeros(end_q.shape[:-1] + (model.nv,), end_q.dtype)
    if lin_q.size:
        out = out.at[..., lin_d].set(end_q[..., lin_q] - start_q[..., lin_q])
    if quat_q.size:
        rows = np.stack([quat_q + i for i in range(4)], axis=-1)  # (n, 4)
        cols = np.stack([quat_d + i for i in range(3)], axis=-1)  # (n, 3)
        rv = rotvec_between(start_q[..., rows], end_q[..., rows])  # (..., n, 3)
        out = out.at[..., cols].set(rv)
    return out


def segment_gaps(model: JointModel, end: JointState, start: JointState):
    """Continuity gaps end − start in the tangent space (module docstring), grouped as the
    maximal ones: [linear coordinates [m], rotations [rad], linear velocities [m/s],
    angular velocities [rad/s]] (each (S − 1, n) for the n DOFs of its kind)."""
    rot = np.asarray(model.topology.dof_rotational, dtype=bool)
    dq = tangent_gap(model, end.qpos, start.qpos)
    dv = end.qvel - start.qvel
    lin, ang = np.flatnonzero(~rot), np.flatnonzero(rot)
    return [dq[..., lin], dq[..., ang], dv[..., lin], dv[..., ang]]
