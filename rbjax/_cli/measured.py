"""The measured data of ``rbjax identify``: an ``.npz`` file (a run file of ``rbjax simulate``,
or any with sample times ``t``), one run of a batch, and its arrays checked against the
sample times. Errors name the configuration field (``data``, ``sample``,
``observations[0].array``) and the fix.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from . import runfile
from .config import fail, string


@dataclasses.dataclass
class Data:
    """The measured arrays (one run of a batch), their times and the names they carry."""

    path: str
    t: np.ndarray
    arrays: dict[str, np.ndarray]

    def names(self, key: str) -> list[str] | None:
        return [str(n) for n in self.arrays[key]] if key in self.arrays else None


def load_data(config_dir: str, doc: dict) -> Data:
    """The file named by the configuration's ``data`` (relative to ``config_dir``); of a
    batch run file, the run ``sample``."""
    path = os.path.join(config_dir, string("data", doc["data"]))
    arrays = runfile.load_npz(
        path,
        "data:",
        "give the path of an .npz file (a run file of 'rbjax simulate', or one with an array "
        "'t' and the measured arrays, written with numpy.savez)",
    )
    batch = None
    fmt = arrays.pop("format", np.asarray(""))
    if fmt.ndim == 0 and str(fmt) == runfile.FORMAT:
        batch = runfile.parse_meta(arrays, f"data: {path!r}").get("batch")
    if "t" not in arrays:
        fail(
            "data",
            f"{path!r} has no array 't' (arrays: {', '.join(arrays)})",
            "store the sample times in s as 't' (T,)",
        )
    t = arrays.pop("t")
    if t.ndim != 1 or t.size < 2 or not np.issubdtype(t.dtype, np.number):
        fail("data", f"array 't' has shape {t.shape}", "store the T sample times as a 1-D array")
    t = t.astype(float)
    if not np.all(np.isfinite(t)) or np.any(np.diff(t) <= 0):
        fail(
            "data",
            "the times 't' are not finite and strictly increasing",
            "sort the samples and drop repeated times",
        )
    if batch:
        if "sample" not in doc:
            fail(
                "sample",
                f"is missing: the data is a batch of {batch} runs",
                f"set sample = k, the run to fit (0 <= k < {batch})",
            )
        k = doc["sample"]
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < batch:
            fail("sample", f"is {k!r}", f"give an integer in [0, {batch})")
        per_run = {key: a for key, a in arrays.items() if not key.endswith("_names") and a.ndim}
        for key, a in per_run.items():
            if a.shape[0] != batch:
                fail(
                    "data",
                    f"array {key!r} of the batch run file has shape {a.shape}, not ({batch}, ...)",
                    "write the batch with 'rbjax simulate --batch'",
                )
        arrays |= {key: a[k] for key, a in per_run.items()}
    elif "sample" in doc:
        fail("sample", "is given but the data is not a batch run file", "remove it")
    return Data(path, t, arrays)


def data_array(path: str, data: Data, name, default: str) -> tuple[str, np.ndarray]:
    """The array ``name`` (the field at ``path``; ``default`` when None) as floats, one row
    per sample time, and its key."""
    key = default if name is None else string(path, name)
    if key not in data.arrays:
        listed = ", ".join(k for k in data.arrays if not k.endswith("_names"))
        hint = "" if name is not None else f" (the default for this kind is '{default}')"
        fail(
            path,
            f"the data has no array {key!r}{hint} (arrays: {listed})",
            "set array = the name of the measured array",
        )
    a = data.arrays[key]
    if not np.issubdtype(a.dtype, np.number) or a.ndim < 1 or a.shape[0] != data.t.size:
        n = a.shape[0] if a.ndim else 0
        fail(
            path,
            f"array {key!r} has shape {a.shape}: {n} samples, but 't' has {data.t.size}",
            "store one row per sample time",
        )
    return key, a.astype(float)


def body_rows(path, key, a, body: int, body_name: str, data: Data, nb: int) -> np.ndarray:
    """The (T, 7) rows of one body from a (T, nb', 7) state array ``a`` (the data's ``key``):
    found by the data's ``body_names``, else by the model's order (``body`` of ``nb``)."""
    names = data.names("body_names")
    if names is not None:
        if body_name not in names:
            fail(
                path,
                f"body {body_name!r} is not in the data's body_names ({', '.join(names)})",
                "observe a body the data holds",
            )
        idx = names.index(body_name)
    else:
        if a.shape[1] != nb:
            fail(
                path,
                f"array {key!r} holds {a.shape[1]} bodies, the model {nb}",
                "store one (7,) state per body of the model, or add body_names",
            )
        idx = body
    return a[:, idx]
