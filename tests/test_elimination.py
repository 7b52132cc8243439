"""The elimination along the joint graph (rbjax/_engine/elimination.py) against a dense KKT solve.

Reference: the full KKT matrix [M W̃ᵀ; W̃ 0] of each mechanism assembled in numpy from the joint
Jacobians and solved by LU (numpy.linalg.solve): a different factorisation of a different (larger)
matrix than the tree elimination and the Schur-complement Cholesky. Then the whole dynamics
(accelerations, multipliers, reaction forces, a projected rollout and its forward- and
reverse-mode derivatives) with the tree elimination against the dense Cholesky of S, to 1e-12.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close

import rbjax
from rbjax._engine import joints as engine_joints, schur as engine_schur
from rbjax._engine.dynamics import scalable_kinematics
from rbjax._engine.elimination import schedule
from rbjax._engine.mass import blocks as mass_blocks

ROD = np.diag([1e-3, 1.0 / 12.0, 1.0 / 12.0])


def chain(n=6):
    """An n-link chain along x with alternating revolute / universal / spherical joints."""
    q0 = np.array([[k + 0.5, 0, 0, 1, 0, 0, 0] for k in range(n)], float)
    bodies = [rbjax.Body(1.0 + 0.1 * k, ROD, name=f"l{k}") for k in range(n)]
    joints = []
    for k in range(n):
        prev = k - 1 if k else rbjax.GROUND
        if k % 3 == 0:
            joints.append(rbjax.Revolute.at(q0, prev, k, point=[k, 0, 0], axis=[0, 1, 0]))
        elif k % 3 == 1:
            joints.append(
                rbjax.Universal.at(q0, prev, k, point=[k, 0, 0], axis=[0, 1, 0], x=[0, 0, 1])
            )
        else:
            joints.append(rbjax.Spherical.at(q0, prev, k, point=[k, 0, 0]))
    return q0, bodies, joints


def branched():
    """A trunk with three branches of two links (one scalable), a loop closed by a distance
    constraint between two branch tips, and one free body attached to nothing."""
    pos = [[0, 0, 0.5]]
    bodies = [rbjax.Body(2.0, np.diag([0.1, 0.2, 0.3]), name="trunk")]
    joints = [
        rbjax.Spherical.at(np.array([[0, 0, 0.5, 1, 0, 0, 0]]), rbjax.GROUND, 0, point=[0, 0, 0])
    ]
    tips = []
    for a in range(3):
        ang = 2 * np.pi * a / 3
        d = np.array([np.cos(ang), np.sin(ang), 0.0])
        for s in range(2):
            pos.append(list(np.array([0, 0, 1.0]) + (s + 0.5) * d))
            bodies.append(rbjax.Body(0.5, ROD, scalable=(a == 1 and s == 1), name=f"b{a}{s}"))
    q0 = np.array([p + [1, 0, 0, 0] for p in pos] + [[5, 5, 5, 1, 0, 0, 0]], float)
    for a in range(3):
        ang = 2 * np.pi * a / 3
        d = np.array([np.cos(ang), np.sin(ang), 0.0])
        i0, i1 = 1 + 2 * a, 2 + 2 * a
        root = np.array([0, 0, 1.0])
        joints.append(rbjax.Revolute.at(q0, 0, i0, point=root, axis=[-d[1], d[0], 0]))
        joints.append(rbjax.Universal.at(q0, i0, i1, point=root + d, axis=[0, 0, 1], x=list(d)))
        tips.append(i1)
    joints.append(
        rbjax.Distance.between(
            q0, tips[0], tips[2], point_i=q0[tips[0], :3], point_j=q0[tips[2], :3]
        )
    )
    bodies.append(rbjax.Body(1.0, np.diag([1.0, 2.0, 3.0]), name="free"))
    return q0, bodies, joints


def _state(q0, batch, seed=0):
    rng = np.random.default_rng(seed)
    nb = q0.shape[0]
    q = np.broadcast_to(q0, (batch, nb, 7)).copy()
    q[..., :3] += 0.02 * rng.normal(size=(batch, nb, 3))
    quat = q[..., 3:] + 0.05 * rng.normal(size=(batch, nb, 4))
    q[..., 3:] = quat / np.linalg.norm(quat, axis=-1, keepdims=True)
    u = 0.3 * rng.normal(size=(batch, nb, 7))
    u[..., 3] = 0.0
    return rbjax.State(t=jnp.zeros(batch), q=jnp.asarray(q), u=jnp.asarray(u))


MODELS = {"chain": chain, "branched": branched}


def test_schedule_is_a_spanning_forest():
    q0, bodies, joints = branched()
    model = rbjax.Model(bodies, joints=joints)
    s = schedule(model.topology)
    nb = model.nb
    assert s.closures == (len(joints) - 1,)  # the distance constraint closes the loop
    assert s.tree_joint[nb - 1] == -1 and s.parent[nb - 1] == nb + 1  # the free body
    level_of = {int(b): lvl for lvl, row in enumerate(s.levels) for b in row if b < nb}
    assert sorted(level_of) == list(range(nb))
    for b in range(nb):
        if s.parent[b] < nb:  # parents are eliminated exactly one level later
            assert level_of[int(s.parent[b])] == level_of[b] + 1
            assert (
                s.levels[level_of[b] + 1][
                    s.pslot[level_of[b]][list(s.levels[level_of[b]]).index(b)]
                ]
                == s.parent[b]
            )


def _kkt_reference(model, terms, r, i):
    """λ of system i: y of the full KKT system [M W̃ᵀ; W̃ 0] [x; y] = [0; −r] (then S y = r),
    assembled in numpy from the joints' W blocks (ν columns of rigid bodies removed here) and
    solved by LU."""
    nb, rows = model.nb, model.joint_rows
    m = sum(rows)
    off = np.cumsum((0,) + rows)
    K = np.zeros((7 * nb + m, 7 * nb + m))
    Mb = np.asarray(mass_blocks(model))
    for b in range(nb):
        K[7 * b : 7 * b + 7, 7 * b : 7 * b + 7] = Mb[:, :, b]
    for k, pair in enumerate(terms.W):
        for side, w in enumerate(pair):
            b = model.topology.joint_bodies[k][side]
            if b < 0:
                continue
            blk = np.array(w[..., i])
            if not model.scalable[b]:
                blk[:, 3] = 0.0
            K[7 * nb + off[k] : 7 * nb + off[k + 1], 7 * b : 7 * b + 7] += blk
    K[: 7 * nb, 7 * nb :] = K[7 * nb :, : 7 * nb].T
    rhs = np.concatenate([np.zeros(7 * nb), -np.asarray(r)[:, i]])
    return np.linalg.solve(K, rhs)[7 * nb :]


@pytest.mark.parametrize("name", ["chain", "branched"])
def test_tree_solve_matches_dense_kkt(name):
    """A chain (no fill at all) and the branched mechanism with its loop closure."""
    q0, bodies, joints = MODELS[name]()
    model = rbjax.Model(bodies, joints=joints, gravity=[0.0, 0.0, -9.81])
    state = _state(q0, 3)
    q = jnp.moveaxis(state.q, -1, 0)
    u = jnp.moveaxis(state.u, -1, 0)
    t = state.t[:, None]
    # under jit: eagerly, its few hundred operations compiled one by one (~5 s)
    terms = jax.jit(lambda t, q, u: engine_joints.joint_terms(model, scalable_kinematics, t, q, u))(
        t, q, u
    )
    rng = np.random.default_rng(1)
    r = jnp.asarray(rng.normal(size=(sum(model.joint_rows), 3)))

    @jax.jit
    def solve_and_products(terms, r):
        out = {}
        for method in ("tree", "block", "dense"):
            schur = engine_schur.SchurSystem(model, terms, q.dtype)
            schur.method = method
            out[method] = schur._solver()(r)
        lam = out["tree"]
        tree = engine_schur.SchurSystem(model, terms, q.dtype)
        tree.method = "tree"
        block = engine_schur.SchurSystem(model, terms, q.dtype)
        block.method = "block"
        return out, tree.matvec(lam), block.matvec(lam)

    lams, back, block_back = solve_and_products(terms, r)
    for i in range(3):
        ref = _kkt_reference(model, terms, r, i)
        scale = np.abs(ref).max()
        for method, lam in lams.items():
            assert_close(
                np.asarray(lam)[:, i] / scale, ref / scale, rtol=0, atol=1e-12, err_msg=method
            )
    # S λ by the vectorised product gives r back, and equals the product on the stacked rows
    assert_close(back, r, rtol=0, atol=1e-10)
    assert_close(block_back, back, rtol=0, atol=1e-10)


def _with_method(method, fn, *args):
    """fn(*args) traced afresh (new jit; non-array leaves such as a model's static fields held
    static) with the Schur solve forced to ``method``."""
    old = engine_schur.FORCE_METHOD
    engine_schur.FORCE_METHOD = method
    try:
        return eqx.filter_jit(lambda *a: fn(*a))(*args)
    finally:
        engine_schur.FORCE_METHOD = old


def test_dynamics_and_reactions_tree_vs_dense():
    """Accelerations, multipliers and reaction forces of the branched mechanism (tree, loop
    closure, scalable body, free body), 3 systems, tree elimination against dense."""
    q0, bodies, joints = branched()
    model = rbjax.Model(bodies, joints=joints, gravity=[0.0, 0.0, -9.81])
    state = _state(q0, 3)

    def f(model, state):
        udot, lam = rbjax.accelerations(model, state)
        rea = rbjax.reactions(model, state, lam)
        return udot, lam, rea.force_i, rea.torque_j

    ref = _with_method("dense", f, model, state)
    got = _with_method("tree", f, model, state)
    for a, b in zip(got, ref, strict=True):
        scale = float(jnp.max(jnp.abs(b)))
        assert_close(a / scale, b / scale, rtol=0, atol=1e-12)


def test_derivatives_tree_vs_dense():
    """Reverse-mode derivatives of the accelerations (through the solve's
    custom_linear_solve rule) of a three-link chain whose tip is
    held at a distance from a ground point (a loop closure) with the tree elimination equal
    the dense ones."""
    q0, bodies, joints = chain(3)
    joints.append(
        rbjax.Distance.between(q0, 2, rbjax.GROUND, point_i=[2.5, 0, 0], point_j=[2.5, 0, -1])
    )
    model = rbjax.Model(bodies, joints=joints, gravity=[0.0, 0.0, -9.81])
    # a consistent state written down (rbjax.assemble compiles for ~15 s): the links at q0,
    # link 0 turning about the hinge axis y at a, link 1 about y and z (the universal's axes)
    # at (b, c) about the joint point (1, 0, 0), link 2 at (d, e, f) about (2, 0, 0) with
    # e = −2(a + b), so that the tip (2.5, 0, 0) moves perpendicular to the distance rod
    a, b, c, d, f = 0.2, -0.1, 0.2, 0.2, 0.2
    e = -2.0 * (a + b)
    state = rbjax.make_state(
        position=q0[:, :3],
        quaternion=q0[:, 3:],
        velocity=[[0, 0, -0.5 * a], [0, 0.5 * c, -a - 0.5 * b], [0, c + 0.5 * f, -a - b - 0.5 * e]],
        omega_body=[[0, a, 0], [0, b, c], [d, e, f]],
    )
    arrays, static = eqx.partition(model, eqx.is_array)
    weights = jnp.linspace(0.5, 1.5, 7 * model.nb).reshape(model.nb, 7)

    def loss(arr, st):
        udot, lam = rbjax.accelerations(eqx.combine(arr, static), st)
        return jnp.sum(weights * udot) + jnp.sum(jnp.sin(lam))

    def both(arr, st):  # reverse mode transposes the solve's jvp rule: both are exercised
        return jax.value_and_grad(loss, argnums=(0, 1))(arr, st)

    # the dense gradient is also checked against central differences of the loss (an
    # independent reference for reverse mode through a loop closure) along one random direction
    # in (model arrays, state); both points are evaluated in the dense program itself
    rng = np.random.default_rng(3)
    direction = jax.tree.map(
        lambda x: (
            jnp.asarray(rng.normal(size=jnp.shape(x)), jnp.result_type(x))
            if jnp.issubdtype(jnp.result_type(x), jnp.inexact)
            else jnp.zeros_like(x)
        ),
        (arrays, state),
    )

    def along(arr, st, e):  # the loss at (arr, st) + e · direction
        return loss(*jax.tree.map(lambda x, d: x + e * d, (arr, st), direction))

    def both_and_fd(arr, st, hs):
        return both(arr, st), jax.vmap(along, (None, None, 0))(arr, st, hs)

    # central difference at h = 1e-7: measured 2.3e-8 relative to autodiff, with this state and
    # with the assembled one it replaces (the loss is strongly curved along this direction:
    # h = 1e-6 is 2.3e-6 off, h = 1e-5 2e-4)
    h = 1e-7
    ref, (fp, fm) = _with_method("dense", both_and_fd, arrays, state, jnp.asarray([h, -h]))
    got = _with_method("tree", both, arrays, state)
    for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(ref), strict=True):
        scale = max(float(jnp.max(jnp.abs(y))), 1.0)
        assert_close(x / scale, y / scale, rtol=0, atol=1e-10)

    fd = (float(fp) - float(fm)) / (2 * h)
    grad = ref[1]
    directional = sum(
        float(jnp.sum(g * d))
        for g, d in zip(jax.tree.leaves(grad), jax.tree.leaves(direction), strict=True)
    )
    assert abs(fd) > 1e-3, fd
    assert abs(directional - fd) <= 1e-7 * abs(fd), (directional, fd)
