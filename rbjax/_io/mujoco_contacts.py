"""MJCF/URDF geoms as :class:`rbjax.Contacts` (``rbjax.load(path, contacts=True)``): the
spheres, capsules and boxes that can collide with one plane of the world body and with each
other, with MuJoCo's friction (the larger sliding coefficient of the two geoms, MuJoCo's
default mixing) and no restitution (MuJoCo's soft contact has none). Collision filtering as
MuJoCo's: geoms a and b can collide when (contype_a & conaffinity_b) or (contype_b &
conaffinity_a); a body does not collide with its parent (unless that is the world); ``<exclude>``
and ``<pair>`` are honoured. The world's spheres, capsules and boxes are fixed obstacles. What
rbjax does not simulate yet (other geom types, a second plane) is returned as lines for the
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


def _filtered_parent(m, body_a: int, body_b: int) -> bool:
    """MuJoCo's parent filter: a body and its parent do not collide (unless the parent is the
    world, or the model turns the filter off)."""
    mujoco = _mujoco()
    if m.opt.disableflags & mujoco.mjtDisableBit.mjDSBL_FILTERPARENT:
        return False
    weld = lambda b: int(m.body_weldid[b])  # noqa: E731
    wa, wb = weld(body_a), weld(body_b)
    pa, pb = weld(int(m.body_parentid[wa])), weld(int(m.body_parentid[wb]))
    return (wa != 0 and wa == pb) or (wb != 0 and wb == pa) or wa == wb


def contacts_from_mujoco(m, body_name: list[str]) -> tuple[Contacts | None, list[str]]:
    """(the rbjax contacts of ``m``, lines naming what is not simulated)."""
    mujoco = _mujoco()
    T = mujoco.mjtGeom
    geom = lambda g: _name(m, mujoco.mjtObj.mjOBJ_GEOM, g, f"geom{g}")  # noqa: E731
    kinds = {T.mjGEOM_SPHERE: "sphere", T.mjGEOM_CAPSULE: "capsule", T.mjGEOM_BOX: "box"}
    world = [g for g in range(m.ngeom) if m.geom_bodyid[g] == 0]
    planes = [g for g in world if m.geom_type[g] == T.mjGEOM_PLANE]
    colliding = [g for g in range(m.ngeom) if m.geom_contype[g] or m.geom_conaffinity[g]]
    problems: list[str] = []
    if len(planes) > 1:
        problems.append(
            f"contacts with planes {[geom(g) for g in planes[1:]]} (rbjax simulates one plane: "
            f"{geom(planes[0])})"
        )
    plane = planes[0] if planes else None
    # the geoms that take part: every colliding sphere, capsule and box (the world's ones as
    # fixed obstacles); the others are named once
    shapes, index, friction = [], {}, []
    other = []
    for g in colliding:
        if g in planes:
            continue
        kind = int(m.geom_type[g])
        if kind not in kinds:
            other.append(geom(g))
            continue
        body = int(m.geom_bodyid[g])
        name = "world" if body == 0 else body_name[body]
        size = np.asarray(m.geom_size[g], float)
        pos = tuple(float(x) for x in m.geom_pos[g])
        quat = tuple(float(x) for x in m.geom_quat[g])
        if kind == T.mjGEOM_SPHERE:
            shapes.append(Sphere(name, float(size[0]), pos))
        elif kind == T.mjGEOM_CAPSULE:
            shapes.append(Capsule(name, float(size[0]), float(size[1]), pos, quat))
        else:
            shapes.append(Box(name, tuple(float(x) for x in size), pos, quat))
        index[g] = len(shapes) - 1
        friction.append(float(m.geom_friction[g, 0]))
    if other:
        problems.append(f"contacts of geoms {other} (not a sphere, capsule, box or plane)")
    # MuJoCo's filter for every two of them, then the explicit <pair>s
    pairs = set()
    geoms = list(index)
    for i, a in enumerate(geoms):
        for b in geoms[i + 1 :]:
            ba, bb = int(m.geom_bodyid[a]), int(m.geom_bodyid[b])
            if ba == bb or (ba == 0 and bb == 0):
                continue
            if (
                _can_collide(m, a, b)
                and not _excluded(m, ba, bb)
                and not _filtered_parent(m, ba, bb)
            ):
                pairs.add((index[a], index[b]))
    unpaired = []
    for k in range(m.npair):
        a, b = int(m.pair_geom1[k]), int(m.pair_geom2[k])
        if a in index and b in index:
            pairs.add((index[a], index[b]))
        else:
            unpaired.append(f"<pair> {geom(a)}–{geom(b)}")
    if unpaired:
        problems.append(f"explicit pairs with a plane or another geom type: {unpaired}")
    # the plane: every moving shape that may collide with it
    touches_plane = []
    if plane is not None:
        for g, k in index.items():
            body = int(m.geom_bodyid[g])
            if body and _can_collide(m, g, plane) and not _excluded(m, 0, body):
                touches_plane.append(k)
    if not shapes or (not pairs and not touches_plane):
        return None, problems
    # shapes that touch neither the plane nor a pair are left out; the plane's list is made
    # exact by listing, as shape indices, which shapes may touch it
    keep = sorted(set(touches_plane) | {i for pair in pairs for i in pair})
    renum = {k: n for n, k in enumerate(keep)}
    plane_obj, plane_mu = None, None
    if plane is not None and touches_plane:
        R = np.zeros(9)
        mujoco.mju_quat2Mat(R, np.asarray(m.geom_quat[plane], float))
        plane_obj = Plane(
            tuple(float(x) for x in R.reshape(3, 3)[:, 2]),
            tuple(float(x) for x in m.geom_pos[plane]),
        )
        plane_mu = float(m.geom_friction[plane, 0])
    contacts = Contacts(
        [shapes[k] for k in keep],
        plane=plane_obj,
        friction=tuple(friction[k] for k in keep),
        pairs=tuple(sorted((renum[a], renum[b]) for a, b in pairs)),
        plane_shapes=tuple(renum[k] for k in sorted(touches_plane)),
        plane_friction=plane_mu,
    )
    return contacts, problems
