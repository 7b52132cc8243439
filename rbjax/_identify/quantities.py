"""Estimates in the units people think in: the physical quantities behind the fitted raw
parameters (inertia entries, principal moments and axes, masses, centres of mass, any
positive quantity, or any function the user gives), with standard errors, correlations and
confidence intervals by the delta method.

Delta method (e.g. Bard, "Nonlinear Parameter Estimation", 1974, §7-5; Ljung, "System
Identification", 1999, §9.3): for a smooth quantity g(θ) with Jacobian G = ∂g/∂θ at the
estimate (``jax.jacfwd``), Cov(g) ≈ G Σ_θ Gᵀ, Σ_θ = (JᵀJ)⁺ the Gauss–Newton covariance on the
identifiable subspace. A quantity that changes along a null direction n of the data is not
determined by the data: its standard error is inf. "Changes" is judged in the column-scaled
coordinates of the identifiability test (S = diag(1/‖J_i‖), n = S n_s with ‖n_s‖ = 1):
|G_i S n_s| > 1e-6 ‖G_i S‖, i.e. a step along the null direction moves the quantity by more
than 1e-6 of what a step of the same size in the data's units moves it at most. One that does not (the moment ratios of a torque-free body, whose
scale is undetermined) has the finite standard error the data give it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from .. import _quaternion as quat
from .._errors import fail
from .._params import Bounded, LogCholeskyInertia, Positive, PrincipalInertia

_PARAM_CLASSES = (Positive, Bounded, PrincipalInertia, LogCholeskyInertia)
_INVARIANT = 1e-6  # |G_i S n_s| ≤ this × ‖G_i S‖: the quantity does not change along n


def _moved(g: np.ndarray, null: np.ndarray, scale: np.ndarray, tol: float) -> np.ndarray:
    """(m, k) True where quantity i changes along null direction k (module docstring)."""
    ns = null / scale[:, None]
    ns = ns / np.maximum(np.linalg.norm(ns, axis=0, keepdims=True), 1e-300)
    gs = g * scale[None, :]
    size = np.linalg.norm(gs, axis=1, keepdims=True)
    return np.abs(gs @ ns) > tol * size


class Estimate(NamedTuple):
    """One quantity: value, standard error, and the ``level`` confidence interval."""

    value: float
    std: float
    low: float
    high: float


class Quantities(eqx.Module):
    """Estimated quantities with their uncertainty (from :meth:`IdentificationResult.quantities`).

    ``names``, ``units`` (per quantity; "" when unknown), ``values``, ``covariance`` (NaN rows
    and columns and an ``inf`` variance for quantities the data do not determine), ``std``,
    ``correlation``; :meth:`interval` the confidence intervals (normal approximation, as the
    Gauss–Newton covariance itself); ``quantities[name]`` an :class:`Estimate`;
    :meth:`summary` a table."""

    names: tuple[str, ...] = eqx.field(static=True)
    units: tuple[str, ...] = eqx.field(static=True)
    values: np.ndarray
    covariance: np.ndarray

    @property
    def std(self) -> np.ndarray:
        return np.sqrt(np.diag(self.covariance))

    @property
    def correlation(self) -> np.ndarray:
        s = self.std
        with np.errstate(divide="ignore", invalid="ignore"):
            c = self.covariance / np.outer(s, s)
        c[~np.isfinite(c)] = np.nan
        np.fill_diagonal(c, np.where(np.isfinite(s), 1.0, np.nan))
        return c

    def interval(self, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
        """(low, high): value ∓ z σ with z the two-sided normal quantile of ``level``."""
        if not (np.ndim(level) == 0 and 0.0 < float(level) < 1.0):
            fail("Quantities.interval(level)", level, "is not in (0, 1)", "pass e.g. 0.95")
        z = statistics.NormalDist().inv_cdf(0.5 + 0.5 * float(level))
        return self.values - z * self.std, self.values + z * self.std

    def __getitem__(self, name: str) -> Estimate:
        if name not in self.names:
            fail("Quantities[name]", name, "is not a quantity", f"use one of {list(self.names)}")
        i = self.names.index(name)
        lo, hi = self.interval()
        return Estimate(float(self.values[i]), float(self.std[i]), float(lo[i]), float(hi[i]))

    def summary(self, level: float = 0.95) -> str:
        """A table: name, unit, value, standard error and the ``level`` confidence interval."""
        lo, hi = self.interval(level)
        w = max([len(n) for n in self.names] + [8])
        pct = f"{100 * level:g} % interval"
        lines = [f"  {'quantity':{w}s}  {'unit':6s}  {'estimate':>13s}  {'std error':>10s}  {pct}"]
        for n, u, v, s, a, b in zip(
            self.names, self.units, self.values, self.std, lo, hi, strict=True
        ):
            lines.append(f"  {n:{w}s}  {u:6s}  {v:13.7g}  {s:10.3g}  [{a:.6g}, {b:.6g}]")
        return "\n".join(lines)


def _inertia_quantities(prefix: str, matrix, pairing) -> dict[str, tuple[Any, str]]:
    """Entries of the inertia matrix, principal moments (ascending) and the rotation vector
    [deg] taking the body axes onto the principal axes (each principal axis paired with the
    body axis nearest to it at the estimate: ``pairing``, and signed towards it)."""
    out = {}
    for (i, j), tag in zip(
        ((0, 0), (1, 1), (2, 2), (0, 1), (0, 2), (1, 2)),
        ("xx", "yy", "zz", "xy", "xz", "yz"),
        strict=True,
    ):
        out[f"{prefix}.I_{tag}"] = (matrix[i, j], "kg m²")
    moments, vectors = jnp.linalg.eigh(matrix)
    for k in range(3):
        out[f"{prefix}.principal_moment[{k}]"] = (moments[k], "kg m²")
    if pairing is not None:
        cols = {axis: vectors[:, k] * jnp.sign(vectors[axis, k]) for k, axis in enumerate(pairing)}
        r = jnp.stack([cols[0], cols[1], cols[2]], axis=1)
        r = r.at[:, 2].multiply(jnp.sign(jnp.linalg.det(r)))
        rotvec = jnp.rad2deg(2.0 * quat.log(quat.from_matrix(r)))
        for k in range(3):
            out[f"{prefix}.axes_rotation[{k}]"] = (rotvec[k], "deg")
    return out


def _pairing(matrix) -> tuple[int, ...] | None:
    """The body axis nearest each principal axis (ascending moments), or None when two
    principal axes are nearest the same body axis or two moments are nearly equal (the axes
    are then not determined by the matrix)."""
    m = np.asarray(matrix, dtype=np.float64)
    w, v = np.linalg.eigh(m)
    if np.min(np.diff(w)) <= 1e-6 * max(float(np.max(np.abs(w))), 1e-300):
        return None
    pairing = tuple(int(np.argmax(np.abs(v[:, k]))) for k in range(3))
    return pairing if len(set(pairing)) == 3 else None


def _keyed(prefix: str, x, unit: str) -> dict[str, tuple[Any, str]]:
    x = jnp.asarray(x)
    if x.ndim == 0:
        return {prefix: (x, unit)}
    return {prefix + "[" + ",".join(map(str, i)) + "]": (x[i], unit) for i in np.ndindex(x.shape)}


def physical(params, template=None) -> dict[str, tuple[Any, str]]:
    """The automatic quantities of a parameter pytree: ``Positive`` and ``Bounded`` → their
    values;
    ``PrincipalInertia`` → inertia entries, principal moments, principal-axis rotation;
    ``LogCholeskyInertia`` → mass, centre of mass, and the same about the centre of mass;
    any other float array leaf → itself. ``template`` (the estimate) fixes the pairing of
    principal and body axes; default ``params``."""
    template = params if template is None else template
    is_leaf = lambda x: isinstance(x, _PARAM_CLASSES)
    flat = jax.tree_util.tree_flatten_with_path(params, is_leaf=is_leaf)[0]
    ref = jax.tree_util.tree_flatten_with_path(template, is_leaf=is_leaf)[0]
    out: dict[str, tuple[Any, str]] = {}
    for (path, leaf), (_, leaf0) in zip(flat, ref, strict=True):
        name = jax.tree_util.keystr(path)
        if isinstance(leaf, Positive | Bounded):
            out |= _keyed(name, leaf.value, "")
        elif isinstance(leaf, PrincipalInertia) and jnp.ndim(leaf.raw_moments) == 1:
            out |= _inertia_quantities(name, leaf.matrix, _pairing(leaf0.matrix))
        elif isinstance(leaf, LogCholeskyInertia) and jnp.ndim(leaf.alpha) == 0:
            out[f"{name}.mass"] = (leaf.mass, "kg")
            out |= _keyed(f"{name}.com", leaf.com, "m")
            out |= _inertia_quantities(name, leaf.inertia_com, _pairing(leaf0.inertia_com))
        elif isinstance(leaf, _PARAM_CLASSES):  # batched parameter objects: their leaves
            for sub_path, sub in jax.tree_util.tree_flatten_with_path(leaf)[0]:
                out |= _keyed(name + jax.tree_util.keystr(sub_path), sub, "")
        elif eqx.is_inexact_array(leaf):
            out |= _keyed(name, leaf, "")
    return out


def _user(fn: Callable, params) -> dict[str, tuple[Any, str]]:
    tree = fn(params)
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        out |= _keyed(jax.tree_util.keystr(path) or "value", leaf, "")
    return out


def _linearise(fn: Callable | None, params, free):
    """(names, units, values, G = ∂values/∂θ) of the quantities ``fn(params)`` (default
    :func:`physical`) at the estimate, θ the free leaves (``jax.jacfwd``)."""
    dyn, fixed = eqx.partition(params, free)
    flat, unravel = ravel_pytree(dyn)

    def table(p):
        return physical(p, params) if fn is None else _user(fn, p)

    def values(v):
        t = table(eqx.combine(unravel(v), fixed))
        return jnp.stack([jnp.asarray(x, flat.dtype) for x, _ in t.values()])

    t0 = table(params)
    if not t0:
        fail("quantities(fn)", fn, "returns no array", "return a pytree of float arrays")
    with jax.numpy_dtype_promotion("standard"):
        g = np.asarray(jax.jacfwd(values)(flat), dtype=np.float64)
        val = np.asarray(values(flat), dtype=np.float64)
    return tuple(t0), tuple(u for _, u in t0.values()), val, g


def propagate(
    fn: Callable | None, params, free, pinv: np.ndarray, null: np.ndarray, scale: np.ndarray
) -> Quantities:
    """The quantities ``fn(params)`` (default :func:`physical`) at the estimate, their
    covariance G (JᵀJ)⁺ Gᵀ, and inf for those that change along a null direction. Only
    quantities that depend on the free parameters are kept."""
    names, units, val, g = _linearise(fn, params, free)
    keep = np.any(g != 0.0, axis=1)
    g, val = g[keep], val[keep]
    names = tuple(n for n, k in zip(names, keep, strict=True) if k)
    units = tuple(u for u, k in zip(units, keep, strict=True) if k)
    cov = g @ pinv @ g.T
    if null.shape[1]:
        moved = np.any(_moved(g, null, scale, _INVARIANT), axis=1)
        cov[moved, :] = np.nan
        cov[:, moved] = np.nan
        cov[moved, moved] = np.inf
    return Quantities(names, units, val, cov)


def hints(params, free, null: np.ndarray, scale: np.ndarray) -> tuple[str, ...]:
    """What data would determine each null direction, from how the automatic quantities
    change along it: a uniform scaling of masses and inertias (only a known force or torque,
    or a known mass, fixes the scale), else the quantities the data see only in combination."""
    if not null.shape[1]:
        return ()
    names, units, val, g = _linearise(None, params, free)
    out = []
    changes = _moved(g, null, scale, 1e-3)
    for k in range(null.shape[1]):
        d = g @ null[:, k]
        moved = changes[:, k]
        if not np.any(moved):
            out.append(
                "no physical quantity changes along this direction (it is internal to a "
                "parameterisation); fix one of its raw parameters with free="
            )
            continue
        rel = d[moved] / np.where(val[moved] != 0.0, val[moved], np.nan)
        mass_like = all(units[i] in ("kg", "kg m²") for i in np.flatnonzero(moved))
        if mass_like and np.all(np.isfinite(rel)) and np.ptp(rel) <= 1e-2 * np.max(np.abs(rel)):
            out.append(
                "a uniform scaling of the masses and inertias leaves the motion unchanged: "
                "apply a known force or torque (or measure one, e.g. a joint reaction), or fix "
                "one mass or inertia"
            )
            continue
        seen = [names[i] for i in np.flatnonzero(moved)[np.argsort(-np.abs(d[moved]))]][:4]
        out.append(
            f"the data see {', '.join(seen)} only in a combination: measure a quantity that "
            "depends on one of them alone (an absolute position or orientation, a known "
            "input), excite the motion differently, or fix one of them (free=)"
        )
    return tuple(out)
