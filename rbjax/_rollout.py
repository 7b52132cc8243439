"""Rollouts: ``lax.scan`` over time, one jit boundary, batch axes anywhere in front.

``rollout(model, state0, dt, n_steps)`` accepts a single system or any leading batch axes on
the state and/or the model's parameters (broadcast together). Batches are integrated in the
component-first layout (rbjax/_engine/kernels.py) with the batch as the minor axis, which is what makes a
batched rollout fast on CPU; the same function also works under ``jax.vmap``, ``jax.grad`` and
``jax.jvp`` (it is an equinox filter-jitted pure function).
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from collections.abc import Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, overload

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from ._abstract import AbstractModel, AbstractState, AbstractTrajectory
from ._analysis.checks import check_mechanism_state, input_violations, model_rules
from ._body import validate_inertia, validate_mass
from ._engine import rank
from ._engine.layout import to_components
from ._engine.monitors import Spec, cheaply_compiled
from ._engine.rollout import _WORK, DEFAULT_CHUNK, chunked, integrate, watch
from ._errors import check_declared, is_concrete, validates_inputs
from ._gradient_guard import guard_inputs, guard_output
from ._integrators import RK4, AbstractIntegrator, check_dt
from ._measures import check_measures
from ._model import require_model
from ._monitors import Plausibility, energy_watch
from ._results import RESULTS
from ._state import State, saved_state
from ._tree.model import JointModel, JointState
from ._tree.rollout import JointTrajectory


class Trajectory(AbstractTrajectory):
    """Saved states of a rollout of a :class:`rbjax.Model`, including the initial state (an
    :class:`rbjax.AbstractTrajectory`).

    ``t`` (*batch, T), ``q`` and ``u`` (*batch, T, nb, 7) with T = n_steps // save_every + 1;
    ``lam`` (*batch, T, nb + m) the formulation's multipliers at each saved state (or None): the
    scaling multiplier of each body, then the m joint equations in ``model.joints`` order;
    ``result`` (*batch,) a :class:`rbjax.RESULTS` code per system (``RESULTS.successful``,
    ``nonfinite``: the state became non-finite, ``solver_failed``: an implicit solve failed,
    ``implausible``: a runtime monitor exceeded its limit, ``invalid_input``: a traced input
    failed the build-time checks);
    ``failed_step`` (*batch,) the first failing step index (for ``implausible`` the last step
    of the saved chunk where it was seen), −1 if none;
    ``measures`` (dict name -> (*batch, ...)) the values of ``rollout(..., measures=...)``
    (rbjax/_measures.py), or None;
    ``monitors`` (dict name -> (*batch,)) the worst value of each watched plausibility
    quantity over the saved states ("unit_length", "joints", "energy"; rbjax/_monitors.py),
    or None when none is watched.
    """

    t: Float[Array, "*batch T"]
    q: Float[Array, "*batch T nb 7"]
    u: Float[Array, "*batch T nb 7"]
    lam: Float[Array, "*batch T nm"] | None
    result: Int[Array, "*batch"]
    failed_step: Int[Array, "*batch"]
    measures: dict[str, Array] | None = None
    monitors: dict[str, Array] | None = None

    @property
    def states(self) -> State:
        """Every saved state, as one State with axes (*batch, T). After a failure
        (``throw=False``) the states from ``failed_step`` on hold its NaN or inf as they are,
        readable with :attr:`result`; they cannot be continued (:func:`rollout` refuses)."""
        return saved_state(self.t, self.q, self.u)

    def __getitem__(self, i) -> State:
        """The i-th saved state (of every batch member), NaN where a member had failed."""
        return saved_state(self.t[..., i], self.q[..., i, :, :], self.u[..., i, :, :])

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


_QUANTITY = {
    "unit_length": "| |A|² − 1 | of a rigid body",
    "joints": "the joint residual |Φ|",
    "energy": "the relative energy change",
}

_RESULT_FIX = {
    RESULTS.nonfinite: "Reduce dt, check forces and initial conditions",
    RESULTS.solver_failed: "Reduce dt, check forces and initial conditions",
    RESULTS.implausible: (
        "Reduce dt (or use ImplicitMidpoint or Projected(RK4())), check forces and initial "
        "conditions; loosen a limit knowingly with monitors=rbjax.Plausibility(...) or "
        "disable them with monitors=None"
    ),
}


@dataclasses.dataclass(frozen=True)
class _StepMessages(Sequence[str]):
    """The error message of every (result code, step) pair, formatted only when one is raised
    (``equinox.branched_error_if`` reads ``msgs[index]`` on the host), so a rollout of any length
    costs nothing at trace time. Index = (code − 1) · n_steps + step. ``spec``: the monitors'
    limits, named in the message of an implausible system."""

    n_steps: int
    spec: Spec | None = None
    loops: str = ""  # said of a failed step of a model whose joint equations can be dependent

    def __len__(self) -> int:
        return 3 * self.n_steps

    def __getitem__(self, index):  # an int index (equinox reads one message)
        code, step = RESULTS(1 + index // self.n_steps), index % self.n_steps
        what = code.message
        if code == RESULTS.implausible:
            what = "the result is implausible: a plausibility monitor exceeded its limit"
        if code == RESULTS.implausible and self.spec is not None:
            limits = ", ".join(
                f"{_QUANTITY[k]} <= {v:.3g}"
                for k, v in zip(
                    ("unit_length", "joints", "energy"),
                    (self.spec.unit, self.spec.joints, self.spec.energy),
                    strict=True,
                )
                if v is not None
            )
            what = f"{what} ({limits}; the worst values are in Trajectory.monitors)"
        where = "by step" if code == RESULTS.implausible else "at step"
        loops = f" {self.loops}" if self.loops and code != RESULTS.implausible else ""
        return (
            f"rbjax.rollout: {what} {where} {step} (step 0 advances the initial state). "
            f"{_RESULT_FIX[code]}, or pass throw=False and inspect Trajectory.result / "
            f"Trajectory.failed_step.{loops}"
        )


_LOOPS_FIX = (
    "rbjax runs redundant equations with the minimum-norm multipliers, but a "
    "loop moving through a configuration where the rank of its equations changes (links "
    "aligned: a singular position) has no unique motion there. Check the loop's geometry "
    "with rbjax.mobility(model, state) along the trajectory, or close the loop with fewer "
    "equations (e.g. a PointOnLine or Spherical in place of the last Revolute of a planar "
    "loop)."
)
_LOOPS = (
    "The model closes kinematic loops (or has user constraints), whose joint equations can "
    f"be redundant: {_LOOPS_FIX}"
)


def _loops_note(model, state0) -> str:
    """What a failed step's message says of redundant joint equations: nothing for a model
    whose equations cannot be dependent (rbjax/_engine/rank.py ``may_be_redundant``); for one
    given concretely, the dependent rows at the initial state (rbjax.mobility, on the host,
    only when a rollout has failed); otherwise :data:`_LOOPS`."""
    if not rank.may_be_redundant(model):
        return ""
    if not isinstance(state0, State) or not is_concrete((model, state0)):
        return _LOOPS
    from ._analysis.mobility import mobility

    first = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[-2:])[0], state0)
    first = State(t=jnp.reshape(state0.t, (-1,))[0], q=first.q, u=first.u)
    try:
        mob = mobility(model, first)
    except Exception:  # e.g. a batched model: the general note, never a second error
        return _LOOPS
    if not mob.redundant:
        return _LOOPS
    return (
        f"The model's joint equations are redundant at the initial state (rank {mob.rank} of "
        f"{mob.rows} rows; dependent: {', '.join(mob.redundant)}): {_LOOPS_FIX}"
    )


@dataclasses.dataclass(frozen=True)
class _InputMessages(Sequence[str]):
    """Messages of the in-program input checks: ``checks`` (field, problem, fix or None) of
    :func:`rbjax._analysis.checks.input_violations`, for each of ``members`` systems of the
    rollout's own batch. Index = check · members + flat index of the system."""

    checks: tuple[tuple[str, str, str | None], ...]
    members: int = 1

    def __len__(self) -> int:
        return len(self.checks) * self.members

    def __getitem__(self, index):  # an int index (equinox reads one message)
        (field, problem, fix), k = self.checks[index // self.members], index % self.members
        system = f" (system {k} of {self.members}, flat index)" if self.members > 1 else ""
        how = (
            f"Fix: {fix}"
            if fix
            else "Fix the input; call rollout outside the transformation once to get the "
            "build-time error naming the entry"
        )
        return (
            f"rbjax.rollout: {field} {problem}{system} (checked inside the program because the "
            f"input is traced by jax.jit, jax.vmap or jax.grad). {how}; or pass throw=False "
            "and inspect Trajectory.result (RESULTS.invalid_input)."
        )


def _monitor_spec(monitors, model, integrator, dtype) -> Spec | None:
    if monitors is None:
        return None
    if not isinstance(monitors, Plausibility):
        raise ValueError(
            f"monitors = {monitors!r} is not an rbjax.Plausibility or None. Fix: pass "
            "rbjax.Plausibility(unit_length=..., joints=..., energy=...) or None (no monitors)."
        )
    limits = monitors.limits(int(integrator.order), float(jnp.finfo(dtype).eps))
    unit, joints, energy = limits
    unit = unit if any(not s for s in model.scalable) else None
    joints = joints if model.joints else None
    balance, work = energy_watch(model)
    spec = Spec.of((unit, joints, energy), balance, work, int(integrator.order))
    return spec if spec.watched else None


_DEFAULT_MONITORS = Plausibility()


if TYPE_CHECKING:  # the overloads typed callers see (the runtime checks see the definition)

    @overload
    def rollout(
        model: AbstractModel,
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
        monitors: Plausibility | None = _DEFAULT_MONITORS,
        check_gradients: bool = False,
    ) -> Trajectory: ...

    @overload
    def rollout(
        model: AbstractModel,
        state0: JointState | JointTrajectory,
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
        monitors: Plausibility | None = _DEFAULT_MONITORS,
        check_gradients: bool = False,
    ) -> JointTrajectory: ...

    @overload
    def rollout(
        model: AbstractModel,
        state0: AbstractState | AbstractTrajectory,
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
        monitors: Plausibility | None = _DEFAULT_MONITORS,
        check_gradients: bool = False,
    ) -> AbstractTrajectory: ...


@validates_inputs
def rollout(
    model: AbstractModel,
    state0: AbstractState | AbstractTrajectory,
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
    monitors: Plausibility | None = _DEFAULT_MONITORS,
    check_gradients: bool = False,
) -> AbstractTrajectory:
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
    them; benchmarks/loaded.py); 0 disables it. Results agree to rounding whatever the
    chunk, not bit for bit: the size of a piece selects the Schur solver of a mechanism
    (rbjax/_engine/schur.py ``method``) and the vector width XLA uses, and with them the
    order of floating-point operations (measured: 100 double pendulums 4.6e-15, 100 free
    bodies 5.6e-17). The same call with the same batch shape and chunk gives the same bits.

    ``checkpoint``: reverse-mode checkpointing, a :class:`Checkpoint` (default: every step
    recomputed in the backward pass) or ``None`` (store every step's residuals).

    ``measures``: statistics computed inside the time loop without saving the trajectory, a
    dict name -> :class:`rbjax.Final`, :class:`rbjax.Maximum`, :class:`rbjax.Minimum`,
    :class:`rbjax.Mean`, :class:`rbjax.Drift` or :class:`rbjax.Event` (located zero
    crossings); their values are returned in ``Trajectory.measures``. Each measure's function
    sees ONE system: the model with that system's mass, inertia and gravity (other leaves
    as given) and its State; for a :class:`rbjax.JointModel`, the model and ONE system's
    :class:`rbjax.JointState` (qpos (nq,), qvel (nv,)), values in ``JointTrajectory.measures``.

    ``monitors``: runtime plausibility limits, a :class:`rbjax.Plausibility` (default: every
    quantity watched with the "auto" limits) or ``None``. At every saved state the rollout
    checks | |A|² − 1 | of the rigid bodies, the joint residual and the work–energy balance
    E − E₀ = W (W the work of the forces without a potential, which the loop integrates;
    rbjax/_monitors.py); a system past a limit is reported as
    ``RESULTS.implausible`` (raised with ``throw=True``), never returned as a success.

    Traced inputs (under ``jax.jit``, ``jax.vmap``, ``jax.grad``) are checked inside the
    program on the same conditions as the build-time checks (positive dt, masses and definite
    inertias, the sign and range rules that forces, actuators, joints and formulations declare
    on their parameters, a finite state, |A|² = 1 and ν = 0, the joints' equations; a continued
    Trajectory whose systems all succeeded): raised with ``throw=True`` naming the field (and
    the system, flat index, of a batched rollout), reported as ``RESULTS.invalid_input`` with
    ``throw=False``. Concrete parameters set with ``equinox.tree_at`` are checked by the same
    rules before running (ValueError).

    ``check_gradients``: in reverse mode (``jax.grad``, ``jax.vjp``), raise (``eqx.error_if``)
    instead of returning a non-finite gradient: when the loss's derivative with respect to the
    trajectory is not finite, or when the rollout's backward pass turns it into a non-finite
    gradient with respect to ``state0`` or the model (rbjax/_gradient_guard.py;
    :func:`rbjax.nonfinite_gradient` then names the step and the force). On a
    :class:`rbjax.JointModel` the backward pass of every step is checked too, and the message
    names the first step (in backward order) that turned a finite cotangent non-finite
    (raised inside the compiled backward pass: JAX's runtime error carrying the message).
    Not for forward mode.

    ``multipliers``: also save the formulation's multipliers at every saved state,
    ``Trajectory.lam``; for a :class:`rbjax.JointModel`, ``JointTrajectory.lam`` (*batch, T,
    m): the equalities' multipliers (:meth:`rbjax.JointModel.equality_forces`, one column per
    equality row; m = 0 for a tree without equalities).
    """
    if isinstance(model, JointModel):  # joint coordinates: rbjax/_tree/rollout.py
        return _joint_rollout(
            model,
            state0,
            dt,
            n_steps,
            integrator,
            save_every,
            throw,
            batch_chunk,
            checkpoint,
            check_measures(measures),
            monitors,
            multipliers,
            check_gradients,
        )
    model = require_model(model)
    integrator = RK4() if integrator is None else integrator
    if not isinstance(integrator, AbstractIntegrator):
        raise ValueError(
            f"integrator = {integrator!r} is not an rbjax integrator. Fix: use RK4(), SemiImplicitEuler() or ImplicitMidpoint()."
        )
    continuing = isinstance(state0, Trajectory)
    prior = None  # the result codes of a continued trajectory, checked in the program if traced
    if continuing:
        prior = state0.result
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
    _check_steps(dt, n_steps, save_every)
    if continuing:  # the integrator's drift is accepted; the body count is still checked
        model.check_state(state0, atol=float("inf"))
    else:
        model.check_state(state0)
        check_mechanism_state(model, state0)
    if is_concrete(model.inertia):
        validate_inertia("model.inertia", model.inertia)
    validate_mass("model.mass", model.mass)
    check_declared(model_rules(model))  # values set by equinox.tree_at bypass constructors
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
    check_output_size(model, state0, int(n_steps) // int(save_every) + 1, bool(multipliers))
    spec = _monitor_spec(monitors, model, integrator, state0.q.dtype)
    # Called with concrete inputs, the compiled program carries no error check: the result code
    # is read and raised here, on the host. A program with a host callback (equinox's
    # error_if) is never stored by JAX's persistent compilation cache, so this keeps rollouts
    # cacheable (rbjax.compilation_cache). Under a caller's trace the check stays inside.
    traced = not is_concrete((model, state0, dt, integrator))
    # a model whose forces do work without a potential has its rollout accumulate that
    # work for the monitors (``deferred``: the rollout returns it, _monitored judges it)
    inner = spec if traced else None
    if spec is not None and not traced and spec.balance == "work":
        inner = dataclasses.replace(spec, deferred=True)
    if check_gradients:
        model, state0 = guard_inputs((model, state0))
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
        inner,
        traced,
        not continuing,
        prior if traced else None,
    )
    if spec is not None and not traced:
        # a separate program: the rollout's own program is then the same with or without
        # monitors (the work's accumulation aside), so its states are the same bits (and a
        # continued rollout equals one longer rollout bit for bit; XLA compiles the loop
        # differently when the monitors share its program, measured 1e-14 apart on a double
        # pendulum)
        traj = _monitored(traj, model, spec, int(save_every), jnp.asarray(dt, traj.q.dtype))
    if throw and not traced:
        if is_concrete(traj.result):
            _raise_on_failure(traj, int(n_steps), spec, model, state0)
        else:  # concrete inputs, but called inside a caller's jit: check in its program
            traj = _error_if_failed(traj, int(n_steps), spec, _loops_note(model, None))
    return guard_output(traj) if check_gradients else traj


def _check_steps(dt, n_steps, save_every) -> None:
    """dt > 0 and finite, n_steps a positive int, save_every a divisor of it (ValueError)."""
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


def _joint_rollout(
    model,
    state0,
    dt,
    n_steps,
    integrator,
    save_every,
    throw,
    batch_chunk,
    checkpoint,
    measures,
    monitors,
    multipliers,
    check_gradients,
):
    """:func:`rollout` of a :class:`JointModel` after the checks both formulations share."""
    from ._tree.rollout import rollout_tree

    integrator = RK4() if integrator is None else integrator
    _check_steps(dt, n_steps, save_every)
    interval = _checkpoint_interval(checkpoint, int(n_steps), int(save_every))
    return rollout_tree(
        model,
        state0,
        dt,
        n_steps,
        integrator=integrator,
        save_every=save_every,
        throw=throw,
        batch_chunk=batch_chunk,
        checkpoint=interval,
        measures=measures,
        monitors=monitors,
        multipliers=bool(multipliers),
        check_gradients=bool(check_gradients),
    )


@cheaply_compiled
def _monitored(traj: Trajectory, model, spec: Spec, save_every: int, h) -> Trajectory:
    """The plausibility monitors of a finished rollout (rbjax/_engine/monitors.py). For a
    model with work, ``traj.monitors`` holds what its loop accumulated (W, A and P at the
    saved states, (T, *batch): rbjax/_engine/rollout.py ``integrate`` with a deferred Spec)
    and is replaced by the monitors' worst values."""
    nbatch = traj.result.ndim
    saved = tuple(jnp.moveaxis(x, nbatch, 0) for x in (traj.t, traj.q, traj.u))
    work = None
    if spec.balance == "work" and traj.monitors is not None:
        work = tuple(traj.monitors[k] for k in _WORK)
    code, step, worst = watch(
        spec, model, saved, traj.result, traj.failed_step, save_every, h, work
    )
    return eqx.tree_at(
        lambda tr: (tr.result, tr.failed_step, tr.monitors),
        traj,
        (code, step, worst),
        is_leaf=lambda x: x is None,
    )


