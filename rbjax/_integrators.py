"""Time integrators: pure ``step(model, state, dt) -> state`` functions.

=====================  =====  =======================================================================
integrator             order  what it conserves
=====================  =====  =======================================================================
SemiImplicitEuler      1      nothing exactly; explicit and cheapest. |A|² and energy drift O(h).
RK4 (ExplicitRK)       4      nothing exactly; energy and |A|² drift O(h⁴) per unit time.
ImplicitMidpoint       2      for the rigid-body DAE: |A|² = 1 to Newton tolerance at every step
                              (the constraint is solved at the end point, never renormalised);
                              for torque-free motion also the kinetic energy, |Θω| and the world
                              angular momentum exactly (Cayley form of the rotation update);
                              symmetric (time-reversible).
=====================  =====  =======================================================================

An explicit Runge–Kutta method is data: a Butcher tableau run by one algorithm (ExplicitRK;
RK4 is the classical tableau). All integrators accept any leading batch axes and are
differentiable (the implicit step through the implicit function theorem, not by unrolling
Newton iterations). Their arithmetic lives in the engine (rbjax/_engine/integrators.py).
"""

import abc
from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from equinox import AbstractVar

from ._engine import integrators as kernels, midpoint
from ._engine.layout import from_components, per_system, to_components
from ._errors import is_concrete
from ._state import State


class AbstractIntegrator(eqx.Module):
    """A time integrator: ``step(model, state, dt) -> state``.

    To write one, subclass this and implement :meth:`step` for ONE system in the natural
    layout (``state.q``, ``state.u`` of shape (nb, 7), a scalar ``state.t``; call
    ``model.formulation.derivatives(model, t, state)`` for (q̇, u̇, λ)) and :attr:`order`.
    Rollouts run it over batches with ``jax.vmap``; a step whose state is not finite is
    reported as failed. The built-in integrators replace that adapter by the engine's batched
    kernels (a private fast path, ``_engine_step``).
    """

    @property
    @abc.abstractmethod
    def order(self) -> int:
        """Order of accuracy of the method."""

    @abc.abstractmethod
    def step(self, model, state: State, dt) -> State:
        """Advance ``state`` by ``dt``; same pytree structure, shapes and dtypes out as in."""

    def _engine_step(self, model, t, q, u, h):
        """The engine's step on its component-first arrays: (t, q, u, ok). Default: ``step``
        per system (``jax.vmap``), ok where the new state is finite."""

        def one(m, tt, state):
            out = self.step(m, state, h)
            ok = jnp.all(jnp.isfinite(out.q)) & jnp.all(jnp.isfinite(out.u))
            return out.t, out.q, out.u, ok

        t1, q1, u1, ok = per_system(one, model, t, q, u)
        t1, q1, u1 = to_components(State(t=t1, q=q1, u=u1))
        return t1, q1, u1, ok

    def _engine_warm(self, model, t, q, u):
        """What the integrator carries from one step to the next besides the state (a solver's
        warm start), or None (default). Its values change only how fast a step is found, never
        the step (to the solver's tolerance): a rollout restarted without it (locating a
        failure, a continued trajectory) takes the same steps."""
        return None

    def _engine_step_warm(self, model, t, q, u, h, warm):
        """:meth:`_engine_step` with the carried ``warm`` (:meth:`_engine_warm`): (t, q, u, ok,
        warm). Default: the step alone, ``warm`` passed on."""
        return (*self._engine_step(model, t, q, u, h), warm)


def check_dt(dt):
    """dt must be a real scalar (checked always: shapes and types are known under tracing)
    and, when its value is known, positive and finite (a traced dt is checked by the rollout's
    program: rbjax/_analysis/checks.py ``input_violations``)."""
    fix = "pass a time step > 0 in seconds as a Python float or a 0-d float array."
    kind = getattr(dt, "dtype", None)
    kind = np.asarray(dt).dtype if kind is None and not isinstance(dt, str) else kind
    if kind is None or np.issubdtype(kind, np.bool_) or not np.issubdtype(kind, np.number):
        raise ValueError(f"dt = {dt!r} is not a number. Fix: {fix}")
    if np.issubdtype(kind, np.complexfloating):
        raise ValueError(f"dt = {dt!r} is complex. Fix: {fix}")
    if np.shape(dt) != ():
        raise ValueError(
            f"dt has shape {np.shape(dt)}, not a scalar: one rollout takes one step size. Fix: "
            "pass a scalar; for several step sizes, call rollout once per step size (or "
            "jax.vmap over dt)."
        )
    if is_concrete(dt):
        arr = np.asarray(dt)
        if not np.isfinite(arr) or arr <= 0:
            raise ValueError(f"dt = {dt!r} is not a positive finite scalar. Fix: {fix}")


