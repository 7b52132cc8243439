"""``rbjax identify CONFIG``: fit masses, inertias, spring-damper coefficients, gravity and
initial joint coordinates of a model to measured motion, described by a TOML file.

The configuration (paths relative to the configuration file)::

    model = "pendulum.toml"        # MJCF (.xml), URDF (.urdf) or rbjax model file (.toml)
    data = "measured.npz"          # a run file of 'rbjax simulate', or any .npz with 't'
    dt = 0.01                      # largest integration step [s] (default: the model's timestep)
    integrator = "rk4"             # rk4 | semi-implicit-euler | implicitfast (joint coordinates)
                                   #   | projected-rk4 | implicit-midpoint (maximal); default
                                   #   as 'rbjax simulate': implicitfast for joint coordinates
                                   #   of a file asking MuJoCo for implicit(fast), else rk4
    sample = 0                     # which run of a batch run file (required for a batch)
    out = "fit.json"               # optional: write the results as JSON (--out overrides)

    [state]                        # optional: the initial state at t[0], in joint coordinates
    qpos = { shoulder = 0.8 }      # joint names (free bodies by body name): MuJoCo's qpos for
    qvel = { shoulder = 0.0 }      # MJCF/URDF; a number, or a list for several coordinates

    [[observations]]               # what was measured; one table per quantity
    kind = "position"              # position | orientation | velocity | angular_velocity
    body = "link1"                 #   | joint_position | joint_velocity
    point = [0.0, 0.0, -0.5]       # position: the marker in body axes from the centre of mass
    array = "q"                    # the data array (default below)
    sigma = 1e-3                   # noise standard deviation: a number or one per component

    [[observations]]
    kind = "joint_velocity"
    coordinate = "shoulder"        # a joint coordinate (joint name)
    sigma = 0.01

    [[parameters]]                 # what to fit; the rest of the model stays as loaded
    kind = "mass"                  # mass | inertia | damping | stiffness | gravity
    body = "link1"                 #   | joint_position | joint_velocity
    initial = 1.2                  # the starting guess (default: the model's value)

    [solver]
    name = "levenberg-marquardt"   # or "lbfgs"
    max_steps = 100
    tol = 1e-10                    # relative loss decrease and ...
    xtol = 1e-8                    # ... relative step: together they stop the fit
    segments = 1                   # multiple shooting (rbjax.Shooting) with this many segments

Observations (``rbjax.Position`` and its siblings; joint coordinates through ``rbjax.Custom``):

* ``position`` (``body``, ``point``): the world position [m] of a body point;
  ``orientation`` (``body``): the body's unit quaternion (w, x, y, z), residuals in rad;
  ``velocity`` (``body``): the world velocity of the centre of mass [m/s];
  ``angular_velocity`` (``body``, ``frame`` = "body" | "world") [rad/s];
  ``joint_position`` / ``joint_velocity`` (``coordinate``): a joint coordinate (a
  revolute's angle [rad], a prismatic's displacement [m], ...) or its rate, in the model
  file's own coordinates: MuJoCo's ``qpos``/``qvel`` for an MJCF or URDF file (a free
  joint's position is its body frame's origin), ``rbjax.JointSpace(model)``'s for a model
  file (a free body's centre of mass), as ``rbjax simulate`` writes them.
* ``array`` names the data: an array (T, nb, 7) of body states as a run file stores them (``q``
  positions of the centres of mass and quaternions, ``u`` velocities and body-axis angular
  velocities; the body is found by the file's ``body_names``, else by the model's order), or
  an array (T, 3) of the measured quantity itself (T, 4 for quaternions), or for position and
  orientation an array (T, nb, 3) of centres of mass or (T, nb, 4) of body attitudes (a
  joint-coordinate run file's ``xipos`` and ``xquat``, MuJoCo's; a ``point`` turns with the
  data's ``xquat``). Defaults: ``q`` for position and orientation (``xipos`` / ``xquat``
  where the data has no ``q``), ``u`` for velocity and angular velocity. Joint kinds default to
  ``qpos`` / ``qvel`` and take the columns named by ``qpos_names`` / ``qvel_names`` (the
  coordinate's name, or ``name:k`` / ``name[k]`` / ``name.k`` for a joint of several), or a
  plain array (T,) or (T, n). Rows with a NaN are missing samples (masked).

Parameters (the fitted coordinate in parentheses; values and standard errors are reported
in physical units, by the delta method):

* ``mass`` (``body``) [kg] (log); ``inertia`` (``body``) [kg m²]: ``initial`` three principal
  moments about the body axes (log of each; the body axes stay principal axes) or a 3×3
  matrix (its six entries, unconstrained: start near the truth); the default is the model's
  inertia, principal if it is diagonal;
* ``damping``, ``stiffness`` of a spring-damper (log): ``force`` = its index in the model's
  forces (the order of ``[[forces]]`` in a model file) or ``joint`` = the joint across which it
  acts (the one spring-damper between that joint's two bodies, as MJCF joint damping is);
* ``gravity`` [m/s²] (the vector);
* ``joint_position``, ``joint_velocity`` (``coordinate``): the initial joint coordinates (in
  maximal coordinates the state is then built by rbjax.state_from_joint_coordinates at every
  step of the fit; in joint coordinates they are the initial JointState's qpos/qvel).

Coordinates: an MJCF/URDF tree is fitted in joint coordinates (rbjax.JointModel, MuJoCo's
qpos/qvel), a file whose connect or weld equality closes a loop in maximal coordinates, as
``rbjax simulate`` does; ``--coordinates maximal`` (or ``joint``) chooses. Both integrate the
same equations and give the same estimates (to the maximal integrator's drift). In joint coordinates ``damping``/``stiffness`` name a ``joint`` (MuJoCo's per-joint
damping and stiffness; ``force`` = k is refused) and the run file's body states of either
formulation are read as above.

Positive quantities are fitted as logarithms, so ``initial`` must be > 0 and every step is
physical. ``bounds = [low, high]`` (any kind but a full 3×3 inertia; low ≥ 0 for a positive
one) keeps every scalar of the parameter inside the interval, as a bounded solver's box
constraint does: it is fitted as rbjax.Bounded's raw value, low + (high − low)·sigmoid(raw),
and ``initial`` must lie strictly inside. A parameter that ends at its bound (within 1e-6 of the
interval's width) is reported as such, exit status 1, with the fix to widen the bounds. A parameter is not determined by the data when rbjax.identify reports it in an
unidentifiable direction, or when its standard error in the fitted coordinate exceeds 1e6
(the data depend on it at rounding level only: rbjax.identify's scaled test cannot tell
such a Jacobian column from a real one). Exit status: 0 converged with every parameter determined by the data; 1 the fit
did not converge, a parameter is not determined by the data or ended at its bound (named), or
the simulation diverged; 2 the configuration or its files are wrong (the message names the field path, e.g.
``parameters[1].body``, and the fix).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys
import textwrap
from typing import Any

import numpy as np

from . import arguments, config, quantities
from .common import (
    ALL_INTEGRATORS,
    JOINT_INTEGRATORS,
    MAXIMAL_INTEGRATORS,
    CliError,
    add_coordinates,
    add_meshes,
    integrator_for,
    load_model,
    output_path,
    writing,
)
from .config import array, fail, integer, number, string, table
from .coordinates import Coordinates
from .measured import load_data
from .observations import observation
from .parameters import Build, Param, parameter
from .quantities import Layout

# The configuration is read field by field, each error naming its path: config.py (the
# generic readers), measured.py (the data file), coordinates.py (joint coordinates by name),
# observations.py ([[observations]]) and parameters.py ([[parameters]] and build). This module
# puts them together into the problem rbjax.identify solves, runs it and reports.

SOLVERS = ("levenberg-marquardt", "lbfgs")
TOP_KEYS = (
    "model",
    "data",
    "dt",
    "integrator",
    "sample",
    "out",
    "state",
    "observations",
    "parameters",
    "solver",
)
SOLVER_KEYS = ("name", "max_steps", "tol", "xtol", "gtol", "segments")
ROUNDING_STD = 1e6  # a standard error above this in the fitted coordinate: not determined


def add_parser(sub):
    p = sub.add_parser(
        "identify",
        help="fit masses, inertias, spring-dampers, gravity and initial joint coordinates to "
        "measured motion (a TOML configuration)",
        description=_help(),
        epilog="exit codes: 0 converged, every parameter determined by the data; 1 not "
        "converged, a parameter the data do not determine (named), or a diverged simulation; "
        "2 a wrong configuration (the message names the field and the fix). The full format: "
        "docstring of rbjax/_cli/identify.py.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("config", metavar="CONFIG", help="the identification configuration (.toml)")
    p.add_argument("--out", help="write the results as JSON here (overrides the config's out)")
    p.add_argument(
        "--max-steps",
        type=arguments.integer("--max-steps", "100", minimum=0, maximum=10**6),
        dest="max_steps",
        help="optimiser steps at most (overrides solver.max_steps; 0 only evaluates the start)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the results as JSON on stdout (the table goes to stderr)",
    )
    add_coordinates(p)
    add_meshes(p)
    p.set_defaults(run=run)


def _help() -> str:
    """The command's help: the module docstring, its format block dedented."""
    doc = (__doc__ or "").replace("``", "'")
    head, rest = doc.split("The configuration (paths relative to the configuration file)::")
    block, tail = rest.split("\n\nObservations", 1)
    return (
        f"{head.strip()}\n\nThe configuration (paths relative to it):\n"
        f"{textwrap.dedent(block)}\n\nObservations{tail}"
    )


