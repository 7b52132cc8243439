"""``rbjax identify CONFIG`` (rbjax/_cli/identify.py), through ``rbjax._cli.main``.

The reference is independent of the code under test: the data are a fine RK4 rollout
(dt = 1e-3 s) of a damped pendulum with TRUE parameters that the configuration does not
contain (its model file holds other, nominal values and its initial guesses are perturbed);
``rbjax identify`` must recover those true values from the data alone and exit 0. A parameter
the data cannot determine (the moments of inertia about axes the pendulum never turns about)
must exit 1 and be named. Every configuration error exits 2 with the field path in the
message, before anything is compiled.

The fits share one configuration shape, so the ``--max-steps 0 --json`` run reuses the
compiled residuals of the recovery fit (the build function is hashable by design).
"""

from __future__ import annotations

import json

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rbjax
from rbjax import quaternion as quat
from rbjax._cli import config, main
from rbjax._cli.common import CliError
from rbjax._cli.runfile import write as write_run

MODEL = """format = "rbjax-model 1"
gravity = [0.0, 0.0, -9.81]
timestep = 0.005

[[bodies]]
name = "rod"
mass = {mass}
inertia = [0.0833, 0.0833, 0.002]

[[joints]]
type = "Revolute"
name = "hinge"
body_i = "ground"
body_j = "rod"
s_i = [0.0, 0.0, 0.0]
s_j = [0.0, 0.0, 0.5]
z_i = [0.0, 1.0, 0.0]

[[forces]]
type = "RotationalSpringDamper"
body_i = "ground"
body_j = "rod"
axis_i = [0.0, 1.0, 0.0]
axis_j = [0.0, 1.0, 0.0]
ref_i = [1.0, 0.0, 0.0]
ref_j = [1.0, 0.0, 0.0]
stiffness = {stiffness}
damping = {damping}

[initial]
q = [[0.0, 0.0, -0.5, 1.0, 0.0, 0.0, 0.0]]
"""
NOMINAL = {"mass": 1.0, "damping": 0.2, "stiffness": 1.0}
TRUE = {"mass": 1.25, "damping": 0.08, "stiffness": 1.5}
QPOS0, QVEL0 = 1.0, 0.5  # rad, rad/s: the true release (the fit knows QPOS0, not QVEL0)
TIP = [0.0, 0.0, -0.5]  # m, the rod's far end, body axes
T_END, FINE, EVERY = 1.5, 1e-3, 50  # s; reference step [s]; samples every 50 steps (20 Hz)


