"""Validation of the equations of motion (rbjax/_dynamics.py) with RK4 rollouts.

Every expected value here is computed independently of rbjax: closed-form solutions of
classical rigid-body problems (Euler/Poinsot precession, the Jacobi-elliptic solution of the
free asymmetric top, steady precession of the heavy top), conservation laws, a point-mass
discretisation of the body, and scipy ``solve_ivp`` (DOP853, rtol = atol = 1e-12) of the
equations of motion written out in plain NumPy from the papers:

* Möller & Glocker 2012 (Möller–Glocker, scalable body): kinematics eqs. (32), (37), (38), (41)-(44),
  (49), (85); kinetic energy and mass matrix eqs. (60)-(64); resultants eq. (75); equations of
  motion eq. (93), Newton–Euler eq. (95), scaling constraint force eq. (96);
* Udwadia & Schutte 2010 (Udwadia–Schutte): the result must not depend on the arbitrary inertia J0.

Conventions (rbjax/_state.py): q = (r, A) with A scalar-first; u = (v, ν, ω) with ω the
body-frame angular velocity scaled by s = |A|² (eq. (49)); for a rigid body s = 1.
All computations are float64 (tests/conftest.py). Time steps are dt = 1e-3 throughout so that
rollouts of the same model structure and length share one compilation.

Set RBJAX_PRINT_ERRORS=1 (and run pytest with -s) to print the measured errors.
"""

import os

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close
from scipy.integrate import solve_ivp
from scipy.special import ellipj, ellipkm1

import rbjax

DT = 1e-3
_PRINT = bool(os.environ.get("RBJAX_PRINT_ERRORS"))


def assert_within(name, err, tol):
    """Assert a measured (max) error is below ``tol``; optionally print it."""
    err = float(np.max(np.abs(err)))
    if _PRINT:
        print(f"\n  {name}: {err:.3e} (tol {tol:.0e})")
    assert err <= tol, f"{name}: error {err:.3e} > tolerance {tol:.1e}"


# ----------------------------------------------------------- independent NumPy helpers


def qmul(a, b):
    """Hamilton product AB, scalar first (Möller & Glocker 2012 eq. (5)); a, b (..., 4)."""
    a0, av = a[..., :1], a[..., 1:]
    b0, bv = b[..., :1], b[..., 1:]
    return np.concatenate(
        [a0 * b0 - np.sum(av * bv, -1, keepdims=True), a0 * bv + b0 * av + np.cross(av, bv)],
        axis=-1,
    )


def qconj(a):
    return a * np.array([1.0, -1.0, -1.0, -1.0])


def rotmat(a):
    """The rotation R of a quaternion of any length (Möller & Glocker 2012 eq. (23)); a (..., 4)."""
    a = np.asarray(a, float)
    a = a / np.linalg.norm(a, axis=-1, keepdims=True)
    w, x, y, z = np.moveaxis(a, -1, 0)
    return np.stack(
        [
            np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)], -1),
            np.stack([2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)], -1),
            np.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1),
        ],
        axis=-2,
    )


def sR_of(a):
    """s R = Im(A (0, x) A*) as a matrix, by columns (Möller & Glocker 2012 eqs. (22), (24))."""
    cols = [qmul(qmul(a, np.concatenate([[0.0], e])), qconj(a))[1:] for e in np.eye(3)]
    return np.stack(cols, axis=-1)


def hat(x):
    """x̃ with x̃ y = x × y."""
    return np.array([[0.0, -x[2], x[1]], [x[2], 0.0, -x[0]], [-x[1], x[0], 0.0]])


def rodrigues(axis, angle):
    """Rotation matrices about the unit ``axis`` by ``angle`` (any shape) -> (..., 3, 3)."""
    k = hat(axis / np.linalg.norm(axis))
    angle = np.asarray(angle)[..., None, None]
    return np.eye(3) + np.sin(angle) * k + (1.0 - np.cos(angle)) * (k @ k)


def random_unit_quaternion(rng):
    a = rng.normal(size=4)
    return a / np.linalg.norm(a)


def phi_left(a):
    """φ(A): the 4x4 matrix of left multiplication by A, φ(A) ψ(B) = ψ(AB) (Möller & Glocker 2012 eq. (10))."""
    return np.stack([qmul(a, e) for e in np.eye(4)], axis=-1)


def rotated_inertia(seed=7, principal=(1.0, 2.0, 3.0)):
    """A NON-diagonal inertia: diag(principal) in axes rotated by a random rotation."""
    P = rotmat(random_unit_quaternion(np.random.default_rng(seed)))
    th = P @ np.diag(principal) @ P.T
    return 0.5 * (th + th.T)


def traj_np(traj):
    """(t (T,), q (T, 7), u (T, 7)) of body 0 of an unbatched trajectory, as NumPy."""
    return np.asarray(traj.t), np.asarray(traj.q[:, 0]), np.asarray(traj.u[:, 0])


# ============================================================ 1. axisymmetric free body


