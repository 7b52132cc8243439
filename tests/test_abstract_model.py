"""rbjax.AbstractModel, AbstractState and AbstractTrajectory (rbjax/_abstract.py): the one model,
state and trajectory type of both formulations, and the annotations of the public functions.

References the code under test did not produce: MuJoCo's compiled model of the same file (body
masses, principal moments of inertia, gravity, names), equinox's own refusal of a module with
an unimplemented AbstractVar, and Python's typing (the annotations a type checker reads).
Nothing here compiles a rollout.
"""

import inspect
import pathlib
import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rbjax

mujoco = pytest.importorskip("mujoco")

MODELS = pathlib.Path(__file__).resolve().parents[1] / "examples" / "models"


def _both(name: str):
    path = MODELS / name
    joint = rbjax.load(path, formulation=rbjax.JointCoordinates())
    maximal = rbjax.load(path, formulation=rbjax.ScalableDAE())
    return joint, maximal, mujoco.MjModel.from_xml_path(str(path))


def test_both_formulations_are_one_model_type():
    """A file loaded in either formulation is an AbstractModel with an AbstractState, and what
    AbstractModel declares reads the file's bodies in both: MuJoCo's masses, principal
    moments (the body axes differ: MuJoCo's body frame, the principal frame), gravity and
    names."""
    for name in ("double_pendulum.xml", "cart_pole.xml"):
        joint, maximal, m = _both(name)
        assert isinstance(joint.model, rbjax.JointModel) and isinstance(maximal.model, rbjax.Model)
        for L in (joint, maximal):
            model: rbjax.AbstractModel = L.model
            assert isinstance(model, rbjax.AbstractModel), name
            assert isinstance(L.state, rbjax.AbstractState), name
            assert model.nb == m.nbody - 1 == len(model.names), name
            assert model.names == tuple(m.body(b).name for b in range(1, m.nbody)), name
            assert model.joint_names == tuple(m.joint(j).name for j in range(m.njnt)), name
            np.testing.assert_allclose(model.mass, m.body_mass[1:], rtol=1e-12)
            moments = np.sort(np.linalg.eigvalsh(np.asarray(model.inertia)), axis=-1)
            np.testing.assert_allclose(moments, np.sort(m.body_inertia[1:], axis=-1), rtol=1e-9)
            np.testing.assert_allclose(model.gravity, m.opt.gravity, rtol=1e-12)
            assert isinstance(model.forces, tuple) and model.baumgarte is None
    for concrete in (rbjax.Trajectory, rbjax.JointTrajectory):
        assert issubclass(concrete, rbjax.AbstractTrajectory)
    assert issubclass(rbjax.State, rbjax.AbstractState)
    assert issubclass(rbjax.JointState, rbjax.AbstractState)


def _one():
    """One body's fields: mass, inertia, gravity, forces, baumgarte, names."""
    return (jnp.ones(1), jnp.eye(3)[None], jnp.zeros(3), (), None, ("b",))


class _Partial(rbjax.AbstractModel):
    """A user's model that forgets nb and joint_names."""

    mass: jax.Array
    inertia: jax.Array
    gravity: jax.Array
    forces: tuple
    baumgarte: tuple | None
    names: tuple[str, ...]


class _Full(_Partial):
    """One that implements every AbstractVar (fields and properties)."""

    joint_names: tuple[str, ...] = ()

    @property
    def nb(self) -> int:
        return len(self.names)


class _NoFinal(rbjax.AbstractTrajectory):
    t: jax.Array
    result: jax.Array
    failed_step: jax.Array
    lam: jax.Array | None = None
    measures: dict | None = None
    monitors: dict | None = None

    def __getitem__(self, i):
        return rbjax.JointState(self.t[..., i], jnp.zeros(1), jnp.zeros(1))


