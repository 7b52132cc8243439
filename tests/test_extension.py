"""Extension points in the natural layout: a user joint, formulation and integrator, each
written for ONE system with plain linear algebra, run through the engine's adapters (jax.vmap)
and compared with the built-in fast paths they re-implement."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close

import rbjax
from rbjax import quaternion as quat


# --8<-- [start:joint]
class MyHinge(rbjax.AbstractConstraint):
    """A revolute joint written by a user: the points coincide and z_i stays ⟂ x_j, y_j."""

    body_i: int = eqx.field(static=True)
    body_j: int = eqx.field(static=True)
    point_i: jax.Array
    point_j: jax.Array
    name: str = eqx.field(static=True, default="my hinge")

    def residual(self, q_i, q_j, t):
        r_i, p_i = q_i[:3], q_i[3:]
        r_j, p_j = q_j[:3], q_j[3:]
        rot_i, rot_j = quat.rotation_matrix(p_i), quat.rotation_matrix(p_j)
        gap_world = r_j + rot_j @ self.point_j - r_i - rot_i @ self.point_i
        z_i, x_j, y_j = rot_i[:, 2], rot_j[:, 0], rot_j[:, 1]
        return jnp.concatenate([gap_world, jnp.stack([z_i @ x_j, z_i @ y_j])])


# --8<-- [end:joint]


def _double_pendulum(hinge):
    """Two rods hanging from the world, hinged about the world z axis (planar swing)."""
    inertia = np.diag([1e-3, 1.0 / 12.0, 1.0 / 12.0])
    bodies = [rbjax.Body(1.0, inertia, name="upper"), rbjax.Body(1.5, inertia, name="lower")]
    q0 = rbjax.make_state(
        position=[[0.5, 0.0, 0.0], [1.5, 0.0, 0.0]],
        quaternion=[[1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]],
    )
    joints = [
        hinge(rbjax.GROUND, 0, np.zeros(3), np.array([-0.5, 0.0, 0.0])),
        hinge(0, 1, np.array([0.5, 0.0, 0.0]), np.array([-0.5, 0.0, 0.0])),
    ]
    model = rbjax.Model(bodies, joints=joints, gravity=[0.0, -9.81, 0.0])
    state = rbjax.make_state(
        position=q0.position,
        quaternion=q0.quaternion,
        velocity=[[0.0, 0.5, 0.0], [0.0, 1.5, 0.0]],
        omega_body=[[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]],
    )
    return model, state


def _builtin(i, j, s_i, s_j):
    return rbjax.Revolute(i, j, s_i=s_i, s_j=s_j)


def _user(i, j, s_i, s_j):
    return MyHinge(i, j, jnp.asarray(s_i), jnp.asarray(s_j))


def test_user_joint_in_natural_layout_matches_builtin_revolute():
    model_b, state = _double_pendulum(_builtin)
    model_u, _ = _double_pendulum(_user)
    assert not type(model_u.joints[0])._vectorised  # the adapter path, not the fast path
    traj_b = rbjax.rollout(model_b, state, 1e-3, 400, multipliers=True)
    traj_u = rbjax.rollout(model_u, state, 1e-3, 400, multipliers=True)
    assert_close(traj_u.q, traj_b.q, rtol=1e-11, atol=1e-12)
    # joint multipliers (the reactions) agree; the scaling multipliers λ[:nb] need not: they
    # depend on how a residual extends off |A|² = 1 (the built-ins use s R = E Gᵀ, this one R)
    assert_close(traj_u.lam[:, 2:], traj_b.lam[:, 2:], rtol=1e-9, atol=1e-9)
    # the state satisfies the user's residual along the motion (to RK4's drift)
    res = jax.vmap(lambda q: model_u.joints[1].residual(q[0], q[1], 0.0))(traj_u.q)
    assert float(jnp.max(jnp.abs(res))) < 1e-6


def test_user_joint_parameters_are_differentiable_like_builtin():
    """Derivatives through the user joint's parameter (a hinge point, forward mode: the
    adapter's jvps differentiated once more) equal the central difference of the built-in
    Revolute's rollout (one forward program, evaluated at ±h). Reverse mode through the
    one-system adapter is checked with the user force below (compile time: a reverse-mode
    mechanism program costs about 45 s here)."""

    def final(build, field, length):
        model, state = _double_pendulum(build)
        model = eqx.tree_at(
            lambda m: getattr(m.joints[1], field), model, jnp.stack([-length, 0.0, 0.0])
        )
        # the lower rod's centre at 1 + length on the x axis, moving with the upper rod's
        # tip (v = 1) plus ω × length: consistent with both joints for every length
        q = state.q.at[1, 0].set(1.0 + length)
        u = state.u.at[1, 1].set(1.0 + length)
        state = rbjax.State(t=state.t, q=q, u=u)
        return rbjax.rollout(model, state, 1e-3, 100).q[-1, 1, 1]

    g_user = jax.jvp(lambda x: final(_user, "point_j", x), (0.5,), (1.0,))[1]
    builtin = eqx.filter_jit(lambda x: final(_builtin, "s_j", x))
    h = 1e-5
    fd = (builtin(jnp.asarray(0.5 + h)) - builtin(jnp.asarray(0.5 - h))) / (2 * h)
    assert_close(builtin(jnp.asarray(0.5)), final(_user, "point_j", 0.5), rtol=1e-11)
    assert_close(g_user, fd, rtol=1e-7)


# --8<-- [start:formulation]
class MyNewtonEuler(rbjax.AbstractFormulation):
    """Newton–Euler for rigid bodies without joints, written for one system (Möller & Glocker 2012 eq. (95))."""

    def kinematics(self, q, u):
        omega_body = u[4:7]
        p_dot = 0.5 * quat.mul(q[3:7], jnp.concatenate([jnp.zeros(1, q.dtype), omega_body]))
        return jnp.concatenate([u[0:3], p_dot])

    def derivatives(self, model, t, state):
        qdot = jax.vmap(self.kinematics)(state.q, state.u)
        omega_body = state.u[:, 4:7]
        spin = jnp.einsum("bij,bj->bi", model.inertia, omega_body)
        gyroscopic = jnp.cross(omega_body, spin)
        omega_dot = jnp.linalg.solve(model.inertia, (-gyroscopic)[..., None])[..., 0]
        v_dot = jnp.broadcast_to(model.gravity, omega_body.shape)
        nu_dot = jnp.zeros(omega_body.shape[:1], state.q.dtype)
        udot = jnp.concatenate([v_dot, nu_dot[:, None], omega_dot], axis=-1)
        lam = -jnp.sum(omega_body * spin, axis=-1)  # eq. (96) with S_C = 0
        return qdot, udot, lam


# --8<-- [end:formulation]


@pytest.mark.parametrize("batch", [(), (3,)])
def test_user_formulation_matches_builtin_newton_euler(batch):
    body = rbjax.Body(2.0, np.diag([1.0, 2.0, 3.0]))
    key = jax.random.PRNGKey(0)
    omega = jax.random.normal(key, batch + (1, 3)) + jnp.array([0.1, 3.0, 0.2])
    state = rbjax.make_state(omega_body=omega, velocity=jnp.ones(batch + (1, 3)))
    ref = rbjax.Model(body, gravity=[0.0, 0.0, -9.81], formulation=rbjax.NewtonEuler())
    mine = rbjax.Model(body, gravity=[0.0, 0.0, -9.81], formulation=MyNewtonEuler())
    traj_r = rbjax.rollout(ref, state, 1e-3, 300, multipliers=True)
    traj_m = rbjax.rollout(mine, state, 1e-3, 300, multipliers=True)
    assert_close(traj_m.q, traj_r.q, rtol=1e-12, atol=1e-13)
    assert_close(traj_m.u, traj_r.u, rtol=1e-12, atol=1e-12)
    assert_close(traj_m.lam, traj_r.lam, rtol=1e-12, atol=1e-12)
    # the natural methods of the built-in agree with the user's on one system
    one = state
    for a, b in zip(
        ref.formulation.derivatives(ref, 0.0, one),
        mine.formulation.derivatives(mine, 0.0, one)
        if not batch
        else jax.vmap(lambda s: mine.formulation.derivatives(mine, 0.0, s))(one),
        strict=True,
    ):
        assert_close(a, b, rtol=1e-13, atol=1e-13)


# --8<-- [start:integrator]
class Heun(rbjax.AbstractIntegrator):
    """Heun's method written by a user for one system (Hairer–Nørsett–Wanner I, §II.1)."""

    @property
    def order(self) -> int:
        return 2

    def step(self, model, state, dt):
        f = model.formulation
        k1q, k1u, _ = f.derivatives(model, state.t, state)
        mid = rbjax.State(t=state.t + dt, q=state.q + dt * k1q, u=state.u + dt * k1u)
        k2q, k2u, _ = f.derivatives(model, state.t + dt, mid)
        return rbjax.State(
            t=state.t + dt,
            q=state.q + 0.5 * dt * (k1q + k2q),
            u=state.u + 0.5 * dt * (k1u + k2u),
        )


