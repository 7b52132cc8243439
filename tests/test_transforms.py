"""JAX transformations compose with rbjax: jit, vmap, grad, jvp, jacfwd/jacrev, batching, dtypes.

Every comparison is against something computed a different way: eager vs jitted, a batched
state vs ``jax.vmap`` vs a Python loop of single systems, autodiff vs central finite
differences, forward vs reverse mode, float32 vs float64.
"""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close

import rbjax

INERTIA = np.array([1.0, 2.0, 3.0])
OMEGAS = np.array([[0.3, 1.0, 0.2], [1.0, 0.2, 0.1], [0.1, 0.1, 2.0], [0.5, -0.5, 0.5]])
B = len(OMEGAS)

INTEGRATORS = {
    "SemiImplicitEuler": rbjax.SemiImplicitEuler,
    "RK4": rbjax.RK4,
    "Heun": lambda: rbjax.advanced.ExplicitRK(
        rbjax.advanced.ButcherTableau(a=((), (1.0,)), b=(0.5, 0.5), c=(0.0, 1.0), order=2)
    ),
    "ImplicitMidpoint": rbjax.ImplicitMidpoint,
}


def _two_body_model(formulation, dtype=jnp.float64):
    """Two bodies, gravity and a point force; body 1 is scalable under ScalableDAE."""
    scal = formulation == "ScalableDAE"
    form = {
        "ScalableDAE": rbjax.ScalableDAE,
        "NewtonEuler": rbjax.NewtonEuler,
        "UdwadiaSchutte": lambda: rbjax.UdwadiaSchutte(J0=2.0),
    }[formulation]()
    th0 = jnp.asarray([[2.0, 0.1, 0.0], [0.1, 3.0, 0.2], [0.0, 0.2, 4.0]], dtype)
    return rbjax.Model(
        [
            rbjax.Body(jnp.asarray(1.5, dtype), th0, name="a"),
            rbjax.Body(
                jnp.asarray(2.0, dtype),
                jnp.asarray([1.0, 1.5, 2.0], dtype),
                scalable=scal,
                name="b",
            ),
        ],
        gravity=(0.0, 0.0, -9.81),
        forces=[
            rbjax.PointForce(
                0, jnp.asarray([0.3, -0.2, 0.1], dtype), jnp.asarray([0.5, 1.0, -2.0], dtype)
            )
        ],
        formulation=form,
    )


def _two_body_state(batch, dtype=jnp.float64):
    rng = np.random.default_rng(0)
    w = rng.normal(size=batch + (2, 3))
    v = rng.normal(size=batch + (2, 3))
    r = rng.normal(size=batch + (2, 3))
    a = rng.normal(size=batch + (2, 4))
    a = a / np.linalg.norm(a, axis=-1, keepdims=True)
    return rbjax.make_state(position=r, quaternion=a, velocity=v, omega_body=w, dtype=dtype)


def _leaves_match(a, b):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        assert x.shape == y.shape, (x.shape, y.shape)
        assert x.dtype == y.dtype, (x.dtype, y.dtype)


def _one_body(inertia=INERTIA, formulation=None, forces=(), gravity=(0.0, 0.0, 0.0)):
    return rbjax.Model(
        rbjax.Body(1.0, inertia), formulation=formulation, forces=forces, gravity=gravity
    )


def _batched_state():
    return rbjax.make_state(omega_body=OMEGAS[:, None, :])


# ------------------------------------------------------- 1. structure, shapes, dtypes


@pytest.mark.parametrize("batch", [(), (5,)], ids=["single", "batch5"])
@pytest.mark.parametrize("formulation", ["ScalableDAE", "NewtonEuler", "UdwadiaSchutte"])
@pytest.mark.parametrize("integrator", list(INTEGRATORS))
def test_step_keeps_structure_shapes_dtypes(integrator, formulation, batch):
    model = _two_body_model(formulation)
    s0 = _two_body_state(batch)
    dt = 1e-2
    s1 = rbjax.step(model, s0, dt, INTEGRATORS[integrator]())
    _leaves_match(s1, s0)
    assert isinstance(s1, rbjax.State)
    assert_close(s1.t, np.asarray(s0.t) + dt, rtol=0, atol=1e-15)
    assert np.all(np.isfinite(np.asarray(s1.q))) and np.all(np.isfinite(np.asarray(s1.u)))
    # the state actually moved (gravity acts on every body)
    assert np.min(np.abs(np.asarray(s1.u[..., 2] - s0.u[..., 2]))) > 0.05


