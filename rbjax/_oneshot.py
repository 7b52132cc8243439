"""``one_shot_jit``: compiling the analyses that run once (assembly, kinematic analysis, the
pre-rollout checks, mobility) for compile time rather than run time.

Their compile time dominates their run time, and XLA's backend optimisation halves it
(3.7 s → 1.8 s for the slider-crank checks on 2 cores). JAX accepts compiler options only on a
top-level ``jit``, so a call whose arguments are all concrete is evaluated right away under
``jax.ensure_compile_time_eval`` (top level even inside an outer trace: its result is a
constant there anyway), and a call with traced arguments (under ``grad``, ``vmap``, ``jit``)
uses the plain compiled version, which the outer transformation then traces through.
"""

from __future__ import annotations

import functools

import equinox as eqx
import jax

from ._errors import is_concrete

_OPTIONS = {"xla_backend_optimization_level": 0}


def one_shot_jit(fn):
    """``eqx.filter_jit(fn)`` compiled with backend optimisation off when every argument is
    concrete; the plain ``eqx.filter_jit(fn)`` when any is traced."""
    fast = eqx.filter_jit(fn, compiler_options=_OPTIONS)  # pyright: ignore[reportCallIssue]
    plain = eqx.filter_jit(fn)

    @functools.wraps(fn)
    def call(*args):
        if not is_concrete(args):
            return plain(*args)
        with jax.ensure_compile_time_eval():
            return fast(*args)

    return call
