"""rbjax.monte_carlo: statistics against numpy, determinism across chunk sizes, devices and
processes, a run killed with SIGKILL and resumed, corrupt chunks, the failure policy."""

import os
import signal
import socket
import subprocess
import sys
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from montecarlo_models import BODY_MEASURES, CASES, body_sample

import rbjax
from rbjax._montecarlo import statistics as st

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "montecarlo_worker.py")


# ---------------------------------------------------------------- statistics alone


def test_blockwise_merged_statistics_equal_numpy_on_the_union():
    """Chan et al.'s pairwise merge over uneven blocks against numpy on all values at once;
    NaN (events that did not happen) counted as missing; histograms add up exactly."""
    rng = np.random.default_rng(3)
    x = 1e3 + rng.standard_normal((1000, 2))  # an offset that ruins a naive Σx² − n x̄²
    x[::17, 1] = np.nan
    ok = rng.random(1000) > 0.1
    edges = np.linspace(997.0, 1003.0, 13)
    cuts = [0, 1, 7, 300, 301, 999, 1000]
    parts = [
        st.block_statistics(x[a:b], ok[a:b], edges)
        for a, b in zip(cuts[:-1], cuts[1:], strict=True)
    ]
    total = parts[0]
    for p in parts[1:]:
        total = st.merge(total, p)
    y = x[ok]
    for j in range(2):
        v = y[:, j][np.isfinite(y[:, j])]
        assert total.count[j] == v.size and total.missing[j] == np.isnan(y[:, j]).sum()
        np.testing.assert_allclose(total.mean[j], v.mean(), rtol=1e-15)
        np.testing.assert_allclose(total.variance[j], v.var(ddof=1), rtol=1e-12)
        assert total.min[j] == v.min() and total.max[j] == v.max()
        np.testing.assert_array_equal(total.histogram[j], np.histogram(v, edges)[0])
    empty = st.block_statistics(x[:0], ok[:0], None)
    assert np.all(np.isnan(empty.average)) and np.all(empty.count == 0)


# ---------------------------------------------------------------- in this process


@pytest.fixture(scope="module")
def body_run():
    sample, measures, dt, n = CASES["body"]
    return rbjax.monte_carlo(
        sample, 3000, dt, n, measures, key=7, chunk_size=512, device_batch=128, progress=False
    )


def test_samples_are_the_rollouts_of_the_sampled_systems(body_run):
    """Sample i of the runner is rollout(*sample(fold_in(key, i), i)) with the same measures
    (to rounding: the batched program and the single rollout are compiled differently; the
    energy drift is a difference of energies ~12 J, so its rounding is ~1e-14 absolute)."""
    sample, measures, dt, n = CASES["body"]
    key = jax.random.key(7)
    for i in (0, 1234, 2999):
        model, state = sample(jax.random.fold_in(key, i), jnp.asarray(i, jnp.int32))
        traj = rbjax.rollout(model, state, dt, n, save_every=n, measures=measures)
        for name in measures:
            np.testing.assert_allclose(
                body_run.samples[name][i], traj.measures[name], rtol=1e-12, atol=1e-13
            )


def test_statistics_and_quantiles_equal_numpy_over_the_kept_samples(body_run):
    r = body_run
    assert r.status is not None and r.samples is not None
    assert r.n_failed == 0 and np.all(r.status == 0) and r.samples["flip"].shape == (3000,)
    for name, s in r.statistics.items():
        x = r.samples[name].reshape(3000, -1)
        x = x[:, np.isfinite(x).all(axis=0)] if name != "flip" else x[np.isfinite(x)][:, None]
        np.testing.assert_allclose(s.mean.reshape(-1)[: x.shape[1]], x.mean(0), rtol=1e-12)
        np.testing.assert_allclose(
            s.variance.reshape(-1)[: x.shape[1]], x.var(0, ddof=1), rtol=1e-9
        )
    flip = r.samples["flip"]
    assert r.statistics["flip"].count + r.statistics["flip"].missing == 3000
    np.testing.assert_array_equal(r.quantile("flip", 0.5), np.nanquantile(flip, 0.5))
    width = 0.1  # the histogram's bin width: quantiles from it are good to one bin
    assert abs(r.statistics["flip"].quantile_from_histogram(0.5) - np.nanmedian(flip)) < width
    assert r.timing["compile_s"] > 0 and r.timing["samples_per_s"] > 0


