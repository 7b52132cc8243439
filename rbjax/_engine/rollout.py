"""The time loop in the engine's layout: ``lax.scan`` over steps and saved chunks,
failure detection, checkpointed groups, batch chunking (used by :func:`rbjax.rollout`).

States are component-first (t (*batch, 1), q, u (7, *batch, nb)); saved states come out with
the time axis first and the natural layout last: (T, *batch, nb, 7).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from .._results import RESULTS
from . import measures as measure, monitors as monitor
from .integrators import large_step

_OK, _NONFINITE, _SOLVER_FAILED, _IMPLAUSIBLE = (
    int(RESULTS.successful),
    int(RESULTS.nonfinite),
    int(RESULTS.solver_failed),
    int(RESULTS.implausible),
)

# the accumulated work a deferred monitor Spec returns (rbjax/_engine/monitors.py work_value)
_WORK = ("work", "absolute_work", "power")

# Systems per cache-sized piece of a batched mechanism rollout: the double pendulum runs at
# 0.30 M steps/s at B = 64 against 0.11 M at B = 1024 unchunked (benchmarks/mechanisms.py).
DEFAULT_CHUNK = 64


def _warm(integrator, model, t, q, u):
    """The integrator's warm start (``AbstractIntegrator._engine_warm``), or None for an
    integrator without one (a wrapper such as rbjax/_gradient_guard.py's)."""
    init = getattr(integrator, "_engine_warm", None)
    return None if init is None else init(model, t, q, u)


def _step_warm(integrator, model, t, q, u, h, warm):
    """(t, q, u, ok, warm) of one step, with the integrator's warm start where it has one."""
    step = getattr(integrator, "_engine_step_warm", None)
    if step is None:
        return (*integrator._engine_step(model, t, q, u, h), warm)
    return step(model, t, q, u, h, warm)


def grouped_scan(body, carry, xs, length: int, group: int):
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


def integrate(
    model,
    t,
    q,
    u,
    batch,
    integrator,
    h,
    n_steps,
    save_every,
    multipliers,
    checkpoint,
    measures=(),
    monitors=None,
):
    """The time integration of one batch (component-first t, q, u with batch shape ``batch``).

    ``measures`` (a tuple of rbjax measures) are accumulated after every step and finished
    after the loop (rbjax/_engine/measures.py).

    ``checkpoint`` (the interval k in steps, 0 = off) groups either the steps of each saved
    chunk (k divides save_every) or the saved chunks (k a multiple of save_every) into
    checkpointed groups; see :func:`_grouped_scan`.

    Returns (saved (t, q, u[, lam]) with the time axis first, result code, failed step,
    measure values, monitor values (dict name -> worst value, (*batch,))).

    ``monitors`` (a :class:`rbjax._engine.monitors.Spec` or None) are evaluated after the loop
    on every saved state; a system exceeding a limit gets ``RESULTS.implausible`` with the last
    step of the saved chunk where it was first seen as its failed step (rbjax/_monitors.py),
    unless it failed earlier. The loop accumulates the work of the forces the energy balance
    needs (``monitors.work``: one power evaluation per step); with ``monitors.deferred`` the
    monitor values are instead {"work": W, "absolute_work": A, "power": P}, (T, *batch) at
    the saved states (rbjax/_engine/monitors.py ``work_value``), for a later :func:`watch`."""
    f = model.formulation
    inner = checkpoint if checkpoint and save_every % checkpoint == 0 else 0
    outer = checkpoint // save_every if checkpoint and not inner else 0

    def finite(q, u):
        return jnp.all(jnp.isfinite(q), axis=(0, -1)) & jnp.all(jnp.isfinite(u), axis=(0, -1))

    def one_step(carry, _):
        t, q, u, ok_all, accs, wk, warm = carry
        t1, q1, u1, ok, warm = _step_warm(integrator, model, t, q, u, h, warm)
        accs = measure.update(measures, accs, model, (t, q, u), (t1, q1, u1), h)
        wk = monitor.work_step(monitors, model, wk, (t1, q1, u1), h)
        return (t1, q1, u1, ok_all & ok, accs, wk, warm), None

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
    per_step = large_step(model)

    def checked_step(carry, k):
        t, q, u, ok_all, first, accs, wk, warm = carry
        t1, q1, u1, ok, warm = _step_warm(integrator, model, t, q, u, h, warm)
        good = ok & finite(q1, u1)
        first = jnp.where((first < 0) & ~good, k, first)
        accs = measure.update(measures, accs, model, (t, q, u), (t1, q1, u1), h)
        wk = monitor.work_step(monitors, model, wk, (t1, q1, u1), h)
        return (t1, q1, u1, ok_all & ok, first, accs, wk, warm), None

    def saved_work(wk):  # (W, A, P) at a saved state, or nothing
        return () if wk is None else monitor.work_value(wk, h)

    def chunk(carry, i):
        t, q, u, code, fchunk, accs, wk, warm = carry
        ok0 = jnp.ones(code.shape, bool)
        if per_step:
            ks = i * save_every + jnp.arange(save_every, dtype=jnp.int32)
            (_, q, u, ok, first, accs, wk, warm), _ = grouped_scan(
                checked_step, (t, q, u, ok0, fchunk, accs, wk, warm), ks, save_every, inner
            )
            fin = finite(q, u)
            new = (code == _OK) & ~(fin & ok)
            code = jnp.where(new, jnp.where(fin, _SOLVER_FAILED, _NONFINITE), code)
            t = t_start + ((i + 1) * save_every).astype(h.dtype) * h
            return (t, q, u, code, first, accs, wk, warm), (save(t, q, u), saved_work(wk))
        (_, q, u, ok, accs, wk, warm), _ = grouped_scan(
            one_step, (t, q, u, ok0, accs, wk, warm), None, save_every, inner
        )
        t = t_start + ((i + 1) * save_every).astype(h.dtype) * h  # t0 + k h, not a running sum of h
        fin = finite(q, u)
        new = (code == _OK) & ~(fin & ok)
        code = jnp.where(new, jnp.where(fin, _SOLVER_FAILED, _NONFINITE), code)
        fchunk = jnp.where(new, i, fchunk)
        return (t, q, u, code, fchunk, accs, wk, warm), (save(t, q, u), saved_work(wk))

    t_start = t
    code0 = jnp.zeros(batch, jnp.int32)
    chunk0 = jnp.full(batch, -1, jnp.int32)
    n_save = n_steps // save_every
    accs0 = measure.init(measures, model, t, q, u)
    wk0 = monitor.work_init(monitors, model, t, q, u)
    # a solver's warm start carried from step to step (MoreauJean's percussions), or None
    warm0 = _warm(integrator, model, t, q, u)
    carry, (saved, work) = grouped_scan(
        chunk,
        (t, q, u, code0, chunk0, accs0, wk0, warm0),
        jnp.arange(n_save, dtype=jnp.int32),
        n_save,
        outer,
    )
    first = save(t, q, u)
    saved = tuple(jnp.concatenate([a[None], b], axis=0) for a, b in zip(first, saved, strict=True))
    work = tuple(  # (W, A, P) at every saved state, the initial one first
        jnp.concatenate([a[None], b], axis=0) for a, b in zip(saved_work(wk0), work, strict=True)
    )
    fail_code, fchunk = carry[3], carry[4]
    values = measure.finish(measures, carry[5], model, integrator, h, carry[:3])

    def locate(_):
        # Restart every member from the start of its failing chunk and step until it fails.
        idx = jnp.maximum(fchunk, 0)
        t_s = jnp.take_along_axis(saved[0], idx[None], axis=0)[0][..., None]
        pick = lambda x: jnp.moveaxis(
            jnp.take_along_axis(x, idx[None, ..., None, None], axis=0)[0], -1, 0
        )
        q_s, u_s = pick(saved[1]), pick(saved[2])

        def find(carry, k):
            t, q, u, first_bad, warm = carry
            t, q, u, ok, warm = _step_warm(integrator, model, t, q, u, h, warm)
            bad = ~(finite(q, u) & ok)
            first_bad = jnp.where((first_bad < 0) & bad, k, first_bad)
            return (t, q, u, first_bad, warm), None

        warm_s = _warm(integrator, model, t_s, q_s, u_s)  # cold: same steps, slower
        init = (t_s, q_s, u_s, jnp.full(batch, -1, jnp.int32), warm_s)
        (_, _, _, k, _), _ = jax.lax.scan(find, init, jnp.arange(save_every, dtype=jnp.int32))
        return jnp.where(fail_code != _OK, idx * save_every + jnp.maximum(k, 0), -1)

    if per_step:
        fail_step = jnp.where(fail_code != _OK, fchunk, -1)
    else:
        fail_step = jax.lax.cond(
            jnp.any(fail_code != _OK), locate, lambda _: jnp.full(batch, -1, jnp.int32), None
        )
    watched = {}
    if monitors is not None and monitors.deferred:  # evaluated by a later program
        watched: dict[str, jax.Array] = dict(zip(_WORK, work, strict=True))
    elif monitors is not None:  # one vectorised pass over the saved states (after the loop)
        fail_code, fail_step, watched = watch(
            monitors, model, saved[:3], fail_code, fail_step, save_every, h, work or None
        )
    return saved, fail_code, fail_step, values, watched


def watch(monitors, model, saved, fail_code, fail_step, save_every, h=None, work=None):
    """Apply the plausibility monitors to the saved states (t, q, u) (time axis first; ``h``
    the step, ``work`` None or the (W, A, P) of :func:`rbjax._engine.monitors.work_value` at
    the saved states): a system becomes implausible where it had not failed, or had failed
    only later. Returns (code, failed step, worst values)."""
    t, q, u = saved
    step, watched = monitor.evaluate(monitors, model, t, q, u, save_every, h, work)
    earlier = (step >= 0) & ((fail_code == _OK) | (step < fail_step))
    fail_code = jnp.where(earlier, _IMPLAUSIBLE, fail_code)
    fail_step = jnp.where(earlier, step, fail_step)
    return fail_code, fail_step, watched


def chunked(model, t, q, u, batch, size, args):
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
        return integrate(m, tc, qc, uc, (size,), *args)

    saved, code, step, values, watched = jax.lax.map(piece, xs)

    def join(x, axis):  # (n, ..., size, ...) -> (..., B, ...)
        x = jnp.moveaxis(x, 0, axis)
        x = x.reshape(x.shape[:axis] + (n * size,) + x.shape[axis + 2 :])
        return jax.lax.slice_in_dim(x, 0, B, axis=axis)

    saved = tuple(join(x, 1) for x in saved)  # (n, T, size, ...) -> (T, B, ...)
    values = jax.tree.map(lambda x: join(x, 0), values)  # (n, size, ...) -> (B, ...)
    deferred = args[-1] is not None and args[-1].deferred  # (n, T, size) work series
    watched = jax.tree.map(lambda x: join(x, 1 if deferred else 0), watched)
    return saved, join(code, 0), join(step, 0), values, watched
