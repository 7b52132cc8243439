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
a custom VJP. The checks cannot name the step inside the compiled backward pass (equinox's
error messages are static); :func:`rbjax.nonfinite_gradient` replays it step by step and does.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

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
