"""A planar four-bar linkage: redundant hinges, Udwadia–Kalaba and the Schur complement, and the
loop-closure equation.

Crank a = 0.2 m, coupler b = 0.6 m, rocker c = 0.5 m, ground link d = 0.55 m: s + l = 0.8 ≤
p + q = 1.05 with the crank the shortest link, so by Grashof's criterion the crank turns fully
while the rocker swings. The linkage stands in the vertical xy-plane (g = 9.81 m/s² along −y)
and the crank starts at θ₀ = 0.4 rad turning at 12 rad/s (the other links with the consistent
rates of the velocity loop closure), fast enough to carry it over the top. The two joint sets
below are the model files examples/models/four_bar_rrrr.toml and four_bar_rsur.toml (rbjax.load).
Checked:

1. Mobility. With four revolute joints (4 × 5 = 20 equations on 3 bodies × 6 = 18 velocities)
   the spatial count says −2 degrees of freedom, yet the loop moves: 3 equations are dependent
   (a planar loop is over-constrained in space). ``rbjax.mobility`` finds rank 17, DOF = 1 and
   names the dependent equations: the out-of-plane ones (translation along z, rotations about
   x and y) of the hinge that closes the loop. Replacing two hinges by a spherical and a
   universal joint (R-S-U-R, 17 independent equations) removes the redundancy without changing
   the motion.
2. ``UdwadiaSchutte`` (Moore–Penrose inverse) and the default ``ScalableDAE`` (Schur complement,
   minimum-norm multipliers where equations are dependent) both integrate the redundant
   R-R-R-R model, and it moves like the minimal R-S-U-R model (RK4 all); energy is conserved.
3. The crank, coupler and rocker angles of both runs against the closed-form loop closure
   (Freudenstein): for crank angle θ the rocker angle ψ solves
   P cos ψ + Q sin ψ = R₀ with P = 2c(d − a cos θ), Q = −2ac sin θ,
   R₀ = b² − a² − c² − d² + 2ad cos θ, and the coupler points from A = a(cos θ, sin θ) to
   B = (d, 0) + c(cos ψ, sin ψ).

    python examples/four_bar.py [--steps 2000]
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

A_CRANK, B_COUPLER, C_ROCKER, D_GROUND = 0.2, 0.6, 0.5, 0.55
TH0 = 0.4  # initial crank angle [rad]
OMEGA0 = 12.0  # initial crank rate [rad/s]
G = 9.81
DT = 5e-4
HERE = os.path.dirname(os.path.abspath(__file__))
FILE_RRRR = os.path.join(HERE, "models", "four_bar_rrrr.toml")  # four hinges, UdwadiaSchutte
FILE_RSUR = os.path.join(HERE, "models", "four_bar_rsur.toml")  # hinge, ball, Cardan, hinge


def loop_closure(th):
    """Rocker angle ψ(θ) and coupler angle γ(θ) (from world x, about z) in closed form."""
    a, b, c, d = A_CRANK, B_COUPLER, C_ROCKER, D_GROUND
    P = 2 * d * c - 2 * a * c * np.cos(th)
    Q = -2 * a * c * np.sin(th)
    R0 = b * b - a * a - c * c - d * d + 2 * a * d * np.cos(th)
    psi = np.arctan2(Q, P) + np.arccos(R0 / np.hypot(P, Q))  # the assembly branch used here
    ax, ay = a * np.cos(th), a * np.sin(th)
    bx, by = d + c * np.cos(psi), c * np.sin(psi)
    return psi, np.arctan2(by - ay, bx - ax)


def linkage():
    """The R-R-R-R model (UdwadiaSchutte) and the R-S-U-R model (ScalableDAE) of the model
    files, and their common initial state; checked against this script's link lengths."""
    rrrr, rsur = rbjax.load(FILE_RRRR), rbjax.load(FILE_RSUR)
    q = np.asarray(rsur.state.q)
    assert np.allclose(np.asarray(rrrr.state.q), q), "the two files start alike"
    pa = np.array([A_CRANK * np.cos(TH0), A_CRANK * np.sin(TH0), 0.0])
    assert np.allclose(2 * q[0, :3], pa), "file ≠ reference: crank"
    return rrrr.model, rsur.model, rsur.state


