"""Pure-functional quaternion algebra (Möller & Glocker 2012, Sects. 2-3; Negrut ME751, E/G/B matrices).

Layout and conventions
----------------------
* A quaternion is an array of shape ``(..., 4)``, scalar FIRST: ``(a0, a1, a2, a3) = (a0, a)``
  (Möller & Glocker 2012, eq. (1)). Vectors are ``(..., 3)``, matrices ``(..., m, n)``. All leading axes
  broadcast against each other with the usual NumPy rules.
* Every function is pure, side-effect free and valid under ``jit``, ``vmap``, ``grad`` and
  ``jvp``. Wherever Möller & Glocker 2012 holds for NON-unit quaternions (products, conjugate, norm,
  inverse, phi, the rotation R and scale s = |A|^2 of eq. (23)), so do these functions.
* The arithmetic is NOT re-implemented here: each function moves the small component axis
  to the front, calls the component-first kernel of ``rbjax/_engine/kernels.py`` (or a private
  component-first kernel defined in this module for formulas ``_cf`` does not have), and
  moves the axis back. There is exactly one implementation of each formula.
* Functions with a removable singularity (``norm``, ``exp``, ``log``, ``slerp``,
  ``to_axis_angle``, ``from_axis_angle``) use the *safe-where* pattern: the singular branch
  is evaluated on a harmless dummy input, so both the value and the gradient are finite
  (no NaN leaks through ``jnp.where`` in the backward pass).

Sign conventions worth knowing
------------------------------
* ``phi(A)`` is the LEFT-multiplication matrix, psi(AB) = phi(A) psi(B) (eq. (15));
  ``phi_right(A)`` is the RIGHT-multiplication matrix, psi(BA) = phi_right(A) psi(B). They
  differ only in the sign of the skew block: ``a0 I + ã`` versus ``a0 I - ã``. Also
  T phi(A) T = phi_right(A*) (which is how eq. (21) is built).
* ``exp`` is the *quaternion* exponential of the pure quaternion (0, v): it represents a
  rotation by the angle ``2 |v|`` about ``v``. For a rotation vector ``w`` use ``exp(w / 2)``.
* ``log`` returns the SHORTEST branch (the sign of A is chosen so that a0 >= 0), so
  ``|log(A)| <= pi/2`` and ``2 log(A)`` is the rotation vector with angle in [0, pi].
  Consequently ``exp(log(A)) = ±A`` and ``log(exp(v)) = v`` for ``|v| < pi/2``.
* ME751's matrix ``A(p) = E(p) G(p)^T`` equals ``s R`` for a non-unit ``p`` (it is the
  *transform* matrix, not the pure rotation), and ``B(p, s̄)`` is its exact Jacobian
  ``∂(E G^T s̄)/∂p``.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from ._engine import kernels as _cf

# --------------------------------------------------------------------------- layout helpers


def _arr(x) -> Array:
    """``jnp.asarray`` that turns integer/bool input into the default float dtype."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        x = x.astype(jnp.result_type(float))
    return x


def _cf_in(x) -> Array:
    """(..., n) -> (n, ...): conventional layout to component-first."""
    return jnp.moveaxis(_arr(x), -1, 0)


def _cf_out(x: Array) -> Array:
    """(n, ...) -> (..., n): component-first back to the conventional layout."""
    return jnp.moveaxis(x, 0, -1)


def _mat_in(m) -> Array:
    """(..., m, n) -> (m, n, ...)."""
    return jnp.moveaxis(_arr(m), (-2, -1), (0, 1))


def _mat_out(m: Array) -> Array:
    """(m, n, ...) -> (..., m, n)."""
    return jnp.moveaxis(m, (0, 1), (-2, -1))


def _common_batch(*args):
    """Broadcast the leading (batch) axes of ``(array, core_ndim)`` pairs to a common shape.

    Needed before calling a ``_cf`` kernel with several operands: inside a kernel a per-batch
    scalar such as ``a[0]`` (shape S_a) multiplies a whole component-first vector ``x``
    (shape (3, *S_x)), which only broadcasts correctly when the batch ranks agree.
    """
    arrs = [_arr(x) for x, _ in args]
    cores = [k for _, k in args]
    batch = jnp.broadcast_shapes(*(x.shape[: x.ndim - k] for x, k in zip(arrs, cores, strict=True)))
    return [
        jnp.broadcast_to(x, batch + x.shape[x.ndim - k :]) for x, k in zip(arrs, cores, strict=True)
    ]


