"""Issue 36's command-line probes: no hang, no late failure, and the exit-code contract.

Each probe of the campaign is reproduced: a divisor search over 10^300 candidates
(``simulate --dt 1e-300``), a batch built before its size was checked and compared with the
machine's TOTAL memory, outputs found unwritable only after the simulation, and tracebacks
with exit 1 for MuJoCo compile errors, bad run files, non-UTF-8 inputs and numbers that no
run can use. Every user error now exits 2 with ONE line ``rbjax CMD: error: ... Fix: ...``,
before anything is built (the work of each command is replaced by a tripwire in the table);
the references are what the code did not compute: brute-force divisors, the run file's own
arrays against the memory estimate, the file's inertials, a URDF written without meshes.
A hypothesis strategy, biased to invalid values, walks random argument lists over the six
commands: an invalid list must exit 2 with one line, a valid one 0, 1 or 2.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, event, example, given, settings, strategies as st

import rbjax
from rbjax._cli import animate, bench, check, main, runfile, simulate

HAS_MUJOCO = importlib.util.find_spec("mujoco") is not None
needs_mujoco = pytest.mark.skipif(not HAS_MUJOCO, reason="MJCF/URDF need mujoco")
L = 0.5  # the pendulum's pivot-to-centre length [m]

MISSING_MESH = """<mujoco><asset><mesh name="m" file="nowhere.stl"/></asset>
<worldbody><body name="bob"><joint type="hinge"/><geom type="mesh" mesh="m"/></body></worldbody>
</mujoco>"""
INERTIAL_MESH = """<mujoco><compiler inertiafromgeom="{mode}"/><asset><mesh name="m" file="nowhere.stl"/></asset>
<worldbody><body name="bob" pos="0 0 1"><joint type="hinge" axis="0 1 0"/>
<inertial pos="0 0 -0.5" mass="2" diaginertia="0.03 0.03 0.002"/><geom type="mesh" mesh="m"/>
<geom type="sphere" size="0.05" pos="0 0 -0.5"/></body></worldbody></mujoco>"""
# A URDF as robot_descriptions / example-robot-data ship them: inertials on every link,
# visual and collision meshes named by ROS package:// URIs.
PACKAGE_URDF = """<?xml version="1.0"?>
<robot name="arm">
  <link name="base">
    <inertial><mass value="2.0"/><inertia ixx="0.01" ixy="0" ixz="0" iyy="0.01" iyz="0" izz="0.01"/></inertial>
    <visual><geometry><mesh filename="package://arm_description/meshes/base.dae"/></geometry></visual>
    <collision><geometry><mesh filename="package://arm_description/meshes/base.stl"/></geometry></collision>
  </link>
  <link name="upper">
    <inertial><origin xyz="0 0 -0.25"/><mass value="1.25"/><inertia ixx="0.02" ixy="0" ixz="0" iyy="0.021" iyz="0" izz="0.002"/></inertial>
    <visual><origin xyz="0 0 -0.25"/><geometry><mesh filename="package://arm_description/meshes/upper.dae"/></geometry></visual>
    <collision><origin xyz="0 0 -0.25"/><geometry><mesh filename="package://arm_description/meshes/upper.stl" scale="1 1 1"/></geometry></collision>
    <collision><origin xyz="0 0 -0.25"/><geometry><cylinder radius="0.03" length="0.5"/></geometry></collision>
  </link>
  <joint name="shoulder" type="continuous">
    <parent link="base"/><child link="upper"/><origin xyz="0 0 1.0"/><axis xyz="0 1 0"/>
  </joint>
