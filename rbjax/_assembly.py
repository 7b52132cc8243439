"""Assembly, consistent initial conditions, mobility analysis and kinematic analysis (ME751).

All position corrections are minimum-norm in the kinetic-energy metric of seed 000 eq. (64):
the Newton step δu = −M⁻¹W̃ᵀ(W̃M⁻¹W̃ᵀ)⁻¹ c moves the bodies as little as possible (in the sense
of ½δuᵀMδu) to first order, reuses the block-sparse Schur complement of the dynamics and is
applied through the formulation's kinematics q ← q + Q⁻¹(q) δu (quaternions of rigid bodies
renormalised). Velocities are projected the same way onto W̃u + c_t = 0. For a fully driven
mechanism (DOF = 0) W̃ is square and these are exactly ME751's position, velocity and
acceleration analyses.
"""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer
from jaxtyping import Array, Float

from . import _cf as cf
from ._constraints import GROUND
from ._dynamics import UdwadiaSchutte
from ._errors import is_concrete
from ._mass import from_cf, to_cf
from ._mechanics import JointTerms, joint_terms, one_shot, solve_multipliers
from ._state import State


def _norm_rows(model, x):
    """Max-abs of a list of per-joint residuals -> (n_joints, ...)."""
    return jnp.stack([jnp.max(jnp.abs(c), axis=0) for c in x])


def _renormalise(model, q):
    a = q[3:7]
    n = jnp.sqrt(cf.qnorm2(a))
    a = jnp.where(model.rigid, a / n, a)
    return jnp.concatenate([q[0:3], a], axis=0)


def _project_position(model, t, q, tol, max_iters):
    kin = model.formulation.kinematics
    zero_u = jnp.zeros_like(q)

    def step(q):
        terms = joint_terms(model, kin, t, q, zero_u, gamma=False)
        rhs = JointTerms(c=terms.c, cdot=terms.cdot, gamma=[-c for c in terms.c], W=terms.W)
        _, du, _ = solve_multipliers(model, rhs, jnp.zeros_like(q))
        return _renormalise(model, q + kin(q, du)), _norm_rows(model, terms.c)

    def cond(carry):
        _, it, err = carry
        return (it < max_iters) & (jnp.max(err) > tol)

    def body(carry):
        q, it, _ = carry
        q, err = step(q)
        return q, it + 1, err

    err0 = jnp.full((len(model.joints),) + q.shape[1:-1], jnp.inf, q.dtype)
    q, it, _ = jax.lax.while_loop(cond, body, (q, jnp.asarray(0), err0))
    final = joint_terms(model, kin, t, q, zero_u, gamma=False, jacobian=False)
    return q, _norm_rows(model, final.c), it


def _project_velocity(model, t, q, u):
    """u ← u − M⁻¹W̃ᵀ(W̃M⁻¹W̃ᵀ)⁻¹(W u + c_t): the M-orthogonal projection onto ċ = 0."""
    kin = model.formulation.kinematics
    terms = joint_terms(model, kin, t, q, u, gamma=False, cdot=True)
    rhs = JointTerms(c=terms.c, cdot=terms.cdot, gamma=[-cd for cd in terms.cdot], W=terms.W)
    _, du, _ = solve_multipliers(model, rhs, jnp.zeros_like(u))
    return u + du


# One-shot analyses compile with XLA's backend optimisation off: it halves their compile time
# (3.7 s -> 1.8 s for the slider-crank checks), which dominates; their run time is negligible.
_ONE_SHOT_OPTIONS = {"xla_backend_optimization_level": 0}


def _one_shot_jit(fn):
    """``eqx.filter_jit`` with :data:`_ONE_SHOT_OPTIONS` at top level; JAX accepts compiler
    options only there, so under an outer transformation (grad, jvp, jit) the plain version."""
    fast = eqx.filter_jit(fn, compiler_options=_ONE_SHOT_OPTIONS)  # pyright: ignore[reportCallIssue]
    plain = eqx.filter_jit(fn)

    @functools.wraps(fn)
    def call(*args):
        traced = any(isinstance(x, Tracer) for x in jax.tree.leaves(args))
        return (plain if traced else fast)(*args)

    return call


