"""A Monte-Carlo run in its own process, for tests/test_montecarlo.py: device counts (JAX reads
them at start-up), several processes under jax.distributed, and a run killed with SIGKILL.

    python tests/montecarlo_worker.py OUT.npz [--devices N] [--model body|top]
        [--n-samples N] [--chunk-size C] [--device-batch B] [--directory D] [--resume]
        [--stall-after-chunk K] [--coordinator HOST:PORT --num-processes P --process-id I]

Writes every sample's measure values, the status codes and the statistics to OUT.npz (process
0), and the chunks it computed and resumed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--devices", type=int, default=1)
ap.add_argument("--mesh", type=int, nargs="*", default=None, help="device counts to run with")
ap.add_argument("--model", default="body")
ap.add_argument("--n-samples", type=int, default=3000)
ap.add_argument("--chunk-size", type=int, default=512)
ap.add_argument("--device-batch", type=int, default=128)
ap.add_argument("--directory", default=None)
ap.add_argument("--resume", action="store_true")
ap.add_argument("--stall-after-chunk", type=int, default=None)
ap.add_argument("--coordinator", default=None)
ap.add_argument("--num-processes", type=int, default=1)
ap.add_argument("--process-id", type=int, default=0)
args = ap.parse_args()

jax.config.update("jax_num_cpu_devices", args.devices)
if args.coordinator:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(args.coordinator, args.num_processes, args.process_id)
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import montecarlo_models as models  # noqa: E402

import rbjax  # noqa: E402


def stall(p: rbjax.Progress):
    if args.stall_after_chunk is not None and p.chunk == args.stall_after_chunk and not p.resumed:
        with open(args.out + ".stalled", "w") as f:
            f.write(str(p.chunk))
        time.sleep(600)  # the test kills the process here, between two chunks' work


sample, measures, dt, n_steps = models.CASES[args.model]
results = {}
for devices in args.mesh or [None]:
    r = rbjax.monte_carlo(
        sample,
        args.n_samples,
        dt,
        n_steps,
        measures,
        key=7,
        chunk_size=args.chunk_size,
        device_batch=args.device_batch,
        devices=devices,
        directory=args.directory,
        resume=args.resume,
        progress=stall,
    )
    tag = "" if devices is None else f"{devices}:"
    results.update({f"{tag}sample_{k}": v for k, v in r.samples.items()})
    results.update({f"{tag}stat_{k}_mean": s.mean for k, s in r.statistics.items()})
    results.update({f"{tag}stat_{k}_m2": s.m2 for k, s in r.statistics.items()})
    results[f"{tag}status"] = r.status
    results[f"{tag}resumed"] = np.asarray(r.chunks_resumed, np.int64)
    results[f"{tag}computed"] = np.asarray(r.chunks_computed, np.int64)
    results[f"{tag}recomputed"] = np.asarray(r.chunks_recomputed, np.int64)
if jax.process_index() == 0:
    np.savez(args.out, **results)
