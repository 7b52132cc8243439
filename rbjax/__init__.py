"""rbjax: a JAX-accelerated, differentiable rigid-body and multibody engine built on
Möller & Glocker's scalable body.

One explicit public surface; the implementation lives in private modules. Quaternion algebra:
:mod:`rbjax.quaternion`; low-level names: :mod:`rbjax.advanced`.
"""

import importlib.metadata as _metadata

from . import advanced as advanced, quaternion as quaternion
from ._abstract import (
    AbstractModel as AbstractModel,
    AbstractState as AbstractState,
    AbstractTrajectory as AbstractTrajectory,
)
from ._actuators import (
    Actuator as Actuator,
    ControlSequence as ControlSequence,
    JointActuators as JointActuators,
)
from ._analysis.assembly import assemble as assemble
from ._analysis.change_points import (
    ChangePoints as ChangePoints,
    SingularConfigurationWarning as SingularConfigurationWarning,
    change_points as change_points,
)
from ._analysis.gradients import (
    GradientHealth as GradientHealth,
    gradient_health as gradient_health,
)
from ._analysis.invariants import (
    angular_momentum as angular_momentum,
    energy_balance as energy_balance,
    kinetic_energy as kinetic_energy,
    linear_momentum as linear_momentum,
    potential_energy as potential_energy,
    total_energy as total_energy,
)
from ._analysis.joint_space import (
    JointForces as JointForces,
    JointSpace as JointSpace,
    joint_coordinates as joint_coordinates,
    state_from_joint_coordinates as state_from_joint_coordinates,
)
from ._analysis.kinematics import (
    KinematicResult as KinematicResult,
    kinematic_analysis as kinematic_analysis,
)
from ._analysis.mobility import Mobility as Mobility, mobility as mobility
from ._analysis.nonfinite import (
    NonfiniteGradient as NonfiniteGradient,
    NonfiniteGradientError as NonfiniteGradientError,
    nonfinite_gradient as nonfinite_gradient,
)
from ._body import Body as Body
from ._cache import compilation_cache as compilation_cache
from ._constraints import GROUND as GROUND, AbstractConstraint as AbstractConstraint
from ._contact.shapes import (
    Box as Box,
    Capsule as Capsule,
    Contacts as Contacts,
    Plane as Plane,
    Sphere as Sphere,
)
from ._contact.stepping import MoreauJean as MoreauJean
from ._dynamics import (
    AbstractFormulation as AbstractFormulation,
    NewtonEuler as NewtonEuler,
    ScalableDAE as ScalableDAE,
    UdwadiaSchutte as UdwadiaSchutte,
    accelerations as accelerations,
)
from ._forces import (
    AbstractForce as AbstractForce,
    BodyTorque as BodyTorque,
    ForceFunction as ForceFunction,
    PointForce as PointForce,
    Wrench as Wrench,
)
from ._identify import (
    IMU as IMU,
    LBFGS as LBFGS,
    AbstractObservation as AbstractObservation,
    Accelerometer as Accelerometer,
    AngularVelocity as AngularVelocity,
    Custom as Custom,
    Gyro as Gyro,
    IdentificationResult as IdentificationResult,
    JointEncoder as JointEncoder,
    LevenbergMarquardt as LevenbergMarquardt,
    Measurements as Measurements,
    Orientation as Orientation,
    Position as Position,
    Quantities as Quantities,
    ReactionForce as ReactionForce,
    Shooting as Shooting,
    Velocity as Velocity,
    identify as identify,
    residuals as residuals,
)
from ._integrators import (
    RK4 as RK4,
    AbstractIntegrator as AbstractIntegrator,
    ImplicitMidpoint as ImplicitMidpoint,
    Projected as Projected,
    SemiImplicitEuler as SemiImplicitEuler,
)
from ._io.expressions import Expression as Expression
from ._io.load import Loaded as Loaded, load as load, save as save
from ._joints import (
    CustomConstraint as CustomConstraint,
    Cylindrical as Cylindrical,
    Distance as Distance,
    Fixed as Fixed,
    Parallel as Parallel,
    Perpendicular as Perpendicular,
    PointOnLine as PointOnLine,
    Revolute as Revolute,
    RotationDriver as RotationDriver,
    Spherical as Spherical,
    Translational as Translational,
    TranslationDriver as TranslationDriver,
    Universal as Universal,
)
from ._measures import (
    AbstractMeasure as AbstractMeasure,
    Drift as Drift,
    Event as Event,
    Final as Final,
    Maximum as Maximum,
    Mean as Mean,
    Minimum as Minimum,
)
from ._model import Model as Model
from ._monitors import Plausibility as Plausibility
from ._montecarlo.devices import use_cpu_cores as use_cpu_cores
from ._montecarlo.runner import (
    MonteCarloResult as MonteCarloResult,
    Progress as Progress,
    monte_carlo as monte_carlo,
)
from ._montecarlo.statistics import Statistics as Statistics
from ._params import (
    Bounded as Bounded,
    LogCholeskyInertia as LogCholeskyInertia,
    Positive as Positive,
    PrincipalInertia as PrincipalInertia,
)
from ._reactions import (
    JointReactions as JointReactions,
    Reactions as Reactions,
    reactions as reactions,
    weld_reactions as weld_reactions,
)
from ._results import RESULTS as RESULTS
from ._rollout import Checkpoint as Checkpoint, Trajectory as Trajectory, rollout as rollout
from ._springs import (
    AxialSpringDamper as AxialSpringDamper,
    RotationalSpringDamper as RotationalSpringDamper,
    TranslationalSpringDamper as TranslationalSpringDamper,
)
from ._state import State as State, make_state as make_state
from ._step import step as step
from ._tree.equality import (
    Connect as Connect,
    JointCoupling as JointCoupling,
    Weld as Weld,
)
from ._tree.implicit import ImplicitFast as ImplicitFast
from ._tree.model import (
    JointCoordinates as JointCoordinates,
    JointModel as JointModel,
    JointState as JointState,
)
from ._tree.rollout import JointTrajectory as JointTrajectory

try:
    __version__ = _metadata.version("rbjax")
except _metadata.PackageNotFoundError:  # pragma: no cover - a source tree, not installed
    __version__ = "0+unknown"
