"""The double pendulum: maximal coordinates against a reduced-coordinate Lagrangian, and drift.

Two uniform rods (1 kg, 1 m each) on revolute joints about world y, the first hinged at the
origin, the second at the tip of the first; both released at rest, horizontal, g = 9.81 m/s²:
the model file examples/models/double_pendulum_rods.toml, loaded with rbjax.load (the reference
below takes its masses and lengths from this script's constants, checked against the file).
rbjax integrates 2 bodies × 7 coordinates with 10 joint equations (ScalableDAE); the reference
integrates the 2 joint angles of the textbook Lagrangian with scipy's DOP853 at
rtol = atol = 1e-12, a computation that shares no code with rbjax. Checked:

* the two rod angles (read from the quaternions) over 2 s against the Lagrangian solution, and
  the energy error of that run (RK4, dt = 2 s / steps);
* drift control over 10 s at a coarse dt = 1e-2 s of the chaotic motion: the largest position
  residual of the hinges, measured from the coordinates alone (pivot and elbow points apart,
  hinge axes off world y), for plain RK4, RK4 with Baumgarte stabilisation (α = β = 10 /s),
  ``Projected(RK4())`` and ``ImplicitMidpoint()``. The last two solve the position equations at
  every step and must stay ≤ 1e-8.

    python examples/double_pendulum.py [--steps 1000] [--plot double_pendulum.png]

``--steps`` sets the number of steps of every rollout (2 s / steps for the comparison with the
Lagrangian, steps × 1e-2 s for the drift table); ``--plot`` writes a PNG if matplotlib is
installed.
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
I_C = MASS * LENGTH**2 / 12
ROD_INERTIA = np.diag([0.01 * I_C, I_C, I_C])  # slender rod along body x
MODEL_FILE = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "models", "double_pendulum_rods.toml"
)
T_REF = 2.0  # length of the comparison with the Lagrangian [s]
DT_DRIFT = 1e-2  # the coarse step of the drift table [s]


def model(baumgarte):
    """The two rods of examples/models/double_pendulum_rods.toml (rbjax.load), with Baumgarte
    stabilisation (α, β) [1/s] set on the loaded model (None: as in the file, without); and
    the file's initial state."""
    loaded = rbjax.load(MODEL_FILE)
    m = loaded.model
    assert np.allclose(m.mass, MASS) and np.allclose(m.inertia, ROD_INERTIA), "file ≠ reference"
    if baumgarte is not None:
        pair = (jnp.asarray(baumgarte[0], m.mass.dtype), jnp.asarray(baumgarte[1], m.mass.dtype))
        m = eqx.tree_at(lambda x: x.baumgarte, m, pair, is_leaf=lambda x: x is None)
    return m, loaded.state


def angles(q):
    """Unwrapped rod angles from the downward vertical, from the quaternions alone, (T, 2)."""
    q = np.asarray(q)
    beta = 2 * np.arctan2(q[..., 5], q[..., 3])
    return np.unwrap(np.pi / 2 - beta, axis=0)


def lagrange_rhs(t, y):
    """Reduced-coordinate Lagrange equations of two uniform rods (absolute angles θ1, θ2)."""
    m, L, g = MASS, LENGTH, G
    th1, th2, w1, w2 = y
    c, s = np.cos(th1 - th2), np.sin(th1 - th2)
    h = m * L * L / 2
    mass = np.array([[m * L * L / 3 + m * L * L, h * c], [h * c, m * L * L / 3]])
    rhs = -np.array(
        [
            h * s * w2**2 + 1.5 * m * g * L * np.sin(th1),
            -h * s * w1**2 + 0.5 * m * g * L * np.sin(th2),
        ]
    )
    return np.r_[w1, w2, np.linalg.solve(mass, rhs)]


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


