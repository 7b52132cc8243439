"""Shared test configuration: float64, strict dtype promotion, one tolerance helper.

Rank promotion is left at "allow" on purpose: the component-first kernels (rbjax/_engine/kernels.py)
broadcast per-body parameters of shape (nb,) against batched states of shape (B, nb) by design.

Compile time dominates the suite (most tests compile a program and run it for milliseconds).
XLA's CPU fusion emitters (its default code generator) spend 25-40 % more time compiling the
large mechanism programs (Schur solves, projections, derivatives) than the older emitters, so
the tests run with ``--xla_cpu_use_fusion_emitters=false``: it changes the generated loops, not
the operations, and every tolerance applies unchanged. This is the one place where the suite's
XLA configuration differs from the default users get, a measured trade-off: on 2 cores the
whole suite takes 13.2 minutes with the default emitters against 10.3-10.5 with this flag
(before issue 14's compile-time work: 20-22 against 13.5-15), and CI (lint, docs and tests)
must stay under 15 minutes. The flag goes when the suite fits with the default emitters.

For the same reason LLVM's optimisation of the generated code is off
(``--xla_backend_optimization_level=0``): the suite's programs run for milliseconds and
compile for seconds. Measured on 2 cores (issue 14): 926 s with the fusion-emitter flag alone,
806 s with both; the tests that run long (the identification examples) get slower, the
compile-bound majority faster. No floating-point reassociation is involved (XLA does not enable
fast math on CPU), and every tolerance applies unchanged.
"""

import os
import shutil
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
for _flag in ("--xla_cpu_use_fusion_emitters=false", "--xla_backend_optimization_level=0"):
    if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

import rbjax  # noqa: E402

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")
# No Python tracebacks as source locations in the compiled programs (JAX records up to ten
# frames per operation by default, for XLA dumps and profiler traces): tracing and lowering
# are most of the suite's time, and this is 7 % of it (measured on 2 cores, issue 18: 100 ->
# 93 s on the double-pendulum gradients and the redundant parallelogram). It changes the
# programs' metadata only: error messages, eqx.error_if texts and results are the same.
jax.config.update("jax_include_full_tracebacks_in_locations", False)
jax.config.update("jax_traceback_in_locations_limit", 0)

# One persistent compilation cache per test run, shared by the xdist workers: a program that
# several tests (or both workers) compile is compiled once and loaded from disk after that.
# The process that starts the run (pytest's controller, or the only process) creates an empty
# directory and names it in the environment, which the workers inherit; it removes it at the
# end. Every run therefore starts cold, like CI.
_OWN_CACHE = "RBJAX_TEST_XLA_CACHE" not in os.environ
if _OWN_CACHE:
    os.environ["RBJAX_TEST_XLA_CACHE"] = tempfile.mkdtemp(prefix="rbjax-tests-xla-")
jax.config.update("jax_compilation_cache_dir", os.environ["RBJAX_TEST_XLA_CACHE"])
# The command line's main() turns its own cache on ($RBJAX_CACHE_DIR, else ~/.cache): the
# same directory here, so that no test writes into the home folder.
os.environ["RBJAX_CACHE_DIR"] = os.environ["RBJAX_TEST_XLA_CACHE"]
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_sessionfinish(session, exitstatus):
    if _OWN_CACHE:
        shutil.rmtree(os.environ["RBJAX_TEST_XLA_CACHE"], ignore_errors=True)


# A process may hold at most vm.max_map_count (65 530 by default) memory mappings on Linux.
_MAPPINGS_BEFORE_CLEARING = 20_000


