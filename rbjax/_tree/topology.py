"""The static structure of a kinematic tree in joint coordinates, resolved once at build time.

A tree of nb bodies, each with a parent (a body, or the world) and an ordered list of joints
(MuJoCo's composition: a body's joints act one after the other, each in the frame the previous
ones left; Todorov et al. 2012, MuJoCo's ``mj_kinematics``). Joint types and their sizes:

======  ====  ====  ================================================================
type     nq    nv   motion
======  ====  ====  ================================================================
hinge     1     1   rotation by qpos − qpos0 about an axis through a point
slide     1     1   translation by qpos − qpos0 along an axis
ball      4     3   rotation by the unit quaternion qpos about a point; qvel = ω in the
                    frame the rotation leaves
free      7     6   world position of the body origin, then its attitude quaternion;
                    qvel = (origin velocity, world; ω, body axes); root bodies only
======  ====  ====  ================================================================

Everything here is NumPy and Python: the index tables and 0/1 masks that let the dynamics
(rbjax/_tree/dynamics.py) run as a few vectorised operations over all bodies and DOFs
instead of a loop over the tree (the tree's recursions become sums over ancestors and
subtrees, written as products with these masks: Featherstone 2008, §6.2 and §5.3, where the
composite inertia of body i is the sum of its subtree's inertias and the bias force on a DOF
the sum of its subtree's forces).
"""

from __future__ import annotations

import dataclasses

import numpy as np

HINGE, SLIDE, BALL, FREE = "hinge", "slide", "ball", "free"
SIZES = {HINGE: (1, 1), SLIDE: (1, 1), BALL: (4, 3), FREE: (7, 6)}


