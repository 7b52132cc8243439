"""The command line (rbjax/_cli): simulate, check and plot, the run file, and every error path.

Physics is checked against what the command line did not compute: the run's q and u against
one rbjax.rollout over the whole span (the segments the command line integrates in must
continue bit for bit), energies against ½ m v² + ½ ωᵀΘω + m g z in NumPy, the joint angle
against atan2 of the pendulum's direction, the perturbed initial angles against the recorded
perturbations, and a redundant model against the rank it must report."""

import json
import os
import subprocess
import sys

import equinox as eqx
import jax
import numpy as np
import pytest

import rbjax
from rbjax._cli import main, runfile, simulate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
L, THETA0 = 0.5, 0.7  # pivot-to-COM length [m], initial angle [rad]
BATCH = ["--batch", "5", "--seed", "3", "--perturb", "qpos=0.1", "--perturb", "mass=0.2"]


def pendulum(path, *, spring=None, formulation=None):
    """A rod of 1 kg hanging from a revolute about world y at the origin, displaced by THETA0."""
    a = np.array([np.cos(THETA0 / 2), 0.0, np.sin(THETA0 / 2), 0.0])  # rotation about +y
    r = np.array([-L * np.sin(THETA0), 0.0, -L * np.cos(THETA0)])  # R(θ about y)·(0, 0, −L)
    hanging = np.array([[0.0, 0.0, -L, 1.0, 0.0, 0.0, 0.0]])  # the joint's zero angle
    joints = [
        rbjax.Revolute.at(hanging, rbjax.GROUND, 0, point=(0, 0, 0), axis=(0, 1, 0), name="hinge")
    ]
    forces = []
    if spring is not None:  # a linear spring from the world point (1, 0, 0) to the COM
        forces.append(
            rbjax.TranslationalSpringDamper(
                rbjax.GROUND, (1.0, 0.0, 0.0), 0, (0.0, 0.0, 0.0), stiffness=spring
            )
        )
    model = rbjax.Model(
        [rbjax.Body(1.0, np.diag([0.02, 0.021, 0.001]), name="rod")],
        joints=joints,
        forces=forces,
        gravity=(0.0, 0.0, -9.81),
        **({} if formulation is None else {"formulation": formulation}),
    )
    state = rbjax.make_state(position=r[None], quaternion=a[None])
    rbjax.save(path, model, state, timestep=1e-3)
    return model, state


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    model, state = pendulum(str(d / "pendulum.toml"))
    assert (
        main(
            [
                "simulate",
                str(d / "pendulum.toml"),
                "--t",
                "0.2",
                "--save-every",
                "4",
                "--out",
                str(d / "run.npz"),
                "--csv",
                str(d / "run.csv"),
                "--no-progress",
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "simulate",
                str(d / "pendulum.toml"),
                "--t",
                "0.1",
                *BATCH,
                "--out",
                str(d / "batch.npz"),
                "--csv",
                str(d / "batch.csv"),
                "--no-progress",
            ]
        )
        == 0
    )
    return d, model, state


def test_run_file_is_plain_numpy_and_matches_one_rollout(files):
    d, model, state = files
    with np.load(d / "run.npz", allow_pickle=False) as f:  # readable without rbjax or pickle
        run = {k: f[k] for k in f.files}
    assert str(run["format"]) == "rbjax-run 1"
    meta = json.loads(str(run["meta"]))
    assert meta["n_steps"] == 200 and meta["save_every"] == 4 and meta["dt"] == 1e-3
    ref = rbjax.rollout(model, state, 1e-3, 200, save_every=4)
    # the segments continue one another: equal to one rollout up to the last bit or two (the
    # programs for 10 and for 200 steps are compiled separately and may round differently)
    np.testing.assert_allclose(run["q"], np.asarray(ref.q), rtol=0, atol=1e-14)
    np.testing.assert_allclose(run["u"], np.asarray(ref.u), rtol=0, atol=1e-13)
    np.testing.assert_allclose(run["t"], np.asarray(ref.t), rtol=0, atol=1e-15)
    assert list(run["body_names"]) == ["rod"] and list(run["joint_names"]) == ["hinge"]
    assert run["result"] == 0 and run["failed_step"] == -1


