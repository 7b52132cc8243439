"""Bad input gets a clear error: a ValueError naming the field and the offending value, and
runtime failures inside the jitted rollout name the step at which they happened."""

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rbjax

INERTIA = np.array([1.0, 2.0, 3.0])


def _model(**kw):
    return rbjax.Model(rbjax.Body(1.0, INERTIA), **kw)


def _state(**kw):
    return rbjax.make_state(omega_body=np.array([0.3, 1.0, 0.2]), **kw)


# --------------------------------------------------------------------------------- Body


@pytest.mark.parametrize(
    "mass,shown",
    [(0.0, "0."), (-1.0, "-1."), (float("nan"), "nan"), (float("inf"), "inf")],
    ids=["zero", "negative", "nan", "inf"],
)
def test_body_bad_mass(mass, shown):
    with pytest.raises(
        ValueError, match=rf"^wheel\.mass = {re.escape(shown)} is not a positive finite number"
    ):
        rbjax.Body(mass, INERTIA, name="wheel")


def test_body_mass_not_scalar():
    with pytest.raises(ValueError, match=r"body\.mass = \[1\., 2\.\] is not a scalar"):
        rbjax.Body(np.array([1.0, 2.0]), INERTIA)


def test_body_inertia_not_symmetric():
    th = np.array([[1.0, 0.1, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 3.0]])
    with pytest.raises(ValueError, match=r"^rotor\.inertia = \[\[1\. , 0\.1, .* is not symmetric"):
        rbjax.Body(1.0, th, name="rotor")


@pytest.mark.parametrize(
    "inertia,moments",
    [
        (np.array([1.0, -2.0, 3.0]), "[-2.  1.  3.]"),
        (np.array([[1.0, 2.0, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 3.0]]), "[-1.  3.  3.]"),
        (np.zeros(3), "[0. 0. 0.]"),
    ],
    ids=["negative_moment", "indefinite_offdiagonal", "zero"],
)
def test_body_inertia_not_positive_definite(inertia, moments):
    with pytest.raises(
        ValueError,
        match=r"^body\.inertia = .* is not positive definite \(principal moments "
        + re.escape(moments),
    ):
        rbjax.Body(1.0, inertia)


def test_body_inertia_violates_triangle_inequality():
    with pytest.raises(
        ValueError,
        match=r"^body\.inertia = \[\[1\., 0\., 0\.\], \[0\., 1\., 0\.\], \[0\., 0\., 3\.\]\] "
        r"violates the triangle inequality I1 \+ I2 >= I3 \(principal moments \[1\. 1\. 3\.\]\)",
    ):
        rbjax.Body(1.0, np.array([1.0, 1.0, 3.0]))
    # the boundary case (a thin plate, I1 + I2 = I3) is physical and accepted
    rbjax.Body(1.0, np.array([1.0, 2.0, 3.0]))


@pytest.mark.parametrize("shape", [(2, 2), (4,), (3, 4), ()])
def test_body_inertia_wrong_shape(shape):
    with pytest.raises(
        ValueError,
        match=rf"^body\.inertia has shape {re.escape(str(shape))}, expected trailing shape \(3, 3\)",
    ):
        rbjax.Body(1.0, np.ones(shape))


@pytest.mark.parametrize("bad", [np.nan, np.inf], ids=["nan", "inf"])
def test_body_inertia_not_finite(bad):
    with pytest.raises(
        ValueError,
        match=rf"^body\.inertia = .*{str(bad)}.* contains non-finite values \(NaN or inf\)",
    ):
        rbjax.Body(1.0, np.array([1.0, bad, 3.0]))


# -------------------------------------------------------------------------------- State


def test_make_state_zero_quaternion():
    with pytest.raises(
        ValueError,
        match=r"quaternion\) = \[\[0\., 0\., 0\., 0\.\]\] has a zero quaternion.*\(1, 0, 0, 0\)",
    ):
        rbjax.make_state(quaternion=np.zeros(4))


