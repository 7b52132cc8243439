"""Actuators on a joint coordinate: MuJoCo's affine motor / position / velocity laws.

An :class:`Actuator` is the actuator function h(t, x, ẋ) of a :class:`rbjax.RotationalSpringDamper`
(x = θ, the hinge angle) or :class:`rbjax.AxialSpringDamper` (x the slider displacement). With the
joint coordinate in MuJoCo's convention, X = x + offset (``offset`` is the joint's reference
value ``ref``), the actuator length and velocity are L = g X and V = g ẋ (``gear`` g), and the
generalized force on the joint is (MuJoCo documentation, "Actuation model")

    f = g · clamp( (a₀ + a₁ L + a₂ V) · clamp(u(t), ctrl_range) + b₀ + b₁ L + b₂ V,  force_range ),

with gain (a₀, a₁, a₂), bias (b₀, b₁, b₂) and the control u(t). A motor is a = (1, 0, 0),
b = 0; a position servo a = (k_p, 0, 0), b = (0, −k_p, −k_v); a velocity servo a = (k_v, 0, 0),
b = (0, 0, −k_v). Every number, and the arrays of a control that is an equinox Module, is a
differentiable leaf. :class:`JointActuators` sums several actuators of one joint and caps the
total (MuJoCo's joint-level ``actuatorfrcrange``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ._errors import Rule, check_finite, checked_array, enforce, fail, ordered, validates_inputs


def _vector(field: str, x, shape: tuple[int, ...], fix: str):
    """``x`` of exactly ``shape``, finite, in the default float dtype (rbjax/_errors.py
    ``checked_array``: host input converted by NumPy, no compiled op per field)."""
    a = checked_array(field, x, shape, fix)
    dtype = jnp.result_type(float)
    return a if a.dtype == dtype else a.astype(dtype)


def _range(field: str, r, fix: str):
    """A finite (low, high) pair or None; low <= high is the class's rule (:func:`_ordered`)."""
    return None if r is None else _vector(field, r, (2,), fix)


def _ordered(field: str) -> Rule:
    """A range (low, high) with low <= high: reversed, ``clip`` would return ``high``
    everywhere, a constant instead of a limit."""
    return Rule((field,), ordered, "has lower bound > upper bound", "give (low, high) or None")


@validates_inputs
class ControlSequence(eqx.Module):
    """A control signal u(t) given at the times t₀ + k·dt, k = 0..n−1 (``values`` (n,) or
    (n, m) for m actuators), held constant over each interval like MuJoCo's ``ctrl`` between
    steps (``hold="zero"``) or interpolated linearly (``hold="linear"``). The values are
    differentiable. Past the last sample the last value is held.

    With ``hold="zero"`` an integrator stage that falls exactly on a sample time t₀ + k·dt
    uses sample k: an RK4 step from t to t + dt sees the NEXT control in its last stage. For a
    control that is constant over each step exactly as MuJoCo applies it, use ``hold="zero"``
    with a step size that is a multiple of dt and compare at the sample times; use
    ``hold="linear"`` for a continuous signal.
    """

    values: Float[Array, " n *m"]
    dt: float = eqx.field(static=True)
    t0: float = eqx.field(static=True, default=0.0)
    hold: str = eqx.field(static=True, default="zero")

    def __init__(self, values, dt: float, t0: float = 0.0, hold: str = "zero"):
        values = jnp.asarray(values, dtype=jnp.result_type(float))
        if values.ndim not in (1, 2) or values.shape[0] < 1:
            fail(
                "ControlSequence.values",
                values,
                f"has shape {values.shape}",
                "give an array (n,) or (n, m) of n >= 1 samples",
            )
        check_finite("ControlSequence.values", values, "give finite control values")
        if not (np.isfinite(dt) and dt > 0):
            fail("ControlSequence.dt", dt, "is not a positive time", "give the sample spacing in s")
        if hold not in ("zero", "linear"):
            fail("ControlSequence.hold", hold, "is not a hold rule", 'use "zero" or "linear"')
        self.values, self.dt, self.t0, self.hold = values, float(dt), float(t0), hold

    def __call__(self, t):
        n = self.values.shape[0]
        s = (t - self.t0) / self.dt
        if self.hold == "zero":
            k = jnp.clip(jnp.floor(s + 1e-9).astype(jnp.int32), 0, n - 1)
            return self.values[k]
        s = jnp.clip(s, 0.0, n - 1.0)
        k = jnp.clip(jnp.floor(s).astype(jnp.int32), 0, max(n - 2, 0))
        w = s - k.astype(s.dtype)
        k1 = jnp.minimum(k + 1, n - 1)
        return (1.0 - w) * self.values[k] + w * self.values[k1]