@_one_shot_jit
def _assemble(model, state, tol, max_iters, velocities):
    with one_shot():
        return _assemble_body(model, state, tol, max_iters, velocities)


def _assemble_body(model, state, tol, max_iters, velocities):
    t, q, u = to_cf(state)
    q, err, it = _project_position(model, t, q, tol, max_iters)
    if velocities:
        u = jnp.where(model.rigid, u.at[3].set(0.0), u)
        u = _project_velocity(model, t, q, u)
    return from_cf(t, q, u), err, it


def _check_model(model, where):
    if not model.joints:
        raise ValueError(
            f"{where}: the model has no joints. Fix: pass joints=[...] to rbjax.Model."
        )


def assemble(
    model, state: State, *, tol: float | None = None, max_iters: int = 50, velocities: bool = True
) -> State:
    """Consistent initial conditions: q with Φ(q, t) = 0 near ``state.q``, then u with
    W u + Φ_t = 0 (ME751 "assembly"; Newton–Raphson with minimum-norm corrections).

    ``tol`` (default 1e-12 in float64, 1e-5 in float32) is the largest residual accepted. If a
    joint cannot be satisfied, raises ValueError naming the joints whose residual stays large.
    Works on batches of states. Forward-mode differentiable; reverse mode through the Newton
    loop (a ``lax.while_loop``) is not supported yet (issue 4: implicit function theorem).
    """
    _check_model(model, "assemble")
    if not isinstance(state, State):
        raise ValueError(f"assemble: state = {type(state).__name__} is not an rbjax.State.")
    if tol is None:
        tol = 1e-12 if state.q.dtype == jnp.float64 else 1e-5
    out, err, it = _assemble(model, state, float(tol), int(max_iters), bool(velocities))
    if is_concrete(err):
        err = np.asarray(err).reshape(len(model.joints), -1).max(axis=1)
        bad = [(n, e) for n, e in zip(model.joint_names, err, strict=True) if not e <= 100 * tol]
        if bad:
            worst = ", ".join(f"'{n}' (residual {e:.3g})" for n, e in bad)
            raise ValueError(
                f"assemble: the joints cannot all be satisfied after {int(np.max(it))} Newton "
                f"iterations; these joints keep a residual above {tol:.1g}: {worst}. Fix: check "
                "their attachment points and axes against the bodies' positions (start closer to "
                "an assembled configuration, e.g. build joints with .at(q, ...)), or remove "
                "contradicting joints."
            )
    return out


class Mobility(eqx.Module):
    """Mobility of a mechanism at one configuration (from the SVD of W̃, rigid bodies in (v, ω)).

    ``dof``: degrees of freedom 6·n_rigid + 7·n_scalable − rank; ``rank``: rank of the joint
    Jacobian; ``rows``: number of joint equations; ``redundant``: names of joints involved in
    redundant (linearly dependent) equations, empty if none; ``singular_values``.
    """

    dof: int = eqx.field(static=True)
    rank: int = eqx.field(static=True)
    rows: int = eqx.field(static=True)
    redundant: tuple[str, ...] = eqx.field(static=True)
    singular_values: Float[Array, " m"]


@_one_shot_jit
def _jacobian_blocks(model, state):
    t, q, u = to_cf(state)
    return joint_terms(model, model.formulation.kinematics, t, q, u, gamma=False).W


def jacobian_matrix(model, state: State) -> np.ndarray:
    """W̃ as a dense (m, 6·nb) or (m, 7·nb) NumPy matrix for ONE system (rigid bodies: (v, ω))."""
    return _dense_jacobian(model, _jacobian_blocks(model, state))


def _dense_jacobian(model, blocks) -> np.ndarray:
    cols = [6 if not s else 7 for s in model.scalable]
    offs = np.cumsum([0] + cols)
    keep = [[0, 1, 2, 4, 5, 6] if not s else [0, 1, 2, 3, 4, 5, 6] for s in model.scalable]
    rows = model.joint_rows
    mat = np.zeros((sum(rows), offs[-1]))
    r0 = 0
    for k, joint in enumerate(model.joints):
        for side, b in enumerate((joint.body_i, joint.body_j)):
            if b == GROUND:
                continue
            w = np.asarray(blocks[k][side])
            mat[r0 : r0 + rows[k], offs[b] : offs[b + 1]] += w[:, keep[b]]
        r0 += rows[k]
    return mat


