"""Issue 36's probes under jax.jit, jax.vmap and jax.grad, and after failures.

* Every physical parameter with a sign, range or geometric condition (a spring's stiffness,
  an actuator's range, a Distance joint's length, Baumgarte's gains, Udwadia–Schutte's J0, ...)
  is checked when traced exactly as it is when built: a negative stiffness under ``jax.jit``
  used to run with result 0. The reference is the constructor's own ValueError for the same
  value, and a test that probes every field of every model part keeps the two in step.
* A failed trajectory (``throw=False``) stays readable: its states hold the NaNs, while a
  State a user builds from NaN is still refused, and it cannot be continued.
* A model without joints has a mobility (6 DOF per rigid body, 7 per scalable body, rank 0);
  the analyses that need joints say why.
"""

from __future__ import annotations

import dataclasses
import inspect
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rbjax
from rbjax import GROUND
from rbjax._errors import declared, declared_violations

Z, X = [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]


def _mechanism():
    """Body 'a' hangs 1 m below the world origin on a Distance joint; one of each parameterised
    built-in force between it and the world (the axial one driven by a position servo),
    Baumgarte's gains and Udwadia–Schutte's J0 as a leaf."""
    servo = rbjax.Actuator.position(2.0, kv=0.1, ctrl_range=(-1.0, 1.0), force_range=(-5.0, 5.0))
    forces = [
        rbjax.TranslationalSpringDamper(
            0, [0, 0, 0], GROUND, [0, 0, -1.0], stiffness=10.0, damping=0.1, rest_length=0.5
        ),
        rbjax.RotationalSpringDamper(
            0, GROUND, axis_i=Z, axis_j=Z, ref_i=X, ref_j=X, stiffness=1.0, damping=0.1
        ),
        rbjax.AxialSpringDamper(
            0, GROUND, s_i=[0, 0, 0], s_j=[0, 0, -1.0], axis_i=Z, stiffness=1.0, actuator=servo
        ),
    ]
    model = rbjax.Model(
        rbjax.Body(1.0, [1.0, 1.0, 1.0], name="a"),
        gravity=[0.0, 0.0, -9.81],
        forces=forces,
        joints=[rbjax.Distance(GROUND, 0, length=1.0, name="rope")],
        baumgarte=(1.0, 1.0),
        formulation=rbjax.UdwadiaSchutte(J0=jnp.asarray(1.0, jnp.float64)),
    )
    return model, rbjax.make_state(position=[0.0, 0.0, -1.0])


# field named in the message -> (where in the model, a value its constructor refuses)
BAD = {
    "model.forces[0].stiffness": (lambda m: m.forces[0].stiffness, -1e3),  # the probe
    "model.forces[0].damping": (lambda m: m.forces[0].damping, -1.0),
    "model.forces[0].rest_length": (lambda m: m.forces[0].rest_length, -0.5),
    "model.forces[1].stiffness": (lambda m: m.forces[1].stiffness, -1.0),
    "model.forces[1].rest_angle": (lambda m: m.forces[1].rest_angle, 4.0),
    "model.forces[1].axis_i": (lambda m: m.forces[1].axis_i, [0.0, 0.0, 0.0]),
    "model.forces[1].ref_j": (lambda m: m.forces[1].ref_j, [1.0, 0.0, 0.5]),
    "model.forces[2].damping": (lambda m: m.forces[2].damping, -1.0),
    "model.forces[2].axis_i": (lambda m: m.forces[2].axis_i, [0.0, 0.0, 0.0]),
    "model.forces[2].actuator.ctrl_range": (
        lambda m: m.forces[2].actuator.ctrl_range,
        [1.0, -1.0],
    ),
    "model.forces[2].actuator.force_range": (
        lambda m: m.forces[2].actuator.force_range,
        [5.0, -5.0],
    ),
    "model.joints[0].length": (lambda m: m.joints[0].length, -1.0),  # L² = 1: joints hold
    "model.joints[0].x_i": (lambda m: m.joints[0].x_i, [1.0, 0.0, 1.0]),  # not ⟂ z_i
    "model.baumgarte": (lambda m: m.baumgarte[0], -1.0),
    "model.formulation.J0": (lambda m: m.formulation.J0, -1.0),
}
WHERE = tuple(where for where, _ in BAD.values())


