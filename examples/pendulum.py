"""A rod pendulum on a revolute joint: the large-amplitude period and the pivot reaction.

A uniform rod (m = 1 kg, L = 1 m, pivot at one end, hinge about world y, g = 9.81 m/s²; the model
file examples/models/rod_pendulum.toml, loaded with rbjax.load) is released at rest from θ₀ = 90° (horizontal) and θ₀ = 30° from the downward vertical, in ONE
batched ``rbjax.rollout`` (ScalableDAE, RK4). We check against closed forms the code did not
produce:

* the period: the zeros of θ(t) (located on the cubic Hermite interpolant of θ, θ̇) against
  T = 4 √(I_O / (m g d)) K(sin(θ₀/2)), the complete elliptic integral of the first kind
  (``scipy.special.ellipk(k²)``), with d = L/2 and I_O = m L²/3 about the pivot;
* the pivot reaction (``rbjax.reactions``, force of the hinge on the rod): at release from the
  horizontal it is vertical, m (g − α d) with α = m g d / I_O (= m g / 4 for a uniform rod);
  at the bottom of each swing, with the energy-consistent rate ω² = 2 m g d (1 − cos θ₀)/I_O,
  it is m g + m ω² d; the hinge carries no bending moment (planar motion);
* energy conservation over the run.

    python examples/pendulum.py [--dt 1e-3] [--t-end 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import rbjax  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _checks import Checks  # noqa: E402

G, MASS, LENGTH = 9.81, 1.0, 1.0
D = LENGTH / 2  # pivot to centre of mass
I_C = MASS * LENGTH**2 / 12  # about the centre of mass, ⟂ to the rod
I_O = I_C + MASS * D**2  # about the pivot
THETA0_DEG = (90.0, 30.0)
MODEL_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models", "rod_pendulum.toml")


def pendulum_model():
    """The rod of examples/models/rod_pendulum.toml (rbjax.load): along body x, hinged about
    world y at its end; checked against this script's constants, which the closed forms use."""
    model = rbjax.load(MODEL_FILE).model
    assert np.allclose(model.mass, MASS) and np.allclose(model.inertia[0, 1, 1], I_C), (
        "file ≠ reference"
    )
    return model


def pendulum_states(theta, omega):
    """Rods at angles θ from the downward vertical (in the xz-plane) turning at θ̇ = ω.

    Body x (pivot → tip) is world x turned about y by β = π/2 − θ, so ω_body = (0, −θ̇, 0)."""
    theta, omega = np.broadcast_arrays(np.asarray(theta, float), np.asarray(omega, float))
    e = np.stack([np.sin(theta), 0 * theta, -np.cos(theta)], -1)
    e_dot = np.stack([np.cos(theta), 0 * theta, np.sin(theta)], -1) * omega[..., None]
    beta = np.pi / 2 - theta
    quat = np.stack([np.cos(beta / 2), 0 * beta, np.sin(beta / 2), 0 * beta], -1)
    w_body = np.stack([0 * omega, -omega, 0 * omega], -1)
    return rbjax.make_state(
        position=(D * e)[..., None, :],
        quaternion=quat[..., None, :],
        velocity=(D * e_dot)[..., None, :],
        omega_body=w_body[..., None, :],
    )


def hermite_zeros(t, f, fdot):
    """Times where f changes sign, on the cubic Hermite interpolant of (f, ḟ) (error O(h⁴))."""
    from scipy.optimize import brentq

    out = []
    for k in np.nonzero(np.sign(f[:-1]) * np.sign(f[1:]) < 0)[0]:
        h = t[k + 1] - t[k]
        f0, f1, d0, d1 = f[k], f[k + 1], fdot[k] * h, fdot[k + 1] * h

        def p(s, f0=f0, f1=f1, d0=d0, d1=d1):
            return (
                (2 * s**3 - 3 * s**2 + 1) * f0
                + (s**3 - 2 * s**2 + s) * d0
                + (-2 * s**3 + 3 * s**2) * f1
                + (s**3 - s**2) * d1
            )

        out.append(t[k] + h * brentq(p, 0.0, 1.0, xtol=1e-15, rtol=1e-15))
    return np.asarray(out)


