"""The Monte-Carlo runner against a bare batched rollout, over devices, memory and resume.

Two workloads (float64, RK4): tumbling bodies (the flips example's sampler, 1000 steps of
2 ms) and heavy tops on a Spherical joint (the tops example's sampler, 500 steps of 2 ms).

* ``throughput``: the same batch integrated by ``rbjax.rollout`` (the batch built from the
  sampler, only the final state kept; a plain-JAX reference for the runner's peer) and by
  ``rbjax.monte_carlo`` on one device, with a single ``Final`` measure (the runner's own
  cost: sampling, sharding, gathering, statistics) and with the examples' measures (located
  events or maxima, energy monitors). Compile and run seconds apart; medians of repeats.
* ``scaling``: samples/s of the runner on 1, 2 and 4 CPU devices (``jax_num_cpu_devices``).
* ``memory``: peak resident memory of a fresh process running 10⁴, 10⁵ and 10⁶ bodies (20
  steps: memory does not depend on the horizon), keeping every sample's values or only the
  statistics.
* ``resume``: a run written to disk against the same run in memory, and resuming a finished
  run (every chunk read back and verified) or a half-finished one.
* ``precision``: the same bodies in float32 and float64 (parameters drawn in float64): the
  located flip times and the statistics.

    python benchmarks/monte_carlo.py --json benchmarks/results/monte_carlo.json [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import jax

if __name__ == "__main__":  # before anything touches JAX: 2 devices in a memory child
    jax.config.update("jax_num_cpu_devices", 2 if "--child" in sys.argv else 4)
jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402

import rbjax  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
sys.path.insert(0, HERE)
import monte_carlo_flips as flips  # noqa: E402
import monte_carlo_top as tops  # noqa: E402
from free_body import write_run  # noqa: E402

WORKLOADS = {
    # name: (sampler, example measures, dt, steps, batch of the bare rollout = one chunk)
    "bodies": (
        flips.sample,
        {
            "flip": rbjax.Event(lambda m, s: s.u[0, 5], direction=-1),
            "energy_drift": rbjax.Drift(lambda m, s: rbjax.kinetic_energy(m, s), limit=1e-8),
        },
        2e-3,
        1000,
        4096,
    ),
    "tops": (
        tops.sample,
        {
            "max_nutation": rbjax.Maximum(tops.nutation, located=True),
            "energy_drift": rbjax.Drift(lambda m, s: rbjax.total_energy(m, s), limit=1e-7),
        },
        2e-3,
        500,
        256,
    ),
}
FINAL = {"final_q": rbjax.Final(lambda m, s: s.q)}


def _median(xs):
    return float(statistics.median(xs))


def _bare_call(name):
    """A timed call of ``rollout`` on the sampler's batch (built once, outside the timing)."""
    sample, _, dt, steps, batch = WORKLOADS[name]
    key = jax.random.key(0)
    ids = jnp.arange(batch, dtype=jnp.int32)
    model, state = jax.vmap(lambda i: sample(jax.random.fold_in(key, i), i))(ids)
    # leaves that do not vary are taken from the first sample (as the runner does)
    model = jax.tree.map(lambda x: x[0] if jnp.all(x == x[:1]) else x, model)

    def call():
        t0 = time.perf_counter()
        traj = rbjax.rollout(model, state, dt, steps, save_every=steps)
        jax.block_until_ready(traj.q)
        return time.perf_counter() - t0

    return call


def _runner_call(name, measures, devices, n_chunks=4):
    """A call of the runner on ``n_chunks`` chunks of the bare rollout's batch: samples/s."""
    sample, _, dt, steps, batch = WORKLOADS[name]
    calls = iter(range(10**6))

    def call():
        r = rbjax.monte_carlo(
            sample, batch * n_chunks, dt, steps, measures, key=next(calls), devices=devices,
            chunk_size=batch, progress=False,
        )  # fmt: skip
        return r.timing

    return call


def runner(name, measures, devices, repeats):
    call = _runner_call(name, measures, devices)
    out = [call() for _ in range(repeats + 1)]  # the first compiles (or reuses a program)
    return {
        "compile_s": out[0]["compile_s"],
        "samples_per_s": _median([t["samples_per_s"] for t in out[1:]]),
    }


