"""Validation helpers: every user mistake becomes a ValueError naming field and fix, and the
declared rules on physical parameters (:class:`Rule`) that are checked both at build time and,
for traced values, inside a rollout's program."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
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


def checked_array(field: str, x, shape: tuple[int, ...], fix: str):
    """``x`` as an array of exactly ``shape`` and finite values (ValueError naming ``field``
    otherwise): a NumPy or Python input becomes the default float dtype; a JAX array (also a
    tracer) keeps its own."""
    a = np.asarray(x, dtype=float) if not isinstance(x, jax.Array) else x
    if tuple(a.shape) != tuple(shape):
        fail(field, x, f"has shape {tuple(np.shape(x))}, expected {tuple(shape)}", fix)
    check_finite(field, x, fix)
    return jnp.asarray(a, dtype=jnp.result_type(float)) if isinstance(a, np.ndarray) else a


class Rule(NamedTuple):
    """A sign, range or geometric condition on the physical parameters of an rbjax object,
    declared once in its class's ``_rules`` and checked in two places:

    * on concrete values when the object is built (:func:`enforce`) and when a rollout starts
      (:func:`check_declared`, for values set by ``equinox.tree_at``): a ValueError naming
      the field, the value and the fix;
    * on values traced by ``jax.jit``, ``jax.vmap`` or ``jax.grad``, inside the rollout's
      program (:func:`declared_violations`, rbjax/_analysis/checks.py): ``RESULTS.invalid_input``
      per system, or an error naming the field with ``throw=True``.

    ``holds(xp, *values)`` is written once for NumPy and ``jax.numpy`` (passed as ``xp``) and
    is True where the values of ONE object satisfy the rule (it reduces the parameter's own
    axes: a vector's norm, a range's two ends); ``fields`` are the attributes it reads, the
    first is the one named. A field that is None (an optional range) is not checked.
    Finiteness is not a rule's business: each constructor's conversion refuses NaN and inf
    (``check_finite``), and a traced NaN or inf makes the first step non-finite
    (``RESULTS.nonfinite`` at step 0); so a sign rule is written ``~(x < 0)``, which a NaN
    passes, rather than ``x >= 0``, which would call a NaN negative.
    """

    fields: tuple[str, ...]
    holds: Callable[..., Any]
    problem: str
    fix: str


def perpendicular_tol(dtype) -> float:
    """Largest |cos| between two directions accepted as perpendicular: 1e-9, or 10 ε of the
    dtype when that is larger (1.2e-6 in float32, where unit vectors rounded from a float64
    frame are 1e-8 apart from perpendicular)."""
    return max(1e-9, 10.0 * float(np.finfo(np.dtype(dtype)).eps))


def not_negative(xp, x):
    """x >= 0 (a NaN is not called negative: see :class:`Rule`)."""
    return ~(x < 0)


def nonzero(xp, v):
    """A direction: |v| > 1e-12, not zero nor rounding of zero."""
    return ~(xp.sqrt(xp.sum(v * v, axis=-1)) <= 1e-12)


def perpendicular(xp, a, b):
    """|cos ∠(a, b)| <= :func:`perpendicular_tol` of their dtype."""
    dot = xp.abs(xp.sum(a * b, axis=-1))
    scale = xp.sqrt(xp.sum(a * a, axis=-1) * xp.sum(b * b, axis=-1))
    return ~(dot > perpendicular_tol(xp.result_type(a, b)) * scale)


def ordered(xp, r):
    """A range (low, high) with low <= high."""
    return ~(r[..., 0] > r[..., 1])


def _rules_of(obj) -> tuple[Rule, ...]:
    return getattr(type(obj), "_rules", ())


def _refuse(field: str, value, rule: Rule):
    """:func:`fail` for a broken rule, a Python number shown as the user wrote it (``0.0``)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise ValueError(f"{field} = {value!r} {rule.problem}. Fix: {rule.fix}")
    fail(field, value, rule.problem, rule.fix)


def _failing(rule: Rule, values) -> bool:
    """Whether concrete ``values`` break ``rule`` (None values: not checked)."""
    if any(v is None for v in values) or not is_concrete(values):
        return False
    return not bool(np.all(rule.holds(np, *(np.asarray(v) for v in values))))


def enforce(obj, label: str) -> None:
    """The build-time side of the rules ``type(obj)._rules``: a ValueError naming
    ``label.field``, the value and the fix for the first rule that concrete values break
    (traced values are checked inside the rollout's program)."""
    for rule in _rules_of(obj):
        values = tuple(getattr(obj, f) for f in rule.fields)
        if _failing(rule, values):
            _refuse(f"{label}.{rule.fields[0]}", values[0], rule)


def declared(tree, path: str, fields: tuple[str, ...] | None = None):
    """``(path, object, rule)`` for every rule declared by the rbjax objects in ``tree``
    (equinox Modules, and tuples or lists of them, nested: a spring's actuator is reached
    through the spring), ``path`` the object's (``model.forces[2].actuator``). ``fields``:
    the fields of ``tree`` to walk into (default: every field that is not static)."""
    if isinstance(tree, (tuple, list)):
        for i, x in enumerate(tree):
            yield from declared(x, f"{path}[{i}]")
    elif isinstance(tree, eqx.Module):
        for rule in _rules_of(tree):
            yield path, tree, rule
        if fields is None:
            fields = tuple(
                f.name for f in dataclasses.fields(tree) if not f.metadata.get("static", False)
            )
        for name in fields:
            yield from declared(getattr(tree, name), f"{path}.{name}")


def _name(path: str, obj, rule: Rule) -> str:
    """``model.joints[0].length (Distance 'rope')``: the field, the type and its name."""
    named = getattr(obj, "name", None)
    what = type(obj).__name__ + (f" '{named}'" if isinstance(named, str) else "")
    return f"{path}.{rule.fields[0]} ({what})"


def check_declared(items) -> None:
    """:func:`enforce` for the ``(path, object, rule)`` of :func:`declared`: concrete values
    set by ``equinox.tree_at`` bypass the constructors, so a rollout checks them here."""
    for path, obj, rule in items:
        values = tuple(getattr(obj, f) for f in rule.fields)
        if _failing(rule, values):
            _refuse(_name(path, obj, rule), values[0], rule)


def declared_violations(items) -> list[tuple[str, str, str, Any]]:
    """The in-program side of the rules: for each ``(path, object, rule)`` of
    :func:`declared` (values None skipped), ``(field, problem, fix, bad)`` with ``bad`` a
    boolean jax array, True where the rule is broken (the shape of the object's own batch
    axes, () for one system)."""
    out = []
    for path, obj, rule in items:
        values = tuple(getattr(obj, f) for f in rule.fields)
        if any(v is None for v in values):
            continue
        ok = rule.holds(jnp, *(jnp.asarray(v) for v in values))
        out.append((_name(path, obj, rule), rule.problem, rule.fix, ~ok))
    return out