def test_torque_free_axisymmetric_precession():
    """Euler's equations for I1 = I2: body-frame ω precesses about ē3 at Ω = (I3 − I1)/I1 ω3;
    in space the symmetry axis and the angular velocity precess about the fixed L at |L|/I1.

    Torque-free, I = diag(I1, I1, I3):  I1 ω̇1 = (I1 − I3) ω2 ω3,  I1 ω̇2 = (I3 − I1) ω3 ω1,
    I3 ω̇3 = 0. So ω3 is constant and ω1 + i ω2 = (ω1(0) + i ω2(0)) exp(iΩt).
    In the world frame L = R Θ ω is constant, and with n = R ē3 (symmetry axis)
    Θ⁻¹ = I/I1 + (1/I3 − 1/I1) ē3 ē3ᵀ gives Ω_w = R ω = L/I1 + (1/I3 − 1/I1)(L·n) n, hence
    ṅ = Ω_w × n = (L/I1) × n: n rotates rigidly about L at |L|/I1, L·n = I3 ω3 is constant
    (cos θ = I3 ω3 / |L|), and Ω_w (a fixed combination of L and n) rotates with it.
    """
    I1, I3 = 1.0, 2.0
    w0 = np.array([0.6, -0.3, 2.0])
    a0 = random_unit_quaternion(np.random.default_rng(1))
    model = rbjax.Model(rbjax.Body(1.0, [I1, I1, I3]))
    state0 = rbjax.make_state(quaternion=a0, omega_body=w0)
    traj = rbjax.rollout(model, state0, DT, 5000)
    t, q, u = traj_np(traj)
    w = u[:, 4:7]

    # body frame: closed form
    big_omega = (I3 - I1) / I1 * w0[2]
    z = (w0[0] + 1j * w0[1]) * np.exp(1j * big_omega * t)
    assert_within("ω3 constant", w[:, 2] - w0[2], 1e-12)
    assert_within("ω1(t) closed form", (w[:, 0] - z.real) / np.abs(z), 1e-10)
    assert_within("ω2(t) closed form", (w[:, 1] - z.imag) / np.abs(z), 1e-10)

    # space frame: Poinsot cone
    R = rotmat(q[:, 3:7])
    theta = np.diag([I1, I1, I3])
    L0 = rotmat(a0) @ theta @ w0
    Lmag = np.linalg.norm(L0)
    L = np.einsum("tij,tj->ti", R, w @ theta)
    assert_within("world L constant", (L - L0) / Lmag, 1e-10)
    n = R[:, :, 2]
    assert_within("cone angle cos θ = I3 ω3/|L|", n @ L0 / Lmag - I3 * w0[2] / Lmag, 1e-10)
    Rp = rodrigues(L0, Lmag / I1 * t)  # precession about L at |L|/I1
    assert_within("symmetry axis precession", n - Rp @ n[0], 1e-10)
    Ww = np.einsum("tij,tj->ti", R, w)
    assert_within("world ω precession", (Ww - Rp @ Ww[0]) / np.linalg.norm(w0), 1e-10)


# ====================================================== 2. intermediate-axis (Dzhanibekov)


def elliptic_free_top(I, w0):
    """Exact torque-free ω(t) for I1 < I2 < I3 and L² < 2 T I2 (Landau–Lifshitz §37).

    With 2T = Σ I_i ω_i² and L² = Σ I_i² ω_i², Landau–Lifshitz give the case L² > 2 T I2 with
    ω2 ∝ sn, ω1 ∝ cn, ω3 ∝ dn; for L² < 2 T I2 (rotation closer to the axis of least inertia,
    ω1 never changes sign) the roles of axes 1 and 3 swap. We derive that case directly:
    ansatz ω1 = a1 dn(u), ω2 = a2 sn(u), ω3 = a3 cn(u), u = p t + u0 with a_i > 0, p > 0.
    With sn' = cn dn, cn' = −sn dn, dn' = −m sn cn, Euler's equations
        ω̇1 = (I2 − I3)/I1 ω2 ω3,  ω̇2 = (I3 − I1)/I2 ω3 ω1,  ω̇3 = (I1 − I2)/I3 ω1 ω2
    give  a1 m p = (I3 − I2)/I1 a2 a3,  a2 p = (I3 − I1)/I2 a3 a1,  a3 p = (I2 − I1)/I3 a1 a2.
    The invariants at sn = 0 (ω = (a1, 0, a3)) and sn = 1 (ω = (a1 √(1−m), a2, 0)) give
        a1² = (2T I3 − L²) / (I1 (I3 − I1)),
        a2² = (L² − 2T I1) / (I2 (I2 − I1)),
        a3² = (L² − 2T I1) / (I3 (I3 − I1)),
        p²  = (I2 − I1)(2T I3 − L²) / (I1 I2 I3),
        m   = (I3 − I2)(L² − 2T I1) / ((I2 − I1)(2T I3 − L²))   (m = k² < 1 iff L² < 2T I2),
        1 − m = (I3 − I1)(2T I2 − L²) / ((I2 − I1)(2T I3 − L²)).
    The differences 2T I_j − L² = Σ_i I_i (I_j − I_i) ω_i² are formed without cancellation.
    ω(t) has period 4K(m)/p; ω2 = a2 sn changes sign every 2K/p.
    Returns (omega(t) function, p, K, u0) for the initial condition ω2(0) > 0, ω3(0) = 0, so
    sn(u0) = 1: u0 = K.
    """
    I = np.asarray(I, float)
    w0 = np.asarray(w0, float)
    I1, I2, I3 = I
    d = {j: np.sum(I * (I[j] - I) * w0**2) for j in range(3)}  # 2T I_j − L²
    assert d[1] > 0, "this closed form needs L² < 2 T I2"
    a1 = np.sqrt(d[2] / (I1 * (I3 - I1)))
    a2 = np.sqrt(-d[0] / (I2 * (I2 - I1)))
    a3 = np.sqrt(-d[0] / (I3 * (I3 - I1)))
    p = np.sqrt((I2 - I1) * d[2] / (I1 * I2 * I3))
    m1 = (I3 - I1) * d[1] / ((I2 - I1) * d[2])  # 1 − m, accurate
    K = ellipkm1(m1)
    assert w0[2] == 0.0 and w0[1] > 0.0
    u0 = K

    def omega(t):
        sn, cn, dn, _ = ellipj(p * np.asarray(t) + u0, 1.0 - m1)
        return np.stack([a1 * dn, a2 * sn, a3 * cn], axis=-1)

    # self-consistency of the derivation (independent of rbjax)
    assert_close(omega(0.0), w0, rtol=1e-12, atol=1e-12)
    return omega, p, K, u0


