"""Every core and device: the CPU device count, and the one-axis mesh the runner shards over.

On a CPU, XLA runs one program on one device, and a device is by default the whole host: a
batched rollout then uses one core for most of its work. :func:`use_cpu_cores` asks JAX for
one CPU device per core (``jax_num_cpu_devices``, read once when JAX starts its backends),
and :func:`rbjax.monte_carlo` splits every chunk across the devices with ``jax.shard_map``
over a one-axis :class:`jax.sharding.Mesh` ("samples"). Under ``jax.distributed.initialize``
(multi-controller JAX) ``jax.devices()`` lists the devices of every process and the same mesh
spans the hosts.
"""

from __future__ import annotations

import os

import jax
import numpy as np
from jax.sharding import Mesh


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def use_cpu_cores(n: int | None = None) -> int:
    """Expose ``n`` CPU devices to JAX (default: one per core this process may run on).

    Call it right after ``import rbjax``, before any JAX computation: JAX reads the setting when
    it starts its backends. Calling it later is an error unless the count already matches.
    Returns the number of CPU devices. Equivalent to ``jax.config.update("jax_num_cpu_devices",
    n)``; the examples and benchmarks call it, so programs run by rbjax use every core.
    """
    n = _cores() if n is None else n
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"use_cpu_cores(n={n!r}): n is not a positive integer. Fix: pass e.g. 4.")
    try:  # JAX refuses the setting once its backends have started
        jax.config.update("jax_num_cpu_devices", int(n))
        return int(n)
    except RuntimeError:
        have = len(jax.devices("cpu"))
        if have != n:
            raise RuntimeError(
                f"use_cpu_cores({n}): JAX has already started with {have} CPU device(s). Fix: "
                "call rbjax.use_cpu_cores() right after importing rbjax, before any JAX "
                "computation (or set XLA_FLAGS=--xla_force_host_platform_device_count=N)."
            ) from None
        return have


def sample_mesh(devices) -> Mesh:
    """The one-axis mesh ("samples",) over ``devices``: None (every device of every process),
    an int k (the first k devices) or a list or tuple of devices."""
    if devices is None:
        devs = jax.devices()
    elif isinstance(devices, (int, np.integer)) and not isinstance(devices, bool):
        avail = jax.devices()
        if not 1 <= devices <= len(avail):
            raise ValueError(
                f"devices = {devices} is not between 1 and the {len(avail)} available device(s). "
                "Fix: pass None (all), a smaller count, or call rbjax.use_cpu_cores() first."
            )
        if jax.process_count() > 1 and devices != len(avail):
            raise ValueError(
                f"devices = {devices}: a multi-process run uses every device of every process "
                f"({len(avail)}). Fix: pass devices=None."
            )
        devs = avail[: int(devices)]
    else:
        devs = list(devices) if isinstance(devices, (list, tuple)) else []
        if not devs or not all(isinstance(d, jax.Device) for d in devs):
            raise ValueError(
                f"devices = {devices!r} is not None, a count or a list of jax devices. Fix: "
                "pass e.g. devices=None or devices=jax.devices()[:2]."
            )
    return Mesh(np.asarray(devs), ("samples",))