@pytest.mark.parametrize("integrator", ["RK4", "ImplicitMidpoint"])
def test_step_keeps_float32(integrator):
    model = _two_body_model("ScalableDAE", jnp.float32)
    # quaternions whose |A|² is exactly 1 in float32 (generic unit quaternions: test below)
    quat = np.broadcast_to([[0.5, 0.5, 0.5, 0.5], [0.5, -0.5, 0.5, -0.5]], (3, 2, 4))
    rng = np.random.default_rng(1)
    s0 = rbjax.make_state(
        quaternion=quat,
        omega_body=rng.normal(size=(3, 2, 3)),
        velocity=rng.normal(size=(3, 2, 3)),
        dtype=jnp.float32,
    )
    s1 = rbjax.step(model, s0, 1e-2, INTEGRATORS[integrator]())
    _leaves_match(s1, s0)
    assert s1.q.dtype == jnp.float32 and s1.t.dtype == jnp.float32


@pytest.mark.parametrize("entry", ["rollout", "step"])
def test_float32_generic_unit_quaternion_is_accepted(entry):
    m32 = rbjax.Model(rbjax.Body(jnp.float32(1.0), jnp.asarray(INERTIA, jnp.float32)))
    s32 = rbjax.make_state(
        quaternion=np.array([1.0, 1.0, 1.0, 0.0]) / np.sqrt(3.0),
        omega_body=OMEGAS[0],
        dtype=jnp.float32,
    )
    if entry == "rollout":
        out = rbjax.rollout(m32, s32, 1e-2, 10)[-1]
    else:
        out = rbjax.step(m32, s32, 1e-2)
    assert out.q.dtype == jnp.float32
    a2 = np.sum(np.asarray(out.q[..., 3:7], np.float64) ** 2) - 1.0
    assert abs(a2) <= 1e-5


# ----------------------------------------------------------------- 2. jit and vmap


@pytest.mark.parametrize("integrator", list(INTEGRATORS))
def test_jit_step_equals_eager_and_vmap_equals_batched(integrator):
    force = rbjax.PointForce(0, np.array([0.3, -0.2, 0.1]), np.ones(3))
    model = _one_body(forces=[force], gravity=(0.0, 0.0, -9.81))
    integ = INTEGRATORS[integrator]()
    sb = _two_body_state((5,))
    sb = jax.tree_util.tree_map(lambda x: x[..., :1, :] if x.ndim >= 2 else x, sb)  # body 0 only
    eager = rbjax.step(model, sb, 1e-2, integ)
    jitted = jax.jit(rbjax.step, static_argnums=3)(model, sb, 1e-2, integ)
    assert_close(jitted.q, eager.q, rtol=1e-13, atol=1e-14)
    assert_close(jitted.u, eager.u, rtol=1e-13, atol=1e-14)
    vmapped = jax.vmap(lambda s: rbjax.step(model, s, 1e-2, integ))(sb)
    _leaves_match(vmapped, eager)
    assert_close(vmapped.q, eager.q, rtol=1e-13, atol=1e-14)
    assert_close(vmapped.u, eager.u, rtol=1e-13, atol=1e-14)
    # ... and a batch member equals stepping it alone (a batched Newton solve iterates until
    # every member converges, so ImplicitMidpoint may differ at its tolerance)
    atol = 1e-12 if integrator == "ImplicitMidpoint" else 1e-14
    si = jax.tree_util.tree_map(lambda x: x[3], sb)
    one = rbjax.step(model, si, 1e-2, integ)
    assert_close(one.q, eager.q[3], rtol=1e-13, atol=atol)
    assert_close(one.u, eager.u[3], rtol=1e-13, atol=atol)


@pytest.mark.parametrize("integrator", ["RK4", "ImplicitMidpoint"])
def test_batched_rollout_equals_vmap_and_loop(integrator):
    model = _one_body()
    integ = INTEGRATORS[integrator]()
    sb = _batched_state()
    n, dt = 50, 2e-2
    # batched Newton iterates until every member converges, so ImplicitMidpoint members may
    # differ from solo runs at the Newton tolerance (measured 8e-14 in ν, itself ~1e-13)
    atol = 1e-12 if integrator == "ImplicitMidpoint" else 1e-14
    batched = rbjax.rollout(model, sb, dt, n, integrator=integ, save_every=5)
    assert batched.q.shape == (B, 11, 1, 7) and batched.t.shape == (B, 11)
    assert batched.result.shape == (B,) and np.all(np.asarray(batched.result) == 0)
    vm = jax.vmap(lambda s: rbjax.rollout(model, s, dt, n, integrator=integ, save_every=5))(sb)
    assert_close(vm.q, batched.q, rtol=1e-12, atol=atol)
    assert_close(vm.u, batched.u, rtol=1e-12, atol=atol)
    assert_close(vm.t, batched.t, rtol=1e-12, atol=atol)
    for i in range(B):
        single = rbjax.rollout(
            model,
            rbjax.make_state(omega_body=OMEGAS[i]),
            dt,
            n,
            integrator=integ,
            save_every=5,
        )
        assert single.q.shape == (11, 1, 7)
        assert_close(single.q, batched.q[i], rtol=1e-12, atol=atol)
        assert_close(single.u, batched.u[i], rtol=1e-12, atol=atol)
    # the members are genuinely different
    assert np.max(np.abs(np.asarray(batched.u[0, -1] - batched.u[1, -1]))) > 0.1


