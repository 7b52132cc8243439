"""The heavy symmetric top in steady precession: a spherical joint to ground under gravity.

A symmetric top (m = 1 kg, centre of mass l = 2 cm from the tip on its symmetry axis,
I₁ = I₂ = 2e-3 kg m² about the centre of mass, I₃ = 4e-3 kg m²) spins at ω₃ = 20 rad/s with its
tip held by a ``Spherical`` joint at the origin, g = 9.81 m/s² along −z (the model file
examples/models/heavy_top.toml, loaded with rbjax.load). Started on the steady-
precession cone (tilt θ, precession rate φ̇, no nutation), the top must keep its tilt and
precess uniformly at the rate given by the closed form (Goldstein §5.7, with I₁' = I₁ + m l²
about the tip):

    m g l = φ̇ (I₃ ω₃ − I₁' φ̇ cos θ),  so  φ̇ = (I₃ω₃ ∓ √((I₃ω₃)² − 4 I₁' m g l cos θ)) / (2 I₁' cos θ).

Three tops run in ONE batched rollout (ScalableDAE, RK4): θ = 30° and 60° on the slow root
(−), and θ = 30° on the fast root (+). Checked for each: the largest deviation of the tilt from
θ, the precession angle φ(t) against φ̇ t, and the energy drift (relative to the kinetic energy).

    python examples/heavy_top.py [--t-end 2] [--dt 5e-4]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import rbjax  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _checks import Checks  # noqa: E402

G, MASS, ARM = 9.81, 1.0, 0.02
I1C, I3 = 2e-3, 4e-3  # about the centre of mass
MODEL_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models", "heavy_top.toml")
I1 = I1C + MASS * ARM**2  # transverse, about the tip
SPIN = 20.0  # ω₃ [rad/s]
CASES = ((30.0, "slow"), (60.0, "slow"), (30.0, "fast"))  # (tilt [deg], root)


def precession_rate(theta, root):
    c = np.cos(theta)
    disc = np.sqrt((I3 * SPIN) ** 2 - 4 * I1 * c * MASS * G * ARM)
    return (I3 * SPIN + (disc if root == "fast" else -disc)) / (2 * I1 * c)


def rotmat(a):
    a = np.asarray(a) / np.linalg.norm(a, axis=-1, keepdims=True)
    a0, a1, a2, a3 = np.moveaxis(a, -1, 0)
    return np.stack(
        [
            np.stack(
                [a0**2 + a1**2 - a2**2 - a3**2, 2 * (a1 * a2 - a0 * a3), 2 * (a1 * a3 + a0 * a2)],
                -1,
            ),
            np.stack(
                [2 * (a1 * a2 + a0 * a3), a0**2 - a1**2 + a2**2 - a3**2, 2 * (a2 * a3 - a0 * a1)],
                -1,
            ),
            np.stack(
                [2 * (a1 * a3 - a0 * a2), 2 * (a2 * a3 + a0 * a1), a0**2 - a1**2 - a2**2 + a3**2],
                -1,
            ),
        ],
        -2,
    )


def steady_state(theta, phidot):
    """The top tilted by θ about world x (symmetry axis (0, −sin θ, cos θ)), on the cone.

    Euler angles ZXZ (φ, θ, ψ) = (0, θ, 0): ω_body = (φ̇ sin θ sin ψ, φ̇ sin θ cos ψ, ψ̇ + φ̇ cos θ)
    with ω₃ = ψ̇ + φ̇ cos θ the spin; the centre of mass r = l e₃ moves with v = ω × r."""
    quat = np.array([np.cos(theta / 2), np.sin(theta / 2), 0.0, 0.0])
    rot = rotmat(quat)
    w_body = np.array([0.0, phidot * np.sin(theta), SPIN])
    r = ARM * rot[:, 2]
    return r, quat, np.cross(rot @ w_body, r), w_body


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--t-end", type=float, default=2.0, help="simulated time [s]")
    ap.add_argument("--dt", type=float, default=5e-4, help="RK4 step [s]")
    args = ap.parse_args(argv)
    n_steps = int(round(args.t_end / args.dt))
    save_every = max(1, n_steps // 400)
    while n_steps % save_every:
        save_every -= 1

    thetas = np.radians([c[0] for c in CASES])
    rates = np.array(
        [precession_rate(th, root) for th, (_, root) in zip(thetas, CASES, strict=True)]
    )
    for th, w in zip(thetas, rates, strict=True):  # the closed form really is a root
        assert abs(w * (I3 * SPIN - I1 * w * np.cos(th)) - MASS * G * ARM) < 1e-12
    r, quat, v, w_body = (
        np.stack(x)[:, None] for x in zip(*map(steady_state, thetas, rates), strict=True)
    )
    state0 = rbjax.make_state(position=r, quaternion=quat, velocity=v, omega_body=w_body)
    model = rbjax.load(MODEL_FILE).model  # the top and its tip joint
    assert np.allclose(model.mass, MASS) and np.allclose(
        np.diag(model.inertia[0]), [I1C, I1C, I3]
    ), "file ≠ reference"
    print(
        f"Heavy symmetric top: m = {MASS} kg, l = {ARM} m, I₁ = {I1C}, I₃ = {I3} kg m² (CoM), "
        f"spin ω₃ = {SPIN} rad/s; {len(CASES)} tops batched, RK4 dt = {args.dt} s, {args.t_end} s"
    )
    t0 = time.perf_counter()
    tr = rbjax.rollout(model, state0, jnp.asarray(args.dt), n_steps, save_every=save_every)
    jax.block_until_ready(tr.q)
    print(f"rollout: {time.perf_counter() - t0:.1f} s wall incl. compile\n")
    t = np.asarray(tr.t[0])
    axis = rotmat(np.asarray(tr.q[:, :, 0, 3:7]))[..., 2]  # symmetry axis, (B, T, 3)
    tilt = np.arccos(np.clip(axis[..., 2], -1, 1))
    phi = np.unwrap(np.arctan2(axis[..., 0], -axis[..., 1]), axis=-1)  # 0 at start
    energy = np.asarray(rbjax.total_energy(model, tr.states))
    kinetic = np.asarray(rbjax.kinetic_energy(model, state0))  # (B,)
    checks = Checks()
    errs = {"tilt": [], "phi": [], "energy": []}
    print(
        f"  {'case':14s} {'φ̇ closed form':>15s} {'φ̇ measured':>15s} {'max |tilt − θ|':>15s} {'turns':>6s}"
    )
    for b, ((deg, root), w) in enumerate(zip(CASES, rates, strict=True)):
        e_tilt = np.abs(tilt[b] - thetas[b]).max()
        e_phi = np.abs(phi[b] - w * t).max() / (abs(w) * t[-1])  # relative to the angle swept
        errs["tilt"].append(e_tilt)
        errs["phi"].append(e_phi)
        errs["energy"].append(np.abs(energy[b] - energy[b, 0]).max() / kinetic[b])
        print(
            f"  {f'{deg:g}°, {root}':14s} {w:15.9f} {phi[b, -1] / t[-1]:15.9f} {e_tilt:15.2e}"
            f" {phi[b, -1] / (2 * np.pi):6.2f}"
        )
    print("checks (worst over the three tops):")
    checks.check("tilt", "max |tilt − θ| (no nutation) [rad]", max(errs["tilt"]), 1e-9)
    checks.check("precession", "max |φ(t) − φ̇ t| / (φ̇ t_end)", max(errs["phi"]), 1e-9)
    checks.check("energy", "max |E − E₀| / T₀ (T₀ the kinetic energy)", max(errs["energy"]), 1e-8)
    if checks.failed:
        raise SystemExit(f"heavy top: checks failed: {checks.failed}")
    return dict(checks)


if __name__ == "__main__":
    rbjax.compilation_cache()  # compiled programs kept on disk for the next run
    main()