def mobility(model, state: State, *, rtol: float = 1e-9) -> Mobility:
    """Degrees of freedom and redundant constraints at ``state`` (one system, concrete).

    The rank of W̃ counts independent joint equations; joints whose rows carry weight in a
    left null vector of W̃ (a linear combination of equations that vanishes) are reported as
    redundant: any of them could be removed without changing the motion.
    """
    _check_model(model, "mobility")
    if state.q.ndim != 2:
        raise ValueError(
            f"mobility: state.q has shape {state.q.shape}; pass ONE system (nb, 7), e.g. state[0]."
        )
    return _mobility(model, jacobian_matrix(model, state), rtol)


def _mobility(model, mat, rtol) -> Mobility:
    uu, sv, _ = np.linalg.svd(mat)
    tol = rtol * max(1.0, sv.max() if sv.size else 1.0)
    rank = int(np.sum(sv > tol))
    m = mat.shape[0]
    redundant: list[str] = []
    if rank < m:
        null = uu[:, rank:]
        weight = np.max(np.abs(null), axis=1)
        rows = model.joint_rows
        r0 = 0
        for name, r in zip(model.joint_names, rows, strict=True):
            if np.any(weight[r0 : r0 + r] > 1e-6):
                redundant.append(name)
            r0 += r
    return Mobility(
        dof=int(mat.shape[1] - rank),
        rank=rank,
        rows=m,
        redundant=tuple(redundant),
        singular_values=jnp.asarray(sv),
    )


class KinematicResult(eqx.Module):
    """Result of :func:`kinematic_analysis`: ``t`` (T,), ``q``/``u``/``udot`` (T, nb, 7),
    ``lam`` (T, nb + m) the multipliers of the equations of motion along the prescribed motion
    (the driver rows are the actuator forces/torques of inverse dynamics), ``residual`` (T,) the
    largest position residual."""

    t: Float[Array, " T"]
    q: Float[Array, "T nb 7"]
    u: Float[Array, "T nb 7"]
    udot: Float[Array, "T nb 7"]
    lam: Float[Array, "T m"]
    residual: Float[Array, " T"]


@_one_shot_jit
def _kinematic_scan(model, q0, times, tol, max_iters):
    with one_shot():
        return _kinematic_scan_body(model, q0, times, tol, max_iters)


def _kinematic_scan_body(model, q0, times, tol, max_iters):
    def one(q_prev, t):
        tt = jnp.reshape(t, (1,))
        q, err, _ = _project_position(model, tt, q_prev, tol, max_iters)
        u = _project_velocity(model, tt, q, jnp.zeros_like(q))
        # DOF = 0: the equations of motion determine the same u̇ as W̃u̇ = γ, and their
        # multipliers are the inverse-dynamics efforts (one W/γ evaluation for both).
        _, udot, lam = model.formulation.derivatives(model, tt, q, u)
        st = from_cf(tt, q, u)
        return q, (st.t, st.q, st.u, jnp.moveaxis(udot, 0, -1), lam, jnp.max(err))

    _, out = jax.lax.scan(one, q0, times)
    return out


