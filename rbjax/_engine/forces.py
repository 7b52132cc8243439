"""Applied forces in the engine's layout: per-body resultants (F, S_C, M_C) (Möller & Glocker 2012, eqs.
(75)-(76)) on component-first arrays, the kernels behind the built-in forces of
rbjax/_forces.py, and the adapter that evaluates a force written for one system.

``Resultants``: F (3, *batch, nb) world frame [N], S (*batch, nb) [N m], M (3, *batch, nb) body
frame [N m].
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .._topology import GROUND
from . import kernels as cf
from .layout import per_system, system_vector


class Resultants(eqx.Module):
    """Per-body resultants in component-first layout: F (3, ..., nb), S (..., nb), M (3, ..., nb)."""

    F: Array
    S: Array
    M: Array

    def __add__(self, other: Resultants) -> Resultants:
        return Resultants(self.F + other.F, self.S + other.S, self.M + other.M)


def _onehot(body, nb: int, dtype):
    """1 at ``body`` over the nb bodies: a static index, or a traced one (a group of forces
    evaluated under ``jax.vmap``, :func:`total_resultants`)."""
    if isinstance(body, (int, np.integer)):
        return jnp.zeros((nb,), dtype).at[body].set(1.0)
    return (jnp.arange(nb) == body).astype(dtype)


def _at_point(p, rho, f, mask) -> Resultants:
    """Resultants of the world force f at the body point ϱ of the body with quaternion p
    (Möller & Glocker 2012, eq. (75)): F = f, S_C = ϱᵀ Rᵀ f, M_C = ϱ × (Rᵀ f), each times the one-hot
    ``mask`` over bodies. Component-first; p (4, ...), ϱ and f (3, ...)."""
    f_body = cf.rotate_t(p, f)
    return Resultants(
        F=f * mask + jnp.zeros_like(f_body),
        S=cf.dot3(rho, f_body) * mask,
        M=cf.cross(rho, f_body) * mask,
    )


def _is_ground(b) -> bool:
    """Static: a traced body index (a group of forces) is never the ground."""
    return isinstance(b, (int, np.integer)) and b == GROUND


def _body_state(q, u, b):
    """(q_b, u_b) of body b ≠ GROUND as component-first (7, ..., 1) slices (b static: a
    batched slice of the (7, ..., nb) arrays; b traced: a dynamic slice)."""
    if isinstance(b, (int, np.integer)):
        return q[..., b : b + 1], u[..., b : b + 1]
    take = lambda x: jax.lax.dynamic_slice_in_dim(x, b, 1, axis=x.ndim - 1)
    return take(q), take(u)


def _pure_torque(p, tau, mask) -> Resultants:
    """Resultants of a pure torque (couple) τ, world frame, on the body with quaternion p:
    F = 0, S_C = 0, M_C = Rᵀ τ / s (s = |A|² = 1 for a rigid body: M_C = Rᵀ τ). The 1/s makes
    M_C the force conjugate to ω, the body angular velocity scaled by s (Möller & Glocker 2012, eq. (49))."""
    m = cf.rotate_t(p, tau) / cf.qnorm2(p) * mask
    return Resultants(F=jnp.zeros_like(m), S=jnp.zeros_like(m[0]), M=m)


def _sum(parts: list[Resultants]) -> Resultants:
    total = parts[0]
    for r in parts[1:]:
        total = total + r
    return total


def point(q, s):
    """World position r + A s̄ of the body point s̄ (component-first; A s̄ = s R s̄)."""
    return q[0:3] + cf.transform(q[3:7], s)


def resultants_per_system(force, model, t, q, u) -> Resultants:
    """The resultants of a force written for ONE system (``force.wrench(model, t, state)`` in
    the natural layout), evaluated on the engine's arrays by ``jax.vmap`` over the batch."""
    w = per_system(force.wrench, model, t, q, u)
    dtype = q.dtype
    return Resultants(
        F=jnp.moveaxis(jnp.asarray(w.force_world, dtype), -1, 0),
        S=jnp.asarray(w.scaling, dtype),
        M=jnp.moveaxis(jnp.asarray(w.moment_body, dtype), -1, 0),
    )