def test_make_state_non_finite_velocity():
    with pytest.raises(
        ValueError,
        match=r"^make_state\(omega_body=\.\.\.\) = \[nan, +0\., +0\.\] contains non-finite",
    ):
        rbjax.make_state(omega_body=np.array([np.nan, 0.0, 0.0]))
    with pytest.raises(
        ValueError,
        match=r"^make_state\(velocity=\.\.\.\) = \[ *0\., +inf, +0\.\] contains non-finite",
    ):
        rbjax.make_state(velocity=np.array([0.0, np.inf, 0.0]))


def test_state_mismatched_q_u_shapes():
    q = jnp.zeros((1, 7)).at[:, 3].set(1.0)
    with pytest.raises(
        ValueError, match=r"State\.q has shape \(1, 7\) but State\.u has shape \(2, 7\)"
    ):
        rbjax.State(t=jnp.asarray(0.0), q=q, u=jnp.zeros((2, 7)))
    with pytest.raises(
        ValueError, match=r"State\.u has shape \(1, 6\), expected trailing shape \(7,\)"
    ):
        rbjax.State(t=jnp.asarray(0.0), q=q, u=jnp.zeros((1, 6)))


# ---------------------------------------------------------------- Model vs state checks


def test_non_unit_quaternion_for_rigid_body():
    model = _model()
    bad = rbjax.make_state(quaternion=np.array([1.0, 0.1, 0.0, 0.0]))
    pattern = (
        r"quaternion of rigid body 'body'\) = \[1\. *, 0\.1, 0\. *, 0\. *\] has \|A\|² = 1\.01, not 1"
        r" \(tolerance 1e-09\)\. Fix: divide the quaternion by its norm, or declare the body "
        r"scalable=True; to continue a rollout, pass its Trajectory as the initial state"
    )
    with pytest.raises(ValueError, match=pattern):
        model.check_state(bad)
    with pytest.raises(ValueError, match=pattern):
        rbjax.rollout(model, bad, 1e-2, 10)
    # the same state is valid for a scalable body
    scal = rbjax.Model(rbjax.Body(1.0, INERTIA, scalable=True))
    assert scal.check_state(bad) is bad


def test_non_unit_quaternion_message_reports_offending_member():
    model = _model()
    s = rbjax.make_state(quaternion=np.array([[[1.0, 0.0, 0.0, 0.0]], [[1.1, 0.0, 0.0, 0.0]]]))
    with pytest.raises(ValueError, match=r"has \|A\|² = 1\.21, not 1"):
        model.check_state(s)


def test_wrong_number_of_bodies():
    model = _model()
    two = rbjax.make_state(omega_body=np.zeros((2, 3)))
    pattern = r"State\.q has 2 bodies but the model has nb = 1"
    with pytest.raises(ValueError, match=pattern):
        model.check_state(two)
    with pytest.raises(ValueError, match=pattern):
        rbjax.rollout(model, two, 1e-2, 10)


# -------------------------------------------------------------------- rollout / step args


@pytest.mark.parametrize(
    "dt,shown", [(0.0, "0.0"), (-1e-3, "-0.001"), (float("nan"), "nan")], ids=["zero", "neg", "nan"]
)
def test_bad_dt(dt, shown):
    model, s = _model(), _state()
    pattern = rf"^dt = {re.escape(shown)} is not a positive finite scalar"
    with pytest.raises(ValueError, match=pattern):
        rbjax.rollout(model, s, dt, 10)
    with pytest.raises(ValueError, match=pattern):
        rbjax.step(model, s, dt)
    for integ in (rbjax.SemiImplicitEuler(), rbjax.RK4(), rbjax.ImplicitMidpoint()):
        with pytest.raises(ValueError, match=pattern):
            integ.step(model, s, dt)


@pytest.mark.parametrize("n", [0, -3, 10.0], ids=["zero", "negative", "float"])
def test_bad_n_steps(n):
    with pytest.raises(
        ValueError, match=rf"^n_steps = {re.escape(repr(n))} is not a positive integer"
    ):
        rbjax.rollout(_model(), _state(), 1e-2, n)


@pytest.mark.parametrize("save_every", [3, 0, 20])
def test_save_every_not_dividing_n_steps(save_every):
    with pytest.raises(
        ValueError, match=rf"^save_every = {save_every} does not divide n_steps = 10"
    ):
        rbjax.rollout(_model(), _state(), 1e-2, 10, save_every=save_every)


