"""Physically consistent parameterisations: every raw value is a physical body.

An optimiser moves unconstrained numbers. If those numbers were a mass and an inertia matrix
directly, one step could produce a negative mass, an indefinite inertia, or an inertia that
violates the triangle inequality I₁ + I₂ ≥ I₃, which no mass distribution has. The simulation
then diverges or produces nonsense, and the fit stalls. The classes here are equinox Modules
whose array fields are unconstrained *raw leaves* (what ``jax.grad`` and optax see) and whose
properties are the physical values. For EVERY finite raw value:

* the physical value is a physical body (positive mass, symmetric positive (semi-)definite
  inertia obeying the triangle inequalities, positive definite pseudo-inertia);
* the map is smooth (C^∞), so ``jax.grad``/``jax.jvp`` are finite and well conditioned; no
  projection, clipping or penalty is involved, and no raw value is "out of range".

Classes:

* :class:`Positive`: x = softplus(raw) + floor (``kind="softplus"``) or exp(raw) + floor
  (``kind="log"``): masses, damping, stiffness, lengths.
* :class:`Bounded`: x = low + (high − low)·sigmoid(raw): a delay, a damping or a friction
  coefficient that must stay in an interval (the smooth form of a box constraint).
* :class:`PrincipalInertia`: the inertia about the centre of mass from the principal SECOND
  moments of the mass distribution Σᵢ = ∫ xᵢ² dm = softplus(rawᵢ) ≥ 0 and the rotation vector
  of the principal axes. The principal moments of inertia are I₁ = Σ₂ + Σ₃, I₂ = Σ₁ + Σ₃,
  I₃ = Σ₁ + Σ₂, so positive definiteness and all three triangle inequalities hold by
  construction (the density-realisability condition of Wensing, Kim & Slotine, "Linear matrix
  inequalities for physically consistent inertial parameter identification", IEEE RA-L 3(1),
  2018, for the rotational part, in closed form).
* :class:`LogCholeskyInertia`: mass, centre of mass and inertia together, from the log-Cholesky
  factor of the 4×4 pseudo-inertia J = U Uᵀ (Rucker & Wensing, "Smooth parameterization of
  rigid-body inertia", IEEE RA-L 7(2):2771–2778, 2022). J ≻ 0 is exactly physical consistency
  (Wensing et al. 2018), and every upper-triangular U with a positive (exponentiated) diagonal
  gives J ≻ 0; the map from the 10 raw parameters onto the physical bodies is a diffeomorphism.

Constructors (``from_value``, ``from_moments``, ``from_matrix``, ``from_physical``) are the
build-time way in: they validate concrete input (``ValueError`` naming the field, the value and
the fix, as everywhere in rbjax; the checks are skipped on tracers) and invert the properties
to rounding. Differentiate through the raw leaves, not through the constructors (``from_matrix``
uses an eigen-decomposition, whose derivative is undefined for equal moments).

All properties broadcast over leading batch axes of the raw leaves (a batch of bodies is a
Module with batched leaves, or ``jax.vmap`` over one), and keep the dtype of the raw leaves
(float64 or float32).
"""

from __future__ import annotations

from functools import partial

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from . import _quaternion as quat
from ._body import validate_inertia
from ._errors import check_finite, check_shape, fail, is_concrete

_KINDS = ("softplus", "log")
_DEGENERATE = 1e-12  # smallest second moment kept, relative to the sum of the second moments


# --------------------------------------------------------------------------- helpers


def _out_dtype(field: str, x, dtype):
    """dtype of the raw leaves: ``dtype`` if given, else x's floating dtype, else JAX's default
    float (float64 with jax_enable_x64)."""
    if dtype is None:
        dt = getattr(x, "dtype", None)
        if dt is not None and jnp.issubdtype(dt, jnp.floating):
            return jax.dtypes.canonicalize_dtype(dt)
        return jnp.result_type(float)
    dt = jnp.dtype(dtype)
    if not jnp.issubdtype(dt, jnp.floating):
        fail(f"{field} dtype", dtype, "is not a floating dtype", "pass jnp.float64 or float32")
    return jax.dtypes.canonicalize_dtype(dt)


