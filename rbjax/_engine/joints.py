"""The constraint terms of a mechanism: c, ċ, γ and W of every joint equation, stacked.

A model's joints are perfect bilateral constraints c(q, t) = 0 (Möller & Glocker 2012 eqs. (77)-(82)). In
generalized velocities u (Möller & Glocker 2012 eq. (37)), ċ = W u + c_t with W = c_q Q⁻¹, and

    M u̇ = f − h + Wᵀλ,      W u̇ = γ = −(∂ċ/∂q q̇ + ∂ċ/∂t)|_u.

W and γ come from automatic differentiation of each joint's residual alone: the 7 columns of W
for a body are jvps of c along q̇ = Q⁻¹(q) e_k (the formulation's kinematics), and γ is a nested
jvp; no Jacobian is written by hand.

The multipliers λ are solved in rbjax/_engine/schur.py.

Joints of the same type (and the same driver function) are stacked along a trailing axis and
evaluated together, and their equations come out stacked in joint order (:class:`JointTerms`,
:func:`row_layout`): the program grows with the number of joint TYPES, not joints.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._constraints import Frame
from .._topology import GROUND, stack_joints
from . import kernels as cf


class Group:
    """Joints of one topology group stacked along a trailing axis (trace-time helper).

    ``joint`` evaluates all of them at once; ``bi`` / ``bj`` are their body columns in the
    extended layout (GROUND is the extra column nb); ``vectorised``: the residual broadcasts
    over trailing axes and accepts Frames (built-in constraints), else it is written for one
    system and is vmapped (:func:`_one_system`)."""

    def __init__(self, model, ids):
        topo = model.topology
        self.ids = ids
        joints = [model.joints[k] for k in ids]
        self.joint = stack_joints(joints)
        self.vectorised = type(joints[0])._vectorised
        nb = topo.nb
        self.bi = np.asarray(
            [nb if topo.joint_bodies[k][0] == GROUND else topo.joint_bodies[k][0] for k in ids]
        )
        self.bj = np.asarray(
            [nb if topo.joint_bodies[k][1] == GROUND else topo.joint_bodies[k][1] for k in ids]
        )


def groups(model):
    """The model's joints in their topology groups (same type and static data)."""
    return [Group(model, ids) for ids in model.topology.joint_groups]


def _one_system(joint):
    """The residual of a stacked group of joints written for ONE system, (q_i (7,), q_j (7,),
    t ()) -> (m,), evaluated on the engine's arrays q (7, g, *batch), t (1, *batch) ->
    (m, g, *batch): ``jax.vmap`` over the group (each joint with its own parameters, the
    trailing axis g of the stacked leaves) and over the flattened batch. This adapter is what
    lets a user constraint speak the natural layout."""
    arrays, static = eqx.partition(joint, eqx.is_array)

    def per_joint(arr, a, b, s):  # a, b (7, n), s (n,) -> (m, n)
        j = eqx.combine(arr, static)
        one = lambda x, y, z: jnp.atleast_1d(j.residual(x, y, z))
        return jax.vmap(one, in_axes=(1, 1, 0), out_axes=1)(a, b, s)

    def res(qi, qj, t):
        g = qi.shape[1]
        batch = jnp.broadcast_shapes(qi.shape[2:], qj.shape[2:], jnp.shape(t)[1:])
        a = jnp.broadcast_to(qi, (7, g) + batch).reshape(7, g, -1)
        b = jnp.broadcast_to(qj, (7, g) + batch).reshape(7, g, -1)
        s = jnp.broadcast_to(t, (g,) + batch).reshape(g, -1)
        out = jax.vmap(per_joint, in_axes=(-1, 1, 1, 0), out_axes=1)(arrays, a, b, s)
        return out.reshape(out.shape[:2] + batch)

    return res


def _extend(x, ground):
    """Append the ground as an extra body column: (7, ..., nb) -> (7, ..., nb + 1)."""
    g = jnp.broadcast_to(
        jnp.asarray(ground, x.dtype).reshape((7,) + (1,) * (x.ndim - 1)), x.shape[:-1] + (1,)
    )
    return jnp.concatenate([x, g], axis=-1)


_GROUND_Q = (0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0)
_ZERO_U = (0.0,) * 7


