"""Measures, plausibility monitors and rbjax.monte_carlo on a JointModel (joint coordinates).

References independent of the code under test: the pendulum's closed forms (the quarter
period √(l/g) K(sin²(θ₀/2)) and its derivatives, the amplitude from energy conservation),
the trapezoid rule and the final state of the saved trajectory, central differences, the
same systems' own rollouts, and the maximal-coordinate monitors' behaviour mirrored.

Compile time dominates: one pendulum program serves every measure check, the gradient
check is one more, and each Monte-Carlo sampler compiles once (a resume compiles nothing).
"""

import pathlib

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import ellipe, ellipk

import rbjax

MODELS = pathlib.Path(__file__).resolve().parents[1] / "examples" / "models"
G = 9.81


def _pendulum(length=1.0, damping=0.0):
    """A point mass on a massless rod of ``length`` about a hinge along y: θ̈ = −(g/l) sin θ
    (minus c θ̇ / (m l²) with damping c)."""
    return rbjax.JointModel(
        names=("bob",),
        parent=(-1,),
        body_pos=np.zeros((1, 3)),
        body_quat=[[1.0, 0.0, 0.0, 0.0]],
        mass=[1.0],
        com=[[0.0, 0.0, -length]],
        inertia=[np.zeros((3, 3))],
        joint_types=("hinge",),
        joint_body=(0,),
        joint_axis=[[0.0, 1.0, 0.0]],
        damping=[damping],
    )


def _quarter_period(theta0, length=1.0):
    """The time from rest at θ₀ to the vertical: √(l/g) K(m), m = sin²(θ₀/2)."""
    return np.sqrt(length / G) * ellipk(np.sin(theta0 / 2) ** 2)


def test_measures_of_a_pendulum_in_joint_coordinates():
    """Two pendula in one rollout (l = 1 m, RK4, h = 10 ms, 2 s): one released from rest at
    θ₀ = 0.5 rad, one launched from the vertical at ω₀ = 2 rad/s. The located Event of the
    first's downward crossing of the vertical is its quarter period (closed form), the
    second's its half period; the
    located Maximum of the second's angle is arccos(1 − ω₀² l / 2g) (energy conservation);
    Final is the saved final state; Mean is the trapezoid of the saved angle; Drift of the
    energy ½ l² θ̇² − g l cos θ stays at RK4's error."""
    model = _pendulum()
    state = rbjax.JointState(jnp.zeros(2), [[0.5], [0.0]], [[0.0], [2.0]])
    measures = {
        "final": rbjax.Final(lambda m, s: s.qpos),
        "top": rbjax.Maximum(lambda m, s: s.qpos[0], located=True),
        "low": rbjax.Minimum(lambda m, s: s.qvel[0]),
        "down": rbjax.Event(lambda m, s: s.qpos[0], direction=-1),
        "mean": rbjax.Mean(lambda m, s: s.qpos[0]),
        "energy": rbjax.Drift(lambda m, s: 0.5 * s.qvel[0] ** 2 - G * jnp.cos(s.qpos[0])),
    }
    h, n = 0.01, 200
    tr = rbjax.rollout(model, state, h, n, measures=measures, monitors=None)
    assert isinstance(tr, rbjax.JointTrajectory) and tr.measures is not None
    v = {k: np.asarray(x) for k, x in tr.measures.items()}
    np.testing.assert_array_equal(v["final"], np.asarray(tr.final.qpos))
    assert v["down"][0] == pytest.approx(_quarter_period(0.5), abs=1e-8)  # measured 3.7e-9
    top = np.arccos(1.0 - 2.0**2 / (2 * G))
    # the second rises to its amplitude and comes back down through the vertical: half its
    # period later (it starts AT the vertical moving up, which is no downward crossing)
    assert v["down"][1] == pytest.approx(2 * _quarter_period(top), abs=1e-8)  # 6.9e-9
    assert v["top"][1] == pytest.approx(top, abs=1e-8)  # 1.6e-9; sampled at the steps: 7e-5
    assert v["top"][1] >= np.max(np.asarray(tr.qpos[1, :, 0]))  # located above the samples
    assert v["top"][0] == 0.5  # the first's largest angle is its initial one
    np.testing.assert_array_equal(v["low"], np.min(np.asarray(tr.qvel[..., 0]), axis=-1))
    trapezoid = np.trapezoid(np.asarray(tr.qpos[..., 0]), dx=h, axis=-1) / (n * h)
    np.testing.assert_allclose(v["mean"], trapezoid, rtol=1e-12, atol=1e-15)
    assert np.all(v["energy"] < 1e-7)


