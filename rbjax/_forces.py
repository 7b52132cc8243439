"""Applied forces as resultants (F, S_C, M_C) per body (seed 000, eqs. (75)-(76)).

Every force reduces to three resultants for each body i:

* ``F``   -- resultant force, world frame [N];
* ``S_C`` -- resultant scaling force S_C = ∫ ϱᵀ Rᵀ dF (scalar) [N m];
* ``M_C`` -- resultant moment about the centre of mass, body frame, M_C = ∫ ϱ̃ Rᵀ dF [N m].

They enter the equations of motion in generalized velocities directly (seed 000, eq. (92)).
All forces are differentiable in their parameters. Concrete forces are final classes; write a
new force by subclassing :class:`AbstractForce` or, most simply, with :class:`ForceFunction`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from . import _cf as cf
from ._errors import check_finite, check_shape
from ._state import State


class Resultants(eqx.Module):
    """Per-body resultants in component-first layout: F (3, ..., nb), S (..., nb), M (3, ..., nb)."""

    F: Array
    S: Array
    M: Array

    def __add__(self, other: Resultants) -> Resultants:
        return Resultants(self.F + other.F, self.S + other.S, self.M + other.M)


class AbstractForce(eqx.Module):
    """Interface: ``resultants(model, t, q, u)`` with component-first q, u of shape (7, ..., nb)."""

    @abc.abstractmethod
    def resultants(self, model, t, q, u) -> Resultants:
        """Per-body resultants (F, S_C, M_C) of this force at (t, q, u), component-first."""


def _onehot(body: int, nb: int, dtype):
    return jnp.zeros((nb,), dtype).at[body].set(1.0)


class PointForce(AbstractForce):
    """A constant world-frame force acting at a material point of one body (seed 000, eq. (75)).

    ``point_body`` is ϱ, the point in body axes relative to the centre of mass in the reference
    configuration. For a rigid body the moment is M_C = ϱ x (Rᵀ f); for a scalable body the
    same point also feels the scaling force S_C = ϱᵀ Rᵀ f.
    """

    body: int = eqx.field(static=True)
    point_body: Float[Array, "3"]
    force_world: Float[Array, "3"]

    def __init__(self, body: int, point_body, force_world):
        check_shape("PointForce.point_body", point_body, (3,))
        check_shape("PointForce.force_world", force_world, (3,))
        check_finite("PointForce.point_body", point_body, "give a finite point in metres")
        check_finite("PointForce.force_world", force_world, "give a finite force in newtons")
        self.body = int(body)
        self.point_body = jnp.asarray(point_body)
        self.force_world = jnp.asarray(force_world)

    def resultants(self, model, t, q, u):
        mask = _onehot(self.body, model.nb, q.dtype)
        f = cf.system_vector(self.force_world, q)
        rho = cf.system_vector(self.point_body, q)
        f_body = cf.rotate_t(q[3:7], f)
        return Resultants(
            F=f * mask + jnp.zeros_like(q[0:3]),
            S=cf.dot3(rho, f_body) * mask,
            M=cf.cross(rho, f_body) * mask,
        )


class BodyTorque(AbstractForce):
    """A constant torque given in the body frame, acting on one body [N m]."""

    body: int = eqx.field(static=True)
    torque_body: Float[Array, "3"]

    def __init__(self, body: int, torque_body):
        check_shape("BodyTorque.torque_body", torque_body, (3,))
        check_finite("BodyTorque.torque_body", torque_body, "give a finite torque in N m")
        self.body = int(body)
        self.torque_body = jnp.asarray(torque_body)

    def resultants(self, model, t, q, u):
        mask = _onehot(self.body, model.nb, q.dtype)
        tau = cf.system_vector(self.torque_body, q)
        zero3 = jnp.zeros_like(q[0:3])
        return Resultants(F=zero3, S=jnp.zeros_like(q[0]), M=tau * mask + zero3)


class ForceFunction(AbstractForce):
    """A user force law ``fn(t, state, params) -> (F, S_C, M_C)``.

    ``fn`` sees ONE system: ``state`` is an :class:`rbjax.State` with ``q``, ``u`` of shape
    (nb, 7); it returns F (nb, 3) world frame, S_C (nb,) and M_C (nb, 3) body frame. ``params``
    is any pytree; its array leaves are differentiable. Batched rollouts apply ``jax.vmap``.
    Pass ``S_C = 0`` for a rigid body unless you model a scaling load.
    """

    fn: Callable[..., Any] = eqx.field(static=True)
    params: Any

    def __init__(self, fn: Callable[..., Any], params: Any = None):
        if not callable(fn):
            raise ValueError(f"ForceFunction.fn = {fn!r} is not callable. Fix: pass a function.")
        self.fn = fn
        self.params = params

    def resultants(self, model, t, q, u):
        batch_shape = q.shape[1:-1]

        def one(t1, q1, u1):
            st = State(t=t1, q=q1.T, u=u1.T)
            F, S, M = self.fn(t1, st, self.params)
            return jnp.asarray(F).T, jnp.asarray(S), jnp.asarray(M).T

        fn = one
        t_b = jnp.broadcast_to(t[..., 0], batch_shape)
        for _ in batch_shape:
            fn = jax.vmap(fn, in_axes=(0, 1, 1), out_axes=(1, 0, 1))
        F, S, M = fn(t_b, q, u)
        return Resultants(F=F.astype(q.dtype), S=S.astype(q.dtype), M=M.astype(q.dtype))


def total_resultants(model, t, q, u) -> Resultants:
    """Sum of gravity (F = m g at the centre of mass: S_C = 0, M_C = 0) and all model forces."""
    g = cf.system_vector(model.gravity, q)
    zero3 = jnp.zeros_like(q[0:3])
    total = Resultants(F=model.mass * g + zero3, S=jnp.zeros_like(q[0]), M=zero3)
    for force in model.forces:
        total = total + force.resultants(model, t, q, u)
    return total
