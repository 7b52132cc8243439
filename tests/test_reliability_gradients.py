"""Non-finite gradients that must never reach an optimiser, issue 36.

The probe of the issue: a body on a nonlinear spring F = −k sign(x) √|x| started at x = 0.
√ has an infinite derivative at 0, so every derivative of the motion with respect to k is NaN
(∞ · 0 in the first step), while the motion and the loss are finite. Before issue 36
``rbjax.identify`` ran on with the NaN Jacobian ("gradient test 0 ≤ gtol", then "NOT
converged" from the Gauss–Newton check) and ``jax.grad`` of a rollout returned NaN without a
word. References the code does not produce: the step where x = 0 (the first, by
construction) and the force that has the square root; the fit of the same spring written with
the safe-where pattern, whose steps, evaluations and estimate were measured before the
change (rbjax at c27ca6f: 6 Levenberg–Marquardt steps and 19 evaluations, 8 L-BFGS steps and
39 evaluations, k = 2 to 3e-15); a central finite difference.

The spring's identification programs are compiled once (one build, one data layout).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_reliability import _sinking_body

import rbjax

K_TRUE, K0 = 2.0, 1.5
SIE = rbjax.SemiImplicitEuler()


def _spring(safe: bool):
    def law(t, state, params):
        x = state.q[:, 0]
        if safe:
            pos = jnp.abs(x) > 0
            root = jnp.where(pos, jnp.sqrt(jnp.where(pos, jnp.abs(x), 1.0)), 0.0)
        else:
            root = jnp.sqrt(jnp.abs(x))
        f = -params["k"] * jnp.sign(x) * root
        return jnp.zeros((1, 3)).at[:, 0].set(f), jnp.zeros(1), jnp.zeros((1, 3))

    def build(p):
        force = rbjax.ForceFunction(law, params={"k": p["k"]})
        model = rbjax.Model(rbjax.Body(1.0, np.eye(3)), forces=[force])
        return model, rbjax.make_state(velocity=[1.0, 0.0, 0.0], nb=1)  # from x = 0

    return build


_UNSAFE, _SAFE = _spring(False), _spring(True)


def _data():
    """Noise-free positions every 0.1 s from a rollout at the fit's own step (0.01 s)."""
    model, s0 = _SAFE({"k": jnp.asarray(K_TRUE)})
    traj = rbjax.rollout(model, s0, 0.01, 100)
    y = np.asarray(traj.q[::10, 0, 0:3])
    return rbjax.Measurements(np.linspace(0.0, 1.0, 11), [rbjax.Position(0, y, 1e-3)])


def test_identify_stops_at_a_nonfinite_gradient_with_the_diagnosis():
    data, p0 = _data(), {"k": jnp.asarray(K0)}
    for solver in (rbjax.LevenbergMarquardt(), rbjax.LBFGS()):
        with pytest.raises(rbjax.NonfiniteGradientError) as info:
            rbjax.identify(_UNSAFE, p0, data, dt=0.01, solver=solver)
        err = info.value
        assert isinstance(err, ValueError) and "Fix:" in str(err)  # the CLI's exit code 2
        assert "the loss is finite" in str(err) and "at the initial guess params0" in str(err)
        assert "non-finite with respect to ['k']" in str(err)
        d = err.diagnosis
        assert isinstance(d, rbjax.NonfiniteGradient)
        assert (d.step, d.time) == (0, 0.0)  # x = 0 at the start of the first step
        assert "q['body', 0]" in d.where
        assert d.forces == ("forces[0] (ForceFunction)",)
        assert "keep that point out of both branches of a jnp.where" in d.message

    res = rbjax.identify(_UNSAFE, p0, data, dt=0.01, nonfinite="result")
    assert not res.converged and res.criterion == "nonfinite gradient"
    assert res.diagnosis is not None and res.diagnosis.step == 0
    assert float(res.params["k"]) == K0 and np.isnan(res.covariance).all()
    assert "NOT converged" in res.summary()

    with pytest.raises(ValueError, match=r"^identify\(nonfinite\) = 'ignore' .*Fix:"):
        rbjax.identify(_UNSAFE, p0, data, dt=0.01, nonfinite="ignore")


def test_a_finite_identification_is_unchanged_by_the_check():
    data, p0 = _data(), {"k": jnp.asarray(K0)}
    # the work of each fit before the check existed, at most: L-BFGS's line search follows
    # rounding (8 steps and 39 evaluations on the Intel CI host, 6 and 37 on an AMD EPYC one)
    for solver, steps, evaluations in (
        (rbjax.LevenbergMarquardt(), 6, 19),
        (rbjax.LBFGS(), 8, 39),
    ):
        res = rbjax.identify(_SAFE, p0, data, dt=0.01, solver=solver)
        assert res.converged and res.diagnosis is None
        assert res.steps <= steps and res.evaluations <= evaluations
        assert float(res.params["k"]) == pytest.approx(K_TRUE, rel=1e-13)
        assert np.all(np.isfinite(res.covariance))


def _k_loss(model, s0, loss, check):
    def f(k):
        m = eqx.tree_at(lambda mm: mm.forces[0].params["k"], model, k)
        traj = rbjax.rollout(
            m, s0, 0.01, 30, integrator=SIE, monitors=None, check_gradients=check
        )  # the cheapest program to compile: one-stage integrator, no monitors
        return loss(traj)

    return f


def test_rollout_check_gradients_raises_instead_of_returning_nan():
    """The sinking body of tests/test_reliability.py (√depth at depth = 0, where plain
    jax.grad returns NaN, as that file asserts): with check_gradients=True it raises, saying
    whether the rollout or the loss produced the NaN; the safe-where body's finite gradient
    (equal to central differences there) is the same bits with and without the check."""
    height = lambda traj: traj.q[-1, 0, 2]
    k = jnp.asarray(50.0)
    model, s0 = _sinking_body(safe=False)
    with pytest.raises(eqx.EquinoxRuntimeError, match="the backward pass of the rollout turned"):
        jax.grad(_k_loss(model, s0, height, True))(k)

    model, s0 = _sinking_body(safe=True)
    g = jax.grad(_k_loss(model, s0, height, True))(k)
    assert np.isfinite(float(g))
    assert float(g) == float(jax.grad(_k_loss(model, s0, height, False))(k))

    # √0 in the loss itself: the NaN comes from the loss, not from the rollout
    root = lambda traj: jnp.sqrt(jnp.maximum(traj.q[-1, 0, 2] - 10.0, 0.0))
    with pytest.raises(eqx.EquinoxRuntimeError, match="derivative of the loss with respect"):
        jax.grad(_k_loss(model, s0, root, True))(k)
