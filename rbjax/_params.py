"""Physically consistent parameterisations for identification (every raw value is a body).

An optimiser moves unconstrained numbers. If those numbers were a mass and an inertia matrix
directly, a step could produce a negative mass, an indefinite inertia or one that violates the
triangle inequality I₁ + I₂ ≥ I₃, which no mass distribution has; the simulation would then
diverge or produce nonsense, and the fit would stall. Here the raw leaves (the array fields that
``jax.grad`` and optax see) map smoothly onto physical values for EVERY finite raw value:

* :class:`Positive`: x = softplus(raw) + floor (or exp(raw) + floor): masses, damping,
  stiffness, lengths.
* :class:`PrincipalInertia`: the principal SECOND moments of the mass distribution
  Σᵢ = ∫ xᵢ² dm = softplus(rawᵢ) ≥ 0 and the rotation vector v of the principal axes
  (R = rotation of exp(v/2): three numbers for three degrees of freedom, so no direction of
  the raw parameters is void, which matters to the identifiability report of rbjax.identify). The principal moments of inertia are I₁ = Σ₂ + Σ₃, I₂ = Σ₁ + Σ₃,
  I₃ = Σ₁ + Σ₂, so positive semi-definiteness and all three triangle inequalities hold by
  construction, and Θ = R diag(I) Rᵀ. This is the density-realisability condition of Wensing,
  Kim & Slotine (IEEE RA-L 3(1), 2018) for the rotational part, in closed form; the log-Cholesky
  parameterisation of the 4×4 pseudo-inertia (Rucker & Wensing, IEEE RA-L 7(2), 2022) adds the
  mass and centre of mass, which rbjax bodies do not need (their frame is at the centre of mass).

Torque-free motion determines only the RATIOS of the moments (a uniform scaling of Θ leaves
ω(t) unchanged, seed 000 eq. (93) with zero load). :attr:`PrincipalInertia.ratios` and
``PrincipalInertia.from_matrix(...)`` with a fixed ``scale`` let a fit leave the scale out.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from . import _quaternion as quat
from ._body import validate_inertia
from ._errors import fail


def _softplus_inv(x):
    """The inverse of softplus, stable for small and large x: x + log(−expm1(−x))."""
    x = np.asarray(x, dtype=np.float64)
    return x + np.log(-np.expm1(-x))


class Positive(eqx.Module):
    """A positive quantity (scalar or array): ``value = softplus(raw) + floor`` (``kind =
    "softplus"``, gradient → 1 for large values, so steps act linearly on large quantities) or
    ``exp(raw) + floor`` (``kind = "log"``, steps act on the logarithm: scale-free). Build it
    from a physical value with :meth:`from_value`."""

    raw: Float[Array, "..."]
    floor: float = eqx.field(static=True, default=0.0)
    kind: str = eqx.field(static=True, default="softplus")

    @property
    def value(self) -> Array:
        if self.kind == "log":
            return jnp.exp(self.raw) + self.floor
        return jax.nn.softplus(self.raw) + self.floor

    @classmethod
    def from_value(cls, x, *, floor: float = 0.0, kind: str = "softplus", dtype=None):
        if kind not in ("softplus", "log"):
            fail(
                "Positive.kind", kind, "is not 'softplus' or 'log'", "pass kind='softplus' or 'log'"
            )
        arr = np.asarray(x, dtype=np.float64)
        if not np.all(np.isfinite(arr)) or np.any(arr <= floor):
            fail(
                "Positive.from_value(x)",
                x,
                f"is not finite and > floor = {floor}",
                "pass a finite value above the floor (e.g. a mass in kg > 0)",
            )
        y = arr - floor
        raw = np.log(y) if kind == "log" else _softplus_inv(y)
        dtype = jnp.result_type(float) if dtype is None else dtype
        return cls(jnp.asarray(raw, dtype), floor=float(floor), kind=kind)


class PrincipalInertia(eqx.Module):
    """An inertia about the centre of mass in body axes that is physical for every raw value.

    ``raw_moments`` (..., 3): softplus⁻¹ of the principal second moments Σᵢ = ∫xᵢ² dm;
    ``raw_rotation`` (..., 3): rotation vector v [rad] of the rotation R = R(exp(v/2)) whose
    columns are the principal axes in body axes (|v| ≤ π from :meth:`from_matrix`). Properties: :attr:`matrix` Θ = R diag(I) Rᵀ, :attr:`moments` I,
    :attr:`axes` R, :attr:`scale` ½ tr Θ = Σ₁ + Σ₂ + Σ₃, :attr:`ratios` I / ½ tr Θ. Leading
    batch axes broadcast.
    """

    raw_moments: Float[Array, "... 3"]
    raw_rotation: Float[Array, "... 3"]

    @property
    def second_moments(self) -> Array:
        return jax.nn.softplus(self.raw_moments)

    @property
    def moments(self) -> Array:
        s = self.second_moments
        total = jnp.sum(s, axis=-1, keepdims=True)
        return total - s  # I_i = Σ_j + Σ_k

    @property
    def axes(self) -> Array:
        return quat.rotation_matrix(quat.exp(0.5 * self.raw_rotation))

    @property
    def matrix(self) -> Array:
        r = self.axes
        return (r * self.moments[..., None, :]) @ jnp.swapaxes(r, -1, -2)

    @property
    def scale(self) -> Array:
        return jnp.sum(self.second_moments, axis=-1)

    @property
    def ratios(self) -> Array:
        return self.moments / self.scale[..., None]

    @classmethod
    def from_moments(cls, moments, rotation=None, *, dtype=None):
        """From principal moments I (3,) (triangle inequalities required) and an optional
        rotation vector (3,) [rad] of the principal axes (default: the body axes)."""
        m = np.asarray(moments, dtype=np.float64)
        if m.shape[-1:] != (3,) or not np.all(np.isfinite(m)) or np.any(m <= 0):
            fail(
                "PrincipalInertia moments",
                moments,
                "are not 3 finite positive numbers",
                "pass principal moments in kg m²",
            )
        sec = 0.5 * np.sum(m, axis=-1, keepdims=True) - m  # Σ_i = ½ tr − I_i
        tol = 1e-12 * np.max(m, axis=-1, keepdims=True)
        if np.any(sec < -tol):
            fail(
                "PrincipalInertia moments",
                moments,
                "violate the triangle inequality I_i <= I_j + I_k",
                "no mass distribution has these moments; check units and axes",
            )
        # a lamina has Σ_3 = 0 exactly: clip to a tiny positive second moment (raw finite)
        sec = np.maximum(sec, 1e-12 * np.sum(sec, axis=-1, keepdims=True))
        rot = (
            np.broadcast_to([1.0, 0.0, 0.0, 0.0], m.shape[:-1] + (4,))
            if rotation is None
            else rotation
        )
        dtype = jnp.result_type(float) if dtype is None else dtype
        return cls(jnp.asarray(_softplus_inv(sec), dtype), jnp.asarray(rot, dtype))

    @classmethod
    def from_matrix(cls, inertia, *, dtype=None):
        """From a symmetric inertia matrix (3, 3) in body axes: eigen-decomposition, axes made a
        proper rotation, quaternion of the axes (rbjax.quaternion.from_matrix)."""
        arr = np.asarray(inertia, dtype=np.float64)
        validate_inertia("PrincipalInertia.from_matrix(inertia)", arr)
        w, v = np.linalg.eigh(arr)
        v = v * np.where(np.linalg.det(v) < 0, -1.0, 1.0)[..., None, None]
        a = np.asarray(quat.from_matrix(jnp.asarray(v)))
        a = a * np.sign(a[0]) if a[0] != 0 else a  # the short way round: |v| <= π
        return cls.from_moments(w, 2.0 * np.asarray(quat.log(jnp.asarray(a))), dtype=dtype)
