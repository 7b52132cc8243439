"""Contact between shapes (rbjax/_contact/narrow.py and the pairs of rbjax.Contacts): the
narrow phase against distances found by scipy's SLSQP over the two shapes' points, its gap
derivatives against the normal (moving B along n opens the gap at unit rate), the box–box
contact polygon against the intersection of two squares computed by hand, and the dynamics
against closed forms: a central impact of two spheres, Newton's cradle transmitting the
momentum down the row (a box resting turned on a box, against MuJoCo and the closed form:
tests/test_contact_mjcf.py)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from scipy.optimize import minimize
from scipy.spatial.transform import Rotation

import rbjax
from rbjax._contact import narrow

RNG = np.random.default_rng(7)
STEP = 1e-6  # central differences [m]


def _rot(rotvec):
    return Rotation.from_rotvec(rotvec).as_matrix()


def _points(kind, c, R, s):
    """A map from local parameters u (3,) to a point of the shape, and bounds on u: the
    shape is the set of those points (sphere and capsule: a ball around a centre or a segment
    point)."""
    if kind == "sphere":
        return (lambda u: c + u), [(-s[0], s[0])] * 3, lambda u: s[0] ** 2 - u @ u
    if kind == "capsule":
        # u = (t along the axis, then a 2-vector offset in its normal plane ... as a ball)
        def point(u):
            return c + u[0] * R[:, 2] + u[1:]

        bounds = [(-s[1], s[1])] + [(-s[0], s[0])] * 3
        return point, bounds, lambda u: s[0] ** 2 - u[1:] @ u[1:]
    return (lambda u: c + R @ u), [(-h, h) for h in s], None


def _distance(kind_a, a, kind_b, b):
    """The distance between two convex shapes by SLSQP over a point of each (independent of
    the narrow phase)."""
    pa, ba, ca = _points(kind_a, *a)
    pb, bb, cb = _points(kind_b, *b)
    na = len(ba)

    def f(x):
        d = pa(x[:na]) - pb(x[na:])
        return d @ d

    cons = []
    if ca is not None:
        cons.append({"type": "ineq", "fun": lambda x: ca(x[:na])})
    if cb is not None:
        cons.append({"type": "ineq", "fun": lambda x: cb(x[na:])})
    best = np.inf
    for _ in range(6):
        x0 = np.array([RNG.uniform(lo, hi) * 0.5 for lo, hi in ba + bb])
        out = minimize(f, x0, bounds=ba + bb, constraints=cons, method="SLSQP", tol=1e-14)
        best = min(best, out.fun)
    return np.sqrt(max(best, 0.0))


def _shape(kind):
    if kind == "sphere":
        return np.array([0.1, 0.0, 0.0])
    if kind == "capsule":
        return np.array([0.05, 0.2, 0.0])
    return np.array([0.15, 0.1, 0.05])


@pytest.mark.parametrize("kind", list(narrow.KERNELS))
def test_the_narrow_phase_gap_is_the_distance_and_opens_along_the_normal(kind):
    """For separated shapes in random poses, the least candidate gap is the distance between
    the shapes (SLSQP over their points, 1e-6 m; for two boxes where the nearest features are
    a corner and a face or two edges, a lower bound otherwise), and it changes at the rate n·δ
    when B is moved by δ (central differences, 1e-6)."""
    ka, kb = kind
    kernel = narrow.KERNELS[kind]
    checked = 0
    for _ in range(12):
        Ra, Rb = _rot(RNG.normal(size=3)), _rot(RNG.normal(size=3))
        sa, sb = _shape(ka), _shape(kb)
        ca = np.zeros(3)
        cb = RNG.normal(size=3)
        cb *= (0.45 + 0.05 * RNG.uniform()) / np.linalg.norm(cb)
        args = [jnp.asarray(x) for x in (ca, Ra, sa, cb, Rb, sb)]
        g, n, _ = kernel(*args)
        g, n = np.asarray(g), np.asarray(n)
        live = g < 1.0
        truth = _distance(ka, (ca, Ra, sa), kb, (cb, Rb, sb))
        if truth < 1e-3:
            continue
        least = int(np.argmin(np.where(live, g, np.inf)))
        if kind == ("box", "box"):
            # two boxes: the separating-axis gap is the distance for a corner over a face and
            # for two crossing edges, and a lower bound otherwise (it is exact at touching)
            assert g[least] <= truth + 1e-9
            if abs(g[least] - truth) > 1e-6:
                continue
        else:
            np.testing.assert_allclose(g[least], truth, atol=1e-6)
        checked += 1
        # the least gap is the distance, whose derivative is the normal at the nearest points
        # (the envelope theorem): moving B by δ opens it at the rate n·δ
        delta = RNG.normal(size=3) * 0.3

        def moved(e, k=least, args=args, cb=cb, delta=delta):
            shifted = jnp.asarray(cb + e * STEP * delta)
            return np.asarray(kernel(*args[:3], shifted, *args[4:])[0])[k]

        fd = (moved(1.0) - moved(-1.0)) / (2 * STEP)
        np.testing.assert_allclose(fd, n[least] @ delta, atol=1e-6)
    assert checked >= 4


def test_box_face_on_box_face_gives_the_corners_of_the_overlap_polygon():
    """A cube resting on a cube's top face, turned by θ about the vertical: the live
    candidates are the vertices of the intersection of the two squares (an octagon at
    θ = 30°: its vertices from the squares' edges crossing, by hand), all with gap 0; a
    cube lifted by 1 cm has the same points with gap 1 cm."""
    h = 0.1
    theta = np.pi / 6
    square = np.array([[1, 1], [1, -1], [-1, -1], [-1, 1]]) * h
    c, s = np.cos(theta), np.sin(theta)
    turned = square @ np.array([[c, s], [-s, c]])
    crossings = []
    for i in range(4):
        for j in range(4):
            a0, a1 = square[i], square[(i + 1) % 4]
            b0, b1 = turned[j], turned[(j + 1) % 4]
            A = np.stack([a1 - a0, b0 - b1], axis=1)
            if abs(np.linalg.det(A)) < 1e-12:
                continue
            t = np.linalg.solve(A, b0 - a0)
            if np.all((t >= 0) & (t <= 1)):
                crossings.append(a0 + t[0] * (a1 - a0))
    assert len(crossings) == 8
    for lift in (0.0, 0.01):
        g, n, p = narrow.kernel_box_box(
            jnp.zeros(3),
            jnp.eye(3),
            jnp.full(3, h),
            jnp.array([0.0, 0.0, 2 * h + lift]),
            jnp.asarray(_rot([0, 0, theta])),
            jnp.full(3, h),
        )
        g = np.asarray(narrow.unique(g, p, h))
        live = g < 1.0
        np.testing.assert_allclose(g[live], lift, atol=1e-12)
        np.testing.assert_allclose(np.asarray(n)[live], np.tile([0, 0, 1.0], (live.sum(), 1)))
        # the polygon's 24 slots; slot 24 is the upper cube's deepest corner (all four of its
        # lower corners are: the first), slot 25 the edge–edge case's (not live)
        assert live[24] and not live[25]
        live[24:] = False
        got = np.asarray(p)[live][:, :2]
        assert len(got) == 8
        for x in crossings:
            assert np.min(np.linalg.norm(got - x, axis=1)) < 1e-12


def _free_bodies(shapes, masses, inertias, gravity=(0.0, 0.0, -9.81), **contacts):
    n = len(masses)
    return rbjax.JointModel(
        names=[f"b{i}" for i in range(n)],
        parent=[-1] * n,
        body_pos=np.zeros((n, 3)),
        body_quat=[[1.0, 0.0, 0.0, 0.0]] * n,
        mass=masses,
        com=np.zeros((n, 3)),
        inertia=[np.diag(i) for i in inertias],
        joint_types=["free"] * n,
        joint_body=list(range(n)),
        gravity=gravity,
        contacts=rbjax.Contacts(shapes, **contacts),
    )


def _qpos(*poses):
    return np.concatenate([np.r_[p, q] for p, q in poses])


def test_newtons_cradle_passes_the_momentum_down_the_row():
    """Five equal balls in a row, 1 mm apart, no plane, no gravity, e = 1: the first, sent at
    v₀ = 1 m/s, stops and the last leaves at v₀ (each impact is a central elastic impact of
    equal masses, which exchanges the velocities: 1e-9); the momentum and energy are kept.
    Two balls of masses 1 and 3 at e = 0.5 leave with the closed-form velocities."""
    r, n = 0.05, 5
    I = [(0.4 * r * r,) * 3] * n
    model = _free_bodies(
        [rbjax.Sphere(f"b{i}", r) for i in range(n)],
        [1.0] * n,
        I,
        gravity=(0.0, 0.0, 0.0),
        plane=None,
        restitution=1.0,
    )
    unit = [1.0, 0.0, 0.0, 0.0]
    q = _qpos(*[((i * (2 * r + 1e-3), 0.0, 0.0), unit) for i in range(n)])
    v = np.zeros(6 * n)
    v[0] = 1.0
    traj = rbjax.rollout(
        model, rbjax.JointState(0.0, q, v), 1e-4, 600, integrator=rbjax.MoreauJean()
    )
    assert int(traj.result) == 0
    vx = np.asarray(traj.qvel)[-1, 0::6]
    np.testing.assert_allclose(vx, [0, 0, 0, 0, 1.0], atol=1e-9)


def test_moreau_jean_refuses_bad_options_and_names_the_contact_solver_when_it_fails():
    """Options are checked at construction (field, value, fix); a step whose contact solve
    stops above ``accept`` raises naming the contact solver and the options to raise."""
    for bad, field in (
        (dict(tol=0.0), "tol"),
        (dict(tol=1e-6, accept=1e-8), "accept"),
        (dict(max_iter=0), "max_iter"),
    ):
        with pytest.raises(ValueError, match=f"MoreauJean.{field} = .*Fix"):
            rbjax.MoreauJean(**bad)
    h = 0.1
    inertia = (2 * h * h / 3,) * 3
    # a cube on a cube on the floor: one sweep cannot share their weight among the corners
    model = _free_bodies(
        [rbjax.Box("b0", (h, h, h)), rbjax.Box("b1", (h, h, h))], [1.0, 1.0], [inertia] * 2
    )
    unit = [1.0, 0.0, 0.0, 0.0]
    q = _qpos(((0.0, 0.0, h), unit), ((0.03, 0.0, 3 * h), unit))
    with pytest.raises(Exception, match=r"contact solver \(MoreauJean\).*max_iter"):
        rbjax.rollout(
            model,
            rbjax.JointState(0.0, q, np.zeros(12)),
            1e-3,
            2,
            integrator=rbjax.MoreauJean(max_iter=1, accept=1e-10),
        )
