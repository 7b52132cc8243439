"""Joint reactions in the engine's layout: W_kbᵀ λ_k reduced to a force and a torque about
the joint point (Negrut ME751 "reaction forces"; the public :func:`rbjax.reactions` documents them).
"""

from __future__ import annotations

import jax.numpy as jnp

from . import kernels as cf
from .joints import _GROUND_Q, _extend, generalized_forces, joint_terms
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
    ``FIELDS`` -> arrays (..., n_joints, 3); ``lam`` (..., nb + m) the multipliers."""
    t, q, u = to_components(state)
    terms = joint_terms(model, model.formulation._engine_kinematics, t, q, u, gamma=False)
    lam_j = jnp.moveaxis(lam[..., model.nb :], -1, 0)
    rows = model.joint_rows
    offs = [sum(rows[:k]) for k in range(len(rows))]
    lam_k = [lam_j[o : o + r] for o, r in zip(offs, rows, strict=True)]
    gen = generalized_forces(terms, lam_k)
    qx = jnp.moveaxis(_extend(q, _GROUND_Q), -1, 1)  # (7, nb + 1, ...)
    out = {key: [] for key in FIELDS}
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
    return {k: jnp.moveaxis(jnp.stack(v, axis=0), (0, 1), (-2, -1)) for k, v in out.items()}
