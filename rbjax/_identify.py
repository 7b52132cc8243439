"""System identification: fit physical parameters and initial conditions to measured motion.

The user writes ``build(params) -> (model, state0)`` for ANY parameter pytree (e.g. masses as
:class:`rbjax.Positive`, inertias as :class:`rbjax.PrincipalInertia`, joint points, damping,
initial spin), chooses which leaves are free with a pytree filter, and passes measurements:
sample times (any spacing) and observations of body positions (markers), orientations,
velocities, angular velocities, joint reaction forces or any custom function of the state,
each with its noise level σ and optional missing-sample mask. :func:`identify` minimises

    L = ½ Σ_k Σ_obs ‖(prediction − measurement) / σ‖²

(the negative log-likelihood under independent Gaussian noise) with optax (L-BFGS with its
zoom line search, Adam, or any ``optax.GradientTransformation``), reverse-mode gradients
through the simulation, and reports the Gauss–Newton covariance (JᵀJ)⁻¹ of the whitened
residuals J, standard errors, and the directions of parameter space the data cannot determine,
by name, instead of silently "fitting" them.

Simulation at the sample times: each interval between samples is split into
n_k = ⌈Δt_k / dt⌉ equal steps (n_k from the concrete times, so static), and one ``lax.scan``
runs all steps with their own step size; the state is taken exactly at every sample time.

Multiple shooting (``shooting=S``): the samples are split into S consecutive segments; the
state at the start of each segment after the first is an extra unknown (position, a rotation
vector relative to the initial guess, velocity, angular velocity; for scalable bodies also the
log-scale and ν), projected onto the joints with :func:`rbjax.assemble` for mechanisms. The
segments are integrated in parallel (``vmap``), and continuity residuals √w·(end of segment s −
start of segment s+1) join the least-squares problem. Short segments keep the loss landscape
smooth on chaotic or long horizons, where single shooting has exponentially large gradients
(see :func:`rbjax.gradient_health` where available, and docs/architecture.md).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from typing import Any, cast

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree
from jaxtyping import Array

from . import _quaternion as quat
from ._assembly import assemble
from ._errors import fail
from ._integrators import RK4, AbstractIntegrator
from ._mass import to_cf
from ._reactions import reactions
from ._state import State

# --------------------------------------------------------------------------- observations


class AbstractObservation(eqx.Module):
    """A measured quantity: ``values`` (K, d) at the sample times, noise std ``sigma`` (scalar
    or (d,)) in the quantity's units, ``mask`` (K,) True where a sample exists (None = all)."""

    values: Array
    sigma: Array
    mask: Array | None

    @abc.abstractmethod
    def predict(self, model, states: State, index) -> Array:
        """The predicted quantity (K, d) at the sample states (leading axis K); ``index``
        resolves a body or joint name or index."""

    def residual(self, model, states: State, index) -> Array:
        """Whitened residual (prediction − measurement)/σ, zero at missing samples, (K, d)."""
        r = (self.predict(model, states, index) - self.values) / self.sigma
        return r if self.mask is None else jnp.where(self.mask[:, None], r, 0.0)

    @property
    def dim(self) -> int:
        return int(np.shape(self.values)[1])


