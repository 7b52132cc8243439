"""``rbjax.monte_carlo``: many perturbed systems, their measures reduced inside the rollout,
merged statistics, every device, resumable.

The run is cut into chunks of ``chunk_size`` samples, integrated one after the other; a chunk
is split over the devices of a one-axis mesh (``jax.shard_map``, devices.py), and each device
integrates its part as ONE batched rollout in the engine's layout with the measures
(rbjax/_measures.py) accumulated inside the time loop. Only the per-sample measure values,
status codes and failing steps leave the devices. Sample i is always built by
``sample(jax.random.fold_in(key, i), i)``, whatever chunk, device or process integrates it,
every sample is integrated by the same per-device program of ``device_batch`` systems, and
statistics are merged over fixed blocks of ids in id order (statistics.py), so the result is
the same bit for bit whatever the chunk size, the number of devices (2 or more) or processes,
or a resume. On ONE device XLA compiles the program without SPMD partitioning, and its
algebraic simplifier may round a few operations differently (measured: a last-bit difference
in 1 of 3000 located flip times; tests/test_montecarlo.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sys
import time
import warnings
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from .._abstract import AbstractModel, AbstractState
from .._analysis.checks import check_mechanism_state
from .._body import validate_inertia, validate_mass
from .._engine.joints import joint_terms
from .._engine.layout import to_components
from .._engine.projection import norm_rows
from .._engine.rollout import DEFAULT_CHUNK
from .._errors import check_declared, declared, validates_inputs
from .._integrators import RK4, AbstractExplicitRK, AbstractIntegrator, SemiImplicitEuler, check_dt
from .._measures import AbstractMeasure, Drift, Event, check_measures
from .._model import Model
from .._monitors import Plausibility
from .._results import RESULTS
from .._rollout import _DEFAULT_MONITORS, _monitor_spec, _rollout
from .._state import State, fresh_tolerances
from .._tree.implicit import ImplicitFast
from .._tree.model import JointModel, JointState
from .._tree.monitors import joint_spec
from .._tree.rollout import batched_parameters, check_joint_state, run_joint
from . import statistics as st
from .devices import sample_mesh
from .store import FORMAT, ROLES, RunStore, run_fingerprint


@dataclasses.dataclass(frozen=True)
class Progress:
    """What a progress callback receives after each chunk."""

    done: int  # samples finished (computed or read back)
    total: int
    samples_per_s: float  # computed samples per second of wall time, compile excluded
    eta_s: float  # estimated seconds left
    chunk: int  # index of the chunk just finished
    resumed: bool  # the chunk was read from disk, not computed


@dataclasses.dataclass(frozen=True)
class MonteCarloResult:
    """The outcome of :func:`rbjax.monte_carlo`.

    ``statistics[name]`` (:class:`Statistics`): count, mean, variance, std, min, max and the
    histogram of each measure over the samples whose ``status`` is ``RESULTS.successful``;
    ``samples[name]`` (n, ...) every sample's value in id order (``keep_samples=True``, else
    None); ``status`` (n,) a :class:`rbjax.RESULTS` code per sample and ``failed_step`` (n,)
    (``keep_samples=True``); ``failed_ids`` / ``failed_status`` the failing samples, always;
    ``timing`` compile and run seconds and samples/s; ``chunks_computed`` / ``chunks_resumed``
    / ``chunks_recomputed`` what a resume found.
    """

    n_samples: int
    statistics: dict[str, st.Statistics]
    samples: dict[str, np.ndarray] | None
    status: np.ndarray | None
    failed_step: np.ndarray | None
    failed_ids: np.ndarray
    failed_status: np.ndarray
    timing: dict[str, float]
    chunks_computed: tuple[int, ...]
    chunks_resumed: tuple[int, ...]
    chunks_recomputed: tuple[int, ...]

    @property
    def n_failed(self) -> int:
        return int(self.failed_ids.size)

    def failures(self) -> list[tuple[int, str]]:
        """(sample id, reason) of every failing sample, in id order."""
        return [
            (int(i), RESULTS(int(c)).message)
            for i, c in zip(self.failed_ids, self.failed_status, strict=True)
        ]

    def quantile(self, name: str, p) -> np.ndarray:
        """Quantile(s) ``p`` of measure ``name`` over the successful samples: exact from the
        kept samples (``np.quantile``, linear interpolation, NaN event values left out), or
        interpolated in the histogram when the samples were not kept."""
        if name not in self.statistics:
            raise ValueError(
                f"quantile(name={name!r}): no such measure. Fix: one of {sorted(self.statistics)}."
            )
        if self.samples is not None and self.status is not None:
            x = self.samples[name][self.status == int(RESULTS.successful)]
            return np.asarray(np.nanquantile(np.asarray(x, np.float64), p, axis=0))
        return self.statistics[name].quantile_from_histogram(p)


def _check_joint_integrator(integrator):
    """The integrators of joint coordinates (rbjax/_tree/rollout.py's check)."""
    if not isinstance(integrator, (AbstractExplicitRK, SemiImplicitEuler, ImplicitFast)):
        raise ValueError(
            f"integrator = {type(integrator).__name__}() does not integrate joint coordinates "
            "yet. Fix: use rbjax.RK4(), rbjax.ExplicitRK(tableau), rbjax.SemiImplicitEuler() "
            "or rbjax.ImplicitFast()."
        )


def _int_ok(x, low):
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= low


def _as_key(key):
    """A typed JAX PRNG key from an int seed, a typed key or raw uint32 key data."""
    if _int_ok(key, 0):
        return jax.random.key(int(key))
    try:
        if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) and key.shape == ():
            return key
        if key.dtype == jnp.uint32:
            return jax.random.wrap_key_data(key)
    except (AttributeError, TypeError, ValueError):
        pass
    raise ValueError(
        f"key = {key!r} is not a seed or a single JAX PRNG key. Fix: pass an int seed (e.g. "
        "key=0) or jax.random.key(0)."
    )


