"""References from an observation to the fitted parameters: a sensor's bias, scale factor,
mounting rotation, lever arm, offset or time delay is either absent (``None``: the ideal
sensor), a known constant (an array), a KEY of the parameter pytree (``"gyro_bias"``:
``params["gyro_bias"]``, fitted like any other leaf when it is free), or a function of the
whole parameter pytree (``lambda p: p["imu"]["bias"]``). A bias or a scale factor is a
parameter, not a force.

Keys and functions are resolved against ``params0`` at build time (``ValueError`` naming the
observation's field, the value and the fix), and against the current parameters inside the
compiled residual function.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._errors import fail

Reference = None | str | Callable | Any  # None, a key, a function of params, or an array


def as_reference(where: str, ref, shape: tuple[int, ...]):
    """Validate a reference at construction: None, a str key, a callable, or a finite array
    of ``shape`` (converted to a float64 array)."""
    if ref is None or isinstance(ref, str) or callable(ref):
        return ref
    try:
        a = np.asarray(ref, dtype=np.float64)
    except (TypeError, ValueError):
        a = None
    if a is not None and a.shape == () and shape != ():
        a = np.broadcast_to(a, shape).copy()  # a scalar for every component
    if a is None or a.shape != shape or not np.all(np.isfinite(a)):
        fail(
            where,
            ref,
            f"is not None, a parameter key, a function of the parameters or a finite array "
            f"of shape {shape}",
            f'pass e.g. "{where.split(".")[-1]}" (a key of params) or a known value of shape '
            f"{shape}",
        )
    return jnp.asarray(a)


def resolve(ref, params, default: float, shape: tuple[int, ...], dtype):
    """The value of a reference for the parameters ``params`` (traced or concrete)."""
    if ref is None:
        return jnp.full(shape, default, dtype)
    if isinstance(ref, str):
        value = params[ref]
    elif callable(ref):
        value = ref(params)
    else:
        value = ref
    value = getattr(value, "value", value)  # an rbjax.Positive stands for its value
    return jnp.broadcast_to(jnp.asarray(value).astype(dtype), shape)  # a scalar for (n,)


def _value(ref, params):
    """The shape of the value a key or a function refers to, before broadcasting."""

    def value(p):
        v = p[ref] if isinstance(ref, str) else ref(p)
        return jnp.asarray(getattr(v, "value", v))

    return jax.eval_shape(value, params)


def check_reference(where: str, ref, params0, shape: tuple[int, ...]) -> None:
    """Build-time check of a key or a function against ``params0``: the key exists, the value
    has ``shape``."""
    if ref is None or not (isinstance(ref, str) or callable(ref)):
        return
    if isinstance(ref, str) and not (isinstance(params0, Mapping) and ref in params0):
        keys = list(params0) if isinstance(params0, Mapping) else []
        fail(
            where,
            ref,
            f"is not a key of params (keys: {keys})",
            f'add params["{ref}"] (e.g. jnp.zeros({shape})) or pass a function of params',
        )
    try:
        raw = _value(ref, params0).shape
    except Exception as e:  # noqa: BLE001 - report any failure of the user's reference
        fail(where, ref, f"fails on params0: {e!r}", "return an array from params")
        raise
    if raw not in (shape, ()):
        fail(
            where,
            ref,
            f"gives an array of shape {raw}, not {shape} (or a scalar)",
            f"make the parameter an array of shape {shape}",
        )
