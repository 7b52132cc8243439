"""Invariants of the motion: kinetic and potential energy, linear and angular momentum (the
conservation laws the validation tests check), for single systems or batches (a batched
model's axes lead the state's, so ``total_energy(model, traj.states)`` works on a batched
rollout), and
:func:`energy_balance`, which says from the model alone whether the total energy is conserved.

Each takes an :class:`rbjax.Model` with its :class:`rbjax.State`, or an :class:`rbjax.JointModel`
with its :class:`rbjax.JointState` (one system, or batch-leading states such as a
:class:`rbjax.JointTrajectory`'s ``qpos``/``qvel``): the same quantities of the same bodies
(rbjax/_tree/energy.py, rbjax/_tree/bodies.py), so both formulations of one file give the same
numbers."""

from __future__ import annotations

from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core

from .._abstract import AbstractModel, AbstractState
from .._constraints import AbstractConstraint, _zero
from .._engine import kernels as cf
from .._engine.layout import inertia_components, to_components
from .._engine.mass import mvec
from .._errors import is_concrete
from .._model import Model, require_model
from .._state import State
from .._tree import bodies as tree_bodies, energy as tree_energy
from .._tree.model import JointModel, JointState


def _maximal(model: AbstractModel, state: AbstractState, what: str) -> tuple[Model, State]:
    """(model, state) of maximal coordinates, the model's batch axes lined up with the
    state's (:func:`_aligned`); a ValueError naming the fix for anything else."""
    model = require_model(model)
    if not isinstance(state, State):
        raise ValueError(
            f"{what}: the model is an rbjax.Model but the state is a {type(state).__name__}. "
            "Fix: pass an rbjax.State(t, q, u) of this model (rbjax.load(path, "
            "formulation=rbjax.ScalableDAE()).state, or a Trajectory's states)."
        )
    return _aligned(model, state), state


def _aligned(model: Model, state: State) -> Model:
    """The model with its batch axes lined up with the LEADING batch axes of ``state``: a
    model batched as mass (B, nb) evaluated on saved states (B, T, nb, 7) (a batched
    rollout's ``traj.states``) gets mass (B, 1, nb), inertia (B, 1, nb, 3, 3), gravity
    (B, 1, 3); leaves without batch axes broadcast as they are."""
    extra = state.q.ndim - 2
    leaves = {"mass": 1, "inertia": 3, "gravity": 1}
    new = {}
    for name, rank in leaves.items():
        x = getattr(model, name)
        lead = x.ndim - rank
        if lead > extra:
            raise ValueError(
                f"model.{name} has {lead} batch axes but the state has {extra}. Fix: pass the "
                "states of every batch member (the model's batch axes lead the state's)."
            )
        if 0 < lead < extra:
            new[name] = x.reshape(x.shape[:lead] + (1,) * (extra - lead) + x.shape[lead:])
    if not new:
        return model
    return eqx.tree_at(lambda m: tuple(getattr(m, k) for k in new), model, tuple(new.values()))


def _joint_arrays(model: JointModel, state, what: str):
    """(qpos (nq, *batch), qvel (nv, *batch)) of a JointState, component-first."""
    if not isinstance(state, JointState):
        raise ValueError(
            f"{what}: the model is a JointModel but the state is a {type(state).__name__}. "
            "Fix: pass an rbjax.JointState(t, qpos, qvel) (rbjax.load(path).state of a tree "
            "file, or a JointTrajectory's saved states)."
        )
    if state.qpos.shape[-1:] != (model.nq,) or state.qvel.shape[-1:] != (model.nv,):
        raise ValueError(
            f"{what}: the state has qpos {tuple(state.qpos.shape)} and qvel "
            f"{tuple(state.qvel.shape)}; the model has nq = {model.nq}, nv = {model.nv}. Fix: "
            "pass qpos (..., nq) and qvel (..., nv) of this model, with the same batch axes."
        )
    q = jnp.moveaxis(state.qpos, -1, 0)
    u = jnp.moveaxis(state.qvel, -1, 0)
    if q.shape[1:] != u.shape[1:]:
        raise ValueError(
            f"{what}: qpos has batch axes {q.shape[1:]} and qvel {u.shape[1:]}. Fix: give both "
            "the same batch axes."
        )
    return q, u


def kinetic_energy(model: AbstractModel, state: AbstractState):
    """T = ½ uᵀ M u summed over bodies (Möller & Glocker 2012, eqs. (60), (64)); valid for scalable bodies.

    For a JointModel T = ½ q̇ᵀ M(q) q̇, armature included (rbjax/_tree/energy.py)."""
    if isinstance(model, JointModel):
        q, u = _joint_arrays(model, state, "rbjax.kinetic_energy")
        return tree_energy.kinetic(model, q, u)
    model, state = _maximal(model, state, "rbjax.kinetic_energy")
    _, _, u = to_components(state)
    return 0.5 * jnp.sum(jnp.sum(u * mvec(model, u), axis=0), axis=-1)


