"""Measures inside the rollout (rbjax/_measures.py): reductions against the saved trajectory,
events against closed-form event times, event-time derivatives against the closed form."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special
from conftest import assert_close
from test_mechanisms import PEND_D, PEND_IO, PEND_M, G, pendulum_model, pendulum_state

import rbjax

I_FLIP = np.array([1.0, 2.0, 2.9])
W_FLIP = np.array([0.01, 5.0, 0.0])


def elliptic_flip_time(inertia, omega0):
    """First zero of ω₂ for ω₃(0) = 0, ω₂(0) > 0 and L² < 2 T I₂: t₁ = K(m)/p
    (Landau & Lifshitz, Mechanics §37)."""
    i1, i2, i3 = inertia
    d = [np.sum(inertia * (inertia[j] - inertia) * omega0**2) for j in range(3)]  # 2T I_j − L²
    p = np.sqrt((i2 - i1) * d[2] / (i1 * i2 * i3))
    one_minus_m = (i3 - i1) * d[1] / ((i2 - i1) * d[2])
    return scipy.special.ellipkm1(one_minus_m) / p


def flip_model(i3=I_FLIP[2]):
    model = rbjax.Model(rbjax.Body(1.0, np.diag(I_FLIP)), formulation=rbjax.NewtonEuler())
    inertia = jnp.diag(jnp.stack([jnp.asarray(1.0), jnp.asarray(2.0), jnp.asarray(i3)]))
    return eqx.tree_at(lambda m: m.inertia, model, inertia[None])


FLIP = rbjax.Event(lambda m, s: s.u[0, 5], direction=-1)


def flip_time(i3, dt):
    n = int(round(3.0 / dt))
    state = rbjax.make_state(omega_body=[W_FLIP])
    traj = rbjax.rollout(flip_model(i3), state, dt, n, save_every=n, measures={"flip": FLIP})
    return traj.measures["flip"]


def test_event_locates_the_intermediate_axis_flip_of_the_elliptic_solution():
    """Located inside its step by the dense output: 1e-12 s at dt = 1 ms (the crossing itself
    falls anywhere in its step; sampling at the steps would be off by up to 1 ms), and the
    error falls like RK4's h⁴ (dt = 10 ms: ~1e-8)."""
    exact = elliptic_flip_time(I_FLIP, W_FLIP)
    err_fine = abs(float(flip_time(I_FLIP[2], 1e-3)) - exact)
    err_coarse = abs(float(flip_time(I_FLIP[2], 1e-2)) - exact)
    print(f"\n[flip] exact {exact:.12f} s, error {err_fine:.1e} (1 ms), {err_coarse:.1e} (10 ms)")
    assert err_fine < 1e-9
    assert 1e-11 < err_coarse < 1e-7
    assert err_coarse / err_fine > 1e3  # ≈ 10⁴ for a 4th-order method


def test_event_time_derivative_is_the_derivative_of_the_closed_form():
    """d t_flip / d I₃ by reverse mode (implicit function theorem at the located root) against
    the central difference of the elliptic closed form."""
    g = float(jax.grad(lambda i3: flip_time(i3, 1e-3))(jnp.asarray(I_FLIP[2])))
    e = 1e-6

    def exact(i3):
        return elliptic_flip_time(np.array([1.0, 2.0, i3]), W_FLIP)

    ref = (exact(I_FLIP[2] + e) - exact(I_FLIP[2] - e)) / (2 * e)
    print(f"\n[flip] dt/dI3 = {g:.10f}, closed form {ref:.10f}")
    assert abs(g - ref) < 1e-7 * abs(ref)


