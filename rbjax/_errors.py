"""Build-time validation helpers: every user mistake becomes a ValueError naming field and fix."""

from __future__ import annotations

import jax
import numpy as np
from jax import core as jax_core


def validates_inputs(obj):
    """Mark a public entry point whose body validates its arguments with rbjax's ValueErrors
    (naming the field, the value and the fix) as skipped by RUNTIME type checkers.

    The test suite runs with jaxtyping's import hook and beartype on every rbjax function; on
    these entry points a generic type error would pre-empt rbjax's own message, which says what
    to change. Static checkers (pyright) still read the annotations: this sets the
    ``__no_type_check__`` attribute that beartype honours, without ``typing.no_type_check``.
    """
    obj.__no_type_check__ = True
    if isinstance(obj, type):  # and its own methods (a hand-written __init__), as typing does
        for member in vars(obj).values():
            fn = getattr(member, "__func__", member)
            if callable(fn) and hasattr(fn, "__dict__"):
                fn.__no_type_check__ = True
    return obj


def is_concrete(x) -> bool:
    """True when ``x`` holds values we can check now (not a tracer inside jit/vmap/grad)."""
    leaves = jax.tree_util.tree_leaves(x)
    return all(not isinstance(leaf, jax_core.Tracer) for leaf in leaves)


def fail(field: str, value, problem: str, fix: str):
    raise ValueError(f"{field} = {_short(value)} {problem}. Fix: {fix}")


def _short(value) -> str:
    try:
        arr = np.asarray(value)
        if arr.size > 12:
            return f"<array shape {arr.shape}>"
        return np.array2string(arr, precision=6, separator=", ").replace("\n", "")
    except Exception:  # pragma: no cover - value is not array-like
        return repr(value)


def check_shape(field: str, x, trailing: tuple[int, ...]):
    shape = np.shape(x)
    if len(shape) < len(trailing) or tuple(shape[len(shape) - len(trailing) :]) != trailing:
        raise ValueError(
            f"{field} has shape {shape}, expected trailing shape {trailing}. "
            f"Fix: pass an array of shape (..., {', '.join(map(str, trailing))})."
        )


def check_finite(field: str, x, fix: str):
    if is_concrete(x) and not np.all(np.isfinite(np.asarray(x))):
        fail(field, x, "contains non-finite values (NaN or inf)", fix)