def zero_crossings(t, y):
    """Times where y changes sign, by linear interpolation between samples."""
    i = np.nonzero(np.sign(y[:-1]) * np.sign(y[1:]) < 0)[0]
    return t[i] - y[i] * (t[i + 1] - t[i]) / (y[i + 1] - y[i])


def test_intermediate_axis_flips_match_elliptic_solution():
    I = np.array([1.0, 2.0, 3.0])
    w0 = np.array([0.01, 5.0, 0.0])
    omega, p, K, _ = elliptic_free_top(I, w0)
    # Here 2T = 50.0001, L² = 100.0001 < 2T I2 = 100.0002: the case derived above.
    model = rbjax.Model(rbjax.Body(1.0, I))
    traj = rbjax.rollout(model, rbjax.make_state(omega_body=w0), DT, 20000)
    t, _, u = traj_np(traj)
    w = u[:, 4:7]

    # flips: ω2 = a2 sn(p t + K) vanishes at t_n = (2n − 1) K / p
    flips = zero_crossings(t, w[:, 1])
    expected = (2 * np.arange(1, 5) - 1) * K / p
    assert flips.shape == (4,), flips
    assert_within("flip times (relative)", (flips - expected) / expected, 1e-8)
    period = 4 * K / p
    assert_within("period of ω2 from crossings", (flips[2:] - flips[:-2]) / period - 1.0, 1e-8)
    assert_within("half periods", np.diff(flips) / (0.5 * period) - 1.0, 1e-8)
    # whole trajectory against the elliptic solution (|ω| ≈ 5)
    assert_within("ω(t) vs cn/sn/dn", (w - omega(t)) / np.linalg.norm(w0), 1e-7)
    # ω1 = a1 dn never changes sign (rotation stays on the ω1 > 0 side of the separatrix)
    assert np.all(w[:, 0] > 0)


# ============================================================== 3. heavy top, steady precession


def _pivot_gravity_torque(t, state, params):
    """Body-frame moment about the pivot of gravity −m g ẑ acting at l ē3: M = l ē3 × Rᵀ(−m g ẑ)."""
    mgl = params
    a = state.q[:, 3:7]
    a = a / jnp.sqrt(jnp.sum(a * a, axis=-1, keepdims=True))
    w, x, y, z = a[:, 0], a[:, 1], a[:, 2], a[:, 3]
    # Rᵀ ẑ is the third row of R
    zb = jnp.stack([2 * (x * z - w * y), 2 * (y * z + w * x), w * w - x * x - y * y + z * z], -1)
    # ē3 × v = (−v2, v1, 0), so M = −m g l ē3 × zb = m g l (zb2, −zb1, 0)
    M = mgl * jnp.stack([zb[:, 1], -zb[:, 0], jnp.zeros_like(zb[:, 0])], -1)
    return jnp.zeros((1, 3)), jnp.zeros((1,)), M


