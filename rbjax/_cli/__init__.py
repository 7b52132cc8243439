"""The ``rbjax`` command line: ``rbjax simulate | check | plot | animate | identify | bench``.

Each subcommand lives in its own module with ``add_parser(subparsers)`` (its arguments and
help) and ``run(args) -> int`` (its work). :func:`main` parses, runs and turns the errors a
user can fix into one message on stderr and an exit code:

* 0: done; the command found nothing wrong;
* 1: the command ran and found a problem (``check`` failed a test, a simulation diverged or a
  solver failed, an identification did not converge);
* 2: the input is wrong (a bad argument, a file that cannot be read, a model rbjax refuses, a
  missing optional dependency); the message names the argument or field and the fix. rbjax's
  own checks raise ValueError with a "Fix:"; any other exception is a bug and keeps its
  traceback.
"""

from __future__ import annotations

import argparse
import sys
import warnings

import jax

from . import animate, bench, check, identify, plot, simulate
from .common import CliError

COMMANDS = (simulate, check, plot, animate, identify, bench)

EPILOG = """exit codes: 0 done; 1 the command found a problem (a failed check, a diverged
simulation, an identification that did not converge); 2 bad input (the message says what to fix).
Run 'rbjax COMMAND --help' for the arguments of each command."""


def parser() -> argparse.ArgumentParser:
    from .. import __version__

    p = argparse.ArgumentParser(
        prog="rbjax",
        description="Simulate, check, plot, animate and identify rigid-body mechanisms "
        "(MJCF, URDF or rbjax model files).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"rbjax {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.add_parser(sub)
    return p


def main(argv=None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    jax.config.update("jax_enable_x64", True)  # the command line computes in float64
    p = parser()
    try:
        args = p.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on a usage error, 0 on --help
        return int(exc.code or 0)
    shown = warnings.showwarning
    warnings.showwarning = _warning(args.command)
    try:
        return int(args.run(args))
    except CliError as exc:
        print(f"rbjax {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        if "Fix:" not in str(exc):  # not one of rbjax's input checks: a bug, keep the traceback
            raise
        print(f"rbjax {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"rbjax {args.command}: interrupted", file=sys.stderr)
        return 130
    finally:
        warnings.showwarning = shown


def _warning(command):
    """Warnings (the loader's list of unsupported elements, an assembled initial state) as
    one line naming the command, not the source line that raised them."""

    def show(message, category, filename, lineno, file=None, line=None):
        print(f"rbjax {command}: warning: {message}", file=sys.stderr if file is None else file)

    return show
