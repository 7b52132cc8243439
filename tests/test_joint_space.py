"""rbjax.JointSpace on hand-built mechanisms: forward and reversed joints (the tree may run
from body_j to body_i), every joint type with coordinates, against Lagrange's equations
evaluated by automatic differentiation of T(x, ẋ) = ½ ẋᵀ M(x) ẋ and V(x) (an independent
formulation: no velocity-product recursion, no Newton–Euler). The MuJoCo side-by-side tests
of the same functions are in test_load.py."""

import os

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rbjax

G = rbjax.GROUND


def _chain(reverse: bool):
    """Ground —Revolute— 0 —Universal— 1 —Cylindrical— 2, each joint given forward (parent
    as body_i) or reversed (parent as body_j). (Prismatic joints share the Cylindrical's
    slide code; forward prismatic joints are checked against MuJoCo in test_load.py.)"""
    bodies = [
        rbjax.Body(1.0 + 0.3 * k, np.diag([0.02 + 0.01 * k, 0.03, 0.025 + 0.005 * k]), name=f"b{k}")
        for k in range(3)
    ]
    q = np.zeros((3, 7))
    q[:, 3] = 1.0
    q[:, 0:3] = [[0.2, 0.0, -0.1], [0.5, 0.1, -0.3], [0.8, 0.1, -0.5]]
    specs = [
        (rbjax.Revolute, G, 0, [0.0, 0.0, 0.0], [0.0, 1.0, 0.0], {}),
        (rbjax.Universal, 0, 1, [0.35, 0.05, -0.2], [1.0, 0.0, 0.0], {"x": [0.0, 0.0, 1.0]}),
        (rbjax.Cylindrical, 1, 2, [0.65, 0.1, -0.4], [0.6, 0.0, -0.8], {}),
    ]
    joints = []
    for cls, i, j, p, a, kw in specs:
        if reverse:
            if cls is rbjax.Universal:  # body i's pin is the first axis: swap the pins too
                kw = {"x": a}
                a = [0.0, 0.0, 1.0]
            joints.append(cls.at(q, j, i, point=p, axis=a, **kw))
        else:
            joints.append(cls.at(q, i, j, point=p, axis=a, **kw))
    return rbjax.Model(bodies, gravity=[0.0, 0.0, -9.81], joints=joints)


def test_bias_equals_lagrange_by_autodiff_on_reversed_joints():
    """Every joint given with the parent as body_j (the tree runs against the joints'
    direction); the forward direction is covered against MuJoCo in test_load.py."""
    model = _chain(reverse=True)
    js = rbjax.JointSpace(model)
    assert js.loops == () and js.nv == 5
    assert [c[1] for c in js.coordinates] == ["revolute", "universal", "cylindrical"]
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.uniform(-0.4, 0.4, js.nq))
    xd = jnp.asarray(rng.uniform(-1.0, 1.0, js.nv))

    def kinetic(x, xd):  # T of the body velocities of (x, ẋ): no joint-space mass matrix
        return rbjax.kinetic_energy(model, js.state(x, xd))

    def potential(x):
        return -jnp.sum(model.mass * (js.state(x).q[:, 0:3] @ model.gravity))

    @jax.jit
    def both(x, xd):
        st = js.state(x, xd)
        # Lagrange at q̈ = 0: C q̇ + g = (∂²T/∂ẋ∂x) ẋ − ∂T/∂x + ∂V/∂x
        dT_dxd = lambda x: jax.grad(kinetic, argnums=1)(x, xd)
        lagrange = (
            jax.jvp(dT_dxd, (x,), (xd,))[1] - jax.grad(kinetic)(x, xd) + jax.grad(potential)(x)
        )
        return js.bias(st), lagrange, js.positions(st), js.velocities(st)

    bias, lagrange, x_back, xd_back = both(x, xd)
    np.testing.assert_allclose(x_back, x, atol=1e-13)  # coordinates both ways
    np.testing.assert_allclose(xd_back, xd, atol=1e-13)
    np.testing.assert_allclose(bias, lagrange, atol=1e-11 * float(jnp.abs(lagrange).max()))


