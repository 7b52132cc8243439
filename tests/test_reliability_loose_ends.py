"""Issue 36's loose ends: silent wrong results found while fixing the rest.

* The command line's qpos/qvel of an MJCF file were rbjax.JointSpace(model)'s (a free body's
  centre of mass, under the name "qpos"); they are MuJoCo's ``data.qpos``/``data.qvel`` now,
  checked against MuJoCo's own RK4 integration of the same file.
* A run file of a failed run could not be animated (NaN axis limits); plot and animate draw
  what precedes the failure and say which system failed where.
* Monte-Carlo sample 0 skipped the declared parameter rules that rollout checks in a value
  set with ``equinox.tree_at``: a negative stiffness was ``invalid_input`` on every sample.
* Direction vectors of 1e154 and more overflowed the norm (z = [0, 0, 0], then a misleading
  error), and float32 joint frames and flat float32 bodies were refused by float64 tolerances.
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest

import rbjax
from rbjax import GROUND
from rbjax._cli import main, quantities
from rbjax._cli.parameters import Build

mujoco = pytest.importorskip("mujoco")

# A floating base whose inertial frame is offset and rotated from its body frame (so MuJoCo's
# free-joint position, the body frame's origin, is not the centre of mass), and a hinged arm.
FLOATING = """
<mujoco model="floating">
  <option timestep="0.001" gravity="0 0 -9.81"/>
  <worldbody>
    <body name="base" pos="0 0 1">
      <freejoint name="root"/>
      <inertial pos="0.1 0.05 -0.02" quat="0.9 0.1 0.3 0.2" mass="2" diaginertia="0.1 0.2 0.25"/>
      <body name="arm" pos="0.2 0 0">
        <joint name="elbow" type="hinge" axis="0 1 0"/>
        <inertial pos="0.15 0 0" mass="0.5" diaginertia="0.001 0.01 0.01"/>
      </body>
    </body>
  </worldbody>
</mujoco>
"""
STEPS = 20


def _mujoco_rk4(path, qpos, qvel, steps):
    """MuJoCo's data after mj_forward at (qpos, qvel), and its qpos, qvel after ``steps`` RK4
    steps from there (its own integrator)."""
    m = mujoco.MjModel.from_xml_path(str(path))
    m.opt.integrator = mujoco.mjtIntegrator.mjINT_RK4
    d = mujoco.MjData(m)
    d.qpos[:], d.qvel[:] = qpos, qvel
    mujoco.mj_forward(m, d)
    start = d.xipos[1:].copy()
    for _ in range(steps):
        mujoco.mj_step(m, d)
    return start, d.qpos.copy(), d.qvel.copy()


def test_simulate_writes_mujocos_qpos_and_qvel_for_an_mjcf_file(tmp_path):
    """The run file's qpos/qvel of an MJCF file are MuJoCo's: MuJoCo placed at a sample's
    qpos, qvel at t = 0 puts the centres of mass (xipos) where the run's q has them, and its
    own RK4 from there ends, after 20 steps, at the run's last qpos and qvel (the same ODE in
    other coordinates: the two 4th-order discretisations agree to 1e-9). The perturbations
    (qpos=0.3, qvel=1) move every coordinate. The columns are named by MuJoCo's joints;
    ``meta`` says "mujoco". Before, qpos[:3] was the base's centre of mass, 0.1 m from its
    frame's origin, and qvel that point's velocity."""
    xml = tmp_path / "floating.xml"
    xml.write_text(FLOATING)
    out = tmp_path / "run.npz"
    argv = ["simulate", str(xml), "--t", str(STEPS * 1e-3), "--dt", "1e-3", "--no-reactions"]
    batch = ["--batch", "2", "--seed", "0", "--perturb", "qpos=0.3", "--perturb", "qvel=1"]
    # maximal coordinates (the bodies' q in the run file); the joint-coordinate default
    # holds MuJoCo's qpos itself (tests/test_cli_joint.py)
    batch += ["--coordinates", "maximal"]
    assert main([*argv, *batch, "--integrator", "rk4", "--out", str(out)]) == 0
    run = np.load(out)
    for s in range(2):
        assert np.all(np.abs(run["qvel"][s, 0]) > 1e-3)  # every coordinate moving
        coms, qpos1, qvel1 = _mujoco_rk4(xml, run["qpos"][s, 0], run["qvel"][s, 0], STEPS)
        np.testing.assert_allclose(run["q"][s, 0, :, :3], coms, rtol=0, atol=1e-12)
        np.testing.assert_allclose(run["qpos"][s, -1], qpos1, rtol=0, atol=1e-9)
        np.testing.assert_allclose(run["qvel"][s, -1], qvel1, rtol=0, atol=1e-8)
    free = [f"base.{c}" for c in ("x", "y", "z", "qw", "qx", "qy", "qz")]
    assert run["qpos_names"].tolist() == [*free, "elbow"]
    assert run["qvel_names"].tolist() == [f"base.{c}" for c in ("vx", "vy", "vz")] + [
        "base.wx",
        "base.wy",
        "base.wz",
        "elbow",
    ]
    assert '"coordinates": "mujoco"' in str(run["meta"])


def test_identify_builds_its_initial_state_from_mujocos_coordinates(tmp_path):
    """``rbjax identify``'s [state] qpos/qvel and joint observations are the file's own
    coordinates: its Build turns the keyframe's qpos/qvel into the loaded state itself."""
    xml = tmp_path / "floating.xml"
    xml.write_text(FLOATING)
    loaded = rbjax.load(
        str(xml), qpos=[0.1, -0.2, 1.1, 0.8, 0.2, -0.3, 0.4, 0.6], formulation=rbjax.ScalableDAE()
    )
    layout = quantities.layout(loaded)
    assert layout.kind == "mujoco"
    qpos0 = np.asarray([0.1, -0.2, 1.1, 0.8, 0.2, -0.3, 0.4, 0.6])
    qpos0[3:7] /= np.linalg.norm(qpos0[3:7])
    params = {
        "fit": (),
        "model": loaded.model,
        "state0": None,
        "qpos0": jnp.asarray(qpos0),
        "qvel0": jnp.zeros(7),
        "t0": jnp.asarray(0.0),
    }
    _, state = Build((), True, layout)(params)
    np.testing.assert_allclose(state.q, loaded.state.q, rtol=0, atol=1e-12)
    np.testing.assert_allclose(state.u, loaded.state.u, rtol=0, atol=1e-12)