def potential_energy(model: AbstractModel, state: AbstractState):
    """V [J], shape (*batch,): uniform gravity plus the springs' potentials,

        V = −Σ_b m_b gᵀ r_b + Σ_f V_f(q),

    with V_f = ½ k (l − l0)² for a :class:`rbjax.TranslationalSpringDamper`, ½ k (θ − θ0)² for
    a :class:`rbjax.RotationalSpringDamper` and ½ k (x − x0)² for an
    :class:`rbjax.AxialSpringDamper` (ME751 TSDA/RSDA, Negrut ME751): the potential of each
    spring term exactly as the force evaluates it (see each class for where that term is a
    gradient). Not included: damping and actuators, and forces that do not derive from a
    potential (:class:`rbjax.PointForce`, :class:`rbjax.BodyTorque`,
    :class:`rbjax.ForceFunction`, user forces); :func:`energy_balance` says whether the total
    energy of a model is conserved.

    For a JointModel: gravity on every centre of mass less the share ``gravcomp`` that gravity
    compensation cancels (a uniform field, so a potential), and the joints' springs (½ k (q −
    q_s)² of a hinge or slide, ½ k φ² of a ball's rotation angle φ from ``qpos_spring``, both
    terms for a free joint): rbjax/_tree/energy.py. This is MuJoCo's ``energy[0]`` plus
    Σ gravcomp·m gᵀc (MuJoCo leaves gravity compensation out of its potential).
    """
    if isinstance(model, JointModel):
        q, _ = _joint_arrays(model, state, "rbjax.potential_energy")
        return tree_energy.potential(model, q)
    model, state = _maximal(model, state, "rbjax.potential_energy")
    g = jnp.asarray(model.gravity)[..., None, :]
    v = -jnp.sum(model.mass * jnp.sum(g * state.q[..., 0:3], axis=-1), axis=-1)
    if not model.forces:
        return v
    t, q, _ = to_components(state)
    for force in model.forces:
        v_force = force._engine_potential(model, t, q)
        if v_force is not None:
            v = v + v_force
    return v


def total_energy(model: AbstractModel, state: AbstractState):
    """T + V [J] (:func:`kinetic_energy`, :func:`potential_energy`: gravity and springs).

    Conserved when :func:`energy_balance` is ``"conservative"`` (gravity, undamped springs,
    joints that do not depend on time), non-increasing when it is ``"dissipative"``; damping
    and the work of forces without a potential are not in it.
    """
    return kinetic_energy(model, state) + potential_energy(model, state)


def energy_balance(model: AbstractModel) -> Literal["conservative", "dissipative"] | None:
    """What the model says about its total energy E = T + V (:func:`total_energy`), decided
    from its structure and concrete values only (no dynamics are evaluated):

    * ``"conservative"``: E is conserved. Every force derives from a potential that
      :func:`potential_energy` includes (gravity, and spring–dampers without an actuator whose
      damping coefficients are all concretely 0: a TSDA; an RSDA on a Revolute, Cylindrical,
      Translational, Fixed or Parallel joint along its axis between the same bodies, which
      keeps its angle a potential; an axial spring whose body i is rigid), and no joint
      depends on time;
    * ``"dissipative"``: the same, but some damping is positive (or a traced value, which is
      counted as positive): E does not increase;
    * ``None``: no statement. A force does work that no potential describes
      (:class:`rbjax.PointForce`, :class:`rbjax.BodyTorque`, :class:`rbjax.ForceFunction`, a
      user force, an actuator, a negative damping, an RSDA without such a joint, an axial
      spring on a scalable body i), or a constraint depends on time (a driver with a driving
      function other than the default zero, a user constraint whose residual reads t), so its
      reactions do work.

    Perfect joints that do not depend on time do no work: their generalized force Wᵀλ
    (Möller & Glocker 2012, eq. (81)) has the power λᵀ W u = −λᵀ c_t, zero when c_t = 0, so
    they do not change the verdict. Baumgarte terms (``Model(baumgarte=...)``) act only off
    the constraint manifold and are ignored, as is the integrator's own error: a conservative
    model's E drifts by the integration error (RK4: O(dt⁴)). Cheap, and usable on a traced
    model: it reads static fields and concrete values (a traced damping counts as positive, a
    traced joint axis as aligned), and traces a driving function or a user residual to a
    jaxpr (no FLOPs, well under a millisecond) only for constraints that have one.

    A JointModel is ``"conservative"`` without damping (concretely 0), actuators and user
    forces (gravity, gravity compensation and the joints' springs have potentials;
    equalities do not depend on time), ``"dissipative"`` when the only other force is damping
    ≥ 0 (a traced damping counts as positive), ``None`` otherwise. The power of those forces
    is ``rbjax/_tree/energy.py``'s ``nonconservative_power``.
    """
    if isinstance(model, JointModel):
        return _joint_energy_balance(model)
    model = require_model(model)
    verdict: Literal["conservative", "dissipative"] = "conservative"
    for force in model.forces:
        balance = force._energy_balance(model)
        if balance is None:
            return None
        if balance == "dissipative":
            verdict = "dissipative"
    dtype = jnp.result_type(model.mass)
    for joint in model.joints:
        if _depends_on_time(joint, dtype):
            return None
    return verdict