def _eps(x: Array) -> float:
    """Machine epsilon of ``x``'s dtype (a Python float, known at trace time)."""
    return float(jnp.finfo(x.dtype).eps)


def _safe_sqrt(x: Array) -> Array:
    """sqrt(x) for x >= 0 whose gradient is 0 (not inf/NaN) at x = 0."""
    pos = x > 0
    return jnp.where(pos, jnp.sqrt(jnp.where(pos, x, 1.0)), 0.0)


# ------------------------------------------------- private component-first kernels (new ones)


def _skew_cf(x):
    """x̃ with x̃ y = x × y (Möller & Glocker 2012, below eq. (5)); component-first (3, 3, ...)."""
    z = jnp.zeros_like(x[0])
    return _cf.stack(
        _cf.stack(z, -x[2], x[1]),
        _cf.stack(x[2], z, -x[0]),
        _cf.stack(-x[1], x[0], z),
    )


def _phi_cf(a):
    """phi(A) = [[a0, -a^T], [a, a0 I + ã]] (Möller & Glocker 2012, eq. (10)); (4, 4, ...)."""
    a0, a1, a2, a3 = a[0], a[1], a[2], a[3]
    return _cf.stack(
        _cf.stack(a0, -a1, -a2, -a3),
        _cf.stack(a1, a0, -a3, a2),
        _cf.stack(a2, a3, a0, -a1),
        _cf.stack(a3, -a2, a1, a0),
    )


def _phi_right_cf(a):
    """[[a0, -a^T], [a, a0 I - ã]]: psi(BA) = phi_right(A) psi(B); (4, 4, ...)."""
    a0, a1, a2, a3 = a[0], a[1], a[2], a[3]
    return _cf.stack(
        _cf.stack(a0, -a1, -a2, -a3),
        _cf.stack(a1, a0, a3, -a2),
        _cf.stack(a2, -a3, a0, a1),
        _cf.stack(a3, a2, -a1, a0),
    )


def _E_cf(p):
    """E(p) = [-e, ẽ + e0 I] (Negrut ME751); (3, 4, ...)."""
    e0, e1, e2, e3 = p[0], p[1], p[2], p[3]
    return _cf.stack(
        _cf.stack(-e1, e0, -e3, e2),
        _cf.stack(-e2, e3, e0, -e1),
        _cf.stack(-e3, -e2, e1, e0),
    )


def _G_cf(p):
    """G(p) = [-e, -ẽ + e0 I] (Negrut ME751); (3, 4, ...)."""
    e0, e1, e2, e3 = p[0], p[1], p[2], p[3]
    return _cf.stack(
        _cf.stack(-e1, e0, e3, -e2),
        _cf.stack(-e2, -e3, e0, e1),
        _cf.stack(-e3, e2, -e1, e0),
    )


def _B_cf(p, s):
    """B(p, s̄) = 2 [(e0 I + ẽ) s̄, e s̄^T - (e0 I + ẽ) s̄̃] (Negrut ME751); (3, 4, ...).

    Column 0 is 2 (e0 s̄ + e × s̄). With Lagrange's formula (Möller & Glocker 2012, eq. (26)),
    ẽ s̄̃ = s̄ e^T - (e^T s̄) I, so the 3x3 block is
    2 (e s̄^T - s̄ e^T + (e^T s̄) I - e0 s̄̃), which is what is evaluated here.
    """
    e0 = p[0]
    e = p[1:4]
    col0 = e0 * s + _cf.cross(e, s)
    es = _cf.dot3(e, s)
    st = _skew_cf(s)
    rows = []
    for i in range(3):
        blk = [e[i] * s[j] - s[i] * e[j] - e0 * st[i][j] for j in range(3)]
        blk[i] = blk[i] + es
        rows.append(_cf.stack(col0[i], *blk))
    return 2.0 * _cf.stack(*rows)


# --------------------------------------------------------------------------- §2 algebra


def mul(a: Float[ArrayLike, "... 4"], b: Float[ArrayLike, "... 4"]) -> Float[Array, "... 4"]:
    """Quaternion product AB = (a0 b0 - a^T b, a0 b + b0 a + ã b) (Möller & Glocker 2012, eq. (5)).

    Shapes ``(..., 4)`` x ``(..., 4)`` -> broadcast ``(..., 4)``. Not commutative.
    """
    return _cf_out(_cf.qmul(_cf_in(a), _cf_in(b)))