def planar_angles(q):
    """Angles about z of the three links' body x from world x, unwrapped, (T, 3)."""
    q = np.asarray(q)
    return np.unwrap(2 * np.arctan2(q[..., 6], q[..., 3]), axis=0)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--steps", type=int, default=2000, help=f"RK4 steps of {DT} s")
    args = ap.parse_args(argv)
    a, b, c, d = A_CRANK, B_COUPLER, C_ROCKER, D_GROUND
    lengths = sorted([a, b, c, d])
    print(
        f"Four-bar: crank {a}, coupler {b}, rocker {c}, ground {d} m. Grashof: s + l = "
        f"{lengths[0] + lengths[3]:.2f} ≤ p + q = {lengths[1] + lengths[2]:.2f}, shortest link = "
        "crank → crank-rocker"
    )
    m_uk, m_min, st0 = linkage()
    checks = Checks()

    # --- 1. mobility (the R-R-R-R file also under the default formulation)
    m_red = eqx.tree_at(lambda m: m.formulation, m_uk, rbjax.ScalableDAE())
    mob_red, mob_min = rbjax.mobility(m_red, st0), rbjax.mobility(m_min, st0)
    print(
        f"\n1. mobility\n  R-R-R-R: {mob_red.rows} equations, rank {mob_red.rank}, DOF = {mob_red.dof};"
        f" dependent equations {list(mob_red.redundant)}\n"
        f"  R-S-U-R: {mob_min.rows} equations, rank {mob_min.rank}, DOF = {mob_min.dof};"
        f" redundant: {list(mob_min.redundant) or 'none'}"
    )
    closing = m_red.joint_names[3]  # the rocker's hinge to the ground closes the loop
    mobility_ok = (
        (mob_red.rows, mob_red.rank, mob_red.dof) == (20, 17, 1)
        and mob_red.redundant == tuple(f"{closing}[row {k}]" for k in (2, 3, 4))
        and (mob_min.rows, mob_min.rank, mob_min.dof, mob_min.redundant) == (17, 17, 1, ())
    )
    print(f"  mobility as expected: {'PASS' if mobility_ok else 'FAIL'}")
    if not mobility_ok:
        checks.failed.append("mobility")
    checks["rank_rrrr"], checks["dof_rrrr"], checks["dof_rsur"] = (
        mob_red.rank,
        mob_red.dof,
        mob_min.dof,
    )

    # --- 2. Udwadia–Kalaba on the redundant loop against the minimal model
    print("\n2. the redundant model (Udwadia–Kalaba, Schur complement) vs the minimal model")
    runs = {}
    for name, mdl in (
        ("R-S-U-R, ScalableDAE", m_min),
        ("R-R-R-R, UdwadiaSchutte", m_uk),
        ("R-R-R-R, ScalableDAE", m_red),
    ):
        t0 = time.perf_counter()
        tr = rbjax.rollout(mdl, st0, jnp.asarray(DT), args.steps)
        jax.block_until_ready(tr.q)
        runs[name] = tr
        print(
            f"  {name}: {args.steps} RK4 steps of {DT} s, {time.perf_counter() - t0:.1f} s wall incl. compile"
        )
    q_min, q_uk, q_dae = (np.asarray(tr.q) for tr in runs.values())
    t = np.asarray(runs["R-S-U-R, ScalableDAE"].t)
    print("checks:")
    checks.check(
        "uk_vs_minimal", "max |q(R-R-R-R, UK) − q(R-S-U-R, DAE)|", np.abs(q_uk - q_min).max(), 1e-8
    )
    checks.check(
        "dae_vs_minimal",
        "max |q(R-R-R-R, DAE) − q(R-S-U-R, DAE)|",
        np.abs(q_dae - q_min).max(),
        1e-8,
    )
    e = np.asarray(rbjax.total_energy(m_min, runs["R-S-U-R, ScalableDAE"].states))
    e_uk = np.asarray(rbjax.total_energy(m_uk, runs["R-R-R-R, UdwadiaSchutte"].states))
    checks.check(
        "energy_drift",
        "max |E − E₀| / T₀ over both runs (T₀ kinetic energy)",
        max(np.abs(e - e[0]).max(), np.abs(e_uk - e_uk[0]).max())
        / float(rbjax.kinetic_energy(m_min, st0)),
        1e-7,
    )
    ang = planar_angles(q_min)

    # --- 3. loop closure
    turns = (ang[-1, 0] - ang[0, 0]) / (2 * np.pi)
    print(f"\n3. angles against the closed-form loop closure (the crank turned {turns:.2f} times)")
    print(
        f"  {'t [s]':>6s} {'θ crank':>10s} {'ψ rocker':>12s} {'ψ(θ) closed':>12s} {'γ coupler':>12s} {'γ(θ) closed':>12s}"
    )
    errs = {}
    for name, q in (("minimal", q_min), ("uk", q_uk)):
        ang = planar_angles(q)
        psi, gam = loop_closure(ang[:, 0])
        wrap = lambda x: np.angle(np.exp(1j * x))  # noqa: E731
        errs[name] = max(np.abs(wrap(ang[:, 2] - psi)).max(), np.abs(wrap(ang[:, 1] - gam)).max())
        if name == "minimal":
            for k in np.linspace(0, len(t) - 1, 6).astype(int):
                print(
                    f"  {t[k]:6.3f} {ang[k, 0]:10.5f} {wrap(ang[k, 2]):12.8f} {wrap(psi[k]):12.8f}"
                    f" {wrap(ang[k, 1]):12.8f} {wrap(gam[k]):12.8f}"
                )
            swing = np.degrees(np.ptp(loop_closure(np.linspace(0, 2 * np.pi, 20001))[0]))
            print(f"  rocker swing over a crank turn (closed form): {swing:.4f}°")
    print("checks:")
    checks.check(
        "closure_minimal", "R-S-U-R: max angle error vs loop closure [rad]", errs["minimal"], 1e-7
    )
    checks.check(
        "closure_uk", "R-R-R-R (UK): max angle error vs loop closure [rad]", errs["uk"], 1e-7
    )
    checks["crank_turns"] = float(turns)
    if checks.failed:
        raise SystemExit(f"four-bar: checks failed: {checks.failed}")
    return dict(checks)


if __name__ == "__main__":
    rbjax.compilation_cache()  # compiled programs kept on disk for the next run
    main()
