"""The static structure of a model, resolved once at build time.

A :class:`Topology` holds everything that drives tracing and never changes under ``jax.grad``
or ``jax.vmap``: the body count and names, which bodies are scalable, and for every joint its
resolved body indices, its name, its number of equations and the group of same-type joints it
is evaluated with. The engine reads joint bodies from here, never from the joint objects (whose
``body_i`` / ``body_j`` may be body names as the user wrote them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import equinox as eqx
import jax
import numpy as np

GROUND = -1
"""The world frame as a joint side: r = 0, p = (1, 0, 0, 0)."""


class Topology(eqx.Module):
    """Static, resolved structure of a model (all fields are static metadata).

    ``names`` (nb,) body names; ``scalable`` (nb,) which bodies are Möller–Glocker scalable
    bodies; ``joint_bodies`` per joint its (body_i, body_j) indices, GROUND = −1 for the world;
    ``joint_names`` unique joint names; ``joint_rows`` equations per joint; ``joint_groups``
    the joints evaluated together (same type and same static data), as tuples of joint indices
    in model order.
    """

    names: tuple[str, ...] = eqx.field(static=True)
    scalable: tuple[bool, ...] = eqx.field(static=True)
    joint_bodies: tuple[tuple[int, int], ...] = eqx.field(static=True, default=())
    joint_names: tuple[str, ...] = eqx.field(static=True, default=())
    joint_rows: tuple[int, ...] = eqx.field(static=True, default=())
    joint_groups: tuple[tuple[int, ...], ...] = eqx.field(static=True, default=())

    @property
    def nb(self) -> int:
        return len(self.names)

    @property
    def n_joints(self) -> int:
        return len(self.joint_bodies)

    @property
    def n_rows(self) -> int:
        """m, the number of joint equations."""
        return sum(self.joint_rows)

    @property
    def row_offsets(self) -> tuple[int, ...]:
        """Offsets of each joint's equations in the stacked rows (length n_joints + 1)."""
        return tuple(int(o) for o in np.cumsum((0,) + self.joint_rows))


_IDENTITY_FIELDS = ("body_i", "body_j", "name")


def group_key(joint, index: int):
    """Joints with equal keys are evaluated together (stacked along a trailing axis).

    The key is the joint's type, the structure, shapes and dtypes of its array leaves, its
    non-array leaves (driving functions, compared by identity) and its static fields other
    than the body references and the name. A joint whose static data cannot be hashed gets a
    group of its own (keyed by its position in the model)."""
    parts: list = [type(joint)]
    for field in dataclasses.fields(joint):
        if field.name in _IDENTITY_FIELDS:
            continue
        value = getattr(joint, field.name)
        if field.metadata.get("static", False):
            parts.append((field.name, value))
            continue
        leaves, treedef = jax.tree_util.tree_flatten(value)
        parts.append(
            (
                field.name,
                treedef,
                tuple((np.shape(x), str(x.dtype)) if eqx.is_array(x) else x for x in leaves),
            )
        )
    key = tuple(parts)
    try:
        hash(key)
    except TypeError:
        return ("unhashable", index)
    return key


def group_joints(joints: Sequence) -> tuple[tuple[int, ...], ...]:
    """Indices of the joints grouped by :func:`group_key`, groups in order of first use."""
    order: dict = {}
    for k, joint in enumerate(joints):
        order.setdefault(group_key(joint, k), []).append(k)
    return tuple(tuple(v) for v in order.values())


def stack_joints(joints: Sequence):
    """The joints of one group as ONE joint whose array leaves carry a trailing group axis
    (g,): leaves are stacked in the order of the first joint's flattening (all joints of a
    group have the same leaf structure; their static body references are not read)."""
    first = joints[0]
    arrays = eqx.filter(first, eqx.is_array)
    leaves, treedef = jax.tree_util.tree_flatten(arrays)
    per_joint = [jax.tree_util.tree_leaves(eqx.filter(j, eqx.is_array)) for j in joints]
    stacked = [
        jax.numpy.stack([leaf[i] for leaf in per_joint], axis=-1) for i in range(len(leaves))
    ]
    return eqx.combine(jax.tree_util.tree_unflatten(treedef, stacked), first)
