"""The optimisers of :func:`rbjax.identify`, as typed solver objects:
``identify(..., solver=LBFGS() | LevenbergMarquardt() | <optax transform>)``.

Every solver is driven from the host with ONE compiled function of the parameters (the
whitened residuals r, and J = ∂r/∂θ or ∇L), so the objective is compiled once however many
steps and line-search trials a fit takes. Why not optax's ``lbfgs`` (with its zoom line search
inside the compiled step) or optimistix's compiled solvers as the defaults: inside a compiled
step a line search traces the objective and its gradient three times
(``value_and_grad_from_state`` and the two branches of the zoom loop); for a free body that
step compiled in 40 s against 5 s for the objective alone (2-core CPU), and compile time
dominates identification problems; optimistix's compiled Levenberg–Marquardt, measured on the
same residuals, compiled in about twice the time of this host loop and took more steps
(benchmarks/solvers.py). Any optax transform is still accepted (objective-aware ones
such as ``optax.lbfgs()`` run compiled, as optax documents them).

Stopping rules (shared, MINPACK style: Moré, Garbow & Hillstrom, "User guide for MINPACK-1",
1980, §2.3; optimistix's Cauchy termination is the same pair of tests). An optimiser stops
when one of these holds, and only the first two can mean convergence:

* **gradient**: the scale-free orthogonality test max_i |J_iᵀr| / (‖J_i‖ ‖r‖) ≤ ``gtol`` (the
  cosine between the residual and each Jacobian column; ‖∇L‖∞ ≤ ``gtol`` when J is not
  formed);
* **step and reduction together**: the step is small relative to the parameters,
  ‖D δ‖ ≤ ``xtol`` (‖D θ‖ + ``xtol``) (D the Jacobian's column norms at the start, so the test
  is free of parameter units), AND the loss fell by at most ``tol`` × the loss. Either alone
  is not enough: a line search that takes a tiny step in a poor direction reduces the loss
  by little far from a minimum (the false convergence of issue 17: L-BFGS stopped 15 σ away);
* **precision limit**: no step decreases the loss any more; converged only if the
  Gauss–Newton step predicts a decrease below the rounding error of the loss (the linearised
  problem is solved to working precision);
* ``max_steps`` reached, the line search or the damping failed: not converged.

An accepted iterate whose loss is finite but whose gradient or Jacobian is not stops every
solver (``NonfiniteIterate``, rbjax/_identify/gradient_check.py): :func:`rbjax.identify`
raises or reports it, never passes the NaN on.

Whatever stopped the optimiser, :func:`rbjax.identify` then checks the end point with
Gauss–Newton steps (:func:`gauss_newton_check`); "converged" is reported only when they cannot
lower the loss by more than the tolerance.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from .._errors import fail, validates_inputs
from .covariance import visible
from .gradient_check import NonfiniteIterate, gradient_finite
from .linesearch import line_search
from .problem import Problem, residual_vector, unravel


@eqx.filter_jit
def extra_args_step(problem: Problem, template, opt, flat, state):
    """One step of an optax transform that needs the objective (``value_fn``), e.g.
    ``optax.lbfgs()`` with its zoom line search, as optax documents it."""

    def loss(v):
        r, _ = residual_vector(problem, unravel(template, v))
        return 0.5 * jnp.sum(r * r)

    if optax.tree.get(state, "value") is not None:
        value, grad = optax.value_and_grad_from_state(loss)(flat, state=state)
    else:
        value, grad = jax.value_and_grad(loss)(flat)
    updates, state = opt.update(grad, state, flat, value=value, grad=grad, value_fn=loss)
    return optax.apply_updates(flat, updates), state, value, grad


@eqx.filter_jit
def _plain_update(opt, grad, state, flat):
    updates, state = opt.update(grad, state, flat)
    return updates, state


@functools.lru_cache(maxsize=8)
def _lbfgs_direction(memory_size: int):
    """optax's L-BFGS two-loop recursion (no line search), one object per memory size so
    that its compiled update is reused."""
    return optax.scale_by_lbfgs(memory_size=memory_size)


class Iterate(NamedTuple):
    """An evaluated point: flat parameters, loss, gradient, (r, J or None, aux)."""

    flat: np.ndarray
    f: float
    g: np.ndarray
    payload: Any


class Run(NamedTuple):
    """How a solver ended: the last iterate, the loss history, whether the stopping rule
    that fired implies a minimum, why it stopped, and the rule's name (``criterion``:
    "gradient", "step and reduction", "precision limit", "max_steps", "line search",
    "damping", "not run")."""

    last: Iterate
    history: list
    converged: bool
    message: str
    criterion: str = ""


def _diverged(k: int):
    raise ValueError(
        f"identify: the simulation diverged (non-finite loss) at optimiser step {k}. Fix: "
        "reduce the learning rate, start closer to the solution, reduce dt, or use "
        "shooting= to split the horizon."
    )


def _accepted(it, prev: Iterate, k: int, history: list, crit) -> Run | None:
    """Record the iterate accepted at step k (raise if its loss is not finite); a Run when
    the step and the loss decrease are both small (the second stopping rule), else None."""
    if not np.isfinite(it.f):
        _diverged(k + 1)
    history.append(it.f)
    if not gradient_finite(it):  # never hand a NaN gradient or Jacobian to the optimiser
        raise NonfiniteIterate(it, k + 1, history)
    old = prev.f
    step = float(np.linalg.norm(crit.scale * (it.flat - prev.flat)))
    size = float(np.linalg.norm(crit.scale * prev.flat))
    if 0 <= old - it.f <= crit.tol * old and step <= crit.xtol * (size + crit.xtol):
        why = (
            f"relative step {step / max(size, 1e-300):.3g} ≤ xtol = {crit.xtol:g} and relative "
            f"loss decrease {(old - it.f) / max(old, 1e-300):.3g} ≤ tol = {crit.tol:g}"
        )
        return Run(it, history, True, why, "step and reduction")
    return None


class Criteria(NamedTuple):
    """Stopping rules: ``tol`` relative loss decrease and ``xtol`` relative step (together),
    ``gtol`` gradient test, ``rounding`` the rounding error of each residual (1e4 ulp of
    the measured values, in σ), ``scale`` D the parameter scaling of the step test."""

    tol: float
    xtol: float
    gtol: float
    rounding: np.ndarray
    scale: np.ndarray


def gradient_test(it: Iterate, rounding: np.ndarray) -> float:
    """MINPACK's orthogonality test max_i |J_iᵀr| / (‖J_i‖ ‖r‖) (scale-free: the cosine
    between the residual and each Jacobian column) over the columns the data see (columns at
    rounding level, ``covariance.visible``, carry a random cosine), when J is known; else
    ‖∇L‖∞."""
    r, jac, _ = it.payload
    if jac is None:
        return float(np.max(np.abs(it.g), initial=0.0))
    rn = float(np.linalg.norm(r))
    with np.errstate(over="ignore", invalid="ignore"):
        cn = np.linalg.norm(jac, axis=0)
    if rn == 0.0:
        return 0.0
    seen = visible(cn, it.flat, np.resize(rounding, r.shape))
    with np.errstate(divide="ignore", invalid="ignore"):
        cos = np.where(seen, np.abs(it.g) / np.where(seen, cn * rn, 1.0), 0.0)
    return float(np.max(cos, initial=0.0))


def _stationary(it: Iterate, crit: Criteria) -> Run | None:
    test = gradient_test(it, crit.rounding)
    if test <= crit.gtol:
        what = "max |J_iᵀr|/(‖J_i‖‖r‖)" if it.payload[1] is not None else "‖∇L‖∞"
        why = f"gradient test {what} = {test:.3g} ≤ gtol = {crit.gtol:g}"
        return Run(it, [], True, why, "gradient")
    return None


def _precision_limit(it: Iterate, crit: Criteria, history: list, why: str) -> Run:
    """No step decreases the loss. Converged if the Gauss–Newton step (minimum-norm solution
    of J δ ≈ −r) predicts a decrease below the rounding error of the loss (Σ|r_i|ρ_i + ½Σρ_i²,
    ρ_i the rounding error of residual i) or below 1e-6 of the loss: the linearised problem is
    solved to working precision, whatever the size of the residual. Without J: ‖∇L‖∞ ≤ 1000
    gtol."""
    r, jac, _ = it.payload
    rho = np.resize(crit.rounding, r.shape)
    noise = float(np.abs(r) @ rho + 0.5 * rho @ rho)
    if jac is not None and np.all(np.isfinite(jac)):
        delta = np.linalg.lstsq(jac, -r, rcond=None)[0]
        rest = r + jac @ delta
        ok = 0.5 * (float(r @ r) - float(rest @ rest)) <= max(1e-6 * it.f, noise)
    else:
        ok = gradient_test(it, crit.rounding) <= 1e3 * crit.gtol or it.f <= noise
    return Run(it, history, bool(ok), why + " (precision limit)", "precision limit")


CHECK_SIGMA = 0.01  # the Gauss–Newton check's tolerance: 0.01 σ from the minimum


class Check(NamedTuple):
    """The Gauss–Newton check of an end point: ``passed``; ``predicted`` the decrease of the
    loss the Gauss–Newton step predicts at the end point; ``reduction`` the decrease the
    check's steps achieved; ``tolerance`` the largest decrease compatible with convergence."""

    passed: bool
    predicted: float
    reduction: float
    tolerance: float


