"""Equations of motion: one body or nb bodies, three formulation classes covering the four
formulations of the core issue (the free scalable body is ScalableDAE with scalable bodies).

Every formulation maps (model, t, q, u) to (q̇, u̇, λ) in the one state convention
(rbjax/_state.py), so integrators and rollouts never know which one they run:

=====================  ==========================================  ===============================
formulation            equations                                   λ returned
=====================  ==========================================  ===============================
ScalableDAE, scalable  Möller & Glocker 2012 eq. (93) with λ = 0, no constraint 0 (7-DOF scalable body)
ScalableDAE, rigid     eq. (93) + perfect constraint |A|² = 1      scaling force, = eq. (96)
                       (eqs. (77)-(82)); W = e_ν, γ = 0 (checked
                       against autodiff of c)
NewtonEuler            eq. (95): Θω̇ + ω̃Θω = M_C, Ȧ = ½A(0,ω)      eq. (96) evaluated
UdwadiaSchutte(J0)     Udwadia & Schutte 2010 eqs. (39), (43)-(45): M_u = 4EᵀJE,  quaternion multiplier μ with
                       fundamental equation, Moore–Penrose inverse  Q_c = 2pμ (depends on J0)
=====================  ==========================================  ===============================

The equations are evaluated by the engine's kernels (rbjax/_engine/dynamics.py).
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from . import _quaternion as quat
from ._engine import dynamics as dyn, kernels as cf
from ._engine.forces import total_resultants
from ._engine.layout import inertia_components, per_system, to_components
from ._engine.mass import blocks as mass_blocks
from ._errors import Rule, enforce, validates_inputs
from ._state import State
from ._tree.model import maximal_only

if TYPE_CHECKING:  # rbjax/_model.py imports this module
    from ._model import Model

# ------------------------------------------------------------------------ formulations


class AbstractFormulation(eqx.Module):
    """How the equations of motion are written. Concrete formulations are final.

    To write one, subclass this and implement, in the natural layout:

    * :meth:`kinematics` ``(q, u) -> q̇`` for one body, q, u (7,): the map q̇ = Q⁻¹(q) u
      between generalized velocities and coordinate rates (Möller & Glocker 2012 eq. (85));
    * :meth:`derivatives` ``(model, t, state) -> (q̇, u̇, λ)`` for ONE system, state.q, state.u
      (nb, 7): the coordinate rates, the accelerations and the multipliers λ (nb + m,).

    Integrators and rollouts evaluate them over batches with ``jax.vmap``. The built-in
    formulations replace those adapters by the engine's batched kernels (private fast paths
    ``_engine_kinematics`` and ``_engine_derivatives``, rbjax/_engine/dynamics.py).
    """

    is_dae: ClassVar[bool] = False

    def check_model(self, model) -> None:  # noqa: B027 - optional hook
        """Raise ValueError at build time if this formulation cannot run ``model``."""

    @abc.abstractmethod
    def kinematics(self, q, u) -> Array:
        """q̇ of one body (or any leading axes): q, u (..., 7) -> (..., 7)."""

    @abc.abstractmethod
    def derivatives(self, model, t, state: State) -> tuple[Array, Array, Array]:
        """(q̇ (nb, 7), u̇ (nb, 7), λ) of one system (built-ins: any leading batch axes)."""

    def _engine_kinematics(self, q, u):
        """q̇ on the engine's arrays (7, *batch, nb). Default: :meth:`kinematics` per body."""
        qn, un = jnp.moveaxis(q, 0, -1), jnp.moveaxis(u, 0, -1)
        lead = qn.shape[:-1]
        out = jax.vmap(self.kinematics)(qn.reshape(-1, 7), un.reshape(-1, 7))
        return jnp.moveaxis(out.reshape(lead + (7,)), -1, 0)

    def _engine_derivatives(self, model, t, q, u):
        """(q̇, u̇, λ) on the engine's arrays. Default: :meth:`derivatives` per system."""
        qdot, udot, lam = per_system(self.derivatives, model, t, q, u)
        return jnp.moveaxis(qdot, -1, 0), jnp.moveaxis(udot, -1, 0), lam


def _natural_kinematics(formulation, q, u):
    """``kinematics`` of a built-in formulation: its engine kernel on q, u (..., 7)."""
    qdot = formulation._engine_kinematics(jnp.moveaxis(q, -1, 0), jnp.moveaxis(u, -1, 0))
    return jnp.moveaxis(qdot, 0, -1)


