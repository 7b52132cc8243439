"""A strong-Wolfe line search (Nocedal & Wright, "Numerical Optimization", 2nd ed.,
Alg. 3.5-3.6, cubic interpolation) driven from the host with the compiled objective."""

from __future__ import annotations

import numpy as np


def _cubic_min(a, fa, da, b, fb, db):
    """Minimiser of the cubic interpolating (a, fa, da), (b, fb, db) (N&W eq. (3.59)), or
    None."""
    d1 = da + db - 3.0 * (fa - fb) / (a - b)
    disc = d1 * d1 - da * db
    if not np.isfinite(disc) or disc < 0:
        return None
    d2 = np.sign(b - a) * np.sqrt(disc)
    den = db - da + 2.0 * d2
    if den == 0 or not np.isfinite(den):
        return None
    return b - (b - a) * (db + d2 - d1) / den


def line_search(phi, f0, d0, alpha=1.0, c1=1e-4, c2=0.9, max_evals=25):
    """Strong-Wolfe line search (Nocedal & Wright 2006, Alg. 3.5 with the zoom of Alg. 3.6,
    safeguarded cubic interpolation). ``phi(α) -> (f, f', payload)``; non-finite values count
    as a failed sufficient decrease. Returns (α, f, payload) of an accepted point, or None."""
    evals = 0
    best = None  # lowest point with sufficient decrease, returned if the search runs out

    def sufficient(a, f):
        return np.isfinite(f) and f <= f0 + c1 * a * d0

    def zoom(lo, f_lo, d_lo, hi, f_hi, d_hi):
        nonlocal evals, best
        while evals < max_evals:
            width = hi - lo
            a = None
            if np.isfinite(f_hi) and np.isfinite(d_hi):
                a = _cubic_min(lo, f_lo, d_lo, hi, f_hi, d_hi)
            lo_b, hi_b = sorted((lo + 0.1 * width, hi - 0.1 * width))
            if a is None or not lo_b <= a <= hi_b:
                a = 0.5 * (lo + hi)
            f, d, p = phi(a)
            evals += 1
            if not sufficient(a, f) or f >= f_lo:
                hi, f_hi, d_hi = a, f, d
            else:
                if best is None or f < best[1]:
                    best = (a, f, p)
                if abs(d) <= -c2 * d0:
                    return a, f, p
                if d * (hi - lo) >= 0:
                    hi, f_hi, d_hi = lo, f_lo, d_lo
                lo, f_lo, d_lo = a, f, d
            if abs(hi - lo) <= 1e-14 * max(abs(lo), abs(hi), 1e-300):
                break
        return best

    a_prev, f_prev, d_prev = 0.0, f0, d0
    a = alpha
    while evals < max_evals:
        f, d, p = phi(a)
        evals += 1
        if not sufficient(a, f) or (evals > 1 and f >= f_prev):
            return zoom(a_prev, f_prev, d_prev, a, f, d)
        best = (a, f, p) if best is None or f < best[1] else best
        if abs(d) <= -c2 * d0:
            return a, f, p
        if d >= 0:
            return zoom(a, f, d, a_prev, f_prev, d_prev)
        a_prev, f_prev, d_prev = a, f, d
        a = 2.0 * a
    return best