def _values(model, **bad):
    """The model's values of the BAD leaves, with ``bad`` (k<index> -> value) substituted."""
    good = [jnp.asarray(w(model)) for w in WHERE]
    return tuple(jnp.asarray(bad.get(f"k{k}", v), v.dtype) for k, v in enumerate(good))


def _run(model, state, values, throw):
    m = eqx.tree_at(lambda mm: tuple(w(mm) for w in WHERE), model, values)
    return rbjax.rollout(m, state, 0.01, 1, throw=throw)


def _message(info) -> str:
    found = re.findall(
        r"^(?:equinox\.EquinoxRuntimeError: )?(rbjax\.rollout: .*)$", str(info.value), re.M
    )
    assert len(found) == 1, str(info.value)
    return found[0]


def test_every_constrained_parameter_is_checked_under_jit_and_vmap():
    """Each BAD value (one the constructor refuses), traced, used to run: result 0, or 3 when
    a monitor noticed the energy it fed in (a TSDA with k = −1e3). Now, under jax.vmap in
    jax.jit: one bad member among good ones is the only RESULTS.invalid_input (throw=False);
    with throw=True the batch raises naming the field and the constructor's fix. Given
    concretely through equinox.tree_at, the value is a ValueError before running."""
    model, s0 = _mechanism()
    fields = list(BAD)
    good = _values(model)
    batch = [good] + [_values(model, **{f"k{k}": BAD[f][1]}) for k, f in enumerate(fields)]
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *batch)
    codes = eqx.filter_jit(jax.vmap(lambda v: _run(model, s0, v, False).result))(stacked)
    assert np.asarray(codes).tolist() == [0] + [int(rbjax.RESULTS.invalid_input)] * len(fields)
    raising = eqx.filter_jit(jax.vmap(lambda v: _run(model, s0, v, True).q))
    for k, field in enumerate(fields):
        with pytest.raises(eqx.EquinoxRuntimeError) as info:
            raising(jax.tree.map(lambda *x: jnp.stack(x), good, batch[1 + k], good))
        msg = _message(info)
        assert msg.startswith(f"rbjax.rollout: {field} ("), msg
        assert "checked inside the program" in msg and "Fix: " in msg, msg
    concrete = eqx.tree_at(lambda m: m.forces[0].stiffness, model, jnp.asarray(-1e3))
    with pytest.raises(ValueError, match=r"^model\.forces\[0\]\.stiffness \(Translational"):
        rbjax.rollout(concrete, s0, 0.01, 1)


def _rk4_height(k, h=0.01, steps=4):
    """z after ``steps`` RK4 steps of z'' = −k z (1 kg on a spring of rest length 0) from
    z = 1 at rest: RK4 applied to y' = A y is y ← (I + hA + (hA)²/2 + (hA)³/6 + (hA)⁴/24) y."""
    a = np.asarray([[0.0, 1.0], [-k, 0.0]]) * h
    step = np.eye(2) + a + a @ a / 2 + a @ a @ a / 6 + a @ a @ a @ a / 24
    return (np.linalg.matrix_power(step, steps) @ np.asarray([1.0, 0.0]))[0]


