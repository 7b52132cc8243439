"""Free-body throughput: B torque-free bodies, I = diag(1, 2, 3), ω0 = (0.01, 5, 0) rad/s.

Runs ``rbjax.rollout`` (one jit boundary, lax.scan over 2000 steps of dt = 1e-3, batch on the
minor axis internally) for each integrator, formulation, dtype and batch size. Compile time
(first call minus one run) and run time (median of repeated calls) are reported separately.

    python benchmarks/free_body.py --json benchmarks/results/free_body.json [--quick]

Writes a JSON list of records with keys problem, integrator, formulation, dtype, batch, steps,
body_steps_per_s, compile_s, run_s (+ machine info) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import rbjax  # noqa: E402

INTEGRATORS = {
    "RK4": rbjax.RK4,
    "SemiImplicitEuler": rbjax.SemiImplicitEuler,
    "ImplicitMidpoint": rbjax.ImplicitMidpoint,
}
FORMULATIONS = {
    "NewtonEuler": rbjax.NewtonEuler,
    "ScalableDAE": rbjax.ScalableDAE,
    "UdwadiaSchutte": rbjax.UdwadiaSchutte,
}


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "python": platform.python_version(),
    }


def compile_and_run(call, repeats: int) -> dict:
    """Time ``call`` (which blocks until its result is ready): ``compile_s`` = the first call
    minus the median of ``repeats`` further calls (``run_s``; all of them in ``runs_s``)."""
    t0 = time.perf_counter()
    call()
    first = time.perf_counter() - t0
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        runs.append(time.perf_counter() - t0)
    run = statistics.median(runs)
    return {"compile_s": first - run, "run_s": run, "runs_s": runs}


def write_records(records: list, path: str | None) -> list:
    """Stamp every new record with the machine (records kept from an earlier run keep theirs),
    print it and write the JSON list to ``path``."""
    info = machine()
    for r in records:
        r.setdefault("machine", info)
    print(f"machine: {info}")
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as fh:
            json.dump(records, fh, indent=1)
        print(f"wrote {len(records)} records to {path}")
    return records


def write_run(records: list, path: str) -> None:
    """Write ``{"meta": {machine, python, jax}, "records": records}`` to ``path`` (the format
    of the scripts whose rows run in fresh processes: one machine stamp per file)."""
    meta = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "jax": jax.__version__,
    }
    with open(path, "w") as fh:
        json.dump({"meta": meta, "records": records}, fh, indent=1)


def run_case(integrator, formulation, dtype, batch, steps, dt, repeats):
    model = rbjax.Model(
        rbjax.Body(jnp.asarray(1.0, dtype), jnp.diag(jnp.asarray([1.0, 2.0, 3.0], dtype))),
        formulation=FORMULATIONS[formulation](),
    )
    omega = np.tile(np.array([0.01, 5.0, 0.0]), (batch, 1))[:, None, :]
    state = rbjax.make_state(omega_body=omega, dtype=dtype)
    integ = INTEGRATORS[integrator]()

    def call():
        traj = rbjax.rollout(model, state, dt, steps, integrator=integ, save_every=steps)
        jax.block_until_ready(traj.q)
        return traj

    t0 = time.perf_counter()
    traj = call()
    first = time.perf_counter() - t0
    if first > 5.0:
        repeats = min(repeats, 2)  # slow reference cases: fewer repeats
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        runs.append(time.perf_counter() - t0)
    run_s = statistics.median(runs)
    w = np.asarray(traj.u[..., -1, 0, 4:7])
    assert np.all(np.isfinite(w)), "non-finite result"
    return {
        "problem": "free_body",
        "integrator": integrator,
        "formulation": formulation,
        "dtype": jnp.dtype(dtype).name,
        "batch": batch,
        "steps": steps,
        "dt": dt,
        "body_steps_per_s": batch * steps / run_s,
        "compile_s": max(first - run_s, 0.0),
        "run_s": run_s,
        "repeats": repeats,
    }


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--json", default=None, help="write records to this path")
    p.add_argument("--quick", action="store_true", help="small subset (smoke test)")
    p.add_argument("--batches", default="1,64,1024,8192")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    cases = []
    for dtype in (jnp.float64, jnp.float32):
        for integ in INTEGRATORS:
            forms = (
                ["NewtonEuler", "ScalableDAE", "UdwadiaSchutte"]
                if integ == "RK4"
                else ["NewtonEuler", "ScalableDAE"]
            )
            for form in forms:
                for b in batches:
                    cases.append((integ, form, dtype, b))
    if args.quick:
        cases = [
            (i, f, d, b)
            for (i, f, d, b) in cases
            if b <= 64 and d == jnp.float64 and f == "NewtonEuler"
        ]
        args.steps, args.repeats = 200, 2
    records = []
    head = f"{'integrator':18s} {'formulation':15s} {'dtype':8s} {'batch':>6s} {'M body-steps/s':>15s} {'compile s':>10s} {'run s':>8s}"
    print(head)
    print("-" * len(head))
    for integ, form, dtype, b in cases:
        steps = args.steps
        if integ == "ImplicitMidpoint" and b > 1024:
            continue  # dense Newton per system (15 nb unknowns): reported up to B = 1024
        if form == "UdwadiaSchutte" and b > 1024:
            continue  # 4x4 Cholesky + solves per body: a reference formulation, not a fast path
        rec = run_case(integ, form, dtype, b, steps, 1e-3, args.repeats)
        records.append(rec)
        print(
            f"{integ:18s} {form:15s} {rec['dtype']:8s} {b:6d} {rec['body_steps_per_s'] / 1e6:15.2f} "
            f"{rec['compile_s']:10.2f} {rec['run_s']:8.4f}",
            flush=True,
        )
    return write_records(records, args.json)


if __name__ == "__main__":
    main()
