"""The run file ``rbjax simulate`` writes: a NumPy ``.npz`` readable without rbjax.

``np.load("run.npz")`` (no pickle) gives named arrays; a leading sample axis B is present only
for a batch (``--batch N``); T saved times, nb bodies, nj joints:

* ``format`` "rbjax-run 1"; ``meta`` a JSON string (model path, dt, steps, integrator,
  batch, perturbations, seed, timings, versions);
* ``t`` (T,) [s]; ``q`` (B, T, nb, 7) positions of the centres of mass [m] and unit
  quaternions (w, x, y, z), world frame; ``u`` (B, T, nb, 7) velocities (v [m/s], 0, ω
  [rad/s] in body axes); ``body_names`` (nb,);
* ``qpos`` (B, T, nq), ``qvel`` (B, T, nv) joint coordinates and velocities with
  ``qpos_names`` / ``qvel_names``; absent for scalable bodies. For an MJCF or URDF file they
  are MuJoCo's ``data.qpos`` and ``data.qvel`` (same order and size; a free joint's position
  is its body frame's origin, its velocity that origin's world velocity then ω in body axes);
  for a model file, or a robot file whose joints rbjax holds in other coordinates (a note
  says so), ``rbjax.JointSpace(model)``'s (a free body's centre of mass). ``meta``'s
  ``coordinates`` says which: "mujoco" or "rbjax". A revolute's angle [rad], a prismatic's
  displacement [m], a spherical joint's quaternion w, x, y, z, a free body's position and
  quaternion;
* ``kinetic_energy``, ``potential_energy``, ``total_energy`` (B, T) [J];
  ``linear_momentum``, ``angular_momentum`` (B, T, 3) world frame, about the origin;
* ``position_residual``, ``velocity_residual`` (B, T) the largest joint residual |Φ| and
  |W u + Φ_t| at each saved time (the drift of the constraints);
* ``reaction_force``, ``reaction_torque`` (B, T, nj, 3) [N], [N m]: what each joint exerts on
  its body j (the second body it names), world frame, torque about the joint point;
  ``joint_names`` (nj,); ``lam`` (B, T, nb + m) the formulation's multipliers;
* a run in joint coordinates (``meta`` ``"formulation": "joint"``, an MJCF/URDF tree
  simulated as an rbjax.JointModel) has no ``q``, ``u``, residuals, reactions or ``lam``:
  its state is ``qpos``/``qvel`` (MuJoCo's), and ``xpos`` (B, T, nb, 3), ``xquat``
  (B, T, nb, 4) are each body frame's world origin and attitude (MuJoCo's ``data.xpos`` and
  ``data.xquat``), ``xipos`` (B, T, nb, 3) its centre of mass (``data.xipos``);
  ``qpos_kinds`` (nq,) the type of the joint of each qpos column ("hinge", "slide",
  "ball", "free");
* ``result`` (B,) an rbjax.RESULTS code (0 = success), ``failed_step`` (B,) (−1 if none);
* for a batch, ``perturb_<name>`` (B, ...) the perturbation each sample received.

``write_csv`` flattens the scalar-per-time quantities to one row per (sample,) time.
``read`` checks what it reads (an .npz of this format, ``meta`` a JSON table, ``t`` and ``q``
present, every array above the shape this list gives it) and names what is wrong.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import NoReturn

import numpy as np

from .common import CliError, input_file

FORMAT = "rbjax-run 1"
SERIES = {  # arrays per saved time: name -> the trailing shape after (B,) T, by dimension name
    "u": ("nb", 7),
    "qpos": ("nq",),
    "qvel": ("nv",),
    "kinetic_energy": (),
    "potential_energy": (),
    "total_energy": (),
    "linear_momentum": (3,),
    "angular_momentum": (3,),
    "position_residual": (),
    "velocity_residual": (),
    "reaction_force": ("nj", 3),
    "reaction_torque": ("nj", 3),
    "lam": ("m",),
    "xpos": ("nb", 3),
    "xquat": ("nb", 4),
    "xipos": ("nb", 3),
}
NAMES = {
    "body_names": "nb",
    "joint_names": "nj",
    "qpos_names": "nq",
    "qvel_names": "nv",
    "qpos_kinds": "nq",
}
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

    @property
    def joint(self) -> bool:
        """A run in joint coordinates (``--coordinates joint``): qpos/qvel and body poses,
        no maximal q/u."""
        return self.meta.get("formulation") == "joint"

    def names(self, key: str) -> list[str]:
        return [str(n) for n in self.arrays[key]] if key in self.arrays else []


def write(path: str, arrays: dict[str, np.ndarray], meta: dict) -> None:
    """Write a run file atomically (a temporary file renamed into place)."""
    data: dict = {k: np.asarray(v) for k, v in arrays.items()}
    data["format"] = np.asarray(FORMAT)
    data["meta"] = np.asarray(json.dumps(meta, sort_keys=True))
    tmp = f"{path}.part.npz"
    try:
        np.savez_compressed(tmp, **data)
        os.replace(tmp, path)
    finally:  # a full disk leaves no partial file behind
        if os.path.exists(tmp):
            os.remove(tmp)


def load_npz(path: str, argument: str, fix: str) -> dict[str, np.ndarray]:
    """Every array of the .npz file at ``path`` (no pickles), or a CliError naming
    ``argument`` and saying what the file is instead."""
    input_file(path, argument, fix)
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic not in (b"PK\x03\x04", b"PK\x05\x06"):  # a zip archive: a file, or empty
        kind = "an empty file" if not magic else "not an .npz file (a NumPy zip archive)"
        raise CliError(f"{argument} {path!r} is {kind}. Fix: {fix}.")
    try:  # the file opened here, so that it is closed whatever np.load makes of it
        with open(path, "rb") as fh, np.load(fh, allow_pickle=False) as f:
            return {k: f[k] for k in f.files}
    except Exception as exc:  # noqa: BLE001 - a truncated archive, pickled objects, ...
        why = " ".join(str(exc).split("If you trust")[0].split()) or type(exc).__name__
        raise CliError(
            f"{argument} {path!r} is not a readable .npz file ({why}). Fix: {fix}."
        ) from None


def parse_meta(arrays: dict[str, np.ndarray], what: str) -> dict:
    """The run file's ``meta`` (a JSON table) taken out of ``arrays``; ``batch`` None or a
    positive whole number. ``what`` names the file in the messages."""
    fix = "write the run file with 'rbjax simulate'"
    if "meta" not in arrays:
        raise CliError(f"{what} has no array 'meta'. Fix: {fix}.")
    raw = arrays.pop("meta")
    try:
        meta = json.loads(str(raw)) if raw.ndim == 0 and raw.dtype.kind in "US" else None
    except ValueError:
        meta = None
    if not isinstance(meta, dict):
        raise CliError(f"{what}: 'meta' is not a JSON table (the run's settings). Fix: {fix}.")
    batch = meta.get("batch")
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
        raise CliError(f"{what}: meta 'batch' is {batch!r}, not null or a count. Fix: {fix}.")
    return meta


def read(path: str) -> Run:
    """Read a run file, or raise CliError saying why it is not one (module docstring)."""
    name = path if path.lower().endswith(".npz") else "run.npz"
    fix = f"give a run file written by 'rbjax simulate MODEL --out {name}'"
    arrays = load_npz(path, "RUN", fix)
    fmt = arrays.pop("format", np.asarray(""))
    fmt = str(fmt) if fmt.ndim == 0 else ""
    if fmt != FORMAT:
        raise CliError(
            f"RUN {path!r} has format {fmt or '(none)'!r}, expected {FORMAT!r}. Fix: write it with "
            "'rbjax simulate ... --out run.npz'."
        )
    run = Run(arrays, parse_meta(arrays, f"RUN {path!r}"))
    _check_shapes(run, f"RUN {path!r}", fix)
    return run


def _check_shapes(run: Run, what: str, fix: str) -> None:
    """``t`` (T,) finite and increasing and ``q`` ([B,] T, nb, 7) present, B the meta's
    batch; every other array of the format numbers of its documented shape (module
    docstring), the names text, one per body, joint or coordinate of the arrays."""

    def wrong(name: str, problem: str) -> NoReturn:
        raise CliError(f"{what}: array {name!r} {problem}. Fix: {fix}.")

    for name in ("t", "qpos" if run.joint else "q"):
        if name not in run:
            wrong(name, "is missing")
    lead = () if run.batch is None else (run.batch,)
    t = run["t"]
    if t.ndim != 1 or t.size < 1 or t.dtype.kind not in "fiu" or not np.all(np.isfinite(t)):
        wrong("t", f"has shape {t.shape} and type {t.dtype}: not T finite times")
    if t.size > 1 and np.any(np.diff(t) <= 0):
        wrong("t", "is not increasing")
    want = (*lead, t.size)
    dims: dict[str, int] = {}
    if run.joint:  # qpos (B, T, nq) is checked with the series below
        q = run["qpos"]
        if q.dtype.kind not in "fiu" or q.shape[:-1] != want or q.ndim != len(want) + 1:
            wrong("qpos", f"has shape {q.shape}, not ({'B, ' * bool(lead)}T, nq) with {want}")
    else:
        q = run["q"]
        if q.dtype.kind not in "fiu" or q.shape[:-2] != want or q.ndim != len(want) + 2:
            wrong("q", f"has shape {q.shape}, not ({'B, ' * bool(lead)}T, nb, 7) with {want}")
        if q.shape[-1] != 7:
            wrong("q", f"has shape {q.shape}, not ({'B, ' * bool(lead)}T, nb, 7)")
        dims["nb"] = q.shape[-2]
    for name, dim in NAMES.items():
        if name in run:
            names = run[name]
            if names.ndim != 1 or names.dtype.kind not in "US":
                wrong(name, f"has shape {names.shape} and type {names.dtype}, not a list of names")
            if dims.setdefault(dim, names.size) != names.size:
                wrong(name, f"has {names.size} names, the run {dims[dim]} ({dim})")
    for name, tail in SERIES.items():
        if name not in run:
            continue
        a = run[name]
        ok = a.dtype.kind in "fiu" and a.shape[: len(want)] == want
        ok = ok and a.ndim == len(want) + len(tail)
        for size, d in zip(a.shape[len(want) :], tail, strict=True) if ok else ():
            ok = ok and (size == d if isinstance(d, int) else dims.setdefault(d, size) == size)
        if not ok:
            parts = ", ".join(["B"] * bool(lead) + ["T"] + [str(d) for d in tail])
            wrong(name, f"has shape {a.shape} and type {a.dtype}, not ({parts})")
    for name in ("result", "failed_step"):
        if name in run and (run[name].shape != lead or run[name].dtype.kind not in "iu"):
            wrong(name, f"has shape {run[name].shape}, not one integer per system {lead}")


def failures(run: Run, samples) -> str | None:
    """One line naming the systems among ``samples`` (indices of a batch, or None for a single
    run) that failed, with their result and the time of the failed step, or None. A failed
    run's saved states are NaN (or implausible) from that step on: the plot and the animation
    draw what comes before."""
    if "result" not in run:
        return None
    codes = np.atleast_1d(run["result"])
    steps = np.atleast_1d(run["failed_step"]) if "failed_step" in run else np.full(codes.shape, -1)
    picked = [0] if samples is None else list(samples)
    bad = [i for i in picked if codes[i] != 0]
    if not bad:
        return None
    from .._results import RESULTS

    dt = run.meta.get("dt")

    def one(i):
        try:
            name = RESULTS(int(codes[i])).name
        except ValueError:
            name = f"code {int(codes[i])}"
        at = f" at step {int(steps[i])}" if steps[i] >= 0 else ""
        if at and isinstance(dt, (int, float)):
            at += f" (t = {float(np.ravel(run['t'])[0]) + int(steps[i]) * dt:.6g} s)"
        return ("" if samples is None else f"sample {i}: ") + name + at

    shown = ", ".join(one(i) for i in bad[:5]) + (
        f" and {len(bad) - 5} more" if len(bad) > 5 else ""
    )
    return f"the run failed ({shown}); its states from that step on are NaN or implausible"


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