# --8<-- [end:integrator]


HEUN = rbjax.advanced.ButcherTableau(a=((), (1.0,)), b=(0.5, 0.5), c=(0.0, 1.0), order=2)


def test_user_integrator_matches_explicit_rk_with_its_tableau():
    """The user's Heun step == ExplicitRK with Heun's tableau on the double pendulum (joints:
    the formulation's natural derivatives through the adapter); batched and under jax.jvp on a
    free body (the integrator is generic; a small model keeps the compile short)."""
    model, state = _double_pendulum(_builtin)
    mine = rbjax.rollout(model, state, 1e-3, 200, integrator=Heun())
    ref = rbjax.rollout(model, state, 1e-3, 200, integrator=rbjax.advanced.ExplicitRK(HEUN))
    assert_close(mine.q, ref.q, rtol=1e-12, atol=1e-13)
    assert isinstance(rbjax.RK4(), rbjax.RK4) and rbjax.RK4().order == 4

    body = rbjax.Model(rbjax.Body(1.0, np.diag([1.0, 2.0, 3.0])), gravity=[0.0, 0.0, -9.81])
    spin = rbjax.make_state(omega_body=[[0.1, 3.0, 0.2]], velocity=[[1.0, 0.0, 0.0]])
    batch = rbjax.make_state(
        omega_body=[[[0.1, 3.0, 0.2]], [[0.2, 6.0, 0.4]]], velocity=[[[1.0, 0.0, 0.0]]] * 2
    )
    both = rbjax.rollout(body, batch, 1e-3, 50, integrator=Heun())
    one = rbjax.rollout(body, spin, 1e-3, 50, integrator=Heun())
    assert_close(both.q[0], one.q, rtol=1e-13, atol=1e-13)

    def final(g, integrator):
        m = eqx.tree_at(lambda m: m.gravity, body, jnp.stack([0.0, 0.0, -g]))
        return rbjax.rollout(m, spin, 1e-3, 50, integrator=integrator).q[-1, 0, 2]

    # forward mode through the user's step == central difference of the tableau's rollout
    tangent = jax.jvp(lambda g: final(g, Heun()), (9.81,), (1.0,))[1]
    ref_fn = eqx.filter_jit(lambda g: final(g, rbjax.advanced.ExplicitRK(HEUN)))
    h = 1e-4
    fd = (ref_fn(jnp.asarray(9.81 + h)) - ref_fn(jnp.asarray(9.81 - h))) / (2 * h)
    assert_close(tangent, fd, rtol=1e-7)


