"""Contact geometry against a plane: spheres, capsules and boxes on the bodies of a tree, and
the gaps, frames and velocities of their candidate contact points.

Against a plane, each of these shapes touches at one of a fixed set of candidate points, which
keeps every array's shape static (one row per candidate, closed or not): a sphere at its
centre minus its radius along the normal, a capsule at either end sphere, a box at any of its
eight corners (the deepest points of a face or an edge lying on the plane are corners too; a
face resting flat touches at four, an edge at two). The gap of a candidate with centre c and
radius r is g = n·(c − p₀) − r; its contact point is c − r n, and its velocity
v_p = v + ω × (p − x_com) of the body's centre-of-mass velocity v and angular velocity ω.

The contact frame is (n, t₁, t₂), with t₁, t₂ a fixed orthonormal basis of the plane: the
contact velocities γ = (n·v_p, t₁·v_p, t₂·v_p) are linear in q̇ (W = ∂γ/∂q̇ by forward-mode
autodiff, exact).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import _quaternion as quat
from .._errors import fail


def _vec(field: str, v, n: int, fix: str) -> np.ndarray:
    a = np.asarray(v, dtype=float)
    if a.shape != (n,) or not np.all(np.isfinite(a)):
        fail(field, v, f"is not {n} finite numbers", fix)
    return a


def _positive(field: str, v, fix: str) -> float:
    if not (isinstance(v, int | float | np.integer | np.floating) and np.isfinite(v) and v > 0):
        fail(field, v, "is not a finite number > 0", fix)
    return float(v)


def _rotation(field: str, q) -> np.ndarray:
    a = _vec(field, q, 4, "give a quaternion [w, x, y, z] (scalar first)")
    norm = np.linalg.norm(a)
    if not norm > 0:
        fail(field, q, "is zero", "give a quaternion [w, x, y, z], e.g. [1, 0, 0, 0]")
    return np.asarray(quat.rotation_matrix(jnp.asarray(a / norm)))


class Sphere(eqx.Module):
    """A sphere of ``radius`` [m] on ``body`` (a body name), its centre at ``pos`` in body
    axes (default the body frame's origin)."""

    body: str = eqx.field(static=True)
    radius: float = eqx.field(static=True)
    pos: tuple = eqx.field(static=True, default=(0.0, 0.0, 0.0))

    def candidates(self) -> tuple[np.ndarray, np.ndarray]:
        """(points (k, 3) in body axes, radii (k,))."""
        r = _positive(f"Sphere({self.body!r}).radius", self.radius, "give the radius in m")
        c = _vec(f"Sphere({self.body!r}).pos", self.pos, 3, "give the centre [x, y, z]")
        return c[None], np.array([r])


class Capsule(eqx.Module):
    """A capsule of ``radius`` [m] on ``body``: the points within ``radius`` of a segment of
    half length ``half_length`` along the z axis of a frame at ``pos``, ``quat`` in body axes
    (MJCF's capsule)."""

    body: str = eqx.field(static=True)
    radius: float = eqx.field(static=True)
    half_length: float = eqx.field(static=True)
    pos: tuple = eqx.field(static=True, default=(0.0, 0.0, 0.0))
    quat: tuple = eqx.field(static=True, default=(1.0, 0.0, 0.0, 0.0))

    def candidates(self) -> tuple[np.ndarray, np.ndarray]:
        name = f"Capsule({self.body!r})"
        r = _positive(f"{name}.radius", self.radius, "give the radius in m")
        half = _positive(f"{name}.half_length", self.half_length, "give half the length in m")
        c = _vec(f"{name}.pos", self.pos, 3, "give the centre [x, y, z]")
        axis = _rotation(f"{name}.quat", self.quat)[:, 2]
        return np.stack([c - half * axis, c + half * axis]), np.array([r, r])


class Box(eqx.Module):
    """A box of half extents ``half`` (3,) [m] on ``body``, centred at ``pos`` with axes
    ``quat`` in body axes (MJCF's box ``size``)."""

    body: str = eqx.field(static=True)
    half: tuple = eqx.field(static=True)
    pos: tuple = eqx.field(static=True, default=(0.0, 0.0, 0.0))
    quat: tuple = eqx.field(static=True, default=(1.0, 0.0, 0.0, 0.0))

    def candidates(self) -> tuple[np.ndarray, np.ndarray]:
        name = f"Box({self.body!r})"
        half = _vec(f"{name}.half", self.half, 3, "give the half extents [hx, hy, hz] in m")
        if not np.all(half > 0):
            fail(f"{name}.half", self.half, "has an entry <= 0", "give half extents > 0")
        c = _vec(f"{name}.pos", self.pos, 3, "give the centre [x, y, z]")
        R = _rotation(f"{name}.quat", self.quat)
        signs = np.array([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)])
        return c + (signs * half) @ R.T, np.zeros(8)


SHAPES = (Sphere, Capsule, Box)


class Plane(eqx.Module):
    """The fixed plane n·(x − point) = 0 that the shapes touch, ``normal`` pointing out of
    it (into the free space); default the ground z = 0."""

    normal: tuple = eqx.field(static=True, default=(0.0, 0.0, 1.0))
    point: tuple = eqx.field(static=True, default=(0.0, 0.0, 0.0))

    def frame(self) -> tuple[np.ndarray, np.ndarray]:
        """(rows (3, 3): n, t₁, t₂ orthonormal, right-handed; the point p₀ (3,))."""
        n = _vec("Plane.normal", self.normal, 3, "give the plane's normal [nx, ny, nz]")
        p0 = _vec("Plane.point", self.point, 3, "give a point of the plane [x, y, z]")
        size = np.linalg.norm(n)
        if not size > 0:
            fail("Plane.normal", self.normal, "is zero", "give the plane's normal, e.g. [0, 0, 1]")
        n = n / size
        helper = np.eye(3)[int(np.argmin(np.abs(n)))]
        t1 = np.cross(n, helper)
        t1 /= np.linalg.norm(t1)
        return np.stack([n, t1, np.cross(n, t1)]), p0