</robot>
"""


def _pendulum(path):
    """A rod of 1 kg on a revolute about world y, released 0.7 rad from hanging."""
    th = 0.7
    hanging = np.array([[0.0, 0.0, -L, 1.0, 0.0, 0.0, 0.0]])
    joint = rbjax.Revolute.at(hanging, rbjax.GROUND, 0, point=(0, 0, 0), axis=(0, 1, 0))
    model = rbjax.Model(
        [rbjax.Body(1.0, np.diag([0.02, 0.021, 0.002]), name="rod")],
        joints=[joint],
        gravity=(0.0, 0.0, -9.81),
    )
    state = rbjax.make_state(
        position=[[-L * np.sin(th), 0.0, -L * np.cos(th)]],
        quaternion=[[np.cos(th / 2), 0.0, np.sin(th / 2), 0.0]],
    )
    rbjax.save(path, model, state, timestep=1e-3)


def _run_arrays(batch=None, t_size=3):
    """The arrays of a consistent run file of the pendulum (1 body, 1 joint), written
    directly: nothing is integrated."""
    lead = () if batch is None else (batch,)
    q = np.zeros((*lead, t_size, 1, 7))
    q[..., 3] = 1.0
    per_time = {
        "q": q,
        "u": np.zeros((*lead, t_size, 1, 7)),
        "qpos": np.zeros((*lead, t_size, 1)),
        "qvel": np.zeros((*lead, t_size, 1)),
        "kinetic_energy": np.zeros((*lead, t_size)),
        "potential_energy": np.zeros((*lead, t_size)),
        "total_energy": np.zeros((*lead, t_size)),
        "linear_momentum": np.zeros((*lead, t_size, 3)),
        "angular_momentum": np.zeros((*lead, t_size, 3)),
        "position_residual": np.full((*lead, t_size), 1e-12),  # drawn on a log scale
        "velocity_residual": np.full((*lead, t_size), 1e-12),
        "reaction_force": np.zeros((*lead, t_size, 1, 3)),
        "reaction_torque": np.zeros((*lead, t_size, 1, 3)),
    }
    return per_time | {
        "t": 0.02 * np.arange(t_size),
        "body_names": np.array(["rod"]),
        "joint_names": np.array(["joint0"]),
        "qpos_names": np.array(["joint0"]),
        "qvel_names": np.array(["joint0"]),
        "result": np.zeros(lead, np.int32),
        "failed_step": np.full(lead, -1, np.int64),
    }


def _raw_run(path, arrays, meta="{}", fmt=runfile.FORMAT):
    """An .npz with the run file's format string and a raw ``meta`` (None: no meta)."""
    extra = {"format": np.asarray(fmt)} | ({} if meta is None else {"meta": np.asarray(meta)})
    np.savez(path, **arrays, **extra)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Every input of the table, made without integrating anything."""
    d = tmp_path_factory.mktemp("reliability_cli")
    _pendulum(str(d / "p.toml"))
    (d / "dir.npz").mkdir()
    (d / "dir.png").mkdir()
    (d / "out").mkdir()
    (d / "empty.toml").write_bytes(b"")
    (d / "empty.xml").write_bytes(b"")
    (d / "empty.npz").write_bytes(b"")
    garbage = bytes(range(256)) * 4  # binary: NUL bytes, 0x80-0xff (not UTF-8)
    for name in ("garbage.toml", "garbage.xml", "garbage.npz", "garbage_cfg.toml"):
        (d / name).write_bytes(garbage)
    (d / "latin1.toml").write_bytes('format = "rbjax-model 1"\n# Düsseldorf\n'.encode("latin-1"))
    (d / "latin1_cfg.toml").write_bytes('model = "p.toml"  # Müller\n'.encode("latin-1"))
    (d / "model.txt").write_text("not a model")
    p_toml = (d / "p.toml").read_text()
    (d / "string_mass.toml").write_text(p_toml.replace("mass = 1.0", 'mass = "heavy"', 1))
    (d / "string_size.xml").write_text(
        '<mujoco><worldbody><body><joint type="hinge"/><geom size="abc"/></body></worldbody></mujoco>'
    )
    (d / "missing_mesh.xml").write_text(MISSING_MESH)
    (d / "package.urdf").write_text(PACKAGE_URDF)
    # run files: good ones, and one per way of being wrong
    runfile.write(str(d / "good.npz"), _run_arrays(), {"model": "p.toml", "batch": None})
    runfile.write(str(d / "batch.npz"), _run_arrays(batch=2), {"model": "p.toml", "batch": 2})
    good = _run_arrays()
    (d / "text.npz").write_text("t,q\n0,1\n")
    with open(d / "good.npz", "rb") as fh:
        (d / "truncated.npz").write_bytes(fh.read()[:300])
    np.savez(d / "pickled.npz", t=np.zeros(3), q=np.array([{"x": 1}], dtype=object))
    np.savez(d / "foreign.npz", t=np.zeros(3))
    _raw_run(d / "no_meta.npz", good, meta=None)
    _raw_run(d / "bad_meta.npz", good, meta="{batch: 2")
    _raw_run(d / "list_meta.npz", good, meta="[1, 2]")
    _raw_run(d / "word_batch.npz", good, meta='{"batch": "two"}')
    _raw_run(d / "no_t.npz", {k: v for k, v in good.items() if k != "t"})
    _raw_run(d / "no_q.npz", {k: v for k, v in good.items() if k != "q"})
    _raw_run(d / "q_shape.npz", good | {"q": np.zeros((3, 1, 6))})
    _raw_run(d / "t_order.npz", good | {"t": np.array([0.0, 0.2, 0.1])})
    _raw_run(d / "energy_shape.npz", good | {"total_energy": np.zeros(4)})
    _raw_run(d / "names_type.npz", good | {"body_names": np.zeros(1)})
    _raw_run(d / "unbatched.npz", good, meta='{"batch": 5}')
    _raw_run(d / "no_energy.npz", {k: v for k, v in good.items() if "energy" not in k})
    # identify configurations pointing at the model and at bad data
    config = (
        'model = "p.toml"\ndata = "{data}"\n[[observations]]\nkind = "position"\nbody = "rod"\n'
        'sigma = 1e-3\n[[parameters]]\nkind = "mass"\nbody = "rod"\n'
    )
    for data in ("garbage.npz", "bad_meta.npz", "unbatched.npz", "dir.npz"):
        sample = "sample = 0\n" if data == "unbatched.npz" else ""
        (d / f"cfg_{data[:-4]}.toml").write_text(sample + config.format(data=data))
    (d / "cfg_out.toml").write_text('out = "/proc/fit.json"\n' + config.format(data="good.npz"))
    return d


# ----------------------------------------------------------------------------- the table
BAD_POSITIVE = ["0", "-1", "nan", "inf", "-inf", "1e400", "abc", ""]
BAD_COUNT = ["0", "-1", "nan", "inf", "1.5", "1e3", "10000000000000", "abc", ""]
BAD_COUNT0 = ["-1", "nan", "inf", "1.5", "10000000000000", "abc", ""]  # 0 is valid
BAD_INDEX = ["-1", "nan", "1.5", "abc", "", "10000000000000"]
BAD_SEED = ["-1", "nan", "1.5", "abc", "", str(2**63)]
BAD_DPI = ["0", "-1", "nan", "inf", "5", "100000", "abc"]
BAD_PAIR = ["1", "1,2,3", "nan,1", "1,inf", "a,b", ""]
# command -> (arguments before the option, {option: bad values})
NUMERIC = {
    "simulate": (
        ["{m}"],
        {
            "--t": BAD_POSITIVE,
            "--dt": BAD_POSITIVE,
            "--save-every": BAD_COUNT,
            "--batch": BAD_COUNT,
            "--seed": BAD_SEED,
            "--max-steps": BAD_COUNT,
            "--ctrl": ["nan", "1,inf", "x", ""],
        },
    ),
    "check": (
        ["{m}"],
        {
            "--tol": BAD_POSITIVE,
            "--dt": BAD_POSITIVE,
            "--drift": BAD_POSITIVE,
            "--steps": BAD_COUNT0 + ["1000000"],
        },
    ),
    "plot": (
        ["{d}/good.npz"],
        {"--dpi": BAD_DPI, "--sample": BAD_INDEX, "--samples": BAD_COUNT},
    ),
    "animate": (
        ["{m}", "{d}/good.npz", "--out", "{d}/a.gif"],
        {
            "--fps": BAD_POSITIVE + ["5000"],
            "--dpi": BAD_DPI,
            "--every": BAD_COUNT,
            "--sample": BAD_INDEX,
            "--view": BAD_PAIR,
            "--size": BAD_PAIR + ["0,1", "-1,2"],
        },
    ),
    "identify": (["{d}/missing.toml"], {"--max-steps": BAD_COUNT0}),
    "bench": (
        [],
        {
            "--batch": BAD_COUNT + ["1,x", "1,0"],
            "--steps": BAD_COUNT,
            "--repeats": BAD_COUNT + ["5000"],
            "--dt": BAD_POSITIVE,
            "--links": BAD_COUNT + ["100000"],
            "--batch-chunk": BAD_INDEX,
            "--seed": BAD_SEED,
            "--max-steps": BAD_COUNT,
        },
    ),
}
NUMERIC_ROWS = [
    pytest.param(
        [cmd, *before, f"{option}={value}"], f"argument {option}", id=f"{cmd} {option}={value}"
    )
    for cmd, (before, options) in NUMERIC.items()
    for option, values in options.items()
    for value in values
]


def _row(args, message, marks=()):
    return pytest.param(args, message, marks=marks, id=" ".join(args).replace("{d}/", ""))


FILE_ROWS = [
    # model files: missing, a folder, empty, binary, not UTF-8, a word for a number, extension
    _row(["simulate", "{d}/missing.toml"], "does not exist"),
    _row(["simulate", "{d}"], "is a folder"),
    _row(["check", "{d}/dir.npz"], "is a folder"),
    _row(["check", "{d}/empty.toml"], "format"),
    _row(["check", "{d}/garbage.toml"], ""),  # the model-file reader's own message
    _row(["check", "{d}/latin1.toml"], ""),  # (rbjax/_io/modelfile.py)
    _row(["check", "{d}/string_mass.toml"], "mass"),
    _row(["simulate", "{d}/model.txt"], "extension '.txt'"),
    _row(["simulate", "{m}", "--no-meshes"], "MJCF/URDF"),
    # MuJoCo's compiler: malformed XML, a word in a number, a missing mesh, package:// URIs
    _row(["check", "{d}/empty.xml"], "not well-formed XML", needs_mujoco),
    _row(["check", "{d}/garbage.xml"], "not well-formed XML", needs_mujoco),
    _row(["check", "{d}/string_size.xml"], "bad format in attribute 'size'", needs_mujoco),
    _row(["simulate", "{d}/missing_mesh.xml"], "put 'nowhere.stl' where", needs_mujoco),
    _row(["bench", "{d}/missing_mesh.xml"], "nowhere.stl", needs_mujoco),
    _row(
        ["animate", "{d}/missing_mesh.xml", "{d}/good.npz", "--out", "{d}/a.gif"],
        "nowhere.stl",
        needs_mujoco,
    ),
    _row(["check", "{d}/package.urdf"], "package://arm_description/", needs_mujoco),
    _row(["simulate", "{d}/package.urdf"], "--no-meshes", needs_mujoco),
    _row(
        ["check", "{d}/missing_mesh.xml", "--no-meshes"], "'bob' come from the geoms", needs_mujoco
    ),
    # outputs that cannot be written, found before any work
    _row(["simulate", "{m}", "--out", "/proc/x.npz"], "cannot write in folder '/proc'"),
    _row(["simulate", "{m}", "--out", "{d}/dir.npz"], "is a folder"),
    _row(["simulate", "{m}", "--out", "{d}/none/x.npz"], "does not exist"),
    _row(["simulate", "{m}", "--csv", "/proc/x.csv"], "--csv '/proc/x.csv': cannot write"),
    _row(["plot", "{d}/good.npz", "--out", "/proc/x.png"], "cannot write in folder"),
    _row(["plot", "{d}/good.npz", "--out", "{d}/dir.png"], "is a folder"),
    _row(["animate", "{m}", "{d}/good.npz", "--out", "/proc/x.gif"], "cannot write"),
    _row(["identify", "{d}/cfg_garbage.toml", "--out", "/proc/fit.json"], "cannot write"),
    _row(["identify", "{d}/cfg_out.toml"], "out (CONFIG) '/proc/fit.json'"),
    _row(["bench", "--json", "/proc/bench.json"], "cannot write"),
    _row(["bench", "--json", "{d}/out"], "is a folder"),
    # run files
    _row(["plot", "{d}/missing.npz"], "does not exist"),
    _row(["plot", "{d}/dir.npz"], "is a folder"),
    _row(["plot", "{d}/empty.npz"], "is an empty file"),
    _row(["plot", "{d}/garbage.npz"], "is not an .npz file"),
    _row(["plot", "{d}/text.npz"], "is not an .npz file"),
    _row(["plot", "{m}"], "is not an .npz file"),
    _row(["plot", "{d}/truncated.npz"], "is not a readable .npz file"),
    _row(["plot", "{d}/pickled.npz"], "is not a readable .npz file"),
    _row(["plot", "{d}/foreign.npz"], "format '(none)'"),
    _row(["plot", "{d}/no_meta.npz"], "has no array 'meta'"),
    _row(["plot", "{d}/bad_meta.npz"], "'meta' is not a JSON table"),
    _row(["plot", "{d}/list_meta.npz"], "'meta' is not a JSON table"),
    _row(["plot", "{d}/word_batch.npz"], "meta 'batch' is 'two'"),
    _row(["plot", "{d}/no_t.npz"], "array 't' is missing"),
    _row(["plot", "{d}/no_q.npz"], "array 'q' is missing"),
    _row(["plot", "{d}/q_shape.npz"], "array 'q' has shape (3, 1, 6)"),
    _row(["plot", "{d}/t_order.npz"], "array 't' is not increasing"),
    _row(["plot", "{d}/energy_shape.npz"], "array 'total_energy' has shape (4,)"),
    _row(["plot", "{d}/names_type.npz"], "array 'body_names'"),
    _row(["plot", "{d}/unbatched.npz"], "array 'q' has shape (3, 1, 7)"),
    _row(["plot", "{d}/no_energy.npz", "-q", "energy"], "has no kinetic_energy"),
    _row(["animate", "{m}", "{d}/bad_meta.npz", "--out", "{d}/a.gif"], "'meta'"),
    _row(["animate", "{m}", "{d}/q_shape.npz", "--out", "{d}/a.gif"], "array 'q'"),
    _row(
        ["animate", "{m}", "{d}/good.npz", "--out", "{d}/a.gif", "--size", "100,100"],
        "pixels a frame",
    ),
    _row(["plot", "{d}/good.npz", "--dpi", "2000", "-q", "qpos", "-q", "energy"], "pixel image"),
    # identify's configuration and data
    _row(["identify", "{d}/missing.toml"], "does not exist"),
    _row(["identify", "{d}"], "is a folder"),
    _row(["identify", "{d}/latin1_cfg.toml"], "is not UTF-8 text (byte 0xfc on line 1)"),
    _row(["identify", "{d}/garbage_cfg.toml"], "is not UTF-8 text"),
    _row(["identify", "{d}/cfg_garbage.toml"], "data: '"),
    _row(["identify", "{d}/cfg_bad_meta.toml"], "'meta' is not a JSON table"),
    _row(["identify", "{d}/cfg_unbatched.toml"], "not (5, ...)"),
    _row(["identify", "{d}/cfg_dir.toml"], "is a folder"),
    # runs that cannot finish or cannot fit, refused before any search or allocation
    _row(["simulate", "{m}", "--t", "1", "--dt", "1e-300"], "1e300 steps"),
    _row(["simulate", "{m}", "--t", "1", "--dt", "5e-324"], "inf steps"),
    _row(["simulate", "{m}", "--t", "1e6", "--dt", "1e-6"], "10^12 steps"),
    _row(["simulate", "{m}", "--t", "1e300"], "steps"),
    _row(["simulate", "{m}", "--dt", "1e300"], "not a whole number of steps"),
    _row(["simulate", "{m}", "--batch", "50000000"], "1000 steps of 50000000 systems"),
    _row(
        ["simulate", "{m}", "--batch", "50000000", "--max-steps", "1000000000000"],
        "memory available now",
    ),
    _row(["bench", "--batch", "100000000000", "--steps", "1000"], "4e14 system-steps"),
    # argparse's own errors, as one line with a fix
    _row(["simulate"], "required: MODEL"),
    _row(["simulate", "{m}", "--bogus"], "unrecognized arguments: --bogus"),
    _row(["simulate", "{m}", "--integrator", "euler"], "invalid choice: 'euler'"),
    _row(["plot", "{d}/good.npz", "--sample", "0", "--samples", "1"], "not allowed with"),
]


@pytest.fixture
def tripwires(monkeypatch):
    """Replace the work of every command (building a batch, integrating, checking,
    drawing, fitting, benchmarking) by an AssertionError: an input error must be found
    before any of it starts."""

    def tripwire(*args, **kwargs):
        raise AssertionError("the command started its work before refusing its input")

    monkeypatch.setattr(simulate, "_initial", tripwire)
    monkeypatch.setattr(simulate, "_integrate", tripwire)
    monkeypatch.setattr(check, "report", tripwire)
    monkeypatch.setattr(animate, "build_scene", tripwire)
    monkeypatch.setattr(bench, "initial_states", tripwire)
    monkeypatch.setattr(bench, "measure", tripwire)
    monkeypatch.setattr(rbjax, "identify", tripwire)


def _argv(args, d):
    return [a.replace("{d}", str(d)).replace("{m}", str(d / "p.toml")) for a in args]


def _one_line(command: str, err: str) -> str:
    """The single line of an input error on stderr (no traceback, no second line)."""
    lines = err.splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    prefix = f"rbjax {command}: error: " if command else "rbjax: error: "
    assert lines[0].startswith(prefix) and "Fix:" in lines[0], err
    return lines[0]


@pytest.mark.parametrize("args, message", FILE_ROWS + NUMERIC_ROWS)
def test_every_input_error_exits_2_with_one_line_and_a_fix(files, tripwires, capsys, args, message):
    code = main(_argv(args, files))
    out, err = capsys.readouterr()
    assert code == 2, out + err
    assert message in _one_line(args[0], err), err
    assert not [p for p in os.listdir(files) if p.startswith(".rbjax-")]  # probes removed


def test_top_level_usage_error_is_one_line(capsys):
    assert main(["simulat"]) == 2
    assert "invalid choice: 'simulat'" in _one_line("", capsys.readouterr().err)


# ----------------------------------------------------------------------------- sizes
def test_step_count_is_refused_before_any_search_with_the_time_it_would_take(
    files, tripwires, capsys
):
    """``--dt 1e-300`` ran a divisor search over 10^300 candidates (no answer); ``--t 1e6
    --dt 1e-6`` gave none within 90 s. Now: the count, the time at 10^4 to 10^6 steps/s
    (10^12 steps: 11.6 days to 3.17 years) and the fix, before the model is even integrated."""
    assert main(_argv(["simulate", "{m}", "--t", "1e6", "--dt", "1e-6"], files)) == 2
    line = _one_line("simulate", capsys.readouterr().err)
    assert "is 10^12 steps, more than the 10^9 system-steps of --max-steps" in line
    assert "11.6 days to 3.17 years" in line and "Fix: a larger --dt or a shorter --t" in line
    assert "raise --max-steps" in line


def test_divisor_searches_are_bounded_and_right():
    """Trial division up to √n: the divisors against brute force for every n ≤ 300, the
    closed forms of a prime and of 10^12 = 2^12 5^12 ((12 + 1)² divisors), and the default
    stride (the smallest divisor keeping ≤ 1000 saves) against a brute-force search."""
    for n in range(1, 301):
        assert simulate._divisors(n) == [d for d in range(1, n + 1) if n % d == 0]
    assert simulate._divisors(999999937) == [1, 999999937]  # the largest prime < 10^9
    big = simulate._divisors(10**12)
    assert len(big) == 169 and big[:4] == [1, 2, 4, 5] and big[-1] == 10**12
    assert simulate._segments(999999937) == 1 and simulate._segments(1000) == 20
    for n_steps in (1000, 1024, 4096, 10**6, 999983):
        expected = min(
            d for d in range(1, n_steps + 1) if n_steps % d == 0 and n_steps // d <= 1000
        )
        assert simulate._steps(n_steps * 1e-3, 1e-3, None, 1, 10**9) == (n_steps, expected)
    assert simulate._steps(999999937e-3, 1e-3, None, 1, 10**9) == (999999937, 999999937)


def test_batch_too_large_for_the_available_memory_is_refused_before_it_is_built(
    files, tripwires, monkeypatch, capsys
):
    """``--batch 50000000`` died after 159 s with RESOURCE_EXHAUSTED: the batch was built
    before the size check, which compared with the TOTAL memory. With 10 MB available, a
    batch of 1000 pendulums over 10 steps (1000 x 11 states x 40 numbers x 8 bytes = 3.5 MB
    of arrays, 28 MB at the peak) is refused by the command line itself, naming the numbers."""
    monkeypatch.setattr(simulate, "_available_memory", lambda host=False: 10 * 2**20)
    argv = ["simulate", "{m}", "--t", "0.01", "--batch", "1000", "--out", "{d}/out/r.npz"]
    assert main(_argv(argv, files)) == 2
    line = _one_line("simulate", capsys.readouterr().err)
    assert "1000 system(s) x 11 saved states x 40 numbers are 0.00328 GiB of arrays" in line
    assert "0.00977 GiB of memory available now" in line and "--save-every" in line
    assert not [p for p in os.listdir(files / "out") if p.startswith((".rbjax-", "r.npz"))]


def test_rollout_sizes_against_available_memory_not_the_total(monkeypatch):
    """rollout's size check compared the peak with the device's TOTAL memory (GPU:
    bytes_limit; CPU: physical memory) and only past 1 GiB of output. It now takes what is
    available: a GPU's bytes_limit − bytes_in_use, and refuses any size that does not fit."""
    from rbjax import _rollout

    class Device:
        platform = "gpu"

        def memory_stats(self):
            return {"bytes_limit": 16 * 2**30, "bytes_in_use": 15 * 2**30}

    with monkeypatch.context() as m:
        m.setattr(_rollout.jax, "devices", lambda: [Device()])
        assert _rollout._available_memory() == 2**30
    if os.path.exists("/proc/meminfo"):  # Linux: MemAvailable (or a container's limit)
        host = _rollout._available_memory(host=True)
        with open("/proc/meminfo") as fh:
            info = {ln.split(":")[0]: int(ln.split()[1]) * 1024 for ln in fh}
        assert host is not None and 0 < host <= info["MemTotal"]
        assert host < info["MemAvailable"] + 0.1 * info["MemTotal"]
    model = rbjax.Model(rbjax.Body(1.0, np.diag([1.0, 2.0, 2.5])))
    s0 = rbjax.make_state(nb=1)
    monkeypatch.setattr(_rollout, "_available_memory", lambda host=False: 10**6)
    size = 10**4 * (14 + 1) * 8  # 1.2 MB of output, 4.2 MB at the peak: far below 1 GiB
    with pytest.raises(ValueError, match=r"memory available now\. Fix: save fewer"):
        _rollout.check_output_size(model, s0, 10**4, False)
    with pytest.raises(ValueError, match=r"0\.00112 GiB of output"):
        rbjax.rollout(model, s0, 1e-3, 10**4 - 1)  # refused before anything is compiled
    monkeypatch.setattr(_rollout, "_available_memory", lambda host=False: 10**7)
    assert _rollout.check_output_size(model, s0, 10**4, False) == size


