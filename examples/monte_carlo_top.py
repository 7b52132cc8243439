"""Monte-Carlo of heavy tops: the distribution of the maximum nutation, every sample checked.

N symmetric tops (m = 1 kg, centre of mass l = 2 cm above the tip, I₁ = 2e-3, I₃ = 4e-3 kg m²
about the centre of mass) spin at ω₃ = 20 rad/s with their tip on a ``Spherical`` joint. Each
sample draws its tilt (30° ± 3°), spin, inertia and mass (± 5 %) and is released with no
precession and no nutation rate, so its axis nods between θ₀ and a lowest tilt θ₁ given by
the conservation of energy and of the two angular momenta p_φ, p_ψ (Goldstein §5.7): with
u = cos θ, I₁' = I₁ + m l² about the tip and a = (I₃ω₃)² / (2 I₁' m g l),

    u₁ = (a − √(a² − 4 (a u₀ − 1))) / 2.

``rbjax.monte_carlo`` integrates them on every core (``rbjax.use_cpu_cores``), keeps only the
maximum nutation of each sample (located inside its step on the dense output) and an energy
monitor, and merges their statistics chunk by chunk; every sample's θ₁ is compared with its
closed form. A histogram goes to a PNG.

    python examples/monte_carlo_top.py [--samples 100000] [--t-end 1] [--dt 2e-3]
        [--directory runs/tops [--resume]] [--out monte_carlo_top.png]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import rbjax

if __name__ == "__main__":
    rbjax.use_cpu_cores()  # one CPU device per core, before JAX starts (a script, not an import)

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update("jax_enable_x64", True)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _checks import Checks  # noqa: E402

G, MASS, ARM, I1C, I3, SPIN = 9.81, 1.0, 0.02, 2e-3, 4e-3, 20.0
TILT, TILT_SD, REL_SD = np.radians(30.0), np.radians(3.0), 0.05

TOP = rbjax.Model(
    [rbjax.Body(MASS, np.diag([I1C, I1C, I3]), name="top")],
    joints=[
        rbjax.Spherical.at(
            np.array([[0.0, 0.0, ARM, 1.0, 0.0, 0.0, 0.0]]), rbjax.GROUND, 0, point=[0, 0, 0]
        )
    ],
    gravity=[0.0, 0.0, -G],
)


def draw(key):
    """The random parameters of one sample: tilt, spin, inertia scale, mass."""
    k = jax.random.split(key, 4)
    theta = TILT + TILT_SD * jax.random.normal(k[0])
    spin = SPIN * (1 + REL_SD * jax.random.normal(k[1]))
    scale = 1 + REL_SD * jax.random.normal(k[2])  # I₁ and I₃ together: the top stays symmetric
    mass = MASS * (1 + REL_SD * jax.random.normal(k[3]))
    return theta, spin, scale, mass


def sample(key, i):
    """(model, state) of sample i: tilted about world x, spinning about its axis."""
    theta, spin, scale, mass = draw(key)
    inertia = jnp.diag(jnp.array([I1C, I1C, I3]) * scale)
    model = eqx.tree_at(lambda m: (m.mass, m.inertia), TOP, (mass[None], inertia[None]))
    axis = jnp.stack([jnp.zeros(()), -jnp.sin(theta), jnp.cos(theta)])
    quat = jnp.stack([jnp.cos(theta / 2), jnp.sin(theta / 2), jnp.zeros(()), jnp.zeros(())])
    r = ARM * axis
    v = jnp.cross(spin * axis, r)  # the tip stays at the origin
    q = jnp.concatenate([r, quat])[None]
    u = jnp.concatenate([v, jnp.zeros(1), jnp.stack([jnp.zeros(()), jnp.zeros(()), spin])])[None]
    return model, rbjax.State(t=jnp.zeros(()), q=q, u=u)


def nutation(model, state):
    """Tilt of the symmetry axis from the vertical [rad] (R₃₃ of the unit quaternion)."""
    a = state.q[0, 3:7] / jnp.linalg.norm(state.q[0, 3:7])
    return jnp.arccos(jnp.clip(a[0] ** 2 - a[1] ** 2 - a[2] ** 2 + a[3] ** 2, -1.0, 1.0))


def lowest_tilt(theta, spin, scale, mass):
    """θ₁, the turning point of the nutation below θ₀ (module docstring)."""
    i1 = I1C * scale + mass * ARM**2
    a = (I3 * scale * spin) ** 2 / (2 * i1 * mass * G * ARM)
    u0 = np.cos(theta)
    return np.arccos((a - np.sqrt(a**2 - 4 * (a * u0 - 1))) / 2)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--t-end", type=float, default=1.0, help="simulated time [s]")
    ap.add_argument("--dt", type=float, default=2e-3, help="RK4 step [s]")
    ap.add_argument("--directory", default=None, help="write the run here (resumable)")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--out", default=None, help="histogram PNG")
    args = ap.parse_args(argv)
    n_steps = int(round(args.t_end / args.dt))
    measures = {
        "max_nutation": rbjax.Maximum(
            nutation, located=True, bins=np.radians(np.linspace(20.0, 50.0, 61))
        ),
        "energy_drift": rbjax.Drift(lambda m, s: rbjax.total_energy(m, s), limit=1e-7),
    }
    print(
        f"{args.samples} heavy tops, {n_steps} RK4 steps of {args.dt} s on "
        f"{len(jax.devices())} device(s)"
    )
    t0 = time.perf_counter()
    result = rbjax.monte_carlo(
        sample,
        args.samples,
        args.dt,
        n_steps,
        measures,
        key=0,
        directory=args.directory,
        resume=args.resume,
    )
    wall = time.perf_counter() - t0
    tm = result.timing
    print(
        f"wall {wall:.1f} s: compile {tm['compile_s']:.1f} s, run {tm['run_s']:.1f} s "
        f"({tm['samples_per_s']:.0f} samples/s, "
        f"{tm['samples_per_s'] * n_steps / 1e6:.2f} M system-steps/s)"
    )
    st = result.statistics["max_nutation"]
    q05, q50, q95 = np.degrees(result.quantile("max_nutation", [0.05, 0.5, 0.95]))
    print(
        f"max nutation: mean {np.degrees(st.mean):.3f}°, std {np.degrees(st.std):.3f}°, "
        f"median {q50:.3f}°, 5-95 % [{q05:.3f}°, {q95:.3f}°], failed samples {result.n_failed}"
    )
    # every sample against its closed form (the parameters redrawn from the same keys)
    key = jax.random.key(0)
    params = jax.vmap(lambda i: draw(jax.random.fold_in(key, i)))(jnp.arange(args.samples))
    exact = lowest_tilt(*(np.asarray(p) for p in params))
    got = result.samples["max_nutation"] if result.samples else None
    assert got is not None
    err = np.abs(got - exact)
    print(f"max |θ₁ − closed form| over samples: {np.degrees(err.max()):.2e}°")
    checks = Checks()
    checks.check("failed", "failed samples (diverged or energy drift > 1e-7 J)", result.n_failed, 0)
    checks.check("nutation", "max |θ₁ − closed form| over samples [rad]", err.max(), 1e-8)
    if args.out:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        assert st.edges is not None and st.histogram is not None
        ax.stairs(st.histogram, np.degrees(st.edges), fill=True, alpha=0.6)
        ax.set_xlabel("maximum nutation θ₁ [deg]")
        ax.set_ylabel("samples")
        ax.set_title(f"{args.samples} heavy tops, {args.t_end} s")
        fig.tight_layout()
        fig.savefig(args.out, dpi=120)
        print(f"histogram written to {args.out}")
    if checks.failed:
        raise SystemExit(f"Monte-Carlo heavy tops: checks failed: {checks.failed}")


if __name__ == "__main__":
    rbjax.compilation_cache()  # compiled programs kept on disk for the next run
    main()