@eqx.filter_jit  # one compile instead of many small eager ones
def accelerations_and_reactions(model, states):
    udot, lam = rbjax.accelerations(model, states)
    return udot, rbjax.reactions(model, states, lam)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--dt", type=float, default=1e-3, help="RK4 step [s]")
    ap.add_argument("--t-end", type=float, default=3.0, help="simulated time [s] (≥ 2.6)")
    args = ap.parse_args(argv)
    from scipy.special import ellipk

    n_steps = int(round(args.t_end / args.dt))
    theta0 = np.radians(THETA0_DEG)
    model = pendulum_model()
    print(
        f"Rod pendulum: m = {MASS} kg, L = {LENGTH} m, I_O = {I_O:.6f} kg m², released at rest from "
        f"θ₀ = {', '.join(f'{a:g}°' for a in THETA0_DEG)}; RK4, dt = {args.dt} s, {args.t_end} s"
    )
    checks = Checks()

    # --- reactions: release from the horizontal, and the bottom of both swings (one batch)
    w_bot = np.sqrt(2 * MASS * G * D * (1 - np.cos(theta0)) / I_O)
    states = pendulum_states(np.r_[np.pi / 2, 0.0, 0.0], np.r_[0.0, w_bot])
    t0 = time.perf_counter()
    udot, rx = accelerations_and_reactions(model, states)
    f_rod = np.asarray(rx.force_j[:, 0])  # force of the hinge on the rod, world frame
    alpha = MASS * G * D / I_O
    expect = np.array(
        [
            [0, 0, MASS * (G - alpha * D)],
            [0, 0, MASS * G + MASS * w_bot[0] ** 2 * D],
            [0, 0, MASS * G + MASS * w_bot[1] ** 2 * D],
        ]
    )
    print(f"\npivot reaction on the rod [N] ({time.perf_counter() - t0:.1f} s incl. compile)")
    for lbl, f, e in zip(
        ("release from 90°", "bottom, released from 90°", "bottom, released from 30°"),
        f_rod,
        expect,
        strict=True,
    ):
        print(f"  {lbl:27s} rbjax {np.array2string(f, precision=9)}  closed form {e[2]:.9f} (z)")
    print("checks:")
    checks.check(
        "reaction_release",
        "reaction at release vs m(g − αd) [N]",
        np.abs(f_rod[0] - expect[0]).max(),
        1e-12,
    )
    checks.check(
        "reaction_bottom",
        "reaction at bottom vs m g + m ω² d [N]",
        np.abs(f_rod[1:] - expect[1:]).max(),
        1e-12,
    )
    checks.check(
        "hinge_moment",
        "hinge moment on the rod (planar: 0) [N m]",
        np.abs(np.asarray(rx.torque_j)).max(),
        1e-12,
    )
    checks.check(
        "alpha_release",
        "angular accel. at release vs α [rad/s²]",
        abs(float(udot[0, 0, 5]) - alpha),  # ω_body,y = −θ̇ and θ̈ = −α at θ = 90°
        1e-12,
    )

    # --- period: both amplitudes in one batched rollout
    t0 = time.perf_counter()
    tr = rbjax.rollout(model, pendulum_states(theta0, 0.0), jnp.asarray(args.dt), n_steps)
    jax.block_until_ready(tr.q)
    wall = time.perf_counter() - t0
    t = np.asarray(tr.t[0])
    a = np.asarray(tr.q[:, :, 0, 3:7])
    theta = np.pi / 2 - 2 * np.arctan2(a[..., 2], a[..., 0])
    theta_dot = -np.asarray(tr.u[:, :, 0, 5])
    energy = np.asarray(rbjax.total_energy(model, tr.states))
    print(f"\nperiod ({n_steps} RK4 steps, both amplitudes batched: {wall:.1f} s incl. compile)")
    period_errs = []
    for b, th0 in enumerate(theta0):
        period = 4 * np.sqrt(I_O / (MASS * G * D)) * ellipk(np.sin(th0 / 2) ** 2)
        zeros = hermite_zeros(t, theta[b], theta_dot[b])
        if len(zeros) < 3:
            raise SystemExit(f"--t-end {args.t_end} s is too short to see a full period")
        measured = zeros[2] - zeros[0]
        rel = abs(measured - period) / period
        period_errs.append(rel)
        print(
            f"  θ₀ = {np.degrees(th0):4.0f}°: T = {measured:.10f} s, elliptic {period:.10f} s "
            f"(small-angle {2 * np.pi * np.sqrt(I_O / (MASS * G * D)):.6f} s)"
        )
    print("checks:")
    checks.check(
        "period_rel", "period vs 4√(I_O/mgd) K(sin θ₀/2), relative", max(period_errs), 1e-9
    )
    e_drift = np.abs(energy - energy[:, :1]).max() / (MASS * G * D)
    checks.check("energy_drift", "energy drift / (m g d)", e_drift, 1e-8)
    if checks.failed:
        raise SystemExit(f"pendulum: checks failed: {checks.failed}")
    return dict(checks)


if __name__ == "__main__":
    rbjax.compilation_cache()  # compiled programs kept on disk for the next run
    main()
