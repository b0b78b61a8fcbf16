"""Fault injection: every edit of a stored asset version is found, or provably harmless.

Each chunk deleted, flipped, truncated, swapped with another and copied from another
version; the manifest deleted, edited or replaced; `zarr.json`'s dtype, shape and chunk
shape edited: `dx.run(dx.load(...))` raises a `dx.DataError` and `deepx-flow assets verify`
exits 2 naming the version, or the read gives the version as written (compared with NumPy)
and verify says ok; the two always agree, and only edits that leave the bytes as written
(two chunks of equal bytes swapped) read. Then the same edits made and undone over and over
while runs read the version: every run gives the version as written or a DataError. The
workers are processes, so a read that killed one (a signal such as SIGBUS) shows as a new
worker pid: there are none.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from itertools import cycle
from pathlib import Path

import numpy as np
import pytest
from distributed import Client, LocalCluster

import deepx_flow as dx
from deepx_flow.assets import catalog
from deepx_flow.cli.main import main
from deepx_flow.meta import open_db
from deepx_flow.meta.db import close_all
from deepx_flow.storage.manifest import NAME as MANIFEST


@pytest.fixture(scope="module")
def cluster():
    """Two worker processes (one thread each), shared by this module's tests."""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address="127.0.0.1:0", silence_logs=logging.CRITICAL) as c, \
            Client(c, set_as_default=False) as client:
        yield client


@pytest.fixture
def env(tmp_path, monkeypatch):
    url = f"sqlite:///{(tmp_path / 'deepx.db').as_posix()}"
    monkeypatch.setenv("DEEPX_DB_URL", url)
    monkeypatch.setenv("DEEPX_ASSET_ROOT", str(tmp_path / "assets"))
    monkeypatch.setenv("DEEPX_MIN_CHUNK_BYTES", str(1 << 14))  # a few chunks per version
    yield open_db(url)
    close_all()


def pipeline():
    @dx.asset
    def base():  # its second half repeats its first: chunks of equal bytes
        half = dx.random.normal((256, 16), seed=3, dtype="float64")
        return dx.concat([half, half], axis=0)

    @dx.asset
    def other():  # another version of the same shape and chunks, other values
        return dx.random.normal((512, 16), seed=4, dtype="float64")

    return dx.Definitions(assets=[base, other])


def _pid():
    return os.getpid()


def chunks_of(uri) -> list[Path]:
    return sorted(p for p in Path(uri, "c").rglob("*") if p.is_file())


def edit_json(path: Path, change) -> None:
    path.write_text(json.dumps(change(json.loads(path.read_text()))))


def swap(a: Path, b: Path) -> None:
    first, second = a.read_bytes(), b.read_bytes()
    a.write_bytes(second)
    b.write_bytes(first)


