r"""Narrow phase between two shapes: the gaps, normals and contact points of a fixed set of
candidate contacts per pair of shape types, so that every array's shape is static.

Every kernel takes the two shapes in world axes, A then B in the order sphere < capsule < box
(each as its centre c, rotation R whose columns are its axes, and size s: a sphere (r, ·, ·), a
capsule (r, half length along its z axis, ·), a box its half extents), and returns per
candidate the signed gap g (the distance between the surfaces, negative in penetration), the
unit normal n pointing from A to B (moving B along n opens the gap), and the contact point
p, midway between the two surfaces' nearest points. A candidate with g > 0 is a contact that
may close in the step; the time stepping decides (rbjax/_contact/stepping.py).

**The distances** (Ericson, *Real-Time Collision Detection*, 2005, §5.1):

- sphere–sphere: g = |c_B − c_A| − r_A − r_B, n = (c_B − c_A)/|c_B − c_A|;
- a point and a segment: the segment's nearest point at the clamped projection;
- two segments: the nearest points of Ericson's §5.1.9 (clamped, parallel segments handled);
- a point and a box (its signed distance function): in box axes x, with d = |x| − h,
  sdf = ‖max(d, 0)‖ outside (normal along x minus its clamp onto the box) and max_i d_i inside
  (normal the face of the largest d_i);
- a segment and a box: the signed distance of a box is convex, so its restriction to a segment
  x(t) is a convex function of t; its minimiser is found by golden-section search (40
  iterations: 4e-9 of the segment's length) and held fixed under differentiation (the gap's
  derivative at a minimiser does not depend on how the minimiser moves).

**The candidates of each pair:**

| pair | candidates |
|---|---|
| sphere–sphere | 1: the centres' line |
| sphere–capsule | 1: the sphere's centre against the segment |
| capsule–capsule | 5: each end of each against the other's segment (a parallel pair rests on two), the segments' nearest points (a crossing pair) |
| sphere–box | 1: the centre's signed distance |
| capsule–box | 5: both ends, the point of least signed distance (an edge or a corner under the capsule), the two ends of the part over the nearest face (a capsule lying across a face) |
| box–box | 26: by the separating axis of largest separation (Gottschalk 1996): a face normal gives the vertices of the faces' overlap polygon (24 slots: each face's corners inside the other, the crossings of their edges) and the other box's deepest corner along it (its gap is the separation: a corner over an edge), an edge–edge axis the nearest points of the two edges (1) |

A candidate that does not exist in a configuration (outside the polygon, the other case) has the
gap ``_FAR`` and never closes; candidates that repeat an earlier one are moved there too
(``unique``), so that the percussion problem has no duplicate rows. The polygon's vertices are
the contact points a face resting on a face needs: a single point per edge (the least along
it) would leave the support polygon to chance and let a resting box rock.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

ORDER = ("sphere", "capsule", "box")
COUNT = {
    ("sphere", "sphere"): 1,
    ("sphere", "capsule"): 1,
    ("capsule", "capsule"): 5,
    ("sphere", "box"): 1,
    ("capsule", "box"): 5,
    ("box", "box"): 26,
}
ORDER_PAIRS = tuple(COUNT)
_GOLDEN = 0.5 * (np.sqrt(5.0) - 1.0)
_SEARCH = 40


def _unit(d):
    """d/|d|, and (0, 0, 1) where d = 0 (coincident points; safe under differentiation)."""
    sq = jnp.sum(d * d, axis=-1, keepdims=True)
    safe = jnp.where(sq > 0, sq, 1.0)
    up = jnp.zeros_like(d).at[..., 2].set(1.0)
    return jnp.where(sq > 0, d / jnp.sqrt(safe), up), jnp.where(
        sq[..., 0] > 0, jnp.sqrt(safe[..., 0]), 0.0
    )


def sphere_sphere(ca, ra, cb, rb):
    """(g, n, p) of two spheres (centres c, radii r)."""
    n, dist = _unit(cb - ca)
    g = dist - ra - rb
    return g, n, ca + n * (ra + 0.5 * g)


def _on_segment(x, c, axis, half):
    """The point of the segment c ± half·axis nearest to x."""
    t = jnp.clip(jnp.dot(x - c, axis), -half, half)
    return c + jax.lax.stop_gradient(t) * axis


def _segments(p1, d1, p2, d2):
    """The nearest points p1 + s d1, p2 + t d2 (s, t ∈ [0, 1]) of two segments (Ericson 2005,
    §5.1.9), s and t held fixed under differentiation."""
    p1, d1, p2, d2 = (jax.lax.stop_gradient(x) for x in (p1, d1, p2, d2))
    r = p1 - p2
    a, e, b = jnp.dot(d1, d1), jnp.dot(d2, d2), jnp.dot(d1, d2)
    c, f = jnp.dot(d1, r), jnp.dot(d2, r)
    denom = a * e - b * b
    parallel = denom <= 1e-12 * a * e
    s = jnp.where(parallel, 0.0, jnp.clip((b * f - c * e) / jnp.where(parallel, 1.0, denom), 0, 1))
    t = (b * s + f) / e
    s = jnp.where(t < 0, jnp.clip(-c / a, 0, 1), jnp.where(t > 1, jnp.clip((b - c) / a, 0, 1), s))
    return s, jnp.clip(t, 0, 1)


def _box_sdf(x, cb, Rb, hb):
    """(signed distance of the world point x to the box, outward unit normal at its nearest
    point in world axes, that nearest point on the surface)."""
    xl = Rb.T @ (x - cb)
    d = jnp.abs(xl) - hb
    inside = jnp.max(d) <= 0
    diff = xl - jnp.clip(xl, -hb, hb)
    n_out, dist = _unit(diff)
    face = jnp.argmax(d)
    n_in = jnp.where(jnp.arange(3) == face, jnp.where(xl >= 0, 1.0, -1.0), 0.0)
    sdf = jnp.where(inside, jnp.max(d), dist)
    n = jnp.where(inside, n_in, n_out)
    return sdf, Rb @ n, cb + Rb @ (xl - sdf * n)


def sphere_box(ca, ra, cb, Rb, hb):
    """(g, n, p) of a sphere (A) and a box (B)."""
    sdf, n_out, surface = _box_sdf(ca, cb, Rb, hb)
    return sdf - ra, -n_out, 0.5 * (surface + ca - ra * n_out)


def _least_on_segment(p, d, cb, Rb, hb):
    """The point p + t d, t ∈ [0, 1], of least signed distance to the box (golden section on
    a convex function), t held fixed under differentiation (the point moves with p and d)."""
    args = tuple(jax.lax.stop_gradient(x) for x in (p, d, cb, Rb, hb))
    f = lambda t: _box_sdf(args[0] + t * args[1], *args[2:])[0]  # noqa: E731

    def body(_, lohi):
        lo, hi = lohi
        x1 = hi - _GOLDEN * (hi - lo)
        x2 = lo + _GOLDEN * (hi - lo)
        left = f(x1) <= f(x2)
        return jnp.where(left, lo, x1), jnp.where(left, x2, hi)

    lo, hi = jax.lax.fori_loop(0, _SEARCH, body, (jnp.zeros_like(p[0]), jnp.ones_like(p[0])))
    return p + 0.5 * (lo + hi) * d


def _ends(c, R, half):
    return c - half * R[:, 2], c + half * R[:, 2]


def _stack(*cands):
    g, n, p = zip(*cands, strict=True)
    return jnp.stack(g), jnp.stack(n), jnp.stack(p)


def kernel_sphere_sphere(ca, Ra, sa, cb, Rb, sb):
    return _stack(sphere_sphere(ca, sa[0], cb, sb[0]))


def kernel_sphere_capsule(ca, Ra, sa, cb, Rb, sb):
    return _stack(sphere_sphere(ca, sa[0], _on_segment(ca, cb, Rb[:, 2], sb[1]), sb[0]))


def kernel_capsule_capsule(ca, Ra, sa, cb, Rb, sb):
    ax, bx = Ra[:, 2], Rb[:, 2]
    cands = [
        sphere_sphere(e, sa[0], _on_segment(e, cb, bx, sb[1]), sb[0]) for e in _ends(ca, Ra, sa[1])
    ]
    for e in _ends(cb, Rb, sb[1]):
        g, n, p = sphere_sphere(e, sb[0], _on_segment(e, ca, ax, sa[1]), sa[0])
        cands.append((g, -n, p))
    a0, b0 = ca - sa[1] * ax, cb - sb[1] * bx
    s, t = _segments(a0, 2 * sa[1] * ax, b0, 2 * sb[1] * bx)
    cands.append(sphere_sphere(a0 + s * 2 * sa[1] * ax, sa[0], b0 + t * 2 * sb[1] * bx, sb[0]))
    return _stack(*cands)


def kernel_sphere_box(ca, Ra, sa, cb, Rb, sb):
    return _stack(sphere_box(ca, sa[0], cb, Rb, sb))


_FAR = 1e3  # [m] the gap of a candidate that does not exist in this configuration (never closes)
_OTHERS = np.array([(1, 2), (0, 2), (0, 1)])  # the two axes other than k
_CYCLE = np.array([(1, 1), (1, -1), (-1, -1), (-1, 1)], float)  # a rectangle's corners in order
_SIGNS = np.array([(x, y, z) for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)], float)


def _face(c, R, h, axis, outward):
    """(centre, in-plane axes (2, 3), half extents (2,)) of the face of a box whose outward
    normal is ``outward`` (= ±R[:, axis]); ``axis`` traced."""
    k = jnp.asarray(_OTHERS)[axis]
    return c + h[axis] * outward, R[:, k].T, h[k]


def _rectangle(centre, axes, half):
    """The 4 corners (4, 3) of a rectangle, in cyclic order."""
    return centre + (jnp.asarray(_CYCLE, half.dtype) * half) @ axes


def _face_contacts(cr, Rr, hr, ci, Ri, hi, n, axis):
    """The 25 candidates (g, p, valid) of a box ``i`` resting on the face of box ``r`` with
    outward normal n = ±Rr[:, axis] (n from r to i): the incident face's corners over the
    reference face, the reference face's corners under the incident face, and the crossings
    of their edges (in the reference plane): the vertices of the contact polygon; and the
    incident box's deepest corner along n."""
    fc, fa, fh = _face(cr, Rr, hr, axis, n)
    dots = Ri.T @ n
    j = jnp.argmax(jnp.abs(dots))
    m = -jnp.sign(dots[j]) * Ri[:, j]  # the incident face's outward normal, against n
    ic, ia, ih = _face(ci, Ri, hi, j, m)
    ref, inc = _rectangle(fc, fa, fh), _rectangle(ic, ia, ih)
    slack = 1e-9 * (jnp.max(hr) + jnp.max(hi))
    # the incident face's corners: over the reference face?
    xy = (inc - fc) @ fa.T
    g1 = (inc - fc) @ n
    v1 = jnp.all(jnp.abs(xy) <= fh + slack, axis=1)
    p1 = inc - 0.5 * g1[:, None] * n
    # the reference face's corners: under the incident face (along n)?
    s = ((ic - ref) @ m) / jnp.dot(n, m)
    hit = ref + s[:, None] * n
    v2 = jnp.all(jnp.abs((hit - ic) @ ia.T) <= ih + slack, axis=1)
    p2 = ref + 0.5 * s[:, None] * n
    # the edges' crossings, in the reference plane's coordinates
    a0, a1 = (ref - fc) @ fa.T, (jnp.roll(ref, -1, axis=0) - fc) @ fa.T  # (4, 2)
    b0, b1 = xy, jnp.roll(xy, -1, axis=0)
    ea, eb = a1 - a0, b1 - b0
    cross = lambda u, w: u[..., 0] * w[..., 1] - u[..., 1] * w[..., 0]  # noqa: E731
    det = cross(ea[:, None], eb[None])  # (4, 4)
    ok = jnp.abs(det) > 1e-12 * (jnp.max(hr) + jnp.max(hi)) ** 2
    safe = jnp.where(ok, det, 1.0)
    diff = b0[None] - a0[:, None]
    alpha = cross(diff, eb[None]) / safe
    beta = cross(diff, ea[:, None]) / safe
    v3 = ok & (alpha >= 0) & (alpha <= 1) & (beta >= 0) & (beta <= 1)
    edge = jnp.roll(inc, -1, axis=0) - inc
    point = inc[None] + beta[..., None] * edge[None]  # (4, 4, 3) on the incident edges
    g3 = (point - fc) @ n
    p3 = point - 0.5 * g3[..., None] * n
    # the incident box's deepest corner along n: its gap is the separation along the axis, a
    # lower bound of the distance that is exact at touching (a corner of i over an edge of r,
    # which the polygon of the two faces misses)
    corners = ci + (jnp.asarray(_SIGNS, hi.dtype) * hi) @ Ri.T
    g4 = (corners - fc) @ n
    deepest = jnp.argmin(g4)
    p4 = corners[deepest] - 0.5 * g4[deepest] * n
    g = jnp.concatenate([g1, s, g3.reshape(16), g4[deepest][None]])
    valid = jnp.concatenate([v1, v2, v3.reshape(16), jnp.ones(1, bool)])
    p = jnp.concatenate([p1, p2, p3.reshape(16, 3), p4[None]])
    return g, p, valid