# ----------------------------------------------------------------------------- a real run
@pytest.fixture(scope="module")
def real_run(files):
    """One real, tiny simulation (2 systems x 4 steps, every state saved): the file the
    memory estimate must count, and the run file plot and animate must accept."""
    out = files / "real.npz"
    argv = ["simulate", "{m}", "--t=0.004", "--dt=0.001", "--batch=2"]
    assert main(_argv(argv, files) + ["--save-every=1", f"--out={out}", "--no-progress"]) == 0
    return out


def test_memory_estimate_counts_what_the_run_file_holds(files, real_run):
    """The estimate of ``simulate._memory`` against the run file it sizes: 1 + the numbers
    per saved time and system of every (B, T, ...) array, 8 bytes each."""
    with np.load(real_run) as f:
        arrays = {k: f[k] for k in f.files}
    per = 1 + sum(
        int(np.prod(a.shape[2:]))
        for a in arrays.values()
        if a.dtype.kind == "f" and a.shape[:2] == (2, 5)
    )
    assert per == 40
    model = rbjax.load(files / "p.toml").model
    assert simulate._memory(model, 2, 5, True, 1) == 2 * 5 * per * 8


def test_real_run_files_pass_the_reader_and_draw(files, real_run, capsys):
    run = runfile.read(str(real_run))
    assert run.batch == 2 and run["q"].shape == (2, 5, 1, 7)
    argv = ["plot", str(real_run), "--samples", "2", "--dpi", "20", "--out", str(files / "r.png")]
    assert main(argv) == 0
    with open(files / "r.png", "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    argv = ["animate", str(files / "p.toml"), str(real_run), "--out", str(files / "r.gif")]
    assert main(argv + ["--size", "1,1", "--dpi", "20", "--no-progress"]) == 0
    assert "wrote" in capsys.readouterr().out


def test_a_write_that_fails_late_is_one_line(files, monkeypatch, capsys):
    """A full disk while writing (after the checks passed) is an input error naming the
    file, not a traceback."""
    from matplotlib.figure import Figure

    def full(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", full)
    out = files / "out" / "full.png"
    assert main(["plot", str(files / "good.npz"), "--dpi", "20", "--out", str(out)]) == 2
    line = _one_line("plot", capsys.readouterr().err)
    assert "could not be written (No space left on device)" in line


# ----------------------------------------------------------------------------- meshes
@needs_mujoco
def test_urdf_with_package_meshes_loads_without_them_with_the_same_dynamics(tmp_path, capsys):
    """MuJoCo cannot resolve package:// URIs. ``meshes=False`` deletes the mesh geoms: the
    model equals the one MuJoCo compiles from the same URDF written without mesh elements,
    and its mass is the file's <inertial> (1.25 kg; the base is welded to the world)."""
    urdf = tmp_path / "arm.urdf"
    urdf.write_text(PACKAGE_URDF)
    plain = tmp_path / "plain.urdf"
    lines = [ln for ln in PACKAGE_URDF.splitlines() if "<mesh " not in ln]
    plain.write_text("\n".join(lines))
    with pytest.raises(ValueError, match="package://arm_description/.*meshes=False"):
        rbjax.load(urdf, formulation=rbjax.ScalableDAE())
    bare, ref = (
        rbjax.load(urdf, meshes=False, formulation=rbjax.ScalableDAE()),
        rbjax.load(plain, formulation=rbjax.ScalableDAE()),
    )
    assert bare.model.names == ref.model.names == ("upper",)
    np.testing.assert_array_equal(np.asarray(bare.model.mass), [1.25])
    np.testing.assert_array_equal(np.asarray(bare.model.inertia), np.asarray(ref.model.inertia))
    np.testing.assert_allclose(np.diag(np.asarray(bare.model.inertia[0])), [0.02, 0.021, 0.002])
    np.testing.assert_array_equal(np.asarray(bare.state.q), np.asarray(ref.state.q))
    np.testing.assert_allclose(np.asarray(bare.state.q)[0, :3], [0.0, 0.0, 0.75], atol=1e-15)
    assert main(["check", str(urdf), "--no-meshes", "--steps", "0", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["total_mass"] == 1.25 and report["dof"] == 1 and report["failures"] == []


@needs_mujoco
def test_meshes_false_is_refused_where_the_meshes_carry_mass(tmp_path):
    """A body whose mass comes from its geoms (no <inertial>, or inertiafromgeom="true")
    would lose mass with its meshes: refused, naming it; with an <inertial> and "auto" the
    mesh goes and the inertial stays (2 kg)."""
    (tmp_path / "m.xml").write_text(MISSING_MESH)
    with pytest.raises(ValueError, match=r"'bob' come from the geoms.*Fix: give those bodies"):
        rbjax.load(tmp_path / "m.xml", meshes=False, formulation=rbjax.ScalableDAE())
    (tmp_path / "all.xml").write_text(INERTIAL_MESH.format(mode="true"))
    with pytest.raises(
        ValueError, match='every body \\(the file sets <compiler inertiafromgeom="true"'
    ):
        rbjax.load(tmp_path / "all.xml", meshes=False, formulation=rbjax.ScalableDAE())
    (tmp_path / "auto.xml").write_text(INERTIAL_MESH.format(mode="auto"))
    np.testing.assert_array_equal(
        np.asarray(
            rbjax.load(
                tmp_path / "auto.xml", meshes=False, formulation=rbjax.ScalableDAE()
            ).model.mass
        ),
        [2.0],
    )


# ----------------------------------------------------------------------------- fuzzing
INVALID_VALUES = {  # per option kind: values that must be refused
    "positive": BAD_POSITIVE,
    "count": BAD_COUNT,
    "count0": BAD_COUNT0,
    "index": BAD_INDEX,
    "seed": BAD_SEED,
    "dpi": BAD_DPI,
    "pair": BAD_PAIR,
}
# command -> (cheap valid arguments, [valid positionals], [invalid positionals],
#             {option: (valid values, invalid values)}). The valid values keep the compiled
# programs those of the real run above (same shapes and statics), so few examples compile.
FUZZ = {
    "simulate": (
        ["--t=0.004", "--dt=0.001", "--batch=2", "--no-progress"],
        ["{m}"],
        ["{d}/missing.toml", "{d}", "{d}/model.txt", "{d}/empty.toml"],
        {
            "--t": (["0.004"], BAD_POSITIVE + ["0.0045", "1e300"]),
            "--dt": (["0.001"], BAD_POSITIVE),
            "--save-every": (["1"], BAD_COUNT + ["3"]),
            "--batch": (["2"], BAD_COUNT + ["100000000000"]),
            "--seed": (["0", "5"], BAD_SEED),
            "--perturb": (["qvel=0.02"], ["qvel=-1", "x=1", "qvel=nan", "qvel", "qvel=inf"]),
            "--ctrl": ([], ["0.5", "nan", "x"]),
            "--integrator": (["rk4"], ["euler", ""]),
            "--max-steps": (["1000000"], BAD_COUNT + ["3"]),
            "--out": (["{d}/out/fz.npz"], ["/proc/x.npz", "{d}/dir.npz", "{d}/x.txt"]),
            "--csv": (["{d}/out/fz.csv"], ["/proc/x.csv", "{d}/x.tsv"]),
        },
    ),
    "check": (
        ["--steps=2"],
        ["{m}"],
        ["{d}/missing.toml", "{d}/garbage.npz", "{d}/dir.npz"],
        {
            "--tol": (["1e-8", "1"], BAD_POSITIVE),
            "--drift": (["1e-6"], BAD_POSITIVE),
            "--steps": (["0", "2"], BAD_COUNT0 + ["1000000"]),
            "--dt": (["0.001"], BAD_POSITIVE),
        },
    ),
    "plot": (
        ["--out={d}/out/fz.png", "--dpi=20"],
        ["{d}/good.npz"],
        ["{d}/missing.npz", "{d}/garbage.npz", "{d}/bad_meta.npz", "{d}/q_shape.npz", "{m}"],
        {
            "--dpi": (["20"], BAD_DPI),
            "--quantity": (["energy", "qpos", "residual"], ["speed", ""]),
            "--sample": (["0"], BAD_INDEX),
            "--samples": (["1"], BAD_COUNT),
            "--out": (["{d}/out/fz.png"], ["/proc/x.png", "{d}/dir.png", "{d}/x.jpg"]),
        },
    ),
    "animate": (
        ["{d}/good.npz", "--out={d}/out/fz.gif", "--size=1,1", "--dpi=20", "--no-progress"],
        ["{m}"],
        ["{d}/missing.toml", "{d}/garbage.npz"],
        {
            "--fps": (["10"], BAD_POSITIVE + ["5000"]),
            "--every": (["1", "2"], BAD_COUNT),
            "--sample": (["0"], BAD_INDEX),
            "--view": (["20,-60", "0,0"], BAD_PAIR),
            "--size": (["1,1"], BAD_PAIR + ["0,1"]),
            "--dpi": (["20"], BAD_DPI),
        },
    ),
    "identify": (
        [],
        [],
        [
            "{d}/missing.toml",
            "{d}",
            "{d}/latin1_cfg.toml",
            "{d}/garbage_cfg.toml",
            "{d}/cfg_garbage.toml",
        ],
        {
            "--max-steps": (["0"], BAD_COUNT0),
            "--out": (["{d}/out/fz.json"], ["/proc/x.json", "{d}/x.csv"]),
        },
    ),
    "bench": (
        ["--batch=1", "--steps=1", "--repeats=1", "--links=1", "--no-progress"],
        [None],  # no MODEL: the built-in chain
        ["{d}/missing.toml", "{d}/garbage.xml"],
        {
            "--batch": (["1"], BAD_COUNT + ["1,x"]),
            "--steps": (["1"], BAD_COUNT),
            "--repeats": (["1"], BAD_COUNT),
            "--dt": (["0.001"], BAD_POSITIVE),
            "--seed": (["3"], BAD_SEED),
            "--links": (["1"], BAD_COUNT + ["100000"]),
            "--batch-chunk": ([], BAD_INDEX),
            "--max-steps": (["1000000"], BAD_COUNT + ["1"]),
            "--json": (["{d}/out/fz.json"], ["/proc/x.json", "{d}/out"]),
        },
    ),
}


@st.composite
def command_lines(draw):
    """(argv, valid): a command, a positional argument and up to three options, each drawn
    valid with probability 1/3, and sometimes a stray argument (always invalid)."""
    command = draw(st.sampled_from(sorted(FUZZ)))
    base, good_pos, bad_pos, options = FUZZ[command]
    valid = True
    argv = [command]
    ok = bool(good_pos) and draw(st.sampled_from([True, False]))
    positional = draw(st.sampled_from(good_pos if ok else bad_pos))
    argv += [] if positional is None else [positional]
    valid &= ok
    argv += base
    for _ in range(draw(st.integers(0, 3))):
        option = draw(st.sampled_from(sorted(options)))
        good, bad = options[option]
        ok = bool(good) and draw(st.sampled_from([True, False, False]))
        argv.append(f"{option}={draw(st.sampled_from(good if ok else bad))}")
        valid &= ok
    if draw(st.integers(0, 5)) == 0:  # a stray argument: unrecognised, or a missing file
        argv.insert(
            draw(st.integers(1, len(argv))), draw(st.sampled_from(["stray", "1", "a b", "{d}/x"]))
        )
        valid = False
    return argv, valid


def _valid(command, *args):
    """A valid command line of the fuzzing table (its cheap base and a valid positional)."""
    base, good_pos, _, _ = FUZZ[command]
    return [command, *[p for p in good_pos[:1] if p is not None], *base, *args], True


@settings(max_examples=80, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=command_lines())
@example(case=_valid("simulate", "--out={d}/out/fz.npz", "--csv={d}/out/fz.csv"))
@example(case=_valid("check", "--steps=0", "--tol=1"))
@example(case=_valid("plot", "--quantity=residual"))
@example(case=_valid("animate", "--every=2"))
@example(case=_valid("bench", "--json={d}/out/fz.json"))
def test_fuzzed_command_lines_keep_the_exit_code_contract(files, real_run, case):
    """Random command lines over the six commands: the exit code is 0, 1 or 2, nothing but
    SystemExit could escape (main returns), an invalid line exits 2 with one line naming the
    fix, and 0 or 1 comes only from valid lines."""
    args, valid = case
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(_argv(args, files))
    event(f"{args[0]}: {'valid' if valid else 'invalid'}, exit {code}")
    assert code in (0, 1, 2), (args, code)
    if not valid:
        assert code == 2, (args, out.getvalue(), err.getvalue())
    if code == 2:
        _one_line("" if args[0] not in FUZZ else args[0], err.getvalue())
    else:
        assert "Traceback" not in err.getvalue()
