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
from .._tree.bodies import natural_body_kinematics
from . import narrow


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

    def solid(self) -> tuple[str, np.ndarray, np.ndarray, np.ndarray]:
        """(type, centre (3,), axes (3, 3), size (3,)) in body axes (rbjax/_contact/narrow.py)."""
        (c,), (r,) = self.candidates()
        return "sphere", c, np.eye(3), np.array([r, 0.0, 0.0])


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

    def solid(self) -> tuple[str, np.ndarray, np.ndarray, np.ndarray]:
        """(type, centre (3,), axes (3, 3), size (3,)) in body axes (rbjax/_contact/narrow.py)."""
        self.candidates()
        R = _rotation(f"Capsule({self.body!r}).quat", self.quat)
        size = np.array([self.radius, self.half_length, 0.0], float)
        return "capsule", np.asarray(self.pos, float), R, size


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

    def solid(self) -> tuple[str, np.ndarray, np.ndarray, np.ndarray]:
        """(type, centre (3,), axes (3, 3), size (3,)) in body axes (rbjax/_contact/narrow.py)."""
        self.candidates()
        R = _rotation(f"Box({self.body!r}).quat", self.quat)
        return "box", np.asarray(self.pos, float), R, np.asarray(self.half, float)


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


class PairGroup(eqx.Module):
    """The shape pairs of one type pair ``kind`` (A, B in the order sphere < capsule < box):
    the static bodies ``body_a``, ``body_b`` (P,) (−1: the world), and per pair each shape's
    centre ``pos_*`` (P, 3), axes ``rot_*`` (P, 3, 3) in its body's axes and ``size_*`` (P, 3)
    (rbjax/_contact/narrow.py)."""

    kind: tuple[str, str] = eqx.field(static=True)
    body_a: tuple[int, ...] = eqx.field(static=True)
    body_b: tuple[int, ...] = eqx.field(static=True)
    pos_a: jax.Array
    rot_a: jax.Array
    size_a: jax.Array
    pos_b: jax.Array
    rot_b: jax.Array
    size_b: jax.Array

    @property
    def count(self) -> int:
        return len(self.body_a) * narrow.COUNT[self.kind]

    def geometry(self, xpos, R):
        """(g (c,), n (c, 3), p (c, 3), body A (c,), body B (c,)) of every candidate, from the
        bodies' world origins ``xpos`` and rotations ``R`` (the world appended last)."""
        a, b = np.asarray(self.body_a), np.asarray(self.body_b)
        world = lambda idx, pos, rot: (  # noqa: E731
            xpos[idx] + jnp.einsum("pab,pb->pa", R[idx], pos),
            jnp.einsum("pab,pbc->pac", R[idx], rot),
        )
        ca, Ra = world(a, self.pos_a, self.rot_a)
        cb, Rb = world(b, self.pos_b, self.rot_b)
        g, n, p = jax.vmap(narrow.KERNELS[self.kind])(ca, Ra, self.size_a, cb, Rb, self.size_b)
        if narrow.COUNT[self.kind] > 1:
            size = jnp.maximum(jnp.max(self.size_a, axis=1), jnp.max(self.size_b, axis=1))
            g = jax.vmap(narrow.unique)(g, p, size)
        per = narrow.COUNT[self.kind]
        return (
            g.reshape(-1),
            n.reshape(-1, 3),
            p.reshape(-1, 3),
            np.repeat(a, per),
            np.repeat(b, per),
        )


def _tangents(n):
    """Rows (n, t₁, t₂) (..., 3, 3) of a right-handed orthonormal frame around unit normals n:
    t₁ = n × e / |n × e| with e the axis of n's smallest component."""
    e = jax.nn.one_hot(jnp.argmin(jnp.abs(n), axis=-1), 3, dtype=n.dtype)
    t1 = jnp.cross(n, e)
    t1 = t1 / jnp.linalg.norm(t1, axis=-1, keepdims=True)
    return jnp.stack([n, t1, jnp.cross(n, t1)], axis=-2)