def _gauss_newton_step(it: Iterate) -> tuple[np.ndarray, float]:
    """Minimum-norm solution δ of J δ ≈ −r and the decrease ½(‖r‖² − ‖r + J δ‖²) it predicts."""
    r, jac, _ = it.payload
    delta = np.linalg.lstsq(jac, -r, rcond=None)[0]
    rest = r + jac @ delta
    return delta, max(0.5 * (float(r @ r) - float(rest @ rest)), 0.0)


def gauss_newton_check(evaluate_j, it: Iterate, crit: Criteria, chi2: float, steps: int = 3):
    """Up to ``steps`` Gauss–Newton steps from the end point ``it`` (whose payload carries
    J), each halved until the loss decreases (at most 12 halvings). The end point passes when
    they lower the loss by at most the tolerance

        max(½ c² max(χ²_red, 1), tol × L, rounding error of L),   c = CHECK_SIGMA = 0.01.

    The loss is whitened, so a point at Mahalanobis distance d from the minimum of a
    quadratic loss lies ½ d² above it: the first term says "within 0.01 standard errors of
    the minimum" in every direction (the standard errors rescaled by χ²_red when the noise
    is larger than the stated σ). ``evaluate_j(flat)`` evaluates (loss, gradient, (r, J,
    aux))."""
    r = it.payload[0]
    rho = np.resize(crit.rounding, r.shape)
    noise = float(np.abs(r) @ rho + 0.5 * rho @ rho)
    scale = chi2 if np.isfinite(chi2) and chi2 > 1.0 else 1.0
    tol = max(0.5 * CHECK_SIGMA**2 * scale, crit.tol * it.f, noise)
    if not np.all(np.isfinite(it.payload[1])):
        return Check(False, float("inf"), 0.0, tol)
    cur, total, predicted = it, 0.0, None
    for _ in range(steps):
        delta, pred = _gauss_newton_step(cur)
        predicted = pred if predicted is None else predicted
        if pred <= tol:
            break
        for _halving in range(13):
            f_new, g_new, payload_new = evaluate_j(cur.flat + delta)
            if np.isfinite(f_new) and f_new < cur.f and np.all(np.isfinite(payload_new[1])):
                break
            delta = 0.5 * delta
        else:
            break
        total += cur.f - f_new
        cur = Iterate(cur.flat + delta, f_new, g_new, payload_new)
        if total > tol:
            break
    return Check(total <= tol, float(predicted or 0.0), float(total), float(tol))


