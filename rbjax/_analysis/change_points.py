"""Singular configurations (change points) of mechanisms: where the joint Jacobian loses rank.

At a change point the joint Jacobian W̃ (rows: joint equations, columns: the bodies' (v, ω))
has a lower rank than at the configurations around it on the joint manifold: two branches of
the motion meet there (a slider-crank with crank length r equal to rod length l at θ = 90°:
the slider can continue on x = 2r cos θ or fold back onto x = 0), the equations do not say
which one the motion takes, and the multipliers are not unique (Haug, Computer-Aided
Kinematics and Dynamics of Mechanical Systems, 1989, §3.5 and §6.6: singular configurations,
lock-up and bifurcation; Allgower & Georg, Introduction to Numerical Continuation Methods,
2003, §8: bifurcation points on a solution curve).

Two tests, one for a single configuration and one for a path:

* **At a configuration** (:func:`rank_drop`, reported by ``rbjax.mobility`` and warned by the
  pre-rollout checks): a rank deficit of W̃ can be structural (a planar loop closed by four
  revolute joints has three dependent equations at every configuration) or singular. They
  differ in how the deficit reacts to a small move along a null direction x of W̃: the
  singular values of W̃(q ⊕ εx) that are zero at q stay zero, or rise as O(ε²) (the move
  leaves the manifold at second order), for a structural deficit, and rise as O(ε) at a
  singular configuration (the rank recovers at first order on either branch). Measured at
  ε = 1e-5 and 1e-4: a deficit counts as singular when its singular value rose above the
  rank tolerance and by less than √1000 ≈ 32 between the two (a factor 10 is linear, 100
  quadratic).
* **Along a path** (:func:`track`, inside ``rbjax.kinematic_analysis``'s compiled program and
  :func:`change_points` on saved states): the smallest singular value σ of W̃ among those
  that are not zero around the path (the rank there; structurally dependent equations keep
  their zeros beyond it), with its left and right singular vectors (u, v), followed from one
  time to the next. σ is reported relative to
  the largest (``conditioning``); a time with σ ≤ 1e-9·max(1, σ_max) (the rank tolerance of
  ``rbjax.mobility``; 1000 ε in float32) is AT a singular configuration. Between two times the
  singular value of the analytic SVD (Bunse-Gerstner, Byers, Mehrmann & Nichols, Numer. Math.
  60, 1991) changes sign where the path crosses a singular configuration; LAPACK returns
  σ ≥ 0 with (u, v) up to a common sign, so a crossing shows as exactly one of u, v turning
  over (uₖ·uₖ₋₁ and vₖ·vₖ₋₁ of opposite signs), trusted only when both stay aligned
  (|uₖ·uₖ₋₁|, |vₖ·vₖ₋₁| ≥ ½: the smallest singular value is still the same one). Its time is
  the zero of the linear interpolation of the signed σ. Unlike the sign of det W̃ (the
  classical test for simple bifurcation points), this also sees two singular values crossing
  zero together, as in the spatial slider-crank above (the in-plane equation and the rod's
  spin about its own axis).
"""

from __future__ import annotations

import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float

from .._constraints import GROUND
from .._engine.joints import joint_terms
from .._engine.layout import to_components
from .._engine.projection import _retract
from .._errors import validates_inputs
from .._model import Model
from .._oneshot import one_shot_jit
from .._state import State
from .._tree.model import maximal_only


class SingularConfigurationWarning(RuntimeWarning):
    """A mechanism starts at, or passes through, a singular configuration (a change point):
    its joint Jacobian loses rank there, the motion beyond is not determined by the equations
    and the multipliers are not unique (rbjax/_analysis/change_points.py)."""


# ------------------------------------------------------------------ the dense joint Jacobian


def _column_layout(model):
    """Static index tables of W̃'s columns: for every stacked joint row and side (i, j), the
    column of each of the 7 velocity components (rigid bodies: (v, ω), ν dropped; scalable:
    (v, ν, ω)), and whether it exists (not ground, not a rigid body's ν). Returns
    (cols (2, R, 7), ok (2, R, 7), n)."""
    width = [7 if s else 6 for s in model.scalable]
    offs = np.cumsum([0] + width)
    colmap = np.full((model.nb + 1, 7), -1)  # the last row stands for the ground
    for b, s in enumerate(model.scalable):
        comps = range(7) if s else (0, 1, 2, 4, 5, 6)
        colmap[b, list(comps)] = offs[b] + np.arange(width[b])
    sides = np.asarray(model.topology.joint_bodies).reshape(-1, 2)  # (joints, 2)
    body = np.repeat(sides, model.joint_rows, axis=0).T  # (2, R)
    body = np.where(body == GROUND, model.nb, body)
    cols = colmap[body]  # (2, R, 7)
    return np.maximum(cols, 0), cols >= 0, int(offs[-1])