class ContactPoints(eqx.Module):
    """The candidate contacts of a model's shapes, resolved against the body names: against
    the plane, ``body`` (k,) static body indices, ``local`` (k, 3) points in body axes,
    ``radius`` (k,), the plane's ``frame`` (3, 3) (rows n, t₁, t₂) and ``origin`` (3,); between
    shapes, the ``pairs`` (:class:`PairGroup`, one per type pair); and per candidate (the
    plane's first, then the pairs' in order) the friction coefficient ``mu``, the normal and
    tangential ``restitution``."""

    body: tuple[int, ...] = eqx.field(static=True)
    local: jax.Array
    radius: jax.Array
    frame: jax.Array
    origin: jax.Array
    pairs: tuple[PairGroup, ...]
    mu: jax.Array
    restitution: jax.Array
    tangential_restitution: jax.Array

    @property
    def count(self) -> int:
        return len(self.body) + sum(group.count for group in self.pairs)

    def _candidates(self, model, qpos, pairs: bool = True):
        """(g (k,), velocity, jacobian) of ONE system, from ONE forward-kinematics pass: every
        candidate's gap; velocity(qvel) -> γ (k, 3), B's velocity relative to A's at the
        candidate's point p in its frame rows (n, t₁, t₂); jacobian() -> W (k, 3, nv) with
        γ = W q̇, in closed form (bodies A, B static; the world is body nb, appended last, and
        a plane candidate's A)."""
        xpos, R, com, body_velocity, point_jacobian = natural_body_kinematics(model, qpos)
        nb = xpos.shape[0]
        # the world as a last body: at rest, at the origin, unrotated
        add = lambda x, row: jnp.concatenate([x, row[None].astype(x.dtype)])  # noqa: E731
        xpos_w, com_w, R_w = add(xpos, jnp.zeros(3)), add(com, jnp.zeros(3)), add(R, jnp.eye(3))
        gaps, frames, points, body_a, body_b = [], [], [], [], []
        if self.body:
            idx = np.asarray(self.body)
            centre = xpos[idx] + jnp.einsum("kab,kb->ka", R[idx], self.local)
            n = self.frame[0]
            gaps.append((centre - self.origin) @ n - self.radius)
            frames.append(jnp.broadcast_to(self.frame, (len(idx), 3, 3)))
            points.append(centre - self.radius[:, None] * n)
            body_a.append(np.full(len(idx), nb))
            body_b.append(idx)
        for group in self.pairs if pairs else ():
            g, n, p, a, b = group.geometry(xpos_w, R_w)
            gaps.append(g)
            frames.append(_tangents(n))
            points.append(p)
            body_a.append(np.where(a < 0, nb, a))
            body_b.append(np.where(b < 0, nb, b))

        p, a, b = jnp.concatenate(points), np.concatenate(body_a), np.concatenate(body_b)
        frame = jnp.concatenate(frames)

        def velocity(qvel):  # γ (k, 3): B's velocity relative to A's at p, in the frame
            v, w = (add(x, jnp.zeros(3)) for x in body_velocity(qvel))
            at = lambda i: v[i] + jnp.cross(w[i], p - com_w[i])  # noqa: E731
            return jnp.einsum("kij,kj->ki", frame, at(b) - at(a))

        def jacobian():  # W (k, 3, nv) with γ = W q̇, in closed form
            return jnp.einsum("kij,kjn->kin", frame, point_jacobian(b, p) - point_jacobian(a, p))

        return jnp.concatenate(gaps), velocity, jacobian

    def gaps(self, model, qpos):
        """The gaps g (k,) of ONE system (module docstring)."""
        return self._candidates(model, qpos)[0]

    def fixed_gaps(self, model, qpos):
        """The gaps of the candidates whose identity does not depend on the configuration,
        which come first: the points against the plane (a pair's candidates are chosen anew
        by the narrow phase)."""
        return (
            self._candidates(model, qpos, pairs=False)[0]
            if self.body
            else jnp.zeros(0, jnp.result_type(qpos))
        )

    def gaps_and_velocity(self, model, qpos, qvel):
        """(g (k,), γ (k, 3)) of ONE system: the gaps and the contact velocities in each
        candidate's frame (n, t₁, t₂) (module docstring; for a pair, γ is B's velocity
        relative to A's at the contact point); γ is linear in qvel."""
        gap, velocity, _ = self._candidates(model, qpos)
        return gap, velocity(qvel)

    def gaps_and_jacobian(self, model, qpos):
        """(g (k,), W (k, 3, nv)) of ONE system: the gaps and γ = W q̇ (the contact
        velocities' Jacobian in closed form from the bodies' motion subspaces,
        rbjax/_tree/bodies.py, one kinematics pass)."""
        gap, _, jacobian = self._candidates(model, qpos)
        return gap, jacobian()


WORLD = "world"
GROUND = Plane()


