"""Loops and couplings of a tree in joint coordinates, closed exactly by multipliers.

A tree's joints are its coordinates; what closes a loop (MuJoCo's ``connect`` and ``weld``) or
couples two joints (MuJoCo's ``joint`` equality) is an equation g(q) = 0 between them. It is
held as a perfect bilateral constraint (seed 003; Udwadia & Kalaba's fundamental equation,
seed 001): its velocity Jacobian J (ġ = J q̇) adds the generalized force Jᵀλ,

    M q̈ = τ − b + Jᵀλ,        J q̈ = −J̇ q̇ − 2α J q̇ − β² g,

the second the constraint differentiated twice in time, with Baumgarte's optional
stabilisation (α, β ≥ 0, ``JointModel(baumgarte=(α, β))``; Baumgarte 1972). Eliminating q̈
with the Cholesky factor M = L Lᵀ (Featherstone 2008, §8.1, "the Lagrangian approach"):

    (J M⁻¹ Jᵀ) λ = −J̇ q̇ − J M⁻¹(τ − b) − 2α J q̇ − β² g,      q̈ = M⁻¹(τ − b + Jᵀλ).

**Redundancy.** A planar four-bar closed by a ``connect`` has three equations of which two are
independent: J M⁻¹ Jᵀ is singular and only Jᵀλ is determined. The solve takes the same
rank-revealing route as maximal coordinates (rbjax/_engine/rank.py): a Cholesky
factorisation whose pivots say whether any row depends on the earlier ones, and in that case
(a ``jax.lax.cond``, decided on values) the minimum-norm multipliers λ = (J M⁻¹ Jᵀ)⁺ r of the
truncated eigendecomposition (Udwadia & Schutte 2010, seed 001, eq. (45)).

**The equations** (world axes; x_b, R_b the pose of body b, world = identity):

* :class:`Connect`: a point of body 1 and a point of body 2 coincide,
  g = (x₁ + R₁ a₁) − (x₂ + R₂ a₂), J = J_p(1, p₁) − J_p(2, p₂), with the point Jacobian
  J_p(b, p) whose column d is v_d + ω_d × (p − O) for the DOFs that move b (the motion
  subspace (ω_d, v_d) about O, rbjax/_tree/kinematics.py). λ (3) is the force on body 1 at
  its point (−λ on body 2).
* :class:`Weld`: also a frame of body 1 and a frame of body 2 align, E = (R₁F₁)(R₂F₂)ᵀ = 1;
  three more rows g = ½ vee(E − Eᵀ) (the rotation vector to first order, sin θ n), whose
  rate at E = 1 is ω₁ − ω₂: J rows ω₁ − ω₂. λ (6): force and torque (world axes, the torque
  about the weld point) on body 1.
* :class:`JointCoupling`: MuJoCo's joint equality between hinge/slide coordinates,
  g = (q₁ − q₁⁰) − Σₖ cₖ (q₂ − q₂⁰)ᵏ (k = 0..4), J = e₁ − p′(q₂ − q₂⁰) e₂; without a second
  joint, q₁ = q₁⁰ + c₀. λ: the generalized force on joint 1.

J̇ q̇ is the time derivative of J(q) q̇ at q̈ = 0, in closed form from the velocity-product
accelerations of the recursive Newton–Euler pass (rbjax/_tree/dynamics.py ``body_motion``):
a point's acceleration a_O + ω̇ × (p − O) + ω × v_p, a body's ω̇, a coupling's −p″(x₂) q̇₂²
(Featherstone 2008, §2.11). It replaces a forward-mode product of J(q) q̇ along q̇, which
traced the kinematics a second time and differentiated them.
"""

from __future__ import annotations

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._engine.kernels import cross
from .._engine.rank import any_deficient, deficient, guarded
from .._errors import checked_array
from .dynamics import body_motion
from .kinematics import Frames, frames, matmul, matvec, motion_subspace
from .topology import HINGE, SLIDE


def _bc(x, tail):
    """A (3,) or (3, 3) constant shaped to broadcast against (3, *tail) arrays."""
    return jnp.asarray(x).reshape(jnp.shape(x) + (1,) * len(tail))


def _point(f: Frames, b: int, local, tail):
    """The world position (3, *tail) of the point ``local`` of body b (b = −1: the world)."""
    if b < 0:
        return jnp.broadcast_to(_bc(local, tail), (3,) + tail)
    return f.p[:, b] + matvec(f.R[:, :, b], jnp.broadcast_to(_bc(local, tail), (3,) + tail))