def test_state_from_joint_coordinates_assembles_loops_and_gradients_flow():
    """A planar four-bar closed by a PointOnLine (the pin's two in-plane equations): the
    spanning tree's coordinates place the bodies, assembly closes the loop (positions and
    velocities); the joint-space functions are differentiable in the model (a mass matrix
    entry against central differences in the link masses)."""
    q = np.zeros((3, 7))
    q[:, 3] = 1.0
    q[:, 0:3] = [[0.0, 0.0, 0.15], [0.4, 0.0, 0.4], [0.8, 0.0, 0.25]]
    bodies = [rbjax.Body(1.0, [0.01, 0.01, 0.002], name=n) for n in ("crank", "coupler", "rocker")]
    y = [0.0, 1.0, 0.0]
    joints = [
        rbjax.Revolute.at(q, G, 0, point=[0.0, 0.0, 0.0], axis=y),
        rbjax.Revolute.at(q, 0, 1, point=[0.0, 0.0, 0.3], axis=y),
        rbjax.Revolute.at(q, G, 2, point=[0.8, 0.0, 0.0], axis=y),
        rbjax.PointOnLine.at(q, 1, 2, point=[0.8, 0.0, 0.5], axis=y, name="loop"),
    ]
    model = rbjax.Model(bodies, gravity=[0, 0, -9.81], joints=joints)
    js = rbjax.JointSpace(model)
    assert js.loops == ("loop",) and js.nv == 3
    state = rbjax.state_from_joint_coordinates(model, [0.1, 0.0, 0.0], [1.0, 0.0, 0.0])
    loop = model.joints[-1]

    def closure(qq):
        return loop.residual(qq[1], qq[2], 0.0)

    q_dot = jax.vmap(
        lambda a, w: 0.5 * rbjax.quaternion.mul(a, jnp.concatenate([jnp.zeros(1), w]))
    )(state.q[:, 3:7], state.u[:, 4:7])
    q_dot = jnp.concatenate([state.u[:, 0:3], q_dot], axis=1)
    res, rate = jax.jvp(closure, (state.q,), (q_dot,))
    assert float(jnp.abs(res).max()) < 1e-12 and float(jnp.abs(rate).max()) < 1e-12
    assert abs(float(js.positions(state)[0]) - 0.1) < 0.02  # a small correction, not elsewhere

    @jax.jit
    def m00(mass):
        return rbjax.JointSpace(eqx.tree_at(lambda m: m.mass, model, mass)).mass_matrix(state)[0, 0]

    g = jax.jit(jax.grad(m00))(model.mass)
    for b in range(3):
        e = jnp.zeros(3).at[b].set(1e-6)
        fd = (m00(model.mass + e) - m00(model.mass - e)) / 2e-6
        np.testing.assert_allclose(g[b], fd, rtol=1e-7)


