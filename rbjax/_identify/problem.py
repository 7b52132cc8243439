"""The compiled identification problem: everything the residual function needs, the whitened
residuals r(θ) and their derivatives (forward-mode J, reverse-mode gradient), and the
host-side validation shared by :func:`rbjax.identify` and :func:`rbjax.residuals`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jaxtyping import Array

from .._abstract import AbstractModel, AbstractState
from .._analysis.checks import check_mechanism_state
from .._engine.layout import to_components
from .._errors import fail, validates_inputs
from .._integrators import RK4, AbstractIntegrator
from .._model import require_model
from .._state import State
from .._tree.model import JointState
from .._tree.rollout import check_joint_state
from .joint import arrays, check_integrator, dtype_of, is_joint, like
from .measurements import Measurements
from .observations import AbstractObservation
from .references import resolve
from .shooting import Shooting, segment_gaps, segment_states, segments


class Problem(eqx.Module):
    """Everything the compiled residual function needs. Static: ``build``, the observation
    kinds and body keys, the segment count; arrays (data, schedules, fixed parameters) are
    traced, so a new data set of the same shapes reuses the compiled code."""

    build: Callable = eqx.field(static=True)
    fixed: Any
    observations: tuple[AbstractObservation, ...]
    integrator: AbstractIntegrator
    t_start: Array  # (S,)
    hs: Array  # (S, n)
    ts: Array  # (S, n)
    pick: Array  # (K,) flat state index of each sample
    ends: Array  # (S − 1,) flat state index of each segment's end
    a_ref: Array | None  # (S − 1, nb, 4) reference attitudes of the segment starts
    # mechanisms of rigid bodies: reference segment start states on the joint manifold and
    # an orthonormal basis of the null space of the velocity Jacobian W̃ there
    ref_q: Array | None  # (S − 1, nb, 7)
    ref_u: Array | None  # (S − 1, nb, 7)
    basis: Array | None  # (S − 1, 6 nb, d), d = degrees of freedom
    sqrt_w: Array
    n_seg: int = eqx.field(static=True)


def _params(problem: Problem, dyn):
    return eqx.combine(dyn, problem.fixed)


def _integrate(problem: Problem, model, init):
    """All segments in parallel: (S, n + 1, nb, 7) states (initial first; a JointModel's
    (S, n + 1, nq) and (S, n + 1, nv)) and the AND of the integrator's success flags."""
    integ = problem.integrator
    joint = is_joint(model)
    q_init, u_init = arrays(init)

    def one(t0, q0, u0, hs, ts):
        if joint:  # the engine's joint arrays: (nq, 1), (nv, 1) (rbjax/_tree/rollout.py)
            t, q, u = t0[None], q0[:, None], u0[:, None]
        else:
            t, q, u = to_components(State(t=t0, q=q0, u=u0))

        def step(carry, ht):
            t, q, u, ok = carry
            h, t_end = ht
            _, q, u, good = integ._engine_step(model, t, q, u, h)
            return (t_end[None], q, u, ok & jnp.all(good)), (q, u)

        ok0 = jnp.asarray(True)
        (_, _, _, ok), (qs, us) = jax.lax.scan(step, (t, q, u, ok0), (hs, ts))
        qs = jnp.concatenate([q[None], qs])
        us = jnp.concatenate([u[None], us])
        if joint:
            return qs[..., 0], us[..., 0], ok
        return jnp.moveaxis(qs, 1, -1), jnp.moveaxis(us, 1, -1), ok

    if problem.hs.shape[1] == 0:  # every sample at t0: nothing to integrate
        return q_init[:, None], u_init[:, None], jnp.asarray(True)
    hs = problem.hs.astype(q_init.dtype)
    ts = problem.ts.astype(q_init.dtype)
    qs, us, ok = jax.vmap(one)(init.t, q_init, u_init, hs, ts)
    return qs, us, jnp.all(ok)


def residual_vector(problem: Problem, x):
    """Whitened residuals r(θ) (observations in order, then continuity) and auxiliary output
    (segment end states for the initialisation, the simulation's success flag)."""
    return observe(problem, *simulate(problem, x))


def simulate(problem: Problem, x):
    """The simulation part of :func:`residual_vector`: (params, model, init (the segment start
    states, State (S, nb, 7)), the segment starts 1..S−1 or None, every state of every segment
    qs, us (S, n + 1, nb, 7), the integrator's success flag). On a JointModel the states are
    JointStates and qs, us (S, n + 1, nq), (S, n + 1, nv)."""
    dyn, seg = x
    params = _params(problem, dyn)
    model, st0 = problem.build(params)
    dtype = dtype_of(st0)
    first = jax.tree.map(lambda a: jnp.asarray(a)[None], st0)
    if problem.n_seg > 1:
        rest = segment_states(problem, model, seg)
        init = jax.tree.map(lambda a, b: jnp.concatenate([a, b.astype(a.dtype)]), first, rest)
    else:
        rest, init = None, first
    q_init, u_init = arrays(init)
    init = like(st0, jnp.broadcast_to(init.t, q_init.shape[:1]).astype(dtype), q_init, u_init)
    qs, us, ok = _integrate(problem, model, init)
    return params, model, init, rest, qs, us, ok