def _work(x) -> Array:
    """x in JAX's default float (float64 with x64): constructors compute at full precision and
    cast the raw leaves to the requested dtype at the end."""
    return jnp.asarray(x, dtype=jnp.result_type(float))


def softplus_inverse(y):
    """The inverse of softplus, y + log(−expm1(−y)) for y > 0: exact for tiny y (≈ log y) and
    for large y (≈ y), where the naive log(exp(y) − 1) underflows or overflows."""
    y = jnp.asarray(y)
    return y + jnp.log(-jnp.expm1(-y))


def _sym(m: Array) -> Array:
    return 0.5 * (m + jnp.swapaxes(m, -1, -2))


def _eye3(like: Array) -> Array:
    return jnp.eye(3, dtype=like.dtype)


# --------------------------------------------------------------------------- Positive


class Positive(eqx.Module):
    """A positive quantity (scalar or array) with an unconstrained raw leaf.

    ``value = softplus(raw) + floor`` (``kind="softplus"``, the default: the gradient
    d value/d raw = sigmoid(raw) tends to 1 for large values, so steps act linearly on large
    quantities) or ``value = exp(raw) + floor`` (``kind="log"``: steps act on the logarithm,
    scale-free; exp overflows for raw > log(max float), ≈ 709 in float64). ``floor`` ≥ 0 is a
    static lower bound (default 0). Build it from a physical value with :meth:`from_value`.

    softplus is evaluated stably (``jax.nn.softplus``) and its gradient, sigmoid(raw), is finite
    at every finite raw value; for raw ≲ −745 (float64) the value underflows to ``floor``.
    """

    raw: Float[Array, "..."]
    floor: float = eqx.field(static=True, default=0.0)
    kind: str = eqx.field(static=True, default="softplus")

    def __check_init__(self):
        if self.kind not in _KINDS:
            fail("Positive.kind", self.kind, "is not 'softplus' or 'log'", "pass one of these")
        if not (
            isinstance(self.floor, int | float | np.integer | np.floating)
            and np.isfinite(self.floor)
            and self.floor >= 0
        ):
            fail(
                "Positive.floor",
                self.floor,
                "is not a finite number >= 0",
                "pass the lower bound of the quantity as a float >= 0 (default 0.0)",
            )

    @property
    def value(self) -> Array:
        if self.kind == "log":
            return jnp.exp(self.raw) + self.floor
        return jax.nn.softplus(self.raw) + self.floor

    @classmethod
    def from_value(cls, x, floor: float = 0.0, *, kind: str = "softplus", dtype=None):
        """The Positive whose :attr:`value` is ``x`` (any shape; every entry finite and
        > ``floor``). ``dtype`` of the raw leaf: default x's floating dtype, else JAX's
        default float."""
        if kind not in _KINDS:
            fail("Positive.kind", kind, "is not 'softplus' or 'log'", "pass one of these")
        floor = float(floor)
        if not (np.isfinite(floor) and floor >= 0.0):
            fail("Positive.floor", floor, "is not a finite number >= 0", "pass a float >= 0")
        out = _out_dtype("Positive.from_value", x, dtype)
        if is_concrete(x):
            arr = np.asarray(x, dtype=np.float64)
            if not np.all(np.isfinite(arr)) or np.any(arr <= floor):
                fail(
                    "Positive.from_value(x)",
                    x,
                    f"is not finite and > floor = {floor}",
                    "pass a finite value above the floor (e.g. a mass in kg > 0), or lower the "
                    "floor",
                )
        return cls(_positive_core(_work(x), floor, kind).astype(out), floor=floor, kind=kind)


# --------------------------------------------------------------------------- Bounded


def _check_bounds(field: str, low, high) -> tuple[float, float]:
    ok = all(isinstance(v, int | float | np.integer | np.floating) for v in (low, high))
    if not (ok and np.isfinite(low) and np.isfinite(high) and low < high):
        fail(
            field,
            (low, high),
            "is not a pair of finite numbers low < high",
            "pass the interval the quantity must stay in, e.g. low=-0.05, high=0.1",
        )
    return float(low), float(high)


