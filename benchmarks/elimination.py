"""Constrained dynamics of N-link chains: the Schur-complement solvers side by side.

For a chain of N rods (benchmarks/models.py ``pendulum_N``: revolute joints, 5 rows each), RK4 at
dt = 1e-3, float64, batch B: compile seconds and run time per step of the rollout with the Schur
complement S = W̃ M⁻¹ W̃ᵀ solved by each factorisation of rbjax/_engine/joints.py:

* ``dense``: one LAPACK Cholesky of the assembled S (O(N³));
* ``block``: block Cholesky of S, unrolled into scalar operations up to 80 rows and one batched
  LAPACK call per block above (rbjax/_engine/blockchol.py);
* ``tree``: the elimination along the joint graph, a ``lax.scan`` over the levels of the
  spanning tree (rbjax/_engine/elimination.py);
* ``auto``: what rbjax chooses (``rbjax._engine.schur.method``);
* ``mujoco-c``: when the ``mujoco`` package is installed (the ``bench`` extra), the same chain in
  MuJoCo's C engine (hinge joints in reduced coordinates, RK4, ``mujoco.rollout`` on all cores),
  the peer measured in the same run.

Each row runs in a fresh process (compile times are not shared).

    python benchmarks/elimination.py --json benchmarks/results/elimination.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def mujoco_row(n: int, batch: int, steps: int) -> dict:
    """The N-link chain in MuJoCo C: rods of 1 kg and 1 m along x, hinges about y at x = k,
    inertia about the centre of mass diag(1e-3, 1/12, 1/12), released horizontal."""
    import mujoco
    import numpy as np
    from mujoco import rollout as mj_rollout

    body = ""
    for k in reversed(range(n)):
        body = (
            f'<body pos="{1 if k else 0} 0 0"><joint type="hinge" axis="0 1 0"/>'
            '<inertial pos="0.5 0 0" mass="1" diaginertia="0.001 0.0833333333 0.0833333333"/>'
            f"{body}</body>"
        )
    xml = (
        '<mujoco><option timestep="0.001" integrator="RK4" gravity="0 0 -9.81"/>'
        f"<worldbody>{body}</worldbody></mujoco>"
    )
    m = mujoco.MjModel.from_xml_string(xml)
    spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
    d = mujoco.MjData(m)
    s0 = np.zeros(mujoco.mj_stateSize(m, spec))
    mujoco.mj_getState(m, d, s0, spec)
    init = np.tile(s0, (batch, 1))
    nthread = os.cpu_count() or 1
    datas = [mujoco.MjData(m) for _ in range(nthread)]
    mj_steps = max(steps, 200)

    def call():
        return mj_rollout.rollout(m, datas, init, nstep=mj_steps, persistent_pool=True)

    call()
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        call()
        runs.append(time.perf_counter() - t0)
    step_s = statistics.median(runs) / mj_steps
    return {
        "bodies": n,
        "rows": 5 * n,
        "batch": batch,
        "method": f"mujoco-c ({nthread} threads)",
        "chosen": "",
        "compile_s": 0.0,
        "us_per_step": 1e6 * step_s,
        "us_per_system_step": 1e6 * step_s / batch,
    }


def row(n: int, batch: int, method: str, steps: int) -> dict:
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    sys.path.insert(0, HERE)
    import models

    import rbjax
    from rbjax._engine import schur as joints

    joints.FORCE_METHOD = None if method == "auto" else method
    model, state = models.build(f"pendulum_{n}")
    if batch > 1:
        state = jax.tree.map(lambda x: jnp.broadcast_to(x, (batch,) + jnp.shape(x)), state)
    arrays, static = eqx.partition(model, eqx.is_array)

    def final(arr, st):
        tr = rbjax.rollout(eqx.combine(arr, static), st, 1e-3, steps, save_every=steps, throw=False)
        return tr.q[..., -1, :, :]

    t0 = time.perf_counter()
    compiled = jax.jit(final).lower(arrays, state).compile()
    compile_s = time.perf_counter() - t0
    jax.block_until_ready(compiled(arrays, state))
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(arrays, state))
        runs.append(time.perf_counter() - t0)
    step_s = statistics.median(runs) / steps
    chosen = joints.method(model.topology, sum(model.joint_rows), batch)
    return {
        "bodies": n,
        "rows": sum(model.joint_rows),
        "batch": batch,
        "method": method,
        "chosen": chosen,
        "compile_s": compile_s,
        "us_per_step": 1e6 * step_s,
        "us_per_system_step": 1e6 * step_s / batch,
    }


def table(records) -> str:
    head = "| N | rows | B | solver | compile s | µs / step | µs / system-step |"
    lines = [head, "|" + "---|" * 7]
    for r in records:
        name = r["method"] if r["method"] != "auto" else f"auto ({r['chosen']})"
        compile_s = f"{r['compile_s']:.1f}" if not r["method"].startswith("mujoco") else "—"
        lines.append(
            f"| {r['bodies']} | {r['rows']} | {r['batch']} | {name} | {compile_s} | "
            f"{r['us_per_step']:.0f} | {r['us_per_system_step']:.1f} |"
        )
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", default=None)
    p.add_argument("--links", default="8,16,32,64,128")
    p.add_argument("--batches", default="1,64")
    p.add_argument("--methods", default="dense,block,tree,mujoco")
    p.add_argument("--append", action="store_true", help="add to the records in --json")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--row", nargs=3, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.row:
        n, b, m = args.row
        rec = (
            mujoco_row(int(n), int(b), args.steps)
            if m == "mujoco"
            else row(int(n), int(b), m, args.steps)
        )
        print(json.dumps(rec))
        return
    records = []
    if args.append and args.json and os.path.exists(args.json):
        with open(args.json) as fh:
            records = json.load(fh)["records"]
    for b in [int(x) for x in args.batches.split(",")]:
        for n in [int(x) for x in args.links.split(",")]:
            for m in args.methods.split(","):
                if m == "dense" and n * 5 > 400:
                    continue  # O(N³): minutes per call
                cmd = [
                    sys.executable,
                    __file__,
                    "--steps",
                    str(args.steps),
                    "--row",
                    str(n),
                    str(b),
                    m,
                ]
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
                if out.returncode:
                    print(out.stderr[-2000:], file=sys.stderr)
                    continue
                rec = json.loads(out.stdout.strip().splitlines()[-1])
                records.append(rec)
                print(table([rec]).splitlines()[-1], flush=True)
    print(table(records))
    if args.json:
        sys.path.insert(0, HERE)
        from free_body import write_run

        write_run(records, args.json)


if __name__ == "__main__":
    main()