@validates_inputs
class Actuator(eqx.Module):
    """MuJoCo's affine actuator on one joint coordinate (module docstring); build it with
    :meth:`motor`, :meth:`position` or :meth:`velocity`.

    ``control`` is u(t): a number (constant), a function of t, or an equinox Module such as
    :class:`ControlSequence` (its arrays differentiable). ``index`` picks one column when the
    control returns a vector (one control signal for several actuators).
    """

    gear: Float[Array, ""]
    gain: Float[Array, "3"]
    bias: Float[Array, "3"]
    offset: Float[Array, ""]
    ctrl_range: Float[Array, "2"] | None
    force_range: Float[Array, "2"] | None
    control: Any
    index: int | None = eqx.field(static=True)
    name: str = eqx.field(static=True)

    # checked at build time and, traced, inside a rollout's program
    _rules: ClassVar[tuple[Rule, ...]] = (_ordered("ctrl_range"), _ordered("force_range"))

    def __init__(
        self,
        *,
        gain=(1.0, 0.0, 0.0),
        bias=(0.0, 0.0, 0.0),
        gear=1.0,
        control: Callable | Any = 0.0,
        ctrl_range=None,
        force_range=None,
        offset=0.0,
        index: int | None = None,
        name: str = "actuator",
    ):
        fix = "give finite numbers"
        self.gain = _vector(f"{name}.gain", gain, (3,), f"{fix}: (a0, a1, a2)")
        self.bias = _vector(f"{name}.bias", bias, (3,), f"{fix}: (b0, b1, b2)")
        self.gear = _vector(f"{name}.gear", gear, (), fix)
        self.offset = _vector(f"{name}.offset", offset, (), fix)
        self.ctrl_range = _range(f"{name}.ctrl_range", ctrl_range, "give (low, high) or None")
        self.force_range = _range(f"{name}.force_range", force_range, "give (low, high) or None")
        if not callable(control):
            n = np.size(control)
            flat = np.reshape(control, () if n == 1 else (n,))
            control = _vector(f"{name}.control", flat, np.shape(flat), fix)
        self.control = control
        self.index = None if index is None else int(index)
        self.name = str(name)
        enforce(self, self.name)

    @classmethod
    def motor(cls, *, gear=1.0, control=0.0, **kwargs) -> Actuator:
        """Force (or torque) g·u: gain (1, 0, 0), no bias (MuJoCo ``<motor>``)."""
        return cls(gain=(1.0, 0.0, 0.0), bias=(0.0, 0.0, 0.0), gear=gear, control=control, **kwargs)

    @classmethod
    def position(cls, kp, *, kv=0.0, gear=1.0, control=0.0, **kwargs) -> Actuator:
        """PD servo to the target u: g·(k_p (u − L) − k_v V) (MuJoCo ``<position>``)."""
        return cls(gain=(kp, 0.0, 0.0), bias=(0.0, -kp, -kv), gear=gear, control=control, **kwargs)

    @classmethod
    def velocity(cls, kv, *, gear=1.0, control=0.0, **kwargs) -> Actuator:
        """Velocity servo to the target u: g·k_v (u − V) (MuJoCo ``<velocity>``)."""
        return cls(gain=(kv, 0.0, 0.0), bias=(0.0, 0.0, -kv), gear=gear, control=control, **kwargs)

    def signal(self, t):
        """The control u(t), clamped to ``ctrl_range``."""
        u = self.control(t) if callable(self.control) else self.control
        u = jnp.asarray(u)
        if self.index is not None:
            u = u[..., self.index]
        if self.ctrl_range is not None:
            u = jnp.clip(u, self.ctrl_range[0], self.ctrl_range[1])
        return u

    def __call__(self, t, x, xdot):
        """The generalized force g·f on the joint at time t, coordinate x and rate ẋ."""
        length = self.gear * (x + self.offset)
        rate = self.gear * xdot
        a, b = self.gain, self.bias
        force = (a[0] + a[1] * length + a[2] * rate) * self.signal(t) + b[0] + b[1] * length
        force = force + b[2] * rate
        if self.force_range is not None:
            force = jnp.clip(force, self.force_range[0], self.force_range[1])
        return self.gear * force


@validates_inputs
class JointActuators(eqx.Module):
    """Several actuators on one joint coordinate whose total generalized force is capped:
    MuJoCo's joint-level ``actuatorfrcrange`` (with ``actuatorfrclimited``). The force on the
    joint is

        τ = clamp( Σ_k τ_k(t, x, ẋ),  force_range ),

    τ_k = g_k · clamp(f_k, force_range_k) the generalized force of each :class:`Actuator`
    (gear and the actuator's own ``forcerange`` included), so the cap applies to the sum after
    the gears: MuJoCo clamps ``qfrc_actuator`` per joint DOF after summing the actuators'
    moment-weighted forces (engine_forward.c, ``mj_fwdActuation``; XML reference,
    joint/actuatorfrcrange). ``force_range`` None: no cap, the plain sum. It is the
    ``actuator`` of a :class:`rbjax.RotationalSpringDamper` or :class:`rbjax.AxialSpringDamper`
    like a single :class:`Actuator`; its numbers are differentiable leaves.
    """

    actuators: tuple[Actuator, ...]
    force_range: Float[Array, "2"] | None
    name: str = eqx.field(static=True)

    _rules: ClassVar[tuple[Rule, ...]] = (_ordered("force_range"),)

    def __init__(self, actuators, *, force_range=None, name: str = "joint"):
        actuators = tuple(actuators)
        if not actuators or not all(isinstance(a, Actuator) for a in actuators):
            fail(
                f"{name}.actuators",
                [type(a).__name__ for a in actuators],
                "is not a non-empty sequence of rbjax.Actuator",
                "pass the joint's actuators, e.g. (rbjax.Actuator.motor(gear=2.0),)",
            )
        self.actuators = actuators
        self.force_range = _range(f"{name}.force_range", force_range, "give (low, high) or None")
        self.name = str(name)
        enforce(self, self.name)

    def __call__(self, t, x, xdot):
        """The capped total generalized force on the joint at time t, coordinate x, rate ẋ."""
        tau = sum(a(t, x, xdot) for a in self.actuators)
        if self.force_range is not None:
            tau = jnp.clip(tau, self.force_range[0], self.force_range[1])
        return tau
