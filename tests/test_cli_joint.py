"""The command line on joint coordinates (rbjax/_cli/joint.py) and its compilation cache.

References the command line did not compute: rbjax.rollout on the same JointModel (the
segments must continue it), MuJoCo's own forward kinematics (body poses) and energy
(mj_energyPos/Vel) at the run's states, the seeded perturbations recomputed from their
definition, and JAX's cache-hit events."""

import json
import os

import jax
import mujoco
import numpy as np
import pytest

import rbjax
from rbjax._cli import main, runfile
from rbjax._cli.common import CliError, integrator_for, load_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PENDULUM = os.path.join(ROOT, "examples", "models", "double_pendulum.xml")
FOUR_BAR = os.path.join(ROOT, "examples", "models", "four_bar.xml")
COUPLED = """<mujoco>
  <option timestep="0.002" integrator="implicitfast"><flag contact="disable"/></option>
  <worldbody>
    <body name="a"><joint name="j1" type="hinge" axis="0 1 0"/>
      <geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.02"/></body>
    <body name="b" pos="1 0 0"><joint name="j2" type="hinge" axis="0 1 0"/>
      <geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.02"/></body>
  </worldbody>
  <equality><joint joint1="j1" joint2="j2"/></equality>
</mujoco>"""
BATCH = ["--batch", "3", "--seed", "7", "--perturb", "qpos=0.1", "--perturb", "qvel=0.2"]


def test_default_coordinates_per_file(tmp_path):
    """A tree loads in joint coordinates, a loop closed by a connect in maximal ones, a joint
    coupling (no loop) in joint coordinates; --coordinates overrides either way; a model
    file refuses the option; and the file's implicitfast is the default integrator there."""
    tree = load_model(PENDULUM)
    assert tree.coordinates == "joint" and isinstance(tree.model, rbjax.JointModel)
    assert tree.why == "its joints form a tree"
    loop = load_model(FOUR_BAR)
    assert loop.coordinates == "maximal" and isinstance(loop.model, rbjax.Model)
    assert "closes a loop" in loop.why
    assert isinstance(load_model(PENDULUM, coordinates="maximal").model, rbjax.Model)
    forced = load_model(FOUR_BAR, coordinates="joint")
    assert isinstance(forced.model, rbjax.JointModel) and forced.why == "--coordinates"
    (tmp_path / "coupled.xml").write_text(COUPLED)
    coupled = load_model(str(tmp_path / "coupled.xml"))
    assert coupled.coordinates == "joint" and len(coupled.model.equalities) == 1
    assert integrator_for(None, coupled) == "implicitfast"  # the file asks for it
    assert integrator_for(None, tree) == "rk4"
    with pytest.warns(UserWarning, match="of type mjEQ_JOINT"):  # maximal: not imported
        maximal = load_model(str(tmp_path / "coupled.xml"), coordinates="maximal")
    assert integrator_for(None, maximal) == "rk4"  # implicitfast integrates joint coordinates
    with pytest.raises(CliError, match="--coordinates maximal"):
        integrator_for("implicit-midpoint", tree)
    with pytest.raises(CliError, match="--coordinates joint"):
        integrator_for("implicitfast", loop)
    rbjax.save(str(tmp_path / "m.toml"), loop.model, loop.state, timestep=1e-3)
    with pytest.raises(CliError, match="Fix: leave out --coordinates"):
        load_model(str(tmp_path / "m.toml"), coordinates="joint")