def dense_jacobian(model, Wi, Wj):
    """W̃ (R, n) of ONE system from the stacked joint blocks ``Wi``/``Wj`` (R, 7) of
    :func:`rbjax._engine.joints.joint_terms` (NumPy in, NumPy out; JAX in, JAX out)."""
    cols, ok, n = _column_layout(model)
    rows = np.broadcast_to(np.arange(cols.shape[1])[:, None], cols.shape[1:])
    if isinstance(Wi, np.ndarray) and isinstance(Wj, np.ndarray):
        mat = np.zeros((cols.shape[1], n), Wi.dtype)
        for side, w in enumerate((Wi, Wj)):
            np.add.at(mat, (rows[ok[side]], cols[side][ok[side]]), w[ok[side]])
        return mat
    mat = jnp.zeros((cols.shape[1], n), jnp.result_type(Wi))
    for side, w in enumerate((Wi, Wj)):
        mat = mat.at[rows, cols[side]].add(jnp.where(ok[side], w, 0.0))
    return mat


def jacobian_now(model, t, q):
    """W̃ (R, n) at the component-first configuration q (7, nb) of ONE system (traceable)."""
    kin = model.formulation._engine_kinematics
    terms = joint_terms(model, kin, t, q, jnp.zeros_like(q), gamma=False)
    return dense_jacobian(model, terms.Wi, terms.Wj)


# ------------------------------------------------------------------ at one configuration

_EPS = (1e-5, 1e-4)  # the two moves of rank_drop (module docstring)


@one_shot_jit
def _moved_jacobians(model, state, d):
    """W̃ at q ⊕ ε d (``state``'s q, ONE system) for both ε of :data:`_EPS`: (2, R, n)."""
    t, q, _ = to_components(state)
    d = jnp.asarray(d, q.dtype)
    return jnp.stack([jacobian_now(model, t, _retract(model, q, e * d)) for e in _EPS])


def rank_drop(model, state: State, mat: np.ndarray, rtol: float) -> int:
    """How many independent joint equations ONE concrete configuration lacks compared with the
    configurations around it on the joint manifold: 0 unless it is singular (a change point;
    module docstring). ``mat`` is W̃ there (NumPy), ``rtol`` the rank tolerance
    (``rbjax.mobility``'s: singular values ≤ rtol·max(1, σ_max) are zero)."""
    if mat.size == 0:
        return 0
    _, sv, vh = np.linalg.svd(mat)
    tol = rtol * max(1.0, float(sv[0]))
    rank = int(np.sum(sv > tol))
    p = min(mat.shape)
    if rank == p:
        return 0
    # a fixed direction in the null space of W̃ (deterministic: the same answer every call)
    null = vh[rank:].T
    x = null @ np.random.default_rng(0).standard_normal(null.shape[1])
    x = x / np.linalg.norm(x)
    d = np.zeros((7, model.nb))
    for b, s in enumerate(model.scalable):
        comps = list(range(7)) if s else [0, 1, 2, 4, 5, 6]
        start = sum(7 if z else 6 for z in model.scalable[:b])
        d[comps, b] = x[start : start + len(comps)]
    # all inside one compiled call: evaluated now, also at build time inside an outer trace
    moved = np.asarray(_moved_jacobians(model, state, d))
    small = [np.linalg.svd(m, compute_uv=False)[rank:p] for m in moved]
    lifted = (small[1] > tol) & (small[1] < np.sqrt(1e3) * small[0])
    return int(np.sum(lifted))


@one_shot_jit
def _jacobian_at(model, state):
    t, q, _ = to_components(state)
    return jacobian_now(model, t, q)


def generic_rank(model, state: State, rtol: float = 1e-9) -> int:
    """The rank of W̃ at the configurations around ONE concrete state: its rank there plus
    its :func:`rank_drop`."""
    mat = np.asarray(_jacobian_at(model, state))
    sv = np.linalg.svd(mat, compute_uv=False)
    rank = int(np.sum(sv > rtol * max(1.0, float(sv[0]) if sv.size else 1.0)))
    return rank + rank_drop(model, state, mat, rtol)


