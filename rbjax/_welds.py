"""Bodies welded to the body that carries them, merged into one rigid body at build time.

A :class:`rbjax.Fixed` joint between two bodies leaves them no relative motion: together they
are one rigid body, whose mass is the sum of the masses, whose centre of mass is the
mass-weighted mean, and whose central inertia is the parallel-axis sum (Huygens–Steiner)

    m = Σ m_b,    c = Σ m_b o_b / m,    Θ = Σ [R_b Θ_b R_bᵀ + m_b (|d_b|² I − d_b d_bᵀ)],

with o_b, R_b the centre of mass and axes of body b in the carrier's axes and d_b = o_b − c.
Merging saves the six weld equations per pair (and their multipliers), and it is the only way
to simulate a **point mass** (:meth:`rbjax.Body.point`): a body of zero inertia has a singular
mass matrix on its own (Möller & Glocker 2012, eq. (64)), but a regular one once carried.
MuJoCo's compiler does the same for bodies without joints (its composite rigid-body inertia).

:class:`Merge` records how every body the user listed sits on the merged model's bodies (the
*engine bodies*): its carrier, centre of mass and axes. It converts states between the two
layouts (:meth:`Merge.expand`, :meth:`Merge.merge_state`), carries user force laws
(:class:`rbjax.ForceFunction`) that are written for the user's bodies, and computes the
reaction of every merged weld (:func:`weld_reactions`) from the Newton–Euler equations of
the part the weld holds (Negrut ME751, "reaction forces"):

    F = Σ_{b∈J} m_b (a_b − g) − F_applied − F_joints,
    τ_P = Σ_{b∈J} [R_b (Θ_b ω̇_b + ω_b × Θ_b ω_b) + (r_b − P) × m_b (a_b − g)] − τ_applied − τ_joints,

where J is the part on the weld's body-j side (or body i's, with the sign flipped, when that
side holds the ground) and P the weld point.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from . import _quaternion as quat
from ._body import Body, validate_inertia
from ._constraints import CD, DP1, DP2, AbstractConstraint, D
from ._errors import is_concrete
from ._forces import AbstractForce, BodyTorque, ForceFunction, PointForce, Wrench
from ._joints import (
    Cylindrical,
    Distance,
    Fixed,
    Parallel,
    Perpendicular,
    PointOnLine,
    Revolute,
    RotationDriver,
    Spherical,
    Translational,
    TranslationDriver,
    Universal,
)
from ._springs import AxialSpringDamper, RotationalSpringDamper, TranslationalSpringDamper
from ._state import State
from ._topology import GROUND

_DIRECTIONS = ("x", "z", "a", "axis", "ref")  # field stems of body-fixed directions (x_i, ...)
_SPRINGS = (TranslationalSpringDamper, RotationalSpringDamper, AxialSpringDamper)


class Merge(eqx.Module):
    """Where each body of the user's list sits once welded bodies are merged.

    ``names`` the user's bodies in the order given to :class:`rbjax.Model`; ``carrier`` the
    engine body (index into ``model.names``) that carries each, or ``GROUND`` for a body
    welded to the world; ``offset`` (n, 3) its centre of mass and ``rotation`` (n, 3, 3) its
    axes, both in the carrier's body axes about the carrier's (composite) centre of mass
    (world frame for the ground); ``mass`` (n,), ``inertia`` (n, 3, 3) its own. ``welds`` the
    merged :class:`rbjax.Fixed` joints (user body indices), ``weld_names`` their names.

    These arrays describe the bodies as built; the dynamics use the composite
    ``model.mass`` / ``model.inertia``. Changing either side with ``equinox.tree_at`` does not
    update the other: to vary a welded body's mass, build the Model inside the function (the
    merge is written in ``jax.numpy``, so it is traced and differentiated).
    """

    names: tuple[str, ...] = eqx.field(static=True)
    carrier: tuple[int, ...] = eqx.field(static=True)
    weld_names: tuple[str, ...] = eqx.field(static=True)
    weld_part: tuple[tuple[tuple[int, ...], int], ...] = eqx.field(static=True)
    joint_sides: tuple[tuple[int, int], ...] = eqx.field(static=True)
    force_sides: tuple[tuple[int, ...] | None, ...] = eqx.field(static=True)
    offset: Float[Array, "n 3"]
    rotation: Float[Array, "n 3 3"]
    mass: Float[Array, " n"]
    inertia: Float[Array, "n 3 3"]
    welds: tuple[Fixed, ...]
    source: tuple  # (bodies, joints, forces) as given to the Model (rbjax.save writes them)
    merge_welded: bool = eqx.field(static=True, default=False)

    @property
    def merged(self) -> tuple[str, ...]:
        """The user's bodies that are not engine bodies (carried by another body or the world)."""
        engine = {c for c in self.carrier if c != GROUND}
        own = {self._own(k) for k in engine}
        return tuple(n for b, n in enumerate(self.names) if b not in own)

    def _own(self, k: int) -> int:
        """The user body whose name engine body k carries (its first member)."""
        return self.carrier.index(k)

    def expand(self, q, u):
        """(q, u) of every user body, (..., n, 7), from the engine's (..., nb, 7).

        r_b = r_k + R_k o_b, A_b = A_k ⊗ A(R_b), v_b = v_k + R_k (ω_k × o_b), ν_b = 0,
        ω_b = R_bᵀ ω_k (body axes); a body welded to the world rests at (o_b, A(R_b))."""
        q, u = jnp.asarray(q), jnp.asarray(u)
        dtype = q.dtype
        idx = np.array([max(c, 0) for c in self.carrier])
        fixed = np.array([c == GROUND for c in self.carrier])
        still = jnp.asarray([0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0], dtype)
        qk = jnp.where(fixed[:, None], still, q[..., idx, :])
        uk = jnp.where(fixed[:, None], jnp.zeros((), dtype), u[..., idx, :])
        o = self.offset.astype(dtype)
        rot = self.rotation.astype(dtype)
        a = qk[..., 3:7]
        omega = uk[..., 4:7]
        r = qk[..., 0:3] + quat.rotate(a, o)
        att = quat.mul(a, quat.from_matrix(rot))
        v = uk[..., 0:3] + quat.rotate(a, jnp.cross(omega, o))
        w = jnp.einsum("...ji,...j->...i", rot, omega)
        zero = jnp.zeros(v.shape[:-1] + (1,), dtype)
        return jnp.concatenate([r, att], -1), jnp.concatenate([v, zero, w], -1)

    def merge_state(self, state: State, *, atol: float | None = None) -> State:
        """The engine state of a user-layout ``state`` (one row per body of the user's list).

        Each engine body takes the pose and velocity of its own user body, moved to the
        composite centre of mass; every other row must already be where its welds put it
        (checked on concrete values to ``atol``, default 1e-8 in float64 and 1e-3 in float32,
        relative to the size of the motion): a ValueError names the first body that is not."""
        if not isinstance(state, State):
            raise ValueError(
                f"merge_state(state = {type(state).__name__}) is not an rbjax.State. Fix: build "
                "it with rbjax.make_state(...) listing every body given to the Model."
            )
        n = len(self.names)
        if state.q.shape[-2] != n:
            raise ValueError(
                f"merge_state: State.q has {state.q.shape[-2]} bodies, but the model was built "
                f"from {n} ({list(self.names)}). Fix: pass a state with one row per body given "
                "to rbjax.Model, in that order."
            )
        q, u = state.q, state.u
        engine = sorted({c for c in self.carrier if c != GROUND})
        own = np.array([self._own(k) for k in engine], dtype=int)
        qo, uo = q[..., own, :], u[..., own, :]
        o = self.offset[own].astype(q.dtype)
        a = qo[..., 3:7]
        r = qo[..., 0:3] - quat.rotate(a, o)
        v = uo[..., 0:3] - quat.rotate(a, jnp.cross(uo[..., 4:7], o))
        qe = jnp.concatenate([r, a], -1)
        ue = jnp.concatenate([v, uo[..., 3:7]], -1)
        if all(is_concrete(x) for x in (q, u, qe, ue)):
            self._check_placed(np.asarray(q), np.asarray(u), qe, ue, atol)
        return State(t=state.t, q=qe, u=ue)

    def _check_placed(self, q, u, qe, ue, atol) -> None:
        dtype = np.dtype(q.dtype)
        if atol is None:
            atol = 1e-8 if dtype == np.float64 else 1e-3
        qx, ux = (np.asarray(x) for x in self.expand(qe, ue))
        scale_r = 1.0 + np.max(np.abs(q[..., 0:3]))
        scale_v = 1.0 + np.max(np.abs(u[..., 0:3])) + np.max(np.abs(u[..., 4:7]))
        ra = np.asarray(quat.rotation_matrix(q[..., 3:7]))
        rx = np.asarray(quat.rotation_matrix(qx[..., 3:7]))
        gaps = {
            "position": np.linalg.norm(q[..., 0:3] - qx[..., 0:3], axis=-1) / scale_r,
            "attitude": np.abs(ra - rx).max(axis=(-1, -2)),
            "velocity": np.linalg.norm(u[..., 0:3] - ux[..., 0:3], axis=-1) / scale_v,
            "angular velocity": np.linalg.norm(u[..., 4:7] - ux[..., 4:7], axis=-1) / scale_v,
        }
        for what, gap in gaps.items():
            bad = ~(gap <= atol)
            if np.any(bad):
                where = tuple(int(i) for i in np.argwhere(bad)[0])
                b = where[-1]
                carrier = self.carrier[b]
                by = "the world" if carrier == GROUND else "the body it is welded to"
                raise ValueError(
                    f"merge_state: State row {', '.join(map(str, where))} (body "
                    f"'{self.names[b]}'): its {what} is not the one {by} gives it: off by "
                    f"{gap[where]:.3g} (relative; tolerance {atol:.1g}). Its welds leave it no "
                    "motion of its own. Fix: place welded bodies with their welds (e.g. build "
                    "the state with the joints' .at() helpers, or give only the carriers and "
                    "take the rest from model.expand), or pass a larger atol=."
                )

    def fold(self, q, wrench: Wrench) -> Wrench:
        """A user-layout wrench (one system) moved onto the engine bodies: each body's force
        acts at its centre of mass o_b on its carrier, F_k += F_b, S_k += o_bᵀ f̄_b,
        M_k += R_b M_b + o_b × f̄_b with f̄_b = R_kᵀ F_b (Möller & Glocker 2012, eq. (75));
        a load on a body welded to the world is taken by the world."""
        nb = q.shape[-2]
        dtype = q.dtype
        idx = np.array([max(c, 0) for c in self.carrier])
        moving = jnp.asarray([c != GROUND for c in self.carrier], dtype)
        f = jnp.asarray(wrench.force_world, dtype) * moving[:, None]
        s = jnp.asarray(wrench.scaling, dtype) * moving
        m = jnp.asarray(wrench.moment_body, dtype) * moving[:, None]
        o = self.offset.astype(dtype)
        f_body = quat.rotate_inverse(q[idx, 3:7], f)
        moment = jnp.einsum("bij,bj->bi", self.rotation.astype(dtype), m) + jnp.cross(o, f_body)
        scaling = s + jnp.sum(o * f_body, -1)
        zero3 = jnp.zeros((nb, 3), dtype)
        return Wrench(
            zero3.at[idx].add(f),
            jnp.zeros((nb,), dtype).at[idx].add(scaling),
            zero3.at[idx].add(moment),
        )


