"""One pure step of the equations of motion, ``step(model, state, dt) -> state``."""

from ._errors import validates_inputs
from ._integrators import RK4, AbstractIntegrator
from ._model import Model, require_model
from ._state import State


@validates_inputs
def step(model: Model, state: State, dt, integrator: AbstractIntegrator | None = None) -> State:
    """One pure step ``(model, state, dt) -> state`` with ``integrator`` (default RK4); same
    pytree structure, shapes and dtypes out as in.

    Steps are chained in loops, so a rigid body's |A|² − 1 and ν are accepted up to the drift
    an integrator leaves (1e-6 in float64, 1e-3 in float32; rbjax/_integrators.py
    ``STEP_DRIFT``), not the 1e-9 a rollout demands of a fresh State."""
    require_model(model)
    integrator = RK4() if integrator is None else integrator
    if not isinstance(integrator, AbstractIntegrator):
        raise ValueError(
            f"integrator = {integrator!r} is not an rbjax integrator. Fix: use RK4(), "
            "SemiImplicitEuler(), ImplicitMidpoint() or Projected(...)."
        )
    return integrator.step(model, state, dt)