def observe(problem: Problem, params, model, init, rest, qs, us, ok):
    """The residuals of the simulated states (:func:`simulate`): (r, segment end states)."""
    dtype = dtype_of(init)
    qf = qs.reshape((-1,) + qs.shape[2:])
    uf = us.reshape((-1,) + us.shape[2:])
    tf = jnp.concatenate([init.t[:, None], problem.ts.astype(dtype)], axis=1).reshape(-1)
    samples = like(init, tf[problem.pick], qf[problem.pick], uf[problem.pick])
    grid = like(init, tf, qf, uf)
    parts = []
    for o in problem.observations:
        delay = getattr(o, "delay", None)
        if delay is None:
            parts.append(o.residual(model, samples, params).reshape(-1))
            continue
        tau = resolve(delay, params, 0.0, (), dtype)
        align = functools.partial(o.align, model)
        pred = delayed(o.predict(model, grid, params), tf, problem.pick, qs.shape[1], tau, align)
        parts.append(o.whiten(o.compare(model, pred)).reshape(-1))
    ends = None
    if rest is not None:
        ends = like(init, tf[problem.ends], qf[problem.ends], uf[problem.ends])
        parts += [problem.sqrt_w * g.reshape(-1) for g in segment_gaps(model, ends, rest)]
    r = jnp.concatenate(parts)
    r = jnp.where(ok, r, jnp.nan)  # a failed implicit step makes the loss non-finite
    return r, ends