def test_failed_user_integrator_step_is_reported():
    class Exploding(Heun):
        def step(self, model, state, dt):
            out = super().step(model, state, dt)
            return rbjax.State(t=out.t, q=out.q / 0.0, u=out.u)

    model = rbjax.Model(rbjax.Body(1.0, np.diag([1.0, 2.0, 3.0])))  # a free body compiles fast
    state = rbjax.make_state(omega_body=[[0.1, 3.0, 0.2]])
    traj = rbjax.rollout(model, state, 1e-3, 10, integrator=Exploding(), throw=False)
    assert int(traj.result) == rbjax.RESULTS.nonfinite and int(traj.failed_step) == 0


# --8<-- [start:force]
class MyPointForce(rbjax.AbstractForce):
    """A world force at a body point, written by a user for one system (Möller & Glocker 2012 eq. (75))."""

    body: int = eqx.field(static=True)
    point_body: jax.Array
    force_world: jax.Array

    def bodies(self):
        return (self.body,)

    def wrench(self, model, t, state):
        rot = quat.rotation_matrix(state.q[self.body, 3:7])
        force_body = rot.T @ self.force_world
        return rbjax.Wrench.zeros(model.nb, state.q.dtype).add(
            self.body,
            force_world=self.force_world,
            scaling=self.point_body @ force_body,
            moment_body=jnp.cross(self.point_body, force_body),
        )


class LinearDrag(rbjax.AbstractForce):
    """F = −c v on every body, at the centre of mass."""

    c: jax.Array

    def wrench(self, model, t, state):
        zeros = jnp.zeros(state.q.shape[:-1], state.q.dtype)
        return rbjax.Wrench(-self.c * state.u[:, 0:3], zeros, jnp.zeros_like(state.u[:, 0:3]))


# --8<-- [end:force]