def start_message(where: str, rank: int, drop: int) -> str:
    """The warning of a singular initial configuration."""
    return (
        f"{where}: the initial configuration is singular (a change point): its joint "
        f"equations have rank {rank}, {drop} less than at the configurations around it on the "
        "joint manifold (rbjax.mobility(model, state).rank_drop). Branches of the motion meet "
        "here: the motion beyond it is not determined by the equations (which branch a run "
        "takes depends on the forces, the integrator and rounding), and the multipliers (joint "
        "reactions) are not unique: rbjax returns the minimum-norm ones. Start a little off "
        "the singular configuration, on the branch you mean."
    )


def check_singular_start(model, state: State, Wi, Wj, *, rtol: float = 1e-9) -> None:
    """Warn (:class:`SingularConfigurationWarning`) when ONE concrete configuration, whose
    stacked joint blocks ``Wi``/``Wj`` (R, 7) are given, is singular (:func:`rank_drop`)."""
    mat = np.asarray(dense_jacobian(model, np.asarray(Wi), np.asarray(Wj)))
    drop = rank_drop(model, state, mat, rtol)
    if drop:
        sv = np.linalg.svd(mat, compute_uv=False)
        rank = int(np.sum(sv > rtol * max(1.0, float(sv[0]))))
        warnings.warn(
            start_message("rbjax", rank, drop), SingularConfigurationWarning, stacklevel=4
        )


# ------------------------------------------------------------------ along a path


def at_rtol(dtype) -> float:
    """The relative tolerance below which the smallest singular value counts as zero: 1e-9
    (``rbjax.mobility``'s rank tolerance) or 1000 ε where that is larger (float32)."""
    return max(1e-9, 1e3 * float(jnp.finfo(dtype).eps))


def track_init(model, dtype):
    """The carry of :func:`track` before the first time: no previous singular vectors."""
    _, _, n = _column_layout(model)
    m = sum(model.joint_rows)
    return (
        jnp.zeros((m,), dtype),
        jnp.zeros((n,), dtype),
        jnp.zeros((), dtype),
        jnp.zeros((), dtype),
    )


def track(carry, t, mat, index: int):
    """One time of the path test (module docstring): ``carry`` the previous (u, v, σ, t),
    ``mat`` W̃ (R, n) at time ``t`` (a scalar), ``index`` the (static) position of the
    followed singular value σ in descending order: the smallest of the rank W̃ has around the
    path (equations dependent at every configuration, structural redundancy, have theirs
    beyond it). Returns the new carry and (σ/σ_max, at, crossed, t_cross): ``at``
    σ ≤ :func:`at_rtol`·max(1, σ_max); ``crossed`` σ changed sign since the previous time;
    ``t_cross`` the interpolated time of that sign change."""
    u_prev, v_prev, s_prev, t_prev = carry
    uu, sv, vh = jnp.linalg.svd(mat, full_matrices=False)
    u, v, s, top = uu[:, index], vh[index], sv[index], sv[0]
    cu, cv = jnp.dot(u, u_prev), jnp.dot(v, v_prev)
    aligned = (jnp.abs(cu) >= 0.5) & (jnp.abs(cv) >= 0.5)
    crossed = aligned & (cu * cv < 0)
    total = s_prev + s
    frac = jnp.where(total > 0, s_prev / jnp.where(total > 0, total, 1.0), 0.0)
    t_cross = t_prev + frac * (t - t_prev)
    ratio = jnp.where(top > 0, s / jnp.where(top > 0, top, 1.0), 0.0)
    at = s <= at_rtol(mat.dtype) * jnp.maximum(1.0, top)
    return (u, v, s, t), (ratio, at, crossed, t_cross)


def passages(t, at, crossed, t_cross):
    """Per time (T,): ``singular`` (a singular configuration at tₖ, or crossed in (tₖ₋₁, tₖ))
    and its estimated time (NaN where none). A crossing next to a time that is itself AT the
    singular configuration is that one (its singular vectors are arbitrary there)."""
    before = jnp.concatenate([jnp.zeros((1,), bool), at[:-1]])
    between = crossed & ~at & ~before
    singular = at | between
    when = jnp.where(at, t, jnp.where(between, t_cross, jnp.nan))
    return singular, when