def _joint_energy_balance(model: JointModel) -> Literal["conservative", "dissipative"] | None:
    if model.actuators or model.forces:
        return None
    damping = model.damping
    if not is_concrete(damping):
        return "dissipative"
    d = np.asarray(damping)
    if np.any(d < 0):
        return None
    return "dissipative" if np.any(d > 0) else "conservative"


# built-in constraints whose residual reads t only through a driving function ``f``
_TIME_THROUGH_F = ("rbjax._joints", "rbjax._constraints")


def _depends_on_time(constraint: AbstractConstraint, dtype) -> bool:
    """Whether Φ(q_i, q_j, t) may depend on t: a built-in joint through its driving function
    ``f`` (none, or the default zero: no), any other constraint through its residual. Decided
    by tracing the function to a jaxpr and following the data flow from t (conservative: an
    operation with an input that depends on t is taken to depend on t)."""
    t = jax.ShapeDtypeStruct((), dtype)
    kind = type(constraint)
    builtin = kind.__module__ in _TIME_THROUGH_F and kind.__name__ != "CustomConstraint"
    f = getattr(constraint, "f", None)
    if builtin and (f is None or f is _zero):
        return False
    # every array leaf (also a driving function's parameters) abstract: no values needed
    params, static = eqx.partition(constraint, eqx.is_array)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    q = jax.ShapeDtypeStruct((7,), dtype)

    def driving(p, tt):
        return eqx.combine(p, static).f(tt)

    def residual(p, q_i, q_j, tt):
        return eqx.combine(p, static).residual(q_i, q_j, tt)

    try:
        if builtin:
            closed = jax.make_jaxpr(driving)(abstract, t)
        else:
            closed = jax.make_jaxpr(residual)(abstract, q, q, t)
    except Exception:  # a function that cannot be traced on its own: no statement
        return True
    return _reads(closed.jaxpr, closed.jaxpr.invars[-1])


def _reads(jaxpr, var) -> bool:
    """Whether any output of ``jaxpr`` depends on its input ``var`` (forward data flow)."""
    dependent = {var}

    def reads(v):
        return isinstance(v, jex_core.Var) and v in dependent

    for eqn in jaxpr.eqns:
        if any(reads(v) for v in eqn.invars):
            dependent.update(eqn.outvars)
    return any(reads(v) for v in jaxpr.outvars)


def linear_momentum(model: AbstractModel, state: AbstractState):
    """Σ m v, world frame [kg m/s] (for a JointModel, v the velocity of each centre of mass)."""
    if isinstance(model, JointModel):
        q, u = _joint_arrays(model, state, "rbjax.linear_momentum")
        return jnp.moveaxis(tree_bodies.momenta(model, q, u)[0], 0, -1)
    model, state = _maximal(model, state, "rbjax.linear_momentum")
    return jnp.sum(model.mass[..., None] * state.u[..., 0:3], axis=-2)


def angular_momentum(model: AbstractModel, state: AbstractState):
    """Angular momentum about the world origin, world frame: Σ m r × v + s R Θ ω.

    For a scalable body, ∫ ξ × ξ̇ dm = m r × v + s R Θ ω (ν contributes nothing since
    ϱ × ϱ = 0); s R x is the quaternion transform A (0, x) A* (Möller & Glocker 2012, eq. (27)).
    For a JointModel: Σ m c × v + R Θ Rᵀ ω of the bodies (rbjax/_tree/bodies.py ``momenta``).
    """
    if isinstance(model, JointModel):
        q, u = _joint_arrays(model, state, "rbjax.angular_momentum")
        return jnp.moveaxis(tree_bodies.momenta(model, q, u)[1], 0, -1)
    model, state = _maximal(model, state, "rbjax.angular_momentum")
    _, q, u = to_components(state)
    th = inertia_components(model)
    spin = cf.transform(q[3:7], cf.matvec(th, u[4:7]))
    orbital = model.mass * cf.cross(q[0:3], u[0:3])
    return jnp.moveaxis(jnp.sum(spin + orbital, axis=-1), 0, -1)
