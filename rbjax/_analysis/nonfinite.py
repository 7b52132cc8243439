"""Where a rollout's gradient turns non-finite: the backward pass replayed step by step.

A NaN in ``jax.grad`` of a rollout's loss is almost always a function with an infinite
derivative evaluated at its singular point inside a user force or constraint: ``jnp.sqrt``
at 0, ``jnp.linalg.norm`` of a zero vector, ``x / |x|``, ``arccos`` at ±1. Its value is finite,
so the forward pass looks fine; in the backward pass ∞ · 0 = NaN, and the NaN then spreads to
every earlier cotangent, so the final gradient says nothing about where it came from.

:func:`nonfinite_gradient` finds it. Reverse mode of a rollout is the chain
c_k = ∂L/∂x_k + (∂x_{k+1}/∂x_k)ᵀ c_{k+1} (x_k = (q, u) of the k-th state; the adjoint
recursion of discrete reverse-mode differentiation; Griewank & Walther, *Evaluating
Derivatives*, 2nd ed., §3.2); it is run here one step at a time (``jax.vjp`` of the step),
and the first step, in backward order, that turns a finite cotangent into a non-finite one
is named, with the forces whose own backward pass is non-finite at that state.

The safe pattern for a user force: keep the singular point out of BOTH branches of a
``jnp.where`` (JAX differentiates both branches), e.g. for a norm::

    r2 = jnp.sum(x * x)
    safe = jnp.where(r2 > 0, r2, 1.0)
    norm = jnp.where(r2 > 0, jnp.sqrt(safe), 0.0)

The same replay runs on any list of steps (:func:`replay_steps`: per-step times and sizes),
which is how :func:`rbjax.identify` diagnoses a non-finite gradient of its objective before it
raises :class:`NonfiniteGradientError` (rbjax/_identify/gradient_check.py).
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._errors import validates_inputs
from .._gradient_guard import SAFE_WHERE
from .._integrators import RK4, AbstractIntegrator
from .._model import Model, require_model
from .._results import RESULTS
from .._rollout import Trajectory, rollout
from .._state import State
from .._tree.model import maximal_only


class NonfiniteGradientError(ValueError):
    """Raised instead of returning a non-finite gradient to an optimiser (by
    :func:`rbjax.identify` with ``nonfinite="raise"``, the default). A ValueError whose message
    says where the gradient turned non-finite and ends with the fix; ``diagnosis`` is the
    :class:`NonfiniteGradient` of the replayed backward pass at the offending parameters."""

    def __init__(self, message: str, diagnosis: NonfiniteGradient):
        super().__init__(message)
        self.diagnosis = diagnosis


@dataclasses.dataclass(frozen=True)
class NonfiniteGradient:
    """Where the backward pass of a rollout first produced a non-finite cotangent.

    ``step``: the step whose backward pass turned finite cotangents into non-finite ones
    (−1: the loss's own derivative with respect to a saved state is non-finite; then
    ``saved_index`` says which); ``time`` [s] the step's start; ``where``: the non-finite
    components ("q[body, k]" / "u[body, k]" of the state before the step, or model leaves);
    ``forces``: the model forces whose backward pass is non-finite at that state (index and
    type); ``message``: all of this with the fix.
    """

    step: int
    time: float
    saved_index: int
    where: tuple[str, ...]
    forces: tuple[str, ...]
    message: str

    def __str__(self) -> str:
        return self.message


def _components(model, name, arr) -> list[str]:
    bad = np.argwhere(~np.isfinite(np.asarray(arr)))
    return [f"{name}[{model.names[b]!r}, {k}]" for b, k in bad[:6]]


def _leaf_names(tree, finite) -> list[str]:
    paths = jax.tree_util.tree_flatten_with_path(tree)[0]
    return [
        "model" + jax.tree_util.keystr(p)
        for (p, _), ok in zip(paths, jax.tree.leaves(finite), strict=True)
        if not ok
    ]


@validates_inputs
def nonfinite_gradient(
    model: Model,
    state0: State,
    dt,
    n_steps: int,
    loss,
    *,
    integrator: AbstractIntegrator | None = None,
) -> NonfiniteGradient | None:
    """Replay the backward pass of ``loss(rollout(model, state0, dt, n_steps))`` step by step
    and return where it first turns non-finite (:class:`NonfiniteGradient`), or None when the
    gradient with respect to the initial state and every floating-point model leaf is finite.

    ``loss(traj) -> scalar`` takes the :class:`rbjax.Trajectory` of every step (save_every=1).
    ONE system (no batch axes); the rollout must succeed. Costs one rollout plus one ``vjp``
    per step; a debugging tool, not for a training loop (module docstring: the safe-where
    pattern for user forces).
    """
    maximal_only(model, "rbjax.nonfinite_gradient")
    require_model(model)
    integrator = RK4() if integrator is None else integrator
    if state0.q.ndim != 2 or model.mass.ndim != 1:
        raise ValueError(
            "nonfinite_gradient: state0 and the model must describe ONE system (q of shape "
            f"(nb, 7), mass (nb,)); got q {state0.q.shape}, mass {model.mass.shape}. Fix: pick "
            "the batch member whose gradient is not finite (x[i] on every batched leaf)."
        )
    traj = rollout(model, state0, dt, n_steps, integrator=integrator, throw=False)
    if int(traj.result) != int(RESULTS.successful):
        raise ValueError(
            f"nonfinite_gradient: the rollout itself failed ({RESULTS(int(traj.result)).message} "
            f"at step {int(traj.failed_step)}). Fix: make the forward run succeed first."
        )
    return _replay(model, traj, dt, integrator, loss)


def _replay(model, traj: Trajectory, dt, integrator, loss):
    def total(q, u):
        return loss(_with(traj, q, u))

    gq, gu = jax.grad(total, argnums=(0, 1))(traj.q, traj.u)
    finite_loss = np.isfinite(np.asarray(gq)).all(axis=(1, 2)) & np.isfinite(np.asarray(gu)).all(
        axis=(1, 2)
    )
    if not finite_loss.all():
        k = int(np.flatnonzero(~finite_loss)[-1])
        where = _components(model, "q", gq[k]) + _components(model, "u", gu[k])
        return _report(model, traj.t, -1, k, where, (), "the loss's own derivative")
    n = traj.q.shape[0] - 1
    h = jnp.full((n,), dt, traj.q.dtype)
    found = replay_steps(model, integrator, traj.t[:-1], traj.q, traj.u, h, gq, gu)
    if found is None:
        return None
    k, where = found
    forces = _bad_forces(model, traj.t[k], traj[k])
    return _report(model, traj.t, k, k, where, forces, f"step {k}")


def replay_steps(model, integrator, t, q, u, h, gq, gu, *, backward=None, components=None):
    """The backward pass of n steps replayed one at a time: step k advances the state
    (t[k], q[k], u[k]) by h[k] (t (n,), h (n,); q, u (n + 1, nb, 7) ONE system's states),
    and (gq, gu) (n + 1, nb, 7) is the loss's derivative with respect to each state. Returns
    None, or (k, where): the first step, in backward order, whose backward pass turned finite
    cotangents into non-finite ones, and the non-finite components ("q[body, k]", "u[body,
    k]" of the state before it, or model leaves).

    ``backward`` and ``components`` (default: this module's, for maximal coordinates) are the
    formulation's scan and namer of state components (a JointModel's:
    rbjax/_identify/gradient_check.py)."""
    backward = _backward if backward is None else backward
    components = _components if components is None else components
    n = q.shape[0] - 1
    if n == 0:
        return None
    ks, ok_in, ok_state, ok_model, bq, bu = backward(model, integrator, t, q, u, h, gq, gu)
    ok_in, ok_state = np.asarray(ok_in), np.asarray(ok_state)
    ok_all_model = np.all(np.stack([np.asarray(x) for x in jax.tree.leaves(ok_model)]), axis=0)
    turned = ok_in & ~(ok_state & ok_all_model)
    if not turned.any():
        return None
    i = int(np.flatnonzero(turned)[0])  # backward order: the latest step first
    where = components(model, "q", bq[i]) + components(model, "u", bu[i])
    dyn = eqx.filter(model, eqx.is_inexact_array)
    where += _leaf_names(dyn, jax.tree.map(lambda x: bool(np.asarray(x)[i]), ok_model))
    return int(ks[i]), where


@eqx.filter_jit
def _backward(model, integrator, t, q, u, h, gq, gu):
    """The scan of :func:`replay_steps` (one compiled program per model structure and step
    count): per step in backward order, whether its incoming cotangent, its state cotangent
    and each model leaf's cotangent are finite, and the state cotangents."""
    dyn, static = eqx.partition(model, eqx.is_inexact_array)

    def one(d, t, q, u, h):
        m = eqx.combine(d, static)
        out = integrator.step(m, State(t=t, q=q, u=u), h)
        return out.q, out.u

    def back(carry, k):
        cq, cu = carry
        _, pull = jax.vjp(lambda d, qq, uu: one(d, t[k], qq, uu, h[k]), dyn, q[k], u[k])
        cd, bq, bu = pull((cq, cu))
        ok_in = jnp.all(jnp.isfinite(cq)) & jnp.all(jnp.isfinite(cu))
        ok_state = jnp.all(jnp.isfinite(bq)) & jnp.all(jnp.isfinite(bu))
        ok_model = jax.tree.map(lambda x: jnp.all(jnp.isfinite(x)), cd)
        new = (bq + gq[k], bu + gu[k])
        return new, (ok_in, ok_state, ok_model, bq, bu)

    n = q.shape[0] - 1
    ks = jnp.arange(n - 1, -1, -1)
    _, out = jax.lax.scan(back, (gq[n], gu[n]), ks)
    return (ks, *out)


def _with(traj: Trajectory, q, u) -> Trajectory:
    return eqx.tree_at(lambda tr: (tr.q, tr.u), traj, (q, u))


def _bad_forces(model, t, state: State) -> tuple[str, ...]:
    """Forces whose own backward pass (of their wrench) is non-finite at ``state`` (ONE
    system) and time ``t``."""
    bad = []
    for i, f in enumerate(model.forces):

        def w(q, u, f=f):
            out = f.wrench(model, t, State(t=t, q=q, u=u))
            return jax.tree.map(jnp.sum, out)

        val, pull = jax.vjp(w, state.q, state.u)
        grads = pull(jax.tree.map(jnp.ones_like, val))
        if not all(bool(jnp.all(jnp.isfinite(g))) for g in grads):
            bad.append(f"forces[{i}] ({type(f).__name__})")
    return tuple(bad)


def _report(model, times, step, saved, where, forces, what) -> NonfiniteGradient:
    time = float(times[max(step, 0)]) if step >= 0 else float(times[saved])
    at = (
        f"the derivative of the loss with respect to saved state {saved} (t = {time:.6g} s)"
        if step < 0
        else f"the backward pass of step {step} (from t = {time:.6g} s)"
    )
    parts = f" in {', '.join(where)}" if where else ""
    culprits = f"; non-finite in the backward pass of {', '.join(forces)}" if forces else ""
    message = (
        f"rbjax.nonfinite_gradient: {at} turned finite cotangents into non-finite ones"
        f"{parts}{culprits} ({what}). Fix: {SAFE_WHERE}."
    )
    return NonfiniteGradient(step, time, saved, tuple(where), forces, message)
