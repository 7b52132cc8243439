"""Rollouts: ``lax.scan`` over time, one jit boundary, batch axes anywhere in front.

``rollout(model, state0, dt, n_steps)`` accepts a single system or any leading batch axes on
the state and/or the model's parameters (broadcast together). Batches are integrated in the
component-first layout (rbjax/_engine/kernels.py) with the batch as the minor axis, which is what makes a
batched rollout fast on CPU; the same function also works under ``jax.vmap``, ``jax.grad`` and
``jax.jvp`` (it is an equinox filter-jitted pure function).
"""

from __future__ import annotations

from fractions import Fraction

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from ._assembly import check_mechanism_state
from ._body import validate_inertia
from ._engine.layout import to_components
from ._errors import is_concrete
from ._integrators import RK4, AbstractIntegrator, check_dt
from ._state import State

RESULT_OK = 0
RESULT_NONFINITE = 1
RESULT_SOLVER_FAILED = 2
_MAX_MESSAGES = 100_000


class Trajectory(eqx.Module):
    """Saved states of a rollout, including the initial state.

    ``t`` (*batch, T), ``q`` and ``u`` (*batch, T, nb, 7) with T = n_steps // save_every + 1;
    ``lam`` (*batch, T, nb + m) the formulation's multipliers at each saved state (or None): the
    scaling multiplier of each body, then the m joint equations in ``model.joints`` order;
    ``result`` (*batch,) 0 = ok, 1 = state became non-finite, 2 = implicit solver failed;
    ``failed_step`` (*batch,) the first failing step index, −1 if none.
    """

    t: Float[Array, "*batch T"]
    q: Float[Array, "*batch T nb 7"]
    u: Float[Array, "*batch T nb 7"]
    lam: Float[Array, "*batch T nm"] | None
    result: Int[Array, "*batch"]
    failed_step: Int[Array, "*batch"]

    @property
    def states(self) -> State:
        return State(t=self.t, q=self.q, u=self.u)

    def __getitem__(self, i) -> State:
        """The i-th saved state (of every batch member)."""
        return State(t=self.t[..., i], q=self.q[..., i, :, :], u=self.u[..., i, :, :])


