"""A Monte-Carlo run on disk: one ``.npz`` per chunk and file kind and a JSON manifest, written
atomically and verified on resume.

Layout of a run directory (format ``rbjax.monte_carlo/2``)::

    manifest.json        {"format", "run", "config", "chunks"}: the run's configuration, its
                         fingerprint and, per finished chunk, its files and their SHA-256
    chunk-000000.npz     ids, status, failed_step and one array per measure ("m_<name>")
    traj-000000.npz      ids and the saved states of the chunk (t, q, u), only with trajectories=k

The run's fingerprint is ``run = SHA-256(json.dumps({"config": config, "format": FORMAT},
sort_keys=True, separators=(",", ":")))``, where ``config`` holds everything that determines
the files (runner.py: n_samples, chunk_size, device_batch, n_steps, dt, key, the measures'
names and types, trajectories, dtype, and the digest of the per-device program: the jaxpr and
constants of the sampler, the model, the measures, the monitors and the integrator). Every file
also embeds ``run`` (str), ``kind`` ("chunk" or "traj") and ``chunk`` (its index) as 0-d
arrays: wherever a file is copied, it says which run and which chunk it belongs to.

Writing: every file is written to a temporary name in the same directory, flushed,
``fsync``-ed and renamed over its final name (``os.replace``, atomic on POSIX), then the
directory is ``fsync``-ed; the manifest is rewritten the same way AFTER the chunk's files, so a
chunk is complete exactly when the manifest lists it.

Resuming: the manifest is checked first (``read_manifest``, ``check_entries``: JSON of the
right shape, the keys and types above, no duplicate keys, chunk indices in range, each entry's
file name the one its kind and index imply, so no path leaves the directory); anything else is
a ValueError naming the manifest, the key and the fix. Then every file it lists is verified
(``read_file``):

* missing, unreadable (truncated or corrupt: not an npz that reads completely, zip CRCs
  included), or this run's own file (fingerprint, kind and index as expected) with another
  digest than the manifest's (a recompute killed before the manifest was rewritten): the
  chunk is recomputed, and the caller warns naming the file;
* readable but carrying another run's fingerprint or none (another run's file, a file of
  format 1, any other npz), or another kind or chunk index: ValueError naming the file. A
  mixed-up directory or an edited file is never silently used and never silently replaced;
* this run's, with the manifest's digest, but arrays that do not fit the chunk (names, shapes,
  dtypes, ids): ValueError naming the file and the array.

Format 1 (no fingerprints; rbjax before issue 36) is refused with a message saying how to go
on: its files cannot be verified, and they stay readable with ``np.load``.

npz + JSON rather than zarr or parquet: both ship with numpy and the standard library (no new
dependency), a chunk is one small file written once, and anyone can read it with ``np.load``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tempfile

import numpy as np

FORMAT = "rbjax.monte_carlo/2"
OLDER_FORMATS = ("rbjax.monte_carlo/1",)  # refused, with the way to go on
MANIFEST = "manifest.json"
ROLES = {"summary": "chunk", "trajectories": "traj"}  # manifest entry key -> file kind
_META = ("run", "kind", "chunk")  # embedded in every file
_KEYS = ("format", "run", "config", "chunks")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_INDEX = re.compile(r"0|[1-9][0-9]*")  # one spelling per index: "01" would alias "1"
_FIX_MANIFEST = (
    "start a new run in an empty directory, or delete manifest.json to recompute every chunk"
)


def _fsync_dir(directory: str):
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes):
    """Write ``data`` to ``path`` atomically: temporary file, fsync, rename, fsync directory."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # pyright: ignore[reportArgumentType]
    return buf.getvalue()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def run_fingerprint(config: dict) -> str:
    """The run's fingerprint: SHA-256 of the canonical JSON of the format and ``config``."""
    text = json.dumps({"config": config, "format": FORMAT}, sort_keys=True, separators=(",", ":"))
    return sha256(text.encode())


def file_name(kind: str, index: int) -> str:
    return f"{kind}-{index:06d}.npz"


class _DuplicateKey(Exception):
    pass


def _unique(pairs):
    """json object hook: a key given twice is an error (json.loads keeps the last silently)."""
    out = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def _load(data: bytes) -> dict[str, np.ndarray] | None:
    """The arrays of an npz that reads completely (zip CRCs checked), else None."""
    try:
        with np.load(io.BytesIO(data)) as z:  # allow_pickle=False: no object arrays
            return {k: z[k] for k in z.files}
    except Exception:  # zipfile, zlib, numpy and EOF errors alike mean "cannot be read"
        return None