def kinematic_analysis(
    model, state0: State, times, *, tol: float | None = None, max_iters: int = 50
) -> KinematicResult:
    """Position, velocity and acceleration analysis of a fully driven mechanism (DOF = 0).

    At each time in ``times`` (ascending), Newton–Raphson solves Φ(q, t) = 0 from the previous
    solution, then Φ_q q̇ = −Φ_t and Φ_q q̈ = γ (in generalized velocities: W̃u = −c_t,
    W̃u̇ = γ). The equations of motion along this motion give the multipliers, whose driver rows
    are the driving forces/torques (inverse dynamics; reactions via :func:`rbjax.reactions`).
    Raises ValueError if the mechanism is not fully driven (DOF ≠ 0) or a position solve fails.
    """
    _check_model(model, "kinematic_analysis")
    times = jnp.asarray(times, state0.q.dtype)
    if times.ndim != 1 or times.shape[0] < 1:
        raise ValueError(
            f"kinematic_analysis: times has shape {times.shape}. Fix: pass a 1-D array of times."
        )
    if state0.q.ndim != 2:
        raise ValueError(
            f"kinematic_analysis: state0.q has shape {state0.q.shape}; pass ONE system (nb, 7) "
            "(use jax.vmap for batches)."
        )
    mob = mobility(model, assemble(model, State(t=times[0], q=state0.q, u=state0.u)))
    if mob.dof != 0:
        raise ValueError(
            f"kinematic_analysis needs a fully driven mechanism (DOF = 0), but this one has "
            f"DOF = {mob.dof} ({mob.rows} joint equations of rank {mob.rank}). Fix: add drivers "
            "(RotationDriver, TranslationDriver or a driven DP1/DP2/D/CD) for the free "
            "coordinates, or use rbjax.rollout for dynamics."
        )
    if tol is None:
        tol = 1e-12 if state0.q.dtype == jnp.float64 else 1e-5
    _, q0, _ = to_cf(state0)
    t, q, u, udot, lam, res = _kinematic_scan(model, q0, times, float(tol), int(max_iters))
    if is_concrete(res) and not np.all(np.asarray(res) <= 100 * tol):
        k = int(np.argmax(~(np.asarray(res) <= 100 * tol)))
        raise ValueError(
            f"kinematic_analysis: the position analysis failed at times[{k}] = {float(times[k]):.6g}"
            f" (residual {float(res[k]):.3g}). The mechanism may pass a singular (lock-up) "
            "configuration there. Fix: check the driver functions and the geometry."
        )
    return KinematicResult(t=t, q=q, u=u, udot=udot, lam=lam, residual=res)


@_one_shot_jit
def _consistency(model, state):
    """Residuals and velocity residuals of every batch member, and the W blocks of the first
    (one compiled function: these checks run before every rollout's first call)."""
    t, q, u = to_cf(state)
    terms = joint_terms(model, model.formulation.kinematics, t, q, u, cdot=True, gamma=False)
    first = [tuple(w.reshape(w.shape[:2] + (-1,))[..., 0] for w in pair) for pair in terms.W]
    return _norm_rows(model, terms.c), _norm_rows(model, terms.cdot), first


def check_mechanism_state(model, state: State, *, tol: float | None = None) -> None:
    """Build-time checks of a mechanism's initial state (concrete values only).

    * the joints hold (|Φ| ≤ tol) and their velocity equations hold (|W u + Φ_t| ≤ tol),
      otherwise ValueError naming the joints and suggesting :func:`rbjax.assemble`;
    * the joint equations are independent when the formulation needs a regular Schur
      complement (ScalableDAE, NewtonEuler), otherwise ValueError naming the redundant joints
      and suggesting ``UdwadiaSchutte`` (Moore–Penrose inverse) or removing equations.
    """
    if not model.joints or not (is_concrete(state.q) and is_concrete(state.u)):
        return
    if tol is None:
        tol = 1e-8 if state.q.dtype == jnp.float64 else 1e-3
    c, cd, first_w = _consistency(model, state)
    for what, val, fix in (
        ("position", c, "rbjax.assemble(model, state)"),
        ("velocity", cd, "rbjax.assemble(model, state) (it also projects the velocities)"),
    ):
        val = np.asarray(val).reshape(len(model.joints), -1).max(axis=1)
        bad = [(n, e) for n, e in zip(model.joint_names, val, strict=True) if not e <= tol]
        if bad:
            worst = ", ".join(f"'{n}' ({e:.3g})" for n, e in bad)
            raise ValueError(
                f"The initial state violates the {what} equations of joints {worst} "
                f"(tolerance {tol:.1g}). Fix: make the state consistent with {fix}."
            )
    if isinstance(model.formulation, UdwadiaSchutte):
        return
    mob = _mobility(model, _dense_jacobian(model, first_w), 1e-9)
    if mob.redundant:
        raise ValueError(
            f"The joint equations are redundant (rank {mob.rank} < {mob.rows} rows); joints "
            f"involved: {list(mob.redundant)}. {type(model.formulation).__name__} needs "
            "independent equations (a regular Schur complement). Fix: use "
            "formulation=rbjax.UdwadiaSchutte(), which handles redundant constraints with the "
            "Moore–Penrose inverse, or replace a joint by one with fewer equations (e.g. a "
            "Revolute in a planar loop by a Spherical or Universal joint)."
        )
