"""Extension points: a user force / joint written in the natural layout (one system, run by the
engine's jax.vmap adapter) against the built-in one (the engine's component-first kernel).

Cases (float64, RK4, dt = 1e-3):

* ``force``: B free bodies under a world force at a body point: built-in ``rbjax.PointForce``
  against ``UserPointForce`` below (the same physics, plain linear algebra on one body);
* ``joint``: B double pendulums hinged about z: built-in ``rbjax.Revolute`` against
  ``UserHinge`` below (residual of one system, vmapped by the engine).

Compile time (first call minus one run) and run time (median of ``--repeats`` calls) are
reported separately; the ratio user / built-in of run times is the number to read (the machine
is noisy, ratios measured in the same run are stable).

    python benchmarks/adapter.py --json benchmarks/results/adapter.json [--batches 1,64,1024]
"""

from __future__ import annotations

import argparse
import statistics
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

from free_body import machine, write_records  # noqa: E402

import rbjax  # noqa: E402
from rbjax import quaternion as quat  # noqa: E402


class UserPointForce(rbjax.AbstractForce):
    """A world force at a body point (Möller & Glocker 2012, eq. (75)), as a user writes it."""

    body: int = eqx.field(static=True)
    point_body: jax.Array
    force_world: jax.Array

    def bodies(self):
        return (self.body,)

    def wrench(self, model, t, state):
        rot = quat.rotation_matrix(state.q[self.body, 3:7])
        force_body = rot.T @ self.force_world
        return rbjax.Wrench.zeros(model.nb, state.q.dtype).add(
            self.body,
            force_world=self.force_world,
            scaling=self.point_body @ force_body,
            moment_body=jnp.cross(self.point_body, force_body),
        )


class UserHinge(rbjax.AbstractConstraint):
    """A revolute joint about z, as a user writes it (one system)."""

    body_i: int = eqx.field(static=True)
    body_j: int = eqx.field(static=True)
    point_i: jax.Array
    point_j: jax.Array
    name: str = eqx.field(static=True, default="hinge")

    def residual(self, q_i, q_j, t):
        rot_i, rot_j = quat.rotation_matrix(q_i[3:]), quat.rotation_matrix(q_j[3:])
        gap_world = q_j[:3] + rot_j @ self.point_j - q_i[:3] - rot_i @ self.point_i
        z_i, x_j, y_j = rot_i[:, 2], rot_j[:, 0], rot_j[:, 1]
        return jnp.concatenate([gap_world, jnp.stack([z_i @ x_j, z_i @ y_j])])


def force_problem(kind: str, batch: int):
    rho, f = jnp.array([0.3, -0.2, 0.5]), jnp.array([1.0, 2.0, -0.5])
    force = rbjax.PointForce(0, rho, f) if kind == "builtin" else UserPointForce(0, rho, f)
    model = rbjax.Model(rbjax.Body(1.0, np.diag([1.0, 2.0, 3.0])), forces=[force])
    rng = np.random.default_rng(0)
    omega = np.array([0.01, 5.0, 0.0]) + 0.1 * rng.standard_normal((batch, 1, 3))
    return model, rbjax.make_state(omega_body=omega)


def joint_problem(kind: str, batch: int):
    inertia = np.diag([1e-3, 1.0 / 12.0, 1.0 / 12.0])
    bodies = [rbjax.Body(1.0, inertia, name="upper"), rbjax.Body(1.5, inertia, name="lower")]
    a, b = np.array([0.5, 0.0, 0.0]), np.array([-0.5, 0.0, 0.0])
    pairs = [(rbjax.GROUND, 0, np.zeros(3), b), (0, 1, a, b)]
    if kind == "builtin":
        joints = [rbjax.Revolute(i, j, s_i=si, s_j=sj) for i, j, si, sj in pairs]
    else:
        joints = [UserHinge(i, j, jnp.asarray(si), jnp.asarray(sj)) for i, j, si, sj in pairs]
    model = rbjax.Model(bodies, joints=joints, gravity=[0.0, -9.81, 0.0])
    w = 1.0 + 0.1 * np.random.default_rng(0).standard_normal(batch)
    state = rbjax.make_state(
        position=np.broadcast_to([[0.5, 0.0, 0.0], [1.5, 0.0, 0.0]], (batch, 2, 3)),
        velocity=np.stack([np.outer(w, [0.0, 0.5, 0.0]), np.outer(w, [0.0, 1.5, 0.0])], 1),
        omega_body=np.stack([np.outer(w, [0.0, 0.0, 1.0])] * 2, 1),
    )
    return model, state


def run_case(case: str, kind: str, batch: int, steps: int, repeats: int) -> dict:
    build = force_problem if case == "force" else joint_problem
    model, state = build(kind, batch)

    def call():
        out = rbjax.rollout(model, state, 1e-3, steps, save_every=steps)
        return jax.block_until_ready(out.q)

    t0 = time.perf_counter()
    call()
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    run = statistics.median(times)
    return {
        "problem": case,
        "kind": kind,
        "batch": batch,
        "steps": steps,
        "run_s": run,
        "compile_s": max(first - run, 0.0),
        "steps_per_s": batch * steps / run,
        "machine": machine(),
    }


def table(records: list) -> str:
    lines = [
        "| problem | B | built-in run s | user run s | user / built-in | compile s (built-in / user) |",
        "|---|---|---|---|---|---|",
    ]
    keys = sorted({(r["problem"], r["batch"]) for r in records})
    for problem, batch in keys:
        by = {r["kind"]: r for r in records if r["problem"] == problem and r["batch"] == batch}
        if {"builtin", "user"} <= set(by):
            b, u = by["builtin"], by["user"]
            lines.append(
                f"| {problem} | {batch} | {b['run_s']:.4f} | {u['run_s']:.4f} | "
                f"{u['run_s'] / b['run_s']:.2f} | {b['compile_s']:.1f} / {u['compile_s']:.1f} |"
            )
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--json", default=None, help="write records to this path")
    p.add_argument("--batches", default="1,64,1024")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--cases", default="force,joint")
    args = p.parse_args(argv)
    records = []
    for case in args.cases.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            for kind in ("builtin", "user"):
                records.append(run_case(case, kind, batch, args.steps, args.repeats))
                print(f"{case} {kind} B={batch}: {records[-1]['run_s']:.4f} s", flush=True)
    write_records(records, args.json)
    print(table(records))
    return records


if __name__ == "__main__":
    main()