def kernel_box_box(ca, Ra, sa, cb, Rb, sb):
    """26 candidates of two boxes (Gottschalk 1996's separating axes; the contact polygon by
    clipping, as Bullet's and ODE's box–box): the axis of largest separation among the 15
    (3 + 3 face normals, 9 edge–edge crosses, faces preferred within 1e-4 of the size) decides:
    a face normal gives the 25 candidates of ``_face_contacts``, an edge cross the one
    contact of the two nearest edges (the last candidate). Candidates of the other case, and
    those outside the polygon, have the gap ``_FAR`` and never close."""
    d = cb - ca
    project = lambda L: jnp.abs(L @ Ra) @ sa + jnp.abs(L @ Rb) @ sb  # noqa: E731
    faces = jnp.concatenate([Ra.T, Rb.T])  # (6, 3)
    sep_face = jnp.abs(faces @ d) - jax.vmap(project)(faces)
    crosses = jnp.cross(Ra.T[:, None], Rb.T[None]).reshape(9, 3)
    length = jnp.linalg.norm(crosses, axis=1)
    ok = length > 1e-6
    edges = crosses / jnp.where(ok, length, 1.0)[:, None]
    sep_edge = jnp.where(ok, jnp.abs(edges @ d) - jax.vmap(project)(edges), -jnp.inf)
    scale = jnp.maximum(jnp.max(sa), jnp.max(sb))
    f, e = jnp.argmax(sep_face), jnp.argmax(sep_edge)
    use_edge = sep_edge[e] > sep_face[f] + 1e-4 * scale
    L = jnp.where(use_edge, edges[e], faces[f])
    n = L * jnp.where(L @ d >= 0, 1.0, -1.0)  # from A to B
    # a face of A (f < 3) or of B (f ≥ 3) as the reference face
    gA, pA, vA = _face_contacts(ca, Ra, sa, cb, Rb, sb, n, f % 3)
    gB, pB, vB = _face_contacts(cb, Rb, sb, ca, Ra, sa, -n, f % 3)
    on_a = f < 3
    g = jnp.where(on_a, gA, gB)
    p = jnp.where(on_a, pA, pB)
    valid = jnp.where(on_a, vA, vB) & ~use_edge
    # the two nearest edges along the edge axis: each box's edge parallel to its crossed axis
    # on the side facing the other box
    i, j = e // 3, e % 3
    toward = lambda R, h, c, w, k: c + R @ (jnp.where(jnp.arange(3) == k, 0.0, jnp.sign(w @ R) * h))  # noqa: E731
    ea = toward(Ra, sa, ca, n, i)
    eb = toward(Rb, sb, cb, -n, j)
    s, t = _segments(
        ea - sa[i] * Ra[:, i], 2 * sa[i] * Ra[:, i], eb - sb[j] * Rb[:, j], 2 * sb[j] * Rb[:, j]
    )
    pa = ea - sa[i] * Ra[:, i] + s * 2 * sa[i] * Ra[:, i]
    pb = eb - sb[j] * Rb[:, j] + t * 2 * sb[j] * Rb[:, j]
    g_edge = (pb - pa) @ n
    g = jnp.append(jnp.where(valid, g, _FAR), jnp.where(use_edge, g_edge, _FAR))
    p = jnp.concatenate([p, (0.5 * (pa + pb))[None]])
    return g, jnp.broadcast_to(n, p.shape), p


