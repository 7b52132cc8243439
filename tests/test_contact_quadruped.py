"""A real quadruped standing (issue 38 §5): Google's Barkour v0 as MuJoCo ships it for MJX's
tests (tests/data/barkour_v0.xml: its bodies, inertials, joints, actuators and foot spheres
unchanged, its visual meshes left out and its height field replaced by the plane the file
carries commented out; tests/data/README.md), its 12 limited joints with armature and
damping, held by its own position actuators (kp 35, kd 0.65, ±18 N·m) at the "standing"
keyframe's controls, 5 s at the file's 2 ms step. Nobody here wrote the robot."""

from __future__ import annotations

import warnings
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import rbjax

mujoco = pytest.importorskip("mujoco")
FILE = Path(__file__).parent / "data" / "barkour_v0.xml"
STEPS = 2500  # 5 s at the file's 2 ms


def _scene(tmp_path, options=None):
    """The file, or a copy with MuJoCo's solver options replaced by ``options``."""
    if options is None:
        return FILE
    path = tmp_path / "barkour_hard.xml"
    path.write_text(FILE.read_text().replace('iterations="1" ls_iterations="4"', options))
    return path


def _feet(mjm, qpos):
    """The foot spheres' centres (T, 4, 3) at each qpos, by MuJoCo's own kinematics."""
    feet = [i for i in range(mjm.ngeom) if mjm.geom_contype[i] == 1]
    d, out = mujoco.MjData(mjm), []
    for q in np.atleast_2d(qpos):
        d.qpos[:] = q
        mujoco.mj_kinematics(mjm, d)
        out.append(d.geom_xpos[feet].copy())
    return np.array(out), float(mjm.geom_size[feet[0], 0])


def _mujoco(path):
    mjm = mujoco.MjModel.from_xml_path(str(path))
    d = mujoco.MjData(mjm)
    mujoco.mj_resetDataKeyframe(mjm, d, mjm.key("standing").id)
    qs = []
    for _ in range(STEPS):
        mujoco.mj_step(mjm, d)
        qs.append(d.qpos.copy())
    depth = max([-c.dist for c in d.contact[: d.ncon]] + [0.0])
    return np.array(qs), depth


def test_the_barkour_quadruped_stands_as_mujoco_does_with_hard_friction(tmp_path):
    """rbjax (perfect contact and Coulomb friction, μ = 1, Moreau–Jean) against MuJoCo on the
    same file, 5 s from the keyframe (it drops 3 cm and settles):

    * rbjax: no foot below the floor at any step (MuJoCo's kinematics of rbjax's states:
      ≥ −1e-9 m), at rest at the end (1e-3), the feet still after 1 s (Coulomb: they carry
      |P_T|/P_N ≈ 0.3 < μ, so they stick; 1e-4 m). A foot rests 0 to 0.1 mm above the floor
      (measured 0.01–0.09 mm): a contact closes when the free motion would cross the floor
      within the step, and the actuators drive a free foot at up to ~0.1 m/s
      (rbjax/_contact/stepping.py's closing rule).
    * MuJoCo with friction made hard (elliptic cone, impratio 100, 100 iterations): the same
      stance, feet within 1 mm, joints within 2e-3 rad, base height within its soft sink
      (0.59 mm, measured) plus rbjax's hover.
    * MuJoCo with the file's own options (pyramidal cone, impratio 1, one iteration): its
      regularised friction lets loaded feet creep; they splay by more than 5 mm between 1 and
      5 s (8.7 mm, measured) and the base sinks, where Coulomb's law holds them (rbjax).

    And the feet's contact Jacobian W (closed form) is MuJoCo's ``mj_jac`` at the contact
    points to 1e-12, in a posture turned away from the stance."""
    path = _scene(tmp_path)
    mjm = mujoco.MjModel.from_xml_path(str(path))
    key = mjm.key("standing")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = rbjax.load(path, contacts=True, qpos=key.qpos, control=key.ctrl)
    left_out = "\n".join(str(w.message) for w in caught)
    assert "contact" not in left_out and "limit" not in left_out, left_out  # only sensors
    model = loaded.model
    assert model.contacts.count == 4 and model.limits.count == 12
    traj = rbjax.rollout(model, loaded.state, 0.002, STEPS, integrator=rbjax.MoreauJean())
    assert int(traj.result) == 0
    q, v = np.asarray(traj.qpos), np.asarray(traj.qvel)
    feet, radius = _feet(mjm, q[::5])
    gaps = feet[:, :, 2] - radius
    assert gaps.min() >= -1e-9
    assert 0.0 <= gaps[-1].min() and gaps[-1].max() <= 1e-4
    assert np.max(np.abs(v[-1])) <= 1e-3
    np.testing.assert_allclose(feet[-1, :, :2], feet[100, :, :2], atol=1e-4)  # 1 s .. 5 s

    hard, hard_depth = _mujoco(
        _scene(tmp_path, 'iterations="100" ls_iterations="50" cone="elliptic" impratio="100"')
    )
    hard_feet, _ = _feet(mjm, hard[-1])
    np.testing.assert_allclose(feet[-1, :, :2], hard_feet[0, :, :2], atol=1e-3)
    np.testing.assert_allclose(q[-1, 7:], hard[-1, 7:], atol=2e-3)
    assert 0.0 <= q[-1, 2] - hard[-1, 2] <= hard_depth + 1e-4

    # the contact Jacobian in closed form (rbjax/_tree/bodies.py point_jacobian) against
    # MuJoCo's mj_jac at the contact points, in a posture away from the stance
    posture = q[-1].copy()
    posture[3:7] = np.array([0.9, 0.1, -0.2, 0.3]) / np.linalg.norm([0.9, 0.1, -0.2, 0.3])
    posture[7:] += np.random.default_rng(0).uniform(-0.4, 0.4, 12)
    _, W = model.contacts.gaps_and_jacobian(model, jnp.asarray(posture))
    feet_now, _ = _feet(mjm, posture)
    d = mujoco.MjData(mjm)
    d.qpos[:] = posture
    mujoco.mj_forward(mjm, d)
    frame = np.asarray(model.contacts.frame)  # rows n, t1, t2 of the plane
    for k, geom in enumerate(i for i in range(mjm.ngeom) if mjm.geom_contype[i] == 1):
        jacp = np.zeros((3, mjm.nv))
        point = feet_now[0, k] - radius * frame[0]
        mujoco.mj_jac(mjm, d, jacp, None, point, mjm.geom_bodyid[geom])
        np.testing.assert_allclose(np.asarray(W[k]), frame @ jacp, atol=1e-12)

    soft, _ = _mujoco(path)
    soft_feet, _ = _feet(mjm, soft[[499, -1]])
    assert np.max(np.abs(soft_feet[1, :, :2] - soft_feet[0, :, :2])) > 5e-3
    assert soft[-1, 2] < q[-1, 2] - 3e-3
