"""The implicit midpoint rule on mechanisms: simplified Newton against exact Newton.

For each mechanism of benchmarks/models.py and batch B, ``rbjax.rollout`` with
``ImplicitMidpoint()`` (simplified Newton through the Schur complement of the joints, the
default since issue 14), ``ImplicitMidpoint(newton="exact")`` (Newton with the dense exact
Jacobian, the solver before) and RK4 for scale, dt = 1e-3, float64, in one process: compile
seconds (ahead-of-time ``lower().compile()``) and the median run time per system-step, and the
largest joint residual at the end (both solvers hold the constraints at the end point).

    python benchmarks/implicit.py --json benchmarks/results/implicit.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import equinox as eqx
import jax
import jax.numpy as jnp

jax.config.update("jax_enable_x64", True)

import rbjax  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
from free_body import write_run  # noqa: E402

from rbjax._engine.projection import residuals as joint_residuals  # noqa: E402

SOLVERS = {
    "simplified": lambda: rbjax.ImplicitMidpoint(),
    "exact": lambda: rbjax.ImplicitMidpoint(newton="exact"),
    "RK4": lambda: rbjax.RK4(),
}


def row(name: str, batch: int, solver: str, steps: int, repeats: int) -> dict:
    model, state = models.build(name)
    state = jax.tree.map(lambda x: jnp.broadcast_to(x, (batch,) + jnp.shape(x)), state)
    arrays, static = eqx.partition(model, eqx.is_array)
    integ = SOLVERS[solver]()

    def final(arr, st):
        m = eqx.combine(arr, static)
        tr = rbjax.rollout(m, st, 1e-3, steps, integrator=integ, save_every=steps, throw=False)
        return tr.q[..., -1, :, :], tr.result

    t0 = time.perf_counter()
    compiled = jax.jit(final).lower(arrays, state).compile()
    compile_s = time.perf_counter() - t0
    q, result = jax.block_until_ready(compiled(arrays, state))
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(arrays, state))
        runs.append(time.perf_counter() - t0)
    step_s = statistics.median(runs) / steps
    t1 = jnp.full((batch, 1), steps * 1e-3)
    residual = jnp.max(jnp.abs(joint_residuals(model, t1, jnp.moveaxis(q, -1, 0))))
    return {
        "model": name,
        "bodies": model.nb,
        "rows": sum(model.joint_rows),
        "batch": batch,
        "solver": solver,
        "steps": steps,
        "compile_s": compile_s,
        "us_per_system_step": 1e6 * step_s / batch,
        "max_joint_residual": float(residual),
        "ok": bool(jnp.all(result == rbjax.RESULTS.successful)),
    }


def table(records) -> str:
    lines = [
        "| model | bodies | joint rows | B | solver | compile s | µs / system-step | "
        "exact / simplified | max joint residual |",
        "|" + "---|" * 9,
    ]
    by = {(r["model"], r["batch"], r["solver"]): r for r in records}
    for r in records:
        simp = by.get((r["model"], r["batch"], "simplified"))
        ratio = ""
        if r["solver"] == "exact" and simp is not None:
            ratio = f"**{r['us_per_system_step'] / simp['us_per_system_step']:.1f}**"
        lines.append(
            f"| {r['model']} | {r['bodies']} | {r['rows']} | {r['batch']} | {r['solver']} | "
            f"{r['compile_s']:.1f} | {r['us_per_system_step']:.3g} | {ratio} | "
            f"{r['max_joint_residual']:.1e}{'' if r['ok'] else ' (failed)'} |"
        )
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", default=None)
    p.add_argument("--models", default="pendulum_2,slider_crank,arm6,pendulum_16,walker")
    p.add_argument("--batches", default="1,64,256")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--max-exact", type=int, default=130, help="exact Newton only up to this many unknowns"
    )
    args = p.parse_args(argv)
    records = []
    for name in args.models.split(","):
        model, _ = models.build(name)
        unknowns = 15 * model.nb + sum(model.joint_rows)
        for b in [int(x) for x in args.batches.split(",")]:
            for solver in SOLVERS:
                if solver == "exact" and unknowns > args.max_exact:
                    continue  # a dense LU of (15 nb + m)² per system and iteration: minutes
                rec = row(name, b, solver, args.steps, args.repeats)
                records.append(rec)
                print(table([rec]).splitlines()[-1], flush=True)
    print(table(records))
    if args.json:
        write_run(records, args.json)


if __name__ == "__main__":
    main()
