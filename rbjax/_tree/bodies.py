"""Bodies of a tree in joint coordinates: their world poses, centres of mass and velocities.

The quantities MuJoCo computes in ``mj_kinematics``/``mj_comPos`` and ``mj_objectVelocity``,
from one forward-kinematics pass (rbjax/_tree/kinematics.py ``frames``), for all bodies and
batch members at once. Arrays are component-first (a vector (3, nb, *batch)); the
``natural_*`` wrappers take and return the natural layout (batch leading, components last).

* pose: body frame's origin x_i (MuJoCo ``xpos``) and attitude R_i as a unit quaternion
  (``xquat``; scalar first, sign chosen with a₀ ≥ 0: q and −q are the same rotation);
* centre of mass c_i = x_i + R_i c̄_i (``xipos``; c̄_i the centre of mass in body axes);
* velocity: the spatial velocity of body i about its tree's reference point O is the sum of
  its DOFs' motions, V_i = Σ_{d ⪯ i} S_d q̇_d = (ω_i, v_O,i) (Featherstone 2008, eq. (3.33);
  S_d in rbjax/_tree/kinematics.py), and the velocity of the centre of mass is that of the
  body point at c_i: v_i = v_O,i + ω_i × (c_i − O) (Featherstone 2008, eq. (2.21)). Both in
  world axes: MuJoCo's ``mj_objectVelocity(m, d, mjOBJ_BODY, i, res, 0)`` = (ω_i, v_i).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .. import _quaternion as quat
from .._engine.kernels import cross
from .dynamics import masked_sum
from .kinematics import Frames, frames, matvec, motion_subspace


def com_from(model, f: Frames) -> Float[Array, "3 nb *batch"]:
    """c_i = x_i + R_i c̄_i of every body from a forward-kinematics pass ``f``."""
    tail = f.p.shape[2:]
    com = model.com.T[(slice(None),) * 2 + (None,) * len(tail)]
    return f.p + matvec(f.R, jnp.broadcast_to(com, f.p.shape))


def velocities_from(model, f: Frames, com, qvel) -> tuple[Array, Array]:
    """(v (3, nb, *batch), ω (3, nb, *batch)): world velocity of each centre of mass ``com``
    and world angular velocity (module docstring), from a pass ``f`` and qvel (nv, *batch)."""
    topo = model.topology
    Sq = motion_subspace(topo, f) * qvel[None]
    V = masked_sum(Sq, topo.body_dofs)  # (6, nb, *batch): (ω, v_O) of each body
    w, v_origin = V[:3], V[3:]
    return v_origin + cross(w, com - f.origin), w


def body_poses(model, q: Float[Array, " nq *batch"]) -> tuple[Array, Array]:
    """(xpos (3, nb, *batch), xquat (4, nb, *batch)): each body frame's world origin and
    attitude (unit, scalar first, a₀ ≥ 0), MuJoCo's ``data.xpos``/``data.xquat``."""
    f = frames(model.topology, model, q)
    R = jnp.moveaxis(f.R, (0, 1), (-2, -1))  # (nb, *batch, 3, 3)
    return f.p, jnp.moveaxis(quat.from_matrix(R), -1, 0)


def body_com(model, q: Float[Array, " nq *batch"]) -> Float[Array, "3 nb *batch"]:
    """World centre of mass of every body, MuJoCo's ``data.xipos``."""
    return com_from(model, frames(model.topology, model, q))


def body_velocities(
    model, q: Float[Array, " nq *batch"], u: Float[Array, " nv *batch"]
) -> tuple[Array, Array]:
    """(v (3, nb, *batch), ω (3, nb, *batch)): world velocity of every body's centre of mass
    and world angular velocity (module docstring)."""
    f = frames(model.topology, model, q)
    return velocities_from(model, f, com_from(model, f), u)


