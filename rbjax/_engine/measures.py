"""Measures inside the time loop (rbjax/_measures.py), in the engine's layout.

The rollout's scan carries one accumulator per measure; after each step the measure's function
is evaluated on the whole batch (:func:`per_system`) and the accumulator updated. After the
loop, :class:`Locator` finishes them: the final value of :class:`rbjax.Final`, and the located
time of each :class:`rbjax.Event` (cubic Hermite dense output of the crossing step, bisection,
implicit-function-theorem derivative).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from .layout import per_system

# Bisection halves the bracket θ ∈ [0, 1] this many times: 2⁻⁶⁰ h is below float64's
# resolution of any event time (the located θ is exact to the last bit of the interpolant).
_BISECTIONS = 60


def state_system(fn, model, t, q, u):
    """``fn(model, state)`` of ONE system on a maximal model's engine arrays (a
    :class:`rbjax.State` per system: :func:`rbjax._engine.layout.per_system`)."""
    return per_system(lambda m, _t, s: fn(m, s), model, t, q, u)


class Natural(eqx.Module):
    """A measure of a formulation whose natural state is not :class:`rbjax.State`:
    ``system(fn, model, t, q, u)`` evaluates the measure's ONE-system ``fn(model, state)`` on
    the engine's component-first arrays (rbjax/_tree/model.py ``per_joint_system``: a
    :class:`rbjax.JointState` per system)."""

    measure: Any  # an rbjax measure (rbjax/_measures.py, above the engine)
    system: Callable = eqx.field(static=True)


def _split(m):
    """(measure, its one-system evaluator) of a plain or :class:`Natural` measure."""
    return (m.measure, m.system) if isinstance(m, Natural) else (m, state_system)


def _value(measure, model, t, q, u, system=state_system):
    return jnp.asarray(system(measure.fn, model, t, q, u))


def init(measures, model, t, q, u):
    """Accumulators at the initial state, one per measure (a tuple in ``measures`` order)."""
    out = []
    for m, system in map(_split, measures):
        v0 = _value(m, model, t, q, u, system) if m._per_step else None
        out.append(m._init(v0, (t, q, u)))
    return tuple(out)


def update(measures, accs, model, s_prev, s_new, h):
    """Accumulators after one step from ``s_prev`` to ``s_new`` (component-first (t, q, u))."""
    out = []
    for (m, system), acc in zip(map(_split, measures), accs, strict=True):
        v = _value(m, model, *s_new, system=system) if m._per_step else None
        out.append(m._update(acc, v, s_prev, s_new, h) if m._per_step else acc)
    return tuple(out)


class Locator:
    """What measures need after the loop: the model, the integrator, the step, the final state."""

    def __init__(self, model, integrator, h, final, system=state_system):
        self.model, self.integrator, self.h, self.final = model, integrator, h, final
        self.system = system
        self.t_end = final[0][..., 0]

    def final_value(self, measure):
        return _value(measure, self.model, *self.final, system=self.system)

    def _piece(self, start):
        """The step from ``start`` (component-first (t, q, u)): its end and both ends' q̇, u̇."""
        model, h = self.model, self.h
        f = model.formulation
        t0, q0, u0 = start
        t1, q1, u1, _ = self.integrator._engine_step(model, t0, q0, u0, h)
        dq0, du0, _ = f._engine_derivatives(model, t0, q0, u0)
        dq1, du1, _ = f._engine_derivatives(model, t1, q1, u1)
        return (t0, q0, u0, dq0, du0), (t1, q1, u1, dq1, du1)

    def _dense(self, measure, a, b, model):
        """θ ↦ fn at the cubic Hermite interpolant of the step from end ``a`` to end ``b``
        (each (t, q, u, q̇, u̇)), θ (*batch,) in [0, 1]."""
        h = self.h
        t0, q0, u0, dq0, du0 = a
        _, q1, u1, dq1, du1 = b

        def g(theta):
            th = theta[None, ..., None]
            h00 = (1 + 2 * th) * (1 - th) ** 2
            h10 = th * (1 - th) ** 2
            h01 = th**2 * (3 - 2 * th)
            h11 = th**2 * (th - 1)
            q = h00 * q0 + h10 * h * dq0 + h01 * q1 + h11 * h * dq1
            u = h00 * u0 + h10 * h * du0 + h01 * u1 + h11 * h * du1
            return _value(measure, model, t0 + theta[..., None] * h, q, u, self.system)

        return g

    def _fixed(self, *ends):
        """The model and step ends with stopped gradients (for the root searches)."""
        sg = lambda x: jax.lax.stop_gradient(x) if eqx.is_array(x) else x
        return jax.tree.map(sg, (self.model, *ends))

    @staticmethod
    def _bisect(sign_at, shape, dtype):
        """θ in [0, 1] where ``sign_at(θ)`` (a boolean "still on the starting side") flips."""

        def body(_, ab):
            a, b = ab
            mid = 0.5 * (a + b)
            same = sign_at(mid)
            return jnp.where(same, mid, a), jnp.where(same, b, mid)

        lo, hi = jnp.zeros(shape, dtype), jnp.ones(shape, dtype)
        a, b = jax.lax.fori_loop(0, _BISECTIONS, body, (lo, hi))
        return jax.lax.stop_gradient(0.5 * (a + b))

    def event(self, measure, found, bracket):
        """The located crossing time of ``measure.fn`` in the step starting at ``bracket``
        (component-first (t, q, u), one per system), NaN where ``found`` is False.

        Dense output: the cubic Hermite interpolant of (q, q̇) and (u, u̇) at the step's two
        ends (the step is recomputed from its start, exactly as in the loop). g(θ) is bisected
        on θ ∈ [0, 1] keeping the sign change, then one Newton step with a stopped-gradient
        slope gives θ the derivative −g_p / g_θ of the implicit function theorem.
        """
        a, b = self._piece(bracket)
        model_f, a_f, b_f = self._fixed(a, b)
        g_fixed = self._dense(measure, a_f, b_f, model_f)
        dtype = bracket[0].dtype
        g0 = g_fixed(jnp.zeros(found.shape, dtype))
        theta = self._bisect(
            lambda th: (jnp.sign(g_fixed(th)) == jnp.sign(g0)) & (g_fixed(th) != 0),
            found.shape,
            dtype,
        )
        g = self._dense(measure, a, b, self.model)
        gt, slope = jax.jvp(g, (theta,), (jnp.ones_like(theta),))
        slope = jax.lax.stop_gradient(slope)
        safe = found & (slope != 0)
        theta = theta - jnp.where(safe, gt, 0) / jnp.where(safe, slope, 1)
        return jnp.where(found, bracket[0][..., 0] + theta * self.h, jnp.nan)

    def extremum(self, measure, best, bracket, first, last, sign):
        """The largest (sign +1) or smallest (−1) value of ``measure.fn``: the values at the
        first and last steps, and the extremum of the dense output on the two steps from
        ``bracket`` (the state two steps before the largest interior peak ``best`` of the
        samples; ±inf where there was none). On each of the two steps the candidates are its
        ends and, where sign·g' goes from + to −, the root of g' (bisection, g' by forward
        mode). The value's derivative is ∂g/∂p at the located point (envelope theorem: g' = 0
        there), so no implicit-function step is needed."""
        a, b = self._piece(bracket)
        _, c = self._piece(b[:3])
        dtype = bracket[0].dtype
        shape = best.shape
        found = jnp.isfinite(best)
        out = jnp.maximum(sign * first, sign * last)
        out = jnp.where(found, jnp.maximum(out, sign * best), out)
        for lo, hi in ((a, b), (b, c)):
            model_f, lo_f, hi_f = self._fixed(lo, hi)
            g_fixed = self._dense(measure, lo_f, hi_f, model_f)
            slope = lambda th, g=g_fixed: sign * jax.jvp(g, (th,), (jnp.ones_like(th),))[1]
            zero, one = jnp.zeros(shape, dtype), jnp.ones(shape, dtype)
            interior = found & (slope(zero) > 0) & (slope(one) < 0)
            theta = self._bisect(lambda th, s=slope: s(th) > 0, shape, dtype)
            g = self._dense(measure, lo, hi, self.model)
            out = jnp.where(interior, jnp.maximum(out, sign * g(theta)), out)
        return sign * out


def finish(measures, accs, model, integrator, h, final):
    """Each measure's value for every system (a tuple in ``measures`` order)."""
    return tuple(
        m._finish(acc, Locator(model, integrator, h, final, system))
        for (m, system), acc in zip(map(_split, measures), accs, strict=True)
    )
