"""Print a benchmark JSON (from free_body.py) as the Markdown table quoted in the README.

python benchmarks/table.py benchmarks/results/free_body.json
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


if __name__ == "__main__":
    with open(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/free_body.json") as fh:
        print(table(json.load(fh)))