def joint_residual(q):
    """Largest hinge violation at each saved time, from the coordinates alone, (T,) [m or 1]."""
    q = np.asarray(q)
    rot = rotmat(q[..., 3:7])  # (T, 2, 3, 3)
    half = np.array([LENGTH / 2, 0.0, 0.0])
    pivot = q[:, 0, :3] - rot[:, 0] @ half  # rod 1's root, must stay at the origin
    tip1 = q[:, 0, :3] + rot[:, 0] @ half
    root2 = q[:, 1, :3] - rot[:, 1] @ half
    axis_err = np.abs(rot[..., :, 1] - np.array([0.0, 1.0, 0.0])).max(axis=(-2, -1))
    return np.maximum.reduce([np.abs(pivot).max(-1), np.abs(tip1 - root2).max(-1), axis_err])


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--steps", type=int, default=1000, help="steps of every rollout")
    ap.add_argument("--plot", default="", help="write a PNG here (needs matplotlib)")
    args = ap.parse_args(argv)
    from scipy.integrate import solve_ivp

    n = args.steps
    # α = β = 0 is the unstabilised DAE (the terms vanish) and gives the model the same structure
    # as the stabilised one, so every RK4 rollout below reuses one compiled scan.
    plain, st0 = model(baumgarte=(0.0, 0.0))  # released horizontal: both angles π/2
    stabilised, _ = model(baumgarte=(10.0, 10.0))
    checks = Checks()

    # --- 1. against the reduced-coordinate Lagrangian
    dt_ref = T_REF / n
    t0 = time.perf_counter()
    tr = rbjax.rollout(plain, st0, jnp.asarray(dt_ref), n)
    jax.block_until_ready(tr.q)
    wall = time.perf_counter() - t0
    t = np.asarray(tr.t)
    sol = solve_ivp(
        lagrange_rhs,
        (0, T_REF),
        [np.pi / 2, np.pi / 2, 0, 0],
        method="DOP853",
        rtol=1e-12,
        atol=1e-12,
        t_eval=t,
    )
    err = np.abs(angles(tr.q) - sol.y[:2].T)
    energy = np.asarray(rbjax.total_energy(plain, tr.states))
    print(
        f"Double pendulum, two rods of {MASS} kg and {LENGTH} m released horizontal.\n\n"
        f"1. {T_REF} s with RK4, dt = {dt_ref:.3g} s ({wall:.1f} s wall incl. compile) vs the "
        "Lagrangian in the two angles (scipy DOP853, rtol = atol = 1e-12)"
    )
    for tt in np.linspace(0, T_REF, 5):
        k = int(np.argmin(np.abs(t - tt)))
        print(
            f"  t = {t[k]:4.2f} s: θ1, θ2 = {angles(tr.q)[k, 0]:+.10f}, {angles(tr.q)[k, 1]:+.10f} rad"
            f"   Lagrange {sol.y[0, k]:+.10f}, {sol.y[1, k]:+.10f}"
        )
    print("checks:")
    # RK4's global error ∝ dt⁴ (measured at dt = 1e-3: 4e-10 rad, 4e-9 relative energy)
    scale = max(1.0, (dt_ref / 1e-3) ** 4)
    checks.check("angle_err", f"max |θ − θ_Lagrange| over {T_REF} s [rad]", err.max(), 4e-9 * scale)
    checks.check(
        "energy_err",
        "max |E − E₀| / (m g L) over that run",
        np.abs(energy - energy[0]).max() / (MASS * G * LENGTH),
        2e-8 * scale,
    )

    # --- 2. drift control at a coarse step
    cases = {
        "RK4": (plain, rbjax.RK4()),
        "RK4 + Baumgarte (10, 10)": (stabilised, rbjax.RK4()),
        "Projected(RK4)": (plain, rbjax.Projected(rbjax.RK4())),
        "ImplicitMidpoint": (plain, rbjax.ImplicitMidpoint()),
    }
    t_drift = n * DT_DRIFT
    print(f"\n2. drift: {t_drift:g} s at dt = {DT_DRIFT} s (chaotic motion), same initial state")
    print(
        f"  {'integrator':26s} {'max residual':>13s} {'final residual':>15s} {'max |ΔE| [J]':>13s} {'wall s':>7s}"
    )
    results = {}
    for name, (mdl, integ) in cases.items():
        t0 = time.perf_counter()
        trd = rbjax.rollout(mdl, st0, jnp.asarray(DT_DRIFT), n, integrator=integ)
        jax.block_until_ready(trd.q)
        wall = time.perf_counter() - t0
        res = joint_residual(trd.q)
        e = np.asarray(rbjax.total_energy(mdl, trd.states))
        results[name] = (np.asarray(trd.t), res, e - e[0])
        print(
            f"  {name:26s} {res.max():13.2e} {res[-1]:15.2e} {np.abs(e - e[0]).max():13.2e} {wall:7.1f}"
        )
    print("checks:")
    checks["drift_rk4"] = float(results["RK4"][1].max())
    checks["drift_baumgarte"] = float(results["RK4 + Baumgarte (10, 10)"][1].max())
    checks.check(
        "drift_projected",
        "Projected(RK4): max position residual",
        results["Projected(RK4)"][1].max(),
        1e-8,
    )
    checks.check(
        "drift_implicit_midpoint",
        "ImplicitMidpoint: max position residual",
        results["ImplicitMidpoint"][1].max(),
        1e-8,
    )
    checks.check(
        "baumgarte_gain",
        "Baumgarte residual / plain RK4 residual",
        checks["drift_baumgarte"] / checks["drift_rk4"],
        0.1,
    )

    if args.plot:
        try:
            import matplotlib
        except ImportError:
            print(f"matplotlib is not installed: no plot written to {args.plot}")
        else:
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt

            fig, axes = plt.subplots(2, 1, figsize=(8, 7))
            axes[0].plot(t, angles(tr.q), lw=2, label=["θ1 rbjax", "θ2 rbjax"])
            axes[0].plot(t, sol.y[:2].T, "k--", lw=1, label=["Lagrange", None])
            axes[0].set_xlabel("t [s]")
            axes[0].set_ylabel("angle from vertical [rad]")
            axes[0].legend()
            for name, (td, res, _) in results.items():
                axes[1].semilogy(td[1:], res[1:] + 1e-17, label=name)
            axes[1].set_xlabel("t [s]")
            axes[1].set_ylabel(f"joint residual, dt = {DT_DRIFT} s")
            axes[1].legend(fontsize=8)
            fig.tight_layout()
            fig.savefig(args.plot, dpi=110)
            print(f"wrote {args.plot}")
    if checks.failed:
        raise SystemExit(f"double pendulum: checks failed: {checks.failed}")
    return dict(checks)


if __name__ == "__main__":
    rbjax.compilation_cache()  # compiled programs kept on disk for the next run
    main()
