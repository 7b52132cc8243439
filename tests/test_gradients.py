"""Gradient checks in float64: forward mode vs reverse mode vs central finite differences.

Every case is ONE function ``f(x) -> (K,)`` of a small, dimensionless parameter vector x
(physical parameter = reference value × (1 + x), or reference + x for offsets and rotations),
evaluated at x = 0. Its Jacobian is computed three ways, each compiled once:

* forward mode: ``jax.jvp`` along each unit vector, vmapped (the same compiled function also
  evaluates f at x ± eps e_k for the finite differences, so no separate primal compile);
* reverse mode: ``jax.jacrev`` (``eqx.filter_grad`` in the closed-form test);
* central finite differences (f(x + eps e_k) − f(x − eps e_k)) / (2 eps).

The error of A against B is max |A − B| / max(|B|, floor), with floor = 1e-3 × the largest
entry of B's row (entries a thousand times smaller than the row's largest are judged in
absolute terms against that scale). Every test asserts a worst relative error ≤ 1e-6 between
every pair. Horizons are short (compile time, not the step count, dominates); the time step
dt is a parameter of every case (a traced ``dt`` into ``rollout``), so each case also checks
the derivative with respect to the time step.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rbjax

TOL = 1e-6  # the required worst relative error between any two of fwd, rev, FD
FLOOR = 1e-3  # relative floor of the error denominator, per output row
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _example(name):
    """Import examples/<name>.py under a private module name."""
    spec = importlib.util.spec_from_file_location(f"_rbjax_example_{name}", EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rel_err(a, b):
    """max |a − b| / max(|b|, FLOOR · max |b| of the row), over a (K, P) Jacobian."""
    a, b = np.atleast_2d(np.asarray(a)), np.atleast_2d(np.asarray(b))
    floor = FLOOR * np.max(np.abs(b), axis=1, keepdims=True)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), np.maximum(floor, 1e-300))))


def _fd_points(n, eps):
    """The points x = ±eps e_k of the central differences (one block per distinct eps)."""
    eps_set = np.unique(np.atleast_1d(eps))
    eye = np.eye(n)
    return eps_set, np.concatenate([s * e * eye for e in eps_set for s in (1.0, -1.0)])


def _central(vals, n, eps, eps_set):
    """Central differences (K, n) from f at the points of :func:`_fd_points` (rows of vals)."""
    fds = {
        e: (vals[2 * i * n : (2 * i + 1) * n] - vals[(2 * i + 1) * n : (2 * i + 2) * n]).T / (2 * e)
        for i, e in enumerate(eps_set)
    }
    rows = np.broadcast_to(eps, (vals.shape[1],))
    return np.stack([fds[e][k] for k, e in enumerate(rows)])


# Compile time dominates these checks (slider-crank forward mode: 65 s with XLA's default CPU
# emitters, 28 s with the older ones the suite runs with; tests/conftest.py).


def _forward_and_fd(f, n, eps):
    """(f(0), forward Jacobian, central FD), each (K, n), from ONE compiled function: jax.jvp
    along each unit vector and f at x = ±eps e_k, vmapped together. ``eps`` is a scalar or
    one value per output row."""
    eps_set, xs = _fd_points(n, eps)
    vs = np.concatenate([np.eye(n), np.zeros_like(xs)])
    xs = np.concatenate([np.zeros((n, n)), xs])
    run = jax.jit(jax.vmap(lambda x, v: jax.jvp(f, (x,), (v,))))
    vals, tans = (np.asarray(a) for a in run(jnp.asarray(xs), jnp.asarray(vs)))
    return vals[0], tans[:n].T, _central(vals[n:], n, eps, eps_set)


def _jacobians(f, n, eps):
    """(f(0), forward Jacobian, reverse Jacobian (jax.jacrev), central FD); two compilations.
    (One function with ``jax.linearize`` and ``jax.linear_transpose`` for both modes compiled
    slower than the two programs together: 300 s against 240 s for the slider-crank.)"""
    value, fwd, fd = _forward_and_fd(f, n, eps)
    rev = np.asarray(jax.jit(jax.jacrev(f))(jnp.zeros(n)))
    return value, fwd, rev, fd


def _check(case, f, n, eps, *, names=None, min_scale=1e-2, reverse=True):
    """Compute the three Jacobians of ``f`` and assert every pair agrees to TOL; returns them.
    ``reverse=False``: forward mode against FD only (the reverse program is the costliest to
    compile; the cases that skip it name where their reverse mode is checked)."""
    if reverse:
        value, fwd, rev, fd = _jacobians(f, n, eps)
    else:
        (value, fwd, fd), rev = _forward_and_fd(f, n, eps), None
    for what, arr in (("value", value), ("forward", fwd), ("reverse", rev), ("FD", fd)):
        assert arr is None or np.all(np.isfinite(arr)), f"{case}: {what} has NaN/inf:\n{arr}"
    scale = np.max(np.abs(fd), axis=1)
    assert np.all(scale > min_scale), f"{case}: a trivial Jacobian row (max |J| = {scale})"
    errs = {"forward vs FD": _rel_err(fwd, fd)}
    if reverse:
        errs["reverse vs FD"] = _rel_err(rev, fd)
        errs["forward vs reverse"] = _rel_err(fwd, rev)
    worst = max(errs.values())
    if worst > TOL:  # name the worst entry
        e = np.abs(fwd - fd) / np.maximum(np.abs(fd), FLOOR * scale[:, None])
        k, j = np.unravel_index(np.argmax(e), e.shape)
        label = names[j] if names else j
        detail = f" (worst fwd-FD entry: output {k}, parameter {label}: {fwd[k, j]} vs {fd[k, j]})"
    else:
        detail = ""
    assert worst <= TOL, f"{case}: worst relative error {worst:.3g} > {TOL:g}: {errs}{detail}"
    return value, fwd, rev, fd, errs


# ------------------------------------------------------------------------ 1. free body

FB_INERTIA = np.array([[2.0, 0.1, 0.0], [0.1, 3.0, 0.2], [0.0, 0.2, 4.0]])  # kg m²
FB_OMEGA = np.array([0.3, 1.0, 0.2])  # rad/s, body frame
FB_DT, FB_STEPS = 1e-2, 20
# orientations: the identity, 1e-9 rad off it, a half turn about x, 1e-9 off a half turn
FB_QUATS = np.array(
    [[1.0, 0.0, 0.0, 0.0], [1.0, 1e-9, -2e-9, 3e-9], [0.0, 1.0, 0.0, 0.0], [1e-9, 0.0, 0.6, 0.8]]
)
FB_QUATS = FB_QUATS / np.linalg.norm(FB_QUATS, axis=1, keepdims=True)
FB_NAMES = ["w1", "w2", "w3", "I11", "I22", "I33", "I12", "I13", "I23", "rx", "ry", "rz", "dt"]
_RNG = np.random.default_rng(7)
FB_WQ, FB_WU = jnp.asarray(_RNG.normal(size=7)), jnp.asarray(_RNG.normal(size=7))


def _sym(d):
    """Symmetric 3×3 from (11, 22, 33, 12, 13, 23)."""
    return jnp.array([[d[0], d[3], d[4]], [d[3], d[1], d[5]], [d[4], d[5], d[2]]])


def _turn(a, d):
    """A ⊗ (1, d/2)/√(1 + |d|²/4): a unit quaternion rotated by ≈ d (body axes), smooth at 0."""
    e = jnp.concatenate([jnp.ones(1), 0.5 * d]) / jnp.sqrt(1.0 + 0.25 * jnp.sum(d * d))
    return rbjax.quaternion.mul(a, e)


def _free_body_loss(formulation, integrator):
    """x = (δω0 [rad/s], δΘ (6) [kg m²], rotation of A0 (3) [rad], dt/dt0 − 1) -> one loss per
    initial orientation after FB_STEPS steps, then the same after ONE step (K = 8). A world
    force at a body point makes the motion depend on the orientation."""
    force = rbjax.PointForce(0, np.array([0.3, -0.2, 0.1]), np.array([0.5, 1.0, -2.0]))
    base = rbjax.Model(rbjax.Body(1.0, FB_INERTIA), formulation=formulation, forces=[force])

    def f(x):
        model = eqx.tree_at(lambda m: m.inertia, base, (FB_INERTIA + _sym(x[3:9]))[None])
        quat = jax.vmap(_turn, (0, None))(jnp.asarray(FB_QUATS), x[9:12])
        omega = jnp.broadcast_to(FB_OMEGA + x[0:3], (len(FB_QUATS), 1, 3))
        state = rbjax.make_state(quaternion=quat[:, None, :], omega_body=omega)
        tr = rbjax.rollout(
            model,
            state,
            FB_DT * (1.0 + x[12]),
            FB_STEPS,
            integrator=integrator,
        )
        q, u = tr.q[:, (-1, 1), 0], tr.u[:, (-1, 1), 0]  # (4, 2, 7): final, after one step
        loss = q @ FB_WQ + u @ FB_WU + 0.5 * jnp.sum(u[..., 4:7] ** 2, axis=-1)
        return loss.T.reshape(-1)

    return f


# (integrator, formulation, FD eps of the 20-step rows, FD eps of the one-step rows).
# ImplicitMidpoint's primal carries the roundoff of its Newton solves (tolerance 1000 ulp,
# 2.2e-13 relative): one-sided differences at eps = 1e-8 scatter by 2e-13 in the 20-step loss,
# and the error of central differences fell as 1/eps (20 steps: 2e-5 at eps = 1e-6, 2e-6 at
# 1e-5; one step: 7.8e-6 at 1e-6), so its rows need larger steps, where the O(eps²)
# truncation error of central differences is still far below 1e-6.
FREE_BODY_CASES = {
    "SemiImplicitEuler-ScalableDAE": (rbjax.SemiImplicitEuler, rbjax.ScalableDAE, 1e-5, 1e-6),
    "RK4-ScalableDAE": (rbjax.RK4, rbjax.ScalableDAE, 1e-5, 1e-6),
    "ImplicitMidpoint-ScalableDAE": (rbjax.ImplicitMidpoint, rbjax.ScalableDAE, 3e-4, 1e-4),
    "SemiImplicitEuler-NewtonEuler": (rbjax.SemiImplicitEuler, rbjax.NewtonEuler, 1e-5, 1e-6),
}


@pytest.mark.parametrize("case", list(FREE_BODY_CASES))
def test_free_body_gradients(case):
    """Free body with a point force, 20 steps, at the identity, 1e-9 off it, a half turn (a0 = 0)
    and 1e-9 off a half turn: d(loss)/d(ω0, Θ, initial rotation, dt) after 20 steps and after
    ONE step. No NaN; forward mode (jvp), reverse mode (jacrev) and central FD agree to 1e-6.
    For ImplicitMidpoint the one-step rows are reverse mode through one implicit step (implicit
    function theorem) against central differences of the converged step."""
    integ, form, eps, eps_one = FREE_BODY_CASES[case]
    f = _free_body_loss(form(), integ())
    nq = len(FB_QUATS)
    eps_rows = np.repeat([eps, eps_one], nq)
    _, fwd, rev, fd, errs = _check(case, f, len(FB_NAMES), eps_rows, names=FB_NAMES)
    # the dt column (a traced dt into rollout) and the one-step rows on their own
    err_dt = max(_rel_err(fwd[:, -1:], fd[:, -1:]), _rel_err(rev[:, -1:], fd[:, -1:]))
    assert err_dt <= TOL, f"{case}: d/d(dt) vs FD {err_dt:.3g}"
    err_one = _rel_err(rev[nq:], fd[nq:])
    assert err_one <= TOL, f"{case}: one step, reverse vs FD {err_one:.3g}"
    print(f"{case}: {errs}, dt column {err_dt:.2g}, one step reverse vs FD {err_one:.2g}")


# ----------------------------------------------------------------------- 2. mechanisms

DP = _example("double_pendulum")
DP_NAMES = ["m1", "m2", "pivot_x", "pivot_y", "pivot_z", "elbow_i_x", "elbow_i_y", "elbow_i_z"]
DP_NAMES += ["elbow_j_x", "elbow_j_y", "elbow_j_z", "dt"]
DP_DT, DP_STEPS = 1e-2, 20
DP_W = jnp.asarray(np.random.default_rng(11).normal(size=(2, 2, 7)))


def _double_pendulum_loss(integrator):
    """x = (m1, m2 relative; pivot offset (3) [m]; elbow point on rod 1 (3) and on rod 2 (3),
    body axes [m]; dt relative) -> (weighted final state, Σ over saved states of |ω|²/10).

    The joint-frame points are the leaves ``s_i``/``s_j`` of the two ``Revolute`` joints. The
    initial state (at rest) is built from them so that it stays consistent: rod 1 hangs from
    the moved pivot, rod 2 from the moved elbow point."""
    base, _ = DP.model(baumgarte=None)
    # the rods at angles θ from the downward vertical: body x = world x turned about y by π/2 − θ
    half = (np.pi / 2 - np.array([1.2, 0.7])) / 2
    quat = jnp.asarray(np.stack([np.cos(half), 0 * half, np.sin(half), 0 * half], axis=-1))
    pivot, elbow = base.joints
    rot = rbjax.quaternion.rotate

    def f(x):
        p, si, sj = pivot.s_i + x[2:5], elbow.s_i + x[5:8], elbow.s_j + x[8:11]
        model = eqx.tree_at(
            lambda m: (m.mass, m.joints[0].s_i, m.joints[1].s_i, m.joints[1].s_j),
            base,
            (base.mass * (1.0 + x[0:2]), p, si, sj),
        )
        c1 = p - rot(quat[0], pivot.s_j)
        c2 = c1 + rot(quat[0], si) - rot(quat[1], sj)
        state = rbjax.make_state(position=jnp.stack([c1, c2]), quaternion=quat)
        tr = rbjax.rollout(
            model, state, DP_DT * (1.0 + x[11]), DP_STEPS, integrator=integrator, save_every=5
        )
        final = jnp.sum(DP_W[0] * tr.q[-1]) + jnp.sum(DP_W[1] * tr.u[-1])
        return jnp.stack([final, 0.1 * jnp.sum(tr.u[..., 4:7] ** 2)])

    return f


@pytest.mark.parametrize("integrator", ["RK4", "Projected(RK4)"])
def test_double_pendulum_gradients(integrator):
    """Double pendulum (examples/double_pendulum.py), 20 steps from rest at (1.2, 0.7) rad:
    derivatives with respect to both masses, the pivot location, both attachment points of the
    elbow and dt, forward vs reverse vs central FD, ≤ 1e-6. The Projected case differentiates
    through the position projection (implicit function theorem) in forward mode; its reverse
    mode (the transposed tangent solve) is checked step by step in tests/test_projections.py,
    and reverse mode through a mechanism rollout by the RK4 case (compile time: Projected's
    reverse program took about 60 of this test's 90 s)."""
    integ = {"RK4": rbjax.RK4(), "Projected(RK4)": rbjax.Projected(rbjax.RK4())}[integrator]
    *_, errs = _check(
        f"double pendulum {integrator}",
        _double_pendulum_loss(integ),
        12,
        1e-6,
        names=DP_NAMES,
        reverse=integrator == "RK4",
    )
    print(f"double pendulum {integrator}: {errs}")
    assert max(errs.values()) <= TOL, errs


SC = _example("slider_crank")
SC_DT, SC_STEPS = 1e-3, 20
SC_NAMES = ["torque", "crank_rate0", "m_crank", "m_rod", "m_slider", "dt"]
SC_W = jnp.asarray(np.random.default_rng(12).normal(size=(2, 3, 7)))


def _slider_crank_velocity(theta0):
    """Velocities (3, 7) of crank, rod and slider for a unit crank rate at crank angle θ0,
    from the closed-form loop closure (planar: every body turns about world z)."""
    r, ln = SC.R, SC.L
    pin = r * np.array([np.cos(theta0), np.sin(theta0), 0.0])
    v_pin = np.cross([0.0, 0.0, 1.0], pin)
    phi = -np.arcsin(r * np.sin(theta0) / ln)
    phidot = -r * np.cos(theta0) / (ln * np.cos(phi))
    v_slider = np.array([SC.closed_form(theta0)[1], 0.0, 0.0])
    u = np.zeros((3, 7))
    u[0, 0:3], u[0, 6] = v_pin / 2, 1.0
    u[1, 0:3], u[1, 6] = (v_pin + v_slider) / 2, phidot
    u[2, 0:3] = v_slider
    return u


def _slider_crank_loss():
    """x = (crank torque, initial crank rate [rad/s], three masses relative, dt relative) ->
    (weighted final state, crank angle turned). The crank torque is the example's constant
    ``BodyTorque`` (its dynamics run); the state is the example's at θ0 with velocities
    rate · (closed-form velocities of a unit crank rate)."""
    _, base, _, st0 = SC.mechanism()  # without the motor, under the constant crank torque, at rest
    unit = _slider_crank_velocity(SC.TH0)
    w = rbjax.advanced.jacobian_matrix(base, st0)  # velocity equations W u = 0 (scleronomic)
    resid = w @ np.concatenate([unit[:, [0, 1, 2, 4, 5, 6]]], axis=None).reshape(-1)
    assert np.max(np.abs(resid)) < 1e-12, resid

    def f(x):
        model = eqx.tree_at(
            lambda m: (m.forces[0].torque_body, m.mass),
            base,
            (base.forces[0].torque_body * (1.0 + x[0]), base.mass * (1.0 + x[2:5])),
        )
        state = rbjax.State(t=st0.t, q=st0.q, u=x[1] * jnp.asarray(unit))
        tr = rbjax.rollout(model, state, SC_DT * (1.0 + x[5]), SC_STEPS, save_every=SC_STEPS)
        q, u = tr.q[-1], tr.u[-1]
        crank = 2.0 * jnp.arctan2(q[0, 6], q[0, 3]) - SC.TH0
        return jnp.stack([jnp.sum(SC_W[0] * q) + jnp.sum(SC_W[1] * u), 100.0 * crank])

    return f


def test_slider_crank_gradients():
    """Slider-crank (examples/slider_crank.py) driven by its constant crank torque, 20 RK4 steps
    of 1 ms: derivatives with respect to the torque magnitude, the initial crank rate, the three
    masses and dt, forward mode vs central FD, ≤ 1e-6. Reverse mode through a closed loop's
    solve is checked against central differences on the accelerations in
    tests/test_elimination.py (test_derivatives_tree_vs_dense) and through a mechanism rollout by the double pendulum's
    RK4 case; the slider-crank's own reverse program took about 40 of this test's 70 s."""
    *_, errs = _check("slider-crank", _slider_crank_loss(), 6, 1e-6, names=SC_NAMES, reverse=False)
    print(f"slider-crank: {errs}")
    assert max(errs.values()) <= TOL, errs


TOP = _example("heavy_top")
TOP_TILT = np.radians(30.0)
TOP_QUAT = np.array([np.cos(TOP_TILT / 2), np.sin(TOP_TILT / 2), 0.0, 0.0])
TOP_DT, TOP_STEPS = 2e-3, 20
TOP_NAMES = ["mass", "I1", "I3", "arm", "dt"]
TOP_W = jnp.asarray(np.random.default_rng(13).normal(size=(2, 7)))


def _heavy_top_loss():
    """x = (mass, transverse and axial moments about the centre of mass, pivot–COM distance,
    dt; all relative) -> (weighted final state, height of the COM ×100). The top starts on the
    steady-precession cone of the reference parameters (examples/heavy_top.py, 30°, slow
    root); the joint point s_j = (0, 0, −l) and the state r = l e3, v = Ω × r are built from l.
    The example's top is a flat disc, I₃ = 2 I₁ exactly: on the triangle inequality, which a
    finite-difference step of +ε on I₃ would cross (an unphysical inertia, refused by the
    rollout's traced checks). The axial moment here is 1 % smaller (the top then nutates
    slightly about the cone; AD against FD does not need the cone)."""
    phidot = TOP.precession_rate(TOP_TILT, "slow")
    i3 = 0.99 * TOP.I3
    w_body = jnp.array([0.0, phidot * np.sin(TOP_TILT), TOP.SPIN])
    base = rbjax.Model(
        [rbjax.Body(TOP.MASS, np.diag([TOP.I1C, TOP.I1C, i3]), name="top")],
        joints=[rbjax.Spherical(rbjax.GROUND, 0, s_j=[0.0, 0.0, -TOP.ARM], name="tip")],
        gravity=[0.0, 0.0, -TOP.G],
    )
    quat = jnp.asarray(TOP_QUAT)
    rot = rbjax.quaternion.rotate

    def f(x):
        arm = TOP.ARM * (1.0 + x[3])
        inertia = jnp.diag(jnp.array([TOP.I1C * (1 + x[1]), TOP.I1C * (1 + x[1]), i3 * (1 + x[2])]))
        model = eqx.tree_at(
            lambda m: (m.mass, m.inertia, m.joints[0].s_j),
            base,
            (base.mass * (1.0 + x[0]), inertia[None], jnp.array([0.0, 0.0, -1.0]) * arm),
        )
        r = arm * rot(quat, jnp.array([0.0, 0.0, 1.0]))
        v = jnp.cross(rot(quat, w_body), r)
        state = rbjax.make_state(position=r, quaternion=quat, velocity=v, omega_body=w_body)
        tr = rbjax.rollout(model, state, TOP_DT * (1.0 + x[4]), TOP_STEPS, save_every=TOP_STEPS)
        q, u = tr.q[-1, 0], tr.u[-1, 0]
        return jnp.stack([TOP_W[0] @ q + TOP_W[1] @ u, 100.0 * q[2]])

    return f


def test_heavy_top_gradients():
    """Heavy symmetric top (examples/heavy_top.py) on a spherical joint, 20 RK4 steps: derivatives
    with respect to mass, both moments of inertia, the pivot–COM distance and dt, forward vs
    reverse vs central FD, ≤ 1e-6."""
    *_, errs = _check("heavy top", _heavy_top_loss(), 5, 1e-6, names=TOP_NAMES)
    print(f"heavy top: {errs}")
    assert max(errs.values()) <= TOL, errs


# --------------------------------------------------------------- 3. closed-form derivatives

AX_A, AX_C = 2.0, 3.0  # kg m²: I1 = I2 = A, I3 = C
AX_OMEGA = np.array([0.4, -0.3, 1.5])  # rad/s, body frame
AX_DT, AX_STEPS = 5e-3, 400  # T = 2 s
AX_NAMES = ["A", "C", "w1", "w2", "w3", "dt"]


def _axisymmetric_omega1(a, c, w, dt):
    """ω1(T), T = AX_STEPS dt, of the torque-free body diag(a, a, c) (ScalableDAE, RK4)."""
    model = rbjax.Model(rbjax.Body(1.0, jnp.stack([a, a, c])))
    tr = rbjax.rollout(model, rbjax.make_state(omega_body=w), dt, AX_STEPS, save_every=AX_STEPS)
    return tr.u[-1, 0, 4:7]


def _axisymmetric_closed_form():
    """ω1(T), ω2(T) and dω1/d(A, C, ω1(0), ω2(0), ω3, dt) of (ω1 + iω2)(t) = (ω1 + iω2)(0)
    e^{iΩt}, Ω = (C − A)/A ω3 (Euler: A ω̇1 = (A − C) ω2 ω3, A ω̇2 = (C − A) ω3 ω1)."""
    w1, w2, w3 = AX_OMEGA
    t = AX_DT * AX_STEPS
    om = (AX_C - AX_A) / AX_A * w3
    c, s = np.cos(om * t), np.sin(om * t)
    d_om = -t * (w1 * s + w2 * c)  # dω1(T)/dΩ
    grad = np.array(
        [
            d_om * (-AX_C * w3 / AX_A**2),
            d_om * (w3 / AX_A),
            c,
            -s,
            d_om * (AX_C - AX_A) / AX_A,
            AX_STEPS * om * -(w1 * s + w2 * c),  # n dω1/dT
        ]
    )
    return np.array([w1 * c - w2 * s, w1 * s + w2 * c]), grad


def test_axisymmetric_body_derivatives_match_closed_form():
    """Torque-free axisymmetric body, 400 RK4 steps of 5 ms: ω1(T) and its derivatives with
    respect to A, C, ω0 and dt from forward mode (jvp), reverse mode (``eqx.filter_grad`` on
    the model's inertia leaf, ω0 and dt) and central FD, each against the closed form
    (ω1 + iω2)(T) = (ω1 + iω2)(0) e^{iΩT}, Ω = (C − A) ω3 / A; the value too (sign convention)."""
    exact_w, exact = _axisymmetric_closed_form()

    def f(x):  # relative A, C, dt; absolute ω0 offsets
        w = _axisymmetric_omega1(
            AX_A * (1 + x[0]), AX_C * (1 + x[1]), AX_OMEGA + x[2:5], AX_DT * (1 + x[5])
        )
        return w[0:1]

    value, fwd, fd = _forward_and_fd(f, 6, 1e-6)
    scale = np.array([AX_A, AX_C, 1.0, 1.0, 1.0, AX_DT])  # back to physical units

    @eqx.filter_jit
    @eqx.filter_grad
    def grad_tree(p):
        model, w, dt = p
        state = rbjax.make_state(omega_body=w)
        tr = rbjax.rollout(model, state, dt, AX_STEPS, save_every=AX_STEPS)
        return tr.u[-1, 0, 4]

    model = rbjax.Model(rbjax.Body(1.0, np.array([AX_A, AX_A, AX_C])))
    g_model, g_w, g_dt = grad_tree((model, jnp.asarray(AX_OMEGA), jnp.asarray(AX_DT)))
    g_th = np.asarray(g_model.inertia[0])
    rev = np.r_[g_th[0, 0] + g_th[1, 1], g_th[2, 2], np.asarray(g_w), float(g_dt)]

    w_end = np.asarray(_axisymmetric_omega1(*map(jnp.asarray, (AX_A, AX_C, AX_OMEGA, AX_DT))))
    err_value = np.max(np.abs(w_end[:2] - exact_w)) / np.max(np.abs(exact_w))
    assert abs(w_end[2] - AX_OMEGA[2]) <= 1e-12 and err_value <= 1e-9, (w_end, exact_w)
    assert abs(value[0] - exact_w[0]) <= 1e-9 * np.max(np.abs(exact_w))
    ad = {
        "forward vs closed form": _rel_err(fwd[0] / scale, exact),
        "reverse vs closed form": _rel_err(rev, exact),
        "forward vs reverse": _rel_err(fwd[0] / scale, rev),
    }
    err_fd = _rel_err(fd[0] / scale, exact)
    print(f"axisymmetric: value {err_value:.2g}, {ad}, FD vs closed form {err_fd:.2g}")
    # autodiff differentiates the RK4 solution, whose error at dt = 5 ms is O(dt⁴) (measured
    # 9e-11 relative); central differences add their own O(eps²) + roundoff/eps (1e-8)
    assert max(ad.values()) <= 1e-9, f"axisymmetric body: autodiff vs closed form {ad}"
    assert err_fd <= TOL, f"axisymmetric body: FD vs closed form {err_fd:.3g} > {TOL:g}"


# ------------------------------------------------------------------------ 4. regressions


def test_mechanism_rollout_traces_with_traced_model_leaf_and_constant_state():
    """Differentiating a mechanism rollout under jit with respect to a MODEL leaf (here the
    mass) while the initial state is a constant must trace: jax.jit(jax.grad(loss)) of the
    natural parameter-identification loss. Traced abstractly (``jax.eval_shape``: no compile).
    Regression: rollout's build-time consistency check used to convert the traced mass to
    NumPy (TracerArrayConversionError); it now runs whenever the state and joints are
    concrete, here on the un-traced call only."""
    model = rbjax.Model(
        rbjax.Body(1.0, [1.0, 1.0, 1.5]),
        joints=[rbjax.Spherical(rbjax.GROUND, 0, s_j=[0.0, 0.0, -1.0])],
        gravity=[0.0, 0.0, -9.81],
    )
    # consistent: the tip (0, 0, −1) in body axes at the origin, with velocity v + ω × (−r) = 0
    state = rbjax.make_state(position=[0, 0, 1.0], velocity=[0, -1.0, 0], omega_body=[1.0, 0, 0])

    def loss(mass):
        m = eqx.tree_at(lambda mm: mm.mass, model, jnp.reshape(mass, (1,)))
        return rbjax.rollout(m, state, 1e-2, 1).q[-1, 0, 1]

    assert np.isfinite(float(loss(1.0)))  # concrete: the build-time check passes
    out = jax.eval_shape(jax.grad(loss), 1.0)
    assert out.shape == ()


def _benchmark(name):
    """Import benchmarks/<name>.py under a private module name."""
    bench = EXAMPLES.parent / "benchmarks"
    spec = importlib.util.spec_from_file_location(f"_rbjax_bench_{name}", bench / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_benchmark_reference_program_is_the_same_motion_and_gradient():
    """benchmarks/gradients.py compares rbjax's rev/eval with a plain-JAX program of the same
    free body; that comparison is only meaningful if both integrate the same motion and the
    reference's reverse mode is right. Against rbjax's NewtonEuler RK4 rollout: final ω, and
    the gradient of |ω|² + |A|² at the end with respect to ω0 and the principal moments, for
    both layouts of the reference, with and without per-step checkpointing."""
    g = _benchmark("gradients")
    steps, dt = 60, 1e-3
    assert g.reference_check(steps) < 1e-12
    model = rbjax.Model(
        rbjax.Body(1.0, jnp.diag(jnp.array([1.0, 2.0, 3.0]))), formulation=rbjax.NewtonEuler()
    )
    w0 = np.array([[0.3, 5.0, -0.2], [1.0, -2.0, 0.5]])
    state = rbjax.make_state(omega_body=w0[:, None, :])

    def rb_loss(w, moments):
        m = eqx.tree_at(lambda mm: mm.inertia, model, jnp.diag(moments)[None])
        s = rbjax.State(t=state.t, q=state.q, u=state.u.at[:, 0, 4:7].set(w))
        tr = rbjax.rollout(m, s, dt, steps, save_every=steps, integrator=rbjax.RK4())
        return jnp.sum(tr.u[:, -1, 0, 4:7] ** 2) + jnp.sum(tr.q[:, -1, 0, 3:7] ** 2)

    moments = jnp.array([1.0, 2.0, 3.0])
    # every gradient under jit: eagerly, each of the many small operations around the scans
    # compiled on its own (130 compilations, half of this test's time)
    want = jax.jit(jax.grad(rb_loss, argnums=(0, 1)))(jnp.asarray(w0), moments)
    q0 = jnp.zeros((4, 2)).at[0].set(1.0)
    for layout in ("stacked", "components"):
        for ck in (False, True):
            loss = g.reference_loss("RK4", layout, steps, dt, ck)
            got = jax.jit(jax.grad(loss, argnums=(1, 2)))(q0, jnp.asarray(w0.T), moments)
            np.testing.assert_allclose(got[0], want[0].T, rtol=1e-11, atol=1e-12)
            np.testing.assert_allclose(got[1], want[1], rtol=1e-11, atol=1e-12)
