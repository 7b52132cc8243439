"""The mechanisms the benchmarks measure, each built as a user would: ``name -> (Model, State)``.

- ``free_body``: a torque-free rigid body (no joints).
- ``pendulum_<N>``: N-link pendulum of 1 kg, 1 m rods along x, hinges about world y (N = 2 is
  the double pendulum of benchmarks/mechanisms.py).
- ``slider_crank``: the spatial slider-crank of examples/slider_crank.py with a 2 N m crank torque.
- ``arm6``: a 6-joint serial arm (hinge axes z, y, y, x, y, x like an industrial arm) with a PD
  motor on every joint: a rotational spring-damper k = 50 N m/rad, c = 2 N m s/rad towards a
  set point 0.1 rad off the start.
- ``walker``: a floating legged walker of 22 bodies: torso, neck and head, a two-segment tail,
  four legs of hip, thigh, shin and foot (revolute hips about x, revolute thighs and shins
  about y, universal ankles), and a bar held by the two front feet on spherical joints, which
  closes one loop through the torso.
- ``fourbars_<K>``: a planar linkage of K four-bar loops in series (2K + 1 bodies): a crank on a
  ground hinge, then per loop a coupler (spherical to the previous rocker, universal to the
  next, its pins the coupler's in-plane normal and the hinge direction) and a rocker on a ground hinge; 5 + 12 K joint rows, one degree of freedom. Rockers
  hang down with alternating lengths (no parallelogram, no change point) and start swinging.

``mjcf(name)`` writes the MJCF twin of ``free_body``, ``pendulum_<N>`` and ``walker`` for the
side-by-sides with MuJoCo C and MJX.
"""

from __future__ import annotations

import os
import sys

import numpy as np

import rbjax

ROD_I = np.diag([1e-3, 1.0 / 12.0, 1.0 / 12.0])
GRAVITY = [0.0, 0.0, -9.81]


def _q(positions):
    """Reference coordinates (nb, 7): bodies at ``positions``, identity orientation."""
    p = np.asarray(positions, float)
    return np.concatenate([p, np.tile([1.0, 0, 0, 0], (len(p), 1))], axis=1)


def _state(q):
    return rbjax.make_state(position=q[:, :3], quaternion=q[:, 3:])


def free_body():
    model = rbjax.Model(rbjax.Body(1.0, np.diag([1.0, 2.0, 3.0])))
    return model, rbjax.make_state(omega_body=[[0.3, 1.0, 0.2]])


def pendulum(n: int):
    q0 = _q([[k + 0.5, 0, 0] for k in range(n)])
    bodies = [rbjax.Body(1.0, ROD_I, name=f"rod{k + 1}") for k in range(n)]
    joints = [
        rbjax.Revolute.at(q0, k - 1 if k else rbjax.GROUND, k, point=[k, 0, 0], axis=[0, 1, 0])
        for k in range(n)
    ]
    return rbjax.Model(bodies, joints=joints, gravity=GRAVITY), _state(q0)


def slider_crank():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
    import slider_crank as example

    _, free, _, rest = example.mechanism()  # the mechanism without its motor, at rest
    bodies = [
        rbjax.Body(m, i, name=n)
        for m, i, n in zip(free.mass, free.inertia, free.names, strict=True)
    ]
    torque = [rbjax.BodyTorque(0, [0.0, 0.0, 2.0])]
    return rbjax.Model(bodies, joints=free.joints, forces=torque, gravity=GRAVITY), rest


ARM_AXES = ([0, 0, 1], [0, 1, 0], [0, 1, 0], [1, 0, 0], [0, 1, 0], [1, 0, 0])
ARM_LENGTHS = (0.3, 0.6, 0.5, 0.15, 0.1, 0.1)
ARM_MASSES = (8.0, 6.0, 4.0, 1.5, 1.0, 0.5)


def arm6():
    """Links stacked along z from the base, each link's centre half-way up its length."""
    tops = np.cumsum(ARM_LENGTHS)
    q0 = _q([[0.0, 0.0, t - 0.5 * ln] for t, ln in zip(tops, ARM_LENGTHS, strict=True)])
    bodies, joints, motors = [], [], []
    for k, (m, ln, axis) in enumerate(zip(ARM_MASSES, ARM_LENGTHS, ARM_AXES, strict=True)):
        i_t = m * (ln**2 / 12.0 + 0.01)
        bodies.append(rbjax.Body(m, np.diag([i_t, i_t, 0.02 * m]), name=f"link{k + 1}"))
        parent = k - 1 if k else rbjax.GROUND
        point = [0.0, 0.0, tops[k] - ln]
        joints.append(rbjax.Revolute.at(q0, parent, k, point=point, axis=axis, name=f"j{k + 1}"))
        motors.append(
            rbjax.RotationalSpringDamper.at(
                q0, parent, k, axis=axis, stiffness=50.0, damping=2.0, rest_angle=0.1
            )
        )
    return rbjax.Model(bodies, joints=joints, forces=motors, gravity=GRAVITY), _state(q0)