def _load_model(config_dir: str, doc: dict, meshes: bool = True, coordinates: str | None = None):
    """The configuration's model; an MJCF/URDF file in ``coordinates`` (--coordinates; None:
    joint coordinates for a tree, rbjax/_io/load.py ``default_coordinates``)."""
    path = os.path.join(config_dir, string("model", doc["model"]))
    try:
        loaded = load_model(path, meshes=meshes, coordinates=coordinates)
    except CliError as exc:
        raise CliError(f"model: {exc}") from None
    except ValueError as exc:  # the model file's own field-path message
        raise CliError(f"model: {path!r}: {exc}") from None
    return loaded


# ------------------------------------------------------------------------ the problem


@dataclasses.dataclass
class _Problem:
    """Everything identify needs, validated, and what the report needs."""

    build: Build
    params0: dict
    free: dict
    data: Any
    dt: float
    integrator: Any
    solver: Any
    solver_name: str
    shooting: Any
    max_steps: int
    tol: float
    xtol: float
    gtol: float
    specs: tuple[Param, ...]
    initial: np.ndarray
    out: str | None
    n_values: int
    coordinates: str  # "joint", "maximal" (MJCF/URDF) or "file" (an rbjax model file)
    integrator_name: str  # the configuration's, else the file's (common.py integrator_for)


