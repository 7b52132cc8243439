"""Observations: measured quantities at the sample times (body points, orientations, velocities,
angular velocities, joint reactions, any differentiable function of the state), validated at
build time, with their whitened residuals (h(x) − y)/σ.

Every observation reads the same quantity from either formulation of a model: on a
:class:`rbjax.JointModel` the bodies' centres of mass, attitudes and velocities come from its
kinematics (rbjax/_identify/joint.py), joint reactions from rbjax/_tree/reactions.py."""

from __future__ import annotations

import abc
import inspect
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .. import _quaternion as quat
from .._abstract import AbstractModel, AbstractState
from .._errors import fail
from .._model import require_model
from .._reactions import reactions
from .joint import body_states, is_joint, reactions as joint_reactions
from .references import Reference, as_reference, check_reference, resolve


def as_float(name: str, x) -> np.ndarray:
    try:
        return np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        fail(name, x, "is not an array of numbers", "pass a float array")
        raise  # unreachable (fail raises); keeps type checkers content


def _check_values(obj: str, values, width: int | None) -> np.ndarray:
    v = as_float(f"{obj}.values", values)
    if v.ndim != 2 or v.shape[0] < 1 or (width is not None and v.shape[1] != width):
        want = f"(K, {width})" if width is not None else "(K, d)"
        fail(
            f"{obj}.values",
            f"<array shape {v.shape}>",
            f"is not a {want} array",
            f"pass one row of {width if width is not None else 'd'} numbers per sample time",
        )
    return v


def _check_sigma(obj: str, sigma, d: int) -> np.ndarray:
    s = as_float(f"{obj}.sigma", sigma)
    if s.shape not in ((), (d,)) or not np.all(np.isfinite(s)) or np.any(s <= 0):
        fail(
            f"{obj}.sigma",
            sigma,
            f"is not a positive finite scalar or a ({d},) vector of them",
            "pass the noise standard deviation (> 0) in the observation's units",
        )
    return np.broadcast_to(s, (d,)).copy()


def _check_mask(obj: str, mask, k: int) -> np.ndarray:
    if mask is None:
        return np.ones(k, dtype=bool)
    m = np.asarray(mask)
    if m.shape != (k,) or m.dtype != np.bool_:
        fail(
            f"{obj}.mask",
            f"<{m.dtype} array shape {m.shape}>",
            f"is not a boolean array of shape ({k},)",
            "pass True where a sample exists and False where it is missing",
        )
    return m


def _check_finite_rows(obj: str, v: np.ndarray, mask: np.ndarray) -> np.ndarray:
    ok = np.all(np.isfinite(v), axis=1) | ~mask
    if not np.all(ok):
        k = int(np.argmin(ok))
        fail(
            f"{obj}.values[{k}]",
            v[k],
            "is not finite at a sample that is not masked",
            "set mask[k] = False for missing samples (their values are ignored)",
        )
    return np.where(np.isfinite(v), v, 0.0)


def _check_body_key(obj: str, field: str, key) -> int | str:
    if isinstance(key, (bool, np.bool_)) or not isinstance(key, (int, np.integer, str)):
        fail(f"{obj}.{field}", key, "is not a name or an index", "pass a str name or an int")
    return key if isinstance(key, str) else int(key)


def _resolve(key: int | str, pool: tuple[str, ...], what: str, where: str) -> int:
    """Index of ``key`` (name or index) in ``pool``; ValueError naming ``where`` otherwise."""
    if isinstance(key, str):
        if key not in pool:
            fail(
                where,
                key,
                f"is not the name of a {what} of the model (names: {list(pool)})",
                f"use one of these names or an index in [0, {len(pool)})",
            )
        return pool.index(key)
    if not 0 <= key < len(pool):
        fail(
            where,
            key,
            f"is not an index of the model's {len(pool)} {what}s",
            f"use an index in [0, {len(pool)}) or a name from {list(pool)}",
        )
    return int(key)


