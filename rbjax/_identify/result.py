"""The result of :func:`rbjax.identify`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import numpy as np

from .._analysis.nonfinite import NonfiniteGradient
from .._params import Bounded
from .._state import State
from .._tree.model import JointState
from .quantities import Quantities, propagate


class IdentificationResult(eqx.Module):
    """What :func:`identify` found.

    * ``params``: the estimate, the full pytree (free leaves fitted, the rest as given).
    * ``loss`` (final L = ½‖r‖², continuity included), ``loss_history`` (np.ndarray: the loss
      at the initial guess and after every optimiser step), ``steps``.
    * ``converged``: True only when a stopping rule that implies a minimum fired
      (``criterion``: "gradient", "step and reduction" or "precision limit"; the others are
      "max_steps", "line search", "damping", "not run", "nonfinite gradient") AND the
      Gauss–Newton check passed:
      from the estimate, Gauss–Newton steps cannot lower the loss by more than
      ½ (0.01)² max(χ²_red, 1) (the estimate is within 0.01 standard errors of a minimum;
      rbjax/_identify/solvers.py). ``message`` says why the optimiser stopped and, when the
      check failed, by how much the loss still fell.
    * ``gradient_test``: the final scale-free gradient max_i |J_iᵀr| / (‖J_i‖ ‖r‖);
      ``gauss_newton_decrease``: the loss decrease the Gauss–Newton step predicts at the
      estimate (√(2 × it) is the estimate's distance from the minimum of the linearised
      problem in standard errors; NaN with max_steps = 0). A minimum can be a local one:
      a reduced χ² far above 1 says the model does not fit (the summary says so).
    * ``evaluations``: evaluations of the compiled residual function with its derivatives
      (r and J in forward mode, r and ∇L in reverse mode), line-search trials, the
      multiple-shooting initialisation and the Gauss–Newton check included.
    * ``hints``: for each unidentifiable direction, what data would determine it;
      ``quantities()``: estimates in physical units (below); ``noise()``: the noise level
      the residuals imply.
    * ``residuals``: one (K, d) array per observation, whitened ((pred − meas)/σ) at the
      estimate, NaN at masked samples.
    * ``names``: the free scalars, from the pytree paths (``jax.tree_util.keystr``) plus the
      element index, e.g. ``"['inertia'].raw_moments[1]"``; ``estimate``: their values.
    * ``covariance`` (p, p): Gauss–Newton (JᵀJ)⁻¹ over ``names`` (pseudo-inverse on the
      identifiable subspace; with multiple shooting the marginal block of the physical
      parameters); rows and columns of unidentifiable parameters are NaN with ``inf`` on the
      diagonal.
    * ``std_errors``: a pytree like ``params`` with the standard errors of the free leaves
      (``inf`` where unidentifiable) and ``None`` at fixed leaves.
    * ``unidentifiable``: one readable string per direction the data cannot determine.
    * ``reduced_chi2``: 2 L_data / (N − p), N the measured scalars (NaN if N ≤ p).
    * ``segment_states`` (multiple shooting): the fitted states at the starts of segments
      1..S−1 (a batched State, or JointState for a JointModel), and ``continuity_gaps``: the
      largest |gap| of position [m], rotation [rad], velocity [m/s] and angular velocity
      [rad/s] at the estimate (a JointModel's: of its linear and angular coordinates).
    * ``diagnosis``: with ``identify(..., nonfinite="result")``, where the gradient of the loss
      turned non-finite (a :class:`rbjax.NonfiniteGradient`; ``criterion`` is then
      "nonfinite gradient", ``params`` the offending parameters, the covariance NaN); None
      otherwise.
    """

    params: Any
    loss: float
    loss_history: np.ndarray
    steps: int
    converged: bool
    residuals: tuple[np.ndarray, ...]
    estimate: np.ndarray
    covariance: np.ndarray
    std_errors: Any
    reduced_chi2: float
    segment_states: State | JointState | None
    continuity_gaps: np.ndarray | None
    names: tuple[str, ...] = eqx.field(static=True)
    unidentifiable: tuple[str, ...] = eqx.field(static=True)
    message: str = eqx.field(static=True)
    criterion: str = eqx.field(static=True, default="")
    gradient_test: float = float("nan")
    gauss_newton_decrease: float = float("nan")
    covariance_identifiable: np.ndarray | None = None
    null_directions: np.ndarray | None = None
    parameter_scale: np.ndarray | None = None
    free: Any = None
    hints: tuple[str, ...] = eqx.field(static=True, default=())
    evaluations: int = eqx.field(static=True, default=0)
    sigmas: tuple[np.ndarray, ...] = ()
    diagnosis: NonfiniteGradient | None = eqx.field(static=True, default=None)

    def noise(self) -> tuple[np.ndarray, ...]:
        """The noise standard deviation each observation's residuals imply, per component, in
        the observation's units: σ̂_j = σ_j √(Σ_k r_kj² / n_j · N/(N − p)) (r whitened, n_j the
        samples, N the measured scalars, p the fitted parameters; the usual unbiased
        estimate, e.g. Bard 1974, §7-3). A sensor's noise is identified this way: σ̂ ≈ σ when
        the stated noise is right, and σ̂/σ = √χ²_red overall."""
        n_all = sum(int(np.sum(np.isfinite(b))) for b in self.residuals)
        p = len(self.names)
        dof = n_all / (n_all - p) if n_all > p else float("nan")
        out = []
        for block, sigma in zip(self.residuals, self.sigmas, strict=True):
            n = np.sum(np.isfinite(block), axis=0)
            ms = np.nansum(block**2, axis=0) / np.maximum(n, 1)
            out.append(np.asarray(sigma) * np.sqrt(ms * dof))
        return tuple(out)

    def quantities(self, fn: Callable | None = None) -> Quantities:
        """Estimates, standard errors, correlations and confidence intervals in physical
        units, by the delta method (rbjax/_identify/quantities.py). ``fn=None``: the
        quantities the parameters stand for: ``rbjax.Positive`` → its value;
        ``rbjax.PrincipalInertia`` → the inertia matrix entries ``.I_xx`` … ``.I_yz``
        [kg m²], the principal moments ``.principal_moment[k]`` (ascending) and the rotation
        vector ``.axes_rotation`` [deg] taking the body axes onto the principal axes;
        ``rbjax.LogCholeskyInertia`` → ``.mass``, ``.com`` and the same about the centre of
        mass; any other fitted array → itself. ``fn(params) -> pytree of arrays``: any smooth
        function of the full parameter pytree (e.g. a moment ratio, a natural frequency).
        Quantities that do not depend on the fitted parameters are left out; quantities that
        change along a direction the data do not determine get an infinite standard error."""
        pinv, null, scale = (
            self.covariance_identifiable,
            self.null_directions,
            self.parameter_scale,
        )
        if pinv is None or null is None or scale is None:
            raise ValueError(
                "IdentificationResult.quantities: this result carries no covariance. Fix: "
                "use the result of rbjax.identify."
            )
        return propagate(fn, self.params, self.free, pinv, null, scale)

    @property
    def at_bound(self) -> tuple[str, ...]:
        """The :class:`rbjax.Bounded` entries of the estimate within 1e-6 of their interval's
        width of a bound (where d value/d raw < 1e-6 (high − low)): held there by the
        interval, not by the data. Named as in ``quantities()``."""
        is_leaf = lambda x: isinstance(x, Bounded)  # noqa: E731
        out = []
        for path, leaf in jax.tree_util.tree_flatten_with_path(self.params, is_leaf=is_leaf)[0]:
            if isinstance(leaf, Bounded):
                v = np.atleast_1d(np.asarray(leaf.value, float))
                near = np.minimum(v - leaf.low, leaf.high - v) <= 1e-6 * (leaf.high - leaf.low)
                name = jax.tree_util.keystr(path)
                shape = np.shape(leaf.value)
                for i in np.flatnonzero(near):
                    idx = np.unravel_index(i, shape) if shape else ()
                    out.append(name + ("[" + ",".join(map(str, idx)) + "]" if idx else ""))
        return tuple(out)

    def summary(self) -> str:
        """A table of name, estimate and standard error, the unidentifiable directions, the
        final loss and the reduced χ²."""
        std = np.sqrt(np.diag(self.covariance))
        w = max([len(n) for n in self.names] + [9])
        state = "converged" if self.converged else "NOT converged"
        lines = [
            f"rbjax.identify: {self.steps} steps, {state} ({self.message})",
            f"  final loss {self.loss:.6g}, reduced chi² {self.reduced_chi2:.4g}",
            f"  gradient test {self.gradient_test:.3g}; the Gauss–Newton step predicts a "
            f"decrease of {self.gauss_newton_decrease:.3g} "
            f"({_distance(self.gauss_newton_decrease, self.reduced_chi2)} standard errors "
            "from the minimum)",
            f"  {'parameter':{w}s}  {'estimate':>15s}  {'std error':>11s}",
        ]
        for n, v, s in zip(self.names, self.estimate, std, strict=True):
            lines.append(f"  {n:{w}s}  {v:15.9g}  {s:11.4g}")
        if _misfit(self.reduced_chi2, self.names, self.residuals):
            lines.append(
                f"  WARNING: reduced chi² {self.reduced_chi2:.4g} is far from 1: the model does "
                "not fit the data to the stated noise (a local minimum, a missing effect, or "
                "sigma too small); the standard errors assume it does"
            )
        if self.at_bound:
            lines.append(
                f"  WARNING: {', '.join(self.at_bound)} ended at the bound of its rbjax.Bounded "
                "interval: the best fit inside the interval, not a minimum of the data's "
                "misfit, and its standard error means nothing; widen the interval if the data "
                "should decide"
            )
        if self.unidentifiable:
            lines.append("  not determined by the data (standard error inf) along:")
            lines += [f"    {d}" for d in self.unidentifiable]
            lines += [f"    to determine it: {h}" for h in self.hints]
        if self.covariance_identifiable is not None and len(self.names) <= 200:
            table = self.quantities()
            if table.names != self.names:
                lines.append("  in physical units (delta method):")
                lines.append(table.summary())
        if self.continuity_gaps is not None:
            g = self.continuity_gaps
            lines.append(
                f"  continuity gaps: position {g[0]:.3g} m, rotation {g[1]:.3g} rad, "
                f"velocity {g[2]:.3g} m/s, angular velocity {g[3]:.3g} rad/s"
            )
        return "\n".join(lines)


def _distance(decrease: float, chi2: float) -> str:
    """√(2 ΔL / max(χ²_red, 1)): the Mahalanobis distance a predicted decrease stands for."""
    if not np.isfinite(decrease):
        return "?"
    scale = chi2 if np.isfinite(chi2) and chi2 > 1.0 else 1.0
    return f"{np.sqrt(2.0 * max(decrease, 0.0) / scale):.2g}"


def _misfit(chi2: float, names, residuals) -> bool:
    """χ²_red outside 5 standard deviations of its distribution (ν = N − p degrees of
    freedom: mean 1, standard deviation √(2/ν))."""
    n = sum(int(np.sum(np.isfinite(b))) for b in residuals)
    nu = n - len(names)
    return bool(nu > 0 and np.isfinite(chi2) and abs(chi2 - 1.0) > 5.0 * np.sqrt(2.0 / nu))