def _scalar(a: np.ndarray | None, kinds: str):
    """The value of a 0-d array of one of the dtype ``kinds``, else None."""
    if a is None or a.shape != () or a.dtype.kind not in kinds:
        return None
    return a.item()


def _misfit(arrays: dict[str, np.ndarray], layout: dict, ids: np.ndarray) -> str:
    """What does not fit the chunk: array names, shapes (n, *per-sample), dtypes, ids."""
    if set(arrays) != set(layout):
        return f"it holds the arrays {sorted(arrays)}, not {sorted(layout)}"
    for k, (tail, dtype) in layout.items():
        a, shape = arrays[k], (len(ids), *tail)
        if a.shape != shape or a.dtype != dtype:
            return f"{k} is {a.dtype}{a.shape}, not {np.dtype(dtype)}{shape}"
    if not np.array_equal(arrays["ids"], ids):
        return f"its ids are not {ids[0]} to {ids[-1]}"
    return ""


class RunStore:
    """The files of one run directory (see module docstring)."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = os.fspath(directory)

    def path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    @property
    def manifest_path(self) -> str:
        return self.path(MANIFEST)

    def malformed(self, problem: str) -> ValueError:
        return ValueError(
            f"monte_carlo(directory={self.directory!r}, resume=True): {self.manifest_path} is "
            f"malformed: {problem}. Fix: {_FIX_MANIFEST}."
        )

    def read_manifest(self) -> dict | None:
        """The manifest (JSON object with the keys and types of a run manifest, no duplicate
        keys, this format), or None when the directory has none."""
        try:
            with open(self.manifest_path, "rb") as f:
                text = f.read()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise self.malformed(f"it cannot be read ({e})") from None
        try:
            manifest = json.loads(text, object_pairs_hook=_unique)
        except _DuplicateKey as e:
            raise self.malformed(f"the key {e.args[0]!r} appears twice") from None
        except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
            raise self.malformed(f"not valid JSON ({e})") from None
        if not isinstance(manifest, dict):
            raise self.malformed(f"it is a {type(manifest).__name__}, not a JSON object")
        if "format" not in manifest:
            raise self.malformed("'format' is missing")
        fmt = manifest["format"]
        where = f"monte_carlo(directory={self.directory!r}, resume=True): {self.manifest_path}"
        if fmt in OLDER_FORMATS:
            raise ValueError(
                f"{where} was written by an older rbjax (format {fmt!r}), whose files do not "
                f"name their run and cannot be verified; this version reads {FORMAT!r}. Fix: "
                "start a new run in an empty directory (or pass resume=False to start again "
                "here), or finish this run with the rbjax version that started it; its .npz "
                "files stay readable with np.load."
            )
        if fmt != FORMAT:
            raise ValueError(
                f"{where} has format {fmt!r}, not {FORMAT!r}: another version of rbjax, or "
                "another program, wrote it. Fix: resume it with the rbjax version that wrote "
                "it, or start a new run in an empty directory."
            )
        for key, kind in (("run", str), ("config", dict), ("chunks", dict)):
            if key not in manifest:
                raise self.malformed(f"{key!r} is missing")
            if not isinstance(manifest[key], kind):
                expected = "JSON object" if kind is dict else "string"
                raise self.malformed(
                    f"{key!r} is a {type(manifest[key]).__name__}, not a {expected}"
                )
        extra = sorted(set(manifest) - set(_KEYS))
        if extra:
            raise self.malformed(f"{extra[0]!r} is not a key of a run manifest {_KEYS}")
        return manifest

    def check_config_keys(self, manifest: dict, config: dict):
        """The manifest's configuration has this version's keys (values: the caller's check)."""
        on_disk = manifest["config"]
        for k in config:
            if k not in on_disk:
                raise self.malformed(f"config[{k!r}] is missing")
        for k in on_disk:
            if k not in config:
                raise self.malformed(f"config[{k!r}] is not a key of a run configuration")

    def check_entries(self, manifest: dict, run: str, n_chunks: int, trajectories: bool):
        """The manifest's fingerprint is ``run`` (that of its configuration, which the caller
        found equal to this call's), and every chunk entry is {"summary": FILE[,
        "trajectories": FILE]} with FILE = {"file": the name its kind and index imply,
        "sha256": 64 hex digits}, for a chunk index in [0, n_chunks)."""
        if manifest["run"] != run:
            raise self.malformed(
                f"'run' = {manifest['run']!r} is not the fingerprint of its 'config' ({run!r})"
            )
        roles = ("summary", "trajectories") if trajectories else ("summary",)
        for key, entry in manifest["chunks"].items():
            where = f"chunks[{key!r}]"
            if not _INDEX.fullmatch(key):
                raise self.malformed(f"the chunk index {key!r} is not 0, 1, 2, ...")
            if int(key) >= n_chunks:
                raise self.malformed(
                    f"{where}: chunk {int(key)} is out of range (the run has chunks 0 to "
                    f"{n_chunks - 1})"
                )
            if not isinstance(entry, dict):
                raise self.malformed(f"{where} is a {type(entry).__name__}, not a JSON object")
            for role in roles:
                if role not in entry:
                    raise self.malformed(f"{where}[{role!r}] is missing")
            for role in sorted(set(entry) - set(roles)):
                raise self.malformed(f"{where}[{role!r}] is not one of {roles}")
            for role in roles:
                self._check_file_entry(f"{where}[{role!r}]", entry[role], ROLES[role], int(key))

    def _check_file_entry(self, where: str, entry, kind: str, index: int):
        if not isinstance(entry, dict):
            raise self.malformed(f"{where} is a {type(entry).__name__}, not a JSON object")
        for k in ("file", "sha256"):
            if k not in entry:
                raise self.malformed(f"{where}[{k!r}] is missing")
        for k in sorted(set(entry) - {"file", "sha256"}):
            raise self.malformed(f"{where}[{k!r}] is not 'file' or 'sha256'")
        name = file_name(kind, index)
        if entry["file"] != name:  # also: no path that leaves the directory
            raise self.malformed(f"{where}['file'] = {entry['file']!r} is not {name!r}")
        digest = entry["sha256"]
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise self.malformed(
                f"{where}['sha256'] = {digest!r} is not a SHA-256 (64 lowercase hex digits)"
            )

    def write_manifest(self, manifest: dict):
        data = json.dumps(manifest, indent=1, sort_keys=True).encode()
        write_atomic(self.manifest_path, data)

    def write_file(self, kind: str, index: int, run: str, arrays: dict[str, np.ndarray]) -> dict:
        """Write chunk ``index``'s file of ``kind`` atomically, with the run's fingerprint, its
        kind and its index embedded; returns its manifest entry (file name, digest)."""
        name = file_name(kind, index)
        meta = {"run": np.asarray(run), "kind": np.asarray(kind), "chunk": np.asarray(index)}
        data = npz_bytes({**meta, **arrays})
        write_atomic(self.path(name), data)
        return {"file": name, "sha256": sha256(data)}

    def read_file(
        self, entry: dict, kind: str, index: int, run: str, layout: dict, ids: np.ndarray
    ) -> tuple[dict[str, np.ndarray] | None, str]:
        """The arrays of a listed file, verified (module docstring), without the embedded
        fingerprint, kind and index; or (None, why) when the chunk must be recomputed.
        ``layout``: name -> (per-sample shape, dtype) of every array; ``ids``: the chunk's.
        Raises ValueError on a file of another run or another chunk, or one that does not
        fit the chunk."""
        name = entry["file"]
        path = self.path(name)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None, f"{name} is missing"
        except OSError as e:
            return None, f"{name} cannot be read ({e})"
        arrays = _load(data)
        if arrays is None:
            return None, f"{name} is truncated or corrupt (not a readable .npz)"
        meta = {k: arrays.pop(k, None) for k in _META}
        their_run = _scalar(meta["run"], "U")
        their = (_scalar(meta["kind"], "U"), _scalar(meta["chunk"], "iu"))
        if their_run is None:
            raise self._refused(
                path,
                index,
                "carries no run fingerprint: this run did not write it (another program, or "
                "an rbjax whose run format is older than 2)",
                foreign=True,
            )
        if their_run != run:
            raise self._refused(
                path,
                index,
                f"belongs to another run (its run fingerprint is {their_run[:16]}..., this "
                f"run's {run[:16]}...)",
                foreign=True,
            )
        if their != (kind, index):
            raise self._refused(
                path, index, f"is this run's {their[0]} {their[1]}, not {kind} {index}"
            )
        if sha256(data) != entry["sha256"]:
            return None, (
                f"{name} is this run's, but not the file {MANIFEST} lists (another SHA-256: it "
                "was written again after the manifest)"
            )
        problem = _misfit(arrays, layout, ids)
        if problem:
            raise self._refused(path, index, f"does not fit chunk {index}: {problem}")
        return arrays, ""

    def _refused(self, path: str, index: int, problem: str, foreign: bool = False) -> ValueError:
        elsewhere = ", or resume the run it belongs to in its own directory" if foreign else ""
        return ValueError(
            f"monte_carlo(directory={self.directory!r}, resume=True): {path} {problem}. Fix: "
            f"delete {os.path.basename(path)} to recompute chunk {index} (or put this run's own "
            f"file back){elsewhere}."
        )
