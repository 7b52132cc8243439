"""Runtime plausibility monitors of a rollout: ``rollout(..., monitors=Plausibility(...))``.

A step that returns finite numbers is not a correct step: an explicit integrator at ten times
its stability limit returns a "rigid" body with |A|² = 60 and an energy five times the initial
one, all finite (issue 18). Every rollout therefore watches three quantities at its saved
states, each a necessary condition of a correct solution:

* ``unit_length``: max over rigid bodies of | |A|² − 1 | (Möller & Glocker 2012, eq. (77):
  the perfect constraint every rigid body carries; the integrators only drift from it);
* ``joints``: max |Φ(q, t)| over all joint equations (ME751 r–p formulation; metres for point
  coincidences, dimensionless for the dot-product rows: the residual of a joint that should
  hold exactly);
* ``energy``: the work–energy balance, |E − E₀ − W| / S, with E = T + V (kinetic energy
  ½ uᵀ M u, Möller & Glocker 2012, eq. (60), valid for rigid and scalable bodies; V of
  gravity and the springs) and W the work of every force that no potential accounts for
  (ForceFunction, PointForce, BodyTorque, user forces, actuators, dampers), W = ∫ P dt with
  P the power of its resultants on u = (v, ν, ω) (eq. (92)), accumulated by the rollout at
  every step (one evaluation of those forces per step) to fourth order in h. W = 0 for a
  conservative model (gravity, undamped springs), whose rollout is unchanged. S is the
  energy the motion exchanges: the largest T + |V − V₀| + |W| so far plus ∫ |P| dt, which
  does not depend on where the potential's zero lies (a body high above the origin is not
  "more accurate"). Not watched for a model with a time-dependent joint (a driver), whose
  reactions do work −λᵀ ∂Φ/∂t: its joint residuals are. A first-order integrator is
  allowed the energy its half-step lag costs (rbjax/_engine/monitors.py ``evaluate``).

What is watched, by model (``energy_watch``):

=======================================  ============================================
model                                    quantities
=======================================  ============================================
rigid bodies                             unit_length, energy
scalable bodies only                     energy
with joints                              + joints
with forces without a potential          energy as the work–energy balance
with a time-dependent joint (driver)     unit_length (if rigid), joints; no energy
=======================================  ============================================

so every model has at least one watched quantity unless its limits are set to None.

A system whose quantity exceeds its limit stops being successful: ``Trajectory.result`` is
``RESULTS.implausible``, ``Trajectory.failed_step`` the last step of the saved chunk where it
was first seen, and with ``throw=True`` the rollout raises naming the step, the quantity and
its value. ``Trajectory.monitors`` holds the worst value of each quantity for every system.
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from ._analysis.invariants import _depends_on_time
from ._errors import validates_inputs

# Defaults: far above what a usable integration leaves (RK4 at dt = 10 ms: |A|² − 1 ≈ 1e-8
# after 10⁴ steps of a spinning body; double-pendulum joints ≈ 5e-5 after 10³ steps; energy
# 1e-6), far below what an unstable one produces (|A|² − 1 ≈ 2 to 60, energy ×1.5 to ×5 at
# dt = 1 to 10 s on a tumbling body). Unit length and energy depend on the order: a
# first-order scheme drifts by design (SemiImplicitEuler grows |A|² by (hω)²/4 per step:
# 1.5 % after 24 steps of 10 ms at 5 rad/s) and is used knowingly as the cheap option.
# The work–energy balance of a spring written as a ForceFunction (k = 100, m = 1, 20
# periods, tests/test_reliability.py): RK4 3.6e-5 at ωh = 0.1, 2.7e-3 at 0.3 (the built-in
# spring's energy: 8.7e-6, 2.1e-3), flagged from ωh = 1 (0.08) to 2.85 (0.3);
# SemiImplicitEuler 6.5e-3 at ωh = 0.01, 0.074 at 0.1, flagged from 0.15 (0.107): its work
# agrees with the trapezoid sum of its power only to first order (the built-in spring:
# 0.077 up to ωh = 0.3, flagged from 1); ImplicitMidpoint 3.1e-4 at ωh = 0.1, 5.1e-3 at
# 0.3, flagged from 1 (0.10): the balance sees its phase error, which the built-in spring's
# energy, conserved exactly by the scheme, does not.
UNIT_LENGTH = {1: 0.1}  # by order; every other order: the HIGH_ORDER value
ENERGY = {1: 0.1}
UNIT_LENGTH_HIGH_ORDER = 1e-2
ENERGY_HIGH_ORDER = 1e-2
JOINTS = 1e-2

QUANTITIES = ("unit_length", "joints", "energy")


def energy_watch(model) -> tuple[str | None, tuple[int, ...]]:
    """What the energy monitor watches for ``model`` (static: structure and concrete values,
    as :func:`rbjax.energy_balance`):

    * ``("conservative", ())``: every force derives from a potential that E = T + V counts
      (gravity, undamped springs): E is conserved;
    * ``("work", indices)``: the forces ``model.forces[i]`` for i in ``indices`` do work no
      potential accounts for (ForceFunction, PointForce, BodyTorque, user forces, actuators,
      dampers, a spring whose V is not its potential): E − E₀ = W, their work, accumulated
      by the rollout;
    * ``(None, ())``: a joint depends on time (a driver): its reactions do work −λᵀ ∂Φ/∂t
      that only the multipliers give; the joint residuals are watched instead.
    """
    dtype = jnp.result_type(model.mass)
    if any(_depends_on_time(joint, dtype) for joint in model.joints):
        return None, ()
    work = tuple(
        i for i, f in enumerate(model.forces) if f._energy_balance(model) != "conservative"
    )
    return ("work" if work else "conservative"), work


def _limit(cls: str, name: str, value):
    if value is None or isinstance(value, str) and value == "auto":
        return value
    ok = isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool)
    if not ok or not (np.isfinite(float(value)) and float(value) > 0):
        raise ValueError(
            f"{cls}.{name} = {value!r} is not a positive finite number, 'auto' or None. Fix: "
            f"pass e.g. {name}=0.05 to loosen the limit, or {name}=None to stop watching it."
        )
    return float(value)


@validates_inputs
class Plausibility(eqx.Module):
    """Limits of the runtime monitors of a rollout (module docstring of rbjax/_monitors.py).

    Each field is a positive limit, ``"auto"`` (the default for the integrator; below) or
    ``None`` (not watched). ``rollout(..., monitors=None)`` disables all three.

    =============  ===================================================  ======================
    field          quantity                                             ``"auto"``
    =============  ===================================================  ======================
    unit_length    max over rigid bodies of | |A|² − 1 |                0.1 first-order
                                                                        integrators, else 1e-2
    joints         max |Φ| over all joint equations [m or 1]            1e-2
    energy         work–energy balance |E − E₀ − W| / S (W = 0 for a   0.1 first-order
                   conservative model; module docstring)                integrators, else 1e-2
    =============  ===================================================  ======================

    Every limit is at least 10⁴ ε of the state's dtype (float32: 1.2e-3), above rounding.
    Loosen a limit (``Plausibility(energy=0.2)``) when a coarse step is accepted knowingly;
    tighten it to use the monitors as an accuracy check.
    """

    unit_length: float | str | None = eqx.field(static=True, default="auto")
    joints: float | str | None = eqx.field(static=True, default="auto")
    energy: float | str | None = eqx.field(static=True, default="auto")

    def __check_init__(self):
        for name in QUANTITIES:
            _limit("Plausibility", name, getattr(self, name))

    def limits(self, order: int, eps: float) -> tuple[float | None, float | None, float | None]:
        """The concrete limits (unit_length, joints, energy) for an integrator of ``order`` and
        a state of machine epsilon ``eps``; None where a quantity is not watched."""
        auto = (
            UNIT_LENGTH.get(order, UNIT_LENGTH_HIGH_ORDER),
            JOINTS,
            ENERGY.get(order, ENERGY_HIGH_ORDER),
        )
        out = []
        for name, default in zip(QUANTITIES, auto, strict=True):
            v = getattr(self, name)
            v = default if v == "auto" else v
            out.append(None if v is None else max(float(v), 1e4 * eps))
        return tuple(out)