def bounded_value(raw, low, high):
    """low + (high − low)·sigmoid(raw), clipped to [low, high] (low + (high − low)·1 may round
    one ulp past high); ``low`` and ``high`` may be arrays (traced, too)."""
    return jnp.clip(low + (high - low) * jax.nn.sigmoid(raw), low, high)


class Bounded(eqx.Module):
    """A quantity confined to the open interval (``low``, ``high``), with an unconstrained raw
    leaf: ``value = low + (high − low) · sigmoid(raw)``.

    What an interval is for: a parameter the physics or the instrument bounds (a sensor's delay
    between 0 and a few samples, a damping between a floor and a ceiling, a friction
    coefficient in (0, 1)) whose fit would otherwise wander into a region where the model is
    meaningless and stop in a local minimum there. This is the smooth counterpart of a box
    constraint in a bounded least-squares solver (as in ``mujoco.sysid``): every finite raw
    value is inside the interval (on a bound only where sigmoid rounds to 0 or 1, |raw| ≳ 37
    in float64), d value/d raw = (value − low)(high − value)/(high − low) is
    finite everywhere, and the Gauss–Newton covariance of ``raw`` propagates to ``value`` by
    the delta method in :meth:`rbjax.IdentificationResult.quantities`.

    Near a bound the derivative tends to 0: a fit whose estimate sits against a bound reports
    a large standard error for ``raw`` and a small one for ``value``. That estimate is the
    best fit *inside* the interval, not a stationary point of the unconstrained problem, and
    its standard error is not a confidence statement: widen the interval if the data should
    decide. The map is not an active-set solver: a step that carries the parameter onto a bound
    leaves it there (measured on benchmarks/identify.py: with every unknown bounded as sysid
    bounds it, the double pendulum converges where the unbounded fit does not, and the
    tumbling body stops with a gyro bias on its bound where the unbounded fit converges). ``low`` and ``high`` are static floats (one interval for every entry of ``raw``).
    Build it from a physical value with :meth:`from_value`.
    """

    raw: Float[Array, "..."]
    low: float = eqx.field(static=True, default=0.0)
    high: float = eqx.field(static=True, default=1.0)

    def __check_init__(self):
        _check_bounds("Bounded(low, high)", self.low, self.high)

    @property
    def value(self) -> Array:
        return bounded_value(self.raw, self.low, self.high)

    @classmethod
    def from_value(cls, x, low: float, high: float, *, dtype=None):
        """The Bounded whose :attr:`value` is ``x`` (any shape; every entry finite and strictly
        between ``low`` and ``high``): raw = log(x − low) − log(high − x). ``dtype`` of the raw
        leaf: default x's floating dtype, else JAX's default float."""
        low, high = _check_bounds("Bounded.from_value(low, high)", low, high)
        out = _out_dtype("Bounded.from_value", x, dtype)
        if is_concrete(x):
            arr = np.asarray(x, dtype=np.float64)
            if not np.all(np.isfinite(arr)) or np.any(arr <= low) or np.any(arr >= high):
                fail(
                    "Bounded.from_value(x)",
                    x,
                    f"is not finite and strictly inside ({low}, {high})",
                    "start inside the interval (a value on a bound has raw = ±inf), or widen it",
                )
        x = _work(x)
        raw = jnp.log(x - low) - jnp.log(high - x)
        return cls(raw.astype(out), low=low, high=high)


# --------------------------------------------------------------------------- PrincipalInertia


def _moments_from_second(s: Array) -> Array:
    """I = (Σ₂ + Σ₃, Σ₁ + Σ₃, Σ₁ + Σ₂), summed directly (no cancellation)."""
    s1, s2, s3 = s[..., 0], s[..., 1], s[..., 2]
    return jnp.stack([s2 + s3, s1 + s3, s1 + s2], axis=-1)


def _second_from_moments(moments: Array) -> Array:
    """Σᵢ = ½ tr Θ − Iᵢ = ½ (I_j + I_k − I_i), clipped below at 1e-12 Σ (the lamina case)."""
    i1, i2, i3 = moments[..., 0], moments[..., 1], moments[..., 2]
    s = 0.5 * jnp.stack([i2 + i3 - i1, i1 + i3 - i2, i1 + i2 - i3], axis=-1)
    total = jnp.sum(s, axis=-1, keepdims=True)
    return jnp.maximum(s, _DEGENERATE * total)