class CarriedForce(AbstractForce):
    """A user force law written for the user's bodies, in a model whose welded bodies are
    merged: ``force.fn`` sees the expanded state (one row per body given to the Model) and
    its wrench is folded onto the engine bodies (:meth:`Merge.fold`)."""

    force: ForceFunction
    merge: Merge

    def wrench(self, model, t, state: State) -> Wrench:
        q, u = self.merge.expand(state.q, state.u)
        inner = self.force.wrench(None, t, State(t=state.t, q=q, u=u))
        return self.merge.fold(state.q, inner)


class CarriedConstraint(AbstractConstraint):
    """A constraint written for the user's bodies (a :class:`rbjax.CustomConstraint` or a
    user subclass) on bodies that welds merged: ``constraint.residual`` sees each merged
    body's own coordinates, q_b = (r_k + R_k o_b, A_k ⊗ A(R_b)), computed from its carrier's
    (``place_i`` / ``place_j`` = (o, R); None for the ground)."""

    constraint: AbstractConstraint
    body_i: int = eqx.field(static=True)
    body_j: int = eqx.field(static=True)
    name: str = eqx.field(static=True)
    place_i: tuple[Array, Array] | None
    place_j: tuple[Array, Array] | None

    def residual(self, q_i, q_j, t):
        return self.constraint.residual(_placed(q_i, self.place_i), _placed(q_j, self.place_j), t)

    def frame(self):
        s_i, s_j, r_i, r_j = self.constraint.frame()
        out = []
        for s, place in ((s_i, self.place_i), (s_j, self.place_j)):
            out.append(s if place is None else place[0] + place[1] @ s)
        for r, place in ((r_i, self.place_i), (r_j, self.place_j)):
            out.append(r if place is None else place[1] @ r)
        return tuple(out)


