"""The rbjax model file: a mechanism in TOML, in the vocabulary of ME751 (bodies, joints by
type, spring-dampers, forces, drivers), read by :func:`rbjax.load` and written by
:func:`rbjax.save`.

TOML because people write these files by hand: it has comments, tables read like the
sections of a model description, numbers keep their exact value (floats are written with
Python's shortest round-trip repr, so save → load is bit for bit), and Python reads it with
the standard library (``tomllib``); JSON has no comments and YAML's implicit typing turns
``no`` into a boolean. The format::

    format = "rbjax-model 1"
    gravity = [0.0, 0.0, -9.81]
    formulation = "ScalableDAE"            # or "NewtonEuler", "UdwadiaSchutte"
    baumgarte = [10.0, 10.0]               # optional: Baumgarte's α, β [1/s] (rbjax.Model)
    merge_welded = true                    # optional: merge every Fixed-welded body (rbjax.Model)

    [[bodies]]
    name = "crank"
    mass = 1.0
    inertia = [0.01, 0.01, 0.002]          # principal moments, or a 3x3 matrix
    scalable = false                       # optional

    [[bodies]]
    name = "bolt"
    mass = 0.05
    point = true                           # a point mass (no inertia), welded by a Fixed joint

    [[joints]]
    type = "Revolute"                      # any joint of rbjax.joints, by class name
    name = "pin"
    body_i = "ground"                      # "ground" or a body name
    body_j = "crank"
    s_i = [0.0, 0.0, 0.0]                  # joint frames in body axes (rbjax.Revolute)
    s_j = [-0.15, 0.0, 0.0]
    z_i = [0.0, 1.0, 0.0]                  # z_j, x_i, x_j optional as in the constructor

    [[joints]]
    type = "RotationDriver"
    body_i = "ground"
    body_j = "crank"
    f = "omega*t"                          # an expression in t (rbjax.Expression)
    params = { omega = 6.283185307179586 }

    [[forces]]
    type = "RotationalSpringDamper"        # TranslationalSpringDamper, AxialSpringDamper,
    body_i = "ground"                      # PointForce, BodyTorque (frame = "body" or
    body_j = "crank"                       # "world": optional, default as in the class)
    axis_i = [0.0, 1.0, 0.0]
    ...
    [forces.actuator]                      # optional: rbjax.Actuator
    gain = [1.0, 0.0, 0.0]
    control = "0.2*sin(t)"                 # a number, an expression, or samples
                                           # { values = [...], dt = 0.01, hold = "zero" }

    [initial]                              # optional: the initial State
    t = 0.0
    q = [[...7 numbers per body...]]       # every body listed, merged or not
    u = [[...]]

Every error names the field path, the value and the fix (``joints[3].f: unknown name 'sn'
at column 5 ...``); unknown keys are errors (a misspelt key must not be ignored).
"""

from __future__ import annotations

import math
import os
import tomllib
import warnings
from typing import Any

import jax.numpy as jnp
import numpy as np

from .. import _joints as joints_module
from .._actuators import Actuator, ControlSequence
from .._body import Body
from .._dynamics import NewtonEuler, ScalableDAE, UdwadiaSchutte
from .._forces import BodyTorque, PointForce
from .._springs import AxialSpringDamper, RotationalSpringDamper, TranslationalSpringDamper
from .._state import State
from .._topology import GROUND
from .expressions import Expression

FORMAT = "rbjax-model 1"
_JOINTS = {
    name: getattr(joints_module, name)
    for name in (
        "Spherical",
        "Revolute",
        "Universal",
        "Cylindrical",
        "Translational",
        "Fixed",
        "Distance",
        "Parallel",
        "Perpendicular",
        "PointOnLine",
        "RotationDriver",
        "TranslationDriver",
    )
}
_FRAME = ("s_i", "s_j", "z_i", "z_j", "x_i", "x_j")
_FORCES: dict[str, tuple[type, tuple[str, ...], tuple[str, ...]]] = {
    # type: (class, body fields, parameter fields)
    "PointForce": (PointForce, ("body",), ("point_body", "force_world")),
    "BodyTorque": (BodyTorque, ("body",), ("torque_body",)),
    "TranslationalSpringDamper": (
        TranslationalSpringDamper,
        ("body_i", "body_j"),
        ("s_i", "s_j", "stiffness", "damping", "rest_length"),
    ),
    "RotationalSpringDamper": (
        RotationalSpringDamper,
        ("body_i", "body_j"),
        ("axis_i", "axis_j", "ref_i", "ref_j", "stiffness", "damping", "rest_angle"),
    ),
    "AxialSpringDamper": (
        AxialSpringDamper,
        ("body_i", "body_j"),
        ("s_i", "s_j", "axis_i", "stiffness", "damping", "rest_length"),
    ),
}
# static options of a force: type -> {field: default}; written only when not the default
_FORCE_OPTIONS: dict[str, dict[str, str]] = {
    "PointForce": {"frame": "world"},
    "BodyTorque": {"frame": "body"},
}
_FORMULATIONS = {
    "ScalableDAE": ScalableDAE,
    "NewtonEuler": NewtonEuler,
    "UdwadiaSchutte": UdwadiaSchutte,
}
_ACTUATOR = ("gain", "bias", "gear", "offset", "ctrl_range", "force_range", "control", "name")


