"""Assembly, consistent initial conditions, mobility analysis and kinematic analysis (ME751).

Position corrections are measured in the kinetic-energy metric of seed 000 eq. (64).
:func:`assemble` returns the configuration on the joint manifold CLOSEST to the input in that
metric (min ½δᵀMδ, δ the generalized displacement); kinematic analysis (DOF = 0) the unique
nearby root; ``Projected`` integrators the standard projection along the mass-weighted normal
at the predicted point. Each is the root of a square system, found by Newton iterations
(which reuse the block-sparse Schur complement S = W̃M⁻¹W̃ᵀ of the dynamics) and differentiated
by the implicit function theorem (``jax.lax.custom_root``), never by unrolling the iterations.
Velocities are projected M-orthogonally onto W̃u + c_t = 0 (a linear solve). For a fully
driven mechanism (DOF = 0) W̃ is square and these are exactly ME751's position, velocity and
acceleration analyses."""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer
from jaxtyping import Array, Float

from ._constraints import GROUND
from ._dynamics import UdwadiaSchutte
from ._engine import kernels as cf
from ._engine.joints import JointTerms, SchurSystem, joint_terms, one_shot, solve_multipliers
from ._engine.layout import from_components, to_components
from ._engine.mass import mvec
from ._engine.newton import batch_jacobian, batched_solve, flatten, implicit_root, unflatten
from ._errors import is_concrete
from ._state import State


def _norm_rows(model, x):
    """Max-abs of a list of per-joint residuals -> (n_joints, ...)."""
    return jnp.stack([jnp.max(jnp.abs(c), axis=0) for c in x])


def _renormalise(model, q):
    a = q[3:7]
    n = jnp.sqrt(cf.qnorm2(a))
    a = jnp.where(model.rigid, a / n, a)
    return jnp.concatenate([q[0:3], a], axis=0)


def _split_rows(model, x):
    """(m, ...) -> per-joint list of (m_k, ...)."""
    offs = np.cumsum((0,) + tuple(model.joint_rows))
    return [x[offs[k] : offs[k + 1]] for k in range(len(model.joints))]


def _residuals(model, t, q):
    """All joint residuals Φ(q, t) stacked, (m, ...)."""
    zero = jnp.zeros_like(q)
    kin = model.formulation._engine_kinematics
    return jnp.concatenate(
        joint_terms(model, kin, t, q, zero, gamma=False, jacobian=False).c, axis=0
    )


def _joint_errors(model, r):
    """Largest |Φ| per joint, (n_joints, ...), from stacked residuals (m, ...)."""
    return _norm_rows(model, _split_rows(model, r))


def _gauss_newton(model, t, q, tol, max_iters):
    """Path-following Gauss–Newton onto Φ(q, t) = 0: q ← N(q + Q⁻¹(q) δu) with the
    minimum-norm step δu = −M⁻¹W̃ᵀS⁻¹Φ re-linearised at every iterate (robust from far away;
    its end point depends on the path, so it only warm-starts :func:`_closest_point`)."""
    kin = model.formulation._engine_kinematics
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
    return q, _joint_errors(model, _residuals(model, t, q)), it


# ---------------------------------------------------------------- projection of a step


def _frozen_normal(model, t, qt):
    """W̃(q̃) and its Schur complement S(q̃) = W̃M⁻¹W̃ᵀ, factored (trace-time object)."""
    terms = joint_terms(
        model, model.formulation._engine_kinematics, t, qt, jnp.zeros_like(qt), gamma=False
    )
    return SchurSystem(model, terms, qt.dtype)


def _along(model, qt, schur, mu):
    """q(μ) = N(q̃ + Q⁻¹(q̃) M⁻¹W̃(q̃)ᵀ μ) for stacked multipliers μ (m, ...)."""
    du, _ = schur.correction(_split_rows(model, mu), jnp.moveaxis(qt, -1, 1))
    return _renormalise(model, qt + model.formulation._engine_kinematics(qt, du))


def _precondition(model, schur, r):
    """S⁻¹ r for stacked right-hand sides (m, ...)."""
    return jnp.concatenate(schur.solve(_split_rows(model, r)), axis=0)


def _projection_residual(mu, args):
    model, t, qt = args
    return _residuals(model, t, _along(model, qt, _frozen_normal(model, t, qt), mu))


