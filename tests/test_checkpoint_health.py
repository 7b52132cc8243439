"""rollout(checkpoint=...) and gradient_health: identical results, validation, chaos detection.

Kept cheap on purpose (compile time dominates): the one-stage SemiImplicitEuler, short
horizons, every compiled program shared by several checks.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rbjax
from rbjax import Checkpoint
from rbjax._analysis.gradients import GradientHealth, _constraint_tangent, gradient_health
from rbjax._rollout import _checkpoint_interval

SQRT = Checkpoint(every=None)

INERTIA = jnp.diag(jnp.array([1.0, 2.0, 3.0]))
SIE = rbjax.SemiImplicitEuler()


def _free_body():
    return rbjax.Model(rbjax.Body(1.0, INERTIA), formulation=rbjax.NewtonEuler())


def _plane_slider():
    """A cheap mechanism: one body whose centre is held on the plane z = 0 (CustomConstraint),
    pushed along x by a tilted gravity, spinning."""
    plane = rbjax.CustomConstraint(lambda qi, qj, t, p: qi[2:3] - qj[2:3], 0, rbjax.GROUND)
    model = rbjax.Model(rbjax.Body(1.0, INERTIA), joints=[plane], gravity=[1.0, 0.0, -9.81])
    state = rbjax.make_state(velocity=[[0.3, 0.2, 0.0]], omega_body=[[0.5, 2.0, 0.1]])
    return model, state


def _trajectories_and_gradients(model, state, n, save_every, checkpoints):
    """Evaluation (public rollout) and value_and_grad w.r.t. (q0, u0, inertia) per checkpoint."""

    def loss(q0, u0, inertia, ck):
        m = eqx.tree_at(lambda mm: mm.inertia, model, inertia)
        s = rbjax.State(t=state.t, q=q0, u=u0)
        tr = rbjax.rollout(m, s, 1e-2, n, save_every=save_every, integrator=SIE, checkpoint=ck)
        return jnp.sum(tr.u**2) + jnp.sum(tr.q[..., -1, :, :] ** 2), tr.q

    @jax.jit
    def grads(q0, u0, inertia):
        return [
            jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q0, u0, inertia, ck)
            for ck in checkpoints
        ]

    evals = [
        rbjax.rollout(model, state, 1e-2, n, save_every=save_every, integrator=SIE, checkpoint=ck)
        for ck in checkpoints
    ]
    return evals, grads(state.q, state.u, model.inertia)


def _assert_same(evals, grads, checkpoints):
    ref_tr, ((ref_val, ref_q), ref_g) = evals[0], grads[0]
    for ck, tr, ((val, q), g) in zip(checkpoints[1:], evals[1:], grads[1:], strict=True):
        for name in ("t", "q", "u", "result", "failed_step"):
            a, b = np.asarray(getattr(tr, name)), np.asarray(getattr(ref_tr, name))
            assert np.array_equal(a, b), f"checkpoint={ck}: Trajectory.{name} differs"
        # the primal inside the gradient program: the linearised step may round differently
        # from the evaluated one at the last bit (measured 8.7e-19 without checkpointing)
        np.testing.assert_allclose(q, ref_q, rtol=0, atol=1e-15, err_msg=f"checkpoint={ck}")
        np.testing.assert_allclose(q, tr.q, rtol=0, atol=1e-15, err_msg=f"checkpoint={ck}")
        assert abs(float(val) - float(ref_val)) <= 1e-14 * abs(float(ref_val)), f"loss, ck={ck}"
        for k, (a, b) in enumerate(zip(g, ref_g, strict=True)):
            rel = float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
            assert rel <= 1e-13, f"checkpoint={ck}: gradient {k} differs by {rel:.2e} relative"


def test_checkpoint_free_body_identical_trajectory_and_gradients():
    # 24 steps saved every 4: k = 2 splits each saved chunk, 4 recomputes one chunk, 12 groups
    # three chunks; a batch of two different bodies
    model = _free_body()
    state = rbjax.make_state(omega_body=[[[0.01, 5.0, 0.2]], [[0.3, 0.1, 4.0]]])
    cks = (None,) + tuple(Checkpoint(every=k) for k in (2, 4, 12)) + (Checkpoint(),)
    evals, grads = _trajectories_and_gradients(model, state, 24, 4, cks)
    _assert_same(evals, grads, cks)
    assert np.all(np.asarray(grads[0][1][2]) != 0.0)  # the inertia gradient is not trivial


def test_checkpoint_mechanism_identical_trajectory_and_gradients():
    # the mechanism path checks every step (per-step indices are split with the steps)
    model, state = _plane_slider()
    cks = (None, Checkpoint(every=2))
    evals, grads = _trajectories_and_gradients(model, state, 12, 4, cks)
    _assert_same(evals, grads, cks)
    assert np.max(np.abs(np.asarray(evals[0].q[..., 2]))) < 1e-12  # the plane holds


def test_checkpoint_automatic_interval_is_about_sqrt_n_steps():
    assert _checkpoint_interval(SQRT, 10_000, 10_000) == 100  # inside the single saved chunk
    assert _checkpoint_interval(SQRT, 10_000, 1) == 100  # groups of 100 saved states
    assert _checkpoint_interval(SQRT, 24, 4) == 4  # one saved chunk
    assert _checkpoint_interval(SQRT, 1000, 10) == 40  # groups of 4 saved chunks
    assert _checkpoint_interval(None, 100, 10) == 0
    assert _checkpoint_interval(Checkpoint(every=np.int64(20)), 100, 10) == 20
    # the default (None): rematerialise every step, the fastest reverse mode measured
    # (benchmarks/gradients.py)
    assert _checkpoint_interval(Checkpoint(), 100, 10) == 1


@pytest.mark.parametrize("bad", [3, 5, True, False, 0, 2.5, "yes"])
def test_checkpoint_invalid_values_are_rejected(bad):
    model = _free_body()
    state = rbjax.make_state(omega_body=[0.0, 0.0, 1.0])
    with pytest.raises(ValueError, match=r"checkpoint = .*Fix:") as err:
        ck = Checkpoint(every=bad) if bad in (3, 5) else bad
        rbjax.rollout(model, state, 1e-2, 24, save_every=4, checkpoint=ck)
    # neither divides save_every = 4 nor is a multiple of it that divides 24
    near = {3: "[2, 4, 8]", 5: "[4, 8, 12]"}
    if bad in near and not isinstance(bad, bool):
        assert f"one of {near[bad]} (nearest allowed values)" in str(err.value)
    else:
        assert "is not an rbjax.Checkpoint or None" in str(err.value)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "3"])
def test_checkpoint_every_must_be_a_positive_integer(bad):
    with pytest.raises(
        ValueError, match=r"^Checkpoint\.every = .* is not a positive integer or None\. Fix:"
    ):
        Checkpoint(every=bad)


def _final_state_loss(traj):
    w = traj.u[..., -1, :, 4:7]
    return jnp.sum(w**2 * jnp.array([1.0, 2.0, 3.0])) + jnp.sum(
        traj.q[..., -1, :, 3:7] * jnp.array([0.1, 0.2, 0.3, 0.4])
    )


def test_gradient_health_stable_spin_vs_intermediate_axis():
    model = _free_body()
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
    # the loss at the full horizon is the loss of the rollout itself
    traj = rbjax.rollout(
        model, rbjax.make_state(omega_body=[0.01, 5.0, 0.01]), 1e-2, 200, integrator=SIE
    )
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
    model, state = _plane_slider()
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
    model = _free_body()
    state = rbjax.make_state(omega_body=[0.0, 0.0, 1.0])
    with pytest.raises(ValueError, match=rf"^{name} = .*Fix:"):
        gradient_health(model, state, 1e-2, 200, _final_state_loss, **kwargs)


def test_gradient_health_bad_positional_arguments():
    model = _free_body()
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
