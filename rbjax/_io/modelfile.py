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

Every field has a type, declared once in the table ``_MODEL`` below (the types are in
rbjax/_io/fields.py): a boolean field takes only ``true``/``false``, a number field only
finite TOML numbers (not ``"1.0"``, not ``true``), an array its shape. The file is UTF-8 and
nests arrays and inline tables at most ``MAX_NESTING`` deep. Every error is a
``ModelFileError`` (a ValueError with a "Fix:") naming the field path, the value and the
fix (``bodies[1].scalable = "false" is a string, not a boolean. Fix: write scalable = false (no
quotes).``); unknown keys are errors (a misspelt key must not be ignored).
"""

from __future__ import annotations

import math
import os
import re
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
from .fields import (
    Bool,
    Map,
    ModelFileError,
    Number,
    Numbers,
    OneOf,
    Table,
    Tables,
    Text,
    Variant,
    check_nesting,
    error,
    fail,
    toml_string,
)

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
_DRIVERS = ("RotationDriver", "TranslationDriver")
_FORCES: dict[str, tuple[type, tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    # type: (class, body fields, parameter fields, the parameters the class requires)
    "PointForce": (
        PointForce,
        ("body",),
        ("point_body", "force_world"),
        ("point_body", "force_world"),
    ),
    "BodyTorque": (BodyTorque, ("body",), ("torque_body",), ("torque_body",)),
    "TranslationalSpringDamper": (
        TranslationalSpringDamper,
        ("body_i", "body_j"),
        ("s_i", "s_j", "stiffness", "damping", "rest_length"),
        ("s_i", "s_j", "stiffness"),
    ),
    "RotationalSpringDamper": (
        RotationalSpringDamper,
        ("body_i", "body_j"),
        ("axis_i", "axis_j", "ref_i", "ref_j", "stiffness", "damping", "rest_angle"),
        ("axis_i", "axis_j", "ref_i", "ref_j", "stiffness"),
    ),
    "AxialSpringDamper": (
        AxialSpringDamper,
        ("body_i", "body_j"),
        ("s_i", "s_j", "axis_i", "stiffness", "damping", "rest_length"),
        ("s_i", "s_j", "axis_i"),
    ),
}
_SCALARS = ("stiffness", "damping", "rest_length", "rest_angle")  # other parameters: 3-vectors
_SPRINGS = ("TranslationalSpringDamper", "RotationalSpringDamper", "AxialSpringDamper")
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
MAX_NESTING = 32
"""Arrays and inline tables nest at most this deep in a model file (the format needs five
levels at most: ``forces = [{ actuator = { control = { values = [...] } } }]``)."""

# ------------------------------------------------------------------ the format, field by field
# The one place that knows each field's type (rbjax/_io/fields.py holds the types): every value
# is checked against it before anything is built from it.

_VECTOR = Numbers(((3,),), "[0.0, 0.0, 1.0]")
_BODY_NAME = Text(example="ground")
_BODY = Table(
    {
        "name": Text(example="crank"),
        "mass": Number("kg"),
        "inertia": Numbers(((3,), (3, 3)), "[0.01, 0.01, 0.002]", "kg m²"),
        "scalable": Bool(),
        "point": Bool(),
    },
    ("name", "mass"),
    "a body",
)
_EXPRESSION = OneOf(
    {"string": Text(example="0.5*sin(2*pi*t)"), "number": Number()},
    "an expression in t (a string) or a number",
    '"0.5*sin(2*pi*t)"',
)


def _joint_table(kind: str) -> Table:
    fields = {
        "type": Text(),
        "name": Text(example="pin"),
        "body_i": _BODY_NAME,
        "body_j": _BODY_NAME,
        **dict.fromkeys(_FRAME, _VECTOR),
    }
    required = ("type", "body_i", "body_j")
    if kind == "Distance":
        fields["length"] = Number("m")
        required += ("length",)
    if kind in _DRIVERS:
        fields["f"], fields["params"] = _EXPRESSION, Map(Number())
    return Table(fields, required, f"a {kind} joint")


_SAMPLES = Table(
    {
        "values": Numbers(((None,),), "[0.0, 0.5, 1.0]"),
        "dt": Number("s", "0.01", positive=True),
        "t0": Number("s", "0.0"),
        "hold": Text(("zero", "linear")),
    },
    ("values", "dt"),
    "control samples",
)
_ACTUATOR = Table(
    {
        "name": Text(example="motor"),
        "gain": _VECTOR,
        "bias": _VECTOR,
        "gear": Number(),
        "offset": Number(),
        "ctrl_range": Numbers(((2,),), "[-1.0, 1.0]"),
        "force_range": Numbers(((2,),), "[-10.0, 10.0]"),
        "control": OneOf(
            {"number": Number(), "string": Text(example="0.2*sin(t)"), "table": _SAMPLES},
            "a number, an expression (a string) or a table of samples",
            '"0.2*sin(t)"',
        ),
    },
    name="an actuator",
)


def _force_table(kind: str) -> Table:
    _, body_fields, params, required = _FORCES[kind]
    fields = {
        "type": Text(),
        **dict.fromkeys(body_fields, _BODY_NAME),
        **{p: Number() if p in _SCALARS else _VECTOR for p in params},
        **dict.fromkeys(_FORCE_OPTIONS.get(kind, {}), Text(("world", "body"))),
    }
    if kind in _SPRINGS:
        fields["actuator"] = _ACTUATOR
    return Table(fields, ("type", *body_fields, *required), f"a {kind}")


_ROWS = Numbers(((None, 7),), "[[0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]]")
_MODEL = Table(
    {
        "format": Text((FORMAT,), noun="the format this rbjax reads"),
        "gravity": Numbers(((3,),), "[0.0, 0.0, -9.81]", "m/s²"),
        "formulation": Text(tuple(_FORMULATIONS), noun="a formulation"),
        "baumgarte": Numbers(((2,),), "[10.0, 10.0]", "1/s"),
        "timestep": Number("s", "0.001", positive=True),
        "bodies": Tables(_BODY, nonempty=True),
        "joints": Tables(Variant("type", {k: _joint_table(k) for k in _JOINTS}, "a joint type")),
        "forces": Tables(Variant("type", {k: _force_table(k) for k in _FORCES}, "a force type")),
        "initial": Table(
            {"t": Number("s", "0.0"), "q": _ROWS, "u": _ROWS}, ("q",), "the initial state"
        ),
        "merge_welded": Bool(),
    },
    ("format", "bodies"),
)


def _wrap(path: str, fn, *args, **kwargs):
    """Call a constructor; its ValueError becomes one naming the file's field path."""
    try:
        return fn(*args, **kwargs)
    except ModelFileError:
        raise
    except ValueError as e:
        raise ModelFileError(f"{path}: {e}") from None


