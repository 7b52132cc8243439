"""rbjax.compilation_cache: one call turns on JAX's persistent cache, and an eager rollout's
program is one that JAX will store (no host callback inside: its failure check runs on the
host afterwards). Run in fresh interpreters, since the cache is process-wide configuration."""

import os
import subprocess
import sys
import textwrap

import pytest

import rbjax

SCRIPT = textwrap.dedent(
    """
    import sys, time
    import jax
    jax.config.update("jax_enable_x64", True)
    import numpy as np
    import rbjax
    rbjax.compilation_cache(sys.argv[1], min_compile_s=0.0)
    model = rbjax.Model(rbjax.Body(1.0, np.diag([1.0, 2.0, 3.0])))
    state = rbjax.make_state(omega_body=[[0.3, 1.0, 0.2]])
    tr = rbjax.rollout(model, state, 1e-2, 20, save_every=20)
    print(repr(float(tr.u[-1, 0, 4])))
    """
)


def _run(cache_dir):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(cache_dir)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def test_rollout_program_is_stored_and_reused(tmp_path):
    cold = _run(tmp_path)
    entries = sorted(p.name for p in tmp_path.iterdir() if "_rollout" in p.name)
    assert entries, f"no rollout program stored in the cache: {os.listdir(tmp_path)}"
    stamps = {p: os.path.getmtime(tmp_path / p) for p in entries}
    warm = _run(tmp_path)
    assert warm == cold  # the same program, loaded instead of compiled
    assert {p: os.path.getmtime(tmp_path / p) for p in entries} == stamps


def test_bad_threshold_names_the_field(tmp_path):
    with pytest.raises(ValueError, match=r"min_compile_s = -1.*Fix:"):
        rbjax.compilation_cache(tmp_path, min_compile_s=-1)
