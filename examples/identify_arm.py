"""Identifying an arm's link masses and joint friction from encoder and motor-torque data.

The two-link arm of examples/models/double_pendulum.xml (an MJCF file: a shoulder and an elbow
hinge about world y, capsule links; rbjax.load gives its joint coordinates, MuJoCo's qpos and
qvel, as for any tree) is driven by known motor torques,
a multisine per joint as a robot's excitation trajectory would be, recorded at 200 Hz. The real
links are 15 % heavier and 10 % lighter than the CAD masses of the file, and each joint has
viscous friction c and Coulomb friction f (smoothed: f tanh(q̇/ε), ε = 0.05 rad/s). The joint
encoders are sampled at 100 Hz for 4 s with 0.5 mrad of noise.

Unknowns: both link masses (rbjax.Positive; each link's inertia scales with its mass, the
geometry being known from CAD), the four friction coefficients (rbjax.Positive) and the initial
joint angles and rates. The motor torques are the known input: a generalized force of the
JointModel (``forces``: τ(t, qpos, qvel)) adds them to the friction torques,
τ = τ_motor(t) − c q̇ − f tanh(q̇/ε), with τ_motor linearly interpolated from its record (an
equinox Module: the friction coefficients are its differentiable leaves). The observations are
rbjax.JointEncoder sensors.

Method: multiple shooting (``rbjax.Shooting(8)``: segments of 0.5 s) started from the encoder
data (angles, and rates by central differences), Levenberg–Marquardt (the default), RK4 at
the sample interval. (The same fit in maximal coordinates, ``formulation=rbjax.ScalableDAE()``
with ``rbjax.JointSpace`` and ``rbjax.JointForces``, reaches the same estimates; in joint
coordinates it compiles and runs several times faster.) The answer comes in physical units
(kg, N m s/rad, N m) with standard errors; the example checks every mass and friction
coefficient against the truth (within 3 standard errors), the convergence and the reduced χ².

    python examples/identify_arm.py [--seconds 4] [--segments 8] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import equinox as eqx  # noqa: E402

import rbjax  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _checks import Checks  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MASS_FACTOR = np.array([1.15, 0.9])  # real link masses / CAD masses
VISCOUS = np.array([0.3, 0.1])  # N m s/rad
COULOMB = np.array([0.2, 0.08])  # N m
EPS = 0.05  # rad/s, smoothing of the Coulomb friction
RATE, NOISE, TORQUE_RATE = 100.0, 5e-4, 200.0  # Hz, rad, Hz


def _arm():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nothing to replace: the file has no actuators
        loaded = rbjax.load(os.path.join(HERE, "models", "double_pendulum.xml"))
    return eqx.tree_at(lambda m: m.forces, loaded.model, ())


BARE = _arm()
CAD_MASS = np.asarray(BARE.mass)


def motor_torque(times):
    """The excitation: a multisine per joint [N m] (known, recorded)."""
    t = np.asarray(times)[:, None]
    amp = np.array([[6.0, 2.0]])
    return amp * (np.sin(2.1 * t) + 0.5 * np.sin(5.3 * t + 1.0) + 0.3 * np.sin(9.7 * t + 2.0))


class Drive(eqx.Module):
    """τ = τ_motor(t) − c q̇ − f tanh(q̇/ε) in joint coordinates: the recorded motor torque,
    linearly interpolated, and the joint friction with differentiable coefficients."""

    viscous: jax.Array
    coulomb: jax.Array
    times: jax.Array
    torques: jax.Array

    def __call__(self, t, qpos, qd):
        motor = jnp.stack(
            [jnp.interp(t, self.times, self.torques[:, k]) for k in range(self.torques.shape[1])]
        )
        return motor - self.viscous * qd - self.coulomb * jnp.tanh(qd / EPS)


def make_build(t_end: float):
    times = np.arange(0.0, t_end + 0.05, 1.0 / TORQUE_RATE)
    torques = jnp.asarray(motor_torque(times))
    times = jnp.asarray(times)

    def build(p):
        mass = p["mass"].value
        inertia = BARE.inertia * (mass / BARE.mass)[:, None, None]
        drive = Drive(p["viscous"].value, p["coulomb"].value, times, torques)
        model = eqx.tree_at(
            lambda m: (m.mass, m.inertia, m.forces),
            BARE,
            (mass, inertia, (drive,)),
        )
        return model, rbjax.JointState(0.0, p["q0"], p["qd0"])

    return build


def measure(build, times, rng):
    """Encoder readings from a fine rollout (RK4, 1 ms) of the true arm."""
    truth = {
        "mass": rbjax.Positive.from_value(CAD_MASS * MASS_FACTOR),
        "viscous": rbjax.Positive.from_value(VISCOUS),
        "coulomb": rbjax.Positive.from_value(COULOMB),
        "q0": jnp.asarray([0.3, -0.2]),
        "qd0": jnp.asarray([0.0, 0.0]),
    }
    model, state = build(truth)
    every = round(1.0 / (RATE * 1e-3))
    traj = rbjax.rollout(model, state, 1e-3, every * (len(times) - 1), save_every=every)
    q = np.asarray(traj.qpos)
    return q + NOISE * rng.normal(size=q.shape)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=4.0, help="length of the record [s]")
    ap.add_argument("--segments", type=int, default=8, help="multiple-shooting segments")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    times = np.arange(0.0, args.seconds + 1e-9, 1.0 / RATE)
    build = make_build(args.seconds)
    enc = measure(build, times, rng)
    data = rbjax.Measurements(
        times,
        [
            rbjax.JointEncoder("shoulder", enc[:, 0:1], NOISE),
            rbjax.JointEncoder("elbow", enc[:, 1:2], NOISE),
        ],
    )
    # segment start states from the encoders: angles as measured, rates by central differences
    rates = np.gradient(enc, times, axis=0)
    starts = rbjax.JointState(times, enc, rates)
    guess = {
        "mass": rbjax.Positive.from_value(CAD_MASS),
        "viscous": rbjax.Positive.from_value(np.array([0.1, 0.1])),
        "coulomb": rbjax.Positive.from_value(np.array([0.1, 0.1])),
        "q0": jnp.asarray(enc[0]),
        "qd0": jnp.asarray(rates[0]),
    }
    t0 = time.perf_counter()
    fit = rbjax.identify(
        build,
        guess,
        data,
        dt=1.0 / RATE,
        integrator=rbjax.RK4(),
        shooting=rbjax.Shooting(args.segments, continuity_weight=1e10, states0=starts),
        max_steps=100,
    )
    print(f"{time.perf_counter() - t0:.1f} s (compile included):\n{fit.summary()}\n")
    q = fit.quantities()
    truth = {
        "mass": CAD_MASS * MASS_FACTOR,
        "viscous": VISCOUS,
        "coulomb": COULOMB,
    }
    checks = Checks()
    z, rel = [], []
    for key, value in truth.items():
        for k in range(2):
            e = q[f"['{key}'][{k}]"]
            z.append((e.value - value[k]) / e.std)
            rel.append(abs(e.value / value[k] - 1.0))
            print(f"  {key}[{k}]: {e.value:.5g} ± {e.std:.2g} (true {value[k]:.5g})")
    nu = data.count - len(fit.names)
    checks.check("converged", "converged (0 = yes)", 0.0 if fit.converged else 1.0, 0.0)
    checks.check("z", "largest |error| / σ (masses, friction)", np.max(np.abs(z)), 3.0)
    checks.check("mass", "link masses, largest relative error", max(rel[:2]), 0.02)
    checks.check("chi2", "|reduced χ² − 1| / (5 √(2/ν))", abs(fit.reduced_chi2 - 1.0) / (5 * np.sqrt(2.0 / nu)), 1.0)  # fmt: skip
    if checks.failed:
        raise SystemExit(f"identify_arm: checks failed: {checks.failed}")
    return checks


if __name__ == "__main__":
    rbjax.compilation_cache()  # compiled programs kept on disk for the next run
    main()
