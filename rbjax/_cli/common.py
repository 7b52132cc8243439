"""What the subcommands share: the error a user can fix, loading a model, the integrators by
name, optional imports, input files, output paths checked before any work and written with
a message, and ``key=value`` options."""

from __future__ import annotations

import contextlib
import math
import os
import sys
import tempfile
from collections.abc import Callable

from .._integrators import RK4, AbstractIntegrator, ImplicitMidpoint, Projected, SemiImplicitEuler


class CliError(Exception):
    """An input error the user can fix: printed as one line, exit code 2."""


def input_file(path: str, argument: str, fix: str) -> str:
    """``path`` if it is a readable file; else a CliError saying what it is instead (missing,
    a folder, unreadable) with ``fix`` (what to give)."""
    if not os.path.exists(path):
        raise CliError(f"{argument} {path!r} does not exist. Fix: {fix}.")
    if os.path.isdir(path):
        raise CliError(f"{argument} {path!r} is a folder, not a file. Fix: {fix}.")
    if not os.path.isfile(path) or not os.access(path, os.R_OK):
        raise CliError(f"{argument} {path!r} is not a readable file. Fix: {fix}.")
    return path


def load_model(path: str, *, control=None, meshes: bool = True):
    """:func:`rbjax.load` with the command line's messages: a missing file or extension, or a
    missing ``mujoco`` package, is a CliError naming the fix. ``control``: constant actuator
    controls of an MJCF/URDF model (a model file refuses them: its controls are in the file);
    ``meshes=False`` (--no-meshes): an MJCF/URDF model without its mesh geoms."""
    from .._io.load import load

    input_file(path, "MODEL", "give the path of a .xml, .urdf or .toml file")
    ext = os.path.splitext(path)[1].lower()
    if ext in (".xml", ".mjcf", ".urdf"):
        try:
            import mujoco  # noqa: F401
        except ImportError as exc:
            raise CliError(
                f"MODEL {path!r} is MJCF/URDF, which rbjax reads through MuJoCo's compiler, and "
                "the mujoco package is not installed. Fix: pip install 'rbjax[mujoco]'."
            ) from exc
    options: dict = {} if control is None else {"control": control}
    if not meshes:
        options["meshes"] = False
    return load(path, **options)


def add_meshes(p) -> None:
    """The --no-meshes flag of the commands that load a MODEL."""
    p.add_argument(
        "--no-meshes",
        dest="meshes",
        action="store_false",
        help="MJCF/URDF: leave out the mesh geoms (meshes not at hand, e.g. package:// URIs); "
        "refused unless every body with one has an <inertial>",
    )


def projected_rk4() -> Projected:
    """RK4 followed by projection onto the constraint manifolds (positions and velocities,
    rbjax.Projected's default tolerance and iterations)."""
    return Projected(RK4())


INTEGRATORS: dict[str, Callable[[], AbstractIntegrator]] = {
    "rk4": RK4,
    "projected-rk4": projected_rk4,
    "implicit-midpoint": ImplicitMidpoint,
    "semi-implicit-euler": SemiImplicitEuler,
}
"""The integrators the commands offer: ``INTEGRATORS[name]()`` makes one."""


def pyplot():
    """matplotlib.pyplot with the file backend (Agg), or a CliError naming the extra."""
    try:
        import matplotlib
    except ImportError as exc:
        raise CliError(
            "drawing needs matplotlib, which is not installed. Fix: pip install 'rbjax[plot]'."
        ) from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def output_path(path: str, extensions: tuple[str, ...], what: str, option: str = "--out") -> str:
    """Check, before any work, that ``path`` has one of ``extensions`` and can be written
    (:func:`writable`); ``option`` names the argument in the message."""
    ext = os.path.splitext(path)[1].lower()
    example = f"{what.split()[0]}{extensions[0]}"
    if ext not in extensions:
        raise CliError(
            f"{option} {path!r} has extension {ext or '(none)'!r}; {what} is written as "
            f"{' or '.join(extensions)}. Fix: e.g. {option} {example}."
        )
    return writable(path, option, example)


def writable(path: str, option: str, example: str) -> str:
    """``path`` if a file can be written there: not a folder, in an existing folder where a
    file can be created (one is, and removed: the writers write a temporary file and rename
    it into place), writable if it exists. ``example`` is a file name for the fix."""
    if os.path.isdir(path):
        raise CliError(
            f"{option} {path!r} is a folder. Fix: give a file name, e.g. "
            f"{option} {os.path.join(path, example)}."
        )
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CliError(
            f"{option} {path!r}: folder {folder!r} does not exist. Fix: create it first."
        )
    if os.path.exists(path) and not (os.path.isfile(path) and os.access(path, os.W_OK)):
        raise CliError(
            f"{option} {path!r} exists and cannot be overwritten. Fix: remove it or write elsewhere."
        )
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".rbjax-"):
            pass
    except OSError as exc:
        raise CliError(
            f"{option} {path!r}: cannot write in folder {folder!r} ({exc.strerror or exc}). "
            f"Fix: write elsewhere, e.g. {option} {example} in the current folder."
        ) from None
    return path


@contextlib.contextmanager
def writing(path: str, option: str = "--out"):
    """Turn an OSError while writing ``path`` (a full disk, a folder removed during the run)
    into a CliError naming it."""
    try:
        yield
    except OSError as exc:
        raise CliError(
            f"{option} {path!r} could not be written ({exc.strerror or exc}). Fix: free space "
            "there or write elsewhere."
        ) from None


def key_values(items, option: str, known: dict[str, str]) -> dict[str, float]:
    """``["name=value", ...]`` into {name: float}; names must be among ``known`` (name ->
    meaning, listed in the message of an unknown name)."""
    out: dict[str, float] = {}
    for item in items or ():
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep:
            raise CliError(f"{option} {item!r} is not NAME=VALUE. Fix: e.g. {option} qpos=0.01.")
        if name not in known:
            listed = "; ".join(f"{k}: {v}" for k, v in known.items())
            raise CliError(f"{option} {item!r}: unknown name {name!r}. Fix: use one of {listed}.")
        try:
            number = float(value)
        except ValueError:
            raise CliError(
                f"{option} {item!r}: {value!r} is not a number. Fix: e.g. {option} {name}=0.01."
            ) from None
        if not math.isfinite(number) or number < 0:
            raise CliError(
                f"{option} {item!r}: {number} is not a finite value >= 0. Fix: e.g. {option} "
                f"{name}=0.01."
            )
        out[name] = number
    return out


def show_progress(flag: bool | None) -> bool:
    """Progress bars on a terminal unless --no-progress (or when --progress forces them)."""
    return sys.stderr.isatty() if flag is None else flag


def add_progress(p) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--progress",
        dest="progress",
        action="store_true",
        default=None,
        help="show progress bars even when stderr is not a terminal",
    )
    g.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
