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
* ``energy``: |E − E₀| / S for a conservative model (gravity, and springs without damping),
  (E − E₀) / S for a passive but dissipative one (the energy may only fall); not watched for
  a model driven by forces without a potential, actuators or time-dependent joints. S is the
  largest T + |V − V₀| seen so far: the energy the motion actually exchanges, which does not
  depend on where the potential's zero lies (a body high above the origin is not "more
  accurate"); see :func:`rbjax.energy_balance`.

A system whose quantity exceeds its limit stops being successful: ``Trajectory.result`` is
``RESULTS.implausible``, ``Trajectory.failed_step`` the last step of the saved chunk where it
was first seen, and with ``throw=True`` the rollout raises naming the step, the quantity and
its value. ``Trajectory.monitors`` holds the worst value of each quantity for every system.
"""

from __future__ import annotations

import equinox as eqx
import numpy as np

from ._errors import validates_inputs

# Defaults: far above what a usable integration leaves (RK4 at dt = 10 ms: |A|² − 1 ≈ 1e-8
# after 10⁴ steps of a spinning body; double-pendulum joints ≈ 5e-5 after 10³ steps; energy
# 1e-6), far below what an unstable one produces (|A|² − 1 ≈ 2 to 60, energy ×1.5 to ×5 at
# dt = 1 to 10 s on a tumbling body). Unit length and energy depend on the order: a
# first-order scheme drifts by design (SemiImplicitEuler grows |A|² by (hω)²/4 per step:
# 1.5 % after 24 steps of 10 ms at 5 rad/s) and is used knowingly as the cheap option.
UNIT_LENGTH = {1: 0.1}  # by order; every other order: the HIGH_ORDER value
ENERGY = {1: 0.1}
UNIT_LENGTH_HIGH_ORDER = 1e-2
ENERGY_HIGH_ORDER = 1e-2
JOINTS = 1e-2

QUANTITIES = ("unit_length", "joints", "energy")


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
    energy         relative energy change (conservative: two-sided;     0.1 first-order
                   dissipative: increase only)                          integrators, else 1e-2
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