def test_simulate_joint_single_run(tmp_path, capsys):
    """The run file of a tree holds MuJoCo's qpos/qvel: the final state equals rbjax.rollout's
    on the same JointModel, body poses equal MuJoCo's xpos/xquat and the energies MuJoCo's
    mj_energyPos + mj_energyVel at the saved states."""
    out = tmp_path / "run.npz"
    argv = ["simulate", PENDULUM, "--t", "0.05", "--save-every", "5", "--out", str(out)]
    assert main([*argv, "--no-progress"]) == 0
    assert "joint coordinates (its joints form a tree)" in capsys.readouterr().out
    run = runfile.read(str(out))
    assert run.joint and run.meta["integrator"] == "rk4" and "q" not in run
    assert run.names("qpos_names") == ["shoulder", "elbow"]
    loaded = rbjax.load(PENDULUM, formulation=rbjax.JointCoordinates())
    ref = rbjax.rollout(loaded.model, loaded.state, 1e-3, 50, save_every=5)
    np.testing.assert_allclose(run["qpos"], ref.qpos, rtol=0, atol=1e-13)
    np.testing.assert_allclose(run["qvel"], ref.qvel, rtol=0, atol=1e-12)
    np.testing.assert_allclose(run["t"], ref.t, rtol=0, atol=1e-15)
    m = mujoco.MjModel.from_xml_path(PENDULUM)
    m.opt.enableflags |= mujoco.mjtEnableBit.mjENBL_ENERGY
    d = mujoco.MjData(m)
    for k in (0, 5, 10):
        d.qpos[:], d.qvel[:] = run["qpos"][k], run["qvel"][k]
        mujoco.mj_forward(m, d)
        np.testing.assert_allclose(run["xpos"][k], d.xpos[1:], atol=1e-12)
        np.testing.assert_allclose(run["xquat"][k], d.xquat[1:], atol=1e-12)
        np.testing.assert_allclose(run["xipos"][k], d.xipos[1:], atol=1e-12)
        np.testing.assert_allclose(run["total_energy"][k], d.energy.sum(), rtol=1e-10)


def test_simulate_joint_batch_is_seeded(tmp_path):
    """--batch with perturbations: the same seed writes the same run, another seed another;
    every sample starts at qpos0 ⊕ δ and qvel0 + δv with the recorded δ (hinges: a sum), and
    a mass perturbation scales each body's weight in the potential energy."""
    paths = [tmp_path / f"{k}.npz" for k in "abc"]
    seeds = ["7", "7", "8"]
    mass = ["--perturb", "mass=0.1"]
    for path, s in zip(paths, seeds, strict=True):
        argv = ["simulate", PENDULUM, "--t", "0.01", "--out", str(path), "--no-progress"]
        assert main([*argv, "--batch", "3", "--seed", s, *BATCH[4:], *mass]) == 0
    a, b, c = (runfile.read(str(p)) for p in paths)
    for key in ("qpos", "qvel", "perturb_qpos", "perturb_mass", "total_energy"):
        np.testing.assert_array_equal(a[key], b[key])
    assert not np.allclose(a["perturb_qpos"], c["perturb_qpos"])
    assert a["qpos"].shape == (3, 11, 2) and a.batch == 3
    np.testing.assert_allclose(a["qpos"][:, 0], a["perturb_qpos"], atol=1e-15)  # qpos0 = 0
    np.testing.assert_allclose(a["qvel"][:, 0], a["perturb_qvel"], atol=1e-15)
    m = mujoco.MjModel.from_xml_path(PENDULUM)
    weight = a["perturb_mass"] * m.body_mass[1:] * 9.81  # (B, nb)
    np.testing.assert_allclose(
        a["potential_energy"][:, 0], np.sum(weight * a["xipos"][:, 0, :, 2], axis=-1), rtol=1e-12
    )


def test_cache_directory_is_created_and_hit(tmp_path, monkeypatch):
    """The command line turns JAX's persistent cache on in $RBJAX_CACHE_DIR: the first run
    writes entries there, a second run (in-memory caches cleared) loads them (JAX's
    cache-hit events) and writes none; the caller's cache settings are back afterwards."""
    cache = tmp_path / "xla"
    monkeypatch.setenv("RBJAX_CACHE_DIR", str(cache))
    before = jax.config.jax_compilation_cache_dir
    argv = ["check", PENDULUM, "--steps", "3", "--json"]
    jax.clear_caches()
    assert main(argv) == 0
    entries = sorted(os.listdir(cache))
    assert entries and jax.config.jax_compilation_cache_dir == before
    hits = []
    listener = lambda event, **kw: hits.append(event)  # noqa: E731
    jax.monitoring.register_event_listener(listener)
    try:
        jax.clear_caches()
        assert main(argv) == 0
    finally:
        jax.monitoring.unregister_event_listener(listener)
    assert hits.count("/jax/compilation_cache/cache_hits") >= 1
    assert sorted(os.listdir(cache)) == entries
    off = tmp_path / "off"
    monkeypatch.setenv("RBJAX_CACHE_DIR", str(off))
    assert main(["check", PENDULUM, "--steps", "0", "--no-cache"]) == 0
    assert not off.exists()


