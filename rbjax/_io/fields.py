"""Typed fields of the model file: each field's type reads the value ``tomllib`` gave and
converts it, or raises a ``ModelFileError`` naming the field path, the value (written as
TOML) and the fix.

``tomllib`` gives ``str``, ``int``, ``float`` (``nan`` and ``inf`` included), ``bool``, dates
and times, ``list`` and ``dict``. Python's ``bool`` is an ``int``, ``bool("false")`` is True,
and NumPy turns ``"1.0"`` and ``True`` into 1.0: so no value is converted before its TOML type
is checked (issue 36: ``scalable = "false"`` declared a rigid body scalable, ``timestep =
true`` was a step of 1 s). Which field has which type, the format itself, is the table in
rbjax/_io/modelfile.py; this module holds the types and ``check_nesting``, the guard that
runs before ``tomllib`` (which recurses once per nested array or inline table).
"""

from __future__ import annotations

import abc
import dataclasses
import datetime
import math
from collections.abc import Mapping
from typing import Any, NoReturn

import jax.numpy as jnp
import numpy as np


class ModelFileError(ValueError):
    """A model file that cannot be read (a ValueError naming the field path and the fix)."""


def error(path: str, problem: str, fix: str) -> NoReturn:
    """``path: problem. Fix: fix.`` (a field that is missing or unknown)."""
    raise ModelFileError(f"{path}: {problem}. Fix: {_stop(fix)}")


def fail(path: str, value: Any, problem: str, fix: str) -> NoReturn:
    """``path = value problem. Fix: fix.`` (a field whose value is wrong)."""
    raise ModelFileError(f"{path} = {show(value)} {problem}. Fix: {_stop(fix)}")


def _stop(text: str) -> str:
    return text if text.endswith(".") else text + "."


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _key(path: str) -> str:
    """The name a fix writes: ``scalable`` for ``bodies[1].scalable``."""
    return path.rsplit(".", 1)[-1]


def _element(path: str) -> bool:
    """Whether the path is an element of an array (``gravity[2]``): no ``key = `` in a fix."""
    return path.endswith("]")


def kind(value: Any) -> str:
    """The TOML type of a value, with its article: "a boolean", "an array", ..."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, datetime.datetime):
        return "a date-time"
    if isinstance(value, datetime.date):
        return "a date"
    if isinstance(value, datetime.time):
        return "a time"
    return f"a {type(value).__name__}"


def _category(value: Any) -> str:
    """The TOML kind that decides which type of a field with several applies."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "table"}.get(type(value), "other")


def show(value: Any, limit: int = 60) -> str:
    """A value written as TOML, at most three levels and ``limit`` characters."""
    text = _toml(value, 3)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def toml_string(text: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch < " " or ch == "\x7f":
            out.append({"\t": "\\t", "\n": "\\n", "\r": "\\r"}.get(ch, f"\\u{ord(ch):04x}"))
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _toml(value: Any, depth: int) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value) if abs(value) < 10**100 else f"{str(value)[:40]}..."
    if isinstance(value, float):
        return "nan" if math.isnan(value) else repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, (list, dict)) and depth == 0:
        return "[...]" if isinstance(value, list) else "{...}"
    if isinstance(value, list):
        items = [_toml(v, depth - 1) for v in value[:8]] + ["..."] * (len(value) > 8)
        return "[" + ", ".join(items) + "]"
    if isinstance(value, dict):
        items = [f"{k} = {_toml(v, depth - 1)}" for k, v in list(value.items())[:8]]
        return "{ " + ", ".join(items) + " }" if items else "{}"
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    return repr(value)


class Field(abc.ABC):
    """A field's type: ``read`` checks the value tomllib gave and converts it."""

    what = "a value"  # the type with its article, for messages
    example = ""  # a value as TOML, for the fixes

    @abc.abstractmethod
    def read(self, path: str, value: Any) -> Any:
        """The value converted (``path`` names the field in errors), or a ModelFileError."""


@dataclasses.dataclass(frozen=True)
class Bool(Field):
    """A TOML boolean, ``true`` or ``false``: nothing else (``"false"``, 0) is one."""

    what = "a boolean"
    example = "true"

    def read(self, path: str, value: Any) -> bool:
        if isinstance(value, bool):
            return value
        key = _key(path)
        word = value.strip().lower() if isinstance(value, str) else None
        if word in ("true", "false"):
            fix = f"write {key} = {word} (no quotes)"
        else:
            fix = f"write {key} = true or {key} = false"
        fail(path, value, f"is {kind(value)}, not a boolean", fix)


def _number_text(value: Any) -> str | None:
    """A string that holds a finite number: the number as written, else None."""
    if not isinstance(value, str):
        return None
    try:
        return value.strip() if math.isfinite(float(value)) else None
    except ValueError:
        return None