def _solver(args, doc: dict) -> tuple[str, int, float, float, float, int]:
    """[solver] with --max-steps: (name, max_steps, tol, xtol, gtol, segments)."""
    solver_doc = table("solver", doc.get("solver", {}), SOLVER_KEYS)
    solver_name = string("solver.name", solver_doc.get("name", SOLVERS[0]), SOLVERS)
    max_steps = integer(
        "solver.max_steps", solver_doc.get("max_steps", 100), minimum=0, example="max_steps = 100"
    )
    if args.max_steps is not None:  # checked when parsed
        max_steps = args.max_steps
    tol = number("solver.tol", solver_doc.get("tol", 1e-10), example="1e-10")
    xtol = number("solver.xtol", solver_doc.get("xtol", 1e-8), example="1e-8")
    gtol = number("solver.gtol", solver_doc.get("gtol", 1e-10), example="1e-10")
    for key, value in (("tol", tol), ("xtol", xtol), ("gtol", gtol)):
        if value < 0:
            fail(f"solver.{key}", "is negative", "give a value >= 0")
    segments = integer(
        "solver.segments", solver_doc.get("segments", 1), minimum=1, example="segments = 4"
    )
    return solver_name, max_steps, tol, xtol, gtol, segments


def _out(args, doc: dict, config_dir: str) -> str | None:
    """Where the JSON results go: --out, else the config's out (relative to it), else None."""
    if args.out is not None:
        return output_path(args.out, (".json",), "fit results")
    if "out" not in doc:
        return None
    out = os.path.join(config_dir, string("out", doc["out"]))
    if os.path.splitext(out)[1].lower() != ".json":
        fail("out", f"{doc['out']!r} is not a .json path", 'write e.g. out = "fit.json"')
    if not os.path.isdir(os.path.dirname(out)):
        fail("out", f"the folder of {out!r} does not exist", "create it first")
    return output_path(out, (".json",), "fit results", "out (CONFIG)")


