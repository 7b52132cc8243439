"""The sample schedule and multiple shooting (Bock & Plitt 1984): the steps between samples, the
segments, and the parameterisation of the segment start states (free bodies relative to
reference attitudes; mechanisms of rigid bodies in the tangent space of the joint manifold)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from .. import _quaternion as quat
from .._analysis.assembly import assemble
from .._analysis.mobility import jacobian_matrix
from .._errors import fail, validates_inputs
from .._state import State
from .._tree.model import JointState
from .joint import arrays, is_joint, like, retract, segment_gaps as joint_gaps
from .measurements import Measurements
from .observations import rotvec_between

if TYPE_CHECKING:
    from .problem import Problem


@validates_inputs
class Shooting(eqx.Module):
    """Multiple shooting for :func:`rbjax.identify` (Bock & Plitt 1984):
    ``identify(..., shooting=Shooting(segments=S))``.

    * ``segments`` S: the samples are split into S contiguous segments integrated in parallel;
      the state at the start of each segment s ≥ 1 is an extra unknown (parameterised so that
      every value is a valid state; mechanisms in the tangent space of the joint manifold).
    * ``continuity_weight`` w = 1/σ_c² of the continuity residuals √w·(end of segment s − start
      of segment s+1): the default 1e6 treats a gap of σ_c = 1e-3 SI units like a one-σ
      misfit, so at the optimum the gaps are far below typical measurement noise while the
      problem stays well conditioned.
    * ``states0``: guesses of the state at EVERY sample time (an ``rbjax.State`` with q and u of
      shape (K, nb, 7); a JointModel's an ``rbjax.JointState``, qpos (K, nq) and qvel (K, nv);
      t is ignored), e.g. estimated from the measurements; each segment starts
      from the guess at its first sample (mechanisms after :func:`rbjax.assemble`). Default: a
      simulation of ``params0``, segment by segment. On chaotic or poorly guessed problems,
      guesses from the data keep every segment near it (Bock's recommendation).
    """

    segments: int = eqx.field(static=True)
    continuity_weight: float = eqx.field(static=True, default=1e6)
    states0: State | JointState | None = None

    def __check_init__(self):
        k = self.segments
        if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)) or k < 1:
            fail(
                "Shooting.segments",
                k,
                "is not a positive integer",
                "pass the number of segments S (1 = single shooting)",
            )
        w = self.continuity_weight
        if not (np.ndim(w) == 0 and np.isfinite(w) and float(w) > 0):
            fail(
                "Shooting.continuity_weight",
                w,
                "is not a positive finite number",
                "pass w = 1/σ_c² (default 1e6: gaps of 1e-3 SI units cost one σ)",
            )
        if self.states0 is not None and not isinstance(self.states0, (State, JointState)):
            fail(
                "Shooting.states0",
                type(self.states0).__name__,
                "is not an rbjax.State or rbjax.JointState",
                "pass rbjax.State(t=times, q=(K, nb, 7), u=(K, nb, 7)) (a JointModel: "
                "rbjax.JointState(times, qpos (K, nq), qvel (K, nv))) or None",
            )


def _schedule(t0: float, times: np.ndarray, dt: float):
    """Steps reaching every sample time exactly: ``hs`` (n,) step sizes, ``ts`` (n,) the exact
    time at the end of each step, ``idx`` (K,) index of each sample's state among [initial,
    after step 1, ...]. n_k = ⌈Δt_k/dt⌉ equal steps per interval (1e-9 relative slack for
    rounding in Δt_k/dt)."""
    hs: list[float] = []
    ts: list[float] = []
    idx: list[int] = []
    prev = float(t0)
    for t in times:
        t = float(t)
        if t > prev:
            n = max(1, int(np.ceil((t - prev) / dt - 1e-9)))
            h = (t - prev) / n
            hs += [h] * n
            ts += [prev + (j + 1) * h for j in range(n - 1)] + [t]
        idx.append(len(hs))
        prev = t
    return np.asarray(hs, dtype=np.float64), np.asarray(ts, dtype=np.float64), np.asarray(idx)


def segments(t0: float, times: np.ndarray, dt: float, n_seg: int):
    """Multiple-shooting layout: per segment its start time and step schedule, padded to a
    common length (h = 0, time held) with the flat index of each sample's state and of each
    segment's end state in the (S·(n+1)) stacked trajectory."""
    k_total = times.size
    chunks = np.array_split(np.arange(k_total), n_seg)
    starts = [float(t0)] + [float(times[c[0]]) for c in chunks[1:]]
    scheds = []
    for s, c in enumerate(chunks):
        seg_t = times[c] if s == n_seg - 1 else np.concatenate([times[c], [starts[s + 1]]])
        scheds.append(_schedule(starts[s], seg_t, dt))
    n = max(len(h) for h, _, _ in scheds)
    hs = np.zeros((n_seg, n))
    ts = np.zeros((n_seg, n))
    pick, ends = [], []
    for s, (h, t, i) in enumerate(scheds):
        hs[s, : len(h)] = h
        ts[s, :] = starts[s] if len(t) == 0 else t[-1]
        ts[s, : len(t)] = t
        pick += list(s * (n + 1) + i[: len(chunks[s])])
        if s < n_seg - 1:
            ends.append(s * (n + 1) + i[-1])
    return (
        np.asarray(starts),
        hs,
        ts,
        np.asarray(pick, dtype=np.int32),
        np.asarray(ends, dtype=np.int32),
        int(sum(len(h) for h, _, _ in scheds)),
    )


