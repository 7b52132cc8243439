"""Physics validation of jointed mechanisms against references rbjax does not produce.

Every assertion compares the engine with a closed form (pendulum reactions and elliptic
period, slider-crank and four-bar loop closure, steady precession of the heavy top), a
conservation or balance law (energy, power, Newton-Euler per body), an independent scipy
integration of the reduced-coordinate Lagrangian (double pendulum), or finite differences.

Compile time dominates (an RK4 rollout of a jointed model compiles in ~20-30 s on 2 cores), so
the models are built once per module, every rollout of a given model uses the same n_steps
(static) and passes dt as a JAX array (dynamic). kinematic_analysis and jax.grad of a rollout
compile for 60-90 s each: those tests are marked ``slow``. Measured errors are printed (run
with ``-s``); most tolerances are the measured values with a margin of about 10x.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate
import scipy.optimize
import scipy.special
from conftest import assert_close

import rbjax

G = 9.81
GROUND = rbjax.GROUND

# ------------------------------------------------------------------ numpy helpers


def rotmat(a):
    """Rotation matrix of (…, 4) scalar-first quaternions (normalised here), numpy."""
    a = np.asarray(a, float)
    a = a / np.linalg.norm(a, axis=-1, keepdims=True)
    a0, a1, a2, a3 = np.moveaxis(a, -1, 0)
    return np.stack(
        [
            np.stack(
                [
                    a0 * a0 + a1 * a1 - a2 * a2 - a3 * a3,
                    2 * (a1 * a2 - a0 * a3),
                    2 * (a1 * a3 + a0 * a2),
                ],
                -1,
            ),
            np.stack(
                [
                    2 * (a1 * a2 + a0 * a3),
                    a0 * a0 - a1 * a1 + a2 * a2 - a3 * a3,
                    2 * (a2 * a3 - a0 * a1),
                ],
                -1,
            ),
            np.stack(
                [
                    2 * (a1 * a3 - a0 * a2),
                    2 * (a2 * a3 + a0 * a1),
                    a0 * a0 - a1 * a1 - a2 * a2 + a3 * a3,
                ],
                -1,
            ),
        ],
        -2,
    )


def quat_axis(axis, angle):
    axis = np.asarray(axis, float) / np.linalg.norm(axis)
    return np.r_[np.cos(angle / 2), np.sin(angle / 2) * axis]


def body_point(q, s):
    """World position of the body point s (body axes, from the CoM) for q (…, 7)."""
    q = np.asarray(q)
    return q[..., 0:3] + np.einsum("...ij,j->...i", rotmat(q[..., 3:7]), np.asarray(s, float))


def rod_inertia(m, L):
    """Slender rod along body x (small but valid axial inertia)."""
    ic = m * L**2 / 12
    return np.diag([0.01 * ic, ic, ic])


def roll(model, state, dt, n, **kw):
    """rollout with dt as an array, so the compiled scan is reused for every dt."""
    return rbjax.rollout(model, state, jnp.asarray(dt, jnp.float64), n, **kw)


def hermite_zero_crossings(t, f, fdot):
    """Times where f changes sign, located on the cubic Hermite interpolant (O(h⁴))."""
    out = []
    for k in np.nonzero(np.sign(f[:-1]) * np.sign(f[1:]) < 0)[0]:
        h = t[k + 1] - t[k]
        f0, f1, d0, d1 = f[k], f[k + 1], fdot[k] * h, fdot[k + 1] * h

        def p(s, f0=f0, f1=f1, d0=d0, d1=d1):
            return (
                (2 * s**3 - 3 * s**2 + 1) * f0
                + (s**3 - 2 * s**2 + s) * d0
                + (-2 * s**3 + 3 * s**2) * f1
                + (s**3 - s**2) * d1
            )

        out.append(t[k] + h * scipy.optimize.brentq(p, 0.0, 1.0, xtol=1e-15, rtol=1e-15))
    return np.asarray(out)


# ================================================================ 1. simple pendulum

PEND_M, PEND_L = 1.3, 0.8
PEND_D = PEND_L / 2
PEND_IC = PEND_M * PEND_L**2 / 12
PEND_IO = PEND_IC + PEND_M * PEND_D**2
PEND_N = 1200  # steps per pendulum rollout


def pendulum_state(phi0, omega=0.0):
    """Rod hanging at angle phi0 from the downward vertical (in the xz-plane), rate omega = dphi/dt.

    The rod's body x points from the pivot to the tip; it is the world x rotated about y by
    beta = pi/2 - phi, so the body angular velocity is (0, -omega, 0)."""
    beta = np.pi / 2 - phi0
    e = np.array([np.sin(phi0), 0.0, -np.cos(phi0)])
    edot = np.array([np.cos(phi0), 0.0, np.sin(phi0)]) * omega
    return (
        np.r_[PEND_D * e, quat_axis([0, 1, 0], beta)],
        np.r_[PEND_D * edot],
        np.array([0.0, -omega, 0.0]),
    )


def pendulum_model(formulation):
    q0 = np.array([[PEND_D, 0, 0, 1, 0, 0, 0.0]])
    joint = rbjax.Revolute.at(q0, GROUND, 0, point=[0, 0, 0], axis=[0, 1, 0], name="pivot")
    body = rbjax.Body(PEND_M, rod_inertia(PEND_M, PEND_L), name="rod")
    return rbjax.Model([body], joints=[joint], gravity=[0, 0, -G], formulation=formulation)


@pytest.mark.parametrize(
    "formulation", [rbjax.ScalableDAE(), rbjax.NewtonEuler()], ids=["DAE", "NE"]
)
def test_simple_pendulum_reactions_and_period(formulation):
    model = pendulum_model(formulation)
    m, d, IO = PEND_M, PEND_D, PEND_IO

    # (a) release from horizontal at rest, (b) bottom with the energy-consistent rate.
    w_bot = np.sqrt(2 * m * G * d / IO)
    states = [pendulum_state(np.pi / 2), pendulum_state(0.0, w_bot)]
    st = rbjax.make_state(
        position=np.stack([s[0][None, :3] for s in states]),
        quaternion=np.stack([s[0][None, 3:] for s in states]),
        velocity=np.stack([s[1][None] for s in states]),
        omega_body=np.stack([s[2][None] for s in states]),
    )
    udot, lam = rbjax.accelerations(model, st)
    rx = rbjax.reactions(model, st, lam)
    alpha = m * G * d / IO
    f_release = np.array([0, 0, m * (G - alpha * d)])
    f_bottom = np.array([0, 0, m * G + m * w_bot**2 * d])
    err_a = np.abs(np.asarray(rx.force_j[0, 0]) - f_release).max()
    err_b = np.abs(np.asarray(rx.force_j[1, 0]) - f_bottom).max()
    print(
        f"\n[pendulum {type(formulation).__name__}] reaction error release {err_a:.2e} bottom {err_b:.2e}"
    )
    assert_close(rx.force_j[0, 0], f_release, atol=1e-12)  # = m g / 4 for a uniform rod
    assert_close(rx.force_j[1, 0], f_bottom, atol=1e-12)
    assert_close(rx.force_i, -rx.force_j, atol=1e-12)  # ground side: equal and opposite
    assert_close(rx.torque_j, 0.0, atol=1e-12)  # planar: no bending moment in the hinge
    assert_close(rx.torque_i, -rx.torque_j, atol=1e-12)
    # angular acceleration alpha about +y (phi increases: body omega_y = -phi_dot), no spin at bottom
    assert_close(udot[0, 0, 4:], [0, alpha, 0], atol=1e-12)
    assert_close(udot[1, 0, 4:], 0.0, atol=1e-12)
    assert_close(udot[1, 0, :3], [0, 0, w_bot**2 * d], atol=1e-12)  # centripetal, toward the pivot

    # (c) period from release at phi0 = 90 deg and 30 deg (one batched rollout).
    phis = np.array([np.pi / 2, np.pi / 6])
    s0 = [pendulum_state(p) for p in phis]
    st0 = rbjax.make_state(
        position=np.stack([s[0][None, :3] for s in s0]),
        quaternion=np.stack([s[0][None, 3:] for s in s0]),
    )
    dt = 2.5e-3  # 3 s
    tr = roll(model, st0, dt, PEND_N)
    t = np.asarray(tr.t[0])
    a = np.asarray(tr.q[..., 0, 3:7])
    phi = np.pi / 2 - 2 * np.arctan2(a[..., 2], a[..., 0])
    phidot = -np.asarray(tr.u[..., 0, 5])
    for b, phi0 in enumerate(phis):
        tc = hermite_zero_crossings(t, phi[b], phidot[b])
        k = np.sin(phi0 / 2)
        period = 4 * np.sqrt(IO / (m * G * d)) * scipy.special.ellipk(k**2)
        rel = abs((tc[2] - tc[0]) - period) / period
        rel_quarter = abs(tc[0] - period / 4) / period
        print(
            f"  phi0={np.degrees(phi0):.0f} deg: T={period:.12f} s, rel err {rel:.2e} (first quarter {rel_quarter:.2e})"
        )
        assert rel <= 1e-6
        assert rel_quarter <= 1e-6
    E = np.asarray(rbjax.total_energy(model, tr.states))
    print(f"  energy drift {np.abs(E - E[:, :1]).max():.2e} J (m g d = {m * G * d:.2f} J)")
    assert np.abs(E - E[:, :1]).max() < 5e-7  # measured 7.5e-8 J (NewtonEuler), 1.7e-8 J (DAE)


# ================================================================ 2. double pendulum

DP_M, DP_L = 1.0, 1.0
DP_N = 2000  # steps of every double-pendulum rollout (compiled once per model structure)


def dp_state(th1, th2, w1=0.0, w2=0.0):
    """Two rods in the xz-plane at angles th from the downward vertical (hinges about y)."""
    L = DP_L
    th1, th2, w1, w2 = np.broadcast_arrays(*(np.asarray(x, float) for x in (th1, th2, w1, w2)))

    def e(th):
        return np.stack([np.sin(th), np.zeros_like(th), -np.cos(th)], -1)

    def ep(th):
        return np.stack([np.cos(th), np.zeros_like(th), np.sin(th)], -1)

    def quat(th):
        b = np.pi / 2 - th
        z = np.zeros_like(b)
        return np.stack([np.cos(b / 2), z, np.sin(b / 2), z], -1)

    c1 = L / 2 * e(th1)
    c2 = L * e(th1) + L / 2 * e(th2)
    v1 = L / 2 * w1[..., None] * ep(th1)
    v2 = L * w1[..., None] * ep(th1) + L / 2 * w2[..., None] * ep(th2)
    zero = np.zeros_like(th1)
    return rbjax.make_state(
        position=np.stack([c1, c2], -2),
        quaternion=np.stack([quat(th1), quat(th2)], -2),
        velocity=np.stack([v1, v2], -2),
        omega_body=np.stack([np.stack([zero, -w1, zero], -1), np.stack([zero, -w2, zero], -1)], -2),
    )


def dp_angles(q):
    """Unwrapped angles from the downward vertical, from the quaternions only, (…, T, 2)."""
    q = np.asarray(q)
    beta = 2 * np.arctan2(q[..., 5], q[..., 3])
    return np.unwrap(np.pi / 2 - beta, axis=-2)


def dp_lagrange_rhs(t, y, m=DP_M, L=DP_L, g=G):
    """Reduced-coordinate Lagrange equations of two uniform rods (absolute angles)."""
    th1, th2, w1, w2 = y
    c, s = np.cos(th1 - th2), np.sin(th1 - th2)
    h = m * L * L / 2
    M = np.array([[m * L * L / 3 + m * L * L, h * c], [h * c, m * L * L / 3]])
    rhs = -np.array(
        [
            h * s * w2**2 + 1.5 * m * g * L * np.sin(th1),
            -h * s * w1**2 + 0.5 * m * g * L * np.sin(th2),
        ]
    )
    return np.r_[w1, w2, np.linalg.solve(M, rhs)]


def dp_joint_residual(q):
    """Position residual of both hinges from the coordinates alone, (…,)."""
    L = DP_L
    pivot = body_point(q[..., 0, :], [-L / 2, 0, 0])
    tip1 = body_point(q[..., 0, :], [L / 2, 0, 0])
    root2 = body_point(q[..., 1, :], [-L / 2, 0, 0])
    y = np.array([0.0, 1.0, 0.0])
    axis_err = [np.abs(rotmat(q[..., b, 3:7])[..., :, 1] - y).max(-1) for b in (0, 1)]
    return np.maximum.reduce(
        [np.abs(pivot).max(-1), np.abs(tip1 - root2).max(-1), axis_err[0], axis_err[1]]
    )


def dp_model(formulation=None, baumgarte=None, mass=(DP_M, DP_M)):
    q0 = np.array([[0.5, 0, 0, 1, 0, 0, 0], [1.5, 0, 0, 1, 0, 0, 0]], float)
    bodies = [
        rbjax.Body(mass[0], rod_inertia(DP_M, DP_L), name="rod1"),
        rbjax.Body(mass[1], rod_inertia(DP_M, DP_L), name="rod2"),
    ]
    joints = [
        rbjax.Revolute.at(q0, GROUND, 0, point=[0, 0, 0], axis=[0, 1, 0], name="pivot"),
        rbjax.Revolute.at(q0, 0, 1, point=[DP_L, 0, 0], axis=[0, 1, 0], name="elbow"),
    ]
    return rbjax.Model(
        bodies, joints=joints, gravity=[0, 0, -G], formulation=formulation, baumgarte=baumgarte
    )


@pytest.fixture(scope="module")
def dp():
    """The default (ScalableDAE) double pendulum and its 2 s reference run at dt = 1e-3."""
    model = dp_model()
    st0 = dp_state(np.pi / 2, np.pi / 2)
    tr = roll(model, st0, 1e-3, DP_N)
    return model, st0, tr


def test_double_pendulum_matches_lagrangian(dp):
    model, st0, tr = dp
    t = np.asarray(tr.t)
    th = dp_angles(tr.q)
    sol = scipy.integrate.solve_ivp(
        dp_lagrange_rhs,
        (0, t[-1]),
        [np.pi / 2, np.pi / 2, 0, 0],
        method="DOP853",
        rtol=1e-12,
        atol=1e-12,
        t_eval=t,
    )
    ref = sol.y[:2].T
    err = np.abs(th - ref).max(axis=0)
    E = np.asarray(rbjax.total_energy(model, tr.states))
    res = dp_joint_residual(np.asarray(tr.q))
    print(
        f"\n[double pendulum] max |angle - Lagrange| over 2 s: {err}, energy drift {np.abs(E - E[0]).max():.2e} J,"
        f" joint residual {res.max():.2e}"
    )
    # measured 3.8e-10 rad (RK4 dt = 1e-3 global error over 2 s of large-angle motion): 8x margin
    assert err.max() < 3e-9
    assert np.abs(E - E[0]).max() < 2e-7  # measured 3.5e-8 J (E scale m g L = 9.8 J)
    assert res.max() < 5e-9  # measured 9.5e-10 m (drift of the unstabilised index-1 DAE)


def test_double_pendulum_baumgarte_reduces_drift(dp):
    model, st0, _ = dp
    m0 = dp_model(baumgarte=(0.0, 0.0))  # same structure as the stabilised model: one compile
    mb = dp_model(baumgarte=(10.0, 10.0))
    dt = 1e-2  # coarse: 2000 steps = 20 s
    res = {}
    for key, mdl in (("none", model), ("(0,0)", m0), ("(10,10)", mb)):
        # the drift is what this test measures: the runtime monitors would stop at 1e-2 m
        tr = roll(mdl, st0, dt, DP_N, monitors=None)
        res[key] = dp_joint_residual(np.asarray(tr.q))
        if key == "none":
            q_none = np.asarray(tr.q)
        if key == "(0,0)":
            q_zero = np.asarray(tr.q)
    print(
        "\n[Baumgarte] max joint residual over 20 s at dt=1e-2: "
        + ", ".join(f"{k}: {v.max():.2e}" for k, v in res.items())
    )
    # Baumgarte with alpha = beta = 0 is the unstabilised index-1 DAE.
    early = slice(0, 200)
    print(
        f"  |q(baumgarte=(0,0)) - q(None)| over the first 2 s: {np.abs(q_zero[early] - q_none[early]).max():.2e}"
    )
    assert_close(q_zero[early], q_none[early], atol=1e-9)
    # measured 1.7e-2 m unstabilised vs 1.8e-5 m with (10, 10)
    assert res["(10,10)"].max() < 1e-2 * res["none"].max()
    assert res["(10,10)"][-200:].max() < 1e-2 * res["none"][-200:].max()
    # with the default monitors, the unstabilised run is reported implausible (not a silent
    # 1.7 cm joint gap) once its residual passes 1e-2, the stabilised one succeeds
    plain = roll(model, st0, dt, DP_N, throw=False)
    assert int(plain.result) == rbjax.RESULTS.implausible
    first = int(np.argmax(res["none"] > 1e-2))  # saved index = step + 1 (save_every = 1)
    assert int(plain.failed_step) == first - 1
    assert float(plain.monitors["joints"]) == pytest.approx(res["none"].max(), rel=0.2)
    assert int(roll(mb, st0, dt, DP_N, throw=False).result) == rbjax.RESULTS.successful


def test_double_pendulum_reactions_newton_euler_per_rod(dp):
    model, st0, _ = dp
    udot, lam = rbjax.accelerations(model, st0)
    rx = rbjax.reactions(model, st0, lam)
    udot = np.asarray(udot)
    m, L = DP_M, DP_L
    g = np.array([0, 0, -G])
    # Independent: Lagrange accelerations at release (both horizontal, at rest).
    thdd = dp_lagrange_rhs(0, [np.pi / 2, np.pi / 2, 0, 0])[2:]
    ep = np.array([0.0, 0.0, 1.0])  # de/dtheta at theta = 90 deg
    a1 = L / 2 * thdd[0] * ep
    a2 = L * thdd[0] * ep + L / 2 * thdd[1] * ep
    assert_close(udot[0, :3], a1, atol=1e-12)
    assert_close(udot[1, :3], a2, atol=1e-12)
    assert_close(udot[:, 5], -thdd, atol=1e-12)
    # Newton per rod: m a = m g + sum of joint forces on that rod.
    f_pivot_on_1 = np.asarray(rx.force_j[0])
    f_elbow_on_1 = np.asarray(rx.force_i[1])
    f_elbow_on_2 = np.asarray(rx.force_j[1])
    r1 = m * udot[0, :3] - (m * g + f_pivot_on_1 + f_elbow_on_1)
    r2 = m * udot[1, :3] - (m * g + f_elbow_on_2)
    # Euler per rod about its CoM (world frame, omega = 0): R Theta omegadot = sum (tau + (P - r) x F)
    q = np.asarray(st0.q)
    I = rod_inertia(DP_M, DP_L)

    def moment(b, joint_side):
        tot = np.zeros(3)
        for k, side in joint_side:
            F = np.asarray(rx.force_i[k] if side == "i" else rx.force_j[k])
            tau = np.asarray(rx.torque_i[k] if side == "i" else rx.torque_j[k])
            P = np.array([0.0, 0, 0]) if k == 0 else np.array([L, 0, 0])
            tot += tau + np.cross(P - q[b, :3], F)
        return rotmat(q[b, 3:7]) @ (I @ udot[b, 4:7]) - tot

    e1, e2 = moment(0, [(0, "j"), (1, "i")]), moment(1, [(1, "j")])
    print(
        f"\n[reactions] Newton residual rod1 {np.abs(r1).max():.2e} rod2 {np.abs(r2).max():.2e};"
        f" Euler residual {np.abs(e1).max():.2e} {np.abs(e2).max():.2e}"
    )
    assert_close(r1, 0.0, atol=1e-12)
    assert_close(r2, 0.0, atol=1e-12)
    assert_close(e1, 0.0, atol=1e-12)
    assert_close(e2, 0.0, atol=1e-12)
    assert_close(rx.force_j[1], -rx.force_i[1], atol=1e-12)  # action = -reaction at the elbow
    assert_close(rx.force_i[0], -rx.force_j[0], atol=1e-12)


def test_double_pendulum_formulations_agree(dp):
    model, st0, tr = dp
    tr_ne = roll(dp_model(formulation=rbjax.NewtonEuler()), st0, 1e-3, DP_N)
    d = np.abs(np.asarray(tr_ne.q) - np.asarray(tr.q)).max(axis=(1, 2))
    print(f"\n[DAE vs NE] max |q diff| over 0.5 s {d[:501].max():.2e}, over 2 s {d.max():.2e}")
    assert d[:501].max() < 1e-10  # measured 1.1e-12
    assert d.max() < 1e-9  # measured 8.2e-11 (the chaotic motion amplifies the difference)


def test_double_pendulum_batch_equals_single_runs(dp):
    model, _, _ = dp
    rng = np.random.default_rng(0)
    th1 = rng.uniform(0.2, 1.8, 8)
    th2 = rng.uniform(-1.0, 2.0, 8)
    dt = 5e-4  # 1 s
    tb = roll(model, dp_state(th1, th2), dt, DP_N)
    diffs = []
    for b in range(8):
        ts = roll(model, dp_state(th1[b], th2[b]), dt, DP_N)
        diffs.append(np.abs(np.asarray(tb.q[b]) - np.asarray(ts.q)).max())
    print(f"\n[batch] max |batched - single| over 8 members, 1 s: {np.max(diffs):.2e}")
    assert max(diffs) < 1e-12
    # the members really differ (the batch is not one system broadcast)
    assert np.ptp(np.asarray(tb.q[:, -1, 1, 0])) > 0.1


# ================================================================ 3. slider-crank

SC_R, SC_L, SC_TH0, SC_W = 0.2, 0.6, 0.3, 2.0
SC_GRAV = np.array([0.0, -0.6 * G, -0.8 * G])  # in-plane component so gravity does work


def sc_closed_form(th):
    r, l = SC_R, SC_L
    s = np.sqrt(l**2 - (r * np.sin(th)) ** 2)
    x = r * np.cos(th) + s
    xp = -r * np.sin(th) - r**2 * np.sin(th) * np.cos(th) / s
    xpp = -r * np.cos(th) - r**2 * np.cos(2 * th) / s - r**4 * (np.sin(th) * np.cos(th)) ** 2 / s**3
    return x, xp, xpp


def slider_crank_parts(r, l, th0, w, gravity):
    """The slider-crank at crank angle ``th0`` on its smooth branch: crank (revolute about z),
    rod (spherical at the crank pin, universal at the wrist), slider (translational along x),
    crank r and rod l. Returns (bodies, joints, the model driven by the motor θ = θ₀ + w t,
    the state at rest); tests/test_change_points.py builds its r = l mechanism here too."""
    xs = r * np.cos(th0) + np.sqrt(l**2 - (r * np.sin(th0)) ** 2)
    pc = np.array([r * np.cos(th0), r * np.sin(th0), 0])
    phi = -np.arcsin(r * np.sin(th0) / l)
    q0 = np.stack(
        [
            np.r_[pc / 2, quat_axis([0, 0, 1], th0)],
            np.r_[(pc + np.array([xs, 0, 0])) / 2, quat_axis([0, 0, 1], phi)],
            np.r_[xs, 0, 0, 1, 0, 0, 0],
        ]
    )
    bodies = [
        rbjax.Body(1.0, np.diag([1e-3, 1e-2, 1e-2]), name="crank"),
        rbjax.Body(2.0, np.diag([1e-3, 6e-2, 6e-2]), name="rod"),
        rbjax.Body(3.0, np.diag([1e-2, 1e-2, 1e-2]), name="slider"),
    ]
    wrist = rbjax.Universal.at(q0, 1, 2, point=[xs, 0, 0], axis=[0, 0, 1])
    joints = [
        rbjax.Revolute.at(q0, GROUND, 0, point=[0, 0, 0], axis=[0, 0, 1], x=[1, 0, 0], name="main"),
        rbjax.Spherical.at(q0, 0, 1, point=pc, name="crankpin"),
        # pins: z on the rod (world z), y on the slider: perpendicular
        rbjax.Universal(
            1,
            2,
            s_i=wrist.s_i,
            s_j=wrist.s_j,
            z_i=np.asarray(wrist.z_i),
            z_j=[0, 1, 0],
            name="wristpin",
        ),
        rbjax.Translational.at(
            q0, GROUND, 2, point=[0, 0, 0], axis=[1, 0, 0], x=[0, 1, 0], name="slide"
        ),
    ]
    motor = rbjax.RotationDriver.at(
        q0,
        GROUND,
        0,
        point=[0, 0, 0],
        axis=[0, 0, 1],
        x=[1, 0, 0],
        f=lambda t: w * t,
        name="motor",
    )
    driven = rbjax.Model(bodies, joints=joints + [motor], gravity=gravity)
    st0 = rbjax.make_state(position=q0[:, :3], quaternion=q0[:, 3:])
    return bodies, joints, driven, st0


@pytest.fixture(scope="module")
def slider_crank():
    return slider_crank_parts(SC_R, SC_L, SC_TH0, SC_W, SC_GRAV)


# The slider-crank's kinematic analysis against the closed form and its motor torque against the
# power balance are asserted by tests/test_mechanism_examples.py::test_slider_crank (the same
# checks through examples/slider_crank.py); compiling the kinematic analysis twice would cost ~1 min
# of CI time.


def test_slider_crank_dynamics_energy_balance(slider_crank):
    """Undriven slider-crank under (tilted) gravity and a constant torque on the crank:
    E(t) - E(0) = tau (theta(t) - theta(0)), the slider stays on the closed-form loop, and the
    balance error of RK4 shrinks 16x per halving of dt (order 4)."""
    bodies, joints, _, st0 = slider_crank
    tau = 4.0  # constant motor torque on the crank about z [N m]
    model = rbjax.Model(
        bodies, joints=joints, gravity=SC_GRAV, forces=[rbjax.BodyTorque(0, [0, 0, tau])]
    )
    mob = rbjax.mobility(model, st0)
    assert (mob.dof, mob.redundant) == (1, ())
    bal_err, x_err = [], []
    for dt in (1e-3, 5e-4, 2.5e-4):  # compare at t = 0.5 s
        k = int(round(0.5 / dt))
        tr = roll(model, st0, dt, 2000)
        q = np.asarray(tr.q)[: k + 1]
        th = np.unwrap(2 * np.arctan2(q[:, 0, 6], q[:, 0, 3]))
        E = np.asarray(rbjax.total_energy(model, tr.states))[: k + 1]
        bal_err.append(np.abs((E - E[0]) - tau * (th - th[0])).max())
        x_err.append(np.abs(q[:, 2, 0] - sc_closed_form(th)[0]).max())
    work = tau * (th[-1] - th[0])
    print(
        f"\n[slider-crank dynamics] crank turned {th[-1] - th[0]:.3f} rad in 0.5 s (work {work:.3f} J);"
        f" energy balance error at dt = 1e-3, 5e-4, 2.5e-4: {', '.join(f'{e:.2e}' for e in bal_err)} J;"
        f" slider vs closed form {', '.join(f'{e:.2e}' for e in x_err)} m"
    )
    # measured 8.2e-8, 5.1e-9, 3.2e-10 J and 1.8e-10, 1.1e-11, 6.9e-13 m
    assert bal_err[-1] < 3e-9
    assert x_err[-1] < 1e-11
    for coarse, fine in zip(bal_err[:-1], bal_err[1:], strict=True):
        assert 10 < coarse / fine < 25  # 2**4 = 16


# ================================================================ 4. four-bar linkage

# crank a, coupler b, rocker c, ground d: Grashof crank-rocker (s + l = 0.8 <= p + q = 1.05,
# the shortest link is the crank, next to the ground)
FB_A, FB_B, FB_C, FB_D = 0.2, 0.6, 0.5, 0.55
FB_TH0, FB_W = 0.4, 1.5


def fb_rocker(th, branch=+1):
    """Rocker angle psi (from world x, about z, pivot at (d, 0)) for crank angle th: closed form."""
    a, b, c, d = FB_A, FB_B, FB_C, FB_D
    P = 2 * d * c - 2 * a * c * np.cos(th)
    Q = -2 * a * c * np.sin(th)
    R = b * b - a * a - c * c - d * d + 2 * a * d * np.cos(th)
    psi = np.arctan2(Q, P) + branch * np.arccos(R / np.hypot(P, Q))
    dP, dQ, dR = 2 * a * c * np.sin(th), -2 * a * c * np.cos(th), -2 * a * d * np.sin(th)
    dpsi = (dR - dP * np.cos(psi) - dQ * np.sin(psi)) / (-P * np.sin(psi) + Q * np.cos(psi))
    return psi, dpsi


@pytest.fixture(scope="module")
def four_bar():
    a, b, c, d = FB_A, FB_B, FB_C, FB_D
    th0 = FB_TH0
    psi0, _ = fb_rocker(th0)
    A = np.array([a * np.cos(th0), a * np.sin(th0), 0.0])
    B = np.array([d + c * np.cos(psi0), c * np.sin(psi0), 0.0])
    D = np.array([d, 0.0, 0.0])
    gam0 = np.arctan2(B[1] - A[1], B[0] - A[0])
    assert abs(np.linalg.norm(B - A) - b) < 1e-14
    q0 = np.stack(
        [
            np.r_[A / 2, quat_axis([0, 0, 1], th0)],
            np.r_[(A + B) / 2, quat_axis([0, 0, 1], gam0)],
            np.r_[(D + B) / 2, quat_axis([0, 0, 1], psi0)],
        ]
    )
    bodies = [
        rbjax.Body(1.0 + k, rod_inertia(1.0 + k, Lk), name=n)
        for k, (n, Lk) in enumerate([("crank", a), ("coupler", b), ("rocker", c)])
    ]
    z = [0, 0, 1]
    R = {
        "g-crank": rbjax.Revolute.at(
            q0, GROUND, 0, point=[0, 0, 0], axis=z, x=[1, 0, 0], name="R_ground_crank"
        ),
        "crank-coupler": rbjax.Revolute.at(q0, 0, 1, point=A, axis=z, name="R_crank_coupler"),
        "coupler-rocker": rbjax.Revolute.at(q0, 1, 2, point=B, axis=z, name="R_coupler_rocker"),
        "rocker-g": rbjax.Revolute.at(q0, 2, GROUND, point=D, axis=z, name="R_rocker_ground"),
    }
    S_A = rbjax.Spherical.at(q0, 0, 1, point=A, name="S_crank_coupler")
    S_B = rbjax.Spherical.at(q0, 1, 2, point=B, name="S_coupler_rocker")
    # Universal coupler-rocker: pin on the coupler along world z, pin on the rocker along the rocker.
    u_ref = rbjax.Universal.at(q0, 1, 2, point=B, axis=z)
    U_B = rbjax.Universal(
        1,
        2,
        s_i=u_ref.s_i,
        s_j=u_ref.s_j,
        z_i=np.asarray(u_ref.z_i),
        z_j=[1, 0, 0],
        name="U_coupler_rocker",
    )
    motor = rbjax.RotationDriver.at(
        q0, GROUND, 0, point=[0, 0, 0], axis=z, x=[1, 0, 0], f=lambda t: FB_W * t, name="motor"
    )
    st0 = rbjax.make_state(position=q0[:, :3], quaternion=q0[:, 3:])
    return bodies, R, S_A, S_B, U_B, motor, st0


def test_four_bar_mobility(four_bar):
    bodies, R, S_A, S_B, U_B, motor, st0 = four_bar
    grav = [0, 0, -G]
    rrrr = rbjax.mobility(rbjax.Model(bodies, joints=list(R.values()), gravity=grav), st0)
    rssr = rbjax.mobility(
        rbjax.Model(bodies, joints=[R["g-crank"], S_A, S_B, R["rocker-g"]], gravity=grav), st0
    )
    rsur = rbjax.mobility(
        rbjax.Model(bodies, joints=[R["g-crank"], S_A, U_B, R["rocker-g"]], gravity=grav), st0
    )
    driven = rbjax.mobility(
        rbjax.Model(bodies, joints=[R["g-crank"], S_A, U_B, R["rocker-g"], motor], gravity=grav),
        st0,
    )
    print(
        f"\n[four-bar mobility] RRRR {rrrr.dof, rrrr.rank, rrrr.rows, rrrr.redundant}; RSSR {rssr.dof, rssr.rank, rssr.rows}; "
        f"RSUR {rsur.dof, rsur.rank, rsur.rows}; RSUR+driver {driven.dof}"
    )
    # spatial Gruebler count 18 - 20 = -2; the planar loop of 4 hinges has 3 dependent rows
    assert (rrrr.dof, rrrr.rows, rrrr.rank) == (1, 20, 17)
    # the dependent rows: the out-of-plane equations (z, rotations about x and y) of the last hinge
    assert rrrr.redundant == tuple(f"R_rocker_ground[row {k}]" for k in (2, 3, 4))
    # R-S-S-R: 18 - 16 = 2 = the crank motion + the coupler's idle spin about its own axis
    assert (rssr.dof, rssr.rows, rssr.rank, rssr.redundant) == (2, 16, 16, ())
    assert (rsur.dof, rsur.rows, rsur.rank, rsur.redundant) == (1, 17, 17, ())
    assert (driven.dof, driven.redundant) == (0, ())


@pytest.mark.slow  # kinematic_analysis compiles for ~60 s
def test_four_bar_kinematics_vs_closed_form(four_bar):
    bodies, R, S_A, _, U_B, motor, st0 = four_bar
    model = rbjax.Model(
        bodies, joints=[R["g-crank"], S_A, U_B, R["rocker-g"], motor], gravity=[0, 0, -G]
    )
    times = np.linspace(0.0, 2 * np.pi / FB_W, 401)  # one full crank revolution
    res = rbjax.kinematic_analysis(model, st0, times)
    th = FB_TH0 + FB_W * times
    psi, dpsi = fb_rocker(th)
    q = np.asarray(res.q)
    psi_rb = np.unwrap(2 * np.arctan2(q[:, 2, 6], q[:, 2, 3]))
    w_rb = np.asarray(res.u[:, 2, 6])  # rocker body z = world z
    e_psi = np.abs(psi_rb - np.unwrap(psi)).max()
    e_w = np.abs(w_rb - dpsi * FB_W).max()
    print(
        f"\n[four-bar kinematics] rocker swing {np.ptp(psi):.4f} rad; |psi| err {e_psi:.2e}, |psi_dot| err {e_w:.2e}"
    )
    assert e_psi < 1e-12
    assert e_w < 1e-11
    # the crank turns fully (Grashof crank-rocker): crank angle advances by 2 pi
    th_rb = np.unwrap(2 * np.arctan2(q[:, 0, 6], q[:, 0, 3]))
    assert_close(th_rb, th, atol=1e-12)


# ================================================================ 5. heavy symmetric top


def test_heavy_top_steady_precession():
    m, l = 1.0, 0.02
    I1c, I3 = 2e-3, 4e-3
    I1 = I1c + m * l * l  # about the tip
    theta, w3 = np.radians(30.0), 20.0
    c = np.cos(theta)
    # m g l = phidot (I3 w3 - I1 phidot cos theta): slow root
    phidot = (I3 * w3 - np.sqrt((I3 * w3) ** 2 - 4 * I1 * c * m * G * l)) / (2 * I1 * c)
    assert abs(phidot * (I3 * w3 - I1 * phidot * c) - m * G * l) < 1e-15
    a0 = quat_axis([1, 0, 0], theta)  # Euler ZXZ (0, theta, 0): symmetry axis (0, -sin, cos)
    Rm = rotmat(a0)
    w_body = np.array([0.0, phidot * np.sin(theta), w3])
    r = l * Rm[:, 2]
    v = np.cross(Rm @ w_body, r)
    q0 = np.r_[r, a0][None]
    model = rbjax.Model(
        [rbjax.Body(m, np.diag([I1c, I1c, I3]), name="top")],
        joints=[rbjax.Spherical.at(q0, GROUND, 0, point=[0, 0, 0], name="tip")],
        gravity=[0, 0, -G],
    )
    st0 = rbjax.make_state(
        position=r[None], quaternion=a0[None], velocity=v[None], omega_body=w_body[None]
    )
    dt, n = 5e-4, 4000  # 2 s, about 0.84 precession turns
    tr = roll(model, st0, dt, n, save_every=10)
    t = np.asarray(tr.t)
    zb = rotmat(np.asarray(tr.q[:, 0, 3:7]))[:, :, 2]
    tilt = np.arccos(np.clip(zb[:, 2], -1, 1))
    phi = np.unwrap(np.arctan2(zb[:, 0], -zb[:, 1]))
    e_tilt = np.abs(tilt - theta).max()
    e_phi = np.abs(phi - phidot * t)[1:].max() / (phidot * t[-1])
    e_rate = abs(phi[-1] / t[-1] - phidot) / phidot
    E = np.asarray(rbjax.total_energy(model, tr.states))
    print(
        f"\n[heavy top] phidot {phidot:.6f} rad/s; max |tilt - theta| {e_tilt:.2e} rad; "
        f"precession angle rel err {e_phi:.2e}; mean rate rel err {e_rate:.2e}; energy drift {np.abs(E - E[0]).max():.2e}"
    )
    assert e_tilt < 1e-10  # measured 6e-13 rad
    assert e_phi < 1e-10  # measured 7e-12
    assert e_rate < 1e-10
