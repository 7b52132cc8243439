"""The plausibility monitors (rbjax/_monitors.py) of a :class:`rbjax.JointModel`'s rollout.

A tree in joint coordinates satisfies its joints by construction: there is no joint residual
to watch. What remains of the three quantities of the maximal formulation:

* ``unit_length``: max over ball and free joints of | |q|² − 1 | of their quaternions. Every
  function of the configuration reads q/|q| (rbjax/_tree/model.py), so a drifted length
  changes no force; but |q| is a first integral of the exact flow (seed 000: the scaling
  rate ν = 0), and RK4 at a usable step keeps it to ~1e-8, so a length far from 1 says the
  step does not resolve the rotation. Not watched for a tree without quaternions.
* ``energy``: the work–energy balance |E − E₀ − W| / S with E = ½ q̇ᵀ M(q) q̇ + V(q) and
  W = ∫ q̇ᵀ τ_nc dt the work of the forces no potential accounts for (damping, actuators,
  user forces; rbjax/_tree/energy.py), accumulated by the rollout's loop at every step
  (rbjax/_engine/monitors.py ``work_step``, with this module's :func:`engine_power`). The
  scale S, the rounding floor and a first-order integrator's lag allowance are those of
  the maximal monitors (one function for both: rbjax/_engine/monitors.py
  ``energy_balance``), with the bodies' centres of mass (rbjax/_tree/bodies.py) in place of
  the maximal coordinates' positions. One-sided
  for :class:`rbjax.ImplicitFast`: its implicit damping and actuator gains dissipate, by
  design, energy that the quadrature of q̇ᵀτ_nc along its states does not see (a stiff servo
  arm at its file's 2 ms step, the trajectory equal to MuJoCo's implicitfast to 1e-12: the
  balance is off by 0.5, tests/test_joint_coordinates.py), which is the stability it is
  chosen for, not an error of the run. So the check is one-sided there: with springs and
  dampers only (whose work is never positive), energy GAINED, max(E − E₀, 0) / S, which an
  unstable step (a spring stiffer than the step resolves) still shows; with actuators or
  user forces, whose work the states' quadrature misjudges as well (the servo arm: 0.5 of
  energy gained beyond it), energy is not watched (unit_length still is).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from .._contact.stepping import MoreauJean
from .._engine.monitors import Spec, energy_balance
from .._errors import is_concrete
from .._monitors import Plausibility
from .bodies import com_from
from .dynamics import qpos_rate
from .energy import kinetic_from, nonconservative_power, potential, potential_from
from .implicit import ImplicitFast
from .kinematics import frames
from .topology import BALL, FREE

QUANTITY = {
    "unit_length": "| |q|² − 1 | of a ball or free joint's quaternion",
    "energy": "the relative energy change",
}


def does_work(model) -> bool:
    """Whether some force of ``model`` does work that no potential accounts for (static:
    structure and concrete values): actuators, user forces, damping that is not zero."""
    if model.actuators or model.forces:
        return True
    d = model.damping
    return not is_concrete(d) or bool(np.any(np.asarray(d) != 0))


def engine_power(model, t, q, u):
    """P = q̇ᵀ τ_nc (*batch,) on the engine's arrays t (*batch, 1), q (nq, *batch, 1),
    u (nv, *batch, 1) (rbjax/_tree/energy.py ``nonconservative_power``)."""
    return nonconservative_power(model, t[..., 0], q[..., 0], u[..., 0])


def joint_spec(monitors, model, integrator, dtype) -> Spec | None:
    """The monitors' static description for a JointModel (None: nothing watched)."""
    if monitors is None:
        return None
    if not isinstance(monitors, Plausibility):
        raise ValueError(
            f"monitors = {monitors!r} is not an rbjax.Plausibility or None. Fix: pass "
            "rbjax.Plausibility(unit_length=..., energy=...) or None (no monitors)."
        )
    order = int(integrator.order)
    unit, _, energy = monitors.limits(order, float(jnp.finfo(dtype).eps))
    unit = unit if model.topology.quat_rows.any() else None
    # module docstring; Moreau–Jean's impacts (e ≤ 1) and friction only remove energy too
    gain_only = isinstance(integrator, ImplicitFast | MoreauJean)
    balance = "work" if does_work(model) else "conservative"
    if gain_only:  # damping only removes energy: E ≤ E₀; actuators and user forces: unwatched
        energy = None if (model.actuators or model.forces) else energy
        balance = "conservative"
    spec = Spec.of((unit, None, energy), balance, (), order)
    if spec.balance == "work":  # deferred: the loop only accumulates the work
        spec = Spec(spec.unit, None, spec.energy, "work", (), spec.lag, True, engine_power)
    if gain_only and spec.energy is not None:
        spec = dataclasses.replace(spec, gain_only=True)
    return spec if spec.watched else None