def test_run_file_quantities_against_numpy(files):
    d, _, _ = files
    run = dict(np.load(d / "run.npz"))
    q, u = run["q"][:, 0], run["u"][:, 0]
    theta = np.diag([0.02, 0.021, 0.001])
    ke = 0.5 * 1.0 * np.sum(u[:, 0:3] ** 2, axis=1)  # m = 1 kg
    ke += 0.5 * np.einsum("ti,ij,tj->t", u[:, 4:7], theta, u[:, 4:7])
    np.testing.assert_allclose(run["kinetic_energy"], ke, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(run["potential_energy"], 9.81 * q[:, 2], rtol=1e-12, atol=1e-14)
    e = run["total_energy"]
    assert np.max(np.abs(e - e[0])) < 1e-8 * abs(e[0])  # RK4 at 1 ms, no dissipation
    angle = np.arctan2(-q[:, 0], -q[:, 2])  # the rod's angle from the downward vertical about +y
    np.testing.assert_allclose(run["qpos"][:, 0], angle, atol=1e-9)
    assert abs(run["qpos"][0, 0] - THETA0) < 1e-12
    assert np.max(run["position_residual"]) < 1e-9
    # the hinge's force on the rod balances gravity and the centripetal/tangential forces:
    # F = m a − m g, with a the COM acceleration (central differences of the saved velocity)
    dt = run["t"][1] - run["t"][0]
    acc = (u[2:, 0:3] - u[:-2, 0:3]) / (2 * dt)
    force = acc - np.array([0.0, 0.0, -9.81])
    np.testing.assert_allclose(run["reaction_force"][1:-1, 0], force, atol=2e-3)  # O(h²), h = 4 ms


def test_csv_columns_are_the_run_files_arrays(files):
    d, _, _ = files
    run = dict(np.load(d / "run.npz"))
    with open(d / "run.csv") as f:
        header = f.readline().strip().split(",")
    table = np.loadtxt(d / "run.csv", delimiter=",", skiprows=1)
    assert header[:4] == ["t", "qpos:hinge", "qvel:hinge", "kinetic_energy"]
    np.testing.assert_array_equal(table[:, 0], run["t"])
    np.testing.assert_array_equal(table[:, 1], run["qpos"][:, 0])
    np.testing.assert_array_equal(table[:, header.index("total_energy")], run["total_energy"])
    batch = np.loadtxt(d / "batch.csv", delimiter=",", skiprows=1)
    assert batch.shape[0] == 5 * 101 and set(batch[:, 0]) == set(range(5))


def test_batch_records_its_perturbations(files):
    d, model, _ = files
    run = dict(np.load(d / "batch.npz"))
    assert run["q"].shape == (5, 101, 1, 7) and run["t"].shape == (101,)
    assert "perturb_qvel" not in run  # only what was asked for
    np.testing.assert_allclose(run["qpos"][:, 0, 0], THETA0 + run["perturb_qpos"][:, 0], atol=1e-12)
    assert np.std(run["perturb_qpos"]) > 0.02 and np.all(run["perturb_mass"] > 0)
    # potential energy m·g·z with each sample's perturbed mass
    m = run["perturb_mass"][:, 0]
    np.testing.assert_allclose(
        run["potential_energy"], m[:, None] * 9.81 * run["q"][..., 0, 2], rtol=1e-12
    )
    e = run["total_energy"]
    assert np.max(np.abs(e - e[:, :1])) < 1e-8
    # the same seed gives the same samples
    assert (
        main(
            [
                "simulate",
                str(d / "pendulum.toml"),
                "--t",
                "0.01",
                *BATCH,
                "--out",
                str(d / "again.npz"),
                "--no-progress",
            ]
        )
        == 0
    )
    again = dict(np.load(d / "again.npz"))
    np.testing.assert_array_equal(again["perturb_qpos"], run["perturb_qpos"])
    np.testing.assert_array_equal(again["q"][:, 0], run["q"][:, 0])


def test_plot_writes_pngs(files, capsys):
    d, _, _ = files
    for args in (
        ["-q", "qpos", "-q", "energy", "-q", "invariants", "-q", "residual", "-q", "reactions"],
        ["-q", "momentum", "-q", "positions", "--select", "rod"],
    ):
        out = d / "p.png"
        assert main(["plot", str(d / "run.npz"), *args, "--out", str(out), "--dpi", "40"]) == 0
        with open(out, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        os.remove(out)
    assert (
        main(
            [
                "plot",
                str(d / "batch.npz"),
                "--samples",
                "3",
                "--out",
                str(d / "b.png"),
                "--dpi",
                "40",
            ]
        )
        == 0
    )
    assert os.path.getsize(d / "b.png") > 1000


def test_check_reports(tmp_path, capsys):
    pendulum(str(tmp_path / "p.toml"))
    assert main(["check", str(tmp_path / "p.toml"), "--json", "--steps", "0"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["dof"] == 1 and rep["rank"] == 5 and rep["redundant"] == [] and rep["failures"] == []
    z = -L * np.cos(THETA0)
    assert abs(rep["potential_energy"] - 9.81 * z) < 1e-12 and rep["kinetic_energy"] == 0
    # the tangential acceleration of the released rod: θ̈ = −m g L sin θ / (Θ_yy + m L²)
    theta_ddot = 9.81 * L * np.sin(THETA0) / (0.021 + L**2)
    assert abs(rep["max_acceleration"] - theta_ddot) < 1e-9  # ω̇ about y, the largest entry
    # the MJCF four-bar closed by a planar connect: rank 17 of 18 rows, one degree of freedom
    four_bar = os.path.join(ROOT, "examples", "models", "four_bar.xml")
    assert main(["check", four_bar, "--json", "--steps", "0"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert (rep["dof"], rep["rank"], rep["rows"]) == (1, 17, 18)
    assert rep["redundant"] == ["loop[row 1]"]  # the connect's out-of-plane equation
    # the same loop under the Schur-complement formulation: checked and integrated alike
    loaded = rbjax.load(four_bar)
    model = eqx.tree_at(lambda m: m.formulation, loaded.model, rbjax.ScalableDAE())
    rbjax.save(str(tmp_path / "fb.toml"), model, loaded.state)
    assert main(["check", str(tmp_path / "fb.toml"), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["redundant"] == ["loop[row 1]"] and rep["failures"] == []


def test_check_fails_a_drifting_or_diverging_trial(tmp_path, capsys):
    pendulum(str(tmp_path / "p.toml"))
    assert main(["check", str(tmp_path / "p.toml"), "--drift", "1e-300"]) == 1
    out = capsys.readouterr().out
    assert "FAILED: after 100 steps of 0.001 s the joints drifted" in out and "smaller step" in out
    pendulum(str(tmp_path / "stiff.toml"), spring=1e9)  # RK4 at 10 ms is unstable
    assert main(["check", str(tmp_path / "stiff.toml"), "--dt", "0.01"]) == 1
    out = capsys.readouterr().out
    assert "FAILED: the trial integration failed at step" in out and "Fix: a smaller step" in out


def test_simulate_reports_a_diverged_run(tmp_path, capsys):
    pendulum(str(tmp_path / "stiff.toml"), spring=1e9)  # RK4 at 10 ms is unstable
    code = main(
        [
            "simulate",
            str(tmp_path / "stiff.toml"),
            "--t",
            "0.5",
            "--dt",
            "0.01",
            "--integrator",
            "semi-implicit-euler",
            "--out",
            str(tmp_path / "r.npz"),
            "--no-progress",
        ]
    )
    assert code == 1
    out = capsys.readouterr().out
    assert "FAILED: 1 of 1 system(s); at step" in out and "smaller --dt" in out
    run = dict(np.load(tmp_path / "r.npz"))
    model, state = (
        rbjax.load(tmp_path / "stiff.toml").model,
        rbjax.load(tmp_path / "stiff.toml").state,
    )
    sie = rbjax.SemiImplicitEuler()
    ref = rbjax.rollout(model, state, 0.01, 50, integrator=sie, throw=False)
    # the energy monitor sees the first step gain energy (the spring is unstable at 10 ms)
    assert run["result"] == int(rbjax.RESULTS.implausible) == int(ref.result)
    assert int(ref.failed_step) == run["failed_step"] == 0
    assert float(ref.monitors["energy"]) > 0.1
    # without the monitors it runs on until the state overflows, as one rollout finds it
    plain = rbjax.rollout(model, state, 0.01, 50, integrator=sie, throw=False, monitors=None)
    assert int(plain.result) == int(rbjax.RESULTS.nonfinite) and 20 < int(plain.failed_step) < 40
    assert np.all(np.isfinite(run["q"][:5]))  # the saved states before the overflow


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Files for the error paths, made without integrating anything: a model, a file that is
    not one, a foreign npz, a model file with a bad joint, and run files written directly
    (a single run, a batch of 5, and a run without reactions)."""
    d = tmp_path_factory.mktemp("inputs")
    pendulum(str(d / "pendulum.toml"))
    (d / "model.txt").write_text("not a model")
    np.savez(d / "foreign.npz", t=np.zeros(3))
    (d / "bad.toml").write_text(
        'format = "rbjax-model 1"\n[[bodies]]\nname = "a"\nmass = 1.0\n'
        'inertia = [1.0, 1.0, 1.0]\n[[joints]]\ntype = "Hinge"\n'
    )
    t = np.linspace(0.0, 0.1, 11)
    single = {
        "t": t,
        "q": np.zeros((11, 1, 7)),
        "body_names": np.array(["rod"]),
        "joint_names": np.array(["hinge"]),
        "qpos": np.zeros((11, 1)),
        "qpos_names": np.array(["hinge"]),
        "total_energy": np.zeros(11),
        "reaction_force": np.zeros((11, 1, 3)),
        "reaction_torque": np.zeros((11, 1, 3)),
    }
    runfile.write(str(d / "run.npz"), single, {"batch": None})
    runfile.write(
        str(d / "batch.npz"),
        {
            k: v if k == "t" or k.endswith("_names") else np.stack([v] * 5)
            for k, v in single.items()
        },
        {"batch": 5},
    )
    bare = {k: v for k, v in single.items() if not k.startswith("reaction")}
    runfile.write(str(d / "bare.npz"), bare, {"batch": None})
    return d


@pytest.mark.parametrize(
    "args, message",
    [
        (["simulate", "missing.toml"], "does not exist"),
        (["simulate", "{d}/model.txt"], "extension '.txt'"),
        (["simulate", "{m}", "--t", "0.0105"], "not a whole number of steps"),
        (["simulate", "{m}", "--dt", "-1"], "argument --dt: '-1' is not a positive number"),
        (["simulate", "{m}", "--t", "0.01", "--save-every", "3"], "--save-every 3 does not divide"),
        (["simulate", "{m}", "--perturb", "qpos=0.1"], "--perturb needs --batch"),
        (["simulate", "{m}", "--batch", "2", "--perturb", "angle=0.1"], "unknown name 'angle'"),
        (["simulate", "{m}", "--batch", "2", "--perturb", "qpos=big"], "'big' is not a number"),
        (["simulate", "{m}", "--batch", "2", "--perturb", "qpos"], "is not NAME=VALUE"),
        (["simulate", "{m}", "--batch", "2", "--perturb", "qpos=-1"], "is not a finite value >= 0"),
        (["simulate", "{m}", "--batch", "0"], "argument --batch: '0' is not a whole number"),
        (["simulate", "{m}", "--out", "{d}/run.txt"], "extension '.txt'"),
        (["simulate", "{m}", "--out", "{d}/no/such/run.npz"], "does not exist. Fix: create it"),
        (["simulate", "{m}", "--csv", "{d}/run.tsv"], "does not end in .csv"),
        (["simulate", "{m}", "--ctrl", "1,x"], "not a comma-separated list"),
        (["simulate", "{m}", "--ctrl", "1"], "control apply to MJCF/URDF files"),
        (["plot", "{d}/none.npz"], "does not exist"),
        (["plot", "{d}/model.txt"], "is not an .npz file"),
        (["plot", "{d}/foreign.npz"], "format '(none)'"),
        (["plot", "{d}/run.npz", "--sample", "2"], "the run is a single simulation"),
        (["plot", "{d}/batch.npz", "--sample", "7"], "--sample 7 is not in 0..4"),
        (["plot", "{d}/batch.npz", "--samples", "9"], "--samples 9 is not in 1..5"),
        (["plot", "{d}/run.npz", "--select", "elbow"], "matches no series"),
        (["plot", "{d}/bare.npz", "-q", "reactions"], "--no-reactions"),
        (["plot", "{d}/run.npz", "--out", "{d}/p.jpg"], "extension '.jpg'"),
        (["check", "{d}/missing.xml"], "does not exist"),
        (["check", "{d}/bad.toml"], "joints[0]"),
        (["check", "{m}", "--steps", "-1"], "argument --steps: '-1' is not a whole number"),
        (["check", "{m}", "--dt", "0"], "argument --dt: '0' is not a positive number"),
    ],
)
def test_input_errors_exit_2_naming_the_fix(inputs, capsys, args, message):
    d = inputs
    argv = [a.replace("{d}", str(d)).replace("{m}", str(d / "pendulum.toml")) for a in args]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rbjax {args[0]}: error: ") and message in err, err
    assert "Fix" in err


def test_usage_errors_and_help(capsys):
    assert main(["simulate"]) == 2  # argparse: MODEL is required
    assert "required: MODEL" in capsys.readouterr().err
    assert main(["simulate", "m.toml", "--integrator", "euler"]) == 2
    assert "invalid choice: 'euler'" in capsys.readouterr().err
    for command in ("simulate", "check", "plot", "animate", "identify", "bench"):
        assert main([command, "--help"]) == 0
        assert capsys.readouterr().out.startswith(f"usage: rbjax {command}")


def test_python_dash_m_and_exit_codes(tmp_path):
    """``python -m rbjax`` runs the same command line in a fresh interpreter, exit code included."""
    out = subprocess.run(
        [sys.executable, "-m", "rbjax", "check", str(tmp_path / "none.toml")],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "rbjax check: error: MODEL" in out.stderr


def test_segments_continue_with_one_compiled_program(inputs):
    """Regression: a model file's initial t is weakly typed; the first segment must hand the
    rollout a state with the types a rollout returns, or the second segment recompiles
    (measured: 10 s of a 0.2 s run of the driven pendulum)."""
    loaded = rbjax.load(inputs / "pendulum.toml")
    first = simulate._as_trajectory(loaded.model, loaded.state, True).final
    later = rbjax.rollout(loaded.model, loaded.state, 1e-3, 1, multipliers=True).final

    def types(state):
        return [(x.dtype, x.weak_type, x.shape) for x in jax.tree.leaves(state)]

    assert types(first) == types(later)
