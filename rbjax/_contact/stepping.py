r"""Moreau–Jean time stepping of a tree in joint coordinates with perfect unilateral contacts
and Coulomb friction, and joint limits (rbjax/_contact/limits.py) (Moreau 1988; Jean 1999; Studer 2009, *Numerics of Unilateral Contacts
and Friction*, §4.2 and Alg. 4.1; Acary & Brogliato 2008, §10.1).

One step of length h from (q_k, v_k) (``integrate_positions``'s ⊕ turns a ball's or free
joint's quaternion by the rotation of its angular velocity):

    q_M = q_k ⊕ (h/2) v_k                                      (midpoint)
    M(q_M) (v_{k+1} − v_k) = h (τ − b)(t_k + h/2, q_M, v_k) + W(q_M) P
    q_{k+1} = q_M ⊕ (h/2) v_{k+1}

where the contacts closed in the step take the percussions P of Signorini–Newton and Coulomb
(rbjax/_contact/prox.py), and the others none. A contact is closed when the gap the free
motion would leave at the end of the step is not positive, g(q_M) + (h/2) γ_N(v_free) ≤ 0
(Studer 2009, §4.2, closes on g(q_M) ≤ 0: on a body resting on several points, rounding puts
some at +1 ulp and some at −1 ulp, closes only the latter, and the impulse on them spins the
body, measured at 0.02 rad/s on a resting box; the predicted gap closes them all), with a
margin of 1 nm (``_CLOSE_MARGIN``: bodies stacked fall together in the free motion, so their
pair's predicted gap is 0 to rounding). Nothing is
penalised: a closed contact's normal velocity after the step is ≥ −e times the one before,
exactly (to the solver's tolerance). The scheme is first order, event-free (impacts happen
inside steps) and, without contacts, the Störmer–Verlet drift–kick–drift of a constant
mass matrix. Equalities (connect, weld, couplings) are not in the impulse problem yet, so a
model with both is refused.

**Position projection** (``projection=True``, the default; Acary 2013, "Projected
event-capturing time-stepping schemes for nonsmooth mechanical systems with unilateral contact
and Coulomb's friction", CMAME 256). A contact closes within half a step of the plane, so the
positions reach a depth O(h |v|) before the velocity law stops them. After each step the
penetrating contacts (g(q_{k+1}) < 0) are pushed out by the smallest move in the metric of M:
Π ≥ 0 with g + G_NN Π ≥ 0 and Πᵀ(g + G_NN Π) = 0 (the frictionless problem of the same solver,
with the midpoint's W and G), then q_{k+1} ⊕ M⁻¹ Wᵀ Π. The velocities are not changed, so the
projection adds no kinetic energy (a Baumgarte term would: on a ball hitting the ground at
4.4 m/s it would throw it back at several dm/s). A body set down on a plane then stays on it
to the solver's tolerance, without drift (tests/test_contact.py); one that lands comes to rest
between 0 and g h²/2 above it (the closing rule stops its last free step early); during an
impact step the depth is still O(h |v|).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._integrators import AbstractIntegrator
from .._tree.implicit import integrate_positions
from .._tree.model import per_joint_system
from .prox import percussions

# the projection's tolerance, relative to its largest push: a position error of 1e-10 of it
# (the frictionless problem is solved exactly by the Newton steps after the sweeps, so this
# costs nothing where the velocity solve's looser ``tol`` would leave depth behind)
_PROJECTION_TOL = 1e-10
# [m] ... of the depths, or of 1 mm where they are smaller: a resting body's gaps are ±1 ulp,
# and a tolerance relative to them alone would ask the solver for 1e-27 m (measured: every
# resting step ran out of sweeps, 2.2× the step time at B = 64)
_PROJECTION_FLOOR = 1e-3
# [m] a contact closes when the free motion leaves it within this of touching, not only past
# it: two cubes stacked fall together in the free motion, so their pair's predicted gap is 0 to
# rounding, and closing on ≤ 0 let the upper one fall (and be projected back) every other step
_CLOSE_MARGIN = 1e-9


class MoreauJean(AbstractIntegrator):
    """Moreau–Jean time stepping with perfect unilateral contacts and Coulomb friction, for a
    :class:`rbjax.JointModel` with ``contacts`` or ``limits`` (joint ranges, as frictionless
    unilateral constraints; rbjax/_contact/stepping.py). ``tol`` and
    ``max_iter``: the contact solver's natural-map tolerance (relative to the largest
    percussion) and its sweeps at most (Gauss–Seidel, then Newton steps:
    rbjax/_contact/prox.py); ``accept`` (≥ tol): the residual below which a solve that ran out
    of sweeps still counts (a contact on the stick–slip boundary of a stack stalls near 1e-6 of
    the largest percussion, measured); a step above it fails with
    ``rbjax.RESULTS.solver_failed``. ``projection``: move the positions out of the plane after
    each step, leaving the velocities as they are (module docstring). First order. In a
    rollout each step's solve starts from the last step's percussions P_k or their
    extrapolation 2 P_k − P_{k−1}, whichever has the smaller natural-map residual (a warm
    start: a box resting on four corners then needs 0 or 1 sweeps a step instead of 19 to 50;
    the quadruped of tests/test_contact_quadruped.py, whose percussions drift with its stance,
    7.3 instead of 10.7 from P_k alone, measured); the steps are the same to the solver's
    tolerance from any start."""

    tol: float = eqx.field(static=True, default=1e-10)
    max_iter: int = eqx.field(static=True, default=1000)
    projection: bool = eqx.field(static=True, default=True)
    accept: float = eqx.field(static=True, default=1e-5)

    def __check_init__(self):
        if not (np.isfinite(self.tol) and self.tol > 0):
            raise ValueError(
                f"MoreauJean.tol = {self.tol!r} is not a number > 0. Fix: give a relative "
                "tolerance such as 1e-10."
            )
        if not (np.isfinite(self.accept) and self.accept >= self.tol):
            raise ValueError(
                f"MoreauJean.accept = {self.accept!r} is not a number >= tol ({self.tol!r}). "
                "Fix: give accept >= tol (default 1e-5)."
            )
        if not (isinstance(self.max_iter, int) and self.max_iter >= 1):
            raise ValueError(
                f"MoreauJean.max_iter = {self.max_iter!r} is not an integer >= 1. Fix: give "
                "the sweeps at most, e.g. 1000."
            )

    @property
    def order(self) -> int:
        return 1

    def step(self, model, state, dt):
        raise ValueError(
            "MoreauJean.step: one step is taken by rbjax.rollout(model, state, dt, 1, "
            "integrator=rbjax.MoreauJean()). Fix: call rollout with n_steps=1."
        )

    def _engine_step(self, model, t, q, u, h):
        return self._engine_step_warm(model, t, q, u, h, self._engine_warm(model, t, q, u))[:4]

    def _engine_warm(self, model, t, q, u):
        """The warm start of the contact solver: the last two steps' percussions
        (*batch, 2, k, 3), newest first, zero at the start. A resting contact's percussions
        change little and smoothly from step to step, so its solve starts next to the
        solution (measured, a box resting on four corners: 19 to 50 sweeps a step from zero,
        rbjax/_contact/prox.py)."""
        if not hasattr(model, "topology"):
            raise ValueError(
                "integrator = MoreauJean() integrates joint coordinates only. Fix: load the "
                "model with formulation=rbjax.JointCoordinates() and give it contacts."
            )
        k = sum(s.count for s in (model.contacts, model.limits) if s is not None)
        return jnp.zeros(t.shape[:-1] + (2, k, 3), q.dtype)

    def _engine_step_warm(self, model, t, q, u, h, warm):
        def one(m, s, last):
            # the last percussions, or their linear extrapolation, whichever is nearer to
            # solving the laws (extrapolating an impact's percussion doubles it)
            P0 = jnp.stack([last[0], 2.0 * last[0] - last[1]])
            out = contact_step(
                m,
                s.t,
                s.qpos,
                s.qvel,
                h,
                self.tol,
                self.max_iter,
                self.projection,
                self.accept,
                initial=P0,
            )
            return *out[:3], jnp.stack([out[3], last[0]])

        q1, u1, ok, P = per_joint_system(one, model, t, q, u, warm)  # batch-first
        back = lambda x: jnp.moveaxis(x, -1, 0)[..., None]  # noqa: E731
        return t + h, back(q1), back(u1), ok, P


def contact_step(
    model, t, qpos, qvel, h, tol, max_iter, projection=True, accept=None, initial=None
):
    """One step of ONE system (module docstring): (qpos', qvel', solver converged,
    percussions (k, 3)); ``initial`` (k, 3) the contact solver's warm start, or (c, k, 3)
    candidate starts (``percussions``; default 0)."""
    topo = model.topology
    qm = integrate_positions(topo, qpos, qvel, 0.5 * h)
    M, b = model.mass_and_bias(qm[:, None], qvel[:, None])
    M, b = M[..., 0], b[..., 0]
    tau = model.generalized_forces(t + 0.5 * h, qm[:, None], qvel[:, None])[..., 0]
    factor = jax.scipy.linalg.cho_factor(M, lower=True)
    v_free = qvel + h * jax.scipy.linalg.cho_solve(factor, tau - b)
    sets = [s for s in (model.contacts, model.limits) if s is not None]
    if not sets:
        q1 = integrate_positions(topo, qm, v_free, 0.5 * h)
        return q1, v_free, jnp.asarray(True), jnp.zeros((0, 3), v_free.dtype)

    # the gaps and γ = W v of every unilateral constraint at the midpoint, (k,) and (3k, nv)
    parts = [s.gaps_and_jacobian(model, qm) for s in sets]
    gap = jnp.concatenate([g for g, _ in parts])
    k = gap.shape[0]
    W = jnp.concatenate([w for _, w in parts]).reshape(3 * k, -1)
    per = lambda name: jnp.concatenate([getattr(s, name) for s in sets])  # noqa: E731
    MinvWt = jax.scipy.linalg.cho_solve(factor, W.T)  # (nv, 3k)
    G = W @ MinvWt
    gamma_free = (W @ v_free).reshape(k, 3)
    # closed: the gap the free motion would leave at the end of the step is ≤ 0 (module
    # docstring); g(q_M) ≤ 0 alone flickers on a resting body, whose corners sit at ±1 ulp
    closed = gap + 0.5 * h * gamma_free[:, 0] <= _CLOSE_MARGIN
    sol = percussions(
        G,
        gamma_free,
        (W @ qvel).reshape(k, 3),
        per("mu"),
        per("restitution"),
        closed,
        tangential_restitution=per("tangential_restitution"),
        tol=tol,
        max_iter=max_iter,
        accept=accept,
        initial=initial,
    )
    v1 = v_free + MinvWt @ sol.P.reshape(3 * k)
    q1 = integrate_positions(topo, qm, v1, 0.5 * h)
    if not projection:
        return q1, v1, sol.ok, sol.P
    # the position projection (module docstring): Π ≥ 0, g + G_NN Π ≥ 0, Πᵀ(g + G_NN Π) = 0
    # over the penetrating contacts and those closed in the step (a push that frees one must
    # not drive another in: a box pushed out of the ground into the box it carries)
    # with the midpoint's W and M, then q ⊕ M⁻¹ Wᵀ Π
    # the depth at the end of the step: exact for the candidates whose identity is fixed (a
    # shape's point against the plane, a limit), to first order for a pair of shapes, whose
    # candidates are chosen anew from the configuration (a box pair's reference face): the
    # gap at q_M plus its rate (h/2) γ_N(v') keeps each row the contact the midpoint's W has
    linear = gap + 0.5 * h * (W @ v1).reshape(k, 3)[:, 0]
    pieces, start = [], 0
    for s in sets:  # each set's fixed rows come first (rbjax/_contact/shapes.py, limits.py)
        exact = s.fixed_gaps(model, q1)
        pieces += [exact, linear[start + exact.shape[0] : start + s.count]]
        start += s.count
    gap1 = jnp.concatenate(pieces)
    zeros = jnp.zeros((k, 2), gap1.dtype)
    push = percussions(
        G,
        jnp.concatenate([gap1[:, None], zeros], axis=1),
        jnp.zeros((k, 3), gap1.dtype),
        0.0,
        0.0,
        closed | (gap1 < 0.0),
        tol=_PROJECTION_TOL,
        max_iter=max_iter,
        floor=_PROJECTION_FLOOR,
    )
    q1 = integrate_positions(topo, q1, MinvWt @ push.P.reshape(3 * k), 1.0)
    # a projection that stops short of its tolerance (slow on redundant contacts: a box face
    # on a face) is still a move out of the plane from Π = 0 by Gauss–Seidel sweeps, each of
    # which lowers the depth: never worse than no projection, so not a failed step
    return q1, v1, sol.ok, sol.P
