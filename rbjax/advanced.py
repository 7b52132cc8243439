"""Low-level and advanced names: the basic constraints of Negrut ME751 (DP1, DP2, D, CD), explicit
Runge–Kutta methods from a Butcher tableau, constraint Jacobian helpers, closed-form checks, mass-matrix
and velocity-transform matrices, the static model topology and the abstract building blocks of
the built-in families. Everyday use needs only the names in :mod:`rbjax`.
"""

from ._analysis.mobility import jacobian_matrix as jacobian_matrix
from ._constraints import (
    CD as CD,
    DP1 as DP1,
    DP2 as DP2,
    D as D,
    constraint_gamma as constraint_gamma,
    constraint_jacobian as constraint_jacobian,
    constraint_jacobian_pi as constraint_jacobian_pi,
    constraint_residual as constraint_residual,
)
from ._dynamics import (
    mass_matrix as mass_matrix,
    scaling_force_closed_form as scaling_force_closed_form,
    velocity_transform as velocity_transform,
    velocity_transform_inverse as velocity_transform_inverse,
)
from ._integrators import (
    RK4_TABLEAU as RK4_TABLEAU,
    AbstractExplicitRK as AbstractExplicitRK,
    ButcherTableau as ButcherTableau,
    ExplicitRK as ExplicitRK,
)
from ._io.mujoco import JointMap as JointMap, MujocoSource as MujocoSource
from ._joints import AbstractJoint as AbstractJoint
from ._topology import Topology as Topology
from ._welds import (
    CarriedConstraint as CarriedConstraint,
    CarriedForce as CarriedForce,
    Merge as Merge,
)
