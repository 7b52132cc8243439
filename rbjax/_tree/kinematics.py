"""Forward kinematics of a tree in joint coordinates, vectorised over bodies and DOFs.

Arrays are component-first like the rest of the engine (rbjax/_engine/README.md): a vector is
(3, n, ...), a rotation matrix (3, 3, n, ...), with n bodies, joints or DOFs and any batch axes
behind. A pose (R, p) maps a point x of its frame to R x + p in the frame above.

Per body i, its frame in its parent's is the product of its body offset B_i (``body_pos``,
``body_quat``) and its joints J_i1 ∘ J_i2 ∘ ... in order, each expressed in the frame the
previous ones left (MuJoCo's ``mj_kinematics``):

* hinge: R = Rot(axis, qpos − qpos0), p = c − R c (rotation about the point c = ``pos``);
* slide: R = 1, p = axis (qpos − qpos0);
* ball: R = R(q/|q|), p = c − R c;
* free: R = R(q/|q|), p = the position coordinates (the body offset is not used).

World poses follow by composing with the parent's: X_i = X_λ(i) ∘ T_i, computed for all bodies
at once by pointer jumping (round r composes each body with the pose of its ancestor 2^r
levels up: ⌈log₂ depth⌉ rounds of the same vectorised operation, instead of one per level).

The motion subspace of each DOF is a spatial motion vector (ω, v_O) in world axes about a
reference point O (Featherstone 2008, §2.2, Plücker coordinates): a rotation about the unit
axis a through the point c is (a, (c − O) × a), a translation along a is (0, a). O is each
tree's root body origin at this instant, fixed in space for the derivative (a point chosen at
the instant is as inertial as the world origin, and keeps the moment arms small far from it).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._engine.kernels import cross, qnorm2, transform_matrix
from .topology import BALL, FREE, HINGE, SLIDE, TreeTopology


def matmul(a, b):
    """a @ b for component-first 3x3 matrices (3, 3, ...), as three column-times-row
    products (humanoid, 22 nodes, B = 64: 17 µs against 47 µs as one broadcast product
    reduced over its middle axis, and against a 15x slower program with every component a
    separate scalar: XLA then duplicated the kinematics into each consumer)."""
    return a[:, 0:1] * b[0:1] + a[:, 1:2] * b[1:2] + a[:, 2:3] * b[2:3]


def matvec(a, x):
    """a @ x for component-first (3, 3, ...) and (3, ...)."""
    return a[:, 0] * x[0:1] + a[:, 1] * x[1:2] + a[:, 2] * x[2:3]


def compose(pa, pb):
    """(Ra, pa) ∘ (Rb, pb) = (Ra Rb, pa + Ra pb)."""
    (ra, ta), (rb, tb) = pa, pb
    return matmul(ra, rb), ta + matvec(ra, tb)


def identity_like(R, n: int):
    """The identity pose of n elements with the batch axes of the rotations ``R`` (3, 3, m, ...)."""
    tail = R.shape[3:]
    eye = jnp.eye(3, dtype=R.dtype).reshape((3, 3, 1) + (1,) * len(tail))
    return (
        jnp.broadcast_to(eye, (3, 3, n) + tail),
        jnp.zeros((3, n) + tail, R.dtype),
    )


def quat_matrix(q):
    """R(q/|q|) of component-first quaternions (4, ...)."""
    return transform_matrix(q) / qnorm2(q)


def axis_angle(axis, angle):
    """Rot(axis, angle) by Rodrigues' formula, unit ``axis`` (3, n), ``angle`` (n, ...)."""
    tail = angle.ndim - 1
    a = axis.reshape(axis.shape + (1,) * tail)
    c, s = jnp.cos(angle), jnp.sin(angle)
    eye = jnp.eye(3, dtype=angle.dtype).reshape((3, 3) + (1,) * angle.ndim)
    k = jnp.stack(
        [
            jnp.stack([0.0 * a[0], -a[2], a[1]]),
            jnp.stack([a[2], 0.0 * a[0], -a[0]]),
            jnp.stack([-a[1], a[0], 0.0 * a[0]]),
        ]
    )
    aa = a[:, None] * a[None, :]
    return eye * c + s * k + (1.0 - c) * aa


def joint_poses(topo: TreeTopology, model, qpos):
    """Each joint's pose J in the frame it acts in, (R (3, 3, nj, ...), p (3, nj, ...)), in
    joint order: all joints at once, from static gathers of qpos (module docstring)."""
    tail = qpos.shape[1:]
    dtype = qpos.dtype
    consts = jnp.broadcast_to(
        jnp.asarray([0.0, 1.0], dtype).reshape((2,) + (1,) * len(tail)), (2,) + tail
    )
    qx = jnp.concatenate([qpos, consts], axis=0)
    kinds = np.asarray(topo.joint_types)
    hinge = (kinds == HINGE).reshape((-1,) + (1,) * len(tail))
    slide = (kinds == SLIDE).reshape((-1,) + (1,) * len(tail))
    about = np.isin(kinds, (HINGE, BALL))  # rotations about the joint's point
    col = lambda x: x.reshape((-1,) + (1,) * len(tail))  # noqa: E731
    x = qx[topo.rows_x] - col(jnp.concatenate([model.qpos0, jnp.zeros(2, dtype)])[topo.rows_x])
    angle = jnp.where(hinge, x, 0.0)
    R = jnp.where(
        hinge[None, None], axis_angle(model.joint_axis.T, angle), quat_matrix(qx[topo.rows_quat])
    )
    c = jnp.where(about[None, :], model.joint_pos.T, 0.0)[(slice(None),) * 2 + (None,) * len(tail)]
    c = jnp.broadcast_to(c, (3, topo.nj) + tail)
    shift = jnp.where(
        slide[None], model.joint_axis.T[(slice(None),) * 2 + (None,) * len(tail)] * x[None], 0.0
    )
    p = c - matvec(R, c) + shift + qx[topo.rows_pos]
    return R, p


