"""Nothing silently wrong (issue 18): probes that returned a plausible but wrong result, each
checked against a closed form or a named error."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest

import rbjax


def test_integer_inputs_do_not_make_an_integer_model():
    """Body(1.5, [1, 2, 3]) with gravity [0, 0, −9.81] used to become an integer model (mass 1,
    gravity −9, v_z(1 s) = −9.0). The inputs are promoted to JAX's default float: the free fall
    after 1 s is the closed form v_z = −g t."""
    model = rbjax.Model(rbjax.Body(1.5, [1, 2, 3]), gravity=[0, 0, -9.81])
    assert jnp.issubdtype(model.mass.dtype, jnp.floating)
    assert float(model.mass[0]) == 1.5 and float(model.gravity[2]) == -9.81
    assert np.allclose(np.asarray(model.inertia[0]), np.diag([1.0, 2.0, 3.0]))
    traj = rbjax.rollout(model, rbjax.make_state(nb=1), 0.01, 100, save_every=100)
    assert abs(float(traj.u[-1, 0, 2]) + 9.81) <= 1e-12


def test_rollout_refuses_a_negative_mass_set_through_tree_at():
    """The documented batching route (equinox.tree_at on model.mass) bypasses Body's check;
    rollout now checks the masses as it checks the inertias, naming the entry."""
    model = rbjax.Model(rbjax.Body(1.0, np.eye(3)), gravity=[0, 0, -9.81])
    bad = eqx.tree_at(lambda m: m.mass, model, jnp.asarray([-2.0]))
    with pytest.raises(ValueError, match=r"model\.mass\[0\].*not a positive finite mass"):
        rbjax.rollout(bad, rbjax.make_state(nb=1), 0.01, 10)
    nan = eqx.tree_at(lambda m: m.mass, model, jnp.asarray([jnp.nan]))
    with pytest.raises(ValueError, match=r"model\.mass\[0\]"):
        rbjax.rollout(nan, rbjax.make_state(nb=1), 0.01, 10)


def test_body_refuses_a_batch_of_inertias():
    """Body(1.0, ones((3, 3, 3))) used to build a silent batch that failed later with a raw
    TypeError; one Body is one body."""
    with pytest.raises(ValueError, match=r"body\.inertia.*not ONE inertia"):
        rbjax.Body(1.0, np.ones((3, 3, 3)))


def test_rollout_refuses_boolean_step_counts():
    """n_steps=True used to run one step (True is an int in Python)."""
    model = rbjax.Model(rbjax.Body(1.0, np.eye(3)))
    with pytest.raises(ValueError, match=r"n_steps = True is not a positive integer"):
        rbjax.rollout(model, rbjax.make_state(nb=1), 0.01, True)
    with pytest.raises(ValueError, match=r"save_every = True"):
        rbjax.rollout(model, rbjax.make_state(nb=1), 0.01, 4, save_every=True)