def _prepare(args) -> _Problem:
    import jax.numpy as jnp

    from .. import LBFGS, JointModel, LevenbergMarquardt, Measurements, Shooting, joint_coordinates
    from .._identify.joint import arrays, like
    from .._model import require_model
    from .._state import State

    doc = config.read(args.config)
    config_dir = os.path.dirname(os.path.abspath(args.config))
    table("", doc, TOP_KEYS, ("model", "data", "observations", "parameters"))
    for key in ("observations", "parameters"):
        config.tables(key, doc[key])
    solver_name, max_steps, tol, xtol, gtol, segments = _solver(args, doc)
    integrator = (
        string("integrator", doc["integrator"], ALL_INTEGRATORS) if "integrator" in doc else None
    )
    out = _out(args, doc, config_dir)
    state_doc = table("state", doc.get("state", {}), ("qpos", "qvel"))
    for key in ("qpos", "qvel"):
        value = state_doc.get(key, {})
        table(f"state.{key}", value, list(value) if isinstance(value, dict) else ())

    loaded = _load_model(config_dir, doc, args.meshes, args.coordinates)
    model = loaded.model
    joint = isinstance(model, JointModel)
    # qpos/qvel: MuJoCo's for an MJCF or URDF file (a JointModel's own are)
    layout = Layout() if joint else quantities.layout(loaded)
    if integrator is not None:
        allowed = JOINT_INTEGRATORS if joint else MAXIMAL_INTEGRATORS
        if integrator not in allowed:
            other = "--coordinates maximal" if joint else "--coordinates joint (MJCF/URDF trees)"
            fail(
                "integrator",
                f"is {integrator!r}, which does not integrate {'joint' if joint else 'maximal'} "
                f"coordinates (those that do: {', '.join(allowed)})",
                f"choose one of them, or run with {other}",
            )
    else:  # as 'rbjax simulate': the stiff dampers a file integrates implicitly stay stable
        integrator = integrator_for(None, loaded)
    if "dt" in doc:
        dt = number("dt", doc["dt"], positive=True, example="0.01")
    elif loaded.timestep is not None:
        dt = float(loaded.timestep)
    else:
        fail("dt", "is missing and the model has no timestep", "set dt = the step in s, e.g. 0.01")
    data = load_data(config_dir, doc)

    # joint coordinates: needed by joint observations and parameters and by [state]
    cache: dict[str, Any] = {}

    def coords_of(path: str) -> Coordinates:
        if "c" not in cache:
            cache["c"] = Coordinates(model, path, layout)
        return cache["c"]

    joint_state = bool(state_doc) or any(
        isinstance(p, dict) and p.get("kind") in ("joint_position", "joint_velocity")
        for p in doc["parameters"]
    )
    qpos0 = qvel0 = np.zeros(0)
    if joint_state:  # NaN until given by [state], a parameter's initial or the model's state
        coords = coords_of("state")
        qpos0, qvel0 = np.full(coords.nq, np.nan), np.full(coords.nv, np.nan)
        for key, vec in (("qpos", qpos0), ("qvel", qvel0)):
            for name, value in state_doc.get(key, {}).items():
                start, n = coords.find(f"state.{key}.{name}", name, key == "qvel")
                vec[start : start + n] = array(
                    f"state.{key}.{name}", value, () if n == 1 else (n,), f"{n} number(s)"
                ).reshape(-1)
    elif loaded.state is None:
        fail(
            "state",
            "is missing and the model file has no initial state",
            "give the initial joint coordinates in [state] qpos = {...}, or add [initial] "
            "to the model file",
        )

    obs, n_values = [], 0
    for i, o in enumerate(doc["observations"]):
        coords = (
            coords_of(f"observations[{i}].coordinate")
            if isinstance(o, dict) and str(o.get("kind", "")).startswith("joint_")
            else None
        )
        ob, n_ok = observation(i, o, model, data, coords)
        obs.append(ob)
        n_values += n_ok * ob.dim

    def model_coordinates():  # the model's initial joint coordinates (computed once)
        if "qv" not in cache and loaded.state is not None and joint:
            cache["qp"], cache["qv"] = (np.asarray(a, float) for a in arrays(loaded.state))
        if "qv" not in cache and isinstance(loaded.state, State):
            cache["qp"], cache["qv"] = (
                np.asarray(a, float)
                for a in joint_coordinates(require_model(model), loaded.state, **layout.options())
            )
        return (cache["qp"], cache["qv"]) if "qv" in cache else None

    def start_value(velocity: bool, start: int, n: int):  # from [state], else the model
        given = (qvel0 if velocity else qpos0)[start : start + n]
        known = model_coordinates()
        if np.all(np.isfinite(given)) or known is None:
            return given if np.all(np.isfinite(given)) else None
        return known[1 if velocity else 0][start : start + n]

    specs, raws, initial, seen = [], [], [], {}
    for i, p in enumerate(doc["parameters"]):
        spec, raw, value = parameter(i, p, model, start_value, coords_of)
        if spec.kind in ("joint_position", "joint_velocity"):
            vec = qpos0 if spec.kind == "joint_position" else qvel0
            vec[spec.target : spec.target + spec.size] = value
        key = (spec.kind, spec.target)
        if key in seen:
            fail(
                f"parameters[{i}]",
                f"fits the same quantity as parameters[{seen[key]}] ({', '.join(spec.labels)})",
                "remove one of them",
            )
        seen[key] = i
        specs.append(spec)
        raws.append(jnp.asarray(raw, jnp.float64))
        initial.append(value)
    if joint_state and np.any(np.isnan(np.concatenate([qpos0, qvel0]))):
        known = model_coordinates()
        if known is not None:
            qpos0 = np.where(np.isnan(qpos0), known[0], qpos0)
            qvel0 = np.where(np.isnan(qvel0), known[1], qvel0)
        qvel0 = np.where(np.isnan(qvel0), 0.0, qvel0)  # at rest unless told otherwise
    if joint_state and np.any(np.isnan(qpos0)):
        coords = coords_of("state")
        missing = [
            n
            for n, (oq, nq, _, _) in coords.offsets.items()
            if np.any(np.isnan(qpos0[oq : oq + nq]))
        ]
        fail(
            "state.qpos",
            f"has no value for {', '.join(missing)} and the model file has no initial state",
            "give every joint coordinate in [state] qpos",
        )
    try:
        measurements = Measurements(data.t, obs)
    except ValueError as exc:
        raise CliError(f"observations: {exc}") from None
    t0 = float(data.t[0])
    state0 = None
    if loaded.state is not None:
        q, u = arrays(loaded.state)
        state0 = like(loaded.state, jnp.asarray(t0, q.dtype), q, u)
    params0 = {
        "fit": tuple(raws),
        "bounds": tuple(None if s.bounds is None else jnp.asarray(s.bounds) for s in specs),
        "model": model,
        "state0": state0,
        "qpos0": jnp.asarray(qpos0, jnp.float64),
        "qvel0": jnp.asarray(qvel0, jnp.float64),
        "t0": jnp.asarray(t0, jnp.float64),
    }
    free = {k: k == "fit" for k in params0}
    solver = LevenbergMarquardt() if solver_name == "levenberg-marquardt" else LBFGS()
    return _Problem(
        build=Build(tuple(specs), joint_state, layout),
        params0=params0,
        free=free,
        data=measurements,
        dt=dt,
        integrator=ALL_INTEGRATORS[integrator](),
        solver=solver,
        solver_name=solver_name,
        shooting=Shooting(segments) if segments > 1 else None,
        max_steps=max_steps,
        tol=tol,
        xtol=xtol,
        gtol=gtol,
        specs=tuple(specs),
        initial=np.concatenate(initial),
        out=out,
        n_values=n_values,
        coordinates=getattr(loaded, "coordinates", "file"),
        integrator_name=integrator,
    )


