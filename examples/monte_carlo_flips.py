"""Monte-Carlo: when does a perturbed tumbling body first flip? 10⁶ bodies, each one checked.

N rigid bodies with inertias near I = diag(1, 2, 3) (2 % noise, kept physical) and initial
spins ω₀ = (0.01, 5, 0) + noise about the unstable intermediate axis. ``rbjax.monte_carlo``
integrates them on every core, locates each body's first flip (the first downward zero of ω₂,
an :class:`rbjax.Event` found inside its step on the dense output) and merges the statistics
chunk by chunk, so memory stays flat in N. Every flip time is checked against that body's
exact Jacobi-elliptic t₁ = K(m)/p (Landau–Lifshitz §37, the case L² < 2 T I₂).

    python examples/monte_carlo_flips.py [--samples 1000000] [--t-end 4] [--dt 2e-3]
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

BODY = rbjax.Model(rbjax.Body(1.0, np.diag([1.0, 2.0, 2.9])), formulation=rbjax.NewtonEuler())


def draw(key):
    """Principal moments I₁ < I₂ < I₃ and ω₀ of one body. diag(1, 2, 3) sits exactly on the
    triangle inequality I₁ + I₂ ≥ I₃ (a thin plate): I₃ is drawn slightly below I₁ + I₂ so
    every body is physical; ω₃(0) = 0 and ω₁(0) > 0, the closed form's branch."""
    k = jax.random.split(key, 3)
    i12 = jnp.array([1.0, 2.0]) * (1 + 0.02 * jax.random.normal(k[0], (2,)))
    i3 = jnp.sum(i12) * (1 - 0.02 * jnp.abs(jax.random.normal(k[1])))
    inertia = jnp.sort(jnp.concatenate([i12, i3[None]]))
    w = jnp.array([0.01, 5.0, 0.0]) + jnp.array([0.005, 0.2, 0.0]) * jax.random.normal(k[2], (3,))
    w = w.at[0].set(jnp.abs(w[0]) + 1e-3)
    return inertia, w


def sample(key, i):
    inertia, w = draw(key)
    model = eqx.tree_at(lambda m: m.inertia, BODY, jnp.diag(inertia)[None])
    q = jnp.array([[0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]])
    u = jnp.concatenate([jnp.zeros(4), w])[None]
    return model, rbjax.State(t=jnp.zeros(()), q=q, u=u)


def exact_first_flip(inertia, omega0):
    """t₁ = K(m)/p for ω₃(0) = 0, ω₂(0) > 0 and L² < 2 T I₂ (vectorised over bodies)."""
    from scipy.special import ellipkm1

    i1, i2, i3 = inertia[:, 0], inertia[:, 1], inertia[:, 2]
    d = [
        np.sum(inertia * (inertia[:, [j]] - inertia) * omega0**2, axis=-1) for j in range(3)
    ]  # 2T I_j − L²
    p = np.sqrt((i2 - i1) * d[2] / (i1 * i2 * i3))
    one_minus_m = (i3 - i1) * d[1] / ((i2 - i1) * d[2])
    return ellipkm1(one_minus_m) / p


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--t-end", type=float, default=4.0)
    ap.add_argument("--dt", type=float, default=2e-3)
    args = ap.parse_args(argv)
    n_steps = int(round(args.t_end / args.dt))
    measures = {
        "flip": rbjax.Event(
            lambda m, s: s.u[0, 5], direction=-1, bins=np.linspace(0.0, args.t_end, 81)
        ),
        "energy_drift": rbjax.Drift(lambda m, s: rbjax.kinetic_energy(m, s), limit=1e-8),
    }
    print(
        f"{args.samples} bodies, {n_steps} RK4 steps of {args.dt} s on "
        f"{len(jax.devices())} device(s)"
    )
    t0 = time.perf_counter()
    result = rbjax.monte_carlo(sample, args.samples, args.dt, n_steps, measures, key=0)
    wall = time.perf_counter() - t0
    tm = result.timing
    print(
        f"wall {wall:.1f} s: compile {tm['compile_s']:.1f} s, run {tm['run_s']:.1f} s "
        f"({tm['samples_per_s'] * n_steps / 1e6:.1f} M body-steps/s)"
    )
    st = result.statistics["flip"]
    q05, q50, q95 = result.quantile("flip", [0.05, 0.5, 0.95])
    print(
        f"first flip seen for {int(st.count)} bodies ({int(st.missing)} not before "
        f"{args.t_end} s): mean {float(st.mean):.4f} s, std {float(st.std):.4f} s, "
        f"median {q50:.4f} s, 5-95 % [{q05:.4f}, {q95:.4f}] s; failed samples {result.n_failed}"
    )
    key = jax.random.key(0)
    inertia, omega0 = jax.vmap(lambda i: draw(jax.random.fold_in(key, i)))(jnp.arange(args.samples))
    exact = exact_first_flip(np.asarray(inertia), np.asarray(omega0))
    assert result.samples is not None
    flip = result.samples["flip"]
    seen = np.isfinite(flip)
    err = np.abs(flip[seen] - exact[seen])
    checks = Checks()
    checks.check("failed", "failed samples (diverged or energy drift > 1e-8)", result.n_failed, 0)
    checks.check(
        "seen", "bodies whose flip is seen ≠ flips the exact solution predicts",
        np.count_nonzero(seen != (exact < args.t_end)), 0,
    )  # fmt: skip
    checks.check("time", "max |t_flip − exact elliptic t_flip| [s]", err.max(), 1e-8)
    if checks.failed:
        raise SystemExit(f"Monte-Carlo flips: checks failed: {checks.failed}")


if __name__ == "__main__":
    rbjax.compilation_cache()  # compiled programs kept on disk for the next run
    main()
