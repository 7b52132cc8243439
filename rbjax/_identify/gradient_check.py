"""What :func:`rbjax.identify` does when the objective is finite but its gradient is not:
stop instead of passing NaN to the optimiser, with the diagnosis of
:func:`rbjax.nonfinite_gradient` run on the offending parameters.

A NaN in the gradient (or the Jacobian) of the identification's loss comes from a function
with an infinite derivative evaluated at its singular point (``jnp.sqrt`` at 0 in a user
force, say, at a state the motion reaches); forward mode (the Jacobian J = ∂r/∂θ) and reverse
mode meet it alike, as 0·∞. The diagnosis replays reverse mode on the identification's own
integration grid (rbjax/_identify/problem.py: each sample interval split into equal steps):
first the derivative of the loss with respect to every simulated state (non-finite there: an
observation function is to blame, named), then the backward pass step by step through each
segment (rbjax/_analysis/nonfinite.py :func:`replay_steps`: the step, the state components
and the forces are named); if both are finite, the derivative of ``build(params)`` (or of a
parameter an observation reads directly) is.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._analysis.nonfinite import (
    NonfiniteGradient,
    NonfiniteGradientError,
    _bad_forces,
    _components,
    replay_steps,
)
from .._gradient_guard import SAFE_WHERE, all_finite
from .._state import State
from .joint import dtype_of, is_joint
from .problem import Problem, leaf_names, observe, simulate, unravel

NONFINITE = ("raise", "result")  # the values of identify(nonfinite=...)


class NonfiniteIterate(Exception):
    """Raised by a solver when it accepts an iterate whose loss is finite and whose gradient
    or Jacobian is not (caught by :func:`rbjax.identify`)."""

    def __init__(self, it, step: int, history: list):
        super().__init__(f"non-finite gradient at optimiser step {step}")
        self.it, self.step, self.history = it, step, history


def gradient_finite(it) -> bool:
    """Whether an evaluated point's gradient (and Jacobian, when formed) is finite."""
    jac = it.payload[1]
    return bool(np.all(np.isfinite(it.g)) and (jac is None or np.all(np.isfinite(jac))))


@eqx.filter_jit
def _sensitivities(problem: Problem, template, flat):
    """Every simulated state and the derivative of ½‖r‖² with respect to each, and per
    observation whether the derivative of its own residuals is finite."""
    params, model, init, rest, qs, us, ok = simulate(problem, unravel(template, flat))
    r, pull = jax.vjp(lambda a, b: observe(problem, params, model, init, rest, a, b, ok)[0], qs, us)
    gq, gu = pull(r)
    finite, off = [], 0
    for o in problem.observations:
        rows = o.values.shape[0] * o.dim
        sel = jnp.zeros_like(r).at[off : off + rows].set(r[off : off + rows])
        finite.append(all_finite(pull(sel)))
        off += rows
    return model, init, qs, us, gq, gu, jnp.stack(finite)


def diagnose(problem: Problem, template, flat: np.ndarray) -> NonfiniteGradient:
    """Where the gradient of ½‖r‖² turns non-finite at the parameters ``flat`` (module
    docstring)."""
    model, init, qs, us, gq, gu, finite_obs = _sensitivities(problem, template, jnp.asarray(flat))
    gq, gu = np.asarray(gq), np.asarray(gu)
    n_seg, width = qs.shape[0], qs.shape[1]
    dtype = dtype_of(init)
    joint = is_joint(model)
    components = _coordinates if joint else _components
    times = np.concatenate(
        [np.asarray(init.t)[:, None], np.asarray(problem.ts, dtype)], axis=1
    )  # (S, n + 1): the time of every simulated state
    tail = tuple(range(2, gq.ndim))
    bad = ~(np.isfinite(gq).all(axis=tail) & np.isfinite(gu).all(axis=tail))  # (S, n + 1)
    if bad.any():
        s, k = (int(i) for i in np.argwhere(bad)[0])
        where = components(model, "q", gq[s, k]) + components(model, "u", gu[s, k])
        culprit = "the continuity equations of the shooting segments"
        for i, ok in enumerate(np.asarray(finite_obs)):
            if not ok:
                o = problem.observations[i]
                culprit = f"Measurements.observations[{i}] ({type(o).__name__})"
                break
        what = (
            f"the derivative of the residuals of {culprit} with respect to the state at "
            f"t = {times[s, k]:.6g} s{_segment(s, n_seg)}"
        )
        return _make(-1, float(times[s, k]), k, where, (), what)

    hs = np.asarray(problem.hs, dtype)
    for s in range(n_seg if width > 1 else 0):
        found = replay_steps(
            model,
            problem.integrator,
            jnp.asarray(times[s, :-1]),
            qs[s],
            us[s],
            jnp.asarray(hs[s]),
            jnp.asarray(gq[s]),
            jnp.asarray(gu[s]),
            **joint_replay if joint else {},
        )
        if found is None:
            continue
        k, where = found
        t_k = jnp.asarray(times[s, k], dtype)
        forces = () if joint else _bad_forces(model, t_k, State(t=t_k, q=qs[s, k], u=us[s, k]))
        what = (
            f"the backward pass of simulation step {k} (from t = {float(t_k):.6g} s)"
            f"{_segment(s, n_seg)}"
        )
        return _make(k, float(t_k), k, where, forces, what)

    # simulation and observations are finite: build(params) or a parameter read directly
    def loss(v):
        return 0.5 * jnp.sum(observe(problem, *simulate(problem, unravel(template, v)))[0] ** 2)

    grad = np.asarray(jax.grad(loss)(jnp.asarray(flat)))
    names = leaf_names(template)
    where = [n for n, g in zip(names, grad, strict=True) if not np.isfinite(g)][:6]
    what = (
        "the derivative of build(params) (the map from the parameters to the model and the "
        "initial state), of the segment start states, or of a parameter an observation reads "
        "directly (the simulation's backward pass and the observations' derivatives with "
        "respect to the states are finite)"
    )
    return _make(-1, float(times[0, 0]), -1, where, (), what)