class Contacts(eqx.Module):
    """What touches what: ``shapes`` (:class:`Sphere`, :class:`Capsule`, :class:`Box` on the
    model's bodies, or on ``"world"`` for a fixed obstacle) against one fixed ``plane``
    (:class:`Plane`, default the ground z = 0; ``None``: no plane) and against each other,
    with Coulomb's ``friction`` coefficient μ ≥ 0 and Newton's ``restitution`` e ∈ [0, 1]
    (normal) and ``tangential_restitution`` e_T ∈ [0, 1] (0: a sliding contact keeps no
    tangential bounce), one value for every shape or one per shape. A pair of shapes takes the
    larger of their two values (MuJoCo's rule for friction).

    ``pairs``: which shapes touch each other: ``"auto"`` (default), every two shapes on
    different bodies that are not parent and child (MuJoCo's default filter: a joint's two
    bodies overlap by design), and not both on the world; ``()`` none (the plane only); or a
    sequence of index pairs (i, j) into ``shapes``. The narrow phase and its candidate contacts
    per pair: rbjax/_contact/narrow.py. ``plane_shapes``: the indices of the shapes that touch
    the plane (default every shape not on the world). ``plane_friction``: the plane's own μ,
    mixed with each shape's by the larger (default None: the shape's μ alone).

    Give it to :class:`rbjax.JointModel` (``contacts=``) and integrate with
    :class:`rbjax.MoreauJean`, the time stepping that treats contacts as perfect unilateral
    constraints (rbjax/_contact/stepping.py)."""

    shapes: tuple
    plane: Plane | None = GROUND
    friction: tuple | float = 0.0
    restitution: tuple | float = 0.0
    tangential_restitution: tuple | float = 0.0
    pairs: tuple | str = eqx.field(static=True, default="auto")
    plane_shapes: tuple | None = eqx.field(static=True, default=None)
    plane_friction: float | None = None

    def __init__(
        self,
        shapes,
        plane: Plane | None = GROUND,
        friction: float | tuple = 0.0,
        restitution: float | tuple = 0.0,
        tangential_restitution: float | tuple = 0.0,
        pairs: str | tuple = "auto",
        plane_shapes: tuple | None = None,
        plane_friction: float | None = None,
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
        if plane is not None and not isinstance(plane, Plane):
            fail(
                "Contacts.plane",
                type(plane).__name__,
                "is not a Plane",
                "give rbjax.Plane(...), or None for no plane",
            )
        self.plane = plane
        self.friction = self._per_shape("friction", friction, 0.0, np.inf)
        self.restitution = self._per_shape("restitution", restitution, 0.0, 1.0)
        self.tangential_restitution = self._per_shape(
            "tangential_restitution", tangential_restitution, 0.0, 1.0
        )
        self.pairs = self._pairs(pairs)
        if plane_shapes is not None:
            plane_shapes = tuple(plane_shapes)
            if not all(
                isinstance(k, int | np.integer) and 0 <= k < len(shapes) for k in plane_shapes
            ):
                fail(
                    "Contacts.plane_shapes",
                    plane_shapes,
                    f"is not a list of shape indices in [0, {len(shapes)})",
                    "give the indices into Contacts.shapes of the shapes that touch the plane",
                )
            plane_shapes = tuple(int(k) for k in plane_shapes)
        self.plane_shapes = plane_shapes
        if plane_friction is not None and not (np.isfinite(plane_friction) and plane_friction >= 0):
            fail("Contacts.plane_friction", plane_friction, "is not a number >= 0", "give μ >= 0")
        self.plane_friction = None if plane_friction is None else float(plane_friction)

    def _pairs(self, pairs) -> tuple | str:
        if isinstance(pairs, str):
            if pairs != "auto":
                fail("Contacts.pairs", pairs, "is not 'auto'", "give 'auto', () or [(i, j), ...]")
            return pairs
        out = []
        for k, pair in enumerate(pairs):
            ok = (
                len(pair) == 2
                and all(isinstance(x, int | np.integer) and 0 <= x < len(self.shapes) for x in pair)
                and pair[0] != pair[1]
            )
            if not ok:
                fail(
                    f"Contacts.pairs[{k}]",
                    pair,
                    f"is not two different shape indices in [0, {len(self.shapes)})",
                    "give (i, j) indices into Contacts.shapes",
                )
            out.append((int(pair[0]), int(pair[1])))
        return tuple(out)

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

    def _bodies(self, names: tuple[str, ...]) -> list[int]:
        out = []
        for k, s in enumerate(self.shapes):
            if s.body == WORLD:
                out.append(-1)
                continue
            if s.body not in names:
                fail(
                    f"Contacts.shapes[{k}].body",
                    s.body,
                    f"is not a body of the model (bodies: {', '.join(names)}, or 'world')",
                    "give the name of the body the shape is attached to",
                )
            out.append(names.index(s.body))
        return out

    def shape_pairs(self, names: tuple[str, ...], parent) -> list[tuple[int, int]]:
        """The index pairs (i, j) of shapes that touch each other on a model with body
        ``names`` and ``parent`` indices (``pairs``; "auto": MuJoCo's default filter)."""
        body = self._bodies(names)
        if not isinstance(self.pairs, str):
            explicit: tuple[tuple[int, int], ...] = self.pairs
            for k, (i, j) in enumerate(explicit):
                if body[i] == body[j]:
                    fail(
                        f"Contacts.pairs[{k}]",
                        (i, j),
                        f"puts two shapes of the same body ({self.shapes[i].body!r}) in contact",
                        "pair shapes on different bodies",
                    )
            return list(explicit)
        linked = lambda a, b: a == b or (a >= 0 and parent[a] == b) or (b >= 0 and parent[b] == a)  # noqa: E731
        return [
            (i, j)
            for i in range(len(body))
            for j in range(i + 1, len(body))
            if not linked(body[i], body[j])
        ]

    def resolve(self, names: tuple[str, ...], parent=()) -> ContactPoints:
        """The :class:`ContactPoints` of these shapes on a model with body ``names`` and
        ``parent`` indices (−1: the world)."""
        body_of = self._bodies(names)
        dt = jnp.result_type(float)
        per_shape = {
            f: np.asarray(getattr(self, f))
            for f in ("friction", "restitution", "tangential_restitution")
        }
        body, local, radius, rows = [], [], [], []
        if self.plane is not None:
            on_plane = range(len(self.shapes)) if self.plane_shapes is None else self.plane_shapes
            for k in on_plane:
                if body_of[k] < 0:
                    continue
                pts, rad = self.shapes[k].candidates()
                body += [body_of[k]] * len(rad)
                local.append(pts)
                radius.append(rad)
                row = np.array([per_shape[f][k] for f in per_shape])
                if self.plane_friction is not None:
                    row[0] = max(row[0], self.plane_friction)
                rows.append(row[None].repeat(len(rad), 0))
            frame, origin = self.plane.frame()
        else:
            frame, origin = np.eye(3), np.zeros(3)
        solids = [s.solid() for s in self.shapes]
        groups: dict[tuple[str, str], list] = {}
        for i, j in self.shape_pairs(names, parent):
            if body_of[i] < 0 and body_of[j] < 0:
                continue
            if narrow.ORDER.index(solids[i][0]) > narrow.ORDER.index(solids[j][0]):
                i, j = j, i
            groups.setdefault((solids[i][0], solids[j][0]), []).append((i, j))
        pairs = []
        for kind, members in sorted(groups.items(), key=lambda kv: narrow.ORDER_PAIRS.index(kv[0])):
            col = lambda which, part, members=members: jnp.asarray(  # noqa: E731
                np.stack([solids[m[which]][part] for m in members]), dt
            )
            pairs.append(
                PairGroup(
                    kind,
                    tuple(body_of[i] for i, _ in members),
                    tuple(body_of[j] for _, j in members),
                    col(0, 1),
                    col(0, 2),
                    col(0, 3),
                    col(1, 1),
                    col(1, 2),
                    col(1, 3),
                )
            )
            mixed = np.array(
                [[max(per_shape[f][i], per_shape[f][j]) for f in per_shape] for i, j in members]
            )
            rows.append(mixed.repeat(narrow.COUNT[kind], 0))
        if not body and not pairs:
            fail(
                "Contacts",
                f"{len(self.shapes)} shape(s)",
                "has no candidate contact (no plane, and no pair of shapes that may touch)",
                "give a plane, or shapes on different bodies",
            )
        table = np.concatenate(rows) if rows else np.zeros((0, 3))
        empty = np.zeros((0, 3))
        return ContactPoints(
            tuple(body),
            jnp.asarray(np.concatenate(local) if local else empty, dt),
            jnp.asarray(np.concatenate(radius) if radius else np.zeros(0), dt),
            jnp.asarray(frame, dt),
            jnp.asarray(origin, dt),
            tuple(pairs),
            jnp.asarray(table[:, 0], dt),
            jnp.asarray(table[:, 1], dt),
            jnp.asarray(table[:, 2], dt),
        )