def _probe(sample, key):
    """Sample 0, evaluated now: its types and its physics are checked at build time."""
    try:
        out = sample(jax.random.fold_in(key, 0), jnp.asarray(0, jnp.int32))
    except Exception as e:
        raise ValueError(
            f"sample(key, 0) raised {type(e).__name__}: {e}. Fix: write sample(key, i) -> "
            "(model, state) for ONE system, using jax.random with key and jnp with i."
        ) from e
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], JointModel):
        return _probe_joint(*out)
    if (
        not isinstance(out, tuple)
        or len(out) != 2
        or not isinstance(out[0], Model)
        or not isinstance(out[1], State)
    ):
        raise ValueError(
            f"sample(key, 0) returned {type(out).__name__}, not (rbjax.Model, rbjax.State) "
            "or (rbjax.JointModel, rbjax.JointState). Fix: return the model and the initial "
            "state of ONE system."
        )
    model, state = out
    if state.q.ndim != 2:
        raise ValueError(
            f"sample(key, 0) returned a state with q of shape {state.q.shape}, not (nb, 7). "
            "Fix: return ONE system; the runner batches the samples."
        )
    model.check_state(state)
    check_mechanism_state(model, state)
    validate_inertia("sample(key, 0): model.inertia", model.inertia)
    validate_mass("sample(key, 0): model.mass", model.mass)
    # the rules of forces, joints and formulation, as rollout checks them: a value set with
    # equinox.tree_at bypasses the constructor (otherwise: invalid_input on every sample)
    where = "sample(key, 0): model"
    check_declared(declared(model, where, fields=("forces", "joints", "formulation")))
    return model, state


def _probe_joint(model, state):
    """Sample 0 of a JointModel: one system's JointState, checked as rollout checks it."""
    if not isinstance(state, JointState):
        raise ValueError(
            f"sample(key, 0) returned a JointModel with a {type(state).__name__}, not an "
            "rbjax.JointState. Fix: return (model, rbjax.JointState(t, qpos, qvel)) of ONE system."
        )
    if state.qpos.ndim != 1 or state.qvel.ndim != 1 or jnp.ndim(state.t) != 0:
        raise ValueError(
            f"sample(key, 0) returned a JointState with qpos {state.qpos.shape} and qvel "
            f"{state.qvel.shape}, not (nq,) and (nv,). Fix: return ONE system; the runner "
            "batches the samples."
        )
    batched = batched_parameters(model)
    if batched:
        raise ValueError(
            f"sample(key, 0) returned a JointModel whose {', '.join(batched)} carry batch "
            "axes. Fix: return ONE system's parameters; the runner batches the samples."
        )
    check_joint_state(model, state)
    _check_joint_parameters(model, "sample(key, 0): model")
    return model, state


def _check_joint_parameters(model, where):
    """A JointModel's masses and inertias at build time (ValueError naming the body)."""
    mass, inertia = np.asarray(model.mass), np.asarray(model.inertia)
    for b in range(model.nb):
        eig = np.linalg.eigvalsh(0.5 * (inertia[b] + inertia[b].T))
        if not mass[b] >= 0 or eig[0] < -_PSD * max(eig[-1], 0.0):
            raise ValueError(
                f"{where}.mass[{b}] = {mass[b]:g}, inertia[{b}] eigenvalues {eig.tolist()} "
                f"(body {model.names[b]!r}): a mass must be >= 0 and an inertia positive "
                "semi-definite. Fix: sample physical values (e.g. a log-normal mass)."
            )


_PSD = 1e-9  # relative tolerance of a positive semi-definite inertia (its rounding)


_NATIVE = ("mass", "inertia", "gravity")  # model leaves the engine batches natively


