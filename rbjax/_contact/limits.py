"""Joint limits of hinges and slides as perfect unilateral constraints (issue 38): the range
lo ≤ q ≤ hi of a joint coordinate is two one-sided constraints with gaps q − lo and hi − q,
whose generalized force directions are ±e_d (the joint's DOF). They take part in the same
Moreau–Jean percussion problem as the contacts, as contacts without friction (their tangent
rows are zero), with a restitution e (0 by default: a plastic stop, as MuJoCo's limits have no
bounce).

One row per limited coordinate, for the side it is nearer to: both sides cannot be closed at
once (lo < hi), and a coordinate moves by h|q̇| in a step, far less than its range, so the
far side's row would be open in every step. Two rows per coordinate made the percussion
problem of a quadruped with 12 limited joints (Barkour v0, benchmarks/contact.py) 28 contacts
instead of 16: 236 against 94 µs per system-step at B = 64, measured on 2 CPU cores."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._errors import fail


class LimitRows(eqx.Module):
    """The limited coordinates of a tree: ``qpos_index``, ``dof`` (k,) static, ``lower`` and
    ``upper`` (k,) arrays (−inf/inf where one side is free) and ``restitution`` (k,)."""

    qpos_index: tuple[int, ...] = eqx.field(static=True)
    dof: tuple[int, ...] = eqx.field(static=True)
    lower: jax.Array
    upper: jax.Array
    restitution: jax.Array

    @property
    def mu(self):
        return jnp.zeros_like(self.restitution)

    @property
    def tangential_restitution(self):
        return jnp.zeros_like(self.restitution)

    @property
    def count(self) -> int:
        """The unilateral constraints: one per limited coordinate (module docstring)."""
        return len(self.dof)

    def _nearer(self, qpos):
        """(gap (k,), side (k,)): the gap to the nearer side, min(q − lo, hi − q), and +1
        where that is the lower side, −1 the upper."""
        q = qpos[np.asarray(self.qpos_index)]
        below, above = q - self.lower, self.upper - q
        return jnp.minimum(below, above), jnp.where(below <= above, 1.0, -1.0).astype(q.dtype)

    def gaps(self, model, qpos):
        """The gaps (k,) of ONE system, each to its coordinate's nearer side."""
        return self._nearer(qpos)[0]

    def fixed_gaps(self, model, qpos):
        """The gaps of the rows whose identity does not depend on the configuration, which
        come first: every limit row (the side a row stands for changes only in mid-range,
        where it is far from closing)."""
        return self.gaps(model, qpos)

    def gaps_and_jacobian(self, model, qpos):
        """(g (k,), W (k, 3, nv)): W's normal rows ±e_d (+ at the lower side, − at the upper),
        its tangent rows zero."""
        k, nv = len(self.dof), model.nv
        unit = np.zeros((k, 3, nv))
        unit[np.arange(k), 0, np.asarray(self.dof, int)] = 1.0
        gap, side = self._nearer(qpos)
        return gap, side[:, None, None] * jnp.asarray(unit, gap.dtype)

    def gaps_and_velocity(self, model, qpos, qvel):
        """(g (k,), γ (k, 3)) of ONE system (``model`` unused: the rows are the
        coordinates'): γ's normal column is ±q̇_d, its tangent columns zero."""
        gap, W = self.gaps_and_jacobian(model, qpos)
        return gap, W @ qvel


def limit_rows(topo, limits: dict | None, restitution: float = 0.0) -> LimitRows | None:
    """The :class:`LimitRows` of ``limits`` {joint name: (lo, hi)} on the tree ``topo``: hinge
    or slide joints, lo < hi (either may be ±inf), restitution in [0, 1]."""
    if not limits:
        return None
    if not isinstance(limits, dict):
        fail("JointModel.limits", limits, "is not a dict", "pass {joint name: (lo, hi)}")
    if not (np.isfinite(restitution) and 0.0 <= restitution <= 1.0):
        fail("JointModel.limit_restitution", restitution, "is not in [0, 1]", "give e in [0, 1]")
    qi, dof, lo, hi = [], [], [], []
    for name, rng in limits.items():
        if name not in topo.joint_names:
            fail(
                f"JointModel.limits[{name!r}]",
                name,
                f"is not a joint of the model (joints: {', '.join(topo.joint_names)})",
                "name a hinge or slide joint",
            )
        j = topo.joint_names.index(name)
        if topo.joint_types[j] not in ("hinge", "slide"):
            fail(
                f"JointModel.limits[{name!r}]",
                topo.joint_types[j],
                "is not a hinge or slide",
                "limit hinge and slide joints only (a ball's cone limit is not simulated)",
            )
        a = np.asarray(rng, dtype=float)
        if a.shape != (2,) or np.any(np.isnan(a)) or not a[0] < a[1]:
            fail(
                f"JointModel.limits[{name!r}]",
                rng,
                "is not a range (lo, hi) with lo < hi",
                "give (lo, hi) in the joint's units (rad or m); ±inf for a free side",
            )
        qi.append(topo.qposadr[j])
        dof.append(topo.dofadr[j])
        lo.append(a[0])
        hi.append(a[1])
    dt = jnp.result_type(float)
    return LimitRows(
        tuple(qi),
        tuple(dof),
        jnp.asarray(lo, dt),
        jnp.asarray(hi, dt),
        jnp.full(len(dof), restitution, dt),
    )