class Frames(NamedTuple):
    """What forward kinematics computes for one configuration (component-first):

    ``R``, ``p``: world pose of every body frame (3, 3, nb, ...), (3, nb, ...);
    ``axis``, ``anchor``: per DOF its world unit axis and a point on it (3, nv, ...);
    ``origin``: the reference point O of each body's tree (3, nb, ...)."""

    R: jax.Array
    p: jax.Array
    axis: jax.Array
    anchor: jax.Array
    origin: jax.Array


def frames(topo: TreeTopology, model, qpos) -> Frames:
    """Forward kinematics (module docstring), over the tree's nodes: one per joint, posed as
    the frame its joint leaves, and one per body without joints. A node's pose in its parent
    node's is (body offset, for its body's first node) ∘ J; world poses by pointer jumping."""
    tail = qpos.shape[1:]
    nj = topo.nj
    nn = len(topo.node_body)
    bc = (slice(None),) * 2 + (None,) * len(tail)
    jR, jp = joint_poses(topo, model, qpos)
    extra = nn - nj  # bodies without joints: identity "joints"
    if extra:
        iR, ip = identity_like(jR, extra)
        jR = jnp.concatenate([jR, iR], axis=2)
        jp = jnp.concatenate([jp, ip], axis=1)
    nodes = topo.node_body
    first = topo.node_first.reshape((-1,) + (1,) * len(tail))
    oR = quat_matrix(model.body_quat.T)[:, :, nodes][(slice(None),) * 3 + (None,) * len(tail)]
    op = model.body_pos.T[:, nodes][bc]
    bR, bp = compose((jnp.broadcast_to(oR, jR.shape), jnp.broadcast_to(op, jp.shape)), (jR, jp))
    wR = jnp.where(first[None, None], bR, jR)
    wp = jnp.where(first[None], bp, jp)
    for anc in topo.jumps:  # compose with the node 2^r levels up, where there is one
        # (only those nodes: 2.1x faster than composing every node with an identity pad)
        sel = np.flatnonzero(anc < nn)
        aR, ap = wR[:, :, anc[sel]], wp[:, anc[sel]]
        nR, npos = compose((aR, ap), (wR[:, :, sel], wp[:, sel]))
        wR, wp = wR.at[:, :, sel].set(nR), wp.at[:, sel].set(npos)
    R, p = wR[:, :, topo.body_node], wp[:, topo.body_node]
    if nj:
        postR, postp = wR[:, :, :nj], wp[:, :nj]
        # a hinge's axis and point are fixed by its own rotation, a slide's axis by its
        # translation: both read in the frame the joint leaves
        axis_j = matvec(postR, jnp.broadcast_to(model.joint_axis.T[bc], (3, nj) + tail))
        anchor_j = postp + matvec(postR, jnp.broadcast_to(model.joint_pos.T[bc], (3, nj) + tail))
        free = topo.joints_of(FREE)
        if free.size:  # a free joint turns about the body origin
            anchor_j = anchor_j.at[:, free].set(postp[:, free])
        dj, colm = topo.dof_joint, topo.dof_column
        eye = jnp.eye(3, dtype=qpos.dtype).reshape((3, 3) + (1,) * len(tail))
        table = jnp.concatenate(
            [
                axis_j,  # index j: the hinge/slide axis
                postR[:, 0],  # (1 + k) nj + j: column k of the frame after joint j
                postR[:, 1],
                postR[:, 2],
                jnp.broadcast_to(eye, (3, 3) + tail),  # 4 nj + k: the world axis e_k
            ],
            axis=1,
        )
        pick = np.where(
            colm < 0, dj, np.where(colm < 3, (1 + np.maximum(colm, 0)) * nj + dj, 4 * nj + colm - 3)
        )
        axis = table[:, pick]
        anchor = anchor_j[:, dj]
    else:
        axis = anchor = jnp.zeros((3, 0) + tail, qpos.dtype)
    origin = p[:, topo.root]
    return Frames(R, p, axis, anchor, origin)


def motion_subspace(topo: TreeTopology, f: Frames):
    """S (6, nv, ...): per DOF (ω, v_O) about its tree's reference point (module docstring)."""
    o = f.origin[:, topo.dof_body]
    rot = jnp.asarray(topo.dof_rotational).reshape((-1,) + (1,) * (f.axis.ndim - 2))
    w = jnp.where(rot, f.axis, 0.0)
    v = jnp.where(rot, cross(f.anchor - o, f.axis), f.axis)
    return jnp.concatenate([w, v], axis=0)
