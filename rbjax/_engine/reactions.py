"""Joint reactions in the engine's layout: W_kbᵀ λ_k reduced to a force and a torque about
the joint point (Negrut ME751 "reaction forces"; the public :func:`rbjax.reactions` documents them).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from . import kernels as cf
from .joints import _GROUND_Q, _extend, joint_terms, row_layout
from .layout import to_components

FIELDS = (
    "force_i",
    "torque_i",
    "force_j",
    "torque_j",
    "force_i_joint",
    "torque_i_joint",
    "force_j_joint",
    "torque_j_joint",
)


def joint_reactions(model, state, lam) -> dict:
    """Reaction force and torque of every joint on each of its bodies, as a dict of
    ``FIELDS`` -> arrays (..., n_joints, 3); ``lam`` (..., nb + m) the multipliers.

    All joints at once: the generalized forces W_kbᵀλ_k are summed from the stacked joint
    rows onto their joints, and the reduction to the joint point and frames runs over a
    trailing joint axis."""
    t, q, u = to_components(state)
    terms = joint_terms(model, model.formulation._engine_kinematics, t, q, u, gamma=False)
    lam_j = jnp.moveaxis(lam[..., model.nb :], -1, 0)  # (R, ...)
    nj = len(model.joints)
    lay = row_layout(model.topology)
    joint_of_row = np.repeat(np.arange(nj), model.joint_rows)
    qx = jnp.moveaxis(_extend(q, _GROUND_Q), -1, 1)  # (7, nb + 1, ...)
    batch = jnp.broadcast_shapes(terms.Wi.shape[2:], lam_j.shape[1:])
    frames = [joint.frame() for joint in model.joints]
    out = {}
    for side, (w, tag) in enumerate(((terms.Wi, "i"), (terms.Wj, "j"))):
        g = jnp.zeros((nj, 7) + batch, w.dtype).at[joint_of_row].add(w * lam_j[:, None])
        g = jnp.moveaxis(g, 0, 1)  # (7, nj, ...)
        body = lay.body[side][lay.offsets[:-1]]  # per joint (the ground is column nb)
        qb = qx[:, body]
        extra = (1,) * len(batch)
        s = jnp.stack([f[side] for f in frames], axis=-1).reshape((3, nj) + extra)
        rb = jnp.stack([f[2 + side] for f in frames], axis=-1).reshape((3, 3, nj) + extra)
        f_world = g[0:3]
        f_body = cf.rotate_t(qb[3:7], f_world)
        tau_body = g[4:7] - cf.cross(s, f_body)
        rbt = jnp.swapaxes(rb, 0, 1)
        out[f"force_{tag}"] = f_world
        out[f"torque_{tag}"] = cf.rotate(qb[3:7], tau_body)
        out[f"force_{tag}_joint"] = cf.matvec(rbt, f_body)
        out[f"torque_{tag}_joint"] = cf.matvec(rbt, tau_body)
    return {k: jnp.moveaxis(out[k], (0, 1), (-1, -2)) for k in FIELDS}
