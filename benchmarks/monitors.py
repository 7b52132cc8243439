"""Cost of the runtime plausibility monitors (rbjax.Plausibility, issue 18): the same rollout
with the default monitors and with ``monitors=None``, compile and run time separately.

The monitors are evaluated at every SAVED state (|A|² − 1 of the rigid bodies, the joint
residual Φ, the relative energy change), so their cost is largest when every step is saved;
the table gives save_every = 1 and 100. Models: the free body (B = 1024, 1000 steps), the
double pendulum (B = 64, 2000 steps) and the 16-link pendulum (B = 64, 500 steps) of
benchmarks/models.py, conservative (the energy is watched), and the 7-link arm of
examples/models/arm7.xml with its joint damping and position servos (B = 64, 500 steps),
whose energy balance needs the work of those forces: the loop integrates their power, one
evaluation per step (issue 36). RK4, float64, dt = 1e-3.

    python benchmarks/monitors.py --json benchmarks/results/monitors_cpu.json [--repeats 5]
        [--only arm7_mjcf]

``--first-call`` measures instead what a user waits for on the first rollout of a process:
a fresh interpreter per sample (trace, compile and run of a 100-step RK4 rollout, dt = 1e-3,
B = 1), with the default monitors and with ``monitors=None``, the samples interleaved and
their median reported (the monitors' own program is compiled with cheap XLA options,
rbjax/_engine/monitors.py ``CHEAP``). Models: the double pendulum and arm7 in joint
coordinates, the double pendulum and the four-bar in maximal coordinates.

    python benchmarks/monitors.py --first-call [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)

import rbjax  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
from free_body import compile_and_run, write_records  # noqa: E402

CASES = (
    ("free_body", 1024, 1000),
    ("pendulum_2", 64, 2000),
    ("pendulum_16", 64, 500),
    ("arm7_mjcf", 64, 500),
)
ARM = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "examples", "models", "arm7.xml"
)


def _build(name):
    if name == "arm7_mjcf":  # MuJoCo's compiler (the optional mujoco extra) reads the file
        loaded = rbjax.load(ARM, formulation=rbjax.ScalableDAE())
        return loaded.model, loaded.state
    return models.build(name)


def _batched(state, batch: int):
    """``batch`` copies of ``state`` with slightly different velocities (one compile)."""
    scale = 1.0 + 0.01 * np.linspace(0.0, 1.0, batch)[:, None, None]
    return rbjax.State(
        t=np.zeros(batch),
        q=np.broadcast_to(np.asarray(state.q), (batch,) + state.q.shape[-2:]),
        u=np.asarray(state.u) * scale,
    )


def run_case(name, batch, steps, save_every, monitors, repeats):
    model, state = _build(name)
    state = _batched(state, batch)
    dt = np.asarray(1e-3)

    def call():
        traj = rbjax.rollout(model, state, dt, steps, save_every=save_every, monitors=monitors)
        jax.block_until_ready(traj.q)
        return traj

    timing = compile_and_run(call, repeats)
    return {
        "problem": name,
        "batch": batch,
        "steps": steps,
        "save_every": save_every,
        "monitors": "default" if monitors is not None else "none",
        **timing,
    }


FIRST_CALL = (
    ("double_pendulum", "joint"),
    ("arm7", "joint"),
    ("double_pendulum", "maximal"),
    ("four_bar", "maximal"),
)


def first_call_one(name: str, coordinates: str, monitors: str) -> float:
    """Seconds from the rollout call to its result, in this (fresh) process."""
    path = os.path.join(os.path.dirname(ARM), f"{name}.xml")
    joint = coordinates == "joint"
    formulation = rbjax.JointCoordinates() if joint else rbjax.ScalableDAE()
    loaded = rbjax.load(path, formulation=formulation)
    kw = {} if monitors == "default" else {"monitors": None}
    start = time.perf_counter()
    traj = rbjax.rollout(loaded.model, loaded.state, 1e-3, 100, **kw)
    jax.block_until_ready(traj.result)
    return time.perf_counter() - start


def first_calls(repeats: int) -> list[dict]:
    """Medians of ``repeats`` fresh processes per row, with and without monitors interleaved."""
    records = []
    print(f"{'problem':<16} {'coordinates':>11} {'monitors':>9} {'first call s':>13}")
    for name, coordinates in FIRST_CALL:
        samples = {"default": [], "none": []}
        for _ in range(repeats):
            for monitors in samples:
                cmd = [sys.executable, __file__, "--first-call-one", name, coordinates, monitors]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                samples[monitors].append(float(out.split()[-1]))
        for monitors, values in samples.items():
            median = float(np.median(values))
            print(f"{name:<16} {coordinates:>11} {monitors:>9} {median:>13.2f}")
            records.append(
                {
                    "problem": name,
                    "coordinates": coordinates,
                    "monitors": monitors,
                    "first_call_s": median,
                    "samples_s": values,
                }
            )
    return records


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", default=None, help="one problem of the table")
    parser.add_argument("--first-call", action="store_true", help="first-call rows (module doc)")
    parser.add_argument("--first-call-one", nargs=3, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.first_call_one:
        print(first_call_one(*args.first_call_one))
        return
    if args.first_call:
        write_records(first_calls(args.repeats), args.json)
        return
    records = []
    print(f"{'problem':<12} {'B':>5} {'save':>5} {'monitors':>9} {'compile s':>10} {'run s':>9}")
    for name, batch, steps in CASES:
        if args.only not in (None, name):
            continue
        for save_every in (1, 100):
            for monitors in (rbjax.Plausibility(), None):
                r = run_case(name, batch, steps, save_every, monitors, args.repeats)
                records.append(r)
                print(
                    f"{name:<12} {batch:>5} {save_every:>5} {r['monitors']:>9} "
                    f"{r['compile_s']:>10.2f} {r['run_s']:>9.4f}"
                )
            on, off = records[-2], records[-1]
            print(
                f"{'':<12} {'':>5} {'':>5} {'ratio':>9} {on['compile_s'] / off['compile_s']:>10.2f} "
                f"{on['run_s'] / off['run_s']:>9.2f}"
            )
    write_records(records, args.json)


if __name__ == "__main__":
    main()