# |A|² − 1 and ν a rigid body may carry into ``step``: steps are chained in user loops, and
# each one leaves the drift of its integrator (RK4 at dt = 10 ms on a body spinning at 5 rad/s:
# 1e-9 after 10³ steps, 1e-8 after 10⁴); a mistake in a hand-built state (a quaternion rounded
# to 4 digits: 2e-5) is larger. In float32: 1e-3 (rounding alone drifts ~1e-5 per 10⁴ steps).
STEP_DRIFT = {jnp.dtype(jnp.float64): 1e-6, jnp.dtype(jnp.float32): 1e-3}


def _step(integrator, model, state: State, dt) -> State:
    """``step`` of a built-in integrator: validate, then the engine's batched kernel."""
    check_dt(dt)
    model.check_state(state, atol=STEP_DRIFT.get(jnp.dtype(state.q.dtype), 1e-3))
    if not is_concrete(dt):  # a traced dt <= 0 would freeze or reverse time silently
        h = jnp.asarray(dt)
        state = eqx.error_if(
            state,
            ~(jnp.isfinite(h) & (h > 0)),
            "rbjax.step: dt is not a positive finite step (checked inside the program because "
            "dt is traced). Fix: pass a time step > 0 in seconds.",
        )
    t, q, u = to_components(state)
    t1, q1, u1, _ = integrator._engine_step(model, t, q, u, jnp.asarray(dt, q.dtype))
    return from_components(t1, q1, u1)


class SemiImplicitEuler(AbstractIntegrator):
    """Semi-implicit (symplectic) Euler: u⁺ = u + h u̇(t, q, u), q⁺ = q + h q̇(q, u⁺). Order 1.

    Symplectic for separable canonical systems; in these non-canonical rotation coordinates it is
    a cheap first-order scheme whose energy error stays bounded for short horizons but is not
    guaranteed; |A|² drifts at O(h). Use ImplicitMidpoint for long-horizon structure.
    """

    @property
    def order(self) -> int:
        return 1

    def step(self, model, state: State, dt) -> State:
        return _step(self, model, state, dt)

    def _engine_step(self, model, t, q, u, h):
        return kernels.semi_implicit_euler_step(model, t, q, u, h)


class ButcherTableau(eqx.Module):
    """Explicit Runge–Kutta coefficients (a strictly lower triangular, b weights, c nodes)."""

    a: tuple[tuple[float, ...], ...] = eqx.field(static=True)
    b: tuple[float, ...] = eqx.field(static=True)
    c: tuple[float, ...] = eqx.field(static=True)
    order: int = eqx.field(static=True)


RK4_TABLEAU = ButcherTableau(
    a=((), (0.5,), (0.0, 0.5), (0.0, 0.0, 1.0)),
    b=(1 / 6, 1 / 3, 1 / 3, 1 / 6),
    c=(0.0, 0.5, 0.5, 1.0),
    order=4,
)


class AbstractExplicitRK(AbstractIntegrator):
    """An explicit Runge–Kutta method: its Butcher tableau, run by one algorithm
    (Hairer–Nørsett–Wanner I, §II.1)."""

    tableau: AbstractVar[ButcherTableau]

    @property
    def order(self) -> int:
        return self.tableau.order

    def step(self, model, state: State, dt) -> State:
        return _step(self, model, state, dt)

    def _engine_step(self, model, t, q, u, h):
        return kernels.explicit_rk_step(self.tableau, model, t, q, u, h)


class ExplicitRK(AbstractExplicitRK):
    """Any explicit Runge–Kutta method, given its Butcher tableau (Hairer–Nørsett–Wanner I, §II.1)."""

    tableau: ButcherTableau = RK4_TABLEAU


class RK4(AbstractExplicitRK):
    """Classical fourth-order Runge–Kutta (the tableau :data:`RK4_TABLEAU`). Order 4."""

    tableau: ClassVar[ButcherTableau] = RK4_TABLEAU  # pyright: ignore[reportIncompatibleVariableOverride]