def _obs_init(obj, name, values, sigma, mask, d, sd=None):
    sd = d if sd is None else sd
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 2 or v.shape[1] != d:
        fail(
            f"{name}.values",
            f"shape {v.shape}",
            f"is not (K, {d})",
            f"pass one row of {d} numbers per sample time",
        )
    s = np.asarray(sigma, dtype=np.float64)
    if s.shape not in ((), (sd,)) or not np.all(np.isfinite(s)) or np.any(s <= 0):
        fail(
            f"{name}.sigma",
            sigma,
            f"is not a positive finite scalar or ({sd},) vector",
            "pass the noise standard deviation in the quantity's units",
        )
    if mask is not None:
        m = np.asarray(mask)
        if m.shape != (v.shape[0],) or m.dtype != bool:
            fail(
                f"{name}.mask",
                f"shape {m.shape}, dtype {m.dtype}",
                f"is not a boolean array of shape ({v.shape[0]},)",
                "pass True where a sample exists",
            )
        mask = jnp.asarray(m)
    finite = (
        np.all(np.isfinite(v), axis=1)
        if mask is None
        else np.all(np.isfinite(v), axis=1) | ~np.asarray(mask)
    )
    if not np.all(finite):
        k = int(np.argmin(finite))
        fail(
            f"{name}.values[{k}]",
            v[k],
            "is not finite",
            "mask missing samples with mask= instead of NaN",
        )
    obj.values = jnp.asarray(np.where(np.isfinite(v), v, 0.0))
    obj.sigma = jnp.asarray(np.broadcast_to(s, (sd,)))
    obj.mask = mask


class Position(AbstractObservation):
    """World position of a body-fixed point (a marker) ``point`` (body axes, from the centre of
    mass) of ``body`` (index or name): r + s R s̄ (seed 000 eq. (27)). values (K, 3) [m]."""

    body: int | str = eqx.field(static=True)
    point: Array

    def __init__(self, body, values, sigma, *, point=(0.0, 0.0, 0.0), mask=None):
        _obs_init(self, "Position", values, sigma, mask, 3)
        self.body = body
        self.point = jnp.asarray(point, dtype=jnp.result_type(float))

    def predict(self, model, states, index):
        b = index(self.body)
        q = states.q[:, b]
        return q[:, 0:3] + quat.transform(q[:, 3:7], jnp.broadcast_to(self.point, q[:, 0:3].shape))


class Orientation(AbstractObservation):
    """Orientation of ``body`` as unit quaternions ``values`` (K, 4); the residual is the
    rotation vector (3 numbers, rad) of the relative rotation between prediction and
    measurement, the same for q and −q. ``sigma`` in rad."""

    body: int | str = eqx.field(static=True)

    def __init__(self, body, values, sigma, *, mask=None):
        v = np.asarray(values, dtype=np.float64)
        if v.ndim != 2 or v.shape[1] != 4:
            fail(
                "Orientation.values",
                f"shape {v.shape}",
                "is not (K, 4)",
                "pass one unit quaternion (scalar first) per sample",
            )
        _obs_init(self, "Orientation", v, sigma, mask, 4, sd=3)
        self.body = body

    @property
    def dim(self) -> int:
        return 3

    def predict(self, model, states, index):
        return states.q[:, index(self.body), 3:7]

    def residual(self, model, states, index):
        rel = quat.mul(quat.conjugate(self.values), self.predict(model, states, index))
        rel = rel * jnp.where(rel[:, :1] < 0, -1.0, 1.0)  # q and −q are the same rotation
        r = 2.0 * quat.log(rel / jnp.linalg.norm(rel, axis=-1, keepdims=True)) / self.sigma
        return r if self.mask is None else jnp.where(self.mask[:, None], r, 0.0)


class AngularVelocity(AbstractObservation):
    """Angular velocity of ``body`` [rad/s], ``frame="body"`` (ω as in the state, seed 000
    eq. (37)) or ``"world"`` (R ω). values (K, 3)."""

    body: int | str = eqx.field(static=True)
    frame: str = eqx.field(static=True)

    def __init__(self, body, values, sigma, *, frame="body", mask=None):
        if frame not in ("body", "world"):
            fail(
                "AngularVelocity.frame",
                frame,
                "is not 'body' or 'world'",
                "pass frame='body' or 'world'",
            )
        _obs_init(self, "AngularVelocity", values, sigma, mask, 3)
        self.body, self.frame = body, frame

    def predict(self, model, states, index):
        b = index(self.body)
        w = states.u[:, b, 4:7]
        return w if self.frame == "body" else quat.rotate(states.q[:, b, 3:7], w)


