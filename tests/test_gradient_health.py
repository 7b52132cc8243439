"""gradient_health: reverse mode against forward mode and central differences at a ladder of
horizons, separating a stable spin from the chaotic intermediate axis; validation.

Kept cheap on purpose (compile time dominates): the one-stage SemiImplicitEuler, short
horizons.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import free_body_model, plane_slider

import rbjax
from rbjax import GradientHealth, gradient_health
from rbjax._analysis.gradients import _constraint_tangent

SIE = rbjax.SemiImplicitEuler()


def _final_state_loss(traj):
    w = traj.u[..., -1, :, 4:7]
    return jnp.sum(w**2 * jnp.array([1.0, 2.0, 3.0])) + jnp.sum(
        traj.q[..., -1, :, 3:7] * jnp.array([0.1, 0.2, 0.3, 0.4])
    )


def test_gradient_health_stable_spin_vs_intermediate_axis():
    model = free_body_model()
    # the same compiled program for both (only the initial values differ)
    stable = gradient_health(
        model, rbjax.make_state(omega_body=[0.01, 0.01, 5.0]), 1e-2, 200, _final_state_loss,
        integrator=SIE,
    )  # fmt: skip
    flip = gradient_health(
        model, rbjax.make_state(omega_body=[0.01, 5.0, 0.01]), 1e-2, 200, _final_state_loss,
        integrator=SIE,
    )  # fmt: skip
    print(stable)
    print(flip)
    assert isinstance(stable, GradientHealth)
    assert list(stable.horizons) == [6, 12, 25, 50, 100, 200]
    assert np.max(stable.ad_fd_error) < 1e-6, stable.ad_fd_error
    assert np.max(stable.fwd_rev_error) < 1e-10, stable.fwd_rev_error
    assert np.max(flip.ad_fd_error) < 1e-6, flip.ad_fd_error  # 2 s is still differentiable
    assert stable.trustworthy_horizon == pytest.approx(2.0)
    assert stable.verdict.startswith("OK: gradients agree with finite differences")
    # spin about the major axis: perturbations grow linearly (phase), not exponentially
    assert abs(stable.lyapunov_exponent) < 0.5, stable.lyapunov_exponent
    # near the intermediate axis: exponential growth, rate ω √((I2−I1)(I3−I2)/(I1 I3)) ≈ 2.9 /s
    assert 1.5 < flip.lyapunov_exponent < 4.0, flip.lyapunov_exponent
    assert flip.lyapunov_exponent > 4 * stable.lyapunov_exponent
    assert flip.growth()[-1] > 20 * stable.growth()[-1]
    assert flip.gradient_norm.shape == flip.loss.shape == (6,) and flip.times.shape == (201,)
    # the loss at the full horizon is the loss of the rollout itself (without the monitors,
    # as gradient_health runs it: SemiImplicitEuler at 10 ms leaves |A|² − 1 = 0.13 here,
    # an inaccurate run whose discrete map is still what is differentiated)
    traj = rbjax.rollout(
        model, rbjax.make_state(omega_body=[0.01, 5.0, 0.01]), 1e-2, 200, integrator=SIE,
        monitors=None,
    )  # fmt: skip
    assert float(flip.loss[-1]) == pytest.approx(float(_final_state_loss(traj)), rel=1e-13)
    assert "Lyapunov" in str(flip) and "AD-FD err" in str(flip)


def _health(ad_fd, fwd_rev, sens_end=1e6, lyap=3.0):
    h = np.array([10, 20, 40, 80])
    times = np.linspace(0.0, 0.8, 81)
    sens = np.exp(np.log(sens_end) * times / 0.8)
    ok = (np.asarray(ad_fd) <= 1e-4) & (np.asarray(fwd_rev) <= 1e-4)
    n_ok = int(np.argmin(ok)) if not ok.all() else 4
    return GradientHealth(
        horizons=h,
        horizon_times=h * 1e-2,
        times=times,
        sensitivity=sens,
        loss=np.ones(4),
        gradient_norm=np.ones(4),
        ad_fd_error=np.asarray(ad_fd),
        fwd_rev_error=np.asarray(fwd_rev),
        lyapunov_exponent=lyap,
        trustworthy_horizon=float(h[n_ok - 1] * 1e-2) if n_ok else 0.0,
        eps=6e-6,
        tol=1e-4,
        wrt="initial state",
    )


def test_gradient_health_verdicts():
    chaotic = _health([1e-9, 1e-8, 3e-3, 0.5], [1e-15] * 4)
    assert chaotic.trustworthy_horizon == pytest.approx(0.2)
    v = chaotic.verdict
    assert "gradients agree with finite differences up to t = 0.2 s" in v
    assert "exceeds 1e-04" in v and "too chaotic to differentiate" in v
    assert "multiple shooting (rbjax.identify(..., shooting=S)" in v
    assert "NO" in str(chaotic) and v in str(chaotic)

    rev = _health([1e-9, 1e-9, 1e-9, 1e-9], [1e-15, 1e-15, 1e-2, 1e-2])
    assert "forward and reverse mode disagree" in rev.verdict

    kink = _health([1e-9, 1e-3, 1e-3, 1e-3], [1e-15] * 4, sens_end=2.0, lyap=0.1)
    assert "not chaos" in kink.verdict and "not smooth" in kink.verdict

    none = _health([1e-2] * 4, [1e-15] * 4)
    assert none.trustworthy_horizon == 0.0
    assert "already at the shortest horizon t = 0.1 s" in none.verdict


def test_gradient_health_mechanism_directions_keep_the_joints():
    # directions in (δr, δθ, δv, δω) are projected onto the plane z = 0 and v_z = 0
    model, state = plane_slider()
    dirs = jax.random.normal(jax.random.PRNGKey(0), (3, 1, 12))
    proj, dof = _constraint_tangent(model, state, dirs)
    assert dof == 10  # 12 coordinates, one position and one velocity equation
    np.testing.assert_allclose(np.asarray(proj[..., [2, 8]]), 0.0, atol=1e-12)
    # every other coordinate is untouched
    keep = [k for k in range(12) if k not in (2, 8)]
    np.testing.assert_allclose(np.asarray(proj[..., keep]), np.asarray(dirs[..., keep]), atol=1e-12)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"horizons": [0]}, "horizons"),
        ({"horizons": [300]}, "horizons"),
        ({"horizons": [15], "save_every": 10}, "horizons"),
        ({"horizons": [1.5]}, "horizons"),
        ({"n_directions": 0}, "n_directions"),
        ({"eps": -1e-6}, "eps"),
        ({"eps": float("nan")}, "eps"),
        ({"tol": 0.0}, "tol"),
        ({"wrt": "params"}, "wrt"),
        ({"wrt": lambda m: "abc"}, "wrt"),
        ({"save_every": 7}, "save_every"),
    ],
)
def test_gradient_health_bad_arguments(kwargs, name):
    model = free_body_model()
    state = rbjax.make_state(omega_body=[0.0, 0.0, 1.0])
    with pytest.raises(ValueError, match=rf"^{name} = .*Fix:"):
        gradient_health(model, state, 1e-2, 200, _final_state_loss, **kwargs)


def test_gradient_health_bad_positional_arguments():
    model = free_body_model()
    state = rbjax.make_state(omega_body=[0.0, 0.0, 1.0])
    with pytest.raises(ValueError, match=r"^loss = .*Fix:"):
        gradient_health(model, state, 1e-2, 200, "sum")
    with pytest.raises(ValueError, match=r"^state0 = .*Fix:"):
        gradient_health(model, state.q, 1e-2, 200, _final_state_loss)
    with pytest.raises(ValueError, match=r"^n_steps = .*Fix:"):
        gradient_health(model, state, 1e-2, 0, _final_state_loss)
    with pytest.raises(ValueError, match=r"^dt = .*Fix:"):
        gradient_health(model, state, -1e-2, 200, _final_state_loss)
    with pytest.raises(ValueError, match=r"loss returned shape \(2,\) .*Fix:"):
        gradient_health(model, state, 1e-2, 4, lambda tr: tr.q[..., -1, 0, 0:2].ravel())