class AbstractObservation(eqx.Module):
    """A measured quantity at the sample times.

    ``values`` (K, m) the measurements (m = 4 for quaternions, else the residual width d),
    ``sigma`` (d,) the noise standard deviation in the quantity's units, ``mask`` (K,) True
    where a sample exists. Subclasses implement :meth:`predict` (or :meth:`error`) for a batch
    of K states and the parameters (sensor parameters are references into them:
    rbjax/_identify/references.py), and :meth:`check` against the model and ``params0``.

    A subclass with a ``delay`` field (a reference to a time delay τ [s], like every
    observation of rbjax) is measured at t_k − τ: identify predicts at every integration step
    and interpolates (cubic Hermite, so the residual is differentiable in τ).
    """

    values: eqx.AbstractVar[Array]
    sigma: eqx.AbstractVar[Array]
    mask: eqx.AbstractVar[Array]

    @property
    def dim(self) -> int:
        """Residual components per sample."""
        return int(np.shape(self.sigma)[0])

    def check(self, model: AbstractModel, state0: AbstractState, params0, where: str) -> None:
        """Build-time validation against the model (names, indices, joints) and params0
        (the parameter references)."""
        for field, shape in self.references().items():
            check_reference(f"{where}.{field}", getattr(self, field), params0, shape)

    def references(self) -> dict[str, tuple[int, ...]]:
        """The fields that refer to parameters, with the shape of their values."""
        return {"delay": ()} if hasattr(self, "delay") else {}

    @abc.abstractmethod
    def predict(self, model: AbstractModel, states: AbstractState, params) -> Array:
        """Prediction (K, d) at the K states, for the parameters ``params``."""

    def compare(self, model: AbstractModel, prediction: Array) -> Array:
        """Prediction − measurement (K, d), in the quantity's units."""
        return prediction - self.values

    def align(self, model: AbstractModel, reference: Array, prediction: Array) -> Array:
        """``prediction`` (K, d) as the representative nearest ``reference`` (K, d) of what
        :meth:`compare` treats as the same reading (default: itself). A delayed observation
        interpolates its predictions between integration steps after this (an angle that
        wraps at ±π, a quaternion whose sign flips, would otherwise be interpolated across
        the jump)."""
        return prediction

    def error(self, model: AbstractModel, states: AbstractState, params) -> Array:
        """Prediction − measurement (K, d) at the K states."""
        return self.compare(model, self.predict(model, states, params))

    def whiten(self, error: Array) -> Array:
        """error/σ (K, d), 0 at masked samples."""
        return jnp.where(self.mask[:, None], error / self.sigma, 0.0)

    def residual(self, model: AbstractModel, states: AbstractState, params) -> Array:
        """Whitened residual (prediction − measurement)/σ (K, d), 0 at masked samples."""
        return self.whiten(self.error(model, states, params))


def _body_state(model, states, key, where: str):
    """(q (K, 7), u (K, 7), index) of one body at the K states: its centre of mass and
    attitude, (v, ν, ω̄) (the maximal state; on a JointModel from its kinematics,
    rbjax/_identify/joint.py, so both formulations of a file observe the same)."""
    b = _resolve(key, model.names, "body", where)
    if is_joint(model):
        q, u = body_states(model, states)
        return q[:, b], u[:, b], b
    return states.q[:, b], states.u[:, b], b


def scalable(model, b: int) -> bool:
    """Whether body b is scalable (never in joint coordinates)."""
    return not is_joint(model) and bool(model.scalable[b])


class _AbstractBodyObservation(AbstractObservation):
    """An observation of one body (``body``: name or index), resolved against the model."""

    body: eqx.AbstractVar[int | str]

    def check(self, model, state0, params0, where):
        super().check(model, state0, params0, where)
        _resolve(self.body, model.names, "body", f"{where}.body")