class ModelFileError(ValueError):
    """A model file that cannot be read (a ValueError naming the field path and the fix)."""


def _err(path: str, problem: str, fix: str):
    raise ModelFileError(f"{path}: {problem}. Fix: {fix}")


def _keys(path: str, table: dict, allowed, required=()):
    if not isinstance(table, dict):
        _err(path, f"is {table!r}, not a table", "write it as a TOML table")
    for key in table:
        if key not in allowed:
            _err(f"{path}.{key}", "is not a known field", f"use one of {sorted(allowed)}")
    for key in required:
        if key not in table:
            _err(f"{path}.{key}", "is missing", "add it")


def _wrap(path: str, fn, *args, **kwargs):
    """Call a constructor; its ValueError becomes one naming the file's field path."""
    try:
        return fn(*args, **kwargs)
    except ModelFileError:
        raise
    except (ValueError, TypeError) as e:
        raise ModelFileError(f"{path}: {e}") from None


# ---------------------------------------------------------------------------------- reading


def read(path) -> tuple[Any, State | None, float | None]:
    """Parse and validate a model file; returns (model, state or None, timestep or None)."""
    from .._model import Model

    with open(path, "rb") as fh:
        try:
            doc = tomllib.load(fh)
        except tomllib.TOMLDecodeError as e:
            raise ModelFileError(
                f"{os.fspath(path)}: not valid TOML ({e}). Fix: check the syntax there."
            ) from None
    _keys(
        "model",
        doc,
        (
            "format",
            "gravity",
            "formulation",
            "baumgarte",
            "timestep",
            "bodies",
            "joints",
            "forces",
            "initial",
            "merge_welded",
        ),
        ("format", "bodies"),
    )
    if doc["format"] != FORMAT:
        _err("format", f"is {doc['format']!r}", f'write format = "{FORMAT}"')
    bodies_doc = doc["bodies"]
    if not isinstance(bodies_doc, list) or not bodies_doc:
        _err("bodies", "is empty", "add [[bodies]] tables")
    bodies, names = [], []
    for k, b in enumerate(bodies_doc):
        p = f"bodies[{k}]"
        _keys(p, b, ("name", "mass", "inertia", "scalable", "point"), ("name", "mass"))
        point = b.get("point", False)
        if not isinstance(point, bool):
            _err(f"{p}.point", f"is {point!r}", "write point = true for a point mass, or omit it")
        if point == ("inertia" in b):
            _err(
                p,
                "has both point = true and an inertia" if point else "has no inertia",
                "give an inertia, or point = true (a point mass, welded by a Fixed joint)",
            )
        if point:
            bodies.append(_wrap(p, Body.point_mass, b["mass"], name=str(b["name"])))
        else:
            bodies.append(
                _wrap(
                    p,
                    Body,
                    b["mass"],
                    np.asarray(b["inertia"], float),
                    scalable=bool(b.get("scalable", False)),
                    name=str(b["name"]),
                )
            )
        names.append(str(b["name"]))

    def body(p, value):
        if value == "ground":
            return GROUND
        if value not in names:
            _err(
                p,
                f"names body {value!r}, which is not in the file",
                f"use 'ground' or one of {names}",
            )
        return names.index(value)

    joints = [_joint(f"joints[{k}]", j, body) for k, j in enumerate(doc.get("joints", []))]
    forces = [_force(f"forces[{k}]", f, body) for k, f in enumerate(doc.get("forces", []))]
    formulation = doc.get("formulation", "ScalableDAE")
    if formulation not in _FORMULATIONS:
        _err("formulation", f"is {formulation!r}", f"use one of {sorted(_FORMULATIONS)}")
    model = _wrap(
        "model",
        Model,
        bodies,
        gravity=np.asarray(doc.get("gravity", [0.0, 0.0, 0.0]), float),
        joints=joints,
        forces=forces,
        formulation=_FORMULATIONS[formulation](),
        baumgarte=_baumgarte(doc.get("baumgarte")),
        merge_welded=_flag("merge_welded", doc.get("merge_welded", False)),
    )
    state = None
    if "initial" in doc:
        init = doc["initial"]
        _keys("initial", init, ("t", "q", "u"), ("q",))
        q = np.asarray(init["q"], float)
        u = np.asarray(init.get("u", np.zeros_like(q)), float)
        state = _wrap(
            "initial",
            State,
            t=jnp.asarray(float(init.get("t", 0.0))),
            q=jnp.asarray(q),
            u=jnp.asarray(u),
        )
        state = _wrap("initial", model.merge_state, state)  # the file lists every body
        state = _wrap("initial", model.check_state, state)
        if joints:
            state = _assembled(model, state)
    timestep = doc.get("timestep")
    if timestep is not None and not (isinstance(timestep, (int, float)) and timestep > 0):
        _err("timestep", f"is {timestep!r}", "give a positive step in seconds, or omit it")
    return model, state, None if timestep is None else float(timestep)