def walker_parts():
    """The walker as data, shared by :func:`walker` and :func:`walker_mjcf`: body names,
    positions (identity orientations) and masses, the tree joints (parent, child, kind, point,
    pins) with kind "revolute" (one pin) or "universal" (body i's pin, then body j's), and the
    loop: the bar on a ball joint at each front foot (foot, bar, point) twice."""
    pos = [[0.0, 0.0, 1.0], [0.45, 0.0, 1.15], [0.6, 0.0, 1.25], [-0.5, 0.0, 1.0]]
    pos += [[-0.7, 0.0, 1.0]]
    names = ["torso", "neck", "head", "tail1", "tail2"]
    legs = []
    for fx in (0.35, -0.35):
        for fy in (0.2, -0.2):
            k = len(pos)
            pos += [[fx, fy, 0.95], [fx, fy, 0.75], [fx, fy, 0.45], [fx + 0.05, fy, 0.2]]
            names += [f"hip{k}", f"thigh{k}", f"shin{k}", f"foot{k}"]
            legs.append(k)
    front = (legs[0] + 3, legs[1] + 3)  # the two front feet
    bar = len(pos)
    pos.append([0.4, 0.0, 0.2])
    names.append("bar")
    masses = [10.0, 1.0, 1.5, 0.5, 0.3] + [1.0, 2.0, 1.0, 0.3] * 4 + [0.4]
    x, y, z = [1, 0, 0], [0, 1, 0], [0, 0, 1]
    tree = [
        (0, 1, "revolute", [0.4, 0.0, 1.1], [y]),
        (1, 2, "revolute", [0.55, 0.0, 1.2], [z]),
        (0, 3, "universal", [-0.4, 0.0, 1.0], [y, z]),
        (3, 4, "revolute", [-0.6, 0.0, 1.0], [z]),
    ]
    for k in legs:
        px, py = pos[k][0], pos[k][1]
        tree += [
            (0, k, "revolute", [px, py, 1.0], [x]),
            (k, k + 1, "revolute", [px, py, 0.9], [y]),
            (k + 1, k + 2, "revolute", [px, py, 0.6], [y]),
            (k + 2, k + 3, "universal", [px, py, 0.3], [y, x]),
        ]
    loop = [(front[0], bar, [0.4, 0.2, 0.2]), (front[1], bar, [0.4, -0.2, 0.2])]
    return names, np.asarray(pos), masses, tree, loop


def walker():
    """22 bodies, 21 tree joints and one loop (the bar between the front feet)."""
    names, pos, masses, tree, loop = walker_parts()
    q0 = _q(pos)
    bodies = [
        rbjax.Body(m, m * np.diag([0.02, 0.03, 0.02]), name=n)
        for m, n in zip(masses, names, strict=True)
    ]
    joints = []
    for i, j, kind, point, pins in tree:
        if kind == "revolute":
            joints.append(rbjax.Revolute.at(q0, i, j, point=point, axis=pins[0]))
        else:
            joints.append(rbjax.Universal.at(q0, i, j, point=point, axis=pins[0], x=pins[1]))
    # the bar: one end on each front foot (ball joints) closes a loop through the torso
    joints += [rbjax.Spherical.at(q0, i, j, point=point) for i, j, point in loop]
    state = rbjax.make_state(
        position=q0[:, :3], quaternion=q0[:, 3:], omega_body=np.zeros((len(pos), 3))
    )
    return rbjax.Model(bodies, joints=joints, gravity=GRAVITY), state


def fourbars(k: int):
    """K four-bar loops in series in the x-z plane, hinges about world y."""
    d, lengths = 1.0, (1.0, 0.8)
    pivots = [np.array([j * d, 0.0, 0.0]) for j in range(k + 1)]
    rock = [lengths[j % 2] for j in range(k + 1)]
    tips = [pivots[j] + rock[j] * np.array([0.0, 0.0, -1.0]) for j in range(k + 1)]
    # rockers (the crank is rocker 0) at bodies 2j, couplers at 2j - 1
    pos = []
    for j in range(k + 1):
        if j:
            pos.append(0.5 * (tips[j - 1] + tips[j]))
        pos.append(0.5 * (pivots[j] + tips[j]))
    q0 = _q(pos)
    bodies = []
    for j in range(2 * k + 1):
        kind = "rocker" if j % 2 == 0 else "coupler"
        bodies.append(rbjax.Body(1.0, ROD_I, name=f"{kind}{j}"))
    joints = []
    for j in range(k + 1):
        r = 2 * j
        joints.append(rbjax.Revolute.at(q0, rbjax.GROUND, r, point=pivots[j], axis=[0, 1, 0]))
        if j:
            c = r - 1
            joints.append(rbjax.Spherical.at(q0, r - 2, c, point=tips[j - 1]))
            # pins: on the coupler its in-plane normal (so it cannot spin about its own
            # line), on the rocker the hinge direction y
            along = tips[j] - tips[j - 1]
            normal = np.cross(along, [0.0, 1.0, 0.0])
            joints.append(rbjax.Universal.at(q0, c, r, point=tips[j], axis=normal, x=[0, 1, 0]))
    model = rbjax.Model(bodies, joints=joints, gravity=GRAVITY)
    # set swinging: every rocker turning at 1 rad/s about y, then the velocities made
    # consistent with the loops (closest in the kinetic-energy metric)
    omega = np.zeros((2 * k + 1, 3))
    vel = np.zeros((2 * k + 1, 3))
    for j in range(k + 1):
        omega[2 * j, 1] = 1.0
        vel[2 * j] = np.cross(omega[2 * j], pos[2 * j] - pivots[j])
    state = rbjax.make_state(
        position=q0[:, :3], quaternion=q0[:, 3:], velocity=vel, omega_body=omega
    )
    return model, rbjax.assemble(model, state)