def test_failures_are_recorded_with_their_ids_and_never_averaged_in():
    """Sample ids ≡ 0 (mod 7) spin at 1e200 rad/s (the state overflows: ``nonfinite``), ids ≡ 3
    (mod 11) get a Drift limit they cannot meet (``implausible``), id 5 a non-unit quaternion
    (``invalid_sample``); statistics are those of the rest; throw=True names the first."""

    def sample(key, i):
        model, state = body_sample(key, i)
        w = jnp.where(i % 7 == 0, 1e200, 1.0)
        a = jnp.where(i == 5, 2.0, 1.0)
        return model, rbjax.State(
            t=state.t,
            q=state.q.at[0, 3].multiply(a),
            u=state.u.at[0, 4:7].multiply(w),
        )

    measures = {
        "w_max": rbjax.Maximum(lambda m, s: s.u[0, 5]),
        "tight": rbjax.Drift(
            lambda m, s: s.u[0, 5] * jnp.where(m.inertia[0, 0, 0] > 1.0, 1.0, 0.0), limit=1e-300
        ),
    }
    n = 200
    r = rbjax.monte_carlo(sample, n, 1e-2, 20, measures, key=1, device_batch=64, progress=False)
    ids = np.arange(n)
    key = jax.random.key(1)
    i11 = np.array(
        [float(body_sample(jax.random.fold_in(key, i), i)[0].inertia[0, 0, 0]) for i in ids]
    )
    nonfinite = ids % 7 == 0
    implausible = ~nonfinite & (i11 > 1.0) & (ids != 5)
    expected = np.where(nonfinite, 1, np.where(ids == 5, 5, np.where(implausible, 3, 0)))
    np.testing.assert_array_equal(r.status, expected)
    np.testing.assert_array_equal(r.failed_ids, ids[expected != 0])
    good = r.samples["w_max"][expected == 0]
    assert r.statistics["w_max"].count == good.size
    np.testing.assert_allclose(r.statistics["w_max"].mean, good.mean(), rtol=1e-13)
    assert "non-finite" in dict(r.failures())[0]
    with pytest.raises(Exception, match="sample 0 failed: the state became non-finite"):
        rbjax.monte_carlo(sample, n, 1e-2, 20, measures, key=1, device_batch=64, throw=True)


def test_bad_arguments_raise_naming_the_field(tmp_path):
    sample, measures, dt, n = CASES["body"]
    with pytest.raises(ValueError, match="n_samples = 0"):
        rbjax.monte_carlo(sample, 0, dt, n, measures)
    with pytest.raises(ValueError, match="no measures"):
        rbjax.monte_carlo(sample, 10, dt, n, {})
    with pytest.raises(ValueError, match="not \\(rbjax.Model, rbjax.State\\)"):
        rbjax.monte_carlo(lambda k, i: 3.0, 10, dt, n, measures)
    with pytest.raises(ValueError, match="trajectories = k needs directory"):
        rbjax.monte_carlo(sample, 10, dt, n, measures, trajectories=10)
    with pytest.raises(ValueError, match="devices = 9"):
        rbjax.monte_carlo(sample, 10, dt, n, measures, devices=9)
    with pytest.raises(ValueError, match="key = 'x'"):
        rbjax.monte_carlo(sample, 10, dt, n, measures, key="x")
    # JAX has started with one CPU device here: asking for it again is fine, for more is not
    assert rbjax.use_cpu_cores(len(jax.devices("cpu"))) == len(jax.devices("cpu"))
    with pytest.raises(RuntimeError, match="already started with 1 CPU device.*Fix: call"):
        rbjax.use_cpu_cores(3)
    with pytest.raises(ValueError, match=r"use_cpu_cores\(n=0\)"):
        rbjax.use_cpu_cores(0)


# ---------------------------------------------------------------- other processes


