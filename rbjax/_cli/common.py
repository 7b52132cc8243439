"""What the subcommands share: the error a user can fix, loading a model, the integrators by
name, optional imports, output paths and ``key=value`` options."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from .._integrators import RK4, AbstractIntegrator, ImplicitMidpoint, Projected, SemiImplicitEuler


class CliError(Exception):
    """An input error the user can fix: printed as one line, exit code 2."""


def load_model(path: str, *, control=None):
    """:func:`rbjax.load` with the command line's messages: a missing file or extension, or a
    missing ``mujoco`` package, is a CliError naming the fix. ``control``: constant actuator
    controls of an MJCF/URDF model (a model file refuses them: its controls are in the file)."""
    from .._io.load import load

    if not os.path.exists(path):
        raise CliError(
            f"MODEL {path!r} does not exist. Fix: give the path of a .xml, .urdf or .toml file."
        )
    ext = os.path.splitext(path)[1].lower()
    if ext in (".xml", ".mjcf", ".urdf"):
        try:
            import mujoco  # noqa: F401
        except ImportError as exc:
            raise CliError(
                f"MODEL {path!r} is MJCF/URDF, which rbjax reads through MuJoCo's compiler, and "
                "the mujoco package is not installed. Fix: pip install 'rbjax[mujoco]'."
            ) from exc
    return load(path) if control is None else load(path, control=control)


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


def output_path(path: str, extensions: tuple[str, ...], what: str) -> str:
    """Check that ``path`` has one of ``extensions`` and that its folder exists."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in extensions:
        raise CliError(
            f"--out {path!r} has extension {ext or '(none)'!r}; {what} is written as "
            f"{' or '.join(extensions)}. Fix: e.g. --out {what.split()[0]}{extensions[0]}."
        )
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CliError(f"--out {path!r}: folder {folder!r} does not exist. Fix: create it first.")
    return path


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
        if not number >= 0:
            raise CliError(f"{option} {item!r}: {number} is negative. Fix: give a value >= 0.")
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