def point_force(force, model, t, q, u, bodies=None) -> Resultants:
    """rbjax.PointForce: a force at a body point (Möller & Glocker 2012, eq. (75)), fixed in the
    world (``frame="world"``: F = f) or in the body (``frame="body"``: F = R f̄, and then
    S_C = ϱᵀ f̄, M_C = ϱ × f̄ directly). ``bodies``: the body index (default
    ``(force.body,)``; see :func:`total_resultants`)."""
    (body,) = (force.body,) if bodies is None else bodies
    mask = _onehot(body, model.nb, q.dtype)
    f = system_vector(force.force_world, q)
    rho = system_vector(force.point_body, q)
    p = q[3:7]
    if force.frame == "world":
        return _at_point(p, rho, f, mask)
    f_world = cf.rotate(p, f)
    zero = jnp.zeros_like(f_world)
    return Resultants(
        F=f_world * mask,
        S=cf.dot3(rho, f) * mask + zero[0],
        M=cf.cross(rho, f) * mask + zero,
    )


def body_torque(force, model, t, q, u, bodies=None) -> Resultants:
    """rbjax.BodyTorque: a torque fixed in the body (``frame="body"``: M_C = τ̄) or in the world
    (``frame="world"``: the couple M_C = Rᵀ τ / s, :func:`_pure_torque`)."""
    (body,) = (force.body,) if bodies is None else bodies
    mask = _onehot(body, model.nb, q.dtype)
    tau = system_vector(force.torque_body, q)
    zero3 = jnp.zeros_like(q[0:3])
    if force.frame == "world":
        return _pure_torque(q[3:7], tau + zero3, mask)
    return Resultants(F=zero3, S=jnp.zeros_like(q[0]), M=tau * mask + zero3)


def _tsda_point(model, q, u, b, s):
    """(q_b, P, Ṗ) of the body point s̄ of body b: P = r + A s̄ and its velocity, the jvp of
    P(q) along q̇ = kinematics(q, u). GROUND: the world point s̄ at rest (q_b = None)."""
    s = system_vector(jnp.asarray(s, q.dtype), q)
    if _is_ground(b):
        return None, s, jnp.zeros_like(s)
    qb, ub = _body_state(q, u, b)
    kin = model.formulation._engine_kinematics
    p, v = jax.jvp(lambda x: point(x, s), (qb,), (kin(qb, ub),))
    return qb, p, v


def _pair(force, bodies):
    return (force.body_i, force.body_j) if bodies is None else bodies


def tsda_geometry(force, model, q, u, bodies=None):
    """(q_i, q_j, d, l, e, l̇) component-first; d, e (3, ..., 1), l, l̇ (..., 1)."""
    bi, bj = _pair(force, bodies)
    qi, pi, vi = _tsda_point(model, q, u, bi, force.s_i)
    qj, pj, vj = _tsda_point(model, q, u, bj, force.s_j)
    d = pj - pi
    l2 = cf.dot3(d, d)
    # double where: the sqrt and the division never see l = 0, on either branch
    safe = l2 > 0.0
    l_safe = jnp.sqrt(jnp.where(safe, l2, 1.0))
    l = jnp.where(safe, l_safe, 0.0)
    e = d / l_safe  # = 0 where d = 0
    return qi, qj, d, l, e, cf.dot3(e, vj - vi)


def tsda(force, model, t, q, u, bodies=None) -> Resultants:
    """rbjax.TranslationalSpringDamper (ME751 TSDA, Negrut ME751)."""
    bi, bj = _pair(force, bodies)
    qi, qj, d, l, e, ldot = tsda_geometry(force, model, q, u, (bi, bj))
    k = jnp.asarray(force.stiffness, q.dtype)
    c = jnp.asarray(force.damping, q.dtype)
    l0 = jnp.asarray(force.rest_length, q.dtype)
    rest = c * ldot - k * l0
    if force.actuator is not None:
        rest = rest + force.actuator(t, l, ldot)
    fe = k * d + rest * e  # f e with f = k (l − l0) + c l̇ + h, since k l e = k d
    parts = []
    for b, qb, s, f in ((bi, qi, force.s_i, fe), (bj, qj, force.s_j, -fe)):
        if qb is not None:
            rho = system_vector(jnp.asarray(s, q.dtype), q)
            parts.append(_at_point(qb[3:7], rho, f, _onehot(b, model.nb, q.dtype)))
    return _sum(parts)


