"""Constrained dynamics of N-link chains: the Schur-complement solvers side by side.

For a chain of N rods (benchmarks/models.py ``pendulum_N``: revolute joints, 5 rows each), RK4 at
dt = 1e-3, float64, batch B: compile seconds and run time per step of the rollout with the Schur
complement S = W̃ M⁻¹ W̃ᵀ solved by each factorisation of rbjax/_engine/joints.py:

* ``dense``: one LAPACK Cholesky of the assembled S (O(N³));
* ``block``: block Cholesky of S, unrolled into scalar operations up to 80 rows and one batched
  LAPACK call per block above (rbjax/_engine/blockchol.py);
* ``tree``: the elimination along the joint graph, a ``lax.scan`` over the levels of the
  spanning tree (rbjax/_engine/elimination.py);
* ``auto``: what rbjax chooses (``rbjax._engine.schur.method``);
* ``mujoco-c``: when the ``mujoco`` package is installed (the ``bench`` extra), the same chain in
  MuJoCo's C engine (hinge joints in reduced coordinates, RK4, ``mujoco.rollout`` on all cores),
  the peer measured in the same run.

Each row runs in a fresh process (compile times are not shared). ``--models walker`` adds
other models of benchmarks/models.py (MuJoCo runs their MJCF twins, ``models.mjcf``);
``--devices 2`` splits rbjax batches of at least 64 per device over host CPU devices (one per
core, as MuJoCo's rollout uses one thread per core); the table ends with the fitted exponent of
the cost per system-step against N. ``--linkage K,T`` adds the K-four-bar linkage under
``Projected(RK4)`` for T seconds of simulated time (wall time with compile, largest joint
residual): issue 14's 40-loop target.

    python benchmarks/elimination.py --json benchmarks/results/elimination.json
    python benchmarks/elimination.py --links 4,8,16,32,64,128,256 --models walker \
        --batches 64,1024 --methods auto,mujoco --devices 2 --steps 10 --linkage 40,20 \
        --json benchmarks/results/scaling.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def mujoco_row(name: str, batch: int, steps: int) -> dict:
    """A model of benchmarks/models.py with an MJCF twin (``models.mjcf``: the N-link chains and
    the walker) in MuJoCo C: joint coordinates, RK4, ``mujoco.rollout`` on all cores."""
    import mujoco
    import numpy as np
    from mujoco import rollout as mj_rollout

    sys.path.insert(0, HERE)
    import models

    m = mujoco.MjModel.from_xml_string(models.mjcf(name))
    spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
    d = mujoco.MjData(m)
    s0 = np.zeros(mujoco.mj_stateSize(m, spec))
    mujoco.mj_getState(m, d, s0, spec)
    init = np.tile(s0, (batch, 1))
    nthread = os.cpu_count() or 1
    datas = [mujoco.MjData(m) for _ in range(nthread)]

    def call():
        return mj_rollout.rollout(m, datas, init, nstep=steps, persistent_pool=True)

    call()
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        call()
        runs.append(time.perf_counter() - t0)
    step_s = statistics.median(runs) / steps
    return {
        "model": name,
        "bodies": m.nbody - 1,
        "rows": None,
        "dof": m.nv,
        "batch": batch,
        "method": f"mujoco-c ({nthread} threads)",
        "chosen": "",
        "devices": 1,
        "compile_s": 0.0,
        "us_per_step": 1e6 * step_s,
        "us_per_system_step": 1e6 * step_s / batch,
    }


def row(name: str, batch: int, method: str, steps: int, devices: int = 1) -> dict:
    """One rbjax row in this (fresh) process: compile seconds and the median run time per step.
    ``devices`` > 1 splits a batch of at least 64 per device over that many host CPU devices
    (``eqx.filter_pmap``, one per core, as MuJoCo's rollout uses one thread per core)."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    sys.path.insert(0, HERE)
    import models

    import rbjax
    from rbjax._engine import schur

    schur.FORCE_METHOD = None if method == "auto" else method
    model, state = models.build(name)
    if batch > 1:
        state = jax.tree.map(lambda x: jnp.broadcast_to(x, (batch,) + jnp.shape(x)), state)
    arrays, static = eqx.partition(model, eqx.is_array)
    devices = devices if batch % devices == 0 and batch >= 64 * devices else 1

    def final(arr, st):
        tr = rbjax.rollout(eqx.combine(arr, static), st, 1e-3, steps, save_every=steps, throw=False)
        return tr.q[..., -1, :, :]

    t0 = time.perf_counter()
    if devices > 1:
        split = jax.tree.map(lambda x: x.reshape((devices, batch // devices) + x.shape[1:]), state)
        run = jax.pmap(final, in_axes=(None, 0))
        jax.block_until_ready(run(arrays, split))

        def call():
            return run(arrays, split)
    else:
        compiled = jax.jit(final).lower(arrays, state).compile()
        jax.block_until_ready(compiled(arrays, state))

        def call():
            return compiled(arrays, state)

    compile_s = time.perf_counter() - t0  # devices > 1: includes one run
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        jax.block_until_ready(call())
        runs.append(time.perf_counter() - t0)
    step_s = statistics.median(runs) / steps
    if devices > 1:
        compile_s -= step_s * steps
    rows = sum(model.joint_rows)
    return {
        "model": name,
        "bodies": int(model.mass.shape[-1]),
        "rows": rows,
        "batch": batch,
        "method": method,
        "chosen": schur.method(model.topology, rows, batch // devices),
        "devices": devices,
        "compile_s": compile_s,
        "us_per_step": 1e6 * step_s,
        "us_per_system_step": 1e6 * step_s / batch,
    }


def linkage(k: int, t_end: float, dt: float) -> dict:
    """The planar linkage of ``k`` four-bar loops (``models.fourbars``) under Projected(RK4)
    for ``t_end`` seconds of simulated time: wall time including compile, and the largest
    joint residual over the run (issue 14: 40 loops, 20 s at dt = 1e-3, held to 1e-10, in
    under a minute)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    sys.path.insert(0, HERE)
    import models

    import rbjax
    from rbjax._engine import schur

    t0 = time.perf_counter()
    model, state = models.build(f"fourbars_{k}")
    build_s = time.perf_counter() - t0  # the model and rbjax.assemble of its initial state
    n = round(t_end / dt)
    every = max(1, n // 200)
    tr = rbjax.rollout(
        model, state, dt, n, integrator=rbjax.Projected(rbjax.RK4()), save_every=every
    )
    jax.block_until_ready(tr.q)
    wall_s = time.perf_counter() - t0
    from rbjax.advanced import constraint_residual

    def residual(q, t):
        return jnp.concatenate([constraint_residual(j, q, t) for j in model.joints])

    worst = float(np.max(np.abs(np.asarray(jax.jit(jax.vmap(residual))(tr.q, tr.t)))))
    return {
        "model": f"fourbars_{k}",
        "bodies": int(model.mass.shape[-1]),
        "rows": sum(model.joint_rows),
        "batch": 1,
        "method": "Projected(RK4)",
        "chosen": schur.method(model.topology, sum(model.joint_rows), 1),
        "build_s": build_s,
        "steps": n,
        "dt": dt,
        "wall_s": wall_s,
        "max_residual": worst,
    }


def _model(r) -> str:
    return r.get("model", f"pendulum_{r['bodies']}")  # records before the walker rows


def table(records) -> str:
    """Every row; the linkage rows and the fitted cost exponents below them."""
    head = "| model | bodies | rows | B | solver | compile s | µs / step | µs / system-step |"
    lines = [head, "|" + "---|" * 8]
    for r in records:
        if "wall_s" in r:
            continue
        name = r["method"] if r["method"] != "auto" else f"auto ({r['chosen']})"
        if r.get("devices", 1) > 1:
            name += f" on {r['devices']} devices"
        compile_s = f"{r['compile_s']:.1f}" if not r["method"].startswith("mujoco") else "—"
        rows = r["rows"] if r["rows"] is not None else f"({r.get('dof', '?')} dof)"
        lines.append(
            f"| {_model(r)} | {r['bodies']} | {rows} | {r['batch']} | {name} | {compile_s} | "
            f"{r['us_per_step']:.0f} | {r['us_per_system_step']:.1f} |"
        )
    fits = exponents(records)
    if fits:
        lines += ["", "| solver | B | N | fitted exponent p (cost ∝ N^p) |", "|---|---|---|---|"]
        lines += [f"| {m} | {b} | {lo}–{hi} | {p:.2f} |" for (m, b), (p, lo, hi) in fits.items()]
    link = [r for r in records if "wall_s" in r]
    if link:
        lines += [
            "",
            "| linkage | bodies | rows | integrator | steps | wall s (with compile) | "
            "max joint residual |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in link:
            lines.append(
                f"| {r['model']} | {r['bodies']} | {r['rows']} | {r['method']} | {r['steps']} | "
                f"{r['wall_s']:.1f} | {r['max_residual']:.1e} |"
            )
    return "\n".join(lines)


def exponents(records) -> dict:
    """Least-squares slope of log(cost per system-step) against log(N) over the chains with
    N ≥ 4, per solver and batch (the issue's "fitted cost exponent")."""
    import numpy as np

    groups: dict = {}
    for r in records:
        if "wall_s" in r or not _model(r).startswith("pendulum_") or r["bodies"] < 4:
            continue
        key = (r["method"] if r["method"] != "auto" else "auto", r["batch"])
        groups.setdefault(key, []).append((r["bodies"], r["us_per_system_step"]))
    out = {}
    for key, pts in groups.items():
        if len({n for n, _ in pts}) >= 3:
            n, c = np.log(np.array(pts)).T
            out[key] = (
                float(np.polyfit(n, c, 1)[0]),
                min(p[0] for p in pts),
                max(p[0] for p in pts),
            )
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", default=None)
    p.add_argument("--links", default="8,16,32,64,128", help="N of the N-link chains")
    p.add_argument("--models", default="", help="other models of benchmarks/models.py (walker)")
    p.add_argument("--batches", default="1,64")
    p.add_argument("--methods", default="dense,block,tree,mujoco")
    p.add_argument("--devices", type=int, default=1, help="host CPU devices for rbjax rows")
    p.add_argument("--append", action="store_true", help="add to the records in --json")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--linkage", default="", help="K,T: the K-four-bar linkage for T s (e.g. 40,20)")
    p.add_argument("--row", nargs=3, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.row:
        name, b, m = args.row
        if m == "mujoco":
            rec = mujoco_row(name, int(b), args.steps)
        elif m == "linkage":
            rec = linkage(int(name), float(b), 1e-3)
        else:
            rec = row(name, int(b), m, args.steps, args.devices)
        print(json.dumps(rec))
        return
    records = []
    if args.append and args.json and os.path.exists(args.json):
        with open(args.json) as fh:
            records = json.load(fh)["records"]
    names = [f"pendulum_{n}" for n in args.links.split(",") if n]
    names += [n for n in args.models.split(",") if n]
    jobs = [
        (name, b, m)
        for b in [int(x) for x in args.batches.split(",")]
        for name in names
        for m in args.methods.split(",")
    ]
    if args.linkage:
        k, t_end = args.linkage.split(",")
        jobs.append((k, t_end, "linkage"))
    for name, b, m in jobs:
        if m == "dense" and name.startswith("pendulum_") and int(name.split("_")[1]) * 5 > 400:
            continue  # O(N³): minutes per call
        env = dict(os.environ)
        if args.devices > 1 and m not in ("mujoco", "linkage"):
            flag = f"--xla_force_host_platform_device_count={args.devices}"
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + flag).strip()
        cmd = [sys.executable, __file__, "--steps", str(args.steps), "--devices", str(args.devices)]
        cmd += ["--row", name, str(b), m]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
        if out.returncode:
            print(out.stderr[-2000:], file=sys.stderr)
            continue
        rec = json.loads(out.stdout.strip().splitlines()[-1])
        records.append(rec)
        print(table([rec]).splitlines()[-1] if "wall_s" not in rec else rec, flush=True)
        if args.json:  # after every row: a run stopped from outside keeps what it measured
            sys.path.insert(0, HERE)
            from free_body import write_run

            write_run(records, args.json)
    print(table(records))


if __name__ == "__main__":
    main()