class ContactPoints(eqx.Module):
    """The candidate contact points of a model's shapes against its plane, resolved against
    the body names: ``body`` (k,) static body indices, ``local`` (k, 3) points in body axes,
    ``radius`` (k,), the plane's ``frame`` (3, 3) (rows n, t₁, t₂) and ``origin`` (3,), and per
    candidate the friction coefficient ``mu``, the normal and tangential ``restitution``."""

    body: tuple[int, ...] = eqx.field(static=True)
    local: jax.Array
    radius: jax.Array
    frame: jax.Array
    origin: jax.Array
    mu: jax.Array
    restitution: jax.Array
    tangential_restitution: jax.Array

    @property
    def count(self) -> int:
        return len(self.body)

    def gaps_and_velocity(self, model, qpos, qvel):
        """(g (k,), γ (k, 3)) of ONE system: the gaps and the contact velocities in the frame
        (n, t₁, t₂) (module docstring); γ is linear in qvel."""
        xpos, xquat = model.body_poses(qpos)
        com = model.body_com(qpos)
        v, w = model.body_velocities(qpos, qvel)
        idx = np.asarray(self.body)
        R = quat.rotation_matrix(xquat[idx])  # (k, 3, 3)
        centre = xpos[idx] + jnp.einsum("kab,kb->ka", R, self.local)
        n = self.frame[0]
        gap = (centre - self.origin) @ n - self.radius
        point = centre - self.radius[:, None] * n
        vp = v[idx] + jnp.cross(w[idx], point - com[idx])
        return gap, vp @ self.frame.T


class Contacts(eqx.Module):
    """What touches what: ``shapes`` (:class:`Sphere`, :class:`Capsule`, :class:`Box` on the
    model's bodies) against one fixed ``plane`` (:class:`Plane`, default the ground z = 0),
    with Coulomb's ``friction`` coefficient μ ≥ 0 and Newton's ``restitution`` e ∈ [0, 1]
    (normal) and ``tangential_restitution`` e_T ∈ [0, 1] (0: a sliding contact keeps no
    tangential bounce), one value for every shape or one per shape.

    Give it to :class:`rbjax.JointModel` (``contacts=``) and integrate with
    :class:`rbjax.MoreauJean`, the time stepping that treats contacts as perfect unilateral
    constraints (rbjax/_contact/stepping.py)."""

    shapes: tuple
    plane: Plane = Plane()
    friction: tuple | float = 0.0
    restitution: tuple | float = 0.0
    tangential_restitution: tuple | float = 0.0

    def __init__(
        self,
        shapes,
        plane: Plane | None = None,
        friction: float | tuple = 0.0,
        restitution: float | tuple = 0.0,
        tangential_restitution: float | tuple = 0.0,
    ):
        shapes = tuple(shapes)
        if not shapes:
            fail("Contacts.shapes", shapes, "is empty", "give at least one Sphere, Capsule or Box")
        for k, s in enumerate(shapes):
            if not isinstance(s, SHAPES):
                fail(
                    f"Contacts.shapes[{k}]",
                    type(s).__name__,
                    "is not a contact shape",
                    "give rbjax.Sphere, rbjax.Capsule or rbjax.Box",
                )
        self.shapes = shapes
        self.plane = Plane() if plane is None else plane
        if not isinstance(self.plane, Plane):
            fail("Contacts.plane", type(plane).__name__, "is not a Plane", "give rbjax.Plane(...)")
        self.friction = self._per_shape("friction", friction, 0.0, np.inf)
        self.restitution = self._per_shape("restitution", restitution, 0.0, 1.0)
        self.tangential_restitution = self._per_shape(
            "tangential_restitution", tangential_restitution, 0.0, 1.0
        )

    def _per_shape(self, field: str, v, low: float, high: float) -> tuple:
        a = (
            np.broadcast_to(np.asarray(v, dtype=float), (len(self.shapes),))
            if np.ndim(v) == 0
            else np.asarray(v, dtype=float)
        )
        if a.shape != (len(self.shapes),) or not np.all((a >= low) & (a <= high)):
            fail(
                f"Contacts.{field}",
                v,
                f"is not one number in [{low:g}, {high:g}] or one per shape",
                f"give a {field} in [{low:g}, {high:g}] for all shapes or one per shape",
            )
        return tuple(float(x) for x in a)

    def resolve(self, names: tuple[str, ...]) -> ContactPoints:
        """The :class:`ContactPoints` of these shapes on a model with body ``names``."""
        body, local, radius, per = [], [], [], []
        for k, s in enumerate(self.shapes):
            if s.body not in names:
                fail(
                    f"Contacts.shapes[{k}].body",
                    s.body,
                    f"is not a body of the model (bodies: {', '.join(names)})",
                    "give the name of the body the shape is attached to",
                )
            pts, rad = s.candidates()
            body += [names.index(s.body)] * len(rad)
            local.append(pts)
            radius.append(rad)
            per += [k] * len(rad)
        frame, origin = self.plane.frame()
        dt = jnp.result_type(float)
        pick = lambda vals: jnp.asarray(np.asarray(vals)[per], dt)  # noqa: E731
        return ContactPoints(
            tuple(body),
            jnp.asarray(np.concatenate(local), dt),
            jnp.asarray(np.concatenate(radius), dt),
            jnp.asarray(frame, dt),
            jnp.asarray(origin, dt),
            pick(self.friction),
            pick(self.restitution),
            pick(self.tangential_restitution),
        )
