"""A small, safe expression language for drivers and actuator laws in model files.

``Expression("0.5*sin(2*pi*t)")`` is a function of time compiled to ``jax.numpy``: numbers,
the names ``t``, ``pi``, ``e`` and the expression's own parameters, the operators
``+ - * / ** %``, comparisons (giving 1.0 or 0.0), ``a if cond else b`` (→ ``jnp.where``) and
the functions listed in :data:`FUNCTIONS`. The text is parsed by Python's ``ast`` parser and
only these node types are accepted: it is never passed to ``eval`` or ``exec``, attributes,
subscripts, lambdas, comprehensions and every other name are refused at build time with the
column of the offending token (``unknown name 'sn' at column 5``).

Parameters (``Expression("A*sin(w*t)", A=0.5, w=2.0)``) are array leaves: differentiable and
identifiable like every other parameter of a model.
"""

from __future__ import annotations

import ast
import keyword
import math
from typing import NoReturn

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from .._errors import is_concrete, validates_inputs

FUNCTIONS = {
    "sin": jnp.sin,
    "cos": jnp.cos,
    "tan": jnp.tan,
    "asin": jnp.arcsin,
    "acos": jnp.arccos,
    "atan": jnp.arctan,
    "atan2": jnp.arctan2,
    "sinh": jnp.sinh,
    "cosh": jnp.cosh,
    "tanh": jnp.tanh,
    "exp": jnp.exp,
    "log": jnp.log,
    "sqrt": jnp.sqrt,
    "abs": jnp.abs,
    "sign": jnp.sign,
    "floor": jnp.floor,
    "min": jnp.minimum,
    "max": jnp.maximum,
    "clip": jnp.clip,
    "step": lambda x: jnp.where(x >= 0, 1.0, 0.0),
}
"""Functions an expression may call, with their arities checked at build time."""

_ARITY = {"atan2": 2, "min": 2, "max": 2, "clip": 3}
CONSTANTS = {"pi": math.pi, "e": math.e}
MAX_LENGTH = 2000
"""An expression has at most this many characters."""
MAX_NODES = 1000
"""An expression has at most this many terms and operations (nodes of its syntax tree)."""
MAX_DEPTH = 100
"""Terms and operations nest at most this deep: checking and evaluating recurse once per
level, far below Python's recursion limit (1000) even inside a traced program (a 999-term sum
raised RecursionError). A long sum written flat, ``a + b + c + ...``, nests once per term:
grouped, ``(a + b) + (c + d)``, it nests less."""

_BINARY = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.Pow: lambda a, b: a**b,
    ast.Mod: lambda a, b: jnp.mod(a, b),
}
_COMPARE = {
    ast.Lt: jnp.less,
    ast.LtE: jnp.less_equal,
    ast.Gt: jnp.greater,
    ast.GtE: jnp.greater_equal,
    ast.Eq: jnp.equal,
    ast.NotEq: jnp.not_equal,
}


class ExpressionError(ValueError):
    """A model-file expression that cannot be compiled (a ValueError naming where)."""


def _fail(where: str, source: str, node, problem: str, fix: str) -> NoReturn:
    col = getattr(node, "col_offset", None)
    at = f" at column {col + 1}" if col is not None else ""
    raise ExpressionError(f"{where}: {problem}{at} in {_short(source)}. Fix: {fix}")


def _short(source: str) -> str:
    return repr(source) if len(source) <= 80 else repr(source[:77]) + "..."


def _size_and_depth(tree: ast.Expression) -> tuple[int, int]:
    """The number of terms and operations (expression nodes) and how deep they nest, by a
    walk with its own stack (no recursion)."""
    nodes, deepest, stack = 0, 0, [(tree.body, 1)]
    while stack:
        node, depth = stack.pop()
        nodes, deepest = nodes + 1, max(deepest, depth)
        stack += [(c, depth + 1) for c in ast.iter_child_nodes(node) if isinstance(c, ast.expr)]
    return nodes, deepest