# The properties' kernels are jitted (inlined under an outer jit; compiled once per shape and
# dtype when properties are evaluated eagerly, instead of once per small operation).


@jax.jit
def _axes(raw_rotation: Array) -> Array:
    return quat.rotation_matrix(quat.exp(0.5 * raw_rotation))


@jax.jit
def _principal_matrix(raw_moments: Array, raw_rotation: Array) -> Array:
    r = _axes(raw_rotation)
    moments = _moments_from_second(jax.nn.softplus(raw_moments))
    return _sym((r * moments[..., None, :]) @ jnp.swapaxes(r, -1, -2))


class PrincipalInertia(eqx.Module):
    """An inertia about the centre of mass, in body axes, that is physical for every raw value.

    Raw leaves:

    * ``raw_moments`` (..., 3): softplus⁻¹ of the principal second moments Σᵢ = ∫ xᵢ² dm ≥ 0
      of the mass distribution (in the principal axes).
    * ``raw_rotation`` (..., 3): rotation vector v [rad] of the rotation R = R(exp(v/2)) whose
      columns are the principal axes in body axes. Three numbers for three degrees of freedom,
      valid and smooth for every value (no normalisation, no zero to avoid), so no direction
      of the raw parameters is void: this matters to the identifiability report of
      ``rbjax.identify``. The map is locally one-to-one for |v| < 2π; the constructors return
      |v| ≤ π. A quaternion may be given to :meth:`from_moments`.

    Properties: :attr:`second_moments` Σ, :attr:`moments` I = (Σ₂+Σ₃, Σ₁+Σ₃, Σ₁+Σ₂),
    :attr:`axes` R, :attr:`matrix` Θ = R diag(I) Rᵀ (exactly symmetric), :attr:`scale`
    ½ tr Θ = Σ₁+Σ₂+Σ₃, :attr:`ratios` I / (½ tr Θ).

    Every raw value gives Σᵢ > 0, hence Iᵢ > 0 and I_i + I_j − I_k = 2Σ_k > 0: positive definite
    and the triangle inequalities, by construction. (In floating point Σᵢ = softplus(rawᵢ)
    underflows to 0 for rawᵢ ≲ −745 in float64, ≲ −104 in float32: a lamina, or a rod if two
    underflow, which is still a limit of physical bodies.)

    Degenerate input: a flat lamina has Σ₃ = 0 (I₃ = I₁ + I₂ exactly), whose raw value would be
    −∞. The constructors clip each Σᵢ below at 1e-12 (Σ₁+Σ₂+Σ₃), so the raw value is finite
    (≈ −27.6 + log(Σ₁+Σ₂+Σ₃)) and the moments are reproduced to 1e-12 · ½ tr Θ.

    Ratios: torque-free motion determines only the ratios of the moments (a uniform scaling of
    Θ leaves ω(t) unchanged, Möller & Glocker 2012 eq. (93) with zero load). :attr:`ratios` divides by
    ½ tr Θ rather than by the largest moment because that is smooth everywhere (the maximum has
    a kink where two moments cross, e.g. at every axisymmetric body); the ratios lie in (0, 1]
    and sum to 2. A fit of torque-free data leaves the scale undetermined; ``rbjax.identify``
    reports that direction of the raw parameters by name. To fit the ratios only, fix the
    scale in the model: use ``p.matrix / p.scale[..., None, None]`` (½ tr Θ = 1) as the
    inertia.
    """

    raw_moments: Float[Array, "... 3"]
    raw_rotation: Float[Array, "... 3"]

    @property
    def second_moments(self) -> Array:
        """Σ = softplus(raw_moments) (..., 3), the principal second moments ∫ xᵢ² dm."""
        return jax.nn.softplus(self.raw_moments)

    @property
    def moments(self) -> Array:
        """The principal moments of inertia I (..., 3), in the order of the axes' columns."""
        return _moments_from_second(self.second_moments)

    @property
    def axes(self) -> Array:
        """R (..., 3, 3): column k is the principal axis of moment k, in body axes."""
        return _axes(self.raw_rotation)

    @property
    def matrix(self) -> Array:
        """Θ = R diag(I) Rᵀ (..., 3, 3) about the centre of mass in body axes [kg m²]."""
        return _principal_matrix(self.raw_moments, self.raw_rotation)

    @property
    def scale(self) -> Array:
        """½ tr Θ = Σ₁ + Σ₂ + Σ₃ = ∫ |x|² dm (...,)."""
        return jnp.sum(self.second_moments, axis=-1)

    @property
    def ratios(self) -> Array:
        """I / (½ tr Θ) (..., 3): scale-free, each in (0, 1], summing to 2."""
        return self.moments / self.scale[..., None]

    @classmethod
    def from_moments(cls, moments, rotation=None, *, dtype=None):
        """From principal moments I (..., 3) [kg m²] (positive, triangle inequalities within
        1e-12 of their sum) and the principal axes ``rotation``: a rotation vector (..., 3)
        [rad], or a nonzero quaternion (..., 4) (scalar first, any norm); ``None`` = the body
        axes. ``dtype`` of the raw leaves: default the moments' floating dtype."""
        field = "PrincipalInertia.from_moments(moments)"
        check_shape(field, moments, (3,))
        check_finite(field, moments, "pass finite principal moments in kg m^2")
        if is_concrete(moments):
            m = np.asarray(moments, dtype=np.float64)
            if np.any(m <= 0.0):
                fail(field, moments, "are not all > 0", "every principal moment must be > 0")
            tol = 1e-12 * np.sum(m, axis=-1)
            lhs = np.sum(m, axis=-1) - 2.0 * np.max(m, axis=-1)  # I_i + I_j − I_k, k largest
            if np.any(lhs < -tol):
                fail(
                    field,
                    moments,
                    "violate the triangle inequality I_i + I_j >= I_k",
                    "no mass distribution has these moments; check units and axes",
                )
        out = _out_dtype("PrincipalInertia.from_moments", moments, dtype)
        mom = _work(moments)
        rot = _rotvec("PrincipalInertia.from_moments(rotation)", rotation, mom)
        return cls(*_cast(_moments_core(mom, rot), out))

    @classmethod
    def from_matrix(cls, inertia, *, dtype=None):
        """From a symmetric positive definite inertia Θ (..., 3, 3) [kg m²] about the centre of
        mass in body axes, obeying the triangle inequalities (``rbjax.Body``'s check).

        Eigen-decomposition (ascending moments); the eigenvector matrix is made a proper
        rotation (det +1) and stored as its rotation vector (angle ≤ π). For equal moments
        (an axisymmetric body) the axes are not unique; any valid choice reproduces Θ.
        ``dtype``: default Θ's floating dtype."""
        field = "PrincipalInertia.from_matrix(inertia)"
        validate_inertia(field, inertia)
        out = _out_dtype("PrincipalInertia.from_matrix", inertia, dtype)
        return cls(*_cast(_matrix_core(_work(inertia)), out))


