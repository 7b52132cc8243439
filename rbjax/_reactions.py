"""Reaction forces of joints from their multipliers (seed 004, "reaction forces").

The generalized constraint force of joint k on body b is W_kbᵀ λ_k (seed 000 eq. (81)): in the
state convention it is (F world frame, S_C, M_C about the centre of mass in body axes). The
reaction is reported as the force F and the torque τ about the JOINT POINT P_b = r_b + A_b s̄_b:
τ̄ = M_C − s̄_b × (A_bᵀ F) in body axes, then in the world frame (A_b τ̄) and in the joint frame
(R̄_bᵀ τ̄, R̄_b = [x̄ ȳ z̄] the joint axes in body axes). For a GROUND side the same formula
uses the Jacobian with respect to a virtual motion of the ground frame, so the pair of
reactions obeys action = −reaction for every joint whose residual is invariant under a common
rigid motion of both frames (all built-in joints).
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float

from ._dynamics import accelerations
from ._engine import kernels as cf
from ._engine.joints import _GROUND_Q, _extend, generalized_forces, joint_terms
from ._engine.layout import to_components


class Reactions(eqx.Module):
    """Joint reactions, arrays (..., n_joints, 3) [N] and [N m], in ``model.joints`` order.

    ``force_i`` / ``force_j``: force the joint exerts on body i / body j, world frame.
    ``torque_i`` / ``torque_j``: its torque about the joint point on that body, world frame.
    ``force_i_joint`` ... ``torque_j_joint``: the same in that body's joint frame (x̄, ȳ, z̄).
    """

    force_i: Float[Array, "... nj 3"]
    torque_i: Float[Array, "... nj 3"]
    force_j: Float[Array, "... nj 3"]
    torque_j: Float[Array, "... nj 3"]
    force_i_joint: Float[Array, "... nj 3"]
    torque_i_joint: Float[Array, "... nj 3"]
    force_j_joint: Float[Array, "... nj 3"]
    torque_j_joint: Float[Array, "... nj 3"]


def reactions(model, state, lam=None) -> Reactions:
    """Reaction force and torque of every joint on each of its two bodies at ``state``.

    ``lam`` (..., nb + m) are the multipliers of ``model.formulation`` (computed from the
    equations of motion when omitted; pass ``Trajectory.lam`` to post-process a rollout).
    Differentiable in everything.
    """
    if not model.joints:
        raise ValueError("reactions: the model has no joints. Fix: pass joints=[...] to Model.")
    if lam is None:
        lam = accelerations(model, state)[1]
    t, q, u = to_components(state)
    terms = joint_terms(model, model.formulation._engine_kinematics, t, q, u, gamma=False)
    lam_j = jnp.moveaxis(lam[..., model.nb :], -1, 0)
    rows = model.joint_rows
    offs = [sum(rows[:k]) for k in range(len(rows))]
    lam_k = [lam_j[o : o + r] for o, r in zip(offs, rows, strict=True)]
    gen = generalized_forces(terms, lam_k)
    qx = jnp.moveaxis(_extend(q, _GROUND_Q), -1, 1)  # (7, nb + 1, ...)
    out = {key: [] for key in Reactions.__dataclass_fields__}
    for k, (joint, (b_i, b_j)) in enumerate(
        zip(model.joints, model.topology.joint_bodies, strict=True)
    ):
        s_i, s_j, rb_i, rb_j = joint.frame()
        for side, (b, s, rb) in enumerate(((b_i, s_i, rb_i), (b_j, s_j, rb_j))):
            qb = qx[:, b]  # GROUND = −1 is the last column
            g = gen[k][side]
            f_world = g[0:3]
            f_body = cf.rotate_t(qb[3:7], f_world)
            s_cf = s.reshape((3,) + (1,) * (f_body.ndim - 1))
            tau_body = g[4:7] - cf.cross(s_cf, f_body)
            rb_cf = jnp.moveaxis(rb, (0, 1), (0, 1)).reshape((3, 3) + (1,) * (f_body.ndim - 1))
            rbt = jnp.swapaxes(rb_cf, 0, 1)
            tag = "i" if side == 0 else "j"
            out[f"force_{tag}"].append(f_world)
            out[f"torque_{tag}"].append(cf.rotate(qb[3:7], tau_body))
            out[f"force_{tag}_joint"].append(cf.matvec(rbt, f_body))
            out[f"torque_{tag}_joint"].append(cf.matvec(rbt, tau_body))
    return Reactions(
        **{k: jnp.moveaxis(jnp.stack(v, axis=0), (0, 1), (-2, -1)) for k, v in out.items()}
    )