def delayed(h, tf, pick, width: int, tau, align=None):
    """The predictions ``h`` (S·width, d) on the integration grid ``tf`` (S·width,: the
    segments one after another, each ``width`` points, non-decreasing, padded at the end with
    repeats of its last time) interpolated at t_k − τ for the samples at grid indices
    ``pick`` (K,), within each sample's segment (t_k − τ clamped to its time span). Cubic
    Hermite on the grid, slopes by the secants of the neighbouring points (Catmull–Rom on a
    non-uniform grid): C¹ in τ, error O(Δt³) in the step size.

    ``align(reference, x)`` (an observation's :meth:`AbstractObservation.align`) moves the
    neighbours of each interval's left point to the representative nearest it (an angle
    wrapped at ±π, a quaternion's sign) before interpolating, so that an interval where the
    prediction jumps by a period is interpolated along the motion, not across the jump."""
    if width == 1:  # every sample at the start of its segment: nothing to interpolate
        return h[pick]
    lo = (pick // width) * width
    hi = lo + width - 1
    t_star = jnp.clip(tf[pick] - tau, tf[lo], tf[hi])
    b = jnp.clip(jnp.searchsorted(tf, t_star, side="left"), lo + 1, jnp.maximum(hi, lo + 1))
    b = jnp.minimum(b, tf.shape[0] - 1)
    a = b - 1
    a0 = jnp.maximum(a - 1, lo)
    b1 = jnp.minimum(b + 1, hi)
    ha, h_a0, hb, h_b1 = h[a], h[a0], h[b], h[b1]
    if align is not None:
        h_a0, hb, h_b1 = align(ha, h_a0), align(ha, hb), align(ha, h_b1)

    def secant(hi_, hj, i, j):
        w = tf[j] - tf[i]
        safe = jnp.where(w > 0, w, 1.0)
        return jnp.where((w > 0)[:, None], (hj - hi_) / safe[:, None], 0.0)

    w = tf[b] - tf[a]
    s = jnp.where(w > 0, (t_star - tf[a]) / jnp.where(w > 0, w, 1.0), 0.0)[:, None]
    ma, mb = secant(h_a0, hb, a0, b) * w[:, None], secant(ha, h_b1, a, b1) * w[:, None]
    s2, s3 = s * s, s * s * s
    return (
        (2 * s3 - 3 * s2 + 1) * ha
        + (s3 - 2 * s2 + s) * ma
        + (-2 * s3 + 3 * s2) * hb
        + (s3 - s2) * mb
    )


def unravel(template, flat):
    return ravel_pytree(template)[1](flat)


@eqx.filter_jit
def eval_forward(problem: Problem, template, flat):
    """(r, J, aux) with J = ∂r/∂θ by forward mode (``jax.jacfwd``: p tangents)."""

    def f(v):
        r, aux = residual_vector(problem, unravel(template, v))
        return r, (r, aux)

    jac, (r, aux) = jax.jacfwd(f, has_aux=True)(flat)
    return r, jac, aux


@eqx.filter_jit
def eval_reverse(problem: Problem, template, flat):
    """(r, ∇L, aux) with L = ½‖r‖² by reverse mode."""

    def f(v):
        r, aux = residual_vector(problem, unravel(template, v))
        return 0.5 * jnp.sum(r * r), (r, aux)

    (_, (r, aux)), g = jax.value_and_grad(f, has_aux=True)(flat)
    return r, g, aux


@eqx.filter_jit
def jacobian_reverse(problem: Problem, template, flat):
    """J = ∂r/∂θ by reverse mode (``jax.jacrev``: one vjp per residual)."""
    return jax.jacrev(lambda v: residual_vector(problem, unravel(template, v))[0])(flat)


def leaf_names(tree) -> list[str]:
    """One name per scalar of the array leaves, in ``ravel_pytree`` order."""
    names = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        base = jax.tree_util.keystr(path)
        shape = np.shape(leaf)
        if not shape:
            names.append(base)
        else:
            names += [base + "[" + ",".join(map(str, i)) + "]" for i in np.ndindex(shape)]
    return names


def _free_spec(params0, free):
    """A bool pytree with params0's structure: True at the fitted leaves."""
    is_float = eqx.is_inexact_array
    if free is None:
        return jax.tree.map(is_float, params0)
    if callable(free) and not isinstance(free, eqx.Module):
        return jax.tree.map(lambda x: bool(free(x)) and is_float(x), params0)

    def expand(f, sub):
        if callable(f):
            return jax.tree.map(lambda x: bool(f(x)) and is_float(x), sub)
        if not isinstance(f, (bool, np.bool_)):
            raise TypeError(f"a leaf of free is {f!r}, not a bool or a callable")
        return jax.tree.map(lambda x: bool(f) and is_float(x), sub)

    try:
        return jax.tree.map(
            expand, free, params0, is_leaf=lambda x: isinstance(x, (bool, np.bool_))
        )
    except (ValueError, TypeError) as e:
        fail(
            "identify(free)",
            free,
            f"does not match the structure of params0 ({e})",
            "pass None (every float array leaf), a pytree of bools with params0's structure "
            "(or a prefix of it), or a callable leaf -> bool",
        )
        raise


def _check_build_output(out, where: str):
    if not (isinstance(out, tuple) and len(out) == 2):
        fail(where, type(out).__name__, "is not a (model, state0) pair", "return (model, state0)")
    model, state0 = out
    if is_joint(model):
        one = isinstance(state0, JointState) and np.ndim(state0.qpos) == 1
        if not (one and np.ndim(state0.t) == 0):
            shape = np.shape(state0.qpos) if isinstance(state0, JointState) else None
            fail(
                f"{where}[1]",
                type(state0).__name__ if shape is None else f"<qpos shape {shape}>",
                "is not ONE rbjax.JointState (t scalar, qpos (nq,), qvel (nv,)) of the JointModel",
                "return the JointModel's initial state of a single system (no batch axes), "
                "e.g. rbjax.JointState(0.0, qpos, qvel)",
            )
        return model, state0
    if not hasattr(model, "formulation") or not hasattr(model, "names"):
        fail(
            f"{where}[0]",
            type(model).__name__,
            "is not an rbjax.Model or rbjax.JointModel",
            "return an rbjax.Model (maximal coordinates) or an rbjax.JointModel",
        )
    if not isinstance(state0, State) or np.ndim(state0.q) != 2 or np.ndim(state0.t) != 0:
        fail(
            f"{where}[1]",
            getattr(state0, "q", state0),
            "is not ONE rbjax.State (t scalar, q and u (nb, 7))",
            "return the initial state of a single system (no batch axes)",
        )
    return model, state0


@validates_inputs
def setup(build, params0, data, dt, integrator, free, shooting: Shooting | None, who: str):
    """Host-side validation and the problem description shared by identify and residuals."""
    if not callable(build):
        fail(f"{who}(build)", build, "is not callable", "pass build(params) -> (model, state0)")
    if not isinstance(data, Measurements):
        fail(
            f"{who}(data)",
            type(data).__name__,
            "is not rbjax.Measurements",
            "wrap the data as rbjax.Measurements(times, [observations...])",
        )
    integrator = RK4() if integrator is None else integrator
    if not isinstance(integrator, AbstractIntegrator):
        fail(f"{who}(integrator)", integrator, "is not an rbjax integrator", "pass rbjax.RK4()")
    try:
        dt_ok = np.ndim(dt) == 0 and np.isfinite(float(dt)) and float(dt) > 0
    except (TypeError, ValueError):
        dt_ok = False
    if not dt_ok:
        fail(f"{who}(dt)", dt, "is not a positive finite number", "pass the largest step in s")
    if shooting is not None and not isinstance(shooting, Shooting):
        fail(
            f"{who}(shooting)",
            shooting,
            "is not None or an rbjax.Shooting",
            "pass None (single shooting) or shooting=rbjax.Shooting(segments=S)",
        )
    model0, state0 = _check_build_output(build(params0), f"{who}: build(params0)")
    if isinstance(state0, JointState):  # and so model0 a JointModel
        check_integrator(integrator, who)
        check_joint_state(model0, state0)
    else:
        require_model(model0).check_state(state0)
        check_mechanism_state(model0, state0)
    t0 = float(state0.t)
    times = data.times
    if times[0] < t0:
        fail(
            "Measurements.times[0]",
            times[0],
            f"is before the initial time state0.t = {t0}",
            "measure at or after state0.t, or start the state earlier",
        )
    for i, o in enumerate(data.observations):
        o.check(model0, state0, params0, f"Measurements.observations[{i}] ({type(o).__name__})")
    k_total = times.size
    n_seg = 1 if shooting is None else shooting.segments
    if n_seg > k_total:
        fail(
            "Shooting.segments",
            n_seg,
            f"is more than the {k_total} samples",
            f"pass at most {k_total} segments (one or more samples per segment)",
        )
    if n_seg > 1 and is_joint(model0) and model0.equalities:
        fail(
            "Shooting.segments",
            n_seg,
            "splits the motion of a JointModel with equalities, whose segment starts would "
            "have to be assembled onto them at every evaluation (not implemented: "
            "rbjax.assemble of a JointModel runs on the host)",
            "use single shooting (shooting=None), or load the file in maximal coordinates "
            "(rbjax.load(path, formulation=rbjax.ScalableDAE())), whose segment starts are "
            "assembled",
        )
    weight = 1.0 if shooting is None else shooting.continuity_weight
    spec = _free_spec(params0, free)
    dyn0, fixed = eqx.partition(params0, spec)
    dyn0 = jax.tree.map(jnp.asarray, dyn0)
    dtype = dtype_of(state0)
    starts, hs, ts, pick, ends, n_steps = segments(t0, times, float(dt), n_seg)
    as_dtype = lambda a: a.astype(dtype) if eqx.is_inexact_array(a) else a
    problem = Problem(
        build=build,
        fixed=fixed,
        observations=jax.tree.map(as_dtype, data.observations),
        integrator=integrator,
        t_start=jnp.asarray(starts, dtype),
        hs=jnp.asarray(hs, dtype),
        ts=jnp.asarray(ts, dtype),
        pick=jnp.asarray(pick),
        ends=jnp.asarray(ends),
        a_ref=None,
        ref_q=None,
        ref_u=None,
        basis=None,
        sqrt_w=jnp.asarray(np.sqrt(float(weight)), dtype),
        n_seg=n_seg,
    )
    return problem, dyn0, spec, model0, state0, n_steps


def residuals(
    build: Callable[[Any], tuple[AbstractModel, AbstractState]],
    params,
    data: Measurements,
    *,
    dt,
    integrator=None,
) -> Array:
    """The whitened residual vector r(θ) = (prediction − measurement)/σ of :func:`identify`
    (single shooting), observations in order, each (K, d) flattened row by row, 0 at masked
    samples; the loss is ½‖r‖². A JAX function of ``params`` (every floating-point leaf):
    ``jax.jit``, ``jax.grad`` and ``jax.jacfwd`` compose with it (the sample schedule is
    computed from the concrete ``data.times`` and ``dt``)."""
    problem, dyn, *_ = setup(build, params, data, dt, integrator, None, None, "residuals")
    return residual_vector(problem, (dyn, {}))[0]


def rounding(problem: Problem, n_residuals: int, dtype) -> np.ndarray:
    """Rounding error of every residual: 1e4 ulp of the largest measured value of its
    observation, in units of σ (continuity rows: 1e4 ulp of 1 SI unit, times √w)."""
    eps = float(jnp.finfo(dtype).eps)
    out = []
    for o in problem.observations:
        y = float(np.max(np.abs(np.asarray(o.values)), initial=1.0))
        rho = 1e4 * eps * max(y, 1.0) / np.asarray(o.sigma, dtype=np.float64)
        out.append(np.tile(rho, o.values.shape[0]))
    out = np.concatenate(out)
    rest = n_residuals - out.size
    return np.concatenate([out, np.full(rest, 1e4 * eps * float(problem.sqrt_w))])


def choose_mode(autodiff: str, p_total: int) -> str:
    if autodiff not in ("auto", "forward", "reverse"):
        fail("identify(autodiff)", autodiff, "is not 'auto', 'forward' or 'reverse'", "pick one")
    if autodiff == "auto":
        return "forward" if p_total <= 64 else "reverse"
    return autodiff