@dataclasses.dataclass(frozen=True, eq=False)
class TreeTopology:
    """The resolved static structure (a static field of the model: equal, and hashed, by the
    tree it describes, so that two loads of one file share their compiled programs).

    Bodies: ``names``, ``parent`` (−1 for the world). Joints (in model order, which is
    qpos/qvel order): ``joint_names``, ``joint_types``, ``joint_body``, ``qposadr``,
    ``dofadr``. Derived tables (NumPy): see :func:`build`."""

    names: tuple[str, ...]
    parent: tuple[int, ...]
    joint_names: tuple[str, ...]
    joint_types: tuple[str, ...]
    joint_body: tuple[int, ...]
    qposadr: tuple[int, ...]
    dofadr: tuple[int, ...]
    nq: int
    nv: int
    # per body: joint index of each stage (K, nb), nj = no joint (identity)
    # kinematic nodes: one per joint (in joint order), then one per body without joints;
    # each node's pose is that of the frame its joint leaves
    node_parent: np.ndarray  # (nn,) the node before it (nn = the world)
    node_first: np.ndarray  # (nn,) bool: the body offset comes before this node's joint
    node_body: np.ndarray  # (nn,) its body
    body_node: np.ndarray  # (nb,) each body's last node: the body frame
    # pointer jumping over the nodes: per round, the node 2^r levels up (nn = none)
    jumps: tuple[np.ndarray, ...]
    # qpos gathers per joint, into qpos with two constant rows appended (nq: 0.0, nq + 1: 1.0)
    rows_x: np.ndarray  # (nj,) hinge/slide coordinate, else the 0 row
    rows_quat: np.ndarray  # (4, nj) ball/free quaternion, else (1, 0, 0, 0)
    rows_pos: np.ndarray  # (3, nj) free position, else 0
    root: np.ndarray  # (nb,) root body of each body's tree
    dof_body: np.ndarray  # (nv,)
    dof_joint: np.ndarray  # (nv,)
    dof_rotational: np.ndarray  # (nv,) bool
    # per DOF, which column of the joint's post-rotation frame is its axis (ball/free
    # rotations), 3 + k for a free joint's world translation e_k, −1 for a hinge/slide axis
    dof_column: np.ndarray
    dof_before: np.ndarray  # (nv, nv) bool: DOF b acts before or with DOF a (b ⪯ a)
    body_dofs: np.ndarray  # (nb, nv) bool: DOF d moves body i (d ⪯ i)
    subtree: np.ndarray  # (nb, nb) bool: body k is in the subtree of body i
    quat_rows: np.ndarray  # (nq,) bool: rows of qpos that are quaternion components

    def _key(self):
        return (self.names, self.parent, self.joint_names, self.joint_types, self.joint_body)

    def __eq__(self, other) -> bool:
        return isinstance(other, TreeTopology) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    @property
    def nb(self) -> int:
        return len(self.names)

    @property
    def nj(self) -> int:
        return len(self.joint_types)

    def rate_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(qpos rows, qvel rows) of the coordinates whose rate is their velocity (hinges,
        slides, free positions), then (first qpos row, first qvel row) of each quaternion
        (balls, free attitudes) and its angular velocity."""
        lin_q, lin_d, quat_q, quat_d = [], [], [], []
        for j, k in enumerate(self.joint_types):
            a, d = self.qposadr[j], self.dofadr[j]
            if k in (HINGE, SLIDE):
                lin_q.append(a)
                lin_d.append(d)
            elif k == BALL:
                quat_q.append(a)
                quat_d.append(d)
            else:
                lin_q += [a, a + 1, a + 2]
                lin_d += [d, d + 1, d + 2]
                quat_q.append(a + 3)
                quat_d.append(d + 3)
        return tuple(np.array(x, dtype=int) for x in (lin_q, lin_d, quat_q, quat_d))  # type: ignore[return-value]

    def joints_of(self, kind: str) -> np.ndarray:
        return np.array([j for j, k in enumerate(self.joint_types) if k == kind], dtype=int)


def build(names, parent, joint_names, joint_types, joint_body) -> TreeTopology:
    """Check and resolve the tree (ValueError naming the field on bad input)."""
    names, parent = tuple(names), tuple(int(p) for p in parent)
    nb, nj = len(names), len(joint_types)
    if len(parent) != nb:
        raise ValueError(
            f"parent has {len(parent)} entries for {nb} bodies. Fix: give one parent per body."
        )
    for i, p in enumerate(parent):
        if not -1 <= p < i:
            raise ValueError(
                f"parent[{i}] = {p} ({names[i]!r}) is not the world (−1) or an earlier body. "
                "Fix: list bodies so that every parent comes before its children."
            )
    for j, (k, b) in enumerate(zip(joint_types, joint_body, strict=True)):
        if k not in SIZES:
            raise ValueError(
                f"joint_types[{j}] = {k!r} is not a joint type. Fix: use one of {sorted(SIZES)}."
            )
        if not 0 <= b < nb:
            raise ValueError(f"joint_body[{j}] = {b} is not a body index. Fix: use 0..{nb - 1}.")
        if k == FREE and (parent[b] != -1 or sum(1 for bb in joint_body if bb == b) != 1):
            raise ValueError(
                f"joint {joint_names[j]!r} is free on body {names[b]!r}, which has a parent body "
                "or other joints. Fix: a free joint is the only joint of a child of the world."
            )
    if list(joint_body) != sorted(joint_body):
        raise ValueError(
            "joint_body is not in body order. Fix: list each body's joints after the previous "
            "body's (MuJoCo's order)."
        )
    sizes = [SIZES[k] for k in joint_types]
    qposadr = tuple(int(x) for x in np.cumsum([0] + [s[0] for s in sizes])[:-1])
    dofadr = tuple(int(x) for x in np.cumsum([0] + [s[1] for s in sizes])[:-1])
    nq = sum(s[0] for s in sizes)
    nv = sum(s[1] for s in sizes)

    per_body = [[j for j in range(nj) if joint_body[j] == i] for i in range(nb)]
    jointless = [i for i in range(nb) if not per_body[i]]
    nn = nj + len(jointless)
    node_body = np.array(list(joint_body) + jointless, dtype=int)
    body_node = np.zeros(nb, dtype=int)
    first_node = np.zeros(nb, dtype=int)
    for i in range(nb):
        nodes = per_body[i] if per_body[i] else [nj + jointless.index(i)]
        first_node[i], body_node[i] = nodes[0], nodes[-1]
    node_parent = np.full(nn, nn, dtype=int)
    node_first = np.zeros(nn, dtype=bool)
    for n in range(nn):
        i = node_body[n]
        if n == first_node[i]:
            # MuJoCo sets a free body's pose from qpos alone: no body offset before it
            node_first[n] = not (n < nj and joint_types[n] == FREE)
            node_parent[n] = body_node[parent[i]] if parent[i] >= 0 else nn
        else:
            node_parent[n] = n - 1  # the previous joint of the same body
    depth = np.zeros(nn, dtype=int)
    order = sorted(range(nn), key=lambda n: (node_body[n], n))
    for n in order:  # parents come first in (body, joint) order
        depth[n] = 0 if node_parent[n] == nn else depth[node_parent[n]] + 1
    anc = np.append(node_parent, nn)
    jumps = []
    for _ in range(int(np.ceil(np.log2(depth.max() + 1))) if nn else 0):
        jumps.append(anc[:nn].copy())
        anc = anc[anc]
    rows_x = np.full(nj, nq, dtype=int)
    rows_quat = np.tile(np.array([[nq + 1], [nq], [nq], [nq]]), (1, nj))
    rows_pos = np.full((3, nj), nq, dtype=int)
    for j, k in enumerate(joint_types):
        a = qposadr[j]
        if k in (HINGE, SLIDE):
            rows_x[j] = a
        elif k == BALL:
            rows_quat[:, j] = range(a, a + 4)
        else:
            rows_pos[:, j] = range(a, a + 3)
            rows_quat[:, j] = range(a + 3, a + 7)
    root = np.arange(nb)
    for i, p in enumerate(parent):
        root[i] = i if p < 0 else root[p]

    ancestors = np.zeros((nb, nb), dtype=bool)  # ancestors[i, k]: k is i or above it
    for i, p in enumerate(parent):
        ancestors[i, i] = True
        if p >= 0:
            ancestors[i] |= ancestors[p]
    dof_body = np.zeros(nv, dtype=int)
    dof_joint = np.zeros(nv, dtype=int)
    dof_rot = np.zeros(nv, dtype=bool)
    dof_col = np.full(nv, -1, dtype=int)
    for j, k in enumerate(joint_types):
        a, n = dofadr[j], sizes[j][1]
        dof_body[a : a + n] = joint_body[j]
        dof_joint[a : a + n] = j
        if k == HINGE:
            dof_rot[a] = True
        elif k == BALL:
            dof_rot[a : a + 3] = True
            dof_col[a : a + 3] = range(3)
        elif k == FREE:
            dof_col[a : a + 3] = range(3, 6)
            dof_rot[a + 3 : a + 6] = True
            dof_col[a + 3 : a + 6] = range(3)
    stage_of = np.zeros(nj, dtype=int)  # position of each joint in its body's list
    for js in per_body:
        for k, j in enumerate(js):
            stage_of[j] = k
    before = np.zeros((nv, nv), dtype=bool)
    for a in range(nv):
        for b in range(nv):
            ba, bb = dof_body[a], dof_body[b]
            if ba == bb:
                # a free joint's translations act before its rotations (the rotations turn
                # about the moved origin); a ball's three DOFs act together
                ja, jb = dof_joint[a], dof_joint[b]
                if ja != jb:
                    before[a, b] = stage_of[jb] < stage_of[ja]
                else:
                    before[a, b] = not (
                        joint_types[ja] == FREE and b - dofadr[jb] >= 3 > a - dofadr[ja]
                    )
            else:
                before[a, b] = bool(ancestors[ba, bb])
    body_dofs = ancestors[:, dof_body]
    subtree = ancestors.T.copy()
    quat_rows = np.zeros(nq, dtype=bool)
    for j, k in enumerate(joint_types):
        if k == BALL:
            quat_rows[qposadr[j] : qposadr[j] + 4] = True
        elif k == FREE:
            quat_rows[qposadr[j] + 3 : qposadr[j] + 7] = True
    return TreeTopology(
        names=names,
        parent=parent,
        joint_names=tuple(joint_names),
        joint_types=tuple(joint_types),
        joint_body=tuple(int(b) for b in joint_body),
        qposadr=qposadr,
        dofadr=dofadr,
        nq=nq,
        nv=nv,
        node_parent=node_parent,
        node_first=node_first,
        node_body=node_body,
        body_node=body_node,
        jumps=tuple(jumps),
        rows_x=rows_x,
        rows_quat=rows_quat,
        rows_pos=rows_pos,
        root=root,
        dof_body=dof_body,
        dof_joint=dof_joint,
        dof_rotational=dof_rot,
        dof_column=dof_col,
        dof_before=before,
        body_dofs=body_dofs,
        subtree=subtree,
        quat_rows=quat_rows,
    )