def segment_states(problem: Problem, model, seg):
    """Valid states from the free segment variables (see the module docstring)."""
    if is_joint(model):  # nv + nv tangent coordinates (rbjax/_identify/joint.py)
        assert problem.ref_q is not None and problem.ref_u is not None
        qpos, qvel = retract(model, problem.ref_q, problem.ref_u, seg["dq"], seg["du"])
        return JointState(problem.t_start[1:].astype(qpos.dtype), qpos, qvel)
    if problem.basis is not None:  # mechanism: d position and d velocity coordinates
        assert problem.ref_q is not None and problem.ref_u is not None
        nb = problem.ref_q.shape[-2]
        dx = jnp.einsum("sij,sj->si", problem.basis, seg["dq"]).reshape(-1, nb, 6)
        dv = jnp.einsum("sij,sj->si", problem.basis, seg["du"]).reshape(-1, nb, 6)
        ref_q, ref_u = problem.ref_q, problem.ref_u
        a = quat.mul(ref_q[..., 3:7], quat.exp(0.5 * dx[..., 3:6]))
        q = jnp.concatenate([ref_q[..., 0:3] + dx[..., 0:3], a], axis=-1)
        u = jnp.concatenate(
            [
                ref_u[..., 0:3] + dv[..., 0:3],
                jnp.zeros_like(dv[..., :1]),
                ref_u[..., 4:7] + dv[..., 3:6],
            ],
            axis=-1,
        )
        return assemble(model, State(t=problem.t_start[1:].astype(q.dtype), q=q, u=u))
    assert problem.a_ref is not None
    a = quat.mul(problem.a_ref, quat.exp(0.5 * seg["rotation"]))
    nu = jnp.zeros_like(seg["r"][..., 0])
    if "log_scale" in seg:
        scal = jnp.asarray(model.scalable)
        a = a * jnp.where(scal, jnp.exp(seg["log_scale"]), 1.0)[..., None]
        nu = jnp.where(scal, seg["nu"], 0.0)
    q = jnp.concatenate([seg["r"], a], axis=-1)
    u = jnp.concatenate([seg["v"], nu[..., None], seg["omega"]], axis=-1)
    st = State(t=problem.t_start[1:].astype(q.dtype), q=q, u=u)
    return assemble(model, st) if model.joints else st


def segment_gaps(model, end, start):
    """Continuity gaps end − start: position, rotation vector, velocity, angular velocity, and
    for scalable bodies ½ log|A|² and ν (a JointModel's in its tangent space, grouped the
    same way: rbjax/_identify/joint.py)."""
    if is_joint(model):
        return joint_gaps(model, end, start)
    out = [
        end.q[..., 0:3] - start.q[..., 0:3],
        rotvec_between(start.q[..., 3:7], end.q[..., 3:7]),
        end.u[..., 0:3] - start.u[..., 0:3],
        end.u[..., 4:7] - start.u[..., 4:7],
    ]
    scal = np.flatnonzero(np.asarray(model.scalable))
    if scal.size:
        half_log = lambda s: 0.5 * jnp.log(jnp.sum(s.q[..., scal, 3:7] ** 2, axis=-1))
        out += [half_log(end) - half_log(start), end.u[..., scal, 3] - start.u[..., scal, 3]]
    return out


def _tangent_basis(model, state: State, dof: int) -> np.ndarray:
    """(6 nb, dof) orthonormal basis of the null space of the velocity Jacobian W̃ at ONE
    state (per body (v, ω), ω in body axes): the ``dof`` right singular vectors of the
    smallest singular values (also defined at a singular configuration)."""
    w = jacobian_matrix(model, state)
    vt = np.linalg.svd(w)[2] if w.shape[0] else np.eye(w.shape[1])
    return vt[vt.shape[0] - dof :].T