def _clip_to_face(e0, e1, fc, fa, fh):
    """The parameters t0 ≤ t1 in [0, 1] of the part of the segment e0→e1 whose projection on a
    face (centre fc, in-plane axes fa (2, 3), half extents fh) lies on it (Liang–Barsky), and
    whether that part exists."""
    x0, dx = (e0 - fc) @ fa.T, (e1 - e0) @ fa.T
    moving = jnp.abs(dx) > 1e-12 * jnp.max(fh)
    safe = jnp.where(moving, dx, 1.0)
    ta, tb = (-fh - x0) / safe, (fh - x0) / safe
    lo = jnp.where(moving, jnp.minimum(ta, tb), jnp.where(jnp.abs(x0) <= fh, -jnp.inf, jnp.inf))
    hi = jnp.where(moving, jnp.maximum(ta, tb), jnp.where(jnp.abs(x0) <= fh, jnp.inf, -jnp.inf))
    t0, t1 = jnp.maximum(0.0, jnp.max(lo)), jnp.minimum(1.0, jnp.min(hi))
    return t0, t1, t0 <= t1


def kernel_capsule_box(ca, Ra, sa, cb, Rb, sb):
    """5 candidates: both ends, the point of least signed distance (an edge or a corner under
    the capsule), and the two ends of the part of the capsule over the box face nearest to it
    (a capsule lying across a face rests on a segment; gap ``_FAR`` where there is none)."""
    e0, e1 = _ends(ca, Ra, sa[1])
    least = _least_on_segment(e0, e1 - e0, cb, Rb, sb)
    cands = [sphere_box(x, sa[0], cb, Rb, sb) for x in (e0, e1, least)]
    # the face whose outward normal is nearest the least point's normal
    n_least = -cands[2][1]
    dots = Rb.T @ n_least
    k = jnp.argmax(jnp.abs(dots))
    outward = jnp.sign(dots[k]) * Rb[:, k]
    fc, fa, fh = _face(cb, Rb, sb, k, outward)
    t0, t1, ok = _clip_to_face(*(jax.lax.stop_gradient(x) for x in (e0, e1, fc, fa, fh)))
    # lying on the face, the capsule rests on the clipped segment's ends: the least point
    # (anywhere along it) would only repeat them
    flat = ok & (jnp.abs(dots[k]) > 1.0 - 1e-9)
    g_least, n_least_ab, p_least = cands[2]
    cands[2] = (jnp.where(flat, _FAR, g_least), n_least_ab, p_least)
    for t in (t0, t1):
        x = e0 + t * (e1 - e0)
        g = (x - fc) @ outward - sa[0]
        cands.append((jnp.where(ok, g, _FAR), -outward, x - (sa[0] + 0.5 * g) * outward))
    return _stack(*cands)


def unique(g, p, size):
    """The gaps g (c,) with every candidate that repeats an earlier one (its point within
    1e-6 of the pair's ``size`` of an earlier candidate's that exists) moved to ``_FAR``: a
    repeated contact adds a redundant row that slows the percussion solver and adds nothing."""
    live = g < 0.5 * _FAR
    close = jnp.sum((p[:, None] - p[None]) ** 2, axis=-1) < (1e-6 * size) ** 2
    earlier = jnp.tril(jnp.ones((g.size, g.size), bool), k=-1)
    repeat = jnp.any(close & earlier & live[None], axis=1)
    return jnp.where(repeat, _FAR, g)


KERNELS = {
    ("sphere", "sphere"): kernel_sphere_sphere,
    ("sphere", "capsule"): kernel_sphere_capsule,
    ("capsule", "capsule"): kernel_capsule_capsule,
    ("sphere", "box"): kernel_sphere_box,
    ("capsule", "box"): kernel_capsule_box,
    ("box", "box"): kernel_box_box,
}
