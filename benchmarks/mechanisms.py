"""Mechanism throughput: double pendulum and slider-crank, rbjax against MuJoCo (C) and MJX.

Double pendulum (issue 3 §9): two rods of 1 kg and 1 m (inertia about the centre of mass
diag(1e-3, 1/12, 1/12) kg m²), hinges about world y at the origin and at the tip of the first
rod, both released horizontal, g = 9.81 along −z, dt = 1e-3, 2000 steps. Slider-crank: the
spatial crank (revolute) – rod (spherical, universal) – slider (translational) of
examples/slider_crank.py under gravity and a constant crank torque.

For every rbjax integrator (and the formulations that matter), batch B ∈ {1, 64, 1024}, float64:
compile time (first call minus one run) and run time (median) separately. When the ``mujoco``
package is installed (``pip install -e .[bench]``), the same double pendulum runs in MuJoCo's C
engine (RK4, ``mujoco.rollout`` on all cores) and in MJX (``jax.vmap`` of ``mjx.step`` under
``lax.scan``, RK4) in the same process, and the final angles are compared with rbjax's.
Also: cost per step of an N-link pendulum, N = 2 … 64.

    python benchmarks/mechanisms.py --json benchmarks/results/mechanisms.json [--quick]

Records have the keys of benchmarks/free_body.py (problem, integrator, formulation, dtype,
batch, steps, body_steps_per_s, compile_s, run_s) plus engine, bodies and steps_per_s
(mechanism steps per second = body_steps_per_s / bodies).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def _devices_from_argv(argv) -> int:
    """--devices N must act before JAX starts: N host CPU devices, one per core by default."""
    n = os.cpu_count() or 1
    for i, a in enumerate(argv):
        if a == "--devices" and i + 1 < len(argv):
            n = int(argv[i + 1])
        elif a.startswith("--devices="):
            n = int(a.split("=", 1)[1])
    return max(1, n)


DEVICES = _devices_from_argv(sys.argv)
if DEVICES > 1 and "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={DEVICES}"
    ).strip()

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update("jax_enable_x64", True)

import rbjax  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402  (the benchmarks' mechanisms and their MJCF twins)
from free_body import write_records  # noqa: E402

INTEGRATORS = {
    "RK4": lambda: rbjax.RK4(),
    "SemiImplicitEuler": lambda: rbjax.SemiImplicitEuler(),
    "Projected(RK4)": lambda: rbjax.Projected(rbjax.RK4()),
    "ImplicitMidpoint": lambda: rbjax.ImplicitMidpoint(),
    # the solver before issue 14 (Newton with the dense exact Jacobian), measured in the same run
    "ImplicitMidpoint(exact)": lambda: rbjax.ImplicitMidpoint(newton="exact"),
}
FORMULATIONS = {
    "ScalableDAE": rbjax.ScalableDAE,
    "NewtonEuler": rbjax.NewtonEuler,
    "UdwadiaSchutte": rbjax.UdwadiaSchutte,
}


def _time(call, repeats):
    t0 = time.perf_counter()
    out = call()
    first = time.perf_counter() - t0
    if first > 20.0:
        repeats = 1
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = call()
        runs.append(time.perf_counter() - t0)
    run_s = statistics.median(runs)
    return out, max(first - run_s, 0.0), run_s, repeats


def rbjax_case(problem, integrator, formulation, batch, steps, repeats, n_links=2, devices=1):
    """One rbjax row. ``devices`` > 1 splits the batch over that many host CPU devices (one per
    core) with ``eqx.filter_pmap``: the way a user runs a batch on all cores."""
    model, state = models.build(
        "slider_crank" if problem == "slider_crank" else f"pendulum_{n_links}"
    )
    model = eqx.tree_at(lambda m: m.formulation, model, FORMULATIONS[formulation]())
    state = jax.tree.map(lambda x: jnp.broadcast_to(x, (batch,) + x.shape), state)
    integ = INTEGRATORS[integrator]()
    dt = jnp.asarray(1e-3)
    # ImplicitMidpoint under filter_pmap over host CPU devices deadlocked (all threads in a
    # futex wait) in our runs; it is a reference scheme, so it stays on one device.
    split_ok = (
        not integrator.startswith("ImplicitMidpoint")
        and batch % devices == 0
        and batch >= 64 * devices
    )
    devices = devices if devices > 1 and split_ok else 1
    if devices > 1:
        split = jax.tree.map(lambda x: x.reshape((devices, batch // devices) + x.shape[1:]), state)
        rbjax.rollout(model, state, dt, 1, integrator=integ)  # validates the concrete state once
        run = eqx.filter_pmap(
            lambda s: rbjax.rollout(
                model, s, dt, steps, integrator=integ, save_every=steps, throw=False
            )
        )

        def call():
            tr = jax.block_until_ready(run(split))
            return jax.tree.map(lambda x: x.reshape((batch,) + x.shape[2:]), tr)

    else:

        def call():
            tr = rbjax.rollout(
                model, state, dt, steps, integrator=integ, save_every=steps, throw=False
            )
            return jax.block_until_ready(tr)

    tr, compile_s, run_s, reps = _time(call, repeats)
    assert np.all(np.isfinite(np.asarray(tr.q))), "non-finite result"
    # A throughput row, timed whatever its accuracy (throw=False): an unstabilised
    # SemiImplicitEuler leaves the hinges 3.4 cm apart after 2000 steps of 1 ms, which the
    # monitors report as implausible. The row says so instead of stopping the benchmark.
    codes = np.asarray(tr.result).reshape(-1)
    worst = {k: float(np.max(np.asarray(v))) for k, v in (tr.monitors or {}).items()}
    nb = model.nb
    return {
        "result": rbjax.RESULTS(int(np.max(codes))).name,
        "monitors": worst,
        "engine": "rbjax",
        "problem": problem if problem == "slider_crank" else f"pendulum_{n_links}",
        "integrator": integrator,
        "formulation": formulation,
        "dtype": "float64",
        "batch": batch,
        "bodies": nb,
        "steps": steps,
        "dt": 1e-3,
        "steps_per_s": batch * steps / run_s,
        "body_steps_per_s": batch * steps * nb / run_s,
        "compile_s": compile_s,
        "run_s": run_s,
        "repeats": reps,
        "devices": devices,
    }, tr


def _reduced_record(engine, dtype, batch, steps, compile_s, run_s, reps, angles):
    """A MuJoCo / MJX row of the double pendulum (2 joint angles, dt = 1e-3)."""
    return {
        "engine": engine,
        "problem": "pendulum_2",
        "integrator": "RK4",
        "formulation": "reduced (2 joint angles)",
        "dtype": dtype,
        "batch": batch,
        "bodies": 2,
        "steps": steps,
        "dt": 1e-3,
        "steps_per_s": batch * steps / run_s,
        "body_steps_per_s": 2 * batch * steps / run_s,
        "compile_s": compile_s,
        "run_s": run_s,
        "repeats": reps,
        "final_angles": [float(a) for a in angles],
    }


def mujoco_cases(batch, steps, repeats):
    """MuJoCo C (RK4, threads = cores) and MJX on the same double pendulum; None if absent."""
    try:
        import mujoco
        from mujoco import rollout as mj_rollout
    except ImportError:
        return None
    out = []
    m = mujoco.MjModel.from_xml_string(models.pendulum_mjcf(2))
    d = mujoco.MjData(m)
    spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
    s0 = np.zeros(mujoco.mj_stateSize(m, spec))
    mujoco.mj_getState(m, d, s0, spec)
    init = np.tile(s0, (batch, 1))
    nthread = os.cpu_count() or 1
    datas = [mujoco.MjData(m) for _ in range(nthread)]

    def call():
        st, _ = mj_rollout.rollout(m, datas, init, nstep=steps, persistent_pool=True)
        return st

    st, compile_s, run_s, reps = _time(call, repeats)
    # qpos sits after time in the full physics state
    angles = st[0, -1, 1:3]
    out.append(
        _reduced_record(
            f"mujoco-c ({nthread} threads)", "float64", batch, steps, compile_s, run_s, reps, angles
        )
    )
    try:
        from mujoco import mjx
    except ImportError:
        return out
    try:
        mx = mjx.put_model(m)
        dx = mjx.make_data(mx)
        dxb = jax.tree.map(lambda x: jnp.broadcast_to(x, (batch,) + jnp.shape(x)), dx)

        @jax.jit
        def run(dxb):
            def body(dd, _):
                return jax.vmap(mjx.step, in_axes=(None, 0))(mx, dd), None

            dd, _ = jax.lax.scan(body, dxb, None, length=steps)
            return dd.qpos

        def call_mjx():
            return jax.block_until_ready(run(dxb))

        qpos, compile_s, run_s, reps = _time(call_mjx, repeats)
        out.append(
            _reduced_record(
                "mjx (jax, cpu)",
                str(qpos.dtype),
                batch,
                steps,
                compile_s,
                run_s,
                reps,
                np.asarray(qpos[0]),
            )
        )
    except Exception as e:  # MJX versions drift; report instead of failing the benchmark
        print(f"MJX failed: {type(e).__name__}: {e}", file=sys.stderr)
    return out


def rbjax_angles(tr):
    """Hinge angles (MuJoCo convention: rotation about +y) of the two rods at the end."""
    q = np.asarray(tr.q)[0, -1]
    a1 = 2 * np.arctan2(q[0, 5], q[0, 3])
    a2 = 2 * np.arctan2(q[1, 5], q[1, 3]) - a1
    return [float(np.angle(np.exp(1j * a1))), float(np.angle(np.exp(1j * a2)))]


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--json", default=None, help="write records to this path")
    p.add_argument("--quick", action="store_true", help="small subset (smoke test)")
    p.add_argument("--batches", default="1,64,1024")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--links", default="2,4,8,16,32,64")
    p.add_argument("--skip-rbjax", action="store_true", help="only the MuJoCo/MJX rows and chain")
    p.add_argument("--skip-chain", action="store_true", help="no N-link scaling rows")
    p.add_argument(
        "--devices",
        type=int,
        default=DEVICES,
        help="host CPU devices for batches >= 64 per device (default: one per core)",
    )
    args = p.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    links = [int(n) for n in args.links.split(",")]
    if args.quick:
        batches, args.steps, args.repeats, links = [1, 64], 200, 1, [2, 4]
    cases = []
    for problem in ("double_pendulum", "slider_crank"):
        for integ in INTEGRATORS:
            forms = ["ScalableDAE", "NewtonEuler"] if integ == "RK4" else ["ScalableDAE"]
            if integ == "RK4" and problem == "double_pendulum":
                forms.append("UdwadiaSchutte")
            for form in forms:
                for b in batches:
                    if form == "UdwadiaSchutte" and b > 64:
                        continue  # SVD pseudo-inverse per system: a reference formulation
                    cases.append((problem, integ, form, b))
    head = (
        f"{'engine':22s} {'problem':16s} {'integrator':17s} {'formulation':15s} {'B':>5s} "
        f"{'steps/s':>10s} {'body-steps/s':>13s} {'compile s':>9s} {'run s':>8s}"
    )
    print(head)
    print("-" * len(head))
    records = []

    def show(r):
        records.append(r)
        print(
            f"{r['engine']:22s} {r['problem']:16s} {r['integrator']:17s} {r['formulation'][:15]:15s} "
            f"{r['batch']:5d} {r['steps_per_s']:10.3g} {r['body_steps_per_s']:13.3g} "
            f"{r['compile_s']:9.2f} {r['run_s']:8.3f}"
            + (
                f"  {r['result']} {r['monitors']}"
                if r.get("result", "successful") != "successful"
                else ""
            ),
            flush=True,
        )

    ref_angles = None
    if args.skip_rbjax:
        cases = []
    for problem, integ, form, b in cases:
        # the implicit scheme (dense Newton per system) runs fewer steps; rates are per step
        implicit = integ.startswith("ImplicitMidpoint")
        steps = args.steps if not implicit else max(args.steps // 10, 20)
        rec, tr = rbjax_case(problem, integ, form, b, steps, args.repeats, devices=args.devices)
        if problem == "double_pendulum" and integ == "RK4" and form == "ScalableDAE":
            rec["final_angles"] = ref_angles = rbjax_angles(tr)
        show(rec)
    for b in batches:
        mj = mujoco_cases(b, args.steps, args.repeats)
        if mj is None:
            print("(mujoco not installed: pip install -e .[bench] for the MuJoCo/MJX rows)")
            break
        for r in mj:
            if ref_angles is not None and "final_angles" in r:
                r["angle_diff_vs_rbjax"] = float(
                    np.max(np.abs(np.asarray(r["final_angles"]) - ref_angles))
                )
            show(r)
    print("\nN-link pendulum (RK4, ScalableDAE, B = 64):")
    for n in [] if args.skip_chain else links:
        rec, _ = rbjax_case("chain", "RK4", "ScalableDAE", 64, max(args.steps // 10, 20), 1, n)
        rec["us_per_step_per_system"] = 1e6 * rec["run_s"] / (64 * rec["steps"])
        show(rec)
    return write_records(records, args.json)


if __name__ == "__main__":
    main()