@pytest.mark.parametrize(
    "integrator", ["rk4", rbjax.RK4, rbjax.ImplicitMidpoint], ids=["str", "factory", "class"]
)
def test_rollout_integrator_of_wrong_type(integrator):
    with pytest.raises(
        ValueError,
        match=rf"^integrator = {re.escape(repr(integrator))} is not an rbjax integrator",
    ):
        rbjax.rollout(_model(), _state(), 1e-2, 10, integrator=integrator)


def test_step_integrator_of_wrong_type():
    """(rbjax.step raised AttributeError here before it validated its integrator.)"""
    with pytest.raises(ValueError, match=r"^integrator = 'rk4' is not an rbjax integrator"):
        rbjax.step(_model(), _state(), 1e-2, integrator="rk4")


def test_rollout_state_of_wrong_type():
    with pytest.raises(ValueError, match=r"^state0 = tuple is not an rbjax\.State"):
        rbjax.rollout(_model(), (0.0, 1.0), 1e-2, 10)


# ------------------------------------------------------------ formulations and forces


@pytest.mark.parametrize("formulation", [rbjax.NewtonEuler, rbjax.UdwadiaSchutte])
def test_rigid_only_formulation_with_scalable_body(formulation):
    name = formulation.__name__
    with pytest.raises(
        ValueError,
        match=rf"^{name} describes rigid bodies only, but bodies \['blob'\] are declared "
        r"scalable=True\. Fix: use formulation=ScalableDAE\(\)",
    ):
        rbjax.Model(
            [
                rbjax.Body(1.0, INERTIA, name="stone"),
                rbjax.Body(1.0, INERTIA, scalable=True, name="blob"),
            ],
            formulation=formulation(),
        )


@pytest.mark.parametrize("j0", [0.0, -1.0, 0])
def test_udwadia_schutte_nonpositive_j0(j0):
    with pytest.raises(ValueError, match=rf"^UdwadiaSchutte\.J0 = {re.escape(str(j0))} is not > 0"):
        rbjax.UdwadiaSchutte(J0=j0)


@pytest.mark.parametrize(
    "force,body",
    [
        (lambda b: rbjax.PointForce(b, np.zeros(3), np.ones(3)), 2),
        (lambda b: rbjax.PointForce(b, np.zeros(3), np.ones(3)), -1),
        (lambda b: rbjax.BodyTorque(b, np.ones(3)), 5),
    ],
    ids=["point_force_2", "point_force_-1", "body_torque_5"],
)
def test_force_body_index_out_of_range(force, body):
    bodies = [rbjax.Body(1.0, INERTIA, name="a"), rbjax.Body(1.0, INERTIA, name="b")]
    with pytest.raises(
        ValueError, match=rf"^forces\[1\]\.body = {body} is not a body index in \[0, 2\)"
    ):
        rbjax.Model(bodies, forces=[rbjax.BodyTorque(0, np.ones(3)), force(body)])


@pytest.mark.parametrize("fn", [3.0, "torque", None])
def test_force_function_not_callable(fn):
    with pytest.raises(
        ValueError, match=rf"^ForceFunction\.fn = {re.escape(repr(fn))} is not callable"
    ):
        rbjax.ForceFunction(fn)


# ------------------------------------------------------------ runtime errors inside jit

THRESHOLD, DT, N = 0.0502, 1e-3, 100


def _nan_after(t, state, params):
    """Torque becomes NaN once t > THRESHOLD, for bodies with ω_x > 0.5."""
    nb = state.q.shape[0]
    bad = (t > THRESHOLD) & (state.u[:, 4] > 0.5)
    m = jnp.where(bad[:, None], jnp.nan, 0.0) * jnp.ones((nb, 3))
    return jnp.zeros((nb, 3)), jnp.zeros(nb), m


def _expected_step(c_max):
    """Step k (t_k = k·dt) evaluates forces at t_k + c·dt for its nodes c; the first step to
    see NaN is the smallest k with (k + c_max)·dt > THRESHOLD (THRESHOLD is between nodes)."""
    return int(np.floor(THRESHOLD / DT - c_max)) + 1


