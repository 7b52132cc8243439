"""Every example runs from the command line (at reduced size) and passes its own checks.

The examples raise SystemExit with a message when what they check (flip times against the
Jacobi-elliptic solution) disagrees, so a zero exit status is an assertion.
"""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "script, args, expect",
    [
        ("tumbling_body.py", ["--t-end", "6", "--out", ""], "max |Δ| vs exact"),
        (
            "monte_carlo_flips.py",
            ["--batch", "64", "--t-end", "3"],
            "max |t_flip − exact elliptic t_flip|",
        ),
        ("identify_tumbling.py", [], "moment ratios, largest relative error"),
        (
            "identify_double_pendulum.py",
            ["--samples", "151", "--dt", "0.02"],
            "fit 2: masses, largest relative error",
        ),
        ("identify_damping.py", ["--samples", "61"], "damping error in standard errors"),
        (
            "train_controller.py",
            ["--steps", "150", "--batch", "16", "--t-end", "4"],
            "controlled runs that flip",
        ),
    ],
)
def test_example_runs_and_checks_itself(script, args, expect):
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert expect in out.stdout


def test_readme_example_runs():
    """The README's Python example executes as written and its numbers are the physics claimed."""
    text = (ROOT / "README.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.strip().splitlines()
    energy = float(lines[1])
    assert abs(energy - 25.00005) < 1e-9  # ½ωᵀΘω of ω0 = (0.01, 5, 0), conserved
    assert "-50.0001" in lines[2]  # λ = −ωᵀΘω (eq. 96)