class Velocity(AbstractObservation):
    """World velocity of the centre of mass of ``body`` [m/s], values (K, 3)."""

    body: int | str = eqx.field(static=True)

    def __init__(self, body, values, sigma, *, mask=None):
        _obs_init(self, "Velocity", values, sigma, mask, 3)
        self.body = body

    def predict(self, model, states, index):
        return states.u[:, index(self.body), 0:3]


class ReactionForce(AbstractObservation):
    """Reaction force (or, with ``torque=True``, torque about the joint point) that ``joint``
    (index or name) exerts on its body ``side`` ("i" or "j"), in the ``"world"`` or the body's
    ``"joint"`` frame (:func:`rbjax.reactions`). values (K, 3) [N] or [N m]."""

    joint: int | str = eqx.field(static=True)
    side: str = eqx.field(static=True)
    frame: str = eqx.field(static=True)
    torque: bool = eqx.field(static=True)

    def __init__(self, joint, values, sigma, *, side="j", frame="world", torque=False, mask=None):
        if side not in ("i", "j"):
            fail("ReactionForce.side", side, "is not 'i' or 'j'", "pass side='i' or 'j'")
        if frame not in ("world", "joint"):
            fail(
                "ReactionForce.frame",
                frame,
                "is not 'world' or 'joint'",
                "pass frame='world' or 'joint'",
            )
        _obs_init(self, "ReactionForce", values, sigma, mask, 3)
        self.joint, self.side, self.frame, self.torque = joint, side, frame, bool(torque)

    def predict(self, model, states, index):
        rx = reactions(model, states)
        name = ("torque" if self.torque else "force") + f"_{self.side}"
        name += "_joint" if self.frame == "joint" else ""
        return getattr(rx, name)[:, index(self.joint, joint=True)]


class Custom(AbstractObservation):
    """Any differentiable ``fn(model, state) -> (d,)`` of ONE state; values (K, d)."""

    fn: Callable = eqx.field(static=True)

    def __init__(self, fn, values, sigma, *, mask=None):
        if not callable(fn):
            fail("Custom.fn", fn, "is not callable", "pass fn(model, state) -> array of shape (d,)")
        d = int(np.shape(values)[1]) if np.ndim(values) == 2 else -1
        _obs_init(self, "Custom", values, sigma, mask, d)
        self.fn = fn

    def predict(self, model, states, index):
        return jax.vmap(lambda s: jnp.asarray(self.fn(model, s)))(states)


class Measurements:
    """Sample ``times`` (K,), strictly increasing, any spacing, and the ``observations``."""

    times: np.ndarray
    observations: tuple[AbstractObservation, ...]

    def __init__(self, times, observations):
        t = np.asarray(times, dtype=np.float64)
        if t.ndim != 1 or t.size < 1 or not np.all(np.isfinite(t)):
            fail(
                "Measurements.times",
                f"shape {t.shape}",
                "is not a 1-D array of finite times",
                "pass the sample times in s",
            )
        if np.any(np.diff(t) <= 0):
            k = int(np.argmax(np.diff(t) <= 0))
            fail(
                f"Measurements.times[{k + 1}]",
                t[k + 1],
                f"is not after times[{k}] = {t[k]}",
                "sort the samples and merge duplicate times",
            )
        obs = tuple(observations) if isinstance(observations, (list, tuple)) else (observations,)
        if not obs:
            fail("Measurements.observations", obs, "is empty", "pass at least one observation")
        for i, o in enumerate(obs):
            if not isinstance(o, AbstractObservation):
                fail(
                    f"Measurements.observations[{i}]",
                    o,
                    "is not an rbjax observation",
                    "use Position, Orientation, AngularVelocity, Velocity, ReactionForce or Custom",
                )
            if o.values.shape[0] != t.size:
                fail(
                    f"Measurements.observations[{i}].values",
                    f"{o.values.shape[0]} samples",
                    f"does not match the {t.size} sample times",
                    "pass one row per sample time (mask missing ones)",
                )
        self.times = t
        self.observations = obs

    @property
    def count(self) -> int:
        """Number of measured scalars (masked samples excluded)."""
        n = 0
        for o in self.observations:
            k = o.values.shape[0] if o.mask is None else int(np.sum(np.asarray(o.mask)))
            n += k * o.dim
        return n


