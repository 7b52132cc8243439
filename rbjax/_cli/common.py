"""What the subcommands share: the error a user can fix, loading a model, the integrators by
name, optional imports, input files, output paths checked before any work and written with
a message, and ``key=value`` options."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import tempfile
import warnings
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from .. import __version__
from .._integrators import RK4, AbstractIntegrator, ImplicitMidpoint, Projected, SemiImplicitEuler
from .._io.load import Loaded
from .._results import RESULTS
from .._tree.implicit import ImplicitFast


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


COORDINATES = ("joint", "maximal")
"""The formulations ``--coordinates`` chooses between for an MJCF/URDF file."""


@dataclasses.dataclass(frozen=True)
class Opened(Loaded):
    """:class:`rbjax.Loaded` as the command line loads it: also the ``coordinates`` it chose
    ("joint", "maximal", or "file" for an rbjax model file), ``why`` (one phrase: the reason of
    the default, or "--coordinates"), the compiled ``mjmodel`` of an MJCF/URDF file (None for
    a model file) and ``not_simulated`` (the loader's warning about elements it leaves out, or
    None)."""

    coordinates: str = "file"
    why: str = ""
    mjmodel: Any = None
    not_simulated: str | None = None


def load_model(path: str, *, control=None, meshes: bool = True, coordinates: str | None = None):
    """:func:`rbjax.load` with the command line's messages: a missing file or extension, or a
    missing ``mujoco`` package, is a CliError naming the fix. ``control``: constant actuator
    controls of an MJCF/URDF model (a model file refuses them: its controls are in the file);
    ``meshes=False`` (--no-meshes): an MJCF/URDF model without its mesh geoms.
    ``coordinates`` (--coordinates): "joint" (a :class:`rbjax.JointModel`) or "maximal" (an
    :class:`rbjax.Model`) for an MJCF/URDF file; None chooses by :func:`default_coordinates`.
    Returns an :class:`Opened`."""
    from .._io.load import default_coordinates, load

    input_file(path, "MODEL", "give the path of a .xml, .urdf or .toml file")
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".xml", ".mjcf", ".urdf"):
        if coordinates is not None and ext == ".toml":
            raise CliError(
                f"--coordinates {coordinates}: MODEL {path!r} is an rbjax model file, which "
                "carries its own formulation. Fix: leave out --coordinates (it applies to MJCF "
                "and URDF files)."
            )
        loaded = load(path, **_options(control, meshes))
        return Opened(loaded.model, loaded.state, loaded.timestep, loaded.source)
    try:
        import mujoco  # noqa: F401
    except ImportError as exc:
        raise CliError(
            f"MODEL {path!r} is MJCF/URDF, which rbjax reads through MuJoCo's compiler, and "
            "the mujoco package is not installed. Fix: pip install 'rbjax[mujoco]'."
        ) from exc
    from .._io.mujoco import _compile, _mujoco

    m = _compile(_mujoco(), path, meshes)
    why = "--coordinates"
    if coordinates is None:
        coordinates, why = default_coordinates(m)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if coordinates == "joint":
            from .._io.mujoco_tree import build_tree_from_mujoco

            model, state, timestep, source = build_tree_from_mujoco(m, control=control)
            loaded = Loaded(model, state, timestep, source)
        else:
            from .._dynamics import ScalableDAE

            loaded = load(path, formulation=ScalableDAE(), **_options(control, meshes))
    notes = []
    for w in caught:  # shown as the command line shows every warning (rbjax/_cli/__init__.py)
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        if "NOT simulated" in str(w.message):
            notes.append(str(w.message))
    return Opened(
        loaded.model,
        loaded.state,
        loaded.timestep,
        loaded.source,
        coordinates=coordinates,
        why=why,
        mjmodel=m,
        not_simulated="\n".join(notes) or None,
    )


def _options(control, meshes: bool) -> dict:
    options: dict = {} if control is None else {"control": control}
    if not meshes:
        options["meshes"] = False
    return options


def add_coordinates(p) -> None:
    """The --coordinates option of the commands that load a MODEL."""
    p.add_argument(
        "--coordinates",
        choices=COORDINATES,
        default=None,
        help="MJCF/URDF: simulate in joint coordinates (MuJoCo's qpos/qvel, rbjax.JointModel) "
        "or maximal coordinates (every body's pose, rbjax.Model); default joint when the "
        "file's joints form a tree, maximal when a connect or weld equality closes a loop",
    )


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
"""The integrators of maximal coordinates: ``INTEGRATORS[name]()`` makes one."""
ALL_INTEGRATORS: dict[str, Callable[[], AbstractIntegrator]] = INTEGRATORS | {
    "implicitfast": ImplicitFast
}
"""Every integrator the commands offer, implicitfast for joint coordinates only."""
JOINT_INTEGRATORS = ("rk4", "semi-implicit-euler", "implicitfast")
"""Those that integrate joint coordinates (rbjax/_tree/rollout.py)."""
MAXIMAL_INTEGRATORS = tuple(INTEGRATORS)
"""Those that integrate maximal coordinates."""


def integrator_for(name: str | None, loaded) -> str:
    """The integrator's name: ``name`` (--integrator) if it integrates the loaded model's
    coordinates, else a CliError naming the fix; None: "implicitfast" for joint coordinates
    of a file that asks for MuJoCo's implicit or implicitfast integrator (stiff dampers and
    servos, unstable with RK4 at the file's step), else "rk4"."""
    joint = isinstance(loaded, Opened) and loaded.coordinates == "joint"
    if name is None:
        m = loaded.mjmodel if isinstance(loaded, Opened) else None
        asks = m is not None and int(m.opt.integrator) in (2, 3)  # mjINT_IMPLICIT, _IMPLICITFAST
        return "implicitfast" if joint and asks else "rk4"
    allowed = JOINT_INTEGRATORS if joint else MAXIMAL_INTEGRATORS
    if name not in allowed:
        other = "--coordinates maximal" if joint else "--coordinates joint (MJCF/URDF trees)"
        where = "joint" if joint else "maximal"
        raise CliError(
            f"--integrator {name} does not integrate {where} coordinates (those that do: "
            f"{', '.join(allowed)}). Fix: choose one of them, or {other}."
        )
    return name


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


