"""Imported robots, batched: rbjax against MuJoCo C on the same MJCF files.

For each model of examples/models (loaded with rbjax.load) and each batch size B, B copies
start from random joint positions and velocities; rbjax integrates all of them in one rollout
(RK4, the file's step, ``--steps`` steps), MuJoCo C steps the same states with RK4 (one thread,
a Python loop over mj_step, and where available ``mujoco.rollout`` on every core). Reported:
compile time (the first call minus a warm call) and the median warm run time over
``--repeats`` runs, as system-steps per second. JSON to ``--json``; a table on stdout.

    python benchmarks/loaded.py [--quick] [--json benchmarks/results/loaded.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import warnings

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)

import rbjax  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "..", "examples", "models")


def random_states(source, batch, rng):
    m = source.mjmodel
    states = []
    for _ in range(batch):
        qpos = m.qpos0 + rng.uniform(-0.3, 0.3, m.nq)
        for j in range(m.njnt):
            a, kind = m.jnt_qposadr[j], int(m.jnt_type[j])
            if kind in (0, 1):  # free, ball: unit quaternions
                o = a + 3 if kind == 0 else a
                qpos[o : o + 4] /= np.linalg.norm(qpos[o : o + 4])
        qvel = rng.uniform(-0.5, 0.5, m.nv)
        states.append((qpos, qvel))
    return states


def time_rbjax(loaded, states, steps, repeats, batch_chunk=None):
    st = [loaded.source.state(q, v) for q, v in states]
    state = rbjax.State(
        t=np.zeros(len(st)), q=np.stack([s.q for s in st]), u=np.stack([s.u for s in st])
    )

    def call():
        traj = rbjax.rollout(
            loaded.model,
            state,
            loaded.timestep,
            steps,
            integrator=rbjax.RK4(),
            save_every=steps,
            batch_chunk=batch_chunk,
        )
        jax.block_until_ready(traj.q)

    t0 = time.perf_counter()
    call()
    first = time.perf_counter() - t0
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        runs.append(time.perf_counter() - t0)
    run = statistics.median(runs)
    return max(first - run, 0.0), run


def time_mujoco(loaded, states, steps, repeats):
    import mujoco

    m = loaded.source.mjmodel
    m.opt.integrator = mujoco.mjtIntegrator.mjINT_RK4
    d = mujoco.MjData(m)
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for qpos, qvel in states:
            d.qpos[:], d.qvel[:] = qpos, qvel
            for _ in range(steps):
                mujoco.mj_step(m, d)
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--models", nargs="*", default=["double_pendulum.xml", "arm7.xml", "humanoid.xml"]
    )
    ap.add_argument("--batches", nargs="*", type=int, default=[1, 64, 1024, 8192])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--mujoco-batch", type=int, default=64, help="largest B MuJoCo steps (a Python loop)"
    )
    ap.add_argument(
        "--batch-chunk", type=int, default=None, help="rollout's batch_chunk (default: its own)"
    )
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.batches, args.steps, args.repeats = [1, 64], 100, 1
    device = jax.devices()[0]
    meta = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "device": f"{device.platform}: {device.device_kind}",
        "jax": jax.__version__,
        "steps": args.steps,
    }
    try:
        import mujoco

        meta["mujoco"] = mujoco.__version__
    except ImportError:
        mujoco = None
    rng = np.random.default_rng(0)
    records = []
    print(f"{meta['device']}, {meta['machine']}, jax {meta['jax']}, {args.steps} RK4 steps")
    print(
        "| model | B | rbjax compile s | rbjax run s | rbjax steps/s | MuJoCo C steps/s (1 thread) |"
    )
    print("|---|---|---|---|---|---|")
    for name in args.models:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loaded = rbjax.load(os.path.join(MODELS, name))
        for batch in args.batches:
            states = random_states(loaded.source, batch, rng)
            compile_s, run_s = time_rbjax(
                loaded, states, args.steps, args.repeats, args.batch_chunk
            )
            rec = {
                "model": name,
                "batch": batch,
                "batch_chunk": args.batch_chunk,
                "compile_s": compile_s,
                "run_s": run_s,
                "rbjax_steps_per_s": batch * args.steps / run_s,
            }
            if mujoco is not None and batch <= args.mujoco_batch:
                mj = time_mujoco(loaded, states, args.steps, max(1, args.repeats // 2))
                rec["mujoco_steps_per_s"] = batch * args.steps / mj
            records.append(rec)
            mj_col = f"{rec['mujoco_steps_per_s']:.3g}" if "mujoco_steps_per_s" in rec else "–"
            print(
                f"| {name} | {batch} | {compile_s:.1f} | {run_s:.3g} | "
                f"{rec['rbjax_steps_per_s']:.3g} | {mj_col} |",
                flush=True,
            )
            if args.json:  # after every row: a run cut short keeps what it measured
                with open(args.json, "w") as fh:
                    json.dump({"meta": meta, "records": records}, fh, indent=1)
    return records


if __name__ == "__main__":
    sys.exit(0 if main() is not None else 1)