# ---------------------------------------------------------------------------------- reading


def _parse(path) -> dict[str, Any]:
    """The file's TOML document: UTF-8 (a byte-order mark is skipped), nested at most
    MAX_NESTING deep, valid TOML; a ModelFileError naming the line otherwise."""
    where = os.fspath(path)
    with open(path, "rb") as fh:
        raw = fh.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        start = raw.rfind(b"\n", 0, e.start) + 1
        line = raw.count(b"\n", 0, e.start) + 1
        column = len(raw[start : e.start].decode("utf-8", "replace")) + 1
        raise ModelFileError(
            f"{where}: is not UTF-8 text: byte 0x{raw[e.start]:02x} at line {line}, column "
            f"{column}. Fix: save the file as UTF-8 (the encoding of TOML)."
        ) from None
    text = text.removeprefix("\ufeff")  # a byte-order mark, as some editors write (not TOML)
    check_nesting(text, where, MAX_NESTING)
    try:
        return tomllib.loads(text)
    except ValueError as e:  # TOMLDecodeError, or an integer of more than 4300 digits
        raise ModelFileError(
            f"{where}: not valid TOML ({e}). Fix: check the syntax there."
        ) from None
    except RecursionError:  # not reached below MAX_NESTING; kept so that none can escape
        raise ModelFileError(
            f"{where}: arrays or inline tables are nested too deeply to read. Fix: remove the "
            "extra brackets."
        ) from None