def test_jax_grad_raises_for_a_bad_parameter_and_differentiates_a_good_one():
    """Under jax.grad a negative stiffness, Baumgarte gain or J0 used to give a gradient; the
    rollout now raises naming the field (the in-program check is the one the jit and vmap
    test above exercises for every class; a reverse-mode program costs 10 s of compilation
    per force, so this one holds a spring, the model's and the formulation's parameters). At
    valid values the checks stay outside the derivative: 1 kg on a spring to the origin
    (Baumgarte has no joint to act on) moves as z'' = −k z, and the gradient is that of RK4's
    closed form (complex step)."""
    spring = rbjax.TranslationalSpringDamper(0, [0, 0, 0], GROUND, [0, 0, 0], stiffness=10.0)
    model = rbjax.Model(
        rbjax.Body(1.0, np.eye(3)),
        forces=[spring],
        baumgarte=(1.0, 1.0),
        formulation=rbjax.UdwadiaSchutte(J0=jnp.asarray(1.0, jnp.float64)),
    )
    s0 = rbjax.make_state(position=[0.0, 0.0, 1.0])
    fields = ["model.forces[0].stiffness", "model.baumgarte", "model.formulation.J0"]
    where = tuple(BAD[f][0] for f in fields)

    def height(values):
        m = eqx.tree_at(lambda mm: tuple(w(mm) for w in where), model, values)
        return rbjax.rollout(m, s0, 0.01, 4, checkpoint=None).q[-1, 0, 2]

    # strongly typed float64 leaves: one compiled program for every call below
    good = tuple(jnp.asarray(w(model), jnp.float64) for w in where)
    grad = eqx.filter_jit(jax.grad(height))
    expected = _rk4_height(10.0 + 1e-30j).imag / 1e-30
    assert abs(float(grad(good)[0]) - expected) <= 1e-12 * abs(expected)
    for k, field in enumerate(fields):
        bad = good[:k] + (jnp.asarray(BAD[field][1], jnp.float64),) + good[k + 1 :]
        with pytest.raises(eqx.EquinoxRuntimeError) as info:
            grad(bad)
        msg = _message(info)
        assert msg.startswith(f"rbjax.rollout: {field} ("), msg
        assert "Fix: " in msg, msg


def test_the_message_names_the_member_of_a_batched_model():
    """A model whose masses carry a batch axis: the in-program error names the member (flat
    index), like the build-time check names model.mass[1, 0]."""
    model = rbjax.Model(rbjax.Body(1.0, np.eye(3)), gravity=[0.0, 0.0, -9.81])

    def run(masses):
        return rbjax.rollout(
            eqx.tree_at(lambda m: m.mass, model, masses), rbjax.make_state(), 0.01, 2
        ).q

    with pytest.raises(eqx.EquinoxRuntimeError) as info:
        eqx.filter_jit(run)(jnp.asarray([[1.0], [-1.0], [2.0]]))
    msg = _message(info)
    assert msg.startswith("rbjax.rollout: model.mass holds a mass that is not positive"), msg
    assert "(system 1 of 3, flat index)" in msg, msg
    with pytest.raises(ValueError, match=r"model\.mass\[1, 0\]"):
        run(jnp.asarray([[1.0], [-1.0], [2.0]]))


# ----- every field of every model part: the constructor and the traced check agree -----

_CONSTRAINT_FRAME = dict(s_i=[0.1, 0.0, 0.0], s_j=[0.0, 0.2, 0.0], z_i=Z, x_i=X, z_j=Z, x_j=X)


def _joint(cls, **extra):
    return lambda **kw: cls(0, 1, **(_CONSTRAINT_FRAME | extra | kw))


def _zero(t):
    return 0.0 * t