def _placed(q, place):
    """The coordinates of the body at (o, R) on the body (or ground) with coordinates q."""
    if place is None:
        return q
    o, rot = (x.astype(q.dtype) for x in place)
    a = q[3:7]
    return jnp.concatenate([q[0:3] + quat.rotate(a, o), quat.mul(a, quat.from_matrix(rot))])


# ---------------------------------------------------------------------------------- the plan


def _frame(x, z):
    x, z = jnp.asarray(x), jnp.asarray(z)
    return jnp.stack([x, jnp.cross(z, x), z], axis=-1)


def _user_index(b, names):
    if isinstance(b, str):
        return names.index(b) if b in names else None
    if isinstance(b, (int, np.integer)) and not isinstance(b, bool):
        b = int(b)
        return b if b == GROUND or 0 <= b < len(names) else None
    return None


class _Place:
    """Body b sits in the frame of group root ``root`` at centre of mass ``o``, axes ``rot``."""

    def __init__(self, root, o, rot):
        self.root, self.o, self.rot = root, o, rot


def plan(bodies, names, joints, forces, merge_welded: bool, dtype):
    """The engine bodies, joints and forces of a model and its :class:`Merge` (None when no
    weld is merged). A :class:`rbjax.Fixed` joint is merged when ``merge_welded`` is true or
    one of its bodies is a point mass; a point mass that no merged weld carries is refused."""
    points = [b.point for b in bodies]
    chosen = []  # (joint index, i, j) with user indices (GROUND allowed)
    for k, joint in enumerate(joints):
        if type(joint) is not Fixed:
            continue
        i, j = _user_index(joint.body_i, names), _user_index(joint.body_j, names)
        if i is None or j is None or i == j:
            continue  # the topology check names the mistake
        if merge_welded or (i != GROUND and points[i]) or (j != GROUND and points[j]):
            chosen.append((k, i, j))
    carried = {b for _, i, j in chosen for b in (i, j) if b != GROUND}
    for b, body in enumerate(bodies):
        if body.point and b not in carried:
            raise ValueError(
                f"Model body '{names[b]}' (bodies[{b}]) is a point mass (zero inertia) that no "
                "rbjax.Fixed joint welds to another body: alone, its rotation is undetermined "
                "(a singular mass matrix). Fix: weld it to the body that carries it, "
                f"rbjax.Fixed(parent, '{names[b]}', s_i=<where it sits on the parent>), or give "
                "it a physical inertia (a sphere of radius r: 2 m r²/5)."
            )
    if not chosen:
        return list(bodies), list(joints), list(forces), None
    for _, i, j in chosen:
        for b in (i, j):
            if b != GROUND and bodies[b].scalable:
                raise ValueError(
                    f"Model body '{names[b]}' is scalable and welded by a merged rbjax.Fixed "
                    "joint: merging needs rigid bodies (a scalable body changes size, so its "
                    "weld is not a rigid connection). Fix: declare it rigid, or build with "
                    "merge_welded=False and keep the weld as a constraint."
                )
    return _merge(bodies, names, joints, forces, chosen, dtype, merge_welded)


