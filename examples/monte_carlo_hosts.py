"""Monte-Carlo on several hosts: the flips example's bodies under ``jax.distributed``.

Every process runs this same script. ``jax.distributed.initialize`` joins them into one JAX
program (multi-controller JAX): ``jax.devices()`` then lists the devices of every process,
``rbjax.monte_carlo`` shards each chunk over all of them, gathers the per-sample values to
every process, and process 0 prints and writes the run. The result is the same, bit for bit,
as one process with as many devices (tests/test_montecarlo.py checks 2 processes × 2 CPU
devices against 1 process × 4).

On one machine (each process gets ``--devices`` CPU devices):

    python examples/monte_carlo_hosts.py --local 2 [--samples 100000] [--directory runs/hosts]

On a cluster, start one process per host with the coordinator's address:

    python examples/monte_carlo_hosts.py --coordinator HOST:PORT --num-processes P --process-id I

* SLURM: ``srun --nodes=P --ntasks-per-node=1 python examples/monte_carlo_hosts.py --slurm``
  (``jax.distributed.initialize()`` reads the coordinator, the process count and this
  process's rank from SLURM's environment).
* Kubernetes: an Indexed Job with P completions and parallelism P, a headless Service in front
  of its pods, ``--coordinator <job>-0.<service>:1234 --num-processes P --process-id
  $JOB_COMPLETION_INDEX``.

With ``--directory`` on a filesystem every host sees, a killed job is resumed by running the
same command with ``--resume``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys


def launch_local(args, argv):
    """Start ``--local`` processes of this script on this machine and wait for them."""
    import socket

    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    i = argv.index("--local")
    rest = argv[:i] + argv[i + 2 :]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                os.path.abspath(__file__),
                *rest,
                "--coordinator",
                f"localhost:{port}",
                "--num-processes",
                str(args.local),
                "--process-id",
                str(i),
            ]
        )  # fmt: skip
        for i in range(args.local)
    ]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"monte_carlo_hosts: a process failed (exit codes {codes})")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--t-end", type=float, default=4.0)
    ap.add_argument("--dt", type=float, default=2e-3)
    ap.add_argument("--devices", type=int, default=None, help="CPU devices per process")
    ap.add_argument("--directory", default=None)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--local", type=int, default=None, help="start this many local processes")
    ap.add_argument("--coordinator", default=None, help="HOST:PORT of process 0")
    ap.add_argument("--num-processes", type=int, default=None)
    ap.add_argument("--process-id", type=int, default=None)
    ap.add_argument("--slurm", action="store_true", help="read the cluster from SLURM")
    args = ap.parse_args(argv)
    if args.local:
        return launch_local(args, argv)

    import jax

    import rbjax

    rbjax.use_cpu_cores(args.devices)  # CPU devices of THIS process (GPUs are found as they are)
    if args.coordinator or args.slurm:
        # collectives between the CPU devices of different processes (GPUs use their own)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        if args.slurm:
            jax.distributed.initialize()
        else:
            jax.distributed.initialize(args.coordinator, args.num_processes, args.process_id)
    jax.config.update("jax_enable_x64", True)
    import numpy as np

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import monte_carlo_flips as flips

    n_steps = int(round(args.t_end / args.dt))
    measures = {
        "flip": rbjax.Event(lambda m, s: s.u[0, 5], direction=-1),
        "energy_drift": rbjax.Drift(lambda m, s: rbjax.kinetic_energy(m, s), limit=1e-8),
    }
    lead = jax.process_index() == 0
    if lead:
        print(
            f"{jax.process_count()} process(es), {len(jax.devices())} devices in all; "
            f"{args.samples} bodies, {n_steps} RK4 steps of {args.dt} s",
            flush=True,
        )
    result = rbjax.monte_carlo(
        flips.sample,
        args.samples,
        args.dt,
        n_steps,
        measures,
        key=0,
        directory=args.directory,
        resume=args.resume,
        progress=None if lead else False,
    )
    if lead:
        st = result.statistics["flip"]
        tm = result.timing
        print(
            f"first flip: mean {float(st.mean):.6f} s, std {float(st.std):.6f} s over "
            f"{int(st.count)} bodies; failed {result.n_failed}; compile {tm['compile_s']:.1f} s,"
            f" {tm['samples_per_s']:.0f} samples/s"
        )
        if result.n_failed or not np.isfinite(st.average):
            raise SystemExit("monte_carlo_hosts: failed samples")


if __name__ == "__main__":
    main()