def test_a_failed_run_is_plotted_and_animated_up_to_its_failure(tmp_path, capsys):
    """A batch run file in which a system failed holds its NaN from the failed step on (the
    others ran to the end). plot draws it (a NaN is a gap) and names the failure in one
    warning; animate used to stop with matplotlib's "Axis limits cannot be NaN or Inf" and
    now draws the states before the failure, saying so."""
    model = tmp_path / "spring.toml"
    body = rbjax.Model(
        rbjax.Body(1.0, [0.1, 0.1, 0.1], name="b"),
        forces=[rbjax.TranslationalSpringDamper(0, [0, 0, 0], GROUND, [0, 0, 0], stiffness=1.0)],
    )
    rbjax.save(model, body, rbjax.make_state(position=[0.1, 0.0, 0.0]), timestep=0.1)
    out = tmp_path / "run.npz"
    assert main(["simulate", str(model), "--t", "2", "--out", str(out), "--no-progress"]) == 0
    run = dict(np.load(out))
    run["q"][5:] = np.nan  # as rollout leaves a system that went non-finite at step 5
    run["u"][5:] = np.nan
    run["result"] = np.asarray(int(rbjax.RESULTS.nonfinite), np.int32)
    run["failed_step"] = np.asarray(5)
    np.savez(out, **run)
    capsys.readouterr()
    png = tmp_path / "run.png"
    assert main(["plot", str(out), "-q", "positions", "--out", str(png), "--dpi", "20"]) == 0
    err = capsys.readouterr().err
    assert "warning:" in err and "the run failed (nonfinite at step 5 (t = 0.5 s))" in err
    gif = tmp_path / "run.gif"
    argv = ["animate", str(model), str(out), "--out", str(gif), "--dpi", "20", "--size", "2,2"]
    assert main([*argv, "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "the run failed (nonfinite" in err and "animating t = 0 .. 0.4 s" in err
    assert gif.stat().st_size > 0


def test_monte_carlo_checks_a_tree_at_value_of_sample_zero_at_build_time():
    """rollout refuses a negative stiffness set with equinox.tree_at before running; the
    Monte-Carlo runner ran it and reported invalid_input for every sample. Now the same
    ValueError, naming the sample and the field."""
    model = rbjax.Model(
        rbjax.Body(1.0, [0.1, 0.1, 0.1]),
        forces=[rbjax.TranslationalSpringDamper(0, [0, 0, 0], GROUND, [0, 0, 0], stiffness=1.0)],
    )
    bad = eqx.tree_at(lambda m: m.forces[0].stiffness, model, jnp.asarray(-1.0))
    state = rbjax.make_state(position=[0.1, 0.0, 0.0])
    with pytest.raises(ValueError, match=r"forces\[0\]\.stiffness"):
        rbjax.rollout(bad, state, 0.01, 2)
    measures = {"x": rbjax.Final(lambda m, s: s.q[0, 0])}
    with pytest.raises(ValueError, match=r"sample\(key, 0\): model\.forces\[0\]\.stiffness"):
        rbjax.monte_carlo(lambda k, i: (bad, state), 4, 0.01, 2, measures, progress=False)


@pytest.mark.parametrize("scale", [1e300, 1e200, 1e-200])
def test_a_direction_of_any_finite_magnitude_is_a_direction(scale):
    """|z| of z = (1e300, 1e300, 0) overflowed to inf: z became (0, 0, 0) with a
    RuntimeWarning and the joint failed with 'body j frame'. Scaled by its largest component,
    any finite direction whose length is above the rounding of zero (1e-12) is normalised
    exactly like the same direction of length 1."""
    z = np.asarray([1.0, 1.0, 0.0]) * scale
    ref = rbjax.Revolute(0, 1, z_i=[1.0, 1.0, 0.0])
    if scale < 1:  # below 1e-12: the rounding of zero, refused as the rule 'nonzero' does
        with pytest.raises(ValueError, match=r"has zero length \(\|.*\| = 1\.41e-200 <= 1e-12"):
            rbjax.Revolute(0, 1, z_i=z)
        return
    with np.errstate(over="raise"):
        joint = rbjax.Revolute(0, 1, z_i=z)
    for f in ("z_i", "z_j", "x_i", "x_j"):
        np.testing.assert_allclose(getattr(joint, f), getattr(ref, f), rtol=0, atol=1e-15)
    with pytest.raises(
        ValueError, match=r"\(body i frame\)\.z = \[inf, 0\.0, 0\.0\] is not finite"
    ):
        rbjax.Revolute(0, 1, z_i=[np.inf, 0.0, 0.0])
    spring = rbjax.RotationalSpringDamper.at(
        np.asarray([[0, 0, 0, 1.0, 0, 0, 0]] * 2), 0, 1, axis=z, stiffness=1.0
    )
    np.testing.assert_allclose(spring.axis_i, np.asarray([1.0, 1.0, 0.0]) / np.sqrt(2), atol=1e-15)


def test_float32_joint_frames_and_flat_bodies_are_accepted_to_float32_rounding():
    """A joint frame given in float32 is perpendicular only to float32 rounding (|xᵀz| of
    order 1e-8, refused against 1e-9), and a flat body's I1 + I2 = I3 is exact in float64 but
    4e-9 short in float32 (refused against 1e-12 of the sum): both are accepted to 10 ε of
    the dtype they are given in (float32 arrays; JAX in float64, as the float32 tests run). A frame tilted by 1e-3 and a body 1e-4 outside the triangle
    inequality are still refused, and float64 input keeps float64's tolerances."""
    c, s = np.cos(0.7), np.sin(0.7)
    turn = np.asarray([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]]) @ np.asarray(
        [[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]]
    )
    z, x = (np.asarray(turn @ v, np.float32) for v in ([0.0, 0.0, 1.0], [1.0, 0.0, 0.0]))
    assert 1e-9 < abs(float(np.dot(z.astype(float), x.astype(float)))) < 1e-6

    rbjax.Revolute(0, 1, z_i=z, x_i=x)
    q0 = np.asarray([[0, 0, 0, 1.0, 0, 0, 0]] * 2, np.float32)
    assert rbjax.Revolute.at(q0, 0, 1, point=[0, 0, 0], axis=z, x=x).z_i.dtype == jnp.float32
    rbjax.RotationalSpringDamper.at(q0, 0, 1, axis=z, ref=x, stiffness=1.0)
    flat = rbjax.Body(1.0, np.diag(np.asarray([0.02, 0.021, 0.001], np.float32)))
    assert flat.inertia.dtype == jnp.float32
    with pytest.raises(ValueError, match="is not perpendicular to z"):
        rbjax.Revolute(0, 1, z_i=z, x_i=(x + 1e-3 * z).astype(np.float32))
    with pytest.raises(ValueError, match="triangle inequality"):
        rbjax.Body(1.0, np.diag(np.asarray([0.02, 0.0211, 0.001], np.float32)))
    with pytest.raises(ValueError, match="is not perpendicular to z"):  # float64: 1e-9
        rbjax.Revolute(0, 1, z_i=z.astype(float), x_i=x.astype(float))
    with pytest.raises(ValueError, match="is not perpendicular to axis"):
        rbjax.RotationalSpringDamper.at(
            q0.astype(float), 0, 1, axis=z.astype(float), ref=x.astype(float), stiffness=1.0
        )
