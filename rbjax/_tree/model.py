"""A kinematic tree in joint coordinates: :class:`JointModel`, its :class:`JointState` and the
:class:`JointCoordinates` formulation.

The state is MuJoCo's (qpos, qvel): hinge and slide coordinates, ball and free joints as a
position and a quaternion (rbjax/_tree/topology.py). The equations of motion are
M(q) q̈ = τ(t, q, q̇) − b(q, q̇) (rbjax/_tree/dynamics.py), with τ the joints' passive forces
(damping −b q̇, stiffness −k (q − q_spring)), the actuators, gravity compensation and the
user's generalized forces.

The quaternions of ball and free joints follow seed 000's treatment of a body's attitude: the
kinematics q̇ = ½ q ⊗ (0, ω) has the scaling rate ν = 0, so |q| is a first integral of the
exact flow, and every function of the configuration reads the rotation of q/|q| (the rotation
of the scalable body, Möller & Glocker 2012, eq. (23)). The drift of |q| an explicit integrator
leaves (RK4: O(h⁴)) therefore changes no force and no acceleration; nothing renormalises it.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._abstract import AbstractModel, AbstractState
from .._contact.limits import LimitRows, limit_rows
from .._contact.shapes import ContactPoints, Contacts
from .._engine.kernels import cross
from .._errors import checked_array, fail, is_concrete
from .bodies import natural_body_com, natural_body_poses, natural_body_velocities
from .dynamics import (
    bias_from,
    body_inertias,
    mass_matrix_from,
    qpos_rate,
    solve_spd,
)
from .equality import AbstractEquality, constrained_solve, constraint_rhs
from .forces import nonconservative_forces, spring_forces
from .kinematics import frames, motion_subspace
from .topology import BALL, FREE, HINGE, SLIDE, TreeTopology, build


class JointCoordinates(eqx.Module):
    """The joint-coordinate formulation of a tree (:class:`JointModel`): MuJoCo's qpos/qvel as
    the state, the composite-rigid-body mass matrix factored by Cholesky and the recursive
    Newton–Euler bias forces (Featherstone 2008, §6.2, §5.3; rbjax/_tree/dynamics.py).

    The engine's fast path: ``_engine_derivatives(model, t, q, u)`` on component-first
    q (nq, ...), u (nv, ...) returns (q̇, q̈, λ): λ (..., m) the equalities' multipliers,
    one column per equality row in ``model.equalities`` order (:meth:`JointModel.solve`;
    (..., 0) without equalities), batch-leading as a maximal formulation's (what
    ``rollout(..., multipliers=True)`` saves; an integrator's step discards it)."""

    def _engine_derivatives(self, model, t, q, u):
        # the engine's arrays end in a unit axis (where a maximal model has its bodies):
        # dropped here, so that the batch is the minor axis XLA vectorises over (with the
        # unit axis minor, the humanoid ran 2.5x slower per system at B = 64)
        q, u, t = q[..., 0], u[..., 0], t[..., 0]
        qd = qpos_rate(model.topology, q, u)
        if not model.equalities:
            lam = jnp.zeros(q.shape[1:] + (0,), q.dtype)
            return qd[..., None], model.accelerations(t, q, u)[..., None], lam
        M, b = model.mass_and_bias(q, u)
        ud, lam = model.solve(M, model.generalized_forces(t, q, u) - b, q, u)
        return qd[..., None], ud[..., None], jnp.moveaxis(lam, 0, -1)


class _Bound(eqx.Module):
    """The formulation as the engine's integrators call it (with the tree's topology)."""

    topology: TreeTopology = eqx.field(static=True)
    options: JointCoordinates

    def _engine_kinematics(self, q, u):
        return qpos_rate(self.topology, q, u)

    def _engine_derivatives(self, model, t, q, u):
        return self.options._engine_derivatives(model, t, q, u)


