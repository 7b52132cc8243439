"""System identification: fit parameters and initial conditions to measured motion.

API
---
``identify(build, params0, data, *, dt, free=None, ...) -> IdentificationResult``

* ``build(params) -> (model, state0)``: the user's map from ANY parameter pytree to a model
  and ONE initial state; the user chooses the parameterisation (``rbjax.Positive`` masses and
  dampers, ``rbjax.PrincipalInertia`` / ``rbjax.LogCholeskyInertia`` inertias, joint points,
  initial spin, ...), so that every raw value is physical and no projection is needed.
* ``free`` selects the fitted leaves (a pytree filter, as ``equinox.partition``'s
  ``filter_spec``): ``None`` = every floating-point array leaf, a bool pytree with
  ``params0``'s structure (or a prefix of it), or a callable ``leaf -> bool``.
* ``data = Measurements(times, observations)``: sample times of any spacing (each ≥ state0.t)
  and observations of body-fixed points (``Position``, markers), ``Orientation``,
  ``Velocity``, ``AngularVelocity``, joint reactions (``ReactionForce``) or any differentiable
  ``Custom(fn)`` of the state, each with its noise standard deviation σ and an optional mask
  of missing samples. Everything is validated at build time (``ValueError`` naming the field,
  the value and the fix).

Statistical model and loss
--------------------------
Independent Gaussian noise: the negative log-likelihood is, up to a constant,

    L(θ) = ½ Σ_obs Σ_k m_k ‖(h_obs(x(t_k; θ), θ) − y_k) / σ_obs‖²        (m_k the mask)

a least-squares problem in the whitened residuals r(θ) = (h − y)/σ. Orientation residuals are
the rotation vector of conj(y_k) ⊗ A(t_k) (sign-invariant: q and −q are one measurement; the
quaternion log of rbjax.quaternion is smooth at the identity). ``residuals(build, params,
data, dt=...)`` exposes r(θ) as a differentiable function.

Simulation at the sample times
------------------------------
Each interval (t_{k−1}, t_k] is split into n_k = ⌈Δt_k / dt⌉ equal steps, counted on the host
from the concrete times (so the step counts are static), and ONE ``lax.scan`` runs every step
with its own step size h and the exact time of its end point; the state is gathered at the
ends of the intervals, i.e. exactly at the sample times (no interpolation). The integrator is
any rbjax integrator (its engine step; default ``RK4()``).

Multiple shooting (``shooting=S``)
----------------------------------
The samples are split into S contiguous segments (Bock & Plitt 1984). The state at the start
of each segment s ≥ 1 (the time of its first sample) is an extra unknown, parameterised so
that every value is a valid state: position r, velocity v and angular velocity ω free; the
attitude as A_ref ⊗ exp(θ/2) with a free rotation vector θ (A_ref = the reference attitude,
so θ starts at 0); ν = 0 and |A| = 1 for rigid bodies (log-scale and ν free for scalable
ones). Mechanisms of rigid bodies: d position and d velocity coordinates in the tangent space
of the joint manifold (d = degrees of freedom): q = (r_ref + δr, A_ref ⊗ exp(δθ/2)) and
u = u_ref + (δv, 0, δω) with (δr, δθ) = N a and (δv, δω) = N b, N (6 nb, d) an orthonormal
basis of the null space of the velocity Jacobian W̃ at the reference state (right singular
vectors), mapped onto the manifold by :func:`rbjax.assemble`, so the state is consistent and
the 12 nb − 2d directions normal to the manifold (which no residual sees) are not unknowns
(the double pendulum: 4 per segment instead of 24, ~5× fewer tangents in forward mode).
Other mechanisms (with scalable bodies) assemble the free-body parameterisation. The
references: the states of a simulation of ``params0``, segment by segment (start s+1 = end
of segment s), or ``segment_states0``, guesses at the sample times, e.g. estimated from the
measurements (Bock's recommendation: on chaotic or poorly guessed problems a simulation of
the guess leaves the data within a few segments and the fit stalls in a local minimum;
guesses from the data keep every segment near it). All segments are integrated in parallel
(``vmap`` over segments, padded to equal length with h = 0 steps whose states are never
read).
Continuity residuals √w·(end of segment s − start of segment s+1): position [m], rotation
vector [rad], velocity [m/s], angular velocity [rad/s] (and for scalable bodies ½ log|A|² and
ν). ``continuity_weight`` w = 1/σ_c²: the default w = 1e6 treats a gap of σ_c = 1e-3 SI units
like a one-σ misfit, so at the optimum the gaps are far below typical measurement noise while
the problem stays well conditioned; the final gaps are reported (``continuity_gaps``). With
mechanisms, integrate with ``Projected(...)`` or ``ImplicitMidpoint()`` (or a small dt): a
segment that drifts off the joint manifold cannot meet its (assembled) successor, and the
drift remains as a gap.
Short segments keep the loss landscape smooth on chaotic or long horizons, where single
shooting has exponentially growing sensitivities.

Derivatives and optimisers
--------------------------
The whitened residuals and their Jacobian J = ∂r/∂θ are ONE compiled function (``jax.jacfwd``:
p tangents of one forward simulation, cheaper than reverse mode for the few parameters of an
identification, and the J is needed for the covariance anyway); with ``autodiff="reverse"``
(automatic above 64 free scalars) the optimiser uses reverse-mode gradients and J is formed
once at the end (``jacfwd`` or ``jacrev``, whichever is cheaper: p ≤ N or not). The compiled
functions are module-level ``equinox.filter_jit`` functions of (problem, parameters): a second
``identify`` call with the same ``build`` and the same shapes reuses them (e.g. Monte-Carlo
studies), only the data values change.

* ``optimizer="lbfgs"`` (default): the L-BFGS direction of ``optax.scale_by_lbfgs`` (the
  two-loop recursion of Nocedal & Wright, "Numerical Optimization", 2nd ed., Alg. 7.4) and a
  strong-Wolfe zoom line search (N&W Alg. 3.5–3.6, c₁ = 1e-4, c₂ = 0.9, cubic interpolation)
  driven from Python with the compiled residual function. This is optax's ``lbfgs`` with its
  zoom line search moved out of the compiled step: inside a compiled step the line search
  traces the objective and its gradient three times (``value_and_grad_from_state`` and the two
  branches of the zoom loop); for a free body that step compiled in 40 s against 5 s for the
  objective alone (2-core CPU), and compile time dominates identification problems.
* ``optimizer="lm"``: Levenberg–Marquardt (Moré 1978 scaling, Nielsen 1999 damping) on the
  whitened residuals, one (r, J) evaluation a step. Least squares is its home ground: on the
  tests' spinning body it needs a quarter of the steps of L-BFGS (single shooting: 11
  against 46) and converges with multiple shooting in 11 steps where L-BFGS needs ~300 (the
  continuity rows make the problem stiff for a quasi-Newton method).
* ``optimizer="adam"`` (``optax.adam(learning_rate)``) or any ``optax.GradientTransformation``:
  one compiled optimiser update per step, the gradient Jᵀr.
* an ``optax.GradientTransformationExtraArgs`` that needs the objective (e.g. ``optax.lbfgs()``
  with its zoom line search): one ``filter_jit`` step with ``optax.value_and_grad_from_state``
  and ``value_fn`` = the loss, exactly as optax documents it (slow to compile, see above).

Stopping: after ``max_steps`` steps; when a step decreases the loss by less than ``tol`` × the
loss (relative change; Adam-type methods: over 10 steps); when the gradient test holds:
MINPACK's scale-free orthogonality test max_i |J_iᵀr| / (‖J_i‖ ‖r‖) ≤ ``gtol`` (the cosine
between the residual vector and every Jacobian column; Moré, Garbow & Hillstrom, "User guide
for MINPACK-1", 1980) when J is known, else ‖∇L‖∞ ≤ ``gtol``; or when no step decreases the
loss any more (converged if the Gauss–Newton step then predicts a decrease below the rounding
error of the loss, from 1e4 ulp of the measured values, or below 1e-6 of the loss: the
linearised problem is solved to working precision; without J: ‖∇L‖∞ ≤ 1000 gtol). A
non-finite loss at an iterate raises ``ValueError`` naming the optimiser step; non-finite
trial points of a line search (or of an LM step) count as too long a step.

Uncertainty and identifiability
-------------------------------
At the estimate, the Gauss–Newton matrix H = JᵀJ of the whitened residuals is the Fisher
information, and its inverse the (asymptotic) covariance of the estimate (e.g. Bard,
"Nonlinear Parameter Estimation", 1974, ch. 7; Ljung, "System Identification", 1999, §9.3).
Identifiability is judged on the column-scaled matrix Ĥ = D H D, D = diag(1/‖J_i‖) (unit
diagonal: free of parameter units): eigenvalues below ``rtol_identifiable`` × the largest are
null directions (the data cannot determine the parameters along them). Each is reported BY
NAME, in the raw parameter coordinates (D v, unit length, reduced row-echelon form when there
are several, so each names few parameters), e.g. "+0.577·['I'].raw[0] +0.577·['I'].raw[1]
+0.577·['I'].raw[2]" for the scale of an inertia under torque-free motion. The covariance is
the pseudo-inverse of H on the identifiable subspace; parameters that take part in a null
direction get an infinite standard error (and NaN covariances). With multiple shooting the
continuity equations are treated as exact for the covariance: the segment start states are
eliminated through the linearised continuity equations (J_red = J_θ − J_s C_s⁺ C_θ, the
marginal of the physical parameters in the limit w → ∞), so at a continuous estimate the
covariance is the single-shooting one; the finite weight w is an optimisation device, not a
noise model, and must not inflate the standard errors. The reduced χ² = 2 L_data / (N − p)
is ≈ 1 when σ is right and the model fits.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree
from jaxtyping import Array

from . import _quaternion as quat
from ._analysis.assembly import assemble
from ._analysis.checks import check_mechanism_state
from ._analysis.mobility import jacobian_matrix, mobility
from ._engine.layout import to_components
from ._errors import fail
from ._integrators import RK4, AbstractIntegrator
from ._reactions import reactions
from ._state import State

__all__ = [
    "AbstractObservation",
    "AngularVelocity",
    "Custom",
    "IdentificationResult",
    "Measurements",
    "Orientation",
    "Position",
    "ReactionForce",
    "Velocity",
    "identify",
    "residuals",
]

# --------------------------------------------------------------------------- observations


def _as_float(name: str, x) -> np.ndarray:
    try:
        return np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        fail(name, x, "is not an array of numbers", "pass a float array")
        raise  # unreachable (fail raises); keeps type checkers content


def _check_values(obj: str, values, width: int | None) -> np.ndarray:
    v = _as_float(f"{obj}.values", values)
    if v.ndim != 2 or v.shape[0] < 1 or (width is not None and v.shape[1] != width):
        want = f"(K, {width})" if width is not None else "(K, d)"
        fail(
            f"{obj}.values",
            f"<array shape {v.shape}>",
            f"is not a {want} array",
            f"pass one row of {width if width is not None else 'd'} numbers per sample time",
        )
    return v


def _check_sigma(obj: str, sigma, d: int) -> np.ndarray:
    s = _as_float(f"{obj}.sigma", sigma)
    if s.shape not in ((), (d,)) or not np.all(np.isfinite(s)) or np.any(s <= 0):
        fail(
            f"{obj}.sigma",
            sigma,
            f"is not a positive finite scalar or a ({d},) vector of them",
            "pass the noise standard deviation (> 0) in the observation's units",
        )
    return np.broadcast_to(s, (d,)).copy()


def _check_mask(obj: str, mask, k: int) -> np.ndarray:
    if mask is None:
        return np.ones(k, dtype=bool)
    m = np.asarray(mask)
    if m.shape != (k,) or m.dtype != np.bool_:
        fail(
            f"{obj}.mask",
            f"<{m.dtype} array shape {m.shape}>",
            f"is not a boolean array of shape ({k},)",
            "pass True where a sample exists and False where it is missing",
        )
    return m


def _check_finite_rows(obj: str, v: np.ndarray, mask: np.ndarray) -> np.ndarray:
    ok = np.all(np.isfinite(v), axis=1) | ~mask
    if not np.all(ok):
        k = int(np.argmin(ok))
        fail(
            f"{obj}.values[{k}]",
            v[k],
            "is not finite at a sample that is not masked",
            "set mask[k] = False for missing samples (their values are ignored)",
        )
    return np.where(np.isfinite(v), v, 0.0)


def _check_body_key(obj: str, field: str, key) -> int | str:
    if isinstance(key, (bool, np.bool_)) or not isinstance(key, (int, np.integer, str)):
        fail(f"{obj}.{field}", key, "is not a name or an index", "pass a str name or an int")
    return key if isinstance(key, str) else int(key)


def _resolve(key: int | str, pool: tuple[str, ...], what: str, where: str) -> int:
    """Index of ``key`` (name or index) in ``pool``; ValueError naming ``where`` otherwise."""
    if isinstance(key, str):
        if key not in pool:
            fail(
                where,
                key,
                f"is not the name of a {what} of the model (names: {list(pool)})",
                f"use one of these names or an index in [0, {len(pool)})",
            )
        return pool.index(key)
    if not 0 <= key < len(pool):
        fail(
            where,
            key,
            f"is not an index of the model's {len(pool)} {what}s",
            f"use an index in [0, {len(pool)}) or a name from {list(pool)}",
        )
    return int(key)


class AbstractObservation(eqx.Module):
    """A measured quantity at the sample times.

    ``values`` (K, m) the measurements (m = 4 for quaternions, else the residual width d),
    ``sigma`` (d,) the noise standard deviation in the quantity's units, ``mask`` (K,) True
    where a sample exists. Subclasses implement :meth:`predict` (or :meth:`error`) for a batch
    of K states and :meth:`check` against the model.
    """

    values: Array
    sigma: Array
    mask: Array

    @property
    def dim(self) -> int:
        """Residual components per sample."""
        return int(np.shape(self.sigma)[0])

    def check(self, model, state0: State, where: str) -> None:
        """Build-time validation against the model (names, indices, joints)."""

    @abc.abstractmethod
    def predict(self, model, states: State) -> Array:
        """Prediction (K, d) at the K states."""

    def error(self, model, states: State) -> Array:
        """Prediction − measurement (K, d), in the quantity's units."""
        return self.predict(model, states) - self.values

    def residual(self, model, states: State) -> Array:
        """Whitened residual (prediction − measurement)/σ (K, d), 0 at masked samples."""
        r = self.error(model, states) / self.sigma
        return jnp.where(self.mask[:, None], r, 0.0)