def test_the_derivative_of_a_located_event_time_is_the_closed_forms():
    """d t*/d θ₀ and d t*/d l of the pendulum's quarter period t* = √(l/g) K(m),
    m = sin²(θ₀/2), by jax.grad through the rollout's Event, against the closed form
    (dK/dm = (E − (1 − m) K) / (2 m (1 − m))) and central differences of the rollout."""
    h, n = 0.01, 80

    def event_time(theta0, length):
        model = eqx.tree_at(lambda m: m.com, _pendulum(), jnp.stack([0.0, 0.0, -length])[None])
        state = rbjax.JointState(0.0, jnp.stack([theta0]), jnp.zeros(1))
        measures = {"down": rbjax.Event(lambda m, s: s.qpos[0], direction=-1)}
        return rbjax.rollout(model, state, h, n, measures=measures, monitors=None).measures["down"]

    theta0, length = 0.7, 1.3
    # one compiled program for the derivative and the central differences
    value_and_grad = jax.jit(jax.value_and_grad(event_time, argnums=(0, 1)))
    _, (d_theta, d_length) = value_and_grad(jnp.asarray(theta0), jnp.asarray(length))
    d_theta, d_length = float(d_theta), float(d_length)
    m = np.sin(theta0 / 2) ** 2
    k, e = ellipk(m), ellipe(m)
    dk_dm = (e - (1 - m) * k) / (2 * m * (1 - m))
    expected_theta = np.sqrt(length / G) * dk_dm * np.sin(theta0 / 2) * np.cos(theta0 / 2)
    expected_length = _quarter_period(theta0, length) / (2 * length)
    assert d_theta == pytest.approx(expected_theta, rel=1e-6)  # measured 2.3e-8
    assert d_length == pytest.approx(expected_length, rel=1e-6)  # measured 1.6e-8
    eps = 1e-5
    up, down = (
        float(value_and_grad(jnp.asarray(theta0 + d), jnp.asarray(length))[0]) for d in (eps, -eps)
    )
    fd = (up - down) / (2 * eps)
    assert d_theta == pytest.approx(fd, rel=1e-7)  # measured 9e-11


@pytest.fixture(scope="module")
def double_pendulum():
    """examples/models/double_pendulum.xml in joint coordinates (two hinges)."""
    return rbjax.load(MODELS / "double_pendulum.xml", formulation=rbjax.JointCoordinates()).model


_HEIGHT = {"height": rbjax.Final(lambda m, s: jnp.cos(s.qpos[0]) + jnp.cos(s.qpos[0] + s.qpos[1]))}


def test_monte_carlo_of_random_angles_equals_one_batched_rollout(double_pendulum):
    """Random initial angles of the double pendulum: each sample's Final measure, and so
    their mean, equal the same quantity of one batched rollout of the same states (the
    sampler's states rebuilt here), to rounding; the plausibility record is clean."""
    model, n, dt, steps = double_pendulum, 48, 0.01, 50

    def sample(key, i):
        q = jax.random.uniform(key, (2,), minval=-1.0, maxval=1.0)
        return model, rbjax.JointState(0.0, q, jnp.zeros(2))

    r = rbjax.monte_carlo(sample, n, dt, steps, _HEIGHT, key=4, device_batch=16, progress=False)
    assert r.n_failed == 0 and r.samples is not None
    key = jax.random.key(4)
    q0 = jax.vmap(lambda i: sample(jax.random.fold_in(key, i), i)[1].qpos)(jnp.arange(n))
    tr = rbjax.rollout(model, rbjax.JointState(jnp.zeros(n), q0, jnp.zeros((n, 2))), dt, steps)
    q = np.asarray(tr.final.qpos)
    height = np.cos(q[:, 0]) + np.cos(q[:, 0] + q[:, 1])
    np.testing.assert_allclose(r.samples["height"], height, rtol=1e-12, atol=1e-13)
    assert r.statistics["height"].mean == pytest.approx(height.mean(), rel=1e-12)
    assert r.statistics["height"].count == n


