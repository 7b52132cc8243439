"""Uncertainty and identifiability at the estimate: the Gauss–Newton covariance (JᵀJ)⁻¹ of
the whitened residuals on the identifiable subspace, and the directions the data cannot
determine, named in the raw parameter coordinates."""

from __future__ import annotations

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


def covariance(jac: np.ndarray, rtol: float, names: list[str]):
    """Gauss–Newton covariance (pseudo-inverse on the identifiable subspace) and the named
    null directions of the column-scaled JᵀJ (module docstring)."""
    p = jac.shape[1]
    with np.errstate(over="ignore", invalid="ignore"):
        h = jac.T @ jac
    col = np.sqrt(np.maximum(np.diag(h), 0.0))
    dead = ~(col > 1e-300 * max(float(np.max(col, initial=0.0)), 1e-300)) | ~np.isfinite(col)
    scale = np.where(dead, 1.0, 1.0 / np.where(dead, 1.0, col))
    hs = np.where(dead[:, None] | dead[None, :], 0.0, scale[:, None] * h * scale[None, :])
    if not np.all(np.isfinite(hs)):
        cov = np.full((p, p), np.nan)
        np.fill_diagonal(cov, np.inf)
        return cov, ("the Jacobian at the estimate is not finite",)
    w, v = np.linalg.eigh(hs)
    top = float(np.max(w, initial=0.0))
    null = ~(w > rtol * top) if top > 0 else np.ones(p, dtype=bool)
    vi = v[:, ~null]
    cov = (scale[:, None] * vi) @ ((vi / w[~null]).T * scale[None, :])
    vn = v[:, null]
    involved = np.sum(vn**2, axis=1) >= 1e-4
    described = []
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
    cov[involved, :] = np.nan
    cov[:, involved] = np.nan
    cov[involved, involved] = np.inf
    return cov, tuple(described)