FACTORIES = {
    rbjax.TranslationalSpringDamper: lambda **kw: rbjax.TranslationalSpringDamper(
        **(
            dict(body_i=0, s_i=[0, 0, 0], body_j=GROUND, s_j=[0, 0, 1.0], stiffness=1.0)
            | dict(damping=0.1, rest_length=0.5)
            | kw
        )
    ),
    rbjax.RotationalSpringDamper: lambda **kw: rbjax.RotationalSpringDamper(
        **(
            dict(body_i=0, body_j=1, axis_i=Z, axis_j=Z, ref_i=X, ref_j=X, stiffness=1.0)
            | dict(damping=0.1, rest_angle=0.5)
            | kw
        )
    ),
    rbjax.AxialSpringDamper: lambda **kw: rbjax.AxialSpringDamper(
        **(
            dict(body_i=0, body_j=1, s_i=[0, 0, 0], s_j=[0, 0, 0], axis_i=Z, stiffness=1.0)
            | dict(damping=0.1, rest_length=0.2)
            | kw
        )
    ),
    rbjax.PointForce: lambda **kw: rbjax.PointForce(
        **(dict(body=0, point_body=[0.1, 0, 0], force_world=[0, 0, 1.0]) | kw)
    ),
    rbjax.BodyTorque: lambda **kw: rbjax.BodyTorque(**(dict(body=0, torque_body=Z) | kw)),
    rbjax.ForceFunction: lambda **kw: rbjax.ForceFunction(
        **(dict(fn=lambda t, s, p: None, params=jnp.asarray(1.0)) | kw)
    ),
    rbjax.Actuator: lambda **kw: rbjax.Actuator(
        **(
            dict(gain=(1.0, 0.0, 0.0), bias=(0.0, -1.0, -0.1), gear=2.0, control=0.5)
            | dict(ctrl_range=(-1.0, 1.0), force_range=(-5.0, 5.0), offset=0.1)
            | kw
        )
    ),
    rbjax.ControlSequence: lambda **kw: rbjax.ControlSequence(
        **(dict(values=[0.0, 1.0, 0.5], dt=0.1) | kw)
    ),
    rbjax.JointActuators: lambda **kw: rbjax.JointActuators(
        **(dict(actuators=(rbjax.Actuator.motor(gear=2.0),), force_range=(-1.0, 1.0)) | kw)
    ),
    rbjax.JointForces: lambda **kw: rbjax.JointForces(**(dict(policy=lambda t, s: None) | kw)),
    rbjax.Model: lambda **kw: rbjax.Model(
        rbjax.Body(1.0, np.eye(3)), **(dict(gravity=[0, 0, -9.81], baumgarte=(1.0, 2.0)) | kw)
    ),
    rbjax.ScalableDAE: rbjax.ScalableDAE,
    rbjax.NewtonEuler: rbjax.NewtonEuler,
    rbjax.UdwadiaSchutte: lambda **kw: rbjax.UdwadiaSchutte(**(dict(J0=1.0) | kw)),
    rbjax.Distance: _joint(rbjax.Distance, length=1.0),
    rbjax.RotationDriver: _joint(rbjax.RotationDriver, f=_zero),
    rbjax.TranslationDriver: _joint(rbjax.TranslationDriver, f=_zero),
    rbjax.CustomConstraint: lambda **kw: rbjax.CustomConstraint(
        **(dict(fn=lambda qi, qj, t, p: qi[:1] - qj[:1], body_i=0, body_j=1, params=1.0) | kw)
    ),
    rbjax.advanced.DP1: lambda **kw: rbjax.advanced.DP1(
        **(dict(body_i=0, a_i=Z, body_j=1, a_j=X) | kw)
    ),
    rbjax.advanced.DP2: lambda **kw: rbjax.advanced.DP2(
        **(dict(body_i=0, a_i=Z, s_i=[0.1, 0, 0], body_j=1, s_j=[0, 0.2, 0]) | kw)
    ),
    rbjax.advanced.D: lambda **kw: rbjax.advanced.D(
        **(dict(body_i=0, s_i=[0.1, 0, 0], body_j=1, s_j=[0, 0.2, 0]) | kw)
    ),
    rbjax.advanced.CD: lambda **kw: rbjax.advanced.CD(
        **(dict(c=X, body_i=0, s_i=[0.1, 0, 0], body_j=1, s_j=[0, 0.2, 0]) | kw)
    ),
}
for _name in (
    "Spherical",
    "Revolute",
    "Universal",
    "Cylindrical",
    "Translational",
    "Fixed",
    "Parallel",
    "Perpendicular",
    "PointOnLine",
):
    FACTORIES[getattr(rbjax, _name)] = _joint(getattr(rbjax, _name))

# model parts whose arrays no rbjax constructor constrains, and why
EXEMPT = {
    "CarriedForce": "built by Model around a user's ForceFunction on merged bodies",
    "CarriedConstraint": "built by Model around a user's constraint on merged bodies",
    "Expression": "a model file's expression: named numbers, any value",
}

_SCALARS = [-4.0, -np.pi, -1.0, 0.0, 0.5, np.pi, 4.0]
_VECTORS = [[0, 0, 0], [1, 1, 1], [0, 0, 2], [1, 0, 0], [0, 1, 0], [-1, 0, 0], [0, 0, -1]]
_PAIRS = [[1, -1], [-1, 1], [0, 0], [-1, -1], [2, 3]]
# Model.mass and Model.inertia come from Body, whose checks (and their traced twins, the
# rollout's INPUT_CHECKS) tests/test_reliability.py probes.
_NOT_PROBED = {(rbjax.Model, "mass"), (rbjax.Model, "inertia")}


