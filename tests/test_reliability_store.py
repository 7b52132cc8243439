"""Issue 36's Monte-Carlo store probes: a run directory verifies itself on resume. Every file
embeds the run's fingerprint, its kind and its chunk index and is listed in the manifest with
its SHA-256; a missing or unreadable file of this run is recomputed with a warning naming it, a
file of another run (or of another chunk) is refused naming it, and a malformed manifest is a
ValueError naming the manifest, the key and the fix, never a KeyError or AttributeError.

One small run (80 tumbling bodies, 10 steps, chunks of 32, trajectories every 5 steps) and a
second one with another key are written once; every probe works on a copy of them, and every
resume reuses the compiled program (or compiles nothing when every chunk is read back)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil

import numpy as np
import pytest
from montecarlo_models import BODY_MEASURES, body_sample

import rbjax

MEASURES = {"w_max": BODY_MEASURES["w_max"]}
N, DT, STEPS = 80, 1e-2, 10  # chunks 0, 1 (32 samples each) and 2 (16)
COMMON = dict(chunk_size=32, device_batch=32, trajectories=5, progress=False)


def _run(directory, resume=True, key=7, **kw):
    args = {**COMMON, **kw}
    return rbjax.monte_carlo(
        body_sample, N, DT, STEPS, MEASURES, key=key, directory=directory, resume=resume, **args
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Run A (key 7) and run B (key 8), uninterrupted, and A's result."""
    base = tmp_path_factory.mktemp("runs")
    result = _run(base / "a", resume=False)
    _run(base / "b", resume=False, key=8)
    return base / "a", base / "b", result


def _copy(src, tmp_path, name="run"):
    dst = tmp_path / name
    shutil.copytree(src, dst)
    return dst


def _manifest(run) -> dict:
    return json.loads((run / "manifest.json").read_text())


def _write_manifest(run, manifest):
    (run / "manifest.json").write_text(json.dumps(manifest))


def _arrays(path) -> dict:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def _same_files(a, b, names):
    for name in names:
        x, y = _arrays(a / name), _arrays(b / name)
        assert sorted(x) == sorted(y), name
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=f"{name}:{k}")


def _same_samples(result, reference):
    np.testing.assert_array_equal(result.samples["w_max"], reference.samples["w_max"])
    np.testing.assert_array_equal(result.status, reference.status)
    np.testing.assert_array_equal(
        result.statistics["w_max"].mean, reference.statistics["w_max"].mean
    )


def _refused(path, *words):
    """The refusal of a file: a ValueError naming it, what is wrong, and the fix."""
    return re.escape(str(path)) + ".*" + ".*".join(words) + r".*Fix: "


# ---------------------------------------------------------------- what a run directory holds


def test_every_file_embeds_the_run_fingerprint_its_kind_and_index_and_is_listed_with_its_digest(
    runs,
):
    """The manifest lists every file with the SHA-256 of its bytes (hashlib here); each file
    embeds run = SHA-256 of the canonical JSON of {format, config} (the formula documented in
    rbjax/_montecarlo/store.py, recomputed here), its kind and its chunk index. Two runs that
    differ in their key have different fingerprints."""
    a, b, _ = runs
    manifest = _manifest(a)
    assert manifest["format"] == "rbjax.monte_carlo/2"
    canonical = json.dumps(
        {"config": manifest["config"], "format": manifest["format"]},
        sort_keys=True,
        separators=(",", ":"),
    )
    assert manifest["run"] == hashlib.sha256(canonical.encode()).hexdigest()
    assert manifest["run"] != _manifest(b)["run"]
    assert manifest["config"]["device_batch"] == 32 and manifest["config"]["dtype"] == "float64"
    listed = {"manifest.json"}
    for c, entry in manifest["chunks"].items():
        for role, kind in (("summary", "chunk"), ("trajectories", "traj")):
            name = f"{kind}-{int(c):06d}.npz"
            assert entry[role]["file"] == name
            data = (a / name).read_bytes()
            assert entry[role]["sha256"] == hashlib.sha256(data).hexdigest()
            z = _arrays(a / name)
            assert str(z["run"]) == manifest["run"]
            assert str(z["kind"]) == kind and int(z["chunk"]) == int(c)
            listed.add(name)
    assert set(os.listdir(a)) == listed and len(listed) == 7


# ---------------------------------------------------------------- files of this run: recomputed