def conjugate(a: Float[ArrayLike, "... 4"]) -> Float[Array, "... 4"]:
    """A* = (a0, -a) (Möller & Glocker 2012, eq. (2)). ``(..., 4) -> (..., 4)``."""
    return _cf_out(_cf.qconj(_cf_in(a)))


def norm2(a: Float[ArrayLike, "... 4"]) -> Float[Array, "..."]:
    """|A|^2 = a0^2 + a^T a (Möller & Glocker 2012, eqs. (7)-(8)). ``(..., 4) -> (...)``."""
    return _cf.qnorm2(_cf_in(a))


def norm(a: Float[ArrayLike, "... 4"]) -> Float[Array, "..."]:
    """|A| = sqrt(a0^2 + a^T a) (Möller & Glocker 2012, eq. (7)). ``(..., 4) -> (...)``.

    Uses a safe square root: at A = 0 the value is 0 and the gradient is 0 (finite).
    """
    return _safe_sqrt(norm2(a))


def inverse(a: Float[ArrayLike, "... 4"]) -> Float[Array, "... 4"]:
    """A^{-1} = A* / |A|^2 for A != 0 (Möller & Glocker 2012, eq. (9)). ``(..., 4) -> (..., 4)``."""
    q = _cf_in(a)
    return _cf_out(_cf.qconj(q) / _cf.qnorm2(q))


def phi(a: Float[ArrayLike, "... 4"]) -> Float[Array, "... 4 4"]:
    """Left-multiplication matrix phi(A) = [[a0, -a^T], [a, a0 I + ã]] (Möller & Glocker 2012, eq. (10)).

    psi(AB) = phi(A) psi(B) (eq. (15)); phi(A*) = phi(A)^T (eq. (11));
    phi(AB) = phi(A) phi(B) (eq. (12)); phi^{-1}(A) = phi(A)^T / |A|^2 (eq. (13)).
    ``(..., 4) -> (..., 4, 4)``.
    """
    return _mat_out(_phi_cf(_cf_in(a)))


def phi_right(a: Float[ArrayLike, "... 4"]) -> Float[Array, "... 4 4"]:
    """Right-multiplication matrix [[a0, -a^T], [a, a0 I - ã]]: psi(BA) = phi_right(A) psi(B).

    The counterpart of phi (Möller & Glocker 2012, eqs. (10), (15)); only the sign of the skew block
    differs, because BA = (a0 b0 - a^T b, a0 b + b0 a - ã b) by eq. (5). It satisfies
    T phi(A) T = phi_right(A*) (eqs. (16), (21)) and commutes with phi.
    ``(..., 4) -> (..., 4, 4)``.
    """
    return _mat_out(_phi_right_cf(_cf_in(a)))


T_MATRIX: Float[np.ndarray, "4 4"] = np.diag([1.0, -1.0, -1.0, -1.0])
"""T = diag(1, -1, -1, -1), psi(A*) = T psi(A) (Möller & Glocker 2012, eqs. (16)-(17)).

A read-only NumPy float64 constant (so its dtype does not depend on whether x64 was enabled
when this module was imported); cast it, e.g. ``jnp.asarray(T_MATRIX, q.dtype)``.
"""
T_MATRIX.flags.writeable = False


def psi(a: Float[ArrayLike, "... 4"]) -> Float[Array, "... 4"]:
    """psi(A) = (a0, a) in R^4 (Möller & Glocker 2012, eq. (14)).

    Because quaternions are already stored as ``(..., 4)`` arrays, psi is the identity on
    the array: it returns ``a`` unchanged (as a JAX array). Provided so that formulas such as
    psi(AB) = phi(A) psi(B) read like the paper.
    """
    return jnp.asarray(a)


def identity(dtype=None) -> Float[Array, "4"]:
    """The unit quaternion (1, 0, 0, 0), shape ``(4,)``; ``dtype`` defaults to JAX's float."""
    return jnp.asarray([1.0, 0.0, 0.0, 0.0], dtype=dtype)


def skew(x: Float[ArrayLike, "... 3"]) -> Float[Array, "... 3 3"]:
    """Cross-product matrix x̃ = [[0, -x3, x2], [x3, 0, -x1], [-x2, x1, 0]], x̃ y = x × y.

    (Möller & Glocker 2012, below eq. (5)). ``(..., 3) -> (..., 3, 3)``.
    """
    return _mat_out(_skew_cf(_cf_in(x)))


