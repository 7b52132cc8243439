"""What a Monte-Carlo sampler varies: which leaves of its ``(model, state)`` depend on the sample.

The runner evaluates ``sample(key_i, i)`` for a whole chunk under ``jax.vmap``; leaves that do
not depend on ``(key_i, i)`` (a joint's geometry that every sample shares, the gravity vector)
are kept unbatched, so the batched rollout sees exactly the parameters that vary, in the
engine's batched layout. Dependence is read from the sampler's jaxpr: an output depends on the
inputs when some equation on its path reads them (nested jaxprs are treated as one equation,
which can only over-approximate).
"""

from __future__ import annotations

import equinox as eqx
import jax


def dependent_leaves(fn, *args) -> list[bool]:
    """For each array leaf of ``fn(*args)`` (``eqx.is_array`` leaves, in ``jax.tree.leaves``
    order), whether it depends on ``args``."""

    def arrays(*a):
        return jax.tree.leaves(eqx.filter(fn(*a), eqx.is_array))

    closed = jax.make_jaxpr(arrays)(*args)
    jaxpr = closed.jaxpr
    dep = {v for v in jaxpr.invars}
    for eqn in jaxpr.eqns:
        if any(_is_var(v) and v in dep for v in eqn.invars):
            dep.update(eqn.outvars)
    return [_is_var(v) and v in dep for v in jaxpr.outvars]


def _is_var(v) -> bool:
    return not hasattr(v, "val")  # jaxpr Literals carry .val; Vars do not