class Position(_AbstractBodyObservation):
    """World position [m] of the body-fixed point ``point`` (body axes, from the centre of
    mass) of ``body`` (name or index), a marker: x = r + s R(A) p̄ (Möller & Glocker 2012 eq. (32)).
    ``values`` (K, 3), ``sigma`` scalar or (3,) [m]. ``point`` and ``delay`` [s] are
    references (a known value, a key of params or a function of params): an unknown marker
    position on the body is a fitted parameter."""

    values: Array
    sigma: Array
    mask: Array
    body: int | str = eqx.field(static=True)
    point: Reference
    delay: Reference

    def __init__(self, body, values, sigma, *, point=(0.0, 0.0, 0.0), delay=None, mask=None):
        v = _check_values("Position", values, 3)
        m = _check_mask("Position", mask, v.shape[0])
        self.body = _check_body_key("Position", "body", body)
        self.values = jnp.asarray(_check_finite_rows("Position", v, m))
        self.sigma = jnp.asarray(_check_sigma("Position", sigma, 3))
        self.mask = jnp.asarray(m)
        self.point = as_reference("Position.point", point, (3,))
        self.delay = as_reference("Position.delay", delay, ())

    def references(self):
        return {"point": (3,), "delay": ()}

    def predict(self, model, states, params):
        q, _, _ = _body_state(model, states, self.body, "Position.body")
        p = resolve(self.point, params, 0.0, (3,), q.dtype)
        return q[:, 0:3] + quat.transform(q[:, 3:7], jnp.broadcast_to(p, q[:, 0:3].shape))


class Orientation(_AbstractBodyObservation):
    """Attitude of ``body`` as unit quaternions ``values`` (K, 4), scalar first, body → world.

    The residual is the rotation vector [rad] of the relative rotation conj(y_k) ⊗ A(t_k),
    2 log(·) (rbjax.quaternion.log: shortest branch, so q and −q are the same measurement, and
    smooth at the identity); ``sigma`` scalar or (3,) [rad] per axis of that vector. Values
    must be within 1e-3 of unit length (they are normalised).

    A star tracker or a motion-capture rigid body measures its own frame, mounted on the body
    at an unknown rotation: ``mounting`` (a reference, (3,) rotation vector [rad] of the
    sensor frame in body axes) makes the prediction A ⊗ exp(m/2); ``delay`` [s]."""

    values: Array
    sigma: Array
    mask: Array
    body: int | str = eqx.field(static=True)
    mounting: Reference
    delay: Reference

    def __init__(self, body, values, sigma, *, mounting=None, delay=None, mask=None):
        v = _check_values("Orientation", values, 4)
        m = _check_mask("Orientation", mask, v.shape[0])
        v = _check_finite_rows("Orientation", v, m)
        norm = np.linalg.norm(v, axis=1)
        bad = m & (np.abs(norm - 1.0) > 1e-3)
        if np.any(bad):
            k = int(np.argmax(bad))
            fail(
                f"Orientation.values[{k}]",
                v[k],
                f"has norm {norm[k]:.6g}, not a unit quaternion",
                "pass unit quaternions, scalar first (a0, a1, a2, a3); scipy's as_quat() is "
                "scalar last: use q[..., [3, 0, 1, 2]]",
            )
        v = np.where(m[:, None], v / np.where(norm > 0, norm, 1.0)[:, None], [1.0, 0, 0, 0])
        self.body = _check_body_key("Orientation", "body", body)
        self.values = jnp.asarray(v)
        self.sigma = jnp.asarray(_check_sigma("Orientation", sigma, 3))
        self.mask = jnp.asarray(m)
        self.mounting = as_reference("Orientation.mounting", mounting, (3,))
        self.delay = as_reference("Orientation.delay", delay, ())

    def references(self):
        return {"mounting": (3,), "delay": ()}

    def predict(self, model, states, params):
        q, _, _ = _body_state(model, states, self.body, "Orientation.body")
        a = q[:, 3:7]
        if self.mounting is None:
            return a
        m = resolve(self.mounting, params, 0.0, (3,), a.dtype)
        return quat.mul(a, jnp.broadcast_to(quat.exp(0.5 * m), a.shape))

    def compare(self, model, prediction):
        return rotvec_between(self.values.astype(prediction.dtype), prediction)

    def align(self, model, reference, prediction):
        """q or −q, whichever is nearer ``reference`` (the same rotation)."""
        flip = jnp.sum(reference * prediction, axis=-1, keepdims=True) < 0
        return jnp.where(flip, -prediction, prediction)