def read(path) -> tuple[Any, State | None, float | None]:
    """Parse and validate a model file; returns (model, state or None, timestep or None)."""
    from .._model import Model

    doc = _MODEL.read("", _parse(path))
    bodies, names = [], []
    for k, b in enumerate(doc["bodies"]):
        p, name, point = f"bodies[{k}]", b["name"], b.get("point", False)
        if name == "ground":
            fail(f"{p}.name", name, "names the fixed world", "give the body another name")
        if name in names:
            fail(
                f"{p}.name",
                name,
                f"is the name of bodies[{names.index(name)}] too",
                "give each body its own name",
            )
        if point and "inertia" in b:
            error(f"{p}.inertia", "is given for a point mass", "remove it, or point = true")
        if not point and "inertia" not in b:
            error(
                f"{p}.inertia",
                "is missing",
                "give the inertia in kg m² (3 principal moments or a 3x3 matrix), or "
                "point = true (a point mass, welded by a Fixed joint)",
            )
        inertia = np.zeros((3, 3)) if point else b["inertia"]
        scalable = b.get("scalable", False)
        bodies.append(_wrap(p, Body, b["mass"], inertia, scalable=scalable, name=name, point=point))
        names.append(name)

    def body(p: str, value: str) -> int:
        if value == "ground":
            return GROUND
        if value not in names:
            error(
                p,
                f"names body {value!r}, which is not in the file",
                f"use 'ground' or one of {names}",
            )
        return names.index(value)

    joints = [_joint(f"joints[{k}]", j, body) for k, j in enumerate(doc.get("joints", []))]
    forces = [_force(f"forces[{k}]", f, body) for k, f in enumerate(doc.get("forces", []))]
    baumgarte = doc.get("baumgarte")
    model = _wrap(
        "model",
        Model,
        bodies,
        gravity=doc.get("gravity", np.zeros(3)),
        joints=joints,
        forces=forces,
        formulation=_FORMULATIONS[doc.get("formulation", "ScalableDAE")](),
        baumgarte=None if baumgarte is None else (float(baumgarte[0]), float(baumgarte[1])),
        merge_welded=doc.get("merge_welded", False),
    )
    state = None
    if "initial" in doc:
        init = doc["initial"]
        q = init["q"]
        state = _wrap(
            "initial",
            State,
            t=jnp.asarray(init.get("t", 0.0)),
            q=jnp.asarray(q),
            u=jnp.asarray(init.get("u", np.zeros_like(q))),
        )
        state = _wrap("initial", model.merge_state, state)  # the file lists every body
        state = _wrap("initial", model.check_state, state)
        if joints:
            state = _assembled(model, state)
    return model, state, doc.get("timestep")


def _expression(path: str, value: str | float, params: dict[str, float]) -> Expression:
    for name in params:
        if name in ("source", "where"):  # Expression's own arguments
            error(
                f"{path.rsplit('.', 1)[0]}.params.{name}",
                "is a name the expression language reserves",
                "rename the parameter (and its uses in f)",
            )
    source = value if isinstance(value, str) else repr(value)
    return Expression(source, where=path, **params)


def _joint(p: str, j: dict[str, Any], body):
    kind = j["type"]
    kwargs: dict[str, Any] = {k: j[k] for k in (*_FRAME, "name", "length") if k in j}
    if kind in _DRIVERS:
        kwargs["f"] = _expression(f"{p}.f", j.get("f", "0"), j.get("params", {}))
    return _wrap(
        p,
        _JOINTS[kind],
        body(f"{p}.body_i", j["body_i"]),
        body(f"{p}.body_j", j["body_j"]),
        **kwargs,
    )


