"""The run file ``rbjax simulate`` writes: a NumPy ``.npz`` readable without rbjax.

``np.load("run.npz")`` (no pickle) gives named arrays; a leading sample axis B is present only
for a batch (``--batch N``); T saved times, nb bodies, nj joints:

* ``format`` "rbjax-run 1"; ``meta`` a JSON string (model path, dt, steps, integrator,
  batch, perturbations, seed, timings, versions);
* ``t`` (T,) [s]; ``q`` (B, T, nb, 7) positions of the centres of mass [m] and unit
  quaternions (w, x, y, z), world frame; ``u`` (B, T, nb, 7) velocities (v [m/s], 0, ω
  [rad/s] in body axes); ``body_names`` (nb,);
* ``qpos`` (B, T, nq), ``qvel`` (B, T, nv) joint coordinates and velocities with
  ``qpos_names`` / ``qvel_names`` (rbjax.JointSpace: a revolute's angle [rad], a prismatic's
  displacement [m], a spherical joint's quaternion w, x, y, z, a free body's position and
  quaternion); absent for scalable bodies;
* ``kinetic_energy``, ``potential_energy``, ``total_energy`` (B, T) [J];
  ``linear_momentum``, ``angular_momentum`` (B, T, 3) world frame, about the origin;
* ``position_residual``, ``velocity_residual`` (B, T) the largest joint residual |Φ| and
  |W u + Φ_t| at each saved time (the drift of the constraints);
* ``reaction_force``, ``reaction_torque`` (B, T, nj, 3) [N], [N m]: what each joint exerts on
  its body j (the second body it names), world frame, torque about the joint point;
  ``joint_names`` (nj,); ``lam`` (B, T, nb + m) the formulation's multipliers;
* ``result`` (B,) an rbjax.RESULTS code (0 = success), ``failed_step`` (B,) (−1 if none);
* for a batch, ``perturb_<name>`` (B, ...) the perturbation each sample received.

``write_csv`` flattens the scalar-per-time quantities to one row per (sample,) time.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from .common import CliError

FORMAT = "rbjax-run 1"
CSV_SERIES = (
    "kinetic_energy",
    "potential_energy",
    "total_energy",
    "position_residual",
    "velocity_residual",
)


@dataclasses.dataclass
class Run:
    """A run file in memory: ``arrays`` (name -> ndarray) and ``meta`` (dict)."""

    arrays: dict[str, np.ndarray]
    meta: dict

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def __contains__(self, name: str) -> bool:
        return name in self.arrays

    @property
    def batch(self) -> int | None:
        """Number of samples of a batch run, None for a single run."""
        return self.meta.get("batch")

    def names(self, key: str) -> list[str]:
        return [str(n) for n in self.arrays[key]] if key in self.arrays else []


def write(path: str, arrays: dict[str, np.ndarray], meta: dict) -> None:
    """Write a run file atomically (a temporary file renamed into place)."""
    data: dict = {k: np.asarray(v) for k, v in arrays.items()}
    data["format"] = np.asarray(FORMAT)
    data["meta"] = np.asarray(json.dumps(meta, sort_keys=True))
    tmp = f"{path}.part.npz"
    np.savez_compressed(tmp, **data)
    os.replace(tmp, path)


def read(path: str) -> Run:
    """Read a run file, or raise CliError saying why it is not one."""
    if not os.path.isfile(path):
        raise CliError(
            f"RUN {path!r} does not exist. Fix: write one with 'rbjax simulate MODEL --out {path}'."
        )
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except Exception as exc:  # a truncated or foreign file: say what it is not
        raise CliError(
            f"RUN {path!r} is not a readable .npz file ({exc}). Fix: write it with 'rbjax simulate'."
        ) from None
    fmt = str(arrays.pop("format", ""))
    if fmt != FORMAT:
        raise CliError(
            f"RUN {path!r} has format {fmt or '(none)'!r}, expected {FORMAT!r}. Fix: write it with "
            "'rbjax simulate ... --out run.npz'."
        )
    meta = json.loads(str(arrays.pop("meta")))
    return Run(arrays, meta)


def write_csv(path: str, run: Run) -> None:
    """One row per saved time (and sample): t, the joint coordinates and velocities, the
    energies and residuals; a header names every column."""
    t = run["t"]
    cols, names = [], []
    lead = (run.batch,) if run.batch else ()
    for key, label in (("qpos", "qpos_names"), ("qvel", "qvel_names")):
        if key in run:
            arr = run[key].reshape(lead + (len(t), -1))
            for i, n in enumerate(run.names(label)):
                cols.append(arr[..., i])
                names.append(f"{key}:{n}")
    for key in CSV_SERIES:
        if key in run:
            cols.append(run[key])
            names.append(key)
    if run.batch:
        sample = np.broadcast_to(np.arange(run.batch)[:, None], (run.batch, len(t)))
        tt = np.broadcast_to(t, (run.batch, len(t)))
        table = np.stack([sample, tt] + cols, axis=-1).reshape(-1, 2 + len(cols))
        header = ["sample", "t"] + names
        fmt = ["%d"] + ["%.17g"] * (1 + len(cols))
    else:
        table = np.stack([t] + cols, axis=-1)
        header = ["t"] + names
        fmt = ["%.17g"] * (1 + len(cols))
    np.savetxt(path, table, delimiter=",", header=",".join(header), comments="", fmt=fmt)