def _unit_rows(x, floor: float):
    """x / max(|x|, floor) row by row; by NumPy when x is concrete (no compiled op)."""
    if is_concrete(x):
        a = np.asarray(x)
        with np.errstate(divide="ignore", invalid="ignore"):  # as jnp: a zero row is NaN
            unit = a / np.maximum(np.linalg.norm(a, axis=-1, keepdims=True), floor)
        return jnp.asarray(unit, dtype=x.dtype)
    return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), floor)


class JointModel(AbstractModel):
    """A tree of rigid bodies in joint coordinates (module docstring; an
    :class:`rbjax.AbstractModel`).

    Bodies (nb): ``names``, ``parent`` (index of an earlier body, −1 the world), ``body_pos``
    (nb, 3) and ``body_quat`` (nb, 4, scalar first) the body frame in its parent's at zero
    joint displacement (not used for a body with a free joint, whose pose is its qpos, as in
    MuJoCo), ``mass`` (nb,), ``com`` (nb, 3) the centre of mass in body axes,
    ``inertia`` (nb, 3, 3) about the centre of mass in body axes. Joints (nj, in body order,
    each body's in the order they act): ``joint_types`` ("hinge", "slide", "ball", "free"),
    ``joint_body``, ``joint_names``, ``joint_pos`` (nj, 3) the point a rotation turns about and
    ``joint_axis`` (nj, 3) the unit hinge/slide axis, both in the frame the joint acts in;
    ``qpos0`` (nq,) the coordinates at zero displacement. Passive forces: ``damping`` and
    ``armature`` (nv,), ``stiffness`` (nj,) about ``qpos_spring`` (nq,); ``gravcomp`` (nb,) the
    share of each body's weight a force −gravcomp·m·g cancels. ``actuators``: pairs (joint
    index of a hinge or slide, :class:`rbjax.Actuator` or :class:`rbjax.JointActuators`).
    ``forces``: functions τ(t, qpos, qvel) -> (nv,) of ONE system, added to the generalized
    forces (a JAX function or an equinox Module whose arrays are parameters). ``contacts``: an
    :class:`rbjax.Contacts` (shapes on the bodies against a plane, friction, restitution),
    simulated by :class:`rbjax.MoreauJean` only (the smooth integrators refuse such a model).
    ``limits``: {hinge or slide joint name: (lo, hi)}, the coordinate's range held as perfect
    unilateral constraints (rbjax/_contact/limits.py) with restitution ``limit_restitution``
    (default 0, a plastic stop), by :class:`rbjax.MoreauJean` too.

    Every array is a differentiable leaf (the contacts' friction and restitution too); the
    structure is static.
    """

    topology: TreeTopology = eqx.field(static=True)
    body_pos: Float[Array, "nb 3"]
    body_quat: Float[Array, "nb 4"]
    mass: Float[Array, " nb"]
    com: Float[Array, "nb 3"]
    inertia: Float[Array, "nb 3 3"]
    joint_pos: Float[Array, "nj 3"]
    joint_axis: Float[Array, "nj 3"]
    qpos0: Float[Array, " nq"]
    damping: Float[Array, " nv"]
    armature: Float[Array, " nv"]
    stiffness: Float[Array, " nj"]
    qpos_spring: Float[Array, " nq"]
    gravcomp: Float[Array, " nb"]
    gravity: Float[Array, "3"]
    actuators: tuple
    actuator_joints: tuple[int, ...] = eqx.field(static=True)
    forces: tuple
    equalities: tuple
    baumgarte: tuple | None
    options: JointCoordinates
    contacts: ContactPoints | None
    limits: LimitRows | None

    def __init__(
        self,
        *,
        names,
        parent,
        body_pos,
        body_quat,
        mass,
        com,
        inertia,
        joint_types,
        joint_body,
        joint_names=None,
        joint_pos=None,
        joint_axis=None,
        qpos0=None,
        damping=None,
        armature=None,
        stiffness=None,
        qpos_spring=None,
        gravcomp=None,
        gravity=(0.0, 0.0, -9.81),
        actuators=(),
        forces=(),
        equalities=(),
        baumgarte=None,
        formulation: JointCoordinates | None = None,
        contacts: Contacts | None = None,
        limits: dict | None = None,
        limit_restitution: float = 0.0,
    ):
        nj = len(joint_types)
        joint_names = (
            tuple(f"joint{j}" for j in range(nj)) if joint_names is None else tuple(joint_names)
        )
        topo = build(names, parent, joint_names, tuple(joint_types), tuple(joint_body))
        nb, nq, nv = topo.nb, topo.nq, topo.nv
        fix = "give one row per body / joint / coordinate (JointModel's docstring)"
        self.topology = topo
        self.body_pos = checked_array("body_pos", body_pos, (nb, 3), fix)
        quat = checked_array("body_quat", body_quat, (nb, 4), fix)
        self.body_quat = _unit_rows(quat, 0.0)
        self.mass = checked_array("mass", mass, (nb,), fix)
        self.com = checked_array("com", com, (nb, 3), fix)
        self.inertia = checked_array("inertia", inertia, (nb, 3, 3), fix)
        zeros = lambda *s: np.zeros(s)  # noqa: E731
        self.joint_pos = checked_array(
            "joint_pos", zeros(nj, 3) if joint_pos is None else joint_pos, (nj, 3), fix
        )
        axis = checked_array(
            "joint_axis",
            np.tile([0.0, 0.0, 1.0], (nj, 1)) if joint_axis is None else joint_axis,
            (nj, 3),
            fix,
        )
        norms = np.linalg.norm(np.asarray(axis), axis=-1) if is_concrete(axis) else None
        if norms is not None:
            for j, k in enumerate(topo.joint_types):
                if k in (HINGE, SLIDE) and not norms[j] > 0:
                    fail(
                        f"joint_axis[{j}]",
                        np.asarray(axis[j]),
                        "is zero",
                        "give the joint's axis direction",
                    )
        self.joint_axis = _unit_rows(axis, 1e-300)
        if qpos0 is None:
            qpos0 = np.zeros(nq)
            for j, k in enumerate(topo.joint_types):
                a = topo.qposadr[j]
                if k == BALL:
                    qpos0[a] = 1.0
                elif k == FREE:
                    qpos0[a + 3] = 1.0
        self.qpos0 = checked_array("qpos0", qpos0, (nq,), fix)
        self.damping = checked_array(
            "damping", zeros(nv) if damping is None else damping, (nv,), fix
        )
        self.armature = checked_array(
            "armature", zeros(nv) if armature is None else armature, (nv,), fix
        )
        self.stiffness = checked_array(
            "stiffness", zeros(nj) if stiffness is None else stiffness, (nj,), fix
        )
        self.qpos_spring = checked_array(
            "qpos_spring", self.qpos0 if qpos_spring is None else qpos_spring, (nq,), fix
        )
        self.gravcomp = checked_array(
            "gravcomp", zeros(nb) if gravcomp is None else gravcomp, (nb,), fix
        )
        self.gravity = checked_array("gravity", gravity, (3,), fix)
        acts, joints = [], []
        for k, pair in enumerate(actuators):
            j, act = pair
            if not (0 <= int(j) < nj) or topo.joint_types[int(j)] not in (HINGE, SLIDE):
                raise ValueError(
                    f"actuators[{k}] acts on joint {j}, which is not a hinge or slide of this "
                    "model. Fix: give the index of a hinge or slide joint."
                )
            acts.append(act)
            joints.append(int(j))
        self.actuators = tuple(acts)
        self.actuator_joints = tuple(joints)
        for k, f in enumerate(forces):
            if not callable(f):
                raise ValueError(
                    f"forces[{k}] = {f!r} is not callable. Fix: pass functions "
                    "tau(t, qpos, qvel) -> (nv,) of one system."
                )
        self.forces = tuple(forces)
        for k, e in enumerate(equalities):
            if not isinstance(e, AbstractEquality):
                raise ValueError(
                    f"equalities[{k}] = {type(e).__name__} is not an equality of a tree. Fix: "
                    "pass rbjax.Connect, rbjax.Weld or rbjax.JointCoupling."
                )
            e.check(topo)
        self.equalities = tuple(equalities)
        if baumgarte is not None:
            if np.shape(baumgarte) != (2,) or not np.all(np.isfinite(baumgarte)):
                fail(
                    "JointModel.baumgarte",
                    baumgarte,
                    "is not two finite numbers",
                    "pass e.g. baumgarte=(10.0, 10.0) [1/s], alpha and beta >= 0, or None",
                )
            if is_concrete(baumgarte) and not np.all(np.asarray(baumgarte) >= 0):
                fail(
                    "JointModel.baumgarte",
                    baumgarte,
                    "has a negative entry",
                    "pass alpha and beta >= 0, e.g. baumgarte=(10.0, 10.0) [1/s], or None",
                )
            dtype = jnp.result_type(float)
            baumgarte = (jnp.asarray(baumgarte[0], dtype), jnp.asarray(baumgarte[1], dtype))
        self.baumgarte = baumgarte
        self.options = JointCoordinates() if formulation is None else formulation
        if contacts is not None and not isinstance(contacts, Contacts):
            fail(
                "JointModel.contacts",
                type(contacts).__name__,
                "is not an rbjax.Contacts",
                "pass rbjax.Contacts([rbjax.Sphere(...), ...], friction=..., restitution=...)",
            )
        if (contacts is not None or limits) and self.equalities:
            fail(
                "JointModel.contacts" if contacts is not None else "JointModel.limits",
                f"{len(contacts.shapes)} shape(s)" if contacts is not None else limits,
                "cannot be combined with equalities yet (the Moreau–Jean step has no "
                "bilateral rows)",
                "remove the equalities, or simulate the contacts without them",
            )
        self.contacts = None if contacts is None else contacts.resolve(topo.names, topo.parent)
        self.limits = limit_rows(topo, limits, limit_restitution)

    # ------------------------------------------------------------------ structure
    @property
    def names(self) -> tuple[str, ...]:
        return self.topology.names

    @property
    def joint_names(self) -> tuple[str, ...]:
        return self.topology.joint_names

    @property
    def nb(self) -> int:
        return self.topology.nb

    @property
    def nq(self) -> int:
        return self.topology.nq

    @property
    def nv(self) -> int:
        return self.topology.nv

    @property
    def joints(self) -> tuple:
        """No maximal-coordinate joint equations: a tree's joints are its coordinates."""
        return ()

    @property
    def large_step(self) -> bool:
        """The engine runs a tree's RK stages in a loop and checks every step
        (rbjax/_engine/integrators.py ``large_step``): one trace of M⁻¹(τ − b) per program (humanoid, B = 64: compiled in 4.0 s at 84 µs
        per system-step, against 13.2 s at 74 µs with the stages unrolled)."""
        return True

    @property
    def formulation(self) -> _Bound:
        return _Bound(self.topology, self.options)

    # ------------------------------------------------------------------ dynamics
    def generalized_forces(self, t, qpos, qvel):
        """τ (nv, ...) of the joints' springs, dampers and actuators and the user's forces,
        component-first (qpos (nq, ...), qvel (nv, ...), t broadcastable to the batch;
        rbjax/_tree/forces.py)."""
        return spring_forces(self, qpos) + nonconservative_forces(self, t, qpos, qvel)

    def mass_and_bias(self, qpos, qvel):
        """(M (nv, nv, ...), b (nv, ...)) from one kinematics pass, component-first; b
        includes gravity compensation (the τ − b of :meth:`accelerations`)."""
        topo = self.topology
        fr = frames(topo, self, qpos)
        S = motion_subspace(topo, fr)
        inert = body_inertias(topo, self, fr)
        M = mass_matrix_from(topo, self, S, inert)
        return M, bias_from(topo, self, S, inert, qvel, _gravcomp_forces(self, inert))

    def accelerations(self, t, qpos, qvel):
        """q̈ (nv, ...) = M⁻¹(τ − b + Jᵀλ), component-first (module docstring; the
        equalities' J and λ: rbjax/_tree/equality.py)."""
        M, b = self.mass_and_bias(qpos, qvel)
        return self.solve(M, self.generalized_forces(t, qpos, qvel) - b, qpos, qvel)[0]

    def solve(self, M, rhs, qpos, qvel):
        """(q̈, λ) of M q̈ = rhs + Jᵀλ with the equalities held (λ None without any);
        component-first. M may be an implicit step's M − h D."""
        if not self.equalities:
            return solve_spd(M, rhs), None
        fr = frames(self.topology, self, qpos)
        J, r = constraint_rhs(self, qpos, qvel, fr, motion_subspace(self.topology, fr))
        return constrained_solve(M, rhs, J, r)

    def equality_forces(self, t, qpos, qvel) -> dict:
        """The multipliers λ of every equality, {name: (..., rows)} (natural layout, one
        system or batch-leading): a :class:`rbjax.Connect`'s force on its body 1 [N], a
        :class:`rbjax.Weld`'s force and torque about its point on body 1, a
        :class:`rbjax.JointCoupling`'s generalized force on its joint 1 (world axes;
        rbjax/_tree/equality.py). Minimum-norm where the equations are redundant."""
        if not self.equalities:
            return {}
        q = jnp.moveaxis(jnp.asarray(qpos), -1, 0)
        v = jnp.moveaxis(jnp.asarray(qvel), -1, 0)
        M, b = self.mass_and_bias(q, v)
        _, lam = self.solve(M, self.generalized_forces(jnp.asarray(t), q, v) - b, q, v)
        assert lam is not None
        out, k = {}, 0
        for e in self.equalities:
            out[e.name] = jnp.moveaxis(lam[k : k + e.rows], 0, -1)
            k += e.rows
        return out

    # ------------------------------------------------------------- natural layout
    def body_poses(self, qpos):
        """(xpos (..., nb, 3), xquat (..., nb, 4)) of qpos (nq,) or batch-leading (..., nq):
        every body frame's world origin and attitude (unit, scalar first, a₀ ≥ 0), MuJoCo's
        ``xpos``/``xquat`` (rbjax/_tree/bodies.py)."""
        return natural_body_poses(self, qpos)

    def body_com(self, qpos):
        """World centre of mass of every body (..., nb, 3), MuJoCo's ``xipos``."""
        return natural_body_com(self, qpos)

    def body_velocities(self, qpos, qvel):
        """(v, ω) (..., nb, 3): each body's centre-of-mass velocity and angular velocity,
        world axes (MuJoCo's ``mj_objectVelocity`` at the centre of mass)."""
        return natural_body_velocities(self, qpos, qvel)

    def mass_matrix(self, qpos):
        """M(q) (nv, nv) of one configuration qpos (nq,) (or batched (..., nq))."""
        q = jnp.moveaxis(jnp.asarray(qpos), -1, 0)
        fr = frames(self.topology, self, q)
        S = motion_subspace(self.topology, fr)
        M = mass_matrix_from(self.topology, self, S, body_inertias(self.topology, self, fr))
        return jnp.moveaxis(jnp.moveaxis(M, 1, -1), 0, -2)

    def bias(self, qpos, qvel):
        """b(q, q̇) = C(q, q̇) q̇ + g(q) (nv,), MuJoCo's ``qfrc_bias``: gravity compensation
        is not in it (a passive force, in :meth:`qacc`)."""
        q = jnp.moveaxis(jnp.asarray(qpos), -1, 0)
        v = jnp.moveaxis(jnp.asarray(qvel), -1, 0)
        fr = frames(self.topology, self, q)
        S = motion_subspace(self.topology, fr)
        b = bias_from(self.topology, self, S, body_inertias(self.topology, self, fr), v)
        return jnp.moveaxis(b, 0, -1)

    def qacc(self, t, qpos, qvel):
        """q̈ (nv,) of one system (or batched (..., nq), (..., nv) with t broadcastable)."""
        q = jnp.moveaxis(jnp.asarray(qpos), -1, 0)
        v = jnp.moveaxis(jnp.asarray(qvel), -1, 0)
        return jnp.moveaxis(self.accelerations(jnp.asarray(t), q, v), 0, -1)