# --------------------------------------------------------------------- §3 rotation, scaling


def scale(a: Float[ArrayLike, "... 4"]) -> Float[Array, "..."]:
    """Scaling factor s = |A|^2 (Möller & Glocker 2012, eq. (23)). ``(..., 4) -> (...)``."""
    return norm2(a)


def rotation_matrix(a: Float[ArrayLike, "... 4"]) -> Float[Array, "... 3 3"]:
    """Pure rotation R of A, valid for any A != 0 (Möller & Glocker 2012, eq. (23)).

    R = (a  a0 I + ã)(a^T ; a0 I + ã) / |A|^2
      = ((a0^2 - a^T a) I + 2 a a^T + 2 a0 ã) / |A|^2,
    so R R^T = I and det R = 1 (eq. (25)) for every non-zero A. ``(..., 4) -> (..., 3, 3)``.
    """
    q = _cf_in(a)
    return _mat_out(_cf.transform_matrix(q) / _cf.qnorm2(q))


def to_matrix(a: Float[ArrayLike, "... 4"]) -> Float[Array, "... 3 3"]:
    """Alias of :func:`rotation_matrix` (Möller & Glocker 2012, eq. (23)): R(A), for any A != 0."""
    return rotation_matrix(a)


def rotation_and_scale(
    a: Float[ArrayLike, "... 4"],
) -> tuple[Float[Array, "... 3 3"], Float[Array, "..."]]:
    """(R, s) with A (0, x) A* = (0, s R x) (Möller & Glocker 2012, eqs. (23), (27)).

    ``(..., 4) -> ((..., 3, 3), (...))``.
    """
    q = _cf_in(a)
    s = _cf.qnorm2(q)
    return _mat_out(_cf.transform_matrix(q) / s), s


def transform(a: Float[ArrayLike, "... 4"], x: Float[ArrayLike, "... 3"]) -> Float[Array, "... 3"]:
    """y = s R x, the imaginary part of A (0, x) A* (Möller & Glocker 2012, eqs. (18), (24), (27)).

    Rotates AND scales x by s = |A|^2. ``(..., 4), (..., 3) -> (..., 3)``.
    """
    a, x = _common_batch((a, 1), (x, 1))
    return _cf_out(_cf.transform(_cf_in(a), _cf_in(x)))


def rotate(a: Float[ArrayLike, "... 4"], x: Float[ArrayLike, "... 3"]) -> Float[Array, "... 3"]:
    """R x: the pure rotation of A applied to x, for any A != 0 (Möller & Glocker 2012, eqs. (23)-(24)).

    ``(..., 4), (..., 3) -> (..., 3)``.
    """
    a, x = _common_batch((a, 1), (x, 1))
    return _cf_out(_cf.rotate(_cf_in(a), _cf_in(x)))


def rotate_inverse(
    a: Float[ArrayLike, "... 4"], x: Float[ArrayLike, "... 3"]
) -> Float[Array, "... 3"]:
    """R^T x (inverse rotation, eqs. (23), (25)); equals the imaginary part of A*(0,x)A / s.

    ``(..., 4), (..., 3) -> (..., 3)``.
    """
    a, x = _common_batch((a, 1), (x, 1))
    return _cf_out(_cf.rotate_t(_cf_in(a), _cf_in(x)))


def from_axis_angle(
    axis: Float[ArrayLike, "... 3"],
    angle: Float[ArrayLike, "..."] | float,
    scale: Float[ArrayLike, "..."] | float = 1.0,
) -> Float[Array, "... 4"]:
    """A = (sqrt(s) cos(phi/2), n sqrt(s) sin(phi/2)) (Möller & Glocker 2012, eq. (30), the + sign).

    ``n = axis / |axis|`` is normalised internally; A then satisfies
    A (0, x) A* = (0, s R x) with R the Rodrigues matrix of eq. (28). A zero ``axis`` is
    allowed (safe normalisation): it gives (sqrt(s) cos(phi/2), 0), in particular the identity
    for a zero angle, with finite gradients. ``(..., 3), (...), (...) -> (..., 4)``.
    """
    v = _cf_in(axis)
    angle = _arr(angle)
    n2 = _cf.dot3(v, v)
    pos = n2 > 0
    inv_n = jnp.where(pos, 1.0 / jnp.sqrt(jnp.where(pos, n2, 1.0)), 0.0)
    rs = jnp.sqrt(_arr(scale))
    half = 0.5 * angle
    c = rs * jnp.cos(half)
    sn = rs * jnp.sin(half) * inv_n
    return _cf_out(_cf.stack(c, sn * v[0], sn * v[1], sn * v[2]))


