"""Public quaternion algebra of rbjax (seed 000, Sects. 2-3; seed 004 E/G/A/B matrices).

Quaternions are ``(..., 4)`` arrays, scalar first ``(a0, a1, a2, a3)``; every function is pure
and works under ``jit``, ``vmap``, ``grad`` and ``jvp``. See :mod:`rbjax._quaternion` for the
conventions (phi vs phi_right, the exp/log branch, A(p) = s R for non-unit p).
"""

from ._quaternion import T_MATRIX as T_MATRIX
from ._quaternion import A_matrix as A_matrix
from ._quaternion import B as B
from ._quaternion import E as E
from ._quaternion import G as G
from ._quaternion import conjugate as conjugate
from ._quaternion import exp as exp
from ._quaternion import from_axis_angle as from_axis_angle
from ._quaternion import from_matrix as from_matrix
from ._quaternion import identity as identity
from ._quaternion import inverse as inverse
from ._quaternion import log as log
from ._quaternion import mul as mul
from ._quaternion import norm as norm
from ._quaternion import norm2 as norm2
from ._quaternion import phi as phi
from ._quaternion import phi_right as phi_right
from ._quaternion import psi as psi
from ._quaternion import rotate as rotate
from ._quaternion import rotate_inverse as rotate_inverse
from ._quaternion import rotation_and_scale as rotation_and_scale
from ._quaternion import rotation_matrix as rotation_matrix
from ._quaternion import scale as scale
from ._quaternion import skew as skew
from ._quaternion import slerp as slerp
from ._quaternion import to_axis_angle as to_axis_angle
from ._quaternion import to_matrix as to_matrix
from ._quaternion import transform as transform

__all__ = [
    "T_MATRIX",
    "A_matrix",
    "B",
    "E",
    "G",
    "conjugate",
    "exp",
    "from_axis_angle",
    "from_matrix",
    "identity",
    "inverse",
    "log",
    "mul",
    "norm",
    "norm2",
    "phi",
    "phi_right",
    "psi",
    "rotate",
    "rotate_inverse",
    "rotation_and_scale",
    "rotation_matrix",
    "scale",
    "skew",
    "slerp",
    "to_axis_angle",
    "to_matrix",
    "transform",
]