# --------------------------------------------------------------------------- simulation


def _schedule(t0: float, times: np.ndarray, dt: float):
    """Step sizes reaching every sample time exactly and, per sample, the index of its state
    among [initial, after step 1, ...]."""
    hs, idx, prev, count = [], [], t0, 0
    for t in times:
        if t > prev:
            n = max(1, int(np.ceil((t - prev) / dt - 1e-9)))
            hs += [(t - prev) / n] * n
            count += n
        idx.append(count)
        prev = t
    return np.asarray(hs, dtype=np.float64), np.asarray(idx, dtype=np.int32)


def _trajectory(model, state0: State, hs, idx, integrator):
    """States at the sample indices ``idx`` of the run with step sizes ``hs`` (one scan)."""
    t, q, u = to_cf(state0)

    def step(carry, h):
        t, q, u = carry
        t, q, u, _ = integrator.step_cf(model, t, q, u, h)
        return (t, q, u), (t, q, u)

    _, (ts, qs, us) = jax.lax.scan(step, (t, q, u), hs)
    ts = jnp.concatenate([t[None], ts])[idx]
    qs = jnp.concatenate([q[None], qs])[idx]
    us = jnp.concatenate([u[None], us])[idx]
    return State(t=ts[:, 0], q=jnp.moveaxis(qs, 1, -1), u=jnp.moveaxis(us, 1, -1))


def _rotvec_between(a, b):
    """Rotation vector of conj(a) ⊗ b for quaternions (..., 4) (sign-invariant)."""
    rel = quat.mul(quat.conjugate(a), b)
    rel = rel * jnp.where(rel[..., :1] < 0, -1.0, 1.0)
    return 2.0 * quat.log(rel / jnp.linalg.norm(rel, axis=-1, keepdims=True))


# --------------------------------------------------------------------------- results


@dataclasses.dataclass(frozen=True)
class IdentificationResult:
    """What :func:`identify` found.

    ``params``: the estimate (full pytree); ``loss`` and ``loss_history`` (per optimiser step);
    ``steps``; ``converged``; ``residuals`` whitened at the estimate; ``names`` of the free
    scalars (pytree paths); ``estimate`` (their values); ``covariance`` Gauss–Newton (JᵀJ)⁻¹
    over them (the marginal block when segment states are also free), with ``inf`` rows for
    unidentifiable ones; ``std_errors`` a pytree like the free leaves of ``params`` (None at
    fixed leaves); ``unidentifiable`` one readable string per direction the data cannot
    determine; ``reduced_chi2`` = 2L/(N − p) (≈ 1 when σ is right and the model fits);
    ``segment_states`` the fitted states at the segment starts (multiple shooting).
    """

    params: Any
    loss: float
    loss_history: np.ndarray
    steps: int
    converged: bool
    residuals: np.ndarray
    names: tuple[str, ...]
    estimate: np.ndarray
    covariance: np.ndarray
    std_errors: Any
    unidentifiable: tuple[str, ...]
    reduced_chi2: float
    segment_states: State | None

    def summary(self) -> str:
        std = np.sqrt(np.maximum(np.diag(self.covariance), 0.0))
        w = max([len(n) for n in self.names] + [9])
        lines = [
            f"rbjax.identify: {self.steps} steps, loss {self.loss:.6g}, reduced chi² "
            f"{self.reduced_chi2:.3g}, {'converged' if self.converged else 'NOT converged'}",
            f"  {'parameter':{w}s}  {'estimate':>14s}  {'std error':>11s}",
        ]
        for n, v, s in zip(self.names, self.estimate, std, strict=True):
            lines.append(f"  {n:{w}s}  {v:14.8g}  {s:11.3g}")
        if self.unidentifiable:
            lines.append("  not determined by the data (std error inf):")
            lines += [f"    {d}" for d in self.unidentifiable]
        return "\n".join(lines)


