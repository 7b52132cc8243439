"""rollout(..., checkpoint=Checkpoint(every=k)): identical trajectories and gradients whatever
the interval, the automatic interval, and validation.

Kept cheap on purpose (compile time dominates): the one-stage SemiImplicitEuler, short
horizons, every compiled program shared by several checks.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import free_body_model, plane_slider

import rbjax
from rbjax import Checkpoint
from rbjax._rollout import _checkpoint_interval

SQRT = Checkpoint(every=None)
SIE = rbjax.SemiImplicitEuler()


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
    model = free_body_model()
    state = rbjax.make_state(omega_body=[[[0.01, 5.0, 0.2]], [[0.3, 0.1, 4.0]]])
    cks = (None,) + tuple(Checkpoint(every=k) for k in (2, 4, 12)) + (Checkpoint(),)
    evals, grads = _trajectories_and_gradients(model, state, 24, 4, cks)
    _assert_same(evals, grads, cks)
    assert np.all(np.asarray(grads[0][1][2]) != 0.0)  # the inertia gradient is not trivial


def test_checkpoint_mechanism_identical_trajectory_and_gradients():
    # the mechanism path checks every step (per-step indices are split with the steps)
    model, state = plane_slider()
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
    model = free_body_model()
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
        ValueError,
        match=r"^Checkpoint\.every = .* is not a positive integer or None\. Fix:",
    ):
        Checkpoint(every=bad)