def _projection_solver(tol, max_iters):
    def solve(args):
        model, t, qt = args
        schur = _frozen_normal(model, t, qt)

        def cond(carry):
            _, _, err, it = carry
            return (it < max_iters) & (jnp.max(err) > tol)

        def body(carry):
            mu, r, _, it = carry
            mu = mu - _precondition(model, schur, r)
            r = _residuals(model, t, _along(model, qt, schur, mu))
            return mu, r, _joint_errors(model, r), it + 1

        mu0 = jnp.zeros((sum(model.joint_rows),) + qt.shape[1:-1], qt.dtype)
        r0 = _residuals(model, t, qt)
        init = (mu0, r0, _joint_errors(model, r0), jnp.asarray(0))
        mu, _, err, it = jax.lax.while_loop(cond, body, init)
        return mu, (err, it)

    return solve


_REFINE_STEPS = 4


def _projection_tangent_solve(g, y, mu, args):
    """Solve g(x) = y, g = ∂Φ(q(μ))/∂μ at the solution, by iterative refinement
    x ← x + S⁻¹(y − g(x)). g = S + O(|μ|) (μ is of the size of the integrator's local error),
    so each step gains a factor O(|μ|); a fixed number of steps keeps the solve linear in y,
    which reverse mode needs (it transposes this function)."""
    model, t, qt = args
    schur = _frozen_normal(model, t, qt)

    def body(_, x):
        return x + _precondition(model, schur, y - g(x))

    return jax.lax.fori_loop(0, _REFINE_STEPS, body, _precondition(model, schur, y))


def _project_position(model, t, qt, tol, max_iters):
    """Projection of q̃ onto Φ(q, t) = 0 along the mass-weighted normal AT q̃ (the standard
    projection of Hairer, Lubich & Wanner, Geometric Numerical Integration, §IV.4, in the
    metric of seed 000 eq. (64)):

        q(μ) = N(q̃ + Q⁻¹(q̃) M⁻¹W̃(q̃)ᵀ μ),      Φ(q(μ), t) = 0,

    m equations for the m multipliers μ (N renormalises rigid quaternions). Solved by
    simplified Newton with S(q̃) = W̃M⁻¹W̃ᵀ factored once (the Jacobian at μ = 0). Because μ
    is the root of a square system, the projection is a function of q̃ and of the model, and
    its derivatives follow from the implicit function theorem (:func:`implicit_root`).
    Returns (q, largest |Φ| per joint, iterations)."""
    args = (model, t, qt)
    mu, (err, it) = implicit_root(
        args,
        residual=_projection_residual,
        solve=_projection_solver(tol, max_iters),
        tangent_solve=_projection_tangent_solve,
    )
    return _along(model, qt, _frozen_normal(model, t, qt), mu), err, it


# ---------------------------------------------------------------- assembly


def _nu_rows(model, dtype, ndim):
    """Mask (7, 1…, nb): 1 at the scaling rate ν of rigid bodies (a coordinate they lack)."""
    mask = np.zeros((7, model.nb))
    mask[3] = [0.0 if s else 1.0 for s in model.scalable]
    return jnp.asarray(mask.reshape((7,) + (1,) * (ndim - 2) + (model.nb,)), dtype)


def _retract(model, q0, d):
    """R(q0, δ) = N(q0 + Q⁻¹(q0) δ): the configuration reached from q0 by the generalized
    displacement δ (7, ..., nb) (seed 000 eq. (37); rigid quaternions renormalised, ν of rigid
    bodies ignored)."""
    d = d * (1.0 - _nu_rows(model, q0.dtype, q0.ndim))
    return _renormalise(model, q0 + model.formulation._engine_kinematics(q0, d))


def _inverse_retract(model, q0, q):
    """The δ with R(q0, δ) = q (rigid bodies: ν = 0 and the rotation within ±180°)."""
    a0, a = q0[3:7], q[3:7]
    s0 = cf.qnorm2(a0)
    p = cf.qmul(cf.qconj(a0), a)  # rigid: ∝ (1, ω/(2 s0)), sign-invariant below
    rigid = jnp.concatenate([jnp.zeros_like(p[:1]), 2.0 * s0 * p[1:4] / p[0]], axis=0)
    scalable = 2.0 * cf.qmul(cf.qconj(a0), a - a0)  # (ν, ω) = 2 A0* (A − A0)
    rot = jnp.where(model.rigid, rigid, scalable)
    return jnp.concatenate([q[0:3] - q0[0:3], rot], axis=0)