class ImplicitMidpoint(AbstractIntegrator):
    """Implicit midpoint rule; for DAE formulations the constraints are solved at the end point.

    With q_m = (q_n + q_{n+1})/2, u_m = (u_n + u_{n+1})/2, t_m = t_n + h/2, one step solves

        q_{n+1} − q_n − h Q⁻¹(q_m) u_m                         = 0,
        u_{n+1} − u_n − h a(t_m, q_m, u_m) − M⁻¹ W(q_m)ᵀ Λ     = 0,
        c(q_{n+1})                                             = 0,

    for (q_{n+1}, u_{n+1}, Λ), where a is the unconstrained scalable-body acceleration of
    Möller & Glocker 2012 eq. (93), W = c_q Q⁻¹ (= e_ν for the normalisation constraint, see
    ScalableDAE.normalisation_jacobian) and Λ ≈ h λ is the constraint impulse. For the
    normalisation constraint, c_q(q_m)(q_{n+1} − q_n) = |A_{n+1}|² − |A_n|² exactly (the
    midpoint is the discrete gradient of a quadratic), so the constraint force does no discrete
    work: for a torque-free rigid body the kinetic energy is conserved to solver tolerance and
    |A|² = 1 holds at every step without renormalisation. For ODE formulations (NewtonEuler,
    UdwadiaSchutte) it is the implicit midpoint rule, which preserves the quadratic invariant
    |A|² of Ȧ = ½A(0, ω). In both, the kinematic update uses ω_m scaled by ρ = 1 + O(h²)
    (``cayley_velocity`` in rbjax/_engine/midpoint.py), which makes the rotation increment the
    Cayley map matching the momentum update, so the world angular momentum of a torque-free
    rigid body is conserved to solver tolerance too (measured on the tumbling body, dt = 1e-3:
    3.6e-14 relative over 1e5 steps, against 2e-6 after 2e3 steps with ρ = 1). Order 2,
    symmetric.

    ``newton="simplified"`` (default) solves the step by simplified Newton with the Jacobian at
    h → 0 of all but the constraint coupling, eliminated through the Schur complement of the
    explicit dynamics (W̃M⁻¹W̃ᵀ, factored once per step along the joint graph; see
    rbjax/_engine/midpoint.py): each iteration costs about one right-hand side and contracts
    the error by θ = O(h). Steps where it does not contract (stiff springs, fast spin at a
    large step) fall back to Newton with the exact Jacobian, per step and automatically.
    ``newton="exact"`` uses that Newton throughout (one jvp per unknown and a dense LU per
    system and iteration: 7-40x slower for mechanisms, benchmarks/implicit.py). Measured
    (tumbling body, 1e5 steps): the energy drifts by 0.05 ulp per step with the simplified
    iteration and by 0.003 with exact Newton, whose remaining error is quadratically small; both
    hold |A|² = 1 and the joint constraints to roundoff.

    The iterations stop when the estimated remaining error θ/(1−θ)|Δz| (relative to the
    state) is below ``tol`` (default 1000 machine epsilons: 2.2e-13 in float64, 1.2e-4 in
    float32; the simplified iteration, whose estimate is sharp, below tol/1000), at most
    ``max_iters`` iterations of each; a step that does not converge reports ok = False (the
    rollout raises with the step index). Derivatives use the implicit function theorem.
    """

    tol: float | None = eqx.field(static=True, default=None)
    max_iters: int = eqx.field(static=True, default=20)
    newton: str = eqx.field(static=True, default="simplified")

    def __check_init__(self):
        if self.newton not in ("simplified", "exact"):
            raise ValueError(
                f"ImplicitMidpoint.newton = {self.newton!r} is not a Newton variant. Fix: pass "
                "newton='simplified' (default) or newton='exact'."
            )

    @property
    def order(self) -> int:
        return 2

    def step(self, model, state: State, dt) -> State:
        return _step(self, model, state, dt)

    def _engine_step(self, model, t, q, u, h):
        return midpoint.implicit_midpoint_step(
            model, t, q, u, h, self.tol, self.max_iters, self.newton == "exact"
        )


class Projected(AbstractIntegrator):
    """Any integrator followed by projection onto the constraint manifolds (drift control).

    After each step of ``base`` to q̃, positions are projected onto Φ(q, t) = 0 along the
    mass-weighted normal at q̃ (the standard projection of Hairer, Lubich & Wanner, GNI §IV.4):
    q = N(q̃ + Q⁻¹M⁻¹W̃(q̃)ᵀμ) with μ solving Φ(q, t) = 0 by simplified Newton (the Schur
    complement S(q̃) factored once); with ``velocities=True``, velocities are then projected
    onto W u + Φ_t = 0 by the M-orthogonal projection. The order of ``base`` is kept (the
    projection changes the solution by O(h^{p+1}) per step); the position residual stays at
    the Newton tolerance ``tol`` (default 1e-12 in float64). The projection is differentiated
    by the implicit function theorem (forward and reverse mode), not through its iterations.
    """

    base: AbstractIntegrator
    velocities: bool = eqx.field(static=True, default=True)
    tol: float | None = eqx.field(static=True, default=None)
    max_iters: int = eqx.field(static=True, default=10)

    @property
    def order(self) -> int:
        return self.base.order

    def step(self, model, state: State, dt) -> State:
        return _step(self, model, state, dt)

    def _engine_step(self, model, t, q, u, h):
        return kernels.projected_step(
            self.base._engine_step, model, t, q, u, h, self.velocities, self.tol, self.max_iters
        )