# failures of the fit itself (not of its input): exit status 1, not 2
_RUNTIME_FAILURES = ("identify: the simulation diverged", "identify: the loss at the initial guess")


def run(args) -> int:
    import jax

    jax.config.update("jax_enable_x64", True)  # identification needs float64 (and its tests)
    from .. import identify

    prob = _prepare(args)
    labels = [lab for s in prob.specs for lab in s.labels]
    report = sys.stderr if args.json else sys.stdout
    n_obs = len(prob.data.observations)
    where = {"file": "", "joint": ", joint coordinates", "maximal": ", maximal coordinates"}[
        prob.coordinates
    ]
    print(
        f"rbjax identify: {len(labels)} parameters ({', '.join(labels)}) from {prob.data.times.size} "
        f"sample times of {n_obs} observation{'s' * (n_obs != 1)} ({prob.n_values} values); "
        f"{prob.solver_name}, at most {prob.max_steps} steps, {prob.integrator_name}, "
        f"dt = {prob.dt:g} s{where}. "
        "Compiling the "
        "simulation and its derivatives, then fitting...",
        file=report,
        flush=True,
    )
    try:
        fit = identify(
            prob.build,
            prob.params0,
            prob.data,
            dt=prob.dt,
            free=prob.free,
            integrator=prob.integrator,
            solver=prob.solver,
            shooting=prob.shooting,
            max_steps=prob.max_steps,
            tol=prob.tol,
            xtol=prob.xtol,
            gtol=prob.gtol,
        )
    except ValueError as exc:
        if str(exc).startswith(_RUNTIME_FAILURES):
            print(f"rbjax identify: the fit failed: {exc}", file=sys.stderr)
            return 1
        raise
    result = _results(prob, fit, labels)
    _print_table(result, report)
    text = json.dumps(result, indent=2, allow_nan=False)
    if prob.out is not None:
        tmp = f"{prob.out}.part"
        with writing(prob.out, "--out" if args.out is not None else "out (CONFIG)"):
            with open(tmp, "w") as fh:
                fh.write(text + "\n")
            os.replace(tmp, prob.out)
        print(f"wrote {prob.out}", file=report)
    if args.json:
        print(text)
    ok = result["converged"] and not result["unidentifiable"] and not result["at_bound"]
    if not result["converged"]:
        print(
            f"rbjax identify: NOT converged ({fit.message}). Fix: raise solver.max_steps (or "
            "--max-steps), start closer to the solution, or split the horizon (solver.segments).",
            file=sys.stderr,
        )
    if result["unidentifiable"]:
        print(
            f"rbjax identify: the data do not determine {', '.join(result['unidentifiable'])}. "
            "Fix: fix them (remove them from [[parameters]]) or measure what depends on them.",
            file=sys.stderr,
        )
    if result["at_bound"]:
        bounds = {lab: s.interval for s in prob.specs for lab in s.labels}
        where = ", ".join(
            f"{lab} = {v:.6g} in [{bounds[lab][0]:g}, {bounds[lab][1]:g}]"
            for lab, v in zip(result["names"], result["values"], strict=True)
            if lab in result["at_bound"]
        )
        print(
            f"rbjax identify: the fit ended at a bound ({where}): the best fit inside the "
            "interval, not a minimum of the data's misfit, and its standard error means "
            "nothing. Fix: widen the bounds if the data should decide, or fix the parameter.",
            file=sys.stderr,
        )
    return 0 if ok else 1