def _merge(bodies, names, joints, forces, chosen, dtype, merge_welded):
    n = len(bodies)
    G = n  # the ground's node
    eye = jnp.eye(3, dtype=dtype)
    place = {b: _Place(b, jnp.zeros(3, dtype), eye) for b in range(n + 1)}
    members = {b: [b] for b in range(n + 1)}
    edges = []  # (i, j) nodes of each merged weld

    def node(b):
        return G if b == GROUND else b

    for k, i, j in chosen:
        joint = joints[k]
        a, b = node(i), node(j)
        ra, rb = place[a].root, place[b].root
        if ra == rb:
            raise ValueError(
                f"joint '{joint.name}' (joints[{k}]) welds {_label(i, names)} to "
                f"{_label(j, names)}, which other rbjax.Fixed joints already weld together: a "
                "loop of welds. Fix: remove one of the welds (they hold nothing more)."
            )
        fi = _frame(joint.x_i, joint.z_i).astype(dtype)
        fj = _frame(joint.x_j, joint.z_j).astype(dtype)
        si, sj = jnp.asarray(joint.s_i, dtype), jnp.asarray(joint.s_j, dtype)
        if rb == G:  # the ground's group absorbs: express body i in body j's group
            a, b, fi, fj, si, sj = b, a, fj, fi, sj, si
            ra, rb = rb, ra
        rel = fi @ fj.T  # b's axes in a's axes
        pa, pb = place[a], place[b]
        rot_b = pa.rot @ rel  # b's axes in root ra
        o_b = pa.o + pa.rot @ (si - rel @ sj)
        rot_root = rot_b @ pb.rot.T  # root rb in root ra
        o_root = o_b - rot_root @ pb.o
        for m in members[rb]:
            pm = place[m]
            place[m] = _Place(ra, o_root + rot_root @ pm.o, rot_root @ pm.rot)
        members[ra] += members.pop(rb)
        edges.append((node(i), node(j)))

    # engine bodies: the roots of the groups that move, in the user's order
    roots = [r for r in range(n) if r in members and place[r].root == r]
    engine_of = {}
    engine_bodies = []
    offsets: dict[int, Array] = {}
    for e, r in enumerate(roots):
        group = sorted(members[r])
        m = [jnp.asarray(bodies[b].mass, dtype) for b in group]
        total = sum(m)
        com = sum(mb * place[b].o for mb, b in zip(m, group, strict=True)) / total
        inertia = jnp.zeros((3, 3), dtype)
        for mb, b in zip(m, group, strict=True):
            d = place[b].o - com
            rot = place[b].rot
            inertia = inertia + rot @ jnp.asarray(bodies[b].inertia, dtype) @ rot.T
            inertia = inertia + mb * (jnp.dot(d, d) * eye - jnp.outer(d, d))
            offsets[b] = d
            engine_of[b] = e
        inertia = 0.5 * (inertia + inertia.T)
        if len(group) > 1:
            label = f"the merged body '{names[r]}' ({', '.join(names[b] for b in group)})"
            validate_inertia(label + " inertia", inertia)
        if len(group) == 1:  # a body no weld touches: itself (a scalable body stays one)
            engine_bodies.append(Body(total, inertia, name=names[r], scalable=bodies[r].scalable))
        else:
            engine_bodies.append(Body(total, inertia, name=names[r]))
    for b in members.get(G, [])[1:] if G in members else []:
        offsets[b] = place[b].o
        engine_of[b] = GROUND
    carrier = tuple(engine_of[b] for b in range(n))
    rotation = jnp.stack([place[b].rot for b in range(n)])
    offset = jnp.stack([offsets[b] for b in range(n)])

    def side(b):
        """(engine body, o, R) of user body b (GROUND stays the ground: 0, I)."""
        if b == GROUND:
            return GROUND, None, None
        return carrier[b], offset[b], rotation[b]

    merged = {k for k, _, _ in chosen}
    new_joints, joint_sides = [], []
    for k, joint in enumerate(joints):
        if k in merged:
            continue
        i, j = _user_index(joint.body_i, names), _user_index(joint.body_j, names)
        if i is None or j is None:
            new_joints.append(joint)  # the topology check names it
            joint_sides.append((GROUND, GROUND))
            continue
        ei, ej = side(i)[0], side(j)[0]
        if ei == ej:
            raise ValueError(
                f"joint '{joint.name}' (joints[{k}]) connects {_label(i, names)} and "
                f"{_label(j, names)}, which welds merge into "
                f"{'the world' if ei == GROUND else 'one body ' + repr(names[roots[ei]])}: it "
                "can hold nothing. Fix: remove the joint or the weld."
            )
        if type(joint) in _SHELLS:
            joint = _moved(joint, {"_i": side(i), "_j": side(j)}, ("body_i", "body_j"))
        else:  # a residual of the user's bodies' coordinates: evaluated on them
            places = [None if b == GROUND else (offset[b], rotation[b]) for b in (i, j)]
            joint = CarriedConstraint(
                constraint=joint,
                body_i=ei,
                body_j=ej,
                name=joint.name,
                place_i=places[0],
                place_j=places[1],
            )
        new_joints.append(joint)
        joint_sides.append((i, j))

    new_forces, force_sides = [], []
    for k, force in enumerate(forces):
        if type(force) is ForceFunction:
            new_forces.append(None)  # filled once the Merge exists
            force_sides.append(None)
            continue
        if type(force) in (PointForce, BodyTorque):
            b = force.body
            if carrier[b] == GROUND:
                raise ValueError(
                    f"forces[{k}] ({type(force).__name__}) acts on '{names[b]}', which is welded "
                    "to the world: it cannot move anything. Fix: remove it (a load on a support "
                    "is not modelled), or weld the body to a moving body instead."
                )
            new_forces.append(_moved_one_body(force, side(b)))
            force_sides.append((b,))
            continue
        if type(force) in _SPRINGS:
            i, j = force.body_i, force.body_j
            ei, ej = side(i)[0], side(j)[0]
            for b in (i, j):
                if b != GROUND and carrier[b] == GROUND:
                    raise ValueError(
                        f"forces[{k}] ({type(force).__name__}) is attached to '{names[b]}', "
                        "which is welded to the world. Fix: attach that side to rbjax.GROUND "
                        "at the same world point (the weld's reaction then leaves it out)."
                    )
            if ei == ej:
                raise ValueError(
                    f"forces[{k}] ({type(force).__name__}) connects {_label(i, names)} and "
                    f"{_label(j, names)}, which welds merge into one body: it does no work and "
                    "only loads the weld. Fix: remove it."
                )
            new_forces.append(_moved(force, {"_i": side(i), "_j": side(j)}, ("body_i", "body_j")))
            force_sides.append((i, j))
            continue
        raise ValueError(
            f"forces[{k}] ({type(force).__name__}) is a force type that rbjax cannot move onto "
            "merged bodies (it indexes the bodies given to the Model, and welds merge some of "
            "them). Fix: write it as an rbjax.ForceFunction (which sees every body given to the "
            "Model), or build with merge_welded=False."
        )

    # the part each weld holds: the side of body j, or of body i when j's side has the ground
    weld_part = []
    for w, (a, b) in enumerate(edges):
        rest = edges[:w] + edges[w + 1 :]
        part = _component(b, rest)
        sign = 1
        if G in part:
            part, sign = _component(a, rest), -1
        weld_part.append((tuple(sorted(part)), sign))
    merge = Merge(
        names=tuple(names),
        carrier=carrier,
        weld_names=tuple(joints[k].name for k, _, _ in chosen),
        weld_part=tuple(weld_part),
        joint_sides=tuple(joint_sides),
        force_sides=tuple(force_sides),
        offset=offset,
        rotation=rotation,
        mass=jnp.stack([jnp.asarray(b.mass, dtype) for b in bodies]),
        inertia=jnp.stack([jnp.asarray(b.inertia, dtype) for b in bodies]),
        welds=tuple(_rebuilt(joints[k], i, j) for k, i, j in chosen),
        source=(tuple(bodies), tuple(joints), tuple(forces)),
        merge_welded=bool(merge_welded),
    )
    new_forces = [
        CarriedForce(force, merge) if f is None else f
        for f, force in zip(new_forces, forces, strict=True)
    ]
    return engine_bodies, new_joints, new_forces, merge