def _phi(model, t, q0, zf):
    """Φ(R(q0, δ), t) for the flattened displacement δ (7·nb, ...), (m, ...)."""
    return _residuals(model, t, _retract(model, q0, unflatten(zf, 7, model.nb)))


def _pinned(model, q0):
    """(7·nb, ...) bool: the ν rows of rigid bodies in a flattened displacement."""
    return flatten(jnp.broadcast_to(_nu_rows(model, q0.dtype, q0.ndim), q0.shape)) > 0


def _metric(model, q0, zf):
    """Mδ for a flattened δ, with the identity on the pinned ν rows of rigid bodies."""
    nb = model.nb
    mass = flatten(mvec(model, unflatten(zf, 7, nb) * (1.0 - _nu_rows(model, zf.dtype, q0.ndim))))
    return jnp.where(_pinned(model, q0), zf, mass)


def _dense_solve(g, y, z, args):
    """Exact tangent solve with the dense Jacobian of the linear map g (one jvp per unknown)."""
    return batched_solve(batch_jacobian(g, y), y)


def _driven_residual(zf, args):
    model, t, q0 = args
    return jnp.concatenate([_phi(model, t, q0, zf), zf[_nu_index(model)]], axis=0)


def _nu_index(model):
    return np.asarray([3 * model.nb + b for b in range(model.nb) if not model.scalable[b]], int)


def _gauss_newton_solver(tol, max_iters):
    def solve(args):
        model, t, q0 = args
        qa, _, it = _gauss_newton(model, t, q0, tol, max_iters)
        return flatten(_inverse_retract(model, q0, qa)), it

    return solve


def _driven_position(model, t, q0, tol, max_iters):
    """The root of Φ(q, t) = 0 near q0 for a fully driven mechanism (DOF = 0, ME751's position
    analysis): q = R(q0, δ) with δ the root of the square system [Φ(R(q0, δ), t); δ_ν] = 0
    (δ_ν of rigid bodies pinned to 0). Found by :func:`_gauss_newton` (whose end point is that
    root when DOF = 0) and differentiated by the implicit function theorem with a dense
    Jacobian of the square system. Returns (q, largest |Φ| per joint, iterations)."""
    z, it = implicit_root(
        (model, t, q0),
        residual=_driven_residual,
        solve=_gauss_newton_solver(tol, max_iters),
        tangent_solve=_dense_solve,
    )
    q = _retract(model, q0, unflatten(z, 7, model.nb))
    return q, _joint_errors(model, _residuals(model, t, q)), it


def _kkt_residual(z, args):
    """Mδ − J(δ)ᵀμ (ν rows of rigid bodies: δ_ν) and Φ(R(q0, δ), t), J = ∂Φ∘R/∂δ."""
    model, t, q0 = args
    n = 7 * model.nb
    c, pull = jax.vjp(lambda d: _phi(model, t, q0, d), z[:n])
    (jt_mu,) = pull(z[n:])
    r1 = _metric(model, q0, z[:n]) - jnp.where(_pinned(model, q0), 0.0, jt_mu)
    return jnp.concatenate([r1, c], axis=0)