def test_joint_space_refuses_scalable_bodies_and_bad_shapes():
    model = rbjax.Model([rbjax.Body(1.0, [1.0, 1.0, 1.0], scalable=True)])
    with pytest.raises(ValueError, match="scalable"):
        rbjax.JointSpace(model)
    js = rbjax.JointSpace(rbjax.Model([rbjax.Body(1.0, [1.0, 1.0, 1.0])]))
    assert js.coordinates == (("body", "free", 7, 6),)
    with pytest.raises(ValueError, match=r"qpos has shape \(3,\), expected \(7,\)"):
        js.state([0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="unknown body 'nope'"):
        js.point(js.state([0, 0, 0, 1.0, 0, 0, 0]), "nope", [0.0, 0.0, 0.0])


def test_velocities_of_a_model_with_a_driver():
    """Regression: a RotationDriver is not a tree joint; JointSpace.velocities raised KeyError.
    The hand-written pendulum's crank turns at the driver's rate A·2π = π rad/s at t = 0 and
    its rod does not rotate yet, so the tip angle changes at −π."""
    path = os.path.join(
        os.path.dirname(__file__), "..", "examples", "models", "pendulum_driven.toml"
    )
    loaded = rbjax.load(path)
    js = rbjax.JointSpace(loaded.model)
    assert js.loops == ("motor",)
    np.testing.assert_allclose(js.velocities(loaded.state), [np.pi, -np.pi], atol=1e-12)


def test_parents_and_origins_give_another_descriptions_coordinates():
    """JointSpace(parents=..., origins=...) (what Loaded.joint_space() passes for MuJoCo's
    qpos): coordinates in body order on the given tree, the other joints loops; a free body's
    position is the world position r + R ō of its origins point and its velocity
    v + ω × R ō (closed form), both ways; wrong options refused by name."""
    bodies = [rbjax.Body(1.0 + k, np.diag([0.02, 0.03, 0.025]), name=f"b{k}") for k in range(2)]
    q = np.zeros((2, 7))
    q[:, 3] = 1.0
    q[:, 0:3] = [[0.0, 0.0, 1.0], [0.3, 0.0, 1.0]]
    y = [0.0, 1.0, 0.0]
    joints = [
        rbjax.Revolute.at(q, 0, 1, point=[0.15, 0.0, 1.0], axis=y, name="hinge"),
        rbjax.Spherical.at(q, G, 1, point=[0.45, 0.0, 1.0], name="hook"),
        rbjax.Revolute.at(q, 1, 0, point=[0.15, 0.0, 1.0], axis=y, name="again"),
    ]
    model = rbjax.Model(bodies, joints=joints)
    default = rbjax.JointSpace(model)
    assert default.free == () and default.loops == ("hinge",)  # grown from the ground
    origins = np.array([[0.05, -0.02, 0.1], [0.0, 0.0, 0.0]])
    js = rbjax.JointSpace(model, parents=(None, "hinge"), origins=origins)
    assert [c[1] for c in js.coordinates] == ["free", "revolute"] and js.parents == (None, 0)
    assert js.loops == ("hook", "again") and (js.nq, js.nv) == (8, 7)
    rng = np.random.default_rng(1)
    a = rng.normal(size=4)
    a /= np.linalg.norm(a)
    qpos = jnp.asarray(np.r_[0.2, -0.1, 0.9, a, 0.3])
    qvel = jnp.asarray(rng.uniform(-1.0, 1.0, 7))

    @jax.jit
    def both(qpos, qvel):
        st = js.state(qpos, qvel)
        return st, js.positions(st), js.velocities(st)

    st, qp, qv = both(qpos, qvel)
    np.testing.assert_allclose(qp, qpos, atol=1e-14)
    np.testing.assert_allclose(qv, qvel, atol=1e-14)
    rot = np.asarray(rbjax.quaternion.to_matrix(jnp.asarray(a)))
    lever = rot @ origins[0]
    np.testing.assert_allclose(st.q[0, 0:3], qpos[0:3] - lever, atol=1e-14)  # r = p − R ō
    omega_world = rot @ np.asarray(qvel[3:6])
    np.testing.assert_allclose(st.u[0, 0:3], qvel[0:3] - np.cross(omega_world, lever), atol=1e-14)
    for kwargs, match in (
        ({"parents": (None,)}, r"parents has 1 entries; the model has 2 bodies"),
        ({"parents": (None, "nope")}, r"parents\[1\] = 'nope' is not a joint"),
        ({"parents": ("hook", None)}, r"joint 'hook', which does not connect body 'b0'"),
        ({"parents": (None, 0, 1)}, r"parents has 3 entries"),
        ({"parents": (0, 2)}, r"form a cycle"),
        ({"parents": (None, 0), "origins": [0.0, 0.0, 0.0]}, r"origins has shape \(3,\)"),
    ):
        with pytest.raises(ValueError, match=match):
            rbjax.JointSpace(model, **kwargs)
