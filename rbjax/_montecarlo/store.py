"""A Monte-Carlo run on disk: one ``.npz`` per chunk and a JSON manifest, written atomically.

Layout of a run directory (format ``rbjax.monte_carlo/1``)::

    manifest.json        the run's configuration and, per finished chunk, its file and SHA-256
    chunk-000000.npz     ids, status, failed_step and one array per measure ("m_<name>")
    traj-000000.npz      saved states of the chunk (t, q, u), only with trajectories=k

Every file is written to a temporary name in the same directory, flushed, ``fsync``-ed and
renamed over its final name (``os.replace``, atomic on POSIX), then the directory is
``fsync``-ed; the manifest is rewritten the same way AFTER the chunk's files, so a chunk is
complete exactly when the manifest lists it. A chunk whose file is missing, truncated or does
not match its checksum is recomputed on resume, never read.

npz + JSON rather than zarr or parquet: both ship with numpy and the standard library (no new
dependency), a chunk is one small file written once, and anyone can read it with ``np.load``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile

import numpy as np

FORMAT = "rbjax.monte_carlo/1"
MANIFEST = "manifest.json"


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


class RunStore:
    """The files of one run directory (see module docstring)."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = os.fspath(directory)

    def path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def read_manifest(self) -> dict | None:
        try:
            with open(self.path(MANIFEST), "rb") as f:
                manifest = json.loads(f.read())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise ValueError(
                f"monte_carlo(directory={self.directory!r}): {MANIFEST} cannot be read ({e}). "
                "Fix: pass resume=False to start the run again in this directory, or another "
                "directory."
            ) from None
        if manifest.get("format") != FORMAT:
            raise ValueError(
                f"monte_carlo(directory={self.directory!r}): {MANIFEST} has format "
                f"{manifest.get('format')!r}, not {FORMAT!r}. Fix: use another directory."
            )
        return manifest

    def write_manifest(self, manifest: dict):
        data = json.dumps(manifest, indent=1, sort_keys=True).encode()
        write_atomic(self.path(MANIFEST), data)

    def write_chunk(self, kind: str, index: int, arrays: dict[str, np.ndarray]) -> dict:
        """Write one chunk file atomically; returns its manifest entry (file name, digest)."""
        name = f"{kind}-{index:06d}.npz"
        data = npz_bytes(arrays)
        write_atomic(self.path(name), data)
        return {"file": name, "sha256": sha256(data)}

    def read_chunk(self, entry: dict) -> dict[str, np.ndarray] | None:
        """The arrays of a chunk whose file matches its digest, else None (to be recomputed)."""
        try:
            with open(self.path(entry["file"]), "rb") as f:
                data = f.read()
        except OSError:
            return None
        if sha256(data) != entry.get("sha256"):
            return None
        try:
            with np.load(io.BytesIO(data)) as z:
                return {k: z[k] for k in z.files}
        except (OSError, ValueError):  # pragma: no cover - digest matched, content unreadable
            return None