def _fingerprint(closed, key) -> str:
    """SHA-256 of the per-device program (its jaxpr and constants) and the key: a resume must
    run the same program."""
    h = hashlib.sha256(str(closed.jaxpr).encode())
    for c in closed.consts:
        a = np.asarray(c)
        h.update(str((a.dtype, a.shape)).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    h.update(np.asarray(jax.random.key_data(key)).tobytes())
    return h.hexdigest()


class _Kernel:
    """The program of one device's share of a chunk: ids (c,) -> per-sample outputs (c, ...)."""

    def __init__(
        self, sample, probe, mask, measures, integrator, n_steps, trajectories, monitors=None
    ):
        self.sample, self.mask = sample, mask
        self.monitors = monitors
        self.measures, self.integrator = measures, integrator
        self.n_steps, self.trajectories = n_steps, trajectories
        model, state = probe
        dyn, _ = eqx.partition((model, state), eqx.is_array)
        treedef = jax.tree.structure(dyn)
        flags = jax.tree.unflatten(treedef, mask)
        model_flags = flags[0]
        self.model_flags = model_flags
        self.joint = isinstance(model, JointModel)
        if self.joint:  # a JointModel is integrated by a jax.vmap over its sampled leaves
            self.native = not any(jax.tree.leaves(model_flags))
            self.rigid = np.zeros(0, bool)
            return
        others = eqx.tree_at(
            lambda m: tuple(getattr(m, k) for k in _NATIVE), model_flags, (False,) * 3
        )
        self.native = not any(jax.tree.leaves(others))
        self.rigid = np.asarray([not s for s in model.scalable])

    def build(self, key_data, ids):
        key = jax.random.wrap_key_data(key_data)
        keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, ids)
        out = jax.vmap(self.sample)(keys, ids)
        dyn, static = eqx.partition(out, eqx.is_array)
        leaves, treedef = jax.tree.flatten(dyn)
        leaves = [x if b else x[0] for x, b in zip(leaves, self.mask, strict=True)]
        return eqx.combine(jax.tree.unflatten(treedef, leaves), static)

    def __call__(self, key_data, dt, ids):
        """Outputs (c, ...) of the samples ``ids`` (c,); ``dt`` is an input, not a constant (a
        new step size reuses the compiled program)."""
        model, state = self.build(key_data, ids)
        c = ids.shape[0]
        if self.joint:
            return self._joint(model, state, dt, c)
        state = State(
            t=jnp.broadcast_to(state.t, (c,)),
            q=jnp.broadcast_to(state.q, (c,) + state.q.shape[-2:]),
            u=jnp.broadcast_to(state.u, (c,) + state.u.shape[-2:]),
        )
        save = self.trajectories or self.n_steps

        def run(m, s, batch_chunk):  # no in-program error check: failures are per sample
            h, k, mon = self.integrator, self.n_steps, self.monitors
            args = (save, False, False, batch_chunk, 0, self.measures, mon, True)
            return _rollout(m, s, dt, h, k, *args)

        if self.native:
            traj = run(model, state, 0)
        else:  # some varying leaf (a force's or joint's parameter) is not batched natively
            axes = jax.tree.map(lambda b: 0 if b else None, self.model_flags)
            traj = eqx.filter_vmap(lambda m, s: run(m, s, 0), in_axes=(axes, 0))(model, state)
        invalid = jnp.where(self._invalid(model, state), int(RESULTS.invalid_sample), 0)
        out = self._outputs(traj, c, invalid)
        if self.trajectories:
            out.update({"traj_t": traj.t, "traj_q": traj.q, "traj_u": traj.u})
        return out

    def _joint(self, model, state, dt, c):
        """Outputs of a chunk of JointModel samples: one batched rollout when only the state
        varies, else ``jax.vmap`` over one-system rollouts with the sampled leaves mapped
        (rbjax/_tree/rollout.py ``run_joint``: no checks, no raising; the monitors run)."""
        state = JointState(
            jnp.broadcast_to(state.t, (c,)),
            jnp.broadcast_to(state.qpos, (c,) + state.qpos.shape[-1:]),
            jnp.broadcast_to(state.qvel, (c,) + state.qvel.shape[-1:]),
        )
        save = self.trajectories or self.n_steps
        args = (self.integrator, self.n_steps, save, 0, 0, self.measures, self.monitors)

        def run(m, s):
            return run_joint(m, s, dt, *args)

        if self.native:
            traj = run(model, state)
        else:
            axes = jax.tree.map(lambda b: 0 if b else None, self.model_flags)
            traj = eqx.filter_vmap(run, in_axes=(axes, 0))(model, state)
        out = self._outputs(traj, c, self._invalid_joint(model, state))
        if self.trajectories:
            out.update({"traj_t": traj.t, "traj_qpos": traj.qpos, "traj_qvel": traj.qvel})
        return out

    def _outputs(self, traj, c, invalid):
        """Status, failing step and measure values per sample, the measures' own failures
        (a Drift past its limit, a non-finite value) and ``invalid`` (c,) (a RESULTS code
        of a sample that fails the checks of sample 0, 0 where it passes) folded in."""
        names = tuple(self.measures)
        status = traj.result.astype(jnp.int32)
        ok = status == int(RESULTS.successful)
        values = traj.measures or {}
        for name in names:
            m, v = self.measures[name], values[name]
            flat = v.reshape(c, -1)
            if isinstance(m, Drift) and m.limit is not None:
                bad = jnp.any(flat > m.limit, axis=1)
                status = jnp.where(ok & bad, int(RESULTS.implausible), status)
            if not isinstance(m, Event):
                bad = ~jnp.all(jnp.isfinite(flat), axis=1)
                status = jnp.where(ok & bad, int(RESULTS.nonfinite_measure), status)
            ok = status == int(RESULTS.successful)
        status = jnp.where(invalid != 0, invalid, status).astype(jnp.int32)
        out = {"status": status, "failed_step": traj.failed_step.astype(jnp.int32)}
        out.update({f"m_{k}": values[k] for k in names})
        return out

    def _invalid_joint(self, model, state):
        """JointModel samples whose parameters or initial state fail the build-time checks
        of sample 0 (rbjax/_tree/rollout.py ``check_joint_state``, :func:`_probe_joint`): a
        non-finite or non-unit-quaternion state is ``invalid_sample``, a negative mass or an
        indefinite inertia ``invalid_input``, as for maximal models. (c,) int codes, 0 valid."""
        topo = model.topology
        tol = 1e-6 if state.qpos.dtype == jnp.float64 else 1e-3
        bad = ~jnp.all(jnp.isfinite(state.qpos), -1) | ~jnp.all(jnp.isfinite(state.qvel), -1)
        for j, k in enumerate(topo.joint_types):
            if k in ("ball", "free"):
                a = topo.qposadr[j] + (3 if k == "free" else 0)
                n = jnp.linalg.norm(state.qpos[..., a : a + 4], axis=-1)
                bad = bad | ~(jnp.abs(n - 1.0) <= tol)
        c = state.qpos.shape[0]
        mass = jnp.broadcast_to(model.mass, (c,) + model.mass.shape[-1:])
        inertia = jnp.broadcast_to(model.inertia, (c,) + model.inertia.shape[-3:])
        eig = jnp.linalg.eigvalsh(0.5 * (inertia + jnp.swapaxes(inertia, -1, -2)))
        indefinite = eig[..., 0] < -_PSD * jnp.maximum(eig[..., -1], 0.0)
        params = jnp.any(~(mass >= 0) | indefinite | ~jnp.isfinite(eig[..., -1]), axis=-1)
        return jnp.where(
            bad, int(RESULTS.invalid_sample), jnp.where(params, int(RESULTS.invalid_input), 0)
        )

    def _invalid(self, model, state):
        """Samples whose initial state violates the model (the runtime twin of the build-time
        checks of sample 0, with the same tolerances)."""
        atol, tol = fresh_tolerances(state.q.dtype)
        a2 = jnp.sum(state.q[..., 3:7] ** 2, axis=-1)
        rigid = jnp.asarray(self.rigid)
        bad = jnp.any(rigid & ((jnp.abs(a2 - 1) > atol) | (jnp.abs(state.u[..., 3]) > atol)), -1)
        if model.joints:
            t, q, u = to_components(state)
            terms = joint_terms(
                model, model.formulation._engine_kinematics, t, q, u, cdot=True, gamma=False
            )
            worst = jnp.maximum(
                jnp.max(norm_rows(model, terms.c), axis=0),
                jnp.max(norm_rows(model, terms.cdot), axis=0),
            )
            bad = bad | ~(worst <= tol)
        return bad