@pytest.fixture(scope="module")
def nan_model():
    return _model(forces=[rbjax.ForceFunction(_nan_after)])


def _spin_x():
    return rbjax.make_state(omega_body=np.array([1.0, 0.1, 0.1]))


@pytest.mark.parametrize(
    "integrator,c_max",
    [(rbjax.RK4, 1.0), (rbjax.SemiImplicitEuler, 0.0)],
    ids=["RK4", "SemiImplicitEuler"],
)
def test_nonfinite_rollout_raises_with_step_index(nan_model, integrator, c_max):
    # RK4's stages sit at t_k, t_k + dt/2 (twice), t_k + dt: step 50 (t = 0.050) reaches 0.0505;
    # SemiImplicitEuler evaluates at t_k only: step 51 (t = 0.051) is the first past 0.0502.
    expected = _expected_step(c_max)
    assert expected == {1.0: 50, 0.0: 51}[c_max]
    with pytest.raises(
        eqx.EquinoxRuntimeError,
        match=rf"rbjax\.rollout: the state became non-finite \(NaN or inf\) at step {expected} ",
    ):
        rbjax.rollout(nan_model, _spin_x(), DT, N, integrator=integrator())
    traj = rbjax.rollout(nan_model, _spin_x(), DT, N, integrator=integrator(), throw=False)
    assert int(traj.result) == rbjax.RESULTS.nonfinite
    assert int(traj.failed_step) == expected
    # the saved states before the failure are finite, after it they are not
    u = np.asarray(traj.u)
    assert np.all(np.isfinite(u[: expected + 1])) and not np.all(np.isfinite(u[expected + 1]))


def test_nonfinite_rollout_raises_inside_outer_jit(nan_model):
    run = eqx.filter_jit(lambda s: rbjax.rollout(nan_model, s, DT, N).q)
    with pytest.raises(eqx.EquinoxRuntimeError, match=r"non-finite \(NaN or inf\) at step 50 "):
        jax.block_until_ready(run(_spin_x()))
    # under plain jax.jit equinox cannot re-raise its own type; the message still names the step
    run_jax = jax.jit(lambda s: rbjax.rollout(nan_model, s, DT, N).q)
    with pytest.raises(Exception, match=r"non-finite \(NaN or inf\) at step 50 "):
        jax.block_until_ready(run_jax(_spin_x()))


def test_nonfinite_batched_rollout_reports_per_member(nan_model):
    """Only member 0 (ω_x > 0.5) fails; member 1 completes normally."""
    s = rbjax.make_state(omega_body=np.array([[[1.0, 0.1, 0.1]], [[0.1, 1.0, 0.1]]]))
    traj = rbjax.rollout(nan_model, s, DT, N, throw=False)
    np.testing.assert_array_equal(
        np.asarray(traj.result), [rbjax.RESULTS.nonfinite, rbjax.RESULTS.successful]
    )
    np.testing.assert_array_equal(np.asarray(traj.failed_step), [50, -1])
    assert np.all(np.isfinite(np.asarray(traj.u[1])))
    with pytest.raises(eqx.EquinoxRuntimeError, match=r"at step 50 "):
        rbjax.rollout(nan_model, s, DT, N)


def test_implicit_solver_not_converging():
    model = _model()
    fast = rbjax.make_state(omega_body=np.array([0.3, 50.0, 0.2]))
    integ = rbjax.ImplicitMidpoint(max_iters=1)
    with pytest.raises(
        eqx.EquinoxRuntimeError,
        match=r"rbjax\.rollout: the implicit solver did not converge at step 0 ",
    ):
        rbjax.rollout(model, fast, 1e-2, 10, integrator=integ)
    traj = rbjax.rollout(model, fast, 1e-2, 10, integrator=integ, throw=False)
    assert int(traj.result) == rbjax.RESULTS.solver_failed
    assert int(traj.failed_step) == 0
    assert np.all(np.isfinite(np.asarray(traj.q)))  # failed to converge, not blown up
