"""Reaction forces of joints from their multipliers (Negrut ME751, "reaction forces").

The generalized constraint force of joint k on body b is W_kbᵀ λ_k (Möller & Glocker 2012 eq. (81)): in the
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
from jaxtyping import Array, Float

from . import _welds as welds
from ._abstract import AbstractModel, AbstractState
from ._dynamics import accelerations
from ._engine.reactions import joint_reactions
from ._errors import validates_inputs
from ._model import Model, require_model
from ._state import State
from ._tree.model import JointModel, JointState, maximal_only
from ._tree.reactions import JointReactions, reactions as tree_reactions


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


def reactions(model: AbstractModel, state: AbstractState, lam=None) -> Reactions | JointReactions:
    """Reaction force and torque of every joint on each of its two bodies at ``state``.

    ``lam`` (..., nb + m) are the multipliers of ``model.formulation`` (computed from the
    equations of motion when omitted; pass ``Trajectory.lam`` to post-process a rollout).
    Differentiable in everything.

    On a :class:`rbjax.JointModel` and a :class:`rbjax.JointState`: the
    :class:`rbjax.JointReactions` of its joints (force and torque on each joint's
    body about the joint's point, world axes; rbjax/_tree/reactions.py), from recursive
    Newton–Euler with the accelerations of the equations of motion; ``lam`` is not taken.
    """
    if isinstance(model, JointModel):
        if lam is not None:
            raise ValueError(
                "reactions: lam is the multipliers of a maximal-coordinate model; a "
                "JointModel's reactions come from its equations of motion. Fix: omit lam."
            )
        if not isinstance(state, JointState):
            raise ValueError(
                f"reactions: model is a JointModel but state is a {type(state).__name__}. Fix: "
                "pass its rbjax.JointState (qpos, qvel), e.g. rbjax.load(...).state or "
                "JointTrajectory[i]."
            )
        return _tree_reactions(model, state)
    model = require_model(model)
    if not isinstance(state, State):
        raise ValueError(
            f"reactions: model is an rbjax.Model but state is a {type(state).__name__}. Fix: "
            "pass its rbjax.State (t, q, u), e.g. Trajectory.states or Trajectory[i]."
        )
    if not model.joints:
        raise ValueError("reactions: the model has no joints. Fix: pass joints=[...] to Model.")
    return _reactions(model, state, lam)


@eqx.filter_jit
def _tree_reactions(model, state) -> JointReactions:
    return tree_reactions(model, state)


@eqx.filter_jit
def _reactions(model, state, lam) -> Reactions:
    """:func:`reactions` as one program (like :func:`rbjax.accelerations`)."""
    if lam is None:
        lam = accelerations(model, state)[1]
    return Reactions(**joint_reactions(model, state, lam))


@validates_inputs
def weld_reactions(model: Model, state: State, lam=None) -> Reactions:
    """Reaction force and torque of every weld that :class:`rbjax.Model` merged
    (``model.merged.weld_names`` order), as :class:`Reactions`: the force and torque (about
    the weld point) that the weld exerts on each of its two bodies, world frame and weld
    frames, exactly what the six-row :class:`rbjax.Fixed` constraint's multipliers give in
    the unmerged model.

    From the Newton–Euler equations of the part the weld holds (rbjax/_welds.py):
    F = Σ m_b (a_b − g) − F_applied − F_joints and
    τ_P = Σ [R_b (Θ_b ω̇_b + ω_b × Θ_b ω_b) + (r_b − P) × m_b (a_b − g)] − τ_applied − τ_joints,
    with the accelerations of the merged model at ``state`` (a state of the merged model,
    e.g. ``Trajectory.states``; any batch axes) and ``lam`` its multipliers (computed when
    omitted). Differentiable in everything.
    """
    maximal_only(model, "rbjax.weld_reactions")
    if getattr(model, "merged", None) is None:
        raise ValueError(
            "weld_reactions: the model merged no weld. Fix: build it with point masses welded "
            "by rbjax.Fixed or with merge_welded=True; otherwise the Fixed joints' reactions "
            "are in rbjax.reactions."
        )
    return Reactions(**welds.weld_reactions(model, state, lam))