def throughput(repeats):
    """Bare rollout and runner timed in alternation, round after round (this machine changes
    speed between processes and over minutes); the ratios are medians of per-round ratios."""
    rows = []
    for name, (_, measures, _dt, steps, batch) in WORKLOADS.items():
        bare = _bare_call(name)
        plain = _runner_call(name, FINAL, 1)
        full = _runner_call(name, measures, 1)
        first = bare()
        compile_plain, compile_full = plain()["compile_s"], full()["compile_s"]
        rounds = []
        for _ in range(max(repeats, 5)):
            b = batch / bare()
            rounds.append((b, plain()["samples_per_s"], full()["samples_per_s"]))
        ref = _median([r[0] for r in rounds])
        rows.append(
            {
                "workload": name, "batch": batch, "steps": steps, "rounds": len(rounds),
                "rollout_first_call_s": first,
                "rollout_samples_per_s": ref,
                "runner_final_compile_s": compile_plain,
                "runner_final_samples_per_s": _median([r[1] for r in rounds]),
                "runner_measures_compile_s": compile_full,
                "runner_measures_samples_per_s": _median([r[2] for r in rounds]),
                "ratio_final": _median([r[1] / r[0] for r in rounds]),
                "ratio_measures": _median([r[2] / r[0] for r in rounds]),
            }
        )  # fmt: skip
        r = rows[-1]
        print(
            f"  {name:7s} B={batch:5d} rollout {ref:8.0f} /s | runner Final "
            f"{r['runner_final_samples_per_s']:8.0f} /s ({r['ratio_final']:.2f}x) | measures "
            f"{r['runner_measures_samples_per_s']:8.0f} /s ({r['ratio_measures']:.2f}x)",
            flush=True,
        )
    return rows


def scaling(repeats):
    rows = []
    for name, (_, measures, *_rest) in WORKLOADS.items():
        for devices in (1, 2, 4):
            r = runner(name, measures, devices, repeats)
            rows.append({"workload": name, "devices": devices, **r})
            print(
                f"  {name:7s} {devices} device(s): {r['samples_per_s']:8.0f} samples/s", flush=True
            )
    return rows


def child_memory(n, keep):
    """(in a fresh process with 2 CPU devices) peak RSS of a run of n bodies, 20 steps."""
    sample, measures, dt, _, _ = WORKLOADS["bodies"]
    t0 = time.perf_counter()
    result = rbjax.monte_carlo(
        sample, n, dt, 20, measures, key=0, chunk_size=16384, keep_samples=keep, progress=False
    )
    wall = time.perf_counter() - t0
    assert result.n_samples == n
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB on Linux
    with open("/proc/self/status") as fh:  # resident now, with the result still held
        now = next(int(x.split()[1]) for x in fh if x.startswith("VmRSS")) / 1024
    row = {"samples": n, "keep_samples": keep, "peak_rss_mib": rss, "end_rss_mib": now}
    print(json.dumps(row | {"wall_s": wall}))


def memory(sizes):
    rows = []
    for keep in (True, False):
        for n in sizes:
            cmd = [sys.executable, __file__, "--child", "memory", str(n), str(int(keep))]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            row = json.loads(out.strip().splitlines()[-1])
            rows.append(row)
            print(
                f"  {n:8d} samples, keep_samples={keep!s:5s}: peak RSS "
                f"{row['peak_rss_mib']:7.0f} MiB, at the end {row['end_rss_mib']:7.0f} MiB "
                f"({row['wall_s']:.0f} s)",
                flush=True,
            )
    return rows


