""":func:`rbjax.identify`: fit parameters and initial conditions to measured motion (the
method is described in the package docstring, rbjax/_identify/__init__.py)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree

from .._abstract import AbstractModel, AbstractState
from .._analysis.mobility import mobility
from .._analysis.nonfinite import NonfiniteGradient
from .._errors import fail, validates_inputs
from .._integrators import AbstractIntegrator
from .covariance import covariance, eliminate_segments
from .gradient_check import NONFINITE, NonfiniteIterate, gradient_finite, nonfinite_error
from .joint import dtype_of, is_joint
from .measurements import Measurements
from .problem import (
    Problem,
    choose_mode,
    eval_forward,
    eval_reverse,
    jacobian_reverse,
    leaf_names,
    rounding,
    setup,
)
from .quantities import hints
from .result import IdentificationResult
from .shooting import (
    Shooting,
    check_segment_guesses,
    segment_gaps,
    segment_states,
    set_segment_starts,
)
from .solvers import (
    AbstractSolver,
    Check,
    Criteria,
    Iterate,
    LevenbergMarquardt,
    Objective,
    Run,
    as_solver,
    gauss_newton_check,
    gradient_test,
)

_DEFAULT_SOLVER = LevenbergMarquardt()


@validates_inputs
def identify(
    build: Callable[[Any], tuple[AbstractModel, AbstractState]],
    params0: Any,
    data: Measurements,
    *,
    dt: float,
    free=None,
    integrator: AbstractIntegrator | None = None,
    solver: AbstractSolver | optax.GradientTransformation = _DEFAULT_SOLVER,
    shooting: Shooting | None = None,
    max_steps: int = 200,
    tol: float = 1e-10,
    xtol: float = 1e-8,
    gtol: float = 1e-10,
    rtol_identifiable: float | None = None,
    autodiff: Literal["auto", "forward", "reverse"] = "auto",
    nonfinite: Literal["raise", "result"] = "raise",
) -> IdentificationResult:
    """Fit the free leaves of ``params0`` (and, with ``shooting``, the states at the starts of
    segments 1..S−1) to ``data`` by minimising the whitened least squares ½‖(h(x(t_k; θ)) − y_k)
    / σ‖² (module docstring); then the Gauss–Newton covariance and the unidentifiable
    directions.

    ``build(params) -> (model, state0)`` must be a pure JAX function of the parameters (it is
    traced). ``dt``: largest integration step [s]. ``free``: the fitted leaves (a pytree filter,
    as ``equinox.partition``'s ``filter_spec``; default every floating-point array leaf).
    ``solver``: :class:`rbjax.LevenbergMarquardt` (default: every fit here is a least-squares
    problem), :class:`rbjax.LBFGS` or any ``optax.GradientTransformation`` (e.g.
    ``optax.adam(1e-2)``). ``shooting``: :class:`rbjax.Shooting` for multiple shooting, None
    for single shooting. ``max_steps``: optimiser steps (0 = only evaluate at ``params0``).
    Stopping rules (rbjax/_identify/solvers.py): ``tol`` relative loss decrease and ``xtol``
    relative step, which stop the optimiser only together; ``gtol`` the scale-free gradient
    test. Whatever stopped it, Gauss–Newton steps from the end point then check it
    (``converged`` only if they cannot lower the loss by more than ½ (0.01)² max(χ²_red, 1):
    the estimate is within 0.01 standard errors of a minimum; a failed check warns).
    ``rtol_identifiable``: singular values of the column-scaled Jacobian below this fraction
    of the largest are null directions (default: the accuracy of an autodiff Jacobian,
    max(1e-10, 1000 ε): 1e-10 in float64, 1.2e-4 in float32). ``autodiff``: ``"forward"``
    (residual Jacobian by ``jacfwd`` at every evaluation), ``"reverse"`` (gradients by reverse
    mode) or ``"auto"`` (forward up to 64 free scalars; LevenbergMarquardt always forward).
    ``nonfinite``: what to do when the loss is finite but its gradient (or Jacobian) is not, at
    the initial guess or at an iterate an optimiser accepted (a trial point of a line search
    is rejected instead, as too long a step): ``"raise"`` (default) raises
    :class:`rbjax.NonfiniteGradientError`, ``"result"`` returns the result at that point with
    ``converged=False``, ``criterion="nonfinite gradient"`` and NaN covariance; either way with
    the diagnosis of :func:`rbjax.nonfinite_gradient` replayed on the identification's own
    steps at those parameters (``error.diagnosis`` / ``result.diagnosis``: the step, the state
    components and the forces; rbjax/_identify/gradient_check.py). ``converged`` is never True
    at non-finite parameters or gradient.
    """
    solver = as_solver(solver)
    if nonfinite not in NONFINITE:
        fail(
            "identify(nonfinite)",
            nonfinite,
            "is not 'raise' or 'result'",
            "pass nonfinite='raise' (stop with NonfiniteGradientError) or 'result'",
        )
    if isinstance(max_steps, (bool, np.bool_)) or not isinstance(max_steps, (int, np.integer)):
        max_steps = -1
    if max_steps < 0:
        fail("identify(max_steps)", max_steps, "is not an integer >= 0", "pass e.g. 200")
    checked = [("tol", tol), ("xtol", xtol), ("gtol", gtol)]
    if rtol_identifiable is not None:
        checked.append(("rtol_identifiable", rtol_identifiable))
    for name, val in checked:
        if not (np.ndim(val) == 0 and np.isfinite(val) and val >= 0):
            fail(f"identify({name})", val, "is not a finite number >= 0", "pass e.g. 1e-10")
    problem, dyn0, spec, model0, state0, _ = setup(
        build, params0, data, dt, integrator, free, shooting, "identify"
    )
    if not jax.tree.leaves(dyn0):
        fail(
            "identify(free)",
            free,
            "selects no floating-point array leaf of params0",
            "select at least one parameter to fit (free leaves must be float arrays; wrap "
            "Python floats in jnp.asarray)",
        )
    problem, seg0 = _segment_unknowns(problem, model0, state0)
    template = (dyn0, seg0)
    flat0 = np.asarray(ravel_pytree(template)[0])
    if rtol_identifiable is None:  # the accuracy of an AD Jacobian in this dtype
        rtol_identifiable = max(1e-10, 1e3 * float(jnp.finfo(dtype_of(state0)).eps))
    p_phys = int(ravel_pytree(dyn0)[0].size)
    mode = choose_mode(autodiff, flat0.size)  # validates autodiff for every solver
    if solver.needs_jacobian:
        mode = "forward"  # Levenberg–Marquardt needs J at every step
    calls = [0]
    evaluate = _host_objective(mode, template, calls)
    if shooting is not None:
        guesses = check_segment_guesses(shooting.states0, data, model0, problem.n_seg)
        if problem.n_seg > 1:
            problem, flat0 = _initial_segments(problem, evaluate, model0, template, flat0, guesses)
    start = Iterate(flat0, *evaluate(flat0, problem))
    if not np.isfinite(start.f):
        raise ValueError(
            "identify: the loss at the initial guess params0 is not finite (the simulation "
            "diverged at optimiser step 0, or a prediction is NaN). Fix: check params0 and "
            "build, reduce dt, or split the horizon with shooting=rbjax.Shooting(segments=S)."
        )
    stop = None  # (iterate, optimiser step, loss history) where the gradient is not finite
    if not gradient_finite(start):
        stop = (start, 0, [start.f])
    crit = Criteria(
        float(tol),
        float(xtol),
        float(gtol),
        rounding(problem, start.payload[0].size, dtype_of(state0)),
        _column_scale(start.payload[1], flat0.size),
    )
    objective = Objective(lambda flat: evaluate(flat, problem), problem, template)
    with jax.numpy_dtype_promotion("standard"):  # optax mixes int32/int64 counters
        if stop is not None:
            pass
        elif max_steps == 0:
            run = Run(start, [start.f], False, "max_steps = 0: evaluated at params0", "not run")
        else:
            try:
                run = solver.run(objective, start, int(max_steps), crit)
            except NonfiniteIterate as e:
                stop = (e.it, e.step, e.history)
    diagnosis = None
    if stop is not None:
        error = nonfinite_error(problem, template, stop[0], stop[1], raising=nonfinite == "raise")
        if nonfinite == "raise":
            raise error
        diagnosis = error.diagnosis
        run = Run(stop[0], stop[2], False, str(error), "nonfinite gradient")
    last = _with_jacobian(run.last, problem, template, mode)
    chi2 = _reduced_chi2(last.payload[0], data, p_phys)
    check = None
    if max_steps > 0 and diagnosis is None:
        evaluate_j = _host_objective("forward", template, calls) if mode != "forward" else evaluate
        check = gauss_newton_check(lambda flat: evaluate_j(flat, problem), last, crit, chi2)
        if run.converged and not check.passed:
            msg = (
                f"{run.message}; but Gauss–Newton steps from the end point lower the loss by "
                f"{check.reduction:.3g} (> {check.tolerance:.3g}, i.e. more than 0.01 standard "
                "errors from a minimum): the optimiser stopped early"
            )
            warnings.warn(
                f"rbjax.identify: NOT converged: {msg}. Fix: continue from result.params with "
                "solver=rbjax.LevenbergMarquardt() (the default), or tighten tol and xtol.",
                RuntimeWarning,
                stacklevel=3,
            )
            run = run._replace(converged=False, message=msg)
    if run.converged and not (np.all(np.isfinite(last.flat)) and gradient_finite(last)):
        run = run._replace(converged=False)  # never "converged" at a NaN (a safeguard)
    run = run._replace(last=last)
    rtol = float(rtol_identifiable)
    return _result(run, problem, template, data, p_phys, rtol, check, spec, calls[0], diagnosis)


def _column_scale(jac, p: int) -> np.ndarray:
    """D of the relative step test: the Jacobian's column norms at the start (free of
    parameter units, as MINPACK's diag), 1 where a column vanishes or J is not formed."""
    if jac is None:
        return np.ones(p)
    col = np.linalg.norm(jac, axis=0)
    ok = np.isfinite(col) & (col > 1e-300)
    return np.where(ok, col, 1.0)


def _with_jacobian(it: Iterate, problem: Problem, template, mode: str) -> Iterate:
    """The iterate with J = ∂r/∂θ in its payload (reverse mode: formed once, by the
    cheaper of forward and reverse mode)."""
    r, jac, aux = it.payload
    if jac is not None:
        return it
    flat = jnp.asarray(it.flat)
    if it.flat.size <= r.size:
        jac = np.asarray(eval_forward(problem, template, flat)[1])
    else:
        jac = np.asarray(jacobian_reverse(problem, template, flat))
    return it._replace(payload=(r, jac, aux))


def _reduced_chi2(r: np.ndarray, data: Measurements, p_phys: int) -> float:
    """2 L_data / (N − p): the data rows of r come first (continuity rows after them)."""
    n_rows = sum(o.values.shape[0] * o.dim for o in data.observations)
    n_meas = data.count
    if n_meas <= p_phys:
        return float("nan")
    return float(np.sum(r[:n_rows] ** 2)) / (n_meas - p_phys)


def _host_objective(mode: str, template, calls: list[int]):
    """``evaluate(flat, problem) -> (loss, gradient, (r, J or None, aux))`` as NumPy values,
    from the compiled forward-mode (r, J) or reverse-mode (r, ∇L) function; ``calls[0]``
    counts the evaluations."""
    compiled = eval_forward if mode == "forward" else eval_reverse
    # Every evaluation traces under the caller's dtype promotion, the start's as the
    # optimiser's (which runs under "standard" for optax): jit's cache key includes the mode,
    # so a strict caller (the test suite) traced the residual function twice, 6-15 s each.
    promotion = jax.config.jax_numpy_dtype_promotion  # pyright: ignore[reportAttributeAccessIssue]

    def evaluate(flat, problem):
        calls[0] += 1
        with jax.numpy_dtype_promotion(promotion):
            r, d, aux = compiled(problem, template, jnp.asarray(flat))
        r = np.asarray(r)
        with np.errstate(over="ignore", invalid="ignore"):
            if mode == "forward":
                jac = np.asarray(d)
                g = jac.T @ r
            else:
                jac, g = None, np.asarray(d)
            f = 0.5 * float(np.sum(np.square(r)))
        return f, g, (r, jac, aux)

    return evaluate


def _segment_unknowns(problem: Problem, model0, state0):
    """The free segment start variables (zeros, initialised by :func:`_initial_segments`):
    free bodies relative to reference attitudes; mechanisms of rigid bodies d position and d
    velocity coordinates in the tangent space of the joint manifold (d = DOF); a JointModel
    nv and nv tangent coordinates about reference joint states."""
    n_seg, nb, dtype = problem.n_seg, model0.nb, dtype_of(state0)
    if n_seg == 1:
        return problem, {}
    if is_joint(model0):  # nv position and nv velocity coordinates (rbjax/_identify/joint.py)
        z = jnp.zeros((n_seg - 1, model0.nv), dtype)
        refs = (
            jnp.broadcast_to(state0.qpos, (n_seg - 1, model0.nq)).astype(dtype),
            jnp.broadcast_to(state0.qvel, (n_seg - 1, model0.nv)).astype(dtype),
        )
        problem = eqx.tree_at(
            lambda p: (p.ref_q, p.ref_u), problem, refs, is_leaf=lambda x: x is None
        )
        return problem, {"dq": z, "du": z}
    if model0.joints and not any(model0.scalable):
        dof = int(mobility(model0, state0).dof)  # 6 nb − rank W̃
        z = jnp.zeros((n_seg - 1, dof), dtype)
        refs = (
            jnp.broadcast_to(state0.q, (n_seg - 1, nb, 7)).astype(dtype),
            jnp.broadcast_to(state0.u, (n_seg - 1, nb, 7)).astype(dtype),
            jnp.zeros((n_seg - 1, 6 * nb, dof), dtype),
        )
        problem = eqx.tree_at(
            lambda p: (p.ref_q, p.ref_u, p.basis), problem, refs, is_leaf=lambda x: x is None
        )
        return problem, {"dq": z, "du": z}
    z3 = jnp.zeros((n_seg - 1, nb, 3), dtype)
    seg0 = {"r": z3, "rotation": z3, "v": z3, "omega": z3}
    if any(model0.scalable):
        z = jnp.zeros((n_seg - 1, nb), dtype)
        seg0 |= {"log_scale": z, "nu": z}
    a_id = jnp.zeros((n_seg - 1, nb, 4), dtype).at[..., 0].set(1.0)
    problem = eqx.tree_at(lambda p: p.a_ref, problem, a_id, is_leaf=lambda x: x is None)
    return problem, seg0


def _initial_segments(problem: Problem, evaluate, model0, template, flat0, guesses):
    """Start every segment from the user's guesses (``Shooting.states0``) or, by default, from
    a simulation of params0 segment by segment (start s+1 = end of segment s)."""
    unravel = ravel_pytree(template)[1]
    dyn, seg = unravel(jnp.asarray(flat0))
    seg = dict(seg)
    if guesses is not None:
        idx = np.arange(problem.n_seg - 1)
        problem, seg = set_segment_starts(problem, seg, model0, idx, guesses)
    else:
        for s in range(problem.n_seg - 1):
            _, _, (_, _, ends) = evaluate(np.asarray(ravel_pytree((dyn, seg))[0]), problem)
            e = jax.tree.map(lambda a, s=s: np.asarray(a)[s : s + 1], ends)
            problem, seg = set_segment_starts(problem, seg, model0, np.array([s]), e)
    return problem, np.asarray(ravel_pytree((dyn, seg))[0])


def _result(
    run: Run,
    problem: Problem,
    template,
    data,
    p_phys,
    rtol,
    check: Check | None,
    spec,
    evaluations: int,
    diagnosis: NonfiniteGradient | None = None,
) -> IdentificationResult:
    """Gauss–Newton covariance and identifiability at the estimate, residuals per
    observation, reduced χ² and the segment states."""
    flat, (r, jac, aux) = run.last.flat, run.last.payload
    dyn, seg = ravel_pytree(template)[1](jnp.asarray(flat))
    names = leaf_names(dyn)
    n_data = sum(o.values.shape[0] * o.dim for o in data.observations)
    if problem.n_seg > 1:
        jac = eliminate_segments(jac, n_data, p_phys)
    rho = rounding(problem, r.size, flat.dtype)[:n_data]
    pinv = null = scale = None
    if np.all(np.isfinite(jac)):
        unc = covariance(jac, rtol, names, flat[:p_phys], rho)
        cov, described = unc.covariance, unc.described
        pinv, null, scale = unc.pinv, unc.null, unc.scale
    else:  # stopped at a non-finite Jacobian (identify(nonfinite="result")): no covariance
        cov, described = np.full((p_phys, p_phys), np.nan), ()
    flat_dyn, unravel_dyn = ravel_pytree(dyn)
    std_tree = unravel_dyn(jnp.asarray(np.sqrt(np.diag(cov)), flat_dyn.dtype))
    params = eqx.combine(dyn, problem.fixed)
    blocks, off = [], 0
    for o in data.observations:
        k_, d_ = o.values.shape[0], o.dim
        b = r[off : off + k_ * d_].reshape(k_, d_).copy()
        b[~np.asarray(o.mask)] = np.nan
        blocks.append(b)
        off += k_ * d_
    chi2 = _reduced_chi2(r, data, p_phys)
    seg_states, gaps = None, None
    if problem.n_seg > 1:
        model_hat, _ = problem.build(params)
        seg_states = jax.tree.map(np.asarray, segment_states(problem, model_hat, seg))
        gap = [np.asarray(a) for a in segment_gaps(model_hat, aux, seg_states)]
        gaps = np.asarray([float(np.max(np.abs(a), initial=0.0)) for a in gap[:4]])
    return IdentificationResult(
        params=params,
        loss=float(run.last.f),
        loss_history=np.asarray(run.history),
        steps=len(run.history) - 1,
        converged=bool(run.converged),
        residuals=tuple(blocks),
        estimate=np.asarray(flat[:p_phys]),
        covariance=cov,
        std_errors=std_tree,
        reduced_chi2=float(chi2),
        segment_states=seg_states,
        continuity_gaps=gaps,
        names=tuple(names),
        unidentifiable=described,
        message=run.message,
        criterion=run.criterion,
        gradient_test=float("nan")
        if diagnosis is not None
        else gradient_test(run.last, rounding(problem, r.size, flat.dtype)),
        gauss_newton_decrease=float("nan") if check is None else check.predicted,
        covariance_identifiable=pinv,
        null_directions=null,
        parameter_scale=scale,
        free=spec,
        hints=() if null is None or scale is None else hints(params, spec, null, scale),
        sigmas=tuple(np.asarray(o.sigma) for o in data.observations),
        evaluations=int(evaluations),
        diagnosis=diagnosis,
    )