class AngularVelocity(_AbstractBodyObservation):
    """Angular velocity [rad/s] of ``body``: ``frame="body"`` (body axes, a gyroscope) or
    ``"world"``. From the state's ω (Möller & Glocker 2012 eq. (37)): the body-frame angular velocity for a
    rigid body, ω/s for a scalable one (eq. (49)); world = R(A) × body. values (K, 3);
    ``delay`` [s] a reference. A gyro with bias, scale factors and misalignment is
    :class:`rbjax.Gyro`."""

    values: Array
    sigma: Array
    mask: Array
    body: int | str = eqx.field(static=True)
    frame: str = eqx.field(static=True)
    delay: Reference

    def __init__(self, body, values, sigma, *, frame="body", delay=None, mask=None):
        if frame not in ("body", "world"):
            fail("AngularVelocity.frame", frame, "is not 'body' or 'world'", "pass one of them")
        v = _check_values("AngularVelocity", values, 3)
        m = _check_mask("AngularVelocity", mask, v.shape[0])
        self.body = _check_body_key("AngularVelocity", "body", body)
        self.frame = frame
        self.values = jnp.asarray(_check_finite_rows("AngularVelocity", v, m))
        self.sigma = jnp.asarray(_check_sigma("AngularVelocity", sigma, 3))
        self.mask = jnp.asarray(m)
        self.delay = as_reference("AngularVelocity.delay", delay, ())

    def predict(self, model, states, params):
        q, u, b = _body_state(model, states, self.body, "AngularVelocity.body")
        w = u[:, 4:7]
        if scalable(model, b):
            w = w / jnp.sum(q[:, 3:7] ** 2, axis=-1, keepdims=True)
        return w if self.frame == "body" else quat.rotate(q[:, 3:7], w)


class Velocity(_AbstractBodyObservation):
    """World velocity [m/s] of the centre of mass of ``body``. values (K, 3); ``delay`` [s] a
    reference."""

    values: Array
    sigma: Array
    mask: Array
    body: int | str = eqx.field(static=True)
    delay: Reference

    def __init__(self, body, values, sigma, *, delay=None, mask=None):
        v = _check_values("Velocity", values, 3)
        m = _check_mask("Velocity", mask, v.shape[0])
        self.body = _check_body_key("Velocity", "body", body)
        self.values = jnp.asarray(_check_finite_rows("Velocity", v, m))
        self.sigma = jnp.asarray(_check_sigma("Velocity", sigma, 3))
        self.mask = jnp.asarray(m)
        self.delay = as_reference("Velocity.delay", delay, ())

    def predict(self, model, states, params):
        _, u, _ = _body_state(model, states, self.body, "Velocity.body")
        return u[:, 0:3]