def _kkt_solver(tol, max_iters):
    def solve(args):
        # Sequential quadratic programming with the Gauss–Newton KKT matrix [[M, −Jᵀ], [J, 0]]
        # (first derivatives only, to keep compile time down) from the end point of the
        # Gauss–Newton iteration: it converges linearly, at a rate of the order of the
        # curvature of the joint manifold times the distance moved, to the root of the exact
        # KKT system :func:`_kkt_residual`, which defines the result and its derivatives.
        model, t, q0 = args
        n = 7 * model.nb
        m = sum(model.joint_rows)
        qa, _, it = _gauss_newton(model, t, q0, tol, max_iters)
        d0 = flatten(_inverse_retract(model, q0, qa))
        z = jnp.concatenate([d0, jnp.zeros((m,) + d0.shape[1:], d0.dtype)], axis=0)
        mass = batch_jacobian(lambda d: _metric(model, q0, d), d0)
        pin = _pinned(model, q0)
        eps = jnp.finfo(z.dtype).eps

        def cond(carry):
            _, size, k = carry
            return (k < 4 * max_iters) & jnp.any(size > 64 * eps)

        def body(carry):
            z, _, k = carry
            jac = batch_jacobian(lambda d: _phi(model, t, q0, d), z[:n])  # (*batch, m, n)
            jt = jnp.swapaxes(jac, -1, -2)
            top = jnp.concatenate([mass, -jt], axis=-1)
            bot = jnp.concatenate([jac, jnp.zeros(jac.shape[:-1] + (m,), z.dtype)], axis=-1)
            mu = jnp.moveaxis(z[n:], 0, -1)[..., None]
            jt_mu = jnp.moveaxis((jt @ mu)[..., 0], -1, 0)
            res = jnp.concatenate(
                [_metric(model, q0, z[:n]) - jnp.where(pin, 0.0, jt_mu), _phi(model, t, q0, z[:n])]
            )
            dz = batched_solve(jnp.concatenate([top, bot], axis=-2), -res)
            z = z + dz
            size = jnp.max(jnp.abs(dz), axis=0) / (1.0 + jnp.max(jnp.abs(z), axis=0))
            return z, size, k + 1

        inf = jnp.full(z.shape[1:], jnp.inf, z.dtype)
        z, _, _ = jax.lax.while_loop(cond, body, (z, inf, jnp.asarray(0)))
        return z, it

    return solve


def _closest_point(model, t, q0, tol, max_iters):
    """The configuration on Φ(q, t) = 0 closest to q0 in the kinetic-energy metric:

        min ½ δᵀMδ   subject to   Φ(R(q0, δ), t) = 0,

    with M of seed 000 eq. (64) and R the retraction of :func:`_retract`. Its KKT system
    (:func:`_kkt_residual`; ν ≡ 0 for rigid bodies) is square, so the result is a function of q0
    and of the model, differentiated by the implicit function theorem (dense tangent solves).
    Returns (q, largest |Φ| per joint, Gauss–Newton iterations)."""
    z, it = implicit_root(
        (model, t, q0),
        residual=_kkt_residual,
        solve=_kkt_solver(tol, max_iters),
        tangent_solve=_dense_solve,
    )
    q = _retract(model, q0, unflatten(z[: 7 * model.nb], 7, model.nb))
    return q, _joint_errors(model, _residuals(model, t, q)), it


def _project_velocity(model, t, q, u):
    """u ← u − M⁻¹W̃ᵀ(W̃M⁻¹W̃ᵀ)⁻¹(W u + c_t): the M-orthogonal projection onto ċ = 0."""
    kin = model.formulation._engine_kinematics
    terms = joint_terms(model, kin, t, q, u, gamma=False, cdot=True)
    rhs = JointTerms(c=terms.c, cdot=terms.cdot, gamma=[-cd for cd in terms.cdot], W=terms.W)
    _, du, _ = solve_multipliers(model, rhs, jnp.zeros_like(u))
    return u + du


# One-shot analyses compile with XLA's backend optimisation off: it halves their compile time
# (3.7 s -> 1.8 s for the slider-crank checks), which dominates; their run time is negligible.
_ONE_SHOT_OPTIONS = {"xla_backend_optimization_level": 0}


def _top_level() -> bool:
    """True outside every JAX transformation (where jit accepts compiler options). Uses
    JAX's own test (private API, hence the fallback: then only traced arguments count)."""
    try:
        from jax._src.core import trace_state_clean
    except ImportError:  # pragma: no cover - a JAX without it
        return True
    return bool(trace_state_clean())


def _one_shot_jit(fn):
    """``eqx.filter_jit`` with :data:`_ONE_SHOT_OPTIONS` at top level; JAX accepts compiler
    options only there, so under an outer transformation (grad, jvp, jit) the plain version."""
    fast = eqx.filter_jit(fn, compiler_options=_ONE_SHOT_OPTIONS)  # pyright: ignore[reportCallIssue]
    plain = eqx.filter_jit(fn)

    @functools.wraps(fn)
    def call(*args):
        traced = any(isinstance(x, Tracer) for x in jax.tree.leaves(args))
        return (plain if traced or not _top_level() else fast)(*args)

    return call


@_one_shot_jit
def _assemble(model, state, tol, max_iters, velocities):
    with one_shot():
        return _assemble_body(model, state, tol, max_iters, velocities)


