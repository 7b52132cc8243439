"""``rbjax.load(path, contacts=True)`` (rbjax/_io/mujoco_contacts.py) against MuJoCo on the same
MJCF: a box dropped tilted and spinning onto the floor comes to rest on the same face, at the
same height to within MuJoCo's soft-contact sink, a cube turned on a cube rests as MuJoCo's
does (and exactly), and where MuJoCo's geoms give rbjax nothing to simulate the one warning
says so."""

from __future__ import annotations

import warnings
from pathlib import Path

import mujoco
import numpy as np
import pytest

import rbjax

HALF = (0.1, 0.075, 0.05)
SCENE = f"""<mujoco>
  <option timestep="0.001" cone="elliptic" integrator="Euler"/>
  <worldbody>
    <geom name="floor" type="plane" size="5 5 0.1" friction="0.5 0 0" condim="3"/>
    <body name="box" pos="0 0 0.3" quat="0.9811 0.1700 0.0858 0.0149">
      <freejoint/>
      <geom type="box" size="{HALF[0]} {HALF[1]} {HALF[2]}" mass="1" friction="0.3 0 0" condim="3"/>
    </body>
  </worldbody>
</mujoco>"""


def test_a_dropped_box_rests_as_mujocos_does(tmp_path):
    """Released 0.3 m up, tilted and spinning (1 rad/s, 0.5 m/s sideways), μ = max(0.5, 0.3):
    rbjax (perfect contact, Moreau–Jean) and MuJoCo (soft contact) both bring it to rest on its
    largest face within 1.5 s; the rest heights agree to MuJoCo's sink (1 mm); rbjax's box
    rests on the floor (0 to g h²/2 above it), level to within that over its width."""
    path = tmp_path / "box.xml"
    path.write_text(SCENE)
    mjm = mujoco.MjModel.from_xml_path(str(path))
    qvel = np.array([0.5, 0.0, 0.0, 0.0, 1.0, 0.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is left out: no warning
        loaded = rbjax.load(path, qvel=qvel, contacts=True)
    model = loaded.model
    assert model.contacts.count == 8
    np.testing.assert_allclose(np.asarray(model.contacts.mu), 0.5)
    steps = 1500
    traj = rbjax.rollout(model, loaded.state, 1e-3, steps, integrator=rbjax.MoreauJean())
    q, v = np.asarray(traj.qpos), np.asarray(traj.qvel)
    d = mujoco.MjData(mjm)
    d.qvel[:] = qvel
    mq, mv = [], []
    for _ in range(steps):
        mujoco.mj_step(mjm, d)
        mq.append(d.qpos.copy())
        mv.append(d.qvel.copy())
    mq, mv = np.array(mq), np.array(mv)
    for name, qq, vv in (("rbjax", q, v), ("MuJoCo", mq, mv)):
        assert np.max(np.abs(vv[-100:])) < 1e-2, name  # at rest
        R = np.zeros(9)
        mujoco.mju_quat2Mat(R, qq[-1, 3:7] / np.linalg.norm(qq[-1, 3:7]))
        assert abs(R.reshape(3, 3)[2, 2]) > 0.999, name  # on its largest (z) face
    assert abs(q[-1, 2] - mq[-1, 2]) <= 1e-3
    # above the floor by at most g h²/2: a contact closes when the end-of-step gap the free
    # motion predicts is ≤ 0 (rbjax/_contact/stepping.py); never below it (the projection)
    assert 0.0 <= q[-1, 2] - HALF[2] <= 0.5 * 9.81 * 1e-3**2
    R = np.zeros(9)
    mujoco.mju_quat2Mat(R, q[-1, 3:7])
    # level to the corners' hover difference, g h²/2 over the box's 0.15 m width
    assert np.arccos(min(1.0, abs(R.reshape(3, 3)[2, 2]))) <= 0.5 * 9.81 * 1e-3**2 / 0.15


def test_what_contacts_leave_out_is_named(tmp_path):
    """Two boxes that can hit each other, and a cylinder: the plane contacts of the boxes and
    the box–box pair are simulated, the cylinder is named in the warning; contacts=True in
    maximal coordinates is refused with the fix."""
    xml = SCENE.replace(
        "</worldbody>",
        """<body name="other" pos="0.5 0 0.3"><freejoint/><geom type="box" size="0.05 0.05 0.05"/>
        <geom name="can" type="cylinder" size="0.03 0.05" pos="0 0 0.1"/></body></worldbody>""",
    )
    path = tmp_path / "two.xml"
    path.write_text(xml)
    with pytest.warns(UserWarning) as caught:
        loaded = rbjax.load(path, contacts=True)
    text = "\n".join(str(w.message) for w in caught)
    assert "contacts of geoms ['can']" in text and "pair" not in text
    # 8 corners of each box on the plane, 26 candidates for the box pair
    assert loaded.model.contacts.count == 16 + 26
    with pytest.raises(ValueError, match="contacts=True needs joint coordinates"):
        rbjax.load(path, contacts=True, formulation=rbjax.ScalableDAE())


STACK = Path(__file__).parent / "data" / "cube_stack.xml"


def test_a_cube_turned_on_a_cube_rests_exactly_and_as_mujocos_does():
    """A cube dropped 1 cm onto a cube on the floor, turned by 0.5 rad and off centre, rests on
    the octagon of their faces' overlap (rbjax/_contact/narrow.py's box–box polygon): rbjax
    brings both to rest (1e-9 m/s) at heights h and 3h to 1e-9 m (the projection leaves no
    depth) and keeps the turn; MuJoCo on the same file rests them at the same heights less its
    soft sink (1 mm) and the same turn (1e-3 rad)."""
    path = STACK
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = rbjax.load(path, contacts=True)
    steps = 600
    traj = rbjax.rollout(loaded.model, loaded.state, 1e-3, steps, integrator=rbjax.MoreauJean())
    assert int(traj.result) == 0
    q1, v1 = np.asarray(traj.qpos)[-1], np.asarray(traj.qvel)[-1]
    np.testing.assert_allclose(v1, 0.0, atol=1e-9)
    np.testing.assert_allclose(q1[[2, 9]], [0.1, 0.3], atol=1e-9)
    turn = lambda q: 2 * np.arctan2(q[3], q[0])  # noqa: E731  (about z)
    np.testing.assert_allclose(turn(q1[10:14]), 0.5, atol=1e-6)
    mjm = mujoco.MjModel.from_xml_path(str(path))
    d = mujoco.MjData(mjm)
    for _ in range(steps):
        mujoco.mj_step(mjm, d)
    np.testing.assert_allclose(d.qpos[[2, 9]], [0.1, 0.3], atol=1e-3)
    assert np.max(np.abs(d.qvel)) < 1e-2
    np.testing.assert_allclose(turn(d.qpos[10:14]), 0.5, atol=1e-3)


PENDULUM = """<mujoco>
  <option timestep="0.001" integrator="Euler"/>
  <worldbody>
    <body name="rod">
      <joint name="hinge" type="hinge" axis="0 1 0" limited="true" range="-17.1887 114.59"/>
      <geom type="capsule" fromto="0 0 0 0 0 -1" size="0.02" mass="1" contype="0" conaffinity="0"/>
    </body>
  </worldbody>
</mujoco>"""


def test_a_hinge_limit_loads_and_stops_the_pendulum_as_mujoco_does(tmp_path):
    """A limited hinge (range −0.3 to 2 rad, in degrees in the file) loads with contacts=True
    as a JointModel limit, not as a warning; released at 1 rad the pendulum stops on it, never
    passing it (rbjax: to 1e-9 rad; MuJoCo's soft limit overshoots to −0.324, measured), and
    both swing back to about the limit's mirror angle 0.3 rad (rbjax's plastic stop: 0.29999;
    MuJoCo's soft one is a little elastic: 0.340)."""
    path = tmp_path / "pendulum.xml"
    path.write_text(PENDULUM)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = rbjax.load(path, qpos=[1.0], contacts=True)
    limits = loaded.model.limits
    np.testing.assert_allclose(np.asarray(limits.lower), [-0.3], atol=1e-5)
    np.testing.assert_allclose(np.asarray(limits.upper), [2.0], atol=1e-4)
    steps = 3000
    traj = rbjax.rollout(loaded.model, loaded.state, 1e-3, steps, integrator=rbjax.MoreauJean())
    theta = np.asarray(traj.qpos)[:, 0]
    mjm = mujoco.MjModel.from_xml_path(str(path))
    d = mujoco.MjData(mjm)
    d.qpos[0] = 1.0
    mj = []
    for _ in range(steps):
        mujoco.mj_step(mjm, d)
        mj.append(d.qpos[0])
    mj = np.array(mj)
    lo = float(limits.lower[0])
    assert theta.min() >= lo - 1e-9 and lo - 0.05 < mj.min() < lo + 1e-3
    for angles in (theta, mj):
        hit = np.argmax(angles <= lo + 0.01)
        assert abs(angles[hit + 100 :].max() - 0.3) <= 0.1
