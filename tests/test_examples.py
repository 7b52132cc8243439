"""Every example runs (at reduced size), in-process through its ``main(argv)``, passes its own
checks and returns or prints the numbers it checked; so does the README's Python example.

Each example raises SystemExit with a message when one of its checks fails (closed forms,
scipy, conservation laws, the true values behind synthetic data; see each docstring); the
mechanism examples also return a dict of the measured errors, asserted here against the same
references. Compile time dominates (every model structure compiles once), so the reduced sizes
mainly shorten the runs.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def example(name):
    """Import examples/<name>.py under a private module name (``pendulum`` is also a PyPI name)."""
    spec = importlib.util.spec_from_file_location(f"_rbjax_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run(name, argv, capsys):
    """``main(argv)`` of examples/<name>.py; its printed output must not report a failed check.
    Examples are user programs: they run with JAX's default dtype promotion (the suite's
    strict promotion checks rbjax's own code, not, e.g., optax's step counters)."""
    try:
        with jax.numpy_dtype_promotion("standard"):
            out = example(name).main(argv)
    except SystemExit as e:  # an example's own check failed (or its CLI rejected argv)
        pytest.fail(f"examples/{name}.py {' '.join(argv)}: {e}\n{capsys.readouterr().out}")
    text = capsys.readouterr().out
    assert "FAIL" not in text, text
    return out, text


@pytest.mark.parametrize(
    "name, argv, expect",
    [
        ("tumbling_body", ["--t-end", "6", "--out", ""], "max |Δ| vs exact"),
        (
            "monte_carlo_flips",
            ["--samples", "2048", "--t-end", "3"],
            "max |t_flip − exact elliptic t_flip|",
        ),
        (  # one process here; tests/test_montecarlo.py runs two under jax.distributed
            "monte_carlo_hosts",
            ["--samples", "64", "--t-end", "3", "--devices", "1"],
            "first flip",
        ),
        (
            "monte_carlo_top",
            ["--samples", "128", "--t-end", "0.25"],
            "max |θ₁ − closed form| over samples",
        ),
        ("identify_tumbling", [], "moment ratios, largest relative error"),
        (
            "import_robot",  # the double pendulum: the 7-DOF arm's computed-torque program compiles for minutes
            [
                "--model",
                str(EXAMPLES / "models" / "double_pendulum.xml"),
                "--t-end",
                "0.2",
                "--dt",
                "1e-3",
                "--no-mujoco",  # test_load.py compares every model with MuJoCo
            ],
            "joint error vs closed form",
        ),
        (
            "identify_double_pendulum",  # 5 segments of 0.6 s: the same minimum as 10 at
            # half the cost of a Jacobian (3 segments leave fit 2 in a local minimum)
            ["--samples", "151", "--dt", "0.02", "--segments", "5"],
            "fit 2: masses, largest relative error",
        ),
        ("identify_damping", ["--samples", "61"], "damping error in standard errors"),
        (
            "identify_satellite",  # the full 20 s record: shorter ones leave the frame weak
            ["--no-lbfgs"],
            "largest |error| / σ (inertia, bias, misalignment)",
        ),
        (
            "identify_arm",  # the defaults (4 s, 8 segments): 17 LM steps, 19 s in joint
            # coordinates (in maximal coordinates 1.5 s and 2 segments took 117 s)
            [],
            "largest |error| / σ (masses, friction)",
        ),
        (
            "train_controller",
            # 100 Adam steps: J falls 50× (10× required), late off-axis rate 0.074 Ω (0.1 Ω
            # required, 0.087 Ω after 75 steps); 25 steps fail the check
            ["--steps", "100", "--batch", "16", "--t-end", "4"],
            "controlled runs that flip",
        ),
    ],
)
def test_example_runs_and_checks_itself(name, argv, expect, capsys):
    _, text = run(name, argv, capsys)
    assert expect in text, text


def test_readme_example_runs(capsys):
    """The README's Python example executes as written and its numbers are the physics claimed."""
    text = (ROOT / "README.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    with jax.numpy_dtype_promotion("standard"):
        exec(compile(code, "README.md", "exec"), {})
    lines = capsys.readouterr().out.strip().splitlines()
    energy = float(lines[1])
    assert abs(energy - 25.00005) < 1e-9  # ½ωᵀΘω of ω0 = (0.01, 5, 0), conserved
    assert "-50.0001" in lines[2]  # λ = −ωᵀΘω (Möller & Glocker 2012, eq. (96))


# ------------------------------------------------------------------ the mechanism examples


def test_pendulum(capsys):
    r, _ = run("pendulum", ["--dt", "2.5e-3", "--t-end", "2.75"], capsys)
    # reactions against m(g − αd) and m g + m ω² d: exact up to rounding
    assert r["reaction_release"] < 1e-12
    assert r["reaction_bottom"] < 1e-12
    assert r["hinge_moment"] < 1e-12
    assert r["alpha_release"] < 1e-12
    # elliptic period, relative; measured 6e-11 at dt = 2.5e-3 (1.6e-12 at the default 1e-3)
    assert r["period_rel"] < 1e-9
    assert r["energy_drift"] < 1e-8


def test_double_pendulum(capsys, tmp_path):
    argv = ["--steps", "400"]
    try:
        import matplotlib  # noqa: F401

        argv += ["--plot", str(tmp_path / "dp.png")]
    except ImportError:
        pass
    r, _ = run("double_pendulum", argv, capsys)
    # 2 s at dt = 5e-3 against scipy DOP853 on the Lagrangian; measured 2.5e-7 rad, 2e-6
    assert r["angle_err"] < 3e-6
    assert r["energy_err"] < 1e-5
    # 4 s at dt = 1e-2: plain RK4 drifts, the projecting schemes hold the joints
    assert r["drift_rk4"] > 1e-6
    assert r["drift_projected"] <= 1e-8
    assert r["drift_implicit_midpoint"] <= 1e-8
    assert r["baumgarte_gain"] < 0.1
    if "--plot" in argv:
        assert (tmp_path / "dp.png").stat().st_size > 10_000


def test_slider_crank(capsys):
    r, _ = run("slider_crank", ["--samples", "400", "--steps", "1000"], capsys)
    assert (r["dof"], r["dof_driven"]) == (1, 0)
    assert r["kin_residual"] < 1e-12
    assert r["kin_x"] < 1e-12  # measured 2e-16 m
    assert r["kin_v"] < 1e-12  # measured 4e-15 m/s
    assert r["kin_a"] < 1e-11  # measured 7e-14 m/s²
    assert r["power_balance"] < 1e-12  # motor torque × ω = dT/dt − P_gravity, measured 3e-14
    assert r["energy_balance"] < 1e-9  # work of the torque = ΔT + ΔV, measured 2e-13
    assert r["dyn_x"] < 1e-11
    assert r["crank_turn"] > 0.5  # the torque really turned the crank


def test_four_bar(capsys):
    r, _ = run("four_bar", ["--steps", "1000"], capsys)
    # 20 hinge equations of rank 17, one degree of freedom in both models
    assert (r["rank_rrrr"], r["dof_rrrr"], r["dof_rsur"]) == (17, 1, 1)
    assert r["uk_vs_minimal"] < 1e-8  # measured 4e-11
    assert r["dae_vs_minimal"] < 1e-8  # the default formulation runs the redundant loop too
    assert r["energy_drift"] < 1e-7
    assert r["closure_minimal"] < 1e-7  # measured 2.4e-9 rad
    assert r["closure_uk"] < 1e-7
    assert r["crank_turns"] > 0.5


def test_heavy_top(capsys):
    r, _ = run("heavy_top", ["--t-end", "0.5"], capsys)
    assert r["tilt"] < 1e-9  # measured 2.7e-11 rad
    assert r["precession"] < 1e-9  # measured 3.4e-11
    assert r["energy"] < 1e-8


@pytest.mark.parametrize(
    "name",
    [p.stem for p in sorted(EXAMPLES.glob("*.py")) if not p.stem.startswith("_")],
)
def test_example_has_cli_and_docstring(name):
    mod = example(name)
    assert "python examples/" in mod.__doc__
    assert callable(mod.main)