def _worker(out, *extra, wait=True):
    cmd = [sys.executable, WORKER, str(out), *map(str, extra)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if not wait:
        return proc
    log, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, log
    return dict(np.load(out))


def _same(a: dict, b: dict, prefix_a="", prefix_b=""):
    for name in BODY_MEASURES:
        for part in (f"sample_{name}", f"stat_{name}_mean", f"stat_{name}_m2"):
            np.testing.assert_array_equal(a[prefix_a + part], b[prefix_b + part], err_msg=part)
    np.testing.assert_array_equal(a[prefix_a + "status"], b[prefix_b + "status"])


def _reference(body_run):
    out = {f"sample_{k}": v for k, v in body_run.samples.items()}
    out.update({f"stat_{k}_mean": s.mean for k, s in body_run.statistics.items()})
    out.update({f"stat_{k}_m2": s.m2 for k, s in body_run.statistics.items()})
    out["status"] = body_run.status
    return out


def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_two_processes_of_two_devices_equal_one_process_bit_for_bit(tmp_path, body_run):
    """jax.distributed on localhost (gloo collectives on CPU), 2 processes × 2 CPU devices, one
    mesh over the 4 devices; process 0 writes the run. Same samples and statistics, to the
    bit, as one process sharding over 4 devices; within one unit in the last place of the
    single-device run in this process (compiled without SPMD partitioning). (2 against 4
    devices in one process: the tops' test below.)"""
    single = _worker(tmp_path / "single.npz", "--devices", 4, "--mesh", 4)
    port = _free_port()
    common = ["--devices", 2, "--coordinator", f"localhost:{port}", "--num-processes", 2]
    out = tmp_path / "mp.npz"
    procs = [
        _worker(out, *common, "--process-id", k, "--directory", tmp_path / "run", wait=False)
        for k in (0, 1)
    ]
    for p in procs:
        log, _ = p.communicate(timeout=600)
        assert p.returncode == 0, log
    multi = dict(np.load(out))
    _same(multi, single, "", "4:")
    assert len(os.listdir(tmp_path / "run")) == 6 + 1  # 6 chunks of 512 + the manifest
    for name in BODY_MEASURES:
        a, b = multi[f"sample_{name}"], body_run.samples[name]
        np.testing.assert_allclose(a, b, rtol=4e-16, atol=1e-300, err_msg=name)


def test_a_run_killed_with_sigkill_resumes_without_losing_or_repeating_samples(tmp_path, body_run):
    """The worker stalls after its 3rd chunk (chunks 0-2 on disk) and is SIGKILL-ed; a left-over
    temporary file and a stray chunk file not in the manifest (as a kill in the middle of a
    write leaves them) are planted; the resumed run reads chunks 0-2, computes 3-5, and equals
    the uninterrupted run bit for bit. Then a truncated and a corrupted chunk are recomputed,
    each with a warning naming it."""
    run = tmp_path / "run"
    out = tmp_path / "killed.npz"
    proc = _worker(out, "--directory", run, "--stall-after-chunk", 2, wait=False)
    deadline = time.time() + 300
    while not os.path.exists(str(out) + ".stalled"):
        assert proc.poll() is None, proc.communicate()[0]
        assert time.time() < deadline
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    (run / ".tmp-Xchunk-000003.npz").write_bytes(b"partial")  # removed on resume
    (run / "chunk-000003.npz").write_bytes(b"not an npz")
    res = _worker(tmp_path / "resumed.npz", "--directory", run, "--resume")
    np.testing.assert_array_equal(res["resumed"], [0, 1, 2])
    np.testing.assert_array_equal(res["computed"], [3, 4, 5])
    _same(res, _reference(body_run))
    # A truncated and a corrupted chunk: detected by their checksums and recomputed.
    data = (run / "chunk-000001.npz").read_bytes()
    (run / "chunk-000001.npz").write_bytes(data[: len(data) // 2])
    data = bytearray((run / "chunk-000004.npz").read_bytes())
    data[-100] ^= 0xFF
    (run / "chunk-000004.npz").write_bytes(bytes(data))
    sample, measures, dt, n = CASES["body"]
    with pytest.warns(RuntimeWarning) as seen:
        again = rbjax.monte_carlo(
            sample, 3000, dt, n, measures, key=7, chunk_size=512, device_batch=128,
            directory=run, resume=True, progress=False,
        )  # fmt: skip
    text = " ".join(str(w.message) for w in seen)
    assert "chunk-000001.npz is truncated or corrupt" in text and "chunk-000004.npz" in text
    assert again.chunks_recomputed == (1, 4) and again.chunks_computed == (1, 4)
    assert again.chunks_resumed == (0, 2, 3, 5)
    _same(_reference(again), _reference(body_run))
    with pytest.raises(ValueError, match="n_steps = 300, this call 301"):
        rbjax.monte_carlo(
            sample, 3000, dt, n + 1, measures, key=7, chunk_size=512, device_batch=128,
            directory=run, resume=True, progress=False,
        )  # fmt: skip


def test_chunk_size_and_device_count_do_not_change_a_single_bit(tmp_path):
    """Heavy tops (a mechanism: Spherical joint, Schur complement) in one process with 4 CPU
    devices: chunk size 64 on 2 devices and 128 on 4 devices give the same bits. (The 1-device
    run may differ from them in the last place: XLA compiles it without SPMD partitioning, and
    its algebraic simplifier rewrites differently; measured ≤ 1e-15 rad here, and checked for
    the bodies in the two-process test.)"""
    res = _worker(
        tmp_path / "top.npz", "--model", "top", "--devices", 4, "--n-samples", 256,
        "--device-batch", 32, "--chunk-size", 64, "--mesh", 2, 4,
    )  # fmt: skip
    for name in ("max_nutation", "energy"):
        np.testing.assert_array_equal(res[f"2:sample_{name}"], res[f"4:sample_{name}"])
        np.testing.assert_array_equal(res[f"2:stat_{name}_mean"], res[f"4:stat_{name}_mean"])
    assert np.all(res["2:status"] == 0)


def test_trajectories_are_streamed_to_disk_and_progress_is_reported(tmp_path):
    """trajectories=k writes every sample's state every k steps, chunk by chunk, equal to the
    sample's own rollout; the progress callback sees every chunk once, in order."""
    sample, measures, dt, _ = CASES["body"]
    seen = []
    r = rbjax.monte_carlo(
        sample, 300, dt, 20, {"w_max": measures["w_max"]}, key=3, device_batch=128,
        directory=tmp_path, trajectories=5, progress=seen.append,
    )  # fmt: skip
    assert [p.chunk for p in seen] == [0, 1, 2] and [p.done for p in seen] == [128, 256, 300]
    assert seen[-1].total == 300 and not any(p.resumed for p in seen)
    files = sorted(f for f in os.listdir(tmp_path) if f.startswith("traj-"))
    assert files == ["traj-000000.npz", "traj-000001.npz", "traj-000002.npz"]
    last = np.load(tmp_path / files[-1])
    np.testing.assert_array_equal(last["ids"], np.arange(256, 300))
    assert last["q"].shape == (44, 5, 1, 7)  # 20 steps saved every 5, the initial state too
    key = jax.random.key(3)
    model, state = sample(jax.random.fold_in(key, 299), jnp.asarray(299, jnp.int32))
    traj = rbjax.rollout(model, state, dt, 20, save_every=5)
    np.testing.assert_allclose(last["q"][-1], traj.q, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(last["u"][-1], traj.u, rtol=1e-12, atol=1e-14)
    assert r.samples is not None and r.samples["w_max"].shape == (300, 3)


def test_a_sampled_force_parameter_runs_per_sample_and_matches_its_rollout():
    """A varying leaf outside mass, inertia and gravity (a body torque) is integrated system by
    system (``jax.vmap`` over one-system rollouts) instead of in the batched layout; each sample
    still equals its own rollout, and the shared leaves stay unbatched."""
    base = rbjax.Model(
        rbjax.Body(1.0, np.diag([1.0, 2.0, 2.9])), forces=[rbjax.BodyTorque(0, [0.0, 0.0, 0.0])]
    )

    def sample(key, i):
        torque = 0.1 * jax.random.normal(key, (3,))
        model = eqx.tree_at(lambda m: m.forces[0].torque_body, base, torque)
        return model, rbjax.make_state(omega_body=[[0.0, 1.0, 0.0]])

    measures = {"w": rbjax.Final(lambda m, s: s.u[0, 4:7])}
    r = rbjax.monte_carlo(sample, 40, 1e-2, 30, measures, key=5, device_batch=16, progress=False)
    key = jax.random.key(5)
    for i in (0, 39):
        model, state = sample(jax.random.fold_in(key, i), jnp.asarray(i, jnp.int32))
        traj = rbjax.rollout(model, state, 1e-2, 30, save_every=30)
        np.testing.assert_allclose(r.samples["w"][i], traj.u[-1, 0, 4:7], rtol=1e-12, atol=1e-14)
    assert np.ptp(r.samples["w"][:, 2]) > 1e-3  # the torques differ, and so do the spins