def _parameters(obj):
    """(field, value) of the parameter leaves of ``obj``: floating arrays, Python floats and
    tuples of them (Model.baumgarte) in fields that are not static."""

    def numeric(x):
        return isinstance(x, float) or (eqx.is_array(x) and jnp.issubdtype(x.dtype, jnp.floating))

    for f in dataclasses.fields(obj):
        x = getattr(obj, f.name)
        if f.metadata.get("static", False) or (type(obj), f.name) in _NOT_PROBED:
            continue
        if numeric(x) or (isinstance(x, tuple) and x and all(numeric(y) for y in x)):
            yield f.name, x


def _probes(value):
    shape = np.shape(np.asarray(value))
    if shape == ():
        return _SCALARS
    if shape == (3,):
        return _VECTORS
    if shape == (2,):
        return _PAIRS
    return [np.full(shape, s) for s in _SCALARS]


@eqx.filter_jit
def _traced_flags(obj):
    return [bad for *_, bad in declared_violations(declared(obj, "obj"))]


def _model_parts():
    out = []
    for module in (rbjax, rbjax.advanced):
        for name, cls in sorted(vars(module).items()):
            parts = (rbjax.AbstractForce, rbjax.AbstractConstraint, rbjax.AbstractFormulation)
            if not (inspect.isclass(cls) and issubclass(cls, eqx.Module)):
                continue
            if inspect.isabstract(cls) or name.startswith("Abstract"):
                continue
            actuation = cls.__module__ == "rbjax._actuators" or name == "Expression"
            if issubclass(cls, parts) or cls is rbjax.Model or actuation:
                out.append(cls)
    return out


def test_every_public_model_part_is_probed():
    """A new force, joint, formulation or actuator class must enter FACTORIES (its fields are
    then probed below) or EXEMPT with a reason."""
    missing = [
        c.__name__ for c in _model_parts() if c not in FACTORIES and c.__name__ not in EXEMPT
    ]
    assert not missing, f"add these classes to FACTORIES or EXEMPT: {missing}"


@pytest.mark.parametrize("cls", list(FACTORIES), ids=lambda c: c.__name__)
def test_the_traced_check_refuses_exactly_what_the_constructor_refuses(cls):
    """Every parameter leaf of every model part, set to each probe value: the constructor
    refuses it (ValueError) if and only if the in-program check, traced by jax.jit, flags it.
    A new constrained field without its declared rule fails here, and so does a rule that
    refuses what the constructor accepts."""
    factory = FACTORIES[cls]
    base = factory()
    assert type(base) is cls
    for field, value in _parameters(base):
        for probe in _probes(value):
            try:
                factory(**{field: tuple(probe) if isinstance(value, tuple) else probe})
                refused = False
            except ValueError as e:
                refused = True
                assert "Fix:" in str(e)
            if isinstance(value, tuple):
                pairs = zip(probe, value, strict=True)
                new = tuple(jnp.asarray(p, jnp.asarray(v).dtype) for p, v in pairs)
            else:
                new = jnp.asarray(probe, jnp.asarray(value).dtype)
            obj = eqx.tree_at(lambda o, f=field: getattr(o, f), base, new)
            flagged = any(bool(np.any(b)) for b in _traced_flags(obj))
            assert refused == flagged, (cls.__name__, field, probe, refused, flagged)


# ----- after a failure -----


def _diverging():
    """Body 'a' on a stiff spring to the origin (k = 1e6 N/m, 1 kg: ω = 1000 rad/s) carrying a
    welded point mass, which the Model merges; RK4 at dt = 0.1 s (ω dt = 100) overflows to
    NaN. Monitors off: the divergence itself is the failure."""
    model = rbjax.Model(
        [rbjax.Body(1.0, np.eye(3), name="a"), rbjax.Body.point_mass(0.5, name="p")],
        forces=[rbjax.TranslationalSpringDamper(0, [0, 0, 0], GROUND, [0, 0, 0], stiffness=1e6)],
        joints=[rbjax.Fixed(0, 1, s_i=[0.1, 0.0, 0.0])],
    )
    # the merged body: composite mass 1.5 kg, its centre of mass 1/30 m from a's along x
    return model, rbjax.make_state(position=[0.0, 0.0, 1.0])