def _rotvec(field: str, rotation, moments: Array) -> Array:
    """A rotation vector (..., 3) from None, a rotation vector (..., 3) or a quaternion
    (..., 4)."""
    if rotation is None:
        return jnp.zeros(moments.shape, dtype=moments.dtype)
    shape = np.shape(rotation)
    last = int(shape[-1]) if len(shape) else 0
    if last not in (3, 4):
        fail(
            field,
            rotation,
            f"has shape {shape}, not (..., 3) or (..., 4)",
            "pass a rotation vector (..., 3) in rad or a quaternion (..., 4), scalar first",
        )
    check_finite(field, rotation, "pass a finite rotation vector or quaternion")
    if last == 4 and is_concrete(rotation):
        if np.any(np.linalg.norm(np.asarray(rotation, dtype=np.float64), axis=-1) == 0.0):
            fail(field, rotation, "is a zero quaternion", "pass a nonzero quaternion (any norm)")
    return _work(rotation)


# The numeric cores of the constructors, jitted once per shape (eager evaluation of the many
# small operations would compile each of them on first use). They run in JAX's default float;
# ``_cast`` then gives the raw leaves their dtype.


def _cast(leaves: tuple[Array, ...], out) -> tuple[Array, ...]:
    return tuple(x.astype(out) for x in leaves)


