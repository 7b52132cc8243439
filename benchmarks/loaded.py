"""Imported robots, batched: rbjax against MuJoCo C on the same MJCF files.

For each model of examples/models (loaded with rbjax.load) and each batch size B, B copies
start from random joint positions and velocities; rbjax integrates all of them in one rollout
(RK4, the file's step, ``--steps`` steps), MuJoCo C steps the same states with RK4 on one
thread (``mujoco.rollout``, contacts and joint limits off as in rbjax; up to B =
``--mujoco-batch``). Reported: compile time (the first call minus the median warm call) and
the median warm run time over ``--repeats`` runs, as system-steps per second. JSON to
``--json``; a table on stdout.

The measuring is ``rbjax bench`` (rbjax/_cli/bench.py); this script runs it over several
models and keeps its own JSON format: ``{"meta": {...}, "records": [{model, batch,
batch_chunk, bodies, compile_s, run_s, rbjax_steps_per_s, rbjax_body_steps_per_s,
mujoco_steps_per_s}, ...]}``, ``meta["header"]`` being ``rbjax bench``'s header.

    python benchmarks/loaded.py [--quick] [--json benchmarks/results/loaded.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

import jax

jax.config.update("jax_enable_x64", True)

from rbjax._cli import bench  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "..", "examples", "models")


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
    ap.add_argument("--mujoco-batch", type=int, default=64, help="largest B MuJoCo C steps")
    ap.add_argument(
        "--batch-chunk", type=int, default=None, help="rollout's batch_chunk (default: its own)"
    )
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.batches, args.steps, args.repeats = [1, 64], 100, 1
    head = bench.header()
    meta = {
        "machine": f"{head['cpu']}, {head['cpu_count']} cores",
        "device": head["device"],
        "jax": head["jax"],
        "steps": args.steps,
        "mujoco": head["mujoco"],
        "header": head,
    }
    records = []
    print("\n".join(bench.header_lines(head)) + f"\n{args.steps} RK4 steps\n")
    print(bench.table_head(), flush=True)

    def on_row(row):
        print(bench.table_line(row), flush=True)
        if row["engine"] == "rbjax":
            rec = {
                "model": row["model"],
                "batch": row["batch"],
                "batch_chunk": row["batch_chunk"],
                "bodies": row["bodies"],
                "compile_s": row["compile_s"],
                "run_s": row["run_s"],
                "rbjax_steps_per_s": row["steps_per_s"],
                "rbjax_body_steps_per_s": row["body_steps_per_s"],
            }
            if "error" in row:
                rec["error"] = row["error"]
            records.append(rec)
        else:  # the peer's row follows the rbjax row of the same model and batch
            records[-1]["mujoco_steps_per_s"] = row["steps_per_s"]
        if args.json:  # after every row: a run cut short keeps what it measured
            with open(args.json, "w") as fh:
                json.dump({"meta": meta, "records": records}, fh, indent=1)

    for name in args.models:
        with warnings.catch_warnings():  # elements rbjax does not simulate (contacts, ...)
            warnings.simplefilter("ignore")
            case = bench.prepare(os.path.join(MODELS, name))
        bench.measure(
            case,
            args.batches,
            steps=args.steps,
            repeats=args.repeats,
            mujoco_max_batch=args.mujoco_batch,
            batch_chunk=args.batch_chunk,
            on_row=on_row,
        )
    return records


if __name__ == "__main__":
    records = main()
    sys.exit(0 if records and not any("error" in r for r in records) else 1)