class _Reporter:
    """Progress to a tqdm bar (on a terminal, or when asked) and/or a callback."""

    def __init__(self, progress, total, lead):
        self.callback = progress if callable(progress) else None
        show = sys.stderr.isatty() if progress is None else progress is True
        self.bar = None
        if show and lead:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, unit="sample", unit_scale=True, smoothing=0.1)
        self.total, self.done, self.computed, self.seconds = total, 0, 0, 0.0

    def update(self, n, chunk, resumed, seconds):
        self.done += n
        if not resumed:
            self.computed += n
            self.seconds += seconds
        rate = self.computed / self.seconds if self.seconds > 0 else float("nan")
        eta = (self.total - self.done) / rate if rate > 0 else float("nan")
        if self.bar is not None:
            self.bar.update(n)
        if self.callback is not None:
            self.callback(Progress(self.done, self.total, rate, eta, chunk, resumed))

    def close(self):
        if self.bar is not None:
            self.bar.close()


@validates_inputs
def monte_carlo(
    sample: Callable[..., tuple[AbstractModel, AbstractState]],
    n_samples: int,
    dt,
    n_steps: int,
    measures: dict[str, AbstractMeasure],
    *,
    key=0,
    integrator: AbstractIntegrator | None = None,
    chunk_size: int | None = None,
    device_batch: int | None = None,
    devices=None,
    directory=None,
    resume: bool = False,
    trajectories: int | None = None,
    keep_samples: bool = True,
    progress=None,
    throw: bool = False,
    monitors: Plausibility | None = _DEFAULT_MONITORS,
) -> MonteCarloResult:
    """Integrate ``n_samples`` systems ``sample(fold_in(key, i), i) -> (model, state)`` for
    ``n_steps`` steps of ``dt`` and reduce their ``measures`` (dict name -> rbjax measure).

    * Deterministic: sample i depends only on (key, i); results are bit-identical for any
      ``chunk_size``, ``devices``, number of processes and after a resume.
    * Each call of the compiled program integrates ``device_batch`` systems on every device
      as one batched rollout (default 1024 for single bodies, 64 for mechanisms); a chunk of
      ``chunk_size`` samples (rounded up to a multiple of devices × device_batch; default one
      call for bodies, four for mechanisms) is written and merged at a time. Memory is bounded
      by the chunk, never by ``n_samples``. Every sample is computed by the same program, so
      results do not depend on the chunk size or on the number of devices and processes
      once the run is sharded (2 or more devices); on ONE device XLA compiles the program
      without SPMD partitioning and its simplifier may round differently (measured: 1 value
      in 3000 differs by one unit in the last place). A different ``device_batch`` may change
      the last bits too (the Schur solver is chosen by batch size).
    * ``devices``: None (every device of every process, see :func:`rbjax.use_cpu_cores`), a
      count or a list; each chunk is split across them.
    * ``directory``: each chunk's results are written there atomically (npz + JSON manifest,
      rbjax/_montecarlo/store.py), every file with the run's fingerprint and its chunk index
      inside and its SHA-256 in the manifest; ``resume=True`` reads back the complete chunks
      and computes the rest. Every file is verified: a missing, truncated or corrupt file of
      this run is recomputed with a ``RuntimeWarning`` naming it; a file of another run or
      of another chunk, and a malformed manifest, raise ``ValueError`` naming the file.
      ``trajectories=k`` also writes the state every k steps of every sample there.
    * Failures: a sample that diverges, whose solver fails, that a plausibility monitor
      (``monitors``, as in :func:`rbjax.rollout`) or a Drift measure's limit finds
      implausible, whose measure is not finite, whose sampled parameters fail the build-time
      checks (a mass <= 0, an indefinite inertia: ``RESULTS.invalid_input``) or whose sampled
      state violates the model is recorded
      in ``failed_ids`` / ``failed_status`` (:class:`rbjax.RESULTS`) and excluded from the
      statistics; ``throw=True`` raises instead, naming the first failing sample.
    * A :class:`rbjax.JointModel` (joint coordinates): ``sample`` returns (JointModel, ONE
      system's :class:`rbjax.JointState`) and the measures see that state. A device's share
      is one batched rollout when only the state varies, else ``jax.vmap`` over one-system
      rollouts with the sampled leaves mapped (a direct rollout refuses batched parameters).
      Its monitors are rbjax/_tree/monitors.py's; a non-finite state or a quaternion off unit
      length is ``invalid_sample``, a negative mass or an indefinite inertia
      ``invalid_input``; ``trajectories=k`` writes ``t``, ``qpos`` and ``qvel``.
    * ``keep_samples``: keep every sample's measure values (n, ...) for exact quantiles; with
      False only the mergeable statistics and the failures are kept.
    * ``progress``: None (a tqdm bar on a terminal), True, False, or a callable receiving a
      :class:`Progress` after each chunk.
    """
    measures = check_measures(measures)
    if not measures:
        raise ValueError(
            "monte_carlo(measures={}) has no measures. Fix: pass e.g. "
            "{'max_nutation': rbjax.Maximum(fn)}."
        )
    if not callable(sample):
        raise ValueError(
            f"sample = {sample!r} is not callable. Fix: pass a function (key, i) -> (model, state)."
        )
    if not _int_ok(n_samples, 1) or n_samples >= 2**31:
        raise ValueError(
            f"n_samples = {n_samples!r} is not an integer in [1, 2**31). Fix: pass e.g. 10_000."
        )
    check_dt(dt)
    if not _int_ok(n_steps, 1):
        raise ValueError(f"n_steps = {n_steps!r} is not a positive integer. Fix: pass e.g. 1000.")
    integrator = RK4() if integrator is None else integrator
    if not isinstance(integrator, AbstractIntegrator):
        raise ValueError(
            f"integrator = {integrator!r} is not an rbjax integrator. Fix: use RK4(), "
            "SemiImplicitEuler() or ImplicitMidpoint()."
        )
    if trajectories is not None and (not _int_ok(trajectories, 1) or n_steps % trajectories):
        raise ValueError(
            f"trajectories = {trajectories!r} does not divide n_steps = {n_steps}. Fix: pass "
            "k >= 1 with n_steps % k == 0 (the state every k steps), or None."
        )
    if trajectories is not None and directory is None:
        raise ValueError(
            "trajectories = k needs directory=...: trajectories are streamed to disk chunk by "
            "chunk, never kept in memory. Fix: pass directory='runs/name'."
        )
    if directory is not None and not isinstance(directory, (str, os.PathLike)):
        raise ValueError(
            f"directory = {directory!r} is not a path. Fix: pass e.g. directory='runs/tops'."
        )
    if resume and directory is None:
        raise ValueError("resume=True needs directory=... (where the run was written).")
    key = _as_key(key)
    key_data = np.asarray(jax.random.key_data(key))
    probe = _probe(sample, key)
    mesh = sample_mesh(devices)
    n_dev = mesh.devices.size
    joint = isinstance(probe[0], JointModel)
    mechanism = joint or bool(probe[0].joints)  # a large step: rbjax/_engine/integrators.py
    if joint:
        _check_joint_integrator(integrator)
    if device_batch is None:
        device_batch = DEFAULT_CHUNK if mechanism else 1024
    if not _int_ok(device_batch, 1):
        raise ValueError(
            f"device_batch = {device_batch!r} is not a positive integer. Fix: e.g. 64, or None."
        )
    call = n_dev * int(device_batch)  # samples per call of the compiled program
    if chunk_size is None:
        chunk_size = call * (4 if mechanism else 1)
    if not _int_ok(chunk_size, 1):
        raise ValueError(f"chunk_size = {chunk_size!r} is not a positive integer. Fix: e.g. 4096.")
    chunk = -(-int(chunk_size) // call) * call

    i0 = jnp.asarray(0, jnp.int32)
    mask = _dependent(sample, key, i0)
    state0 = probe[1]
    dtype = state0.qpos.dtype if isinstance(state0, JointState) else state0.q.dtype
    if joint:
        spec = joint_spec(monitors, probe[0], integrator, dtype)
    else:
        spec = _monitor_spec(monitors, probe[0], integrator, dtype)
    kernel = _Kernel(sample, probe, mask, measures, integrator, n_steps, trajectories, spec)
    ids_spec = jax.ShapeDtypeStruct((int(device_batch),), jnp.int32)  # one device's share
    dt_data = np.asarray(dt, dtype=dtype)
    fingerprint = layout = None  # traced only for a run on disk (a mechanism's: seconds)
    if directory is not None:
        closed, shapes = jax.make_jaxpr(kernel, return_shape=True)(key_data, dt_data, ids_spec)
        fingerprint, layout = _fingerprint(closed, key), _layout(shapes)

    program = jax.jit(
        jax.shard_map(
            kernel,
            mesh=mesh,
            in_specs=(P(), P(), P("samples")),
            out_specs=P("samples"),
            check_vma=False,
        )
    )
    ids_sharding = NamedSharding(mesh, P("samples"))
    key_sharding = NamedSharding(mesh, P())
    cache_key = _program_key(sample, measures, integrator, n_steps, trajectories, mesh, call)
    cache_key = cache_key + (dt_data.dtype.name, key_data.shape)
    compiled = [_PROGRAMS[cache_key][1]] if cache_key in _PROGRAMS else []

    def run_call(*args):
        if not compiled:  # on first use: a resume that finds every chunk compiles nothing
            t0 = time.perf_counter()
            compiled.append(
                program.lower(
                    jax.ShapeDtypeStruct(key_data.shape, key_data.dtype, sharding=key_sharding),
                    jax.ShapeDtypeStruct((), dt_data.dtype, sharding=key_sharding),
                    jax.ShapeDtypeStruct((call,), jnp.int32, sharding=ids_sharding),
                ).compile()
            )
            timing["compile_s"] = time.perf_counter() - t0
            _remember(cache_key, (sample, measures, integrator), compiled[0])
        return compiled[0](*args)

    def run_chunk(lo):
        """One chunk: ``chunk // call`` calls of the same program, all dispatched before the
        first result is read (JAX dispatches asynchronously), then gathered to the host."""
        outs = []
        for k in range(chunk // call):
            ids = np.arange(lo + k * call, lo + (k + 1) * call, dtype=np.int32)
            ids_arr = jax.make_array_from_callback((call,), ids_sharding, lambda i, ids=ids: ids[i])
            outs.append(run_call(key_arr, dt_arr, ids_arr))
        parts = [_gather(o) for o in outs]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    timing = {"compile_s": 0.0}
    key_arr = jax.make_array_from_callback(key_data.shape, key_sharding, lambda i: key_data[i])
    dt_arr = jax.make_array_from_callback((), key_sharding, lambda i: dt_data[i])

    config = {
        "n_samples": int(n_samples),
        "chunk_size": chunk,
        "device_batch": int(device_batch),
        "n_steps": int(n_steps),
        "dt": float(dt),
        "key": key_data.tolist(),
        "measures": {k: repr(type(m).__name__) for k, m in measures.items()},
        "trajectories": trajectories,
        "dtype": dt_data.dtype.name,
        "program": fingerprint,
    }
    lead = jax.process_index() == 0
    store = RunStore(directory) if directory is not None else None
    n_chunks = -(-n_samples // chunk)
    manifest = _open_run(store, config, resume, lead, n_chunks)

    acc = _Accumulator(measures, n_samples, keep_samples)
    reporter = _Reporter(progress, n_samples, lead)
    computed, resumed, recomputed = [], [], []
    run_s = 0.0
    try:
        for c in range(n_chunks):
            lo, hi = c * chunk, min((c + 1) * chunk, n_samples)
            data = None
            entry = manifest["chunks"].get(str(c)) if manifest is not None else None
            if entry is not None and manifest is not None and store and layout is not None:
                data, problem = _read_chunk(store, entry, c, manifest["run"], layout, lo, hi)
                if data is None:
                    recomputed.append(c)
                    if lead:
                        warnings.warn(
                            f"monte_carlo(directory={store.directory!r}): {problem}; chunk {c} "
                            "is recomputed.",
                            RuntimeWarning,
                            stacklevel=2,
                        )
            seconds = 0.0
            if data is None:
                before = timing["compile_s"]
                t1 = time.perf_counter()
                out = run_chunk(lo)
                seconds = time.perf_counter() - t1 - (timing["compile_s"] - before)
                run_s += seconds
                data = {k: v[: hi - lo] for k, v in out.items()}
                data["ids"] = np.arange(lo, hi, dtype=np.int32)
                if store is not None and manifest is not None:
                    _write_chunk(store, manifest, c, data, lead)
                computed.append(c)
            else:
                resumed.append(c)
            acc.add(data)
            reporter.update(hi - lo, c, c in resumed, seconds)
            if throw and acc.failed_ids:
                i, code = acc.failed_ids[0], acc.failed_status[0]
                raise eqx.EquinoxRuntimeError(
                    f"rbjax.monte_carlo: sample {i} failed: {RESULTS(code).message}. Pass "
                    "throw=False to record failures and exclude them from the statistics."
                )
    finally:
        reporter.close()
    n_run = sum(min((c + 1) * chunk, n_samples) - c * chunk for c in computed)
    timing["run_s"] = run_s
    timing["samples_per_s"] = n_run / run_s if run_s > 0 else float("nan")
    return acc.result(timing, tuple(computed), tuple(resumed), tuple(recomputed))


# Compiled programs of recent calls, so that calling monte_carlo again with the same sampler,
# measures and settings (another key, n_samples, dt, chunk size or directory) does not compile
# again. Keyed by the identity of the sampler and the measures (kept alive in the entry, so
# an id is never reused while its entry exists) and by the value of everything else.
_PROGRAMS: dict[tuple, tuple[tuple, Callable]] = {}
_PROGRAMS_MAX = 8


def _value_key(tree) -> tuple:
    leaves, treedef = jax.tree.flatten(tree)
    return (treedef,) + tuple(
        (np.shape(x), np.asarray(x).dtype.name, np.asarray(x).tobytes()) if eqx.is_array(x) else x
        for x in leaves
    )


def _program_key(sample, measures, integrator, n_steps, trajectories, mesh, call) -> tuple:
    return (
        id(sample),
        tuple((k, id(m)) for k, m in measures.items()),
        _value_key(integrator),
        n_steps,
        trajectories,
        tuple(d.id for d in mesh.devices.flat),
        call,
        bool(jax.config.read("jax_enable_x64")),
    )


def _remember(key, objects, compiled):
    if len(_PROGRAMS) >= _PROGRAMS_MAX:
        _PROGRAMS.pop(next(iter(_PROGRAMS)))
    _PROGRAMS[key] = (objects, compiled)


def _dependent(sample, key, i0):
    from .sampling import dependent_leaves

    return dependent_leaves(sample, jax.random.fold_in(key, 0), i0)


def _gather(out) -> dict[str, np.ndarray]:
    """Per-sample outputs as host arrays, from every process."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        return {
            k: np.asarray(v) for k, v in multihost_utils.process_allgather(out, tiled=True).items()
        }
    return {k: np.asarray(v) for k, v in jax.device_get(out).items()}


def _layout(shapes) -> dict[str, dict[str, tuple[tuple[int, ...], np.dtype]]]:
    """Per file kind, the arrays of a chunk's file: name -> (per-sample shape, dtype), from
    the per-device program's outputs (c, ...)."""
    per = {k: (tuple(v.shape[1:]), np.dtype(v.dtype)) for k, v in shapes.items()}
    ids = ((), np.dtype(np.int32))
    summary = {k: v for k, v in per.items() if not k.startswith("traj_")}
    traj = {k[5:]: v for k, v in per.items() if k.startswith("traj_")}
    return {"chunk": {"ids": ids, **summary}, "traj": {"ids": ids, **traj}}


def _read_chunk(store, entry, c, run, layout, lo, hi):
    """Chunk c's summary arrays, every file of it verified (RunStore.read_file, which raises
    on a file of another run); (None, why) when one of them must be recomputed."""
    ids = np.arange(lo, hi, dtype=np.int32)
    data, problems = None, []
    for role, kind in ROLES.items():  # all of them: a foreign file is refused, not overwritten
        if role in entry:
            arrays, problem = store.read_file(entry[role], kind, c, run, layout[kind], ids)
            if arrays is None:
                problems.append(problem)
            elif role == "summary":
                data = arrays
    return (None, "; ".join(problems)) if problems else (data, "")


def _open_run(store, config, resume, lead, n_chunks):
    """The manifest of a run on disk: the resumed one, checked against this call (its
    configuration, its fingerprint, the shape of every chunk entry), or a new one."""
    if store is None:
        return None
    if lead:
        os.makedirs(store.directory, exist_ok=True)
    run = run_fingerprint(config)
    manifest = store.read_manifest() if resume else None
    if manifest is not None:
        store.check_config_keys(manifest, config)
        for k, v in config.items():
            if manifest["config"][k] != v:
                raise ValueError(
                    f"monte_carlo(directory={store.directory!r}, resume=True): the run on disk "
                    f"has {k} = {manifest['config'][k]!r}, this call {v!r}. Fix: call with "
                    "the same arguments (same sampler, measures, key, chunk_size and "
                    "device_batch), or resume=False to start again, or another directory."
                )
        store.check_entries(manifest, run, n_chunks, config["trajectories"] is not None)
        if lead:  # what a write killed half-way left behind
            for name in os.listdir(store.directory):
                if name.startswith(".tmp-"):
                    os.unlink(store.path(name))
        return manifest
    manifest = {"format": FORMAT, "run": run, "config": config, "chunks": {}}
    if lead:
        store.write_manifest(manifest)
    return manifest


def _write_chunk(store, manifest, c, data, lead):
    """The chunk's files, then the manifest that lists them (process 0 writes)."""
    if not lead:
        return
    run = manifest["run"]
    summary = {k: v for k, v in data.items() if not k.startswith("traj_")}
    entry = {"summary": store.write_file("chunk", c, run, summary)}
    if "traj_t" in data:
        traj = {"ids": data["ids"]}
        traj.update({k[5:]: v for k, v in data.items() if k.startswith("traj_")})
        entry["trajectories"] = store.write_file("traj", c, run, traj)
    manifest["chunks"][str(c)] = entry
    store.write_manifest(manifest)


class _Accumulator:
    """Statistics folded in fixed id blocks (statistics.BLOCK) in id order, failures, and
    (keep_samples) every sample's values."""

    def __init__(self, measures, n, keep):
        self.measures, self.n, self.keep = measures, n, keep
        self.stats: dict[str, st.Statistics | None] = {k: None for k in measures}
        self.pending: list[dict[str, np.ndarray]] = []
        self.n_pending = 0
        self.next_block = 0
        self.kept: list[dict[str, np.ndarray]] = []
        self.failed_ids: list[int] = []
        self.failed_status: list[int] = []

    def add(self, data):
        data = {k: v for k, v in data.items() if not k.startswith("traj_")}
        bad = np.flatnonzero(data["status"] != int(RESULTS.successful))
        self.failed_ids.extend(int(i) for i in data["ids"][bad])
        self.failed_status.extend(int(s) for s in data["status"][bad])
        if self.keep:
            self.kept.append(data)
        self.pending.append(data)
        self.n_pending += len(data["ids"])
        self._fold(final=False)

    def _fold(self, final):
        while self.pending:
            start = self.next_block * st.BLOCK
            end = min(start + st.BLOCK, self.n)
            if not final and self.n_pending < end - start:
                return
            joined = {k: np.concatenate([d[k] for d in self.pending]) for k in self.pending[0]}
            take = end - start
            block = {k: v[:take] for k, v in joined.items()}
            rest = {k: v[take:] for k, v in joined.items()}
            ok = block["status"] == int(RESULTS.successful)
            for name, m in self.measures.items():
                b = st.block_statistics(block[f"m_{name}"], ok, m.bins)
                prev = self.stats[name]
                self.stats[name] = b if prev is None else st.merge(prev, b)
            self.next_block += 1
            self.pending = [rest] if len(rest["ids"]) else []
            self.n_pending = len(rest["ids"])

    def result(self, timing, computed, resumed, recomputed) -> MonteCarloResult:
        self._fold(final=True)
        samples = status = failed_step = None
        if self.keep:
            joined = {k: np.concatenate([d[k] for d in self.kept]) for k in self.kept[0]}
            samples = {name: joined[f"m_{name}"] for name in self.measures}
            status, failed_step = joined["status"], joined["failed_step"]
        stats = {k: v for k, v in self.stats.items() if v is not None}
        return MonteCarloResult(
            n_samples=self.n,
            statistics=stats,
            samples=samples,
            status=status,
            failed_step=failed_step,
            failed_ids=np.asarray(self.failed_ids, np.int64),
            failed_status=np.asarray(self.failed_status, np.int32),
            timing=timing,
            chunks_computed=computed,
            chunks_resumed=resumed,
            chunks_recomputed=recomputed,
        )
