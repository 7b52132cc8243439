"""Write the measurements that examples/cli/identify_pendulum.toml fits: the damped pendulum of
damped_pendulum.toml with its TRUE parameters (mass 1.25 kg, damping 0.08 N m s/rad, stiffness
1.5 N m/rad; released at 1 rad with 0.5 rad/s), integrated by RK4 at dt = 1e-3 s for 3 s and
sampled at 50 Hz: a marker at the rod's far end with 1 mm of noise per coordinate and a rate
gyroscope on the rod with 0.01 rad/s, seeded. Arrays of pendulum_measured.npz: ``t`` (T,) [s],
``tip`` (T, 3) [m], ``gyro`` (T, 3) [rad/s], and ``truth_*`` (the values, for checking).

    python examples/cli/make_pendulum_data.py [--out examples/cli/pendulum_measured.npz]
    python -m rbjax identify examples/cli/identify_pendulum.toml
"""

from __future__ import annotations

import argparse
import os

import jax

jax.config.update("jax_enable_x64", True)

import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import rbjax  # noqa: E402
from rbjax import quaternion as quat  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TRUTH = {"mass": 1.25, "damping": 0.08, "stiffness": 1.5, "qpos0": 1.0, "qvel0": 0.5}
TIP = np.array([0.0, 0.0, -0.5])  # m, the rod's far end in body axes
T_END, DT, RATE = 3.0, 1e-3, 50  # s, s, Hz
SIGMA_TIP, SIGMA_GYRO = 1e-3, 0.01  # m, rad/s


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(HERE, "pendulum_measured.npz"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    model = rbjax.load(os.path.join(HERE, "damped_pendulum.toml")).model
    model = eqx.tree_at(
        lambda m: (m.mass, m.forces[0].damping, m.forces[0].stiffness),
        model,
        (
            jnp.array([TRUTH["mass"]]),
            jnp.asarray(TRUTH["damping"]),
            jnp.asarray(TRUTH["stiffness"]),
        ),
    )
    state = rbjax.state_from_joint_coordinates(
        model, jnp.array([TRUTH["qpos0"]]), jnp.array([TRUTH["qvel0"]])
    )
    n, every = round(T_END / DT), round(1 / (RATE * DT))
    traj = rbjax.rollout(model, state, DT, n, save_every=every)
    q, u = np.asarray(traj.q[:, 0]), np.asarray(traj.u[:, 0])
    rng = np.random.default_rng(args.seed)
    tip = q[:, 0:3] + np.asarray(quat.rotate(jnp.asarray(q[:, 3:7]), jnp.asarray(TIP)))
    np.savez(
        args.out,
        t=np.asarray(traj.t),
        tip=tip + SIGMA_TIP * rng.normal(size=tip.shape),
        gyro=u[:, 4:7] + SIGMA_GYRO * rng.normal(size=(len(q), 3)),
        **{f"truth_{k}": np.asarray(v) for k, v in TRUTH.items()},
    )
    print(f"wrote {args.out}: {len(q)} samples over {T_END} s; true values {TRUTH}")


if __name__ == "__main__":
    main()