def run_meta(args, dt, n_steps: int, save_every: int, perturb, control, times, dtype) -> dict:
    """The ``meta`` of ``rbjax simulate``'s run file, either formulation (the caller adds what
    is its own: "coordinates", "formulation"). ``times``: the wall time of each segment, the
    first one including the compilation: compile_s is what the first segment took beyond the
    median of the others (None with one segment), run_s the rest."""
    compile_s = max(times[0] - float(np.median(times[1:])), 0.0) if len(times) > 1 else None
    run_s = float(np.sum(times[1:]) + (times[0] - (compile_s or 0.0)))
    return {
        "model": args.model,
        "dt": dt,
        "n_steps": n_steps,
        "save_every": save_every,
        "integrator": args.integrator,
        "batch": args.batch,
        "perturb": perturb,
        "seed": args.seed if args.batch else None,
        "ctrl": None if control is None else control.tolist(),
        "compile_s": compile_s,
        "run_s": run_s,
        "rbjax": __version__,
        "jax": jax.__version__,
        "device": str(jax.devices()[0].device_kind),
        "dtype": str(dtype),
    }


def print_run(args, header: str, arrays: dict, meta: dict, result, failed, fix: str) -> int:
    """``rbjax simulate``'s report, either formulation: ``header`` (the model and the run),
    the compile/run split of :func:`run_meta`, the energy change (and the joint residual
    where the run file has one), the files written, and the first failure with ``fix``.
    Returns the exit code (1 if a system failed)."""
    n_sys = 1 if args.batch is None else args.batch
    steps = meta["n_steps"] * n_sys
    print(header)
    compile_txt = "n/a (one segment)" if meta["compile_s"] is None else f"{meta['compile_s']:.2f} s"
    rate = steps / max(meta["run_s"], 1e-12)
    print(f"compile {compile_txt}; run {meta['run_s']:.2f} s ({rate:.3g} steps/s)")
    energy = arrays["total_energy"]
    drift = np.nanmax(np.abs(energy - energy[..., :1]))
    line = f"energy change max |E(t) - E(0)| = {drift:.3g} J"
    if "position_residual" in arrays:
        line += f"; joint residual max |Phi| = {np.nanmax(arrays['position_residual']):.3g}"
    print(line)
    print(f"wrote {args.out}" + (f" and {args.csv}" if args.csv else ""))
    bad = np.flatnonzero(np.asarray(result).reshape(-1) != 0)
    if not bad.size:
        return 0
    flat_f = np.asarray(failed).reshape(-1)
    flat_r = np.asarray(result).reshape(-1)
    first = int(bad[0])
    which = "" if args.batch is None else f"sample {first} "
    print(
        f"FAILED: {bad.size} of {n_sys} system(s); {which}at step {int(flat_f[first])}: "
        f"{RESULTS(int(flat_r[first])).message}. Fix: {fix}.",
    )
    return 1