def _axes(f: Frames, b: int, local, tail):
    """The world axes (3, 3, *tail) of the frame ``local`` (3, 3) fixed in body b."""
    if b < 0:
        return jnp.broadcast_to(_bc(local, tail), (3, 3) + tail)
    return matmul(f.R[:, :, b], jnp.broadcast_to(_bc(local, tail), (3, 3) + tail))


def _mask(topo, b: int, tail):
    m = np.zeros(topo.nv, bool) if b < 0 else np.asarray(topo.body_dofs[b], bool)
    return m.reshape((1, -1) + (1,) * len(tail))


def _point_jacobian(topo, f: Frames, S, b: int, p, tail):
    """J_p(b, p) (3, nv, *tail): the world velocity of the point p moving with body b."""
    if b < 0:
        return jnp.zeros((3, topo.nv) + tail, p.dtype)
    o = f.origin[:, b]
    cols = S[3:] + cross(S[:3], (p - o)[:, None])
    return jnp.where(_mask(topo, b, tail), cols, 0.0)


def _angular_jacobian(topo, S, b: int, tail):
    """The rows (3, nv, *tail) of body b's world angular velocity."""
    if b < 0:
        return jnp.zeros((3, topo.nv) + tail, S.dtype)
    return jnp.where(_mask(topo, b, tail), S[:3], 0.0)


def _point_bias(f: Frames, V, A, b: int, p, tail):
    """The acceleration (3, *tail) at q̈ = 0 of the point p moving with body b (zero for the
    world): with the body's spatial velocity (ω, v_O) and velocity-product acceleration
    (ω̇, a_O) about its tree's point O (rbjax/_tree/dynamics.py ``body_motion``), the
    point's velocity is v_p = v_O + ω × (p − O) and its acceleration
    a_O + ω̇ × (p − O) + ω × v_p (Featherstone 2008, §2.11: the classical acceleration
    from the spatial one)."""
    if b < 0:
        return jnp.zeros((3,) + tail, p.dtype)
    r = p - f.origin[:, b]
    w, v_o, wd, a_o = V[:3, b], V[3:, b], A[:3, b], A[3:, b]
    return a_o + cross(wd, r) + cross(w, v_o + cross(w, r))


def _angular_bias(A, b: int, tail, dtype):
    """ω̇ (3, *tail) of body b at q̈ = 0 (zero for the world)."""
    return jnp.zeros((3,) + tail, dtype) if b < 0 else A[:3, b]


class AbstractEquality(eqx.Module):
    """An equation g(q) = 0 of a :class:`rbjax.JointModel`, held by a multiplier (module
    docstring). ``rows`` equations; :meth:`residual` g (rows, *batch) and :meth:`jacobian`
    J (rows, nv, *batch) on component-first arrays; ``name`` as in the model file."""

    name: str = eqx.field(static=True)

    @property
    @abc.abstractmethod
    def rows(self) -> int: ...

    @abc.abstractmethod
    def residual(self, model, q, f: Frames): ...

    @abc.abstractmethod
    def jacobian(self, model, q, f: Frames, S): ...

    @abc.abstractmethod
    def velocity_product(self, model, q, u, f: Frames, V, A):
        """J̇ q̇ (rows, *batch): the time derivative of J(q) q̇ at q̈ = 0, from the bodies'
        spatial velocities V and velocity-product accelerations A (6, nb, *batch)
        (rbjax/_tree/dynamics.py ``body_motion``)."""

    def body_forces(self, model, q, f: Frames, lam):
        """The spatial forces (6, nb, *batch) about each tree's O that multipliers ``lam``
        (rows, *batch) exert on the bodies (zero for an equation between joint coordinates,
        whose force is generalized: Jᵀλ along the joints' own DOFs)."""
        return jnp.zeros((6, model.topology.nb) + q.shape[1:], q.dtype)

    def _wrench_on(self, model, f: Frames, b: int, point, force, torque=None):
        """(6, nb, *batch): ``force`` at ``point`` (and a couple ``torque``) on body b."""
        tail = force.shape[1:]
        out = jnp.zeros((6, model.topology.nb) + tail, force.dtype)
        if b < 0:
            return out
        moment = cross(point - f.origin[:, b], force)
        if torque is not None:
            moment = moment + torque
        return out.at[:, b].set(jnp.concatenate([moment, force], axis=0))

    def check(self, topo) -> None:
        """ValueError naming the field when the equation does not fit the tree."""
        for field in ("body1", "body2"):
            b = getattr(self, field, None)
            if b is not None and not -1 <= b < topo.nb:
                raise ValueError(
                    f"{type(self).__name__}({self.name!r}).{field} = {b} is not a body of the "
                    f"model (0..{topo.nb - 1}, or -1 for the world). Fix: give a body index."
                )


