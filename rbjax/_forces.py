"""Applied forces as a wrench per body: (F, S_C, M_C) (Möller & Glocker 2012, eqs. (75)-(76)).

Every force reduces to three resultants for each body i, a :class:`Wrench`:

* ``force_world`` F -- resultant force, world frame [N];
* ``scaling`` S_C -- resultant scaling force S_C = ∫ ϱᵀ Rᵀ dF (scalar) [N m];
* ``moment_body`` M_C -- resultant moment about the centre of mass, body frame,
  M_C = ∫ ϱ̃ Rᵀ dF [N m].

They enter the equations of motion in generalized velocities directly (Möller & Glocker 2012, eq. (92)).
All forces are differentiable in their parameters. Concrete forces are final classes; write a
new force by subclassing :class:`AbstractForce` or, most simply, with :class:`ForceFunction`.

Forces between two bodies (the spring–dampers) are in rbjax/_springs.py.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float

from . import _quaternion as quat
from ._engine import forces as kernels
from ._errors import check_finite, check_shape, fail, validates_inputs
from ._state import State


class Wrench(eqx.Module):
    """The resultants of a force on every body of ONE system (Möller & Glocker 2012, eq. (75)):
    ``force_world`` (nb, 3) [N], ``scaling`` S_C (nb,) [N m], ``moment_body`` M_C (nb, 3) [N m]
    about each centre of mass in body axes. :meth:`zeros` and :meth:`add_point_force` /
    :meth:`add` build one body at a time."""

    force_world: Float[Array, "*batch nb 3"]
    scaling: Float[Array, "*batch nb"]
    moment_body: Float[Array, "*batch nb 3"]

    @classmethod
    def zeros(cls, nb: int, dtype=None) -> Wrench:
        """No force on any of ``nb`` bodies."""
        dtype = jnp.result_type(float) if dtype is None else dtype
        return cls(jnp.zeros((nb, 3), dtype), jnp.zeros((nb,), dtype), jnp.zeros((nb, 3), dtype))

    def add(self, body: int, *, force_world=None, scaling=None, moment_body=None) -> Wrench:
        """This wrench plus the given resultants on ``body``."""
        f, s, m = self.force_world, self.scaling, self.moment_body
        if force_world is not None:
            f = f.at[body].add(jnp.asarray(force_world, f.dtype))
        if scaling is not None:
            s = s.at[body].add(jnp.asarray(scaling, s.dtype))
        if moment_body is not None:
            m = m.at[body].add(jnp.asarray(moment_body, m.dtype))
        return Wrench(f, s, m)

    def add_point_force(self, body: int, attitude, point_body, force_world) -> Wrench:
        """Add the world force f acting at the material point ϱ (body axes, from the centre of
        mass) of ``body`` with quaternion ``attitude`` (Möller & Glocker 2012, eq. (75)):
        F = f,  S_C = ϱᵀ Rᵀ f,  M_C = ϱ × Rᵀ f."""
        force_body = quat.rotate_inverse(attitude, force_world)
        return self.add(
            body,
            force_world=force_world,
            scaling=jnp.dot(point_body, force_body),
            moment_body=jnp.cross(point_body, force_body),
        )

    def add_couple(self, body: int, attitude, torque_world) -> Wrench:
        """Add a pure couple τ (world frame) on ``body``: F = 0, S_C = 0, M_C = Rᵀ τ / s, with
        s = |A|² (1 for a rigid body); the 1/s makes M_C conjugate to ω, the body angular
        velocity scaled by s (Möller & Glocker 2012, eq. (49))."""
        moment_body = quat.rotate_inverse(attitude, torque_world) / quat.norm2(attitude)
        return self.add(body, moment_body=moment_body)

    def __add__(self, other: Wrench) -> Wrench:
        return Wrench(
            self.force_world + other.force_world,
            self.scaling + other.scaling,
            self.moment_body + other.moment_body,
        )


class AbstractForce(eqx.Module):
    """An applied force. To write one, subclass this and implement :meth:`wrench` for ONE
    system in the natural layout; :meth:`bodies` names the bodies it acts on (checked by
    :class:`rbjax.Model`). Rollouts evaluate it over batches with ``jax.vmap``. Concrete forces
    are final; the built-ins replace that adapter by the engine's batched kernels (a private
    fast path, ``_engine_resultants``, rbjax/_engine/forces.py)."""

    @abc.abstractmethod
    def wrench(self, model, t, state: State) -> Wrench:
        """The force's :class:`Wrench` on every body at time ``t`` (scalar) and ``state``
        (``state.q``, ``state.u`` of shape (nb, 7))."""

    def bodies(self) -> tuple[int, ...]:
        """The static indices of the bodies this force acts on (GROUND = −1 allowed for a
        side of a two-body force); () when it may act on any body."""
        return ()

    def _engine_resultants(self, model, t, q, u) -> kernels.Resultants:
        """The engine's resultants on its arrays. Default: :meth:`wrench` per system."""
        return kernels.resultants_per_system(self, model, t, q, u)

    def _engine_potential(self, model, t, q) -> Array | None:
        """The potential energy V [J] of the force's conservative part, shape (*batch,), on the
        engine's arrays (``t`` (*batch, 1), ``q`` (7, *batch, nb)), such that the resultants of
        that part are the generalized force −∂V/∂q; :func:`rbjax.potential_energy` adds it.
        None (the default) for a force that does not derive from a potential."""
        return None

    def _engine_nonconservative(self, model) -> AbstractForce | None:
        """The part of the force that :meth:`_engine_potential` does not account for, as a
        force, on the motions ``model`` allows: the power of its resultants is what the
        work–energy monitor integrates (rbjax/_engine/forces.py :func:`power`). None where
        the potential is not exact there (its force is not −∂V/∂q): the monitor then
        integrates the whole force's power plus dV/dt. Default: all of it."""
        return self

    def _engine_energy_scale(self, model, t, q) -> Array | None:
        """The magnitude of the terms :meth:`_engine_potential` is computed from, shape
        (*batch,) [J] (a spring's ½ k (x² + x0²) where V = ½ k (x − x0)²): the energy
        monitor's rounding floor (rbjax/_engine/monitors.py). Default: |V|, None without V."""
        v = self._engine_potential(model, t, q)
        return None if v is None else jnp.abs(v)

    def _energy_balance(self, model) -> str | None:
        """Static, from the structure of ``model`` and concrete values only: "conservative"
        when the force is exactly the gradient of :meth:`_engine_potential` on every motion
        the model allows, "dissipative" when it is that plus a damping force whose power is
        never positive, None otherwise (the default: the force may do any work). Read by
        :func:`rbjax.energy_balance`."""
        return None


