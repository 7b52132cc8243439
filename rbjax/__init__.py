"""rbjax: a JAX-accelerated, differentiable rigid-body engine built on the scalable body.

One explicit public surface; implementation lives in private modules. See README.md and
docs/architecture.md. Quaternion algebra: ``rbjax.quaternion``.
"""

from . import quaternion as quaternion
from ._assembly import KinematicResult as KinematicResult
from ._assembly import Mobility as Mobility
from ._assembly import assemble as assemble
from ._assembly import jacobian_matrix as jacobian_matrix
from ._assembly import kinematic_analysis as kinematic_analysis
from ._assembly import mobility as mobility
from ._body import Body as Body
from ._constraints import (
    CD as CD,
)
from ._constraints import (
    DP1 as DP1,
)
from ._constraints import (
    DP2 as DP2,
)
from ._constraints import (
    GROUND as GROUND,
)
from ._constraints import (
    AbstractConstraint as AbstractConstraint,
)
from ._constraints import (
    D as D,
)
from ._constraints import (
    constraint_gamma as constraint_gamma,
)
from ._constraints import (
    constraint_jacobian as constraint_jacobian,
)
from ._constraints import (
    constraint_jacobian_pi as constraint_jacobian_pi,
)
from ._constraints import (
    constraint_residual as constraint_residual,
)
from ._dynamics import (
    AbstractFormulation as AbstractFormulation,
)
from ._dynamics import (
    NewtonEuler as NewtonEuler,
)
from ._dynamics import (
    ScalableDAE as ScalableDAE,
)
from ._dynamics import (
    UdwadiaSchutte as UdwadiaSchutte,
)
from ._dynamics import (
    accelerations as accelerations,
)
from ._dynamics import (
    angular_momentum as angular_momentum,
)
from ._dynamics import (
    kinetic_energy as kinetic_energy,
)
from ._dynamics import (
    linear_momentum as linear_momentum,
)
from ._dynamics import (
    mass_matrix as mass_matrix,
)
from ._dynamics import (
    potential_energy as potential_energy,
)
from ._dynamics import (
    scaling_force_closed_form as scaling_force_closed_form,
)
from ._dynamics import (
    total_energy as total_energy,
)
from ._dynamics import (
    velocity_transform as velocity_transform,
)
from ._dynamics import (
    velocity_transform_inverse as velocity_transform_inverse,
)
from ._forces import (
    AbstractForce as AbstractForce,
)
from ._forces import (
    BodyTorque as BodyTorque,
)
from ._forces import (
    ForceFunction as ForceFunction,
)
from ._forces import (
    PointForce as PointForce,
)
from ._forces import (
    RotationalSpringDamper as RotationalSpringDamper,
)
from ._forces import (
    TranslationalSpringDamper as TranslationalSpringDamper,
)
from ._gradhealth import GradientHealth as GradientHealth
from ._gradhealth import gradient_health as gradient_health
from ._identify import AbstractObservation as AbstractObservation
from ._identify import AngularVelocity as AngularVelocity
from ._identify import Custom as Custom
from ._identify import IdentificationResult as IdentificationResult
from ._identify import Measurements as Measurements
from ._identify import Orientation as Orientation
from ._identify import Position as Position
from ._identify import ReactionForce as ReactionForce
from ._identify import Velocity as Velocity
from ._identify import identify as identify
from ._identify import residuals as residuals
from ._integrators import (
    RK4 as RK4,
)
from ._integrators import (
    RK4_TABLEAU as RK4_TABLEAU,
)
from ._integrators import (
    AbstractIntegrator as AbstractIntegrator,
)
from ._integrators import (
    ButcherTableau as ButcherTableau,
)
from ._integrators import (
    ExplicitRK as ExplicitRK,
)
from ._integrators import (
    ImplicitMidpoint as ImplicitMidpoint,
)
from ._integrators import Projected as Projected
from ._integrators import (
    SemiImplicitEuler as SemiImplicitEuler,
)
from ._joints import AbstractJoint as AbstractJoint
from ._joints import CustomConstraint as CustomConstraint
from ._joints import Cylindrical as Cylindrical
from ._joints import Distance as Distance
from ._joints import Fixed as Fixed
from ._joints import Parallel as Parallel
from ._joints import Perpendicular as Perpendicular
from ._joints import PointOnLine as PointOnLine
from ._joints import Revolute as Revolute
from ._joints import RotationDriver as RotationDriver
from ._joints import Spherical as Spherical
from ._joints import Translational as Translational
from ._joints import TranslationDriver as TranslationDriver
from ._joints import Universal as Universal
from ._model import Model as Model
from ._params import LogCholeskyInertia as LogCholeskyInertia
from ._params import Positive as Positive
from ._params import PrincipalInertia as PrincipalInertia
from ._reactions import Reactions as Reactions
from ._reactions import reactions as reactions
from ._simulate import (
    RESULT_NONFINITE as RESULT_NONFINITE,
)
from ._simulate import (
    RESULT_OK as RESULT_OK,
)
from ._simulate import (
    RESULT_SOLVER_FAILED as RESULT_SOLVER_FAILED,
)
from ._simulate import (
    Trajectory as Trajectory,
)
from ._simulate import (
    rollout as rollout,
)
from ._state import State as State
from ._state import make_state as make_state


def step(model: Model, state: State, dt, integrator: AbstractIntegrator | None = None) -> State:
    """One pure step ``(model, state, dt) -> state`` with ``integrator`` (default RK4)."""
    integrator = RK4() if integrator is None else integrator
    if not isinstance(integrator, AbstractIntegrator):
        raise ValueError(
            f"integrator = {integrator!r} is not an rbjax integrator. Fix: use RK4(), SemiImplicitEuler() or ImplicitMidpoint()."
        )
    return integrator.step(model, state, dt)


__version__ = "0.1.0"
