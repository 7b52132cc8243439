"""Shared test configuration: float64, strict dtype promotion, one tolerance helper.

Rank promotion is left at "allow" on purpose: the component-first kernels (rbjax/_cf.py)
broadcast per-body parameters of shape (nb,) against batched states of shape (B, nb) by design.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")

settings.register_profile("rbjax", max_examples=60, deadline=None, derandomize=True)
settings.load_profile("rbjax")


def assert_close(actual, expected, *, rtol=1e-10, atol=1e-12, err_msg=""):
    """The one tolerance helper: numpy's assert_allclose on host copies."""
    np.testing.assert_allclose(
        np.asarray(actual), np.asarray(expected), rtol=rtol, atol=atol, err_msg=err_msg
    )


@pytest.fixture
def close():
    return assert_close
