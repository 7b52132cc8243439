"""Result codes of rollouts, each carrying its message."""

from __future__ import annotations

import enum


class RESULTS(enum.IntEnum):
    """What happened to one system of a rollout: ``Trajectory.result`` holds these codes as an
    integer array with the batch's shape, so ``traj.result == rbjax.RESULTS.nonfinite`` is an
    elementwise test. :attr:`message` says what each code means.

    (A Python enumeration rather than ``equinox.Enumeration``, whose items are scalars: one
    rollout integrates a whole batch, and its result is an array of codes.)
    """

    successful = 0
    nonfinite = 1
    solver_failed = 2
    implausible = 3
    # reported per sample by rbjax.monte_carlo (never by a rollout):
    nonfinite_measure = 4
    invalid_sample = 5
    # reported by a rollout whose traced inputs fail the build-time checks:
    invalid_input = 6

    @property
    def message(self) -> str:
        return _MESSAGES[self]


_MESSAGES = {
    RESULTS.successful: "",
    RESULTS.nonfinite: "the state became non-finite (NaN or inf)",
    RESULTS.solver_failed: "the implicit solver did not converge",
    RESULTS.implausible: (
        "the result is implausible: a plausibility monitor (rbjax.Plausibility) or a Drift "
        "measure's limit was exceeded"
    ),
    RESULTS.nonfinite_measure: "a measure's value is not finite",
    RESULTS.invalid_sample: (
        "the sampled initial state violates the model (a rigid body's |A|² ≠ 1 or ν ≠ 0, or "
        "a joint's position or velocity equations)"
    ),
    RESULTS.invalid_input: (
        "an input failed the checks run inside the program (a traced dt, mass, inertia, "
        "gravity, force, actuator, joint or formulation parameter, or initial state; or a "
        "continued trajectory that had failed)"
    ),
}