def _label(b, names) -> str:
    return "the ground" if b == GROUND else f"'{names[b]}'"


def _component(start, edges):
    seen, todo = {start}, [start]
    while todo:
        x = todo.pop()
        for a, b in edges:
            for p, r in ((a, b), (b, a)):
                if p == x and r not in seen:
                    seen.add(r)
                    todo.append(r)
    return seen


_Z, _X, _O = (0.0, 0.0, 1.0), (1.0, 0.0, 0.0), (0.0, 0.0, 0.0)
_JOINTS = (Spherical, Revolute, Universal, Cylindrical, Translational, Fixed, Parallel)
_JOINTS += (Perpendicular, PointOnLine)
# each built-in type moved onto merged bodies: its public constructor between the bodies i, j
# (or on body i) with default data and the object's own static data (name, frame) and
# non-array fields (driving function, actuator), so the result has the object's structure
_SHELLS = {cls: lambda o, i, j: type(o)(i, j, name=o.name) for cls in _JOINTS} | {
    Distance: lambda o, i, j: Distance(i, j, length=1.0, name=o.name),
    RotationDriver: lambda o, i, j: RotationDriver(i, j, o.f, name=o.name),
    TranslationDriver: lambda o, i, j: TranslationDriver(i, j, o.f, name=o.name),
    DP1: lambda o, i, j: DP1(i, _Z, j, _Z, o.f, name=o.name),
    DP2: lambda o, i, j: DP2(i, _Z, _O, j, _O, o.f, name=o.name),
    D: lambda o, i, j: D(i, _O, j, _O, o.f, name=o.name),
    CD: lambda o, i, j: CD(_Z, i, _O, j, _O, o.f, name=o.name),
    TranslationalSpringDamper: lambda o, i, j: TranslationalSpringDamper(
        i, _O, j, _O, stiffness=0.0, actuator=o.actuator
    ),
    RotationalSpringDamper: lambda o, i, j: RotationalSpringDamper(
        i, j, axis_i=_Z, axis_j=_Z, ref_i=_X, ref_j=_X, stiffness=0.0, actuator=o.actuator
    ),
    AxialSpringDamper: lambda o, i, j: AxialSpringDamper(
        i, j, s_i=_O, s_j=_O, axis_i=_Z, actuator=o.actuator
    ),
    PointForce: lambda o, b: PointForce(b, _O, _O, frame=o.frame),
    BodyTorque: lambda o, b: BodyTorque(b, _O, frame=o.frame),
}