def test_a_failed_trajectory_stays_readable_and_cannot_be_continued():
    """traj.states, traj.final, energies and model.expand used to raise ValueError (State
    refused the NaNs the failure left); only the raw arrays could be read. They now hold the
    NaNs as NaNs; a State built from NaN by a user is still refused, and continuing the failed
    trajectory is refused: eagerly (ValueError) and under jax.jit (RESULTS.invalid_input, or
    raised naming it), where a drifted SUCCESSFUL trajectory continues (|A|² − 1 = 1e-7 used
    to be invalid_input under jit, while the eager continuation accepts an integrator's drift)."""
    model, s0 = _diverging()
    dt = jnp.asarray(0.1)
    traj = rbjax.rollout(model, s0, dt, 100, save_every=10, throw=False, monitors=None)
    assert int(traj.result) == rbjax.RESULTS.nonfinite and 0 <= int(traj.failed_step) < 90
    states = traj.states
    assert np.array_equal(np.asarray(states.q), np.asarray(traj.q), equal_nan=True)
    assert np.isnan(np.asarray(traj.final.q)).all()
    assert np.array_equal(np.asarray(traj[0].q), np.asarray(s0.q))
    energy = np.asarray(rbjax.total_energy(model, states))
    # at rest (T = 0), V = ½ k |d|² of the spring (rest length 0) on a's centre, 1/30 m from
    # the composite's along x: |d|² = 1 + (1/30)²
    assert energy[0] == pytest.approx(0.5e6 * (1 + 1 / 900), rel=1e-12)
    assert np.isnan(energy[-1])
    expanded = model.expand(states)
    assert expanded.q.shape == (11, 2, 7) and np.isnan(np.asarray(expanded.q[-1])).all()
    with pytest.raises(ValueError, match=r"State\.q = .* contains non-finite values"):
        rbjax.State(t=traj.t[-1], q=traj.q[-1], u=traj.u[-1])
    with pytest.raises(ValueError, match=r"state0 is a Trajectory whose system 0 .* failed"):
        rbjax.rollout(model, traj, dt, 10)

    def cont(tr, throw):
        return rbjax.rollout(model, tr, dt, 10, save_every=10, throw=throw, monitors=None)

    codes = eqx.filter_jit(lambda tr: cont(tr, False).result)
    assert int(codes(traj)) == rbjax.RESULTS.invalid_input
    with pytest.raises(eqx.EquinoxRuntimeError) as info:
        eqx.filter_jit(lambda tr: cont(tr, True).q)(traj)
    msg = _message(info)
    assert msg.startswith("rbjax.rollout: state0 is a Trajectory whose system failed"), msg
    good = rbjax.rollout(model, s0, jnp.asarray(1e-4), 100, save_every=10, monitors=None)
    drifted = eqx.tree_at(lambda tr: tr.q, good, good.q.at[-1, 0, 3:7].multiply(1.0 + 5e-8))
    assert int(codes(drifted)) == rbjax.RESULTS.successful


def test_monte_carlo_reports_a_traced_bad_parameter_and_keeps_failed_samples_readable():
    """Sampled spring constants are traced (jax.vmap over the sampler): a negative stiffness
    in sample 2 used to be integrated as an energy source with status 0; a stiffness that
    diverges in sample 3 is nonfinite with its NaN measure kept; the rest is unchanged."""
    model, s0 = _diverging()

    def sample(key, i):
        k = jnp.where(i == 2, -10.0, jnp.where(i == 3, 1e6, 10.0))
        return eqx.tree_at(lambda m: m.forces[0].stiffness, model, k), s0

    measures = {"z": rbjax.Final(lambda m, s: s.q[0, 2])}
    r = rbjax.monte_carlo(
        sample, 5, 0.1, 60, measures, device_batch=5, progress=False, monitors=None
    )
    failed = dict(zip(r.failed_ids.tolist(), r.failed_status.tolist(), strict=True))
    assert failed == {2: rbjax.RESULTS.invalid_input, 3: rbjax.RESULTS.nonfinite}
    assert np.isnan(r.samples["z"][3])
    ok = rbjax.rollout(*sample(None, 0), 0.1, 60, monitors=None)
    assert float(r.samples["z"][0]) == pytest.approx(float(ok.q[-1, 0, 2]), rel=1e-14)