def print_check(rep: dict) -> None:
    """The human-readable lines of ``rbjax check``'s report, either formulation (joint
    coordinates: rbjax/_cli/joint.py ``check_report``, whose report has ``equalities``;
    maximal: rbjax/_cli/check.py ``report``)."""
    joint = "equalities" in rep
    joints = ", ".join(f"{n} {k}" for k, n in rep["joints"].items()) or "none"
    print(f"model        {rep['model']}")
    merged = "; ".join(f"{b} into {into}" for b, into in rep.get("merged", {}).items())
    merged = f"; welded bodies merged: {merged}" if merged else ""
    print(f"bodies       {len(rep['bodies'])} ({rep['total_mass']:.6g} kg in all{merged})")
    why = f" ({rep['coordinates_choice']}; --coordinates maximal for the other)" if joint else ""
    print(f"joints       {joints}; formulation {rep['formulation']}{why}")
    c = rep.get("coordinates") or {}
    if joint:
        print(f"mobility     {rep['dof']} degrees of freedom (nq = {c['nq']}, nv = {c['nv']})")
        print(f"equalities   {', '.join(rep['equalities']) or 'none'}")
        if rep["not_simulated"]:
            print("not simulated " + " ".join(rep["not_simulated"].split("\n")[1:]).strip())
    elif "rank" in rep:
        print(
            f"mobility     {rep['dof']} degrees of freedom (rank {rep['rank']} of "
            f"{rep['rows']} joint equations)"
        )
        print(f"redundant    {', '.join(rep['redundant']) or 'none'}")
        worst_p = max(v["position"] for v in rep["residual"].values())
        worst_v = max(v["velocity"] for v in rep["residual"].values())
        print(f"assembly     largest residual |Phi| = {worst_p:.3g}, |W u + Phi_t| = {worst_v:.3g}")
    else:
        print(f"mobility     {rep['dof']} degrees of freedom (free bodies)")
    if c and not joint:
        kind = "MuJoCo qpos/qvel" if c["kind"] == "mujoco" else "rbjax.JointSpace"
        print(
            f"coordinates  nq = {c['nq']}, nv = {c['nv']} ({kind}); constraints outside the "
            f"joint tree: {', '.join(c['loops']) or 'none'}"
        )
    print(
        f"energy       kinetic {rep['kinetic_energy']:.6g} J, potential "
        f"{rep['potential_energy']:.6g} J, total {rep['total_energy']:.6g} J"
    )
    print(f"accelerations largest |{'qacc' if joint else 'u_dot'}| = {rep['max_acceleration']:.3g}")
    if "trial" in rep:
        tr = rep["trial"]
        text = f"{tr['steps']} RK4 steps of {tr['dt']:g} s: "
        if tr["finite"]:
            text += f"energy change {tr['energy_change']:.3g} J"
            text += f", joint residual {tr['residual']:.3g}" if "residual" in tr else ""
            if "quaternion_drift" in tr:
                text += f", quaternion length drift {tr['quaternion_drift']:.3g}"
        else:
            text += "FAILED"
        print(f"trial        {text}")
    for f in rep["failures"]:
        print(f"FAILED: {f}")
    print("all checks passed" if not rep["failures"] else f"{len(rep['failures'])} check(s) failed")
