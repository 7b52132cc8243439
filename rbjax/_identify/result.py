"""The result of :func:`rbjax.identify`."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import numpy as np

from .._state import State


class IdentificationResult(eqx.Module):
    """What :func:`identify` found.

    * ``params``: the estimate, the full pytree (free leaves fitted, the rest as given).
    * ``loss`` (final L = ½‖r‖², continuity included), ``loss_history`` (np.ndarray: the loss
      at the initial guess and after every optimiser step), ``steps``, ``converged``,
      ``message`` (why the optimiser stopped).
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
      1..S−1 (a batched State), and ``continuity_gaps``: the largest |gap| of position [m],
      rotation [rad], velocity [m/s] and angular velocity [rad/s] at the estimate.
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
    segment_states: State | None
    continuity_gaps: np.ndarray | None
    names: tuple[str, ...] = eqx.field(static=True)
    unidentifiable: tuple[str, ...] = eqx.field(static=True)
    message: str = eqx.field(static=True)

    def summary(self) -> str:
        """A table of name, estimate and standard error, the unidentifiable directions, the
        final loss and the reduced χ²."""
        std = np.sqrt(np.diag(self.covariance))
        w = max([len(n) for n in self.names] + [9])
        state = "converged" if self.converged else "NOT converged"
        lines = [
            f"rbjax.identify: {self.steps} steps, {state} ({self.message})",
            f"  final loss {self.loss:.6g}, reduced chi² {self.reduced_chi2:.4g}",
            f"  {'parameter':{w}s}  {'estimate':>15s}  {'std error':>11s}",
        ]
        for n, v, s in zip(self.names, self.estimate, std, strict=True):
            lines.append(f"  {n:{w}s}  {v:15.9g}  {s:11.4g}")
        if self.unidentifiable:
            lines.append("  not determined by the data (standard error inf) along:")
            lines += [f"    {d}" for d in self.unidentifiable]
        if self.continuity_gaps is not None:
            g = self.continuity_gaps
            lines.append(
                f"  continuity gaps: position {g[0]:.3g} m, rotation {g[1]:.3g} rad, "
                f"velocity {g[2]:.3g} m/s, angular velocity {g[3]:.3g} rad/s"
            )
        return "\n".join(lines)