def run_lbfgs(evaluate, it: Iterate, max_steps, crit: Criteria, memory_size) -> Run:
    """L-BFGS (optax.scale_by_lbfgs) with the host strong-Wolfe line search, in variables
    scaled by the Jacobian's column norms at the start (when J is available), so that the
    first steps are not dominated by the units of the parameters."""
    jac = it.payload[1]
    cs = np.ones_like(it.flat)
    if jac is not None:
        # columns at rounding level (a change of max(|θ_i|, 1) moves the residuals by less
        # than their rounding error) keep scale 1: scaling them up would make the first
        # steps astronomically long in a parameter the data do not see
        col = np.linalg.norm(jac, axis=0)
        ok = visible(col, it.flat, np.resize(crit.rounding, it.payload[0].shape))
        cs = np.where(ok, 1.0 / np.where(ok, col, 1.0), 1.0)
    opt = _lbfgs_direction(memory_size)
    z = lambda flat: jnp.asarray(flat / cs)
    state = opt.init(z(it.flat))
    history = [it.f]
    for k in range(max_steps):
        if (done := _stationary(it, crit)) is not None:
            return done._replace(history=history)
        upd, state = _plain_update(opt, jnp.asarray(it.g * cs), state, z(it.flat))
        d = -np.asarray(upd) * cs
        slope = float(it.g @ d)
        if not slope < 0:  # not a descent direction: restart from steepest descent
            state = opt.init(z(it.flat))
            d = -it.g * cs**2 / max(1.0, float(np.linalg.norm(it.g * cs)))
            slope = float(it.g @ d)

        def phi(a, flat=it.flat, d=d):
            fa, ga, pa = evaluate(flat + a * d)
            if not np.all(np.isfinite(ga)):  # a non-finite gradient rejects the point
                return np.nan, np.nan, (ga, pa)
            return fa, float(ga @ d), (ga, pa)

        found = line_search(phi, it.f, slope)
        if found is None:
            return _precision_limit(it, crit, history, "the line search found no lower loss")
        a, f_new, (g_new, payload_new) = found
        prev, it = it, Iterate(it.flat + a * d, f_new, g_new, payload_new)
        if (done := _accepted(it, prev, k, history, crit)) is not None:
            return done
    return Run(it, history, False, "max_steps reached", "max_steps")


