"""The rollout's plausibility monitors (rbjax/_monitors.py), evaluated after the time loop
on every saved state at once: the saved-time axis is one more batch axis of the engine's
component-first layout, and the check is one vectorised pass.

The one thing the loop adds, for a model whose forces do work that no potential accounts
for, is that work: W = ∫ P dt accumulated step by step (:func:`work_init`,
:func:`work_step`), since the saved states alone (``save_every`` may be 100) cannot give it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.core import Tracer

from . import kernels as cf
from .forces import power
from .layout import system_vector
from .mass import half_trace, mvec
from .projection import residuals

# XLA options of the monitors' program. It runs once per rollout, a few vectorised passes over
# the saved states, and its compilation was a third of a first rollout's wait: 1.1 s of 4.3 s
# (double pendulum in joint coordinates, 100 steps), 1.8 s of 5.5 s (arm7), with 2.3 and 3.1 s
# for monitors=None. With LLVM's optimisation off and the older loop emitters (the test
# suite's settings, tests/conftest.py) it compiles in 0.25 s and 0.4 s (medians of 3 fresh
# processes on 2 cores). The loop's program keeps the default options, so the trajectory is
# the same bits; only the monitors' values, judged against limits far above rounding, may
# differ in the last digits (1e-8 relative measured on arm7's energy balance).
CHEAP = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}


def cheaply_compiled(fn):
    """``equinox.filter_jit(fn)`` with the :data:`CHEAP` XLA options: array leaves of the
    positional arguments are traced, every other leaf is static (hashable). Under a
    caller's transformation (jit, grad, vmap: a traced leaf), where JAX takes no options for
    an inner program, a plain ``jax.jit``."""

    def monitors(static, dynamic):
        treedef, others, where = static
        it, ot = iter(dynamic), iter(others)
        leaves = [next(it) if w else next(ot) for w in where]
        return fn(*jax.tree.unflatten(treedef, leaves))

    cheap = jax.jit(monitors, static_argnums=0, compiler_options=CHEAP)
    plain = jax.jit(monitors, static_argnums=0)

    @functools.wraps(fn)
    def call(*args):
        leaves, treedef = jax.tree.flatten(args)
        where = tuple(eqx.is_array(x) for x in leaves)
        dynamic = [x for x, w in zip(leaves, where, strict=True) if w]
        others = tuple(x for x, w in zip(leaves, where, strict=True) if not w)
        traced = any(isinstance(x, Tracer) for x in dynamic)
        return (plain if traced else cheap)((treedef, others, where), dynamic)

    return call


@dataclasses.dataclass(frozen=True)
class Spec:
    """Static description of what a rollout watches (a static argument of the compiled
    rollout): the three limits (None: not watched); the model's energy balance
    ("conservative": E = T + V is conserved; "work": E − E₀ equals the work W of the forces
    ``work`` (indices into ``model.forces``); None: energy not watched); ``lag``: the
    integrator is of first order (:func:`evaluate`); ``deferred``: the loop only
    accumulates W and returns it, the monitors are evaluated by a later program;
    ``power``: ``power(model, t, q, u) -> (*batch,)`` in place of the power of the forces
    ``work`` (another formulation's: rbjax/_tree/monitors.py); ``gain_only``: only energy
    gained counts (an integrator that dissipates by design, rbjax/_tree/monitors.py)."""

    unit: float | None
    joints: float | None
    energy: float | None
    balance: str | None
    work: tuple[int, ...] = ()
    lag: bool = False
    deferred: bool = False
    power: Callable | None = None
    gain_only: bool = False

    @classmethod
    def of(cls, limits, balance, work=(), order: int = 4) -> Spec:
        unit, joints, energy = limits
        watch = energy is not None and balance is not None
        if not watch:
            return cls(unit, joints, None, None)
        return cls(unit, joints, energy, balance, tuple(work), order == 1)

    @property
    def watched(self) -> tuple[str, ...]:
        names = ("unit_length", "joints", "energy")
        limits = (self.unit, self.joints, self.energy)
        return tuple(n for n, v in zip(names, limits, strict=True) if v is not None)


def kinetic(model, u):
    """T = ½ uᵀ M u per system (Möller & Glocker 2012, eqs. (60), (64)), (*batch,)."""
    return 0.5 * jnp.sum(jnp.sum(u * mvec(model, u), axis=0), axis=-1)


def potential(model, t, q):
    """V = −Σ m gᵀ r plus the potentials of the model's springs, (*batch,)."""
    g = system_vector(model.gravity, q)
    v = -jnp.sum(model.mass * jnp.sum(g * q[0:3], axis=0), axis=-1)
    for f in model.forces:
        vf = f._engine_potential(model, t, q)
        if vf is not None:
            v = v + vf
    return v


def magnitude(model, t, q):
    """The magnitude of the terms V is computed from, (*batch,) [J]: Σ_b m_b |gᵀ r_b| (each
    body's own term, so that bodies above and below the origin do not cancel) plus each
    force's ``_engine_energy_scale`` (a spring's ½ k (x² + x0²)). Nonzero for a model at rest
    at E = 0 whose energy still moves by rounding."""
    g = system_vector(model.gravity, q)
    out = jnp.sum(model.mass * jnp.abs(jnp.sum(g * q[0:3], axis=0)), axis=-1)
    for f in model.forces:
        scale = f._engine_energy_scale(model, t, q)
        if scale is not None:
            out = out + scale
    return out


def work_init(spec: Spec | None, model, t, q, u):
    """The loop's work accumulator at the initial state, or None when the energy monitor
    needs no work (a conservative model, or none watched): (n, W, A, P_n, P_{n−1}, P_{n−2},
    C₀) with n the steps taken (a scalar), W and A the trapezoid sums of the power P and of
    |P|, the last three powers and C₀ = −3 P₀ + 4 P₁ − P₂ (complete after two steps;
    :func:`work_value`)."""
    if spec is None or spec.balance != "work":
        return None
    p = _power(spec, model, t, q, u)
    zero = jnp.zeros_like(p)
    return (jnp.zeros((), jnp.int32), zero, zero, p, p, p, -3.0 * p)


def _power(spec: Spec, model, t, q, u):
    # The monitors judge the computed trajectory, they are not a differentiable output:
    # no tangent flows into them (nothing of them is stored for reverse mode).
    t, q, u = jax.lax.stop_gradient((t, q, u))
    if spec.power is not None:
        return spec.power(model, t, q, u)
    return power([model.forces[i] for i in spec.work], model, t, q, u)


def work_step(spec: Spec | None, model, acc, new, h):
    """The accumulator after one step of size h to the state ``new`` (t, q, u): ONE
    evaluation of the working forces' power, at the new state (the old one is carried)."""
    if acc is None or spec is None:
        return None
    n, w, a, p, p1, _, c0 = acc
    p_new = _power(spec, model, *new)
    w = w + (0.5 * h) * (p + p_new)
    a = a + (0.5 * h) * (jnp.abs(p) + jnp.abs(p_new))
    c0 = c0 + jnp.where(n == 0, 4.0, jnp.where(n == 1, -1.0, 0.0)).astype(p.dtype) * p_new
    return (n + 1, w, a, p_new, p, p1, c0)


def work_value(acc, h):
    """(W, A, P) at the current state: A = ∫ |P| dt (the trapezoid sum: a scale), and
    W = ∫ P dt by the trapezoid sum with Gregory's end corrections,

        W = h (½P₀ + P₁ + … + P_{n−1} + ½P_n) + h/24 (−3P₀ + 4P₁ − P₂ − 3P_n + 4P_{n−1} − P_{n−2}),

    the Euler–Maclaurin term h²/12 (Ṗ₀ − Ṗ_n) with Ṗ from the three end values (Press et
    al., Numerical Recipes, §4.1: the extended formula of order 1/N⁴, weights 3/8, 7/6,
    23/24; Simpson's rule for n = 2, the plain trapezoid for n = 1). Fourth order in h. The
    plain trapezoid is off by h²/12 times the change of Ṗ, and an oscillator's power
    oscillates at twice its frequency: on a damped, driven oscillator at ωh = 0.3, where RK4
    is accurate (5e-4 in x against the closed form), it gives 1.9e-2, a false alarm at the
    limit 1e-2; with the corrections 3.6e-3, and 10.5 times less at half the step
    (tests/test_reliability.py). Integrator-agnostic: only P at the states the integrator
    returns, one evaluation per step."""
    n, w, a, p, p1, p2, c0 = acc
    corrected = w + (h / 24.0) * (c0 - 3.0 * p + 4.0 * p1 - p2)
    return jnp.where(n >= 2, corrected, w), a, p


def evaluate(spec: Spec, model, t, q, u, save_every: int, h=None, work=None):
    """The monitors on every saved state at once, after the time loop (vectorised over the
    saved states). ``t`` (T, *batch), ``q``, ``u`` (T, *batch, nb, 7) as the rollout saves
    them, index 0 the initial state; ``h`` the step; ``work`` None or (W, A, P), each
    (T, *batch), of :func:`work_value` at the saved states.

    The energy quantity at saved state k (n_k steps) is

        |E_k − E₀ − W_k| / (S_k + floor_k + lag_k / limit),

    with W = 0 for a conservative model, and

    * S_k = max_{j≤k} (T_j + |V_j − V₀| + |W_j|) + A_k: the energy the motion has exchanged
      so far (A = ∫ |P| dt, the work done in either direction);
    * floor_k = ε (10³ + 10² n_k) (M_k + M₀): the rounding after n_k steps, M = T +
      :func:`magnitude` + |W| + A (the terms' magnitudes, nonzero at rest at E = 0);
    * lag_k = min(h |V̇_k| / 2, S_k / 3) for a first-order integrator, 0 otherwise: its
      state lags the motion by about half a step, so its E is off by h/2 times the rate at
      which the potential changes, for any h (semi-implicit Euler from rest: exactly
      1/(2n + 1) of the energy exchanged after n steps, whose first-order part
      ½ n h² aᵀMa this term is; tests/test_reliability.py). Never more than a third of S
      (its value at the first step from rest): a larger lag means a step that does not
      resolve the motion.

    Returns (step (*batch,) int32: the last step of the first saved chunk where a limit is
    exceeded, −1 if none; worst: dict name -> (*batch,), the worst finite value)."""
    tc = t[..., None]  # (T, *batch, 1): the saved times as one more batch axis
    qc, uc = jnp.moveaxis(q, -1, 0), jnp.moveaxis(u, -1, 0)  # (7, T, *batch, nb)
    shape = t.shape
    values = {}
    if spec.unit is not None:
        a2 = cf.qnorm2(qc[3:7])
        values["unit_length"] = jnp.max(jnp.where(model.rigid, jnp.abs(a2 - 1), 0), axis=-1)
    if spec.joints is not None:
        r = residuals(model, tc, qc)
        values["joints"] = jnp.max(jnp.abs(r), axis=0)
    if spec.energy is not None:
        values["energy"] = _energy(spec, model, tc, qc, uc, save_every, h, work)
    named = {"unit_length": spec.unit, "joints": spec.joints, "energy": spec.energy}
    limits = {k: float(v) for k, v in named.items() if v is not None}
    exceeded = jnp.zeros(shape, bool)
    worst = {}
    for k, v in values.items():
        v = jnp.broadcast_to(v, shape)
        exceeded = exceeded | (v > limits[k])
        worst[k] = jnp.max(jnp.where(jnp.isfinite(v), v, 0), axis=0)
    first = jnp.argmax(exceeded, axis=0)
    step = jnp.where(jnp.any(exceeded, axis=0), first * save_every - 1, -1)
    return step.astype(jnp.int32), worst


def _energy(spec: Spec, model, tc, qc, uc, save_every: int, h, work):
    """The energy quantity of :func:`evaluate`, (T, *batch)."""
    kin, pot = kinetic(model, uc), potential(model, tc, qc)
    reach = jnp.sum(model.mass * cf.dot3(qc[0:3], qc[0:3]) + 2.0 * half_trace(model), -1)

    def rate():
        qdot = model.formulation._engine_kinematics(qc, uc)
        _, vdot = jax.jvp(
            lambda tt, qq: potential(model, tt, qq), (tc, qc), (jnp.ones_like(tc), qdot)
        )
        return vdot

    return energy_balance(
        spec, kin, pot, magnitude(model, tc, qc), reach, save_every, h, work, rate
    )


def energy_balance(spec: Spec, kin, pot, mag_v, reach, save_every: int, h, work, rate):
    """The work–energy quantity of :func:`evaluate`, (T, *batch), of either formulation (this
    module's :func:`_energy`, rbjax/_tree/monitors.py): from the saved states' kinetic
    energy ``kin``, potential ``pot``, the magnitude ``mag_v`` of the terms V is made of
    (:func:`magnitude`), the bodies' reach ``reach`` = Σ m |r|² + tr Θ, each (T, *batch);
    ``work`` None or (W, A, P) of :func:`work_value`; ``rate()`` -> V̇ (T, *batch), called
    only for a first-order integrator's lag. With ``spec.gain_only`` only energy gained,
    max(E − E₀ − W, 0), counts."""
    e = kin + pot
    w, a = 0.0, 0.0
    if work is not None:
        w, a, p = work
        if save_every == 1 and w.shape[0] >= 3:
            # After one step the loop has only the trapezoid, and from rest its error h³P̈/12
            # is of the order of the exchanged energy (∝ h²) times (ωh)²: (ωh)²/9 measured
            # on a spring, a false alarm from ωh = 0.3. The later powers give the first
            # interval to higher order: the cubic through P₀…P₃ (Adams–Moulton weights 9,
            # 19, −5, 1 over 24; 1.1e-5 → 3.7e-9 at ωh = 0.01), the parabola if only P₀…P₂
            # exist.
            if w.shape[0] >= 4:
                w1 = h * (9.0 * p[0] + 19.0 * p[1] - 5.0 * p[2] + p[3]) / 24.0
            else:
                w1 = h * (5.0 * p[0] + 8.0 * p[1] - p[2]) / 12.0
            w = w.at[1].set(w1)
    dtype = e.dtype
    eps = jnp.finfo(dtype).eps
    # rounding: 10³ ε of the magnitudes, and 10² ε more per step taken (a model at rest
    # accumulates ~ε|V| per step: 1.2e-13 J of 12.8 J in 100 steps of a resting four-bar).
    # The magnitudes are those of the terms, not of E: a body at rest at a spring's rest
    # length has E = 0 exactly, but its stretch is rounded to ε l0, which a step turns into
    # motion of about (ε k l0)²/k; ε ½ k (l² + l0²) is far above that and far below any
    # motion one could resolve (a stretch of √ε l0).
    # A force the model cannot decompose (a ForceFunction spring at its rest length) has
    # its rounding hidden in its value: the body then moves within the rounding of its
    # position, |Δr| ≈ ε |r| per step, with energies ~ m (ε |r| / h)² that no quadrature of
    # such a force's power follows (a ForceFunction spring at rest, k = 100, h = 0.01:
    # T ≈ 7e-30 J, measured |E − E₀ − W| / S ≈ 0.03). Motion below 10 ε of the position
    # (and of the body's size, √(tr Θ / m)) per step is no physics: 10² (ε/h)² Σ m|r|² + tr Θ.
    steps = jnp.arange(e.shape[0], dtype=dtype) * save_every
    steps = steps.reshape((-1,) + (1,) * (e.ndim - 1))
    mag = kin + mag_v + jnp.abs(w) + a
    floor = eps * (1e3 + 1e2 * steps) * (mag + mag[0]) + 1e2 * (eps / h) ** 2 * (reach + reach[0])
    floor = floor + jnp.finfo(dtype).tiny
    scale = jax.lax.cummax(kin + jnp.abs(pot - pot[0]) + jnp.abs(w), axis=0) + a
    if spec.lag:
        lag = jnp.minimum(0.5 * h * jnp.abs(rate()), scale / 3.0)
        scale = scale + lag / float(spec.energy or 1.0)  # the limit (set when watched)
    gap = e - e[0] - w
    gap = jnp.maximum(gap, 0.0) if spec.gain_only else jnp.abs(gap)
    return gap / (scale + floor)