def _body_state(model, states: State, key, where: str):
    b = _resolve(key, model.names, "body", where)
    return states.q[:, b], states.u[:, b], b


class _AbstractBodyObservation(AbstractObservation):
    """An observation of one body (``body``: name or index), resolved against the model."""

    body: eqx.AbstractVar[int | str]

    def check(self, model, state0, where):
        _resolve(self.body, model.names, "body", f"{where}.body")


class Position(_AbstractBodyObservation):
    """World position [m] of the body-fixed point ``point`` (body axes, from the centre of
    mass) of ``body`` (name or index), a marker: x = r + s R(A) p̄ (seed 000 eq. (32)).
    ``values`` (K, 3), ``sigma`` scalar or (3,) [m]."""

    body: int | str = eqx.field(static=True)
    point: Array

    def __init__(self, body, values, sigma, *, point=(0.0, 0.0, 0.0), mask=None):
        v = _check_values("Position", values, 3)
        m = _check_mask("Position", mask, v.shape[0])
        p = _as_float("Position.point", point)
        if p.shape != (3,) or not np.all(np.isfinite(p)):
            fail("Position.point", point, "is not 3 finite numbers", "pass (x, y, z) in m")
        self.body = _check_body_key("Position", "body", body)
        self.values = jnp.asarray(_check_finite_rows("Position", v, m))
        self.sigma = jnp.asarray(_check_sigma("Position", sigma, 3))
        self.mask = jnp.asarray(m)
        self.point = jnp.asarray(p)

    def predict(self, model, states):
        q, _, _ = _body_state(model, states, self.body, "Position.body")
        p = jnp.broadcast_to(self.point.astype(q.dtype), q[:, 0:3].shape)
        return q[:, 0:3] + quat.transform(q[:, 3:7], p)


class Orientation(_AbstractBodyObservation):
    """Attitude of ``body`` as unit quaternions ``values`` (K, 4), scalar first, body → world.

    The residual is the rotation vector [rad] of the relative rotation conj(y_k) ⊗ A(t_k),
    2 log(·) (rbjax.quaternion.log: shortest branch, so q and −q are the same measurement, and
    smooth at the identity); ``sigma`` scalar or (3,) [rad] per axis of that vector. Values
    must be within 1e-3 of unit length (they are normalised)."""

    body: int | str = eqx.field(static=True)

    def __init__(self, body, values, sigma, *, mask=None):
        v = _check_values("Orientation", values, 4)
        m = _check_mask("Orientation", mask, v.shape[0])
        v = _check_finite_rows("Orientation", v, m)
        norm = np.linalg.norm(v, axis=1)
        bad = m & (np.abs(norm - 1.0) > 1e-3)
        if np.any(bad):
            k = int(np.argmax(bad))
            fail(
                f"Orientation.values[{k}]",
                v[k],
                f"has norm {norm[k]:.6g}, not a unit quaternion",
                "pass unit quaternions, scalar first (a0, a1, a2, a3); scipy's as_quat() is "
                "scalar last: use q[..., [3, 0, 1, 2]]",
            )
        v = np.where(m[:, None], v / np.where(norm > 0, norm, 1.0)[:, None], [1.0, 0, 0, 0])
        self.body = _check_body_key("Orientation", "body", body)
        self.values = jnp.asarray(v)
        self.sigma = jnp.asarray(_check_sigma("Orientation", sigma, 3))
        self.mask = jnp.asarray(m)

    def predict(self, model, states):
        q, _, _ = _body_state(model, states, self.body, "Orientation.body")
        return q[:, 3:7]

    def error(self, model, states):
        return _rotvec_between(self.values.astype(states.q.dtype), self.predict(model, states))


class AngularVelocity(_AbstractBodyObservation):
    """Angular velocity [rad/s] of ``body``: ``frame="body"`` (body axes, a gyroscope) or
    ``"world"``. From the state's ω (seed 000 eq. (37)): the body-frame angular velocity for a
    rigid body, ω/s for a scalable one (eq. (49)); world = R(A) × body. values (K, 3)."""

    body: int | str = eqx.field(static=True)
    frame: str = eqx.field(static=True)

    def __init__(self, body, values, sigma, *, frame="body", mask=None):
        if frame not in ("body", "world"):
            fail("AngularVelocity.frame", frame, "is not 'body' or 'world'", "pass one of them")
        v = _check_values("AngularVelocity", values, 3)
        m = _check_mask("AngularVelocity", mask, v.shape[0])
        self.body = _check_body_key("AngularVelocity", "body", body)
        self.frame = frame
        self.values = jnp.asarray(_check_finite_rows("AngularVelocity", v, m))
        self.sigma = jnp.asarray(_check_sigma("AngularVelocity", sigma, 3))
        self.mask = jnp.asarray(m)

    def predict(self, model, states):
        q, u, b = _body_state(model, states, self.body, "AngularVelocity.body")
        w = u[:, 4:7]
        if model.scalable[b]:
            w = w / jnp.sum(q[:, 3:7] ** 2, axis=-1, keepdims=True)
        return w if self.frame == "body" else quat.rotate(q[:, 3:7], w)


class Velocity(_AbstractBodyObservation):
    """World velocity [m/s] of the centre of mass of ``body``. values (K, 3)."""

    body: int | str = eqx.field(static=True)

    def __init__(self, body, values, sigma, *, mask=None):
        v = _check_values("Velocity", values, 3)
        m = _check_mask("Velocity", mask, v.shape[0])
        self.body = _check_body_key("Velocity", "body", body)
        self.values = jnp.asarray(_check_finite_rows("Velocity", v, m))
        self.sigma = jnp.asarray(_check_sigma("Velocity", sigma, 3))
        self.mask = jnp.asarray(m)

    def predict(self, model, states):
        _, u, _ = _body_state(model, states, self.body, "Velocity.body")
        return u[:, 0:3]


