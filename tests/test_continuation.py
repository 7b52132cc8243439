"""Continuing a run from its drifted final state: ``rollout(model, trajectory, ...)`` and
chained ``step`` calls accept the drift their integrator left, and continuing is exact."""

import numpy as np
import pytest
from test_mechanisms import dp_model, dp_state

import rbjax
from rbjax._analysis.checks import _consistency


def test_continuing_a_rollout_equals_one_longer_rollout_bit_for_bit():
    """A double pendulum at dt = 10 ms drifts off its joints by ~1e-5 in 200 RK4 steps: its final
    State is rejected as a fresh initial state (tolerance 1e-8), the Trajectory is continued,
    and two rollouts of n steps end where one rollout of 2n steps does, to the bit."""
    model = dp_model(rbjax.ScalableDAE())
    s0 = dp_state(1.0, 0.5)
    dt, n = 1e-2, 200
    first = rbjax.rollout(model, s0, dt, n, save_every=n)
    drift = float(np.max(np.abs(np.asarray(_consistency(model, first.final)[0]))))
    assert drift > 1e-6  # far above the fresh-state tolerance: the test needs the drift
    with pytest.raises(ValueError, match="pass its Trajectory as the initial state"):
        rbjax.rollout(model, first.final, dt, n, save_every=n)
    second = rbjax.rollout(model, first, dt, n, save_every=n)
    whole = rbjax.rollout(model, s0, dt, 2 * n, save_every=n)
    np.testing.assert_array_equal(second.q[-1], whole.q[-1])
    np.testing.assert_array_equal(second.u[-1], whole.u[-1])
    np.testing.assert_allclose(second.t[-1], whole.t[-1], rtol=1e-15)


def test_chained_steps_accept_their_own_drift_and_a_failed_trajectory_is_not_continued():
    """|A|² of a rigid body spinning at 10 rad/s drifts to ~1e-7 in 12 RK4 steps of 20 ms; chained
    ``step`` calls keep going (the issue's report: rejected after 8 steps)."""
    model = rbjax.Model(rbjax.Body(1.0, np.diag([1.0, 2.0, 2.9])))
    state = rbjax.make_state(omega_body=[[0.1, 10.0, 0.0]])
    worst = 0.0
    for _ in range(12):
        state = rbjax.step(model, state, 0.02)
        worst = max(worst, abs(float(np.sum(np.asarray(state.q[0, 3:7]) ** 2)) - 1.0))
    assert 1e-9 < worst < 1e-6
    blown = rbjax.rollout(
        model, rbjax.make_state(omega_body=[[0.0, 1e200, 0.0]]), 0.02, 2, throw=False
    )
    with pytest.raises(ValueError, match="failed .*non-finite.*cannot be continued"):
        rbjax.rollout(model, blown, 0.02, 2)
