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

Stopping rules (shared): after ``max_steps`` steps; when a step decreases the loss by less than
``tol`` × the loss (relative change; first-order optax transforms: over 10 steps); when the
gradient test holds (MINPACK's scale-free orthogonality test max_i |J_iᵀr| / (‖J_i‖ ‖r‖) ≤
``gtol`` when J is known, else ‖∇L‖∞ ≤ ``gtol``; Moré, Garbow & Hillstrom, "User guide for
MINPACK-1", 1980); or when no step decreases the loss any more (converged only if the
Gauss–Newton step then predicts a decrease below the rounding error of the loss: the
linearised problem is solved to working precision).
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
    last: Iterate
    history: list
    converged: bool
    message: str


def _diverged(k: int):
    raise ValueError(
        f"identify: the simulation diverged (non-finite loss) at optimiser step {k}. Fix: "
        "reduce the learning rate, start closer to the solution, reduce dt, or use "
        "shooting= to split the horizon."
    )


def _accepted(it, old: float, k: int, history: list, crit) -> Run | None:
    """Record the iterate accepted at step k (raise if its loss is not finite); a converged
    Run when the loss fell by at most ``tol`` × the previous loss, else None."""
    if not np.isfinite(it.f):
        _diverged(k + 1)
    history.append(it.f)
    if 0 <= old - it.f <= crit.tol * old:
        return Run(it, history, True, f"relative loss decrease ≤ tol = {crit.tol:g}")
    return None


class Criteria(NamedTuple):
    """Stopping rules: ``tol`` relative loss decrease, ``gtol`` gradient test, ``rounding``
    the rounding error of each residual (1e4 ulp of the measured values, in σ)."""

    tol: float
    gtol: float
    rounding: np.ndarray


def _gradient_test(it: Iterate) -> float:
    """MINPACK's orthogonality test max_i |J_iᵀr| / (‖J_i‖ ‖r‖) (scale-free: the cosine
    between the residual and each Jacobian column) when J is known, else ‖∇L‖∞."""
    r, jac, _ = it.payload
    if jac is None:
        return float(np.max(np.abs(it.g), initial=0.0))
    rn = float(np.linalg.norm(r))
    cn = np.linalg.norm(jac, axis=0)
    if rn == 0.0:
        return 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        cos = np.where(cn > 0, np.abs(it.g) / (cn * rn), 0.0)
    return float(np.max(cos, initial=0.0))


def _stationary(it: Iterate, crit: Criteria) -> Run | None:
    test = _gradient_test(it)
    if test <= crit.gtol:
        what = "max |J_iᵀr|/(‖J_i‖‖r‖)" if it.payload[1] is not None else "‖∇L‖∞"
        return Run(it, [], True, f"gradient test {what} = {test:.3g} ≤ gtol = {crit.gtol:g}")
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
        ok = _gradient_test(it) <= 1e3 * crit.gtol or it.f <= noise
    return Run(it, history, bool(ok), why + " (precision limit)")


def run_lbfgs(evaluate, it: Iterate, max_steps, crit: Criteria, memory_size) -> Run:
    """L-BFGS (optax.scale_by_lbfgs) with the host strong-Wolfe line search, in variables
    scaled by the Jacobian's column norms at the start (when J is available), so that the
    first steps are not dominated by the units of the parameters."""
    jac = it.payload[1]
    cs = np.ones_like(it.flat)
    if jac is not None:
        col = np.linalg.norm(jac, axis=0)
        ok = np.isfinite(col) & (col > 1e-300 * max(float(np.max(col, initial=0.0)), 1e-300))
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
        old, it = it.f, Iterate(it.flat + a * d, f_new, g_new, payload_new)
        if (done := _accepted(it, old, k, history, crit)) is not None:
            return done
    return Run(it, history, False, "max_steps reached")


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
            return Run(it, history, False, "the damping did not produce a decrease")
        old, it = it.f, Iterate(it.flat + delta, f_new, g_new, payload_new)
        if (done := _accepted(it, old, k, history, crit)) is not None:
            return done
    return Run(it, history, False, "max_steps reached")


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
        if k >= 10 and abs(history[-11] - it.f) <= 10 * crit.tol * history[-11]:
            return Run(
                it, history, True, f"relative loss change ≤ tol = {crit.tol:g} over 10 steps"
            )
    return Run(it, history, False, "max_steps reached")


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
        old, it = it.f, Iterate(flat, *evaluate(flat))
        if (done := _accepted(it, old, k, history, crit)) is not None:
            return done
    return Run(it, history, False, "max_steps reached")


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