def rsda_geometry(force, q, u, bodies=None):
    """(p_i, p_j, z, θ, θ̇) component-first; z (3, ..., 1), θ, θ̇ (..., 1); p = None for
    GROUND."""

    def frame(b, *vectors):
        """Quaternion, world vectors A x̄ and world angular velocity R ω / s of body b."""
        vs = [system_vector(jnp.asarray(x, q.dtype), q) for x in vectors]
        if _is_ground(b):
            return None, vs, jnp.zeros_like(vs[0])
        qb, ub = _body_state(q, u, b)
        p = qb[3:7]
        return p, [cf.transform(p, x) for x in vs], cf.rotate(p, ub[4:7]) / cf.qnorm2(p)

    bi, bj = _pair(force, bodies)
    pi, (z, xi), wi = frame(bi, force.axis_i, force.ref_i)
    pj, (xj,), wj = frame(bj, force.ref_j)
    z = z / jnp.sqrt(cf.dot3(z, z))
    theta = jnp.arctan2(cf.dot3(z, cf.cross(xi, xj)), cf.dot3(xi, xj))
    return pi, pj, z, theta, cf.dot3(z, wj - wi)


def rsda(force, model, t, q, u, bodies=None) -> Resultants:
    """rbjax.RotationalSpringDamper (ME751 RSDA, Negrut ME751)."""
    bi, bj = _pair(force, bodies)
    pi, pj, z, theta, theta_dot = rsda_geometry(force, q, u, (bi, bj))
    k = jnp.asarray(force.stiffness, q.dtype)
    c = jnp.asarray(force.damping, q.dtype)
    th0 = jnp.asarray(force.rest_angle, q.dtype)
    tau = -(k * (theta - th0) + c * theta_dot)
    if force.actuator is not None:
        tau = tau + force.actuator(t, theta, theta_dot)
    torque = tau * z
    parts = []
    for b, p, tq in ((bi, pi, -torque), (bj, pj, torque)):
        if p is not None:
            parts.append(_pure_torque(p, tq, _onehot(b, model.nb, q.dtype)))
    return _sum(parts)


def tsda_power(force, model, t, q, u, bodies=None) -> Array:
    """The power [W], (*batch,), of rbjax.TranslationalSpringDamper's damping and actuator:
    −(c l̇ + h) l̇ (its force f e on body i and −f e on body j with f = k (l − l0) + c l̇ + h;
    the spring's part is −dV/dt)."""
    *_, l, _, ldot = tsda_geometry(force, model, q, u, bodies)
    f = jnp.asarray(force.damping, q.dtype) * ldot
    if force.actuator is not None:
        f = f + force.actuator(t, l, ldot)
    return -(f * ldot)[..., 0]


def rsda_power(force, model, t, q, u, bodies=None) -> Array:
    """The power [W], (*batch,), of rbjax.RotationalSpringDamper's damping and actuator:
    (−c θ̇ + h) θ̇ (its torque τ z on body j and −τ z on body i, τ = −k (θ − θ0) − c θ̇ + h;
    the spring's part is −dV/dt)."""
    _, _, _, theta, theta_dot = rsda_geometry(force, q, u, bodies)
    tau = -jnp.asarray(force.damping, q.dtype) * theta_dot
    if force.actuator is not None:
        tau = tau + force.actuator(t, theta, theta_dot)
    return (tau * theta_dot)[..., 0]


# ------------------------------------------------------- potentials of the springs


def _placed(q, b, s, free=True):
    """World point r + A s̄ (``free``) or direction A s̄ of body b, component-first (3, ..., 1);
    GROUND: s̄ itself (world data)."""
    s = system_vector(jnp.asarray(s, q.dtype), q)
    if _is_ground(b):
        return s
    qb = q[..., b : b + 1]
    return point(qb, s) if free else cf.transform(qb[3:7], s)


def _spring_energy(k, x, x0, scale: bool) -> Array:
    """½ k (x − x0)², or with ``scale`` the magnitude of its terms ½ k (x² + x0²): what its
    rounding is relative to (a spring at rest length has V = 0 but a stretch x − x0 rounded
    to ε x0, which a step turns into ε-sized motion; rbjax/_engine/monitors.py)."""
    if scale:
        return (0.5 * k * (x * x + x0 * x0))[..., 0]
    stretch = x - x0
    return (0.5 * k * stretch * stretch)[..., 0]


