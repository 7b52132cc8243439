"""Mergeable statistics of one measure over samples: count, mean, variance, min, max, histogram.

Two partial results combine exactly in count, min, max and histogram counts, and in mean and
variance by the pairwise update of Chan, Golub & LeVeque (1979), "Updating formulae and a
pairwise algorithm for computing sample variances" (eq. 2.1b):

    n = n_a + n_b,   δ = x̄_b − x̄_a,   x̄ = x̄_a + δ n_b / n,   M₂ = M₂_a + M₂_b + δ² n_a n_b / n,

with M₂ = Σ (x − x̄)² and the (unbiased) variance M₂ / (n − 1). Within one block the mean and
M₂ are computed by two passes (mean, then squared deviations), which is exact to rounding.

The runner folds blocks of a FIXED set of sample ids in id order (``BLOCK`` below), so the
floating-point result depends only on the per-sample values, never on the chunk size, the
number of devices or hosts, or a resume. All arithmetic is float64 on the host, whatever the
dtype the samples were computed in.
"""

from __future__ import annotations

import dataclasses

import numpy as np

# Samples per statistics block: ids [k·BLOCK, (k+1)·BLOCK) form block k.
BLOCK = 4096


@dataclasses.dataclass(frozen=True)
class Statistics:
    """Statistics of one measure over the successful samples (elementwise for array measures).

    ``count`` samples with a finite value (an :class:`rbjax.Event` that did not happen is NaN
    and counted in ``missing``, not averaged); ``mean`` (0 where ``count`` is 0; ``average``
    gives NaN there), ``variance`` (unbiased, M₂/(n−1); NaN for n < 2), ``std``, ``min``,
    ``max`` (±inf where ``count`` is 0); ``histogram`` (counts per bin, values outside
    the edges in ``below`` / ``above``) when the measure was given ``bins``, with ``edges``.
    """

    count: np.ndarray
    missing: np.ndarray
    mean: np.ndarray
    m2: np.ndarray
    min: np.ndarray
    max: np.ndarray
    edges: np.ndarray | None = None
    histogram: np.ndarray | None = None
    below: np.ndarray | None = None
    above: np.ndarray | None = None

    @property
    def average(self) -> np.ndarray:
        """The mean, NaN where no sample counted (``mean`` holds 0 there, for merging)."""
        return np.asarray(np.where(self.count > 0, self.mean, np.nan))

    @property
    def variance(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.asarray(
                np.where(self.count > 1, self.m2 / np.maximum(self.count - 1, 1), np.nan)
            )

    @property
    def std(self) -> np.ndarray:
        return np.asarray(np.sqrt(self.variance))

    def quantile_from_histogram(self, p) -> np.ndarray:
        """Quantile(s) ``p`` interpolated linearly inside the histogram's bins (resolution: one
        bin). Only for scalar measures with ``bins``; exact quantiles come from the samples."""
        if self.histogram is None or self.edges is None or self.histogram.ndim != 1:
            raise ValueError(
                "quantile_from_histogram needs a scalar measure given bins=. Fix: pass "
                "bins=np.linspace(lo, hi, n) to the measure, or keep the samples "
                "(keep_samples=True) for exact quantiles."
            )
        assert self.below is not None and self.above is not None
        counts = np.concatenate([[self.below], self.histogram, [self.above]]).astype(np.float64)
        cum = np.cumsum(counts)
        total = cum[-1]
        p = np.asarray(p, dtype=np.float64)
        target = p * total
        edges = self.edges
        # bins 1..nbins of ``counts`` are the histogram; outside values clamp to the edges
        cum_h = np.concatenate([[self.below], self.below + np.cumsum(self.histogram)])
        k = np.clip(np.searchsorted(cum_h, target, side="left"), 1, len(edges) - 1)
        lo, hi = cum_h[k - 1], cum_h[k]
        frac = np.where(hi > lo, (target - lo) / np.where(hi > lo, hi - lo, 1), 0.0)
        return np.asarray(edges[k - 1] + np.clip(frac, 0, 1) * (edges[k] - edges[k - 1]))


def block_statistics(values: np.ndarray, ok: np.ndarray, edges) -> Statistics:
    """Statistics of one block: ``values`` (n, ...) of the samples, ``ok`` (n,) which count."""
    x = np.asarray(values, dtype=np.float64)[np.asarray(ok, bool)]
    shape = x.shape[1:]
    finite = np.isfinite(x)
    count = finite.sum(axis=0).astype(np.int64)
    missing = (~finite).sum(axis=0).astype(np.int64)
    xs = np.where(finite, x, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(count > 0, xs.sum(axis=0) / np.maximum(count, 1), 0.0)
        m2 = np.where(finite, (x - mean) ** 2, 0.0).sum(axis=0)
    lo = np.where(finite, x, np.inf).min(axis=0, initial=np.inf)
    hi = np.where(finite, x, -np.inf).max(axis=0, initial=-np.inf)
    hist = below = above = None
    e = None
    if edges is not None:
        e = np.asarray(edges, dtype=np.float64)
        flat = x.reshape(x.shape[0], int(np.prod(shape)))
        fin = finite.reshape(flat.shape)
        nb = len(e) - 1
        hist = np.zeros((flat.shape[1], nb), np.int64)
        below = np.zeros(flat.shape[1], np.int64)
        above = np.zeros(flat.shape[1], np.int64)
        for j in range(flat.shape[1]):
            v = flat[fin[:, j], j]
            hist[j] = np.histogram(v, bins=e)[0]
            below[j] = np.count_nonzero(v < e[0])
            above[j] = np.count_nonzero(v > e[-1])
        hist = hist.reshape(shape + (nb,))
        below = below.reshape(shape)
        above = above.reshape(shape)
    return _statistics(count, missing, mean, m2, lo, hi, e, hist, below, above)


def merge(a: Statistics, b: Statistics) -> Statistics:
    """The statistics of the union of two disjoint sets of samples (Chan et al. 1979)."""
    n = a.count + b.count
    with np.errstate(invalid="ignore", divide="ignore"):
        nn = np.maximum(n, 1)
        delta = b.mean - a.mean
        mean = np.where(n > 0, a.mean + delta * (b.count / nn), 0.0)
        m2 = np.where(n > 0, a.m2 + b.m2 + delta**2 * (a.count * b.count / nn), 0.0)
    hist = below = above = None
    if a.histogram is not None and b.histogram is not None:
        hist, below, above = a.histogram + b.histogram, a.below + b.below, a.above + b.above  # type: ignore[operator]
    lo, hi = np.minimum(a.min, b.min), np.maximum(a.max, b.max)
    return _statistics(n, a.missing + b.missing, mean, m2, lo, hi, a.edges, hist, below, above)


def _statistics(count, missing, mean, m2, lo, hi, edges, hist, below, above) -> Statistics:
    """Every field an ndarray (0-d for scalar measures), histogram fields None without bins."""
    arr = lambda x: None if x is None else np.asarray(x)
    return Statistics(
        count=np.asarray(count),
        missing=np.asarray(missing),
        mean=np.asarray(mean),
        m2=np.asarray(m2),
        min=np.asarray(lo),
        max=np.asarray(hi),
        edges=arr(edges),
        histogram=arr(hist),
        below=arr(below),
        above=arr(above),
    )
