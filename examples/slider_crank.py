"""A spatial slider-crank: kinematic analysis, inverse dynamics and a torque-driven run.

Crank (r = 0.2 m, 1 kg) on a revolute joint to ground about world z; connecting rod (l = 0.6 m,
2 kg) with a spherical joint at the crank pin and a universal joint at the wrist pin; slider
(3 kg) on a translational joint along world x. Gravity is tilted into the plane of motion,
g = 9.81 (0, −0.6, −0.8) m/s², so that it does work. The mechanism is the model file
examples/models/slider_crank.toml (rbjax.load); the closed forms below take r, l, θ₀ and ω
from this script's constants. Checked against things rbjax does not
compute:

1. Mobility: 1 degree of freedom, no redundant joint equations; with a motor
   (``RotationDriver``, θ(t) = θ₀ + ω t, ω = 2 rad/s) 0 degrees of freedom.
2. Kinematic analysis over one crank revolution (``rbjax.kinematic_analysis``): the slider's
   position, velocity and acceleration against the closed form of the loop closure
   x(θ) = r cos θ + √(l² − r² sin² θ) and its θ-derivatives times ω, ω².
3. Inverse dynamics: the driver multiplier is the motor torque τ(t); the power balance
   τ ω = dT/dt − P_gravity must hold, with dT/dt = Σ m v·v̇ + ωᵀΘω̇ from the analysed motion
   and P_gravity = Σ m g·v.
4. Dynamics (RK4) without the motor under a constant crank torque τ = 4 N m from rest: the
   work of the torque equals the change of kinetic plus potential energy,
   τ (θ(t) − θ₀) = ΔT + ΔV, and the slider stays on the closed-form x(θ).

    python examples/slider_crank.py [--samples 3142] [--steps 2000]
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

R, L, TH0, OMEGA = 0.2, 0.6, 0.3, 2.0  # crank, rod [m]; initial crank angle [rad]; motor [rad/s]
GRAVITY = 9.81 * np.array([0.0, -0.6, -0.8])
TORQUE = 4.0  # constant crank torque of the dynamics run [N m]
DT = 2.5e-4  # RK4 step of the dynamics run [s]
MODEL_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models", "slider_crank.toml")


def closed_form(th):
    """Slider position x(θ) and its derivatives dx/dθ, d²x/dθ²."""
    s = np.sqrt(L**2 - (R * np.sin(th)) ** 2)
    x = R * np.cos(th) + s
    xp = -R * np.sin(th) - R**2 * np.sin(th) * np.cos(th) / s
    xpp = -R * np.cos(th) - R**2 * np.cos(2 * th) / s - R**4 * (np.sin(th) * np.cos(th)) ** 2 / s**3
    return x, xp, xpp


def mechanism():
    """The motor-driven mechanism of examples/models/slider_crank.toml (rbjax.load), the same
    mechanism without the motor under a constant crank torque, and the state at rest at θ₀."""
    loaded = rbjax.load(MODEL_FILE)
    driven, state = loaded.model, loaded.state
    assert driven.joint_names[-1] == "motor", "the motor is the file's last joint"
    bodies = [
        rbjax.Body(m, i, name=n)
        for m, i, n in zip(driven.mass, driven.inertia, driven.names, strict=True)
    ]
    free = rbjax.Model(
        bodies,
        joints=driven.joints[:-1],
        gravity=driven.gravity,
        forces=[rbjax.BodyTorque(0, [0.0, 0.0, TORQUE])],
    )
    rest = rbjax.make_state(position=state.q[:, :3], quaternion=state.q[:, 3:])
    return driven, free, state, rest


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--samples", type=int, default=3142, help="kinematic analysis times (one revolution)"
    )
    ap.add_argument(
        "--steps", type=int, default=2000, help=f"RK4 steps of {DT} s in the dynamics run"
    )
    args = ap.parse_args(argv)
    driven, free, st0, rest = mechanism()
    mass, inertia = np.asarray(driven.mass), np.asarray(driven.inertia)
    assert np.allclose(driven.gravity, GRAVITY), "file ≠ reference"
    checks = Checks()
    print(
        f"Spatial slider-crank: crank {R} m, rod {L} m, masses {mass.tolist()} kg, "
        f"g = {np.round(GRAVITY, 3).tolist()} m/s²"
    )

    # --- 1. mobility
    mob_free, mob_driven = rbjax.mobility(free, rest), rbjax.mobility(driven, st0)
    print(
        f"\n1. mobility: without motor DOF = {mob_free.dof} ({mob_free.rows} equations, rank "
        f"{mob_free.rank}, redundant {list(mob_free.redundant)}); with motor DOF = {mob_driven.dof}"
    )
    mobility_ok = (mob_free.dof, mob_free.redundant, mob_driven.dof) == (1, (), 0)
    print(
        f"  DOF 1 without and 0 with the motor, no redundancy: {'PASS' if mobility_ok else 'FAIL'}"
    )
    if not mobility_ok:
        checks.failed.append("mobility")
    checks["dof"], checks["dof_driven"] = mob_free.dof, mob_driven.dof

    # --- 2. kinematic analysis over one crank revolution
    times = np.linspace(0.0, 2 * np.pi / OMEGA, args.samples)
    t0 = time.perf_counter()
    res = rbjax.kinematic_analysis(driven, st0, times)
    jax.block_until_ready(res.q)
    wall = time.perf_counter() - t0
    th = TH0 + OMEGA * times
    x, xp, xpp = closed_form(th)
    xs, vs, as_ = (np.asarray(a[:, 2, 0]) for a in (res.q, res.u, res.udot))
    print(
        f"\n2. kinematic analysis, {args.samples} times over one revolution ({wall:.1f} s wall incl. "
        f"compile); slider stroke {x.min():.6f} … {x.max():.6f} m"
    )
    print("checks:")
    checks.check(
        "kin_residual", "largest position residual |Φ| of the analysis", np.max(res.residual), 1e-12
    )
    checks.check(
        "kin_x", "slider x vs r cos θ + √(l² − r² sin² θ) [m]", np.abs(xs - x).max(), 1e-12
    )
    checks.check("kin_v", "slider ẋ vs ω dx/dθ [m/s]", np.abs(vs - OMEGA * xp).max(), 1e-12)
    checks.check(
        "kin_a", "slider ẍ vs ω² d²x/dθ² [m/s²]", np.abs(as_ - OMEGA**2 * xpp).max(), 1e-11
    )

    # --- 3. inverse dynamics: motor torque against the power balance
    tau = np.asarray(res.lam[:, -1])  # the driver is the last joint and has one row
    v, w = np.asarray(res.u[..., 0:3]), np.asarray(res.u[..., 4:7])
    vdot, wdot = np.asarray(res.udot[..., 0:3]), np.asarray(res.udot[..., 4:7])
    dT = np.einsum("b,tbi,tbi->t", mass, v, vdot) + np.einsum("tbi,bij,tbj->t", w, inertia, wdot)
    p_grav = np.einsum("b,tbi,i->t", mass, v, GRAVITY)
    balance = tau * OMEGA - (dT - p_grav)
    scale = np.abs(tau * OMEGA).max()
    print(
        f"\n3. inverse dynamics: motor torque {tau.min():+.6f} … {tau.max():+.6f} N m over the revolution"
    )
    for k in np.linspace(0, len(times) - 1, 5).astype(int):
        print(
            f"  θ = {np.degrees(th[k]):6.1f}°: τ = {tau[k]:+.9f} N m, τω = {tau[k] * OMEGA:+.9f} W, "
            f"dT/dt − P_g = {dT[k] - p_grav[k]:+.9f} W"
        )
    print("checks:")
    checks.check(
        "power_balance",
        "max |τω − (dT/dt − P_gravity)| / max |τω|",
        np.abs(balance).max() / scale,
        1e-12,
    )

    # --- 4. dynamics under a constant crank torque, energy balance
    t0 = time.perf_counter()
    tr = rbjax.rollout(free, rest, jnp.asarray(DT), args.steps)
    jax.block_until_ready(tr.q)
    wall = time.perf_counter() - t0
    q = np.asarray(tr.q)
    th = np.unwrap(2 * np.arctan2(q[:, 0, 6], q[:, 0, 3]))  # crank angle about z
    energy = np.asarray(rbjax.total_energy(free, tr.states))
    work = TORQUE * (th - th[0])
    err_balance = np.abs((energy - energy[0]) - work).max()
    err_x = np.abs(q[:, 2, 0] - closed_form(th)[0]).max()
    print(
        f"\n4. dynamics: τ = {TORQUE} N m on the crank from rest, RK4 dt = {DT} s, {args.steps} steps "
        f"({wall:.1f} s wall incl. compile)"
    )
    for k in np.linspace(0, args.steps, 5).astype(int):
        print(
            f"  t = {k * DT:5.3f} s: θ − θ₀ = {th[k] - th[0]:8.5f} rad, work {work[k]:10.6f} J, "
            f"ΔT + ΔV = {energy[k] - energy[0]:10.6f} J"
        )
    print("checks:")
    checks.check(
        "energy_balance",
        "max |τ(θ − θ₀) − (ΔT + ΔV)| / max work",
        err_balance / np.abs(work).max(),
        1e-9,
    )
    checks.check("dyn_x", "slider x vs closed form x(θ) along the run [m]", err_x, 1e-11)
    checks["crank_turn"] = float(th[-1] - th[0])
    if checks.failed:
        raise SystemExit(f"slider-crank: checks failed: {checks.failed}")
    return dict(checks)


if __name__ == "__main__":
    rbjax.compilation_cache()  # compiled programs kept on disk for the next run
    main()
