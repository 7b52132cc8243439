""":func:`rbjax.identify`: fit parameters and initial conditions to measured motion (the
method is described in the package docstring, rbjax/_identify/__init__.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree

from .._analysis.mobility import mobility
from .._errors import fail, validates_inputs
from .._integrators import AbstractIntegrator
from .._state import State
from .covariance import covariance, eliminate_segments
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
from .result import IdentificationResult
from .shooting import (
    Shooting,
    check_segment_guesses,
    segment_gaps,
    segment_states,
    set_segment_starts,
)
from .solvers import LBFGS, AbstractSolver, Criteria, Iterate, Objective, Run, as_solver

_DEFAULT_SOLVER = LBFGS()


@validates_inputs
def identify(
    build: Callable[[Any], tuple[Any, State]],
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
    gtol: float = 1e-10,
    rtol_identifiable: float = 1e-8,
    autodiff: Literal["auto", "forward", "reverse"] = "auto",
) -> IdentificationResult:
    """Fit the free leaves of ``params0`` (and, with ``shooting``, the states at the starts of
    segments 1..S−1) to ``data`` by minimising the whitened least squares ½‖(h(x(t_k; θ)) − y_k)
    / σ‖² (module docstring); then the Gauss–Newton covariance and the unidentifiable
    directions.

    ``build(params) -> (model, state0)`` must be a pure JAX function of the parameters (it is
    traced). ``dt``: largest integration step [s]. ``free``: the fitted leaves (a pytree filter,
    as ``equinox.partition``'s ``filter_spec``; default every floating-point array leaf).
    ``solver``: :class:`rbjax.LBFGS` (default), :class:`rbjax.LevenbergMarquardt` or any
    ``optax.GradientTransformation`` (e.g. ``optax.adam(1e-2)``). ``shooting``:
    :class:`rbjax.Shooting` for multiple shooting, None for single shooting. ``max_steps``:
    optimiser steps (0 = only evaluate at ``params0``). ``tol``: relative loss decrease below
    which the optimiser stops; ``gtol``: the gradient test (solvers.py). ``rtol_identifiable``:
    eigenvalue threshold of the scaled Gauss–Newton matrix. ``autodiff``: ``"forward"``
    (residual Jacobian by ``jacfwd`` at every evaluation), ``"reverse"`` (gradients by reverse
    mode) or ``"auto"`` (forward up to 64 free scalars; LevenbergMarquardt always forward).
    """
    solver = as_solver(solver)
    if isinstance(max_steps, (bool, np.bool_)) or not isinstance(max_steps, (int, np.integer)):
        max_steps = -1
    if max_steps < 0:
        fail("identify(max_steps)", max_steps, "is not an integer >= 0", "pass e.g. 200")
    for name, val in (("tol", tol), ("gtol", gtol), ("rtol_identifiable", rtol_identifiable)):
        if not (np.ndim(val) == 0 and np.isfinite(val) and val >= 0):
            fail(f"identify({name})", val, "is not a finite number >= 0", "pass e.g. 1e-10")
    problem, dyn0, _, model0, state0, _ = setup(
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
    p_phys = int(ravel_pytree(dyn0)[0].size)
    mode = choose_mode(autodiff, flat0.size)  # validates autodiff for every solver
    if solver.needs_jacobian:
        mode = "forward"  # Levenberg–Marquardt needs J at every step
    evaluate = _host_objective(mode, template)
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
    crit = Criteria(
        float(tol), float(gtol), rounding(problem, start.payload[0].size, state0.q.dtype)
    )
    objective = Objective(lambda flat: evaluate(flat, problem), problem, template)
    with jax.numpy_dtype_promotion("standard"):  # optax mixes int32/int64 counters
        if max_steps == 0:
            run = Run(start, [start.f], False, "max_steps = 0: evaluated at params0")
        else:
            run = solver.run(objective, start, int(max_steps), crit)
    return _result(run, problem, template, data, p_phys, float(rtol_identifiable))


def _host_objective(mode: str, template):
    """``evaluate(flat, problem) -> (loss, gradient, (r, J or None, aux))`` as NumPy values,
    from the compiled forward-mode (r, J) or reverse-mode (r, ∇L) function."""
    compiled = eval_forward if mode == "forward" else eval_reverse

    def evaluate(flat, problem):
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


def _segment_unknowns(problem: Problem, model0, state0: State):
    """The free segment start variables (zeros, initialised by :func:`_initial_segments`):
    free bodies relative to reference attitudes; mechanisms of rigid bodies d position and d
    velocity coordinates in the tangent space of the joint manifold (d = DOF)."""
    n_seg, nb, dtype = problem.n_seg, model0.nb, state0.q.dtype
    if n_seg == 1:
        return problem, {}
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


def _result(run: Run, problem: Problem, template, data, p_phys, rtol) -> IdentificationResult:
    """Gauss–Newton covariance and identifiability at the estimate, residuals per
    observation, reduced χ² and the segment states."""
    flat, (r, jac, aux) = run.last.flat, run.last.payload
    if jac is None:  # reverse mode: form J once, by the cheaper mode
        if flat.size <= r.size:
            jac = np.asarray(eval_forward(problem, template, jnp.asarray(flat))[1])
        else:
            jac = np.asarray(jacobian_reverse(problem, template, jnp.asarray(flat)))
    dyn, seg = ravel_pytree(template)[1](jnp.asarray(flat))
    names = leaf_names(dyn)
    n_data = sum(o.values.shape[0] * o.dim for o in data.observations)
    if problem.n_seg > 1:
        jac = eliminate_segments(jac, n_data, p_phys)
    cov, described = covariance(jac, rtol, names)
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
    loss_data = 0.5 * float(np.sum(r[:off] ** 2))
    n_meas = data.count
    chi2 = 2.0 * loss_data / (n_meas - p_phys) if n_meas > p_phys else float("nan")
    seg_states, gaps = None, None
    if problem.n_seg > 1:
        model_hat, _ = problem.build(params)
        seg_states = jax.tree.map(np.asarray, segment_states(problem, model_hat, seg))
        gap = [np.asarray(a) for a in segment_gaps(model_hat, aux, seg_states)]
        gaps = np.asarray([float(np.max(np.abs(a))) for a in gap[:4]])
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
    )