def test_heavy_top_steady_precession():
    """Lagrange top about a fixed pivot, emulated by a torque-only model.

    Pivot fixed => only rotation about the pivot matters: one body whose inertia is the
    inertia ABOUT THE PIVOT, diag(A', A', C) with A' = A + m l² (parallel axes), no gravity
    force (Model gravity = 0, the translation stays at rest) and the gravity moment about the
    pivot M = l ē3 × Rᵀ(−m g ẑ) from a ForceFunction.
    Euler angles R = R_z(φ) R_x(θ) R_z(ψ): Lagrangian
        L = ½A'(θ̇² + φ̇² sin²θ) + ½C(ψ̇ + φ̇ cos θ)² − m g l cos θ,
    ω3 = ψ̇ + φ̇ cos θ is conserved and the θ equation reads
        A' θ̈ = sin θ (A' φ̇² cos θ − C ω3 φ̇ + m g l).
    Steady precession (θ̇ = 0, θ̈ = 0): A' φ̇² cos θ − C ω3 φ̇ + m g l = 0; the slow root is
        φ̇ = (C ω3 − √(C²ω3² − 4 A' m g l cos θ)) / (2 A' cos θ) = 2 m g l / (C ω3 + √(...)).
    Body-frame angular velocity at ψ = 0, θ̇ = 0: ω = φ̇ Rᵀẑ + ψ̇ ē3 = (0, φ̇ sin θ, ω3),
    since R_x(θ)ᵀ ẑ = (0, sin θ, cos θ). The axis n = R ē3 = (sin φ sin θ, −cos φ sin θ, cos θ).
    """
    m, g, l, A, C = 1.0, 9.81, 0.1, 0.1, 0.2
    Ap = A + m * l**2
    w3, th0 = 6.0, 0.5
    mgl = m * g * l
    disc = (C * w3) ** 2 - 4 * Ap * mgl * np.cos(th0)
    assert disc > 0
    phidot = 2 * mgl / (C * w3 + np.sqrt(disc))
    assert_close(Ap * phidot**2 * np.cos(th0) - C * w3 * phidot + mgl, 0.0, atol=1e-14)

    model = rbjax.Model(
        rbjax.Body(m, [Ap, Ap, C]),
        forces=[rbjax.ForceFunction(_pivot_gravity_torque, jnp.asarray(mgl))],
    )
    a0 = np.array([np.cos(th0 / 2), np.sin(th0 / 2), 0.0, 0.0])  # R = R_x(θ0)
    state0 = rbjax.make_state(quaternion=a0, omega_body=[0.0, phidot * np.sin(th0), w3])
    n_steps = 15000  # ~ 2 precession periods (2π/φ̇ ≈ 7.1 s)
    assert n_steps * DT > 2 * (2 * np.pi / phidot)
    traj = rbjax.rollout(model, state0, DT, n_steps)
    t, q, u = traj_np(traj)
    n = rotmat(q[:, 3:7])[:, :, 2]
    assert_within("tilt θ constant", np.arccos(n[:, 2]) - th0, 1e-10)
    phi = np.unwrap(np.arctan2(n[:, 0], -n[:, 1]))
    assert_within("precession angle φ = φ̇ t", phi - phidot * t, 1e-10)
    assert_within("spin ω3 constant", u[:, 6] - w3, 1e-9)
    assert_within("translation at rest", q[:, 0:3], 1e-14)


# ================================================ 4, 5, 8. loaded body with non-diagonal inertia

LOADED = dict(
    mass=2.0,
    inertia=rotated_inertia(),
    gravity=np.array([0.0, 0.0, -9.81]),
    rho=np.array([0.1, -0.2, 0.3]),
    f=np.array([1.0, 0.5, -2.0]),
    tau=np.array([0.3, -0.1, 0.2]),
    r0=np.array([1.0, 2.0, 3.0]),
    a0=random_unit_quaternion(np.random.default_rng(3)),
    v0=np.array([0.1, 0.2, 0.3]),
    w0=np.array([1.0, -2.0, 0.5]),
)
LOADED_STEPS = 2000


def loaded_model(formulation=None):
    p = LOADED
    return rbjax.Model(
        rbjax.Body(p["mass"], p["inertia"]),
        gravity=p["gravity"],
        forces=[rbjax.PointForce(0, p["rho"], p["f"]), rbjax.BodyTorque(0, p["tau"])],
        formulation=formulation,
    )


def loaded_state0():
    p = LOADED
    return rbjax.make_state(
        position=p["r0"], quaternion=p["a0"], velocity=p["v0"], omega_body=p["w0"]
    )


@pytest.fixture(scope="module")
def loaded_dae():
    """RK4 rollout of the loaded rigid body with the default ScalableDAE, with multipliers."""
    return rbjax.rollout(loaded_model(), loaded_state0(), DT, LOADED_STEPS, multipliers=True)