def _rebuilt(obj, *bodies):
    """``obj`` (a built-in joint, constraint or force) between other ``bodies``: its type's
    public constructor gives an object with the new (static) body indices, which then takes
    ``obj``'s own leaves (unflattened into its structure: traced leaves pass, and none is
    validated twice: the user's constructor call checked them)."""
    shell = _SHELLS[type(obj)](obj, *bodies)
    structure = jax.tree_util.tree_structure(shell)
    return jax.tree_util.tree_unflatten(structure, jax.tree_util.tree_leaves(obj))


def _on_carrier(obj, bodies, moves):
    """``obj`` rebuilt between the engine ``bodies`` with some fields re-expressed on their
    carrier (module docstring): ``moves`` holds (field, o, R) for a body point, s ↦ o + R s,
    and (field, None, R) for a body direction, d ↦ R d."""
    out = _rebuilt(obj, *bodies)
    if not moves:
        return out
    values = []
    for field, o, rot in moves:
        x = getattr(obj, field)
        moved = rot.astype(x.dtype) @ x
        values.append(moved if o is None else o.astype(x.dtype) + moved)
    return eqx.tree_at(lambda m: tuple(getattr(m, f) for f, _, _ in moves), out, tuple(values))


def _moved(obj, sides: dict, body_fields):
    """The two-sided joint or force ``obj`` on the engine bodies: ``sides`` maps "_i", "_j"
    to (engine body, o, R) (o None: the user's ground, unchanged). Its body data are the
    fields ``s_i`` (a point) and ``x_i``, ``z_i``, ``a_i``, ``axis_i``, ``ref_i`` (directions)."""
    bodies, moves = [], []
    for (suffix, (engine, o, rot)), field in zip(sides.items(), body_fields, strict=True):
        bodies.append(getattr(obj, field) if o is None else engine)
        if o is None:
            continue
        for stem in ("s",) + _DIRECTIONS:
            if eqx.is_array(getattr(obj, stem + suffix, None)):
                moves.append((stem + suffix, o if stem == "s" else None, rot))
    return _on_carrier(obj, bodies, moves)