def to_axis_angle(
    a: Float[ArrayLike, "... 4"],
) -> tuple[Float[Array, "... 3"], Float[Array, "..."]]:
    """Unit axis n and angle phi in [0, pi] with A = ±sqrt(s)(cos(phi/2), n sin(phi/2)).

    Inverse of eq. (30) (Möller & Glocker 2012): the sign of A is chosen so that a0 >= 0 (by the sign
    bit, so A and -A give the same result even at 180°, where a0 = ±0), then
    phi = 2 atan2(|a|, a0) and n = a / |a|. Works for non-unit A (the scale s = |A|^2 is
    :func:`scale`). At a zero rotation (a = 0) the axis is undefined; (1, 0, 0) is returned
    and the gradients stay finite (safe-where). ``(..., 4) -> ((..., 3), (...))``.
    """
    q = _cf_in(a)
    sgn = jnp.where(jnp.signbit(q[0]), -1.0, 1.0)
    a0 = sgn * q[0]
    v = sgn * q[1:4]
    n2 = _cf.dot3(v, v)
    pos = n2 > 0
    n = _safe_sqrt(n2)
    inv_n = jnp.where(pos, 1.0 / jnp.where(pos, n, 1.0), 0.0)
    one = jnp.ones_like(n2)
    zero = jnp.zeros_like(n2)
    axis = _cf.stack(
        jnp.where(pos, v[0] * inv_n, one),
        jnp.where(pos, v[1] * inv_n, zero),
        jnp.where(pos, v[2] * inv_n, zero),
    )
    angle = 2.0 * jnp.arctan2(n, a0)
    return _cf_out(axis), angle


def from_matrix(R: Float[ArrayLike, "... 3 3"]) -> Float[Array, "... 4"]:
    """Unit quaternion A with rotation_matrix(A) = R, robust at every angle incl. 180°.

    Shepperd's / Markley's method (the inverse of Möller & Glocker 2012, eqs. (23), (28)-(30)): with
    t0 = 1 + tr R = 4 a0^2 and t_k = 1 + 2 R_kk - tr R = 4 a_k^2 (unit A), take the branch
    k with the largest t_k (always >= 1 for a rotation, since sum t = 4, so no square root
    or division ever sees a small number) and read the other components from the
    (anti)symmetric parts of R:

        k=0: (t0, R21-R12, R02-R20, R10-R01) / (2 sqrt t0)
        k=1: (R21-R12, t1, R01+R10, R02+R20) / (2 sqrt t1)   ... etc.

    The result is normalised (absorbing slight non-orthogonality of R) and its sign chosen
    so that a0 >= 0 (at exactly 180° a0 = 0 and either sign may come out).
    ``(..., 3, 3) -> (..., 4)``.
    """
    m = _mat_in(R)
    r00, r11, r22 = m[0][0], m[1][1], m[2][2]
    tr = r00 + r11 + r22
    t = _cf.stack(1.0 + tr, 1.0 + 2.0 * r00 - tr, 1.0 + 2.0 * r11 - tr, 1.0 + 2.0 * r22 - tr)
    k = jnp.argmax(t, axis=0)
    d21, d02, d10 = m[2][1] - m[1][2], m[0][2] - m[2][0], m[1][0] - m[0][1]
    s01, s02, s12 = m[0][1] + m[1][0], m[0][2] + m[2][0], m[1][2] + m[2][1]
    cands = (
        _cf.stack(t[0], d21, d02, d10),
        _cf.stack(d21, t[1], s01, s02),
        _cf.stack(d02, s01, t[2], s12),
        _cf.stack(d10, s02, s12, t[3]),
    )
    q = cands[3]
    tk = t[3]
    for i in (2, 1, 0):
        q = jnp.where(k == i, cands[i], q)
        tk = jnp.where(k == i, t[i], tk)
    # tk >= 1 for a valid rotation; the guard only protects garbage input from NaN.
    q = q / (2.0 * jnp.sqrt(jnp.maximum(tk, _eps(tk))))
    q = q / jnp.sqrt(_cf.qnorm2(q))
    q = jnp.where(q[0] < 0, -q, q)
    return _cf_out(q)