def maximal_only(model, what: str) -> None:
    """ValueError naming ``what`` when ``model`` is a JointModel: the analyses that read
    bodies' maximal coordinates do not take one yet."""
    if isinstance(model, JointModel):
        raise ValueError(
            f"{what}: model is a JointModel (joint coordinates); {what} works on maximal "
            "coordinates for now. Fix: load the file in maximal coordinates for this "
            "analysis: rbjax.load(path, formulation=rbjax.ScalableDAE())."
        )


def _gravcomp_forces(model, inert):
    """Spatial forces (6, nb, ...) about O of −gravcomp·m·g at each centre of mass."""
    m, h, _ = inert
    tail = m.shape[1:]
    c = model.gravcomp.reshape((-1,) + (1,) * len(tail))
    g = model.gravity.reshape((3, 1) + (1,) * len(tail))
    force = -c * m * g  # (3, nb, ...)
    r = h / jnp.where(m == 0, 1.0, m)
    force = jnp.broadcast_to(force, r.shape)
    return jnp.concatenate([cross(r, force), force], axis=0)


class JointState(AbstractState):
    """Time and MuJoCo-style coordinates of a :class:`JointModel` (an
    :class:`rbjax.AbstractState`): ``t`` (*batch), ``qpos`` (*batch, nq), ``qvel`` (*batch,
    nv) (module docstring). Integers become the default float; qvel and t take qpos's
    dtype."""

    t: Float[Array, "*batch"]
    qpos: Float[Array, "*batch nq"]
    qvel: Float[Array, "*batch nv"]

    def __init__(self, t, qpos, qvel):
        # host input converted by NumPy (no compiled op per field), JAX arrays by jax.numpy
        xp = jnp if any(isinstance(x, jax.Array) for x in (t, qpos, qvel)) else np
        qpos = xp.asarray(qpos)
        if not xp.issubdtype(qpos.dtype, xp.floating):
            qpos = qpos.astype(jnp.result_type(float))
        self.qpos = jnp.asarray(qpos)
        self.qvel = jnp.asarray(xp.asarray(qvel, dtype=qpos.dtype))
        self.t = jnp.asarray(xp.asarray(t, dtype=qpos.dtype))


def per_joint_system(fn, model, t, q, u, *extra):
    """``fn(model, state, *extra)`` written for ONE system (a :class:`rbjax.JointState`: t (),
    qpos (nq,), qvel (nv,)) on the engine's arrays t (*batch, 1), q (nq, *batch, 1),
    u (nv, *batch, 1) and batch-first ``extra`` pytrees (*batch, ...), ``jax.vmap``-ed over
    every batch axis; outputs batch-first."""
    t, qpos, qvel = t[..., 0], jnp.moveaxis(q[..., 0], 0, -1), jnp.moveaxis(u[..., 0], 0, -1)

    def one(tt, qq, vv, *ee):
        return fn(model, JointState(tt, qq, vv), *ee)

    for _ in t.shape:
        one = jax.vmap(one)
    return one(t, qpos, qvel, *extra)