def _tumbling_box():
    """A free body (m = 2, Θ = diag(1, 2, 3)) tumbling at ω = (1, 5, 0.3) rad/s under gravity:
    the maximal-coordinate monitors' test body (tests/test_reliability.py)."""
    model = rbjax.JointModel(
        names=("box",),
        parent=(-1,),
        body_pos=np.zeros((1, 3)),
        body_quat=[[1.0, 0.0, 0.0, 0.0]],
        mass=[2.0],
        com=np.zeros((1, 3)),
        inertia=[np.diag([1.0, 2.0, 3.0])],
        joint_types=("free",),
        joint_body=(0,),
    )
    state = rbjax.JointState(0.0, model.qpos0, [0.0, 0.0, 0.0, 1.0, 5.0, 0.3])
    return model, state


def test_a_huge_explicit_step_of_a_joint_model_is_implausible_not_successful():
    """RK4 at dt = 1 s and 10 s on the tumbling free body returns a quaternion of length far
    from 1, all finite: reported as RESULTS.implausible at step 0, raised naming the
    quantity, its value and the limit. At dt = 10 ms the same rollout succeeds, its monitors
    at RK4's drift: | |q|² − 1 | and the energy balance against the closed forms |q| = 1 and
    E = E₀ (a free body under gravity: E = ½ m |v|² + ½ ωᵀΘω − m gᵀ c, here recomputed
    from the saved states). Limits can be loosened, or the monitors switched off."""
    model, s0 = _tumbling_box()
    for dt in (1.0, 10.0):  # one step: a few more overflow to inf and NaN
        tr = rbjax.rollout(model, s0, dt, 1, throw=False)
        n2 = np.sum(np.asarray(tr.qpos[-1, 3:7]) ** 2)
        assert abs(n2 - 1.0) > 0.5  # the garbage is still computed ...
        assert int(tr.result) == rbjax.RESULTS.implausible  # ... but not called a success
        assert int(tr.failed_step) == 0
        assert tr.monitors is not None and set(tr.monitors) == {"unit_length", "energy"}
        assert float(tr.monitors["unit_length"]) >= abs(n2 - 1.0)
    with pytest.raises(
        eqx.EquinoxRuntimeError,
        match=r"implausible result by step 0 of a JointModel: .* reached [0-9.e+]+ "
        r"\(limit 0\.01\)\. Fix: .*monitors=rbjax\.Plausibility",
    ):
        rbjax.rollout(model, s0, 1.0, 1)
    ok = rbjax.rollout(model, s0, 0.01, 1000, save_every=10)
    assert int(ok.result) == rbjax.RESULTS.successful and ok.monitors is not None
    q, v = np.asarray(ok.qpos), np.asarray(ok.qvel)
    unit = np.abs(np.sum(q[:, 3:7] ** 2, axis=-1) - 1.0)
    assert float(ok.monitors["unit_length"]) == pytest.approx(unit.max(), rel=1e-12)
    assert unit.max() < 1e-7
    # qvel of a free joint: the world velocity of the body's origin (its centre of mass
    # here), then ω in body axes; m = 2
    kinetic = np.sum(v[:, :3] ** 2, -1) + 0.5 * np.sum([1.0, 2.0, 3.0] * v[:, 3:] ** 2, -1)
    potential = 2.0 * G * q[:, 2]
    energy = kinetic + potential
    scale = np.maximum.accumulate(kinetic + np.abs(potential - potential[0]))
    assert float(ok.monitors["energy"]) == pytest.approx(
        np.max(np.abs(energy - energy[0]) / scale), rel=1e-3, abs=1e-12
    )
    assert float(ok.monitors["energy"]) < 1e-7
    loose = rbjax.Plausibility(unit_length=100.0, energy=100.0)
    assert int(rbjax.rollout(model, s0, 1.0, 1, monitors=loose).result) == 0
    assert rbjax.rollout(model, s0, 1.0, 1, monitors=None).monitors is None