def tsda_potential(force, model, t, q, scale: bool = False) -> Array:
    """V = ½ k (l − l0)² [J], (*batch,), of rbjax.TranslationalSpringDamper: the potential of
    its spring term k (l − l0) e (ME751 TSDA, Negrut ME751). l by the same double ``where`` as
    the force, so ∂V/∂d = k (l − l0) e away from l = 0 and 0 at l = 0, where the force is
    k d = 0. ``scale``: ½ k (l² + l0²) instead (:func:`_spring_energy`)."""
    d = _placed(q, force.body_j, force.s_j) - _placed(q, force.body_i, force.s_i)
    l2 = cf.dot3(d, d)
    safe = l2 > 0.0
    length = jnp.where(safe, jnp.sqrt(jnp.where(safe, l2, 1.0)), 0.0)
    k = jnp.asarray(force.stiffness, q.dtype)
    return _spring_energy(k, length, jnp.asarray(force.rest_length, q.dtype), scale)


def rsda_potential(force, model, t, q, scale: bool = False) -> Array:
    """V = ½ k (θ − θ0)² [J], (*batch,), of rbjax.RotationalSpringDamper, θ the principal
    value of :func:`rsda_geometry` (ME751 RSDA, Negrut ME751). ``scale``: ½ k (θ² + θ0²)."""
    _, _, _, theta, _ = rsda_geometry(force, q, jnp.zeros_like(q))
    k = jnp.asarray(force.stiffness, q.dtype)
    return _spring_energy(k, theta, jnp.asarray(force.rest_angle, q.dtype), scale)


def axial_potential(force, model, t, q, scale: bool = False) -> Array:
    """V = ½ k (x − x0)² [J], (*batch,), of rbjax.AxialSpringDamper, x = zᵀ (P_j − P_i) with
    the unit axis z = A_i ā_i / |A_i ā_i|. ``scale``: ½ k (x² + x0²)."""
    z = _placed(q, force.body_i, force.axis_i, free=False)
    z = z / jnp.sqrt(cf.dot3(z, z))
    x = cf.dot3(z, _placed(q, force.body_j, force.s_j) - _placed(q, force.body_i, force.s_i))
    k = jnp.asarray(force.stiffness, q.dtype)
    return _spring_energy(k, x, jnp.asarray(force.rest_length, q.dtype), scale)


def _group_key(force):
    """Forces evaluated together: the same built-in type (``_engine_kernel``), the same sides on
    the ground, and the same fields apart from the bodies, every one an array of the same shape
    or None (so no actuator function). None: the force is evaluated on its own."""
    cls = type(force)
    kernel = cls.__dict__.get("_engine_kernel")
    if kernel is None:
        return None
    sig = []
    for fld in dataclasses.fields(force):
        if fld.name in cls._body_fields:
            sig.append((fld.name, getattr(force, fld.name) == GROUND))
            continue
        v = getattr(force, fld.name)
        if fld.metadata.get("static", False):  # an option such as PointForce.frame
            if not isinstance(v, (str, bool, int, float, type(None))):
                return None
            sig.append((fld.name, "static", v))
            continue
        if v is None:
            sig.append((fld.name, None))
        elif eqx.is_array(v):
            sig.append((fld.name, v.shape, str(v.dtype)))
        else:
            return None
    return (cls, tuple(sig))


def _force_groups(forces) -> list[list]:
    groups: dict = {}
    alone = []
    for f in forces:
        key = _group_key(f)
        if key is None:
            alone.append([f])
        else:
            groups.setdefault(key, []).append(f)
    return list(groups.values()) + alone


def _group_resultants(group, model, t, q, u) -> Resultants:
    """The resultants of several forces of one type, traced ONCE: ``jax.vmap`` of the type's
    kernel over the forces' stacked fields and body indices (scatter into the bodies by a
    one-hot of the traced index). A robot's motor on every joint is one kernel in the
    program instead of one per joint, forward and reverse."""
    return _group_sum(group, type(group[0])._engine_kernel, model, t, q, u)


