"""Cost of redundant joint equations (issue 18 §3, rbjax/_engine/rank.py): the parallelogram
four-bar closed by four revolute joints (20 equations, rank 17) against its non-redundant
twin (the last hinge replaced by a PointOnLine: 17 independent equations, the same motion),
compile and run time separately, in the formulations that run it.

Where the equations are dependent, every step's Cholesky factorisation of the Schur complement
reports a deficient pivot and the solve takes the truncated eigendecomposition of S instead
(ScalableDAE, NewtonEuler); UdwadiaSchutte always uses an SVD. The twin never takes that
branch; it still pays for the pivot test, because a PointOnLine closes a loop (models
without a loop skip the test altogether). RK4, float64, dt = 1e-3, tilted gravity
(tests/test_redundant_loops.py builds the models).

    python benchmarks/redundant.py --json benchmarks/results/redundant_cpu.json [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)

import rbjax  # noqa: E402
from rbjax._engine import rank  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from free_body import compile_and_run, write_records  # noqa: E402
from test_redundant_loops import parallelogram  # noqa: E402

FORMULATIONS = {
    "ScalableDAE": rbjax.ScalableDAE(),
    "NewtonEuler": rbjax.NewtonEuler(),
    "UdwadiaSchutte": rbjax.UdwadiaSchutte(),
}
CASES = ((1, 2000), (64, 1000))  # (batch, steps)


def _batched(state, batch: int):
    """``batch`` copies of ``state`` (one compile; the same motion for every member)."""
    return jax.tree.map(lambda x: np.broadcast_to(np.asarray(x), (batch,) + x.shape), state)


def run_case(formulation, twin, batch, steps, repeats, tested=True):
    """One rollout timed; ``tested=False`` compiles it without the rank test (what a loop
    cost before redundant equations were handled), for the twin's overhead."""
    if not tested:
        rank.may_be_redundant, saved = (lambda model: False), rank.may_be_redundant
        try:
            return run_case(formulation, twin, batch, steps, repeats) | {"rank_test": False}
        finally:
            rank.may_be_redundant = saved
    jax.clear_caches()  # the rank test is decided at trace time: trace every case anew
    model, state = parallelogram(twin=twin, formulation=FORMULATIONS[formulation])
    state = _batched(state, batch)
    dt = np.asarray(1e-3)

    def call():
        traj = rbjax.rollout(model, state, dt, steps, save_every=steps)
        jax.block_until_ready(traj.q)
        return traj

    timing = compile_and_run(call, repeats)
    return {
        "problem": "parallelogram_twin" if twin else "parallelogram_redundant",
        "formulation": formulation,
        "rank_test": True,
        "rows": int(sum(model.joint_rows)),
        "batch": batch,
        "steps": steps,
        **timing,
        "us_per_step": 1e6 * timing["run_s"] / steps,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    records = []
    print(
        f"{'formulation':<15} {'B':>4} {'model':<20} {'rows':>4} {'compile s':>10} "
        f"{'run s':>8} {'µs/step':>8}"
    )
    for batch, steps in CASES:
        for formulation in FORMULATIONS:
            variants = [(True, False), (True, True), (False, True)]  # (twin, rank test)
            if formulation == "UdwadiaSchutte":
                variants = [(False, True)]  # the Schur formulations' twin is its baseline
            for twin, tested in variants:
                r = run_case(formulation, twin, batch, steps, args.repeats, tested)
                records.append(r)
                label = ("twin" if twin else "redundant") + ("" if tested else " (no test)")
                print(
                    f"{formulation:<15} {batch:>4} {label:<20} "
                    f"{r['rows']:>4} {r['compile_s']:>10.2f} {r['run_s']:>8.3f} "
                    f"{r['us_per_step']:>8.1f}"
                )
    base = {
        (r["formulation"], r["batch"]): r
        for r in records
        if r["problem"] == "parallelogram_twin" and r["rank_test"]
    }
    print("\nrun-time ratio twin with / without the rank test")
    for r in records:
        if r["problem"] == "parallelogram_twin" and not r["rank_test"]:
            ref = base[(r["formulation"], r["batch"])]
            print(f"  {r['formulation']:<15} B = {r['batch']:>3}: {ref['run_s'] / r['run_s']:.2f}")
    print("\nrun-time ratio redundant / twin (ScalableDAE twin for UdwadiaSchutte)")
    for r in records:
        if r["problem"] == "parallelogram_redundant":
            ref = base.get((r["formulation"], r["batch"])) or base[("ScalableDAE", r["batch"])]
            print(f"  {r['formulation']:<15} B = {r['batch']:>3}: {r['run_s'] / ref['run_s']:.2f}")
    write_records(records, args.json)


if __name__ == "__main__":
    main()