def _expression(path, value, params):
    if isinstance(value, str):
        return Expression(value, where=path, **(params or {}))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Expression(repr(float(value)), where=path)
    _err(path, f"is {value!r}", 'write an expression in t, e.g. "0.5*sin(2*pi*t)"')


def _joint(p, j, body):
    _keys(
        p,
        j,
        ("type", "name", "body_i", "body_j", *_FRAME, "length", "f", "params"),
        ("type", "body_i", "body_j"),
    )
    kind = j["type"]
    if kind not in _JOINTS:
        _err(f"{p}.type", f"is {kind!r}, not a joint type", f"use one of {sorted(_JOINTS)}")
    kwargs: dict[str, Any] = {k: np.asarray(j[k], float) for k in _FRAME if k in j}
    if "name" in j:
        kwargs["name"] = str(j["name"])
    if kind == "Distance":
        if "length" not in j:
            _err(f"{p}.length", "is missing", "give the distance in metres")
        kwargs["length"] = float(j["length"])
    elif "length" in j:
        _err(f"{p}.length", f"is not a field of {kind}", "remove it")
    if kind in ("RotationDriver", "TranslationDriver"):
        kwargs["f"] = _expression(f"{p}.f", j.get("f", "0"), j.get("params"))
    elif "f" in j or "params" in j:
        _err(f"{p}.f", f"{kind} has no driving function", "remove f/params, or use a driver type")
    return _wrap(
        p,
        _JOINTS[kind],
        body(f"{p}.body_i", j["body_i"]),
        body(f"{p}.body_j", j["body_j"]),
        **kwargs,
    )


def _control(p, c):
    if isinstance(c, dict):
        _keys(p, c, ("values", "dt", "t0", "hold"), ("values", "dt"))
        return _wrap(
            p,
            ControlSequence,
            np.asarray(c["values"], float),
            float(c["dt"]),
            float(c.get("t0", 0.0)),
            str(c.get("hold", "zero")),
        )
    if isinstance(c, (int, float)) and not isinstance(c, bool):
        return float(c)
    return _expression(p, c, None)


def _actuator(p, a):
    _keys(p, a, _ACTUATOR)
    kwargs = {
        k: a[k] for k in ("gain", "bias", "gear", "offset", "ctrl_range", "force_range") if k in a
    }
    if "control" in a:
        kwargs["control"] = _control(f"{p}.control", a["control"])
    return _wrap(p, Actuator, name=str(a.get("name", "actuator")), **kwargs)


def _force(p, f, body):
    kind = str(f.get("type")) if isinstance(f, dict) else ""
    if kind not in _FORCES:
        _err(f"{p}.type", f"is {kind!r}, not a force type", f"use one of {sorted(_FORCES)}")
    cls, body_fields, params = _FORCES[kind]
    actuated = kind in ("TranslationalSpringDamper", "RotationalSpringDamper", "AxialSpringDamper")
    required = params if kind in ("PointForce", "BodyTorque") else ()
    options = _FORCE_OPTIONS.get(kind, {})
    _keys(
        p,
        f,
        ("type", *body_fields, *params, *options, *(("actuator",) if actuated else ())),
        ("type", *body_fields, *required),
    )
    bodies = [body(f"{p}.{b}", f[b]) for b in body_fields]
    for b, field in zip(bodies, body_fields, strict=True):
        if b == GROUND and len(body_fields) == 1:
            _err(f"{p}.{field}", "is 'ground'", "a force on one body acts on a body")
    kwargs: dict[str, Any] = {
        k: (np.asarray(f[k], float) if isinstance(f[k], list) else float(f[k]))
        for k in params
        if k in f
    }
    if "actuator" in f:
        kwargs["actuator"] = _actuator(f"{p}.actuator", f["actuator"])
    for key in options:
        if key in f:
            if not isinstance(f[key], str):
                _err(f"{p}.{key}", f"is {f[key]!r}, not a string", f'write e.g. {key} = "world"')
            kwargs[key] = f[key]
    if kind in ("PointForce", "BodyTorque"):
        vectors = [kwargs.pop(k) for k in params]
        return _wrap(p, cls, bodies[0], *vectors, **kwargs)
    if kind == "TranslationalSpringDamper":
        return _wrap(p, cls, bodies[0], kwargs.pop("s_i"), bodies[1], kwargs.pop("s_j"), **kwargs)
    return _wrap(p, cls, *bodies, **kwargs)