def _natural_derivatives(formulation, model, t, state: State):
    """``derivatives`` of a built-in formulation: its engine kernel on the state."""
    t = jnp.broadcast_to(jnp.asarray(t, state.q.dtype), state.q.shape[:-2])
    tc, q, u = to_components(State(t=t, q=state.q, u=state.u))
    qdot, udot, lam = formulation._engine_derivatives(model, tc, q, u)
    return jnp.moveaxis(qdot, 0, -1), jnp.moveaxis(udot, 0, -1), lam


def _rigid_only(name, model):
    bad = [n for n, s in zip(model.names, model.scalable, strict=True) if s]
    if bad:
        raise ValueError(
            f"{name} describes rigid bodies only, but bodies {bad} are declared scalable=True. "
            "Fix: use formulation=ScalableDAE() for scalable bodies."
        )


class ScalableDAE(AbstractFormulation):
    """Möller–Glocker's scalable body in generalized velocities (Möller & Glocker 2012, eq. (93)).

    Each body has 7 velocities u = (v, ν, ω) and the constant regular mass matrix
    M = diag(mI, ½trΘ, Θ) (eq. (64)):

        m v̇ = F,
        ½ trΘ ν̇ − ωᵀΘω / |A|² = S_C + λ,
        Θ ω̇ + (νI + ω̃) Θω / |A|² = M_C,
        ṙ = v,   Ȧ = A (ν, ω) / (2|A|²).

    A scalable body (``Body(scalable=True)``) has λ = 0 and no constraint: the free 7-DOF body,
    which grows when it spins. A rigid body adds the perfect bilateral constraint
    c = |A|² − 1 = 0 (eq. (77)) with generalized force Wᵀλ (eq. (81)), W = c_q Q⁻¹, and
    λ solves the Schur complement (W M⁻¹ Wᵀ) λ = γ − W M⁻¹ (f − h). In u-coordinates W = e_ν
    and γ = 0 exactly (see :meth:`normalisation_jacobian`); :meth:`constraint_jacobian` and
    :meth:`gamma` obtain them by autodiff of c alone (jvp, nested jvp), the route joints take.
    Each constraint involves one body, so W M⁻¹ Wᵀ is diagonal; along any trajectory λ equals
    −ωᵀΘω − S_C (eq. (96)), the physical force that keeps the body from growing.
    """

    is_dae: ClassVar[bool] = True

    def kinematics(self, q, u):
        return _natural_kinematics(self, q, u)

    def derivatives(self, model, t, state):
        return _natural_derivatives(self, model, t, state)

    def _engine_kinematics(self, q, u):
        return dyn.scalable_kinematics(q, u)

    def _engine_derivatives(self, model, t, q, u):
        return dyn.scalable_dae_derivatives(model, t, q, u)


class NewtonEuler(AbstractFormulation):
    """Newton–Euler equations of a rigid body (Möller & Glocker 2012, eq. (95)):

        m v̇ = F,   Θ ω̇ + ω̃ Θ ω = M_C,   ṙ = v,   Ȧ = ½ A (0, ω),

    with ν ≡ 0 (eq. (94)) and the scaling constraint force reported from eq. (96),
    λ = −ωᵀΘω − S_C. |A|² is a first integral of Ȧ = ½A(0, ω); explicit integrators drift
    from it at their truncation order.
    """

    def check_model(self, model):
        _rigid_only("NewtonEuler", model)

    def kinematics(self, q, u):
        return _natural_kinematics(self, q, u)

    def derivatives(self, model, t, state):
        return _natural_derivatives(self, model, t, state)

    def _engine_kinematics(self, q, u):
        return dyn.newton_euler_kinematics(q, u)

    def _engine_derivatives(self, model, t, q, u):
        return dyn.newton_euler_derivatives(model, t, q, u)


