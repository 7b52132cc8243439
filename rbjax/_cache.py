"""JAX's persistent compilation cache, turned on by one call.

Compiling a mechanism's programs takes seconds to minutes; the compiled executables depend only
on the program and the machine, so a second run of the same script can load them from disk
instead. JAX keeps such a cache (``jax_compilation_cache_dir``); this sets it up with the
defaults rbjax's own programs use. The warm-start times are measured in benchmarks/compile.py
(``--cache``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import jax

from ._errors import validates_inputs

PROGRAM_MIN_COMPILE_S = 0.1
"""The command line caches every program that compiles in 0.1 s or more: its start-up is
dominated by a handful of programs of 0.1 to 10 s (a double pendulum's rollout 1.5 s, the
humanoid's 12 s on the development machine), and an entry is read back faster than it is
compiled; programs below that are op-by-op dispatches, not worth a file each."""
_SETTINGS = (
    "jax_compilation_cache_dir",
    "jax_persistent_cache_min_compile_time_secs",
    "jax_persistent_cache_min_entry_size_bytes",
)


def default_cache_dir() -> Path:
    """``$RBJAX_CACHE_DIR``, else ``$XDG_CACHE_HOME/rbjax/xla``, else ``~/.cache/rbjax/xla``."""
    env = os.environ.get("RBJAX_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "rbjax" / "xla"


@validates_inputs
def compilation_cache(directory: str | os.PathLike | None = None, *, min_compile_s: float = 1.0):
    """Turn on JAX's persistent compilation cache in ``directory`` and return its path.

    Every program that takes at least ``min_compile_s`` seconds to compile is stored on disk
    after its first compilation and loaded from there by any later process on the same machine
    with the same JAX version (JAX keys the entries by program, compile options, devices and
    versions, so a stale entry is never used). Call it once, before the first rollout; it is
    process-wide, like any ``jax.config`` setting. rbjax's examples and benchmarks call it when
    run as programs; a library importing rbjax is never opted in silently.

    ``directory`` defaults to :func:`default_cache_dir` (``$RBJAX_CACHE_DIR`` or
    ``~/.cache/rbjax/xla``). Delete the directory to clear the cache.
    """
    if (
        isinstance(min_compile_s, bool)
        or not isinstance(min_compile_s, (int, float))
        or not min_compile_s >= 0.0
    ):
        raise ValueError(
            f"compilation_cache: min_compile_s = {min_compile_s!r} is not a non-negative number "
            "of seconds. Fix: pass e.g. 1.0 (cache programs that take a second or more)."
        )
    path = Path(directory).expanduser() if directory is not None else default_cache_dir()
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_s))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


@contextlib.contextmanager
def program_cache(
    directory: str | os.PathLike | None = None, *, min_compile_s: float = PROGRAM_MIN_COMPILE_S
) -> Iterator[Path]:
    """:func:`compilation_cache` for the run of a program (rbjax's command line): on while
    the ``with`` block runs, the process's previous settings restored after it. Yields the
    directory.

    JAX opens its persistent cache once per process, at the first compilation, in the
    directory set then; a program that is called in-process after other compilations (the
    command line's ``main()`` from Python or a test) would keep writing wherever that was.
    The cache is therefore reset (``jax.experimental.compilation_cache.reset_cache``) when
    the directory changes, on entry and again on exit, so that each directory holds its own
    entries."""
    from jax.experimental.compilation_cache import compilation_cache as jax_cache

    before = {k: getattr(jax.config, k) for k in _SETTINGS}
    path = compilation_cache(directory, min_compile_s=min_compile_s)
    moved = before["jax_compilation_cache_dir"] != str(path)
    if moved:
        jax_cache.reset_cache()
    try:
        yield path
    finally:
        for k, v in before.items():
            jax.config.update(k, v)
        if moved:
            jax_cache.reset_cache()