def test_event_in_a_mechanism_locates_quarter_and_half_periods_of_the_pendulum():
    """A hinged rod released at rest from φ₀: φ = 0 at T/4 (downward crossing of φ) and φ̇ = 0
    at T/2, T = 4 √(I_O / m g d) K(sin²(φ₀/2)) (complete elliptic integral); the largest
    angular speed, at the bottom, √(2 m g d (1 − cos φ₀) / I_O) (energy), located inside its
    step and sampled at the steps; one batched rollout of two amplitudes, ScalableDAE + RK4."""
    model = pendulum_model(rbjax.ScalableDAE())
    phis = np.array([np.pi / 2, np.pi / 6])
    s0 = [pendulum_state(p) for p in phis]
    state = rbjax.make_state(
        position=np.stack([s[0][None, :3] for s in s0]),
        quaternion=np.stack([s[0][None, 3:] for s in s0]),
    )

    def phi(m, s):  # the rod's body x is world x rotated about y by π/2 − φ
        a = s.q[0, 3:7]
        return np.pi / 2 - 2 * jnp.arctan2(a[2], a[0])

    measures = {
        "quarter": rbjax.Event(phi, direction=-1),
        "half": rbjax.Event(lambda m, s: s.u[0, 5], direction=-1),  # ω_y = −φ̇ falls through 0
        "speed": rbjax.Maximum(lambda m, s: s.u[0, 5], located=True),
        "speed_sampled": rbjax.Maximum(lambda m, s: s.u[0, 5]),
    }
    traj = rbjax.rollout(model, state, 2.5e-3, 800, save_every=800, measures=measures)
    for b, phi0 in enumerate(phis):
        period = (
            4
            * np.sqrt(PEND_IO / (PEND_M * G * PEND_D))
            * scipy.special.ellipk(np.sin(phi0 / 2) ** 2)
        )
        quarter = float(traj.measures["quarter"][b])
        half = float(traj.measures["half"][b])
        print(
            f"\n[pendulum φ₀ = {np.degrees(phi0):.0f}°] T/4 {quarter - period / 4:.1e}, T/2 {half - period / 2:.1e}"
        )
        assert abs(quarter - period / 4) < 1e-9
        assert abs(half - period / 2) < 1e-9
        top = np.sqrt(2 * PEND_M * G * PEND_D * (1 - np.cos(phi0)) / PEND_IO)
        located = float(traj.measures["speed"][b]) - top
        sampled = float(traj.measures["speed_sampled"][b]) - top
        print(f"  max speed {top:.9f} rad/s: located {located:.1e}, sampled {sampled:.1e}")
        assert abs(located) < 1e-9 and sampled < -1e-7  # sampling misses the peak


def test_reductions_equal_the_same_reductions_of_the_saved_trajectory():
    """Maximum, Minimum, Final exactly; Mean (trapezoid) and Drift to rounding; batched."""
    model = rbjax.Model(rbjax.Body(1.0, np.diag(I_FLIP)), formulation=rbjax.NewtonEuler())
    w0 = np.array([[W_FLIP], [[0.3, 2.0, 1.0]]])
    state = rbjax.make_state(omega_body=w0)
    fns = {
        "w": lambda m, s: s.u[0, 4:7],
        "energy": lambda m, s: rbjax.kinetic_energy(m, s),
    }
    measures = {
        "w_max": rbjax.Maximum(fns["w"]),
        "w_min": rbjax.Minimum(fns["w"]),
        "w_mean": rbjax.Mean(fns["w"]),
        "w_final": rbjax.Final(fns["w"]),
        "e_drift": rbjax.Drift(fns["energy"]),
    }
    dt, n = 1e-2, 300
    traj = rbjax.rollout(model, state, dt, n, measures=measures)
    w = np.asarray(traj.u[..., 0, 4:7])  # (B, T, 3)
    e = np.asarray(rbjax.kinetic_energy(model, traj.states))  # (B, T)
    got = {k: np.asarray(v) for k, v in traj.measures.items()}
    np.testing.assert_array_equal(got["w_max"], w.max(axis=1))
    np.testing.assert_array_equal(got["w_min"], w.min(axis=1))
    np.testing.assert_array_equal(got["w_final"], w[:, -1])
    assert_close(got["w_mean"], np.trapezoid(w, dx=dt, axis=1) / (n * dt), rtol=1e-13, atol=1e-14)
    assert_close(got["e_drift"], np.abs(e - e[:, :1]).max(axis=1), rtol=1e-6, atol=1e-15)
    assert np.all(got["e_drift"] > 0)


def test_an_event_that_does_not_happen_is_nan_and_bad_measures_are_named():
    state = rbjax.make_state(omega_body=[W_FLIP])
    never = {"never": rbjax.Event(lambda m, s: s.u[0, 5] + 100.0)}
    traj = rbjax.rollout(flip_model(), state, 1e-2, 10, save_every=10, measures=never)
    assert np.isnan(float(traj.measures["never"]))
    with pytest.raises(ValueError, match="not a scalar"):
        rbjax.rollout(
            flip_model(), state, 1e-2, 10, measures={"e": rbjax.Event(lambda m, s: s.u[0])}
        )
    with pytest.raises(ValueError, match=r"measures\['x'\].*not an rbjax measure"):
        rbjax.rollout(flip_model(), state, 1e-2, 10, measures={"x": lambda m, s: s.t})
    with pytest.raises(ValueError, match="direction=2"):
        rbjax.Event(lambda m, s: s.t, direction=2)
    with pytest.raises(ValueError, match="limit=-1"):
        rbjax.Drift(lambda m, s: s.t, limit=-1)
    with pytest.raises(ValueError, match="bins"):
        rbjax.Maximum(lambda m, s: s.t, bins=[1.0, 0.0])


