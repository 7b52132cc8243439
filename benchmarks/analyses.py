"""Cost of the one-call analyses (issue 18): the first call (tracing, compilation and one run)
and a repeated call of ``rbjax.accelerations`` and ``rbjax.reactions`` on the double pendulum,
compiled as one program (what they do now) against evaluated eagerly operation by operation
(what they did), and of ``rbjax.kinematic_analysis`` on the slider-crank (400 times over one
revolution) next to the program its DOF check used to compile on its own (``rbjax.assemble``
then ``rbjax.mobility``). Peer in the same run: MuJoCo C's ``mj_forward`` and ``mj_inverse``
on the same double pendulum from MJCF (model compile and one call). Every row runs in a fresh
process, so no row inherits another's compiled programs. float64, CPU.

    python benchmarks/analyses.py --json benchmarks/results/analyses_cpu.json [--repeats 5]
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
ROWS = (
    "accelerations:compiled",
    "accelerations:eager",
    "reactions:compiled",
    "reactions:eager",
    "kinematic_analysis:now",
    "kinematic_analysis:assemble+mobility",
    "mujoco:forward",
    "mujoco:inverse",
)


def _timed(call, repeats):
    t0 = time.perf_counter()
    call()
    first = time.perf_counter() - t0
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        runs.append(time.perf_counter() - t0)
    return {"first_s": first, "repeat_s": statistics.median(runs)}


def row(name: str, repeats: int) -> dict:
    """One measurement, in this (fresh) process."""
    what, mode = name.split(":")
    if what == "mujoco":
        import mujoco

        sys.path.insert(0, HERE)
        from models import pendulum_mjcf

        t0 = time.perf_counter()
        m = mujoco.MjModel.from_xml_string(pendulum_mjcf(2))
        d = mujoco.MjData(m)
        d.qpos[:] = [0.3, -0.2]
        d.qvel[:] = [0.5, 0.1]
        build = time.perf_counter() - t0
        fn = mujoco.mj_forward if mode == "forward" else mujoco.mj_inverse
        return {"row": name, "model_s": build, **_timed(lambda: fn(m, d), max(repeats, 100))}

    import jax

    jax.config.update("jax_enable_x64", True)
    import rbjax

    sys.path.insert(0, HERE)
    if what == "kinematic_analysis":
        import numpy as np

        sys.path.insert(0, os.path.join(HERE, "..", "examples"))
        import slider_crank as example

        driven, _, state, _ = example.mechanism()
        times = np.linspace(0.0, 2 * np.pi / example.OMEGA, 400)
        if mode == "now":

            def call():
                jax.block_until_ready(rbjax.kinematic_analysis(driven, state, times).q)
        else:

            def call():
                at = rbjax.State(t=jax.numpy.asarray(times[0]), q=state.q, u=state.u)
                rbjax.mobility(driven, rbjax.assemble(driven, at))

        return {"row": name, "bodies": driven.nb, **_timed(call, repeats)}

    from models import pendulum

    model, state = pendulum(2)
    state = rbjax.assemble(model, state)
    accelerations = rbjax.accelerations
    if mode == "eager":
        accelerations = rbjax.accelerations.__wrapped__  # the function before eqx.filter_jit

    if what == "accelerations":

        def call():
            jax.block_until_ready(accelerations(model, state))
    else:
        from rbjax._engine.reactions import joint_reactions

        def call():
            if mode == "eager":
                lam = accelerations(model, state)[1]
                jax.block_until_ready(joint_reactions(model, state, lam))
            else:
                jax.block_until_ready(rbjax.reactions(model, state))

    return {"row": name, "bodies": model.nb, **_timed(call, repeats)}


def _spawn(name, repeats, timeout=600):
    cmd = [sys.executable, __file__, "--row", name, "--repeats", str(repeats)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode or not lines:
        tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["?"]
        return {"row": name, "error": tail[0][:200]}
    return json.loads(lines[-1])


def table(records) -> str:
    lines = ["| row | first call (compile + run) | repeated call |", "|---|---|---|"]
    for r in records:
        if "error" in r:
            lines.append(f"| {r['row']} | {r['error']} | |")
            continue
        extra = f" (model compile {r['model_s'] * 1e3:.1f} ms)" if "model_s" in r else ""
        lines.append(f"| {r['row']} | {r['first_s']:.3g} s{extra} | {r['repeat_s'] * 1e6:.1f} µs |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default=None, help="write the records here")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--row", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.row:
        print(json.dumps(row(args.row, args.repeats)))
        return
    sys.path.insert(0, HERE)
    from free_body import write_records

    records = [_spawn(name, args.repeats) for name in ROWS]
    print(table(records))
    write_records(records, args.json)


if __name__ == "__main__":
    main()
