"""Joints: the basic constraints of Negrut ME751 composed into the usual kinematic pairs.

Every joint connects a joint frame on body i, (s̄_i; x̄_i, ȳ_i, z̄_i), to one on body j,
(s̄_j; x̄_j, ȳ_j, z̄_j), all in body axes, with ȳ = z̄ × x̄. z̄ is the joint axis (hinge axis,
slider direction). With the world vectors a = A ā and d_ij = r_j + A_j s̄_j − r_i − A_i s̄_i
the residuals are (ME751, Negrut ME751 "joints from basic constraints"):

==============  ====  =======================================================================
joint           rows  residual (each line one basic constraint)
==============  ====  =======================================================================
Spherical       3     d_ij = 0                                      (3 × CD)
Revolute        5     d_ij = 0;  z_iᵀx_j = 0, z_iᵀy_j = 0             (3 CD + 2 DP1)
Universal       4     d_ij = 0;  z_iᵀz_j = 0 (the two pins stay ⟂)  (3 CD + DP1)
Cylindrical     4     z_iᵀx_j = z_iᵀy_j = 0;  x_iᵀd_ij = y_iᵀd_ij = 0 (2 DP1 + 2 DP2)
Translational   5     Cylindrical;  x_iᵀy_j = 0                      (3 DP1 + 2 DP2)
Fixed           6     d_ij = 0;  z_iᵀx_j = z_iᵀy_j = x_iᵀy_j = 0     (3 CD + 3 DP1)
Distance        1     d_ijᵀd_ij − L² = 0                             (D)
Parallel        2     z_iᵀx_j = z_iᵀy_j = 0                          (2 DP1)
Perpendicular   1     z_iᵀz_j = 0                                    (DP1)
PointOnLine     2     x_iᵀd_ij = y_iᵀd_ij = 0                        (2 DP2)
RotationDriver  1     (y_iᵀx_j) cos θ(t) − (x_iᵀx_j) sin θ(t) = 0    (angle of x_j about z_i)
TranslationDriver 1   z_iᵀd_ij − f(t) = 0                            (DP2 with driver)
==============  ====  =======================================================================

The rotation driver's residual is sin(φ − θ) for the actual angle φ of x_j from x_i about z_i:
smooth for every θ (no branch of atan2), and zero with a full-rank row at φ = θ.

Build a joint either in body axes (``Revolute(i, j, s_i=..., s_j=..., z_i=..., z_j=...)``) or,
usually simpler, from a reference configuration and world-frame data with ``.at(q, i, j,
point=..., axis=...)``, which converts the world point and axis into each body's axes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ._constraints import GROUND, AbstractConstraint, _check_f, _vec, _zero, axis, point
from ._engine import kernels as cf
from ._errors import Rule, enforce, nonzero, perpendicular, perpendicular_tol, validates_inputs


def _unit(name, x):
    """x / |x| for a finite direction of any magnitude: where |x| overflows (components of
    1e154 and more) or underflows, the norm is taken of x scaled by its largest component
    (elsewhere x / |x| as computed directly: a unit vector comes back bit for bit).
    ValueError when x is not finite or |x| <= 1e-12, zero or the rounding of zero (the bound
    of the rule :func:`rbjax._errors.nonzero` that the stored axes obey)."""
    x = np.asarray(x, dtype=float)
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name} = {x.tolist()} is not finite. Fix: give a finite direction.")
    with np.errstate(over="ignore", under="ignore"):
        n = float(np.linalg.norm(x))
    if np.isfinite(n) and n > 1e-100:
        unit = x / n
    else:
        big = float(np.max(np.abs(x))) if x.size else 0.0
        scaled = x / big if big > 0 else x
        n = big * float(np.linalg.norm(scaled))
        unit = scaled / np.linalg.norm(scaled) if big > 0 else x
    if not n > 1e-12:
        raise ValueError(
            f"{name} = {x.tolist()} has zero length (|{name}| = {n:.3g} <= 1e-12: zero or the "
            "rounding of zero). Fix: give a direction vector."
        )
    return unit


def _dtype_of(*vectors):
    """The floating dtype the caller gave directions in (float64 for lists and integers):
    float32 frames are perpendicular only to float32 rounding."""
    kinds = [np.dtype(getattr(v, "dtype", np.float64)) for v in vectors if v is not None]
    kind = np.result_type(*kinds) if kinds else np.dtype(np.float64)
    return kind if np.issubdtype(kind, np.floating) else np.dtype(np.float64)


_AXES = ("z_i", "z_j", "x_i", "x_j")


def _perpendicular(z):
    """A unit vector ⟂ z: the world axis least aligned with z, orthogonalised."""
    e = np.eye(3)[int(np.argmin(np.abs(z)))]
    x = e - np.dot(e, z) * z
    return x / np.linalg.norm(x)


def _frame_vectors(name, z, x, kind):
    """Validate (z, x) in body axes; default x ⟂ z. Returns unit z and unit x with xᵀz = 0
    to :func:`rbjax._errors.perpendicular_tol` of ``kind``, the dtype they were given in."""
    z = _unit(f"{name}.z", z)
    if x is None:
        return z, _perpendicular(z)
    tol = perpendicular_tol(kind)
    x = _unit(f"{name}.x", x)
    if abs(np.dot(x, z)) > tol:
        raise ValueError(
            f"{name}: x = {x.tolist()} is not perpendicular to z = {z.tolist()} "
            f"(xᵀz = {np.dot(x, z):.3g}). Fix: give a reference direction x ⟂ z, or omit x."
        )
    return z, x


class AbstractJoint(AbstractConstraint):
    """A joint between two joint frames (point s̄, axes x̄, z̄ in body axes; ȳ = z̄ × x̄).

    Unlike the other abstract bases this one holds fields and a constructor: the twelve final
    joints share exactly these frame fields and their validation, and keeping them flat keeps
    every user's parameter path (``m.joints[k].s_i``) short (docs/devdocs/architecture.md,
    "Deviations").
    """

    body_i: int | str = eqx.field(static=True)
    body_j: int | str = eqx.field(static=True)
    name: str = eqx.field(static=True)
    _pins_perpendicular: ClassVar[bool] = False  # .at(): z_j from x (Universal, Perpendicular)
    s_i: Float[Array, "3"]
    s_j: Float[Array, "3"]
    z_i: Float[Array, "3"]
    z_j: Float[Array, "3"]
    x_i: Float[Array, "3"]
    x_j: Float[Array, "3"]

    # the frames' conditions on the stored axes, checked at build time (__check_init__) and,
    # traced, inside a rollout's program
    _rules: ClassVar[tuple[Rule, ...]] = (
        *(Rule((f,), nonzero, "has zero length", "give a direction vector") for f in _AXES),
        *(
            Rule(
                (f"x_{s}", f"z_{s}"),
                perpendicular,
                f"is not perpendicular to z_{s}",
                "give a reference direction x ⟂ z, or omit x",
            )
            for s in "ij"
        ),
    )

    def __init__(
        self,
        body_i,
        body_j,
        *,
        s_i=(0.0, 0.0, 0.0),
        s_j=(0.0, 0.0, 0.0),
        z_i=(0.0, 0.0, 1.0),
        z_j=None,
        x_i=None,
        x_j=None,
        name: str | None = None,
    ):
        name = type(self).__name__ if name is None else name
        self.body_i, self.body_j, self.name = body_i, body_j, name
        # the directions are checked and stored in the dtype they were given in: the frame
        # rule then reads them to its rounding
        kind = _dtype_of(z_i, z_j, x_i, x_j)
        zi, xi = _frame_vectors(f"{name} (body i frame)", z_i, x_i, kind)
        zj, xj = _frame_vectors(f"{name} (body j frame)", zi if z_j is None else z_j, x_j, kind)
        if z_j is None and x_j is None:
            xj = xi
        self.s_i, self.s_j = _vec(f"{name}.s_i", s_i), _vec(f"{name}.s_j", s_j)
        self.z_i, self.z_j = (
            _vec(f"{name}.{f}", v.astype(kind)) for f, v in (("z_i", zi), ("z_j", zj))
        )
        self.x_i, self.x_j = (
            _vec(f"{name}.{f}", v.astype(kind)) for f, v in (("x_i", xi), ("x_j", xj))
        )

    def __check_init__(self):
        enforce(self, self.name)

    @classmethod
    def at(cls, q, body_i, body_j, *, point, axis=(0.0, 0.0, 1.0), x=None, name=None, **kwargs):
        """Build the joint from a reference configuration q (nb, 7) and world-frame data.

        ``point`` is the joint origin and ``axis`` the joint axis z in world coordinates (in the
        configuration q), ``x`` an optional world reference direction ⟂ axis (default: any). The
        joint frames in body axes are s̄ = Aᵀ(point − r), z̄ = Aᵀ axis, x̄ = Aᵀ x, so the joint
        is satisfied exactly in q. For :class:`Universal` and :class:`Perpendicular`, whose two
        axes must be perpendicular, ``axis`` is body i's pin and ``x`` body j's. Other keyword
        arguments go to the constructor.
        """
        q = np.asarray(q, dtype=float)
        if q.ndim != 2 or q.shape[-1] != 7:
            raise ValueError(
                f"{cls.__name__}.at: q has shape {q.shape}, expected (nb, 7). "
                "Fix: pass one system's coordinates, e.g. state.q."
            )
        z, x_given = _unit(f"{cls.__name__}.at axis", axis), x
        x = _perpendicular(z) if x is None else _unit(f"{cls.__name__}.at x", x)
        pnt = np.asarray(point, dtype=float)
        kind = _dtype_of(axis, x_given)  # directions stay in the dtype they were given in

        def body_frame(b):
            if b == GROUND:
                return pnt, z.astype(kind), x.astype(kind)
            if not isinstance(b, (int, np.integer)) or not 0 <= b < q.shape[0]:
                raise ValueError(
                    f"{cls.__name__}.at: body {b!r} is not an index into q (nb = {q.shape[0]}) "
                    "or GROUND. Fix: use integer body indices with .at()."
                )
            r, a = q[b, 0:3], q[b, 3:7] / np.linalg.norm(q[b, 3:7])
            rot = _rot_np(a)
            return rot.T @ (pnt - r), (rot.T @ z).astype(kind), (rot.T @ x).astype(kind)

        si, zi, xi = body_frame(body_i)
        sj, zj, xj = body_frame(body_j)
        if cls._pins_perpendicular:  # body j's pin is the reference direction x ⟂ axis
            zj, xj = xj, zj
        return cls(
            body_i, body_j, s_i=si, s_j=sj, z_i=zi, z_j=zj, x_i=xi, x_j=xj, name=name, **kwargs
        )

    def frames(self, qi, qj):
        """World axes (x, y, z) of both joint frames, component-first."""
        xi, zi = axis(qi, self.x_i), axis(qi, self.z_i)
        xj, zj = axis(qj, self.x_j), axis(qj, self.z_j)
        return (xi, cf.cross(zi, xi), zi), (xj, cf.cross(zj, xj), zj)

    def d(self, qi, qj):
        return point(qj, self.s_j) - point(qi, self.s_i)

    def frame(self):
        def rot(x, z):
            return jnp.stack([x, jnp.cross(z, x), z], axis=-1)

        return self.s_i, self.s_j, rot(self.x_i, self.z_i), rot(self.x_j, self.z_j)


def _rot_np(a):
    """R(A) of a unit quaternion (w, x, y, z) as a float64 NumPy matrix (build-time helper;
    Möller & Glocker 2012 eq. (23)). In NumPy, not jnp: joint frames built from it must be
    perpendicular to float64 rounding even when JAX runs in float32 (measured: jnp in float32
    left xᵀz = 3e-8 on an imported arm, which the 1e-9 frame check rejects)."""
    w, x, y, z = np.asarray(a, dtype=np.float64)
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ]
    )


def _configuration(where: str, q0) -> np.ndarray:
    """One system's coordinates q0 (nb, 7) as float64 NumPy (ValueError naming the fix)."""
    try:
        q0 = np.asarray(q0, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(
            f"{where}: q0 = {q0!r} is not an array of coordinates. Fix: pass one system's "
            "coordinates (nb, 7), e.g. state.q."
        ) from None
    if q0.ndim != 2 or q0.shape[-1] != 7:
        raise ValueError(
            f"{where}: q0 has shape {q0.shape}, expected (nb, 7). Fix: pass one system's "
            "coordinates, e.g. state.q (for a batch, one member: state.q[0])."
        )
    if not np.all(np.isfinite(q0)):
        raise ValueError(f"{where}: q0 is not finite. Fix: pass finite coordinates.")
    return q0


def _placement(where: str, side: str, q0: np.ndarray, b, names):
    """(r, A) of the joint's body ``side`` in q0: position and the 3x3 transform A = s R
    (GROUND: 0, I). A body name resolves against ``names``."""
    if isinstance(b, str):
        if names is None:
            raise ValueError(
                f"{where}: joint.{side} = {b!r} is a body name, and no names were given to "
                "find it in q0. Fix: pass names=model.names (or build the joint with indices)."
            )
        if b not in tuple(names):
            raise ValueError(
                f"{where}: joint.{side} = {b!r} is not in names = {list(names)}. Fix: use one "
                "of these names, or pass the names of the model the joint belongs to."
            )
        b = tuple(names).index(b)
    if isinstance(b, bool) or not isinstance(b, (int, np.integer)):
        raise ValueError(
            f"{where}: joint.{side} = {b!r} is not a body. Fix: use a body index, a body name "
            "or rbjax.GROUND."
        )
    if b == GROUND:
        return np.zeros(3), np.eye(3)
    if not 0 <= b < q0.shape[0]:
        raise ValueError(
            f"{where}: joint.{side} = {b} is not a body of q0 (nb = {q0.shape[0]}). Fix: pass "
            "the coordinates of the model the joint belongs to."
        )
    a = q0[b, 3:7]
    s = float(a @ a)
    if not s > 0.0:
        raise ValueError(f"{where}: q0[{b}, 3:7] is zero. Fix: give a nonzero quaternion.")
    return q0[b, 0:3], s * _rot_np(a / np.sqrt(s))


def _aligned_axes(where: str, joint, A_i, A_j, tol: float = 1e-6):
    """The world axes z_i, z_j (unit) of ``joint`` in q0, checked parallel."""
    z_i = A_i @ np.asarray(joint.z_i, float)
    z_j = A_j @ np.asarray(joint.z_j, float)
    z_i, z_j = z_i / np.linalg.norm(z_i), z_j / np.linalg.norm(z_j)
    gap = float(np.linalg.norm(np.cross(z_i, z_j)))
    if gap > tol or float(z_i @ z_j) < 0.0:
        raise ValueError(
            f"{where}: q0 does not satisfy joint '{joint.name}': its axes z_i, z_j differ by "
            f"{np.degrees(np.arctan2(gap, float(z_i @ z_j))):.3g} degrees in q0. Fix: pass a "
            "configuration on the joint, e.g. rbjax.assemble(model, state).q."
        )
    return z_i, z_j


class Spherical(AbstractJoint):
    """Ball joint: the two joint points coincide, d_ij = 0 (3 rows; 3 × CD of Negrut ME751)."""

    _vectorised: ClassVar[bool] = True

    def residual(self, qi, qj, t):
        return self.d(qi, qj)


class Revolute(AbstractJoint):
    """Hinge about z: d_ij = 0 and z_i ⟂ x_j, y_j (5 rows: 3 CD + 2 DP1 of Negrut ME751)."""

    _vectorised: ClassVar[bool] = True

    def residual(self, qi, qj, t):
        (_, _, zi), (xj, yj, _) = self.frames(qi, qj)
        d = self.d(qi, qj)
        return cf.stack(*cf.comps(d), cf.dot3(zi, xj), cf.dot3(zi, yj))


class Universal(AbstractJoint):
    """Cardan joint: d_ij = 0 and the pins z_i (on body i) and z_j (on body j) stay
    perpendicular (4 rows: 3 CD + DP1). Build it with z_i ⟂ z_j in the reference configuration."""

    _vectorised: ClassVar[bool] = True
    _pins_perpendicular: ClassVar[bool] = True

    def residual(self, qi, qj, t):
        (_, _, zi), (_, _, zj) = self.frames(qi, qj)
        d = self.d(qi, qj)
        return cf.stack(*cf.comps(d), cf.dot3(zi, zj))


class Cylindrical(AbstractJoint):
    """Slides along and turns about z: z_i ∥ z_j and P_j on the line (P_i, z_i) (4 rows)."""

    _vectorised: ClassVar[bool] = True

    def residual(self, qi, qj, t):
        (xi, yi, zi), (xj, yj, _) = self.frames(qi, qj)
        d = self.d(qi, qj)
        return cf.stack(cf.dot3(zi, xj), cf.dot3(zi, yj), cf.dot3(xi, d), cf.dot3(yi, d))


class Translational(AbstractJoint):
    """Prismatic joint: slides along z, no relative rotation (5 rows: Cylindrical + x_i ⟂ y_j)."""

    _vectorised: ClassVar[bool] = True

    def residual(self, qi, qj, t):
        (xi, yi, zi), (xj, yj, _) = self.frames(qi, qj)
        d = self.d(qi, qj)
        return cf.stack(
            cf.dot3(zi, xj), cf.dot3(zi, yj), cf.dot3(xi, d), cf.dot3(yi, d), cf.dot3(xi, yj)
        )


class Fixed(AbstractJoint):
    """Weld: d_ij = 0 and the frames stay aligned (6 rows: 3 CD + 3 DP1)."""

    _vectorised: ClassVar[bool] = True

    def residual(self, qi, qj, t):
        (xi, _, zi), (xj, yj, _) = self.frames(qi, qj)
        d = self.d(qi, qj)
        return cf.stack(*cf.comps(d), cf.dot3(zi, xj), cf.dot3(zi, yj), cf.dot3(xi, yj))


class Parallel(AbstractJoint):
    """z_i ∥ z_j (2 rows: z_i ⟂ x_j, y_j; 2 × DP1)."""

    _vectorised: ClassVar[bool] = True

    def residual(self, qi, qj, t):
        (_, _, zi), (xj, yj, _) = self.frames(qi, qj)
        return cf.stack(cf.dot3(zi, xj), cf.dot3(zi, yj))


class Perpendicular(AbstractJoint):
    """z_i ⟂ z_j (1 row; DP1)."""

    _vectorised: ClassVar[bool] = True
    _pins_perpendicular: ClassVar[bool] = True

    def residual(self, qi, qj, t):
        (_, _, zi), (_, _, zj) = self.frames(qi, qj)
        return cf.stack(cf.dot3(zi, zj))


class PointOnLine(AbstractJoint):
    """The point P_j stays on the line through P_i along z_i (2 rows; 2 × DP2)."""

    _vectorised: ClassVar[bool] = True

    def residual(self, qi, qj, t):
        (xi, yi, _), _ = self.frames(qi, qj)
        d = self.d(qi, qj)
        return cf.stack(cf.dot3(xi, d), cf.dot3(yi, d))


class Distance(AbstractJoint):
    """|P_j − P_i| = L: d_ijᵀ d_ij − L² = 0 (1 row; D of Negrut ME751). ``length`` [m] is a
    differentiable leaf."""

    _vectorised: ClassVar[bool] = True

    length: Float[Array, ""]

    _rules: ClassVar[tuple[Rule, ...]] = (
        *AbstractJoint._rules,
        Rule(
            ("length",),
            lambda xp, length: xp.isfinite(length) & (length > 0),
            "is not a positive finite scalar",
            "give the distance between the two points in metres",
        ),
    )

    def __init__(self, body_i, body_j, *, length, **kwargs):
        super().__init__(body_i, body_j, **kwargs)
        length = jnp.asarray(length, dtype=self.s_i.dtype)
        if length.shape != ():
            raise ValueError(
                f"{self.name}.length has shape {length.shape}, not a scalar. "
                "Fix: give the distance between the two points in metres."
            )
        self.length = length  # its sign: the rule above (AbstractJoint.__check_init__)

    @classmethod
    def between(cls, q, body_i, body_j, *, point_i, point_j, name=None):
        """The distance constraint that holds in configuration q between two world points."""
        q = np.asarray(q, dtype=float)

        def local(b, p):
            p = np.asarray(p, dtype=float)
            if b == GROUND:
                return p
            rot = _rot_np(q[b, 3:7] / np.linalg.norm(q[b, 3:7]))
            return rot.T @ (p - q[b, 0:3])

        length = float(np.linalg.norm(np.asarray(point_j) - np.asarray(point_i)))
        return cls(
            body_i,
            body_j,
            s_i=local(body_i, point_i),
            s_j=local(body_j, point_j),
            length=length,
            name=name,
        )

    def residual(self, qi, qj, t):
        d = self.d(qi, qj)
        return cf.stack(cf.dot3(d, d) - self.length * self.length)


def _driver_on(cls, joint, q0, f, names, name, kinds, attach):
    """What :meth:`RotationDriver.on` and :meth:`TranslationDriver.on` share: ``joint`` must be
    one of ``kinds`` = (classes, "hinge"/"slider", the other kind, its driver); its bodies are
    placed in q0 and its axes must be parallel there; the driver keeps the joint's bodies and
    geometry, with the entries that ``attach(where, joint, (r_i, A_i), (r_j, A_j))`` returns
    replaced."""
    classes, kind, other, other_driver = kinds
    where = f"{cls.__name__}.on"
    if not isinstance(joint, classes):
        allowed = " or ".join(f"rbjax.{c.__name__}" for c in classes)
        raise ValueError(
            f"{where}: joint = {type(joint).__name__} ({getattr(joint, 'name', joint)!r}) "
            f"is not a {kind}. Fix: pass a {allowed} joint (drive a {other} one with "
            f"rbjax.{other_driver}.on)."
        )
    q0 = _configuration(where, q0)
    placed_i = _placement(where, "body_i", q0, joint.body_i, names)
    placed_j = _placement(where, "body_j", q0, joint.body_j, names)
    _aligned_axes(where, joint, placed_i[1], placed_j[1])
    fields = ("s_i", "s_j", "z_i", "z_j", "x_i", "x_j")
    geometry = {k: np.asarray(getattr(joint, k), float) for k in fields}
    geometry |= attach(where, joint, placed_i, placed_j)
    name = f"{joint.name}_driver" if name is None else name
    return cls(joint.body_i, joint.body_j, _check_f(name, f), name=name, **geometry)


class RotationDriver(AbstractJoint):
    """Prescribes the angle θ(t) of x_j from x_i about z_i (1 row); pair it with a Revolute.

    Residual (y_iᵀx_j) cos θ − (x_iᵀx_j) sin θ = sin(φ − θ) for the actual angle φ: smooth
    for all θ, so drivers can turn through any number of revolutions. ``f`` is θ(t) [rad]: any
    JAX function of t, or an equinox Module with differentiable parameters. Build it on an
    existing hinge with :meth:`on` (the angle measured from a configuration), or from world
    data with :meth:`at`.
    """

    _vectorised: ClassVar[bool] = True

    f: Callable = _zero

    def __init__(self, body_i, body_j, f: Callable = _zero, **kwargs):
        super().__init__(body_i, body_j, **kwargs)
        self.f = _check_f(self.name, f)

    @classmethod
    @validates_inputs
    def on(
        cls,
        joint: AbstractJoint,
        q0,
        f: Callable = _zero,
        *,
        names=None,
        name: str | None = None,
    ) -> RotationDriver:
        """Drive the rotation about an existing :class:`Revolute` (or :class:`Cylindrical`)
        ``joint``, measured from the configuration ``q0`` (nb, 7): φ(t) = f(t) [rad].

        φ is the angle of body j relative to body i about the joint axis z_i (right-handed,
        world direction A_i z̄_i), zero in q0: the driver keeps the joint's bodies, point and
        axes (z̄_i, x̄_i, z̄_j, s̄_i, s̄_j, so its reaction is reported about the hinge point in
        the hinge frame) and takes x̄_j = A_jᵀ A_i x̄_i from q0 (projected ⟂ z̄_j), so no
        reference vector needs aligning by hand. f(0) = 0 holds the initial angle (the default
        f ≡ 0 locks the hinge); f(0) ≠ 0 starts off the driver (assemble the state first).
        ``names`` (e.g. ``model.names``) resolves a joint that names its bodies; ``name``
        defaults to the joint's name + "_driver". ValueError if ``joint`` is not a hinge or q0
        is not a configuration of it (its axes must be parallel in q0).
        """

        def attach(where, joint, placed_i, placed_j):
            x_world = placed_i[1] @ np.asarray(joint.x_i, float)
            x_j = np.linalg.solve(placed_j[1], x_world)  # A_j⁻¹ = Rᵀ/s: in body j axes
            z_j = _unit(f"{where} joint.z_j", np.asarray(joint.z_j, float))
            return {"z_j": z_j, "x_j": _unit(f"{where} x_j", x_j - (x_j @ z_j) * z_j)}

        kinds = ((Revolute, Cylindrical), "hinge", "Translational", "TranslationDriver")
        return _driver_on(cls, joint, q0, f, names, name, kinds, attach)

    def residual(self, qi, qj, t):
        (xi, yi, _), (xj, _, _) = self.frames(qi, qj)
        th = self.f(t)
        return cf.stack(cf.dot3(yi, xj) * jnp.cos(th) - cf.dot3(xi, xj) * jnp.sin(th))


class TranslationDriver(AbstractJoint):
    """Prescribes the displacement f(t) of P_j from P_i along z_i: z_iᵀd_ij − f(t) = 0 (1 row;
    DP2 with a driver). Pair it with a Translational joint; build it on one with :meth:`on`
    (the displacement measured from a configuration), or from world data with :meth:`at`."""

    _vectorised: ClassVar[bool] = True

    f: Callable = _zero

    def __init__(self, body_i, body_j, f: Callable = _zero, **kwargs):
        super().__init__(body_i, body_j, **kwargs)
        self.f = _check_f(self.name, f)

    @classmethod
    @validates_inputs
    def on(
        cls,
        joint: AbstractJoint,
        q0,
        f: Callable = _zero,
        *,
        names=None,
        name: str | None = None,
    ) -> TranslationDriver:
        """Drive the slide of an existing :class:`Translational` (or :class:`Cylindrical`)
        ``joint``, measured from the configuration ``q0`` (nb, 7): x(t) = f(t) [m].

        x = z_iᵀ(P_j − P_i) is the displacement of body j relative to body i along the joint
        axis z_i (world direction A_i z̄_i), zero in q0: the driver keeps the joint's bodies,
        axes and P_i = r_i + A_i s̄_i, and takes for P_j the material point of body j at P_i in
        q0, s̄_j = A_j⁻¹(P_i − r_j), which stays on the joint's axis line. f(0) = 0 holds the
        initial position (the default f ≡ 0 locks the slider); f(0) ≠ 0 starts off the driver
        (assemble the state first). ``names`` and ``name`` as for
        :meth:`RotationDriver.on`. ValueError if ``joint`` is not a slider or q0 is not a
        configuration of it (its axes must be parallel in q0).
        """

        def attach(where, joint, placed_i, placed_j):
            (r_i, A_i), (r_j, A_j) = placed_i, placed_j
            p_i = r_i + A_i @ np.asarray(joint.s_i, float)
            return {"s_j": np.linalg.solve(A_j, p_i - r_j)}

        kinds = ((Translational, Cylindrical), "slider", "Revolute", "RotationDriver")
        return _driver_on(cls, joint, q0, f, names, name, kinds, attach)

    def residual(self, qi, qj, t):
        (_, _, zi), _ = self.frames(qi, qj)
        return cf.stack(cf.dot3(zi, self.d(qi, qj)) - self.f(t))


class CustomConstraint(AbstractConstraint):
    """A user constraint from a plain function: ``fn(q_i, q_j, t, params) -> residual (m,)``.

    q_i, q_j have shape (7,) = (r, p) in the state convention (ground: r = 0, p = (1, 0, 0, 0)),
    t is a scalar, ``params`` any pytree (its arrays are differentiable). The engine takes the
    Jacobian (jvp) and γ (nested jvp) of ``fn`` itself and ``jax.vmap``s it over batches: no
    hand-written derivatives. (Equivalently, subclass :class:`rbjax.AbstractConstraint`.)
    """

    fn: Callable = eqx.field(static=True)
    params: object
    body_i: int | str = eqx.field(static=True)
    body_j: int | str = eqx.field(static=True)
    name: str = eqx.field(static=True)

    def __init__(self, fn: Callable, body_i, body_j, params=None, *, name: str = "custom"):
        if not callable(fn):
            raise ValueError(f"CustomConstraint.fn = {fn!r} is not callable. Fix: pass a function.")
        self.fn, self.params = fn, params
        self.body_i, self.body_j, self.name = body_i, body_j, name

    def residual(self, q_i, q_j, t):
        return jnp.atleast_1d(self.fn(q_i, q_j, t, self.params))