def _vector(field, x, shape):
    return checked_array(field, x, shape, f"give {shape} finite numbers")


class Connect(AbstractEquality):
    """The point ``anchor1`` of ``body1`` and the point ``anchor2`` of ``body2`` coincide
    (MuJoCo's ``connect``; a ball joint closing a loop). Bodies by index, −1 the world;
    anchors in the body's frame (module docstring). Multipliers: the force on body 1 [N]."""

    body1: int = eqx.field(static=True)
    body2: int = eqx.field(static=True)
    anchor1: Float[Array, "3"]
    anchor2: Float[Array, "3"]

    def __init__(self, body1: int, body2: int, anchor1, anchor2, *, name: str = "connect"):
        self.body1, self.body2, self.name = int(body1), int(body2), str(name)
        self.anchor1 = _vector(f"Connect({name!r}).anchor1", anchor1, (3,))
        self.anchor2 = _vector(f"Connect({name!r}).anchor2", anchor2, (3,))

    @property
    def rows(self) -> int:
        return 3

    def residual(self, model, q, f):
        tail = q.shape[1:]
        return _point(f, self.body1, self.anchor1, tail) - _point(f, self.body2, self.anchor2, tail)

    def jacobian(self, model, q, f, S):
        tail = q.shape[1:]
        topo = model.topology
        p1 = _point(f, self.body1, self.anchor1, tail)
        p2 = _point(f, self.body2, self.anchor2, tail)
        return _point_jacobian(topo, f, S, self.body1, p1, tail) - _point_jacobian(
            topo, f, S, self.body2, p2, tail
        )

    def velocity_product(self, model, q, u, f, V, A):
        tail = q.shape[1:]
        p1 = _point(f, self.body1, self.anchor1, tail)
        p2 = _point(f, self.body2, self.anchor2, tail)
        return _point_bias(f, V, A, self.body1, p1, tail) - _point_bias(
            f, V, A, self.body2, p2, tail
        )

    def body_forces(self, model, q, f, lam):
        tail = q.shape[1:]
        p1 = _point(f, self.body1, self.anchor1, tail)
        p2 = _point(f, self.body2, self.anchor2, tail)
        return self._wrench_on(model, f, self.body1, p1, lam) + self._wrench_on(
            model, f, self.body2, p2, -lam
        )


class Weld(AbstractEquality):
    """``body1`` and ``body2`` held together (MuJoCo's ``weld``): the point ``anchor1`` of body
    1 coincides with ``anchor2`` of body 2, and the frame ``frame1`` (3, 3, columns its axes in
    body 1's frame) with ``frame2`` of body 2. Multipliers: force [N] and torque about the weld
    point [N m] on body 1, world axes (module docstring)."""

    body1: int = eqx.field(static=True)
    body2: int = eqx.field(static=True)
    anchor1: Float[Array, "3"]
    anchor2: Float[Array, "3"]
    frame1: Float[Array, "3 3"]
    frame2: Float[Array, "3 3"]

    def __init__(
        self,
        body1: int,
        body2: int,
        anchor1,
        anchor2,
        frame1=None,
        frame2=None,
        *,
        name: str = "weld",
    ):
        self.body1, self.body2, self.name = int(body1), int(body2), str(name)
        self.anchor1 = _vector(f"Weld({name!r}).anchor1", anchor1, (3,))
        self.anchor2 = _vector(f"Weld({name!r}).anchor2", anchor2, (3,))
        eye = np.eye(3)
        self.frame1 = _vector(f"Weld({name!r}).frame1", eye if frame1 is None else frame1, (3, 3))
        self.frame2 = _vector(f"Weld({name!r}).frame2", eye if frame2 is None else frame2, (3, 3))

    @property
    def rows(self) -> int:
        return 6

    def residual(self, model, q, f):
        tail = q.shape[1:]
        dp = _point(f, self.body1, self.anchor1, tail) - _point(f, self.body2, self.anchor2, tail)
        a1 = _axes(f, self.body1, self.frame1, tail)
        a2 = _axes(f, self.body2, self.frame2, tail)
        E = matmul(a1, jnp.swapaxes(a2, 0, 1))
        rot = 0.5 * jnp.stack([E[2, 1] - E[1, 2], E[0, 2] - E[2, 0], E[1, 0] - E[0, 1]])
        return jnp.concatenate([dp, rot], axis=0)

    def jacobian(self, model, q, f, S):
        tail = q.shape[1:]
        topo = model.topology
        p1 = _point(f, self.body1, self.anchor1, tail)
        p2 = _point(f, self.body2, self.anchor2, tail)
        lin = _point_jacobian(topo, f, S, self.body1, p1, tail) - _point_jacobian(
            topo, f, S, self.body2, p2, tail
        )
        ang = _angular_jacobian(topo, S, self.body1, tail) - _angular_jacobian(
            topo, S, self.body2, tail
        )
        return jnp.concatenate([lin, ang], axis=0)

    def velocity_product(self, model, q, u, f, V, A):
        tail = q.shape[1:]
        p1 = _point(f, self.body1, self.anchor1, tail)
        p2 = _point(f, self.body2, self.anchor2, tail)
        lin = _point_bias(f, V, A, self.body1, p1, tail) - _point_bias(
            f, V, A, self.body2, p2, tail
        )
        ang = _angular_bias(A, self.body1, tail, q.dtype) - _angular_bias(
            A, self.body2, tail, q.dtype
        )
        return jnp.concatenate([lin, ang], axis=0)

    def body_forces(self, model, q, f, lam):
        tail = q.shape[1:]
        p1 = _point(f, self.body1, self.anchor1, tail)
        p2 = _point(f, self.body2, self.anchor2, tail)
        return self._wrench_on(model, f, self.body1, p1, lam[:3], lam[3:]) + self._wrench_on(
            model, f, self.body2, p2, -lam[:3], -lam[3:]
        )


