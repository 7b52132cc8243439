"""The ``[[observations]]`` tables of an ``rbjax identify`` configuration, read into rbjax
observations (rbjax.Position and its siblings; joint coordinates through rbjax.Custom) with
the measured values taken from the data file. The format: rbjax/_cli/identify.py."""

from __future__ import annotations

import numpy as np

from .common import CliError
from .config import array, fail, is_number, resolve, string, table
from .coordinates import Coordinates, JointCoordinate
from .measured import Data, body_rows, data_array

KINDS = (
    "position",
    "orientation",
    "velocity",
    "angular_velocity",
    "joint_position",
    "joint_velocity",
)
KEYS = {  # the keys of each kind besides kind, array and sigma (the first one is required)
    "position": ("body", "point"),
    "orientation": ("body",),
    "velocity": ("body",),
    "angular_velocity": ("body", "frame"),
    "joint_position": ("coordinate",),
    "joint_velocity": ("coordinate",),
}


def sigma(path: str, v, d: int) -> np.ndarray:
    """The noise standard deviation: one positive number, or ``d`` of them."""
    if is_number(v):
        s = np.full(d, float(v))
    elif isinstance(v, list) and len(v) == d and all(is_number(x) for x in v):
        s = np.asarray(v, float)
    else:
        s = np.full(d, np.nan)
    if not np.all(np.isfinite(s)) or np.any(s <= 0):
        fail(
            path,
            f"is {v!r}, not a positive number (or {d} of them)",
            "give the noise standard deviation in the quantity's units, e.g. sigma = 1e-3",
        )
    return s


def observation(i: int, o, model, data: Data, coords: Coordinates | None):
    """(the rbjax observation, its number of samples) of ``[[observations]]`` entry i;
    ``coords`` is needed by the joint kinds only."""
    import jax.numpy as jnp

    from .. import AngularVelocity, Custom, Orientation, Position, Velocity, quaternion as quat

    path = f"observations[{i}]"
    every = ("kind", *dict.fromkeys(k for ks in KEYS.values() for k in ks), "array", "sigma")
    kind = string(f"{path}.kind", table(path, o, every, ("kind",))["kind"], KINDS)
    table(path, o, ("kind", *KEYS[kind], "array", "sigma"), ("sigma", *KEYS[kind][:1]))
    if kind.startswith("joint_"):
        velocity = kind == "joint_velocity"
        assert coords is not None
        start, n = coords.find(f"{path}.coordinate", o["coordinate"], velocity)
        default = "qvel" if velocity else "qpos"
        key, a = data_array(f"{path}.array", data, o.get("array"), default)
        names = data.names(f"{key}_names")
        if names is not None and a.ndim == 2:
            c = o["coordinate"]
            cols = [
                j
                for j, nm in enumerate(names)
                if nm == c or any(nm.startswith(c + sep) for sep in (":", "[", "."))
            ]
            if len(cols) != n:
                fail(
                    f"{path}.coordinate",
                    f"{c!r} matches {len(cols)} of the columns "
                    f"{key}_names ({', '.join(names)}), the coordinate has {n}",
                    "name the columns after the coordinate",
                )
            values = a[:, cols]
        else:
            values = a.reshape(a.shape[0], -1)
            if values.shape[1] != n:
                fail(
                    f"{path}.array",
                    f"array {key!r} has shape {a.shape}, the coordinate "
                    f"{o['coordinate']!r} has {n} component(s)",
                    f"store (T,) or (T, {n}) values, or a run file's {default}",
                )
        s = sigma(f"{path}.sigma", o["sigma"], n)
        return _made(
            path, Custom, JointCoordinate(start, start + n, velocity, coords.layout), values, s
        )
    body = resolve(f"{path}.body", o["body"], model.names, "body")
    name = model.names[body]
    width = 4 if kind == "orientation" else 3
    default = "q" if kind in ("position", "orientation") else "u"
    if default == "q" and "q" not in data.arrays and "xipos" in data.arrays:
        default = "xipos" if kind == "position" else "xquat"  # a joint-coordinate run file
    key, a = data_array(f"{path}.array", data, o.get("array"), default)
    point = np.zeros(3)
    if "point" in o:
        point = array(f"{path}.point", o["point"], (3,), "a point [x, y, z] in m, body axes")
    frame = string(f"{path}.frame", o.get("frame", "body"), ("body", "world"))
    if a.ndim == 3 and a.shape[2] == 7:
        rows = body_rows(f"{path}.array", key, a, body, name, data, model.nb)
        if kind == "position":
            values = rows[:, 0:3] + np.asarray(
                quat.rotate(jnp.asarray(rows[:, 3:7]), jnp.asarray(point))
            )
        elif kind == "orientation":
            values = rows[:, 3:7]
        elif kind == "velocity":
            values = rows[:, 0:3]
        else:
            values = rows[:, 4:7]
            if frame == "world":  # the run file's ω is in body axes: rotate by the data's q
                _, q = data_array(f"{path}.frame", data, None, "q")
                q_rows = body_rows(f"{path}.frame", "q", q, body, name, data, model.nb)
                values = np.asarray(quat.rotate(jnp.asarray(q_rows[:, 3:7]), jnp.asarray(values)))
    elif kind in ("position", "orientation") and a.ndim == 3 and a.shape[2] == width:
        # per-body centres of mass (T, nb, 3) or attitudes (T, nb, 4): a joint-coordinate run
        # file's xipos / xquat (MuJoCo's); the point turns with the body's xquat
        values = body_rows(f"{path}.array", key, a, body, name, data, model.nb)
        if kind == "position" and np.any(point != 0):
            _, xq = data_array(f"{path}.point", data, None, "xquat")
            xq_rows = body_rows(f"{path}.point", "xquat", xq, body, name, data, model.nb)
            values = values + np.asarray(quat.rotate(jnp.asarray(xq_rows), jnp.asarray(point)))
    elif a.ndim == 2 and a.shape[1] == width:
        values = a
    else:
        fail(
            f"{path}.array",
            f"array {key!r} has shape {a.shape}",
            f"store (T, {width}) measured values, or body states (T, nb, 7) as a run file does"
            + (f", or (T, nb, {width}) per body" if kind in ("position", "orientation") else ""),
        )
    s = sigma(f"{path}.sigma", o["sigma"], 3)
    if kind == "position":
        return _made(path, Position, name, values, s, point=point)
    if kind == "angular_velocity":
        return _made(path, AngularVelocity, name, values, s, frame=frame)
    return _made(path, Orientation if kind == "orientation" else Velocity, name, values, s)


def _made(path: str, cls, what, values: np.ndarray, sigma: np.ndarray, **kwargs):
    """``cls(what, values, sigma, mask=..., **kwargs)`` (rows with a NaN are missing samples)
    and the number of samples; rbjax's own check of it (a ValueError naming the field)
    becomes a CliError naming the configuration's table."""
    mask = np.all(np.isfinite(values), axis=1)
    if not np.any(mask):
        fail(f"{path}.array", "holds no finite sample", "measure at least one sample")
    try:
        return cls(what, values, sigma, mask=mask, **kwargs), int(mask.sum())
    except ValueError as exc:
        raise CliError(f"{path}: {exc}") from None
