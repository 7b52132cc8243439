"""Compile time as a first-class metric: trace, lower and compile seconds of every program a user
of a mechanism builds, with the peak memory of compiling and the size of the program.

For each model of benchmarks/models.py (free body, double pendulum, slider-crank, the 6-joint arm
with PD motors, N-link chains, the 22-body walker with one loop, 40 four-bars in series) and each
mode:

========== ==============================================================================
rollout     ``rbjax.rollout`` with RK4, saving the last state
multipliers the same with ``multipliers=True``
reactions   the same, then ``rbjax.reactions`` of the final state and multipliers
projected   ``Projected(RK4())``
implicit    ``ImplicitMidpoint()``
grad        reverse-mode gradient of a scalar loss of the final state in the model's leaves and
            the initial state (``eqx.filter_grad``)
jvp         forward-mode derivative of the final state along one tangent of the same inputs
========== ==============================================================================

every row runs in a fresh Python process (nothing cached in memory, the persistent compilation
cache off unless ``--cache``), times ``jax.jit(f).trace``, ``.lower()`` and ``.compile()``
separately, then one call of the compiled program (B = 1, 100 steps of 1 ms, float64). The
rollouts run with ``throw=False``: that is the program an eager ``rollout`` call compiles (its
failure check reads the result code on the host afterwards, outside the program). Peak
memory is the growth of the process's maximum resident set during the three stages; ``ops`` is
the number of lines of the lowered StableHLO program (its size: it should not grow with N).
``--cache DIR`` runs every row twice against a persistent compilation cache in DIR
(``rbjax.compilation_cache``): the first fills it, the second is the warm start.

    python benchmarks/compile.py --json benchmarks/results/compile.json [--quick]
    python benchmarks/compile.py --models pendulum_2,arm6 --modes rollout,grad
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = ("rollout", "multipliers", "reactions", "projected", "implicit", "grad", "jvp")
CHAINS = (2, 4, 8, 16, 32, 64, 128, 256)
MODELS = (
    ["free_body", "pendulum_2", "slider_crank", "arm6"]
    + [f"pendulum_{n}" for n in CHAINS[1:]]
    + ["walker", "fourbars_40"]
)
QUICK_MODELS = ["free_body", "pendulum_2", "slider_crank", "arm6", "pendulum_8", "walker"]
STEPS, DT = 100, 1e-3


def _program(name: str, mode: str):
    """(f, args): the jitted function of one row and its array arguments."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    import rbjax

    sys.path.insert(0, HERE)
    import models

    model, state = models.build(name)
    if mode in ("multipliers", "reactions", "projected") and not model.joints:
        return None
    integ = {"projected": rbjax.Projected(rbjax.RK4()), "implicit": rbjax.ImplicitMidpoint()}
    integrator = integ.get(mode, rbjax.RK4())
    arrays, static = eqx.partition(model, eqx.is_array)
    weights = jnp.linspace(0.5, 1.5, 7 * model.nb).reshape(model.nb, 7)

    def final(arr, st):
        m = eqx.combine(arr, static)
        mult = mode in ("multipliers", "reactions")
        tr = rbjax.rollout(
            m, st, DT, STEPS, integrator=integrator, save_every=STEPS, multipliers=mult, throw=False
        )
        if mode == "reactions":
            last = jax.tree.map(lambda x: x[-1], tr.states)
            return rbjax.reactions(m, last, tr.lam[-1]).force_i
        return tr.q[-1], tr.u[-1]

    def loss(arr, st):
        q, u = final(arr, st)
        return jnp.sum(weights * q) + jnp.sum(weights * u)

    if mode == "grad":
        return jax.grad(loss, argnums=(0, 1)), (arrays, state)
    if mode == "jvp":
        tangents = jax.tree.map(jnp.ones_like, (arrays, state))
        return lambda a, s: jax.jvp(final, (a, s), tangents), (arrays, state)
    return final, (arrays, state)


def row(name: str, mode: str, cache: str | None) -> dict:
    """One measurement, in this (fresh) process."""
    import jax

    jax.config.update("jax_enable_x64", True)
    if cache:
        import rbjax

        rbjax.compilation_cache(cache)
    t0 = time.perf_counter()
    built = _program(name, mode)
    if built is None:
        return {}
    fn, args = built
    build_s = time.perf_counter() - t0
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    traced = jax.jit(fn).trace(*args)
    t1 = time.perf_counter()
    lowered = traced.lower()
    t2 = time.perf_counter()
    compiled = lowered.compile()
    t3 = time.perf_counter()
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    jax.block_until_ready(compiled(*args))
    t4 = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    run_s = time.perf_counter() - t4
    return {
        "model": name,
        "mode": mode,
        "bodies": int(args[1].q.shape[-2]),
        "build_s": build_s,
        "trace_s": t1 - t0,
        "lower_s": t2 - t1,
        "compile_s": t3 - t2,
        "total_s": t3 - t0,
        "peak_mib": (rss1 - rss0) / 1024.0,
        "ops": lowered.as_text().count("\n"),
        "run_s": run_s,
        "steps": STEPS,
        "cache": "warm" if cache else "off",
    }


def _spawn(name, mode, cache, timeout):
    cmd = [sys.executable, __file__, "--row", f"{name}:{mode}"] + (
        ["--cache", cache] if cache else []
    )
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"model": name, "mode": mode, "error": f"over {timeout} s"}
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode or not lines:
        tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["?"]
        return {"model": name, "mode": mode, "error": tail[0][:200]}
    return json.loads(lines[-1])


def table(records) -> str:
    head = "| model | bodies | mode | trace s | lower s | compile s | total s | peak MiB | ops | run s |"
    lines = [head, "|" + "---|" * 10]
    for r in records:
        if "error" in r:
            lines.append(f"| {r['model']} | | {r['mode']} | {r['error']} ||||||")
            continue
        warm = " (warm)" if r.get("cache") == "warm" else ""
        lines.append(
            f"| {r['model']} | {r['bodies']} | {r['mode']}{warm} | {r['trace_s']:.2f} | "
            f"{r['lower_s']:.2f} | {r['compile_s']:.2f} | {r['total_s']:.2f} | "
            f"{r['peak_mib']:.0f} | {r['ops']} | {r['run_s']:.3g} |"
        )
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write the records here")
    ap.add_argument("--models", help="comma-separated names (default: all)")
    ap.add_argument("--modes", help=f"comma-separated, of {','.join(MODES)}")
    ap.add_argument("--quick", action="store_true", help="small models only")
    ap.add_argument("--cache", help="persistent cache directory: also measure the warm start")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per row")
    ap.add_argument("--row", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.row:
        name, mode = args.row.split(":")
        print(json.dumps(row(name, mode, args.cache)))
        return []
    names = args.models.split(",") if args.models else QUICK_MODELS if args.quick else MODELS
    modes = args.modes.split(",") if args.modes else MODES
    sys.path.insert(0, HERE)
    from free_body import write_records

    records = []
    for name in names:
        for mode in modes:
            rec = _spawn(name, mode, None, args.timeout)
            if rec:
                records.append(rec)
                print(table([rec]).splitlines()[-1], flush=True)
            if args.cache and rec and "error" not in rec:
                _spawn(name, mode, args.cache, args.timeout)  # fills the cache
                warm = _spawn(name, mode, args.cache, args.timeout)
                records.append(warm)
                print(table([warm]).splitlines()[-1], flush=True)
            if args.json:  # after every row: a run stopped from outside keeps what it measured
                with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
                    write_records(records, args.json)
    write_records(records, args.json)
    print(table(records))
    return records


if __name__ == "__main__":
    main()