class ReactionForce(AbstractObservation):
    """Reaction force [N] (``torque=True``: torque [N m] about the joint point) that ``joint``
    (name or index) exerts on its body ``side`` ("i" or "j"), in the ``"world"`` frame or that
    body's ``"joint"`` frame, from :func:`rbjax.reactions` (the multipliers of the equations of
    motion, Möller & Glocker 2012 eq. (81)). values (K, 3). A force/torque sensor: ``bias``
    (3,) [N or N m] added to the prediction and ``delay`` [s], both references (a known
    value, a key of params or a function of params)."""

    values: Array
    sigma: Array
    mask: Array
    joint: int | str = eqx.field(static=True)
    side: str = eqx.field(static=True)
    frame: str = eqx.field(static=True)
    torque: bool = eqx.field(static=True)
    bias: Reference
    delay: Reference

    def __init__(
        self,
        joint,
        values,
        sigma,
        *,
        side="j",
        frame="world",
        torque=False,
        bias=None,
        delay=None,
        mask=None,
    ):
        if side not in ("i", "j"):
            fail("ReactionForce.side", side, "is not 'i' or 'j'", "pass side='i' or 'j'")
        if frame not in ("world", "joint"):
            fail("ReactionForce.frame", frame, "is not 'world' or 'joint'", "pass one of them")
        if not isinstance(torque, (bool, np.bool_)):
            fail("ReactionForce.torque", torque, "is not a bool", "pass True or False")
        v = _check_values("ReactionForce", values, 3)
        m = _check_mask("ReactionForce", mask, v.shape[0])
        self.joint = _check_body_key("ReactionForce", "joint", joint)
        self.side, self.frame, self.torque = side, frame, bool(torque)
        self.values = jnp.asarray(_check_finite_rows("ReactionForce", v, m))
        self.sigma = jnp.asarray(_check_sigma("ReactionForce", sigma, 3))
        self.mask = jnp.asarray(m)
        self.bias = as_reference("ReactionForce.bias", bias, (3,))
        self.delay = as_reference("ReactionForce.delay", delay, ())

    def references(self):
        return {"bias": (3,), "delay": ()}

    def check(self, model, state0, params0, where):
        super().check(model, state0, params0, where)
        if is_joint(model):
            self._check_joint_model(model, where)
            return
        model = require_model(model)
        if not model.joints:
            fail(
                f"{where}.joint",
                self.joint,
                "observes a joint reaction but the model has no joints",
                "add the joint to the model (Model(..., joints=[...])) or remove this observation",
            )
        _resolve(self.joint, model.joint_names, "joint", f"{where}.joint")

    def _check_joint_model(self, model, where):
        """On a JointModel: a joint of the tree, in world axes; the parent's side only where
        its joint point is known (module docstring of rbjax/_identify/joint.py)."""
        k = _resolve(self.joint, model.joint_names, "joint", f"{where}.joint")
        kind = model.topology.joint_types[k]
        if kind == "free":
            fail(
                f"{where}.joint",
                self.joint,
                "is a free joint, which carries no reaction",
                "observe a hinge, slide or ball joint",
            )
        if self.frame == "joint":
            fail(
                f"{where}.frame",
                self.frame,
                "is the joint frame of a maximal-coordinate joint (rbjax.Revolute's x̄, ȳ, z̄), "
                "which a JointModel's joint does not have",
                "observe frame='world' (rotate the measured force with the body's attitude), "
                "or load the file in maximal coordinates "
                "(rbjax.load(path, formulation=rbjax.ScalableDAE()))",
            )

    def predict(self, model, states, params):
        k = _resolve(self.joint, model.joint_names, "joint", "ReactionForce.joint")
        if is_joint(model):
            out = _tree_reaction(model, states, k, self.side, self.torque)
            return out + resolve(self.bias, params, 0.0, (3,), out.dtype)
        rx = reactions(model, states)
        name = ("torque" if self.torque else "force") + f"_{self.side}"
        name += "_joint" if self.frame == "joint" else ""
        out = getattr(rx, name)[:, k]
        return out + resolve(self.bias, params, 0.0, (3,), out.dtype)