def test_a_subclass_must_implement_every_abstract_var():
    """equinox refuses to build a module whose AbstractVars are not all implemented, naming
    them; an AbstractTrajectory without ``final`` is refused by Python's abc."""
    one = _one()
    assert _Full(*one).nb == 1 and isinstance(_Full(*one), rbjax.AbstractModel)
    with pytest.raises(TypeError, match="Can't instantiate abstract class _Partial") as info:
        _Partial(*one)
    assert "joint_names" in str(info.value) and "'nb'" in str(info.value)
    with pytest.raises(TypeError, match="Can't instantiate abstract class _NoFinal.*final"):
        _NoFinal(jnp.zeros(2), jnp.zeros((), int), jnp.zeros((), int))
    with pytest.raises(TypeError, match="Can't instantiate abstract class"):
        rbjax.AbstractModel()  # pyright: ignore[reportAbstractUsage]


# what a type checker (and, in the tests, jaxtyping's runtime checks) read: every public
# function that takes either formulation says AbstractModel; maximal-only ones say Model
EITHER = [
    rbjax.rollout, rbjax.reactions, rbjax.kinetic_energy, rbjax.potential_energy,
    rbjax.total_energy, rbjax.linear_momentum, rbjax.angular_momentum, rbjax.energy_balance,
    rbjax.assemble,
]  # fmt: skip
MAXIMAL_ONLY = [
    rbjax.step, rbjax.accelerations, rbjax.change_points, rbjax.gradient_health,
    rbjax.nonfinite_gradient, rbjax.kinematic_analysis, rbjax.mobility, rbjax.joint_coordinates,
    rbjax.state_from_joint_coordinates, rbjax.weld_reactions, rbjax.save,
    rbjax.JointSpace.__init__,
]  # fmt: skip


def _hints(fn) -> dict:
    """typing.get_type_hints without its ``__no_type_check__`` shortcut (which the entry
    points that validate their own inputs set, rbjax/_errors.py ``validates_inputs``); names
    a module imports for the type checker only are looked up among rbjax's public names."""
    fn = inspect.unwrap(fn)
    return {
        k: eval(v, fn.__globals__, dict(vars(rbjax))) if isinstance(v, str) else v  # noqa: S307
        for k, v in fn.__annotations__.items()
    }


def test_public_functions_annotate_the_model_type():
    for fn in EITHER:
        hints = _hints(fn)
        assert hints["model"] is rbjax.AbstractModel, fn.__name__
        state = next((k for k in ("state", "state0") if k in hints), None)  # energy_balance
        either = (rbjax.AbstractState, rbjax.AbstractState | rbjax.AbstractTrajectory, None)
        assert hints.get(state) in either, fn.__name__
    assert _hints(rbjax.rollout)["return"] is rbjax.AbstractTrajectory
    for fn in MAXIMAL_ONLY:
        assert _hints(fn)["model"] is rbjax.Model, fn.__qualname__
    pair = typing.get_args(_hints(rbjax.identify)["build"])[1]
    assert pair == tuple[rbjax.AbstractModel, rbjax.AbstractState]
    for fn in (rbjax.monte_carlo, rbjax.residuals):
        name = "sample" if fn is rbjax.monte_carlo else "build"
        assert typing.get_args(_hints(fn)[name])[1] == pair, fn.__name__
    hints = typing.get_type_hints(rbjax.Loaded)
    assert hints["model"] is rbjax.AbstractModel
    assert hints["state"] == rbjax.AbstractState | None


def test_a_state_of_the_other_formulation_is_refused_by_name():
    """A maximal model with a JointState (or anything but a Model on the maximal path) is a
    ValueError naming the fix, as a JointModel with a State already was, not an
    AttributeError from inside."""
    joint, maximal, _ = _both("double_pendulum.xml")
    for fn in (rbjax.kinetic_energy, rbjax.potential_energy, rbjax.total_energy):
        with pytest.raises(ValueError, match="the model is an rbjax.Model but the state is a "):
            fn(maximal.model, joint.state)
    for fn in (rbjax.linear_momentum, rbjax.angular_momentum):
        with pytest.raises(ValueError, match=r"JointState\. Fix: pass an rbjax.State\(t, q, u\)"):
            fn(maximal.model, joint.state)
    with pytest.raises(ValueError, match="reactions: model is an rbjax.Model but state is a Joint"):
        rbjax.reactions(maximal.model, joint.state)
    with pytest.raises(ValueError, match="model = _Full is not an rbjax.Model. Fix:"):
        rbjax.energy_balance(_Full(*_one()))