class ReactionForce(AbstractObservation):
    """Reaction force [N] (``torque=True``: torque [N m] about the joint point) that ``joint``
    (name or index) exerts on its body ``side`` ("i" or "j"), in the ``"world"`` frame or that
    body's ``"joint"`` frame, from :func:`rbjax.reactions` (the multipliers of the equations of
    motion, seed 000 eq. (81)). values (K, 3)."""

    joint: int | str = eqx.field(static=True)
    side: str = eqx.field(static=True)
    frame: str = eqx.field(static=True)
    torque: bool = eqx.field(static=True)

    def __init__(self, joint, values, sigma, *, side="j", frame="world", torque=False, mask=None):
        if side not in ("i", "j"):
            fail("ReactionForce.side", side, "is not 'i' or 'j'", "pass side='i' or 'j'")
        if frame not in ("world", "joint"):
            fail("ReactionForce.frame", frame, "is not 'world' or 'joint'", "pass one of them")
        if not isinstance(torque, (bool, np.bool_)):
            fail("ReactionForce.torque", torque, "is not a bool", "pass True or False")
        v = _check_values("ReactionForce", values, 3)
        m = _check_mask("ReactionForce", mask, v.shape[0])
        self.joint = _check_body_key("ReactionForce", "joint", joint)
        self.side, self.frame, self.torque = side, frame, bool(torque)
        self.values = jnp.asarray(_check_finite_rows("ReactionForce", v, m))
        self.sigma = jnp.asarray(_check_sigma("ReactionForce", sigma, 3))
        self.mask = jnp.asarray(m)

    def check(self, model, state0, where):
        if not model.joints:
            fail(
                f"{where}.joint",
                self.joint,
                "observes a joint reaction but the model has no joints",
                "add the joint to the model (Model(..., joints=[...])) or remove this observation",
            )
        _resolve(self.joint, model.joint_names, "joint", f"{where}.joint")

    def predict(self, model, states):
        k = _resolve(self.joint, model.joint_names, "joint", "ReactionForce.joint")
        rx = reactions(model, states)
        name = ("torque" if self.torque else "force") + f"_{self.side}"
        name += "_joint" if self.frame == "joint" else ""
        return getattr(rx, name)[:, k]


class Custom(AbstractObservation):
    """Any differentiable ``fn(model, state) -> (d,)`` of ONE state (``state.q`` (nb, 7));
    ``values`` (K, d), ``sigma`` scalar or (d,) in fn's units. ``fn`` is static: pass a
    module-level function (or the same object each time) to reuse compiled code."""

    fn: Callable = eqx.field(static=True)

    def __init__(self, fn, values, sigma, *, mask=None):
        if not callable(fn):
            fail("Custom.fn", fn, "is not callable", "pass fn(model, state) -> array (d,)")
        v = _check_values("Custom", values, None)
        m = _check_mask("Custom", mask, v.shape[0])
        self.fn = fn
        self.values = jnp.asarray(_check_finite_rows("Custom", v, m))
        self.sigma = jnp.asarray(_check_sigma("Custom", sigma, v.shape[1]))
        self.mask = jnp.asarray(m)

    def check(self, model, state0, where):
        try:
            out = jax.eval_shape(self.fn, model, state0)
        except Exception as e:  # noqa: BLE001 - report any failure of the user's function
            fail(f"{where}.fn", self.fn, f"fails on (model, state0): {e!r}", "fix the function")
            raise
        shape = getattr(out, "shape", None)
        if shape != (self.dim,):
            fail(
                f"{where}.fn",
                self.fn,
                f"returns shape {shape} for one state, not ({self.dim},) as values has",
                "return a 1-D array with one entry per column of values",
            )

    def predict(self, model, states):
        return jax.vmap(lambda s: jnp.asarray(self.fn(model, s)))(states)


def _rotvec_between(a, b):
    """Rotation vector [rad] of conj(a) ⊗ b for quaternions (..., 4): sign- and
    scale-invariant (quaternion.log takes the shortest branch and atan2 of the parts)."""
    return 2.0 * quat.log(quat.mul(quat.conjugate(a), b))


class Measurements(eqx.Module):
    """Sample ``times`` (K,) [s], strictly increasing, any spacing, and the ``observations``
    (a tuple of observation objects, each with K rows)."""

    times: np.ndarray
    observations: tuple[AbstractObservation, ...]

    def __init__(self, times, observations):
        t = _as_float("Measurements.times", times)
        if t.ndim != 1 or t.size < 1 or not np.all(np.isfinite(t)):
            fail(
                "Measurements.times",
                times if t.size <= 12 else f"<array shape {t.shape}>",
                "is not a non-empty 1-D array of finite times",
                "pass the sample times in s as a (K,) array",
            )
        step = np.diff(t)
        if np.any(step <= 0):
            k = int(np.argmax(step <= 0))
            fail(
                f"Measurements.times[{k + 1}]",
                t[k + 1],
                f"is not after times[{k}] = {t[k]!r} (times must be strictly increasing)",
                "sort the samples and merge samples taken at the same time",
            )
        obs = tuple(observations) if isinstance(observations, (list, tuple)) else (observations,)
        if not obs:
            fail("Measurements.observations", "()", "is empty", "pass at least one observation")
        for i, o in enumerate(obs):
            if not isinstance(o, AbstractObservation):
                fail(
                    f"Measurements.observations[{i}]",
                    type(o).__name__,
                    "is not an rbjax observation",
                    "use Position, Orientation, Velocity, AngularVelocity, ReactionForce or Custom",
                )
            if o.values.shape[0] != t.size:
                fail(
                    f"Measurements.observations[{i}].values ({type(o).__name__})",
                    f"<{o.values.shape[0]} rows>",
                    f"does not match the {t.size} sample times",
                    "pass one row per sample time; mark missing samples with mask=",
                )
        self.times = t
        self.observations = obs

    @property
    def count(self) -> int:
        """Number of measured scalars N (masked samples excluded)."""
        return int(sum(int(np.sum(np.asarray(o.mask))) * o.dim for o in self.observations))


# --------------------------------------------------------------------------- schedule


def _schedule(t0: float, times: np.ndarray, dt: float):
    """Steps reaching every sample time exactly: ``hs`` (n,) step sizes, ``ts`` (n,) the exact
    time at the end of each step, ``idx`` (K,) index of each sample's state among [initial,
    after step 1, ...]. n_k = ⌈Δt_k/dt⌉ equal steps per interval (1e-9 relative slack for
    rounding in Δt_k/dt)."""
    hs: list[float] = []
    ts: list[float] = []
    idx: list[int] = []
    prev = float(t0)
    for t in times:
        t = float(t)
        if t > prev:
            n = max(1, int(np.ceil((t - prev) / dt - 1e-9)))
            h = (t - prev) / n
            hs += [h] * n
            ts += [prev + (j + 1) * h for j in range(n - 1)] + [t]
        idx.append(len(hs))
        prev = t
    return np.asarray(hs, dtype=np.float64), np.asarray(ts, dtype=np.float64), np.asarray(idx)


def _segments(t0: float, times: np.ndarray, dt: float, n_seg: int):
    """Multiple-shooting layout: per segment its start time and step schedule, padded to a
    common length (h = 0, time held) with the flat index of each sample's state and of each
    segment's end state in the (S·(n+1)) stacked trajectory."""
    k_total = times.size
    chunks = np.array_split(np.arange(k_total), n_seg)
    starts = [float(t0)] + [float(times[c[0]]) for c in chunks[1:]]
    scheds = []
    for s, c in enumerate(chunks):
        seg_t = times[c] if s == n_seg - 1 else np.concatenate([times[c], [starts[s + 1]]])
        scheds.append(_schedule(starts[s], seg_t, dt))
    n = max(len(h) for h, _, _ in scheds)
    hs = np.zeros((n_seg, n))
    ts = np.zeros((n_seg, n))
    pick, ends = [], []
    for s, (h, t, i) in enumerate(scheds):
        hs[s, : len(h)] = h
        ts[s, :] = starts[s] if len(t) == 0 else t[-1]
        ts[s, : len(t)] = t
        pick += list(s * (n + 1) + i[: len(chunks[s])])
        if s < n_seg - 1:
            ends.append(s * (n + 1) + i[-1])
    return (
        np.asarray(starts),
        hs,
        ts,
        np.asarray(pick, dtype=np.int32),
        np.asarray(ends, dtype=np.int32),
        int(sum(len(h) for h, _, _ in scheds)),
    )


# --------------------------------------------------------------------------- the problem


class _Problem(eqx.Module):
    """Everything the compiled residual function needs. Static: ``build``, the observation
    kinds and body keys, the segment count; arrays (data, schedules, fixed parameters) are
    traced, so a new data set of the same shapes reuses the compiled code."""

    build: Callable = eqx.field(static=True)
    fixed: Any
    observations: tuple[AbstractObservation, ...]
    integrator: AbstractIntegrator
    t_start: Array  # (S,)
    hs: Array  # (S, n)
    ts: Array  # (S, n)
    pick: Array  # (K,) flat state index of each sample
    ends: Array  # (S − 1,) flat state index of each segment's end
    a_ref: Array | None  # (S − 1, nb, 4) reference attitudes of the segment starts
    # mechanisms of rigid bodies: reference segment start states on the joint manifold and
    # an orthonormal basis of the null space of the velocity Jacobian W̃ there
    ref_q: Array | None  # (S − 1, nb, 7)
    ref_u: Array | None  # (S − 1, nb, 7)
    basis: Array | None  # (S − 1, 6 nb, d), d = degrees of freedom
    sqrt_w: Array
    n_seg: int = eqx.field(static=True)


def _params(problem: _Problem, dyn):
    return eqx.combine(dyn, problem.fixed)