def test_located_minimum_and_its_derivative_match_the_conservation_laws():
    """Torque-free body: where ω₂ passes through 0 during the flip, ω₃ is extreme, and energy
    and angular momentum give ω₃² = (L² − 2T I₁) / (I₃ (I₃ − I₁)). The located minimum of ω₃
    (it is negative here) and its derivative in I₃ (envelope theorem) against the closed form
    and its central difference."""

    def closed_form(i3):
        inertia = np.array([1.0, 2.0, i3])
        two_t = np.sum(inertia * W_FLIP**2)
        l2 = np.sum((inertia * W_FLIP) ** 2)
        return -np.sqrt((l2 - two_t * inertia[0]) / (i3 * (i3 - inertia[0])))

    lowest = {"w3": rbjax.Minimum(lambda m, s: s.u[0, 6], located=True)}
    state = rbjax.make_state(omega_body=[W_FLIP])

    def w3_min(i3):
        traj = rbjax.rollout(flip_model(i3), state, 1e-2, 300, save_every=300, measures=lowest)
        return traj.measures["w3"]

    i3 = I_FLIP[2]
    value, grad = jax.value_and_grad(w3_min)(jnp.asarray(i3))
    e = 1e-5
    ref = (closed_form(i3 + e) - closed_form(i3 - e)) / (2 * e)
    discrete = (w3_min(i3 + e) - w3_min(i3 - e)) / (2 * e)  # of the computed minimum
    print(
        f"\n[flip] min ω₃ {float(value) - closed_form(i3):.1e}, d/dI₃ {float(grad) - ref:.1e} "
        f"(closed form), {float(grad) - float(discrete):.1e} (difference of the computed)"
    )
    assert abs(float(value) - closed_form(i3)) < 1e-8
    # reverse mode is the derivative of the computed minimum; that converges to the exact
    # derivative more slowly than the value (measured 3.6e-6 at dt = 10 ms, 6.4e-7 at 5 ms)
    assert abs(float(grad) - float(discrete)) < 1e-8 * abs(ref)
    assert abs(float(grad) - ref) < 1e-5 * abs(ref)


def test_located_maximum_is_not_fooled_by_a_higher_last_sample():
    """ω_y of the pendulum released from rest peaks at T/4 and 5T/4. With dt = (T/4) / 100.45
    the first peak falls 0.45 dt from its nearest step and the run stops 0.25 dt BEFORE the
    second, so the last sample is the largest sample while ω_y is still rising. The located
    maximum must come from the interior peak (the closed form), not from the last sample."""
    model = pendulum_model(rbjax.NewtonEuler())
    phi0 = np.pi / 2
    s0 = pendulum_state(phi0)
    state = rbjax.make_state(position=s0[0][None, :3], quaternion=s0[0][None, 3:])
    period = 4 * np.sqrt(PEND_IO / (PEND_M * G * PEND_D)) * scipy.special.ellipk(0.5)
    dt = period / 4 / 100.45
    speed = lambda m, s: s.u[0, 5]  # noqa: E731
    measures = {"located": rbjax.Maximum(speed, located=True), "sampled": rbjax.Maximum(speed)}
    traj = rbjax.rollout(model, state, dt, 502, measures=measures)
    top = np.sqrt(2 * PEND_M * G * PEND_D * (1 - np.cos(phi0)) / PEND_IO)
    w = np.asarray(traj.u[:, 0, 5])
    assert np.argmax(w) == 502  # the premise: the last sample is the largest
    print(
        f"\n[peak] located {float(traj.measures['located']) - top:.1e}, last sample {w[-1] - top:.1e}"
    )
    # RK4 at this dt is good to ~4e-9; the last sample is 6.5e-5 low
    assert abs(float(traj.measures["located"]) - top) < 1e-7
    assert float(traj.measures["sampled"]) - top < -1e-5