def resume(n):
    sample, measures, dt, _, batch = WORKLOADS["bodies"]
    steps = 200
    common = dict(key=0, chunk_size=batch, progress=False)
    rbjax.monte_carlo(sample, n, dt, steps, measures, **common)  # compile (cached after)
    t0 = time.perf_counter()
    rbjax.monte_carlo(sample, n, dt, steps, measures, **common)
    memory_s = time.perf_counter() - t0
    d = tempfile.mkdtemp()
    try:
        t0 = time.perf_counter()
        rbjax.monte_carlo(sample, n, dt, steps, measures, directory=d, **common)
        disk_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        r = rbjax.monte_carlo(sample, n, dt, steps, measures, directory=d, resume=True, **common)
        read_s = time.perf_counter() - t0
        assert not r.chunks_computed
        manifest = json.load(open(os.path.join(d, "manifest.json")))
        chunks = sorted(manifest["chunks"], key=int)
        for c in chunks[len(chunks) // 2 :]:
            del manifest["chunks"][c]
        with open(os.path.join(d, "manifest.json"), "w") as fh:
            json.dump(manifest, fh)
        t0 = time.perf_counter()
        rbjax.monte_carlo(sample, n, dt, steps, measures, directory=d, resume=True, **common)
        half_s = time.perf_counter() - t0
    finally:
        shutil.rmtree(d)
    row = {
        "samples": n, "steps": steps, "in_memory_s": memory_s, "to_disk_s": disk_s,
        "resume_complete_s": read_s, "resume_half_s": half_s,
    }  # fmt: skip
    print(
        f"  {n} bodies x {steps} steps: in memory {memory_s:.2f} s, to disk {disk_s:.2f} s "
        f"(+{100 * (disk_s / memory_s - 1):.0f} %), resume complete {read_s:.2f} s, "
        f"resume half {half_s:.2f} s",
        flush=True,
    )
    return [row]


def precision(n):
    """The same bodies (parameters drawn in float64, then rounded) integrated in float32 and
    float64: statistics of the located first-flip time and of the energy drift."""
    import equinox as eqx
    import numpy as np

    def sampler(dtype):
        base = rbjax.Model(
            rbjax.Body(jnp.asarray(1.0, dtype), jnp.eye(3, dtype=dtype)),
            formulation=rbjax.NewtonEuler(),
        )

        def sample(key, i):
            inertia, w = flips.draw(key)
            model = eqx.tree_at(lambda m: m.inertia, base, jnp.diag(inertia).astype(dtype)[None])
            q = jnp.array([[0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]], dtype)
            u = jnp.concatenate([jnp.zeros(4), w]).astype(dtype)[None]
            return model, rbjax.State(t=jnp.zeros((), dtype), q=q, u=u)

        return sample

    measures = {
        "flip": rbjax.Event(lambda m, s: s.u[0, 5], direction=-1),
        "energy_drift": rbjax.Drift(lambda m, s: rbjax.kinetic_energy(m, s)),
    }
    out = {}
    for name, dtype in (("float64", jnp.float64), ("float32", jnp.float32)):
        out[name] = rbjax.monte_carlo(
            sampler(dtype), n, 2e-3, 2000, measures, key=0, progress=False
        )
    a, b = out["float64"], out["float32"]
    assert a.samples is not None and b.samples is not None
    fa, fb = a.samples["flip"], b.samples["flip"].astype(np.float64)
    both = np.isfinite(fa) & np.isfinite(fb)
    sa, sb = a.statistics["flip"], b.statistics["flip"]
    row = {
        "samples": n,
        "flip_max_abs_diff_s": float(np.abs(fa - fb)[both].max()),
        "flip_median_abs_diff_s": float(np.median(np.abs(fa - fb)[both])),
        "flip_seen_float64": int(sa.count), "flip_seen_float32": int(sb.count),
        "flip_mean_float64": float(sa.mean), "flip_mean_float32": float(sb.mean),
        "flip_std_float64": float(sa.std), "flip_std_float32": float(sb.std),
        "energy_drift_max_float64": float(a.statistics["energy_drift"].max),
        "energy_drift_max_float32": float(b.statistics["energy_drift"].max),
        "failed_float32": b.n_failed,
    }  # fmt: skip
    print(
        f"  {n} bodies, flip time float32 vs float64: max |Δ| {row['flip_max_abs_diff_s']:.1e} s,"
        f" median {row['flip_median_abs_diff_s']:.1e} s; mean {sa.mean:.6f} vs {sb.mean:.6f} s,"
        f" std {sa.std:.6f} vs {sb.std:.6f} s; energy drift max "
        f"{row['energy_drift_max_float64']:.1e} vs {row['energy_drift_max_float32']:.1e}",
        flush=True,
    )
    return [row]


def _md(columns, lines) -> str:
    """A markdown table: the header ``columns`` and one row per string of ``lines``."""
    head = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
    return head + "\n".join(f"| {line} |" for line in lines)


def tables(records) -> str:
    """The sections of a results file as markdown tables (also used by benchmarks/table.py)."""
    sec = {r["section"]: r["rows"] for r in records}
    out = []
    if rows := sec.get("throughput"):
        cols = ["workload", "B", "steps", "rollout samples/s", "runner, `Final` only", "ratio",
                "runner, example measures", "ratio", "runner compile s (Final / measures)"]  # fmt: skip
        out.append(_md(cols, (
            f"{r['workload']} | {r['batch']} | {r['steps']} | {r['rollout_samples_per_s']:.0f} | "
            f"{r['runner_final_samples_per_s']:.0f} | {r['ratio_final']:.2f} | "
            f"{r['runner_measures_samples_per_s']:.0f} | {r['ratio_measures']:.2f} | "
            f"{r['runner_final_compile_s']:.1f} / {r['runner_measures_compile_s']:.1f}"
            for r in rows
        )))  # fmt: skip
    if rows := sec.get("scaling"):
        out.append(_md(["workload", "devices", "samples/s", "compile s"], (
            f"{r['workload']} | {r['devices']} | {r['samples_per_s']:.0f} | {r['compile_s']:.1f}"
            for r in rows
        )))  # fmt: skip
    if rows := sec.get("memory"):
        out.append(_md(["samples", "keep_samples", "peak RSS MiB", "RSS at the end MiB", "wall s"], (
            f"{r['samples']} | {r['keep_samples']} | {r['peak_rss_mib']:.0f} | "
            f"{r.get('end_rss_mib', float('nan')):.0f} | {r['wall_s']:.1f}"
            for r in rows
        )))  # fmt: skip
    if rows := sec.get("resume"):
        cols = ["samples × steps", "in memory s", "to disk s", "resume, complete s",
                "resume, half s"]  # fmt: skip
        out.append(_md(cols, (
            f"{r['samples']} × {r['steps']} | {r['in_memory_s']:.2f} | {r['to_disk_s']:.2f} | "
            f"{r['resume_complete_s']:.2f} | {r['resume_half_s']:.2f}"
            for r in rows
        )))  # fmt: skip
    if rows := sec.get("precision"):
        cols = ["samples", "flip time max / median \\|Δ\\| s", "mean f64 / f32 s",
                "std f64 / f32 s", "energy drift max f64 / f32 J", "failed f32"]  # fmt: skip
        out.append(_md(cols, (
            f"{r['samples']} | {r['flip_max_abs_diff_s']:.1e} / "
            f"{r['flip_median_abs_diff_s']:.1e} | {r['flip_mean_float64']:.6f} / "
            f"{r['flip_mean_float32']:.6f} | {r['flip_std_float64']:.6f} / "
            f"{r['flip_std_float32']:.6f} | {r['energy_drift_max_float64']:.1e} / "
            f"{r['energy_drift_max_float32']:.1e} | {r['failed_float32']}"
            for r in rows
        )))  # fmt: skip
    return "\n\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="fewer repeats, smaller sizes")
    ap.add_argument("--child", nargs="*", default=None, help=argparse.SUPPRESS)
    ap.add_argument(
        "--sections", nargs="*", default=None,
        help="run only these (throughput scaling memory resume precision); with --json, "
        "replace them in an existing results file",
    )  # fmt: skip
    args = ap.parse_args(argv)
    if args.child:
        return child_memory(int(args.child[1]), bool(int(args.child[2])))
    repeats = 2 if args.quick else 3
    sizes = (10_000, 100_000) if args.quick else (10_000, 100_000, 1_000_000)
    print(f"devices: {jax.devices()}", flush=True)
    runs = {
        "throughput": lambda: throughput(repeats),
        "scaling": lambda: scaling(repeats),
        "memory": lambda: memory(sizes),
        "resume": lambda: resume(20_000 if args.quick else 100_000),
        "precision": lambda: precision(4096 if args.quick else 20_000),
    }
    results = {}
    for name, run in runs.items():
        if args.sections is None or name in args.sections:
            print(f"{name}:", flush=True)
            results[name] = run()
    if args.sections is not None and args.json and os.path.exists(args.json):
        with open(args.json) as fh:
            old = {r["section"]: r["rows"] for r in json.load(fh)["records"]}
        results = {k: results.get(k, old.get(k)) for k in runs if k in results or k in old}
    records = [{"section": k, "rows": v} for k, v in results.items()]
    print(tables(records))
    if args.json:
        write_run(records, args.json)


if __name__ == "__main__":
    main()