class RowLayout:
    """Where each joint equation lives when all of them are stacked in joint order (numpy,
    built once per topology): the engine's stacked-row layout.

    ``offsets`` (n_joints + 1,) the first row of each joint; ``body`` (2, R) per row the body of
    side i and side j (``nb`` for the ground); ``perm`` the rows of the concatenated groups
    (each group row-major: joint, then equation) in joint order, None if already in order;
    ``pad`` (n_joints, m_max) per joint its rows padded with R (a row reading 0); ``keep``
    (2, R, 7) the columns of W̃ per side; ``onto`` (K, nb) per body the rows on it (see below)."""

    def __init__(self, topology):
        nb, rows = topology.nb, tuple(topology.joint_rows)
        off = np.asarray(topology.row_offsets, int)
        self.offsets, self.n = off, int(off[-1])
        joint = np.repeat(np.arange(len(rows), dtype=int), rows)
        ext = lambda b: nb if b == GROUND else b  # noqa: E731
        jb = topology.joint_bodies
        self.body = np.asarray(
            [[ext(jb[k][0]) for k in joint], [ext(jb[k][1]) for k in joint]], int
        ).reshape(2, -1)
        src = [off[k] + r for ids in topology.joint_groups for k in ids for r in range(rows[k])]
        self.perm = None if src == list(range(self.n)) else np.argsort(np.asarray(src, int))
        width = max(rows, default=1)
        self.pad = np.full((len(rows), width), self.n, int)
        for k, m in enumerate(rows):
            self.pad[k, :m] = np.arange(off[k], off[k] + m)
        # per row and side: 1 where the column of W̃ is kept (the ν column of a rigid body and
        # every column of a ground side are dropped), (2, R, 7)
        keep = np.ones((2, self.n, 7))
        for side in (0, 1):
            for r, b in enumerate(self.body[side]):
                if b == nb:
                    keep[side, r] = 0.0
                elif not topology.scalable[b]:
                    keep[side, r, 3] = 0.0
        self.keep = keep
        # per body its rows, as indices into both sides' rows stacked (side i, then side j)
        # and padded with 2R (a zero row): (K, nb), K the most rows on one body
        touch: list = [[] for _ in range(nb)]
        for side in (0, 1):
            for r, b in enumerate(self.body[side]):
                if b < nb:
                    touch[b].append(side * self.n + r)
        depth = max([len(t) for t in touch] + [1])
        self.onto = np.full((depth, nb), 2 * self.n, int)
        for b, rows_b in enumerate(touch):
            self.onto[: len(rows_b), b] = rows_b


@functools.lru_cache(maxsize=64)
def row_layout(topology) -> RowLayout:
    return RowLayout(topology)


class JointTerms(eqx.Module):
    """The constraint terms of every joint equation, stacked in joint order (R rows, the batch
    trailing): ``c`` (R, ...) residual; ``cdot`` (R, ...) = W u + c_t; ``gamma`` (R, ...);
    ``Wi`` / ``Wj`` (R, 7, ...) the rows of W on the body of side i / j (for a ground side, the
    Jacobian with respect to a virtual motion of the ground frame, used for its reaction).
    Fields not requested from :func:`joint_terms` are None. ``rows``: equations per joint.

    Everything the engine computes per joint equation works on these stacked rows, so a
    mechanism's program does not grow with its number of joints (:func:`row_layout` maps rows
    to bodies); :meth:`split` and :attr:`W` give the per-joint view."""

    # (typed Any: a field not requested is None, and every consumer asks for what it reads)
    c: Any
    cdot: Any
    gamma: Any
    Wi: Any
    Wj: Any
    rows: tuple[int, ...] = eqx.field(static=True)

    def split(self, x) -> list:
        """Stacked rows (R, ...) -> per joint (m_k, ...)."""
        off = np.cumsum((0,) + self.rows)
        return [x[off[k] : off[k + 1]] for k in range(len(self.rows))]

    @property
    def W(self) -> list:
        """Per joint the pair of blocks (W_i, W_j), each (m_k, 7, ...)."""
        if self.Wi is None or self.Wj is None:
            return [None] * len(self.rows)
        return list(zip(self.split(self.Wi), self.split(self.Wj), strict=True))

    def with_gamma(self, gamma) -> JointTerms:
        """The same terms with another right-hand side γ (R, ...)."""
        return dataclasses.replace(self, gamma=gamma)


