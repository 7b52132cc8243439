"""Joint space: joint coordinates of a maximal-coordinate mechanism, and the reverse map.

rbjax integrates every body's (r, A); robotics speaks joint angles. :class:`JointSpace` takes
a spanning tree of the joint graph (rooted at the ground, plus every body no joint reaches,
which is free) and reads each tree joint's coordinates from its two joint frames. With the
joint frames' world attitudes A_i ⊗ f_i and A_j ⊗ f_j (f = quaternion of the frame
(x̄, ȳ, z̄) in body axes) the relative rotation of the frames is

    Q = (A_i ⊗ f_i)* ⊗ (A_j ⊗ f_j),   K = R(Q),   d = F_iᵀ R_iᵀ (P_j − P_i),

and the coordinates are (ME751 joint definitions, Negrut ME751; MuJoCo's joint conventions):

===============  =================================  ==========================================
joint            position coordinates               velocity coordinates
===============  =================================  ==========================================
Revolute         θ = atan2(K₁₀, K₀₀)                θ̇ = z_iᵀ(ω_j − ω_i)
Translational    x = d₂                             ẋ
Cylindrical      (θ, x)                             (θ̇, ẋ)
Universal        θ₁ about z_i, θ₂ about z_j         (θ̇₁, θ̇₂)
Spherical        Q (4, scalar first)                w = ω_rel in frame j (3)
Fixed            none                               none
free body        (r + R ō, A) (7)                   (v + ω × R ō world, ω body axes) (6)
===============  =================================  ==========================================

with (r, A) the body's centre of mass and attitude, (v, ω) their rates (v world, ω body axes),
and ō the body's ``origins`` point (body axes, from the centre of mass; default 0): MuJoCo's
free joint has the body frame's origin as its position and that origin's world velocity as its
velocity (``mj_jac`` at the origin), which a loaded file's ``Loaded.joint_space()`` uses.

Angles are principal values in (−π, π]: a hinge's winding number is not in the maximal state.
The reverse map (:meth:`JointSpace.state`) is forward kinematics along the tree,
A_j = A_i ⊗ f_i ⊗ Q(coordinates) ⊗ f_j*, P_j = P_i + R_i F_i (0, 0, x). Velocities come from
its jvp, so the geometric Jacobian J (body velocities from joint velocities), the joint-space
mass matrix Jᵀ M J and the bias forces Jᵀ(M J̇ q̇ − f_gravity + gyroscopic terms) follow
exactly (Featherstone 2008 §3; the recursive Newton–Euler algorithm computes the same).
Everything is a JAX function of one system: jit, vmap, grad and jvp apply.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from .._errors import is_concrete, validates_inputs
from .._forces import AbstractForce, Wrench
from .._joints import Cylindrical, Fixed, Revolute, Spherical, Translational, Universal
from .._model import Model
from .._state import State
from .._topology import GROUND
from .._tree.model import maximal_only

# joint class -> (kind, position size, velocity size)
_KINDS = {
    Revolute: ("revolute", 1, 1),
    Translational: ("prismatic", 1, 1),
    Cylindrical: ("cylindrical", 2, 2),
    Universal: ("universal", 2, 2),
    Spherical: ("spherical", 4, 3),
    Fixed: ("fixed", 0, 0),
}
# Universal's frames at zero angles (built by Universal.at): x̄_i ∥ z̄_j, x̄_j ∥ z̄_i, so the
# frame-j axes in frame i are (e3, −e2, e1): the rotation P of π about (e1 + e3)/√2.
_P_UNIVERSAL = np.array([0.0, 1.0, 0.0, 1.0]) / np.sqrt(2.0)


# Single-quaternion algebra on (4,) arrays (scalar first; Möller & Glocker 2012 eqs. (5), (23)):
# the public rbjax.quaternion functions work on batches in the engine's layout, which for one
# quaternion at a time costs several times the operations (measured: 3x the compile time of
# the joint-space programs).
def _qmul(a, b):
    a0, av, b0, bv = a[0], a[1:4], b[0], b[1:4]
    return jnp.concatenate(
        [(a0 * b0 - jnp.dot(av, bv))[None], a0 * bv + b0 * av + jnp.cross(av, bv)]
    )


def _qconj(a):
    return a * jnp.array([1.0, -1.0, -1.0, -1.0], a.dtype)


def _qrot(a, x):
    """R(A) x for a unit quaternion A."""
    a0, av = a[0], a[1:4]
    t = 2.0 * jnp.cross(av, x)
    return x + a0 * t + jnp.cross(av, t)


def _qrot_t(a, x):
    return _qrot(_qconj(a), x)


def _qmat(a):
    return jax.vmap(lambda e: _qrot(a, e), out_axes=1)(jnp.eye(3, dtype=a.dtype))


def quat_from_matrix(rot):
    """The unit quaternion (scalar first) of a rotation matrix, by Shepperd's method (Shepperd
    1978): the largest of 4w², 4x², 4y², 4z² is taken from the diagonal, the others from the
    off-diagonal sums, so the division is always by a number ≥ 1/2."""
    r = rot
    tr = r[0, 0] + r[1, 1] + r[2, 2]
    cands = jnp.stack([tr, r[0, 0], r[1, 1], r[2, 2]])
    k = jnp.argmax(cands)

    def branch(i):
        if i == 0:
            s = jnp.sqrt(jnp.maximum(1.0 + tr, 1e-30)) * 2.0
            return jnp.stack(
                [
                    0.25 * s,
                    (r[2, 1] - r[1, 2]) / s,
                    (r[0, 2] - r[2, 0]) / s,
                    (r[1, 0] - r[0, 1]) / s,
                ]
            )
        a, b, c = i - 1, i % 3, (i + 1) % 3
        s = jnp.sqrt(jnp.maximum(1.0 + r[a, a] - r[b, b] - r[c, c], 1e-30)) * 2.0
        v = {a: 0.25 * s, b: (r[b, a] + r[a, b]) / s, c: (r[c, a] + r[a, c]) / s}
        return jnp.stack([(r[c, b] - r[b, c]) / s, v[0], v[1], v[2]])

    outs = jnp.stack([branch(i) for i in range(4)])
    return outs[k]


def _frame_quat(x, z):
    """Quaternion f of the frame (x̄, z̄ × x̄, z̄) (columns) in body axes: computed with NumPy
    when the frame is concrete (a constant of the program), traced (and differentiable)
    when it is not."""
    if is_concrete((x, z)):
        with jax.ensure_compile_time_eval():
            return jnp.asarray(np.asarray(_frame_quat_traced(x, z)), jnp.result_type(x))
    return _frame_quat_traced(x, z)


def _frame_quat_traced(x, z):
    x = x / jnp.linalg.norm(x)
    z = z / jnp.linalg.norm(z)
    return quat_from_matrix(jnp.stack([x, jnp.cross(z, x), z], axis=-1))


def _qz(angle):
    return jnp.stack([jnp.cos(0.5 * angle), 0.0 * angle, 0.0 * angle, jnp.sin(0.5 * angle)])


class JointSpace(eqx.Module):
    """Joint coordinates of ``model`` (module docstring): a spanning tree of its joints.

    ``coordinates``: one entry (name, kind, nq, nv) per free body (kind "free") and per tree
    joint; ``loops``: the names of the joints that close loops (not coordinates). ``nq``,
    ``nv``: total sizes. By default the tree is found from the joints (in ``model.joints``
    order) and the coordinates are the free bodies' (in body order), then the tree joints' (in
    ``model.joints`` order). Two options give another robot description's coordinates (the
    ones a loaded MJCF/URDF file gets from ``Loaded.joint_space()``, which are MuJoCo's
    ``qpos``/``qvel`` exactly):

    * ``parents`` (nb,): per body, the joint (index in ``model.joints`` or name) that places it
      on the tree, or None for a free body; the coordinates are then in body order (each
      body's free or joint coordinates), and every other joint closes a loop;
    * ``origins`` (nb, 3): per body, the point (body axes, from the centre of mass) whose
      world position is a free body's position coordinate and whose world velocity is its
      velocity coordinate (MuJoCo: the body frame's origin); default the centre of mass.

    Methods work on ONE system (vmap for batches):

    * :meth:`positions` / :meth:`velocities`: (nq,), (nv,) from a :class:`rbjax.State`;
    * :meth:`state`: the State of joint positions and velocities (forward kinematics);
    * :meth:`point`, :meth:`jacobian`: world position of a body point (body axes, from the
      centre of mass) and its geometric Jacobian (6, nv) = (linear; angular), world frame;
    * :meth:`mass_matrix` (nv, nv), :meth:`bias` (nv,) and :meth:`inverse_dynamics`.
    """

    model: Any
    origins: Any  # (nb, 3) or None (the centres of mass)
    order: tuple = eqx.field(static=True)  # ((joint k, parent, child, reversed), ...) topological
    free: tuple[int, ...] = eqx.field(static=True)
    coordinates: tuple = eqx.field(static=True)
    loops: tuple[str, ...] = eqx.field(static=True)
    parents: tuple = eqx.field(static=True)  # per body: its tree joint, or None (free)
    _offsets: tuple = eqx.field(static=True)

    @validates_inputs
    def __init__(self, model: Model, *, parents=None, origins=None):
        maximal_only(model, "rbjax.JointSpace")
        if any(model.scalable):
            raise ValueError(
                f"JointSpace: bodies {[n for n, s in zip(model.names, model.scalable, strict=True) if s]} "
                "are scalable. Fix: joint coordinates are defined for rigid bodies only."
            )
        nb = model.nb
        if parents is None:
            order, free = _spanning_tree(model)
            parent_of = {c: k for k, _, c, _ in order}
            blocks = [("body", b) for b in free] + [
                ("joint", k) for k in sorted(parent_of.values())
            ]
        else:
            parent_of = _given_parents(model, parents)
            free = [b for b in range(nb) if parent_of.get(b) is None]
            order = _tree_order(model, parent_of)
            blocks = [("body", b) if b in free else ("joint", parent_of[b]) for b in range(nb)]
        if origins is not None:
            origins = jnp.asarray(origins)
            if origins.shape != (nb, 3) or not jnp.issubdtype(origins.dtype, jnp.floating):
                raise ValueError(
                    f"JointSpace: origins has shape {origins.shape} ({origins.dtype}). Fix: give "
                    f"one point per body, (nb, 3) = ({nb}, 3) floats, body axes from the centre "
                    "of mass (or None: the centres of mass)."
                )
            if is_concrete(origins) and not np.all(np.isfinite(np.asarray(origins))):
                raise ValueError(
                    "JointSpace: origins has non-finite values. Fix: give finite points."
                )
        self.model = model
        self.origins = origins
        self.order = tuple(order)
        self.free = tuple(free)
        self.parents = tuple(parent_of.get(b) for b in range(nb))
        used = {k for k, *_ in order}
        coords, offs, q0, v0 = [], [], 0, 0
        for key in blocks:
            if key[0] == "body":
                name, kind, nq, nv = model.names[key[1]], "free", 7, 6
            else:
                kind, nq, nv = _KINDS[type(model.joints[key[1]])]
                name = model.joint_names[key[1]]
            coords.append((name, kind, nq, nv))
            offs.append((key, (q0, v0)))
            q0, v0 = q0 + nq, v0 + nv
        self.coordinates = tuple(coords)
        self.loops = tuple(n for k, n in enumerate(model.joint_names) if k not in used)
        self._offsets = tuple(offs)

    @property
    def nq(self) -> int:
        return sum(c[2] for c in self.coordinates)

    @property
    def nv(self) -> int:
        return sum(c[3] for c in self.coordinates)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c[0] for c in self.coordinates)

    def _offset(self, key):
        return dict(self._offsets)[key]

    # ---------------------------------------------------------------- coordinates of a state
    def _frames(self):
        """{joint k: (f_i, f_j, s̄_i, s̄_j)} of the tree joints: the frame quaternions are
        computed once per call of a public method (they are functions of the joints' leaves,
        so derivatives with respect to joint geometry flow through them)."""
        out = {}
        for k, _, _, _ in self.order:
            joint = self.model.joints[k]
            out[k] = (
                _frame_quat(joint.x_i, joint.z_i),
                _frame_quat(joint.x_j, joint.z_j),
                joint.s_i,
                joint.s_j,
            )
        return out

    def _joint_coordinates(self, k, q, frames):
        """Position coordinates of tree joint k at q (nb, 7)."""
        joint = self.model.joints[k]
        i, j = self.model.topology.joint_bodies[k]
        ground = jnp.array([0.0, 0, 0, 1, 0, 0, 0], q.dtype)
        qi = ground if i == GROUND else q[i]
        qj = ground if j == GROUND else q[j]
        fi, fj, si, sj = frames[k]
        wi = _qmul(qi[3:7], fi)
        wj = _qmul(qj[3:7], fj)
        rel = _qmul(_qconj(wi), wj)
        rel = rel / jnp.linalg.norm(rel)
        kmat = _qmat(rel)
        p_i = qi[0:3] + _qrot(qi[3:7], si)
        p_j = qj[0:3] + _qrot(qj[3:7], sj)
        d = _qrot_t(wi, p_j - p_i)
        kind = _KINDS[type(joint)][0]
        theta = jnp.arctan2(kmat[1, 0], kmat[0, 0])
        if kind == "revolute":
            return theta[None]
        if kind == "prismatic":
            return d[2:3]
        if kind == "cylindrical":
            return jnp.stack([theta, d[2]])
        if kind == "universal":
            t1 = jnp.arctan2(kmat[1, 2], kmat[0, 2])
            t2 = jnp.arctan2(kmat[0, 0] * jnp.sin(t1) - kmat[1, 0] * jnp.cos(t1), kmat[2, 0])
            return jnp.stack([t1, t2])
        if kind == "spherical":
            return rel * jnp.where(rel[0] < 0, -1.0, 1.0)
        return jnp.zeros((0,), q.dtype)

    def _lever(self, b, a):
        """R(A) ō_b: a free body's origin (``origins``) from its centre of mass, world frame."""
        if self.origins is None:
            return jnp.zeros(3, a.dtype)
        return _qrot(a, self.origins[b].astype(a.dtype))

    def positions(self, state: State):
        """Joint positions (nq,) of ONE system (a free body: (r + R ō, A), ō its ``origins``
        entry, default 0: the centre of mass; module docstring)."""
        q = state.q
        frames = self._frames()
        parts = []
        for key, _ in self._offsets:
            if key[0] == "body":
                b = key[1]
                parts += [q[b, 0:3] + self._lever(b, q[b, 3:7]), q[b, 3:7]]
            else:
                parts.append(self._joint_coordinates(key[1], q, frames))
        return jnp.concatenate(parts)

    def velocities(self, state: State):
        """Joint velocities (nv,) of ONE system: rates of the angles and displacements, the
        relative angular velocity in frame j for a spherical joint, (v + ω × R ō world, ω body
        axes) for a free body (the velocity of its ``origins`` point; MuJoCo's free joint)."""
        q, u = state.q, state.u
        frames = self._frames()
        kinds = {k: _KINDS[type(self.model.joints[k])][0] for k, *_ in self.order}  # tree joints
        scalar = [
            key[1]
            for key, _ in self._offsets
            if key[0] == "joint" and kinds[key[1]] not in ("spherical", "fixed")
        ]
        rates = {}
        if scalar:  # one jvp for every angle and displacement

            def coordinates(qq):
                return jnp.concatenate([self._joint_coordinates(k, qq, frames) for k in scalar])

            _, flat = jax.jvp(coordinates, (q,), (jax.vmap(_q_dot)(q, u),))
            start = 0
            for k in scalar:
                n = _KINDS[type(self.model.joints[k])][2]
                rates[k] = flat[start : start + n]
                start += n
        parts = []
        for key, _ in self._offsets:
            if key[0] == "body":
                b = key[1]
                w = _qrot(q[b, 3:7], u[b, 4:7])
                parts += [u[b, 0:3] + jnp.cross(w, self._lever(b, q[b, 3:7])), u[b, 4:7]]
            elif kinds[key[1]] == "spherical":
                i, j = self.model.topology.joint_bodies[key[1]]
                _, fj, _, _ = frames[key[1]]
                zero = jnp.zeros(3, q.dtype)
                w_i = zero if i == GROUND else _qrot(q[i, 3:7], u[i, 4:7])
                w_j = zero if j == GROUND else _qrot(q[j, 3:7], u[j, 4:7])
                a_j = fj if j == GROUND else _qmul(q[j, 3:7], fj)
                parts.append(_qrot_t(a_j, w_j - w_i))
            elif kinds[key[1]] != "fixed":
                parts.append(rates[key[1]])
        return jnp.concatenate(parts) if parts else jnp.zeros((0,), q.dtype)

    # ---------------------------------------------------------------- forward kinematics
    def _place(self, qpos, frames):
        """Coordinates q (nb, 7) of the joint positions ``qpos`` (free bodies inside qpos):
        every body is placed, by qpos (free) or by its tree joint."""
        dtype = qpos.dtype
        q = {}
        for b in self.free:  # r = p − R ō: the centre of mass from the origin coordinate
            o, _ = self._offset(("body", b))
            a = qpos[o + 3 : o + 7]
            q[b] = jnp.concatenate([qpos[o : o + 3] - self._lever(b, a), a])
        for k, parent, child, rev in self.order:
            o, _ = self._offset(("joint", k))
            kind, nq, _ = _KINDS[type(self.model.joints[k])]
            x = qpos[o : o + nq]
            if kind in ("revolute", "cylindrical"):
                rel = _qz(x[0])
            elif kind == "universal":
                rel = _qmul(_qmul(_qz(x[0]), jnp.asarray(_P_UNIVERSAL, dtype)), _qz(x[1]))
            elif kind == "spherical":
                rel = x / jnp.linalg.norm(x)
            else:
                rel = jnp.array([1.0, 0, 0, 0], dtype)
            slide = {"prismatic": x[0:1], "cylindrical": x[1:2]}.get(kind)
            t = (
                jnp.zeros(3, dtype)
                if slide is None
                else jnp.concatenate([jnp.zeros(2, dtype), slide])
            )
            fi, fj, si, sj = frames[k]
            if rev:  # the tree runs from body_j (known) to body_i
                fi, fj, si, sj = fj, fi, sj, si
                rel = _qconj(rel)
            ground = jnp.array([0.0, 0, 0, 1, 0, 0, 0], dtype)
            qp = ground if parent == GROUND else q[parent]
            wp = _qmul(qp[3:7], fi)
            if rev:  # P_i = P_j − R_i F_i t: the slide is along the child's frame axis
                a_c = _qmul(_qmul(wp, rel), _qconj(fj))
                p_c = qp[0:3] + _qrot(qp[3:7], si) - _qrot(_qmul(a_c, fj), t)
            else:
                a_c = _qmul(_qmul(wp, rel), _qconj(fj))
                p_c = qp[0:3] + _qrot(qp[3:7], si) + _qrot(wp, t)
            r_c = p_c - _qrot(a_c, sj)
            q[child] = jnp.concatenate([r_c, a_c])
        return jnp.stack([q[b] for b in range(self.model.nb)])

    def _tangent(self, qpos, qvel):
        """d qpos / dt of the joint velocities (quaternion rates from angular velocities)."""
        parts = []
        for key, (o, v) in self._offsets:
            if key[0] == "body":
                a = qpos[o + 3 : o + 7]
                w = qvel[v + 3 : v + 6]
                parts += [
                    qvel[v : v + 3],
                    0.5 * _qmul(a, jnp.concatenate([jnp.zeros(1, a.dtype), w])),
                ]
                continue
            kind, nq, nv = _KINDS[type(self.model.joints[key[1]])]
            if kind == "spherical":
                a = qpos[o : o + 4]
                w = qvel[v : v + 3]
                parts.append(0.5 * _qmul(a, jnp.concatenate([jnp.zeros(1, a.dtype), w])))
            else:
                parts.append(qvel[v : v + nv])
        return jnp.concatenate(parts) if parts else qvel

    def _body_velocities(self, qpos, qvel, frames):
        """(q (nb, 7), u (nb, 7)) of joint positions and velocities (rigid: ν = 0)."""
        q, q_dot = jax.jvp(lambda x: self._place(x, frames), (qpos,), (self._tangent(qpos, qvel),))
        return q, jax.vmap(_u_of)(q, q_dot)

    def state(self, qpos, qvel=None, t: ArrayLike = 0.0) -> State:
        """The :class:`rbjax.State` of joint positions ``qpos`` (nq,) and velocities ``qvel``
        (nv,) (default rest), by forward kinematics along the tree. Loop closures are not
        imposed: give coordinates that close them, or pass the result to :func:`rbjax.assemble`."""
        qpos = jnp.asarray(qpos)
        dtype = qpos.dtype if jnp.issubdtype(qpos.dtype, jnp.floating) else jnp.result_type(float)
        qpos = qpos.astype(dtype)
        if qpos.shape != (self.nq,):
            raise ValueError(
                f"JointSpace.state: qpos has shape {qpos.shape}, expected ({self.nq},) for "
                f"coordinates {self.names}. Fix: pass one number per coordinate."
            )
        qvel = jnp.zeros(self.nv, dtype) if qvel is None else jnp.asarray(qvel, dtype)
        if qvel.shape != (self.nv,):
            raise ValueError(
                f"JointSpace.state: qvel has shape {qvel.shape}, expected ({self.nv},). Fix: "
                "pass one number per velocity coordinate."
            )
        q, u = self._body_velocities(qpos, qvel, self._frames())
        return State(t=jnp.asarray(t, dtype), q=q, u=u)

    # ---------------------------------------------------------------- Jacobians and dynamics
    def point(self, state: State, body, point_body):
        """World position r + R s̄ of the point s̄ (body axes, from the centre of mass) of
        ``body`` (index or name). A loaded file's point in a MuJoCo body frame, measured from
        that frame's origin, is converted by ``loaded.source.body_point(name, point)``."""
        b = self._body(body)
        q = state.q[b]
        return q[0:3] + _qrot(q[3:7], jnp.asarray(point_body, q.dtype))

    def _body(self, body):
        if isinstance(body, str):
            if body not in self.model.names:
                raise ValueError(
                    f"JointSpace: unknown body {body!r}. Fix: use one of {list(self.model.names)}."
                )
            return self.model.names.index(body)
        if not 0 <= int(body) < self.model.nb:
            raise ValueError(
                f"JointSpace: body {body} is not in [0, {self.model.nb}). Fix: index a body."
            )
        return int(body)

    def _velocity_map(self, state):
        qpos = self.positions(state)
        frames = self._frames()
        return qpos, lambda qvel: self._body_velocities(qpos, qvel, frames)[1]

    def jacobian(self, state: State, body, point_body=(0.0, 0.0, 0.0)):
        """Geometric Jacobian (6, nv) of a body point: rows 0–2 its world velocity, rows 3–5
        the body's world angular velocity, per unit joint velocity (MuJoCo's mj_jac)."""
        b = self._body(body)
        qpos, umap = self._velocity_map(state)
        s = jnp.asarray(point_body, qpos.dtype)

        def twist(qvel):
            u = umap(qvel)
            a = state.q[b, 3:7]
            w = _qrot(a, u[b, 4:7])
            return jnp.concatenate([u[b, 0:3] + jnp.cross(w, _qrot(a, s)), w])

        return jax.jacfwd(twist)(jnp.zeros(self.nv, qpos.dtype))

    def _body_jacobian(self, state):
        qpos, umap = self._velocity_map(state)

        def vw(qvel):
            u = umap(qvel)
            return jnp.concatenate([u[:, 0:3], u[:, 4:7]], axis=1).reshape(-1)

        return qpos, jax.jacfwd(vw)(jnp.zeros(self.nv, qpos.dtype))

    def _body_mass(self):
        m = self.model
        blocks = []
        for b in range(m.nb):
            blocks.append(
                jax.scipy.linalg.block_diag(
                    m.mass[b] * jnp.eye(3, dtype=m.inertia.dtype), m.inertia[b]
                )
            )
        return jax.scipy.linalg.block_diag(*blocks)

    def mass_matrix(self, state: State):
        """Joint-space mass matrix Jᵀ M J (nv, nv), J = ∂(v, ω)/∂q̇ (MuJoCo's mj_fullM)."""
        _, jac = self._body_jacobian(state)
        return jac.T @ self._body_mass() @ jac

    def _drift(self, state: State, qvel):
        """Body accelerations at zero joint acceleration, u̇₀ = J̇ q̇ (nb, 6) = (a of the centre
        of mass, ω̇ in body axes), by the velocity-product recursion along the tree
        (Featherstone 2008 §5.3, written for world vectors). Per edge parent p → child c with
        ω_rel = ω_c − ω_p and the joint-point levers ρ = R s̄ (body-fixed, ρ̈ = α × ρ + ω × (ω × ρ)):

            α_c = α_p + ω_p × ω_rel  (+ θ̇₁θ̇₂ z_i × z_j, signed, for a Universal joint),
            a_c = a_p + ρ̈_p + δ̈ − ρ̈_c,   δ = ±x e the slide along its owner's axis e,
            δ̈ = ±(2ẋ ω_o × e + x (α_o × e + ω_o × (ω_o × e))).
        """
        dtype = state.q.dtype
        q, u = state.q, state.u
        frames = self._frames()
        zero = jnp.zeros(3, dtype)
        omega = {b: _qrot(q[b, 3:7], u[b, 4:7]) for b in range(self.model.nb)}
        alpha = {b: zero for b in self.free}
        # a free body's origin p = r + ρ does not accelerate (p̈ = 0, ω̇ = 0): r̈ = −ω × (ω × ρ)
        acc = {
            b: -jnp.cross(omega[b], jnp.cross(omega[b], self._lever(b, q[b, 3:7])))
            for b in self.free
        }
        omega[GROUND], alpha[GROUND], acc[GROUND] = zero, zero, zero

        def lever(b, s):
            return zero if b == GROUND else _qrot(q[b, 3:7], s)

        def rho_ddot(b, r):
            return jnp.cross(alpha[b], r) + jnp.cross(omega[b], jnp.cross(omega[b], r))

        def world(b, v):
            return v if b == GROUND else _qrot(q[b, 3:7], v)

        for k, parent, child, rev in self.order:
            joint = self.model.joints[k]
            kind = _KINDS[type(joint)][0]
            i, j = self.model.topology.joint_bodies[k]
            _, fj, si, sj = frames[k]
            o, v = self._offset(("joint", k))
            rates = qvel[v : v + _KINDS[type(joint)][2]]
            w_p, w_c = omega[parent], omega[child]
            a_rel = jnp.cross(w_p, w_c - w_p)
            if kind == "universal":
                sign = -1.0 if rev else 1.0
                zi = world(i, joint.z_i / jnp.linalg.norm(joint.z_i))
                zj = world(j, joint.z_j / jnp.linalg.norm(joint.z_j))
                a_rel = a_rel + sign * rates[0] * rates[1] * jnp.cross(zi, zj)
            alpha[child] = alpha[parent] + a_rel
            s_p, s_c = (sj, si) if rev else (si, sj)
            r_p, r_c = lever(parent, s_p), lever(child, s_c)
            slide = jnp.zeros(3, dtype)
            if kind in ("prismatic", "cylindrical"):
                x = self._joint_coordinates(k, q, frames)[-1]
                xdot = rates[-1]
                e = world(i, joint.z_i / jnp.linalg.norm(joint.z_i))  # owned by body i
                owner = i
                sign = -1.0 if rev else 1.0
                w_o, a_o = omega[owner], alpha[owner]
                slide = sign * (
                    2.0 * xdot * jnp.cross(w_o, e)
                    + x * (jnp.cross(a_o, e) + jnp.cross(w_o, jnp.cross(w_o, e)))
                )
            acc[child] = acc[parent] + rho_ddot(parent, r_p) + slide - rho_ddot(child, r_c)
        return jnp.stack(
            [jnp.concatenate([acc[b], _qrot_t(q[b, 3:7], alpha[b])]) for b in range(self.model.nb)]
        )

    def inverse_dynamics(self, state: State, qacc):
        """Joint forces τ (nv,) that give the joint accelerations ``qacc`` at ``state`` under
        gravity alone: τ = Jᵀ(M u̇ − f_g + (0, ω × Θω)), u̇ = J q̈ + J̇ q̇ (Newton–Euler per body,
        J̇ q̇ by :meth:`_drift`; the applied forces of the model are not included, as in
        MuJoCo's mj_rne)."""
        m = self.model
        qvel = self.velocities(state)
        _, jac = self._body_jacobian(state)
        qacc = jnp.asarray(qacc, jac.dtype)
        udot = jac @ qacc + self._drift(state, qvel).reshape(-1)
        w = state.u[:, 4:7]
        gyro = jnp.cross(w, jnp.einsum("bij,bj->bi", m.inertia, w))
        grav = m.mass[:, None] * m.gravity[None, :]
        load = jnp.concatenate([-grav, gyro], axis=1).reshape(-1)
        return jac.T @ (self._body_mass() @ udot + load)

    def bias(self, state: State):
        """Coriolis, centrifugal and gravity forces C(q, q̇)q̇ + g(q) (nv,): inverse dynamics
        at zero joint acceleration (MuJoCo's qfrc_bias)."""
        return self.inverse_dynamics(state, jnp.zeros(self.nv, state.q.dtype))


def _spanning_tree(model):
    """(order, free) of the default tree: the joints with coordinates in ``model.joints``
    order, grown from the ground; a body no joint reaches is free, and the tree grows on from
    it (bodies in index order)."""
    known = {GROUND}
    order, free, used = [], [], set()
    pairs = model.topology.joint_bodies

    def grow():
        changed = True
        while changed:
            changed = False
            for k, (joint, (i, j)) in enumerate(zip(model.joints, pairs, strict=True)):
                if k in used or type(joint) not in _KINDS:
                    continue
                if i in known and j not in known:
                    order.append((k, i, j, False))
                elif j in known and i not in known:
                    order.append((k, j, i, True))
                else:
                    continue
                used.add(k)
                known.add(order[-1][2])
                changed = True

    grow()
    for b in range(model.nb):
        if b not in known:
            free.append(b)
            known.add(b)
            grow()
    return order, free


def _given_parents(model, parents) -> dict[int, int]:
    """{body: joint index} of ``JointSpace(parents=...)``, checked: one entry per body, each a
    joint with coordinates that connects that body, no joint used twice."""
    parents = tuple(parents)
    if len(parents) != model.nb:
        raise ValueError(
            f"JointSpace: parents has {len(parents)} entries; the model has {model.nb} bodies "
            f"{list(model.names)}. Fix: give one per body: the joint that places it, or None "
            "(a free body)."
        )
    out: dict[int, int] = {}
    for b, p in enumerate(parents):
        if p is None:
            continue
        if isinstance(p, str):
            if p not in model.joint_names:
                raise ValueError(
                    f"JointSpace: parents[{b}] = {p!r} is not a joint of the model. Fix: use "
                    f"one of {list(model.joint_names)}, an index, or None."
                )
            k = model.joint_names.index(p)
        elif isinstance(p, (int, np.integer)) and 0 <= int(p) < len(model.joints):
            k = int(p)
        else:
            raise ValueError(
                f"JointSpace: parents[{b}] = {p!r} is not a joint index in "
                f"[0, {len(model.joints)}). Fix: give an index of model.joints, a name, or None."
            )
        joint = model.joints[k]
        if type(joint) not in _KINDS:
            raise ValueError(
                f"JointSpace: parents[{b}] is joint {model.joint_names[k]!r}, a "
                f"{type(joint).__name__}, which has no joint coordinates. Fix: place body "
                f"{model.names[b]!r} by a joint of type {sorted(c.__name__ for c in _KINDS)}."
            )
        if b not in model.topology.joint_bodies[k]:
            raise ValueError(
                f"JointSpace: parents[{b}] is joint {model.joint_names[k]!r}, which does not "
                f"connect body {model.names[b]!r}. Fix: give the joint between the body and "
                "its parent."
            )
        if k in out.values():
            raise ValueError(
                f"JointSpace: joint {model.joint_names[k]!r} places two bodies. Fix: a joint "
                "places the one body it connects to the tree."
            )
        out[b] = k
    return out


def _tree_order(model, parent_of) -> list:
    """The tree of ``parent_of`` {child: joint} in topological order ((joint, parent, child,
    reversed), ...), reversed when the child is the joint's body_i; a cycle is refused."""
    pairs = model.topology.joint_bodies
    known = {GROUND} | {b for b in range(model.nb) if b not in parent_of}
    order, pending = [], dict(parent_of)
    while pending:
        placed = []
        for b, k in pending.items():
            i, j = pairs[k]
            other = i if j == b else j
            if other in known:
                order.append((k, other, b, j != b))
                placed.append(b)
        if not placed:
            raise ValueError(
                f"JointSpace: the parents of bodies {[model.names[b] for b in pending]} form a "
                "cycle (none of them reaches the ground or a free body). Fix: let one of them "
                "be placed by a joint to the ground, or be free (None)."
            )
        for b in placed:
            known.add(b)
            del pending[b]
    return order


def _q_dot(q, u):
    """q̇ of a rigid body's (r, A) from u = (v, ν, ω): ṙ = v, Ȧ = ½ A ⊗ (0, ω) (ν = 0)."""
    a = q[3:7]
    w = jnp.concatenate([jnp.zeros(1, q.dtype), u[4:7]])
    return jnp.concatenate([u[0:3], 0.5 * _qmul(a, w)])


def _u_of(q, q_dot):
    """u = (v, 0, ω) of (q, q̇) for a unit quaternion: ω = 2 Im(A* Ȧ)."""
    w = 2.0 * _qmul(_qconj(q[3:7]), q_dot[3:7])[1:4]
    return jnp.concatenate([q_dot[0:3], jnp.zeros(1, q.dtype), w])


@validates_inputs
def joint_coordinates(model: Model, state: State, *, parents=None, origins=None):
    """(positions (nq,), velocities (nv,)) of ONE system in the coordinates of
    :class:`JointSpace` (``parents``, ``origins``: its options; default free bodies first,
    then the tree joints in ``model.joints`` order)."""
    maximal_only(model, "rbjax.joint_coordinates")
    js = JointSpace(model, parents=parents, origins=origins)
    return js.positions(state), js.velocities(state)


@validates_inputs
def state_from_joint_coordinates(
    model: Model, qpos, qvel=None, t=0.0, *, parents=None, origins=None
) -> State:
    """A consistent :class:`rbjax.State` of joint positions and velocities (the coordinates of
    :class:`JointSpace` with its options ``parents``, ``origins``): forward kinematics along
    the spanning tree; if the model closes loops, :func:`rbjax.assemble` then puts the state on
    the loop closures (the closest configuration in the kinetic-energy metric) and projects
    the velocities."""
    maximal_only(model, "rbjax.state_from_joint_coordinates")
    js = JointSpace(model, parents=parents, origins=origins)
    state = js.state(qpos, qvel, t)
    if js.loops:
        from .assembly import assemble

        state = assemble(model, state)
    return state


@validates_inputs
class JointForces(AbstractForce):
    """Generalized forces τ in the coordinates of :class:`JointSpace` (a motor on every
    joint), given by a policy ``τ = policy(t, state)`` (nv,) of ONE system: a JAX function, or
    an equinox Module whose arrays are differentiable parameters (a control law, a network).

    Each joint's share acts as the action–reaction pair a motor exerts between its two bodies,
    so its power is exactly τ_kᵀ q̇_k (the dual of :meth:`JointSpace.velocities`): a couple
    ±τ z on a revolute, ±τ₁ z_i ± τ₂ z_j on a universal, ±R_j F_j τ on a spherical joint, a
    force ±f e at the joint point of a prismatic one, both on a cylindrical one; a free body's
    share (F world, M body axes) acts on it at its ``origins`` point (MuJoCo's
    ``qfrc_applied`` of a free joint). ``parents``, ``origins``: the options of the
    :class:`JointSpace` whose coordinates τ is in (``js.parents``, ``js.origins``). With
    τ = M(q)(q̈_d + K_p e + K_d ė) + C q̇ + g (:meth:`JointSpace.mass_matrix`,
    :meth:`JointSpace.bias`) this is computed-torque control.
    """

    policy: Callable[..., Any]
    origins: Any
    parents: tuple | None = eqx.field(static=True)

    def __init__(self, policy: Callable[..., Any], *, parents=None, origins=None):
        if not callable(policy):
            raise ValueError(
                f"JointForces.policy = {policy!r} is not callable. Fix: pass a function "
                "policy(t, state) -> tau of shape (nv,) (the JointSpace velocity coordinates)."
            )
        self.policy = policy
        self.parents = None if parents is None else tuple(parents)
        self.origins = origins

    def wrench(self, model, t, state: State) -> Wrench:
        js = JointSpace(model, parents=self.parents, origins=self.origins)
        dtype = state.q.dtype
        tau = jnp.asarray(self.policy(t, state), dtype)
        if tau.shape != (js.nv,):
            raise ValueError(
                f"JointForces: the policy returned shape {tau.shape}; the joint space has nv = "
                f"{js.nv} velocity coordinates {js.names}. Fix: return one number per coordinate."
            )
        q = state.q
        frames = js._frames()
        out = Wrench.zeros(model.nb, dtype)

        def couple(out, b, torque):
            return out if b == GROUND else out.add_couple(b, q[b, 3:7], torque)

        def push(out, b, point, force):
            if b == GROUND:
                return out
            a = q[b, 3:7]
            rho = _qrot_t(a, point - q[b, 0:3])
            return out.add_point_force(b, a, rho, force)

        def world(b, v):
            v = v / jnp.linalg.norm(v)
            return v if b == GROUND else _qrot(q[b, 3:7], v)

        for key, (_, v) in js._offsets:
            if key[0] == "body":  # the force at the origin point: its moment about the COM
                b = key[1]
                f = tau[v : v + 3]
                lever = _qrot_t(q[b, 3:7], js._lever(b, q[b, 3:7]))
                moment = tau[v + 3 : v + 6] + jnp.cross(lever, _qrot_t(q[b, 3:7], f))
                out = out.add(b, force_world=f, moment_body=moment)
                continue
            k = key[1]
            joint = model.joints[k]
            kind, _, nv = _KINDS[type(joint)]
            i, j = model.topology.joint_bodies[k]
            share = tau[v : v + nv]
            torque = jnp.zeros(3, dtype)
            if kind in ("revolute", "cylindrical"):
                torque = share[0] * world(i, joint.z_i)
            elif kind == "universal":
                torque = share[0] * world(i, joint.z_i) + share[1] * world(j, joint.z_j)
            elif kind == "spherical":
                _, fj, _, _ = frames[k]
                a_j = fj if j == GROUND else _qmul(q[j, 3:7], fj)
                torque = _qrot(a_j, share)
            out = couple(couple(out, j, torque), i, -torque)
            if kind in ("prismatic", "cylindrical"):
                force = share[-1] * world(i, joint.z_i)
                p_j = joint.s_j if j == GROUND else q[j, 0:3] + _qrot(q[j, 3:7], joint.s_j)
                out = push(push(out, j, p_j, force), i, p_j, -force)
        return out
