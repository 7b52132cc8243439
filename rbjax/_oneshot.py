"""``one_shot_jit``: compiling the analyses that run once (assembly, kinematic analysis, the
pre-rollout checks, mobility) for compile time rather than run time.

The same for the programs that run once per rollout or per run file: the plausibility
monitors (rbjax/_engine/monitors.py) and the command line's derived quantities. Their compile
time dominates their run time: XLA's backend optimisation off halves it (3.7 s → 1.8 s for the
slider-crank checks on 2 cores), the older loop emitters cut it again (the monitors' program:
1.1 → 0.25 s for the double pendulum, 1.8 → 0.4 s for arm7; the run file's quantities of arm7
2.3-3.0 → 1.2-1.4 s with tracing). XLA does not reassociate floating point on CPU either way;
results may differ from the default options' in the last bit (1e-16 relative on arm7's energy). JAX accepts compiler options only on a
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

CHEAP = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}


def one_shot_jit(fn):
    """``eqx.filter_jit(fn)`` compiled with the :data:`CHEAP` XLA options when every argument
    is concrete; the plain ``eqx.filter_jit(fn)`` when any is traced (JAX takes no options for
    a program inside a caller's transformation)."""
    fast = eqx.filter_jit(fn, compiler_options=CHEAP)  # pyright: ignore[reportCallIssue]
    plain = eqx.filter_jit(fn)

    @functools.wraps(fn)
    def call(*args):
        if not is_concrete(args):
            return plain(*args)
        with jax.ensure_compile_time_eval():
            return fast(*args)

    return call