def _segment_states(problem: _Problem, model, seg) -> State:
    """Valid states from the free segment variables (see the module docstring)."""
    if problem.basis is not None:  # mechanism: d position and d velocity coordinates
        assert problem.ref_q is not None and problem.ref_u is not None
        nb = problem.ref_q.shape[-2]
        dx = jnp.einsum("sij,sj->si", problem.basis, seg["dq"]).reshape(-1, nb, 6)
        dv = jnp.einsum("sij,sj->si", problem.basis, seg["du"]).reshape(-1, nb, 6)
        ref_q, ref_u = problem.ref_q, problem.ref_u
        a = quat.mul(ref_q[..., 3:7], quat.exp(0.5 * dx[..., 3:6]))
        q = jnp.concatenate([ref_q[..., 0:3] + dx[..., 0:3], a], axis=-1)
        u = jnp.concatenate(
            [
                ref_u[..., 0:3] + dv[..., 0:3],
                jnp.zeros_like(dv[..., :1]),
                ref_u[..., 4:7] + dv[..., 3:6],
            ],
            axis=-1,
        )
        return assemble(model, State(t=problem.t_start[1:].astype(q.dtype), q=q, u=u))
    assert problem.a_ref is not None
    a = quat.mul(problem.a_ref, quat.exp(0.5 * seg["rotation"]))
    nu = jnp.zeros_like(seg["r"][..., 0])
    if "log_scale" in seg:
        scal = jnp.asarray(model.scalable)
        a = a * jnp.where(scal, jnp.exp(seg["log_scale"]), 1.0)[..., None]
        nu = jnp.where(scal, seg["nu"], 0.0)
    q = jnp.concatenate([seg["r"], a], axis=-1)
    u = jnp.concatenate([seg["v"], nu[..., None], seg["omega"]], axis=-1)
    st = State(t=problem.t_start[1:].astype(q.dtype), q=q, u=u)
    return assemble(model, st) if model.joints else st


def _integrate(problem: _Problem, model, init: State):
    """All segments in parallel: (S, n + 1, nb, 7) states (initial first) and the AND of the
    integrator's success flags."""
    integ = problem.integrator

    def one(t0, q0, u0, hs, ts):
        t, q, u = to_components(State(t=t0, q=q0, u=u0))

        def step(carry, ht):
            t, q, u, ok = carry
            h, t_end = ht
            _, q, u, good = integ._engine_step(model, t, q, u, h)
            return (t_end[None], q, u, ok & jnp.all(good)), (q, u)

        ok0 = jnp.asarray(True)
        (_, _, _, ok), (qs, us) = jax.lax.scan(step, (t, q, u, ok0), (hs, ts))
        qs = jnp.concatenate([q[None], qs])
        us = jnp.concatenate([u[None], us])
        return jnp.moveaxis(qs, 1, -1), jnp.moveaxis(us, 1, -1), ok

    if problem.hs.shape[1] == 0:  # every sample at t0: nothing to integrate
        return init.q[:, None], init.u[:, None], jnp.asarray(True)
    hs = problem.hs.astype(init.q.dtype)
    ts = problem.ts.astype(init.q.dtype)
    qs, us, ok = jax.vmap(one)(init.t, init.q, init.u, hs, ts)
    return qs, us, jnp.all(ok)


def _residual_vector(problem: _Problem, x):
    """Whitened residuals r(θ) (observations in order, then continuity) and auxiliary output
    (segment end states for the initialisation, the simulation's success flag)."""
    dyn, seg = x
    model, st0 = problem.build(_params(problem, dyn))
    dtype = st0.q.dtype
    first = jax.tree.map(lambda a: jnp.asarray(a)[None], st0)
    if problem.n_seg > 1:
        rest = _segment_states(problem, model, seg)
        init = jax.tree.map(lambda a, b: jnp.concatenate([a, b.astype(a.dtype)]), first, rest)
    else:
        rest, init = None, first
    init = State(t=jnp.broadcast_to(init.t, init.q.shape[:1]).astype(dtype), q=init.q, u=init.u)
    qs, us, ok = _integrate(problem, model, init)
    qf = qs.reshape((-1,) + qs.shape[2:])
    uf = us.reshape((-1,) + us.shape[2:])
    tf = jnp.concatenate([init.t[:, None], problem.ts.astype(dtype)], axis=1).reshape(-1)
    samples = State(t=tf[problem.pick], q=qf[problem.pick], u=uf[problem.pick])
    parts = [o.residual(model, samples).reshape(-1) for o in problem.observations]
    ends = None
    if rest is not None:
        ends = State(t=tf[problem.ends], q=qf[problem.ends], u=uf[problem.ends])
        parts += [problem.sqrt_w * g.reshape(-1) for g in _gaps(model, ends, rest)]
    r = jnp.concatenate(parts)
    r = jnp.where(ok, r, jnp.nan)  # a failed implicit step makes the loss non-finite
    return r, ends


def _gaps(model, end: State, start: State):
    """Continuity gaps end − start: position, rotation vector, velocity, angular velocity, and
    for scalable bodies ½ log|A|² and ν."""
    out = [
        end.q[..., 0:3] - start.q[..., 0:3],
        _rotvec_between(start.q[..., 3:7], end.q[..., 3:7]),
        end.u[..., 0:3] - start.u[..., 0:3],
        end.u[..., 4:7] - start.u[..., 4:7],
    ]
    scal = np.flatnonzero(np.asarray(model.scalable))
    if scal.size:
        half_log = lambda s: 0.5 * jnp.log(jnp.sum(s.q[..., scal, 3:7] ** 2, axis=-1))
        out += [half_log(end) - half_log(start), end.u[..., scal, 3] - start.u[..., scal, 3]]
    return out


def _unravel(template, flat):
    return ravel_pytree(template)[1](flat)


@eqx.filter_jit
def _eval_forward(problem: _Problem, template, flat):
    """(r, J, aux) with J = ∂r/∂θ by forward mode (``jax.jacfwd``: p tangents)."""

    def f(v):
        r, aux = _residual_vector(problem, _unravel(template, v))
        return r, (r, aux)

    jac, (r, aux) = jax.jacfwd(f, has_aux=True)(flat)
    return r, jac, aux


@eqx.filter_jit
def _eval_reverse(problem: _Problem, template, flat):
    """(r, ∇L, aux) with L = ½‖r‖² by reverse mode."""

    def f(v):
        r, aux = _residual_vector(problem, _unravel(template, v))
        return 0.5 * jnp.sum(r * r), (r, aux)

    (_, (r, aux)), g = jax.value_and_grad(f, has_aux=True)(flat)
    return r, g, aux


@eqx.filter_jit
def _jacobian_reverse(problem: _Problem, template, flat):
    """J = ∂r/∂θ by reverse mode (``jax.jacrev``: one vjp per residual)."""
    return jax.jacrev(lambda v: _residual_vector(problem, _unravel(template, v))[0])(flat)


@eqx.filter_jit
def _extra_args_step(problem: _Problem, template, opt, flat, state):
    """One step of an optax transform that needs the objective (``value_fn``), e.g.
    ``optax.lbfgs()`` with its zoom line search, as optax documents it."""

    def loss(v):
        r, _ = _residual_vector(problem, _unravel(template, v))
        return 0.5 * jnp.sum(r * r)

    if optax.tree.get(state, "value") is not None:
        value, grad = optax.value_and_grad_from_state(loss)(flat, state=state)
    else:
        value, grad = jax.value_and_grad(loss)(flat)
    updates, state = opt.update(grad, state, flat, value=value, grad=grad, value_fn=loss)
    return optax.apply_updates(flat, updates), state, value, grad


@eqx.filter_jit
def _plain_update(opt, grad, state, flat):
    updates, state = opt.update(grad, state, flat)
    return updates, state


@functools.lru_cache(maxsize=8)
def _lbfgs_direction(memory_size: int):
    """optax's L-BFGS two-loop recursion (no line search), one object per memory size so
    that its compiled update is reused."""
    return optax.scale_by_lbfgs(memory_size=memory_size)


@functools.lru_cache(maxsize=32)
def _adam(learning_rate: float):
    return optax.adam(learning_rate)


# --------------------------------------------------------------------------- line search


def _cubic_min(a, fa, da, b, fb, db):
    """Minimiser of the cubic interpolating (a, fa, da), (b, fb, db) (N&W eq. (3.59)), or
    None."""
    d1 = da + db - 3.0 * (fa - fb) / (a - b)
    disc = d1 * d1 - da * db
    if not np.isfinite(disc) or disc < 0:
        return None
    d2 = np.sign(b - a) * np.sqrt(disc)
    den = db - da + 2.0 * d2
    if den == 0 or not np.isfinite(den):
        return None
    return b - (b - a) * (db + d2 - d1) / den


def _line_search(phi, f0, d0, alpha=1.0, c1=1e-4, c2=0.9, max_evals=25):
    """Strong-Wolfe line search (Nocedal & Wright 2006, Alg. 3.5 with the zoom of Alg. 3.6,
    safeguarded cubic interpolation). ``phi(α) -> (f, f', payload)``; non-finite values count
    as a failed sufficient decrease. Returns (α, f, payload) of an accepted point, or None."""
    evals = 0
    best = None  # lowest point with sufficient decrease, returned if the search runs out

    def sufficient(a, f):
        return np.isfinite(f) and f <= f0 + c1 * a * d0

    def zoom(lo, f_lo, d_lo, hi, f_hi, d_hi):
        nonlocal evals, best
        while evals < max_evals:
            width = hi - lo
            a = None
            if np.isfinite(f_hi) and np.isfinite(d_hi):
                a = _cubic_min(lo, f_lo, d_lo, hi, f_hi, d_hi)
            lo_b, hi_b = sorted((lo + 0.1 * width, hi - 0.1 * width))
            if a is None or not lo_b <= a <= hi_b:
                a = 0.5 * (lo + hi)
            f, d, p = phi(a)
            evals += 1
            if not sufficient(a, f) or f >= f_lo:
                hi, f_hi, d_hi = a, f, d
            else:
                if best is None or f < best[1]:
                    best = (a, f, p)
                if abs(d) <= -c2 * d0:
                    return a, f, p
                if d * (hi - lo) >= 0:
                    hi, f_hi, d_hi = lo, f_lo, d_lo
                lo, f_lo, d_lo = a, f, d
            if abs(hi - lo) <= 1e-14 * max(abs(lo), abs(hi), 1e-300):
                break
        return best

    a_prev, f_prev, d_prev = 0.0, f0, d0
    a = alpha
    while evals < max_evals:
        f, d, p = phi(a)
        evals += 1
        if not sufficient(a, f) or (evals > 1 and f >= f_prev):
            return zoom(a_prev, f_prev, d_prev, a, f, d)
        best = (a, f, p) if best is None or f < best[1] else best
        if abs(d) <= -c2 * d0:
            return a, f, p
        if d >= 0:
            return zoom(a, f, d, a_prev, f_prev, d_prev)
        a_prev, f_prev, d_prev = a, f, d
        a = 2.0 * a
    return best


# --------------------------------------------------------------------------- results