def _assembled(model, state):
    """The file's initial state, assembled onto the joints when it is off them (a file that
    cannot be assembled: assemble's ValueError names the joints)."""
    from .._analysis.assembly import assemble
    from .._analysis.checks import check_mechanism_state

    try:
        check_mechanism_state(model, state)
        return state
    except ValueError as e:
        if "redundant" in str(e):
            raise ModelFileError(f"initial: {e}") from None
    try:
        fixed = assemble(model, state)
    except ValueError as e:
        raise ModelFileError(f"initial: the joints cannot be assembled: {e}") from None
    moved = float(np.max(np.abs(np.asarray(fixed.q) - np.asarray(state.q))))
    sped = float(np.max(np.abs(np.asarray(fixed.u) - np.asarray(state.u))))
    warnings.warn(
        f"load: the file's initial state violated the joints; it was assembled (coordinates "
        f"moved by up to {moved:.3g}, velocities changed by up to {sped:.3g}).",
        UserWarning,
        stacklevel=4,
    )
    return fixed


# ---------------------------------------------------------------------------------- writing


def _num(x) -> str:
    x = float(x)
    if not math.isfinite(x):
        raise ModelFileError(f"value {x} is not finite. Fix: model files hold finite numbers.")
    return repr(x)


def _value(x) -> str:
    if isinstance(x, str):
        return '"' + x.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, dict):
        return "{ " + ", ".join(f"{k} = {_value(v)}" for k, v in x.items()) + " }"
    arr = np.asarray(x)
    if arr.ndim == 0:
        return _num(arr)
    return "[" + ", ".join(_value(v) for v in arr) + "]"


def _name_of(names, b):
    return "ground" if b == GROUND else names[b]


def _expression_out(path, f):
    if isinstance(f, Expression):
        return f.source, {k: float(v) for k, v in f.params.items()}
    raise ModelFileError(
        f"{path} is {type(f).__name__}, a Python function a model file cannot hold. Fix: give "
        'it as rbjax.Expression("...") (text), or keep this model in Python.'
    )


def _flag(key, value) -> bool:
    if not isinstance(value, bool):
        _err(key, f"is {value!r}", f"write {key} = true or false")
    return value


def _baumgarte(value):
    """``baumgarte = [α, β]``: two numbers, or absent (None)."""
    if value is None:
        return None
    if not (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    ):
        _err("baumgarte", f"is {value!r}", "give two numbers [alpha, beta] in 1/s, or omit it")
    return (float(value[0]), float(value[1]))