class ChangePoints(eqx.Module):
    """Result of :func:`change_points`: per saved time (*batch, T) ``t``; ``conditioning`` the
    smallest singular value of the joint Jacobian W̃ relative to the largest; ``singular`` True
    where a singular configuration lies at tₖ or was crossed since tₖ₋₁; ``time`` its
    estimated time [s] (NaN where none). ``first`` (*batch): the first such time, NaN if none."""

    t: Float[Array, "*batch T"]
    conditioning: Float[Array, "*batch T"]
    singular: Bool[Array, "*batch T"]
    time: Float[Array, "*batch T"]

    @property
    def first(self) -> Array:
        return first_time(self.singular, self.time)


def first_time(singular, when):
    """The first estimated time along the last axis where ``singular``; NaN if none."""
    k = jnp.argmax(singular, axis=-1)
    return jnp.where(
        jnp.any(singular, axis=-1), jnp.take_along_axis(when, k[..., None], -1)[..., 0], jnp.nan
    )


@one_shot_jit
def _scan_paths(model, t, q, index):
    """(B, T) times and (B, T, 7, nb) configurations -> (σ/σ_max, singular, time), (B, T)."""

    def path(t, q):
        def one(carry, tq):
            tk, qk = tq
            return track(carry, tk, jacobian_now(model, jnp.reshape(tk, (1,)), qk), index)

        init = track_init(model, q.dtype)
        _, (ratio, at, crossed, t_cross) = jax.lax.scan(one, init, (t, q))
        singular, when = passages(t, at, crossed, t_cross)
        return ratio, singular, when

    return jax.vmap(path)(t, q)


@validates_inputs
def change_points(model: Model, states: State) -> ChangePoints:
    """The singular configurations (change points) a saved motion passes: ``states`` a
    sequence of states of ONE system (t (T,), q and u (T, nb, 7)), or of a batch (*batch, T),
    e.g. ``rollout(...).states``. Each saved state's joint Jacobian is decomposed (SVD) and its
    smallest singular value followed from one saved time to the next (module docstring), so a
    passage between saved states is seen as long as the smallest singular direction changes
    little between them (save densely near the suspected time for a precise estimate).

    A rollout does not test this itself (the cost stays out of its steps): passing a change
    point, it continues with the minimum-norm multipliers where the rank test of
    rbjax/_engine/rank.py drops an equation and otherwise with very large ones, and its energy
    error jumps there (docs/guide/mechanisms.md, "Change points")."""
    maximal_only(model, "rbjax.change_points")
    if not model.joints:
        raise ValueError(
            "change_points: the model has no joints. Fix: pass joints=[...] to rbjax.Model."
        )
    if not isinstance(states, State) or np.ndim(states.q) < 3:
        raise ValueError(
            f"change_points: states = {type(states).__name__} is not a sequence of states "
            "(q of shape (..., T, nb, 7)). Fix: pass rollout(...).states."
        )
    batch = states.q.shape[:-3]
    size = int(np.prod(batch))
    t = jnp.broadcast_to(states.t, states.q.shape[:-2]).reshape((size,) + states.q.shape[-3:-2])
    q = jnp.swapaxes(states.q.reshape((size,) + states.q.shape[-3:]), -1, -2)  # (B, T, 7, nb)
    # the rank around the path: that of the first saved state, plus its rank drop
    flat = jax.tree.map(lambda x: x.reshape((size,) + x.shape[-3:])[0, 0], (states.q, states.u))
    rank = generic_rank(model, State(t=t[0, 0], q=flat[0], u=flat[1]))
    ratio, singular, when = _scan_paths(model, t, q, max(rank, 1) - 1)
    shape = batch + states.q.shape[-3:-2]
    return ChangePoints(
        t=t.reshape(shape),
        conditioning=ratio.reshape(shape),
        singular=singular.reshape(shape),
        time=when.reshape(shape),
    )


def path_message(where: str, times: np.ndarray, at_sample: np.ndarray, what: str) -> str:
    """The warning of a path through singular configurations at ``times``."""
    shown = ", ".join(
        f"{t:.6g} s{' (an analysed time)' if a else ''}"
        for t, a in zip(times[:5], at_sample[:5], strict=True)
    )
    more = f" and {len(times) - 5} more" if len(times) > 5 else ""
    return (
        f"{where}: the mechanism passes a singular configuration (a change point: its joint "
        f"Jacobian loses rank) at t = {shown}{more}. Beyond it the solution may continue on "
        f"either branch: the equations do not determine which. {what}"
    )
