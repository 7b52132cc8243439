"""Rollouts: ``lax.scan`` over time, one jit boundary, batch axes anywhere in front.

``rollout(model, state0, dt, n_steps)`` accepts a single system or any leading batch axes on
the state and/or the model's parameters (broadcast together). Batches are integrated in the
component-first layout (rbjax/_engine/kernels.py) with the batch as the minor axis, which is what makes a
batched rollout fast on CPU; the same function also works under ``jax.vmap``, ``jax.grad`` and
``jax.jvp`` (it is an equinox filter-jitted pure function).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from fractions import Fraction

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from ._analysis.checks import check_mechanism_state
from ._body import validate_inertia, validate_mass
from ._engine.layout import to_components
from ._engine.rollout import DEFAULT_CHUNK, chunked, integrate
from ._errors import is_concrete, validates_inputs
from ._integrators import RK4, AbstractIntegrator, check_dt
from ._measures import check_measures
from ._results import RESULTS
from ._state import State


class Trajectory(eqx.Module):
    """Saved states of a rollout, including the initial state.

    ``t`` (*batch, T), ``q`` and ``u`` (*batch, T, nb, 7) with T = n_steps // save_every + 1;
    ``lam`` (*batch, T, nb + m) the formulation's multipliers at each saved state (or None): the
    scaling multiplier of each body, then the m joint equations in ``model.joints`` order;
    ``result`` (*batch,) a :class:`rbjax.RESULTS` code per system (``RESULTS.successful``,
    ``nonfinite``: the state became non-finite, ``solver_failed``: an implicit solve failed);
    ``failed_step`` (*batch,) the first failing step index, −1 if none;
    ``measures`` (dict name -> (*batch, ...)) the values of ``rollout(..., measures=...)``
    (rbjax/_measures.py), or None.
    """

    t: Float[Array, "*batch T"]
    q: Float[Array, "*batch T nb 7"]
    u: Float[Array, "*batch T nb 7"]
    lam: Float[Array, "*batch T nm"] | None
    result: Int[Array, "*batch"]
    failed_step: Int[Array, "*batch"]
    measures: dict[str, Array] | None = None

    @property
    def states(self) -> State:
        return State(t=self.t, q=self.q, u=self.u)

    def __getitem__(self, i) -> State:
        """The i-th saved state (of every batch member)."""
        return State(t=self.t[..., i], q=self.q[..., i, :, :], u=self.u[..., i, :, :])

    @property
    def final(self) -> State:
        """The last saved state (the state after the last step)."""
        return self[-1]


def _plain_int(k):
    """A NumPy integer becomes a Python int (a static field must not hold an array scalar)."""
    return int(k) if isinstance(k, np.integer) else k


@validates_inputs
class Checkpoint(eqx.Module):
    """Reverse-mode checkpointing of a rollout: ``rollout(..., checkpoint=Checkpoint(every=k))``.

    Reverse mode (``jax.grad``, ``jax.vjp``) then stores only the state at every k-th step and
    recomputes the k steps of one group at a time in the backward pass (``jax.checkpoint``
    around each group), so its memory is O(n_steps / k + k) states' worth of residuals instead
    of the residuals of every step. k must divide ``save_every`` (each saved chunk is split into
    groups of k steps) or be a multiple of ``save_every`` that divides ``n_steps`` (groups of
    k / save_every saved chunks).

    * ``Checkpoint(every=1)`` (the default): every step is recomputed from its stored state; for
      explicit schemes on CPU that is FASTER than storing every step's residuals (less memory
      traffic; benchmarks/gradients.py) and needs one state per step.
    * ``Checkpoint(every=None)``: the allowed k nearest to √n_steps (least memory, about one
      extra forward pass).
    * ``checkpoint=None`` in :func:`rollout`: no checkpointing, every step's residuals are
      stored; for ImplicitMidpoint, whose Newton solve dominates a step, 10-60 % faster when
      its memory is available.

    Forward mode and plain evaluation are unaffected; the trajectory is bitwise the same
    whatever the choice.
    """

    every: int | None = eqx.field(static=True, default=1, converter=_plain_int)

    def __check_init__(self):
        k = self.every
        if k is not None and (isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1):
            raise ValueError(
                f"Checkpoint.every = {k!r} is not a positive integer or None. Fix: pass the "
                "interval in steps (e.g. Checkpoint(every=10)), or Checkpoint(every=None) for "
                "about sqrt(n_steps) steps."
            )


_EVERY_STEP = Checkpoint(every=1)


@dataclasses.dataclass(frozen=True)
class _StepMessages(Sequence[str]):
    """The error message of every (result code, step) pair, formatted only when one is raised
    (``equinox.branched_error_if`` reads ``msgs[index]`` on the host), so a rollout of any length
    costs nothing at trace time. Index = (code − 1) · n_steps + step."""

    n_steps: int

    def __len__(self) -> int:
        return 2 * self.n_steps

    def __getitem__(self, index):  # an int index (equinox reads one message)
        code, step = RESULTS(1 + index // self.n_steps), index % self.n_steps
        return (
            f"rbjax.rollout: {code.message} at step {step} (step 0 advances the initial state). "
            "Reduce dt, check forces and initial conditions, or pass throw=False and inspect "
            "Trajectory.result / Trajectory.failed_step."
        )


@validates_inputs
def rollout(
    model,
    state0: State | Trajectory,
    dt,
    n_steps: int,
    *,
    integrator: AbstractIntegrator | None = None,
    save_every: int = 1,
    multipliers: bool = False,
    throw: bool = True,
    batch_chunk: int | None = None,
    checkpoint: Checkpoint | None = _EVERY_STEP,
    measures: dict | None = None,
) -> Trajectory:
    """Integrate ``n_steps`` steps of size ``dt`` and save every ``save_every``-th state.

    ``state0``: the initial :class:`State`, or a :class:`Trajectory` to CONTINUE from its
    final state. A State is checked at build time (a rigid body's |A|² = 1 and ν = 0 to 1e-9,
    the joints' position and velocity equations to 1e-8). A Trajectory's final state carries
    the drift its integrator left (RK4 at dt = 10 ms: |A|² − 1 ≈ 1e-8 after 10⁴ steps of a
    spinning body, double-pendulum joints ≈ 5e-5 after 10³ steps), which those checks would
    reject; continuing skips them, exactly as one longer rollout would have carried on, and
    ``rollout(model, rollout(model, s, dt, n), dt, k)`` ends in the same q and u, bit for bit,
    as ``rollout(model, s, dt, n + k)`` (for a model that does not depend on time; times are
    t_n + j·dt instead of t₀ + (n + j)·dt, equal to rounding). To put a drifted state back ON
    the manifold instead, use :func:`rbjax.assemble` (it moves the state by the drift) or the
    :class:`rbjax.Projected` integrator.

    Validates its inputs (ValueError naming the argument), then runs one filter-jitted
    ``lax.scan``. Inside, a state that turns non-finite or an implicit step that fails to
    converge raises (``eqx.error_if`` family) naming the first failing step; with
    ``throw=False`` the failure is reported in ``Trajectory.result`` and ``failed_step``.

    ``batch_chunk``: a batch of B systems is integrated in pieces of this many systems, each
    over the whole time span (``lax.map`` over pieces), so that a piece's working set stays in
    cache. ``None`` picks 64 for mechanisms on a CPU backend (measured in benchmarks/) and no
    chunking for free bodies or on a GPU/TPU backend, where the pieces would run one after
    the other (measured on an H200: a double pendulum ran 2.6e5 steps/s at every batch from
    64 to 8192 with pieces of 64, the humanoid of examples/models 8.1e5 at B = 1024 without
    them; benchmarks/loaded.py); 0 disables it. Results do not depend on it.

    ``checkpoint``: reverse-mode checkpointing, a :class:`Checkpoint` (default: every step
    recomputed in the backward pass) or ``None`` (store every step's residuals).

    ``measures``: statistics computed inside the time loop without saving the trajectory, a
    dict name -> :class:`rbjax.Final`, :class:`rbjax.Maximum`, :class:`rbjax.Minimum`,
    :class:`rbjax.Mean`, :class:`rbjax.Drift` or :class:`rbjax.Event` (located zero
    crossings); their values are returned in ``Trajectory.measures``. Each measure's function
    sees ONE system: the model with that system's mass, inertia and gravity (other leaves
    as given) and its State.
    """
    integrator = RK4() if integrator is None else integrator
    if not isinstance(integrator, AbstractIntegrator):
        raise ValueError(
            f"integrator = {integrator!r} is not an rbjax integrator. Fix: use RK4(), SemiImplicitEuler() or ImplicitMidpoint()."
        )
    continuing = isinstance(state0, Trajectory)
    if continuing:
        codes = np.asarray(state0.result) if is_concrete(state0.result) else None
        if codes is not None and np.any(codes != int(RESULTS.successful)):
            bad = int(np.flatnonzero(codes.reshape(-1) != int(RESULTS.successful))[0])
            raise ValueError(
                f"state0 is a Trajectory whose system {bad} (flat index) failed "
                f"({RESULTS(int(codes.reshape(-1)[bad])).message}); it cannot be continued. "
                "Fix: continue only the successful systems, or rerun with a smaller dt."
            )
        state0 = state0.final
    if not isinstance(state0, State):
        raise ValueError(
            f"state0 = {type(state0).__name__} is not an rbjax.State or Trajectory. Fix: build "
            "it with rbjax.make_state(...), or pass a Trajectory to continue it."
        )
    check_dt(dt)
    if (
        isinstance(n_steps, (bool, np.bool_))
        or not isinstance(n_steps, (int, np.integer))
        or n_steps < 1
    ):
        raise ValueError(
            f"n_steps = {n_steps!r} is not a positive integer. Fix: pass the number of steps as an int >= 1."
        )
    bad_type = isinstance(save_every, (bool, np.bool_)) or not isinstance(
        save_every, (int, np.integer)
    )
    if bad_type or save_every < 1 or n_steps % save_every:
        raise ValueError(
            f"save_every = {save_every!r} does not divide n_steps = {n_steps}. Fix: choose save_every >= 1 with n_steps % save_every == 0."
        )
    if continuing:  # the integrator's drift is accepted; the body count is still checked
        model.check_state(state0, atol=float("inf"))
    else:
        model.check_state(state0)
        check_mechanism_state(model, state0)
    if is_concrete(model.inertia):
        validate_inertia("model.inertia", model.inertia)
    validate_mass("model.mass", model.mass)
    if batch_chunk is None:
        on_cpu = jax.default_backend() == "cpu"
        batch_chunk = DEFAULT_CHUNK if model.joints and on_cpu else 0
    if not isinstance(batch_chunk, (int, np.integer)) or batch_chunk < 0:
        raise ValueError(
            f"batch_chunk = {batch_chunk!r} is not a non-negative integer. Fix: pass e.g. 64, "
            "0 (no chunking) or None (automatic)."
        )
    interval = _checkpoint_interval(checkpoint, int(n_steps), int(save_every))
    measures = check_measures(measures)
    # Called with concrete inputs, the compiled program carries no error check: the result code
    # is read and raised here, on the host. A program with a host callback (equinox's
    # error_if) is never stored by JAX's persistent compilation cache, so this keeps rollouts
    # cacheable (rbjax.compilation_cache). Under a caller's trace the check stays inside.
    traced = not is_concrete((model, state0, dt, integrator))
    traj = _rollout(
        model,
        state0,
        dt,
        integrator,
        int(n_steps),
        int(save_every),
        bool(multipliers),
        bool(throw) and traced,
        int(batch_chunk),
        interval,
        measures,
    )
    if throw and not traced:
        _raise_on_failure(traj, int(n_steps))
    return traj


def _raise_on_failure(traj: Trajectory, n_steps: int):
    """Raise ``equinox.EquinoxRuntimeError`` (the type the in-program check raises) for the
    first failing system of a finished rollout, with the message naming its step."""
    codes = np.asarray(traj.result).reshape(-1)
    failed = np.flatnonzero(codes != int(RESULTS.successful))
    if failed.size:
        k = int(failed[0])
        step = max(int(np.asarray(traj.failed_step).reshape(-1)[k]), 0)
        raise eqx.EquinoxRuntimeError(_StepMessages(n_steps)[(int(codes[k]) - 1) * n_steps + step])


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _allowed_intervals(n_steps: int, save_every: int) -> list[int]:
    """Checkpoint intervals: divisors of save_every and multiples of it that divide n_steps."""
    return sorted(
        set(_divisors(save_every)) | {save_every * d for d in _divisors(n_steps // save_every)}
    )


def _checkpoint_interval(checkpoint, n_steps: int, save_every: int) -> int:
    """The checkpoint interval k in steps of ``rollout(..., checkpoint=...)`` (0 = off).

    ``Checkpoint(every=None)`` gives the allowed k nearest to √n_steps in log distance (ties:
    the smaller k). Raises ValueError for anything that is not a Checkpoint or None, and for an
    interval that does not fit ``save_every`` and ``n_steps``."""
    if checkpoint is None:
        return 0
    if not isinstance(checkpoint, Checkpoint):
        raise ValueError(
            f"checkpoint = {checkpoint!r} is not an rbjax.Checkpoint or None. Fix: pass "
            "Checkpoint(every=k) (an interval in steps), Checkpoint(every=None) (about "
            "sqrt(n_steps) steps), Checkpoint() (the default, every step) or None (no "
            "checkpointing)."
        )
    allowed = _allowed_intervals(n_steps, save_every)
    if checkpoint.every is None:
        # log distance |log k − ½ log n| compared exactly: the ratio max(k², n) / min(k², n)
        return min(allowed, key=lambda k: (Fraction(max(k * k, n_steps), min(k * k, n_steps)), k))
    k = int(checkpoint.every)
    if k not in allowed:
        near = sorted(sorted(allowed, key=lambda a: (Fraction(max(a, k), min(a, k)), a))[:3])
        raise ValueError(
            f"checkpoint = Checkpoint(every={k}): {k} neither divides save_every = {save_every} "
            f"nor is a multiple of it that divides n_steps = {n_steps}. Fix: pass one of "
            f"{near} (nearest allowed values), or Checkpoint(every=None) (about sqrt(n_steps))."
        )
    return k


@eqx.filter_jit
def _rollout(
    model,
    state0,
    dt,
    integrator,
    n_steps,
    save_every,
    multipliers,
    throw,
    batch_chunk,
    checkpoint,
    measures,
):
    t, q, u = to_components(state0)
    # Broadcast the state over the batch axes of the model parameters (leading axes).
    batch = jnp.broadcast_shapes(
        q.shape[1:-1], model.mass.shape[:-1], model.inertia.shape[:-3], model.gravity.shape[:-1]
    )
    nb = model.nb

    def lift(x, lead):  # insert missing batch axes after the ``lead`` component axes
        missing = len(batch) - (x.ndim - lead - 1)
        return x.reshape(x.shape[:lead] + (1,) * missing + x.shape[lead:])

    q = jnp.broadcast_to(lift(q, 1), (7,) + batch + (nb,))
    u = jnp.broadcast_to(lift(u, 1), (7,) + batch + (nb,))
    t = jnp.broadcast_to(lift(t, 0), batch + (1,))
    h = jnp.asarray(dt, q.dtype)
    args = (integrator, h, n_steps, save_every, multipliers, checkpoint, tuple(measures.values()))
    B = batch[0] if len(batch) == 1 else 0
    if batch_chunk and B > batch_chunk:
        saved, fail_code, fail_step, values = chunked(model, t, q, u, batch, batch_chunk, args)
    else:
        saved, fail_code, fail_step, values = integrate(model, t, q, u, batch, *args)
    # time axis after the batch axes: (T, *batch, ...) -> (*batch, T, ...)
    nbatch = len(batch)
    saved = tuple(jnp.moveaxis(x, 0, nbatch) for x in saved)
    traj = Trajectory(
        t=saved[0],
        q=saved[1],
        u=saved[2],
        lam=saved[3] if multipliers else None,
        result=fail_code,
        failed_step=fail_step,
        measures=dict(zip(measures, values, strict=True)) if measures else None,
    )
    if throw:
        index = (fail_code - 1) * n_steps + jnp.maximum(fail_step, 0)
        traj = eqx.branched_error_if(
            traj, fail_code != int(RESULTS.successful), index, _StepMessages(n_steps)
        )
    return traj