def _moved_one_body(force, where):
    """A PointForce or BodyTorque on the body that carries its own: the point ϱ ↦ o + R ϱ,
    a body-frame force or torque turned by R (a world-frame one keeps its components)."""
    engine, o, rot = where
    turned = force.frame == "body"
    if isinstance(force, PointForce):
        moves = [("point_body", o, rot)] + ([("force_world", None, rot)] if turned else [])
    else:
        moves = [("torque_body", None, rot)] if turned else []
    return _on_carrier(force, [engine], moves)


# ------------------------------------------------------------------------------- reactions


def weld_reactions(model, state: State, lam=None) -> dict:
    """Force and torque of every merged weld on each of its two bodies (module docstring),
    as :func:`rbjax.reactions`'s fields, arrays (..., n_welds, 3)."""
    _check_parts(model, model.merged)
    return _weld_reactions(model, state, lam)


@eqx.filter_jit
def _weld_reactions(model, state: State, lam) -> dict:
    """:func:`weld_reactions` as one program (the per-weld loops unrolled at trace time)."""
    from ._dynamics import accelerations
    from ._engine.reactions import FIELDS, joint_reactions

    merge = model.merged
    udot, lam_full = accelerations(model, state)
    if lam is None:
        lam = lam_full
    react = joint_reactions(model, state, lam) if model.joints else None
    batch = state.q.shape[:-2]

    def one(q, u, ud, t, rj):
        return _weld_one(model, merge, q, u, ud, t, rj)

    flat = int(np.prod(batch)) if batch else 1

    def flatten(x):
        return x.reshape((flat,) + x.shape[len(batch) :])

    t = jnp.broadcast_to(jnp.asarray(state.t, state.q.dtype), batch)
    rj = None if react is None else {k: flatten(v) for k, v in react.items()}
    out = jax.vmap(one)(flatten(state.q), flatten(state.u), flatten(udot), flatten(t), rj)
    return {k: out[k].reshape(batch + out[k].shape[1:]) for k in FIELDS}


def _check_parts(model, merge: Merge) -> None:
    """The parts' masses must still add up to the model's composite masses: a mass changed
    with ``eqx.tree_at`` after the build (which the composite does not see from the parts, nor
    the parts from the composite) would make every weld reaction wrong. Concrete values only."""
    if not (is_concrete(model.mass) and is_concrete(merge.mass)):
        return
    composite = np.asarray(model.mass, dtype=float)
    parts = np.zeros(composite.shape[-1:])
    for b, k in enumerate(merge.carrier):
        if k != GROUND:
            parts[k] += float(merge.mass[b])
    if composite.ndim != 1 or not np.allclose(composite, parts, rtol=1e-12, atol=0.0):
        raise ValueError(
            f"weld_reactions: model.mass = {composite.tolist()} is not the sum of the merged "
            f"bodies' masses {parts.tolist()} (model.merged.mass): the model was changed after "
            "it was built (e.g. with equinox.tree_at, or batched), and the welded parts no "
            "longer match their composite. Fix: build the Model again from its bodies (inside "
            "the function for a batch or a gradient: the merge is differentiable)."
        )