def test_missing_or_unreadable_files_of_this_run_are_recomputed_with_a_warning_naming_them(
    runs, tmp_path
):
    """A truncated trajectory file, a deleted chunk file, and a chunk file of this run rewritten
    after the manifest (a recompute killed before the manifest was rewritten: right fingerprint
    and index, another digest) are recomputed, each with a warning naming the file; the files
    and the results are those of the uninterrupted run bit for bit."""
    a, _, reference = runs
    run = _copy(a, tmp_path)
    data = (run / "traj-000001.npz").read_bytes()
    (run / "traj-000001.npz").write_bytes(data[: len(data) // 2])
    (run / "chunk-000002.npz").unlink()
    z = _arrays(run / "chunk-000000.npz")
    z["m_w_max"] = z["m_w_max"] + 1.0  # content that only the digest can tell is wrong
    np.savez(run / "chunk-000000.npz", **z)
    with pytest.warns(RuntimeWarning) as record:
        r = _run(run)
    text = "\n".join(str(w.message) for w in record)
    for name in ("traj-000001.npz", "chunk-000002.npz", "chunk-000000.npz"):
        assert re.search(re.escape(name) + ".*recomputed", text), text
    assert r.chunks_recomputed == (0, 1, 2) and r.chunks_resumed == ()
    _same_samples(r, reference)
    _same_files(run, a, [f"{k}-{c:06d}.npz" for k in ("chunk", "traj") for c in range(3)])
    again = _run(run)  # the recomputed files are listed with their new digests
    assert again.chunks_resumed == (0, 1, 2)


# ---------------------------------------------------------------- files of another run: refused


def test_a_replaced_trajectory_file_is_never_kept(runs, tmp_path):
    """Issue 36: traj-000001.npz replaced (by a re-saved copy with other states, by chunk 2's
    trajectory file of the same run, by run B's) was kept on resume. Each is now refused,
    naming the file; also when chunk 1 is to be recomputed anyway (its other file missing),
    rather than overwritten."""
    a, b, _ = runs
    name = "traj-000001.npz"
    run = _copy(a, tmp_path)
    z = _arrays(run / name)
    np.savez(run / name, ids=z["ids"], t=z["t"], q=-z["q"], u=z["u"])
    with pytest.raises(ValueError, match=_refused(run / name, "no run fingerprint")):
        _run(run)
    shutil.copyfile(a / "traj-000002.npz", run / name)
    with pytest.raises(ValueError, match=_refused(run / name, "traj 2", "not traj 1")):
        _run(run)
    shutil.copyfile(b / name, run / name)
    with pytest.raises(ValueError, match=_refused(run / name, "another run")):
        _run(run)
    (run / "chunk-000001.npz").unlink()  # chunk 1 must be recomputed: B's file is still refused
    with pytest.raises(ValueError, match=_refused(run / name, "another run")):
        _run(run)


def test_a_foreign_chunk_spliced_into_the_manifest_with_its_digest_is_refused(runs, tmp_path):
    """Issue 36: run B's chunk-000001.npz copied into run A with B's manifest entry (so its
    digest matches) was read back as A's chunk 1. It, and B's trajectory file spliced the same
    way, are refused naming the file; so is B's chunk without its digest."""
    a, b, _ = runs
    for role, name in (("summary", "chunk-000001.npz"), ("trajectories", "traj-000001.npz")):
        run = _copy(a, tmp_path, role)
        shutil.copyfile(b / name, run / name)
        manifest = _manifest(run)
        manifest["chunks"]["1"][role] = _manifest(b)["chunks"]["1"][role]
        _write_manifest(run, manifest)
        with pytest.raises(ValueError, match=_refused(run / name, "another run")):
            _run(run)
    run = _copy(a, tmp_path, "unspliced")
    shutil.copyfile(b / "chunk-000001.npz", run / "chunk-000001.npz")
    with pytest.raises(ValueError, match=_refused(run / "chunk-000001.npz", "another run")):
        _run(run)
    (run / "chunk-000001.npz").unlink()  # the fix the message gives: the chunk is recomputed
    with pytest.warns(RuntimeWarning, match="chunk-000001.npz is missing"):
        assert _run(run).chunks_recomputed == (1,)


def test_a_file_of_this_run_with_a_forged_payload_is_refused(runs, tmp_path):
    """A chunk file with this run's fingerprint and index and a matching digest in the manifest,
    whose arrays do not fit the chunk (ids of another chunk; one measure value missing), is
    refused naming the file and the array."""
    a, _, _ = runs
    run = _copy(a, tmp_path)
    name = "chunk-000001.npz"
    z = _arrays(run / name)
    for forged, words in (
        ({**z, "ids": z["ids"] + 1}, ("ids",)),
        ({**z, "m_w_max": z["m_w_max"][:-1]}, ("m_w_max", r"\(31, 3\)", r"\(32, 3\)")),
    ):
        np.savez(run / name, **forged)
        manifest = _manifest(run)
        manifest["chunks"]["1"]["summary"]["sha256"] = hashlib.sha256(
            (run / name).read_bytes()
        ).hexdigest()
        _write_manifest(run, manifest)
        with pytest.raises(ValueError, match=_refused(run / name, *words)):
            _run(run)


# ---------------------------------------------------------------- malformed manifests


def _set(path, value):
    def edit(m):
        *head, last = path
        for k in head:
            m = m[k]
        m[last] = value

    return edit


def _delete(path):
    def edit(m):
        *head, last = path
        for k in head:
            m = m[k]
        del m[last]

    return edit


_S = ("chunks", "1", "summary")
MALFORMED = {
    "not JSON": (b'{"format": "rbjax.monte_carlo/2", "chunks": {', "not valid JSON"),
    "a list": (b"[1, 2]", "a list, not a JSON object"),
    "no chunks": (_delete(("chunks",)), "'chunks' is missing"),
    "chunks a list": (_set(("chunks",), []), "'chunks' is a list"),
    "config a string": (_set(("config",), "x"), "'config' is a str"),
    "unknown key": (_set(("extra",), 1), "'extra' is not a key of"),
    "no digest": (_delete((*_S, "sha256")), re.escape("chunks['1']['summary']['sha256']")),
    "digest a number": (_set((*_S, "sha256"), 5), re.escape("['sha256'] = 5")),
    "no trajectories": (
        _delete(("chunks", "1", "trajectories")),
        re.escape("chunks['1']['trajectories'] is missing"),
    ),
    "entry a list": (_set(("chunks", "1"), []), re.escape("chunks['1'] is a list")),
    "index out of range": (lambda m: m["chunks"].update({"3": m["chunks"]["0"]}), "chunk 3"),
    "index not a number": (lambda m: m["chunks"].update({"x": m["chunks"]["0"]}), "'x'"),
    "index not canonical": (lambda m: m["chunks"].update({"01": m["chunks"]["0"]}), "'01'"),
    "escaping path": (_set((*_S, "file"), "../chunk-000001.npz"), "'../chunk-000001.npz'"),
    "another chunk's file": (_set((*_S, "file"), "chunk-000002.npz"), "not 'chunk-000001.npz'"),
    "run edited": (_set(("run",), "0" * 64), "'run'"),
    "format missing": (_delete(("format",)), "'format' is missing"),
    "format unknown": (_set(("format",), "rbjax.monte_carlo/9"), "rbjax.monte_carlo/9"),
    "format 1": (_set(("format",), "rbjax.monte_carlo/1"), "older rbjax"),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_manifest_is_a_named_error(runs, tmp_path, case):
    """Each malformed manifest raises ValueError naming the manifest's path, the offending key
    and the fix (before any chunk is read or computed)."""
    edit, words = MALFORMED[case]
    run = _copy(runs[0], tmp_path)
    if isinstance(edit, bytes):
        (run / "manifest.json").write_bytes(edit)
    else:
        manifest = _manifest(run)
        edit(manifest)
        _write_manifest(run, manifest)
    pattern = re.escape(str(run / "manifest.json")) + ".*" + words + ".*Fix: "
    with pytest.raises(ValueError, match=pattern):
        _run(run)


def test_duplicate_chunk_indices_in_the_manifest_are_a_named_error(runs, tmp_path):
    """JSON keeps the last of two equal keys silently; the manifest reader does not."""
    run = _copy(runs[0], tmp_path)
    manifest = _manifest(run)
    text = json.dumps(manifest).replace(
        '"chunks": {', '"chunks": {"2": ' + json.dumps(manifest["chunks"]["0"]) + ", ", 1
    )
    (run / "manifest.json").write_text(text)
    pattern = re.escape(str(run / "manifest.json")) + ".*'2' appears twice.*Fix: "
    with pytest.raises(ValueError, match=pattern):
        _run(run)


def test_a_resume_with_another_device_batch_names_it(runs, tmp_path):
    """device_batch is part of the run (it may change the last bits): a resume with another one
    is refused naming it, not as an opaque program digest."""
    run = _copy(runs[0], tmp_path)
    with pytest.raises(ValueError, match="device_batch = 32, this call 16.*Fix: "):
        _run(run, device_batch=16, chunk_size=32)