def _identify_files(d):
    """A damped double pendulum (MJCF) and MuJoCo's own RK4 motion of it at the fit's step,
    60 samples stored as a joint-coordinate run file names them: qpos with its column names,
    the bodies' centres of mass xipos and attitudes xquat with body_names."""
    with open(PENDULUM) as fh:
        xml = fh.read().replace('timestep="0.001"', 'timestep="0.005"')
    xml = xml.replace('axis="0 1 0"/>', 'axis="0 1 0" damping="0.3"/>')
    (d / "damped.xml").write_text(xml)
    m = mujoco.MjModel.from_xml_string(xml)
    data = mujoco.MjData(m)
    data.qpos[:], data.qvel[:] = [0.9, -0.4], [0.5, 0.0]
    t, qpos, xipos, xquat = [], [], [], []
    for _ in range(60):
        mujoco.mj_forward(m, data)
        t.append(data.time), qpos.append(data.qpos.copy())
        xipos.append(data.xipos[1:].copy()), xquat.append(data.xquat[1:].copy())
        mujoco.mj_step(m, data)
    np.savez(
        d / "measured.npz",
        t=np.array(t),
        qpos=np.array(qpos),
        qpos_names=np.array(["shoulder", "elbow"]),
        xipos=np.array(xipos),
        xquat=np.array(xquat),
        body_names=np.array(["upper", "lower"]),
    )
    lines = [
        'model = "damped.xml"',
        'data = "measured.npz"',
        "[state]",
        "qpos = { shoulder = 0.9, elbow = -0.4 }",
        "qvel = { elbow = 0.0 }",
    ]
    for c in ("shoulder", "elbow"):
        lines += ["[[observations]]", 'kind = "joint_position"', f'coordinate = "{c}"']
        lines += ["sigma = 1e-3"]
    lines += ["[[observations]]", 'kind = "position"', 'body = "lower"']  # xipos, xquat
    lines += ["point = [0.0, 0.0, -0.25]", "sigma = 1e-3"]  # the lower link's tip
    lines += ["[[observations]]", 'kind = "orientation"', 'body = "upper"', "sigma = 1e-3"]
    for kind, key, value in (
        ("damping", 'joint = "shoulder"', 0.2),
        ("damping", 'joint = "elbow"', 0.45),
        ("mass", 'body = "lower"', 1.3),
        ("joint_velocity", 'coordinate = "shoulder"', 0.3),
    ):
        lines += ["[[parameters]]", f'kind = "{kind}"', key, f"initial = {value}"]
    lines += ["[solver]", "max_steps = 30"]
    (d / "id.toml").write_text("\n".join(lines) + "\n")
    return str(d / "id.toml"), float(m.body_mass[2])


def test_identify_in_joint_and_maximal_coordinates(tmp_path, capsys):
    """identify fits a tree in joint coordinates by default, and --coordinates maximal fits
    the same file in the other formulation: both recover MuJoCo's damping, mass and initial
    rate, with the same estimates and standard errors (the same equations integrated)."""
    cfg, mass = _identify_files(tmp_path)
    fits = {}
    for extra in ([], ["--coordinates", "maximal"]):
        code = main(["identify", cfg, "--json", *extra])
        out, err = capsys.readouterr()
        assert code == 0, err
        fit = json.loads(out)
        fits[fit["coordinates"]] = fit
        assert f"dt = 0.005 s, {fit['coordinates']} coordinates" in err  # the banner
    joint, maximal = fits["joint"], fits["maximal"]  # the default is joint for a tree
    assert (
        joint["names"]
        == maximal["names"]
        == [
            "shoulder.damping",
            "elbow.damping",
            "lower.mass",
            "shoulder.qvel0",
        ]
    )
    truth = [0.3, 0.3, mass, 0.5]
    for fit in (joint, maximal):  # MuJoCo's RK4 at the fit's step: the same discretisation
        np.testing.assert_allclose(fit["values"], truth, rtol=1e-6)
        assert fit["converged"] and fit["unidentifiable"] == []
    np.testing.assert_allclose(joint["values"], maximal["values"], rtol=1e-6)
    np.testing.assert_allclose(joint["std"], maximal["std"], rtol=1e-6)


