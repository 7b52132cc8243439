"""Validated reading of TOML configuration tables: every error names the field path and the fix.

Each reader takes the path of the field as the user writes it (``parameters[1].body``,
``solver.max_steps``; ``""`` for the top level) and its value, and returns the value in the
type the command needs, or raises :class:`~rbjax._cli.common.CliError` with the one line
``"<path>: <problem>. Fix: <fix>."`` (exit status 2) when the value is not what the field
takes.
"""

from __future__ import annotations

import math
import tomllib
from typing import NoReturn

import numpy as np

from .common import CliError, input_file


def read(path: str, argument: str = "CONFIG") -> dict:
    """The TOML file at ``path`` (the command-line ``argument``) as a dict."""
    input_file(path, argument, "give the path of the .toml configuration")
    with open(path, "rb") as fh:
        raw = fh.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise CliError(
            f"{argument} {path!r} is not UTF-8 text (byte {raw[exc.start]:#04x} on line {line}). "
            "Fix: save it as UTF-8 (TOML files are UTF-8), or give the .toml configuration."
        ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CliError(
            f"{argument} {path!r} is not valid TOML ({exc}). Fix: correct the syntax there."
        ) from None


def fail(path: str, problem: str, fix: str) -> NoReturn:
    raise CliError(f"{path}: {problem}. Fix: {fix}.")


def table(path: str, value, allowed, required=()) -> dict:
    """A table whose keys are among ``allowed`` and include every key of ``required``."""
    if not isinstance(value, dict):
        fail(path, f"is {value!r}, not a table", f"write it as a TOML table [{path}]")
    for key in value:
        if key not in allowed:
            fail(
                f"{path}.{key}" if path else key,
                "is not a known key",
                f"use one of {', '.join(allowed)}",
            )
    for key in required:
        if key not in value:
            fail(f"{path}.{key}" if path else key, "is missing", "add it")
    return value


def tables(path: str, value) -> list:
    """A non-empty array of tables ``[[path]]`` (the tables themselves are checked by the
    caller, which knows their keys)."""
    if not isinstance(value, list) or not value:
        fail(path, f"is {value!r}, not a non-empty array of tables", f"add [[{path}]] tables")
    return value


def is_number(v) -> bool:
    """An int or a float, not a bool (TOML's true is no number)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def number(path: str, v, *, positive=False, example="1.0") -> float:
    """A finite number (> 0 when ``positive``); ``example`` goes into the fix."""
    if not is_number(v) or not math.isfinite(v):
        fail(
            path, f"is {v!r}, not a finite number", f"write e.g. {path.split('.')[-1]} = {example}"
        )
    if positive and not v > 0:
        fail(path, f"is {v!r}, not > 0", f"give a positive value, e.g. {example}")
    return float(v)


def integer(path: str, v, *, minimum: int, example: str) -> int:
    """An integer >= ``minimum``; ``example`` (``"key = 4"``) goes into the fix."""
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        fail(path, f"is {v!r}, not an integer >= {minimum}", f"write e.g. {example}")
    return int(v)


def string(path: str, v, choices=None) -> str:
    """A string, one of ``choices`` when given."""
    if not isinstance(v, str):
        fail(path, f"is {v!r}, not a string", 'write it in quotes, e.g. "link1"')
    if choices is not None and v not in choices:
        fail(path, f"is {v!r}", f"use one of {', '.join(choices)}")
    return v


def array(path: str, v, shape: tuple[int, ...], what: str) -> np.ndarray:
    """A nested list of finite numbers of ``shape`` (a number for shape ()); ``what``
    describes it in the message and the fix ("a point [x, y, z] in m")."""
    if is_number(v):
        a = np.asarray(float(v))
    elif isinstance(v, list):
        try:
            a = np.asarray(v, dtype=float)
        except (TypeError, ValueError):
            fail(path, f"is {v!r}, not a list of numbers", f"write {what}")
    else:
        fail(path, f"is {v!r}, not a number or a list of numbers", f"write {what}")
    if a.shape != shape or not np.all(np.isfinite(a)):
        fail(path, f"is {v!r}, not {what}", f"write {what}")
    return a


def resolve(path: str, name, pool, what: str, fix: str = "") -> int:
    """The index of ``name`` in ``pool``, the names of the model's ``what`` (body, joint,
    ...): the message of an unknown name lists them all."""
    string(path, name)
    pool = list(pool)
    if name not in pool:
        listed = ", ".join(pool) if pool else "none"
        plural = "bodies" if what == "body" else f"{what}s"
        fail(
            path,
            f"unknown {what} {name!r} ({plural}: {listed})",
            fix or f"use one of these {what} names",
        )
    return pool.index(name)
