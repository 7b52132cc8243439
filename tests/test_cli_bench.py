"""``rbjax bench``: a tiny run's table and JSON, the MuJoCo C peer, and every input error.

No timing assertions: the checks are on the fields and on their consistency (steps/s is the
batch times the steps over the run time), never on how fast anything is."""

import json
import math
import os

import pytest

from rbjax._cli import main

HERE = os.path.dirname(os.path.abspath(__file__))
PENDULUM = os.path.join(HERE, "..", "examples", "models", "double_pendulum.xml")
TINY = ["--steps", "5", "--repeats", "1", "--no-progress"]
FREE_BODY = """<mujoco><option timestep="0.002"/><worldbody><body pos="0 0 1"><freejoint/>
<geom type="box" size="0.1 0.2 0.3" density="1000"/></body></worldbody></mujoco>"""
HEADER = (
    "rbjax",
    "jax",
    "mujoco",
    "numpy",
    "python",
    "device",
    "platform",
    "cpu",
    "cpu_count",
    "model",
    "bodies",
    "dt",
    "steps",
    "repeats",
    "integrator",
    "dtype",
    "mujoco_peer",
)
ROW = (
    "engine",
    "model",
    "integrator",
    "dtype",
    "batch",
    "steps",
    "dt",
    "bodies",
    "compile_s",
    "run_s",
    "runs_s",
    "steps_per_s",
    "body_steps_per_s",
)


def test_tiny_run_writes_the_documented_json(tmp_path, capsys):
    """A free body (it compiles in about a second) at B = 1, 2: the header, one row per engine
    and batch size, consistent numbers. Its free joint also checks that the random initial
    quaternions are unit ones (rollout's input check passes) and that both engines use the
    file's step."""
    pytest.importorskip("mujoco")
    model, out = tmp_path / "free.xml", tmp_path / "bench.json"
    model.write_text(FREE_BODY)
    assert main(["bench", str(model), "--batch", "1,2", *TINY, "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "device: cpu" in text and "versions: rbjax" in text and "machine:" in text
    assert "| rbjax | free.xml | RK4 | float64 | 2 |" in text
    data = json.loads(out.read_text())
    head, rows = data["header"], data["rows"]
    assert set(HEADER) <= set(head)
    assert head["model"] == "free.xml" and head["bodies"] == 1 and head["cpu_count"] >= 1
    assert head["dt"] == 0.002 and head["steps"] == 5 and head["repeats"] == 1
    assert [(r["engine"], r["batch"]) for r in rows] == [
        ("rbjax", 1),
        ("mujoco-c", 1),
        ("rbjax", 2),
        ("mujoco-c", 2),
    ]
    for r in rows:
        assert set(ROW) <= set(r) and "error" not in r
        assert r["dt"] == 0.002 and r["bodies"] == 1 and r["steps"] == 5
        assert r["run_s"] > 0 and len(r["runs_s"]) == 1
        assert math.isclose(r["steps_per_s"], r["batch"] * 5 / r["run_s"], rel_tol=1e-12)
        assert math.isclose(r["body_steps_per_s"], r["steps_per_s"], rel_tol=1e-12)
        if r["engine"] == "rbjax":
            assert r["compile_s"] >= 0 and r["dtype"] == "float64"
        else:
            assert r["compile_s"] is None and r["threads"] == 1


def test_mujoco_peer_of_an_mjcf_model_and_no_mujoco(tmp_path, capsys):
    pytest.importorskip("mujoco")
    assert main(["bench", PENDULUM, "--batch", "1", *TINY]) == 0
    text = capsys.readouterr().out
    assert "| rbjax | double_pendulum.xml | RK4 | float64 | 1 |" in text
    assert "| mujoco-c (1 thread) | double_pendulum.xml | RK4 | float64 | 1 |" in text
    assert "rbjax steps/s / MuJoCo C steps/s: B = 1:" in text
    out = tmp_path / "bench.json"
    args = ["bench", PENDULUM, "--batch", "1", *TINY, "--no-mujoco", "--json", str(out)]
    assert main(args) == 0  # the same program, compiled once in this process
    assert "mujoco-c" not in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert [(r["engine"], r["bodies"]) for r in data["rows"]] == [("rbjax", 2)]
    assert data["header"]["mujoco_peer"] == "skipped (--no-mujoco)"


def test_built_in_model(tmp_path):
    """Without MODEL: the built-in double pendulum from random angles (rollout's joint checks
    pass, so the states are on the joints), no MuJoCo peer."""
    out = tmp_path / "bench.json"
    assert main(["bench", "--batch", "1", *TINY, "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["header"]["model"] == "chain2 (built in)"
    assert data["header"]["mujoco_peer"].startswith("none")
    assert [(r["engine"], r["bodies"]) for r in data["rows"]] == [("rbjax", 2)]
    assert data["rows"][0]["run_s"] > 0


@pytest.mark.parametrize(
    "args, option",
    [
        (["--batch", "1,x"], "--batch"),
        (["--batch", "0"], "--batch"),
        (["--batch", ""], "--batch"),
        (["--dtype", "float16"], "--dtype"),
        (["--integrator", "euler"], "--integrator"),
        (["--steps", "0"], "--steps"),
        (["--repeats=-1"], "--repeats"),
        (["--dt=-1e-3"], "--dt"),
        (["--batch-chunk", "-2"], "--batch-chunk"),
        ([PENDULUM, "--links", "3"], "--links"),
        (["no_such_model.xml"], "MODEL"),
        (["--json", os.path.join("no_such_folder", "out.json")], "--json"),
    ],
)
def test_input_errors_exit_2(args, option, capsys):
    """Each fails before anything is compiled, naming the option and the fix."""
    assert main(["bench", *args]) == 2
    err = capsys.readouterr().err
    assert option in err and ("Fix" in err or "invalid choice" in err)


def test_json_into_a_folder_path_exits_2(tmp_path, capsys):
    assert main(["bench", "--json", str(tmp_path)]) == 2
    assert "--json" in capsys.readouterr().err