def _assemble_body(model, state, tol, max_iters, velocities):
    t, q, u = to_components(state)
    q, err, it = _closest_point(model, t, q, tol, max_iters)
    if velocities:
        u = jnp.where(model.rigid, u.at[3].set(0.0), u)
        u = _project_velocity(model, t, q, u)
    return from_components(t, q, u), err, it


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
    Works on batches of states. The result is the configuration on the joint manifold closest
    to ``state.q`` in the kinetic-energy metric (seed 000 eq. (64)), so it is a function of the
    input and of the model, differentiable in forward and reverse mode by the implicit function
    theorem (the Newton iterations are not differentiated).
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
    t, q, u = to_components(state)
    return joint_terms(model, model.formulation._engine_kinematics, t, q, u, gamma=False).W


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
    for k, bodies in enumerate(model.topology.joint_bodies):
        for side, b in enumerate(bodies):
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
        q, err, _ = _driven_position(model, tt, q_prev, tol, max_iters)
        u = _project_velocity(model, tt, q, jnp.zeros_like(q))
        # DOF = 0: the equations of motion determine the same u̇ as W̃u̇ = γ, and their
        # multipliers are the inverse-dynamics efforts (one W/γ evaluation for both).
        _, udot, lam = model.formulation._engine_derivatives(model, tt, q, u)
        st = from_components(tt, q, u)
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
    Raises ValueError if the mechanism is not fully driven (DOF ≠ 0) or a position solve fails
    (checked on concrete inputs). Differentiable in forward and reverse mode with respect to
    the model (geometry, driver parameters) by the implicit function theorem at every instant.
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
    # The mobility check needs values: it runs when the model and state are concrete (call
    # once outside jax.grad/jacfwd/jit to get it; under a transformation it is skipped).
    check = is_concrete((model, state0, times))
    mob = (
        mobility(model, assemble(model, State(t=times[0], q=state0.q, u=state0.u)))
        if check
        else None
    )
    if mob is not None and mob.dof != 0:
        raise ValueError(
            f"kinematic_analysis needs a fully driven mechanism (DOF = 0), but this one has "
            f"DOF = {mob.dof} ({mob.rows} joint equations of rank {mob.rank}). Fix: add drivers "
            "(RotationDriver, TranslationDriver or a driven DP1/DP2/D/CD) for the free "
            "coordinates, or use rbjax.rollout for dynamics."
        )
    if tol is None:
        tol = 1e-12 if state0.q.dtype == jnp.float64 else 1e-5
    _, q0, _ = to_components(state0)
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
    t, q, u = to_components(state)
    terms = joint_terms(
        model, model.formulation._engine_kinematics, t, q, u, cdot=True, gamma=False
    )
    first = [tuple(w.reshape(w.shape[:2] + (-1,))[..., 0] for w in pair) for pair in terms.W]
    return _norm_rows(model, terms.c), _norm_rows(model, terms.cdot), first


def check_mechanism_state(model, state: State, *, tol: float | None = None) -> None:
    """Build-time checks of a mechanism's initial state (skipped when the state, the joints or
    the formulation are traced, e.g. under ``jax.grad`` with respect to a joint point).

    * the joints hold (|Φ| ≤ tol) and their velocity equations hold (|W u + Φ_t| ≤ tol),
      otherwise ValueError naming the joints and suggesting :func:`rbjax.assemble`;
    * the joint equations are independent when the formulation needs a regular Schur
      complement (ScalableDAE, NewtonEuler), otherwise ValueError naming the redundant joints
      and suggesting ``UdwadiaSchutte`` (Moore–Penrose inverse) or removing equations.
    """
    # Only what the checks read must be concrete: the state and the joints (and the
    # formulation's kinematics). A traced mass or force (e.g. under jax.grad in an
    # identification) does not prevent them.
    if not model.joints or not is_concrete((state, model.joints, model.formulation)):
        return
    # the checks never read masses, inertias, gravity or forces: stand-ins for traced ones
    model = jax.tree.map(
        lambda x: np.zeros(x.shape, x.dtype) if isinstance(x, Tracer) else x, model
    )
    if tol is None:
        tol = 1e-8 if state.q.dtype == jnp.float64 else 1e-3
    # evaluated now even when called inside an outer jit/grad trace (the inputs are concrete)
    with jax.ensure_compile_time_eval():
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
    with jax.ensure_compile_time_eval():
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