BATCH_MOMENTS = np.array([[1.0, 2.0, 3.0], [1.0, 1.8, 2.5], [2.0, 2.5, 3.0], [1.5, 1.0, 2.0]])


def _batched_inertia():
    """(B, 1, 3, 3): four bodies of different inertia SHAPE (a pure rescaling of Θ would not
    change torque-free motion, since Θω̇ = −ω × Θω is homogeneous in Θ)."""
    return jnp.asarray(np.stack([np.diag(m) for m in BATCH_MOMENTS])[:, None])


def _per_member_rollouts(states, n, dt):
    outs = []
    for i in range(B):
        si = jax.tree_util.tree_map(lambda x, i=i: x[i], states) if states.q.ndim == 3 else states
        outs.append(rbjax.rollout(_one_body(BATCH_MOMENTS[i]), si, dt, n))
    return outs


def test_batched_inertia_with_batched_state_equals_per_member():
    model = _one_body()
    ib = _batched_inertia()
    mb = eqx.tree_at(lambda m: m.inertia, model, ib)
    sb = rbjax.make_state(omega_body=np.broadcast_to(OMEGAS[0], (B, 1, 3)))
    n, dt = 40, 2e-2
    traj = rbjax.rollout(mb, sb, dt, n)
    assert traj.q.shape == (B, n + 1, 1, 7)
    refs = _per_member_rollouts(sb, n, dt)
    for i in range(B):
        assert_close(traj.q[i], refs[i].q, rtol=1e-12, atol=1e-14)
        assert_close(traj.u[i], refs[i].u, rtol=1e-12, atol=1e-14)
    # the members genuinely differ
    for i in range(1, B):
        assert np.max(np.abs(np.asarray(traj.u[i, -1] - traj.u[0, -1]))) > 1e-2
    # jax.vmap over the model's inertia leaf with a single state agrees as well
    s1 = rbjax.make_state(omega_body=OMEGAS[0])
    vm = jax.vmap(lambda th: rbjax.rollout(eqx.tree_at(lambda m: m.inertia, model, th), s1, dt, n))(
        ib
    )
    assert_close(vm.q, traj.q, rtol=1e-12, atol=1e-14)
    assert_close(vm.u, traj.u, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("batched_mass", [False, True], ids=["inertia_only", "inertia_and_mass"])
def test_batched_inertia_with_single_state_equals_per_member(batched_mass):
    """A single state with batched model leaves broadcasts to the model's batch (this raised
    'Incompatible shapes for broadcasting' before the fix in _rollout's batch handling)."""
    model = _one_body()
    ib = _batched_inertia()
    if batched_mass:
        mb = eqx.tree_at(lambda m: (m.inertia, m.mass), model, (ib, jnp.ones((B, 1))))
    else:
        mb = eqx.tree_at(lambda m: m.inertia, model, ib)
    s1 = rbjax.make_state(omega_body=OMEGAS[0])
    n, dt = 40, 2e-2
    traj = rbjax.rollout(mb, s1, dt, n)
    assert traj.q.shape == (B, n + 1, 1, 7)
    refs = _per_member_rollouts(s1, n, dt)
    for i in range(B):
        assert_close(traj.u[i], refs[i].u, rtol=1e-12, atol=1e-14)


# ------------------------------------------------------------------- 3. derivatives
#
# The default formulation (ScalableDAE) is used for grad and jvp. Its reverse-mode compile is
# expensive (measured ~25 s CPU for a 200-step RK4 rollout, vs ~5 s for NewtonEuler), so one
# jitted grad covers both ω0 and Θ, and the jacfwd/jacrev and eqx.filter_grad checks run on
# NewtonEuler.

N_GRAD, DT_GRAD = 200, 1e-2
_RNG = np.random.default_rng(42)
WQ = jnp.asarray(_RNG.normal(size=7))
WU = jnp.asarray(_RNG.normal(size=7))
THETA = np.array([[2.0, 0.1, 0.0], [0.1, 3.0, 0.2], [0.0, 0.2, 4.0]])
# symmetric directions in inertia space: the three principal diagonals and one full matrix
THETA_DIRS = [np.diag(np.eye(3)[k]) for k in range(3)] + [
    np.array([[0.3, 0.2, -0.1], [0.2, -0.4, 0.15], [-0.1, 0.15, 0.5]])
]

# ImplicitMidpoint differentiates through jax.lax.custom_root (implicit function theorem);
# it raised TypeError (bool aux of custom_root) before the fix in _integrators.py.
AD_INTEGRATORS = ["RK4", "ImplicitMidpoint"]


def _final(model, w0, integ):
    traj = rbjax.rollout(
        model,
        rbjax.make_state(omega_body=w0),
        DT_GRAD,
        N_GRAD,
        integrator=integ,
        save_every=N_GRAD,
    )
    return traj.q[-1, 0], traj.u[-1, 0]


def _loss_of(model, w0, integ):
    q, u = _final(model, w0, integ)
    return jnp.sum(WQ * q) + jnp.sum(WU * u) + 0.5 * jnp.sum(u[4:7] ** 2 * q[4:7] ** 2)


def _loss_fn(integ, formulation=rbjax.ScalableDAE):
    """loss(ω0, Θ) building the model from a full 3x3 inertia inside the function."""
    return lambda w0, th: _loss_of(_one_body(th, formulation()), w0, integ)


@functools.cache
def _jitted_loss_and_grad(integrator):
    """Jitted loss(ω0, Θ) and its grad, compiled once per integrator for all tests here."""
    loss = _loss_fn(INTEGRATORS[integrator]())
    return loss, jax.jit(loss), jax.jit(jax.grad(loss, argnums=(0, 1)))


def _fd_directional(f, x, d, h=4e-4):
    """Richardson-extrapolated central difference (error O(h⁴) + noise/h).

    Plain central differences are limited by truncation (h²) against the roundoff noise of a
    200-step tumbling rollout (~1e-12 in the loss, larger for ImplicitMidpoint's Newton
    solves). Measured agreement with autodiff at h = 4e-4: RK4 <= 7e-10, ImplicitMidpoint
    <= 8e-8 relative.
    """

    def central(hh):
        return (float(f(x + hh * d)) - float(f(x - hh * d))) / (2 * hh)

    return (4.0 * central(h / 2) - central(h)) / 3.0


@pytest.mark.parametrize("integrator", AD_INTEGRATORS)
def test_grad_wrt_omega0_and_inertia_matches_finite_differences(integrator):
    _, value, grad = _jitted_loss_and_grad(integrator)
    w0, th = jnp.asarray(OMEGAS[0]), jnp.asarray(THETA)
    g_w, g_th = grad(w0, th)
    assert g_w.shape == (3,) and g_th.shape == (3, 3)
    for k in range(3):
        e = jnp.asarray(np.eye(3)[k])
        fd = _fd_directional(lambda w: value(w, th), w0, e)
        assert abs(fd) > 1e-3
        assert abs(float(g_w[k]) - fd) <= 1e-6 * abs(fd), (k, float(g_w[k]), fd)
    for d in THETA_DIRS:
        d = jnp.asarray(d)
        fd = _fd_directional(lambda t: value(w0, t), th, d)
        assert abs(fd) > 1e-3
        directional = float(jnp.sum(g_th * d))
        assert abs(directional - fd) <= 1e-6 * abs(fd), (directional, fd)


def test_filter_grad_wrt_model_inertia_matches_finite_differences():
    """eqx.filter_grad w.r.t. the Model itself (NewtonEuler, RK4)."""
    integ = rbjax.RK4()
    model = _one_body(THETA, rbjax.NewtonEuler())
    w0 = jnp.asarray(OMEGAS[3])
    gm = eqx.filter_jit(eqx.filter_grad(lambda m: _loss_of(m, w0, integ)))(model)
    assert gm.inertia.shape == (1, 3, 3) and gm.mass.shape == (1,)

    @jax.jit
    def along(eps, d):
        return _loss_of(eqx.tree_at(lambda m: m.inertia, model, model.inertia + eps * d), w0, integ)

    for d in THETA_DIRS:
        d = jnp.asarray(d)[None]
        fd = _fd_directional(lambda e, d=d: along(e, d), jnp.asarray(0.0), jnp.asarray(1.0))
        assert abs(fd) > 1e-3
        directional = float(jnp.sum(gm.inertia * d))
        assert abs(directional - fd) <= 1e-6 * abs(fd), (directional, fd)
    # mass does not enter a torque-free rotation
    assert_close(gm.mass, 0.0, rtol=0, atol=1e-14)


@pytest.mark.parametrize("integrator", AD_INTEGRATORS)
def test_jvp_equals_grad_dot_direction(integrator):
    loss, value, grad = _jitted_loss_and_grad(integrator)
    w0, th = jnp.asarray(OMEGAS[1]), jnp.asarray(THETA)
    v_w = jnp.asarray([0.3, -1.2, 0.7])
    v_th = jnp.asarray(THETA_DIRS[3])
    primal, tangent = jax.jit(lambda a, b: jax.jvp(loss, (a, b), (v_w, v_th)))(w0, th)
    g_w, g_th = grad(w0, th)
    expected = jnp.dot(g_w, v_w) + jnp.sum(g_th * v_th)
    assert abs(float(expected)) > 1e-3
    assert_close(tangent, expected, rtol=1e-10, atol=1e-12)
    # two compiled programs (the jvp's and the value's): ImplicitMidpoint's Newton solves stop
    # at their tolerance (2.2e-13) in each, measured 6e-13 apart
    assert_close(primal, value(w0, th), rtol=1e-11, atol=0)


@pytest.mark.parametrize("integrator", AD_INTEGRATORS)
def test_jacfwd_equals_jacrev(integrator):
    integ = INTEGRATORS[integrator]()
    model = _one_body(THETA, rbjax.NewtonEuler())

    def f(w):
        q, u = _final(model, w, integ)
        return jnp.concatenate([q[3:7], u[4:7]])

    w0 = jnp.asarray(OMEGAS[2])
    jf = jax.jit(jax.jacfwd(f))(w0)
    jr = jax.jit(jax.jacrev(f))(w0)
    assert jf.shape == (7, 3)
    assert np.max(np.abs(np.asarray(jf))) > 0.1
    assert_close(jf, jr, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------------ 4. float32


def _f32_setup():
    m32 = rbjax.Model(rbjax.Body(jnp.float32(1.0), jnp.asarray(INERTIA, jnp.float32)))
    s32 = rbjax.make_state(omega_body=OMEGAS[0], dtype=jnp.float32)
    return m32, s32


def test_float32_rk4_rollout_agrees_with_float64():
    """Measured over 1000 steps, dt = 1e-2: max |q32 − q64| = 9.0e-6, |u32 − u64| = 4.8e-6."""
    m32, s32 = _f32_setup()
    assert m32.inertia.dtype == jnp.float32 and m32.mass.dtype == jnp.float32
    t32 = rbjax.rollout(m32, s32, 1e-2, 1000, save_every=100)
    for leaf in (t32.t, t32.q, t32.u):
        assert leaf.dtype == jnp.float32
    t64 = rbjax.rollout(
        _one_body(), rbjax.make_state(omega_body=OMEGAS[0]), 1e-2, 1000, save_every=100
    )
    assert t64.q.dtype == jnp.float64
    dq = np.max(np.abs(np.asarray(t32.q, np.float64) - np.asarray(t64.q)))
    du = np.max(np.abs(np.asarray(t32.u, np.float64) - np.asarray(t64.u)))
    assert dq <= 1e-4 and du <= 1e-4, (dq, du)
    assert dq > 1e-8  # it really ran in single precision


@pytest.mark.parametrize("newton", ["simplified", "exact"])
def test_float32_implicit_midpoint_keeps_unit_quaternion(newton):
    """Measured over 1000 steps, dt = 1e-2: max |A|² − 1 = 1.3e-7 (float32 eps = 1.2e-7),
    kinetic energy 1.1e-5 relative with the simplified iteration (its remaining error, about
    one ulp along a fixed direction, drifts the energy by ~0.1 ulp per step) and 2.8e-6 with
    exact Newton (the default Newton tol in float32 is 1.2e-4)."""
    m32, s32 = _f32_setup()
    integ = rbjax.ImplicitMidpoint(newton=newton)
    traj = rbjax.rollout(m32, s32, 1e-2, 1000, integrator=integ, save_every=10)
    assert traj.q.dtype == jnp.float32
    assert int(traj.result) == rbjax.RESULTS.successful
    a2 = np.sum(np.asarray(traj.q[:, 0, 3:7], np.float64) ** 2, axis=-1) - 1.0
    assert np.max(np.abs(a2)) <= 1e-6, np.max(np.abs(a2))
    e = np.asarray(rbjax.kinetic_energy(m32, traj.states), np.float64)
    bound = 1e-5 if newton == "exact" else 3e-5
    assert np.max(np.abs(e / e[0] - 1.0)) <= bound, np.max(np.abs(e / e[0] - 1.0))