def _error_if_failed(
    traj: Trajectory, n_steps: int, spec: Spec | None, loops: str = ""
) -> Trajectory:
    """The in-program twin of :func:`_raise_on_failure` (``equinox.branched_error_if``)."""
    code = traj.result
    failed = (code != int(RESULTS.successful)) & (code != int(RESULTS.invalid_input))
    index = (jnp.clip(code, 1, 3) - 1) * n_steps + jnp.maximum(traj.failed_step, 0)
    return eqx.branched_error_if(traj, failed, index, _StepMessages(n_steps, spec, loops))


# Saved output above which a rollout warns; its peak memory is about 3.5x the output (the
# scan's stacked outputs, their move to the batch-first layout, the Trajectory): measured
# 6.4 GB for the 1.8 GB saved by 16 bodies x 10^6 steps (issue 18).
OUTPUT_WARN_BYTES = 2**30
PEAK_FACTOR = 3.5


def _available_memory(host: bool = False) -> int | None:
    """Bytes the default device can still take, not its total (memory that other programs
    hold cannot be lent): on a GPU/TPU the allocator's ``bytes_limit − bytes_in_use``
    (``Device.memory_stats()``); on a CPU backend, or with ``host``, the host's available
    memory, Linux's ``MemAvailable`` (free pages plus the page cache the kernel can reclaim,
    /proc/meminfo), capped by a cgroup's limit less its usage but reclaimable cache (a
    container's memory), and
    elsewhere the free pages of ``os.sysconf``. None when unknown."""
    if not host:
        try:
            stats = jax.devices()[0].memory_stats() or {}
            if stats.get("bytes_limit"):
                return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
        except Exception:  # noqa: BLE001 - a backend without memory statistics
            pass
    found = []
    try:
        with open("/proc/meminfo") as fh:
            found += [int(ln.split()[1]) * 1024 for ln in fh if ln.startswith("MemAvailable:")]
    except (OSError, ValueError, IndexError):
        pass
    for folder, limit, usage, cache in (  # a container's limit: cgroup v2, then v1
        ("/sys/fs/cgroup", "memory.max", "memory.current", "inactive_file"),
        (
            "/sys/fs/cgroup/memory",
            "memory.limit_in_bytes",
            "memory.usage_in_bytes",
            "total_inactive_file",
        ),
    ):
        try:
            with open(f"{folder}/{limit}") as fh:
                cap = fh.read().strip()
            if not cap.isdigit() or int(cap) >= 2**60:  # "max", or 2^63 less a page: none
                continue
            with open(f"{folder}/{usage}") as fh:
                used = int(fh.read())
            with open(f"{folder}/memory.stat") as fh:  # reclaimable cache counts as free
                for ln in fh:
                    if ln.split()[:1] == [cache]:
                        used -= int(ln.split()[1])
            found.append(int(cap) - used)
        except (OSError, ValueError):
            pass
    if not found:
        try:
            found.append(int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")))
        except (ValueError, OSError, AttributeError):
            return None
    return min(found)


def check_output_size(model, state0: State, saved: int, multipliers: bool) -> int:
    """Estimate the bytes of a rollout's saved trajectory before running it: refuse
    (ValueError) when about 3.5x of it (the peak) exceeds the memory the device has
    AVAILABLE now (:func:`_available_memory`), and warn above :data:`OUTPUT_WARN_BYTES`.
    Returns the estimate."""
    batch = jnp.broadcast_shapes(
        state0.q.shape[:-2],
        model.mass.shape[:-1],
        model.inertia.shape[:-3],
        model.gravity.shape[:-1],
    )
    systems = math.prod(int(b) for b in batch)
    per_state = 14 * model.nb + 1 + ((model.nb + sum(model.joint_rows)) if multipliers else 0)
    size = systems * saved * per_state * jnp.dtype(state0.q.dtype).itemsize
    gib = size / 2**30
    fix = (
        "save fewer states (save_every=k keeps every k-th), compute statistics inside the "
        "loop with measures={...} (rbjax.Final, Maximum, Mean, Drift, Event), or stream a "
        "large batch through rbjax.monte_carlo (its statistics never hold every trajectory)"
    )
    available = _available_memory()
    if available is not None and PEAK_FACTOR * size > available:
        raise ValueError(
            f"rollout would save {saved} states of {systems} system(s): {gib:.3g} GiB of output "
            f"and about {PEAK_FACTOR * gib:.3g} GiB at its peak, more than the "
            f"{available / 2**30:.3g} GiB of {jax.devices()[0].platform} memory available now. "
            f"Fix: {fix}."
        )
    if size > OUTPUT_WARN_BYTES:
        warnings.warn(
            f"rollout will save {saved} states of {systems} system(s): {gib:.1f} GiB of "
            f"output, about {PEAK_FACTOR * gib:.1f} GiB at its peak. If that is not "
            f"intended: {fix}.",
            ResourceWarning,
            stacklevel=3,
        )
    return size


def _raise_on_failure(
    traj: Trajectory, n_steps: int, spec: Spec | None = None, model=None, state0=None
):
    """Raise ``equinox.EquinoxRuntimeError`` (the type the in-program check raises) for the
    first failing system of a finished rollout, with the message naming its step (and for an
    implausible system the quantity, its worst value and the limit; for a failed step of a
    model with loops, its redundant joint equations: :func:`_loops_note`)."""
    codes = np.asarray(traj.result).reshape(-1)
    failed = np.flatnonzero(codes != int(RESULTS.successful))
    if not failed.size:
        return
    k = int(failed[0])
    step = max(int(np.asarray(traj.failed_step).reshape(-1)[k]), 0)
    code = RESULTS(int(codes[k]))
    loops = "" if model is None else _loops_note(model, state0)
    msg = _StepMessages(n_steps, spec, loops)[(int(code) - 1) * n_steps + step]
    if code == RESULTS.implausible and spec is not None and traj.monitors:
        named = {"unit_length": spec.unit, "joints": spec.joints, "energy": spec.energy}
        limits = {n: float(v) for n, v in named.items() if v is not None}
        worst = {n: float(np.asarray(v).reshape(-1)[k]) for n, v in traj.monitors.items()}
        name = max(worst, key=lambda n: worst[n] / limits[n])
        system = f" (system {k}, flat index)" if codes.size > 1 else ""
        msg = (
            f"rbjax.rollout: implausible result by step {step}{system}: {_QUANTITY[name]} "
            f"reached {worst[name]:.3g} (limit {limits[name]:.3g}). {_RESULT_FIX[code]}, or "
            "pass throw=False and inspect Trajectory.result / Trajectory.monitors."
        )
    raise eqx.EquinoxRuntimeError(msg)


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
    monitors=None,
    check_inputs=False,
    fresh=True,
    prior=None,
):
    """The compiled rollout. ``monitors``: a monitors Spec or None; ``check_inputs``: run the
    build-time checks inside the program (traced inputs), for a ``fresh`` initial state
    including |A|² = 1, ν = 0 and the joints' equations (not for a continued Trajectory,
    whose result codes ``prior`` must all be successful)."""
    batch = tuple(
        jnp.broadcast_shapes(
            state0.q.shape[:-2],
            model.mass.shape[:-1],
            model.inertia.shape[:-3],
            model.gravity.shape[:-1],
        )
    )
    invalid = None
    if check_inputs:
        invalid, checks = input_violations(model, state0, dt, batch, fresh=fresh, prior=prior)
        if throw:  # the first failing system, named by its flat index in the rollout's batch
            flat = invalid.reshape(-1)
            k = jnp.argmax(flat >= 0).astype(flat.dtype)
            index = jnp.maximum(flat[k], 0) * flat.size + k
            messages = _InputMessages(checks, flat.size)
            state0 = eqx.branched_error_if(state0, flat[k] >= 0, index, messages)
    t, q, u = to_components(state0)
    # Broadcast the state over the batch axes of the model parameters (leading axes).
    nb = model.nb

    def lift(x, lead):  # insert missing batch axes after the ``lead`` component axes
        missing = len(batch) - (x.ndim - lead - 1)
        return x.reshape(x.shape[:lead] + (1,) * missing + x.shape[lead:])

    q = jnp.broadcast_to(lift(q, 1), (7,) + batch + (nb,))
    u = jnp.broadcast_to(lift(u, 1), (7,) + batch + (nb,))
    t = jnp.broadcast_to(lift(t, 0), batch + (1,))
    h = jnp.asarray(dt, q.dtype)
    args = (
        integrator,
        h,
        n_steps,
        save_every,
        multipliers,
        checkpoint,
        tuple(measures.values()),
        monitors,
    )
    B = batch[0] if len(batch) == 1 else 0
    if batch_chunk and B > batch_chunk:
        out = chunked(model, t, q, u, batch, batch_chunk, args)
    else:
        out = integrate(model, t, q, u, batch, *args)
    saved, fail_code, fail_step, values, watched = out
    if invalid is not None:  # an invalid input overrides whatever the integration did
        fail_code = jnp.where(invalid >= 0, int(RESULTS.invalid_input), fail_code)
        fail_step = jnp.where(invalid >= 0, -1, fail_step)
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
        monitors=watched or None,
    )
    if throw:
        traj = _error_if_failed(traj, n_steps, monitors, _loops_note(model, None))
    return traj
