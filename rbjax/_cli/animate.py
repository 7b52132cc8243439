"""``rbjax animate MODEL RUN --out motion.gif|mp4``: a 3D animation of a run file's motion.

Each frame places every body by its row of the run file's ``q``: the position r of its
centre of mass [m] and its quaternion p = (w, x, y, z), which maps body axes into world axes,
x = r + A(p) x̄ with A = E(p)G(p)ᵀ (a rotation for a unit quaternion; Möller & Glocker 2012,
eq. (22)). What is drawn is built once in body axes and moved frame by frame:

* MJCF/URDF models: MuJoCo's geoms as polygon meshes, box (six faces), sphere and ellipsoid
  (a latitude-longitude mesh), cylinder (side and two caps), capsule (side and two
  hemispheres), each fixed to the rbjax body that carries its MuJoCo body (bodies welded to a
  parent move with it). A geom's pose in body axes is found once, at qpos0, from MuJoCo's geom
  pose (``mj_kinematics``) and the rbjax body's pose (``MujocoSource.state()``). A body with
  geoms of other types (mesh, height field) or with none is drawn as its inertia box. Geoms of
  the world and of bodies welded to it are drawn once, in grey (a plane as a grid under the
  footprint of everything else; other types as their bounding box).
* rbjax model files (.toml): each body's inertia box, the uniform box with the body's mass and
  principal moments, sides a_k = √(6/m (I_j + I_l − I_k)) along the principal axes.
* Joints (every model): a dot at each joint point, r + A s̄ on a body and s̄ itself on the
  ground, and a line to it from the body's centre of mass; joints that hold no point together
  (Parallel, Perpendicular, RotationDriver) are not drawn.

A run in joint coordinates (an MJCF/URDF tree, ``rbjax simulate`` writes the bodies' poses
``xpos``/``xquat``) places each body's frame instead, with its geoms found in that frame
(``build_joint_scene``) and the joint points ``jnt_pos``, linked to the body frame's origin.
The model is loaded in the run's coordinates.

The axis limits are those of the whole trajectory, fixed over the animation, with one scale on
the three axes (metres); the title gives the time of the frame.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import itertools
import math
import os
import sys

import numpy as np
from tqdm.auto import tqdm

from .._io.mujoco import MujocoSource
from .._joints import AbstractJoint, Parallel, Perpendicular, RotationDriver
from .._rollout import _available_memory
from .._topology import GROUND
from . import runfile
from .arguments import integer, numbers, real
from .common import (
    CliError,
    add_meshes,
    add_progress,
    load_model,
    output_path,
    pyplot,
    show_progress,
    writing,
)

MAX_FRAMES = 200
MAX_DRAWN = 10**4  # frames an animation may have at all (--every 1 of a long run)
MAX_PIXELS = 10**7  # pixels of one frame: a GIF keeps every frame in memory
AROUND = 16  # polygons around a round shape
LIGHT = np.array([-0.4, -0.6, 0.7]) / np.linalg.norm([-0.4, -0.6, 0.7])  # world direction
GREY = (0.6, 0.6, 0.6, 1.0)
EDGES = {"edgecolors": (0.0, 0.0, 0.0, 0.15), "linewidths": 0.2}
POINTLESS = (Parallel, Perpendicular, RotationDriver)


def add_parser(sub):
    p = sub.add_parser(
        "animate",
        help="draw a run file's motion as a GIF or MP4",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "model",
        metavar="MODEL",
        help="the MJCF (.xml), URDF (.urdf) or model file (.toml) of the run",
    )
    p.add_argument("run_file", metavar="RUN", help="run file written by 'rbjax simulate' (.npz)")
    p.add_argument("--out", required=True, help="animation to write: .gif, or .mp4 (needs ffmpeg)")
    p.add_argument(
        "--fps",
        type=real(
            "--fps", "a number of frames per second in (0, 1000]", "30", positive=True, maximum=1000
        ),
        default=30.0,
        help="frames per second (default 30)",
    )
    p.add_argument(
        "--every",
        type=integer("--every", "2"),
        default=None,
        metavar="K",
        help=f"draw every K-th saved state (default: real time at --fps, at most {MAX_FRAMES} frames)",
    )
    p.add_argument(
        "--sample",
        type=integer("--sample", "0", minimum=0),
        default=0,
        metavar="I",
        help="which sample of a batch run (default 0)",
    )
    p.add_argument(
        "--view",
        type=numbers("--view", "two numbers ELEV,AZIM [degrees]", "20,-60", count=2),
        default=(20.0, -60.0),
        metavar="ELEV,AZIM",
        help="camera elevation and azimuth in degrees (default 20,-60; "
        "write --view=-10,30 for a negative elevation)",
    )
    p.add_argument(
        "--size",
        type=numbers("--size", "two positive numbers W,H [inches]", "6,5", count=2, positive=True),
        default=(6.0, 5.0),
        metavar="W,H",
        help="figure size in inches (default 6,5)",
    )
    p.add_argument(
        "--dpi",
        type=integer("--dpi", "100", minimum=10, maximum=2000),
        default=100,
        help="pixels per inch, 10 to 2000 (default 100)",
    )
    add_meshes(p)
    add_progress(p)
    p.set_defaults(run=run)


# --- shapes in their own axes: (F, 4, 3) quadrilaterals; a triangle repeats a corner ----------


def box(half) -> np.ndarray:
    """The six faces of the box with half-sides ``half`` (3,), centred at the origin."""
    corners = np.array(list(itertools.product((-1.0, 1.0), repeat=3))) * np.asarray(half)
    faces = [[0, 1, 3, 2], [4, 5, 7, 6], [0, 1, 5, 4], [2, 3, 7, 6], [0, 2, 6, 4], [1, 3, 7, 5]]
    return corners[np.array(faces)]


def revolve(rho, z) -> np.ndarray:
    """The surface swept about the z axis by the profile (ρ_k, z_k), k = 0..K."""
    phi = np.linspace(0.0, 2.0 * np.pi, AROUND + 1)
    ring = np.stack(
        [
            np.outer(rho, np.cos(phi)),
            np.outer(rho, np.sin(phi)),
            np.repeat(z[:, None], AROUND + 1, 1),
        ],
        axis=-1,
    )  # (K + 1, AROUND + 1, 3)
    quads = np.stack([ring[:-1, :-1], ring[:-1, 1:], ring[1:, 1:], ring[1:, :-1]], axis=2)
    return quads.reshape(-1, 4, 3)


def ellipsoid(radii) -> np.ndarray:
    """An ellipsoid with semi-axes ``radii`` (3,) (a sphere when they are equal)."""
    theta = np.linspace(0.0, np.pi, AROUND // 2 + 1)
    return revolve(np.sin(theta), -np.cos(theta)) * np.asarray(radii)


def cylinder(radius, half_length) -> np.ndarray:
    """A cylinder about z, closed by its two caps."""
    return revolve(np.array([0.0, radius, radius, 0.0]), half_length * np.array([-1.0, -1, 1, 1]))


def capsule(radius, half_length) -> np.ndarray:
    """A cylinder about z with a hemisphere of the same radius on each end."""
    theta = np.linspace(0.0, np.pi / 2, AROUND // 4 + 1)
    rho = radius * np.concatenate([np.sin(theta), np.cos(theta)])
    z = np.concatenate(
        [-half_length - radius * np.cos(theta), half_length + radius * np.sin(theta)]
    )
    return revolve(rho, z)


def inertia_box(mass, inertia) -> np.ndarray:
    """The uniform box with ``mass`` and central ``inertia`` (3, 3): sides a_k =
    √(6/m (I_j + I_l − I_k)) along the principal axes. A side a degenerate inertia leaves at zero
    (a rod, a plate, a point mass) is drawn 5 % of the largest, or 5 cm for a point."""
    moments, axes = np.linalg.eigh(np.asarray(inertia, dtype=float))
    sides = np.sqrt(
        np.clip(6.0 / max(float(mass), 1e-300) * (moments.sum() - 2 * moments), 0, None)
    )
    sides = np.maximum(sides, 0.05 * sides.max()) if sides.max() > 0 else np.full(3, 0.05)
    return box(sides / 2) @ axes.T


def normals(faces) -> np.ndarray:
    """Unit normals (F, 3) of quadrilaterals (F, 4, 3), from the cross product of the diagonals
    (also right for a triangle that repeats a corner)."""
    n = np.cross(faces[:, 2] - faces[:, 0], faces[:, 3] - faces[:, 1])
    return n / np.maximum(np.linalg.norm(n, axis=-1, keepdims=True), 1e-300)


# --- the scene: what each body carries, in body axes ------------------------------------------


@dataclasses.dataclass
class Scene:
    """Everything drawn. ``faces`` (F, 4, 3) in the axes of body ``owner`` (F,), relative to its
    centre of mass, with ``geom`` (F,) the MuJoCo geom each face comes from (−1: an inertia box);
    ``static`` (S, 4, 3) world faces of the world's geoms; ``planes`` the world's plane geoms
    as (position (3,), axes (3, 3), half-sizes (2,), 0 = unbounded); ``joint_body`` (P,) and
    ``joint_point`` (P, 3) the joint points, s̄ in body axes (world coordinates for GROUND)."""

    faces: np.ndarray
    owner: np.ndarray
    geom: np.ndarray
    static: np.ndarray
    planes: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
    joint_body: np.ndarray
    joint_point: np.ndarray


def pose(q) -> tuple[np.ndarray, np.ndarray]:
    """(r (..., 3), A (..., 3, 3)) of q (..., 7) = (r, w, x, y, z): A = E(p)G(p)ᵀ maps body
    axes into world axes (eq. (22))."""
    q = np.asarray(q, dtype=float)
    w, x, y, z = np.moveaxis(q[..., 3:7], -1, 0)
    a = np.stack(
        [
            w * w + x * x - y * y - z * z, 2 * (x * y - w * z), 2 * (x * z + w * y),
            2 * (x * y + w * z), w * w - x * x + y * y - z * z, 2 * (y * z - w * x),
            2 * (x * z - w * y), 2 * (y * z + w * x), w * w - x * x - y * y + z * z,
        ],
        axis=-1,
    )  # fmt: skip
    return q[..., 0:3], a.reshape(q.shape[:-1] + (3, 3))


def place(scene: Scene, q) -> np.ndarray:
    """The world faces (F, 4, 3) of the bodies at q (nb, 7)."""
    r, a = pose(q)
    return r[scene.owner, None] + np.einsum("fij,fkj->fki", a[scene.owner], scene.faces)


def joint_points(scene: Scene, q) -> tuple[np.ndarray, np.ndarray]:
    """World joint points (P, 3) and their bodies' centres of mass (P, 3) (the point itself
    for a ground point) at q (nb, 7)."""
    r, a = pose(q)
    b = np.maximum(scene.joint_body, 0)
    moving = (scene.joint_body != GROUND)[:, None]
    points = np.where(
        moving, r[b] + np.einsum("pij,pj->pi", a[b], scene.joint_point), scene.joint_point
    )
    return points, np.where(moving, r[b], points)


def build_scene(loaded) -> Scene:
    """The :class:`Scene` of a loaded model: MuJoCo geoms for MJCF/URDF, inertia boxes for a
    model file, and the joint points of either."""
    model = loaded.model
    mass, inertia = np.asarray(model.mass, dtype=float), np.asarray(model.inertia, dtype=float)
    parts: list[tuple[np.ndarray, int, int]] = []  # (faces in body axes, body, geom)
    static, planes = [np.zeros((0, 4, 3))], []
    boxed = set(range(model.nb))
    if isinstance(loaded.source, MujocoSource):
        boxed = _geoms(loaded.source, parts, static, planes)
    parts += [(inertia_box(mass[b], inertia[b]), b, -1) for b in sorted(boxed)]
    body, point = [], []
    for joint, sides in zip(model.joints, model.topology.joint_bodies, strict=True):
        if isinstance(joint, AbstractJoint) and not isinstance(joint, POINTLESS):
            s_i, s_j = (np.asarray(s, dtype=float) for s in joint.frame()[:2])
            body += list(sides)
            point += [s_i, s_j]
    return Scene(
        faces=np.concatenate([f for f, _, _ in parts]),
        owner=np.concatenate([np.full(len(f), b) for f, b, _ in parts]),
        geom=np.concatenate([np.full(len(f), g) for f, _, g in parts]),
        static=np.concatenate(static),
        planes=planes,
        joint_body=np.array(body, dtype=int),
        joint_point=np.array(point, dtype=float).reshape(-1, 3),
    )


def build_joint_scene(loaded) -> Scene:
    """The :class:`Scene` of a tree in joint coordinates (a run with body poses ``xpos``,
    ``xquat``): MuJoCo's geoms in the axes of their body FRAME (not the centre of mass),
    found once at qpos0 from ``mj_kinematics`` (Aᵀ(x − x_b) with x_b, A the body frame's
    ``xpos``, ``xmat``); a body without a drawable geom as its inertia box about its centre
    of mass; each joint's point ``jnt_pos`` in its body's frame."""
    mujoco = importlib.import_module("mujoco")
    model, m = loaded.model, loaded.mjmodel
    d = mujoco.MjData(m)
    mujoco.mj_kinematics(m, d)
    t = mujoco.mjtGeom
    parts: list[tuple[np.ndarray, int, int]] = []
    static, planes, drawn = [np.zeros((0, 4, 3))], [], set()
    for g in range(m.ngeom):
        if m.geom_rgba[g, 3] == 0:  # MuJoCo hides these too
            continue
        kind, shape = int(m.geom_type[g]), _shape(t, int(m.geom_type[g]), m.geom_size[g])
        xpos, xmat = d.geom_xpos[g].copy(), d.geom_xmat[g].reshape(3, 3).copy()
        k = int(m.geom_bodyid[g])
        world = k == 0 or (int(m.body_weldid[k]) == 0)  # the world and bodies welded to it
        if world and kind == t.mjGEOM_PLANE:
            planes.append((xpos, xmat, m.geom_size[g, :2].copy()))
        elif world and kind != t.mjGEOM_HFIELD:
            aabb = box(m.geom_aabb[g, 3:]) + m.geom_aabb[g, :3]
            static.append(xpos + (aabb if shape is None else shape) @ xmat.T)
        elif not world and shape is not None:
            r, a = d.xpos[k], d.xmat[k].reshape(3, 3)
            parts.append(((xpos + shape @ xmat.T - r) @ a, k - 1, g))
            drawn.add(k - 1)
    mass, inertia = np.asarray(model.mass, float), np.asarray(model.inertia, float)
    com = np.asarray(model.com, float)
    moving = {b for b in range(model.nb) if int(m.body_weldid[b + 1]) != 0}
    parts += [(inertia_box(mass[b], inertia[b]) + com[b], b, -1) for b in sorted(moving - drawn)]
    if not parts:  # nothing moves: an empty scene of moving faces
        parts = [(np.zeros((0, 4, 3)), 0, -1)]
    return Scene(
        faces=np.concatenate([f for f, _, _ in parts]),
        owner=np.concatenate([np.full(len(f), b) for f, b, _ in parts]).astype(int),
        geom=np.concatenate([np.full(len(f), g) for f, _, g in parts]).astype(int),
        static=np.concatenate(static),
        planes=planes,
        joint_body=np.array(m.jnt_bodyid, dtype=int) - 1,
        joint_point=np.array(m.jnt_pos, dtype=float).reshape(-1, 3),
    )


def joint_trajectory(run: runfile.Run, model, path: str, model_path: str, sample: int):
    """(t (T,), frames (T, nb, 7)) of one sample of a joint-coordinate run: each body
    frame's origin and attitude (the run's ``xpos``, ``xquat``), checked against the model."""
    if "xpos" not in run or "xquat" not in run:
        raise CliError(
            f"RUN {path!r} is in joint coordinates and holds no body poses (xpos, xquat). "
            f"Fix: simulate it again with this rbjax ('rbjax simulate {model_path} --out "
            f"{path}'), which writes them."
        )
    names = run.names("body_names")
    if run["xpos"].shape[-2] != model.nb or (names and names != list(model.names)):
        raise CliError(
            f"RUN {path!r} has bodies {names} but MODEL {model_path!r} has {list(model.names)}. "
            f"Fix: animate the run with the model that wrote it ({run.meta.get('model', 'see the run meta')})."
        )
    frames = np.concatenate([run["xpos"], run["xquat"]], axis=-1)
    t = run["t"]
    if frames.ndim == 4:
        if not 0 <= sample < frames.shape[0]:
            raise CliError(
                f"--sample {sample} is out of range: RUN {path!r} holds {frames.shape[0]} "
                f"samples. Fix: give --sample between 0 and {frames.shape[0] - 1}."
            )
        return t, frames[sample]
    if sample != 0:
        raise CliError(f"--sample {sample}: RUN {path!r} is a single run. Fix: leave out --sample.")
    return t, frames


def _shape(t, kind: int, size) -> np.ndarray | None:
    """The faces of a MuJoCo geom of type ``kind`` (``mjtGeom`` ``t``) in its own axes, None
    for types without a shape here (plane, height field, mesh, SDF)."""
    if kind == t.mjGEOM_BOX:
        return box(size)
    if kind in (t.mjGEOM_SPHERE, t.mjGEOM_ELLIPSOID):
        return ellipsoid(np.full(3, size[0]) if kind == t.mjGEOM_SPHERE else size)
    if kind == t.mjGEOM_CYLINDER:
        return cylinder(size[0], size[1])
    if kind == t.mjGEOM_CAPSULE:
        return capsule(size[0], size[1])
    return None


def _geoms(source: MujocoSource, parts, static, planes) -> set[int]:
    """Append the MuJoCo geoms (pose at qpos0) to ``parts`` (moving) and ``static``/``planes``
    (the world's); return the rbjax bodies left to draw as inertia boxes."""
    mujoco = importlib.import_module("mujoco")
    m = source.mjmodel
    d = mujoco.MjData(m)
    mujoco.mj_kinematics(m, d)
    r, a = pose(np.asarray(source.state().q, dtype=float))
    t = mujoco.mjtGeom
    drawn = set()
    for g in range(m.ngeom):
        if m.geom_rgba[g, 3] == 0:  # MuJoCo hides these too
            continue
        kind, shape = int(m.geom_type[g]), _shape(t, int(m.geom_type[g]), m.geom_size[g])
        xpos, xmat = d.geom_xpos[g].copy(), d.geom_xmat[g].reshape(3, 3).copy()
        b = source.body_of[m.geom_bodyid[g]]
        if b == GROUND and kind == t.mjGEOM_PLANE:
            planes.append((xpos, xmat, m.geom_size[g, :2].copy()))
        elif b == GROUND and kind != t.mjGEOM_HFIELD:
            aabb = box(m.geom_aabb[g, 3:]) + m.geom_aabb[g, :3]  # a mesh: its bounding box
            static.append(xpos + (aabb if shape is None else shape) @ xmat.T)
        elif b != GROUND and shape is not None:
            parts.append(((xpos + shape @ xmat.T - r[b]) @ a[b], b, g))  # Aᵀ(x − r), row-wise
            drawn.add(b)
    return set(range(len(r))) - drawn


def _plane_grid(plane, lo, hi, lines=9) -> np.ndarray:
    """Segments (2·lines, 2, 3) of a plane geom's grid over the footprint of the box [lo, hi]
    in the plane (cut to the plane's half-sizes where they are bounded)."""
    xpos, xmat, half = plane
    corners = np.array(list(itertools.product(*zip(lo, hi, strict=True))))
    local = (corners - xpos) @ xmat
    a, b = local[:, :2].min(0), local[:, :2].max(0)
    bounded = half > 0
    a, b = np.where(bounded, np.maximum(a, -half), a), np.where(bounded, np.minimum(b, half), b)
    if np.any(b <= a):
        return np.zeros((0, 2, 3))
    u, v = np.linspace(a[0], b[0], lines), np.linspace(a[1], b[1], lines)
    seg = [[(x, a[1], 0.0), (x, b[1], 0.0)] for x in u] + [
        [(a[0], y, 0.0), (b[0], y, 0.0)] for y in v
    ]
    return xpos + np.array(seg) @ xmat.T


# --- the command ----------------------------------------------------------------------------


def trajectory(run: runfile.Run, model, path: str, model_path: str, sample: int):
    """(t (T,), q (T, nb, 7)) of one sample of the run, checked against the model's bodies."""
    q, t = run["q"], run["t"]
    names = run.names("body_names") or [f"({q.shape[-2]} bodies)"]
    if q.shape[-2] != model.nb or (run.names("body_names") and names != list(model.names)):
        raise CliError(
            f"RUN {path!r} has bodies {names} but MODEL {model_path!r} has {list(model.names)}. "
            f"Fix: animate the run with the model that wrote it ({run.meta.get('model', 'see the run meta')})."
        )
    if q.ndim == 4:
        if not 0 <= sample < q.shape[0]:
            raise CliError(
                f"--sample {sample} is out of range: RUN {path!r} holds {q.shape[0]} samples. "
                f"Fix: give --sample between 0 and {q.shape[0] - 1}."
            )
        q, t = q[sample], t if t.ndim == 1 else t[sample]
    elif sample != 0:
        raise CliError(f"--sample {sample}: RUN {path!r} is a single run. Fix: leave out --sample.")
    return t, q


def _real_time(t, fps: float) -> int:
    """The stride of saved states that plays the motion in real time at ``fps`` (one frame per
    1/fps s of simulated time), coarser if that would exceed MAX_FRAMES frames."""
    step = float(t[1] - t[0]) if len(t) > 1 else 1.0
    real = max(1, round(1.0 / (fps * step))) if step > 0 else 1
    return max(real, math.ceil(len(t) / MAX_FRAMES))


def run(args) -> int:
    """Check the options, load the model and the run, draw every ``--every``-th saved state."""
    plt = pyplot()
    from matplotlib import animation

    out = output_path(args.out, (".gif", ".mp4"), "motion animation")
    gif = out.lower().endswith(".gif")
    if not gif and not animation.FFMpegWriter.isAvailable():
        raise CliError(
            f"--out {out!r}: writing .mp4 needs ffmpeg, which was not found. "
            "Fix: install ffmpeg (e.g. apt install ffmpeg, conda install ffmpeg) or write a .gif."
        )
    view, size = args.view, args.size
    pixels = round(size[0] * args.dpi) * round(size[1] * args.dpi)
    if pixels > MAX_PIXELS:
        raise CliError(
            f"--size {size[0]:g},{size[1]:g} at --dpi {args.dpi} is {pixels:.3g} pixels a frame, "
            f"more than {MAX_PIXELS:.0e}. Fix: a smaller --size or --dpi, e.g. --size 6,5 --dpi 100."
        )

    saved = runfile.read(args.run_file)
    coordinates = "joint" if saved.joint else None  # the run's own coordinates
    if saved.joint and os.path.splitext(args.model)[1].lower() not in (".xml", ".mjcf", ".urdf"):
        raise CliError(
            f"RUN {args.run_file!r} is in joint coordinates, from an MJCF/URDF file, and MODEL "
            f"{args.model!r} is not one. Fix: animate it with {saved.meta.get('model', 'its model')}."
        )
    if not saved.joint and os.path.splitext(args.model)[1].lower() in (".xml", ".mjcf", ".urdf"):
        coordinates = "maximal"  # a run in maximal coordinates: q is every body's pose
    loaded = load_model(args.model, meshes=args.meshes, coordinates=coordinates)
    if saved.joint:
        t, q = joint_trajectory(saved, loaded.model, args.run_file, args.model, args.sample)
    else:
        t, q = trajectory(saved, loaded.model, args.run_file, args.model, args.sample)
    failed = runfile.failures(saved, None if saved.batch is None else [args.sample])
    finite = np.all(np.isfinite(q.reshape(len(t), -1)), axis=1)
    if failed or not np.all(finite):
        n = len(t) if np.all(finite) else int(np.argmin(finite))  # states before the first NaN
        if n == 0:
            raise CliError(
                f"RUN {args.run_file!r} has no finite state to draw "
                f"({failed or 'its first state is not finite'}). Fix: simulate again with a "
                "smaller --dt."
            )
        t, q = t[:n], q[:n]
        print(
            f"warning: {args.run_file}: {failed or 'states are not finite'}; animating "
            f"t = {t[0]:g} .. {t[-1]:g} s",
            file=sys.stderr,
        )
    every = args.every or _real_time(t, args.fps)
    frames = np.arange(0, len(t), every)
    if len(frames) > MAX_DRAWN:
        raise CliError(
            f"--every {every} draws {len(frames)} of the {len(t)} saved states, more than "
            f"{MAX_DRAWN} frames. Fix: --every {math.ceil(len(t) / MAX_FRAMES)} (or leave it "
            f"out: at most {MAX_FRAMES} frames)."
        )
    available = _available_memory(host=True)
    if gif and available is not None and 4 * pixels * len(frames) > available:
        raise CliError(  # matplotlib's GIF writer holds every frame (RGBA) until it is done
            f"{len(frames)} frames of {pixels:.3g} pixels take {4 * pixels * len(frames) / 2**30:.3g} "
            f"GiB, more than the {available / 2**30:.3g} GiB of memory available now. Fix: a "
            "larger --every, a smaller --size or --dpi, or an .mp4."
        )
    scene = build_joint_scene(loaded) if saved.joint else build_scene(loaded)
    fig, draw = figure(plt, scene, q[frames], t[frames], view, size, args.dpi)
    writer = (animation.PillowWriter if gif else animation.FFMpegWriter)(fps=args.fps)
    steps = tqdm(
        range(len(frames)), "animate", unit="frame", disable=not show_progress(args.progress)
    )
    try:
        with writing(out), writer.saving(fig, out, args.dpi):  # one draw a frame, not two
            for i in steps:
                draw(i)
                writer.grab_frame()
    finally:
        plt.close(fig)
    print(
        f"wrote {out}: {len(frames)} frames at {args.fps:g} fps (--every {every} of {len(t)} "
        f"saved states), t = {t[0]:g} .. {t[frames[-1]]:g} s"
    )
    return 0


def limits(scene: Scene, q) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(centre (3,), half-widths (3,), plane grid segments (G, 2, 3)) of the frames q (T, nb, 7):
    the cube, with a 10 % margin, around every moving face and joint point, the world's geoms
    and the planes' grids, which cover the footprint of the rest."""
    moving = [
        np.concatenate([place(scene, qk).reshape(-1, 3), *joint_points(scene, qk)]) for qk in q
    ]
    ext = np.concatenate([*moving, scene.static.reshape(-1, 3)])
    grid = [_plane_grid(p, ext.min(0), ext.max(0)) for p in scene.planes]
    grid = np.concatenate([np.zeros((0, 2, 3)), *grid])
    world = np.concatenate([ext, grid.reshape(-1, 3)])
    lo, hi = world.min(0), world.max(0)
    return (lo + hi) / 2, np.full(3, 0.55 * max((hi - lo).max(), 1e-3)), grid


def figure(plt, scene: Scene, q, t, view, size, dpi):
    """The figure with fixed limits and ``draw(i)``, which shows frame i of q (T, nb, 7) at
    times t (T,): polygons and lines are updated in place, never re-created."""
    from mpl_toolkits.mplot3d.art3d import Line3D, Line3DCollection, Poly3DCollection

    centre, half, grid = limits(scene, q)
    fig = plt.figure(figsize=size, dpi=dpi)
    ax = fig.add_subplot(projection="3d", computed_zorder=False)  # world, bodies, joints
    fig.subplots_adjust(left=0.0, right=1.0, bottom=0.02, top=0.95)
    ax.view_init(elev=view[0], azim=view[1])
    ax.set(xlabel="x [m]", ylabel="y [m]", zlabel="z [m]")
    ax.locator_params(nbins=4)
    ax.tick_params(labelsize="small")
    ax.set_xlim(centre[0] - half[0], centre[0] + half[0])
    ax.set_ylim(centre[1] - half[1], centre[1] + half[1])
    ax.set_zlim(centre[2] - half[2], centre[2] + half[2])
    ax.set_box_aspect((1.0, 1.0, 1.0))  # a cube: one scale on the three axes
    ax.add_collection3d(
        Line3DCollection(grid, colors=[GREY], linewidths=0.5, zorder=0), autolim=False
    )
    if len(scene.static):
        grey = _shade(np.tile(GREY, (len(scene.static), 1)), normals(scene.static))
        ax.add_collection3d(
            Poly3DCollection(scene.static, facecolors=grey, **EDGES, zorder=1), autolim=False
        )
    colour = np.array([plt.get_cmap("tab10")(b % 10) for b in scene.owner]).reshape(-1, 4)
    n_body = normals(scene.faces)
    bodies = Poly3DCollection(place(scene, q[0]), facecolors=colour, **EDGES, zorder=2)
    links = Line3DCollection([], colors="0.15", linewidths=1.2, zorder=3)
    dots = Line3D([], [], [], marker="o", linestyle="", color="k", markersize=3, zorder=4)
    ax.add_collection3d(bodies, autolim=False)
    ax.add_collection3d(links, autolim=False)
    ax.add_line(dots)
    title = ax.set_title("")

    def draw(i):
        faces = place(scene, q[i])
        bodies.set_verts(faces)  # pyright: ignore[reportArgumentType]  (an (F, 4, 3) array: mpl's fast path)
        n_world = np.einsum("fij,fj->fi", pose(q[i])[1][scene.owner], n_body)
        bodies.set_facecolor(_shade(colour, n_world))
        points, coms = joint_points(scene, q[i])
        links.set_segments(np.stack([coms, points], axis=1))  # pyright: ignore[reportArgumentType]
        dots.set_data_3d(points[:, 0], points[:, 1], points[:, 2])
        title.set_text(f"t = {t[i]:.3f} s")

    return fig, draw


def _shade(colour, n_world) -> np.ndarray:
    """Two-sided Lambert shading of face colours (F, 4) by world normals (F, 3)."""
    n_world = n_world / np.maximum(np.linalg.norm(n_world, axis=-1, keepdims=True), 1e-300)
    light = 0.4 + 0.6 * np.abs(n_world @ LIGHT)
    return np.concatenate([colour[:, :3] * light[:, None], colour[:, 3:]], axis=1)
