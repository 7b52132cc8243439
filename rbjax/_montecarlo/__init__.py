"""Batched Monte-Carlo: the runner (runner.py), mergeable statistics (statistics.py), run
directories (store.py), devices and meshes (devices.py), what a sampler varies (sampling.py)."""