@partial(jax.jit, static_argnums=(1, 2))
def _positive_core(x: Array, floor: float, kind: str) -> Array:
    y = x - floor
    return jnp.log(y) if kind == "log" else softplus_inverse(y)


@jax.jit
def _moments_core(moments: Array, rotation: Array) -> tuple[Array, Array]:
    raw_m = softplus_inverse(_second_from_moments(moments))
    if rotation.shape[-1] == 4:  # log is invariant to a positive scale: the rotation of a/|a|
        rotation = 2.0 * quat.log(rotation)
    return raw_m, rotation


@jax.jit
def _matrix_core(inertia: Array) -> tuple[Array, Array]:
    w, v = jnp.linalg.eigh(_sym(inertia))  # ascending moments, orthonormal axes
    v = v * jnp.where(jnp.linalg.det(v) < 0, -1.0, 1.0)[..., None, None]  # proper rotation
    rotvec = 2.0 * quat.log(quat.from_matrix(v))  # angle in [0, π]
    return softplus_inverse(_second_from_moments(w)), rotvec


@jax.jit
def _physical_core(mass: Array, com: Array, inertia: Array):
    th = _sym(inertia)
    tr = jnp.trace(th, axis1=-2, axis2=-1)[..., None, None]
    sc = 0.5 * tr * _eye3(th) - th  # Σ_c = ½ tr Θ 1 − Θ, positive semi-definite
    s_norm = sc / mass[..., None, None]
    lam_min = jax.lax.stop_gradient(jnp.linalg.eigvalsh(s_norm)[..., 0])
    tr_s = jnp.trace(s_norm, axis1=-2, axis2=-1)
    lift = jnp.maximum(_DEGENERATE * tr_s - lam_min, 0.0)  # 0 unless (nearly) a lamina
    s_norm = s_norm + lift[..., None, None] * _eye3(s_norm)
    v = jnp.linalg.cholesky(s_norm[..., ::-1, ::-1])[..., ::-1, ::-1]  # upper: V Vᵀ = S
    alpha = 0.5 * jnp.log(mass)
    d = jnp.log(jnp.diagonal(v, axis1=-2, axis2=-1))
    s = jnp.stack([v[..., 0, 1], v[..., 1, 2], v[..., 0, 2]], axis=-1)
    return alpha, d, s, com


# --------------------------------------------------------------------------- LogCholeskyInertia


@jax.jit
def _upper(d: Array, s: Array) -> Array:
    """V (..., 3, 3): the upper-left block of U / e^α."""
    ed = jnp.exp(d)
    batch = jnp.broadcast_shapes(ed.shape[:-1], s.shape[:-1])
    ed = jnp.broadcast_to(ed, batch + (3,))
    s = jnp.broadcast_to(s, batch + (3,))
    zero = jnp.zeros(batch, dtype=ed.dtype)
    rows = [
        jnp.stack([ed[..., 0], s[..., 0], s[..., 2]], axis=-1),
        jnp.stack([zero, ed[..., 1], s[..., 1]], axis=-1),
        jnp.stack([zero, zero, ed[..., 2]], axis=-1),
    ]
    return jnp.stack(rows, axis=-2)


@jax.jit
def _second_moment_com(alpha: Array, d: Array, s: Array) -> Array:
    v = _upper(d, s)
    return _sym(jnp.exp(2.0 * alpha)[..., None, None] * (v @ jnp.swapaxes(v, -1, -2)))


@jax.jit
def _inertia_from_second(sig: Array) -> Array:
    """tr(Σ) 1 − Σ: the inertia of a second-moment matrix about the same point."""
    return jnp.trace(sig, axis1=-2, axis2=-1)[..., None, None] * _eye3(sig) - sig


