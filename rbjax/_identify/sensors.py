"""Sensor models with identifiable parameters: gyroscope, accelerometer, IMU (both), joint
encoder. Each sensor parameter (bias, scale factor, misalignment, lever arm, offset, time
delay) is a reference: absent (the ideal sensor), a known value, a key of the parameter
pytree or a function of it (rbjax/_identify/references.py), so that it is fitted together
with the physical parameters and gets its standard error and correlations.

Sensor axes: a triad mounted on the body with the small rotation ``misalignment`` m (a
rotation vector [rad], sensor axes in body axes): a body vector x reads R(m)ᵀ x in the
sensor. Scale factors k (per axis, relative: 0 = ideal) and biases b then give
y = (1 + k) ⊙ R(m)ᵀ x + b (e.g. Titterton & Weston, "Strapdown Inertial Navigation
Technology", 2nd ed., 2004, §4.2 and §8.4; the orthogonal part of the misalignment, which
alone is identifiable from rigid-body motion without a reference triad).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .. import _quaternion as quat
from .._dynamics import accelerations
from .._errors import fail
from .._model import require_model
from .joint import arrays, body_accelerations, dtype_of, encoder_rows, is_joint
from .observations import (
    AbstractObservation,
    _AbstractBodyObservation,
    _body_state,
    _check_body_key,
    _check_finite_rows,
    _check_mask,
    _check_sigma,
    _check_values,
    _resolve,
    scalable,
)
from .references import Reference, as_reference, resolve


def _triad(obs, x, params):
    """(1 + k) ⊙ R(m)ᵀ x + b for body vectors x (K, 3), from the sensor's references
    ``misalignment`` m, ``scale`` k and ``bias`` b."""
    return _reading(x, params, obs.misalignment, obs.scale, obs.bias)


def _reading(x, params, misalignment, scale, bias):
    """(1 + k) ⊙ R(m)ᵀ x + b (module docstring)."""
    dtype = x.dtype
    if misalignment is not None:
        m = resolve(misalignment, params, 0.0, (3,), dtype)
        x = quat.rotate(jnp.broadcast_to(quat.conjugate(quat.exp(0.5 * m)), x.shape[:-1] + (4,)), x)
    k = resolve(scale, params, 0.0, (3,), dtype)
    b = resolve(bias, params, 0.0, (3,), dtype)
    return (1.0 + k) * x + b


def _body_rate(model, q, u, b):
    """Body-frame angular velocity (K, 3): ω of a rigid body, ω/|A|² of a scalable one."""
    w = u[:, 4:7]
    if scalable(model, b):
        w = w / jnp.sum(q[:, 3:7] ** 2, axis=-1, keepdims=True)
    return w


def _specific_force(model, states, b, point):
    """Specific force [m/s²] at the body point ``point`` (body axes, from the centre of mass)
    in body axes: R(A)ᵀ (a_c − g) + α × p + ω × (ω × p), with a_c, α = ω̇ from
    :func:`rbjax.accelerations` (the constrained dynamics of the whole model; on a JointModel
    from q̈, rbjax/_identify/joint.py)."""
    if is_joint(model):
        q, u, _ = _body_state(model, states, b, "Accelerometer.body")
        a_c, alpha = body_accelerations(model, states, b)
    else:
        udot = jax.vmap(lambda s: accelerations(model, s)[0])(states)
        q, u = states.q[:, b], states.u[:, b]
        a_c = udot[:, b, 0:3]
        alpha = udot[:, b, 4:7]
    w = u[:, 4:7]
    g = jnp.broadcast_to(jnp.asarray(model.gravity, q.dtype), a_c.shape)
    lin = quat.rotate(quat.conjugate(q[:, 3:7]), a_c - g)
    p = jnp.broadcast_to(point, w.shape)
    return lin + jnp.cross(alpha, p) + jnp.cross(w, jnp.cross(w, p))


def _check_rigid(model, key, where: str) -> None:
    b = _resolve(key, model.names, "body", f"{where}.body")
    if scalable(model, b):
        fail(
            f"{where}.body",
            key,
            "is a scalable body; the accelerometer model needs a rigid one",
            "measure a rigid body (rbjax.Body), or write a Custom observation",
        )


def _triad_refs(where: str, bias, scale, misalignment, delay):
    return (
        as_reference(f"{where}.bias", bias, (3,)),
        as_reference(f"{where}.scale", scale, (3,)),
        as_reference(f"{where}.misalignment", misalignment, (3,)),
        as_reference(f"{where}.delay", delay, ()),
    )


class Gyro(_AbstractBodyObservation):
    """A rate gyro triad on ``body``: y = (1 + k) ⊙ R(m)ᵀ ω + b [rad/s], ω the body-frame
    angular velocity (Möller & Glocker 2012 eq. (37)).

    ``values`` (K, 3), ``sigma`` [rad/s] the white noise per sample. References (None = ideal,
    a known value, a key of params or a function of params): ``bias`` b (3,) [rad/s],
    ``scale`` k (3,) relative scale-factor errors, ``misalignment`` m (3,) [rad] the rotation
    of the sensor axes in body axes, ``delay`` τ [s] (the reading at t_k is the rate at
    t_k − τ)."""

    values: Array
    sigma: Array
    mask: Array
    body: int | str = eqx.field(static=True)
    bias: Reference
    scale: Reference
    misalignment: Reference
    delay: Reference

    def __init__(
        self,
        body,
        values,
        sigma,
        *,
        bias=None,
        scale=None,
        misalignment=None,
        delay=None,
        mask=None,
    ):
        v = _check_values("Gyro", values, 3)
        m = _check_mask("Gyro", mask, v.shape[0])
        self.body = _check_body_key("Gyro", "body", body)
        self.values = jnp.asarray(_check_finite_rows("Gyro", v, m))
        self.sigma = jnp.asarray(_check_sigma("Gyro", sigma, 3))
        self.mask = jnp.asarray(m)
        self.bias, self.scale, self.misalignment, self.delay = _triad_refs(
            "Gyro", bias, scale, misalignment, delay
        )

    def references(self):
        return {"bias": (3,), "scale": (3,), "misalignment": (3,), "delay": ()}

    def predict(self, model, states, params):
        q, u, b = _body_state(model, states, self.body, "Gyro.body")
        return _triad(self, _body_rate(model, q, u, b), params)


class Accelerometer(_AbstractBodyObservation):
    """An accelerometer triad at the body point ``point`` (body axes, from the centre of mass
    [m], a reference: a lever arm can be fitted): y = (1 + k) ⊙ R(m)ᵀ f + b [m/s²], f the
    specific force R(A)ᵀ (a_p − g) in body axes, a_p = a_c + R(A)(α × p + ω × (ω × p)) the
    acceleration of the point (accelerations of the constrained dynamics, so joint reactions
    are included). At rest it reads −g rotated into the sensor: +9.81 upwards.

    ``values`` (K, 3), ``sigma`` [m/s²]; references ``bias``, ``scale``, ``misalignment`` and
    ``delay`` as :class:`Gyro`. Rigid bodies only."""

    values: Array
    sigma: Array
    mask: Array
    body: int | str = eqx.field(static=True)
    point: Reference
    bias: Reference
    scale: Reference
    misalignment: Reference
    delay: Reference

    def __init__(
        self,
        body,
        values,
        sigma,
        *,
        point=(0.0, 0.0, 0.0),
        bias=None,
        scale=None,
        misalignment=None,
        delay=None,
        mask=None,
    ):
        v = _check_values("Accelerometer", values, 3)
        m = _check_mask("Accelerometer", mask, v.shape[0])
        self.body = _check_body_key("Accelerometer", "body", body)
        self.values = jnp.asarray(_check_finite_rows("Accelerometer", v, m))
        self.sigma = jnp.asarray(_check_sigma("Accelerometer", sigma, 3))
        self.mask = jnp.asarray(m)
        self.point = as_reference("Accelerometer.point", point, (3,))
        self.bias, self.scale, self.misalignment, self.delay = _triad_refs(
            "Accelerometer", bias, scale, misalignment, delay
        )

    def references(self):
        return {"point": (3,), "bias": (3,), "scale": (3,), "misalignment": (3,), "delay": ()}

    def check(self, model, state0, params0, where):
        super().check(model, state0, params0, where)
        _check_rigid(model, self.body, where)

    def predict(self, model, states, params):
        b = _resolve(self.body, model.names, "body", "Accelerometer.body")
        p = resolve(self.point, params, 0.0, (3,), dtype_of(states))
        return _triad(self, _specific_force(model, states, b, p), params)


class IMU(_AbstractBodyObservation):
    """An inertial measurement unit: a gyro and an accelerometer triad in one case at the
    body point ``point``, sharing the mounting rotation ``misalignment`` and the ``delay``;
    each triad has its own bias and scale factors (``gyro_bias``, ``gyro_scale``,
    ``accel_bias``, ``accel_scale``). ``values`` (K, 6) = (gyro [rad/s], accelerometer
    [m/s²]); ``sigma`` (6,) or the pair (σ_gyro, σ_accel). The readings are those of
    :class:`Gyro` and :class:`Accelerometer`."""

    values: Array
    sigma: Array
    mask: Array
    body: int | str = eqx.field(static=True)
    point: Reference
    misalignment: Reference
    gyro_bias: Reference
    gyro_scale: Reference
    accel_bias: Reference
    accel_scale: Reference
    delay: Reference

    def __init__(
        self,
        body,
        values,
        sigma,
        *,
        point=(0.0, 0.0, 0.0),
        misalignment=None,
        gyro_bias=None,
        gyro_scale=None,
        accel_bias=None,
        accel_scale=None,
        delay=None,
        mask=None,
    ):
        v = _check_values("IMU", values, 6)
        m = _check_mask("IMU", mask, v.shape[0])
        sig = np.asarray(sigma, dtype=np.float64) if not isinstance(sigma, str) else sigma
        if np.shape(sig) == (2,):
            sig = np.repeat(sig, 3)
        self.body = _check_body_key("IMU", "body", body)
        self.values = jnp.asarray(_check_finite_rows("IMU", v, m))
        self.sigma = jnp.asarray(_check_sigma("IMU", sig, 6))
        self.mask = jnp.asarray(m)
        self.point = as_reference("IMU.point", point, (3,))
        self.misalignment = as_reference("IMU.misalignment", misalignment, (3,))
        self.gyro_bias = as_reference("IMU.gyro_bias", gyro_bias, (3,))
        self.gyro_scale = as_reference("IMU.gyro_scale", gyro_scale, (3,))
        self.accel_bias = as_reference("IMU.accel_bias", accel_bias, (3,))
        self.accel_scale = as_reference("IMU.accel_scale", accel_scale, (3,))
        self.delay = as_reference("IMU.delay", delay, ())

    def references(self):
        out = {k: (3,) for k in ("point", "misalignment", "gyro_bias", "gyro_scale")}
        return out | {"accel_bias": (3,), "accel_scale": (3,), "delay": ()}

    def check(self, model, state0, params0, where):
        super().check(model, state0, params0, where)
        _check_rigid(model, self.body, where)

    def predict(self, model, states, params):
        q, u, b = _body_state(model, states, self.body, "IMU.body")
        p = resolve(self.point, params, 0.0, (3,), q.dtype)
        w = _reading(
            _body_rate(model, q, u, b), params, self.misalignment, self.gyro_scale, self.gyro_bias
        )
        f = _specific_force(model, states, b, p)
        f = _reading(f, params, self.misalignment, self.accel_scale, self.accel_bias)
        return jnp.concatenate([w, f], axis=-1)


class JointEncoder(AbstractObservation):
    """A joint encoder: the coordinates of the tree joint ``joint`` (name or index) in the
    coordinates of :class:`rbjax.JointSpace` (a revolute angle [rad], a prismatic
    displacement [m], the two of a cylindrical or universal joint) plus ``offset`` (a
    reference: the encoder's zero is a fitted parameter), at ``delay`` [s]. Angle residuals
    are wrapped to (−π, π]. ``values`` (K, n), n the joint's coordinates."""

    values: Array
    sigma: Array
    mask: Array
    joint: int | str = eqx.field(static=True)
    offset: Reference
    delay: Reference

    def __init__(self, joint, values, sigma, *, offset=None, delay=None, mask=None):
        v = _check_values("JointEncoder", values, None)
        m = _check_mask("JointEncoder", mask, v.shape[0])
        self.joint = _check_body_key("JointEncoder", "joint", joint)
        self.values = jnp.asarray(_check_finite_rows("JointEncoder", v, m))
        self.sigma = jnp.asarray(_check_sigma("JointEncoder", sigma, v.shape[1]))
        self.mask = jnp.asarray(m)
        self.offset = as_reference("JointEncoder.offset", offset, (v.shape[1],))
        self.delay = as_reference("JointEncoder.delay", delay, ())

    def references(self):
        return {"offset": (self.dim,), "delay": ()}

    def _coordinate(self, model):
        """(k, angular flags) of the joint, validated: a tree joint with scalar coordinates."""
        from .._analysis.joint_space import _KINDS, JointSpace

        k = _resolve(self.joint, model.joint_names, "joint", "JointEncoder.joint")
        js = JointSpace(model)
        kind = _KINDS.get(type(model.joints[k]), ("other", 0, 0))[0]
        angular = {"revolute": (True,), "prismatic": (False,), "cylindrical": (True, False)}
        angular |= {"universal": (True, True)}
        return k, js, angular.get(kind), kind

    def check(self, model, state0, params0, where):
        super().check(model, state0, params0, where)
        if is_joint(model):
            k = _resolve(self.joint, model.joint_names, "joint", f"{where}.joint")
            encoder_rows(model, k, f"{where}.joint", self.joint)
            if self.dim != 1:
                fail(
                    f"{where}.values",
                    f"<{self.dim} columns>",
                    f"do not match the 1 coordinate of the {model.topology.joint_types[k]} "
                    f"joint {model.joint_names[k]!r}",
                    "pass (K, 1) values",
                )
            return
        model = require_model(model)
        if not model.joints:
            fail(f"{where}.joint", self.joint, "but the model has no joints", "add the joint")
        k, js, angular, kind = self._coordinate(model)
        name = model.joint_names[k]
        if angular is None or name not in js.names:
            why = f"is a {kind} joint" if angular is None else "closes a loop (not a coordinate)"
            fail(
                f"{where}.joint",
                self.joint,
                f"{why}; an encoder reads a revolute, prismatic, cylindrical or universal "
                "joint of the spanning tree",
                "measure a tree joint, or write a Custom observation",
            )
            return
        if len(angular) != self.dim:
            fail(
                f"{where}.values",
                f"<{self.dim} columns>",
                f"do not match the {len(angular)} coordinates of the {kind} joint {name!r}",
                f"pass (K, {len(angular)}) values",
            )

    def _tree_coordinate(self, model):
        """(qpos row, angular) of the JointModel's hinge or slide joint."""
        k = _resolve(self.joint, model.joint_names, "joint", "JointEncoder.joint")
        return encoder_rows(model, k, "JointEncoder.joint", self.joint)

    def predict(self, model, states, params):
        if is_joint(model):  # JointSpace's coordinate: the displacement from qpos0
            a, _ = self._tree_coordinate(model)
            coords = (arrays(states)[0][:, a] - model.qpos0[a])[:, None]
            return coords + resolve(self.offset, params, 0.0, (self.dim,), coords.dtype)
        k, js, _, _ = self._coordinate(model)
        frames = js._frames()
        coords = jax.vmap(lambda q: js._joint_coordinates(k, q, frames))(arrays(states)[0])
        return coords + resolve(self.offset, params, 0.0, (self.dim,), coords.dtype)

    def _angular(self, model) -> tuple[bool, ...]:
        """Which of the joint's coordinates are angles (validated by :meth:`check`)."""
        if is_joint(model):
            return (self._tree_coordinate(model)[1],)
        angular = self._coordinate(model)[2]
        assert angular is not None  # check() refused the other joints
        return angular

    def compare(self, model, prediction):
        """Prediction − measurement, angles wrapped to (−π, π]."""
        d = prediction - self.values.astype(prediction.dtype)
        return jnp.where(jnp.asarray(self._angular(model)), _wrap(d), d)

    def align(self, model, reference, prediction):
        """Angles moved by a multiple of 2π to within π of ``reference`` (maximal
        coordinates read a revolute angle wrapped to (−π, π])."""
        moved = reference + _wrap(prediction - reference)
        return jnp.where(jnp.asarray(self._angular(model)), moved, prediction)


def _wrap(d):
    """d wrapped to (−π, π]."""
    return jnp.arctan2(jnp.sin(d), jnp.cos(d))
