"""Measurements: the sample times and the observations taken at them."""

from __future__ import annotations

import equinox as eqx
import numpy as np

from .._errors import fail
from .observations import AbstractObservation, as_float


class Measurements(eqx.Module):
    """Sample ``times`` (K,) [s], strictly increasing, any spacing, and the ``observations``
    (a tuple of observation objects, each with K rows)."""

    times: np.ndarray
    observations: tuple[AbstractObservation, ...]

    def __init__(self, times, observations):
        t = as_float("Measurements.times", times)
        if t.ndim != 1 or t.size < 1 or not np.all(np.isfinite(t)):
            fail(
                "Measurements.times",
                times if t.size <= 12 else f"<array shape {t.shape}>",
                "is not a non-empty 1-D array of finite times",
                "pass the sample times in s as a (K,) array",
            )
        step = np.diff(t)
        if np.any(step <= 0):
            k = int(np.argmax(step <= 0))
            fail(
                f"Measurements.times[{k + 1}]",
                t[k + 1],
                f"is not after times[{k}] = {t[k]!r} (times must be strictly increasing)",
                "sort the samples and merge samples taken at the same time",
            )
        obs = tuple(observations) if isinstance(observations, (list, tuple)) else (observations,)
        if not obs:
            fail("Measurements.observations", "()", "is empty", "pass at least one observation")
        for i, o in enumerate(obs):
            if not isinstance(o, AbstractObservation):
                fail(
                    f"Measurements.observations[{i}]",
                    type(o).__name__,
                    "is not an rbjax observation",
                    "use an rbjax observation or sensor (Position, Orientation, Gyro, IMU, "
                    "JointEncoder, ..., Custom)",
                )
            if o.values.shape[0] != t.size:
                fail(
                    f"Measurements.observations[{i}].values ({type(o).__name__})",
                    f"<{o.values.shape[0]} rows>",
                    f"does not match the {t.size} sample times",
                    "pass one row per sample time; mark missing samples with mask=",
                )
        self.times = t
        self.observations = obs

    @property
    def count(self) -> int:
        """Number of measured scalars N (masked samples excluded)."""
        return int(sum(int(np.sum(np.asarray(o.mask))) * o.dim for o in self.observations))