def test_identify_joint_refusals(tmp_path, capsys):
    """What joint coordinates cannot express, or do not integrate, is one line naming the fix
    (exit 2): a damper named as a force index, a maximal-only integrator."""
    cfg, _ = _identify_files(tmp_path)
    with open(cfg) as fh:
        text = fh.read()
    (tmp_path / "force.toml").write_text(text.replace('joint = "elbow"', "force = 1"))
    assert main(["identify", str(tmp_path / "force.toml")]) == 2
    err = capsys.readouterr().err
    assert "parameters[1].force: is 1: in joint coordinates" in err
    assert "Fix: give joint = the joint's name, or run with --coordinates maximal" in err
    (tmp_path / "midpoint.toml").write_text('integrator = "implicit-midpoint"\n' + text)
    assert main(["identify", str(tmp_path / "midpoint.toml")]) == 2
    err = capsys.readouterr().err
    assert "integrator: is 'implicit-midpoint', which does not integrate joint" in err
    assert "--coordinates maximal" in err


def test_wrong_integrator_refused(tmp_path, capsys):
    """An integrator the coordinates do not take is one line with the fix (exit 2), not a
    traceback."""
    out = str(tmp_path / "r.npz")
    argv = ["simulate", PENDULUM, "--integrator", "projected-rk4", "--out", out]
    assert main(argv) == 2
    assert "Fix: choose one of them, or --coordinates maximal" in capsys.readouterr().err
    assert main(["check", PENDULUM, "--coordinates", "cartesian"]) == 2