def _frame(name: str, frame, default: str, meaning: dict[str, str]) -> str:
    """Validate the static ``frame`` option of a one-body force: "body" or "world"."""
    if not isinstance(frame, str) or frame not in meaning:
        fail(
            f"{name}.frame",
            frame,
            "is not a frame",
            " or ".join(f'frame="{k}" ({v})' for k, v in meaning.items())
            + f'; the default is "{default}"',
        )
    return frame


@validates_inputs
class PointForce(AbstractForce):
    """A constant force acting at a material point of one body (Möller & Glocker 2012, eq. (75)).

    ``point_body`` is ϱ, the point in body axes relative to the centre of mass in the reference
    configuration. ``force_world`` holds the force's components in the frame named by the
    static ``frame``:

    * ``frame="world"`` (default): f is fixed in the world frame, F = f;
    * ``frame="body"``: f̄ is fixed in the body frame and turns with the body (a thruster),
      F = R f̄ (the pure rotation R of A: the magnitude |f̄| stays the same on a scalable body).

    With the force in body axes f̄ = Rᵀ F the resultants are (eq. (75))

        F,    S_C = ϱᵀ f̄,    M_C = ϱ × f̄,

    so a rigid body feels the moment M_C = ϱ × f̄ about its centre of mass and a scalable body
    also the scaling force S_C. The field keeps its name ``force_world`` for every frame (the
    parameter path ``forces[k].force_world`` and model files stay as they were).
    """

    body: int = eqx.field(static=True)
    point_body: Float[Array, "3"]
    force_world: Float[Array, "3"]
    frame: str = eqx.field(static=True)

    def __init__(self, body: int, point_body, force_world, *, frame: str = "world"):
        check_shape("PointForce.point_body", point_body, (3,))
        check_shape("PointForce.force_world", force_world, (3,))
        check_finite("PointForce.point_body", point_body, "give a finite point in metres")
        check_finite("PointForce.force_world", force_world, "give a finite force in newtons")
        self.body = int(body)
        self.point_body = jnp.asarray(point_body)
        self.force_world = jnp.asarray(force_world)
        self.frame = _frame(
            "PointForce",
            frame,
            "world",
            {"world": "the force is fixed in the world", "body": "it turns with the body"},
        )

    def bodies(self) -> tuple[int, ...]:
        return (self.body,)

    def wrench(self, model, t, state: State) -> Wrench:
        dtype = state.q.dtype
        attitude = state.q[self.body, 3:7]
        f = self.force_world.astype(dtype)
        if self.frame == "body":
            f = quat.rotate(attitude, f)  # F = R f̄
        return Wrench.zeros(model.nb, dtype).add_point_force(
            self.body, attitude, self.point_body.astype(dtype), f
        )

    _engine_kernel = staticmethod(kernels.point_force)  # several evaluated together
    _body_fields = ("body",)

    def _engine_resultants(self, model, t, q, u):
        return kernels.point_force(self, model, t, q, u)


