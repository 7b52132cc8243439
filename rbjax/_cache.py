"""JAX's persistent compilation cache, turned on by one call.

Compiling a mechanism's programs takes seconds to minutes; the compiled executables depend only
on the program and the machine, so a second run of the same script can load them from disk
instead. JAX keeps such a cache (``jax_compilation_cache_dir``); this sets it up with the
defaults rbjax's own programs use. The warm-start times are measured in benchmarks/compile.py
(``--cache``).
"""

from __future__ import annotations

import os
from pathlib import Path

import jax

from ._errors import validates_inputs


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
