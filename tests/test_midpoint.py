"""The implicit midpoint step's simplified Newton (rbjax/_engine/midpoint.py).

References: the exact Jacobian of the midpoint residual by ``jax.jacfwd``, Newton's method
with the exact Jacobian (the solver before the simplified iteration), and central finite
differences of whole rollouts for the derivatives.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close
from test_elimination import _state, branched, chain

import rbjax
from rbjax._engine import midpoint as mp
from rbjax._engine.newton import batch_jacobian, batched_solve


def _components(state):
    return state.t[:, None], jnp.moveaxis(state.q, -1, 0), jnp.moveaxis(state.u, -1, 0)


def _mechanism(name, formulation, **kw):
    q0, bodies, joints = {"chain": chain, "branched": branched}[name](**kw)
    model = rbjax.Model(bodies, joints=joints, gravity=[0.0, 0.0, -9.81], formulation=formulation)
    return model, rbjax.assemble(model, _state(q0, 2))


@eqx.filter_jit
def _exact_root(model, t, q, u, h):
    """The midpoint root by Newton's method with the exact (autodiff) Jacobian."""
    args = (model, t, q, u, h)
    fn = lambda z: mp.residual(z, args)  # noqa: E731
    newton = lambda _, z: z + batched_solve(batch_jacobian(fn, z), -fn(z))  # noqa: E731
    return jax.lax.fori_loop(0, 8, newton, mp._guess(model, q, u))


@eqx.filter_jit
def _matrices(model, t, q, u, h):
    """(J, P⁻¹) at the root: J by jax.jacfwd (n, batch, n, batch), the columns of P⁻¹ applied
    to unit vectors in every system (column, row, batch)."""
    z = _exact_root(model, t, q, u, h)
    jac = jax.jacfwd(lambda zz: mp.residual(zz, (model, t, q, u, h)))(z)
    precondition = mp.Preconditioner(model, t, q, h)
    n, b = z.shape
    cols = jax.vmap(lambda e: precondition(e[:, None] * jnp.ones((1, b))))(jnp.eye(n))
    return jac, cols


def _radius(model, t, q, u, h):
    """Spectral radius of I − P⁻¹J per system of a batch of two."""
    jac, cols = (np.asarray(x) for x in _matrices(model, t, q, u, h))
    n = jac.shape[0]
    return [
        np.max(np.abs(np.linalg.eigvals(np.eye(n) - cols[:, :, i].T @ jac[:, i, :, i])))
        for i in range(2)
    ]


CASES = [("chain", rbjax.NewtonEuler()), ("branched", rbjax.ScalableDAE())]


@pytest.mark.parametrize("name,formulation", CASES, ids=["chain-NE", "branched"])
def test_preconditioner_inverts_the_jacobian_to_first_order_in_h(name, formulation):
    """I − P⁻¹J at the root, J the exact Jacobian of the residual by jax.jacfwd: its spectral
    radius is the simplified iteration's contraction and must vanish like h (a wrong sign or
    factor in the elimination leaves it O(1)). A 4-link chain in NewtonEuler (no
    normalisation rows) and the branched mechanism in ScalableDAE: revolute, universal,
    spherical and distance joints, a scalable body, a free body and a loop closure."""
    model, state = _mechanism(name, formulation, **({"n": 4} if name == "chain" else {}))
    t, q, u = _components(state)
    radius = [r for h in (1e-3, 1e-4) for r in _radius(model, t, q, u, jnp.asarray(h))]
    assert max(radius[:2]) < 0.05, radius
    assert max(radius[2:]) < max(radius[:2]) / 5, radius


def test_step_matches_exact_newton():
    """One step of every member of a batch against Newton with the exact Jacobian, and the
    residual at the returned point (q and u at roundoff, joints held)."""
    model, state = _mechanism("branched", rbjax.ScalableDAE())
    t, q, u = _components(state)
    h = jnp.asarray(2e-3)
    _, q1, u1, ok = jax.jit(mp.implicit_midpoint_step, static_argnums=(5, 6))(
        model, t, q, u, h, None, 20
    )
    assert bool(jnp.all(ok))
    z = _exact_root(model, t, q, u, h)
    zb = mp.unflatten(z[: 15 * model.nb], 15, model.nb)
    assert_close(q1, zb[0:7], rtol=0, atol=1e-12)
    assert_close(u1, zb[7:14], rtol=0, atol=1e-11)


def _spinning_body():
    """Two torque-free bodies with dt = 1e-2: one spinning fast about its middle axis (hω =
    0.5: the simplified iteration contracts by ~0.5 per iteration, if at all) and a slow one
    (hω = 1e-3)."""
    model = rbjax.Model(rbjax.Body(1.0, jnp.diag(jnp.array([1.0, 2.0, 3.0]))))
    state = rbjax.make_state(omega_body=np.array([[[0.3, 50.0, 0.2]], [[0.01, 0.02, 0.1]]]))
    return model, state


def test_stiff_step_converges_and_flags_the_dense_derivative():
    model, state = _spinning_body()
    t, q, u = _components(state)
    h = jnp.asarray(1e-2)
    z, (done, fast) = mp._solver(2.2e-13, 20, False)((model, t, q, u, h))
    assert bool(jnp.all(done))
    # the fast spinner is flagged (the derivatives take the dense solve), the slow one is not
    np.testing.assert_array_equal(np.asarray(fast), [False, True])
    assert_close(z, _exact_root(model, t, q, u, h), rtol=0, atol=1e-12)


