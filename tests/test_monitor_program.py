"""The plausibility monitors' own program (rbjax/_engine/monitors.py ``cheaply_compiled``):
the same values eager and under a caller's jit (where JAX takes no compiler options for an
inner program), the quantity the public energies give, and a loop whose bits
do not depend on them."""

import pathlib
import warnings

import jax
import numpy as np

import rbjax

MODELS = pathlib.Path(__file__).resolve().parents[1] / "examples" / "models"


def test_joint_monitors_keep_their_value_under_transformations_and_change_no_bit():
    """Double pendulum, RK4 at 10 ms. The energy monitor is max_k |E_k − E₀| /
    max_{j≤k}(T_j + |V_j − V₀|) of the public energies (the rounding floor is 1e-11 of it
    here), the same eager, inside a caller's jit and under jax.grad (a nested program with
    compiler options was refused by JAX: ValueError); the states are the same bits as
    without monitors, and a continued rollout ends where one longer rollout does, to the bit
    (with the monitors traced into the loop's program instead, the continuation was 1 ulp
    off under the suite's XLA flags, and 1e-14 on a maximal double pendulum)."""
    model = rbjax.load(MODELS / "double_pendulum.xml", formulation=rbjax.JointCoordinates())
    m = model.model
    s0 = rbjax.JointState(0.0, model.state.qpos + 0.4, model.state.qvel + 2.0)
    dt, n = 1e-2, 4
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a first call may warn about the CPU's cache
        plain = rbjax.rollout(m, s0, dt, n, save_every=2, monitors=None)
        watched = rbjax.rollout(m, s0, dt, n, save_every=2)
    np.testing.assert_array_equal(watched.qpos, plain.qpos)
    np.testing.assert_array_equal(watched.qvel, plain.qvel)
    assert watched.result == rbjax.RESULTS.successful

    def run(v):
        traj = rbjax.rollout(m, rbjax.JointState(s0.t, s0.qpos, v), dt, n, save_every=2)
        return traj.monitors["energy"]

    energy = jax.jit(run)(s0.qvel)
    states = [watched[k] for k in range(watched.t.shape[-1])]
    kin = np.array([float(rbjax.kinetic_energy(m, s)) for s in states])
    pot = np.array([float(rbjax.potential_energy(m, s)) for s in states])
    gap = np.abs(kin + pot - kin[0] - pot[0])
    scale = np.maximum.accumulate(kin + np.abs(pot - pot[0]))
    expected = np.max(gap / scale)
    assert expected > 1e-9  # the step is coarse enough for the check to mean something
    for value in (watched.monitors["energy"], energy):
        np.testing.assert_allclose(value, expected, rtol=1e-6)

    # n_save = 1 (save_every = n): XLA inlines a loop of one trip, the case where monitors
    # sharing the program could change the rounding of the states
    first = rbjax.rollout(m, s0, dt, n, save_every=n)
    second = rbjax.rollout(m, first, dt, n, save_every=n)
    bare = rbjax.rollout(m, rbjax.rollout(m, s0, dt, n, save_every=n, monitors=None), dt, n,
                         save_every=n, monitors=None)  # fmt: skip
    np.testing.assert_array_equal(second.qpos, bare.qpos)  # the monitors change no bit
    np.testing.assert_array_equal(second.qvel, bare.qvel)
    # a continued rollout against the whole one: the same steps, compiled in loops of other
    # trip counts; bit-equal on the Intel CI host, one ulp apart in one coordinate on an AMD
    # EPYC host (XLA's code for the two programs), so compared to 4 ulp
    whole = rbjax.rollout(m, s0, dt, 2 * n, save_every=n)
    ulp = 4 * np.finfo(np.float64).eps
    np.testing.assert_allclose(first.qpos[-1], whole.qpos[1], rtol=ulp, atol=0)
    np.testing.assert_allclose(second.qpos[-1], whole.qpos[-1], rtol=ulp, atol=0)
    np.testing.assert_allclose(second.qvel[-1], whole.qvel[-1], rtol=ulp, atol=0)