def newton_euler_rhs(t, y):
    """Newton–Euler ODE with R as 9 components: ṙ = v, m v̇ = m g + f, Ṙ = R ω̃,
    Θ ω̇ = ϱ × Rᵀf + τ − ω × Θω (Möller & Glocker 2012 eq. (95) with M_C of eq. (75))."""
    p = LOADED
    th = p["inertia"]
    v, R, w = y[3:6], y[6:15].reshape(3, 3), y[15:18]
    M = np.cross(p["rho"], R.T @ p["f"]) + p["tau"]
    wdot = np.linalg.solve(th, M - np.cross(w, th @ w))
    vdot = p["gravity"] + p["f"] / p["mass"]
    return np.concatenate([v, vdot, (R @ hat(w)).ravel(), wdot])


def test_reference_integration_rotation_matrix_ode(loaded_dae):
    p = LOADED
    t, q, u = traj_np(loaded_dae)
    y0 = np.concatenate([p["r0"], p["v0"], rotmat(p["a0"]).ravel(), p["w0"]])
    sol = solve_ivp(
        newton_euler_rhs, (0.0, t[-1]), y0, method="DOP853", rtol=1e-12, atol=1e-12, t_eval=t
    )
    assert sol.success
    ref = sol.y.T
    R_ref = ref[:, 6:15].reshape(-1, 3, 3)
    assert_within(
        "reference: R(Rᵀ)=I drift of the reference",
        R_ref @ R_ref.transpose(0, 2, 1) - np.eye(3),
        1e-10,
    )
    assert_within("position vs reference", q[:, 0:3] - ref[:, 0:3], 1e-10)
    assert_within("R vs reference", rotmat(q[:, 3:7]) - R_ref, 1e-10)
    assert_within("ω vs reference", u[:, 4:7] - ref[:, 15:18], 1e-10)
    assert_within("v vs reference", u[:, 0:3] - ref[:, 3:6], 1e-10)
    # translation is even closed form: r = r0 + v0 t + ½ (g + f/m) t²
    acc = p["gravity"] + p["f"] / p["mass"]
    r_exact = p["r0"] + np.outer(t, p["v0"]) + 0.5 * np.outer(t**2, acc)
    assert_within("position vs closed form", q[:, 0:3] - r_exact, 1e-11)


@pytest.mark.parametrize(
    "formulation",
    [
        rbjax.NewtonEuler(),
        rbjax.UdwadiaSchutte(jnp.asarray(0.1)),
        rbjax.UdwadiaSchutte(jnp.asarray(1.0)),
        rbjax.UdwadiaSchutte(jnp.asarray(7.3)),
    ],
    ids=["NewtonEuler", "US-J0=0.1", "US-J0=1.0", "US-J0=7.3"],
)
def test_formulations_agree_on_rigid_trajectory(loaded_dae, formulation):
    traj = rbjax.rollout(loaded_model(formulation), loaded_state0(), DT, LOADED_STEPS)
    _, q_ref, u_ref = traj_np(loaded_dae)
    _, q, u = traj_np(traj)
    assert_within("q vs ScalableDAE", q - q_ref, 1e-11)
    assert_within("u vs ScalableDAE", u - u_ref, 1e-11)


def test_formulation_accelerations_agree_and_us_independent_of_j0():
    """At random rigid states, u̇ of every formulation equals Newton–Euler written by hand, and
    Udwadia–Schutte's ω̇ does not depend on J0 (Udwadia & Schutte 2010, eq. (42))."""
    p = LOADED
    rng = np.random.default_rng(11)
    B = 16
    a = rng.normal(size=(B, 1, 4))
    a /= np.linalg.norm(a, axis=-1, keepdims=True)
    w = rng.normal(size=(B, 1, 3)) * 3.0
    state = rbjax.make_state(
        position=rng.normal(size=(B, 1, 3)),
        quaternion=a,
        velocity=rng.normal(size=(B, 1, 3)),
        omega_body=w,
    )
    th = p["inertia"]
    expected = np.zeros((B, 1, 7))
    for b in range(B):
        R = rotmat(a[b, 0])
        M = np.cross(p["rho"], R.T @ p["f"]) + p["tau"]
        expected[b, 0, 0:3] = p["gravity"] + p["f"] / p["mass"]
        expected[b, 0, 4:7] = np.linalg.solve(th, M - np.cross(w[b, 0], th @ w[b, 0]))
    results = {}
    for name, form in [
        ("ScalableDAE", rbjax.ScalableDAE()),
        ("NewtonEuler", rbjax.NewtonEuler()),
        ("US-0.1", rbjax.UdwadiaSchutte(jnp.asarray(0.1))),
        ("US-1.0", rbjax.UdwadiaSchutte(jnp.asarray(1.0))),
        ("US-7.3", rbjax.UdwadiaSchutte(jnp.asarray(7.3))),
    ]:
        udot, _ = eqx.filter_jit(rbjax.accelerations)(loaded_model(form), state)
        results[name] = np.asarray(udot)
        assert_within(f"u̇ {name} vs hand Newton–Euler", (results[name] - expected) / 30.0, 1e-12)
    for name in ("US-0.1", "US-7.3"):
        assert_within(
            f"U–S u̇ J0 independence {name}", (results[name] - results["US-1.0"]) / 30.0, 1e-12
        )


