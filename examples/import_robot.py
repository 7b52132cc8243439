"""Load a robot from MJCF, check it against MuJoCo, and track a trajectory by computed torque.

The 7-DOF arm of ``examples/models/arm7.xml`` is loaded with ``rbjax.load`` (MuJoCo's compiler
reads the file; its joints form a tree, so rbjax loads it in joint coordinates by default: an
:class:`rbjax.JointModel` whose state is MuJoCo's qpos/qvel). Checked:

* **side by side with MuJoCo** (if the ``mujoco`` package is installed): the loaded model with
  its joint damping, spring, motors and servos, released from a perturbed pose, against
  MuJoCo's own RK4 at the same step: the largest difference of the joint angles;
* **computed-torque control** in maximal coordinates (the same file loaded with
  ``formulation=rbjax.ScalableDAE()``) through :class:`rbjax.JointSpace`: the model's own force
  elements are removed and :class:`rbjax.JointForces` applies
  τ = M(q)(q̈_d + K_p e + K_d ė) + C(q, q̇)q̇ + g(q), which cancels the dynamics exactly, so
  every joint's error e = q_d − q obeys ë + 2ω ė + ω² e = 0 (K_p = ω², K_d = 2ω), whose
  solution is e(t) = (e₀ + (ė₀ + ω e₀) t) e^{−ωt}. The simulated errors are compared with that
  closed form: a check of the mass matrix, the bias forces and the joint forces together.

    python examples/import_robot.py [--model examples/models/arm7.xml] [--t-end 1.0]
                                    [--dt 1e-3] [--plot tracking.png] [--no-mujoco]
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import rbjax  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _checks import Checks  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OMEGA = 8.0  # bandwidth of the computed-torque error dynamics [rad/s]


def side_by_side(path, t_end, dt, checks):
    """The loaded model (all its force elements) against MuJoCo's RK4 at the same step."""
    try:
        import mujoco
    except ImportError:
        print("  mujoco is not installed: the side-by-side check is skipped")
        return
    loaded = rbjax.load(path)
    m = loaded.source.mjmodel
    rng = np.random.default_rng(0)
    qpos = m.qpos0 + rng.uniform(-0.3, 0.3, m.nq)
    qvel = rng.uniform(-0.3, 0.3, m.nv)
    loaded = rbjax.load(path, qpos=qpos, qvel=qvel)  # joint coordinates: a tree
    m.opt.timestep, m.opt.integrator = dt, mujoco.mjtIntegrator.mjINT_RK4
    d = mujoco.MjData(m)
    d.qpos[:], d.qvel[:] = qpos, qvel
    n = int(round(t_end / dt))
    for _ in range(n):
        mujoco.mj_step(m, d)
    traj = rbjax.rollout(loaded.model, loaded.state, dt, n, integrator=rbjax.RK4(), save_every=n)
    angles = np.asarray(traj.qpos[-1])  # MuJoCo's qpos
    diff = np.mod(angles - d.qpos + np.pi, 2 * np.pi) - np.pi
    checks.check(
        "mujoco", f"joint angles vs MuJoCo RK4 after {t_end:g} s", np.abs(diff).max(), 1e-6
    )


def computed_torque(path, t_end, dt, checks, plot):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the model's elements are replaced below
        loaded = rbjax.load(path, formulation=rbjax.ScalableDAE())
    bare = eqx.tree_at(lambda m: m.forces, loaded.model, ())
    js = rbjax.JointSpace(bare)
    nv = js.nv
    amp = jnp.linspace(0.3, 0.6, nv)
    freq = jnp.linspace(1.0, 2.0, nv)

    def desired(t):
        """q_d(t) = A sin(ν t) and its first two derivatives."""
        return (
            amp * jnp.sin(freq * t),
            amp * freq * jnp.cos(freq * t),
            -amp * freq**2 * jnp.sin(freq * t),
        )

    def policy(t, state):
        q, qd = js.positions(state), js.velocities(state)
        pos, vel, acc = desired(t)
        wrap = jnp.mod(pos - q + jnp.pi, 2 * jnp.pi) - jnp.pi
        target = acc + OMEGA**2 * wrap + 2 * OMEGA * (vel - qd)
        return js.mass_matrix(state) @ target + js.bias(state)

    model = eqx.tree_at(lambda m: m.forces, bare, (rbjax.JointForces(policy),))
    e0 = jnp.full(nv, 0.1)  # start 0.1 rad off the desired pose, at rest
    state0 = js.state(-e0)
    n = int(round(t_end / dt))
    traj = rbjax.rollout(model, state0, dt, n, integrator=rbjax.RK4(), save_every=max(n // 50, 1))
    states = rbjax.State(t=traj.t, q=traj.q, u=traj.u)
    q = np.asarray(jax.vmap(js.positions)(states))
    t = np.asarray(traj.t)
    pos, vel, _ = (np.asarray(x) for x in jax.vmap(desired)(jnp.asarray(t)))
    err = pos - q
    e_dot0 = np.asarray(desired(0.0)[1])  # ė(0) = q̇_d(0) − 0
    closed = (np.asarray(e0)[None] + (e_dot0 + OMEGA * np.asarray(e0))[None] * t[:, None]) * np.exp(
        -OMEGA * t[:, None]
    )
    checks.check(
        "tracking",
        "joint error vs closed form (ë + 2ωė + ω²e = 0)",
        np.abs(err - closed).max(),
        1e-6,
    )
    print(f"  largest tracking error at t = {t[-1]:.2f} s: {np.abs(err[-1]).max():.2e} rad")
    if plot:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("  matplotlib is not installed: no plot")
            return
        fig, ax = plt.subplots(figsize=(7, 3.5))
        for k in range(nv):
            ax.plot(t, err[:, k], label=js.names[k])
        ax.plot(t, closed[:, 0], "k--", lw=1, label="closed form")
        ax.set(xlabel="t [s]", ylabel="q_d − q [rad]", title="computed-torque tracking error")
        ax.legend(fontsize=7, ncol=4)
        fig.tight_layout()
        fig.savefig(plot, dpi=120)
        print(f"  wrote {plot}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=os.path.join(HERE, "models", "arm7.xml"))
    p.add_argument("--t-end", type=float, default=1.0, help="simulated time [s]")
    p.add_argument("--dt", type=float, default=2.5e-4, help="step [s]")
    p.add_argument("--plot", default=None, help="PNG of the tracking errors")
    p.add_argument("--no-mujoco", action="store_true", help="skip the side-by-side check")
    args = p.parse_args(argv)
    checks = Checks()
    print(f"{os.path.basename(args.model)}: MJCF through rbjax.load")
    if not args.no_mujoco:
        side_by_side(args.model, args.t_end, args.dt, checks)
    computed_torque(args.model, args.t_end, args.dt, checks, args.plot)
    if checks.failed:
        raise SystemExit(f"failed checks: {checks.failed}")
    return dict(checks)


if __name__ == "__main__":
    main()