def _weld_one(model, merge: Merge, q, u, udot, t, react):
    dtype = q.dtype
    g = jnp.asarray(model.gravity, dtype)
    n = len(merge.names)
    qu, uu = merge.expand(q, u)
    idx = np.array([max(c, 0) for c in merge.carrier])
    moving = jnp.asarray([c != GROUND for c in merge.carrier], dtype)[:, None]
    # world kinematics of every user body
    ak = q[idx, 3:7]
    omega = quat.rotate(ak, u[idx, 4:7]) * moving  # world
    alpha = quat.rotate(ak, udot[idx, 4:7]) * moving
    arm = qu[:, 0:3] - q[idx, 0:3] * moving
    acc = (
        udot[idx, 0:3] + jnp.cross(alpha, arm) + jnp.cross(omega, jnp.cross(omega, arm))
    ) * moving
    rb = quat.rotation_matrix(qu[:, 3:7])
    wb = jnp.einsum("bji,bj->bi", rb, omega)
    ab = jnp.einsum("bji,bj->bi", rb, alpha)
    th = merge.inertia.astype(dtype)
    hdot = jnp.einsum(
        "bij,bj->bi",
        rb,
        jnp.einsum("bij,bj->bi", th, ab) + jnp.cross(wb, jnp.einsum("bij,bj->bi", th, wb)),
    )
    inertial = merge.mass.astype(dtype)[:, None] * (acc - g)
    r = qu[:, 0:3]

    # applied forces per user body: (force world, moment world about the body's point (r_b))
    applied_f = jnp.zeros((n, 3), dtype)
    applied_m = jnp.zeros((n, 3), dtype)  # about r_b
    state1 = State(t=t, q=q, u=u)
    for force, sides in zip(model.forces, merge.force_sides, strict=True):
        if sides is None:  # a user force law: its user-layout wrench
            w = force.force.wrench(None, t, State(t=t, q=qu, u=uu))
            fw = jnp.asarray(w.force_world, dtype)
            mw = jnp.einsum("bij,bj->bi", rb, jnp.asarray(w.moment_body, dtype))
            applied_f, applied_m = applied_f + fw, applied_m + mw
            continue
        w = force.wrench(model, t, state1)
        for s, b in enumerate(sides):
            if b == GROUND:
                continue
            k = merge.carrier[b]
            fw = jnp.asarray(w.force_world, dtype)[k]
            # the engine moment is about the carrier's centre of mass: move it to r_b
            mk = quat.rotate(q[k, 3:7], jnp.asarray(w.moment_body, dtype)[k])
            mk = mk + jnp.cross(q[k, 0:3] - r[b], fw)
            applied_f = applied_f.at[b].add(fw)
            applied_m = applied_m.at[b].add(mk)
            del s

    fields = {}
    for w, (part, sign) in enumerate(merge.weld_part):
        weld = merge.welds[w]
        jb = weld.body_j
        if jb == GROUND:
            p = jnp.asarray(weld.s_j, dtype)
        else:
            p = r[jb] + quat.rotate(qu[jb, 3:7], jnp.asarray(weld.s_j, dtype))
        sel = np.zeros(n)
        sel[list(part)] = 1.0
        sel = jnp.asarray(sel, dtype)[:, None]
        force = jnp.sum(sel * (inertial - applied_f), 0)
        torque = jnp.sum(
            sel * (hdot + jnp.cross(r - p, inertial) - applied_m - jnp.cross(r - p, applied_f)), 0
        )
        # other joints acting on the part
        for jk, (i, j) in enumerate(merge.joint_sides):
            for tag, b in (("i", i), ("j", j)):
                if b == GROUND or b not in part:
                    continue
                fk = react[f"force_{tag}"][jk]
                tk = react[f"torque_{tag}"][jk]
                joint = model.joints[jk]
                s_bar = joint.frame()[0 if tag == "i" else 1]
                eb = merge.carrier[b]
                pj = (
                    jnp.asarray(s_bar, dtype)
                    if eb == GROUND
                    else (q[eb, 0:3] + quat.rotate(q[eb, 3:7], jnp.asarray(s_bar, dtype)))
                )
                force = force - fk
                torque = torque - tk - jnp.cross(pj - p, fk)
        fields.setdefault("force_j", []).append(sign * force)
        fields.setdefault("torque_j", []).append(sign * torque)
        fields.setdefault("force_i", []).append(-sign * force)
        fields.setdefault("torque_i", []).append(-sign * torque)
        for tag, b, frame in (("i", weld.body_i, weld.frame()[2]), ("j", jb, weld.frame()[3])):
            rot = jnp.eye(3, dtype=dtype) if b == GROUND else rb[b]
            to_joint = (rot @ jnp.asarray(frame, dtype)).T
            fields.setdefault(f"force_{tag}_joint", []).append(
                to_joint @ fields[f"force_{tag}"][-1]
            )
            fields.setdefault(f"torque_{tag}_joint", []).append(
                to_joint @ fields[f"torque_{tag}"][-1]
            )
    return {k: jnp.stack(v) for k, v in fields.items()}