def _toml(doc: dict) -> str:
    """A small TOML writer for the configurations below (tables, arrays of tables)."""

    def val(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {val(x)}" for k, x in v.items()) + " }"
        if isinstance(v, list):
            return "[" + ", ".join(val(x) for x in v) + "]"
        return repr(v)

    def is_tables(v):
        return isinstance(v, list) and v and all(isinstance(x, dict) for x in v)

    lines = [f"{k} = {val(v)}" for k, v in doc.items() if not (isinstance(v, dict) or is_tables(v))]
    for k, v in doc.items():
        if isinstance(v, dict):
            lines += [f"\n[{k}]"] + [f"{a} = {val(b)}" for a, b in v.items()]
        elif is_tables(v):
            for item in v:
                lines += [f"\n[[{k}]]"] + [f"{a} = {val(b)}" for a, b in item.items()]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The nominal and the true model files, and the data of the true model: a run file
    (q, u, qpos, qvel with names) and a plain .npz of tip markers, both 31 samples."""
    d = tmp_path_factory.mktemp("identify")
    (d / "nominal.toml").write_text(MODEL.format(**NOMINAL))
    (d / "true.toml").write_text(MODEL.format(**TRUE))
    model = rbjax.load(d / "true.toml").model
    state = rbjax.state_from_joint_coordinates(model, jnp.array([QPOS0]), jnp.array([QVEL0]))
    traj = rbjax.rollout(model, state, FINE, round(T_END / FINE), save_every=EVERY)
    q, u = np.asarray(traj.q), np.asarray(traj.u)  # (T, 1, 7)
    coordinates = eqx.filter_jit(jax.vmap(rbjax.joint_coordinates, in_axes=(None, 0)))
    qpos, qvel = coordinates(model, traj.states)
    t = np.asarray(traj.t)
    arrays = {
        "t": t,
        "q": q,
        "u": u,
        "qpos": np.asarray(qpos),
        "qvel": np.asarray(qvel),
        "qpos_names": np.array(["hinge"]),
        "qvel_names": np.array(["hinge"]),
        "body_names": np.array(["rod"]),
        "short": q[:-1, 0, :3],  # for the error tests: one sample short
        "flat": q[:, 0, 0],  # (T,): not a (T, 3) marker
    }
    write_run(str(d / "run.npz"), arrays, {"model": "true.toml"})
    tip = q[:, 0, :3] + np.asarray(quat.rotate(jnp.asarray(q[:, 0, 3:7]), jnp.asarray(TIP)))
    np.savez(d / "markers.npz", t=t, tip=tip)
    batch = {k: (np.stack([v, v]) if k in ("q", "u") else v) for k, v in arrays.items()}
    write_run(str(d / "batch.npz"), batch, {"batch": 2})
    return d


def _recovery_config() -> dict:
    """Mass, damping (by joint), stiffness (by force index) and the initial rate, from the
    tip position (computed from the run file's q) and the hinge rate (its qvel column)."""
    return {
        "model": "nominal.toml",
        "data": "run.npz",
        "dt": 0.01,
        "out": "fit.json",
        "state": {"qpos": {"hinge": QPOS0}},
        "observations": [
            {"kind": "position", "body": "rod", "point": TIP, "sigma": 1e-3},
            {"kind": "joint_velocity", "coordinate": "hinge", "sigma": 0.01},
        ],
        "parameters": [
            {"kind": "mass", "body": "rod"},
            {"kind": "damping", "joint": "hinge"},
            {"kind": "stiffness", "force": 0, "initial": 1.2},
            {"kind": "joint_velocity", "coordinate": "hinge", "initial": 0.0},
        ],
        "solver": {"name": "levenberg-marquardt", "max_steps": 60},
    }


def _write(d, doc: dict, name="config.toml"):
    path = d / name
    path.write_text(_toml(doc))
    return str(path)


def test_recovers_true_parameters(files, capsys):
    code = main(["identify", _write(files, _recovery_config())])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    fit = json.loads((files / "fit.json").read_text())
    truth = {
        "rod.mass": TRUE["mass"],
        "hinge.damping": TRUE["damping"],
        "forces[0].stiffness": TRUE["stiffness"],
        "hinge.qvel0": QVEL0,
    }
    assert fit["names"] == list(truth)
    assert fit["converged"] and fit["unidentifiable"] == []
    # noise-free data from a 10x finer RK4 rollout: the fit's RK4 at dt = 0.01 s recovers the
    # parameters to its truncation error, far below the 2 % to 60 % initial errors
    for name, value, std in zip(fit["names"], fit["values"], fit["std"], strict=True):
        assert value == pytest.approx(truth[name], rel=1e-5), name
        assert std is not None and 0 < std < truth[name], name
    assert fit["initial"] == [NOMINAL["mass"], NOMINAL["damping"], 1.2, 0.0]
    assert fit["steps"] >= 1 and fit["loss"] < 1e-6
    cov = np.asarray(fit["covariance"])
    np.testing.assert_allclose(np.sqrt(np.diag(cov)), fit["std"], rtol=1e-12)
    # the table shows every parameter with its initial and fitted value and says converged
    for name in truth:
        assert name in out
    assert "converged" in out and "NOT converged" not in out and "steps" in out


def test_json_out_and_max_steps_override(files, capsys, tmp_path):
    """--max-steps 0 evaluates the start only: not converged, exit 1; --json prints the
    results on stdout (the table on stderr), --out overrides the config's out. (L-BFGS with
    4 parameters evaluates by forward mode too: the recovery fit's compiled code is reused.)"""
    out_path = tmp_path / "start.json"
    doc = _bad(solver__name="lbfgs")(_recovery_config())
    argv = ["identify", _write(files, doc, "lbfgs.toml"), "--max-steps", "0", "--json"]
    code = main(argv + ["--out", str(out_path)])
    out, err = capsys.readouterr()
    assert code == 1
    result = json.loads(out)
    assert result == json.loads(out_path.read_text())
    assert result["steps"] == 0 and not result["converged"] and result["solver"] == "lbfgs"
    np.testing.assert_allclose(result["values"], result["initial"], rtol=1e-14)
    assert "NOT converged" in err and "max-steps" in err


def test_unidentifiable_inertia_exits_1_and_names_it(files, capsys):
    """The pendulum turns about body y only: Euler's equations see Iyy, never Ixx or Izz. The
    fit recovers Iyy (true 0.0833 from 0.1, from a plain marker array) and exits 1 naming the
    other two."""
    doc = {
        "model": "true.toml",
        "data": "markers.npz",
        "dt": 0.01,
        "state": {"qpos": {"hinge": QPOS0}, "qvel": {"hinge": QVEL0}},
        "observations": [
            {"kind": "position", "body": "rod", "point": TIP, "array": "tip", "sigma": 1e-3}
        ],
        "parameters": [{"kind": "inertia", "body": "rod", "initial": [0.09, 0.1, 0.003]}],
        "solver": {"name": "levenberg-marquardt", "max_steps": 100},
    }
    code = main(["identify", _write(files, doc, "inertia.toml"), "--json"])
    out, err = capsys.readouterr()
    assert code == 1, out + err
    result = json.loads(out)
    assert result["names"] == ["rod.Ixx", "rod.Iyy", "rod.Izz"]
    assert result["unidentifiable"] == ["rod.Ixx", "rod.Izz"]
    assert result["std"][0] is None and result["std"][2] is None
    assert result["values"][1] == pytest.approx(0.0833, rel=1e-5)
    assert "do not determine rod.Ixx, rod.Izz" in err
    assert "log rod.Ixx" in err  # the direction, in the fitted coordinates


def test_bounds_keep_the_estimate_and_its_delta_method_error(files, capsys):
    """Every parameter bounded (``bounds = [low, high]``, fitted as rbjax.Bounded's raw value)
    by intervals that hold the truth: the same estimates as the unbounded recovery fit, and
    the same standard errors (the delta method through d value/d raw is exact for a one-to-one
    reparameterisation at the minimum). Bounds that exclude the true mass stop it at its
    bound, inside the interval, and the fit exits 1 saying so and how to fix it."""
    doc = _recovery_config()
    doc["out"] = "bounded.json"
    for p, lo_hi in zip(
        doc["parameters"], ([0.5, 2.0], [0.0, 1.0], [0.5, 3.0], [-2.0, 2.0]), strict=True
    ):
        p["bounds"] = lo_hi
    code = main(["identify", _write(files, doc, "bounded.toml")])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    fit = json.loads((files / "bounded.json").read_text())
    assert fit["converged"] and fit["unidentifiable"] == []
    truth = [TRUE["mass"], TRUE["damping"], TRUE["stiffness"], QVEL0]
    np.testing.assert_allclose(fit["values"], truth, rtol=1e-5)
    # the unbounded fit's standard errors, in its own coordinates (log for the first three)
    main(["identify", _write(files, _recovery_config()), "--json"])
    plain = json.loads(capsys.readouterr().out)
    np.testing.assert_allclose(fit["std"], plain["std"], rtol=1e-4)

    doc["parameters"][0]["bounds"] = [0.5, 1.1]  # the true mass is 1.25
    doc["parameters"][0]["initial"] = 1.0
    code = main(["identify", _write(files, doc, "pinned.toml"), "--json"])
    out, err = capsys.readouterr()
    assert code == 1, out + err
    result = json.loads(out)
    assert 1.1 - 1e-5 < result["values"][0] < 1.1  # held by the bound, inside it
    assert result["at_bound"] == ["rod.mass"] and result["unidentifiable"] == []
    assert "the fit ended at a bound (rod.mass = 1.1 in [0.5, 1.1])" in err, err
    assert "widen the bounds" in err and "do not determine" not in err


def _bad(**change):
    """The recovery configuration with ``change`` applied: key "a.b.0.c" sets
    doc["a"]["b"][0]["c"]; a value of None deletes the key."""

    def apply(doc):
        for key, value in change.items():
            *head, last = key.split("__")
            node = doc
            for h in head:
                node = node[int(h)] if isinstance(node, list) else node[h]
            if isinstance(node, list):
                node[int(last)] = value
            elif value is None:
                del node[last]
            else:
                node[last] = value
        return doc

    return apply


ERRORS = [
    (_bad(model=None), "model: is missing"),
    (_bad(modle="x.toml"), "modle: is not a known key"),
    (_bad(model="nowhere.toml"), "model: MODEL"),
    (_bad(data="nowhere.npz"), "data: "),
    (_bad(dt=0.0), "dt: is 0.0, not > 0"),
    (_bad(dt="fast"), "dt: is 'fast', not a finite number"),
    (_bad(integrator="euler"), "integrator: is 'euler'"),
    (_bad(sample=0), "sample: is given but the data is not a batch"),
    (_bad(data="batch.npz"), "sample: is missing: the data is a batch of 2 runs"),
    (_bad(data="batch.npz", sample=2), "sample: is 2. Fix: give an integer in [0, 2)"),
    (_bad(out="fit.txt"), "out: 'fit.txt' is not a .json path"),
    (_bad(state__qpos={"knee": 1.0}), "state.qpos.knee: unknown coordinate 'knee' (coordinates: hinge)"),
    (_bad(state__qvel={"hinge": [1.0, 2.0]}), "state.qvel.hinge: is [1.0, 2.0], not 1 number"),
    (_bad(state__qpos=3), "state.qpos: is 3, not a table. Fix: write it as a TOML table [state.qpos]."),
    (_bad(parameters=[]), "parameters: is [], not a non-empty array of tables"),
    (_bad(parameters__0__body="rd"), "parameters[0].body: unknown body 'rd' (bodies: rod). Fix:"),
    (_bad(parameters__0__bdy="rod"), "parameters[0].bdy: is not a known key"),
    (_bad(parameters__0__kind="masss"), "parameters[0].kind: is 'masss'. Fix: use one of mass"),
    (_bad(parameters__0__initial="heavy"), "parameters[0].initial: is 'heavy'"),
    (_bad(parameters__0__initial=-1.0), "parameters[0].initial: is -1.0: a mass is fitted as a logarithm"),
    (_bad(parameters__0__point=[0.0, 0.0, 0.0]), "parameters[0].point: is not a known key"),
    (_bad(parameters__0__bounds=[2.0, 1.0]), "parameters[0].bounds: is [2.0, 1.0]: low >= high"),
    (_bad(parameters__0__bounds=[-1.0, 2.0]), "parameters[0].bounds: is [-1.0, 2.0]: a mass must stay positive"),
    (_bad(parameters__0__bounds=[1.0]), "parameters[0].bounds: is [1.0], not the interval [low, high]"),
    (_bad(parameters__2__bounds=[2.0, 3.0]), "parameters[2].initial: is 1.2, not strictly inside bounds = [2, 3]"),
    (_bad(parameters__1__joint="hnge"), "parameters[1].joint: unknown joint 'hnge' (joints: hinge)"),
    (_bad(parameters__1__force=0), "parameters[1]: has both force and joint"),
    (_bad(parameters__2__force=3), "parameters[2].force: is 3, not an index of the model's forces (0: RotationalSpringDamper ground-rod)"),
    (_bad(parameters__3__coordinate="elbow"), "parameters[3].coordinate: unknown coordinate 'elbow'"),
    (_bad(parameters__3__kind="joint_position", parameters__3__initial=[1.0, 2.0]), "parameters[3].initial"),
    (_bad(parameters__2__kind="damping", parameters__2__force=0), "parameters[2]: fits the same quantity as parameters[1]"),
    (_bad(observations__0__kind="acceleration"), "observations[0].kind: is 'acceleration'"),
    (_bad(observations__0__body="rood"), "observations[0].body: unknown body 'rood' (bodies: rod)"),
    (_bad(observations__0__sigma=None), "observations[0].sigma: is missing"),
    (_bad(observations__0__sigma=-1.0), "observations[0].sigma: is -1.0, not a positive number"),
    (_bad(observations__0__point=[0.0, 0.5]), "observations[0].point: is [0.0, 0.5], not a point"),
    (_bad(observations__0__array="marker"), "observations[0].array: the data has no array 'marker'"),
    (_bad(observations__0__array="short"), "observations[0].array: array 'short' has shape (30, 3): 30 samples, but 't' has 31"),
    (_bad(observations__0__array="flat"), "observations[0].array: array 'flat' has shape (31,)"),
    (_bad(observations__1__coordinate="knee"), "observations[1].coordinate: unknown coordinate 'knee'"),
    (_bad(observations__1__frame="body"), "observations[1].frame: is not a known key"),
    (_bad(solver__name="newton"), "solver.name: is 'newton'. Fix: use one of levenberg-marquardt, lbfgs"),
    (_bad(solver__max_steps=-3), "solver.max_steps: is -3, not an integer >= 0"),
    (_bad(solver__steps=3), "solver.steps: is not a known key"),
]  # fmt: skip


@pytest.mark.parametrize("change, message", ERRORS, ids=[m.split(":")[0] for _, m in ERRORS])
def test_config_errors_exit_2_naming_the_field(files, capsys, change, message):
    path = _write(files, change(_recovery_config()), "bad.toml")
    code = main(["identify", path])
    out, err = capsys.readouterr()
    assert code == 2, out + err
    assert message in err, err
    assert "Fix:" in err and err.count("\n") == 1, err  # one line that says what to fix
    assert "Compiling" not in out  # refused before any work


def test_file_and_option_errors_exit_2(files, capsys):
    bad = files / "syntax.toml"
    bad.write_text('model = "nominal.toml"\ndata = \n')
    assert main(["identify", str(bad)]) == 2
    assert "is not valid TOML" in capsys.readouterr().err
    assert main(["identify", str(files / "absent.toml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    cfg = _write(files, _recovery_config())
    assert main(["identify", cfg, "--out", str(files / "fit.csv")]) == 2
    assert "--out" in capsys.readouterr().err
    assert main(["identify", cfg, "--max-steps", "-1"]) == 2
    assert "argument --max-steps: '-1'" in capsys.readouterr().err


def test_help_documents_the_format(capsys):
    assert main(["identify", "--help"]) == 0
    text = capsys.readouterr().out
    for word in (
        "[[observations]]",
        "[[parameters]]",
        "joint_velocity",
        "levenberg-marquardt",
        "exit",
    ):
        assert word in text


def test_integrators_by_name():
    """The commands' one table of integrators: each name makes a fresh integrator, in the
    order identify lists them; projected-rk4 is RK4 followed by rbjax.Projected's projection."""
    from rbjax._cli.common import INTEGRATORS

    assert list(INTEGRATORS) == ["rk4", "projected-rk4", "implicit-midpoint", "semi-implicit-euler"]
    for name, make in INTEGRATORS.items():
        assert isinstance(make(), rbjax.AbstractIntegrator), name
    projected = INTEGRATORS["projected-rk4"]()
    assert isinstance(projected, rbjax.Projected) and isinstance(projected.base, rbjax.RK4)


READER_ERRORS = [
    (lambda: config.table("solver", {"nme": 1}, ("name",)), "solver.nme: is not a known key. Fix: use one of name."),
    (lambda: config.table("", {}, ("model",), ("model",)), "model: is missing. Fix: add it."),
    (lambda: config.table("state", 5, ("qpos",)), "state: is 5, not a table. Fix: write it as a TOML table [state]."),
    (lambda: config.tables("observations", {}), "observations: is {}, not a non-empty array of tables. Fix: add [[observations]] tables."),
    (lambda: config.number("dt", float("nan"), example="0.01"), "dt: is nan, not a finite number. Fix: write e.g. dt = 0.01."),
    (lambda: config.number("dt", True), "dt: is True, not a finite number"),
    (lambda: config.number("dt", -1, positive=True), "dt: is -1, not > 0. Fix: give a positive value, e.g. 1.0."),
    (lambda: config.integer("solver.segments", 1.0, minimum=1, example="segments = 4"), "solver.segments: is 1.0, not an integer >= 1. Fix: write e.g. segments = 4."),
    (lambda: config.string("kind", 3), "kind: is 3, not a string"),
    (lambda: config.string("kind", "mas", ("mass", "inertia")), "kind: is 'mas'. Fix: use one of mass, inertia."),
    (lambda: config.array("p", [1, "a"], (2,), "two numbers"), "p: is [1, 'a'], not a list of numbers. Fix: write two numbers."),
    (lambda: config.array("p", [1.0, float("inf")], (2,), "two numbers"), "p: is [1.0, inf], not two numbers. Fix: write two numbers."),
    (lambda: config.resolve("b", "x", [], "body"), "b: unknown body 'x' (bodies: none). Fix: use one of these body names."),
]  # fmt: skip


@pytest.mark.parametrize(
    "read, message", READER_ERRORS, ids=[m.split(":")[0] for _, m in READER_ERRORS]
)
def test_config_readers_name_the_field_and_the_fix(read, message):
    """The readers of rbjax/_cli/config.py: one CliError line, field path first, then the fix."""
    with pytest.raises(CliError) as info:
        read()
    assert str(info.value).startswith(message), str(info.value)


def test_config_readers_return_the_value():
    assert config.number("dt", 2) == 2.0 and type(config.number("dt", 2)) is float
    assert config.integer("n", 3, minimum=0, example="n = 3") == 3
    assert config.string("kind", "mass", ("mass",)) == "mass"
    np.testing.assert_array_equal(config.array("p", [[1, 2]], (1, 2), "a row"), [[1.0, 2.0]])
    assert config.array("m", 1.5, (), "a mass").shape == ()
    assert config.resolve("b", "rod", ["ground", "rod"], "body") == 1
    assert config.table("s", {"a": 1}, ("a", "b"), ("a",)) == {"a": 1}


STIFF_HINGE = """<mujoco>
  <option timestep="0.01" integrator="{integrator}"/>
  <worldbody>
    <body name="rod"><joint name="hinge" type="hinge" axis="0 1 0" damping="50"/>
      <geom type="capsule" fromto="0 0 0 0 0 -0.5" size="0.02" mass="1"/></body>
  </worldbody>
</mujoco>"""


def test_identify_follows_the_files_integrator(tmp_path):
    """Without an integrator in the configuration, identify integrates as ``rbjax simulate``
    does (rbjax/_cli/common.py ``integrator_for``): joint coordinates of a file that asks
    MuJoCo for implicitfast (or implicit) with rbjax.ImplicitFast, anything else with RK4;
    the configuration's integrator wins. Only the configuration is prepared (nothing is
    compiled)."""
    from rbjax._cli import identify as cli_identify, parser

    t = np.arange(5) * 0.01
    np.savez(tmp_path / "m.npz", t=t, qpos=0.1 * t[:, None], qpos_names=np.array(["hinge"]))
    lines = ['data = "m.npz"', "[[observations]]", 'kind = "joint_position"']
    lines += ['coordinate = "hinge"', "sigma = 1e-3", "[[parameters]]", 'kind = "damping"']
    lines += ['joint = "hinge"', "initial = 40.0"]
    cases = [  # (file's integrator, configuration's, --coordinates, the integrator used)
        ("implicitfast", None, None, rbjax.ImplicitFast),
        ("implicit", None, None, rbjax.ImplicitFast),
        ("RK4", None, None, rbjax.RK4),
        ("Euler", None, None, rbjax.RK4),
        ("implicitfast", "rk4", None, rbjax.RK4),
        ("implicitfast", None, "maximal", rbjax.RK4),
    ]
    for k, (in_file, in_config, coordinates, expected) in enumerate(cases):
        (tmp_path / f"h{k}.xml").write_text(STIFF_HINGE.format(integrator=in_file))
        head = [f'model = "h{k}.xml"'] + ([f'integrator = "{in_config}"'] if in_config else [])
        cfg = tmp_path / f"c{k}.toml"
        cfg.write_text("\n".join(head + lines) + "\n")
        argv = ["identify", str(cfg)] + (["--coordinates", coordinates] if coordinates else [])
        prob = cli_identify._prepare(parser().parse_args(argv))
        assert type(prob.integrator) is expected, (in_file, in_config, coordinates)