def _mappings() -> int | None:
    try:
        with open("/proc/self/maps", "rb") as fh:
            return sum(1 for _ in fh)
    except OSError:  # not Linux: no count to read
        return None


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop JAX's in-memory caches of traced and compiled programs after a test module when
    the worker holds many memory mappings (or where they cannot be counted).

    A worker otherwise keeps every executable the suite compiled: measured with 1346 tests on
    2 workers, 30 000 memory mappings and 5.4 GB per worker half way, and near the end the
    kernel's limit of 65 530 mappings per process (vm.max_map_count): a worker then died with
    a segmentation fault while serialising an executable for the persistent cache (in
    tests/test_midpoint.py, whichever test came last; alone it passes). Clearing after every
    module kept a worker below 16 000 mappings and 4.4 GB but cost recompilations across
    modules; clearing past 20 000 keeps most of the reuse. A later module that needs a
    program again loads it from the persistent cache above."""
    yield
    count = _mappings()
    if count is None or count > _MAPPINGS_BEFORE_CLEARING:
        jax.clear_caches()


settings.register_profile("rbjax", max_examples=60, deadline=None, derandomize=True)
settings.load_profile("rbjax")


def assert_close(actual, expected, *, rtol=1e-10, atol=1e-12, err_msg=""):
    """The one tolerance helper: numpy's assert_allclose on host copies."""
    np.testing.assert_allclose(
        np.asarray(actual), np.asarray(expected), rtol=rtol, atol=atol, err_msg=err_msg
    )


def free_body_model():
    """A torque-free rigid body, I = diag(1, 2, 3), Newton–Euler (cheap to compile)."""
    return rbjax.Model(rbjax.Body(1.0, np.diag([1.0, 2.0, 3.0])), formulation=rbjax.NewtonEuler())


def plane_slider():
    """A cheap mechanism: one body whose centre is held on the plane z = 0 (CustomConstraint),
    pushed along x by a tilted gravity, spinning. Returns (model, state)."""
    plane = rbjax.CustomConstraint(lambda qi, qj, t, p: qi[2:3] - qj[2:3], 0, rbjax.GROUND)
    body = rbjax.Body(1.0, np.diag([1.0, 2.0, 3.0]))
    model = rbjax.Model(body, joints=[plane], gravity=[1.0, 0.0, -9.81])
    state = rbjax.make_state(velocity=[[0.3, 0.2, 0.0]], omega_body=[[0.5, 2.0, 0.1]])
    return model, state


@pytest.fixture
def close():
    return assert_close


# ---------------------------------------------------------------- where the suite's time goes
# RBJAX_COMPILE_PROFILE=DIR pytest ... writes DIR/<worker>.json: per test, the seconds JAX spent
# tracing, lowering and compiling (its monitoring events) and the programs it compiled, by name.
# benchmarks/suite_profile.py sums them into a table. Off unless the variable is set.
_PROFILE_DIR = os.environ.get("RBJAX_COMPILE_PROFILE")
_PHASES = {
    "/jax/core/compile/jaxpr_trace_duration": "trace",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
    "/jax/core/compile/backend_compile_duration": "compile",
    "/jax/compilation_cache/cache_retrieval_time_sec": "cache_load",
}
_profile: dict = {"tests": {}}
_current: dict | None = None

if _PROFILE_DIR:

    def _on_duration(event, duration, **kwargs):
        phase = _PHASES.get(event)
        if phase is None or _current is None:
            return
        _current[phase] = _current.get(phase, 0.0) + duration
        if phase in ("trace", "compile"):  # by name: "programs" compiled, "traced" functions
            key = "programs" if phase == "compile" else "traced"
            _current.setdefault(key, []).append([kwargs.get("fun_name", "?"), round(duration, 3)])

    jax.monitoring.register_event_duration_secs_listener(_on_duration)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        global _current
        _current = {"programs": [], "traced": []}
        import time

        start = time.perf_counter()
        yield
        _current["wall"] = time.perf_counter() - start
        _profile["tests"][item.nodeid] = _current
        _current = None

    def pytest_unconfigure(config):
        import json

        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        os.makedirs(_PROFILE_DIR, exist_ok=True)
        with open(os.path.join(_PROFILE_DIR, f"{worker}.json"), "w") as fh:
            json.dump(_profile, fh)