def natural_body_kinematics(model, qpos: Float[Array, " nq"]):
    """(xpos (nb, 3), R (nb, 3, 3), com (nb, 3), velocity, point_jacobian) of ONE system from
    one forward-kinematics pass, with velocity(qvel (nv,)) -> (v, ω) (nb, 3), linear in qvel:
    what :func:`natural_body_poses`, :func:`natural_body_com` and
    :func:`natural_body_velocities` give, with the attitude as a rotation matrix (a contact's
    geometry needs the matrix; three passes and a matrix-quaternion-matrix round trip were
    a third of a contact step's program, measured).

    point_jacobian(body (k,) static, points (k, 3)) -> J (k, 3, nv): the velocity of world
    points fixed to the bodies ``body`` (nb: the world, J = 0) is J q̇, in closed form: column
    d of body i is [d ⪯ i] (S_d^v + S_d^ω × (p − O)) (module docstring; the forward-mode
    Jacobian of ``velocity`` pushed nv tangents through it: 21 of a quadruped's 85 µs contact
    step at B = 64, measured)."""
    topo = model.topology
    f = frames(topo, model, _first(qpos))
    com = com_from(model, f)

    def velocity(qvel):
        v, w = velocities_from(model, f, com, _first(qvel))
        return _natural(v), _natural(w)

    def point_jacobian(body, points):
        body = np.asarray(body, int)
        mask = np.concatenate([topo.body_dofs, np.zeros((1, topo.nv), bool)])[body]
        origin = jnp.concatenate([f.origin, jnp.zeros((3, 1), f.origin.dtype)], axis=1)
        S = motion_subspace(topo, f)  # (6, nv)
        arm = points - origin[:, body].T  # (k, 3)
        J = S[3:].T[None] + jnp.cross(S[:3].T[None], arm[:, None, :])  # (k, nv, 3)
        return jnp.swapaxes(jnp.where(mask[:, :, None], J, 0.0), 1, 2)

    return (
        _natural(f.p),
        jnp.moveaxis(f.R, (0, 1), (-2, -1)),
        _natural(com),
        velocity,
        point_jacobian,
    )


def _first(x):
    return jnp.moveaxis(jnp.asarray(x), -1, 0)


def _natural(x):
    """(c, nb, *batch) -> (*batch, nb, c)."""
    return jnp.moveaxis(jnp.moveaxis(x, 0, -1), 0, -2)


def natural_body_poses(
    model, qpos: Float[Array, "*batch nq"]
) -> tuple[Float[Array, "*batch nb 3"], Float[Array, "*batch nb 4"]]:
    """:func:`body_poses` of qpos (nq,) or batch-leading (..., nq): ((..., nb, 3), (..., nb, 4))."""
    x, r = body_poses(model, _first(qpos))
    return _natural(x), _natural(r)


def natural_body_com(model, qpos: Float[Array, "*batch nq"]) -> Float[Array, "*batch nb 3"]:
    """:func:`body_com` of qpos (nq,) or batch-leading (..., nq): (..., nb, 3)."""
    return _natural(body_com(model, _first(qpos)))


def natural_body_velocities(
    model, qpos: Float[Array, "*batch nq"], qvel: Float[Array, "*batch nv"]
) -> tuple[Float[Array, "*batch nb 3"], Float[Array, "*batch nb 3"]]:
    """:func:`body_velocities` in the natural layout: ((..., nb, 3) centre-of-mass velocity,
    (..., nb, 3) angular velocity), both world axes."""
    v, w = body_velocities(model, _first(qpos), _first(qvel))
    return _natural(v), _natural(w)


def momenta(
    model, q: Float[Array, " nq *batch"], u: Float[Array, " nv *batch"]
) -> tuple[Array, Array]:
    """(p (3, *batch), L (3, *batch)): the linear momentum Σ m_i v_i [kg m/s] and the angular
    momentum about the world origin Σ m_i c_i × v_i + R_i Θ_i R_iᵀ ω_i [kg m²/s] of the bodies,
    world axes (Featherstone 2008, eq. (2.62): h = (c × m v + I_c ω, m v) about the origin).

    The bodies' momenta only, which a free-floating tree conserves without external forces
    (Noether: T is invariant under rigid motions of the whole tree). Armature, an inertia on a
    joint coordinate (MuJoCo's), does not change that on the joints inside the tree, whose
    coordinates a rigid motion leaves alone; on a free joint's own DOFs it adds a term
    a ⊙ q̇ the bodies do not carry, and then p and L are not conserved."""
    f = frames(model.topology, model, q)
    com = com_from(model, f)
    v, w = velocities_from(model, f, com, u)
    tail = u.shape[1:]
    m = model.mass.reshape((-1,) + (1,) * len(tail))
    theta = jnp.moveaxis(model.inertia, 0, -1)[(slice(None),) * 3 + (None,) * len(tail)]
    Rt = jnp.swapaxes(f.R, 0, 1)
    spin = matvec(f.R, matvec(jnp.broadcast_to(theta, f.R.shape), matvec(Rt, w)))
    mv = m * v
    return jnp.sum(mv, axis=1), jnp.sum(cross(com, mv) + spin, axis=1)