def _group_sum(group, kernel, model, t, q, u):
    """Σ over ``group`` (forces of one :func:`_group_key`) of ``kernel(force, model, t, q, u,
    bodies)``, traced once (:func:`_group_resultants`)."""
    first, cls = group[0], type(group[0])
    names = [  # the array fields; static options are the same across the group (its key)
        f.name
        for f in dataclasses.fields(first)
        if f.name not in cls._body_fields
        and not f.metadata.get("static", False)
        and getattr(first, f.name) is not None
    ]
    stacked = [jnp.stack([getattr(f, n) for f in group]) for n in names]
    sides = [n for n in cls._body_fields if getattr(first, n) != GROUND]
    index = [jnp.asarray([getattr(f, n) for f in group]) for n in sides]

    def one(values, idx):
        force = eqx.tree_at(lambda m: [getattr(m, n) for n in names], first, list(values))
        found = dict(zip(sides, idx, strict=True))
        bodies = tuple(found.get(n, GROUND) for n in cls._body_fields)
        return kernel(force, model, t, q, u, bodies)

    return jax.tree.map(lambda x: x.sum(0), jax.vmap(one)(stacked, index))


def total_resultants(model, t, q, u) -> Resultants:
    """Sum of gravity (F = m g at the centre of mass: S_C = 0, M_C = 0) and all model forces.
    Built-in forces of one type are evaluated together (:func:`_group_resultants`)."""
    g = system_vector(model.gravity, q)
    zero3 = jnp.zeros((3,) + q.shape[1:], q.dtype)
    total = Resultants(F=model.mass * g + zero3, S=jnp.zeros(q.shape[1:], q.dtype), M=zero3)
    return _add_forces(total, model.forces, model, t, q, u)


def _add_forces(total: Resultants, forces, model, t, q, u) -> Resultants:
    for group in _force_groups(forces):
        if len(group) > 1:
            total = total + _group_resultants(group, model, t, q, u)
        else:
            total = total + group[0]._engine_resultants(model, t, q, u)
    return total


# ------------------------------------------------------------ power and energy scales


def power(forces, model, t, q, u) -> Array:
    """The power [W], (*batch,), of ``forces`` (a sequence of the model's forces) that no
    potential accounts for:

        P = Σ_b (Fᵀ v + S_C ν + M_Cᵀ ω)_b  [+ Σ_f dV_f/dt]

    the power of the resultants (F, S_C, M_C) on u = (v, ν, ω) (Möller & Glocker 2012, eq.
    (92) with δu = u: the generalized force is conjugate to u, and the gyroscopic terms of eq.
    (93) do no work, so dT/dt = that power) of each force's non-conservative part
    (``_engine_nonconservative``: a spring–damper without its spring, k = 0, where V is the
    spring's potential; any other force whole). A spring–damper with a kernel of its own
    (``_engine_power``: :func:`tsda_power`, :func:`rsda_power`) gives that power from its
    geometry directly (half the program of its resultants). Where a spring's V is not its
    potential on the model's motions (an RSDA whose axes no joint keeps parallel, an axial
    spring on a scalable body), the whole force's power plus dV/dt, by a jvp along
    (ṫ, q̇) = (1, Q⁻¹ u), of the V that :func:`rbjax.potential_energy` counts in E. Then
    d(T + V)/dt = P for a model whose joints do not depend on time (their reactions do no
    work). Forces of one type are evaluated together, as in the dynamics."""
    p = jnp.zeros(q.shape[1:-1], q.dtype)
    rest, inexact = [], []
    for group in _force_groups(forces):
        parts = [f._engine_nonconservative(model) for f in group]
        inexact += [f for f, part in zip(group, parts, strict=True) if part is None]
        exact = [f for f, part in zip(group, parts, strict=True) if part is not None]
        kernel = type(group[0]).__dict__.get("_engine_power")
        if kernel is None:
            rest += [part for part in parts if part is not None]
        elif len(exact) > 1:
            p = p + _group_sum(exact, kernel, model, t, q, u)
        elif exact:
            p = p + kernel(exact[0], model, t, q, u)
    rest += inexact
    if rest:
        zero3 = jnp.zeros((3,) + q.shape[1:], q.dtype)
        none = Resultants(F=zero3, S=jnp.zeros(q.shape[1:], q.dtype), M=zero3)
        res = _add_forces(none, rest, model, t, q, u)
        pb = cf.dot3(res.F, u[0:3]) + res.S * u[3] + cf.dot3(res.M, u[4:7])
        p = p + jnp.sum(pb, axis=-1)
    if inexact:

        def v(tt, qq):
            return sum(f._engine_potential(model, tt, qq) for f in inexact)

        qdot = model.formulation._engine_kinematics(q, u)
        p = p + jax.jvp(v, (t, q), (jnp.ones_like(t), qdot))[1]
    return p