class JointCoupling(AbstractEquality):
    """MuJoCo's joint equality: hinge/slide ``joint1``'s displacement from qpos0 is the
    quartic Σₖ polycoef[k] (q₂ − q₂⁰)ᵏ of ``joint2``'s (−1: none, then q₁ = q₁⁰ + c₀).
    Multiplier: the generalized force on joint 1 [N m or N]."""

    joint1: int = eqx.field(static=True)
    joint2: int = eqx.field(static=True)
    polycoef: Float[Array, "5"]

    def __init__(self, joint1: int, joint2: int, polycoef, *, name: str = "joint"):
        self.joint1, self.joint2, self.name = int(joint1), int(joint2), str(name)
        self.polycoef = _vector(f"JointCoupling({name!r}).polycoef", polycoef, (5,))

    @property
    def rows(self) -> int:
        return 1

    def check(self, topo) -> None:
        for field in ("joint1", "joint2"):
            j = getattr(self, field)
            if field == "joint2" and j == -1:
                continue
            if not 0 <= j < topo.nj or topo.joint_types[j] not in (HINGE, SLIDE):
                raise ValueError(
                    f"JointCoupling({self.name!r}).{field} = {j} is not a hinge or slide joint "
                    "of the model. Fix: couple hinge or slide joints by their index."
                )

    def _x(self, model, q, j):
        a = model.topology.qposadr[j]
        return q[a] - model.qpos0[a]

    def residual(self, model, q, f):
        c = self.polycoef
        x1 = self._x(model, q, self.joint1)
        if self.joint2 < 0:
            return (x1 - c[0])[None]
        x2 = self._x(model, q, self.joint2)
        poly = c[0] + x2 * (c[1] + x2 * (c[2] + x2 * (c[3] + x2 * c[4])))
        return (x1 - poly)[None]

    def jacobian(self, model, q, f, S):
        topo = model.topology
        tail = q.shape[1:]
        J = jnp.zeros((1, topo.nv) + tail, q.dtype)
        J = J.at[0, topo.dofadr[self.joint1]].set(1.0)
        if self.joint2 >= 0:
            c = self.polycoef
            x2 = self._x(model, q, self.joint2)
            slope = c[1] + x2 * (2 * c[2] + x2 * (3 * c[3] + x2 * 4 * c[4]))
            J = J.at[0, topo.dofadr[self.joint2]].add(-slope)
        return J

    def velocity_product(self, model, q, u, f, V, A):
        # d/dt (q̇₁ − p′(x₂) q̇₂) at q̈ = 0 is −p″(x₂) q̇₂² (a hinge or slide: ẋ = q̇)
        if self.joint2 < 0:
            return jnp.zeros((1,) + q.shape[1:], q.dtype)
        c = self.polycoef
        x2 = self._x(model, q, self.joint2)
        curve = 2 * c[2] + x2 * (6 * c[3] + x2 * 12 * c[4])
        v2 = u[model.topology.dofadr[self.joint2]]
        return (-curve * v2 * v2)[None]