def edits(uri: str, other: str, rng) -> dict:
    """Name -> a function making that edit to the version at `uri` (`other`: another
    version's folder, of the same chunk grid)."""
    files = chunks_of(uri)
    root, manifest = Path(uri), Path(uri, MANIFEST)
    out = {}
    for i, f in enumerate(files):
        name = "/".join(f.relative_to(root).parts)
        size = f.stat().st_size
        at, bit, cut = int(rng.integers(0, size)), int(rng.integers(0, 8)), \
            int(rng.integers(0, size))

        def flip(f=f, at=at, bit=bit):
            data = bytearray(f.read_bytes())
            data[at] ^= 1 << bit
            f.write_bytes(bytes(data))

        out[f"{name} deleted"] = f.unlink
        out[f"{name} flipped"] = flip
        out[f"{name} truncated"] = lambda f=f, cut=cut: os.truncate(f, cut)
        out[f"{name} copied from another version"] = \
            lambda f=f, name=name: shutil.copyfile(Path(other, name), f)
        # With the next chunk, and with the first one of equal bytes (harmless).
        same = [g for g in files if g != f and g.read_bytes() == f.read_bytes()]
        for g in {files[(i + 1) % len(files)], *same[:1]} - {f}:
            out[f"{name} swapped with {'/'.join(g.relative_to(root).parts)}"] = \
                lambda f=f, g=g: swap(f, g)

    def swap_and_resize():  # the manifest's sizes rewritten to match
        swap(files[0], files[1])
        key = lambda f: "/".join(f.relative_to(root).parts)  # noqa: E731
        edit_json(manifest, lambda m: {**m, "chunks": {**m["chunks"], **{
            key(f): [f.stat().st_size, m["chunks"][key(f)][1]] for f in files[:2]}}})

    out["two chunks swapped, the manifest's sizes rewritten"] = swap_and_resize
    out["two chunks swapped, the manifest deleted"] = \
        lambda: (swap(files[0], files[1]), manifest.unlink())
    out["the manifest deleted"] = manifest.unlink
    out["the manifest's checksum of a chunk edited"] = lambda: edit_json(
        manifest, lambda m: {**m, "chunks": {k: [s, c ^ 1] for k, (s, c) in
                                             m["chunks"].items()}})
    out["the manifest replaced by another version's"] = \
        lambda: shutil.copyfile(Path(other, MANIFEST), manifest)
    meta = Path(uri, "zarr.json")
    out["zarr.json's dtype float32"] = lambda: edit_json(meta, lambda m: {
        **m, "data_type": "float32"})
    out["zarr.json's dtype int64"] = lambda: edit_json(meta, lambda m: {
        **m, "data_type": "int64"})
    out["zarr.json's shape larger"] = lambda: edit_json(meta, lambda m: {
        **m, "shape": [m["shape"][0] * 2, m["shape"][1]]})
    out["zarr.json's shape smaller"] = lambda: edit_json(meta, lambda m: {
        **m, "shape": [m["shape"][0] // 2, m["shape"][1]]})
    out["zarr.json's chunk shape"] = lambda: edit_json(meta, lambda m: {
        **m, "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [
            c // 2 for c in m["chunk_grid"]["configuration"]["chunk_shape"]]}}})
    return out


def outcome(client, written: np.ndarray) -> str:
    """'error' (a DataError from dx.load or the run), 'same' or 'wrong'."""
    try:
        got = dx.run(dx.load("base"), client=client)
    except dx.DataError as err:
        assert err.asset == "base", str(err)
        return "error"
    return "same" if got.dtype == written.dtype and np.array_equal(got, written) else "wrong"


def test_every_edit_of_a_stored_version_is_found_or_harmless(cluster, env, capsys):
    pids = cluster.run(_pid)
    dx.materialize(pipeline(), client=cluster)
    row, other = catalog.latest(env, "base"), catalog.latest(env, "other")
    written = dx.run(dx.load("base"), client=cluster)
    files = chunks_of(row.uri)
    assert len(files) >= 3 and row.manifest_digest
    stored = {f: f.read_bytes() for f in files}
    pristine = Path(row.uri).with_suffix(".pristine")
    shutil.copytree(row.uri, pristine)

    results, found = {}, {}
    for name, make in edits(row.uri, other.uri, np.random.default_rng(30)).items():
        shutil.rmtree(row.uri)
        shutil.copytree(pristine, row.uri)
        make()
        results[name] = outcome(cluster, written)
        found[name] = main(["assets", "verify", "base", "--db", env.url])
        capsys.readouterr()

    assert [n for n, r in results.items() if r == "wrong"] == []
    disagree = {n: (results[n], found[n]) for n in results
                if (results[n] == "error") != (found[n] == 2)}
    assert disagree == {}
    # What read as written is exactly what left the bytes in place as written: a swap of
    # two chunks of equal bytes.
    harmless = {n for n, r in results.items() if r == "same"}
    swaps = {n for n in results if " swapped with " in n and "," not in n}
    equal = {n for n in swaps if len({stored[Path(row.uri, p)] for p in n.split(
        " swapped with ")}) == 1}
    assert equal and harmless == equal
    assert cluster.run(_pid) == pids  # no worker died


def test_edits_made_while_runs_read_are_found_or_harmless(cluster, env):
    pids = cluster.run(_pid)
    dx.materialize(pipeline(), client=cluster)
    row, other = catalog.latest(env, "base"), catalog.latest(env, "other")
    tensor = dx.load("base")
    written = dx.run(tensor, client=cluster)
    saved = {p: p.read_bytes() for p in Path(row.uri).rglob("*") if p.is_file()}
    # Made in place, as a disk or another program would: files cut and rewritten while a
    # worker may be reading them.
    changes = edits(row.uri, other.uri, np.random.default_rng(31))
    stop = threading.Event()
    made = []

    def vandal():
        for name, make in cycle(sorted(changes.items())):
            if stop.is_set():
                return
            try:
                make()
                made.append(name)
            except FileNotFoundError:  # (an edit of a file the last one left out)
                pass
            time.sleep(0.005)
            for path, data in saved.items():
                if not path.exists() or path.read_bytes() != data:
                    with open(path, "wb") as out:
                        out.write(data)
            time.sleep(0.005)

    counts = {"same": 0, "error": 0, "wrong": 0}
    thread = threading.Thread(target=vandal, daemon=True)
    thread.start()
    try:  # 30 runs at least, and until every edit was made (a busy machine is slower)
        deadline = time.monotonic() + 120
        while sum(counts.values()) < 30 or len(set(made)) < len(changes) and \
                time.monotonic() < deadline:
            counts[_read(cluster, tensor, written)] += 1
    finally:
        stop.set()
        thread.join()
        for path, data in saved.items():
            path.write_bytes(data)

    assert cluster.run(_pid) == pids  # no worker died
    assert counts["wrong"] == 0 and counts["error"] > 0, counts
    assert set(made) == set(changes), (counts, set(changes) - set(made))
    assert np.array_equal(dx.run(dx.load("base"), client=cluster), written)
    assert main(["assets", "verify", "base", "--db", env.url]) == 0


def _read(client, tensor, written) -> str:
    try:
        got = dx.run(tensor, client=client)
    except dx.DataError:
        return "error"
    return "same" if np.array_equal(got, written) else "wrong"
