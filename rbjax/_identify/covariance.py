"""Uncertainty and identifiability at the estimate: the Gauss–Newton covariance (JᵀJ)⁻¹ of
the whitened residuals on the identifiable subspace, and the directions the data cannot
determine, named in the raw parameter coordinates."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


def _rref_rows(m: np.ndarray, tol: float = 1e-9) -> np.ndarray:
    """Reduced row-echelon form of the rows of ``m`` (k, p) with partial pivoting: a basis of
    the same row space whose vectors each involve few parameters."""
    a = m.copy()
    k, p = a.shape
    row = 0
    for col in range(p):
        if row >= k:
            break
        piv = row + int(np.argmax(np.abs(a[row:, col])))
        if abs(a[piv, col]) <= tol * max(np.max(np.abs(a)), 1e-300):
            continue
        a[[row, piv]] = a[[piv, row]]
        a[row] /= a[row, col]
        for r in range(k):
            if r != row:
                a[r] -= a[r, col] * a[row]
        row += 1
    return a[:row]


def _describe(d: np.ndarray, names: list[str]) -> str:
    """'0.577·a + 0.577·b − 0.577·c' for a unit direction (terms of size ≥ 0.01)."""
    out = ""
    for i in np.argsort(-np.abs(d)):
        if abs(d[i]) < 0.01:
            break
        sign = ("− " if out else "−") if d[i] < 0 else ("+ " if out else "")
        out += f"{' ' if out else ''}{sign}{abs(d[i]):.3g}·{names[i]}"
    return out


def eliminate_segments(jac: np.ndarray, n_data: int, p_phys: int) -> np.ndarray:
    """The data Jacobian with respect to the physical parameters only, the segment start
    states s eliminated through the linearised continuity equations C_θ dθ + C_s ds = 0:
    J_red = J_θ − J_s C_s⁺ C_θ (C_s⁺ the pseudo-inverse: directions of s that no residual
    sees, such as coordinates normal to the joints before assembly, drop out). At a
    continuous estimate this is the single-shooting sensitivity."""
    jd, c = jac[:n_data], jac[n_data:]
    ds = -np.linalg.lstsq(c[:, p_phys:], c[:, :p_phys], rcond=None)[0]
    return jd[:, :p_phys] + jd[:, p_phys:] @ ds


class Uncertainty(NamedTuple):
    """The Gauss–Newton uncertainty at the estimate: ``covariance`` (p, p) with NaN rows and
    columns and ``inf`` variances for parameters in a null direction; ``pinv`` the
    pseudo-inverse of JᵀJ on the identifiable subspace (no NaN: the covariance of every
    function of the parameters that does not change along a null direction, used by the
    delta method); ``null`` (p, k) the null directions in the raw coordinates (unit
    columns); ``scale`` (p,) the column scaling 1/‖J_i‖ (1 for dead columns): the change of
    parameter i that moves the whitened residuals by one unit; ``described`` one readable
    line per null direction."""

    covariance: np.ndarray
    pinv: np.ndarray
    null: np.ndarray
    scale: np.ndarray
    described: tuple[str, ...]


def visible(col: np.ndarray, flat, rounding) -> np.ndarray:
    """Columns the data see: a change of max(|θ_i|, 1) moves the residuals by more than
    their rounding error ρ (‖J_i‖ max(|θ_i|, 1) > ‖ρ‖), and the norm is finite and > 0.
    Columns at rounding level are noise: scaled to unit length they look like information
    (a standard error of 1e27 reported as determined, a random cosine with the residual that
    fails every gradient test, astronomically long first steps)."""
    typical = np.maximum(np.abs(np.asarray(flat, dtype=np.float64)), 1.0)
    noise = float(np.linalg.norm(rounding))
    with np.errstate(over="ignore", invalid="ignore"):
        return np.isfinite(col) & (col > 0) & (col * typical > noise)


def covariance(jac: np.ndarray, rtol: float, names: list[str], flat, rounding) -> Uncertainty:
    """Gauss–Newton covariance and the named null directions (module docstring of the
    package). From the singular value decomposition of the column-scaled Jacobian
    J S = U Σ Vᵀ, S = diag(1/‖J_i‖) (free of parameter units; an SVD, not an eigen-
    decomposition of JᵀJ, whose squaring would lose half the digits): directions with
    Σ_k ≤ ``rtol`` Σ_max are null (the data cannot determine them: rank deficiency up to the
    accuracy of J), and (JᵀJ)⁺ = S V Σ⁻² Vᵀ S over the others.

    A column at rounding level is dead before any scaling: when changing parameter i by
    max(|θ_i|, 1) moves the residuals by less than their rounding error ρ (‖J_i‖ max(|θ_i|,
    1) ≤ ‖ρ‖), no measured quantity depends on it; scaling such a column to unit length would
    make rounding noise look like information (standard errors of 1e27 reported as
    determined)."""
    p = jac.shape[1]
    with np.errstate(over="ignore", invalid="ignore"):
        col = np.linalg.norm(jac, axis=0)
    dead = ~visible(col, flat, rounding)
    dead |= ~(col > 1e-300 * max(float(np.max(col, initial=0.0)), 1e-300))
    scale = np.where(dead, 1.0, 1.0 / np.where(dead, 1.0, col))
    js = np.where(dead[None, :], 0.0, jac * scale[None, :])
    if not np.all(np.isfinite(js)):
        cov = np.full((p, p), np.nan)
        np.fill_diagonal(cov, np.inf)
        why = ("the Jacobian at the estimate is not finite",)
        return Uncertainty(cov, cov.copy(), np.eye(p), np.ones(p), why)
    _, sv, vt = np.linalg.svd(js, full_matrices=False)
    v = vt.T
    if v.shape[1] < p:  # fewer residuals than parameters: complete the basis
        v = np.linalg.svd(np.concatenate([vt, np.zeros((p - vt.shape[0], p))]))[2].T
        sv = np.concatenate([sv, np.zeros(p - sv.size)])
    top = float(np.max(sv, initial=0.0))
    null = ~(sv > rtol * top) if top > 0 else np.ones(p, dtype=bool)
    vi = v[:, ~null]
    pinv = (scale[:, None] * vi) @ ((vi / sv[~null] ** 2).T * scale[None, :])
    vn = v[:, null]
    involved = np.sum(vn**2, axis=1) >= 1e-4
    described = []
    raw = np.zeros((p, 0))
    if vn.shape[1]:
        raw = (scale[:, None] * vn).T  # directions in the raw parameter coordinates
        raw = raw / np.linalg.norm(raw, axis=1, keepdims=True)
        rows = _rref_rows(raw) if raw.shape[0] > 1 else raw
        for d in rows:
            d = d / np.linalg.norm(d)
            d = d * np.sign(d[np.argmax(np.abs(d))])
            nz = np.flatnonzero(np.abs(d) >= 0.01)
            if nz.size == 1 and dead[nz[0]]:
                described.append(f"{names[nz[0]]} (no measured quantity depends on it)")
            else:
                described.append(_describe(d, names))
        raw = raw.T
    cov = pinv.copy()
    cov[involved, :] = np.nan
    cov[:, involved] = np.nan
    cov[involved, involved] = np.inf
    return Uncertainty(cov, pinv, raw, scale, tuple(described))