def test_the_energy_monitor_of_a_damped_tree_balances_the_dampers_work():
    """A damped pendulum (c = 0.3 N m s) loses energy: E − E₀ = W, the dampers' work,
    accumulated by the loop. At h = 10 ms (ωh = 0.03, ω = √(g/l)) the balance holds to
    RK4's error (measured 1.4e-8; successful), though E − E₀ alone is most of the exchanged
    energy. At ωh = 0.94 (h = 0.3 s: ten times the step at which RK4 follows this motion to
    1e-4) the balance fails (measured 0.012 > 0.01): implausible, as the maximal monitors
    flag a spring written as a force from ωh = 1 (tests/test_reliability.py)."""
    model = _pendulum(damping=0.3)
    s0 = rbjax.JointState(0.0, [1.0], [0.0])
    ok = rbjax.rollout(model, s0, 0.01, 400, save_every=10, throw=False)
    assert int(ok.result) == rbjax.RESULTS.successful and ok.monitors is not None
    assert set(ok.monitors) == {"energy"}  # no quaternion: no unit_length
    assert float(ok.monitors["energy"]) < 1e-6
    q, v = np.asarray(ok.qpos[:, 0]), np.asarray(ok.qvel[:, 0])
    e = 0.5 * v**2 - G * np.cos(q)
    assert e[0] - e[-1] > 0.5 * (e[0] + G)  # most of the energy is gone: the dampers' work
    bad = rbjax.rollout(model, s0, 0.3, 12, save_every=3, throw=False)
    assert int(bad.result) == rbjax.RESULTS.implausible
    assert 0.01 < float(bad.monitors["energy"]) < 0.1


def test_the_energy_monitor_of_implicit_fast_counts_only_energy_gained():
    """ImplicitFast dissipates by design (its implicit damping), so its energy monitor is
    one-sided (rbjax/_tree/monitors.py). A hinge spring of ω = 100 rad/s without damping:
    at ωh = 0.01 the step is stable and successful (energy within 0.5 %, the scheme's
    first-order oscillation); at ωh = 3 the explicit spring term is
    unstable (symplectic Euler needs ωh < 2), the energy grows, and the run is implausible.
    With a damper of 1e3 N m s at ωh = 3 the implicit damping keeps it stable: the energy
    only falls, which a two-sided balance would have called implausible (the damper's work
    along the states is far from the energy the step removes), and the run succeeds."""
    spring = eqx.tree_at(
        lambda m: (m.stiffness, m.gravity), _pendulum(), (jnp.asarray([1e4]), jnp.zeros(3))
    )
    s0 = rbjax.JointState(0.0, [0.1], [0.0])
    step = rbjax.ImplicitFast()
    fine = rbjax.rollout(spring, s0, 1e-4, 3000, save_every=300, integrator=step, throw=False)
    assert int(fine.result) == rbjax.RESULTS.successful
    coarse = rbjax.rollout(spring, s0, 0.03, 30, save_every=3, integrator=step, throw=False)
    assert int(coarse.result) == rbjax.RESULTS.implausible
    assert float(coarse.monitors["energy"]) > 0.1
    damped = eqx.tree_at(lambda m: m.damping, spring, jnp.asarray([1e3]))
    calm = rbjax.rollout(damped, s0, 0.03, 30, save_every=3, integrator=step, throw=False)
    assert int(calm.result) == rbjax.RESULTS.successful
    q = np.asarray(calm.qpos[:, 0])
    assert abs(q[-1]) < abs(q[0])