def _control(p: str, c: Any):
    if isinstance(c, dict):
        hold = c.get("hold", "zero")
        return _wrap(p, ControlSequence, c["values"], c["dt"], c.get("t0", 0.0), hold)
    return c if isinstance(c, float) else _expression(p, c, {})


def _actuator(p: str, a: dict[str, Any]) -> Actuator:
    kwargs = {
        k: a[k] for k in ("gain", "bias", "gear", "offset", "ctrl_range", "force_range") if k in a
    }
    if "control" in a:
        kwargs["control"] = _control(f"{p}.control", a["control"])
    return _wrap(p, Actuator, name=a.get("name", "actuator"), **kwargs)


def _force(p: str, f: dict[str, Any], body):
    kind = f["type"]
    cls, body_fields, params, _ = _FORCES[kind]
    bodies = [body(f"{p}.{b}", f[b]) for b in body_fields]
    if len(body_fields) == 1 and bodies[0] == GROUND:
        error(f"{p}.{body_fields[0]}", "is 'ground'", "a force on one body acts on a body")
    kwargs: dict[str, Any] = {k: f[k] for k in (*params, *_FORCE_OPTIONS.get(kind, {})) if k in f}
    if "actuator" in f:
        kwargs["actuator"] = _actuator(f"{p}.actuator", f["actuator"])
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
        try:
            x.encode("utf-8")
        except UnicodeEncodeError:
            raise ModelFileError(
                f"the text {x!r} holds a character that UTF-8 cannot encode (a lone surrogate). "
                "Fix: remove it from the name."
            ) from None
        return toml_string(x)  # quotes, backslashes and control characters escaped
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in x.items()) + " }"
    arr = np.asarray(x)
    if arr.ndim == 0:
        return _num(arr)
    return "[" + ", ".join(_value(v) for v in arr) + "]"


def _key(key: str) -> str:
    """A TOML key: bare when it is one (A-Z a-z 0-9 _ -), quoted otherwise (a parameter 'é')."""
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else toml_string(key)


def _name_of(names, b):
    return "ground" if b == GROUND else names[b]


def _expression_out(path, f):
    if isinstance(f, Expression):
        return f.source, {k: float(v) for k, v in f.params.items()}
    raise ModelFileError(
        f"{path} is {type(f).__name__}, a Python function a model file cannot hold. Fix: give "
        'it as rbjax.Expression("...") (text), or keep this model in Python.'
    )


def write(path, model, state: State | None = None, timestep: float | None = None) -> None:
    """Write ``model`` (and ``state``, ``timestep``) to ``path`` in the model-file format."""
    names = model.names
    lines = [f'format = "{FORMAT}"', f"gravity = {_value(model.gravity)}"]
    if timestep is not None:
        if isinstance(timestep, bool) or not float(timestep) > 0.0:
            raise ModelFileError(
                f"save: timestep = {timestep!r} is not a positive number. Fix: give the step in "
                "s, or None."
            )
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
    for k, (name, mass, inertia, scalable, point) in enumerate(bodies):
        if name == "ground":
            raise ModelFileError(
                f"bodies[{k}] is named 'ground', the name a model file gives the fixed world. "
                "Fix: rename the body."
            )
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
        _, body_fields, params, _ = _FORCES[kind]
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
            elif np.size(c) != 1:
                raise ModelFileError(
                    f"forces[{k}].actuator.control is {np.size(c)} constant controls: a model "
                    "file holds one control per actuator. Fix: give the actuator one number, or "
                    "keep this model in Python."
                )
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
    with open(path, "w", encoding="utf-8", newline="\n") as fh:  # TOML is UTF-8 on every locale
        fh.write(text)