@validates_inputs
class BodyTorque(AbstractForce):
    """A constant torque on one body [N m], given in the body frame or in the world frame.

    ``torque_body`` holds the torque's components in the frame named by the static ``frame``:

    * ``frame="body"`` (default): τ̄ is fixed in the body frame and turns with the body; it is
      the body-frame moment resultant itself, M_C = τ̄ (Möller & Glocker 2012, eq. (75)).
    * ``frame="world"``: τ is fixed in the world frame (a couple whose moment keeps its world
      direction), M_C = Rᵀ τ / s with s = |A|² (1 for a rigid body); the 1/s makes M_C
      conjugate to ω̄, the body angular velocity scaled by s, so the power is τᵀ ω_world
      (Möller & Glocker 2012, eq. (49); the same couple as :meth:`Wrench.add_couple`).

    F = 0 and S_C = 0 in both frames. On a rigid body the two agree when τ = R τ̄; on a
    scalable body the body-frame torque is the material moment (its world moment is s R τ̄).
    The field keeps its name ``torque_body`` for every frame (the parameter path
    ``forces[k].torque_body`` and model files stay as they were).
    """

    body: int = eqx.field(static=True)
    torque_body: Float[Array, "3"]
    frame: str = eqx.field(static=True)

    def __init__(self, body: int, torque_body, *, frame: str = "body"):
        check_shape("BodyTorque.torque_body", torque_body, (3,))
        check_finite("BodyTorque.torque_body", torque_body, "give a finite torque in N m")
        self.body = int(body)
        self.torque_body = jnp.asarray(torque_body)
        self.frame = _frame(
            "BodyTorque",
            frame,
            "body",
            {"body": "the torque turns with the body", "world": "it is fixed in the world"},
        )

    def bodies(self) -> tuple[int, ...]:
        return (self.body,)

    def wrench(self, model, t, state: State) -> Wrench:
        dtype = state.q.dtype
        out = Wrench.zeros(model.nb, dtype)
        tau = self.torque_body.astype(dtype)
        if self.frame == "world":
            return out.add_couple(self.body, state.q[self.body, 3:7], tau)
        return out.add(self.body, moment_body=tau)

    _engine_kernel = staticmethod(kernels.body_torque)  # several evaluated together
    _body_fields = ("body",)

    def _engine_resultants(self, model, t, q, u):
        return kernels.body_torque(self, model, t, q, u)


@validates_inputs
class ForceFunction(AbstractForce):
    """A user force law ``fn(t, state, params) -> (F, S_C, M_C)``.

    ``fn`` sees ONE system: ``state`` is an :class:`rbjax.State` with ``q``, ``u`` of shape
    (nb, 7); it returns a :class:`Wrench` or the tuple (F (nb, 3) world frame, S_C (nb,),
    M_C (nb, 3) body frame). ``params``
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

    def wrench(self, model, t, state: State) -> Wrench:
        out = self.fn(t, state, self.params)
        if isinstance(out, Wrench):
            return out
        force_world, scaling, moment_body = out
        return Wrench(jnp.asarray(force_world), jnp.asarray(scaling), jnp.asarray(moment_body))
