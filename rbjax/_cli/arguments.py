"""The command line's options checked when they are parsed: argparse ``type=`` functions
that refuse what no run can use (a word, NaN, ∞, a non-positive step or tolerance, a count
out of range) and the parser whose errors are ONE line with a "Fix:" and exit status 2.

argparse reports a ``type=`` failure as ``rbjax CMD: error: argument --dt: '0' is not a
positive number of seconds. Fix: e.g. --dt 1e-3.``; its own errors (a missing argument, an
unknown option, an invalid choice) get a fix pointing at ``--help``. Nothing is loaded or
compiled before these checks pass.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping
from typing import NoReturn

# Ceilings of what one command line run can be asked for (the message of each says why).
MAX_COUNT = 10**12  # steps, batch sizes, strides: beyond this the run cannot finish
MAX_SEED = 2**63 - 1  # JAX's random key takes a signed 64-bit integer


class Parser(argparse.ArgumentParser):
    """argparse's parser, with errors as one line ``PROG: error: MESSAGE. Fix: ...`` and
    exit status 2 (argparse prints the usage block first; ``--help`` still shows it).
    Arguments that no parser recognises are reported by the subcommand's parser (argparse
    would blame the top level: ``rbjax: error:``)."""

    commands: Mapping[str, argparse.ArgumentParser] | None = None  # set by add_subparsers

    def add_subparsers(self, **kwargs):
        action = super().add_subparsers(**kwargs)
        self.commands = action.choices  # name -> the subcommand's parser, filled as added
        return action

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            command = getattr(parsed, "command", None) or ""
            (self.commands or {}).get(command, self).error(
                f"unrecognized arguments: {' '.join(extra)}"
            )
        return parsed

    def error(self, message: str) -> NoReturn:
        message = " ".join(message.split())
        if "Fix:" not in message:
            message = f"{message.rstrip('.')}. Fix: see '{self.prog} --help'."
        self.exit(2, f"{self.prog}: error: {message}\n")


def _refuse(text: str, what: str, option: str, example: str):
    return argparse.ArgumentTypeError(f"{text!r} is not {what}. Fix: e.g. {option} {example}.")


def real(
    option: str,
    what: str,
    example: str,
    *,
    minimum: float | int | None = None,
    positive: bool = False,
    maximum: float | int | None = None,
) -> Callable[[str], float]:
    """A finite float (> 0 when ``positive``, within [minimum, maximum] when given);
    ``what`` ("a positive number of seconds") and ``example`` go into the message."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise _refuse(text, what, option, example) from None
        bad = not math.isfinite(value) or (positive and not value > 0)
        bad = bad or (minimum is not None and value < minimum)
        if bad or (maximum is not None and value > maximum):
            raise _refuse(text, what, option, example)
        return value

    return parse


def integer(
    option: str, example: str, *, minimum: int = 1, maximum: int = MAX_COUNT, top: str = ""
) -> Callable[[str], int]:
    """A whole number in [minimum, maximum] (``1e3`` and ``2.0`` are not whole numbers
    here: a count is written as digits); ``top`` writes the maximum in the message."""
    what = f"a whole number from {minimum} to {top or large(maximum)}"

    def parse(text: str) -> int:
        try:
            value = int(text.strip().replace("_", ""), 10)
        except ValueError:
            raise _refuse(text, what, option, example) from None
        if not minimum <= value <= maximum:
            raise _refuse(text, what, option, example)
        return value

    return parse


def seed(option: str = "--seed") -> Callable[[str], int]:
    """A random seed: a whole number from 0 to 2⁶³ − 1."""
    return integer(option, "0", minimum=0, maximum=MAX_SEED, top="2^63 - 1")


def large(x: float | int) -> str:
    """A count for a message: 10**9 as "10^9", 5000 as "5000", 4e14 as "4e14"."""
    if math.isfinite(x) and x >= 10**6 and x == 10 ** round(math.log10(x)):
        return f"10^{round(math.log10(x))}"
    if math.isfinite(x) and x == int(x) and abs(x) < 10**6:
        return str(int(x))
    return f"{x:.4g}".replace("e+", "e")


def numbers(option: str, what: str, example: str, count: int | None = None, positive=False):
    """Comma-separated finite numbers (``count`` of them when given, each > 0 when
    ``positive``) as a tuple."""

    def parse(text: str) -> tuple[float, ...]:
        try:
            values = tuple(float(v) for v in text.split(","))
        except ValueError:
            raise _refuse(text, what, option, example) from None
        if (count is not None and len(values) != count) or not all(
            math.isfinite(v) and (v > 0 or not positive) for v in values
        ):
            raise _refuse(text, what, option, example)
        return values

    return parse


def duration(seconds: float | int) -> str:
    """A time span for a message: "40 s", "17 minutes", "2.8 hours", "12 days", "3.2 years"."""
    if not math.isfinite(seconds):
        return "forever"
    for unit, size in (("years", 3.156e7), ("days", 86400.0), ("hours", 3600.0)):
        if seconds >= 2 * size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds / 60:.3g} minutes" if seconds >= 120 else f"{seconds:.2g} s"