def rows(model, q, f: Frames, S):
    """(g (m, *batch), J (m, nv, *batch)) of all the model's equalities, stacked in order."""
    gs = [e.residual(model, q, f) for e in model.equalities]
    Js = [e.jacobian(model, q, f, S) for e in model.equalities]
    return jnp.concatenate(gs, axis=0), jnp.concatenate(Js, axis=0)


def constraint_rhs(model, q, u, f: Frames, S):
    """(J (m, nv, *batch), r (m, *batch)) of J q̈ = r (module docstring)."""
    g, J = rows(model, q, f, S)
    Ju = jnp.sum(J * u[None], axis=1)
    V, A = body_motion(model.topology, S, u)
    r = -jnp.concatenate([e.velocity_product(model, q, u, f, V, A) for e in model.equalities])
    if model.baumgarte is not None:
        alpha, beta = model.baumgarte
        r = r - 2.0 * alpha * Ju - beta * beta * g
    return J, r


def constrained_solve(M, rhs, J, r):
    """(q̈ (nv, *batch), λ (m, *batch)) of M q̈ = rhs + Jᵀλ, J q̈ = r (module docstring), for
    M (nv, nv, *batch) symmetric positive definite and J (m, nv, *batch)."""
    to_last = lambda x: jnp.moveaxis(x, 0, -1)  # noqa: E731
    Mb = to_last(to_last(M))  # (*batch, nv, nv)
    Jb = to_last(to_last(J))  # (*batch, m, nv)
    L = jax.lax.linalg.cholesky(Mb, symmetrize_input=False)

    def lsolve(x, transpose=False):
        return jax.lax.linalg.triangular_solve(
            L, x, left_side=True, lower=True, transpose_a=transpose
        )

    x_free = lsolve(lsolve(to_last(rhs)[..., None]), True)[..., 0]  # (*batch, nv)
    Y = lsolve(jnp.swapaxes(Jb, -1, -2))  # L⁻¹ Jᵀ (*batch, nv, m)
    A = jnp.swapaxes(Y, -1, -2) @ Y  # J M⁻¹ Jᵀ (*batch, m, m)
    s = to_last(r) - (Jb @ x_free[..., None])[..., 0]  # (*batch, m)
    La = jax.lax.linalg.cholesky(A, symmetrize_input=False)
    diag = jnp.diagonal(A, axis1=-2, axis2=-1)
    pivots = jnp.diagonal(La, axis1=-2, axis2=-1) ** 2
    bad = any_deficient(deficient(pivots, diag))

    def fast(rhs_m):  # rhs_m (m, *batch)
        b = to_last(rhs_m)[..., None]
        y = jax.lax.linalg.triangular_solve(La, b, left_side=True, lower=True)
        x = jax.lax.linalg.triangular_solve(La, y, left_side=True, lower=True, transpose_a=True)
        return jnp.moveaxis(x[..., 0], -1, 0)

    lam = guarded(bad, fast, lambda: A)(jnp.moveaxis(s, -1, 0))  # (m, *batch)
    lam_b = to_last(lam)[..., None]
    qacc = x_free + lsolve(Y @ lam_b, True)[..., 0]
    return jnp.moveaxis(qacc, -1, 0), lam


