"""Measures inside the time loop (rbjax/_measures.py), in the engine's layout.

The rollout's scan carries one accumulator per measure; after each step the measure's function
is evaluated on the whole batch (:func:`per_system`) and the accumulator updated. After the
loop, :class:`Locator` finishes them: the final value of :class:`rbjax.Final`, and the located
time of each :class:`rbjax.Event` (cubic Hermite dense output of the crossing step, bisection,
implicit-function-theorem derivative).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from .layout import per_system

# Bisection halves the bracket θ ∈ [0, 1] this many times: 2⁻⁶⁰ h is below float64's
# resolution of any event time (the located θ is exact to the last bit of the interpolant).
_BISECTIONS = 60


def _value(measure, model, t, q, u):
    return jnp.asarray(per_system(lambda m, _t, s: measure.fn(m, s), model, t, q, u))


def init(measures, model, t, q, u):
    """Accumulators at the initial state, one per measure (a tuple in ``measures`` order)."""
    return tuple(
        m._init(_value(m, model, t, q, u) if m._per_step else None, (t, q, u)) for m in measures
    )


def update(measures, accs, model, s_prev, s_new, h):
    """Accumulators after one step from ``s_prev`` to ``s_new`` (component-first (t, q, u))."""
    return tuple(
        m._update(acc, _value(m, model, *s_new), s_prev, s_new, h) if m._per_step else acc
        for m, acc in zip(measures, accs, strict=True)
    )


class Locator:
    """What measures need after the loop: the model, the integrator, the step, the final state."""

    def __init__(self, model, integrator, h, final):
        self.model, self.integrator, self.h, self.final = model, integrator, h, final
        self.t_end = final[0][..., 0]

    def final_value(self, measure):
        return _value(measure, self.model, *self.final)

    def event(self, measure, found, bracket):
        """The located crossing time of ``measure.fn`` in the step starting at ``bracket``
        (component-first (t, q, u), one per system), NaN where ``found`` is False.

        Dense output: the cubic Hermite interpolant of (q, q̇) and (u, u̇) at the step's two
        ends (the step is recomputed from its start, exactly as in the loop). g(θ) is bisected
        on θ ∈ [0, 1] keeping the sign change, then one Newton step with a stopped-gradient
        slope gives θ the derivative −g_p / g_θ of the implicit function theorem.
        """
        model, h = self.model, self.h
        f = model.formulation
        t0, q0, u0 = bracket
        t1, q1, u1, _ = self.integrator._engine_step(model, t0, q0, u0, h)
        dq0, du0, _ = f._engine_derivatives(model, t0, q0, u0)
        dq1, du1, _ = f._engine_derivatives(model, t1, q1, u1)

        def g(theta, model, q0, u0, q1, u1, dq0, du0, dq1, du1):  # theta (*batch,)
            th = theta[None, ..., None]
            h00 = (1 + 2 * th) * (1 - th) ** 2
            h10 = th * (1 - th) ** 2
            h01 = th**2 * (3 - 2 * th)
            h11 = th**2 * (th - 1)
            q = h00 * q0 + h10 * h * dq0 + h01 * q1 + h11 * h * dq1
            u = h00 * u0 + h10 * h * du0 + h01 * u1 + h11 * h * du1
            t = t0 + theta[..., None] * h
            return _value(measure, model, t, q, u)

        ends = (model, q0, u0, q1, u1, dq0, du0, dq1, du1)
        fixed = jax.tree.map(lambda x: jax.lax.stop_gradient(x) if eqx.is_array(x) else x, ends)
        g0 = g(jnp.zeros(found.shape, t0.dtype), *fixed)

        def bisect(_, ab):  # keeps g(a) on g(0)'s side and the sign change in [a, b]
            a, b = ab
            mid = 0.5 * (a + b)
            gm = g(mid, *fixed)
            same = jnp.sign(gm) == jnp.sign(g0)
            same = same & (gm != 0)
            return jnp.where(same, mid, a), jnp.where(same, b, mid)

        lo = jnp.zeros(found.shape, t0.dtype)
        hi = jnp.ones(found.shape, t0.dtype)
        a, b = jax.lax.fori_loop(0, _BISECTIONS, bisect, (lo, hi))
        theta = jax.lax.stop_gradient(0.5 * (a + b))
        gt, slope = jax.jvp(lambda th: g(th, *ends), (theta,), (jnp.ones_like(theta),))
        slope = jax.lax.stop_gradient(slope)
        safe = found & (slope != 0)
        theta = theta - jnp.where(safe, gt, 0) / jnp.where(safe, slope, 1)
        return jnp.where(found, t0[..., 0] + theta * h, jnp.nan)


def finish(measures, accs, model, integrator, h, final):
    """Each measure's value for every system (a tuple in ``measures`` order)."""
    loc = Locator(model, integrator, h, final)
    return tuple(m._finish(acc, loc) for m, acc in zip(measures, accs, strict=True))