def run_lm(evaluate, it: Iterate, max_steps, crit: Criteria) -> Run:
    """Levenberg–Marquardt on the whitened residuals: (JᵀJ + μ D²) δ = −Jᵀr with Moré's
    scaling D² = the largest diag(JᵀJ) seen (Moré 1978) and Nielsen's damping update
    (Nielsen 1999; Madsen, Nielsen & Tingleff 2004, Alg. 3.16), solved as the least-squares
    problem [J; √μ D] δ ≈ −[r; 0]. Each step is one evaluation of (r, J).

    μ is dimensionless: D² already carries the scale of JᵀJ, so μ₀ = τ = 1e-3 (Madsen et
    al.'s τ, whose μ₀ = τ max diag(JᵀJ) is for D = I). Scaling μ₀ by max diag(JᵀJ) as well
    damped the first steps by that factor (1e10 with heavily weighted continuity rows), and
    Nielsen's update lowers μ by at most 3× a step: ~20 wasted steps."""
    r, jac, _ = it.payload
    d2 = np.sum(jac * jac, axis=0)
    mu = 1e-3
    nu = 2.0
    history = [it.f]
    for k in range(max_steps):
        if (done := _stationary(it, crit)) is not None:
            return done._replace(history=history)
        r, jac, _ = it.payload
        d2 = np.maximum(d2, np.sum(jac * jac, axis=0))
        dd = np.sqrt(np.maximum(d2, 1e-30 * float(np.max(d2, initial=1.0))))
        for _attempt in range(30):  # raise μ until a step decreases the loss
            a = np.concatenate([jac, np.sqrt(mu) * np.diag(dd)])
            rhs = -np.concatenate([r, np.zeros_like(dd)])
            delta = np.linalg.lstsq(a, rhs, rcond=None)[0]
            jd = jac @ delta
            pred = -(float(it.g @ delta) + 0.5 * float(jd @ jd))
            f_new, g_new, payload_new = evaluate(it.flat + delta)
            rho = (it.f - f_new) / pred if pred > 0 else -1.0
            if np.isfinite(f_new) and rho > 0:
                mu *= max(1.0 / 3.0, 1.0 - (2.0 * rho - 1.0) ** 3)
                nu = 2.0
                break
            mu *= nu
            nu *= 2.0
            if not np.isfinite(mu) or pred <= 1e-15 * max(it.f, 1e-300):
                return _precision_limit(it, crit, history, "no step decreases the loss")
        else:
            return Run(it, history, False, "the damping did not produce a decrease", "damping")
        prev, it = it, Iterate(it.flat + delta, f_new, g_new, payload_new)
        if (done := _accepted(it, prev, k, history, crit)) is not None:
            return done
    return Run(it, history, False, "max_steps reached", "max_steps")