def _finite(x: float) -> float | None:
    """JSON has no inf or NaN: an undetermined value is null."""
    return float(x) if math.isfinite(x) else None


def _results(prob: _Problem, fit, labels: list[str]) -> dict:
    """Physical values, standard errors and covariance by the delta method: x = exp(raw) for
    the logarithmic parameters (σ_x = x σ_raw), x = low + (high − low) sigmoid(raw) for the
    bounded ones (σ_x = (x − low)(high − x)/(high − low) σ_raw), x = raw otherwise."""
    fitted = [np.asarray(a, float).reshape(-1) for a in fit.params["fit"]]
    raw = np.concatenate(fitted)
    values = np.concatenate(
        [np.asarray(s.value(a), float) for s, a in zip(prob.specs, fitted, strict=True)]
    )
    scale = np.concatenate(
        [
            s.slope(v)
            for s, v in zip(
                prob.specs,
                np.split(values, np.cumsum([s.size for s in prob.specs])[:-1]),
                strict=True,
            )
        ]
    )
    coordinate = [s.coordinate for s in prob.specs for _ in range(s.size)]
    cov_raw = np.array(fit.covariance, float)
    assert cov_raw.shape == (raw.size, raw.size), (cov_raw.shape, raw.size)
    # rbjax.identify judges identifiability on the column-scaled Gauss-Newton matrix (free of
    # units), which cannot tell a Jacobian column of pure rounding error from a real one: the
    # moments of inertia about axes a planar pendulum never turns about get standard errors of
    # 1e27. A standard error above ROUNDING_STD in the fitted coordinate (the logarithm of a
    # positive quantity, else SI units) is such a column: the data do not depend on it.
    with np.errstate(invalid="ignore"):
        rounding = np.isfinite(np.diag(cov_raw)) & (
            np.sqrt(np.abs(np.diag(cov_raw))) > ROUNDING_STD
        )
    cov_raw[rounding, :] = np.nan
    cov_raw[:, rounding] = np.nan
    cov_raw[rounding, rounding] = np.inf
    with np.errstate(invalid="ignore"):
        cov = scale[:, None] * cov_raw * scale[None, :]
    std = np.sqrt(np.diag(cov))
    pinned = _at_bound(prob, values)
    at_bound = [lab for lab, p in zip(labels, pinned, strict=True) if p]
    undetermined = [
        lab for lab, s, p in zip(labels, std, pinned, strict=True) if not np.isfinite(s) and not p
    ]
    # the library names directions by raw pytree paths ("['fit'][1][0]"): use ours instead
    raw_names = [c + lab for lab, c in zip(labels, coordinate, strict=True)]
    lookup = dict(zip(fit.names, raw_names, strict=True))
    pattern = re.compile("|".join(re.escape(n) for n in sorted(lookup, key=len, reverse=True)))
    directions = [pattern.sub(lambda m: lookup[m.group(0)], d) for d in fit.unidentifiable]
    directions += [
        f"{raw_names[i]} ("
        + (
            "it ended at its bound: widen the bounds"
            if pinned[i]
            else "the data depend on it at rounding level only"
        )
        + ")"
        for i in np.flatnonzero(rounding)
    ]
    return {
        "converged": bool(fit.converged),
        "message": str(fit.message),
        "criterion": str(fit.criterion),
        "gradient_test": _finite(fit.gradient_test),
        "gauss_newton_decrease": _finite(fit.gauss_newton_decrease),
        "loss": float(fit.loss),
        "reduced_chi2": _finite(fit.reduced_chi2),
        "steps": int(fit.steps),
        "names": labels,
        "initial": [float(v) for v in prob.initial],
        "values": [float(v) for v in values],
        "std": [_finite(s) for s in std],
        "covariance": [[_finite(c) for c in row] for row in cov],
        "unidentifiable": undetermined,
        "at_bound": at_bound,
        "unidentifiable_directions": directions,
        "solver": prob.solver_name,
        "dt": prob.dt,
        "coordinates": prob.coordinates,
        "integrator": prob.integrator_name,
    }


