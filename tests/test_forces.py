"""Forces: resultants against hand computations (Möller & Glocker 2012, eq. (75)); differentiability in
every force parameter against central finite differences; user force laws under batching."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from conftest import assert_close

import rbjax
from rbjax._engine.forces import total_resultants
from rbjax._engine.layout import to_components

INERTIA = jnp.diag(jnp.array([1.0, 2.0, 3.0]))


def rot(q):
    a0, a = q[0], q[1:]
    sk = np.array([[0, -a[2], a[1]], [a[2], 0, -a[0]], [-a[1], a[0], 0]])
    return (a0**2 - a @ a) * np.eye(3) + 2 * np.outer(a, a) + 2 * a0 * sk


def test_point_force_resultants_match_eq75_for_scalable_body():
    rho = np.array([0.3, -0.2, 0.5])
    f = np.array([1.0, 2.0, -0.5])
    model = rbjax.Model(
        [rbjax.Body(2.0, INERTIA, scalable=True)],
        gravity=(0.0, 0.0, -9.81),
        forces=[rbjax.PointForce(0, rho, f)],
    )
    a = np.array([0.9, 0.2, -0.3, 0.4])  # non-unit: s = |A|² ≠ 1
    st = rbjax.make_state(quaternion=a)
    res = total_resultants(model, *to_components(st))
    R = rot(a) / (a @ a)
    assert_close(np.asarray(res.F)[:, 0], f + 2.0 * np.array([0, 0, -9.81]), rtol=1e-14)
    assert_close(np.asarray(res.S)[0], rho @ R.T @ f, rtol=1e-13)  # S_C = ϱᵀRᵀF
    assert_close(np.asarray(res.M)[:, 0], np.cross(rho, R.T @ f), rtol=1e-13)  # M_C = ϱ̃RᵀF


def final_position_loss(model, state):
    traj = rbjax.rollout(model, state, 1e-2, 50, save_every=50)
    qf = traj.q[-1, 0]
    return jnp.sum(qf[0:3] ** 2) + jnp.sum(qf[3:7] * jnp.array([0.3, -0.1, 0.7, 0.2]))


def fd_grad(fn, x, eps=1e-6):
    x = np.asarray(x, float)
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = eps
        g[i] = (fn(jnp.asarray(x + e)) - fn(jnp.asarray(x - e))) / (2 * eps)
    return g


WHERE = {
    "force_world": lambda m: m.forces[0].force_world,
    "point_body": lambda m: m.forces[0].point_body,
    "torque_body": lambda m: m.forces[1].torque_body,
    "user_params": lambda m: m.forces[2].params,
    "gravity": lambda m: m.gravity,
    "mass": lambda m: m.mass,
}


def test_gradients_in_force_parameters_match_finite_differences():
    def drag(t, state, c):
        v = state.u[:, 0:3]
        return -c[0] * v, jnp.zeros(v.shape[:1]), -c[1] * state.u[:, 4:7]

    model = rbjax.Model(
        rbjax.Body(1.5, INERTIA),
        gravity=(0.0, 0.0, -9.81),
        forces=[
            rbjax.PointForce(0, [0.2, 0.0, 0.1], [0.5, -1.0, 2.0]),
            rbjax.BodyTorque(0, [0.1, 0.3, -0.2]),
            rbjax.ForceFunction(drag, jnp.array([0.4, 0.2])),
        ],
    )
    state = rbjax.make_state(velocity=[1.0, 0.0, 0.5], omega_body=[0.3, 1.0, -0.4])
    wheres = list(WHERE.values())
    everything = lambda m: tuple(w(m) for w in wheres)
    x0 = everything(model)
    loss = jax.jit(lambda xs: final_position_loss(eqx.tree_at(everything, model, xs), state))
    g_rev = jax.grad(loss)(x0)
    for k, name in enumerate(WHERE):

        def partial_loss(x, k=k):
            xs = list(x0)
            xs[k] = x
            return loss(tuple(xs))

        g_fd = fd_grad(partial_loss, x0[k])
        assert np.all(np.isfinite(np.asarray(g_rev[k]))), name
        assert_close(g_rev[k], g_fd, rtol=1e-6, atol=1e-8, err_msg=name)
    # forward mode agrees with reverse mode
    direction = tuple(jnp.ones_like(x) for x in x0)
    _, jvp = jax.jvp(loss, (x0,), (direction,))
    assert_close(jvp, sum(jnp.sum(g) for g in g_rev), rtol=1e-10)


def test_force_function_batched_rollout_equals_single_rollouts():
    def spring(t, state, k):
        r = state.q[:, 0:3]
        return -k * r, jnp.zeros(r.shape[:1]), jnp.zeros_like(r)

    model = rbjax.Model(
        rbjax.Body(1.0, INERTIA), forces=[rbjax.ForceFunction(spring, jnp.asarray(4.0))]
    )
    pos = np.array([[1.0, 0.0, 0.0], [0.0, 0.5, 0.0], [0.2, 0.2, 0.2]])[:, None, :]
    batched = rbjax.rollout(model, rbjax.make_state(position=pos), 1e-2, 100)
    for i in range(3):
        single = rbjax.rollout(model, rbjax.make_state(position=pos[i]), 1e-2, 100)
        assert_close(batched.q[i], single.q, rtol=1e-13, atol=1e-15)
    # harmonic oscillator: x(t) = x0 cos(2t) (ω = sqrt(k/m) = 2)
    t = np.asarray(batched.t[0])
    assert_close(batched.q[0, :, 0, 0], np.cos(2 * t), atol=1e-7)


def test_forces_of_one_type_evaluated_together_equal_their_sum():
    """Built-in forces of one type are traced once as a group (vmap over their fields and
    traced body indices): the total equals the sum of each force's natural ``wrench`` (the
    per-system adapter, a second implementation) on a batch, with ground and body sides mixed,
    and the program holds one copy of the kernel per group, not per force."""
    from rbjax._engine.forces import _force_groups, resultants_per_system

    q0 = np.array([[0.1 * k, 0.2, -0.1 * k, 1.0, 0.0, 0.0, 0.0] for k in range(4)])
    bodies = [rbjax.Body(1.0 + k, np.diag([1.0, 2.0, 2.5]) * (1 + k)) for k in range(4)]
    forces = [
        rbjax.RotationalSpringDamper.at(q0, k, k + 1, axis=[0.2 * k, 1.0, 0.3], stiffness=2.0 + k)
        for k in range(3)
    ]
    forces += [
        rbjax.RotationalSpringDamper.at(q0, rbjax.GROUND, 2, axis=[1.0, 0.0, 0.0], stiffness=3.0)
    ]
    forces += [
        rbjax.TranslationalSpringDamper(
            k, [0.1, 0.0, 0.2 * k], (k + 2) % 4, [0.0, 0.3, 0.1], stiffness=4.0 + k, damping=0.5
        )
        for k in range(4)
    ]
    forces += [rbjax.PointForce(k, [0.1, -0.2, 0.3 * k], [1.0, k, 0.5]) for k in range(3)]
    forces += [rbjax.BodyTorque(k, [0.3, k, -1.0]) for k in (0, 3)]
    model = rbjax.Model(bodies, forces=forces)
    assert sorted(len(g) for g in _force_groups(model.forces)) == [1, 2, 3, 3, 4]
    k1, k2 = jax.random.split(jax.random.PRNGKey(3))
    q = jnp.asarray(q0) + 0.3 * jax.random.normal(k1, (5, 4, 7))
    u = jax.random.normal(k2, (5, 4, 7)).at[:, :, 3].set(0.0)
    t, qc, uc = to_components(rbjax.State(t=jnp.linspace(0.0, 1.0, 5), q=q, u=u))
    total = total_resultants(model, t, qc, uc)
    parts = [resultants_per_system(f, model, t, qc, uc) for f in forces]
    gravity = rbjax.Model(bodies)
    expected = total_resultants(gravity, t, qc, uc)
    for p in parts:
        expected = expected + p
    for a, b in zip((total.F, total.S, total.M), (expected.F, expected.S, expected.M), strict=True):
        assert_close(a, b, rtol=1e-13, atol=1e-13)
    assert float(jnp.max(jnp.abs(total.M))) > 1.0  # the check can fail
