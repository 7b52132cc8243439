"""First-number latency of ``rbjax simulate`` on robot files, cold and warm compilation cache.

For each model, ``rbjax simulate MODEL --t T`` runs in a fresh Python process twice against one
persistent compilation cache (``RBJAX_CACHE_DIR``, an empty temporary folder at first): the
first run is the cold start (every program compiled, then stored), the second the warm start
(the programs loaded from the cache). Measured: the wall time from starting the process to
the first line it prints on stdout (the run's summary: bodies, joints, steps; simulate prints
it when the run is done), and to its exit. A third row runs with ``--no-cache`` after the
warm one: what the cache saves. The timings the command itself reports (compile s, run s)
are parsed from its second line ("compile 1.23 s; run 0.45 s (...)").

    python benchmarks/cli_latency.py --json benchmarks/results/cli_latency.json
    python benchmarks/cli_latency.py --models examples/models/arm7.xml --t 0.5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODELS = ("examples/models/arm7.xml", "tests/data/mujoco_humanoid.xml")


def one_run(model: str, t: float, cache: str, extra=()) -> dict:
    """Run ``rbjax simulate`` once in a fresh process; the seconds to its first stdout line
    and to its exit, and what it printed about compile and run time."""
    env = dict(os.environ, RBJAX_CACHE_DIR=cache)
    with tempfile.TemporaryDirectory() as out, tempfile.TemporaryFile("w+") as errors:
        argv = [sys.executable, "-m", "rbjax", "simulate", os.path.join(ROOT, model)]
        argv += ["--t", str(t), "--out", os.path.join(out, "run.npz"), "--no-progress", *extra]
        start = time.perf_counter()
        # stderr to a file, stdout read through ONE buffered reader: communicate() after a
        # readline() reads the pipe's descriptor directly and loses what readline() had
        # buffered (simulate prints its lines at once, so every line after the first)
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=errors, text=True, env=env, cwd=out
        )
        assert proc.stdout is not None
        lines = [proc.stdout.readline()]
        first = time.perf_counter() - start
        rest = proc.stdout.read()
        proc.wait()
        total = time.perf_counter() - start
        errors.seek(0)
        err = errors.read()
    lines += rest.splitlines()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {err.strip()[-500:]}")
    row = {"first_line_s": first, "exit_s": total, "summary": lines[0].strip()}
    match = re.search(r"compile ([0-9.]+) s; run ([0-9.]+) s", "\n".join(lines))
    if match:
        row["compile_s"], row["run_s"] = float(match.group(1)), float(match.group(2))
    return row


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated model files")
    p.add_argument("--t", type=float, default=1.0, help="simulated seconds (default 1)")
    p.add_argument("--json", default=None, help="write the rows here")
    args = p.parse_args(argv)
    rows = []
    for model in args.models.split(","):
        with tempfile.TemporaryDirectory() as cache:
            for label, extra in (("cold", ()), ("warm", ()), ("no-cache", ("--no-cache",))):
                row = {"model": model, "t": args.t, "cache": label} | one_run(
                    model, args.t, cache, extra
                )
                if label == "warm":
                    row["cache_files"] = len(os.listdir(cache))
                rows.append(row)
                print(
                    f"{model:40s} {label:9s} first line {row['first_line_s']:6.2f} s, exit "
                    f"{row['exit_s']:6.2f} s (compile {row.get('compile_s', float('nan')):.2f} s, "
                    f"run {row.get('run_s', float('nan')):.2f} s)",
                    flush=True,
                )
    if args.json:
        import jax

        head = {
            "python": platform.python_version(),
            "jax": jax.__version__,
            "machine": platform.machine(),
            "cpu_count": os.cpu_count(),
            "note": "wall time from process start; the machine may be shared",
        }
        with open(args.json, "w") as fh:
            json.dump({"header": head, "rows": rows}, fh, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