class IdentificationResult(eqx.Module):
    """What :func:`identify` found.

    * ``params``: the estimate, the full pytree (free leaves fitted, the rest as given).
    * ``loss`` (final L = ½‖r‖², continuity included), ``loss_history`` (np.ndarray: the loss
      at the initial guess and after every optimiser step), ``steps``, ``converged``,
      ``message`` (why the optimiser stopped).
    * ``residuals``: one (K, d) array per observation, whitened ((pred − meas)/σ) at the
      estimate, NaN at masked samples.
    * ``names``: the free scalars, from the pytree paths (``jax.tree_util.keystr``) plus the
      element index, e.g. ``"['inertia'].raw_moments[1]"``; ``estimate``: their values.
    * ``covariance`` (p, p): Gauss–Newton (JᵀJ)⁻¹ over ``names`` (pseudo-inverse on the
      identifiable subspace; with multiple shooting the marginal block of the physical
      parameters); rows and columns of unidentifiable parameters are NaN with ``inf`` on the
      diagonal.
    * ``std_errors``: a pytree like ``params`` with the standard errors of the free leaves
      (``inf`` where unidentifiable) and ``None`` at fixed leaves.
    * ``unidentifiable``: one readable string per direction the data cannot determine.
    * ``reduced_chi2``: 2 L_data / (N − p), N the measured scalars (NaN if N ≤ p).
    * ``segment_states`` (multiple shooting): the fitted states at the starts of segments
      1..S−1 (a batched State), and ``continuity_gaps``: the largest |gap| of position [m],
      rotation [rad], velocity [m/s] and angular velocity [rad/s] at the estimate.
    """

    params: Any
    loss: float
    loss_history: np.ndarray
    steps: int
    converged: bool
    residuals: tuple[np.ndarray, ...]
    estimate: np.ndarray
    covariance: np.ndarray
    std_errors: Any
    reduced_chi2: float
    segment_states: State | None
    continuity_gaps: np.ndarray | None
    names: tuple[str, ...] = eqx.field(static=True)
    unidentifiable: tuple[str, ...] = eqx.field(static=True)
    message: str = eqx.field(static=True)

    def summary(self) -> str:
        """A table of name, estimate and standard error, the unidentifiable directions, the
        final loss and the reduced χ²."""
        std = np.sqrt(np.diag(self.covariance))
        w = max([len(n) for n in self.names] + [9])
        state = "converged" if self.converged else "NOT converged"
        lines = [
            f"rbjax.identify: {self.steps} steps, {state} ({self.message})",
            f"  final loss {self.loss:.6g}, reduced chi² {self.reduced_chi2:.4g}",
            f"  {'parameter':{w}s}  {'estimate':>15s}  {'std error':>11s}",
        ]
        for n, v, s in zip(self.names, self.estimate, std, strict=True):
            lines.append(f"  {n:{w}s}  {v:15.9g}  {s:11.4g}")
        if self.unidentifiable:
            lines.append("  not determined by the data (standard error inf) along:")
            lines += [f"    {d}" for d in self.unidentifiable]
        if self.continuity_gaps is not None:
            g = self.continuity_gaps
            lines.append(
                f"  continuity gaps: position {g[0]:.3g} m, rotation {g[1]:.3g} rad, "
                f"velocity {g[2]:.3g} m/s, angular velocity {g[3]:.3g} rad/s"
            )
        return "\n".join(lines)


# --------------------------------------------------------------------------- helpers


def _leaf_names(tree) -> list[str]:
    """One name per scalar of the array leaves, in ``ravel_pytree`` order."""
    names = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        base = jax.tree_util.keystr(path)
        shape = np.shape(leaf)
        if not shape:
            names.append(base)
        else:
            names += [base + "[" + ",".join(map(str, i)) + "]" for i in np.ndindex(shape)]
    return names


def _free_spec(params0, free):
    """A bool pytree with params0's structure: True at the fitted leaves."""
    is_float = eqx.is_inexact_array
    if free is None:
        return jax.tree.map(is_float, params0)
    if callable(free) and not isinstance(free, eqx.Module):
        return jax.tree.map(lambda x: bool(free(x)) and is_float(x), params0)

    def expand(f, sub):
        if callable(f):
            return jax.tree.map(lambda x: bool(f(x)) and is_float(x), sub)
        if not isinstance(f, (bool, np.bool_)):
            raise TypeError(f"a leaf of free is {f!r}, not a bool or a callable")
        return jax.tree.map(lambda x: bool(f) and is_float(x), sub)

    try:
        return jax.tree.map(
            expand, free, params0, is_leaf=lambda x: isinstance(x, (bool, np.bool_))
        )
    except (ValueError, TypeError) as e:
        fail(
            "identify(free)",
            free,
            f"does not match the structure of params0 ({e})",
            "pass None (every float array leaf), a pytree of bools with params0's structure "
            "(or a prefix of it), or a callable leaf -> bool",
        )
        raise


def _rref_rows(m: np.ndarray, tol: float = 1e-9) -> np.ndarray:
    """Reduced row-echelon form of the rows of ``m`` (k, p) with partial pivoting: a basis of
    the same row space whose vectors each involve few parameters."""
    a = m.copy()
    k, p = a.shape
    row = 0
    for col in range(p):
        if row >= k:
            break
        piv = row + int(np.argmax(np.abs(a[row:, col])))
        if abs(a[piv, col]) <= tol * max(np.max(np.abs(a)), 1e-300):
            continue
        a[[row, piv]] = a[[piv, row]]
        a[row] /= a[row, col]
        for r in range(k):
            if r != row:
                a[r] -= a[r, col] * a[row]
        row += 1
    return a[:row]


def _describe(d: np.ndarray, names: list[str]) -> str:
    """'0.577·a + 0.577·b − 0.577·c' for a unit direction (terms of size ≥ 0.01)."""
    out = ""
    for i in np.argsort(-np.abs(d)):
        if abs(d[i]) < 0.01:
            break
        sign = ("− " if out else "−") if d[i] < 0 else ("+ " if out else "")
        out += f"{' ' if out else ''}{sign}{abs(d[i]):.3g}·{names[i]}"
    return out


def _eliminate_segments(jac: np.ndarray, n_data: int, p_phys: int) -> np.ndarray:
    """The data Jacobian with respect to the physical parameters only, the segment start
    states s eliminated through the linearised continuity equations C_θ dθ + C_s ds = 0:
    J_red = J_θ − J_s C_s⁺ C_θ (C_s⁺ the pseudo-inverse: directions of s that no residual
    sees, such as coordinates normal to the joints before assembly, drop out). At a
    continuous estimate this is the single-shooting sensitivity."""
    jd, c = jac[:n_data], jac[n_data:]
    ds = -np.linalg.lstsq(c[:, p_phys:], c[:, :p_phys], rcond=None)[0]
    return jd[:, :p_phys] + jd[:, p_phys:] @ ds


def _covariance(jac: np.ndarray, rtol: float, names: list[str]):
    """Gauss–Newton covariance (pseudo-inverse on the identifiable subspace) and the named
    null directions of the column-scaled JᵀJ (module docstring)."""
    p = jac.shape[1]
    with np.errstate(over="ignore", invalid="ignore"):
        h = jac.T @ jac
    col = np.sqrt(np.maximum(np.diag(h), 0.0))
    dead = ~(col > 1e-300 * max(float(np.max(col, initial=0.0)), 1e-300)) | ~np.isfinite(col)
    scale = np.where(dead, 1.0, 1.0 / np.where(dead, 1.0, col))
    hs = np.where(dead[:, None] | dead[None, :], 0.0, scale[:, None] * h * scale[None, :])
    if not np.all(np.isfinite(hs)):
        cov = np.full((p, p), np.nan)
        np.fill_diagonal(cov, np.inf)
        return cov, ("the Jacobian at the estimate is not finite",)
    w, v = np.linalg.eigh(hs)
    top = float(np.max(w, initial=0.0))
    null = ~(w > rtol * top) if top > 0 else np.ones(p, dtype=bool)
    vi = v[:, ~null]
    cov = (scale[:, None] * vi) @ ((vi / w[~null]).T * scale[None, :])
    vn = v[:, null]
    involved = np.sum(vn**2, axis=1) >= 1e-4
    described = []
    if vn.shape[1]:
        raw = (scale[:, None] * vn).T  # directions in the raw parameter coordinates
        raw = raw / np.linalg.norm(raw, axis=1, keepdims=True)
        rows = _rref_rows(raw) if raw.shape[0] > 1 else raw
        for d in rows:
            d = d / np.linalg.norm(d)
            d = d * np.sign(d[np.argmax(np.abs(d))])
            nz = np.flatnonzero(np.abs(d) >= 0.01)
            if nz.size == 1 and dead[nz[0]]:
                described.append(f"{names[nz[0]]} (no measured quantity depends on it)")
            else:
                described.append(_describe(d, names))
    cov[involved, :] = np.nan
    cov[:, involved] = np.nan
    cov[involved, involved] = np.inf
    return cov, tuple(described)


# --------------------------------------------------------------------------- optimisers


class _Iterate(NamedTuple):
    """An evaluated point: flat parameters, loss, gradient, (r, J or None, aux)."""

    flat: np.ndarray
    f: float
    g: np.ndarray
    payload: Any


class _Run(NamedTuple):
    last: _Iterate
    history: list
    converged: bool
    message: str


def _diverged(k: int):
    raise ValueError(
        f"identify: the simulation diverged (non-finite loss) at optimiser step {k}. Fix: "
        "reduce the learning rate, start closer to the solution, reduce dt, or use "
        "shooting= to split the horizon."
    )


class _Criteria(NamedTuple):
    """Stopping rules: ``tol`` relative loss decrease, ``gtol`` gradient test, ``rounding``
    the rounding error of each residual (1e4 ulp of the measured values, in σ)."""

    tol: float
    gtol: float
    rounding: np.ndarray


def _gradient_test(it: _Iterate) -> float:
    """MINPACK's orthogonality test max_i |J_iᵀr| / (‖J_i‖ ‖r‖) (scale-free: the cosine
    between the residual and each Jacobian column) when J is known, else ‖∇L‖∞."""
    r, jac, _ = it.payload
    if jac is None:
        return float(np.max(np.abs(it.g), initial=0.0))
    rn = float(np.linalg.norm(r))
    cn = np.linalg.norm(jac, axis=0)
    if rn == 0.0:
        return 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        cos = np.where(cn > 0, np.abs(it.g) / (cn * rn), 0.0)
    return float(np.max(cos, initial=0.0))


