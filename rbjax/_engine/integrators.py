"""Time stepping in the engine's layout: the kernels behind rbjax's integrators.

Every step maps component-first (t (*batch, 1), q, u (7, *batch, nb), h) to (t, q, u, ok), ok
(*batch,) False where an inner solver failed. The explicit steps take any component counts
(nq, *batch, nb), (nv, *batch, nb): a tree in joint coordinates runs them on (nq, *batch, 1),
(nv, *batch, 1) (rbjax/_tree/rollout.py). The public classes in rbjax/_integrators.py
document the methods and call these.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float

from .projection import project_position, project_velocity


def large_step(model) -> bool:
    """Whether one right-hand side of ``model`` is large (a mechanism's joints, or a tree in
    joint coordinates: ``model.large_step``): its RK stages then run in a ``lax.scan`` and its
    rollout checks every step, which traces the right-hand side once instead of once per
    stage plus once to locate a failure (compile time dominates such rollouts)."""
    return bool(getattr(model, "large_step", False) or model.joints)


def _ok(t):
    return jnp.ones(t.shape[:-1], dtype=bool)


def semi_implicit_euler_step(
    model,
    t: Float[Array, "*batch 1"],
    q: Float[Array, "nq *batch nb"],
    u: Float[Array, "nv *batch nb"],
    h: Float[Array, ""],
) -> tuple[
    Float[Array, "*batch 1"],
    Float[Array, "nq *batch nb"],
    Float[Array, "nv *batch nb"],
    Bool[Array, "*batch"],
]:
    """u⁺ = u + h u̇(t, q, u), q⁺ = q + h q̇(q, u⁺) (rbjax.SemiImplicitEuler)."""
    f = model.formulation
    _, udot, _ = f._engine_derivatives(model, t, q, u)
    u1 = u + h * udot
    q1 = q + h * f._engine_kinematics(q, u1)
    return t + h, q1, u1, _ok(t)


def explicit_rk_step(
    tab,
    model,
    t: Float[Array, "*batch 1"],
    q: Float[Array, "nq *batch nb"],
    u: Float[Array, "nv *batch nb"],
    h: Float[Array, ""],
) -> tuple[
    Float[Array, "*batch 1"],
    Float[Array, "nq *batch nb"],
    Float[Array, "nv *batch nb"],
    Bool[Array, "*batch"],
]:
    """One step of the explicit Runge–Kutta method with Butcher tableau ``tab``."""
    if large_step(model):
        return _explicit_rk_looped(tab, model, t, q, u, h)
    f = model.formulation
    ks = []
    for i, ci in enumerate(tab.c):
        qi, ui = q, u
        for aij, (kq, ku) in zip(tab.a[i], ks, strict=True):
            if aij != 0.0:
                qi = qi + (h * aij) * kq
                ui = ui + (h * aij) * ku
        kq, ku, _ = f._engine_derivatives(model, t + ci * h, qi, ui)
        ks.append((kq, ku))
    q1, u1 = q, u
    for bi, (kq, ku) in zip(tab.b, ks, strict=True):
        q1 = q1 + (h * bi) * kq
        u1 = u1 + (h * bi) * ku
    return t + h, q1, u1, _ok(t)


def _explicit_rk_looped(tab, model, t, q, u, h):
    """The same method with the stages in a ``lax.scan``: the right-hand side is traced
    once instead of once per stage. Used for mechanisms, whose right-hand side (autodiff
    W and γ, Schur complement) is large, to keep compile times down; the arithmetic is
    identical up to the order of additions."""
    f = model.formulation
    ns = len(tab.c)
    amat = np.zeros((ns, ns))
    for i, row in enumerate(tab.a):
        amat[i, : len(row)] = row
    coeffs = jnp.asarray(np.concatenate([amat, np.asarray(tab.c)[:, None]], 1), q.dtype)

    def stage(ks, i):
        kq, ku = ks
        row = coeffs[i]
        w = (h * row[:ns]).reshape((ns,) + (1,) * q.ndim)
        qi = q + jnp.sum(w * kq, axis=0)
        ui = u + jnp.sum(w * ku, axis=0)
        dq, du, _ = f._engine_derivatives(model, t + row[ns] * h, qi, ui)
        return (kq.at[i].set(dq), ku.at[i].set(du)), None

    # The stage slopes start as zeros that DEPEND on q and u: under jax.vmap and jax.jvp the
    # scan's carry is then batched and has tangents from the first pass, so JAX's fixpoint over
    # the carry (loops.py, _scan_batching_rule / _scan_jvp) traces the right-hand side once
    # instead of twice. Measured (double pendulum, 20-step rollout, alternating A/B runs on a
    # noisy 2-core machine): tracing a vmapped jvp 6.6-7.7 → 4.6-5.0 s, a grad 6.4-10.6 →
    # 4.8-8.7 s (every pair faster, median about 0.75x). 0 · q is 0 for any finite state; a
    # non-finite one fails the step anyway.
    zeros = (jnp.zeros((ns,) + q.shape, q.dtype) * q, jnp.zeros((ns,) + u.shape, u.dtype) * u)
    (kq, ku), _ = jax.lax.scan(stage, zeros, jnp.arange(ns))
    b = jnp.asarray(tab.b, q.dtype).reshape((ns,) + (1,) * q.ndim)
    return t + h, q + h * jnp.sum(b * kq, axis=0), u + h * jnp.sum(b * ku, axis=0), _ok(t)


def projected_step(base_step, model, t, q, u, h, velocities, tol, max_iters):
    """``base_step`` then the projection onto the joint manifolds (rbjax.Projected)."""
    t1, q1, u1, ok = base_step(model, t, q, u, h)
    if not model.joints:
        return t1, q1, u1, ok
    tol = (1e-12 if q.dtype == jnp.float64 else 1e-5) if tol is None else tol
    q1, err, _ = project_position(model, t1, q1, tol, max_iters)
    if velocities:
        u1 = project_velocity(model, t1, q1, u1)
    ok = ok & jnp.all(err <= 100 * tol, axis=0)
    return t1, q1, u1, ok