def run_plain(evaluate, opt, it: Iterate, max_steps, crit: Criteria) -> Run:
    """A plain optax transform (e.g. Adam) on the gradient Jᵀr, one compiled update a step."""
    state = opt.init(jnp.asarray(it.flat))
    history = [it.f]
    for k in range(max_steps):
        if (done := _stationary(it, crit)) is not None:
            return done._replace(history=history)
        upd, state = _plain_update(opt, jnp.asarray(it.g), state, jnp.asarray(it.flat))
        flat = it.flat + np.asarray(upd)
        it = Iterate(flat, *evaluate(flat))
        if not np.isfinite(it.f):
            _diverged(k + 1)
        history.append(it.f)
        if not gradient_finite(it):
            raise NonfiniteIterate(it, k + 1, history)
        if k >= 10 and abs(history[-11] - it.f) <= 10 * crit.tol * history[-11]:
            # a first-order method's steps do not shrink to zero (a fixed learning rate):
            # the change over 10 steps stops it, and the Gauss–Newton check decides
            why = f"relative loss change ≤ tol = {crit.tol:g} over 10 steps"
            return Run(it, history, True, why, "step and reduction")
    return Run(it, history, False, "max_steps reached", "max_steps")


def needs_objective(opt, flat) -> bool:
    """True for optax transforms that evaluate the objective themselves: their state stores
    the objective's ``value`` (optax's line searches, e.g. in ``optax.lbfgs()``)."""
    if not isinstance(opt, optax.GradientTransformationExtraArgs):
        return False
    state = jax.eval_shape(opt.init, jnp.asarray(flat))
    return optax.tree.get(state, "value") is not None


def run_extra_args(evaluate, step, opt, it: Iterate, max_steps, crit: Criteria) -> Run:
    """An optax transform that needs the objective (e.g. ``optax.lbfgs()``): the compiled
    ``step`` runs value_and_grad_from_state, the transform (its line search included) and
    the update."""
    state = opt.init(jnp.asarray(it.flat))
    history = [it.f]
    for k in range(max_steps):
        if (done := _stationary(it, crit)) is not None:
            return done._replace(history=history)
        new, state, value, _ = step(jnp.asarray(it.flat), state)
        if not np.isfinite(float(np.asarray(value))):
            _diverged(k)
        flat = np.asarray(new)
        prev, it = it, Iterate(flat, *evaluate(flat))
        if (done := _accepted(it, prev, k, history, crit)) is not None:
            return done
    return Run(it, history, False, "max_steps reached", "max_steps")