def _at_bound(prob: _Problem, values: np.ndarray) -> np.ndarray:
    """Per scalar: a bounded parameter within 1e-6 of its interval's width of a bound (where
    d value/d raw < 1e-6 (high − low): the fit is held there by the bound, not the data)."""
    flags, k = np.zeros(values.size, bool), 0
    for s in prob.specs:
        if s.bounded:
            low, high = s.interval
            v = values[k : k + s.size]
            flags[k : k + s.size] = np.minimum(v - low, high - v) <= 1e-6 * (high - low)
        k += s.size
    return flags


def _print_table(r: dict, file) -> None:
    w = max(len(n) for n in r["names"] + ["parameter"])
    print(
        f"  {'parameter':{w}s}  {'initial':>14s}  {'estimate':>16s}  {'std error':>10s}", file=file
    )
    for n, v0, v, s in zip(r["names"], r["initial"], r["values"], r["std"], strict=True):
        sd = f"{s:10.3g}" if s is not None else f"{'inf':>10s}"
        print(f"  {n:{w}s}  {v0:14.6g}  {v:16.10g}  {sd}", file=file)
    chi2 = r["reduced_chi2"]
    state = "converged" if r["converged"] else "NOT converged"
    print(
        f"  final loss {r['loss']:.6g}, reduced chi² {chi2 if chi2 is None else f'{chi2:.4g}'}, "
        f"{r['steps']} steps, {state} ({r['message']})",
        file=file,
    )
    if r["unidentifiable"]:
        print(f"  not determined by the data: {', '.join(r['unidentifiable'])}", file=file)
        for d in r["unidentifiable_directions"]:
            print(f"    along {d}", file=file)
