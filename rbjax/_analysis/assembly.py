"""Assembly: consistent initial conditions on the joint manifold (ME751).

:func:`assemble` returns the configuration on Φ(q, t) = 0 CLOSEST to the input in the
kinetic-energy metric of Möller & Glocker 2012 eq. (64) (min ½δᵀMδ, δ the generalized displacement), then
projects the velocities M-orthogonally onto W̃u + Φ_t = 0. Both are roots of square systems
(rbjax/_engine/projection.py), differentiated by the implicit function theorem.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, overload

import jax.numpy as jnp
import numpy as np

from .._abstract import AbstractModel, AbstractState
from .._engine.layout import from_components, to_components
from .._engine.projection import NOT_CLOSEST, STOP_REASONS, closest_point, project_velocity
from .._errors import is_concrete
from .._model import require_model
from .._oneshot import one_shot_jit
from .._state import State
from .._tree.equality import assemble_state
from .._tree.model import JointModel, JointState


@one_shot_jit
def _assemble(model, state, tol, max_iters, velocities):
    t, q, u = to_components(state)
    q, err, it, reason = closest_point(model, t, q, tol, max_iters, dense=True)
    if velocities:
        u = jnp.where(model.rigid, u.at[3].set(0.0), u)
        u = project_velocity(model, t, q, u, dense=True)
    return from_components(t, q, u), err, it, reason


def _free(model, state: State, velocities: bool) -> State:
    """:func:`assemble` of a model without joints: its only equations are a rigid body's
    |A|² = 1 (Möller & Glocker 2012 eq. (77)), whose closest point in the kinetic-energy metric
    is A / |A| (a displacement along the scaling direction alone), and ν = 0."""
    a = state.q[..., 3:7]
    rigid = model.rigid[:, None]
    a = jnp.where(rigid, a / jnp.sqrt(jnp.sum(a * a, axis=-1, keepdims=True)), a)
    q = jnp.concatenate([state.q[..., 0:3], a], axis=-1)
    u = state.u
    if velocities:
        u = u.at[..., 3].set(jnp.where(model.rigid, 0.0, u[..., 3]))
    return State(t=state.t, q=q, u=u)


if TYPE_CHECKING:  # the overloads typed callers see (the runtime checks see the definition)

    @overload
    def assemble(
        model: AbstractModel,
        state: State,
        *,
        tol: float | None = None,
        max_iters: int = 50,
        velocities: bool = True,
    ) -> State: ...

    @overload
    def assemble(
        model: AbstractModel,
        state: JointState,
        *,
        tol: float | None = None,
        max_iters: int = 50,
        velocities: bool = True,
    ) -> JointState: ...

    @overload
    def assemble(
        model: AbstractModel,
        state: AbstractState,
        *,
        tol: float | None = None,
        max_iters: int = 50,
        velocities: bool = True,
    ) -> AbstractState: ...


def assemble(
    model: AbstractModel,
    state: AbstractState,
    *,
    tol: float | None = None,
    max_iters: int = 50,
    velocities: bool = True,
) -> AbstractState:
    """Consistent initial conditions: q with Φ(q, t) = 0 near ``state.q``, then u with
    W u + Φ_t = 0 (ME751 "assembly"; Newton–Raphson with minimum-norm corrections).

    ``tol`` (default 1e-12 in float64, 1e-5 in float32) is the largest residual accepted. If a
    joint cannot be satisfied, raises ValueError naming the joints whose residual stays large.
    Works on batches of states. The result is the configuration on the joint manifold closest
    to ``state.q`` in the kinetic-energy metric (Möller & Glocker 2012 eq. (64)), so it is a function of the
    input and of the model, differentiable in forward and reverse mode by the implicit function
    theorem (the Newton iterations are not differentiated). A model without joints: rigid
    quaternions are normalised and their ν set to 0, the rest is unchanged.

    A :class:`rbjax.JointModel` and its :class:`rbjax.JointState`: the equalities closed by
    Gauss–Newton steps in joint space, each the minimum-norm correction in the kinetic-energy
    metric of its iterate, velocities projected (rbjax/_tree/equality.py), every system of a
    batch, on the host (concrete inputs, not differentiated); ball and free quaternions
    normalised. Its result is a closed configuration near the input, not the closest point:
    the end point depends on the steps' path (on MJX's constraints.xml, up to 0.29 m from
    the closest point that maximal coordinates find).
    """
    if isinstance(model, JointModel):  # joint coordinates: only the equalities to close
        if not isinstance(state, JointState):
            raise ValueError(
                f"assemble: model is a JointModel but state is a {type(state).__name__}. Fix: "
                "pass its rbjax.JointState (qpos, qvel)."
            )
        return assemble_state(model, state)
    model = require_model(model)
    if not isinstance(state, State):
        raise ValueError(f"assemble: state = {type(state).__name__} is not an rbjax.State.")
    if not model.joints:
        return _free(model, state, bool(velocities))
    if tol is None:
        tol = 1e-12 if state.q.dtype == jnp.float64 else 1e-5
    out, err, it, reason = _assemble(model, state, float(tol), int(max_iters), bool(velocities))
    if is_concrete(err):
        batch = np.shape(err)[1:]
        err = np.asarray(err).reshape(len(model.joints), -1)
        reason = np.asarray(reason).reshape(-1)
        failed = ~np.all(err <= 100 * tol, axis=0) | (reason == NOT_CLOSEST)  # per system
        if failed.any():
            raise ValueError(_failure_message(model, err, failed, reason, it, tol, batch))
    return out


def _failure_message(model, err, failed, reason, it, tol, batch) -> str:
    """The error of :func:`assemble`: per joint its largest residual over the failed systems
    (that of the last finite iterate), and why Gauss–Newton stopped (or, on the manifold, why
    the closest point was not found)."""
    worst_err = np.where(failed, err, -np.inf).max(axis=1)  # NaN propagates
    bad = [(n, e) for n, e in zip(model.joint_names, worst_err, strict=True) if not e <= 100 * tol]
    worst = ", ".join(f"'{n}' (residual {e:.3g})" for n, e in bad)
    reasons = sorted(set(np.broadcast_to(reason.reshape(-1), failed.shape)[failed].tolist()))
    why = "; ".join(STOP_REASONS[int(r)] for r in reasons)
    where = ""
    if failed.size > 1:
        idx = np.flatnonzero(failed)
        first = tuple(int(i) for i in np.unravel_index(idx[0], batch))
        first = first[0] if len(first) == 1 else first
        where = f" in {idx.size} of {failed.size} systems (first: batch index {first})"
    n = int(np.max(it))
    if not bad:  # on the manifold, but not at the point closest to the start
        return (
            f"assemble: no closest configuration on the joint manifold was found{where}: "
            f"Gauss–Newton reached the manifold in {n} iteration{'' if n == 1 else 's'}, but "
            f"{why}. Fix: start closer to an assembled configuration (e.g. build joints with "
            ".at(q, ...)), or assemble in steps from intermediate configurations."
        )
    return (
        f"assemble: the joints cannot all be satisfied{where} after {n} Newton "
        f"iteration{'' if n == 1 else 's'}; these joints keep a residual above {tol:.1g}: {worst}. Newton stopped "
        f"because {why}. Fix: check their attachment points and axes against the bodies' "
        "positions (start closer to an assembled configuration, e.g. build joints with "
        ".at(q, ...)), or remove contradicting joints."
    )