def _two_link_states():
    """The 2-link chain (revolute about y at the origin, universal at (1, 0, 0) with pins y on
    link 0 and z on link 1), ScalableDAE, in two consistent states written down (rather than
    ``rbjax.assemble``d: its compilation took a quarter of the test): link 0 turned by α about
    y, link 1 by α + β about y and then γ about its own z, at rates (α̇, β̇, γ̇)."""
    _, bodies, joints = chain(2)
    model = rbjax.Model(
        bodies, joints=joints, gravity=[0.0, 0.0, -9.81], formulation=rbjax.ScalableDAE()
    )

    def rot(axis, a):  # rotation matrix and quaternion of the angle a about e_axis
        e = np.eye(3)[axis]
        k = np.cross(np.eye(3), e)  # k v = e × v
        return np.eye(3) + np.sin(a) * k + (1 - np.cos(a)) * k @ k, np.r_[np.cos(a / 2), np.sin(a / 2) * e]  # fmt: skip

    def qmul(a, b):
        return np.r_[a[0] * b[0] - a[1:] @ b[1:], a[0] * b[1:] + b[0] * a[1:] + np.cross(a[1:], b[1:])]  # fmt: skip

    states = []
    for al, be, ga, dal, dbe, dga in [
        (0.3, -0.5, 0.4, 0.7, -0.4, 0.9),
        (-1.0, 0.8, -0.6, -0.3, 0.5, 0.6),
    ]:
        (r0, p0), (r01, p01), (rz, pz) = rot(1, al), rot(1, al + be), rot(2, ga)
        r1 = r01 @ rz
        c0, pin = r0 @ [0.5, 0, 0], r0 @ [1.0, 0, 0]
        c1 = pin + r1 @ [0.5, 0, 0]
        w0, w1 = np.array([0, dal, 0]), np.array([0, dal + dbe, 0]) + r01 @ [0, 0, dga]
        states.append(
            rbjax.make_state(
                position=[c0, c1],
                quaternion=[p0, qmul(p01, pz)],
                velocity=[np.cross(w0, c0), np.cross(w0, pin) + np.cross(w1, c1 - pin)],
                omega_body=[r0.T @ w0, r1.T @ w1],
            )
        )
    return model, jax.tree.map(lambda *x: jnp.stack(x), *states)


def test_step_derivatives_against_exact_newton():
    """d(q, u after one step)/d(u before) of a 2-link chain (revolute + universal,
    ScalableDAE, h = 1e-3), whose derivatives take the refinement with P, against the same
    step with ``newton="exact"`` (a dense LU of the exact Jacobian). Reverse mode through the
    refinement: tests/test_transforms.py (jacfwd = jacrev, jvp = grad · direction)."""
    model, s0 = _two_link_states()
    t, q, u = _components(s0)
    h = jnp.asarray(1e-3)

    def step(u0, exact):
        _, q1, u1, _ = mp.implicit_midpoint_step(model, t, q, u0, h, None, 20, exact)
        return jnp.concatenate([q1.ravel(), u1.ravel()])

    rng = np.random.default_rng(3)
    v = jnp.asarray(rng.normal(size=u.shape)).at[3].set(0.0)
    tangent = lambda exact: jax.jit(  # noqa: E731
        lambda x: jax.jvp(lambda y: step(y, exact), (x,), (v,))[1]
    )(u)
    jvp = tangent(False)
    assert_close(jvp, tangent(True), rtol=0, atol=1e-11 * float(jnp.max(jnp.abs(jvp))))


def test_stiff_rollout_derivatives_against_finite_differences():
    """d(final state)/d(initial velocity) of 20 steps of the two spinning bodies (the fast
    one takes the dense LU): forward mode against central differences (the primal iterates to
    its roundoff floor, ~1e-13 per step, which sets their accuracy), reverse mode against
    forward mode."""
    model, s0 = _spinning_body()
    dt, n = 1e-2, 20

    def final(u0):
        s = rbjax.State(t=s0.t, q=s0.q, u=u0)
        tr = rbjax.rollout(model, s, dt, n, integrator=rbjax.ImplicitMidpoint(), save_every=n)
        return jnp.concatenate([tr.q[:, -1].ravel(), tr.u[:, -1].ravel()])

    rng = np.random.default_rng(3)
    v = jnp.asarray(rng.normal(size=s0.u.shape)).at[..., 3].set(0.0)
    jvp = jax.jit(lambda x: jax.jvp(final, (x,), (v,))[1])(s0.u)
    eps = 1e-5
    final_j = jax.jit(final)
    fd = (final_j(s0.u + eps * v) - final_j(s0.u - eps * v)) / (2 * eps)
    assert_close(jvp, fd, rtol=0, atol=1e-6 * float(jnp.max(jnp.abs(jvp))))
    w = jnp.asarray(rng.normal(size=jvp.shape))
    vjp = jax.jit(lambda x: jax.vjp(final, x)[1](w)[0])(s0.u)
    assert_close(jnp.sum(vjp * v), jnp.sum(w * jvp), rtol=1e-10, atol=0)
