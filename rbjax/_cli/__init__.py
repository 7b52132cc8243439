"""The ``rbjax`` command line: ``rbjax simulate | check | plot | animate | identify | bench``.

Each subcommand lives in its own module with ``add_parser(subparsers)`` (its arguments and
help) and ``run(args) -> int`` (its work). :func:`main` parses, runs and turns the errors a
user can fix into one message on stderr and an exit code:

* 0: done; the command found nothing wrong;
* 1: the command ran and found a problem (``check`` failed a test, a simulation diverged or a
  solver failed, an identification did not converge);
* 2: the input is wrong (a bad argument, a file that cannot be read or written, a model rbjax
  refuses, a run too long or too large for this machine, a missing optional dependency): ONE
  line on stderr, ``rbjax COMMAND: error: ... Fix: ...``, naming the argument or field and
  the fix. Options are checked when parsed (rbjax/_cli/arguments.py), files and sizes before
  anything is built or compiled. rbjax's own checks raise ValueError with a "Fix:"; running
  out of memory anyway is reported the same way; any other exception is a bug and keeps its
  traceback.

Compiled programs are kept in JAX's persistent compilation cache, on by default for the
command line (a program, not a library): ``$RBJAX_CACHE_DIR``, else
``$XDG_CACHE_HOME/rbjax/xla``, else ``~/.cache/rbjax/xla`` (rbjax/_cache.py). A second run of
the same model and options loads its programs from there instead of compiling them.
``--no-cache`` (any subcommand) turns it off for one run; delete the folder to clear it.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings

import jax

from .._cache import default_cache_dir, program_cache
from . import animate, bench, check, identify, plot, simulate
from .arguments import Parser
from .common import CliError

COMMANDS = (simulate, check, plot, animate, identify, bench)

EPILOG = """exit codes: 0 done; 1 the command found a problem (a failed check, a diverged
simulation, an identification that did not converge); 2 bad input (the message says what to fix).
Run 'rbjax COMMAND --help' for the arguments of each command."""


def parser() -> argparse.ArgumentParser:
    from .. import __version__

    p = Parser(
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
    for command in (p.commands or {}).values():
        command.add_argument(
            "--no-cache",
            dest="cache",
            action="store_false",
            help="do not use the persistent compilation cache ($RBJAX_CACHE_DIR, else "
            "$XDG_CACHE_HOME/rbjax/xla or ~/.cache/rbjax/xla)",
        )
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
        with contextlib.ExitStack() as stack:
            if args.cache:
                _cache_on(stack, args.command)
            return int(args.run(args))
    except CliError as exc:
        return _error(args.command, str(exc))
    except ValueError as exc:
        if "Fix:" not in str(exc):  # not one of rbjax's input checks: a bug, keep the traceback
            raise
        return _error(args.command, str(exc))
    except Exception as exc:  # XLA's RESOURCE_EXHAUSTED (its type moved between jax versions)
        if not isinstance(exc, MemoryError) and "RESOURCE_EXHAUSTED" not in str(exc):
            raise
        first = (str(exc).strip().splitlines() or ["out of memory"])[0]
        return _error(
            args.command,
            f"ran out of memory ({first}). Fix: ask for less at once: a smaller batch, fewer "
            "saved states or frames, a shorter run.",
        )
    except KeyboardInterrupt:
        print(f"rbjax {args.command}: interrupted", file=sys.stderr)
        return 130
    finally:
        warnings.showwarning = shown


def _cache_on(stack: contextlib.ExitStack, command: str) -> None:
    """The persistent compilation cache for this run (module docstring); a folder that cannot
    be created is a warning, and the run goes on without the cache."""
    try:
        stack.enter_context(program_cache())
    except OSError as exc:
        print(
            f"rbjax {command}: warning: compilation cache off: cannot create "
            f"{str(default_cache_dir())!r} ({exc.strerror or exc}). Fix: set RBJAX_CACHE_DIR to "
            "a writable folder, or pass --no-cache.",
            file=sys.stderr,
        )


def _error(command: str, message: str) -> int:
    """The one line of an input error (a message's own line breaks become spaces); exit 2."""
    print(f"rbjax {command}: error: {' '.join(message.split())}", file=sys.stderr)
    return 2


def _warning(command):
    """Warnings (the loader's list of unsupported elements, an assembled initial state) as
    one line naming the command, not the source line that raised them."""

    def show(message, category, filename, lineno, file=None, line=None):
        print(f"rbjax {command}: warning: {message}", file=sys.stderr if file is None else file)

    return show
