"""Forces between two bodies (ME751's TSDA and RSDA, Negrut ME751, and the axial spring of a
joint): :class:`TranslationalSpringDamper`, :class:`RotationalSpringDamper` and
:class:`AxialSpringDamper`; either side may be ``GROUND``. Each reports its potential (the exact
integral of the implemented spring force), so conservative mechanisms with springs conserve
``rbjax.total_energy``. The wrench convention is rbjax/_forces.py's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from . import _quaternion as quat
from ._constraints import GROUND, _vec
from ._engine import forces as kernels
from ._errors import (
    Rule,
    check_finite,
    enforce,
    fail,
    is_concrete,
    nonzero,
    not_negative,
    perpendicular,
    perpendicular_tol,
    validates_inputs,
)
from ._forces import AbstractForce, Wrench
from ._joints import _dtype_of, _perpendicular, _rot_np, _unit
from ._state import State


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


def _not_negative(field: str) -> Rule:
    """k >= 0 or c >= 0: a negative stiffness or damping is a sign mistake (an energy source)
    far more often than an intended model."""
    return Rule(
        (field,),
        not_negative,
        "is negative: the spring pushes away from its rest position, or the damper feeds energy in",
        "give k >= 0 and c >= 0 (check the sign convention: the force opposes the extension "
        "and the velocity)",
    )


_SIGNS = (_not_negative("stiffness"), _not_negative("damping"))


def _direction(field: str) -> Rule:
    return Rule((field,), nonzero, "has zero length", "give a nonzero direction")


def _principal(xp, angle):
    """θ0 in (−π, π] (a NaN is not this rule's business: :class:`rbjax._errors.Rule`)."""
    return ~((angle <= -np.pi) | (angle > np.pi))


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


def _over_batch(one, state: State):
    """``one(state)`` of ONE system, mapped over the leading batch axes of ``state``."""
    for _ in range(state.q.ndim - 2):
        one = jax.vmap(one)
    return one(state)


def _actuator(name: str, h):
    if h is not None and not callable(h):
        raise ValueError(
            f"{name}.actuator = {h!r} is not callable. Fix: pass a JAX function h(t, x, xdot) "
            "(or an equinox Module with __call__ whose array fields are its parameters), or None."
        )
    return h


# joints that keep their axes z_i, z_j parallel (they contain z_i ⟂ x_j, y_j)
_PARALLEL_AXES = ("Revolute", "Cylindrical", "Translational", "Fixed", "Parallel")


def _on_parallel_joint(force, model) -> bool:
    """Whether a joint of ``model`` between the RSDA's two bodies keeps the RSDA's axis
    parallel on both: a Revolute, Cylindrical, Translational, Fixed or Parallel joint whose
    axis on body i is along ``axis_i`` (checked when the vectors are concrete)."""
    pair = (force.body_i, force.body_j)
    for joint, bodies in zip(model.joints, model.topology.joint_bodies, strict=True):
        if type(joint).__name__ not in _PARALLEL_AXES or type(joint).__module__ != "rbjax._joints":
            continue
        if bodies == pair:
            on_i = joint.z_i
        elif bodies == pair[::-1]:
            on_i = joint.z_j
        else:
            continue
        if not is_concrete((on_i, force.axis_i)):
            return True
        a, b = np.asarray(on_i, float), np.asarray(force.axis_i, float)
        if np.linalg.norm(np.cross(a, b)) <= 1e-9 * np.linalg.norm(a) * np.linalg.norm(b):
            return True
    return False


def _spring_balance(force) -> str | None:
    """The energy balance of a spring–damper: None with an actuator (it may do any work) or a
    negative damping (it feeds energy in), "conservative" when the damping is concretely 0,
    "dissipative" otherwise (a traced damping counts as dissipative)."""
    if force.actuator is not None:
        return None
    c = force.damping
    if not is_concrete(c):
        return "dissipative"
    c = np.asarray(c)
    if np.any(c < 0.0):
        return None
    return "conservative" if np.all(c == 0.0) else "dissipative"


def _without_spring(self):
    """A spring–damper less its spring (k = 0): its damping and actuator, the part of the
    force that its potential ½ k (x − x0)² does not account for where V is the spring's
    potential. The force is linear in k, so the power of these resultants is then the power
    of the whole force plus dV/dt."""
    k = jnp.asarray(self.stiffness)
    return eqx.tree_at(lambda f: f.stiffness, self, jnp.zeros_like(k))


@validates_inputs
class TranslationalSpringDamper(AbstractForce):
    """Translational spring–damper–actuator (TSDA) between two body points (ME751 TSDA/RSDA,
    Negrut ME751).

    The points are s̄_i on body i and s̄_j on body j (body axes, relative to each centre of
    mass; for ``GROUND`` a world point). With P = r + A s̄ (A s̄ = s R s̄, the same material
    point as :class:`PointForce`),

        d = P_j − P_i,   l = |d|,   e = d / l,   l̇ = eᵀ (Ṗ_j − Ṗ_i),
        f = k (l − l0) + c l̇ + h(t, l, l̇)        (tension, [N]),

    and the force +f e acts on body i at s̄_i and −f e on body j at s̄_j: a stretched spring
    (f > 0) pulls the two points together. Each is reduced to resultants exactly as a
    :class:`PointForce` (Möller & Glocker 2012, eq. (75)). The point velocities Ṗ are jvps of P(q) along the
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

    Energy: the spring term is the gradient of V = ½ k (l − l0)², which
    :func:`rbjax.potential_energy` includes (for every configuration and formulation, scalable
    bodies too: the force acts at material points). The damping power −c l̇² is never positive;
    the actuator's work is not described by a potential.
    """

    body_i: int = eqx.field(static=True)
    body_j: int = eqx.field(static=True)
    s_i: Float[Array, "3"]
    s_j: Float[Array, "3"]
    stiffness: Float[Array, ""]
    damping: Float[Array, ""]
    rest_length: Float[Array, ""]
    actuator: Callable[..., Any] | None

    # the sign conditions, checked at build time and, traced, inside a rollout's program
    _rules: ClassVar[tuple[Rule, ...]] = (
        *_SIGNS,
        Rule(("rest_length",), not_negative, "is negative", "give l0 >= 0 in m"),
    )

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
        self.actuator = _actuator(name, actuator)
        enforce(self, name)

    def bodies(self) -> tuple[int, ...]:
        return (self.body_i, self.body_j)

    def _point(self, model, state: State, b: int, s):
        """(P, Ṗ) of the body point s̄ of body b: P = r + A s̄ (A s̄ = s R s̄) and its velocity,
        the jvp of P(q) along q̇ = kinematics(q, u). GROUND: the world point s̄ at rest."""
        s = jnp.asarray(s, state.q.dtype)
        if b == GROUND:
            return s, jnp.zeros_like(s)
        q_b, u_b = state.q[b], state.u[b]

        def position_world(q):
            return q[0:3] + quat.transform(q[3:7], s)

        q_dot = model.formulation.kinematics(q_b, u_b)
        return jax.jvp(position_world, (q_b,), (q_dot,))

    def _geometry(self, model, state: State):
        """(d, l, e, l̇) of one system: separation d = P_j − P_i, length l, direction e and
        rate l̇ (e = 0 where l = 0, by a double where)."""
        p_i, v_i = self._point(model, state, self.body_i, self.s_i)
        p_j, v_j = self._point(model, state, self.body_j, self.s_j)
        d = p_j - p_i
        l2 = jnp.dot(d, d)
        safe = l2 > 0.0
        l_safe = jnp.sqrt(jnp.where(safe, l2, 1.0))
        length = jnp.where(safe, l_safe, 0.0)
        e = d / l_safe
        return d, length, e, jnp.dot(e, v_j - v_i)

    def length_and_rate(self, model, state: State):
        """(l, l̇) [m, m/s] at ``state`` (any leading batch axes)."""

        def one(st):
            _, length, _, rate = self._geometry(model, st)
            return length, rate

        return _over_batch(one, state)

    def wrench(self, model, t, state: State) -> Wrench:
        dtype = state.q.dtype
        d, length, e, rate = self._geometry(model, state)
        k, c, l0 = (jnp.asarray(x, dtype) for x in (self.stiffness, self.damping, self.rest_length))
        rest = c * rate - k * l0
        if self.actuator is not None:
            rest = rest + self.actuator(t, length, rate)
        pull = k * d + rest * e  # f e with f = k (l − l0) + c l̇ + h, since k l e = k d
        out = Wrench.zeros(model.nb, dtype)
        for b, s, f in ((self.body_i, self.s_i, pull), (self.body_j, self.s_j, -pull)):
            if b != GROUND:
                out = out.add_point_force(b, state.q[b, 3:7], jnp.asarray(s, dtype), f)
        return out

    _engine_kernel = staticmethod(kernels.tsda)  # several evaluated together
    _engine_power = staticmethod(kernels.tsda_power)  # the work monitor's power
    _body_fields = ("body_i", "body_j")

    def _engine_resultants(self, model, t, q, u):
        return kernels.tsda(self, model, t, q, u)

    def _engine_nonconservative(self, model):
        return _without_spring(self)  # V is its spring's potential in every configuration

    def _engine_potential(self, model, t, q):
        return kernels.tsda_potential(self, model, t, q)

    def _engine_energy_scale(self, model, t, q):
        return kernels.tsda_potential(self, model, t, q, scale=True)

    def _energy_balance(self, model) -> str | None:
        return _spring_balance(self)  # a potential in every configuration


@validates_inputs
class RotationalSpringDamper(AbstractForce):
    """Rotational spring–damper–actuator (RSDA) about a revolute-like axis (ME751 TSDA/RSDA,
    Negrut ME751).

    ``axis_i`` ā_i, ``axis_j`` ā_j are the joint axis in body i and body j axes; ``ref_i``,
    ``ref_j`` are reference directions ⟂ to it in the same body axes (``GROUND``: world axes).
    With z = A_i ā_i / |A_i ā_i|, x_i = A_i ref_i and x_j = A_j ref_j (world frame), the angle
    of body j relative to body i about z and its rate are

        θ = atan2(zᵀ (x_i × x_j), x_iᵀ x_j),     θ̇ = zᵀ (ω_j − ω_i),

    with ω = R ω̄ / s the world angular velocity of each body (ω̄ the velocity u[4:7], which
    is the body angular velocity scaled by s = |A|², Möller & Glocker 2012 eq. (49); s = 1 for rigid
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

    Energy: :func:`rbjax.potential_energy` includes V = ½ k (θ − θ0)² (θ the same principal
    value). Its gradient is the spring torque −k (θ − θ0) z wherever x_j ⟂ z, i.e. wherever
    ā_j is along z, which a Revolute or Cylindrical joint keeps; for a free relative rotation
    the torque about z alone is not a gradient (the gradient of θ has a component along x_j's
    projection, of relative size zᵀx_j / |x_j − (zᵀx_j) z|), so V is a potential of the RSDA
    on its documented pairing only. The damping power −c θ̇² is never positive.
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

    _rules: ClassVar[tuple[Rule, ...]] = (
        *(_direction(f) for f in ("axis_i", "axis_j", "ref_i", "ref_j")),
        *(
            Rule(
                (f"ref_{side}", f"axis_{side}"),
                perpendicular,
                f"is not perpendicular to axis_{side}",
                "give a reference direction ⟂ the axis, or build the RSDA with "
                "RotationalSpringDamper.at(q0, ..., axis=..., ref=...)",
            )
            for side in ("i", "j")
        ),
        *_SIGNS,
        Rule(
            ("rest_angle",),
            _principal,
            "is not in (−π, π] (θ is a principal value)",
            "give the rest angle θ0 in (−π, π] rad",
        ),
    )

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
        self.axis_i, self.axis_j = _vec(f"{name}.axis_i", axis_i), _vec(f"{name}.axis_j", axis_j)
        self.ref_i, self.ref_j = _vec(f"{name}.ref_i", ref_i), _vec(f"{name}.ref_j", ref_j)
        self.stiffness = _scalar(
            f"{name}.stiffness", stiffness, "give the stiffness k as one finite number in N m/rad"
        )
        self.damping = _scalar(
            f"{name}.damping", damping, "give the damping c as one finite number in N m s/rad"
        )
        self.rest_angle = _scalar(
            f"{name}.rest_angle", rest_angle, "give the rest angle θ0 in (−π, π] rad"
        )
        self.actuator = _actuator(name, actuator)
        enforce(self, name)

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
        if abs(np.dot(x, z)) > perpendicular_tol(_dtype_of(axis, ref)):
            raise ValueError(
                f"{name}: ref = {x.tolist()} is not perpendicular to axis = {z.tolist()} "
                f"(refᵀaxis = {np.dot(x, z):.3g}). Fix: give a reference direction ⟂ axis, or omit ref."
            )

        def local(b, v):
            if b == GROUND:
                return v.astype(kind)
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
            return (_rot_np(a / np.linalg.norm(a)).T @ v).astype(kind)

        kind = _dtype_of(axis, ref)  # stored as given: the frame rule reads it to its rounding
        return cls(
            body_i,
            body_j,
            axis_i=local(body_i, z),
            axis_j=local(body_j, z),
            ref_i=local(body_i, x),
            ref_j=local(body_j, x),
            **kwargs,
        )

    def bodies(self) -> tuple[int, ...]:
        return (self.body_i, self.body_j)

    def _geometry(self, state: State):
        """(z, θ, θ̇) of one system (world axis z, angle and rate)."""
        dtype = state.q.dtype

        def frame(b, *vectors_body):
            """World vectors A x̄ and world angular velocity R ω / s of body b."""
            vs = [jnp.asarray(x, dtype) for x in vectors_body]
            if b == GROUND:
                return vs, jnp.zeros(3, dtype)
            attitude, omega_body = state.q[b, 3:7], state.u[b, 4:7]
            omega_world = quat.rotate(attitude, omega_body) / quat.norm2(attitude)
            return [quat.transform(attitude, x) for x in vs], omega_world

        (z, x_i), omega_i = frame(self.body_i, self.axis_i, self.ref_i)
        (x_j,), omega_j = frame(self.body_j, self.ref_j)
        z = z / jnp.sqrt(jnp.dot(z, z))
        theta = jnp.arctan2(jnp.dot(z, jnp.cross(x_i, x_j)), jnp.dot(x_i, x_j))
        return z, theta, jnp.dot(z, omega_j - omega_i)

    def angle_and_rate(self, model, state: State):
        """(θ, θ̇) [rad, rad/s] at ``state`` (any leading batch axes)."""

        def one(st):
            _, theta, rate = self._geometry(st)
            return theta, rate

        return _over_batch(one, state)

    def wrench(self, model, t, state: State) -> Wrench:
        dtype = state.q.dtype
        z, theta, rate = self._geometry(state)
        k, c, th0 = (jnp.asarray(x, dtype) for x in (self.stiffness, self.damping, self.rest_angle))
        tau = -(k * (theta - th0) + c * rate)
        if self.actuator is not None:
            tau = tau + self.actuator(t, theta, rate)
        out = Wrench.zeros(model.nb, dtype)
        for b, torque in ((self.body_i, -tau * z), (self.body_j, tau * z)):
            if b != GROUND:
                out = out.add_couple(b, state.q[b, 3:7], torque)
        return out

    _engine_kernel = staticmethod(kernels.rsda)  # several evaluated together
    _engine_power = staticmethod(kernels.rsda_power)  # the work monitor's power
    _body_fields = ("body_i", "body_j")

    def _engine_resultants(self, model, t, q, u):
        return kernels.rsda(self, model, t, q, u)

    def _engine_nonconservative(self, model):
        # V is the spring's potential only where a joint keeps the axes parallel
        return _without_spring(self) if _on_parallel_joint(self, model) else None

    def _engine_potential(self, model, t, q):
        return kernels.rsda_potential(self, model, t, q)

    def _engine_energy_scale(self, model, t, q):
        return kernels.rsda_potential(self, model, t, q, scale=True)

    def _energy_balance(self, model) -> str | None:
        # V is a potential only where the axes stay parallel: a joint must keep them so
        return _spring_balance(self) if _on_parallel_joint(self, model) else None


@validates_inputs
class AxialSpringDamper(AbstractForce):
    """Spring–damper–actuator along a sliding axis: the force element of a prismatic joint
    (the translational counterpart of :class:`RotationalSpringDamper`; ME751 TSDA along a
    translational joint, Negrut ME751).

    The joint points are s̄_i on body i and s̄_j on body j (body axes, relative to each centre
    of mass; ``GROUND``: world), the axis ā_i is in body i axes. With P = r + A s̄ and the unit
    world axis z = A_i ā_i / |A_i ā_i|, the displacement and its rate are

        x = zᵀ (P_j − P_i),     ẋ = d/dt x    (a jvp along q̇ = kinematics(q, u)),

    and the force magnitude is f = −k (x − x0) − c ẋ + h(t, x, ẋ) [N]. The force f z acts on
    body j at P_j and −f z on body i at the same world point P_j, so the pair has no net
    moment, and on a Translational or Cylindrical joint its power is exactly f ẋ. x = 0 where
    the two points coincide: build it with :meth:`at` so that x = 0 in the reference
    configuration (MuJoCo's slide joint: x = qpos − ref).

    ``stiffness`` k [N/m], ``damping`` c [N s/m], ``rest_length`` x0 [m] (any sign) and the
    vectors are differentiable leaves; ``actuator`` h(t, x, ẋ) -> force [N] is an optional JAX
    function or equinox Module (:class:`rbjax.Actuator`).

    Energy: :func:`rbjax.potential_energy` includes V = ½ k (x − x0)². For a rigid body i its
    gradient is the spring force in every configuration: a virtual motion changes x by
    δx = zᵀ(δP_j − δP_i'), with P_i' the material point of body i at P_j where −f z acts (the
    turn of z and the move of P_i cancel). A scalable body i adds (δs/s) x to δx, which the
    force does not see: there V is exact only at x = 0.
    """

    body_i: int = eqx.field(static=True)
    body_j: int = eqx.field(static=True)
    s_i: Float[Array, "3"]
    s_j: Float[Array, "3"]
    axis_i: Float[Array, "3"]
    stiffness: Float[Array, ""]
    damping: Float[Array, ""]
    rest_length: Float[Array, ""]
    actuator: Callable[..., Any] | None

    _rules: ClassVar[tuple[Rule, ...]] = (_direction("axis_i"), *_SIGNS)

    def __init__(
        self,
        body_i: int,
        body_j: int,
        *,
        s_i,
        s_j,
        axis_i,
        stiffness=0.0,
        damping=0.0,
        rest_length=0.0,
        actuator: Callable[..., Any] | None = None,
    ):
        name = "AxialSpringDamper"
        self.body_i, self.body_j = _bodies(name, body_i, body_j)
        self.s_i = _vec(f"{name}.s_i", s_i)
        self.s_j = _vec(f"{name}.s_j", s_j)
        self.axis_i = _vec(f"{name}.axis_i", axis_i)
        self.stiffness = _scalar(
            f"{name}.stiffness", stiffness, "give the stiffness k as one finite number in N/m"
        )
        self.damping = _scalar(
            f"{name}.damping", damping, "give the damping c as one finite number in N s/m"
        )
        self.rest_length = _scalar(
            f"{name}.rest_length", rest_length, "give the rest displacement x0 in m"
        )
        self.actuator = _actuator(name, actuator)
        enforce(self, name)

    @classmethod
    def at(cls, q0, body_i: int, body_j: int, *, point, axis, **kwargs) -> AxialSpringDamper:
        """Build it from a configuration q0 (nb, 7) and world data: the joint ``point`` and
        ``axis`` in q0 become s̄ = Aᵀ(point − r) on both bodies and ā_i = A_iᵀ axis, so x = 0
        in q0. Other keyword arguments go to the constructor."""
        name = f"{cls.__name__}.at"
        q0 = np.asarray(q0, dtype=float)
        if q0.ndim != 2 or q0.shape[-1] != 7:
            raise ValueError(
                f"{name}: q0 has shape {q0.shape}, expected (nb, 7). "
                "Fix: pass one system's coordinates, e.g. state.q."
            )
        z = _unit(f"{name} axis", axis)
        p = np.asarray(point, dtype=float)

        def local(b, v, origin):
            if b == GROUND:
                return v
            if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or not 0 <= b < len(q0):
                raise ValueError(
                    f"{name}: body {b!r} is not an index into q0 (nb = {q0.shape[0]}) or "
                    "GROUND. Fix: use a body index in [0, nb) or rbjax.GROUND."
                )
            a = q0[b, 3:7]
            return _rot_np(a / np.linalg.norm(a)).T @ (v - (q0[b, 0:3] if origin else 0.0))

        return cls(
            body_i,
            body_j,
            s_i=local(body_i, p, True),
            s_j=local(body_j, p, True),
            axis_i=local(body_i, z, False),
            **kwargs,
        )

    def bodies(self) -> tuple[int, ...]:
        return (self.body_i, self.body_j)

    def _geometry(self, model, state: State):
        """(z, P_j, x, ẋ) of one system."""
        dtype = state.q.dtype

        def placed(q):
            def world(b, s, free):
                s = jnp.asarray(s, dtype)
                if b == GROUND:
                    return s
                return (q[b, 0:3] if free else 0.0) + quat.transform(q[b, 3:7], s)

            z = world(self.body_i, self.axis_i, False)
            z = z / jnp.sqrt(jnp.dot(z, z))
            p_j = world(self.body_j, self.s_j, True)
            return z, p_j, jnp.dot(z, p_j - world(self.body_i, self.s_i, True))

        q_dot = jax.vmap(model.formulation.kinematics)(state.q, state.u)
        (z, p_j, x), (_, _, rate) = jax.jvp(placed, (state.q,), (q_dot,))
        return z, p_j, x, rate

    def displacement_and_rate(self, model, state: State):
        """(x, ẋ) [m, m/s] at ``state`` (any leading batch axes)."""

        def one(st):
            _, _, x, rate = self._geometry(model, st)
            return x, rate

        return _over_batch(one, state)

    def wrench(self, model, t, state: State) -> Wrench:
        dtype = state.q.dtype
        z, p_j, x, rate = self._geometry(model, state)
        k, c, x0 = (jnp.asarray(v, dtype) for v in (self.stiffness, self.damping, self.rest_length))
        f = -(k * (x - x0) + c * rate)
        if self.actuator is not None:
            f = f + self.actuator(t, x, rate)
        out = Wrench.zeros(model.nb, dtype)
        for b, force in ((self.body_i, -f * z), (self.body_j, f * z)):
            if b != GROUND:
                a = state.q[b, 3:7]  # the material point of body b at P_j (eq. (75))
                rho = quat.rotate_inverse(a, p_j - state.q[b, 0:3]) / quat.norm2(a)
                out = out.add_point_force(b, a, rho, force)
        return out

    def _engine_nonconservative(self, model):
        if self.body_i != GROUND and model.scalable[self.body_i]:
            return None  # body i's scaling changes x: V is not the spring's potential
        return _without_spring(self)

    def _engine_potential(self, model, t, q):
        return kernels.axial_potential(self, model, t, q)

    def _engine_energy_scale(self, model, t, q):
        return kernels.axial_potential(self, model, t, q, scale=True)

    def _energy_balance(self, model) -> str | None:
        if self.body_i != GROUND and model.scalable[self.body_i]:
            return None  # body i's scaling changes x without the force doing work
        return _spring_balance(self)