def _stationary(it: _Iterate, crit: _Criteria) -> _Run | None:
    test = _gradient_test(it)
    if test <= crit.gtol:
        what = "max |J_iᵀr|/(‖J_i‖‖r‖)" if it.payload[1] is not None else "‖∇L‖∞"
        return _Run(it, [], True, f"gradient test {what} = {test:.3g} ≤ gtol = {crit.gtol:g}")
    return None


def _precision_limit(it: _Iterate, crit: _Criteria, history: list, why: str) -> _Run:
    """No step decreases the loss. Converged if the Gauss–Newton step (minimum-norm solution
    of J δ ≈ −r) predicts a decrease below the rounding error of the loss (Σ|r_i|ρ_i + ½Σρ_i²,
    ρ_i the rounding error of residual i) or below 1e-6 of the loss: the linearised problem is
    solved to working precision, whatever the size of the residual. Without J: ‖∇L‖∞ ≤ 1000
    gtol."""
    r, jac, _ = it.payload
    rho = np.resize(crit.rounding, r.shape)
    noise = float(np.abs(r) @ rho + 0.5 * rho @ rho)
    if jac is not None and np.all(np.isfinite(jac)):
        delta = np.linalg.lstsq(jac, -r, rcond=None)[0]
        rest = r + jac @ delta
        ok = 0.5 * (float(r @ r) - float(rest @ rest)) <= max(1e-6 * it.f, noise)
    else:
        ok = _gradient_test(it) <= 1e3 * crit.gtol or it.f <= noise
    return _Run(it, history, bool(ok), why + " (precision limit)")


def _run_lbfgs(evaluate, it: _Iterate, max_steps, crit: _Criteria, memory_size) -> _Run:
    """L-BFGS (optax.scale_by_lbfgs) with the host strong-Wolfe line search, in variables
    scaled by the Jacobian's column norms at the start (when J is available), so that the
    first steps are not dominated by the units of the parameters."""
    jac = it.payload[1]
    cs = np.ones_like(it.flat)
    if jac is not None:
        col = np.linalg.norm(jac, axis=0)
        ok = np.isfinite(col) & (col > 1e-300 * max(float(np.max(col, initial=0.0)), 1e-300))
        cs = np.where(ok, 1.0 / np.where(ok, col, 1.0), 1.0)
    opt = _lbfgs_direction(memory_size)
    z = lambda flat: jnp.asarray(flat / cs)
    state = opt.init(z(it.flat))
    history = [it.f]
    for k in range(max_steps):
        if (done := _stationary(it, crit)) is not None:
            return done._replace(history=history)
        upd, state = _plain_update(opt, jnp.asarray(it.g * cs), state, z(it.flat))
        d = -np.asarray(upd) * cs
        slope = float(it.g @ d)
        if not slope < 0:  # not a descent direction: restart from steepest descent
            state = opt.init(z(it.flat))
            d = -it.g * cs**2 / max(1.0, float(np.linalg.norm(it.g * cs)))
            slope = float(it.g @ d)

        def phi(a, flat=it.flat, d=d):
            fa, ga, pa = evaluate(flat + a * d)
            if not np.all(np.isfinite(ga)):  # a non-finite gradient rejects the point
                return np.nan, np.nan, (ga, pa)
            return fa, float(ga @ d), (ga, pa)

        found = _line_search(phi, it.f, slope)
        if found is None:
            return _precision_limit(it, crit, history, "the line search found no lower loss")
        a, f_new, (g_new, payload_new) = found
        old = it.f
        it = _Iterate(it.flat + a * d, f_new, g_new, payload_new)
        if not np.isfinite(it.f):
            _diverged(k + 1)
        history.append(it.f)
        if 0 <= old - it.f <= crit.tol * old:
            return _Run(it, history, True, f"relative loss decrease ≤ tol = {crit.tol:g}")
    return _Run(it, history, False, "max_steps reached")


def _run_lm(evaluate, it: _Iterate, max_steps, crit: _Criteria) -> _Run:
    """Levenberg–Marquardt on the whitened residuals: (JᵀJ + μ D²) δ = −Jᵀr with Moré's
    scaling D² = the largest diag(JᵀJ) seen (Moré 1978) and Nielsen's damping update
    (Nielsen 1999; Madsen, Nielsen & Tingleff 2004, Alg. 3.16), solved as the least-squares
    problem [J; √μ D] δ ≈ −[r; 0]. Each step is one evaluation of (r, J).

    μ is dimensionless: D² already carries the scale of JᵀJ, so μ₀ = τ = 1e-3 (Madsen et
    al.'s τ, whose μ₀ = τ max diag(JᵀJ) is for D = I). Scaling μ₀ by max diag(JᵀJ) as well
    damped the first steps by that factor (1e10 with heavily weighted continuity rows), and
    Nielsen's update lowers μ by at most 3× a step: ~20 wasted steps."""
    r, jac, _ = it.payload
    d2 = np.sum(jac * jac, axis=0)
    mu = 1e-3
    nu = 2.0
    history = [it.f]
    for _ in range(max_steps):
        if (done := _stationary(it, crit)) is not None:
            return done._replace(history=history)
        r, jac, _ = it.payload
        d2 = np.maximum(d2, np.sum(jac * jac, axis=0))
        dd = np.sqrt(np.maximum(d2, 1e-30 * float(np.max(d2, initial=1.0))))
        for _attempt in range(30):  # raise μ until a step decreases the loss
            a = np.concatenate([jac, np.sqrt(mu) * np.diag(dd)])
            rhs = -np.concatenate([r, np.zeros_like(dd)])
            delta = np.linalg.lstsq(a, rhs, rcond=None)[0]
            jd = jac @ delta
            pred = -(float(it.g @ delta) + 0.5 * float(jd @ jd))
            f_new, g_new, payload_new = evaluate(it.flat + delta)
            rho = (it.f - f_new) / pred if pred > 0 else -1.0
            if np.isfinite(f_new) and rho > 0:
                mu *= max(1.0 / 3.0, 1.0 - (2.0 * rho - 1.0) ** 3)
                nu = 2.0
                break
            mu *= nu
            nu *= 2.0
            if not np.isfinite(mu) or pred <= 1e-15 * max(it.f, 1e-300):
                return _precision_limit(it, crit, history, "no step decreases the loss")
        else:
            return _Run(it, history, False, "the damping did not produce a decrease")
        old = it.f
        it = _Iterate(it.flat + delta, f_new, g_new, payload_new)
        history.append(it.f)
        if 0 <= old - it.f <= crit.tol * old:
            return _Run(it, history, True, f"relative loss decrease ≤ tol = {crit.tol:g}")
    return _Run(it, history, False, "max_steps reached")


def _run_plain(evaluate, opt, it: _Iterate, max_steps, crit: _Criteria) -> _Run:
    """A plain optax transform (e.g. Adam) on the gradient Jᵀr, one compiled update a step."""
    state = opt.init(jnp.asarray(it.flat))
    history = [it.f]
    for k in range(max_steps):
        if (done := _stationary(it, crit)) is not None:
            return done._replace(history=history)
        upd, state = _plain_update(opt, jnp.asarray(it.g), state, jnp.asarray(it.flat))
        flat = it.flat + np.asarray(upd)
        it = _Iterate(flat, *evaluate(flat))
        if not np.isfinite(it.f):
            _diverged(k + 1)
        history.append(it.f)
        if k >= 10 and abs(history[-11] - it.f) <= 10 * crit.tol * history[-11]:
            return _Run(
                it, history, True, f"relative loss change ≤ tol = {crit.tol:g} over 10 steps"
            )
    return _Run(it, history, False, "max_steps reached")


def _needs_objective(opt, flat) -> bool:
    """True for optax transforms that evaluate the objective themselves: their state stores
    the objective's ``value`` (optax's line searches, e.g. in ``optax.lbfgs()``)."""
    if not isinstance(opt, optax.GradientTransformationExtraArgs):
        return False
    state = jax.eval_shape(opt.init, jnp.asarray(flat))
    return optax.tree.get(state, "value") is not None


def _run_extra_args(evaluate, step, opt, it: _Iterate, max_steps, crit: _Criteria) -> _Run:
    """An optax transform that needs the objective (e.g. ``optax.lbfgs()``): the compiled
    ``step`` runs value_and_grad_from_state, the transform (its line search included) and
    the update."""
    state = opt.init(jnp.asarray(it.flat))
    history = [it.f]
    for k in range(max_steps):
        if (done := _stationary(it, crit)) is not None:
            return done._replace(history=history)
        new, state, value, _ = step(jnp.asarray(it.flat), state)
        if not np.isfinite(float(np.asarray(value))):
            _diverged(k)
        flat = np.asarray(new)
        old = it.f
        it = _Iterate(flat, *evaluate(flat))
        if not np.isfinite(it.f):
            _diverged(k + 1)
        history.append(it.f)
        if 0 <= old - it.f <= crit.tol * old:
            return _Run(it, history, True, f"relative loss decrease ≤ tol = {crit.tol:g}")
    return _Run(it, history, False, "max_steps reached")


# --------------------------------------------------------------------------- identify


def _check_build_output(out, where: str):
    if not (isinstance(out, tuple) and len(out) == 2):
        fail(where, type(out).__name__, "is not a (model, state0) pair", "return (model, state0)")
    model, state0 = out
    if not hasattr(model, "formulation") or not hasattr(model, "names"):
        fail(f"{where}[0]", type(model).__name__, "is not an rbjax.Model", "return an rbjax.Model")
    if not isinstance(state0, State) or np.ndim(state0.q) != 2 or np.ndim(state0.t) != 0:
        fail(
            f"{where}[1]",
            getattr(state0, "q", state0),
            "is not ONE rbjax.State (t scalar, q and u (nb, 7))",
            "return the initial state of a single system (no batch axes)",
        )
    return model, state0


