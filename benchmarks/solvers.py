"""Identification solvers: rbjax.identify's host-driven loops against optimistix's compiled ones.

rbjax.identify drives its optimisers from the host around ONE compiled function (the whitened
residuals r(θ) and J = ∂r/∂θ by forward mode), on the argument that a solver loop compiled with
the objective inside (a line search or trust region) costs much more compile time, and compile
time dominates identification (docs/dependencies.md, rbjax/_identify/solvers.py). This measures
that claim on the same residual function (rbjax's own, rbjax/_identify/problem.py), solved by

* ``rbjax.identify`` with ``rbjax.LevenbergMarquardt()``, ``rbjax.LBFGS()`` and
  ``optax.lbfgs()`` (one compiled step with optax's zoom line search, driven by rbjax's host loop);
* ``optimistix.least_squares`` with ``LevenbergMarquardt``, ``GaussNewton`` and ``Dogleg``, and
  ``optimistix.minimise`` with ``BFGS`` and ``LBFGS`` on ½‖r‖², each whole loop under one
  ``eqx.filter_jit`` (the problem's arrays traced, as rbjax's are).

Problems: examples/identify_tumbling.py at the test suite's size (401 orientation samples over
2 s, RK4 with dt = 0.01 s, 12 free scalars, the example's initial guess): ``tumbling``
torque-free (the inertia scale is unidentifiable, J has rank 11; the error is over the moment
ratios and ω₀) and ``tumbling_torque`` with the example's known torque (every direction
identifiable; the error is over the absolute moments and ω₀), started from the same guess.

Compile time = first call − run time (``jax.clear_caches()`` before each solver, so none reuses
another's compiled code); run time = median of ``--repeats`` further calls; first call = compile + one run (time to
the first answer with empty caches). The final loss ½‖r‖² is re-evaluated with
``rbjax.residuals`` at each returned estimate; Δloss is relative to the lowest loss any solver
reached on the problem. rbjax: steps = accepted steps, evals = (r, J) evaluations (line-search
trials and rejected damping included); optimistix: one evaluation per step (rejected included); optax.lbfgs: host evaluations only
(its line-search trials inside the compiled step are not counted).
float64. rbjax solvers: tol = gtol = 1e-10 (the defaults); optimistix: rtol = atol = 1e-8.
max_steps: 300 (the example's) for the Gauss–Newton family, 900 for the quasi-Newton methods.

    python benchmarks/solvers.py --json benchmarks/results/solvers.json [--repeats 3]
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import statistics
import sys
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import optax  # noqa: E402

try:  # the bench extra; benchmarks/table.py only needs this module's table()
    import optimistix as optx  # noqa: E402
except ImportError:  # pragma: no cover
    optx = None
from free_body import write_records  # noqa: E402
from jax.flatten_util import ravel_pytree  # noqa: E402

import rbjax  # noqa: E402
from rbjax._identify.problem import residual_vector, setup, unravel  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import identify_tumbling as tumbling  # noqa: E402

_identify = importlib.import_module("rbjax._identify.identify")  # the module, not the function

DT, MAX_STEPS, RTOL, ATOL = tumbling.DT, 300, 1e-8, 1e-8
RBJAX = {  # name -> (solver, max_steps)
    "rbjax LevenbergMarquardt": (rbjax.LevenbergMarquardt, MAX_STEPS),
    "rbjax LBFGS": (rbjax.LBFGS, 3 * MAX_STEPS),
    "rbjax + optax.lbfgs (compiled step)": (optax.lbfgs, 3 * MAX_STEPS),
}
OPTX = (
    {}
    if optx is None
    else {  # name -> (solver, least squares?, max_steps)
        "optimistix LevenbergMarquardt": (optx.LevenbergMarquardt, True, MAX_STEPS),
        "optimistix GaussNewton": (optx.GaussNewton, True, MAX_STEPS),
        "optimistix Dogleg": (optx.Dogleg, True, MAX_STEPS),
        "optimistix BFGS": (optx.BFGS, False, 3 * MAX_STEPS),
        "optimistix LBFGS": (optx.LBFGS, False, 3 * MAX_STEPS),
    }
)


def tumbling_problem(torque: bool, samples: int, seed: int):
    """(build, guess, data, error) of examples/identify_tumbling.py, fit 1 or fit 2."""
    rng = np.random.default_rng(seed)
    times = np.linspace(0.0, tumbling.T_END, samples)
    ys = tumbling.measure(times, None, rng)
    tq = None
    if torque:  # fit 2's data: the second draw of the same generator, as in the example
        tq = jnp.asarray(tumbling.TORQUE)
        ys = tumbling.measure(times, tq, rng)
    data = rbjax.Measurements(
        times, [rbjax.Orientation("body", ys, np.deg2rad(tumbling.NOISE_DEG))]
    )
    guess = {
        "inertia": rbjax.PrincipalInertia.from_moments([2.5, 2.8, 3.6], 0.5 * tumbling.AXES_ROTVEC),
        "attitude0": jnp.zeros(3),
        "omega0": jnp.asarray([4.3, 6.2, -3.5]),
    }
    true_m = tumbling.MOMENTS if torque else tumbling.MOMENTS / tumbling.MOMENTS.sum() * 2.0

    def error(params):  # moments sorted: a permutation of the axes is the same body
        inertia = params["inertia"]
        m = np.sort(np.asarray(inertia.moments if torque else inertia.ratios))
        om = np.asarray(params["omega0"]) / tumbling.OMEGA0
        return float(max(np.max(np.abs(m / true_m - 1.0)), np.max(np.abs(om - 1.0))))

    return functools.partial(tumbling.build, torque=tq), guess, data, error


def timed(call, repeats: int):
    t0 = time.perf_counter()
    out = call()
    first = time.perf_counter() - t0
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        runs.append(time.perf_counter() - t0)
    run = statistics.median(runs)
    return out, first, run


class _Counted:
    """rbjax's compiled (r, J) function, counting its calls (identify looks it up per fit)."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *a):
        self.calls += 1
        return self.fn(*a)