def test_scaling_multiplier_equals_eq96_along_trajectory(loaded_dae):
    """λ(t) of the rigid-body DAE is the scaling constraint force −ωᵀΘω − S_C (eq. (96)),
    with S_C = ϱᵀ Rᵀ f for a point force (eq. (75)); here S_C ≠ 0."""
    p = LOADED
    lam = np.asarray(loaded_dae.lam[:, 0])
    _, q, u = traj_np(loaded_dae)
    lam_cf = np.asarray(
        rbjax.advanced.scaling_force_closed_form(loaded_model(), loaded_dae.states)
    )[:, 0]
    R = rotmat(q[:, 3:7])
    w = u[:, 4:7]
    S_C = np.einsum("j,tij,i->t", p["rho"], R, p["f"])  # ϱᵀ Rᵀ f
    assert np.ptp(S_C) > 0.1  # the point force really produces a varying scaling load
    lam_hand = -np.einsum("ti,ij,tj->t", w, p["inertia"], w) - S_C
    scale = np.max(np.abs(lam_hand))
    assert_within("λ DAE vs eq (96) by hand", (lam - lam_hand) / scale, 1e-10)
    assert_within("scaling_force_closed_form vs hand", (lam_cf - lam_hand) / scale, 1e-12)


# ========================================================================= 6. scalable body


def scalable_rhs(th):
    """Seed 000 eq. (93) with λ = 0, no forces: y = (r, A, v, ν, ω), 14 components."""
    half_tr = 0.5 * np.trace(th)
    th_inv = np.linalg.inv(th)

    def rhs(t, y):
        a, v, nu, w = y[3:7], y[7:10], y[10], y[11:14]
        s = a @ a
        thw = th @ w
        adot = qmul(a, np.concatenate([[nu], w])) / (2 * s)
        nudot = (w @ thw) / s / half_tr
        wdot = -th_inv @ (nu * thw + np.cross(w, thw)) / s
        return np.concatenate([v, adot, np.zeros(3), [nudot], wdot])

    return rhs


def test_free_scalable_body_grows_and_conserves():
    """The free 7-DOF scalable body (eq. (93), λ = 0, no forces).

    Independent expectations:
    * kinetic energy T = ½(m v² + ½trΘ ν² + ωᵀΘω) is conserved: dT/dt = ν(ωᵀΘω/s) −
      ωᵀ(νΘω + ω × Θω)/s = 0;
    * ṡ = ν (eq. (44));
    * world angular momentum about the COM, ∫ (ξ − r) × ξ̇ dm = s R Θ ω (eqs. (32), (42)), is
      conserved (the scaling constraint is rotation invariant);
    * Lagrange–Jacobi: the polar moment ∫|ξ − r|² dm = s² ½trΘ obeys
      d²(s²)/dt² = 2ν² + 2sν̇ = (2/(½trΘ))(½trΘ ν² + ωᵀΘω) = 4 T_rot / (½trΘ), constant, so
      s(t)² = s0² + 2 s0 ν0 t + 2 T_rot t² / (½trΘ) EXACTLY; for ν0 = 0 the spinning body
      grows from the start;
    * scipy DOP853 of eq. (93) written here in NumPy.
    Batch of two: (s0 = 1, ν0 = 0) and (s0 = 1.3, ν0 = −0.2).
    """
    th = rotated_inertia(seed=5, principal=(1.0, 1.5, 2.0))
    mass = 1.5
    half_tr = 0.5 * np.trace(th)
    model = rbjax.Model(rbjax.Body(mass, th, scalable=True))
    a_unit = random_unit_quaternion(np.random.default_rng(4))
    s0 = np.array([1.0, 1.3])
    nu0 = np.array([0.0, -0.2])
    a0 = np.sqrt(s0)[:, None, None] * a_unit
    w0 = np.array([1.0, -0.5, 2.0])
    v0 = np.array([0.3, 0.0, -0.1])
    state0 = rbjax.make_state(
        quaternion=a0,
        omega_body=np.broadcast_to(w0, (2, 1, 3)),
        velocity=np.broadcast_to(v0, (2, 1, 3)),
        nu=nu0[:, None],
    )
    n_steps = 2000
    traj = rbjax.rollout(model, state0, DT, n_steps)
    t = np.asarray(traj.t[0])
    for b in range(2):
        q, u = np.asarray(traj.q[b, :, 0]), np.asarray(traj.u[b, :, 0])
        a, nu, w = q[:, 3:7], u[:, 3], u[:, 4:7]
        s = np.sum(a * a, axis=-1)
        tag = f"[s0={s0[b]}, ν0={nu0[b]}]"

        # energy
        T_rot0 = 0.5 * (half_tr * nu0[b] ** 2 + w0 @ th @ w0)
        T = 0.5 * (
            mass * np.sum(u[:, 0:3] ** 2, -1) + half_tr * nu**2 + np.einsum("ti,ij,tj->t", w, th, w)
        )
        T0 = T_rot0 + 0.5 * mass * v0 @ v0
        assert_within(f"{tag} kinetic energy conserved", T / T0 - 1.0, 1e-10)
        assert_within(
            f"{tag} rbjax.kinetic_energy",
            np.asarray(rbjax.kinetic_energy(model, traj.states))[b] / T0 - 1.0,
            1e-10,
        )

        # growth: exact Lagrange–Jacobi law
        s_exact = np.sqrt(s0[b] ** 2 + 2 * s0[b] * nu0[b] * t + 2 * T_rot0 / half_tr * t**2)
        assert_within(f"{tag} s(t) vs Lagrange–Jacobi closed form", s / s_exact - 1.0, 1e-10)
        assert s[-1] > 1.5 * s0[b]
        if nu0[b] == 0.0:
            assert np.all(np.diff(s) > 0), "a spinning scalable body must grow"

        # ṡ = ν by the fourth-order central difference (truncation error h⁴ s⁽⁵⁾/30)
        ds = (s[:-4] - 8 * s[1:-3] + 8 * s[3:-1] - s[4:]) / (12 * DT)
        assert_within(f"{tag} ds/dt = ν", ds - nu[2:-2], 1e-9)

        # angular momentum s R Θ ω about the centre of mass (sR from A (0, x) A*)
        Lw = np.stack([sR_of(ak) @ (th @ wk) for ak, wk in zip(a, w, strict=True)])
        L0 = s0[b] * rotmat(a_unit) @ th @ w0
        assert_within(f"{tag} s R Θ ω conserved", (Lw - L0) / np.linalg.norm(L0), 1e-10)
        assert_within(
            f"{tag} rbjax.angular_momentum",
            (
                np.asarray(rbjax.angular_momentum(model, traj.states))[b]
                - np.cross(q[:, 0:3], mass * u[:, 0:3])
                - L0
            )
            / np.linalg.norm(L0),
            1e-10,
        )

        # reference integration of eq. (93)
        y0 = np.concatenate([np.zeros(3), a0[b, 0], v0, [nu0[b]], w0])
        sol = solve_ivp(
            scalable_rhs(th),
            (0.0, t[-1]),
            y0,
            method="DOP853",
            rtol=1e-12,
            atol=1e-12,
            t_eval=t,
        )
        assert sol.success
        ref = sol.y.T
        assert_within(f"{tag} s vs solve_ivp", s / np.sum(ref[:, 3:7] ** 2, -1) - 1.0, 1e-10)
        assert_within(f"{tag} ω vs solve_ivp", w - ref[:, 11:14], 1e-9)
        assert_within(f"{tag} ν vs solve_ivp", nu - ref[:, 10], 1e-9)
        assert_within(f"{tag} A vs solve_ivp", a - ref[:, 3:7], 1e-9)
        assert_within(f"{tag} r vs solve_ivp", q[:, 0:3] - ref[:, 0:3], 1e-11)