def _tree_reaction(model, states, k: int, side: str, torque: bool):
    """A JointModel joint's reaction (K, 3), world axes, as maximal coordinates report it:
    on the child (side "j") the force F and the torque τ about the joint point of
    rbjax/_tree/reactions.py; on the parent (side "i") −F and the torque about the joint's
    point fixed in the parent, −τ − (P_j − P_i) × F, P_j − P_i = e (x − x₀) for a slide of
    world axis e and displacement x − x₀ (hinge, ball: one point)."""
    force, tau = joint_reactions(model, states)
    f, tq = force[:, k], tau[:, k]
    if side == "j":
        return tq if torque else f
    if not torque:
        return -f
    if model.topology.joint_types[k] != "slide":
        return -tq
    a = model.topology.qposadr[k]
    x = states.qpos[:, a] - model.qpos0[a]
    axis = _slide_axis_world(model, states, k)
    return -tq - jnp.cross(axis * x[:, None], f)


def _slide_axis_world(model, states, k: int):
    """World unit axis (K, 3) of slide joint k (rbjax/_tree/kinematics.py ``Frames.axis``)."""
    from .._tree.kinematics import frames

    f = frames(model.topology, model, states.qpos.T)
    return f.axis[:, model.topology.dofadr[k]].T


class Custom(AbstractObservation):
    """Any differentiable ``fn(model, state) -> (d,)`` of ONE state (``state.q`` (nb, 7); on a
    :class:`rbjax.JointModel` a :class:`rbjax.JointState`, ``state.qpos`` (nq,), ``state.qvel``
    (nv,)), or ``fn(model, state, params) -> (d,)``, which also receives the full parameter pytree being
    fitted (a sensor's bias or scale factor is a parameter: ``params["bias"] + ...``).
    ``values`` (K, d), ``sigma`` scalar or (d,) in fn's units; ``delay`` [s] a reference.
    ``fn`` is static: pass a module-level function (or the same object each time) to reuse
    compiled code."""

    values: Array
    sigma: Array
    mask: Array
    fn: Callable = eqx.field(static=True)
    with_params: bool = eqx.field(static=True)
    delay: Reference

    def __init__(self, fn, values, sigma, *, delay=None, mask=None):
        if not callable(fn):
            fail("Custom.fn", fn, "is not callable", "pass fn(model, state) -> array (d,)")
        v = _check_values("Custom", values, None)
        m = _check_mask("Custom", mask, v.shape[0])
        self.fn = fn
        self.with_params = _positional_count(fn) >= 3
        self.values = jnp.asarray(_check_finite_rows("Custom", v, m))
        self.sigma = jnp.asarray(_check_sigma("Custom", sigma, v.shape[1]))
        self.mask = jnp.asarray(m)
        self.delay = as_reference("Custom.delay", delay, ())

    def _call(self, model, state, params):
        return self.fn(model, state, params) if self.with_params else self.fn(model, state)

    def check(self, model, state0, params0, where):
        super().check(model, state0, params0, where)
        try:
            out = jax.eval_shape(self._call, model, state0, params0)
        except Exception as e:  # noqa: BLE001 - report any failure of the user's function
            fail(f"{where}.fn", self.fn, f"fails on (model, state0): {e!r}", "fix the function")
            raise
        shape = getattr(out, "shape", None)
        if shape != (self.dim,):
            fail(
                f"{where}.fn",
                self.fn,
                f"returns shape {shape} for one state, not ({self.dim},) as values has",
                "return a 1-D array with one entry per column of values",
            )

    def predict(self, model, states, params):
        return jax.vmap(lambda s: jnp.asarray(self._call(model, s, params)))(states)


def _positional_count(fn) -> int:
    """Positional parameters of ``fn`` (3 or more: it takes the parameters too)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return 2
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in sig.parameters.values()):
        return 3
    return sum(p.kind in kinds for p in sig.parameters.values())


def rotvec_between(a, b):
    """Rotation vector [rad] of conj(a) ⊗ b for quaternions (..., 4): sign- and
    scale-invariant (quaternion.log takes the shortest branch and atan2 of the parts)."""
    return 2.0 * quat.log(quat.mul(quat.conjugate(a), b))
