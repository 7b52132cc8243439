"""Mobility analysis: degrees of freedom and redundant joint equations from the SVD of the
joint Jacobian W̃ (ME751; rigid bodies in (v, ω), scalable bodies in (v, ν, ω))."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._constraints import GROUND
from .._engine.joints import joint_terms
from .._engine.layout import to_components
from .._oneshot import one_shot_jit
from .._state import State
from .assembly import require_joints


class Mobility(eqx.Module):
    """Mobility of a mechanism at one configuration (from the SVD of W̃, rigid bodies in (v, ω)).

    ``dof``: degrees of freedom 6·n_rigid + 7·n_scalable − rank; ``rank``: rank of the joint
    Jacobian; ``rows``: number of joint equations; ``redundant``: names of joints involved in
    redundant (linearly dependent) equations, empty if none; ``singular_values``.
    """

    dof: int = eqx.field(static=True)
    rank: int = eqx.field(static=True)
    rows: int = eqx.field(static=True)
    redundant: tuple[str, ...] = eqx.field(static=True)
    singular_values: Float[Array, " m"]


@one_shot_jit
def _jacobian_blocks(model, state):
    t, q, u = to_components(state)
    return joint_terms(model, model.formulation._engine_kinematics, t, q, u, gamma=False).W


def jacobian_matrix(model, state: State) -> np.ndarray:
    """W̃ as a dense (m, 6·nb) or (m, 7·nb) NumPy matrix for ONE system (rigid bodies: (v, ω))."""
    return _dense_jacobian(model, _jacobian_blocks(model, state))


def _dense_jacobian(model, blocks) -> np.ndarray:
    cols = [6 if not s else 7 for s in model.scalable]
    offs = np.cumsum([0] + cols)
    keep = [[0, 1, 2, 4, 5, 6] if not s else [0, 1, 2, 3, 4, 5, 6] for s in model.scalable]
    rows = model.joint_rows
    mat = np.zeros((sum(rows), offs[-1]))
    r0 = 0
    for k, bodies in enumerate(model.topology.joint_bodies):
        for side, b in enumerate(bodies):
            if b == GROUND:
                continue
            w = np.asarray(blocks[k][side])
            mat[r0 : r0 + rows[k], offs[b] : offs[b + 1]] += w[:, keep[b]]
        r0 += rows[k]
    return mat


def mobility(model, state: State, *, rtol: float = 1e-9) -> Mobility:
    """Degrees of freedom and redundant constraints at ``state`` (one system, concrete).

    The rank of W̃ counts independent joint equations; joints whose rows carry weight in a
    left null vector of W̃ (a linear combination of equations that vanishes) are reported as
    redundant: any of them could be removed without changing the motion.
    """
    require_joints(model, "mobility")
    if state.q.ndim != 2:
        raise ValueError(
            f"mobility: state.q has shape {state.q.shape}; pass ONE system (nb, 7), e.g. state[0]."
        )
    return _mobility(model, jacobian_matrix(model, state), rtol)


def _mobility(model, mat, rtol) -> Mobility:
    uu, sv, _ = np.linalg.svd(mat)
    tol = rtol * max(1.0, sv.max() if sv.size else 1.0)
    rank = int(np.sum(sv > tol))
    m = mat.shape[0]
    redundant: list[str] = []
    if rank < m:
        null = uu[:, rank:]
        weight = np.max(np.abs(null), axis=1)
        rows = model.joint_rows
        r0 = 0
        for name, r in zip(model.joint_names, rows, strict=True):
            if np.any(weight[r0 : r0 + r] > 1e-6):
                redundant.append(name)
            r0 += r
    return Mobility(
        dof=int(mat.shape[1] - rank),
        rank=rank,
        rows=m,
        redundant=tuple(redundant),
        singular_values=jnp.asarray(sv),
    )