# -------------------------------------------------------------------- exp / log / slerp


def exp(v: Float[ArrayLike, "... 3"]) -> Float[Array, "... 4"]:
    """Quaternion exponential of the pure quaternion (0, v): (cos|v|, v sin|v| / |v|).

    The unit quaternion of a rotation by the angle 2|v| about v (Möller & Glocker 2012, eq. (30) with
    s = 1, phi = 2|v|); for a rotation vector w use ``exp(w / 2)``. Near |v| = 0 the Taylor
    series cos θ ≈ 1 - θ²/2 + θ⁴/24, sin θ/θ ≈ 1 - θ²/6 + θ⁴/120 is used below the
    dtype-aware threshold θ < eps^(1/4) (truncation error ~θ⁶ << eps), and the exact branch
    sees a dummy input there, so value and gradient are finite at v = 0.
    ``(..., 3) -> (..., 4)``.
    """
    x = _cf_in(v)
    th2 = _cf.dot3(x, x)
    small = th2 < _eps(th2) ** 0.5
    th = jnp.sqrt(jnp.where(small, 1.0, th2))
    c = jnp.where(small, 1.0 - th2 / 2.0 + th2 * th2 / 24.0, jnp.cos(th))
    sinc = jnp.where(small, 1.0 - th2 / 6.0 + th2 * th2 / 120.0, jnp.sin(th) / th)
    return _cf_out(_cf.stack(c, sinc * x[0], sinc * x[1], sinc * x[2]))


def log(a: Float[ArrayLike, "... 4"]) -> Float[Array, "... 3"]:
    """Logarithm of a unit quaternion as a 3-vector: log(A) = a atan2(|a|, a0) / |a|.

    Inverse of :func:`exp`. BRANCH: the shortest one -- A is first replaced by -A if
    a0 < 0 (both represent the same rotation, Möller & Glocker 2012 eq. (30) and the remark after (31));
    the test is on the sign BIT, so a0 = -0.0 is flipped too and log(-A) = log(A) holds
    exactly even for 180° rotations (where ±a pi/2 are equally valid),
    so |log(A)| in [0, pi/2], ``2 log(A)`` is the rotation vector with angle in [0, pi],
    and log(-1) = log(1) = 0. Hence exp(log(A)) = ±A and log(exp(v)) = v for |v| < pi/2.
    atan2 makes the result invariant to a positive scale of A, so for a non-unit A it is the
    log of A/|A|. Near a = 0 the Taylor series atan(x)/x ≈ 1 - x²/3 + x⁴/5 (x = |a|/a0)
    is used, so value and gradient are finite at the identity. ``(..., 4) -> (..., 3)``.
    """
    q = _cf_in(a)
    sgn = jnp.where(jnp.signbit(q[0]), -1.0, 1.0)
    a0 = sgn * q[0]
    v = sgn * q[1:4]
    n2 = _cf.dot3(v, v)
    thr2 = _eps(n2) ** 0.5
    small = (n2 <= thr2 * a0 * a0) & (a0 > 0)
    a0s = jnp.where(small, a0, 1.0)
    x2 = n2 / (a0s * a0s)
    f_taylor = (1.0 - x2 / 3.0 + x2 * x2 / 5.0) / a0s
    big_ok = ~small & (n2 > 0)
    n = jnp.sqrt(jnp.where(big_ok, n2, 1.0))
    f_exact = jnp.where(big_ok, jnp.arctan2(n, a0) / n, 0.0)
    f = jnp.where(small, f_taylor, f_exact)
    return _cf_out(f * v)