def check(source: str, names: tuple[str, ...] = (), where: str = "expression") -> ast.Expression:
    """Parse and validate ``source``; returns its syntax tree (ExpressionError otherwise)."""
    if not isinstance(source, str):
        raise ExpressionError(
            f"{where}: {source!r} is not a string. Fix: write the expression in quotes."
        )
    if len(source) > MAX_LENGTH:
        raise ExpressionError(
            f"{where}: the expression has {len(source)} characters (at most {MAX_LENGTH}). "
            "Fix: split it into parameters."
        )
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except (SyntaxError, ValueError) as e:  # ValueError: a null byte, on older Pythons
        offset, msg = getattr(e, "offset", None), getattr(e, "msg", str(e))
        col = f" at column {offset}" if offset else ""
        raise ExpressionError(
            f"{where}: syntax error{col} in {_short(source)} ({msg}). Fix: write an arithmetic "
            "expression in t, e.g. '0.5*sin(2*pi*t)'."
        ) from None
    except (RecursionError, MemoryError):  # Python's own parser gives up on deep nesting
        raise ExpressionError(
            f"{where}: the expression is nested too deeply for Python's parser. Fix: write it "
            "with fewer nested parentheses and signs."
        ) from None
    nodes, depth = _size_and_depth(tree)
    if nodes > MAX_NODES:
        raise ExpressionError(
            f"{where}: the expression has {nodes} terms and operations (at most {MAX_NODES}). "
            "Fix: shorten it: give repeated numbers as parameters, or a tabulated signal as "
            "control samples."
        )
    if depth > MAX_DEPTH:
        raise ExpressionError(
            f"{where}: the expression is nested {depth} deep (at most {MAX_DEPTH}). Fix: group "
            "long sums and products in parentheses, (a + b) + (c + d), or shorten it."
        )
    known = set(names) | {"t"} | set(CONSTANTS)

    def visit(node):
        if isinstance(node, ast.Expression):
            return visit(node.body)
        if isinstance(node, ast.Constant):
            value = node.value
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                _fail(where, source, node, f"constant {value!r} is not a number", "use numbers")
            try:
                finite = math.isfinite(float(value))
            except OverflowError:  # an integer literal of 309 digits or more
                text = str(value)
                _fail(
                    where,
                    source,
                    node,
                    f"constant {text[:20]}... ({len(text)} digits) is too large for a float",
                    "use a number below 1e308",
                )
            if not finite:  # 1e999 is inf
                _fail(
                    where, source, node, f"constant {value!r} is not finite", "use a finite number"
                )
            return
        if isinstance(node, ast.Name):
            if node.id not in known:
                hint = sorted(known | set(FUNCTIONS))
                _fail(where, source, node, f"unknown name {node.id!r}", f"use one of {hint}")
            return
        if isinstance(node, ast.BinOp):
            if type(node.op) not in _BINARY:
                _fail(
                    where,
                    source,
                    node,
                    f"operator {type(node.op).__name__} is not allowed",
                    "use + - * / ** %",
                )
            visit(node.left)
            visit(node.right)
            return
        if isinstance(node, ast.UnaryOp):
            if not isinstance(node.op, (ast.UAdd, ast.USub)):
                _fail(
                    where,
                    source,
                    node,
                    f"operator {type(node.op).__name__} is not allowed",
                    "use + or -",
                )
            visit(node.operand)
            return
        if isinstance(node, ast.Compare):
            if len(node.ops) != 1 or type(node.ops[0]) not in _COMPARE:
                _fail(
                    where,
                    source,
                    node,
                    "only one comparison < <= > >= == != at a time",
                    "write 'a < b'",
                )
            visit(node.left)
            visit(node.comparators[0])
            return
        if isinstance(node, ast.IfExp):
            visit(node.test)
            visit(node.body)
            visit(node.orelse)
            return
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
                name = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
                _fail(
                    where,
                    source,
                    node,
                    f"unknown function {name!r}",
                    f"use one of {sorted(FUNCTIONS)}",
                )
            if node.keywords:
                _fail(
                    where,
                    source,
                    node,
                    "keyword arguments are not allowed",
                    "pass arguments by position",
                )
            fname = str(getattr(node.func, "id", ""))
            arity = _ARITY.get(fname, 1)
            if len(node.args) != arity:
                _fail(
                    where,
                    source,
                    node,
                    f"{fname}() takes {arity} argument(s), got {len(node.args)}",
                    f"call {fname} with {arity} argument(s)",
                )
            for a in node.args:
                visit(a)
            return
        _fail(
            where,
            source,
            node,
            f"{type(node).__name__} is not part of the expression language",
            "use arithmetic, comparisons, 'a if c else b' and the listed functions",
        )

    visit(tree)
    return tree


