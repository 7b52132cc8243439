"""Where the test suite's time goes: tracing, lowering, XLA compilation and the rest, per test
file and per compiled program, from the per-worker records that tests/conftest.py writes when
RBJAX_COMPILE_PROFILE names a directory.

    RBJAX_COMPILE_PROFILE=/tmp/prof .venv/bin/python -m pytest -q -n auto --dist worksteal
    python benchmarks/suite_profile.py /tmp/prof [--top 25] [--json out.json]

The seconds are JAX's own monitoring events (jaxpr trace, jaxpr -> MLIR, backend compile,
persistent-cache load), summed over both workers; "other" is a test's wall time less those:
running the programs, Python and NumPy, MuJoCo, subprocesses. A program name compiled many
times is a candidate for sharing: one jit for one structure (rbjax's own caches), or a model
that the tests build once.
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

PHASES = ("trace", "lower", "compile", "cache_load")


def load(directory: Path) -> dict[str, dict]:
    tests: dict[str, dict] = {}
    for path in sorted(directory.glob("*.json")):
        tests.update(json.loads(path.read_text())["tests"])
    return tests


def summarise(tests: dict[str, dict], top: int) -> dict:
    total = {p: sum(t.get(p, 0.0) for t in tests.values()) for p in (*PHASES, "wall")}
    total["other"] = total["wall"] - sum(total[p] for p in PHASES)
    files: dict[str, dict] = collections.defaultdict(lambda: collections.defaultdict(float))
    programs: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    traced: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    for nodeid, t in tests.items():
        f = files[nodeid.split("::")[0]]
        for p in (*PHASES, "wall"):
            f[p] += t.get(p, 0.0)
        f["tests"] += 1
        for name, seconds in t["programs"]:
            programs[name][0] += 1
            programs[name][1] += seconds
        for name, seconds in t.get("traced", ()):
            traced[name][0] += 1
            traced[name][1] += seconds
    by_file = sorted(files.items(), key=lambda kv: -kv[1]["wall"])
    by_program = sorted(programs.items(), key=lambda kv: -kv[1][1])
    by_traced = sorted(traced.items(), key=lambda kv: -kv[1][1])
    return {
        "tests": len(tests),
        "total": total,
        "files": [{"file": k, **v} for k, v in by_file],
        "programs": [{"name": k, "count": c, "compile": s} for k, (c, s) in by_program[:top]],
        "traced": [{"name": k, "count": c, "trace": s} for k, (c, s) in by_traced[:top]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    s = summarise(load(args.directory), args.top)
    t = s["total"]
    print(f"{s['tests']} tests, {t['wall']:.0f} s of test time (both workers)")
    print(
        " | ".join(f"{p} {t[p]:.0f} s ({100 * t[p] / t['wall']:.0f} %)" for p in (*PHASES, "other"))
    )
    print(
        "\n| file | tests | wall s | trace | lower | compile | cache load |\n|---|---|---|---|---|---|---|"
    )
    for f in s["files"][: args.top]:
        print(
            f"| {f['file']} | {f['tests']:.0f} | {f['wall']:.0f} | {f['trace']:.0f} | "
            f"{f['lower']:.0f} | {f['compile']:.0f} | {f['cache_load']:.0f} |"
        )
    print("\n| program | compiled | compile s |\n|---|---|---|")
    for p in s["programs"]:
        print(f"| {p['name']} | {p['count']} | {p['compile']:.1f} |")
    print("\n| traced function | traced | trace s |\n|---|---|---|")
    for p in s["traced"]:
        print(f"| {p['name']} | {p['count']} | {p['trace']:.1f} |")
    if args.json:
        args.json.write_text(json.dumps(s, indent=1))


if __name__ == "__main__":
    main()