@dataclasses.dataclass(frozen=True)
class Number(Field):
    """A finite TOML integer or float (not a boolean, not a string), as a Python float that the
    float JAX computes in holds; ``positive``: > 0."""

    unit: str = ""
    example: str = "1.0"
    positive: bool = False
    what = "a number"

    def read(self, path: str, value: Any) -> float:
        key, unit = _key(path), f" in {self.unit}" if self.unit else ""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            written = _number_text(value)
            where = " in the array" if _element(path) else ""
            lhs = "" if _element(path) else f"{key} = "
            if written:
                fix = f"write {lhs}{written} (no quotes){where}"
            else:
                fix = f"write a number{unit}{where}, e.g. {lhs}{self.example}"
            fail(path, value, f"is {kind(value)}, not a number", fix)
        try:
            x = float(value)
        except OverflowError:
            fail(path, value, "is too large for a float", f"write a number{unit} below 1e308")
        if not math.isfinite(x):
            fail(path, value, "is not finite", f"write a finite number{unit}")
        # a number the float JAX computes in cannot hold would silently become inf, or 0 (a
        # subnormal loses its digits): float32 when x64 is off
        dtype = np.dtype(jnp.result_type(float))
        info = np.finfo(dtype)
        if abs(x) > float(info.max) or 0.0 < abs(x) < float(info.tiny):
            fail(
                path,
                value,
                f"{'over' if abs(x) > 1 else 'under'}flows {dtype.name}, the float JAX computes in",
                f"write a number between {float(info.tiny):.3g} and {float(info.max):.3g} in "
                "size, or 0, or compute in float64: jax.config.update('jax_enable_x64', True)",
            )
        if self.positive and not x > 0.0:
            fail(path, value, "is not positive", f"write a positive number{unit}")
        return x


def _shape_text(shape: tuple[int | None, ...]) -> str:
    if len(shape) == 1:
        return "an array of numbers" if shape[0] is None else f"an array of {shape[0]} numbers"
    rows = "rows" if shape[0] is None else f"{shape[0]} rows"
    return f"{rows} of {shape[1]} numbers"


@dataclasses.dataclass(frozen=True)
class Numbers(Field):
    """An array of finite numbers of one of the ``shapes`` (a length None: any length >= 1; at
    most two levels), as a float64 NumPy array. An array of arrays is read as rows when its
    first element is an array."""

    shapes: tuple[tuple[int | None, ...], ...]
    example: str
    unit: str = ""

    @property
    def what(self) -> str:  # pyright: ignore[reportIncompatibleVariableOverride]
        return " or ".join(_shape_text(s) for s in self.shapes)

    def read(self, path: str, value: Any) -> np.ndarray:
        fix = f"write {self.what}, e.g. {_key(path)} = {self.example}"
        if not isinstance(value, list):
            fail(path, value, f"is {kind(value)}, not {self.what}", fix)
        rows = isinstance(value[0], list) if value else all(len(s) == 2 for s in self.shapes)
        shape = next((s for s in self.shapes if (len(s) == 2) == rows), None)
        if shape is None:
            nested = "an array of arrays" if rows else "an array of numbers"
            fail(path, value, f"is {nested}, not {self.what}", fix)
        number = Number(self.unit, example="1.0")
        n = shape[0]
        what = ("row" if rows else "number") + ("" if len(value) == 1 else "s")
        if n is None and not value:
            fail(path, value, "is empty", fix)
        if n is not None and len(value) != n:
            fail(path, value, f"has {len(value)} {what}, not {n}", fix)
        if not rows:
            return np.asarray([number.read(f"{path}[{k}]", v) for k, v in enumerate(value)])
        m = shape[1]
        out = []
        for k, row in enumerate(value):
            p = f"{path}[{k}]"
            if not isinstance(row, list):
                fail(p, row, f"is {kind(row)}, not an array of {m} numbers", fix)
            if len(row) != m:
                fail(p, row, f"has {len(row)} number{'' if len(row) == 1 else 's'}, not {m}", fix)
            out.append([number.read(f"{p}[{c}]", v) for c, v in enumerate(row)])
        return np.asarray(out, dtype=float)


@dataclasses.dataclass(frozen=True)
class Text(Field):
    """A TOML string; with ``choices``, one of them (``noun``: what they are)."""

    choices: tuple[str, ...] = ()
    noun: str = ""
    example: str = "name"
    what = "a string"

    def read(self, path: str, value: Any) -> str:
        key = _key(path)
        if self.choices and len(self.choices) <= 3:
            fix = "write " + " or ".join(f"{key} = {toml_string(c)}" for c in self.choices)
        elif self.choices:
            fix = f"use one of {list(self.choices)}"
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            fix = f"write {key} = {toml_string(str(value))} (in quotes)"
        else:
            fix = f"write {key} = {toml_string(self.example)}"
        if not isinstance(value, str):
            fail(path, value, f"is {kind(value)}, not a string", fix)
        if self.choices and value not in self.choices:
            fail(path, value, f"is not {self.noun or f'one of {list(self.choices)}'}", fix)
        return value


