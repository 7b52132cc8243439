"""Mobility analysis: degrees of freedom from the SVD of the joint Jacobian W̃ and the redundant
joint equations by QR of its rows (ME751; rigid bodies in (v, ω), scalable bodies in (v, ν, ω))."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._constraints import GROUND
from .._engine.joints import joint_terms
from .._engine.layout import to_components
from .._errors import validates_inputs
from .._model import Model
from .._oneshot import one_shot_jit
from .._state import State
from .._tree.model import maximal_only
from .change_points import rank_drop


class Mobility(eqx.Module):
    """Mobility of a mechanism at one configuration (from the SVD of W̃, rigid bodies in (v, ω)).

    ``dof``: degrees of freedom 6·n_rigid + 7·n_scalable − rank; ``rank``: rank of the joint
    Jacobian; ``rows``: number of joint equations; ``redundant``: the dependent equations, each
    named ``"joint[row k]"`` (k counts the joint's equations from 0): in joint order, the rows
    that are linear combinations of earlier rows; removing them leaves ``rank`` independent
    equations and the same motion. Empty if none. ``singular_values``: of W̃, descending.
    ``rank_drop``: how many independent equations this configuration lacks compared with the
    configurations around it on the joint manifold (rbjax/_analysis/change_points.py); > 0 at
    a singular configuration (a change point: branches of the motion meet, the multipliers
    are not unique), where ``dof`` and ``redundant`` count the equations that are dependent
    only there; ``singular`` says rank_drop > 0.
    """

    dof: int = eqx.field(static=True)
    rank: int = eqx.field(static=True)
    rows: int = eqx.field(static=True)
    redundant: tuple[str, ...] = eqx.field(static=True)
    singular_values: Float[Array, " m"]
    rank_drop: int = eqx.field(static=True, default=0)

    @property
    def singular(self) -> bool:
        return self.rank_drop > 0


@one_shot_jit
def _jacobian_blocks(model, state):
    t, q, u = to_components(state)
    return joint_terms(model, model.formulation._engine_kinematics, t, q, u, gamma=False).W


def jacobian_matrix(model, state: State) -> np.ndarray:
    """W̃ as a dense (m, 6·nb) or (m, 7·nb) NumPy matrix for ONE system (rigid bodies: (v, ω));
    (0, n) for a model without joints."""
    if not model.joints:  # no equations: nothing to compile
        return np.zeros((0, sum(6 if not s else 7 for s in model.scalable)))
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


@validates_inputs
def mobility(model: Model, state: State, *, rtol: float = 1e-9) -> Mobility:
    """Degrees of freedom and redundant constraints at ``state`` (one system, concrete).

    The rank of W̃ counts independent joint equations: singular values above
    ``rtol`` · max(1, σ_max). The redundant equations are found in joint order by Gram–Schmidt
    on the rows of W̃ (the unpivoted QR factorisation of W̃ᵀ, Golub & Van Loan, Matrix
    Computations, §5.2): row r is dependent when its distance from the span of the earlier
    independent rows is at most the same tolerance. Which rows are reported depends on the
    order of the joints (any set of ``rows − rank`` rows whose removal leaves the rank unchanged
    would do); the later rows of a loop are named, e.g. for a planar four-bar closed by four
    revolute joints the out-of-plane equations of the last one. A model without joints has
    no equations: rank 0, ``dof`` = 6 per rigid body + 7 per scalable body.
    """
    maximal_only(model, "rbjax.mobility")
    if state.q.ndim != 2:
        raise ValueError(
            f"mobility: state.q has shape {state.q.shape}; pass ONE system (nb, 7), e.g. state[0]."
        )
    mat = jacobian_matrix(model, state)
    if not model.joints:  # free bodies: 6 DOF per rigid body, 7 per scalable one, rank 0
        return _mobility(model, mat, rtol)
    return _mobility(model, mat, rtol, rank_drop(model, state, mat, rtol))


def dependent_rows(mat, tol) -> list[int]:
    """Indices of the rows of ``mat`` that lie within ``tol`` of the span of the earlier
    independent rows (Gram–Schmidt in row order, reorthogonalised once: "twice is enough",
    Giraud et al., Numer. Math. 101, 2005)."""
    basis = np.zeros((0, mat.shape[1]))
    out = []
    for r, row in enumerate(mat):
        v = row - basis.T @ (basis @ row)
        v = v - basis.T @ (basis @ v)
        norm = np.linalg.norm(v)
        if norm <= tol:
            out.append(r)
        else:
            basis = np.vstack([basis, v / norm])
    return out


def _prefix_dependent_rows(mat, tol) -> list[int]:
    """The rows that do not raise the numerical rank of the rows before them (SVD of every
    prefix): exactly ``rows − rank`` of them by the interlacing of singular values (Golub & Van Loan §8.6);
    the slow fallback of :func:`dependent_rows` for ill-conditioned Jacobians."""
    out, prev = [], 0
    for r in range(mat.shape[0]):
        sv = np.linalg.svd(mat[: r + 1], compute_uv=False)
        now = int(np.sum(sv > tol))
        if now == prev:
            out.append(r)
        prev = now
    return out


def _mobility(model, mat, rtol, drop: int = 0) -> Mobility:
    sv = np.linalg.svd(mat, compute_uv=False)
    tol = rtol * max(1.0, sv.max() if sv.size else 1.0)
    rank = int(np.sum(sv > tol))
    m = mat.shape[0]
    dependent: list[int] = []
    if rank < m:
        dependent = dependent_rows(mat, tol)
        if len(dependent) != m - rank:
            dependent = _prefix_dependent_rows(mat, tol)
    joint = np.repeat(np.arange(len(model.joint_rows)), model.joint_rows)
    first = np.cumsum((0,) + tuple(model.joint_rows))
    redundant = tuple(
        f"{model.joint_names[joint[r]]}[row {r - first[joint[r]]}]" for r in dependent
    )
    return Mobility(
        dof=int(mat.shape[1] - rank),
        rank=rank,
        rows=m,
        redundant=redundant,
        singular_values=jnp.asarray(sv),
        rank_drop=drop,
    )