def _evaluate(node, env):
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, env)
    if isinstance(node, ast.Constant):
        return float(node.value)  # pyright: ignore[reportArgumentType]  (checked: a number)
    if isinstance(node, ast.Name):
        return env[node.id]
    if isinstance(node, ast.BinOp):
        return _BINARY[type(node.op)](_evaluate(node.left, env), _evaluate(node.right, env))
    if isinstance(node, ast.UnaryOp):
        value = _evaluate(node.operand, env)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.Compare):
        out = _COMPARE[type(node.ops[0])](
            _evaluate(node.left, env), _evaluate(node.comparators[0], env)
        )
        return jnp.where(out, 1.0, 0.0)
    if isinstance(node, ast.IfExp):
        return jnp.where(
            _evaluate(node.test, env) != 0, _evaluate(node.body, env), _evaluate(node.orelse, env)
        )
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    return FUNCTIONS[node.func.id](*[_evaluate(a, env) for a in node.args])


@validates_inputs
class Expression(eqx.Module):
    """A function of time written as text (module docstring): ``Expression(source, **params)``.

    Calling it with t (any shape) returns ``jnp`` values of the same shape. ``params`` are
    named numbers (not booleans, not strings), differentiable leaves. ``where`` names the field
    in error messages. The text has at most 2000 characters and 1000 terms and operations,
    nested at most 100 deep (``MAX_LENGTH``, ``MAX_NODES``, ``MAX_DEPTH``); anything else is an
    ``ExpressionError``, a ValueError naming ``where`` and the fix.
    """

    source: str = eqx.field(static=True)
    params: dict
    where: str = eqx.field(static=True)

    def __init__(self, source: str, where: str = "expression", **params):
        for name in params:
            reserved = name in CONSTANTS or name in FUNCTIONS or name == "t"
            if reserved or keyword.iskeyword(name) or not name.isidentifier():
                raise ExpressionError(
                    f"{where}: parameter name {name!r} is reserved or invalid. Fix: rename it."
                )
        check(source, tuple(params), where)
        values = {}
        for name, v in params.items():
            if hasattr(v, "dtype") and hasattr(v, "shape"):  # an array or a tracer
                dtype, shape = v.dtype, tuple(v.shape)
            else:
                try:
                    dtype, shape = np.asarray(v).dtype, np.shape(v)
                except (TypeError, ValueError):  # a ragged list
                    dtype, shape = np.dtype(object), None
            real = jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.floating)
            if isinstance(v, bool) or not real:
                what = {bool: "a boolean", str: "a string"}.get(type(v), f"of type {dtype}")
                raise ExpressionError(
                    f"{where}: parameter {name} = {v!r} is {what}, not a number. Fix: give a "
                    "number (true/false and quoted numbers are not numbers)."
                )
            if shape != () or (is_concrete(v) and not np.isfinite(float(v))):
                raise ExpressionError(
                    f"{where}: parameter {name} = {v!r} is not a finite number. Fix: give a number."
                )
            values[name] = jnp.asarray(v, dtype=jnp.result_type(v, float))
        self.source, self.params, self.where = source.strip(), values, where

    def __call__(self, t):
        t = jnp.asarray(t)
        env = {"t": t, **CONSTANTS, **self.params}
        out = _evaluate(ast.parse(self.source, mode="eval"), env)
        return jnp.broadcast_to(jnp.asarray(out, dtype=jnp.result_type(t, float)), t.shape)