def evaluate(spec: Spec, model, t, qpos, qvel, save_every: int, h, work=None):
    """The monitors on every saved state at once: ``t`` (T, *batch), ``qpos`` (T, *batch,
    nq), ``qvel`` (T, *batch, nv) as the rollout saves them, ``work`` None or (W, A, P)
    (T, *batch) at the saved states. Returns (step (*batch,) int32: the last step of the
    first saved chunk where a limit is exceeded, −1 if none; worst: dict name -> (*batch,))."""
    q = jnp.moveaxis(qpos, -1, 0)  # (nq, T, *batch): the saved times as a batch axis
    u = jnp.moveaxis(qvel, -1, 0)
    topo = model.topology
    values = {}
    if spec.unit is not None:
        starts = [
            topo.qposadr[j] + (3 if k == FREE else 0)
            for j, k in enumerate(topo.joint_types)
            if k in (BALL, FREE)
        ]
        lengths = [jnp.abs(jnp.sum(q[a : a + 4] ** 2, axis=0) - 1.0) for a in starts]
        values["unit_length"] = jnp.max(jnp.stack(lengths), axis=0)
    if spec.energy is not None:
        values["energy"] = _energy(spec, model, t, q, u, save_every, h, work)
    limits = {"unit_length": spec.unit, "energy": spec.energy}
    exceeded = jnp.zeros(t.shape, bool)
    worst = {}
    for k, v in values.items():
        v = jnp.broadcast_to(v, t.shape)
        exceeded = exceeded | (v > float(limits[k]))  # type: ignore[arg-type]
        worst[k] = jnp.max(jnp.where(jnp.isfinite(v), v, 0), axis=0)
    first = jnp.argmax(exceeded, axis=0)
    step = jnp.where(jnp.any(exceeded, axis=0), first * save_every - 1, -1)
    return step.astype(jnp.int32), worst


def _energy(spec: Spec, model, t, q, u, save_every: int, h, work):
    """|E − E₀ − W| / (S + floor + lag/limit), (T, *batch): rbjax/_engine/monitors.py
    ``energy_balance`` (the maximal monitors' balance, whose derivation and measurements it
    carries) on this formulation's energies, magnitudes and reach."""
    f = frames(model.topology, model, q)  # one kinematics pass for T, V and the floor
    com = com_from(model, f)  # (3, nb, T, *batch)
    kin, pot = kinetic_from(model, f, com, u), potential_from(model, q, com)
    # the magnitudes of V's terms (each body's weight term Σ m |gᵀ c|, so that bodies above
    # and below the origin do not cancel, and |V| for the springs) and the reach of the
    # bodies (Σ m |c|² + tr Θ), whose rounding a step turns into motion
    lift = (1,) * (com.ndim - 2)
    mass = model.mass.reshape((-1,) + lift)
    g = model.gravity.reshape((3, 1) + lift)
    weight = jnp.sum(mass * jnp.abs(jnp.sum(g * com, axis=0)), axis=0)
    trace = jnp.trace(model.inertia, axis1=-2, axis2=-1).reshape((-1,) + lift)
    reach = jnp.sum(mass * jnp.sum(com * com, axis=0) + trace, axis=0)

    def rate():
        qdot = qpos_rate(model.topology, q, u)
        return jax.jvp(lambda qq: potential(model, qq), (q,), (qdot,))[1]

    mag_v = weight + jnp.abs(pot)
    return energy_balance(spec, kin, pot, mag_v, reach, save_every, h, work, rate)