@jax.jit
def _factor(alpha: Array, d: Array, s: Array, t: Array) -> Array:
    v = _upper(d, s)
    batch = jnp.broadcast_shapes(v.shape[:-2], t.shape[:-1], jnp.shape(alpha))
    v = jnp.broadcast_to(v, batch + (3, 3))
    t = jnp.broadcast_to(t, batch + (3,))
    top = jnp.concatenate([v, t[..., :, None]], axis=-1)
    bottom = jnp.concatenate(
        [jnp.zeros(batch + (1, 3), v.dtype), jnp.ones(batch + (1, 1), v.dtype)], axis=-1
    )
    return jnp.exp(alpha)[..., None, None] * jnp.concatenate([top, bottom], axis=-2)


@jax.jit
def _pseudo_inertia(alpha: Array, d: Array, s: Array, t: Array) -> Array:
    u = _factor(alpha, d, s, t)
    return _sym(u @ jnp.swapaxes(u, -1, -2))


class LogCholeskyInertia(eqx.Module):
    """Mass, centre of mass and inertia from the log-Cholesky factor of the pseudo-inertia.

    Rucker & Wensing, "Smooth parameterization of rigid-body inertia", IEEE RA-L 7(2), 2022.
    The pseudo-inertia of a body about the ORIGIN of its frame is the 4×4 matrix

        J = [[Σ, h], [hᵀ, m]],   Σ = ∫ x xᵀ dm = ½ tr(Ī) 1 − Ī,   h = m c,   m = ∫ dm,

    with Ī the inertia about the origin and c the centre of mass. A body is physically
    consistent (a nonnegative density exists) exactly when J ≻ 0 (Wensing, Kim & Slotine 2018),
    and J ≻ 0 exactly when J = U Uᵀ with U upper triangular with positive diagonal. The paper's
    10 parameters θ = (α, d₁, d₂, d₃, s₁₂, s₂₃, s₁₃, t₁, t₂, t₃) give

        U = e^α [[e^d₁, s₁₂, s₁₃, t₁],
                 [0,    e^d₂, s₂₃, t₂],
                 [0,    0,    e^d₃, t₃],
                 [0,    0,    0,    1 ]],

    so m = e^{2α}, c = t, and the second moment about the centre of mass Σ_c = Σ − m c cᵀ =
    m V Vᵀ with V the upper-left 3×3 block of U/e^α. Every real θ is a physical body and the
    map is smooth with a smooth inverse (:meth:`from_physical`), so gradients are finite
    wherever exp does not overflow (α ≲ 354, dᵢ ≲ 709 in float64).

    Raw leaves: ``alpha`` (...,), ``d`` (..., 3), ``s`` (..., 3) = (s₁₂, s₂₃, s₁₃) and
    ``t`` (..., 3) (separate leaves, so a fit can fix e.g. the centre of mass); :attr:`theta`
    stacks them in the paper's order and :meth:`from_theta` splits such a vector.

    Properties: :attr:`mass`, :attr:`com` (body frame), :attr:`inertia_com` (about the centre
    of mass, body axes: what ``rbjax.Body`` takes), :attr:`inertia_origin` Ī,
    :attr:`pseudo_inertia` J, :attr:`factor` U.

    rbjax bodies have their frame AT the centre of mass, so ``Body(p.mass, p.inertia_com)`` is
    the body. :attr:`com` is for users who identify a centre-of-mass offset relative to a
    reference frame (e.g. a CAD origin or a marker frame): a point p given in that frame is at
    p − com relative to the centre of mass, which is what ``PointForce.point_body``, joint
    points and marker offsets take.
    """

    alpha: Float[Array, "..."]
    d: Float[Array, "... 3"]
    s: Float[Array, "... 3"]
    t: Float[Array, "... 3"]

    @property
    def mass(self) -> Array:
        """m = e^{2α} [kg] (...,)."""
        return jnp.exp(2.0 * self.alpha)

    @property
    def com(self) -> Array:
        """c = t [m] (..., 3): centre of mass in the body frame."""
        return self.t

    @property
    def second_moment_com(self) -> Array:
        """Σ_c = ∫ (x − c)(x − c)ᵀ dm = m V Vᵀ (..., 3, 3) [kg m²]."""
        return _second_moment_com(self.alpha, self.d, self.s)

    @property
    def inertia_com(self) -> Array:
        """Θ = tr(Σ_c) 1 − Σ_c (..., 3, 3) [kg m²], about the centre of mass in body axes.

        Equal to the parallel-axis theorem Ī − m(|c|² 1 − c cᵀ) applied to
        :attr:`inertia_origin`, computed without its cancellation."""
        return _inertia_from_second(_second_moment_com(self.alpha, self.d, self.s))

    @property
    def inertia_origin(self) -> Array:
        """Ī = tr(Σ) 1 − Σ (..., 3, 3) [kg m²], about the origin of the body frame."""
        sig = _pseudo_inertia(self.alpha, self.d, self.s, self.t)[..., :3, :3]
        return _inertia_from_second(sig)

    @property
    def factor(self) -> Array:
        """U (..., 4, 4), upper triangular with positive diagonal, J = U Uᵀ."""
        return _factor(self.alpha, self.d, self.s, self.t)

    @property
    def pseudo_inertia(self) -> Array:
        """J = U Uᵀ = [[Σ, m c], [m cᵀ, m]] (..., 4, 4), symmetric positive definite."""
        return _pseudo_inertia(self.alpha, self.d, self.s, self.t)

    @property
    def theta(self) -> Array:
        """(α, d₁, d₂, d₃, s₁₂, s₂₃, s₁₃, t₁, t₂, t₃) (..., 10), the paper's order."""
        batch = jnp.broadcast_shapes(
            jnp.shape(self.alpha), self.d.shape[:-1], self.s.shape[:-1], self.t.shape[:-1]
        )
        parts = [
            jnp.broadcast_to(self.alpha, batch)[..., None],
            jnp.broadcast_to(self.d, batch + (3,)),
            jnp.broadcast_to(self.s, batch + (3,)),
            jnp.broadcast_to(self.t, batch + (3,)),
        ]
        return jnp.concatenate(parts, axis=-1)

    @classmethod
    def from_theta(cls, theta, *, dtype=None):
        """From the paper's parameter vector θ (..., 10) (any real values)."""
        field = "LogCholeskyInertia.from_theta(theta)"
        check_shape(field, theta, (10,))
        check_finite(field, theta, "pass 10 finite log-Cholesky parameters")
        out = _out_dtype("LogCholeskyInertia.from_theta", theta, dtype)
        th = jnp.asarray(theta, dtype=out)
        return cls(th[..., 0], th[..., 1:4], th[..., 4:7], th[..., 7:10])

    @classmethod
    def from_physical(cls, mass, com, inertia_com, *, dtype=None):
        """From mass m (...,) [kg] > 0, centre of mass ``com`` (..., 3) [m] in the body frame
        and the inertia about the centre of mass ``inertia_com`` (..., 3, 3) [kg m²] (symmetric
        positive definite, triangle inequalities: ``rbjax.Body``'s check); leading axes
        broadcast. ``dtype``: default the inertia's floating dtype.

        The upper factor is the reversed Cholesky factor: with P the reversal permutation,
        V = P chol(P S P) P is upper triangular and V Vᵀ = S = Σ_c / m. A flat lamina has a
        singular Σ_c; it is lifted to a smallest eigenvalue of 1e-12 tr Σ_c (as in
        :class:`PrincipalInertia`), so the raw values stay finite and Θ changes by
        2e-12 (½ tr Θ) 1."""
        mfield = "LogCholeskyInertia.from_physical(mass)"
        check_finite(mfield, mass, "pass a finite mass in kg")
        if is_concrete(mass) and np.any(np.asarray(mass, dtype=np.float64) <= 0.0):
            fail(mfield, mass, "is not > 0", "mass must be > 0 kg")
        cfield = "LogCholeskyInertia.from_physical(com)"
        check_shape(cfield, com, (3,))
        check_finite(cfield, com, "pass a finite centre of mass in m, in the body frame")
        validate_inertia("LogCholeskyInertia.from_physical(inertia_com)", inertia_com)
        out = _out_dtype("LogCholeskyInertia.from_physical", inertia_com, dtype)
        return cls(*_cast(_physical_core(_work(mass), _work(com), _work(inertia_com)), out))