def _setup(build, params0, data, dt, integrator, free, shooting, continuity_weight, who):
    """Host-side validation and the problem description shared by identify and residuals."""
    if not callable(build):
        fail(f"{who}(build)", build, "is not callable", "pass build(params) -> (model, state0)")
    if not isinstance(data, Measurements):
        fail(
            f"{who}(data)",
            type(data).__name__,
            "is not rbjax.Measurements",
            "wrap the data as rbjax.Measurements(times, [observations...])",
        )
    integrator = RK4() if integrator is None else integrator
    if not isinstance(integrator, AbstractIntegrator):
        fail(f"{who}(integrator)", integrator, "is not an rbjax integrator", "pass rbjax.RK4()")
    try:
        dt_ok = np.ndim(dt) == 0 and np.isfinite(float(dt)) and float(dt) > 0
    except (TypeError, ValueError):
        dt_ok = False
    if not dt_ok:
        fail(f"{who}(dt)", dt, "is not a positive finite number", "pass the largest step in s")
    if not (np.ndim(continuity_weight) == 0 and np.isfinite(continuity_weight)):
        continuity_weight = -1.0
    if float(continuity_weight) <= 0:
        fail(
            f"{who}(continuity_weight)",
            continuity_weight,
            "is not a positive finite number",
            "pass w = 1/σ_c² (default 1e6: gaps of 1e-3 SI units cost one σ)",
        )
    model0, state0 = _check_build_output(build(params0), f"{who}: build(params0)")
    model0.check_state(state0)
    check_mechanism_state(model0, state0)
    t0 = float(state0.t)
    times = data.times
    if times[0] < t0:
        fail(
            "Measurements.times[0]",
            times[0],
            f"is before the initial time state0.t = {t0}",
            "measure at or after state0.t, or start the state earlier",
        )
    for i, o in enumerate(data.observations):
        o.check(model0, state0, f"Measurements.observations[{i}] ({type(o).__name__})")
    k_total = times.size
    if shooting is None:
        n_seg = 1
    elif (
        isinstance(shooting, (bool, np.bool_))
        or not isinstance(shooting, (int, np.integer))
        or not 1 <= shooting <= k_total
    ):
        fail(
            f"{who}(shooting)",
            shooting,
            f"is not None or a number of segments in [1, {k_total}] (the number of samples)",
            "pass None (single shooting) or an int S with one or more samples per segment",
        )
        raise AssertionError  # unreachable
    else:
        n_seg = int(shooting)
    spec = _free_spec(params0, free)
    dyn0, fixed = eqx.partition(params0, spec)
    dyn0 = jax.tree.map(jnp.asarray, dyn0)
    dtype = state0.q.dtype
    starts, hs, ts, pick, ends, n_steps = _segments(t0, times, float(dt), n_seg)
    as_dtype = lambda a: a.astype(dtype) if eqx.is_inexact_array(a) else a
    problem = _Problem(
        build=build,
        fixed=fixed,
        observations=jax.tree.map(as_dtype, data.observations),
        integrator=integrator,
        t_start=jnp.asarray(starts, dtype),
        hs=jnp.asarray(hs, dtype),
        ts=jnp.asarray(ts, dtype),
        pick=jnp.asarray(pick),
        ends=jnp.asarray(ends),
        a_ref=None,
        ref_q=None,
        ref_u=None,
        basis=None,
        sqrt_w=jnp.asarray(np.sqrt(float(continuity_weight)), dtype),
        n_seg=n_seg,
    )
    return problem, dyn0, spec, model0, state0, n_steps


def residuals(build, params, data: Measurements, *, dt, integrator=None) -> Array:
    """The whitened residual vector r(θ) = (prediction − measurement)/σ of :func:`identify`
    (single shooting), observations in order, each (K, d) flattened row by row, 0 at masked
    samples; the loss is ½‖r‖². A JAX function of ``params`` (every floating-point leaf):
    ``jax.jit``, ``jax.grad`` and ``jax.jacfwd`` compose with it (the sample schedule is
    computed from the concrete ``data.times`` and ``dt``)."""
    problem, dyn, *_ = _setup(build, params, data, dt, integrator, None, None, 1.0, "residuals")
    return _residual_vector(problem, (dyn, {}))[0]


def _rounding(problem: _Problem, n_residuals: int, dtype) -> np.ndarray:
    """Rounding error of every residual: 1e4 ulp of the largest measured value of its
    observation, in units of σ (continuity rows: 1e4 ulp of 1 SI unit, times √w)."""
    eps = float(jnp.finfo(dtype).eps)
    out = []
    for o in problem.observations:
        y = float(np.max(np.abs(np.asarray(o.values)), initial=1.0))
        rho = 1e4 * eps * max(y, 1.0) / np.asarray(o.sigma, dtype=np.float64)
        out.append(np.tile(rho, o.values.shape[0]))
    out = np.concatenate(out)
    rest = n_residuals - out.size
    return np.concatenate([out, np.full(rest, 1e4 * eps * float(problem.sqrt_w))])


def _choose_mode(autodiff: str, p_total: int) -> str:
    if autodiff not in ("auto", "forward", "reverse"):
        fail("identify(autodiff)", autodiff, "is not 'auto', 'forward' or 'reverse'", "pick one")
    if autodiff == "auto":
        return "forward" if p_total <= 64 else "reverse"
    return autodiff


def _tangent_basis(model, state: State, dof: int) -> np.ndarray:
    """(6 nb, dof) orthonormal basis of the null space of the velocity Jacobian W̃ at ONE
    state (per body (v, ω), ω in body axes): the ``dof`` right singular vectors of the
    smallest singular values (also defined at a singular configuration)."""
    w = jacobian_matrix(model, state)
    vt = np.linalg.svd(w)[2] if w.shape[0] else np.eye(w.shape[1])
    return vt[vt.shape[0] - dof :].T


def _check_segment_guesses(guesses, data: Measurements, model, n_seg: int):
    """The rows of ``segment_states0`` (one state per sample time) at the first sample of
    each segment 1..S−1, as NumPy arrays; None if not given."""
    if guesses is None:
        return None
    k = data.times.size
    if n_seg == 1:
        fail(
            "identify(segment_states0)",
            "<State>",
            "is given but shooting is None or 1 (single shooting has no segment states)",
            "pass shooting=S with S ≥ 2, or drop segment_states0",
        )
    shape = (k, model.nb, 7)
    q_shape = np.shape(guesses.q) if isinstance(guesses, State) else None
    if not isinstance(guesses, State) or q_shape != shape:
        fail(
            "identify(segment_states0)",
            f"<{type(guesses).__name__} q shape {q_shape}>",
            f"is not an rbjax.State with q and u of shape {shape} (one state per sample time)",
            "pass guesses of the state at every sample time, e.g. estimated from the "
            "measurements; the segment starts take theirs",
        )
    q, u = np.asarray(guesses.q, np.float64), np.asarray(guesses.u, np.float64)
    rows = np.asarray([c[0] for c in np.array_split(np.arange(k), n_seg)[1:]])
    q, u = q[rows], u[rows]
    if not (np.all(np.isfinite(q)) and np.all(np.isfinite(u))):
        fail(
            "identify(segment_states0)",
            "<State>",
            "is not finite at the first sample of a segment",
            "give finite guesses at least at the segment starts",
        )
    return State(t=jnp.asarray(data.times[rows]), q=jnp.asarray(q), u=jnp.asarray(u))


def _set_segment_starts(problem: _Problem, seg: dict, model, idx: np.ndarray, states: State):
    """Initialise the start variables of segments ``idx`` (0 = the start of segment 1) to
    ``states`` (concrete, leading axis len(idx)). Mechanisms of rigid bodies: the states are
    assembled (rbjax.assemble, with the model of params0) and become the references, with
    the tangent basis there and zero coordinates. Otherwise: position, velocities and the
    attitude as the reference (normalised; log-scale and ν for scalable bodies)."""
    seg = dict(seg)
    q, u = np.asarray(states.q, np.float64), np.asarray(states.u, np.float64)
    if problem.basis is not None:
        assert problem.ref_q is not None and problem.ref_u is not None
        dtype = problem.ref_q.dtype
        t = np.asarray(problem.t_start)[1:][idx]
        st = assemble(
            model, State(t=jnp.asarray(t, dtype), q=jnp.asarray(q, dtype), u=jnp.asarray(u, dtype))
        )
        sq, su = np.asarray(st.q), np.asarray(st.u)
        dof = problem.basis.shape[-1]
        basis = np.stack(
            [
                _tangent_basis(model, State(t=jnp.asarray(t[k], dtype), q=sq[k], u=su[k]), dof)
                for k in range(len(idx))
            ]
        )
        new = (
            problem.ref_q.at[idx].set(sq),
            problem.ref_u.at[idx].set(su),
            problem.basis.at[idx].set(basis),
        )
        problem = eqx.tree_at(lambda p: (p.ref_q, p.ref_u, p.basis), problem, new)
        seg["dq"] = seg["dq"].at[idx].set(0.0)
        seg["du"] = seg["du"].at[idx].set(0.0)
        return problem, seg
    assert problem.a_ref is not None
    seg["r"] = seg["r"].at[idx].set(q[..., 0:3])
    seg["v"] = seg["v"].at[idx].set(u[..., 0:3])
    seg["omega"] = seg["omega"].at[idx].set(u[..., 4:7])
    seg["rotation"] = seg["rotation"].at[idx].set(0.0)
    a = q[..., 3:7]
    s2 = np.sum(a**2, axis=-1)
    if "log_scale" in seg:
        seg["log_scale"] = seg["log_scale"].at[idx].set(0.5 * np.log(s2))
        seg["nu"] = seg["nu"].at[idx].set(u[..., 3])
    a = a / np.sqrt(s2)[..., None]
    problem = eqx.tree_at(lambda p: p.a_ref, problem, problem.a_ref.at[idx].set(a))
    return problem, seg