# --------------------------------------------------------------------------- identify


def _leaf_names(tree, prefix=""):
    names = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        base = prefix + jax.tree_util.keystr(path)
        arr = np.asarray(leaf)
        if arr.ndim == 0:
            names.append(base)
        else:
            names += [base + str(list(i)).replace(" ", "") for i in np.ndindex(arr.shape)]
    return names


def _free_spec(params0, free):
    if free is None:
        return jax.tree.map(eqx.is_inexact_array, params0)
    if callable(free):
        return jax.tree.map(lambda x: bool(free(x)) and eqx.is_inexact_array(x), params0)
    try:
        spec = jax.tree.map(lambda x, f: bool(f) and eqx.is_inexact_array(x), params0, free)
    except ValueError as e:
        raise ValueError(
            f"identify: free = {free!r} does not have the structure of params0 ({e}). Fix: pass "
            "a pytree of bools like params0, a callable leaf -> bool, or None (all float arrays)."
        ) from None
    return spec


def identify(
    build: Callable[[Any], tuple[Any, State]],
    params0: Any,
    data: Measurements,
    *,
    dt: float,
    free=None,
    integrator: AbstractIntegrator | None = None,
    optimizer: str | optax.GradientTransformation = "lbfgs",
    learning_rate: float = 1e-2,
    max_steps: int = 200,
    tol: float = 1e-12,
    shooting: int | None = None,
    continuity_weight: float = 1e6,
    rtol_identifiable: float = 1e-9,
) -> IdentificationResult:
    """Fit the free leaves of ``params0`` (and, with ``shooting``, the segment start states) to
    ``data``; see the module docstring. ``build(params) -> (model, state0)`` must be a pure JAX
    function of the parameters. ``dt`` is the largest integration step [s]. Stops after
    ``max_steps`` or when the relative loss decrease of an L-BFGS step is below ``tol`` (Adam:
    when the gradient norm is below ``tol``). ``continuity_weight`` w multiplies the squared
    continuity gaps of multiple shooting (units m, rad, m/s, rad/s; default 1e6, i.e. a gap of
    1e-3 costs as much as a one-σ misfit). Directions of parameter space along which the
    scaled Gauss–Newton matrix has eigenvalues below ``rtol_identifiable`` × the largest are
    reported as unidentifiable.
    """
    integrator = RK4() if integrator is None else integrator
    if not isinstance(integrator, AbstractIntegrator):
        fail(
            "identify(integrator)",
            integrator,
            "is not an rbjax integrator",
            "pass e.g. rbjax.RK4()",
        )
    if not isinstance(data, Measurements):
        fail(
            "identify(data)",
            type(data).__name__,
            "is not rbjax.Measurements",
            "wrap the times and observations in rbjax.Measurements(times, [...])",
        )
    if not (np.isfinite(dt) and dt > 0):
        fail(
            "identify(dt)",
            dt,
            "is not a positive finite step",
            "pass the largest integration step in s",
        )
    if not isinstance(max_steps, (int, np.integer)) or max_steps < 1:
        fail("identify(max_steps)", max_steps, "is not a positive integer", "pass e.g. 200")
    model0, state0 = build(params0)
    if not isinstance(state0, State) or state0.q.ndim != 2:
        fail(
            "identify: build(params0)[1]",
            getattr(state0, "q", state0),
            "is not ONE rbjax.State (nb, 7)",
            "return (model, state0) for a single system",
        )
    t0 = float(state0.t)
    times = data.times
    if times[0] < t0:
        fail(
            "Measurements.times[0]",
            times[0],
            f"is before the initial time {t0}",
            "measure at or after state0.t",
        )
    names = model0.names
    jnames = model0.joint_names

    def index(key, joint=False):
        pool = jnames if joint else names
        what = "joint" if joint else "body"
        if isinstance(key, str):
            if key not in pool:
                fail(
                    f"observation {what}",
                    key,
                    f"is not a {what} of the model {list(pool)}",
                    "use one of these names or an index",
                )
            return pool.index(key)
        if not isinstance(key, (int, np.integer)) or not 0 <= key < len(pool):
            fail(
                f"observation {what}",
                key,
                f"is not an index into the model's {len(pool)} {what}s",
                f"use an index in [0, {len(pool)}) or a name",
            )
        return int(key)

    for o in data.observations:  # validate names and indices now, not inside jit
        if isinstance(o, ReactionForce):
            if not model0.joints:
                fail(
                    "ReactionForce",
                    o.joint,
                    "observes a joint but the model has no joints",
                    "add joints to the model or remove the observation",
                )
            index(o.joint, joint=True)
        elif hasattr(o, "body"):
            index(o.body)  # pyright: ignore[reportAttributeAccessIssue]

    spec = _free_spec(params0, free)
    dyn0, static = eqx.partition(params0, spec)
    if not jax.tree.leaves(dyn0):
        fail(
            "identify(free)",
            free,
            "selects no floating-point leaf of params0",
            "select at least one parameter to fit",
        )

    # ---- segments (multiple shooting) and their step schedules
    K = times.size
    S = 1 if shooting is None else int(shooting)
    if S < 1 or S > K:
        fail(
            "identify(shooting)",
            shooting,
            f"is not a number of segments in [1, {K}]",
            "pass None or an integer <= the number of samples",
        )
    chunks = np.array_split(np.arange(K), S)
    starts = [t0] + [float(times[c[0]]) for c in chunks[1:]]
    scheds = []
    for s, c in enumerate(chunks):
        seg_times = times[c] if s == S - 1 else np.concatenate([times[c], [starts[s + 1]]])
        hs, idx = _schedule(starts[s], seg_times, dt)
        scheds.append((hs, idx))
    n_max = max(1, max(len(h) for h, _ in scheds))
    l_max = max(len(i) for _, i in scheds)
    hs_all = np.zeros((S, n_max))
    idx_all = np.zeros((S, l_max), dtype=np.int32)
    for s, (hs, idx) in enumerate(scheds):
        hs_all[s, : len(hs)] = hs  # h = 0 steps at the end leave the state unchanged
        idx_all[s, : len(idx)] = idx
    sample_at = np.concatenate(
        [np.stack([np.full(len(c), s), np.arange(len(c))], 1) for s, c in enumerate(chunks)]
    )
    ends = np.asarray([[s, len(chunks[s])] for s in range(S - 1)], dtype=np.int32).reshape(-1, 2)
    dtype = state0.q.dtype
    hs_all = jnp.asarray(hs_all, dtype)
    idx_all = jnp.asarray(idx_all)
    rigid = np.asarray([not sc for sc in model0.scalable])
    nb = model0.nb

    # ---- free segment start states (s >= 1), relative to their initial guess
    if S > 1:
        hs_guess = jnp.asarray(np.concatenate([h for h, _ in scheds[:-1]]), dtype)
        at_starts = jnp.asarray(np.cumsum([len(h) for h, _ in scheds[:-1]]), jnp.int32)
        guess = _trajectory(model0, state0, hs_guess, at_starts, integrator)
        ref_q = np.asarray(guess.q)
        seg0 = {
            "r": jnp.asarray(ref_q[:, :, 0:3]),
            "rotation": jnp.zeros((S - 1, nb, 3), dtype),
            "log_scale": jnp.zeros((S - 1, nb), dtype),
            "v": guess.u[:, :, 0:3],
            "nu": guess.u[:, :, 3],
            "omega": guess.u[:, :, 4:7],
        }
        ref_a = jnp.asarray(ref_q[:, :, 3:7])
    else:
        seg0, ref_a = {}, None

    def segment_state(seg, model, t_start):
        assert ref_a is not None
        a = quat.mul(ref_a, quat.exp(0.5 * seg["rotation"]))
        a = a * jnp.where(jnp.asarray(rigid)[:, None], 1.0, jnp.exp(seg["log_scale"])[..., None])
        nu = jnp.where(jnp.asarray(rigid), 0.0, seg["nu"])
        q = jnp.concatenate([seg["r"], a], axis=-1)
        u = jnp.concatenate([seg["v"], nu[..., None], seg["omega"]], axis=-1)
        st = State(t=jnp.asarray(t_start, dtype), q=q, u=u)
        return assemble(model, st) if model.joints else st

    t_starts = jnp.asarray(starts[1:], dtype)

    def simulate(x):
        dyn, seg = x
        model, st0 = build(eqx.combine(dyn, static))
        if S > 1:
            rest = segment_state(seg, model, t_starts)
            init = jax.tree.map(lambda a, b: jnp.concatenate([a[None], b]), st0, rest)
        else:
            rest = None
            init = jax.tree.map(lambda a: a[None], st0)
        out = jax.vmap(lambda s0, h, i: _trajectory(model, s0, h, i, integrator))(
            init, hs_all, idx_all
        )
        return model, out, rest

    def residuals(x):
        model, out, rest = simulate(x)
        samples = jax.tree.map(lambda a: a[sample_at[:, 0], sample_at[:, 1]], out)
        parts = [o.residual(model, samples, index).reshape(-1) for o in data.observations]
        if rest is not None:
            end = jax.tree.map(lambda a: a[ends[:, 0], ends[:, 1]], out)
            gap = [
                end.q[..., 0:3] - rest.q[..., 0:3],
                _rotvec_between(rest.q[..., 3:7], end.q[..., 3:7]),
                jnp.sum(end.q[..., 3:7] ** 2, -1, keepdims=True)
                - jnp.sum(rest.q[..., 3:7] ** 2, -1, keepdims=True),
                end.u - rest.u,
            ]
            parts += [np.sqrt(continuity_weight) * g.reshape(-1) for g in gap]
        return jnp.concatenate(parts)

    def loss(x):
        r = residuals(x)
        return 0.5 * jnp.sum(r * r)

    x0: Any = (dyn0, seg0)
    if optimizer == "lbfgs":
        opt = optax.lbfgs()  # with optax's zoom line search (strong Wolfe conditions)
        vg = optax.value_and_grad_from_state(loss)

        @eqx.filter_jit
        def step(x, state):
            value, grad = vg(x, state=state)
            updates, state = opt.update(grad, state, x, value=value, grad=grad, value_fn=loss)
            return optax.apply_updates(x, updates), state, value, optax.tree.norm(grad)

    else:
        if optimizer == "adam":
            opt = optax.adam(learning_rate)
        elif isinstance(optimizer, optax.GradientTransformation):
            opt = optimizer
        else:
            fail(
                "identify(optimizer)",
                optimizer,
                "is not 'lbfgs', 'adam' or an optax.GradientTransformation",
                "pass one of these",
            )

        @eqx.filter_jit
        def _step_plain(x, state):
            value, grad = jax.value_and_grad(loss)(x)
            updates, state = opt.update(grad, state, x)
            return optax.apply_updates(x, updates), state, value, optax.tree.norm(grad)

        step = _step_plain

    # optax's L-BFGS mixes int32 and int64 counters: run it under standard promotion so that
    # it also works for users who enable jax_numpy_dtype_promotion='strict' (as our tests do)
    with jax.numpy_dtype_promotion("standard"):
        x: Any = x0
        state = opt.init(x0)
        # the initial optimiser state with the dtypes the step returns (else it compiles twice)
        out_state = eqx.filter_eval_shape(step, x, state)[1]
        state = jax.tree.map(
            lambda a, o: jnp.asarray(a, o.dtype) if hasattr(o, "dtype") else a, state, out_state
        )
        history = []
        converged = False
        for k in range(int(max_steps)):
            x_new, state, value, gnorm = step(x, state)
            value = float(value)  # pyright: ignore[reportArgumentType]
            if not np.isfinite(value):
                raise ValueError(
                    f"identify: the loss became non-finite at optimiser step {k} (the simulation "
                    "diverged for these parameters). Fix: start closer, lower learning_rate, use a "
                    "smaller dt, or split the horizon with shooting=."
                )
            history.append(value)
            x = cast(Any, x_new)
            if float(gnorm) <= tol * max(1.0, value) or (
                optimizer == "lbfgs"
                and k > 0
                and history[-2] - value <= tol * max(history[-2], 1e-300)
                and history[-2] >= value
            ):
                converged = True
                break
    final_loss = float(jax.jit(loss)(x))
    history.append(final_loss)

    # ---- Gauss–Newton covariance and identifiability
    flat, unravel = ravel_pytree(x)
    p_phys = ravel_pytree(x[0])[0].size
    r_fn = lambda f: residuals(unravel(f))  # noqa: E731
    jac = np.asarray(jax.jit(jax.jacfwd(r_fn))(flat))
    res = np.asarray(jax.jit(r_fn)(flat))
    h = jac.T @ jac
    col = np.sqrt(np.diag(h))
    dead = col <= 1e-300
    dscale = np.where(dead, 0.0, 1.0 / np.where(dead, 1.0, col))
    hs_ = dscale[:, None] * h * dscale[None, :]
    w, v = np.linalg.eigh(hs_)
    top = max(w.max(), 1e-300)
    null = (w <= rtol_identifiable * top) | ~np.isfinite(w)
    inv_w = np.where(null, 0.0, 1.0 / np.where(null, 1.0, w))
    cov = dscale[:, None] * (v * inv_w) @ v.T * dscale[None, :]
    nullv = v[:, null]
    bad = dead | (np.sum(nullv**2, axis=1) > 1e-6)
    cov[bad, :] = np.inf
    cov[:, bad] = np.inf
    all_names = _leaf_names(x[0]) + (_leaf_names(x[1], "segment") if S > 1 else [])
    described = []
    hidden = 0
    for j in range(nullv.shape[1]):
        d = dscale * nullv[:, j]
        if np.max(np.abs(d[:p_phys]), initial=0.0) < 0.05 * np.max(np.abs(d)):
            hidden += 1  # a direction of segment start states only (e.g. normal to the joints)
            continue
        d = d / np.max(np.abs(d))
        terms = [f"{d[i]:+.3f}·{all_names[i]}" for i in np.argsort(-np.abs(d)) if abs(d[i]) >= 0.05]
        described.append(" ".join(terms))
    for i in np.flatnonzero(dead[:p_phys]):
        described.append(f"{all_names[i]} (no measured quantity depends on it)")
    cov_phys = cov[:p_phys, :p_phys]
    std = np.sqrt(
        np.where(np.isfinite(np.diag(cov_phys)), np.maximum(np.diag(cov_phys), 0.0), np.inf)
    )
    std_tree = ravel_pytree(x[0])[1](jnp.asarray(std))
    dof = max(data.count - p_phys, 1)
    seg_states = None
    if S > 1:
        model_hat, _ = build(eqx.combine(x[0], static))
        seg_states = segment_state(x[1], model_hat, t_starts)
    return IdentificationResult(
        params=eqx.combine(x[0], static),
        loss=final_loss,
        loss_history=np.asarray(history),
        steps=len(history) - 1,
        converged=converged,
        residuals=res,
        names=tuple(all_names[:p_phys]),
        estimate=np.asarray(flat[:p_phys]),
        covariance=cov_phys,
        std_errors=std_tree,
        unidentifiable=tuple(described),
        reduced_chi2=2.0 * final_loss / dof,
        segment_states=seg_states,
    )