@pytest.mark.parametrize("batched_mass", [False, True])
def test_user_force_in_natural_layout_matches_builtin(batched_mass):
    body = rbjax.Body(2.0, np.diag([1.0, 2.0, 3.0]))
    rho, f = jnp.array([0.3, -0.2, 0.5]), jnp.array([1.0, 2.0, -0.5])
    drag = rbjax.ForceFunction(
        lambda t, s, c: (-c * s.u[:, 0:3], 0.0 * s.u[:, 3], 0.0 * s.u[:, 0:3]), 0.4
    )
    ref = rbjax.Model(body, gravity=[0.0, 0.0, -9.81], forces=[rbjax.PointForce(0, rho, f), drag])
    mine = rbjax.Model(
        body,
        gravity=[0.0, 0.0, -9.81],
        forces=[MyPointForce(0, rho, f), LinearDrag(jnp.asarray(0.4))],
    )
    omega = jnp.array([[[0.1, 3.0, 0.2]], [[1.0, -0.5, 2.0]], [[0.0, 0.3, -4.0]]])
    state = rbjax.make_state(omega_body=omega, velocity=jnp.ones((3, 1, 3)))
    if batched_mass:  # model leaves with the batch axis go through the adapter's vmap too
        masses = jnp.array([[1.0], [2.0], [3.0]])
        ref = eqx.tree_at(lambda m: m.mass, ref, masses)
        mine = eqx.tree_at(lambda m: m.mass, mine, masses)
    traj_r = rbjax.rollout(ref, state, 1e-3, 200)
    traj_m = rbjax.rollout(mine, state, 1e-3, 200)
    assert_close(traj_m.q, traj_r.q, rtol=1e-12, atol=1e-13)
    assert_close(traj_m.u, traj_r.u, rtol=1e-12, atol=1e-13)

    if batched_mass:
        return  # reverse mode once (compile time), through the unbatched adapter below

    def final(model, fz):
        model = eqx.tree_at(lambda m: m.forces[0].force_world, model, jnp.array([1.0, 2.0, fz]))
        return jnp.sum(rbjax.rollout(model, state, 1e-3, 50).u[:, -1, 0, :])

    # both gradients in one program (jax.grad through rollout's jit compiles two per model)
    grads = jax.jit(lambda fz: [jax.grad(final, argnums=1)(m, fz) for m in (mine, ref)])
    got, want = grads(jnp.asarray(-0.5))
    assert_close(got, want, rtol=1e-11)


def test_builtin_forces_natural_wrench_equals_engine_fast_path_on_batches():
    """Every built-in force: its natural per-system ``wrench`` (vmapped by the adapter) equals
    its component-first kernel on a batch with batched model leaves (a second formulation)."""
    from rbjax._engine.forces import resultants_per_system
    from rbjax._engine.layout import to_components

    key = jax.random.PRNGKey(7)
    bodies = [
        rbjax.Body(1.0, np.diag([1.0, 2.0, 2.5]), name="a"),
        rbjax.Body(2.0, np.eye(3), scalable=True, name="b"),
    ]
    q0 = np.array([[0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0], [1.0, 0.5, 0.0, 1.1, 0.2, 0.0, 0.1]])
    forces = [
        rbjax.PointForce(1, [0.1, 0.2, 0.3], [1.0, -2.0, 0.5]),
        rbjax.BodyTorque(0, [0.3, 0.0, -1.0]),
        rbjax.TranslationalSpringDamper(
            0,
            [0.2, -0.1, 0.3],
            1,
            [-0.15, 0.25, 0.05],
            stiffness=40.0,
            damping=0.8,
            rest_length=0.7,
        ),
        rbjax.TranslationalSpringDamper(
            1, [0.1, 0.0, 0.0], rbjax.GROUND, [2.0, 1.0, 0.0], stiffness=5.0, damping=0.3
        ),
        rbjax.RotationalSpringDamper.at(q0, 0, 1, axis=[0.0, 0.3, 1.0], stiffness=2.0, damping=0.1),
        rbjax.RotationalSpringDamper.at(q0, rbjax.GROUND, 1, axis=[1.0, 0.0, 0.0], stiffness=3.0),
    ]
    model = rbjax.Model(bodies, forces=forces)
    model = eqx.tree_at(lambda m: m.mass, model, jnp.array([[1.0, 2.0], [1.5, 2.5], [0.5, 3.0]]))
    k1, k2 = jax.random.split(key)
    q = jnp.asarray(q0) + 0.2 * jax.random.normal(k1, (3, 2, 7))
    u = jax.random.normal(k2, (3, 2, 7)).at[:, 0, 3].set(0.0)
    t, qc, uc = to_components(rbjax.State(t=jnp.array([0.0, 0.3, 1.0]), q=q, u=u))
    for force in forces:
        fast = force._engine_resultants(model, t, qc, uc)
        natural = resultants_per_system(force, model, t, qc, uc)
        for a, b in zip((fast.F, fast.S, fast.M), (natural.F, natural.S, natural.M), strict=True):
            assert_close(a, b, rtol=1e-13, atol=1e-13, err_msg=type(force).__name__)