def slerp(
    a: Float[ArrayLike, "... 4"], b: Float[ArrayLike, "... 4"], t: Float[ArrayLike, "..."] | float
) -> Float[Array, "... 4"]:
    """Spherical linear interpolation of unit quaternions along the SHORTEST path.

    If psi(A).psi(B) < 0, B is replaced by -B (same rotation). With theta the angle between
    psi(A) and psi(B) on the unit sphere S³ (half the relative rotation angle), computed as
    theta = 2 atan2(|A - B|, |A + B|) (accurate at every angle, unlike acos),

        slerp = (sin((1-t) theta) A + sin(t theta) B) / sin(theta),

    so the rotation angle from A grows linearly in t (constant angular speed). When A and B
    are nearly parallel (theta < eps^(1/4)) it falls back to a normalised lerp with weights
    k (1 + (1 - k²) theta²/6), k in {1-t, t} (the Taylor series of sin(k theta)/sin theta),
    evaluated on a dummy input otherwise, so value and gradient are finite everywhere
    (including A = ±B). t = 0 gives A, t = 1 gives ±B. ``(..., 4), (..., 4), (...) -> (..., 4)``.
    """
    a, b, t = _common_batch((a, 1), (b, 1), (t, 0))
    qa = _cf_in(a)
    qb = _cf_in(b)
    qb = jnp.where(_cf.qdot4(qa, qb) < 0, -qb, qb)
    dm = qa - qb
    dp = qa + qb
    m2 = _cf.qnorm2(dm)
    p2 = _cf.qnorm2(dp)
    small = m2 < _eps(m2) ** 0.5
    # exact branch (dummy input where small): p2 >= 2 for unit inputs after the sign flip
    m = jnp.sqrt(jnp.where(small, 1.0, m2))
    p = jnp.sqrt(jnp.where(small, 1.0, p2))
    th = 2.0 * jnp.arctan2(m, p)
    sth = jnp.sin(th)
    wa_exact = jnp.sin((1.0 - t) * th) / sth
    wb_exact = jnp.sin(t * th) / sth
    # nearly parallel: theta² ≈ |A - B|² (error O(theta⁴))
    u = 1.0 - t
    wa_small = u * (1.0 + (1.0 - u * u) * m2 / 6.0)
    wb_small = t * (1.0 + (1.0 - t * t) * m2 / 6.0)
    wa = jnp.where(small, wa_small, wa_exact)
    wb = jnp.where(small, wb_small, wb_exact)
    q = wa * qa + wb * qb
    q_norm = jnp.where(small, q / jnp.sqrt(_cf.qnorm2(q)), q)
    return _cf_out(q_norm)


# --------------------------------------------------------------- Negrut ME751: E, G, A, B matrices


def E(p: Float[ArrayLike, "... 4"]) -> Float[Array, "... 3 4"]:
    """E(p) = [-e, ẽ + e0 I] for p = (e0, e) (Negrut ME751). ``(..., 4) -> (..., 3, 4)``.

    Properties: E p = 0, E E^T = |p|^2 I, and E = (0 I) phi_right(p)^T.
    """
    return _mat_out(_E_cf(_cf_in(p)))


def G(p: Float[ArrayLike, "... 4"]) -> Float[Array, "... 3 4"]:
    """G(p) = [-e, -ẽ + e0 I] for p = (e0, e) (Negrut ME751). ``(..., 4) -> (..., 3, 4)``.

    Properties: G p = 0, G G^T = |p|^2 I, and G = (0 I) phi(p)^T.
    """
    return _mat_out(_G_cf(_cf_in(p)))


def A_matrix(p: Float[ArrayLike, "... 4"]) -> Float[Array, "... 3 3"]:
    """A(p) = E(p) G(p)^T (Negrut ME751) = s R (Möller & Glocker 2012, eqs. (22)-(23)).

    For a unit p this is the rotation matrix; for a non-unit p it is the TRANSFORM matrix
    s R with s = |p|^2 (not the pure rotation; use :func:`rotation_matrix` for R).
    ``(..., 4) -> (..., 3, 3)``.
    """
    return _mat_out(_cf.transform_matrix(_cf_in(p)))


def B(p: Float[ArrayLike, "... 4"], sbar: Float[ArrayLike, "... 3"]) -> Float[Array, "... 3 4"]:
    """B(p, s̄) = ∂(A(p) s̄)/∂p = 2 [(e0 I + ẽ) s̄,  e s̄^T - (e0 I + ẽ) s̄̃] (Negrut ME751).

    A(p) = E(p) G(p)^T is the transform matrix of :func:`A_matrix`; the formula is the exact
    Jacobian for ANY p (no unit-norm assumption), i.e. it equals
    ``jax.jacfwd(lambda p: A_matrix(p) @ sbar)(p)``. ``(..., 4), (..., 3) -> (..., 3, 4)``.
    """
    p, sbar = _common_batch((p, 1), (sbar, 1))
    return _mat_out(_B_cf(_cf_in(p), _cf_in(sbar)))
