"""Gradient health of a rollout: are its derivatives trustworthy, and up to which horizon?

Differentiating a rollout is exact (the derivative of the discrete map), but over a chaotic
horizon the loss varies on scales far below any useful step: its gradient is exponentially large
and no longer predicts finite changes. :func:`gradient_health` measures this for one rollout
and one loss, at several horizons, from ONE compiled program:

* the loss at each horizon L_h is evaluated on the first h steps of one rollout of ``n_steps``
  (a rollout is causal: that is the rollout to h steps), so all horizons share one trace;
* forward mode (one ``jax.jvp`` per direction, ``vmap``-ed) gives dL_h/dξ · d and the tangent
  trajectory ∂x(t)/∂ξ · d at every saved time;
* reverse mode (one ``jax.vjp``, its pullback ``vmap``-ed over the horizons) gives ∇L_h;
* central finite differences (L_h(ξ + εd) − L_h(ξ − εd)) / 2ε along the same directions.

ξ are perturbation coordinates: for ``wrt="state"`` per body (δr, δθ, δv, δω) (world position,
body-frame rotation A ⊗ (1, δθ/2) rescaled to the same |A|, world velocity, body angular
velocity); for mechanisms the random directions are projected onto the tangent space of the
position and velocity constraints at the initial state (null space of their Jacobian), so every
perturbed state is consistent to first order. With a callable ``wrt(model) -> leaf or tuple of
leaves`` ξ are those model parameters, each leaf scaled by its RMS magnitude.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._engine.joints import joint_terms
from .._engine.layout import to_components
from .._errors import validates_inputs
from .._integrators import RK4, AbstractIntegrator, check_dt
from .._model import Model
from .._quaternion import mul as qmul
from .._results import RESULTS
from .._rollout import Checkpoint, Trajectory, rollout
from .._state import State
from .._tree.model import maximal_only
from .checks import check_mechanism_state


class GradientHealth(eqx.Module):
    """Result of :func:`gradient_health` (NumPy arrays; times in seconds).

    ``horizons`` (H,) horizons in steps, ``horizon_times`` (H,) the same in seconds;
    ``times`` (T,) the saved times of the rollout and ``sensitivity`` (T,) the largest
    ‖∂x(t)/∂ξ · d‖ over the directions d (x = (q, u) of every body and batch member);
    ``loss`` (H,) the loss at each horizon; ``gradient_norm`` (H,) ‖∂L_h/∂ξ‖ by reverse mode; ``ad_fd_error`` (H,) the largest
    |forward-mode − central-difference| directional derivative relative to the largest
    directional derivative at that horizon; ``fwd_rev_error`` (H,) the same between forward and
    reverse mode; ``lyapunov_exponent`` [1/s] the slope of a least-squares fit of
    log ``sensitivity`` against t (a finite-time Lyapunov exponent; ≈ 0 for regular motion);
    ``trustworthy_horizon`` [s] the longest horizon up to which every horizon passes
    (both errors ≤ ``tol``), 0 if none; ``eps`` the finite-difference step, ``tol`` the
    threshold, ``wrt`` what ξ is. ``str(result)`` prints a table and :attr:`verdict`.
    """

    horizons: np.ndarray
    horizon_times: np.ndarray
    times: np.ndarray
    sensitivity: np.ndarray
    loss: np.ndarray
    gradient_norm: np.ndarray
    ad_fd_error: np.ndarray
    fwd_rev_error: np.ndarray
    lyapunov_exponent: float
    trustworthy_horizon: float
    eps: float
    tol: float
    wrt: str

    def passed(self) -> np.ndarray:
        """(H,) bool: both errors ≤ tol at each horizon."""
        return (self.ad_fd_error <= self.tol) & (self.fwd_rev_error <= self.tol)

    def growth(self) -> np.ndarray:
        """(H,) sensitivity at each horizon relative to the start (or to the first horizon
        when the initial sensitivity is zero, as for parameters)."""
        at = np.interp(self.horizon_times, self.times, self.sensitivity)
        base = self.sensitivity[0] if self.sensitivity[0] > 0 else at[0]
        return at / base if base > 0 else np.full_like(at, np.nan)

    @property
    def verdict(self) -> str:
        ok = self.passed()
        lam = f"finite-time Lyapunov exponent ≈ {self.lyapunov_exponent:.3g} /s"
        g = self.growth()
        if ok.all():
            worst = max(float(self.ad_fd_error.max()), float(self.fwd_rev_error.max()))
            return (
                f"OK: gradients agree with finite differences at every horizon up to "
                f"t = {self.horizon_times[-1]:.4g} s (largest relative error {worst:.1e} ≤ "
                f"{self.tol:.0e}); the sensitivity grows {g[-1]:.3g}× ({lam})."
            )
        bad = int(np.argmin(ok))
        t_bad, err = self.horizon_times[bad], self.ad_fd_error[bad]
        if self.fwd_rev_error[bad] > self.tol:
            cause = (
                f"forward and reverse mode disagree there (relative error "
                f"{self.fwd_rev_error[bad]:.1e}): a derivative rule is inaccurate, e.g. an "
                "implicit solve that stopped early (tighten the integrator's tol) or a loss "
                "that is not differentiable."
            )
        elif g[bad] >= 100.0 or self.lyapunov_exponent * t_bad >= math.log(100.0):
            cause = (
                f"the horizon is too chaotic to differentiate (the sensitivity has grown "
                f"{g[bad]:.3g}× by then, {lam}): the loss varies on scales below eps = "
                f"{self.eps:.1e} and its gradient does not predict finite changes. Use multiple "
                "shooting (rbjax.identify(..., shooting=S) with segments shorter than the "
                "trustworthy horizon) or a shorter horizon."
            )
        else:
            cause = (
                f"the sensitivity has only grown {g[bad]:.3g}×, so this is not chaos: the loss "
                f"is probably not smooth at the scale eps = {self.eps:.1e} (a kink, an angle "
                "wrapping, a max) or eps is badly chosen for its scale; try another eps."
            )
        if self.trustworthy_horizon > 0:
            head = (
                f"gradients agree with finite differences up to t = "
                f"{self.trustworthy_horizon:.4g} s; beyond that (t = {t_bad:.4g} s) the relative "
                f"error {err:.1e} exceeds {self.tol:.0e}: "
            )
        else:
            head = (
                f"gradients disagree with finite differences already at the shortest horizon "
                f"t = {t_bad:.4g} s (relative error {err:.1e} > {self.tol:.0e}): "
            )
        return head + cause

    def __str__(self) -> str:
        g = self.growth()
        ok = self.passed()
        head = (
            f"{'steps':>8s} {'t [s]':>9s} {'|dL/dξ|':>10s} {'AD-FD err':>10s} "
            f"{'fwd-rev err':>11s} {'growth':>10s}  ok"
        )
        lines = [f"gradient health (ξ = {self.wrt}, eps = {self.eps:.1e})", head]
        for k in range(len(self.horizons)):
            lines.append(
                f"{int(self.horizons[k]):8d} {self.horizon_times[k]:9.4g} "
                f"{self.gradient_norm[k]:10.3e} {self.ad_fd_error[k]:10.1e} "
                f"{self.fwd_rev_error[k]:11.1e} {g[k]:10.3g}  {'yes' if ok[k] else 'NO'}"
            )
        lines.append(f"finite-time Lyapunov exponent: {self.lyapunov_exponent:.4g} /s")
        lines.append(self.verdict)
        return "\n".join(lines)


# ------------------------------------------------------------------ perturbation coordinates


def _perturb_state(state0: State, xi):
    """State at perturbation coordinates ξ (..., nb, 12) = (δr, δθ, δv, δω)."""
    q, u = state0.q, state0.u
    a0 = q[..., 3:7]
    one = jnp.ones(xi.shape[:-1] + (1,), xi.dtype)
    a = qmul(a0, jnp.concatenate([one, 0.5 * xi[..., 3:6]], axis=-1))
    n0 = jnp.sum(a0 * a0, axis=-1, keepdims=True)
    a = a * jnp.sqrt(n0 / jnp.sum(a * a, axis=-1, keepdims=True))  # a pure rotation
    q1 = jnp.concatenate([q[..., 0:3] + xi[..., 0:3], a], axis=-1)
    u1 = jnp.concatenate([u[..., 0:3] + xi[..., 6:9], u[..., 3:4], u[..., 4:7] + xi[..., 9:12]], -1)
    return State(t=state0.t, q=q1, u=u1)


def _constraint_tangent(model, state0: State, dirs):
    """Project state directions (n, *batch, nb, 12) onto the null space of the Jacobian of
    (Φ(q), W u + Φ_t) at ξ = 0, per batch member; also returns the smallest dimension of that
    null space (the degrees of freedom of position and velocity together)."""
    out, dof = _project_tangent(model, state0, dirs)
    return out, int(np.min(np.asarray(dof)))


@eqx.filter_jit
def _project_tangent(model, state0: State, dirs):
    kin = model.formulation._engine_kinematics
    batch = state0.q.shape[:-2]
    nb = model.nb

    def constraints(xi, s):
        t, q, u = to_components(_perturb_state(s, xi))
        terms = joint_terms(model, kin, t, q, u, gamma=False, cdot=True)
        return jnp.concatenate([terms.c, terms.cdot], axis=0)

    def project(s, d):  # one system: s (nb, 7) arrays, d (n, nb, 12)
        zero = jnp.zeros((nb, 12), s.q.dtype)
        jac = jax.jacfwd(constraints)(zero, s).reshape(-1, 12 * nb)
        _, sv, vt = jnp.linalg.svd(jac, full_matrices=True)
        rank = jnp.sum(sv > 1e-9 * jnp.maximum(sv[0], 1.0))
        mask = (jnp.arange(12 * nb) >= rank).astype(d.dtype)
        flat = d.reshape(d.shape[0], -1)
        coef = (flat @ vt.T) * mask
        return (coef @ vt).reshape(d.shape), 12 * nb - rank

    flat_s = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[len(batch) :]), state0)
    flat_d = jnp.moveaxis(dirs.reshape((dirs.shape[0], -1, nb, 12)), 1, 0)
    out, dof = jax.vmap(project)(flat_s, flat_d)
    return jnp.moveaxis(out, 0, 1).reshape(dirs.shape), dof


def _param_leaves(model, wrt):
    leaves = wrt(model)
    leaves = tuple(leaves) if isinstance(leaves, (tuple, list)) else (leaves,)
    ok = len(leaves) > 0 and all(
        isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jnp.floating) for x in leaves
    )
    if not ok:
        raise ValueError(
            f"wrt = {wrt!r} returned {type(leaves).__name__} of "
            f"{[type(x).__name__ for x in leaves]}, not floating-point arrays of the model. "
            "Fix: pass a function selecting model leaves, e.g. wrt=lambda m: m.inertia or "
            'wrt=lambda m: (m.mass, m.inertia), or wrt="state".'
        )
    return leaves


def _replace(model, wrt, leaves, xi, scales):
    new = tuple(p + s * x for p, s, x in zip(leaves, scales, xi, strict=True))
    return eqx.tree_at(lambda m: tuple(_as_tuple(wrt(m))), model, new)


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _truncate(traj: Trajectory, k: int) -> Trajectory:
    """The first k saved states of a trajectory (the rollout to (k − 1) · save_every steps)."""
    return Trajectory(
        t=traj.t[..., :k],
        q=traj.q[..., :k, :, :],
        u=traj.u[..., :k, :, :],
        lam=None if traj.lam is None else traj.lam[..., :k, :],
        result=traj.result,
        failed_step=traj.failed_step,
    )


@eqx.filter_jit
def _kernel(model, state0, dt, dirs, eps, integrator, n_steps, save_every, opts, loss, wrt):
    multipliers, checkpoint, horizons = opts
    if wrt == "state":
        scales = leaves = None
    else:
        leaves = _as_tuple(wrt(model))
        scales = tuple(jnp.sqrt(jnp.mean(p * p)) + (jnp.max(jnp.abs(p)) == 0) for p in leaves)

    def run(xi):
        if wrt == "state":
            m, s = model, _perturb_state(state0, xi)
        else:
            m, s = _replace(model, wrt, leaves, xi, scales), state0
        tr = rollout(
            m,
            s,
            dt,
            n_steps,
            integrator=integrator,
            save_every=save_every,
            multipliers=multipliers,
            throw=False,
            checkpoint=checkpoint,
            monitors=None,  # the discrete map's derivatives are analysed, whatever its accuracy
        )
        out = []
        for h in horizons:
            val = jnp.asarray(loss(_truncate(tr, h // save_every + 1)))
            if val.shape != ():
                raise ValueError(
                    f"loss returned shape {val.shape} for a trajectory of {h} steps, not a "
                    "scalar. Fix: reduce it to one number, e.g. with jnp.sum or jnp.mean."
                )
            out.append(val)
        return jnp.stack(out), (tr.q, tr.u), tr.result

    zero = jax.tree.map(lambda d: jnp.zeros_like(d[0]), dirs)
    losses_and_code = lambda out: (out[0], out[2])  # the result code as aux output

    # forward mode along every direction: dL_h · d and the tangent trajectory
    def fwd(d):
        _, (dl, dx, _) = jax.jvp(run, (zero,), (d,))
        return dl, dx

    dl, (dq, du) = jax.vmap(fwd)(dirs)
    # reverse mode: ∇L_h for every horizon from one linearisation
    losses, pullback, result = jax.vjp(lambda xi: losses_and_code(run(xi)), zero, has_aux=True)
    grads = jax.vmap(pullback)(jnp.eye(len(horizons), dtype=losses.dtype))[0]
    rev = sum(
        jnp.einsum("h...,d...->dh", g, d)
        for g, d in zip(jax.tree.leaves(grads), jax.tree.leaves(dirs), strict=True)
    )
    gnorm = jnp.sqrt(
        sum(jnp.sum(g.reshape(g.shape[0], -1) ** 2, 1) for g in jax.tree.leaves(grads))
    )

    # central differences along the same directions
    def fd(d):
        plus = jax.tree.map(lambda z, x: z + eps * x, zero, d)
        minus = jax.tree.map(lambda z, x: z - eps * x, zero, d)
        lp, _, rp = run(plus)
        lm, _, rm = run(minus)
        return (lp - lm) / (2.0 * eps), jnp.maximum(jnp.max(rp), jnp.max(rm))

    fdv, fd_result = jax.vmap(fd)(dirs)
    axes = tuple(range(2, dq.ndim))  # (n_dir, *batch, T, nb, 7): norm over all but n_dir, T
    tang = jnp.moveaxis(dq, -3, 1), jnp.moveaxis(du, -3, 1)
    sens = jnp.sqrt(sum(jnp.sum(x * x, axis=axes) for x in tang))
    return dict(
        losses=losses,
        fwd=dl,
        rev=rev,
        fd=fdv,
        gnorm=gnorm,
        sens=jnp.max(sens, axis=0),
        result=jnp.max(result),
        fd_result=jnp.max(fd_result),
    )


def _rel(a, b):
    """Largest |a − b| over directions relative to the largest |a|, |b| at each horizon."""
    scale = np.maximum(np.abs(a).max(axis=0), np.abs(b).max(axis=0))
    err = np.abs(a - b).max(axis=0)
    return np.where(scale > 0, err / np.where(scale > 0, scale, 1.0), 0.0)


def _dt_value(dt) -> float:
    return float(np.asarray(dt))


def _default_horizons(n_steps: int, save_every: int) -> tuple[int, ...]:
    n_save = n_steps // save_every
    out = {max(1, round(n_save / 2**j)) * save_every for j in range(6)}
    return tuple(sorted(out))


@validates_inputs
def gradient_health(
    model: Model,
    state0: State,
    dt,
    n_steps: int,
    loss: Callable[[Trajectory], jax.Array],
    *,
    wrt: str | Callable = "state",
    horizons=None,
    integrator: AbstractIntegrator | None = None,
    save_every: int = 1,
    multipliers: bool = False,
    checkpoint: Checkpoint | None = Checkpoint(),  # noqa: B008 - immutable
    n_directions: int = 3,
    eps: float | None = None,
    tol: float = 1e-4,
    seed: int = 0,
) -> GradientHealth:
    """How trustworthy are the gradients of ``loss(rollout(...))``, horizon by horizon?

    ``loss(traj) -> scalar`` is evaluated on the trajectory of each horizon h ∈ ``horizons``
    (steps, multiples of ``save_every``, ≤ ``n_steps``; default six geometric fractions
    n_steps / 32 … n_steps): the first h / save_every + 1 saved states of one rollout, so it
    must accept any trajectory length (e.g. use ``traj.q[..., -1, :, :]`` for the final
    state). Derivatives are taken with respect to ``wrt``: ``"state"`` (default: the initial
    position, orientation, velocity and angular velocity of every body, see the module
    docstring; for mechanisms only directions that keep the joints satisfied to first order)
    or a function selecting model leaves (``wrt=lambda m: m.inertia``), perturbed relative to
    their RMS size. Along ``n_directions`` random unit directions (``seed``), the directional
    derivative by forward mode is compared with reverse mode and with central finite
    differences of step ``eps`` (default ε_mach^(1/3): 6e-6 in float64). The tangent
    trajectory of forward mode gives the state sensitivity ‖∂x(t)/∂ξ · d‖ at every saved
    time and from it a finite-time Lyapunov exponent (log-linear fit). ``integrator``,
    ``save_every``, ``multipliers`` and ``checkpoint`` are passed to :func:`rbjax.rollout`.

    Everything is one compiled program (the rollout traced for evaluation, forward and reverse
    mode); cost about 2 · n_directions + 2 rollouts plus one backward pass. Returns a
    :class:`GradientHealth`; ``print(result)`` shows the table and a plain-language verdict.
    Bad input raises ValueError naming the argument; a rollout that fails (non-finite state,
    solver failure) raises ValueError too.
    """
    maximal_only(model, "rbjax.gradient_health")
    integrator = RK4() if integrator is None else integrator
    if not isinstance(state0, State):
        raise ValueError(
            f"state0 = {type(state0).__name__} is not an rbjax.State. Fix: build it with "
            "rbjax.make_state(...)."
        )
    if not callable(loss):
        raise ValueError(
            f"loss = {loss!r} is not callable. Fix: pass a function traj -> scalar, e.g. "
            "lambda traj: jnp.sum(traj.q[..., -1, :, :] ** 2)."
        )
    check_dt(dt)
    if not isinstance(n_steps, (int, np.integer)) or isinstance(n_steps, bool) or n_steps < 1:
        raise ValueError(
            f"n_steps = {n_steps!r} is not a positive integer. Fix: pass the longest horizon in "
            "steps as an int >= 1."
        )
    if not isinstance(save_every, (int, np.integer)) or save_every < 1 or n_steps % save_every:
        raise ValueError(
            f"save_every = {save_every!r} does not divide n_steps = {n_steps}. Fix: choose "
            "save_every >= 1 with n_steps % save_every == 0."
        )
    n_steps, save_every = int(n_steps), int(save_every)
    if horizons is None:
        hs = _default_horizons(n_steps, save_every)
    else:
        arr = np.atleast_1d(np.asarray(horizons))
        good = (
            arr.ndim == 1
            and arr.size > 0
            and np.issubdtype(arr.dtype, np.integer)
            and bool(np.all((arr >= 1) & (arr <= n_steps) & (arr % save_every == 0)))
        )
        if not good:
            raise ValueError(
                f"horizons = {horizons!r} are not integers in [1, n_steps = {n_steps}] that are "
                f"multiples of save_every = {save_every}. Fix: pass numbers of steps, e.g. "
                f"horizons={list(_default_horizons(n_steps, save_every))}, or None."
            )
        hs = tuple(sorted({int(h) for h in arr}))
    if not isinstance(n_directions, (int, np.integer)) or n_directions < 1:
        raise ValueError(
            f"n_directions = {n_directions!r} is not a positive integer. Fix: pass e.g. 3."
        )
    dtype = jnp.result_type(state0.q)
    if eps is None:
        eps = float(jnp.finfo(dtype).eps) ** (1.0 / 3.0)
    if not (isinstance(eps, (int, float, np.floating)) and math.isfinite(eps) and eps > 0):
        raise ValueError(
            f"eps = {eps!r} is not a positive finite number. Fix: pass a finite-difference step "
            "such as 1e-6, or None (ε_mach^(1/3))."
        )
    if not (isinstance(tol, (int, float, np.floating)) and tol > 0):
        raise ValueError(f"tol = {tol!r} is not a positive number. Fix: pass e.g. 1e-4.")
    if not (wrt == "state" or callable(wrt)):
        raise ValueError(
            f'wrt = {wrt!r} is neither "state" nor a function of the model. Fix: pass '
            'wrt="state" or e.g. wrt=lambda m: m.inertia.'
        )
    model.check_state(state0)
    check_mechanism_state(model, state0)

    key = jax.random.PRNGKey(seed)
    joints = bool(getattr(model, "joints", ()))
    if wrt == "state":
        shape = (int(n_directions),) + state0.q.shape[:-1] + (12,)
        dirs = jax.random.normal(key, shape, dtype)
        if joints:
            dirs, dof = _constraint_tangent(model, state0, dirs)
            if dof == 0:
                raise ValueError(
                    'wrt = "state": the mechanism has no free motion (0 degrees of freedom at '
                    "state0), so no initial state can be perturbed. Fix: pass a function "
                    "selecting model parameters, e.g. wrt=lambda m: m.mass."
                )
        norm = jnp.sqrt(jnp.sum(dirs.reshape(dirs.shape[0], -1) ** 2, axis=1))
        dirs = dirs / norm.reshape((-1,) + (1,) * (dirs.ndim - 1))
        what = "initial state (δr, δθ, δv, δω)"
    else:
        leaves = _param_leaves(model, wrt)
        keys = jax.random.split(key, len(leaves))
        raw = []
        for k, p in zip(keys, leaves, strict=True):
            d = jax.random.normal(k, (int(n_directions),) + p.shape, p.dtype)
            if p.ndim >= 2 and p.shape[-1] == p.shape[-2]:
                d = 0.5 * (d + jnp.swapaxes(d, -1, -2))  # symmetric (inertia) perturbations
            raw.append(d)
        norm = jnp.sqrt(sum(jnp.sum(d.reshape(d.shape[0], -1) ** 2, axis=1) for d in raw))
        dirs = tuple(d / norm.reshape((-1,) + (1,) * (d.ndim - 1)) for d in raw)
        what = "model parameters (relative)"

    out = _kernel(
        model,
        state0,
        dt,
        dirs,
        float(eps),
        integrator,
        n_steps,
        save_every,
        (bool(multipliers), checkpoint, hs),
        loss,
        wrt,
    )
    out = jax.tree.map(np.asarray, out)
    if int(out["result"]) != RESULTS.successful or int(out["fd_result"]) != RESULTS.successful:
        raise ValueError(
            f"The rollout failed ({RESULTS(max(int(out['result']), int(out['fd_result']))).message})"
            " within n_steps = "
            f"{n_steps}, at state0 or at a perturbation of size eps = {eps:.1e}. Fix: reduce dt "
            "or n_steps, or check the model (rbjax.rollout names the failing step)."
        )
    times = float(np.asarray(state0.t).ravel()[0]) + _dt_value(dt) * save_every * np.arange(
        n_steps // save_every + 1
    )
    sens = out["sens"]
    fit = (times > times[0]) & (sens > 0) & np.isfinite(sens)
    if fit.sum() >= 2:
        lyap = float(np.polyfit(times[fit] - times[0], np.log(sens[fit]), 1)[0])
    else:
        lyap = float("nan")
    hs_arr = np.asarray(hs)
    ad_fd = _rel(out["fwd"], out["fd"])
    fwd_rev = _rel(out["fwd"], out["rev"])
    passed = (ad_fd <= tol) & (fwd_rev <= tol)
    n_ok = int(np.argmin(passed)) if not passed.all() else len(hs)
    return GradientHealth(
        horizons=hs_arr,
        horizon_times=hs_arr * _dt_value(dt),
        times=times,
        sensitivity=sens,
        loss=out["losses"],
        gradient_norm=out["gnorm"],
        ad_fd_error=ad_fd,
        fwd_rev_error=fwd_rev,
        lyapunov_exponent=lyap,
        trustworthy_horizon=float(hs_arr[n_ok - 1] * _dt_value(dt)) if n_ok else 0.0,
        eps=float(eps),
        tol=float(tol),
        wrt=what,
    )