class Objective(NamedTuple):
    """What a solver needs: ``evaluate(flat) -> (loss, gradient, (r, J or None, aux))`` on the
    host, and the compiled problem for transforms that evaluate the loss themselves."""

    evaluate: Callable
    problem: Problem
    template: Any


class AbstractSolver(eqx.Module):
    """An optimiser for :func:`rbjax.identify`, run from the host on the compiled objective."""

    @property
    def needs_jacobian(self) -> bool:
        """True when every step needs J = ∂r/∂θ (forward mode at every evaluation)."""
        return False

    @abc.abstractmethod
    def run(self, objective: Objective, start: Iterate, max_steps: int, crit: Criteria) -> Run:
        """Iterate from ``start`` until a stopping rule holds or ``max_steps`` steps."""


@validates_inputs
class LBFGS(AbstractSolver):
    """L-BFGS (the default): the direction of ``optax.scale_by_lbfgs`` (the two-loop recursion
    of Nocedal & Wright, "Numerical Optimization", 2nd ed., Alg. 7.4) with ``memory_size``
    correction pairs, a strong-Wolfe zoom line search (N&W Alg. 3.5-3.6, c₁ = 1e-4, c₂ = 0.9,
    cubic interpolation) on the host, in variables scaled by the Jacobian's column norms at the
    start when J is available."""

    memory_size: int = eqx.field(static=True, default=10)

    def __check_init__(self):
        k = self.memory_size
        if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)) or k < 1:
            fail("LBFGS.memory_size", k, "is not a positive integer", "pass e.g. 10")

    def run(self, objective, start, max_steps, crit):
        return run_lbfgs(objective.evaluate, start, max_steps, crit, int(self.memory_size))


class LevenbergMarquardt(AbstractSolver):
    """Levenberg–Marquardt on the whitened residuals (Moré 1978 scaling, Nielsen 1999 damping),
    one (r, J) evaluation a step. Least squares is its home ground: on the tests' spinning body
    it needs a quarter of the steps of L-BFGS (single shooting: 11 against 46) and converges
    with multiple shooting in 11 steps where L-BFGS needs about 300 (the continuity rows make
    the problem stiff for a quasi-Newton method). Recommended with :class:`rbjax.Shooting`."""

    @property
    def needs_jacobian(self) -> bool:
        return True

    def run(self, objective, start, max_steps, crit):
        return run_lm(objective.evaluate, start, max_steps, crit)


class OptaxSolver(AbstractSolver):
    """Any ``optax.GradientTransformation`` (e.g. ``optax.adam(1e-2)``): one compiled update per
    step on the gradient Jᵀr. A transform that needs the objective (its state stores the
    loss ``value``, e.g. ``optax.lbfgs()``) runs one compiled step with
    ``optax.value_and_grad_from_state`` and ``value_fn`` = the loss, as optax documents it."""

    transform: optax.GradientTransformation = eqx.field(static=True)

    def run(self, objective, start, max_steps, crit):
        opt = self.transform
        if needs_objective(opt, start.flat):
            step = functools.partial(extra_args_step, objective.problem, objective.template, opt)
            return run_extra_args(objective.evaluate, step, opt, start, max_steps, crit)
        return run_plain(objective.evaluate, opt, start, max_steps, crit)


def as_solver(solver) -> AbstractSolver:
    """The solver object for ``identify(solver=...)``; ValueError for anything else."""
    if isinstance(solver, AbstractSolver):
        return solver
    if isinstance(solver, optax.GradientTransformation):
        return OptaxSolver(solver)
    fail(
        "identify(solver)",
        solver,
        "is not rbjax.LBFGS(), rbjax.LevenbergMarquardt() or an optax.GradientTransformation",
        "pass one of these, e.g. solver=rbjax.LevenbergMarquardt() or solver=optax.adam(1e-2)",
    )
    raise AssertionError  # unreachable: fail raises