def identify(
    build: Callable[[Any], tuple[Any, State]],
    params0: Any,
    data: Measurements,
    *,
    dt: float,
    free=None,
    integrator: AbstractIntegrator | None = None,
    optimizer: str | optax.GradientTransformation = "lbfgs",
    learning_rate: float = 1e-2,
    max_steps: int = 200,
    tol: float = 1e-10,
    gtol: float = 1e-10,
    shooting: int | None = None,
    continuity_weight: float = 1e6,
    rtol_identifiable: float = 1e-8,
    autodiff: str = "auto",
    memory_size: int = 10,
    segment_states0: State | None = None,
) -> IdentificationResult:
    """Fit the free leaves of ``params0`` (and, with ``shooting=S``, the states at the starts
    of segments 1..S−1) to ``data`` by minimising the whitened least squares of the module
    docstring; then the Gauss–Newton covariance and the unidentifiable directions.

    ``build(params) -> (model, state0)`` must be a pure JAX function of the parameters (it is
    traced). ``dt``: largest integration step [s]. ``optimizer``: ``"lbfgs"`` (default),
    ``"lm"`` (Levenberg–Marquardt: fewest steps for least squares, recommended with
    ``shooting``), ``"adam"`` (with ``learning_rate``) or an optax transform. ``max_steps``: optimiser steps
    (0 = only evaluate at ``params0``). ``tol``: relative loss decrease below which the
    optimiser stops; ``gtol``: gradient test (module docstring). ``rtol_identifiable``:
    eigenvalue threshold of the scaled Gauss–Newton matrix. ``autodiff``: ``"forward"``
    (residual Jacobian by ``jacfwd`` at every evaluation), ``"reverse"`` (gradients by reverse
    mode) or ``"auto"`` (forward up to 64 free scalars). ``memory_size``: L-BFGS pairs.
    ``segment_states0`` (with ``shooting``): guesses of the state at every sample time, an
    ``rbjax.State`` with q and u of shape (K, nb, 7) (t is ignored), e.g. estimated from the
    measurements; each segment starts from the guess at its first sample (for mechanisms
    after :func:`rbjax.assemble` with the model of ``params0``). Default: a simulation of
    ``params0``, segment by segment.
    """
    if isinstance(optimizer, str):
        if optimizer not in ("lbfgs", "lm", "adam"):
            fail(
                "identify(optimizer)",
                optimizer,
                "is not 'lbfgs', 'lm', 'adam' or an optax.GradientTransformation",
                "pass one of these",
            )
    elif not isinstance(optimizer, optax.GradientTransformation):
        fail(
            "identify(optimizer)",
            optimizer,
            "is not 'lbfgs', 'lm', 'adam' or an optax.GradientTransformation",
            "pass one of these",
        )
    if not (np.ndim(learning_rate) == 0 and np.isfinite(learning_rate) and learning_rate > 0):
        fail("identify(learning_rate)", learning_rate, "is not > 0", "pass e.g. 1e-2")
    if isinstance(max_steps, (bool, np.bool_)) or not isinstance(max_steps, (int, np.integer)):
        max_steps = -1
    if max_steps < 0:
        fail("identify(max_steps)", max_steps, "is not an integer >= 0", "pass e.g. 200")
    for name, val in (("tol", tol), ("gtol", gtol), ("rtol_identifiable", rtol_identifiable)):
        if not (np.ndim(val) == 0 and np.isfinite(val) and val >= 0):
            fail(f"identify({name})", val, "is not a finite number >= 0", "pass e.g. 1e-10")
    problem, dyn0, spec, model0, state0, _ = _setup(
        build, params0, data, dt, integrator, free, shooting, continuity_weight, "identify"
    )
    if not jax.tree.leaves(dyn0):
        fail(
            "identify(free)",
            free,
            "selects no floating-point array leaf of params0",
            "select at least one parameter to fit (free leaves must be float arrays; wrap "
            "Python floats in jnp.asarray)",
        )
    dtype = state0.q.dtype
    n_seg = problem.n_seg
    nb = model0.nb

    # ---- free segment start states, initialised below: free bodies relative to reference
    # attitudes; mechanisms of rigid bodies in the tangent space of the joint manifold
    seg0: dict[str, Array] = {}
    tangent = n_seg > 1 and bool(model0.joints) and not any(model0.scalable)
    if tangent:
        dof = int(mobility(model0, state0).dof)  # 6 nb − rank W̃
        z = jnp.zeros((n_seg - 1, dof), dtype)
        seg0 = {"dq": z, "du": z}
        refs = (
            jnp.broadcast_to(state0.q, (n_seg - 1, nb, 7)).astype(dtype),
            jnp.broadcast_to(state0.u, (n_seg - 1, nb, 7)).astype(dtype),
            jnp.zeros((n_seg - 1, 6 * nb, dof), dtype),
        )
        problem = eqx.tree_at(
            lambda p: (p.ref_q, p.ref_u, p.basis), problem, refs, is_leaf=lambda x: x is None
        )
    elif n_seg > 1:
        z3 = jnp.zeros((n_seg - 1, nb, 3), dtype)
        seg0 = {"r": z3, "rotation": z3, "v": z3, "omega": z3}
        if any(model0.scalable):
            z = jnp.zeros((n_seg - 1, nb), dtype)
            seg0 |= {"log_scale": z, "nu": z}
        a_id = jnp.zeros((n_seg - 1, nb, 4), dtype).at[..., 0].set(1.0)
        problem = eqx.tree_at(lambda p: p.a_ref, problem, a_id, is_leaf=lambda x: x is None)
    guesses = _check_segment_guesses(segment_states0, data, model0, n_seg)
    template = (dyn0, seg0)
    flat0, unravel = ravel_pytree(template)
    flat0 = np.asarray(flat0)
    p_phys = int(ravel_pytree(dyn0)[0].size)
    p_total = flat0.size
    mode = _choose_mode(autodiff, p_total)
    if optimizer == "lm":
        mode = "forward"  # Levenberg–Marquardt needs J at every step
    evaluate_fn = _eval_forward if mode == "forward" else _eval_reverse

    def evaluate(flat, prob=None):
        r, d, aux = evaluate_fn(problem if prob is None else prob, template, jnp.asarray(flat))
        r = np.asarray(r)
        if mode == "forward":
            jac = np.asarray(d)
            with np.errstate(over="ignore", invalid="ignore"):
                g = jac.T @ r
        else:
            jac, g = None, np.asarray(d)
        with np.errstate(over="ignore", invalid="ignore"):
            f = 0.5 * float(np.sum(np.square(r)))
        return f, g, (r, jac, aux)

    if n_seg > 1:
        x = unravel(jnp.asarray(flat0))
        seg = dict(x[1])
        if guesses is not None:  # the user's guesses (e.g. from the measurements)
            idx = np.arange(n_seg - 1)
            problem, seg = _set_segment_starts(problem, seg, model0, idx, guesses)
        else:  # simulate params0 segment by segment: start s+1 = end of segment s
            for s in range(n_seg - 1):
                _, _, (_, _, ends) = evaluate(np.asarray(ravel_pytree((x[0], seg))[0]))
                e = jax.tree.map(lambda a, s=s: np.asarray(a)[s : s + 1], ends)
                problem, seg = _set_segment_starts(problem, seg, model0, np.array([s]), e)
        flat0 = np.asarray(ravel_pytree((x[0], seg))[0])

    f, g, payload = evaluate(flat0)
    if not np.isfinite(f):
        raise ValueError(
            "identify: the loss at the initial guess params0 is not finite (the simulation "
            "diverged at optimiser step 0, or a prediction is NaN). Fix: check params0 and "
            "build, reduce dt, or split the horizon with shooting=."
        )
    start = _Iterate(flat0, f, g, payload)
    crit = _Criteria(float(tol), float(gtol), _rounding(problem, payload[0].size, dtype))
    with jax.numpy_dtype_promotion("standard"):  # optax mixes int32/int64 counters
        if max_steps == 0:
            run = _Run(start, [f], False, "max_steps = 0: evaluated at params0")
        elif optimizer == "lbfgs":
            run = _run_lbfgs(evaluate, start, int(max_steps), crit, int(memory_size))
        elif optimizer == "lm":
            run = _run_lm(evaluate, start, int(max_steps), crit)
        elif not isinstance(optimizer, str) and _needs_objective(optimizer, flat0):
            step = functools.partial(_extra_args_step, problem, template, optimizer)
            run = _run_extra_args(evaluate, step, optimizer, start, int(max_steps), crit)
        else:
            opt = _adam(float(learning_rate)) if optimizer == "adam" else optimizer
            assert isinstance(opt, optax.GradientTransformation)
            run = _run_plain(evaluate, opt, start, int(max_steps), crit)
    flat, f, history = run.last.flat, run.last.f, run.history
    converged, message, payload = run.converged, run.message, run.last.payload

    # ---- Gauss–Newton covariance and identifiability at the estimate
    r, jac, aux = payload
    if jac is None:
        n_res = r.size
        if p_total <= n_res:
            jac = np.asarray(_eval_forward(problem, template, jnp.asarray(flat))[1])
        else:
            jac = np.asarray(_jacobian_reverse(problem, template, jnp.asarray(flat)))
    x = unravel(jnp.asarray(flat))
    names = _leaf_names(x[0])
    n_data = sum(o.values.shape[0] * o.dim for o in data.observations)
    if n_seg > 1:
        jac = _eliminate_segments(jac, n_data, p_phys)
    cov, described = _covariance(jac, float(rtol_identifiable), names)
    std = np.sqrt(np.diag(cov))
    std_tree = ravel_pytree(x[0])[1](jnp.asarray(std, dtype))
    params = eqx.combine(x[0], problem.fixed)

    # ---- residuals per observation, χ², segment states
    blocks, off = [], 0
    for o in data.observations:
        k_, d_ = o.values.shape[0], o.dim
        b = r[off : off + k_ * d_].reshape(k_, d_).copy()
        b[~np.asarray(o.mask)] = np.nan
        blocks.append(b)
        off += k_ * d_
    loss_data = 0.5 * float(np.sum(r[:off] ** 2))
    n_meas = data.count
    chi2 = 2.0 * loss_data / (n_meas - p_phys) if n_meas > p_phys else float("nan")
    seg_states, gaps = None, None
    if n_seg > 1:
        model_hat, _ = build(params)
        seg_states = jax.tree.map(np.asarray, _segment_states(problem, model_hat, x[1]))
        ends = aux
        gap = [np.asarray(a) for a in _gaps(model_hat, ends, seg_states)]
        gaps = np.asarray([float(np.max(np.abs(a))) for a in gap[:4]])
    return IdentificationResult(
        params=params,
        loss=float(f),
        loss_history=np.asarray(history),
        steps=len(history) - 1,
        converged=bool(converged),
        residuals=tuple(blocks),
        estimate=np.asarray(flat[:p_phys]),
        covariance=cov,
        std_errors=std_tree,
        reduced_chi2=float(chi2),
        segment_states=seg_states,
        continuity_gaps=gaps,
        names=tuple(names),
        unidentifiable=described,
        message=message,
    )