@dataclasses.dataclass(frozen=True)
class Table(Field):
    """A TOML table with these ``fields`` (no others: a misspelt key must not be ignored), the
    ``required`` ones present. ``name`` says whose fields they are in messages."""

    fields: Mapping[str, Field]
    required: tuple[str, ...] = ()
    name: str = ""
    what = "a table"

    def read(self, path: str, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            fix = "write it as a table: a [section] or { key = value, ... }"
            fail(path, value, f"is {kind(value)}, not a table", fix)
        out = {}
        for key, v in value.items():  # in the file's order: the first problem is reported
            p = join(path, key)
            if key not in self.fields:
                of = f" of {self.name}" if self.name else ""
                error(p, f"is not a known field{of}", f"use one of {sorted(self.fields)}")
            out[key] = self.fields[key].read(p, v)
        for key in self.required:
            if key not in value:
                field = self.fields[key]
                e = f", e.g. {key} = {field.example}" if field.example else ""
                error(join(path, key), "is missing", f"add it ({field.what}{e})")
        return out


@dataclasses.dataclass(frozen=True)
class Map(Field):
    """A TOML table with free keys, every value of type ``of`` (an expression's parameters)."""

    of: Field
    what = "a table of numbers"
    example = "{ A = 0.5 }"

    def read(self, path: str, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            fail(
                path,
                value,
                f"is {kind(value)}, not a table",
                f"write e.g. {_key(path)} = {{ A = 0.5 }}",
            )
        return {key: self.of.read(join(path, key), v) for key, v in value.items()}


@dataclasses.dataclass(frozen=True)
class Tables(Field):
    """An array of tables (``[[bodies]]``), each of type ``of``; ``nonempty``: at least one."""

    of: Field
    nonempty: bool = False
    what = "an array of tables"

    def read(self, path: str, value: Any) -> list[Any]:
        if not isinstance(value, list):
            fix = f"write each as a [[{path}]] section"
            fail(path, value, f"is {kind(value)}, not an array of tables", fix)
        if self.nonempty and not value:
            error(path, "is empty", f"add [[{path}]] tables")
        return [self.of.read(f"{path}[{k}]", v) for k, v in enumerate(value)]


@dataclasses.dataclass(frozen=True)
class Variant(Field):
    """A table whose ``key`` field (its type) picks its fields: a joint, a force."""

    key: str
    tables: Mapping[str, Table]
    noun: str
    what = "a table"

    def read(self, path: str, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            fail(path, value, f"is {kind(value)}, not a table", f"write it as a [[{path}]] table")
        choices = tuple(sorted(self.tables))
        if self.key not in value:
            error(join(path, self.key), "is missing", f"add {self.key} = one of {list(choices)}")
        kind_ = Text(choices, noun=self.noun).read(join(path, self.key), value[self.key])
        return self.tables[kind_].read(path, value)


@dataclasses.dataclass(frozen=True)
class OneOf(Field):
    """A field of several types, picked by the TOML kind of its value ("number", "string",
    "table"): an expression or a number; a control."""

    options: Mapping[str, Field]
    what: str  # pyright: ignore[reportIncompatibleVariableOverride]
    example: str  # pyright: ignore[reportIncompatibleVariableOverride]

    def read(self, path: str, value: Any) -> Any:
        field = self.options.get(_category(value))
        if field is None:
            fail(
                path,
                value,
                f"is {kind(value)}, not {self.what}",
                f"write e.g. {_key(path)} = {self.example}",
            )
        return field.read(path, value)


def _skip_string(text: str, i: int) -> int:
    """The index after the TOML string that starts at ``text[i]`` (a quote); an unterminated
    one ends at the line's end (tomllib reports it)."""
    quote = text[i]
    delim = quote * 3 if text.startswith(quote * 3, i) else quote
    j = i + len(delim)
    while j < len(text):
        if quote == '"' and text[j] == "\\":  # basic strings escape; literal strings do not
            j += 2
        elif text.startswith(delim, j):
            return j + len(delim)
        elif len(delim) == 1 and text[j] == "\n":
            return j
        else:
            j += 1
    return j


def check_nesting(text: str, where: str, limit: int) -> None:
    """Refuse arrays and inline tables nested more than ``limit`` deep, naming the line and
    column where the too-deep value opens (outside strings and comments). tomllib recurses
    two to three Python frames per level, so a 3000-deep array raised RecursionError."""
    opened: list[int] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "#":
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
            continue
        if c in "\"'":
            i = _skip_string(text, i)
            continue
        if c in "[{":
            opened.append(i)
            if len(opened) > limit:
                at = opened[0]
                line = text.count("\n", 0, at) + 1
                column = at - (text.rfind("\n", 0, at) + 1) + 1
                raise ModelFileError(
                    f"{where}: line {line}, column {column}: arrays or inline tables nested "
                    f"more than {limit} deep. Fix: a model file nests at most three levels (rows "
                    "of numbers in a table in an array); remove the extra brackets."
                )
        elif c in "]}" and opened:
            opened.pop()
        i += 1