def test_monte_carlo_of_sampled_masses_failures_and_a_resumed_store(double_pendulum, tmp_path):
    """Masses perturbed inside the sampler (eqx.tree_at on the JointModel): the runner maps
    the rollout over the sampled leaves; each sample equals its own rollout, and the whole
    run equals jax.vmap of rbjax.rollout over the sampled models. Bad samples are recorded as
    for maximal models and never averaged in: a negative mass (invalid_input), a non-finite
    angle (invalid_sample), a velocity that overflows (nonfinite), a spin of 60 rad/s at
    h = 10 ms (0.6 rad per step: the energy balance off by 7 %, implausible). The run on disk resumes without computing
    anything and gives the same bits; trajectories=k writes qpos/qvel every k steps."""
    model, n, dt, steps = double_pendulum, 32, 0.01, 20

    def sample(key, i):
        k1, k2 = jax.random.split(key)
        q = jax.random.uniform(k1, (2,), minval=-1.0, maxval=1.0)
        scale = 1.0 + 0.3 * jax.random.uniform(k2, model.mass.shape)
        mass = jnp.where(i == 3, -1.0, scale * model.mass)
        q = jnp.where(i == 5, jnp.nan, q)
        w = jnp.where(i == 7, 1e200, jnp.where(i == 9, 60.0, 0.0))
        m = eqx.tree_at(lambda mm: mm.mass, model, mass)
        return m, rbjax.JointState(0.0, q, jnp.stack([w, 0.0]))

    args = (sample, n, dt, steps, _HEIGHT)
    options = dict(key=6, device_batch=8, chunk_size=16, progress=False, trajectories=10)
    r = rbjax.monte_carlo(*args, directory=tmp_path, **options)
    failed = dict(zip(r.failed_ids.tolist(), r.failed_status.tolist(), strict=True))
    assert failed == {
        3: rbjax.RESULTS.invalid_input,
        5: rbjax.RESULTS.invalid_sample,
        7: rbjax.RESULTS.nonfinite,
        9: rbjax.RESULTS.implausible,
    }
    key = jax.random.key(6)
    models, states = jax.vmap(lambda i: sample(jax.random.fold_in(key, i), i))(jnp.arange(n))
    tr = eqx.filter_vmap(lambda m, s: rbjax.rollout(m, s, dt, steps, throw=False))(models, states)
    q = np.asarray(tr.final.qpos)
    height = np.cos(q[:, 0]) + np.cos(q[:, 0] + q[:, 1])
    good = np.setdiff1d(np.arange(n), list(failed))
    assert r.samples is not None
    np.testing.assert_allclose(r.samples["height"][good], height[good], rtol=1e-12, atol=1e-13)
    assert r.statistics["height"].count == good.size
    assert r.statistics["height"].mean == pytest.approx(height[good].mean(), rel=1e-12)
    assert np.ptp(np.asarray(models.mass[:, 0])[good]) > 0.1  # the masses do differ
    m0, s0 = sample(jax.random.fold_in(key, 0), jnp.asarray(0, jnp.int32))
    own = rbjax.rollout(m0, s0, dt, steps, save_every=10)
    last = np.load(tmp_path / "traj-000000.npz")
    assert last["qpos"].shape == (16, 3, 2) and last["qvel"].shape == (16, 3, 2)
    np.testing.assert_allclose(last["qpos"][0], own.qpos, rtol=1e-12, atol=1e-14)
    again = rbjax.monte_carlo(*args, directory=tmp_path, resume=True, **options)
    assert again.chunks_computed == () and again.chunks_resumed == (0, 1)
    np.testing.assert_array_equal(again.samples["height"], r.samples["height"])
    np.testing.assert_array_equal(again.status, r.status)