@validates_inputs
class UdwadiaSchutte(AbstractFormulation):
    """Udwadia–Schutte quaternion equations via the fundamental equation (Udwadia & Schutte 2010).

    The rotational coordinates p = A are treated as unconstrained with the positive definite
    M_u = 4EᵀJE, J = diag(J0, Θ) for an ARBITRARY J0 > 0 (Udwadia & Schutte 2010, eqs. (4), (10); Θ may be
    a full inertia, which generalises diag(J1, J2, J3)). The impressed force is
    Q = −8ĖᵀJEṗ − 4J0 N(ṗ) p + 2EᵀΓ_B (eqs. (39), (43)-(44)) and the unit-norm constraint
    pᵀp̈ = −N(ṗ) (eq. (11)) is enforced by the fundamental equation of constrained motion with
    the Moore–Penrose inverse (eqs. (12), (45)):

        p̈ = a + L⁻ᵀ (A_u L⁻ᵀ)⁺ (b_u − A_u a),   a = M_u⁻¹ Q,   M_u = L Lᵀ.

    Seed 001 writes M_u^{1/2}; any factor M_u = L Lᵀ gives the same p̈ (it is the minimiser of
    Gauss's function (p̈ − a)ᵀ M_u (p̈ − a) subject to the constraint, Udwadia & Kalaba 1996),
    and the Cholesky factor stays differentiable where a symmetric square root is not
    (repeated eigenvalues). The result does not depend on J0 (eq. (42)); this is a test.
    ω̇ = 2 G(p) p̈ converts back to the state convention; translation is m v̇ = F.
    """

    J0: float | Float[Array, ""] = 1.0

    # checked at build time and, traced, inside a rollout's program (M_u = 4EᵀJE is positive
    # definite only for J0 > 0)
    _rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            ("J0",),
            lambda xp, j0: j0 > 0,
            "is not > 0",
            "J0 is an arbitrary positive inertia, e.g. 1.0",
        ),
    )

    def __check_init__(self):
        enforce(self, "UdwadiaSchutte")

    def check_model(self, model):
        _rigid_only("UdwadiaSchutte", model)

    def kinematics(self, q, u):
        return _natural_kinematics(self, q, u)

    def derivatives(self, model, t, state):
        return _natural_derivatives(self, model, t, state)

    def _engine_kinematics(self, q, u):
        return dyn.newton_euler_kinematics(q, u)

    def _engine_derivatives(self, model, t, q, u):
        return dyn.udwadia_schutte_derivatives(self.J0, model, t, q, u)


# ------------------------------------------------------------- public natural-layout API


@eqx.filter_jit
@validates_inputs
def accelerations(model: Model, state: State):
    """(u̇, λ) of ``model.formulation`` at ``state``; u̇ has the shape of ``state.u``.

    Compiled as one program on the first call for a model's structure (array leaves traced, so
    new values do not compile again): evaluated eagerly, its few hundred operations would each
    be compiled on their own, which takes seconds even for a pendulum. Inside a caller's
    ``jax.jit`` it is part of the caller's program."""
    maximal_only(model, "rbjax.accelerations")
    t, q, u = to_components(state)
    _, udot, lam = model.formulation._engine_derivatives(model, t, q, u)
    return jnp.moveaxis(udot, 0, -1), lam


def mass_matrix(model):
    """M = diag(mI, ½trΘ, Θ) per body, shape (..., nb, 7, 7) (Möller & Glocker 2012, eq. (64))."""
    return jnp.moveaxis(mass_blocks(model), (0, 1), (-2, -1))


def scaling_force_closed_form(model, state):
    """λ = −ωᵀΘω − S_C (Möller & Glocker 2012, eq. (96)), the scaling constraint force of a rigid body."""
    t, q, u = to_components(state)
    res = total_resultants(model, t, q, u)
    th = inertia_components(model)
    w = u[4:7]
    return -cf.dot3(w, cf.matvec(th, w)) - res.S


def velocity_transform(q):
    """Q(q) of Möller & Glocker 2012 eq. (38), u = Q q̇: blockdiag(I, 2φ(A*)); q (..., 7) -> (..., 7, 7)."""
    out = jnp.zeros(q.shape + (7,), q.dtype)
    out = out.at[..., 0:3, 0:3].set(jnp.eye(3, dtype=q.dtype))
    return out.at[..., 3:7, 3:7].set(2.0 * quat.phi(quat.conjugate(q[..., 3:7])))


def velocity_transform_inverse(q):
    """Q⁻¹(q) of Möller & Glocker 2012 eq. (85): blockdiag(I, φ(A) / (2|A|²))."""
    a = q[..., 3:7]
    out = jnp.zeros(q.shape + (7,), q.dtype)
    out = out.at[..., 0:3, 0:3].set(jnp.eye(3, dtype=q.dtype))
    return out.at[..., 3:7, 3:7].set(quat.phi(a) / (2.0 * quat.norm2(a)[..., None, None]))