def run_rbjax(name, build, guess, data, repeats):
    make, max_steps = RBJAX[name]
    solver = make()
    counted = _Counted(_identify.eval_forward)

    def call():
        counted.calls = 0
        return rbjax.identify(build, guess, data, dt=DT, solver=solver, max_steps=max_steps)

    _identify.eval_forward = counted
    try:
        fit, first, run = timed(call, repeats)
    finally:
        _identify.eval_forward = counted.fn
    return fit.params, first, run, fit.steps, counted.calls, fit.converged, fit.message


def run_optx(name, build, guess, data, repeats):
    make, least_squares, max_steps = OPTX[name]
    solver = make(rtol=RTOL, atol=ATOL)
    problem, dyn0, *_ = setup(build, guess, data, DT, None, None, None, "benchmark")
    template = (dyn0, {})
    y0 = ravel_pytree(template)[0]

    def resid(y, problem):
        return residual_vector(problem, unravel(template, y))[0]

    def loss(y, problem):
        r = resid(y, problem)
        return 0.5 * jnp.sum(r * r)

    @eqx.filter_jit
    def solve(problem, y0):
        go = optx.least_squares if least_squares else optx.minimise
        sol = go(resid if least_squares else loss, solver, y0, problem, max_steps=max_steps, throw=False)  # fmt: skip
        return sol.value, sol.stats["num_steps"], sol.result

    (y, steps, result), first, run = timed(
        lambda: jax.block_until_ready(solve(problem, y0)), repeats
    )
    params = eqx.combine(unravel(template, y)[0], problem.fixed)
    ok = bool(result == optx.RESULTS.successful)
    return params, first, run, int(steps), int(steps), ok, optx.RESULTS[result] or "successful"


def table(records: list) -> str:
    lines = [
        "| problem | solver | compile s | run s | first call s | steps | evals | final loss | "
        "Δloss rel | param err | converged |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        lines.append(
            f"| {r['problem']} | {r['solver']} | {r['compile_s']:.1f} | {r['run_s']:.2f} | "
            f"{r['first_call_s']:.1f} | {r['steps']} | {r['evals']} | {r['loss']:.10g} | "
            f"{r['loss_rel_to_best']:.1e} | {r['param_error']:.2e} | {r['converged']} |"
        )
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--json", default=None, help="write records to this path")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--samples", type=int, default=401)
    p.add_argument("--problems", default="tumbling,tumbling_torque")
    p.add_argument("--solvers", default=",".join([*RBJAX, *OPTX]), help="comma-separated names")
    args = p.parse_args(argv)
    records = []
    for prob in args.problems.split(","):
        build, guess, data, error = tumbling_problem(prob == "tumbling_torque", args.samples, 0)
        rows = []
        for name in args.solvers.split(","):
            jax.clear_caches()
            go = run_rbjax if name in RBJAX else run_optx
            params, first, run, steps, evals, ok, why = go(name, build, guess, data, args.repeats)
            flat = np.asarray(ravel_pytree(params)[0])
            try:
                r = np.asarray(rbjax.residuals(build, params, data, dt=DT))
            except ValueError:  # a non-finite estimate
                r = np.full(1, np.nan)
            rows.append(
                {
                    "problem": prob,
                    "solver": name,
                    "compile_s": max(first - run, 0.0),
                    "run_s": run,
                    "first_call_s": first,
                    "steps": steps,
                    "evals": evals,
                    "loss": 0.5 * float(r @ r),
                    "param_error": error(params),
                    "converged": ok,
                    "message": why,
                    "max_steps": (RBJAX.get(name) or OPTX[name])[-1],
                    "rtol_atol_optimistix": [RTOL, ATOL],
                    "samples": args.samples,
                    "estimate": flat.tolist(),
                }
            )
            print(f"{prob} {name}: first {first:.1f} s, run {run:.2f} s, {steps} steps", flush=True)
        best = min(row["loss"] for row in rows if np.isfinite(row["loss"]))
        for row in rows:
            row["loss_rel_to_best"] = (row["loss"] - best) / best
        records += rows
    write_records(records, args.json)
    print(table(records))
    return records


if __name__ == "__main__":
    main()