# ================================================== 7. mass matrix, kinetic energy, Q, Q⁻¹


def test_mass_matrix_kinetic_energy_and_velocity_transform():
    """Eqs. (38), (60), (64), (85) against a hand-built Q and a point-mass body.

    The body is 8 point masses m_i at ϱ_i (centred: Σ m_i ϱ_i = 0, eq. (61)) with
    Θ = Σ m_i (|ϱ_i|² I − ϱ_i ϱ_iᵀ) (eq. (62)). For a scalable state with s ≠ 1:
    * ξ_i(t) = Im(A(t)(0, ϱ_i)A(t)*) + r(t) (eq. (34)); along A(t) = A + tȦ, r(t) = r + t v it
      is a quadratic polynomial in t, so a central difference gives ξ̇_i exactly;
    * Ȧ follows from (ν, ω) = 2A*Ȧ (eq. (37)): Ȧ = A(ν, ω) / (2|A|²);
    * ξ̇_i must equal eq. (42) v + R(νϱ_i + ω × ϱ_i), eq. (41) ṡ = ν and s Rᵀ Ṙ = ω̃ (eq. (44));
    * T = Σ ½ m_i |ξ̇_i|² = ½ q̇ᵀ QᵀMQ q̇ = rbjax.kinetic_energy, and the point-mass mass
      matrix Σ m_i J_iᵀ J_i with J_i = (I, Rϱ_i, −Rϱ̃_i) (integrand of eq. (60)) equals eq. (64).
    """
    rng = np.random.default_rng(21)
    mi = rng.uniform(0.2, 1.0, size=8)
    rho = rng.normal(size=(8, 3))
    rho -= (mi @ rho) / mi.sum()
    m = mi.sum()
    th = sum(mk * (rk @ rk * np.eye(3) - np.outer(rk, rk)) for mk, rk in zip(mi, rho, strict=True))
    model = rbjax.Model(rbjax.Body(m, th, scalable=True))

    r = rng.normal(size=3)
    a = rng.normal(size=4)
    a *= np.sqrt(1.7) / np.linalg.norm(a)  # s = |A|² = 1.7
    s = a @ a
    v = rng.normal(size=3)
    nu = 0.37
    w = rng.normal(size=3)
    q = np.concatenate([r, a])
    u = np.concatenate([v, [nu], w])
    state = rbjax.make_state(position=r, quaternion=a, velocity=v, omega_body=w, nu=nu)

    # eq. (38) Q = blockdiag(I, 2φ(A*)) and eq. (85) Q⁻¹ = blockdiag(I, φ(A)/(2|A|²))
    Q = np.zeros((7, 7))
    Q[:3, :3] = np.eye(3)
    Q[3:, 3:] = 2.0 * phi_left(qconj(a))
    Qinv = np.zeros((7, 7))
    Qinv[:3, :3] = np.eye(3)
    Qinv[3:, 3:] = phi_left(a) / (2.0 * s)
    Q_rb = np.asarray(rbjax.advanced.velocity_transform(jnp.asarray(q)))
    Qinv_rb = np.asarray(rbjax.advanced.velocity_transform_inverse(jnp.asarray(q)))
    assert_close(Q_rb, Q, atol=1e-14)
    assert_close(Qinv_rb, Qinv, atol=1e-14)
    assert_close(Q_rb @ Qinv_rb, np.eye(7), atol=1e-14)
    assert_close(Qinv_rb @ Q_rb, np.eye(7), atol=1e-14)
    # batched, several non-unit quaternions (including tiny and large)
    qs = np.concatenate(
        [
            rng.normal(size=(5, 3)),
            rng.normal(size=(5, 4)) * np.array([[1e-3], [0.1], [1.0], [10.0], [1e3]]),
        ],
        -1,
    )
    prod = np.asarray(
        rbjax.advanced.velocity_transform(jnp.asarray(qs))
        @ rbjax.advanced.velocity_transform_inverse(jnp.asarray(qs))
    )
    assert_close(prod, np.broadcast_to(np.eye(7), (5, 7, 7)), atol=1e-12)

    # q̇ from u (eq. (37) inverted) and back
    adot = qmul(a, np.concatenate([[nu], w])) / (2.0 * s)
    qdot = np.concatenate([v, adot])
    assert_close(Q @ qdot, u, atol=1e-14)
    assert_close(2.0 * qmul(qconj(a), adot), np.concatenate([[nu], w]), atol=1e-14)

    # eq. (64) mass matrix
    M = np.zeros((7, 7))
    M[:3, :3] = m * np.eye(3)
    M[3, 3] = 0.5 * np.trace(th)
    M[4:, 4:] = th
    assert_close(np.asarray(rbjax.advanced.mass_matrix(model))[0], M, rtol=1e-14, atol=1e-14)
    R = rotmat(a)
    M_cloud = np.zeros((7, 7))
    for mk, rk in zip(mi, rho, strict=True):
        J = np.concatenate([np.eye(3), (R @ rk)[:, None], -R @ hat(rk)], axis=1)
        M_cloud += mk * J.T @ J
    assert_close(M_cloud, M, rtol=1e-12, atol=1e-12)

    # point velocities three ways
    h = 1e-3

    def xi(tau):
        at = a + tau * adot
        return (
            np.stack([qmul(qmul(at, np.concatenate([[0.0], rk])), qconj(at))[1:] for rk in rho])
            + r
            + tau * v
        )

    xidot_exact = (xi(h) - xi(-h)) / (2 * h)
    xidot_42 = v + (nu * rho + np.cross(w, rho)) @ R.T
    assert_close(xidot_42, xidot_exact, rtol=1e-11, atol=1e-11)
    # eq. (41)/(44): ṡ = 2 A·Ȧ = ν and s Rᵀ Ṙ = ω̃ with Ṙ = (d(sR)/dt − ṡ R)/s
    sdot = 2.0 * a @ adot
    assert_close(sdot, nu, atol=1e-14)
    dsR = (sR_of(a + h * adot) - sR_of(a - h * adot)) / (2 * h)
    Rdot = (dsR - sdot * R) / s
    assert_close(s * R.T @ Rdot, hat(w), atol=1e-11)
    xidot_41 = v + sdot * rho @ R.T + s * rho @ Rdot.T
    assert_close(xidot_41, xidot_exact, rtol=1e-11, atol=1e-11)

    T_cloud = 0.5 * np.sum(mi * np.sum(xidot_exact**2, -1))
    T_quad = 0.5 * qdot @ Q.T @ M @ Q @ qdot
    T_rb = float(rbjax.kinetic_energy(model, state))
    assert_close(T_quad, T_cloud, rtol=1e-11)
    assert_close(T_rb, T_cloud, rtol=1e-11)
    T_rbQ = 0.5 * qdot @ Q_rb.T @ np.asarray(rbjax.advanced.mass_matrix(model))[0] @ Q_rb @ qdot
    assert_close(T_rb, T_rbQ, rtol=1e-13)