def _body_frames(kin, qx, ux, *, jacobian, gamma, cdot):
    """Per-body Frame data in the extended layout (…, nb + 1, *batch) (ground included).

    Returns A (3, 3, …), the direction tangents dA[l] = ∂A/∂p · q̇_p(e_{3+l}) (4, 3, 3, …) for the
    rotational velocity directions, Ȧ along u and Ä = d/dt Ȧ at fixed u. All by jvp of A(p)
    along the formulation's kinematics. This uses the engine-wide convention that q̇ = kin(q, u)
    has ṙ = u[0:3] and that ṗ depends on (p, u[3:7]) only (true for every formulation).
    """
    p = qx[3:7]
    T = cf.transform_matrix(p)
    out = {"T": T}

    def pdot(pp, uu):
        return kin(jnp.concatenate([qx[0:3], pp], axis=0), uu)[3:7]

    if jacobian:
        eye = jnp.eye(7, dtype=qx.dtype)

        def direction(e):
            e = jnp.broadcast_to(e.reshape((7,) + (1,) * (qx.ndim - 1)), qx.shape)
            return jax.jvp(cf.transform_matrix, (p,), (pdot(p, e),))[1]

        out["dT"] = jax.vmap(direction)(eye[3:7])
    if gamma or cdot:

        def tdot(pp):
            return jax.jvp(cf.transform_matrix, (pp,), (pdot(pp, ux),))[1]

        if gamma:
            out["Td"], out["Tdd"] = jax.jvp(tdot, (p,), (pdot(p, ux),))
        else:
            out["Td"] = tdot(p)
    return out


def _frame_group(res, fr, qx, ux, bi, bj, tt, *, jacobian, gamma, cdot):
    """c, ċ, γ and W of one group of frame-capable joints (see :func:`joint_terms`)."""
    ri, rj = qx[0:3][:, bi], qx[0:3][:, bj]
    Ti, Tj = fr["T"][:, :, bi], fr["T"][:, :, bj]
    Fi, Fj = Frame(ri, Ti), Frame(rj, Tj)
    val = res(Fi, Fj, tt)
    cdv = gv = jnp.zeros(())
    if gamma or cdot:
        vi, vj = ux[0:3][:, bi], ux[0:3][:, bj]
        Tdi, Tdj = fr["Td"][:, :, bi], fr["Td"][:, :, bj]
        if gamma:
            Tddi, Tddj = fr["Tdd"][:, :, bi], fr["Tdd"][:, :, bj]
        else:
            Tddi = Tddj = jnp.zeros_like(Ti)

        def path(tau):
            # second-order Taylor path of the frames at fixed u (r̈ = 0 since ṙ = v)
            h = 0.5 * tau * tau
            a = Frame(ri + tau * vi, Ti + tau * Tdi + h * Tddi)
            b = Frame(rj + tau * vj, Tj + tau * Tdj + h * Tddj)
            return res(a, b, tt + tau)

        def first(tau):
            return jax.jvp(path, (tau,), (jnp.ones_like(tau),))[1]

        zero = jnp.zeros((), qx.dtype)
        if gamma:
            cdv, cdd = jax.jvp(first, (zero,), (jnp.ones_like(zero),))
            gv = -cdd
        else:
            cdv = first(zero)
    wi = wj = None
    if jacobian:
        eye3 = jnp.eye(3, dtype=qx.dtype)

        def trans(e, side):
            r0 = ri if side == 0 else rj
            d = jnp.broadcast_to(e.reshape((3,) + (1,) * (r0.ndim - 1)), r0.shape)
            if side == 0:
                return jax.jvp(lambda r: res(Frame(r, Ti), Fj, tt), (ri,), (d,))[1]
            return jax.jvp(lambda r: res(Fi, Frame(r, Tj), tt), (rj,), (d,))[1]

        def rot(dT, side):
            if side == 0:
                return jax.jvp(lambda T: res(Frame(ri, T), Fj, tt), (Ti,), (dT[:, :, bi],))[1]
            return jax.jvp(lambda T: res(Fi, Frame(rj, T), tt), (Tj,), (dT[:, :, bj],))[1]

        wi = jnp.concatenate(
            [jax.vmap(lambda e: trans(e, 0))(eye3), jax.vmap(lambda d: rot(d, 0))(fr["dT"])]
        )
        wj = jnp.concatenate(
            [jax.vmap(lambda e: trans(e, 1))(eye3), jax.vmap(lambda d: rot(d, 1))(fr["dT"])]
        )
    return val, cdv, gv, wi, wj


def _generic_group(res, kin, qx, ux, bi, bj, tt, *, jacobian, gamma, cdot):
    """c, ċ, γ and W of a group of joints by jvps of the residual along kin(q, ·) in q."""
    qi, qj = qx[:, bi], qx[:, bj]
    ui, uj = ux[:, bi], ux[:, bj]
    ones = jnp.ones_like(tt)
    val = res(qi, qj, tt)
    cdv = gv = jnp.zeros(())
    if gamma:

        def cd(a, b, s):
            return jax.jvp(res, (a, b, s), (kin(a, ui), kin(b, uj), ones))[1]

        cdv, cdd = jax.jvp(cd, (qi, qj, tt), (kin(qi, ui), kin(qj, uj), ones))
        gv = -cdd
    elif cdot:
        cdv = jax.jvp(res, (qi, qj, tt), (kin(qi, ui), kin(qj, uj), ones))[1]
    wi = wj = None
    if jacobian:
        eye = jnp.eye(7, dtype=qx.dtype)

        def col(e, side):
            q_s = qi if side == 0 else qj
            d = kin(q_s, jnp.broadcast_to(e.reshape((7,) + (1,) * (q_s.ndim - 1)), q_s.shape))
            z = jnp.zeros_like(d)
            tang = (d, z) if side == 0 else (z, d)
            return jax.jvp(lambda a, b: res(a, b, tt), (qi, qj), tang)[1]

        wi = jax.vmap(lambda e: col(e, 0))(eye)  # (7, m, g, *batch)
        wj = jax.vmap(lambda e: col(e, 1))(eye)
    return val, cdv, gv, wi, wj