# ----- a model without joints -----


def test_a_model_without_joints_has_a_mobility_and_the_analyses_say_why_not():
    """rbjax.mobility raised 'the model has no joints' where `rbjax check` reports the DOF
    (and counted 6 for a scalable body, whose DOF is 7: Möller & Glocker 2012 §4). Free
    bodies: DOF = 6 per rigid body + 7 per scalable one, rank 0, nothing redundant."""
    from rbjax._cli.check import report

    model = rbjax.Model(
        [
            rbjax.Body(1.0, np.eye(3), name="rigid"),
            rbjax.Body(2.0, [1.0, 2.0, 2.0], scalable=True, name="blob"),
        ],
        gravity=[0.0, 0.0, -9.81],
    )
    s = rbjax.make_state(nb=2)
    mob = rbjax.mobility(model, s)
    assert (mob.dof, mob.rank, mob.rows, mob.redundant) == (13, 0, 0, ())
    assert mob.singular_values.shape == (0,)
    assert rbjax.advanced.jacobian_matrix(model, s).shape == (0, 13)
    assert report(model, s, 1e-8, 1e-3, 0, 1e-6)["dof"] == 13
    # assemble: the only equations are the rigid body's |A|² = 1 and ν = 0
    a = np.asarray([2.0, 0.0, 0.0, 0.0])
    off = rbjax.State(
        t=jnp.asarray(0.0),
        q=jnp.asarray([[1.0, 2.0, 3.0, *a], [0.0, 0.0, 0.0, *a]]),
        u=jnp.asarray([[1.0, 2.0, 3.0, 0.5, 0.1, 0.2, 0.3]] * 2),
    )
    on = rbjax.assemble(model, off)
    expected_q = np.asarray(off.q).copy()
    expected_q[0, 3:7] = [1.0, 0.0, 0.0, 0.0]
    expected_u = np.asarray(off.u).copy()
    expected_u[0, 3] = 0.0
    assert np.array_equal(np.asarray(on.q), expected_q)
    assert np.array_equal(np.asarray(on.u), expected_u)
    with pytest.raises(ValueError, match=r"fully driven mechanism \(DOF = 0\).*DOF = 13"):
        rbjax.kinematic_analysis(model, s, [0.0, 0.1])
    with pytest.raises(ValueError, match=r"reactions: the model has no joints.*Fix:"):
        rbjax.reactions(model, s)
    udot, _ = rbjax.accelerations(model, s)  # free fall at rest: u̇ = (g, 0, 0)
    assert np.array_equal(np.asarray(udot), np.asarray([[0, 0, -9.81, 0, 0, 0, 0]] * 2))


def test_a_float32_frame_is_perpendicular_to_its_rounding():
    """A rotated frame stored in float32 is perpendicular only to float32 rounding (|cos| of
    order 1e-8): RotationalSpringDamper refused it against 1e-9 (so RotationalSpringDamper.at
    failed for a float32 model in a general orientation), while the traced check must read
    the same stored values. The tolerance is 10 ε of the dtype where larger than 1e-9; a
    genuinely tilted reference is still refused."""
    c, s = np.cos(0.7), np.sin(0.7)
    turn = np.asarray([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]]) @ np.asarray(
        [[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]]
    )
    axis, ref = (np.asarray(turn @ v, np.float32) for v in (Z, X))
    cos = float(np.dot(axis.astype(float), ref.astype(float)))
    assert 1e-9 < abs(cos) < 1e-6  # float32 rounding of a perpendicular pair
    frame = dict(axis_i=axis, axis_j=axis, ref_i=ref, ref_j=ref)
    rsda = rbjax.RotationalSpringDamper(0, 1, stiffness=np.float32(1.0), **frame)
    assert rsda.ref_i.dtype == jnp.float32
    assert not any(bool(b) for b in _traced_flags(rsda))
    tilted = (ref + np.float32(1e-3) * axis).astype(np.float32)
    with pytest.raises(ValueError, match=r"ref_j = .* is not perpendicular to axis_j"):
        rbjax.RotationalSpringDamper(0, 1, stiffness=1.0, **(frame | dict(ref_j=tilted)))