def assemble(model, qpos, qvel, *, tol: float = 1e-12, max_steps: int = 50):
    """One system's (qpos, qvel) put on the equalities g(q) = 0 by Gauss–Newton steps from
    qpos: each step δ = −M⁻¹Jᵀ(JM⁻¹Jᵀ)⁺g is the minimum-norm correction of the linearised
    equations in the kinetic-energy metric M of the current iterate (quaternions turned by
    exp; Udwadia & Kalaba's projection), until |g| <= ``tol``; then q̇ projected the same way
    onto J q̇ = 0. The end point is a closed configuration near qpos (to first order in g the
    M-metric projection), but not the closest one: it depends on the path the steps take
    (tests/data/mjx_constraints.xml keyframe 0: body centres of mass up to 0.29 m from
    maximal coordinates' closest point, rbjax/_engine/projection.py ``closest_point``).
    Returns (qpos, qvel, gap), gap the largest |g| and |J q̇| before. ValueError naming the
    equalities left open when g cannot reach ``tol`` (times the model's size) in
    ``max_steps`` steps. Host-side, at build time."""
    from .implicit import integrate_positions

    topo = model.topology
    q = jnp.asarray(qpos)
    v = jnp.asarray(qvel, q.dtype)

    @jax.jit
    def pieces(q):
        f = frames(topo, model, q)
        S = motion_subspace(topo, f)
        g, J = rows(model, q, f, S)
        return g, J, model.mass_matrix(q)

    def project(M, J, x):  # the M-metric minimum-norm correction −M⁻¹Jᵀ(JM⁻¹Jᵀ)⁺ x
        Mi_Jt = np.linalg.solve(M, J.T)
        return -Mi_Jt @ (np.linalg.pinv(J @ Mi_Jt, rcond=1e-10, hermitian=True) @ x)

    g, J, M = (np.asarray(a) for a in pieces(q))
    gap = max(float(np.abs(g).max()), float(np.abs(J @ np.asarray(v)).max()))
    scale = max(1.0, float(np.abs(np.asarray(model.body_pos)).max()))
    for _ in range(max_steps):
        if np.abs(g).max() <= tol * scale:
            break
        q = integrate_positions(topo, q, jnp.asarray(project(M, J, g), q.dtype), 1.0)
        g, J, M = (np.asarray(a) for a in pieces(q))
    if not np.abs(g).max() <= tol * scale * 100:
        k, names = 0, []
        for e in model.equalities:
            if np.abs(g[k : k + e.rows]).max() > tol * scale * 100:
                names.append(f"{e.name!r} (residual {np.abs(g[k : k + e.rows]).max():.3g})")
            k += e.rows
        raise ValueError(
            f"load: the equalities {', '.join(names)} cannot be closed from the initial qpos "
            f"in {max_steps} Gauss-Newton steps. Fix: start from coordinates closer to a "
            "closed configuration, or check the equalities' anchors."
        )
    v = np.asarray(v) + project(M, J, J @ np.asarray(v))
    return q, jnp.asarray(v, q.dtype), gap


def violations(model, qpos, qvel):
    """Per equality, the largest |g| and |J q̇| over the systems of concrete (..., nq),
    (..., nv) arrays: a list of (name, position gap, velocity gap). Host-side."""
    topo = model.topology
    q = jnp.moveaxis(jnp.asarray(qpos).reshape(-1, topo.nq), 0, -1)
    u = jnp.moveaxis(
        jnp.broadcast_to(jnp.asarray(qvel), jnp.shape(qpos)[:-1] + (topo.nv,)).reshape(-1, topo.nv),
        0,
        -1,
    )
    with jax.ensure_compile_time_eval():
        f = frames(topo, model, q)
        g, J = rows(model, q, f, motion_subspace(topo, f))
        gv = jnp.sum(J * u[None], axis=1)
    g, gv = np.abs(np.asarray(g)), np.abs(np.asarray(gv))
    out, k = [], 0
    for e in model.equalities:
        out.append((e.name, float(g[k : k + e.rows].max()), float(gv[k : k + e.rows].max())))
        k += e.rows
    return out


def assemble_state(model, state):
    """:func:`assemble` of every system of a :class:`rbjax.JointState` (batch-leading), as
    ``rbjax.assemble(JointModel, JointState)``: the Gauss–Newton end point of
    :func:`assemble` (a closed configuration near the input, not the closest one), velocities
    projected; a model without equalities returns the state with its ball/free quaternions
    normalised."""
    from .model import JointState

    topo = model.topology
    qpos = np.array(state.qpos)
    qvel = np.broadcast_to(np.asarray(state.qvel), qpos.shape[:-1] + (topo.nv,)).copy()
    flat_q, flat_v = qpos.reshape(-1, topo.nq), qvel.reshape(-1, topo.nv)
    for k, kind in enumerate(topo.joint_types):
        if kind in ("ball", "free"):
            a = topo.qposadr[k] + (3 if kind == "free" else 0)
            flat_q[:, a : a + 4] /= np.linalg.norm(flat_q[:, a : a + 4], axis=-1, keepdims=True)
    if model.equalities:
        for i in range(flat_q.shape[0]):
            q, v, _ = assemble(model, flat_q[i], flat_v[i])
            flat_q[i], flat_v[i] = np.asarray(q), np.asarray(v)
    return JointState(state.t, flat_q.reshape(qpos.shape), flat_v.reshape(qvel.shape))