def joint_terms(model, kin, t, q, u, *, jacobian=True, gamma=True, cdot=False):
    """Evaluate every joint's residual, W blocks and γ (autodiff of the residual only).

    ``kin(q, u)`` is the formulation's q̇ = Q⁻¹(q) u (component-first, linear in u); ``t`` has
    shape (..., 1) or (...,); q, u (7, ..., nb).

    Built-in joints (``_vectorised`` constraint types) read q only through world points r + A s̄ and vectors A ā.
    Their W is obtained by the chain rule split at the body Frame (r, A): ∂A/∂p along each of
    the 4 rotational velocity directions is ONE jvp of A(p) per body, shared by all joints on the
    body; each joint then costs a jvp of its residual with respect to (r, A), which is linear in
    (r, A). γ is the second derivative of the residual along the Taylor path of the frames at
    fixed u. Other constraints (CustomConstraint, user subclasses) take jvps of the residual in
    q directly. Both routes are autodiff of the residual alone; tests compare them.
    """
    # Inside, bodies/joints go BEFORE the batch axes so that the batch stays the minor
    # (contiguous, vectorised) axis: (7, nb + 1, *batch); parameters (k, g) broadcast along it.
    nbatch = q.ndim - 2
    batch = q.shape[1:-1]
    tt = (t[..., 0] if t.ndim == q.ndim - 1 else t)[None]  # (1, *batch)
    qx = jnp.moveaxis(_extend(q, _GROUND_Q), -1, 1)
    ux = jnp.moveaxis(_extend(u, _ZERO_U), -1, 1)
    grps = groups(model)
    fr = None
    if any(_fast_path(g) for g in grps):
        fr = _body_frames(kin, qx, ux, jacobian=jacobian, gamma=gamma, cdot=cdot)
    parts: dict = {"c": [], "cdot": [], "gamma": [], "Wi": [], "Wj": []}

    def rows_of(x, lead):  # (*lead, m, g, *batch) -> (g * m, *lead, *batch), joint-major
        x = jnp.broadcast_to(x, x.shape[: lead + 2] + batch)
        x = jnp.moveaxis(x, (lead, lead + 1), (1, 0))
        return x.reshape((-1,) + x.shape[2 : lead + 2] + batch)

    for grp in grps:
        if _fast_path(grp):
            joint = jax.tree.map(
                lambda x: x.reshape(x.shape + (1,) * nbatch) if eqx.is_array(x) else x, grp.joint
            )
            res = joint.residual  # vectorised: the same code takes the engine's arrays
        else:
            res = _one_system(grp.joint)

        flags = dict(jacobian=jacobian, gamma=gamma, cdot=cdot)
        if _fast_path(grp):
            val, cdv, gv, wi, wj = _frame_group(res, fr, qx, ux, grp.bi, grp.bj, tt, **flags)
        else:
            val, cdv, gv, wi, wj = _generic_group(res, kin, qx, ux, grp.bi, grp.bj, tt, **flags)
        parts["c"].append(rows_of(val, 0))
        if gamma or cdot:
            parts["cdot"].append(rows_of(cdv, 0))
        if gamma:
            parts["gamma"].append(rows_of(gv, 0))
        if wi is not None and wj is not None:
            parts["Wi"].append(rows_of(wi, 1))  # (7, m, g, *batch)
            parts["Wj"].append(rows_of(wj, 1))
    perm = row_layout(model.topology).perm

    def stacked(name):
        if not parts[name]:
            return None
        x = jnp.concatenate(parts[name], axis=0)
        return x if perm is None else x[perm]

    return JointTerms(
        c=stacked("c"),
        cdot=stacked("cdot"),
        gamma=stacked("gamma"),
        Wi=stacked("Wi"),
        Wj=stacked("Wj"),
        rows=tuple(model.joint_rows),
    )


def _fast_path(grp) -> bool:
    """Whether a group takes the vectorised frame route (else the one-system adapter)."""
    return grp.vectorised