def test_check_joint_json(capsys):
    """check on a tree reports nv degrees of freedom, no equalities, and a finite trial."""
    assert main(["check", PENDULUM, "--steps", "2", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["dof"] == 2 and rep["formulation"] == "JointCoordinates"
    assert rep["equalities"] == [] and rep["trial"]["finite"]
    m = mujoco.MjModel.from_xml_path(PENDULUM)
    assert rep["total_mass"] == pytest.approx(float(np.sum(m.body_mass)), rel=1e-12)


def test_plot_animate_bench_on_joint_coordinates(tmp_path, capsys):
    """A joint-coordinate run plots (qpos grouped, positions from the centres of mass), refuses
    residuals with the fix, and animates: its scene puts every geom where MuJoCo's forward
    kinematics puts it at a saved state; bench times the JointModel against MuJoCo."""
    from rbjax._cli import animate

    out = str(tmp_path / "run.npz")
    argv = ["simulate", PENDULUM, "--t", "0.02", "--save-every", "10", "--out", out]
    assert main([*argv, "--no-progress"]) == 0
    png = str(tmp_path / "p.png")
    assert main(["plot", out, "-q", "qpos", "-q", "positions", "-q", "energy", "--out", png]) == 0
    assert os.path.getsize(png) > 0
    assert main(["plot", out, "-q", "residual", "--out", png]) == 2
    assert "Fix: simulate with --coordinates maximal" in capsys.readouterr().err
    gif = str(tmp_path / "a.gif")
    assert main(["animate", PENDULUM, out, "--out", gif, "--no-progress"]) == 0
    run = runfile.read(out)
    scene = animate.build_joint_scene(load_model(PENDULUM))
    t, frames = animate.joint_trajectory(run, load_model(PENDULUM).model, out, PENDULUM, 0)
    m = mujoco.MjModel.from_xml_path(PENDULUM)
    d = mujoco.MjData(m)
    d.qpos[:] = run["qpos"][-1]
    mujoco.mj_kinematics(m, d)
    faces = animate.place(scene, frames[-1])
    for g in range(m.ngeom):  # a revolved shape's vertices average to its centre
        centre = faces[scene.geom == g].reshape(-1, 3).mean(axis=0)
        np.testing.assert_allclose(centre, d.geom_xpos[g], atol=1e-12)
    capsys.readouterr()
    js = str(tmp_path / "bench.json")
    argv = ["bench", PENDULUM, "--batch", "2", "--steps", "5", "--repeats", "1", "--json", js]
    assert main([*argv, "--no-progress"]) == 0
    with open(js) as fh:
        doc = json.load(fh)
    assert doc["header"]["coordinates"] == "joint"
    assert [r["engine"] for r in doc["rows"]] == ["rbjax", "mujoco-c"]
    assert "error" not in doc["rows"][0] and doc["rows"][0]["steps_per_s"] > 0


def test_simulate_perturbed_coupling_is_assembled(tmp_path, capsys):
    """--perturb qpos/qvel on a file with a joint coupling (j1 = j2) in joint coordinates:
    every perturbed sample is put back on the coupling (rbjax.assemble, as the maximal path
    does for loops) before the rollout, which would refuse an open start. The run's initial
    states hold q1 = q2 and q̇1 = q̇2 (the coupling's definition, not the code's) though the
    recorded perturbations differ per joint."""
    path = tmp_path / "coupled.xml"
    path.write_text(COUPLED)
    out = tmp_path / "run.npz"
    argv = ["simulate", str(path), "--t", "0.01", "--out", str(out), "--no-progress", *BATCH]
    assert main(argv) == 0, capsys.readouterr().out
    run = runfile.read(str(out))
    assert np.abs(np.diff(run["perturb_qpos"], axis=-1)).min() > 1e-3  # opened by the draw
    q0, v0 = run["qpos"][:, 0], run["qvel"][:, 0]
    np.testing.assert_allclose(q0[:, 0], q0[:, 1], rtol=0, atol=1e-12)
    np.testing.assert_allclose(v0[:, 0], v0[:, 1], rtol=0, atol=1e-12)
    assert np.abs(q0).max() > 1e-3  # perturbed, not reset to qpos0


BALL_CHAIN = """<mujoco>
  <option><flag contact="disable"/></option>
  <worldbody>
    <body name="a"><joint name="h" type="hinge" axis="0 1 0"/>
      <geom type="capsule" fromto="0 0 0 0 0 -0.5" size="0.03"/>
      <body name="b" pos="0 0 -0.5"><joint name="s" type="ball"/>
        <geom type="capsule" fromto="0 0 0 0.4 0 0" size="0.02"/></body></body>
  </worldbody>
</mujoco>"""


def test_identify_joint_springs_are_mujocos(tmp_path):
    """identify's damping and stiffness of a JointModel joint (parameters.py) are MuJoCo's
    per-joint ones, on every DOF of a ball joint: the passive forces of the built model equal
    MuJoCo's qfrc_passive with the same values set in the file's compiled model."""
    from rbjax._cli.parameters import Build, parameter
    from rbjax._cli.quantities import Layout

    (tmp_path / "ball.xml").write_text(BALL_CHAIN)
    loaded = load_model(str(tmp_path / "ball.xml"))
    model = loaded.model
    assert isinstance(model, rbjax.JointModel)
    values = {("damping", "h"): 0.2, ("stiffness", "h"): 0.9, ("damping", "s"): 0.4}
    values[("stiffness", "s")] = 0.6
    specs, raws = [], []
    for i, ((kind, joint), v) in enumerate(values.items()):
        p = {"kind": kind, "joint": joint, "initial": v}
        spec, raw, _ = parameter(i, p, model, None, None)
        assert spec.labels == (f"{joint}.{kind}",)
        specs.append(spec), raws.append(jax.numpy.asarray(raw))
    state = loaded.state
    params = {"fit": tuple(raws), "model": model, "state0": state, "t0": state.t}
    params |= {"qpos0": state.qpos, "qvel0": state.qvel}
    built, _ = Build(tuple(specs), False, Layout())(params)
    qpos = np.array([0.7, np.cos(0.3), 0.2 * np.sin(0.3), -0.5 * np.sin(0.3), 0.0])
    qpos[1:] /= np.linalg.norm(qpos[1:])
    qvel = np.array([0.5, -1.0, 0.3, 2.0])
    tau = built.generalized_forces(0.0, jax.numpy.asarray(qpos), jax.numpy.asarray(qvel))
    m = mujoco.MjModel.from_xml_string(BALL_CHAIN)
    m.dof_damping[:] = [0.2, 0.4, 0.4, 0.4]
    m.jnt_stiffness[:] = [0.9, 0.6]
    d = mujoco.MjData(m)
    d.qpos[:], d.qvel[:] = qpos, qvel
    mujoco.mj_forward(m, d)
    np.testing.assert_allclose(tau, d.qfrc_passive, rtol=1e-12, atol=1e-14)
