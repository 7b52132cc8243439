"""Print a benchmark JSON (free_body.py or mechanisms.py) as the Markdown table in the README.

python benchmarks/table.py benchmarks/results/free_body.json
python benchmarks/table.py benchmarks/results/mechanisms.json
"""

from __future__ import annotations

import json
import sys

ORDER = (
    ("RK4", ("NewtonEuler", "ScalableDAE", "UdwadiaSchutte")),
    ("SemiImplicitEuler", ("NewtonEuler", "ScalableDAE")),
    ("ImplicitMidpoint", ("NewtonEuler", "ScalableDAE")),
)


def table(records) -> str:
    batches = sorted({r["batch"] for r in records})
    head = (
        "| integrator | formulation | dtype | "
        + " | ".join(f"B = {b}" for b in batches)
        + " | compile s (max) |"
    )
    lines = [head, "|" + "---|" * (len(batches) + 4)]
    for dtype in ("float64", "float32"):
        for integ, forms in ORDER:
            for form in forms:
                rs = [
                    r
                    for r in records
                    if (r["integrator"], r["formulation"], r["dtype"]) == (integ, form, dtype)
                ]
                if not rs:
                    continue
                by = {r["batch"]: r for r in rs}
                cells = [
                    f"{by[b]['body_steps_per_s'] / 1e6:.2f}" if b in by else "–" for b in batches
                ]
                comp = max(r["compile_s"] for r in rs)
                lines.append(
                    f"| {integ} | {form} | {dtype} | " + " | ".join(cells) + f" | {comp:.1f} |"
                )
    m = records[0].get("machine", {})
    lines.append("")
    lines.append(
        f"Million body-steps per second (median run time); machine: {m.get('cpu', '?')}, "
        f"{m.get('cores', '?')} cores, JAX {m.get('jax', '?')} on {m.get('backend', '?')}."
    )
    return "\n".join(lines)


def mechanism_table(records) -> str:
    """Table of benchmarks/mechanisms.py records: steps/s (mechanism steps) per engine/case."""
    main = [
        r
        for r in records
        if not r["problem"].startswith("pendulum_") or r["problem"] == "pendulum_2"
    ]
    main = [r for r in main if "us_per_step_per_system" not in r]
    batches = sorted({r["batch"] for r in main})
    head = (
        "| engine | problem | integrator | formulation | "
        + " | ".join(f"B = {b}" for b in batches)
        + " | compile s (max) |"
    )
    lines = [head, "|" + "---|" * (len(batches) + 5)]
    keys = []
    for r in main:
        k = (r["engine"], r["problem"], r["integrator"], r["formulation"])
        if k not in keys:
            keys.append(k)
    for k in keys:
        by = {
            r["batch"]: r
            for r in main
            if (r["engine"], r["problem"], r["integrator"], r["formulation"]) == k
        }
        cells = [
            f"{by[b]['steps_per_s']:.3g}" + ("†" if by[b].get("devices", 1) > 1 else "")
            if b in by
            else "–"
            for b in batches
        ]
        comp = max(r["compile_s"] for r in by.values())
        lines.append(
            f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | " + " | ".join(cells) + f" | {comp:.1f} |"
        )
    chain = [r for r in records if "us_per_step_per_system" in r]
    if chain:
        lines += [
            "",
            "| N links | µs per step per system (RK4, B = 64) | compile s |",
            "|---|---|---|",
        ]
        for r in chain:
            lines.append(
                f"| {r['bodies']} | {r['us_per_step_per_system']:.1f} | {r['compile_s']:.1f} |"
            )
    m = records[0].get("machine", {})
    ndev = max((r.get("devices", 1) for r in main), default=1)
    if ndev > 1:
        lines.append("")
        lines.append(
            f"† the batch split over {ndev} host CPU devices (one per core) with "
            "`eqx.filter_pmap`, as MuJoCo's rollout uses one thread per core."
        )
    lines.append("")
    lines.append(
        f"Mechanism steps per second (body-steps/s = steps/s × bodies; run time of one call after "
        f"compilation); machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, "
        f"JAX {m.get('jax', '?')} on {m.get('backend', '?')}."
    )
    return "\n".join(lines)


if __name__ == "__main__":
    with open(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/free_body.json") as fh:
        recs = json.load(fh)
    print(mechanism_table(recs) if "engine" in recs[0] else table(recs))
