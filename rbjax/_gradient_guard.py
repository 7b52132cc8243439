"""Reverse-mode guards that stop a non-finite gradient at the rollout it comes from:
``rollout(..., check_gradients=True)``.

A NaN in ``jax.grad`` of a loss of a rollout is born where a function with an infinite
derivative is evaluated at its singular point (``jnp.sqrt`` at 0, the norm of a zero vector):
in the loss itself, or in a force or constraint inside the rollout's backward pass, from
where it spreads to every earlier step (rbjax/_analysis/nonfinite.py). Two identity
functions with a custom VJP bracket the rollout, so that the backward pass checks the
cotangents at both ends (``eqx.error_if``, raised under ``jax.jit`` and ``jax.vmap`` too):

* on the trajectory (the first backward step): the cotangent the loss sends into the
  trajectory; non-finite there means the loss's own derivative is not finite;
* on the initial state and the model's floating-point leaves (the last backward step):
  non-finite there, from a finite cotangent of the trajectory, means the rollout's own backward
  pass produced it (a force, a constraint or the dynamics).

Reverse mode only (``jax.grad``, ``jax.vjp``, ``jax.jacrev``): JAX does not forward-differentiate
a custom VJP. For maximal coordinates the checks do not name the step inside the compiled
backward pass; :func:`rbjax.nonfinite_gradient` replays it step by step and does. A
:class:`rbjax.JointModel`'s rollout names it in the program: :class:`GuardedSteps` wraps the
integrator's step in a third identity-like custom VJP, which checks the adjoint recursion
c_k = (∂x_{k+1}/∂x_k)ᵀ c_{k+1} (Griewank & Walther, *Evaluating Derivatives*, 2nd ed.,
§3.2) at every step: the first step, in backward order, that turns a finite cotangent of
the state after it into a non-finite one (with respect to the state before it, the model
or dt) raises with its index. equinox's messages are static, so the index selects one of
at most :data:`MESSAGES` messages (``eqx.branched_error_if``): each names one step for a
rollout of up to that many steps, a range of steps beyond.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from ._errors import is_concrete

SAFE_WHERE = (
    "look for a function with an infinite derivative at a point the motion reaches (sqrt at "
    "0, the norm of a zero vector, x/|x|, arccos at ±1) in a user force, constraint or loss, "
    "and keep that point out of both branches of a jnp.where: r2 = jnp.sum(x * x); "
    "safe = jnp.where(r2 > 0, r2, 1.0); norm = jnp.where(r2 > 0, jnp.sqrt(safe), 0.0)"
)

_FROM_LOSS = (
    "rbjax.rollout(check_gradients=True): the derivative of the loss with respect to the "
    "trajectory is not finite (the NaN or inf comes from the loss, not from the rollout). "
    f"Fix: {SAFE_WHERE}."
)
_FROM_ROLLOUT = (
    "rbjax.rollout(check_gradients=True): the backward pass of the rollout turned finite "
    "cotangents of its trajectory into a non-finite gradient with respect to the initial "
    "state or the model. rbjax.nonfinite_gradient(model, state0, dt, n_steps, loss) names the "
    f"step, the state components and the forces. Fix: {SAFE_WHERE}."
)


def all_finite(tree):
    """One boolean: every leaf of ``tree`` is finite everywhere."""
    out = jnp.asarray(True)
    for leaf in jax.tree.leaves(tree):
        out = out & jnp.all(jnp.isfinite(leaf))
    return out


def _guard(message: str):
    @jax.custom_vjp
    def identity(x):
        return x

    def fwd(x):
        return x, None

    def bwd(_, ct):
        return (eqx.error_if(ct, ~all_finite(ct), message),)

    identity.defvjp(fwd, bwd)
    return identity


_check_loss = _guard(_FROM_LOSS)
_check_rollout = _guard(_FROM_ROLLOUT)


def _traced_float(x) -> bool:
    return eqx.is_inexact_array(x) and not is_concrete(x)


def _apply(check, tree):
    # Only traced leaves: a concrete one has no gradient to check, and passing it through
    # the guard would turn a constant of the compiled program into a computed value (for a
    # free body differentiated with respect to its initial spin, that cost 25 % of the
    # gradient's run time, measured; with concrete leaves left alone, nothing measurable).
    dyn, static = eqx.partition(tree, _traced_float)
    return eqx.combine(check(dyn), static)


def guard_inputs(tree):
    """Identity on ``tree`` (e.g. (model, state0)); in the backward pass, raises when the
    gradient with respect to its floating-point leaves is not finite."""
    return _apply(_check_rollout, tree)


def guard_output(tree):
    """Identity on ``tree`` (a Trajectory); in the backward pass, raises when the cotangent
    it receives is not finite."""
    return _apply(_check_loss, tree)


MESSAGES = 1000
"""The most step messages a :class:`GuardedSteps` carries (beyond: one per range of steps)."""


def step_messages(n_steps: int) -> tuple[tuple[str, ...], int]:
    """The messages of :class:`GuardedSteps` for a rollout of ``n_steps`` steps, and the
    number of steps each one covers."""
    per = max(1, math.ceil(n_steps / MESSAGES))
    msgs = []
    for i in range(math.ceil(n_steps / per)):
        first, last = i * per, min((i + 1) * per, n_steps) - 1
        which = f"step {first}" if first == last else f"one of steps {first} to {last}"
        msgs.append(
            f"rbjax.rollout(check_gradients=True): the backward pass of {which} (of "
            f"{n_steps}; step k advances t0 + k·dt by dt) turned finite cotangents of the state "
            "after it into a non-finite gradient with respect to the state before it, the "
            "model or dt: a force, an equality or the dynamics has an infinite derivative at "
            f"that state (a user force of model.forces first). Fix: {SAFE_WHERE}."
        )
    return tuple(msgs), per


class GuardedSteps(eqx.Module):
    """An integrator whose every step checks, in reverse mode, that its backward pass keeps a
    finite cotangent finite (module docstring), raising with the step's index:
    ``rollout(JointModel, ..., check_gradients=True)``.

    ``inner`` the integrator (its ``_engine_step`` is what runs, unchanged in the forward
    pass); ``t0`` the start time (a scalar, or (*batch,) when systems start at different
    times): step k begins at t0 + k·h, the index the backward pass reads; ``n_steps`` the
    rollout's steps (the messages).

    Cost: one finiteness reduction and one branch per step of the backward pass; measured
    on the double pendulum in joint coordinates (``jax.jit(jax.value_and_grad)`` with
    respect to the masses, 2000 RK4 steps, median of 15 interleaved runs on 2 loaded
    cores): 1.39 → 1.73 s, 8281 → 9407 lines of HLO, compile time unchanged within noise
    (43 s both). A debugging switch, off by default."""

    inner: Any
    t0: Float[Array, "..."]
    n_steps: int = eqx.field(static=True)

    def _engine_step(self, model, t, q, u, h):
        dyn, static = eqx.partition((model, self.inner), eqx.is_inexact_array)
        msgs, per = step_messages(self.n_steps)

        def step(d, t, q, u, h):
            m, integrator = eqx.combine(d, static)
            t1, q1, u1, ok = integrator._engine_step(m, t, q, u, h)
            return (t1, q1, u1), ok

        t0 = jnp.reshape(
            jnp.asarray(self.t0, t.dtype), jnp.shape(self.t0) + (1,) * (t.ndim - jnp.ndim(self.t0))
        )
        out, ok = _checked_step(step, msgs, per)(dyn, t, q, u, h, t0)
        return (*out, ok)


def _checked_step(step: Callable, msgs: tuple[str, ...], per: int):
    """``step`` (d, t, q, u, h) -> ((t1, q1, u1), ok) with a backward pass that raises
    ``msgs[k // per]`` when it turns a finite cotangent non-finite at step k = (t − t0)/h."""

    @jax.custom_vjp
    def checked(d, t, q, u, h, t0):
        return step(d, t, q, u, h)

    def fwd(d, t, q, u, h, t0):
        out, pull, ok = jax.vjp(step, d, t, q, u, h, has_aux=True)
        return (out, ok), (pull, t, h, t0)

    def bwd(res, ct):
        pull, t, h, t0 = res
        ct_out = ct[0]
        cts = pull(ct_out)
        bad = all_finite(ct_out) & ~all_finite(cts)
        k = jnp.max(jnp.round((t - t0) / h)).astype(jnp.int32)
        index = jnp.clip(k // per, 0, len(msgs) - 1)
        cts = eqx.branched_error_if(cts, bad, index, msgs)
        return (*cts, jnp.zeros_like(t0))

    checked.defvjp(fwd, bwd)
    return checked
