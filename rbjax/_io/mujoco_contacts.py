"""MJCF/URDF geoms as :class:`rbjax.Contacts` (``rbjax.load(path, contacts=True)``): the
spheres, capsules and boxes of the moving bodies that can collide with one plane of the world
body, with MuJoCo's friction (the larger sliding coefficient of the two geoms, MuJoCo's
default mixing) and no restitution (MuJoCo's soft contact has none). Collision filtering as
MuJoCo's: geoms a and b can collide when (contype_a & conaffinity_b) or (contype_b &
conaffinity_a); ``<exclude>`` of the world and a body, and ``<pair>``, are honoured for the
plane. What rbjax does not simulate yet (contacts between the bodies' own geoms, other geom
types against the plane, a second plane or a static obstacle) is returned as lines for the
loader's one warning."""

from __future__ import annotations

import numpy as np

from .._contact.shapes import Box, Capsule, Contacts, Plane, Sphere
from .mujoco import _mujoco, _name


def _can_collide(m, a: int, b: int) -> bool:
    return bool(
        (m.geom_contype[a] & m.geom_conaffinity[b]) or (m.geom_contype[b] & m.geom_conaffinity[a])
    )


def _excluded(m, body_a: int, body_b: int) -> bool:
    signature = (min(body_a, body_b) << 16) + max(body_a, body_b)
    return bool(np.any(np.asarray(m.exclude_signature) == signature)) if m.nexclude else False


def contacts_from_mujoco(m, body_name: list[str]) -> tuple[Contacts | None, list[str]]:
    """(the rbjax contacts of ``m``, lines naming what is not simulated)."""
    mujoco = _mujoco()
    T = mujoco.mjtGeom
    geom = lambda g: _name(m, mujoco.mjtObj.mjOBJ_GEOM, g, f"geom{g}")  # noqa: E731
    world = [g for g in range(m.ngeom) if m.geom_bodyid[g] == 0]
    planes = [g for g in world if m.geom_type[g] == T.mjGEOM_PLANE]
    colliding = [g for g in range(m.ngeom) if m.geom_contype[g] or m.geom_conaffinity[g]]
    problems: list[str] = []
    if len(planes) > 1:
        problems.append(
            f"contacts with planes {[geom(g) for g in planes[1:]]} (rbjax simulates one plane: "
            f"{geom(planes[0])})"
        )
    static = [g for g in world if g not in planes and g in colliding]
    if static:
        problems.append(f"contacts with the world's geoms {[geom(g) for g in static]}")
    moving = [g for g in colliding if m.geom_bodyid[g] != 0]
    between = sum(
        1
        for i, a in enumerate(moving)
        for b in moving[i + 1 :]
        if m.geom_bodyid[a] != m.geom_bodyid[b]
        and _can_collide(m, a, b)
        and not _excluded(m, int(m.geom_bodyid[a]), int(m.geom_bodyid[b]))
        and int(m.body_parentid[m.geom_bodyid[a]]) != int(m.geom_bodyid[b])
        and int(m.body_parentid[m.geom_bodyid[b]]) != int(m.geom_bodyid[a])
    )
    if between:
        problems.append(
            f"{between} pair(s) of the bodies' own geoms that can collide with each other "
            "(rbjax simulates contacts with the plane only)"
        )
    if m.npair:
        problems.append(f"{m.npair} explicit <pair> element(s)")
    if not planes:
        return None, problems
    plane = planes[0]
    R = np.zeros(9)
    mujoco.mju_quat2Mat(R, np.asarray(m.geom_quat[plane], float))
    normal = R.reshape(3, 3)[:, 2]
    shapes, friction, other = [], [], []
    for g in moving:
        body = int(m.geom_bodyid[g])
        if not _can_collide(m, g, plane) or _excluded(m, 0, body):
            continue
        name, size = body_name[body], np.asarray(m.geom_size[g], float)
        pos = tuple(float(x) for x in m.geom_pos[g])
        quat = tuple(float(x) for x in m.geom_quat[g])
        kind = int(m.geom_type[g])
        if kind == T.mjGEOM_SPHERE:
            shapes.append(Sphere(name, float(size[0]), pos))
        elif kind == T.mjGEOM_CAPSULE:
            shapes.append(Capsule(name, float(size[0]), float(size[1]), pos, quat))
        elif kind == T.mjGEOM_BOX:
            shapes.append(Box(name, tuple(float(x) for x in size), pos, quat))
        else:
            other.append(geom(g))
            continue
        friction.append(max(float(m.geom_friction[g, 0]), float(m.geom_friction[plane, 0])))
    if other:
        problems.append(f"contacts of geoms {other} with the plane (not a sphere, capsule or box)")
    if not shapes:
        return None, problems
    contacts = Contacts(
        shapes,
        plane=Plane(tuple(float(x) for x in normal), tuple(float(x) for x in m.geom_pos[plane])),
        friction=tuple(friction),
    )
    return contacts, problems
