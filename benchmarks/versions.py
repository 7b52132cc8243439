"""Throughput and compile time of two versions of rbjax, side by side on one machine.

The rows of ``make bench`` that a refactoring must not move: free bodies (RK4 with NewtonEuler
and ScalableDAE, SemiImplicitEuler, float64, B = 1 to 8192) and the double pendulum (RK4,
ScalableDAE and NewtonEuler, B = 1 to 1024, one device), 2000 steps of dt = 1e-3 each. The
version ``--before`` (a git revision, checked out into a temporary worktree) and the working
tree are run alternately, ``--rounds`` times each, every run in a fresh process (so compile
times are cold); the table shows the median of the rounds and the ratio after / before. The
machine is noisy, so read the ratios, and the spread between rounds in the JSON.

    python benchmarks/versions.py --before 6eea938 --json benchmarks/results/versions.json

``--worker PATH`` (internal) runs the cases once with the rbjax found at PATH and prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
FREE = [
    ("RK4", "NewtonEuler", 1),
    ("RK4", "NewtonEuler", 1024),
    ("RK4", "NewtonEuler", 8192),
    ("RK4", "ScalableDAE", 1),
    ("RK4", "ScalableDAE", 1024),
    ("RK4", "ScalableDAE", 8192),
    ("SemiImplicitEuler", "ScalableDAE", 1024),
]
PENDULUM = [
    ("RK4", "ScalableDAE", 1),
    ("RK4", "ScalableDAE", 64),
    ("RK4", "ScalableDAE", 1024),
    ("RK4", "NewtonEuler", 1024),
]


def worker(path: str, steps: int, repeats: int) -> list:
    """Every case once with the rbjax at ``path`` (only public API, common to both versions)."""
    sys.path.insert(0, path)
    sys.path.insert(1, str(HERE))
    import jax

    jax.config.update("jax_enable_x64", True)
    import free_body
    import mechanisms

    import rbjax

    assert Path(rbjax.__file__).resolve().is_relative_to(Path(path).resolve()), rbjax.__file__
    out = []
    for integ, form, batch in FREE:
        r = free_body.run_case(integ, form, "float64", batch, steps, 1e-3, repeats)
        out.append(dict(problem="free_body", **{k: r[k] for k in KEYS}))
    for integ, form, batch in PENDULUM:
        r, _ = mechanisms.rbjax_case("double_pendulum", integ, form, batch, steps, repeats)
        out.append(dict(problem="double_pendulum", **{k: r[k] for k in KEYS}))
    return out


KEYS = ("integrator", "formulation", "batch", "steps", "run_s", "compile_s")


def _case(r) -> tuple:
    return r["problem"], r["integrator"], r["formulation"], r["batch"]


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--before", help="git revision to compare the working tree with")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", default=None)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.steps, args.repeats)))
        return None
    if not args.before:
        p.error("--before REV is required")
    root = HERE.parent
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "before"
        subprocess.run(
            ["git", "-C", str(root), "worktree", "add", "--detach", str(old), args.before],
            check=True,
            capture_output=True,
        )
        try:
            for rnd in range(args.rounds):
                for label, path in (("before", old), ("after", root)):
                    t0 = time.perf_counter()
                    res = subprocess.run(
                        [sys.executable, __file__, "--worker", str(path)]
                        + ["--steps", str(args.steps), "--repeats", str(args.repeats)],
                        check=True,
                        capture_output=True,
                        text=True,
                        env={**os.environ, "PYTHONPATH": ""},
                    )
                    rows = json.loads(res.stdout.strip().splitlines()[-1])
                    for r in rows:
                        records.append(dict(r, version=label, round=rnd))
                    print(f"round {rnd} {label}: {time.perf_counter() - t0:.0f} s", flush=True)
        finally:
            subprocess.run(
                ["git", "-C", str(root), "worktree", "remove", "--force", str(old)],
                check=False,
                capture_output=True,
            )
    print(table(records))
    if args.json:
        sys.path.insert(0, str(HERE))
        from free_body import machine

        info = dict(machine(), before=args.before, after="working tree")
        for r in records:
            r["machine"] = info
        Path(args.json).write_text(json.dumps(records, indent=1))
    return records


def table(records) -> str:
    lines = [
        "| problem | integrator | formulation | B | steps/s before | steps/s after | after / "
        "before | compile s before / after |",
        "|" + "---|" * 8,
    ]
    keys = list(dict.fromkeys(_case(r) for r in records))
    for k in keys:
        med = {}
        for v in ("before", "after"):
            rs = [r for r in records if r["version"] == v and _case(r) == k]
            med[v] = (
                statistics.median(r["batch"] * r["steps"] / r["run_s"] for r in rs),
                statistics.median(r["compile_s"] for r in rs),
            )
        (sb, cb), (sa, ca) = med["before"], med["after"]
        lines.append(
            f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {sb:.3g} | {sa:.3g} | {sa / sb:.2f} | "
            f"{cb:.1f} / {ca:.1f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