def _coordinates(model, name, arr) -> list[str]:
    """The non-finite entries of a JointModel's qpos (``name`` "q") or qvel ("u") cotangent,
    named by joint: "qpos[3] (joint 'elbow')"."""
    topo = model.topology
    adr = topo.qposadr if name == "q" else topo.dofadr
    label = "qpos" if name == "q" else "qvel"
    out = []
    for i in np.flatnonzero(~np.isfinite(np.asarray(arr)))[:6]:
        j = int(np.searchsorted(np.asarray(adr), i, side="right")) - 1
        out.append(f"{label}[{int(i)}] (joint {topo.joint_names[j]!r})")
    return out


@eqx.filter_jit
def _joint_backward(model, integrator, t, q, u, h, gq, gu):
    dyn, static = eqx.partition(model, eqx.is_inexact_array)

    def one(d, t, q, u, h):
        m = eqx.combine(d, static)
        _, q1, u1, _ = integrator._engine_step(m, t[None], q[:, None], u[:, None], h)
        return q1[:, 0], u1[:, 0]

    def back(carry, k):
        cq, cu = carry
        _, pull = jax.vjp(lambda d, qq, uu: one(d, t[k], qq, uu, h[k]), dyn, q[k], u[k])
        cd, bq, bu = pull((cq, cu))
        ok_in = jnp.all(jnp.isfinite(cq)) & jnp.all(jnp.isfinite(cu))
        ok_state = jnp.all(jnp.isfinite(bq)) & jnp.all(jnp.isfinite(bu))
        ok_model = jax.tree.map(lambda x: jnp.all(jnp.isfinite(x)), cd)
        return (bq + gq[k], bu + gu[k]), (ok_in, ok_state, ok_model, bq, bu)

    n = q.shape[0] - 1
    ks = jnp.arange(n - 1, -1, -1)
    _, out = jax.lax.scan(back, (gq[n], gu[n]), ks)
    return (ks, *out)


def _segment(s: int, n_seg: int) -> str:
    return f" in shooting segment {s}" if n_seg > 1 else ""


def _make(step, time, saved, where, forces, what) -> NonfiniteGradient:
    parts = f" in {', '.join(where)}" if where else ""
    culprits = f"; non-finite in the backward pass of {', '.join(forces)}" if forces else ""
    message = (
        f"{what} turned finite cotangents into non-finite ones{parts}{culprits}. Fix: {SAFE_WHERE}."
    )
    return NonfiniteGradient(step, time, saved, tuple(where), tuple(forces), message)


def nonfinite_error(
    problem: Problem, template, it, step: int, *, raising: bool
) -> NonfiniteGradientError:
    """The error of a finite loss with a non-finite gradient at the evaluated point ``it``
    (optimiser step ``step``; 0: the initial guess), with the diagnosis; ``raising``: the
    message says how to get the result instead."""
    diagnosis = diagnose(problem, template, it.flat)
    g = np.asarray(it.g)
    jac = it.payload[1]
    col = ~np.isfinite(g) if jac is None else ~np.all(np.isfinite(jac), axis=0) | ~np.isfinite(g)
    names = leaf_names(template[0]) + [f"segments{n}" for n in leaf_names(template[1])]
    bad = [n for n, b in zip(names, col, strict=True) if b][:6]
    at = "the initial guess params0" if step == 0 else f"optimiser step {step}"
    instead = (
        " (identify(..., nonfinite='result') returns the result with this diagnosis instead)"
        if raising
        else ""
    )
    message = (
        f"rbjax.identify: the loss is finite ({it.f:.6g}) but its gradient is not at {at} "
        f"(non-finite with respect to {', '.join(bad) or 'the parameters'}); stopped instead "
        f"of passing it to the optimiser{instead}. Where it turns non-finite: "
        f"{diagnosis.message}"
    )
    return NonfiniteGradientError(message, diagnosis)


# The replay of rbjax/_analysis/nonfinite.py on joint coordinates: their backward scan and the
# names of their coordinates ("qpos[k] (joint 'name')").
joint_replay = {"backward": _joint_backward, "components": _coordinates}
