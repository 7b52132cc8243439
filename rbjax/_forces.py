"""Applied forces as resultants (F, S_C, M_C) per body (seed 000, eqs. (75)-(76)).

Every force reduces to three resultants for each body i:

* ``F``   -- resultant force, world frame [N];
* ``S_C`` -- resultant scaling force S_C = ∫ ϱᵀ Rᵀ dF (scalar) [N m];
* ``M_C`` -- resultant moment about the centre of mass, body frame, M_C = ∫ ϱ̃ Rᵀ dF [N m].

They enter the equations of motion in generalized velocities directly (seed 000, eq. (92)).
All forces are differentiable in their parameters. Concrete forces are final classes; write a
new force by subclassing :class:`AbstractForce` or, most simply, with :class:`ForceFunction`.

Forces between two bodies (ME751 TSDA/RSDA, seed 004): :class:`TranslationalSpringDamper`
and :class:`RotationalSpringDamper`; either side may be ``GROUND``.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ._constraints import GROUND, _vec, point
from ._engine import kernels as cf
from ._engine.layout import system_vector
from ._errors import check_finite, check_shape, fail, is_concrete
from ._joints import _perpendicular, _rot_np, _unit
from ._state import State


class Resultants(eqx.Module):
    """Per-body resultants in component-first layout: F (3, ..., nb), S (..., nb), M (3, ..., nb)."""

    F: Array
    S: Array
    M: Array

    def __add__(self, other: Resultants) -> Resultants:
        return Resultants(self.F + other.F, self.S + other.S, self.M + other.M)


class AbstractForce(eqx.Module):
    """Interface: ``resultants(model, t, q, u)`` with component-first q, u of shape (7, ..., nb)."""

    @abc.abstractmethod
    def resultants(self, model, t, q, u) -> Resultants:
        """Per-body resultants (F, S_C, M_C) of this force at (t, q, u), component-first."""


def _onehot(body: int, nb: int, dtype):
    return jnp.zeros((nb,), dtype).at[body].set(1.0)


def _at_point(p, rho, f, mask) -> Resultants:
    """Resultants of the world force f at the body point ϱ of the body with quaternion p
    (seed 000, eq. (75)): F = f, S_C = ϱᵀ Rᵀ f, M_C = ϱ × (Rᵀ f), each times the one-hot
    ``mask`` over bodies. Component-first; p (4, ...), ϱ and f (3, ...)."""
    f_body = cf.rotate_t(p, f)
    return Resultants(
        F=f * mask + jnp.zeros_like(f_body),
        S=cf.dot3(rho, f_body) * mask,
        M=cf.cross(rho, f_body) * mask,
    )


class PointForce(AbstractForce):
    """A constant world-frame force acting at a material point of one body (seed 000, eq. (75)).

    ``point_body`` is ϱ, the point in body axes relative to the centre of mass in the reference
    configuration. For a rigid body the moment is M_C = ϱ x (Rᵀ f); for a scalable body the
    same point also feels the scaling force S_C = ϱᵀ Rᵀ f.
    """

    body: int = eqx.field(static=True)
    point_body: Float[Array, "3"]
    force_world: Float[Array, "3"]

    def __init__(self, body: int, point_body, force_world):
        check_shape("PointForce.point_body", point_body, (3,))
        check_shape("PointForce.force_world", force_world, (3,))
        check_finite("PointForce.point_body", point_body, "give a finite point in metres")
        check_finite("PointForce.force_world", force_world, "give a finite force in newtons")
        self.body = int(body)
        self.point_body = jnp.asarray(point_body)
        self.force_world = jnp.asarray(force_world)

    def resultants(self, model, t, q, u):
        mask = _onehot(self.body, model.nb, q.dtype)
        f = system_vector(self.force_world, q)
        rho = system_vector(self.point_body, q)
        return _at_point(q[3:7], rho, f, mask)


class BodyTorque(AbstractForce):
    """A constant torque given in the body frame, acting on one body [N m]."""

    body: int = eqx.field(static=True)
    torque_body: Float[Array, "3"]

    def __init__(self, body: int, torque_body):
        check_shape("BodyTorque.torque_body", torque_body, (3,))
        check_finite("BodyTorque.torque_body", torque_body, "give a finite torque in N m")
        self.body = int(body)
        self.torque_body = jnp.asarray(torque_body)

    def resultants(self, model, t, q, u):
        mask = _onehot(self.body, model.nb, q.dtype)
        tau = system_vector(self.torque_body, q)
        zero3 = jnp.zeros_like(q[0:3])
        return Resultants(F=zero3, S=jnp.zeros_like(q[0]), M=tau * mask + zero3)


class ForceFunction(AbstractForce):
    """A user force law ``fn(t, state, params) -> (F, S_C, M_C)``.

    ``fn`` sees ONE system: ``state`` is an :class:`rbjax.State` with ``q``, ``u`` of shape
    (nb, 7); it returns F (nb, 3) world frame, S_C (nb,) and M_C (nb, 3) body frame. ``params``
    is any pytree; its array leaves are differentiable. Batched rollouts apply ``jax.vmap``.
    Pass ``S_C = 0`` for a rigid body unless you model a scaling load.
    """

    fn: Callable[..., Any] = eqx.field(static=True)
    params: Any

    def __init__(self, fn: Callable[..., Any], params: Any = None):
        if not callable(fn):
            raise ValueError(f"ForceFunction.fn = {fn!r} is not callable. Fix: pass a function.")
        self.fn = fn
        self.params = params

    def resultants(self, model, t, q, u):
        batch_shape = q.shape[1:-1]

        def one(t1, q1, u1):
            st = State(t=t1, q=q1.T, u=u1.T)
            F, S, M = self.fn(t1, st, self.params)
            return jnp.asarray(F).T, jnp.asarray(S), jnp.asarray(M).T

        fn = one
        t_b = jnp.broadcast_to(t[..., 0], batch_shape)
        for _ in batch_shape:
            fn = jax.vmap(fn, in_axes=(0, 1, 1), out_axes=(1, 0, 1))
        F, S, M = fn(t_b, q, u)
        return Resultants(F=F.astype(q.dtype), S=S.astype(q.dtype), M=M.astype(q.dtype))


# ------------------------------------------------------------- forces between two bodies


def _bodies(name: str, body_i, body_j) -> tuple[int, int]:
    """Validate the two static body indices of a two-body force (range is checked by Model)."""
    for side, b in (("body_i", body_i), ("body_j", body_j)):
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)):
            raise ValueError(
                f"{name}.{side} = {b!r} is not a body index. Fix: pass an integer index into the "
                "Model's bodies list, or rbjax.GROUND (-1)."
            )
    if int(body_i) == int(body_j):
        raise ValueError(
            f"{name} connects body {int(body_i)} to itself (body_i == body_j). Fix: a "
            "spring-damper acts between two different bodies (or a body and rbjax.GROUND)."
        )
    return int(body_i), int(body_j)


def _scalar(field: str, x, fix: str):
    """A finite scalar leaf as a floating array (ValueError naming ``field`` otherwise)."""
    if np.shape(x) != ():
        fail(field, x, f"has shape {np.shape(x)}, not a scalar", fix)
    try:
        x = jnp.asarray(x)
    except TypeError:
        fail(field, x, "is not a number", fix)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        if not jnp.issubdtype(x.dtype, jnp.integer):
            fail(field, x, "is not a real number", fix)
        x = x.astype(jnp.result_type(float))
    check_finite(field, x, fix)
    # strong dtype: 1.0 and np.float64(1.0) give the same pytree (no recompilation of rollouts)
    return jnp.asarray(x, dtype=x.dtype)


def _actuator(name: str, h):
    if h is not None and not callable(h):
        raise ValueError(
            f"{name}.actuator = {h!r} is not callable. Fix: pass a JAX function h(t, x, xdot) "
            "(or an equinox Module with __call__ whose array fields are its parameters), or None."
        )
    return h


def _body_state(q, u, b: int):
    """(q_b, u_b) of body b ≠ GROUND as component-first (7, ..., 1) slices (b is static, so
    this is a batched slice of the (7, ..., nb) arrays)."""
    return q[..., b : b + 1], u[..., b : b + 1]


def _pure_torque(p, tau, mask) -> Resultants:
    """Resultants of a pure torque (couple) τ, world frame, on the body with quaternion p:
    F = 0, S_C = 0, M_C = Rᵀ τ / s (s = |A|² = 1 for a rigid body: M_C = Rᵀ τ). The 1/s makes
    M_C the force conjugate to ω, the body angular velocity scaled by s (seed 000, eq. (49))."""
    m = cf.rotate_t(p, tau) / cf.qnorm2(p) * mask
    return Resultants(F=jnp.zeros_like(m), S=jnp.zeros_like(m[0]), M=m)


def _sum(parts: list[Resultants]) -> Resultants:
    total = parts[0]
    for r in parts[1:]:
        total = total + r
    return total


class TranslationalSpringDamper(AbstractForce):
    """Translational spring–damper–actuator (TSDA) between two body points (ME751 TSDA/RSDA,
    seed 004).

    The points are s̄_i on body i and s̄_j on body j (body axes, relative to each centre of
    mass; for ``GROUND`` a world point). With P = r + A s̄ (A s̄ = s R s̄, the same material
    point as :class:`PointForce`),

        d = P_j − P_i,   l = |d|,   e = d / l,   l̇ = eᵀ (Ṗ_j − Ṗ_i),
        f = k (l − l0) + c l̇ + h(t, l, l̇)        (tension, [N]),

    and the force +f e acts on body i at s̄_i and −f e on body j at s̄_j: a stretched spring
    (f > 0) pulls the two points together. Each is reduced to resultants exactly as a
    :class:`PointForce` (seed 000, eq. (75)). The point velocities Ṗ are jvps of P(q) along the
    model formulation's q̇ = kinematics(q, u), so l̇ is exact for every formulation and for
    scalable bodies.

    ``stiffness`` k [N/m], ``damping`` c [N s/m], ``rest_length`` l0 [m] and the points are
    differentiable leaves; ``body_i`` / ``body_j`` are static body indices or ``GROUND`` (−1).
    ``actuator`` h(t, l, l̇) -> force [N] is an optional JAX function of broadcastable arrays (or
    an equinox Module whose array fields are differentiable parameters); it must be finite at
    l = 0 if the points can coincide.

    Singularity at l = 0: the direction e is undefined. The spring term is evaluated as
    k (l − l0) e = k d − k l0 e, so with ``rest_length = 0`` it is k d, smooth through
    coincident points (its limit there is zero). At l = 0 exactly, e is set to 0 by a
    double-``where`` (the square root and the division never see l = 0, on either branch), so
    the damping, actuator and −k l0 e terms are zero there and neither the force nor its
    gradient contains NaN. Those terms have no limit at l = 0 in general (bounded, but along an
    undefined direction), and with l0 > 0 the force jumps there (magnitude k l0): keep the
    points apart unless l0 = 0 and c = 0.
    """

    body_i: int = eqx.field(static=True)
    body_j: int = eqx.field(static=True)
    s_i: Float[Array, "3"]
    s_j: Float[Array, "3"]
    stiffness: Float[Array, ""]
    damping: Float[Array, ""]
    rest_length: Float[Array, ""]
    actuator: Callable[..., Any] | None

    def __init__(
        self,
        body_i: int,
        s_i,
        body_j: int,
        s_j,
        *,
        stiffness,
        damping=0.0,
        rest_length=0.0,
        actuator: Callable[..., Any] | None = None,
    ):
        name = "TranslationalSpringDamper"
        self.body_i, self.body_j = _bodies(name, body_i, body_j)
        self.s_i = _vec(f"{name}.s_i", s_i)
        self.s_j = _vec(f"{name}.s_j", s_j)
        self.stiffness = _scalar(
            f"{name}.stiffness", stiffness, "give the stiffness k as one finite number in N/m"
        )
        self.damping = _scalar(
            f"{name}.damping", damping, "give the damping c as one finite number in N s/m"
        )
        self.rest_length = _scalar(
            f"{name}.rest_length", rest_length, "give the rest length l0 >= 0 in m"
        )
        if is_concrete(self.rest_length) and not float(self.rest_length) >= 0.0:
            fail(f"{name}.rest_length", rest_length, "is negative", "give l0 >= 0 in m")
        self.actuator = _actuator(name, actuator)

    def _point(self, model, q, u, b: int, s):
        """(q_b, P, Ṗ) of the body point s̄ of body b: P = r + A s̄ and its velocity, the jvp of
        P(q) along q̇ = kinematics(q, u). GROUND: the world point s̄ at rest (q_b = None)."""
        s = system_vector(jnp.asarray(s, q.dtype), q)
        if b == GROUND:
            return None, s, jnp.zeros_like(s)
        qb, ub = _body_state(q, u, b)
        kin = model.formulation._engine_kinematics
        p, v = jax.jvp(lambda x: point(x, s), (qb,), (kin(qb, ub),))
        return qb, p, v

    def _geometry(self, model, q, u):
        """(q_i, q_j, d, l, e, l̇) component-first; d, e (3, ..., 1), l, l̇ (..., 1)."""
        qi, pi, vi = self._point(model, q, u, self.body_i, self.s_i)
        qj, pj, vj = self._point(model, q, u, self.body_j, self.s_j)
        d = pj - pi
        l2 = cf.dot3(d, d)
        # double where: the sqrt and the division never see l = 0, on either branch
        safe = l2 > 0.0
        l_safe = jnp.sqrt(jnp.where(safe, l2, 1.0))
        l = jnp.where(safe, l_safe, 0.0)
        e = d / l_safe  # = 0 where d = 0
        return qi, qj, d, l, e, cf.dot3(e, vj - vi)

    def length_and_rate(self, model, q, u):
        """(l, l̇) [m, m/s] at component-first q, u (7, ..., nb); each of shape (...)."""
        _, _, _, l, _, ldot = self._geometry(model, q, u)
        return l[..., 0], ldot[..., 0]

    def resultants(self, model, t, q, u):
        qi, qj, d, l, e, ldot = self._geometry(model, q, u)
        k = jnp.asarray(self.stiffness, q.dtype)
        c = jnp.asarray(self.damping, q.dtype)
        l0 = jnp.asarray(self.rest_length, q.dtype)
        rest = c * ldot - k * l0
        if self.actuator is not None:
            rest = rest + self.actuator(t, l, ldot)
        fe = k * d + rest * e  # f e with f = k (l − l0) + c l̇ + h, since k l e = k d
        parts = []
        for b, qb, s, f in ((self.body_i, qi, self.s_i, fe), (self.body_j, qj, self.s_j, -fe)):
            if qb is not None:
                rho = system_vector(jnp.asarray(s, q.dtype), q)
                parts.append(_at_point(qb[3:7], rho, f, _onehot(b, model.nb, q.dtype)))
        return _sum(parts)


class RotationalSpringDamper(AbstractForce):
    """Rotational spring–damper–actuator (RSDA) about a revolute-like axis (ME751 TSDA/RSDA,
    seed 004).

    ``axis_i`` ā_i, ``axis_j`` ā_j are the joint axis in body i and body j axes; ``ref_i``,
    ``ref_j`` are reference directions ⟂ to it in the same body axes (``GROUND``: world axes).
    With z = A_i ā_i / |A_i ā_i|, x_i = A_i ref_i and x_j = A_j ref_j (world frame), the angle
    of body j relative to body i about z and its rate are

        θ = atan2(zᵀ (x_i × x_j), x_iᵀ x_j),     θ̇ = zᵀ (ω_j − ω_i),

    with ω = R ω̄ / s the world angular velocity of each body (ω̄ the velocity u[4:7], which
    is the body angular velocity scaled by s = |A|², seed 000 eq. (49); s = 1 for rigid
    bodies). The torque magnitude is

        τ = −[k (θ − θ0) + c θ̇] + h(t, θ, θ̇)      [N m],

    applied as the world torque τ z on body j and −τ z on body i, i.e. M_C = Rᵀ(±τ z)/s
    (F = 0, S_C = 0). The power of the pair is exactly τ θ̇, so damping always dissipates.

    θ is the principal value in (−π, π]: it wraps at ±π. ``rest_angle`` θ0 must lie in
    (−π, π] and the deflection θ − θ0 must stay below π in magnitude, else the spring torque
    jumps. θ̇ = zᵀ(ω_j − ω_i) is the rate of θ when the relative rotation is about z (pair the
    RSDA with a Revolute or Cylindrical joint); θ is undefined if x_j becomes parallel to z.
    ``axis_j`` is the same axis seen from body j (only used to check ref_j ⟂ axis); build both
    frames from world data with :meth:`at`. ``stiffness`` k [N m/rad], ``damping`` c
    [N m s/rad], ``rest_angle`` [rad] and the vectors are differentiable leaves; ``actuator``
    h(t, θ, θ̇) -> torque [N m] is an optional JAX function of broadcastable arrays (or an
    equinox Module with differentiable fields).
    """

    body_i: int = eqx.field(static=True)
    body_j: int = eqx.field(static=True)
    axis_i: Float[Array, "3"]
    axis_j: Float[Array, "3"]
    ref_i: Float[Array, "3"]
    ref_j: Float[Array, "3"]
    stiffness: Float[Array, ""]
    damping: Float[Array, ""]
    rest_angle: Float[Array, ""]
    actuator: Callable[..., Any] | None

    def __init__(
        self,
        body_i: int,
        body_j: int,
        *,
        axis_i,
        axis_j,
        ref_i,
        ref_j,
        stiffness,
        damping=0.0,
        rest_angle=0.0,
        actuator: Callable[..., Any] | None = None,
    ):
        name = "RotationalSpringDamper"
        self.body_i, self.body_j = _bodies(name, body_i, body_j)
        vecs = {}
        for field, v in (
            ("axis_i", axis_i),
            ("axis_j", axis_j),
            ("ref_i", ref_i),
            ("ref_j", ref_j),
        ):
            vecs[field] = _vec(f"{name}.{field}", v)
            if is_concrete(vecs[field]) and not np.linalg.norm(np.asarray(vecs[field])) > 0.0:
                fail(f"{name}.{field}", v, "has zero length", "give a nonzero direction")
        for side in ("i", "j"):
            a, r = vecs[f"axis_{side}"], vecs[f"ref_{side}"]
            if is_concrete((a, r)):
                a_n, r_n = np.asarray(a, float), np.asarray(r, float)
                cos = np.dot(a_n, r_n) / (np.linalg.norm(a_n) * np.linalg.norm(r_n))
                if abs(cos) > 1e-9:
                    fail(
                        f"{name}.ref_{side}",
                        r,
                        f"is not perpendicular to axis_{side} = {a_n.tolist()} (cos = {cos:.3g})",
                        "give a reference direction ⟂ the axis, or build the RSDA with "
                        "RotationalSpringDamper.at(q0, ..., axis=..., ref=...)",
                    )
        self.axis_i, self.axis_j = vecs["axis_i"], vecs["axis_j"]
        self.ref_i, self.ref_j = vecs["ref_i"], vecs["ref_j"]
        self.stiffness = _scalar(
            f"{name}.stiffness", stiffness, "give the stiffness k as one finite number in N m/rad"
        )
        self.damping = _scalar(
            f"{name}.damping", damping, "give the damping c as one finite number in N m s/rad"
        )
        self.rest_angle = _scalar(
            f"{name}.rest_angle", rest_angle, "give the rest angle θ0 in (−π, π] rad"
        )
        if is_concrete(self.rest_angle) and not -np.pi < float(self.rest_angle) <= np.pi:
            fail(
                f"{name}.rest_angle",
                rest_angle,
                "is not in (−π, π] (θ is a principal value)",
                "give the rest angle θ0 in (−π, π] rad",
            )
        self.actuator = _actuator(name, actuator)

    @classmethod
    def at(
        cls,
        q0,
        body_i: int,
        body_j: int,
        *,
        axis=(0.0, 0.0, 1.0),
        ref=None,
        **kwargs,
    ) -> RotationalSpringDamper:
        """Build the RSDA from a configuration q0 (nb, 7) and world-frame data.

        ``axis`` is the rotation axis and ``ref`` a reference direction ⟂ axis (default: any),
        both in world coordinates in the configuration q0. They become ā = Aᵀ axis and
        ref = Aᵀ ref in the axes of each body, so θ = 0 in q0 (``rest_angle = 0`` makes q0 the
        rest configuration). Other keyword arguments (stiffness, damping, rest_angle,
        actuator) go to the constructor.
        """
        name = f"{cls.__name__}.at"
        q0 = np.asarray(q0, dtype=float)
        if q0.ndim != 2 or q0.shape[-1] != 7:
            raise ValueError(
                f"{name}: q0 has shape {q0.shape}, expected (nb, 7). "
                "Fix: pass one system's coordinates, e.g. state.q."
            )
        z = _unit(f"{name} axis", axis)
        x = _perpendicular(z) if ref is None else _unit(f"{name} ref", ref)
        if abs(np.dot(x, z)) > 1e-9:
            raise ValueError(
                f"{name}: ref = {x.tolist()} is not perpendicular to axis = {z.tolist()} "
                f"(refᵀaxis = {np.dot(x, z):.3g}). Fix: give a reference direction ⟂ axis, or omit ref."
            )

        def local(b, v):
            if b == GROUND:
                return v
            if isinstance(b, bool) or not isinstance(b, (int, np.integer)):
                raise ValueError(
                    f"{name}: body {b!r} is not an index into q0 or GROUND. "
                    "Fix: use integer body indices."
                )
            if not 0 <= b < q0.shape[0]:
                raise ValueError(
                    f"{name}: body {b} is not an index into q0 (nb = {q0.shape[0]}) or GROUND. "
                    "Fix: use a body index in [0, nb) or rbjax.GROUND."
                )
            a = q0[b, 3:7]
            return _rot_np(a / np.linalg.norm(a)).T @ v

        return cls(
            body_i,
            body_j,
            axis_i=local(body_i, z),
            axis_j=local(body_j, z),
            ref_i=local(body_i, x),
            ref_j=local(body_j, x),
            **kwargs,
        )

    def _geometry(self, q, u):
        """(p_i, p_j, z, θ, θ̇) component-first; z (3, ..., 1), θ, θ̇ (..., 1); p = None for
        GROUND."""

        def frame(b, *vectors):
            """Quaternion, world vectors A x̄ and world angular velocity R ω / s of body b."""
            vs = [system_vector(jnp.asarray(x, q.dtype), q) for x in vectors]
            if b == GROUND:
                return None, vs, jnp.zeros_like(vs[0])
            qb, ub = _body_state(q, u, b)
            p = qb[3:7]
            return p, [cf.transform(p, x) for x in vs], cf.rotate(p, ub[4:7]) / cf.qnorm2(p)

        pi, (z, xi), wi = frame(self.body_i, self.axis_i, self.ref_i)
        pj, (xj,), wj = frame(self.body_j, self.ref_j)
        z = z / jnp.sqrt(cf.dot3(z, z))
        theta = jnp.arctan2(cf.dot3(z, cf.cross(xi, xj)), cf.dot3(xi, xj))
        return pi, pj, z, theta, cf.dot3(z, wj - wi)

    def angle_and_rate(self, model, q, u):
        """(θ, θ̇) [rad, rad/s] at component-first q, u (7, ..., nb); each of shape (...)."""
        _, _, _, theta, theta_dot = self._geometry(q, u)
        return theta[..., 0], theta_dot[..., 0]

    def resultants(self, model, t, q, u):
        pi, pj, z, theta, theta_dot = self._geometry(q, u)
        k = jnp.asarray(self.stiffness, q.dtype)
        c = jnp.asarray(self.damping, q.dtype)
        th0 = jnp.asarray(self.rest_angle, q.dtype)
        tau = -(k * (theta - th0) + c * theta_dot)
        if self.actuator is not None:
            tau = tau + self.actuator(t, theta, theta_dot)
        torque = tau * z
        parts = []
        for b, p, tq in ((self.body_i, pi, -torque), (self.body_j, pj, torque)):
            if p is not None:
                parts.append(_pure_torque(p, tq, _onehot(b, model.nb, q.dtype)))
        return _sum(parts)


def total_resultants(model, t, q, u) -> Resultants:
    """Sum of gravity (F = m g at the centre of mass: S_C = 0, M_C = 0) and all model forces."""
    g = system_vector(model.gravity, q)
    zero3 = jnp.zeros((3,) + q.shape[1:], q.dtype)
    total = Resultants(F=model.mass * g + zero3, S=jnp.zeros(q.shape[1:], q.dtype), M=zero3)
    for force in model.forces:
        total = total + force.resultants(model, t, q, u)
    return total