def _messages(n_steps: int):
    bucket = max(1, -(-n_steps // _MAX_MESSAGES))
    out = []
    for kind in (
        "the state became non-finite (NaN or inf)",
        "the implicit solver did not converge",
    ):
        for b in range(-(-n_steps // bucket)):
            where = (
                f"at step {b}"
                if bucket == 1
                else f"between steps {b * bucket} and {min(n_steps, (b + 1) * bucket) - 1}"
            )
            out.append(
                f"rbjax.rollout: {kind} {where} (step 0 advances the initial state). "
                "Reduce dt, check forces and initial conditions, or pass throw=False and inspect "
                "Trajectory.result / Trajectory.failed_step."
            )
    return tuple(out), bucket


def rollout(
    model,
    state0: State,
    dt,
    n_steps: int,
    *,
    integrator: AbstractIntegrator | None = None,
    save_every: int = 1,
    multipliers: bool = False,
    throw: bool = True,
    batch_chunk: int | None = None,
    checkpoint: bool | int | None = None,
) -> Trajectory:
    """Integrate ``n_steps`` steps of size ``dt`` and save every ``save_every``-th state.

    Validates its inputs (ValueError naming the argument), then runs one filter-jitted
    ``lax.scan``. Inside, a state that turns non-finite or an implicit step that fails to
    converge raises (``eqx.error_if`` family) naming the first failing step; with
    ``throw=False`` the failure is reported in ``Trajectory.result`` and ``failed_step``.

    ``batch_chunk``: a batch of B systems is integrated in pieces of this many systems, each
    over the whole time span (``lax.map`` over pieces), so that a piece's working set stays in
    cache. ``None`` picks 64 for mechanisms and no chunking for free bodies (measured in
    benchmarks/); 0 disables it. Results do not depend on it.

    ``checkpoint``: reverse-mode checkpointing with an interval of k steps. Reverse mode
    (``jax.grad``, ``jax.vjp``) then stores only the state at every k-th step and recomputes
    the k steps of one group at a time during the backward pass (``jax.checkpoint`` around
    each group), so its memory is O(n_steps / k + k) states' worth of residuals instead of the
    residuals of every step. k must divide ``save_every`` (each saved chunk is split into
    groups of k steps) or be a multiple of ``save_every`` that divides ``n_steps`` (groups of
    k / save_every saved chunks; the saved states are unchanged). ``None`` (default): k = 1,
    every step is recomputed in the backward pass from the stored state; for explicit schemes
    on CPU that is FASTER than storing every step's residuals (less memory traffic;
    benchmarks/gradients.py) and needs only one state per step. For ImplicitMidpoint, whose
    Newton solve dominates a step, ``False`` is 10-60 % faster when its memory is available.
    ``True`` picks the allowed k nearest to √n_steps (least memory, about one extra forward
    pass), ``False`` or 0 stores every step's residuals.
    Forward mode and plain evaluation are unaffected, and the trajectory is bitwise the same
    whatever the value.
    """
    integrator = RK4() if integrator is None else integrator
    if not isinstance(integrator, AbstractIntegrator):
        raise ValueError(
            f"integrator = {integrator!r} is not an rbjax integrator. Fix: use RK4(), SemiImplicitEuler() or ImplicitMidpoint()."
        )
    if not isinstance(state0, State):
        raise ValueError(
            f"state0 = {type(state0).__name__} is not an rbjax.State. Fix: build it with rbjax.make_state(...)."
        )
    check_dt(dt)
    if not isinstance(n_steps, (int, np.integer)) or n_steps < 1:
        raise ValueError(
            f"n_steps = {n_steps!r} is not a positive integer. Fix: pass the number of steps as an int >= 1."
        )
    if not isinstance(save_every, (int, np.integer)) or save_every < 1 or n_steps % save_every:
        raise ValueError(
            f"save_every = {save_every!r} does not divide n_steps = {n_steps}. Fix: choose save_every >= 1 with n_steps % save_every == 0."
        )
    model.check_state(state0)
    check_mechanism_state(model, state0)
    if is_concrete(model.inertia):
        validate_inertia("model.inertia", model.inertia)
    if batch_chunk is None:
        batch_chunk = _DEFAULT_CHUNK if getattr(model, "joints", ()) else 0
    if not isinstance(batch_chunk, (int, np.integer)) or batch_chunk < 0:
        raise ValueError(
            f"batch_chunk = {batch_chunk!r} is not a non-negative integer. Fix: pass e.g. 64, "
            "0 (no chunking) or None (automatic)."
        )
    interval = _checkpoint_interval(checkpoint, int(n_steps), int(save_every))
    return _rollout(
        model,
        state0,
        dt,
        integrator,
        int(n_steps),
        int(save_every),
        bool(multipliers),
        bool(throw),
        int(batch_chunk),
        interval,
    )


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

    ``True`` gives the allowed k nearest to √n_steps in log distance (ties: the smaller k).
    Raises ValueError for anything that is not a bool or an allowed positive integer."""
    if checkpoint is None:
        return _DEFAULT_CHECKPOINT
    if isinstance(checkpoint, (bool, np.bool_)):
        if not checkpoint:
            return 0
        allowed = _allowed_intervals(n_steps, save_every)
        # log distance |log k − ½ log n| compared exactly: the ratio max(k², n) / min(k², n)
        return min(allowed, key=lambda k: (Fraction(max(k * k, n_steps), min(k * k, n_steps)), k))
    if not isinstance(checkpoint, (int, np.integer)) or checkpoint < 0:
        raise ValueError(
            f"checkpoint = {checkpoint!r} is not a bool or a non-negative integer. Fix: pass "
            "True (an interval of about sqrt(n_steps) steps), False, or an interval in steps "
            "that divides save_every or is a multiple of save_every dividing n_steps."
        )
    k = int(checkpoint)
    if k == 0:
        return 0
    allowed = _allowed_intervals(n_steps, save_every)
    if k not in allowed:
        near = sorted(sorted(allowed, key=lambda a: (Fraction(max(a, k), min(a, k)), a))[:3])
        raise ValueError(
            f"checkpoint = {checkpoint!r} neither divides save_every = {save_every} nor is a "
            f"multiple of it that divides n_steps = {n_steps}. Fix: pass one of {near} (nearest "
            "allowed values), True (about sqrt(n_steps) steps) or False."
        )
    return k


def _grouped_scan(body, carry, xs, length: int, group: int):
    """``lax.scan(body, carry, xs, length=length)``, as a scan over ``length // group``
    checkpointed groups of ``group`` iterations when ``group`` > 0 (same results; reverse mode
    stores the carry at group boundaries and recomputes one group at a time)."""
    if not group:
        return jax.lax.scan(body, carry, xs, length=length)
    n = length // group
    xs = jax.tree.map(lambda x: x.reshape((n, group) + x.shape[1:]), xs)

    def run_group(c, x):
        return jax.lax.scan(body, c, x, length=group)

    # prevent_cse=False: the enclosing scan already keeps XLA from merging the recomputation
    # with the forward pass (see the jax.checkpoint docs).
    run_group = jax.checkpoint(run_group, prevent_cse=False)
    carry, ys = jax.lax.scan(run_group, carry, xs, length=n)
    ys = jax.tree.map(lambda y: y.reshape((length,) + y.shape[2:]), ys)
    return carry, ys


# Systems per cache-sized piece of a batched mechanism rollout: the double pendulum runs at
# 0.30 M steps/s at B = 64 against 0.11 M at B = 1024 unchunked (benchmarks/mechanisms.py).
_DEFAULT_CHUNK = 64

# Checkpoint interval of ``rollout(checkpoint=None)``: rematerialise every step in reverse mode.
_DEFAULT_CHECKPOINT = 1


def _integrate(model, t, q, u, batch, integrator, h, n_steps, save_every, multipliers, checkpoint):
    """The time integration of one batch (component-first t, q, u with batch shape ``batch``).

    ``checkpoint`` (the interval k in steps, 0 = off) groups either the steps of each saved
    chunk (k divides save_every) or the saved chunks (k a multiple of save_every) into
    checkpointed groups; see :func:`_grouped_scan`.

    Returns (saved (t, q, u[, lam]) with the time axis first, result code, failed step)."""
    f = model.formulation
    inner = checkpoint if checkpoint and save_every % checkpoint == 0 else 0
    outer = checkpoint // save_every if checkpoint and not inner else 0

    def finite(q, u):
        return jnp.all(jnp.isfinite(q), axis=(0, -1)) & jnp.all(jnp.isfinite(u), axis=(0, -1))

    def one_step(carry, _):
        t, q, u, ok_all = carry
        t1, q1, u1, ok = integrator._engine_step(model, t, q, u, h)
        return (t1, q1, u1, ok_all & ok), None

    def save(t, q, u):
        out = (t[..., 0], jnp.moveaxis(q, 0, -1), jnp.moveaxis(u, 0, -1))
        if multipliers:
            out = out + (f._engine_derivatives(model, t, q, u)[2],)
        return out

    # Failures are detected per saved chunk (a non-finite state stays non-finite; the solver
    # flag is accumulated), which keeps reductions out of the per-step loop; the exact step is
    # then located by re-running only the failing chunk (see ``locate`` below).
    # Mechanisms: the step is large, so a per-step check is cheap and saves compiling the step a
    # second time for ``locate`` (compile time dominates mechanism rollouts).
    per_step = bool(getattr(model, "joints", ()))

    def checked_step(carry, k):
        t, q, u, ok_all, first = carry
        t1, q1, u1, ok = integrator._engine_step(model, t, q, u, h)
        good = ok & finite(q1, u1)
        first = jnp.where((first < 0) & ~good, k, first)
        return (t1, q1, u1, ok_all & ok, first), None

    def chunk(carry, i):
        t, q, u, code, fchunk = carry
        ok0 = jnp.ones(code.shape, bool)
        if per_step:
            ks = i * save_every + jnp.arange(save_every, dtype=jnp.int32)
            (_, q, u, ok, first), _ = _grouped_scan(
                checked_step, (t, q, u, ok0, fchunk), ks, save_every, inner
            )
            fin = finite(q, u)
            new = (code == RESULT_OK) & ~(fin & ok)
            code = jnp.where(new, jnp.where(fin, RESULT_SOLVER_FAILED, RESULT_NONFINITE), code)
            t = t_start + ((i + 1) * save_every).astype(h.dtype) * h
            return (t, q, u, code, first), save(t, q, u)
        (_, q, u, ok), _ = _grouped_scan(one_step, (t, q, u, ok0), None, save_every, inner)
        t = t_start + ((i + 1) * save_every).astype(h.dtype) * h  # t0 + k h, not a running sum of h
        fin = finite(q, u)
        new = (code == RESULT_OK) & ~(fin & ok)
        code = jnp.where(new, jnp.where(fin, RESULT_SOLVER_FAILED, RESULT_NONFINITE), code)
        fchunk = jnp.where(new, i, fchunk)
        return (t, q, u, code, fchunk), save(t, q, u)

    t_start = t
    code0 = jnp.zeros(batch, jnp.int32)
    chunk0 = jnp.full(batch, -1, jnp.int32)
    n_save = n_steps // save_every
    carry, saved = _grouped_scan(
        chunk, (t, q, u, code0, chunk0), jnp.arange(n_save, dtype=jnp.int32), n_save, outer
    )
    first = save(t, q, u)
    saved = tuple(jnp.concatenate([a[None], b], axis=0) for a, b in zip(first, saved, strict=True))
    fail_code, fchunk = carry[3], carry[4]

    def locate(_):
        # Restart every member from the start of its failing chunk and step until it fails.
        idx = jnp.maximum(fchunk, 0)
        t_s = jnp.take_along_axis(saved[0], idx[None], axis=0)[0][..., None]
        pick = lambda x: jnp.moveaxis(
            jnp.take_along_axis(x, idx[None, ..., None, None], axis=0)[0], -1, 0
        )
        q_s, u_s = pick(saved[1]), pick(saved[2])

        def find(carry, k):
            t, q, u, first_bad = carry
            t, q, u, ok = integrator._engine_step(model, t, q, u, h)
            bad = ~(finite(q, u) & ok)
            first_bad = jnp.where((first_bad < 0) & bad, k, first_bad)
            return (t, q, u, first_bad), None

        init = (t_s, q_s, u_s, jnp.full(batch, -1, jnp.int32))
        (_, _, _, k), _ = jax.lax.scan(find, init, jnp.arange(save_every, dtype=jnp.int32))
        return jnp.where(fail_code != RESULT_OK, idx * save_every + jnp.maximum(k, 0), -1)

    if per_step:
        fail_step = jnp.where(fail_code != RESULT_OK, fchunk, -1)
    else:
        fail_step = jax.lax.cond(
            jnp.any(fail_code != RESULT_OK), locate, lambda _: jnp.full(batch, -1, jnp.int32), None
        )
    return saved, fail_code, fail_step


def _chunked(model, t, q, u, batch, size, args):
    """:func:`_integrate` over pieces of ``size`` systems (``lax.map``), padded to a multiple."""
    B = batch[0]
    n = -(-B // size)
    pad = n * size - B

    def split(x, axis):  # (..., B, ...) -> (n, ..., size, ...) with edge padding
        if pad:
            idx = jnp.concatenate([jnp.arange(B), jnp.full((pad,), B - 1)])
            x = jnp.take(x, idx, axis=axis)
        x = x.reshape(x.shape[:axis] + (n, size) + x.shape[axis + 1 :])
        return jnp.moveaxis(x, axis, 0)

    def batched(x, base):  # a model leaf carrying the batch axis in front of ``base`` dims
        return x.ndim == base + 1 and x.shape[0] == B

    leaves = {
        "mass": (model.mass, 1),
        "inertia": (model.inertia, 3),
        "gravity": (model.gravity, 1),
    }
    mapped = {k: split(v, 0) for k, (v, base) in leaves.items() if batched(v, base)}
    xs = (split(t, 0), split(q, 1), split(u, 1), mapped)

    def piece(x):
        tc, qc, uc, leaves_c = x
        m = model
        for k, v in leaves_c.items():
            m = eqx.tree_at(lambda mm, k=k: getattr(mm, k), m, v)
        return _integrate(m, tc, qc, uc, (size,), *args)

    saved, code, step = jax.lax.map(piece, xs)

    def join(x, axis):  # (n, ..., size, ...) -> (..., B, ...)
        x = jnp.moveaxis(x, 0, axis)
        x = x.reshape(x.shape[:axis] + (n * size,) + x.shape[axis + 2 :])
        return jax.lax.slice_in_dim(x, 0, B, axis=axis)

    saved = tuple(join(x, 1) for x in saved)  # (n, T, size, ...) -> (T, B, ...)
    return saved, join(code, 0), join(step, 0)


@eqx.filter_jit
def _rollout(
    model, state0, dt, integrator, n_steps, save_every, multipliers, throw, batch_chunk, checkpoint
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
    args = (integrator, h, n_steps, save_every, multipliers, checkpoint)
    B = batch[0] if len(batch) == 1 else 0
    if batch_chunk and B > batch_chunk:
        saved, fail_code, fail_step = _chunked(model, t, q, u, batch, batch_chunk, args)
    else:
        saved, fail_code, fail_step = _integrate(model, t, q, u, batch, *args)
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
    )
    if throw:
        msgs, bucket = _messages(n_steps)
        n_b = len(msgs) // 2
        index = (
            jnp.where(fail_code == RESULT_SOLVER_FAILED, n_b, 0)
            + jnp.maximum(fail_step, 0) // bucket
        )
        traj = eqx.branched_error_if(traj, fail_code != RESULT_OK, index, msgs)
    return traj