# ---- the same mechanisms for MuJoCo (benchmarks/elimination.py, gradients.py --mjx): MJCF,
# contacts off, RK4, dt = 1e-3. MuJoCo works in joint coordinates: each rbjax joint becomes
# the joints of one child body (a universal joint two hinges, a spherical joint a ball) and
# the walker's loop an equality ``connect`` (a soft constraint in MuJoCo, exact in rbjax).


def _mj(world: str, extra: str = "", gravity: str = "0 0 -9.81") -> str:
    return (
        f'<mujoco>\n  <option timestep="0.001" integrator="RK4" gravity="{gravity}">\n'
        '    <flag contact="disable"/>\n  </option>\n'
        f"  <worldbody>\n    {world}\n  </worldbody>\n{extra}</mujoco>\n"
    )


def _v(x) -> str:
    return " ".join(f"{float(c):.12g}" for c in x)


def pendulum_mjcf(n: int) -> str:
    """MJCF of ``pendulum_<n>``: nested rods, each hinged about y at its parent's tip."""
    inertial = f'<inertial pos="0.5 0 0" mass="1" diaginertia="{_v(np.diag(ROD_I))}"/>'
    body = ""
    for k in reversed(range(n)):
        pos = "0 0 0" if k == 0 else "1 0 0"
        body = (
            f'<body name="rod{k + 1}" pos="{pos}"><joint type="hinge" axis="0 1 0"/>'
            f"{inertial}{body}</body>"
        )
    return _mj(body)


def walker_mjcf() -> str:
    """MJCF of ``walker``: the same bodies, masses, inertias, joint points and pins; the torso
    floats (free joint), the bar hangs from the first front foot (ball joint) and an equality
    connects it to the second."""
    names, pos, masses, tree, loop = walker_parts()
    (foot, bar, point), (foot2, _, point2) = loop
    parent_of = {j: (i, kind, point, pins) for i, j, kind, point, pins in tree}
    parent_of[bar] = (foot, "ball", point, [])
    children: dict[int, list[int]] = {}
    for j, (i, *_) in parent_of.items():
        children.setdefault(i, []).append(j)

    def emit(b, origin):
        m = masses[b]
        out = (
            f'<body name="{names[b]}" pos="{_v(pos[b] - origin)}">'
            f'<inertial pos="0 0 0" mass="{m:.12g}" diaginertia="{_v(m * np.array([0.02, 0.03, 0.02]))}"/>'
        )
        if b not in parent_of:
            out += "<freejoint/>"
        else:
            _, kind, at, pins = parent_of[b]
            rel = _v(np.asarray(at) - pos[b])
            if kind == "ball":
                out += f'<joint type="ball" pos="{rel}"/>'
            for pin in pins:  # a universal joint: body i's pin, then body j's
                out += f'<joint type="hinge" pos="{rel}" axis="{_v(pin)}"/>'
        for c in sorted(children.get(b, [])):
            out += emit(c, pos[b])
        return out + "</body>"

    eq = (
        f'<equality><connect body1="{names[bar]}" body2="{names[foot2]}" '
        f'anchor="{_v(np.asarray(point2) - pos[bar])}"/></equality>'
    )
    return _mj(emit(0, np.zeros(3)), f"  {eq}\n")


def mjcf(name: str) -> str:
    """MJCF of a model of :func:`build` that MuJoCo can run side by side."""
    if name == "free_body":  # I = diag(1, 2, 3), no gravity
        body = '<body><freejoint/><inertial pos="0 0 0" mass="1" diaginertia="1 2 3"/></body>'
        return _mj(body, gravity="0 0 0")
    if name == "walker":
        return walker_mjcf()
    if name.startswith("pendulum_"):
        return pendulum_mjcf(int(name.split("_")[1]))
    raise ValueError(f"no MJCF for {name!r}")


def build(name: str):
    """``name`` -> (model, state), e.g. ``pendulum_16``, ``fourbars_40``, ``walker``."""
    if name == "free_body":
        return free_body()
    if name == "slider_crank":
        return slider_crank()
    if name == "arm6":
        return arm6()
    if name == "walker":
        return walker()
    if name.startswith("pendulum_"):
        return pendulum(int(name.split("_")[1]))
    if name.startswith("fourbars_"):
        return fourbars(int(name.split("_")[1]))
    raise ValueError(f"unknown model {name!r}")