def write(path, model, state: State | None = None, timestep: float | None = None) -> None:
    """Write ``model`` (and ``state``, ``timestep``) to ``path`` in the model-file format."""
    names = model.names
    lines = [f'format = "{FORMAT}"', f"gravity = {_value(model.gravity)}"]
    if timestep is not None:
        lines.append(f"timestep = {_num(timestep)}")
    lines.append(f'formulation = "{type(model.formulation).__name__}"')
    if type(model.formulation).__name__ not in _FORMULATIONS or (
        isinstance(model.formulation, UdwadiaSchutte) and float(model.formulation.J0) != 1.0
    ):
        raise ModelFileError(
            f"formulation {model.formulation!r} has no model-file form. Fix: use ScalableDAE(), "
            "NewtonEuler() or UdwadiaSchutte()."
        )
    if model.baumgarte is not None:
        lines.append(f"baumgarte = [{_num(model.baumgarte[0])}, {_num(model.baumgarte[1])}]")
    # the bodies, joints and forces as given to the Model (welded bodies unmerged)
    if model.merged is None:
        bodies = [
            (names[b], model.mass[b], model.inertia[b], model.scalable[b], False)
            for b in range(model.nb)
        ]
        joints, forces = model.joints, model.forces
        joint_bodies = model.topology.joint_bodies
    else:
        given, joints, forces = model.merged.source
        names = model.merged.names
        bodies = [
            (n, b.mass, b.inertia, b.scalable, b.point) for n, b in zip(names, given, strict=True)
        ]
        joint_bodies = [
            tuple(names.index(b) if isinstance(b, str) else b for b in (j.body_i, j.body_j))
            for j in joints
        ]
        if model.merged.merge_welded:
            lines.append("merge_welded = true")
        if state is not None and state.q.shape[-2] == model.nb:
            state = model.expand(state)
    for name, mass, inertia, scalable, point in bodies:
        lines += ["", "[[bodies]]", f"name = {_value(name)}", f"mass = {_num(mass)}"]
        if point:
            lines.append("point = true")
        else:
            lines.append(f"inertia = {_value(inertia)}")
        if scalable:
            lines.append("scalable = true")
    for k, j in enumerate(joints):
        kind = type(j).__name__
        if kind not in _JOINTS:
            raise ModelFileError(
                f"joints[{k}] ('{j.name}') is a {kind}, which a model file cannot "
                "hold (a Python function). Fix: build it from the joint library, or keep this "
                "model in Python."
            )
        i, jj = joint_bodies[k]
        lines += ["", "[[joints]]", f"type = {_value(kind)}", f"name = {_value(j.name)}"]
        lines += [
            f"body_i = {_value(_name_of(names, i))}",
            f"body_j = {_value(_name_of(names, jj))}",
        ]
        lines += [f"{f} = {_value(getattr(j, f))}" for f in _FRAME]
        if kind == "Distance":
            lines.append(f"length = {_num(j.length)}")
        if kind in ("RotationDriver", "TranslationDriver"):
            src, params = _expression_out(f"joints[{k}].f", j.f)
            lines.append(f"f = {_value(src)}")
            if params:
                lines.append(f"params = {_value(params)}")
    for k, f in enumerate(forces):
        kind = type(f).__name__
        if kind not in _FORCES:
            raise ModelFileError(
                f"forces[{k}] is a {kind}, which a model file cannot hold (a Python function). "
                "Fix: use the built-in forces, or keep this model in Python."
            )
        _, body_fields, params = _FORCES[kind]
        lines += ["", "[[forces]]", f"type = {_value(kind)}"]
        lines += [f"{b} = {_value(_name_of(names, getattr(f, b)))}" for b in body_fields]
        lines += [f"{p} = {_value(getattr(f, p))}" for p in params]
        lines += [
            f"{key} = {_value(getattr(f, key))}"
            for key, default in _FORCE_OPTIONS.get(kind, {}).items()
            if getattr(f, key) != default
        ]
        act = getattr(f, "actuator", None)
        if act is not None:
            if not isinstance(act, Actuator) or act.index is not None:
                raise ModelFileError(
                    f"forces[{k}].actuator is {type(act).__name__}: a model file holds an "
                    "rbjax.Actuator with its own control. Fix: use rbjax.Actuator."
                )
            lines += ["", "[forces.actuator]", f"name = {_value(act.name)}"]
            for p in ("gain", "bias", "gear", "offset", "ctrl_range", "force_range"):
                if getattr(act, p) is not None:
                    lines.append(f"{p} = {_value(getattr(act, p))}")
            c = act.control
            if isinstance(c, ControlSequence):
                seq = {
                    "values": np.asarray(c.values).tolist(),
                    "dt": c.dt,
                    "t0": c.t0,
                    "hold": c.hold,
                }
                lines.append(f"control = {_value(seq)}")
            elif callable(c):
                src, params = _expression_out(f"forces[{k}].actuator.control", c)
                if params:
                    raise ModelFileError(
                        f"forces[{k}].actuator.control has parameters {sorted(params)}. Fix: write "
                        "their values into the expression."
                    )
                lines.append(f"control = {_value(src)}")
            else:
                lines.append(f"control = {_num(c)}")
    if state is not None:
        if state.q.ndim != 2:
            raise ModelFileError(
                f"state.q has shape {state.q.shape}: a model file holds ONE initial state. "
                "Fix: save state[0] (or one member of the batch)."
            )
        lines += [
            "",
            "[initial]",
            f"t = {_num(state.t)}",
            f"q = {_value(state.q)}",
            f"u = {_value(state.u)}",
        ]
    text = "\n".join(lines) + "\n"
    with open(path, "w") as fh:
        fh.write(text)