def check_segment_guesses(guesses, data: Measurements, model, n_seg: int):
    """The rows of ``Shooting.states0`` (one state per sample time) at the first sample of
    each segment 1..S−1, as NumPy arrays; None if not given."""
    if guesses is None:
        return None
    k = data.times.size
    if n_seg == 1:
        fail(
            "Shooting.states0",
            "<State>",
            "is given but Shooting.segments = 1 (single shooting has no segment states)",
            "pass Shooting(segments=S) with S ≥ 2, or drop states0",
        )
    if is_joint(model):
        kind, shapes = JointState, ((k, model.nq), (k, model.nv))
        want = f"an rbjax.JointState with qpos {shapes[0]} and qvel {shapes[1]}"
    else:
        kind, shapes = State, ((k, model.nb, 7), (k, model.nb, 7))
        want = f"an rbjax.State with q and u of shape {shapes[0]}"
    got = tuple(np.shape(a) for a in arrays(guesses)) if isinstance(guesses, kind) else None
    if got != shapes:
        fail(
            "Shooting.states0",
            f"<{type(guesses).__name__} shapes {got}>",
            f"is not {want} (one state per sample time)",
            "pass guesses of the state at every sample time, e.g. estimated from the "
            "measurements; the segment starts take theirs",
        )
    q, u = (np.asarray(a, np.float64) for a in arrays(guesses))
    rows = np.asarray([c[0] for c in np.array_split(np.arange(k), n_seg)[1:]])
    q, u = q[rows], u[rows]
    if not (np.all(np.isfinite(q)) and np.all(np.isfinite(u))):
        fail(
            "Shooting.states0",
            "<State>",
            "is not finite at the first sample of a segment",
            "give finite guesses at least at the segment starts",
        )
    return like(guesses, jnp.asarray(data.times[rows]), jnp.asarray(q), jnp.asarray(u))


def set_segment_starts(problem: Problem, seg: dict, model, idx: np.ndarray, states):
    """Initialise the start variables of segments ``idx`` (0 = the start of segment 1) to
    ``states`` (concrete, leading axis len(idx)). Mechanisms of rigid bodies: the states are
    assembled (rbjax.assemble, with the model of params0) and become the references, with
    the tangent basis there and zero coordinates. Otherwise: position, velocities and the
    attitude as the reference (normalised; log-scale and ν for scalable bodies)."""
    seg = dict(seg)
    q, u = (np.asarray(a, np.float64) for a in arrays(states))
    if is_joint(model):  # the references: the states, quaternions normalised
        assert problem.ref_q is not None and problem.ref_u is not None
        dtype = problem.ref_q.dtype
        st = assemble(model, JointState(jnp.zeros(len(idx), dtype), q, u))
        new = (
            problem.ref_q.at[idx].set(jnp.asarray(st.qpos, dtype)),
            problem.ref_u.at[idx].set(jnp.asarray(st.qvel, dtype)),
        )
        problem = eqx.tree_at(lambda p: (p.ref_q, p.ref_u), problem, new)
        seg["dq"] = seg["dq"].at[idx].set(0.0)
        seg["du"] = seg["du"].at[idx].set(0.0)
        return problem, seg
    if problem.basis is not None:
        assert problem.ref_q is not None and problem.ref_u is not None
        dtype = problem.ref_q.dtype
        t = np.asarray(problem.t_start)[1:][idx]
        st = assemble(
            model, State(t=jnp.asarray(t, dtype), q=jnp.asarray(q, dtype), u=jnp.asarray(u, dtype))
        )
        sq, su = np.asarray(st.q), np.asarray(st.u)
        dof = problem.basis.shape[-1]
        basis = np.stack(
            [
                _tangent_basis(model, State(t=jnp.asarray(t[k], dtype), q=sq[k], u=su[k]), dof)
                for k in range(len(idx))
            ]
        )
        new = (
            problem.ref_q.at[idx].set(sq),
            problem.ref_u.at[idx].set(su),
            problem.basis.at[idx].set(basis),
        )
        problem = eqx.tree_at(lambda p: (p.ref_q, p.ref_u, p.basis), problem, new)
        seg["dq"] = seg["dq"].at[idx].set(0.0)
        seg["du"] = seg["du"].at[idx].set(0.0)
        return problem, seg
    assert problem.a_ref is not None
    seg["r"] = seg["r"].at[idx].set(q[..., 0:3])
    seg["v"] = seg["v"].at[idx].set(u[..., 0:3])
    seg["omega"] = seg["omega"].at[idx].set(u[..., 4:7])
    seg["rotation"] = seg["rotation"].at[idx].set(0.0)
    a = q[..., 3:7]
    s2 = np.sum(a**2, axis=-1)
    if "log_scale" in seg:
        seg["log_scale"] = seg["log_scale"].at[idx].set(0.5 * np.log(s2))
        seg["nu"] = seg["nu"].at[idx].set(u[..., 3])
    a = a / np.sqrt(s2)[..., None]
    problem = eqx.tree_at(lambda p: p.a_ref, problem, problem.a_ref.at[idx].set(a))
    return problem, seg
