"""A stored version's manifest binds what was written (`storage/manifest.py`): its metadata,
and each chunk to its position, by the digest its database row records. Here the versions
are written as materializations write them and read with that digest, as `dx.load`'s tasks
read them: a chunk swapped with another or copied from another version, an edited
`zarr.json` and a manifest edited, replaced or deleted are DataErrors, from a read and from
`verify_array` (deep; quick too, but for the chunk contents); a chunk whose bytes are the
same as the one in its place reads the values written. Versions stored before manifests
bound anything are upgraded once (`verify.upgrade`)."""

from __future__ import annotations

import json
import math
import re
import shutil
import uuid
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import deepx_flow as dx
from deepx_flow.storage import manifest as manifests
from deepx_flow.storage import verify
from tests.storage.test_verify import grid, write_checked


# What a read says of a chunk that is not the one written at its position: by its size when
# that differs, else by its checksum.
MOVED = r"not the ones written at this position|bytes where [\d,]+ were written"


def version(tmp_path, values, chunk, name=None) -> tuple[str, dict]:
    """A version of `values` stored in chunks of `chunk`: its URI and the origin its reads
    get (the digest its row would record)."""
    uri = str(tmp_path / f"{name or uuid.uuid4().hex}.zarr")
    digest = write_checked(uri, values, grid(values.shape, chunk))
    return uri, {"asset": "a", "version": Path(uri).stem, "partition": None,
                 "manifest": digest}


def whole(values) -> tuple:
    return tuple((0, n) for n in values.shape)


def chunk_file(uri, idx) -> Path:
    return Path(uri, "c", *map(str, idx))


def read_chunk(uri, origin, idx, shape, chunk):
    return verify.read_region(uri, verify.chunk_region(idx, shape, chunk), origin=origin)


arrays = st.integers(1, 3).flatmap(lambda ndim: st.tuples(
    st.lists(st.integers(2, 9), min_size=ndim, max_size=ndim),
    st.lists(st.integers(1, 4), min_size=ndim, max_size=ndim)))


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arrays, st.sampled_from(["swap", "copy"]), st.integers(0, 10**6), st.integers(0, 10**6),
       st.sampled_from(["float32", "int16", "float64"]))
def test_a_chunk_moved_or_copied_from_another_version_is_found(tmp_path, spec, how, a, b,
                                                               dtype):
    shape, chunk = tuple(spec[0]), tuple(spec[1])
    values = (np.arange(math.prod(shape)) % 97 - 40).astype(dtype).reshape(shape)
    values.flat[::5] = 0  # some chunks may hold the same values: those move harmlessly
    other = (values * 3 + 1).astype(dtype)
    uri, origin = version(tmp_path, values, chunk)
    source, _ = version(tmp_path, other, chunk)
    indices = verify.chunk_indices(shape, chunk)
    first, second = indices[a % len(indices)], indices[b % len(indices)]
    region = verify.chunk_region(first, shape, chunk)
    if how == "swap":  # two chunks of the version change places (sizes and all)
        there, here = chunk_file(uri, first).read_bytes(), chunk_file(uri, second).read_bytes()
        chunk_file(uri, first).write_bytes(here)
        chunk_file(uri, second).write_bytes(there)
        changed = {first, second} if here != there else set()
    else:  # a chunk of another version, at the same position
        shutil.copyfile(chunk_file(source, first), chunk_file(uri, first))
        changed = {first} if not np.array_equal(
            values[tuple(slice(lo, hi) for lo, hi in region)],
            other[tuple(slice(lo, hi) for lo, hi in region)]) else set()

    assert {p.chunk for p in verify.verify_array(uri, origin=origin)} == changed
    for idx in indices:
        if idx in changed:
            with pytest.raises(dx.DataError) as err:
                read_chunk(uri, origin, idx, shape, chunk)
            assert err.value.chunk == idx and re.search(MOVED, str(err.value))
        else:  # untouched, or the same bytes: the values written
            block = read_chunk(uri, origin, idx, shape, chunk)
            region = verify.chunk_region(idx, shape, chunk)
            assert np.array_equal(block, values[tuple(slice(lo, hi) for lo, hi in region)])
    if changed:
        with pytest.raises(dx.DataError, match=MOVED):
            verify.read_region(uri, whole(values), origin=origin)
    else:
        assert np.array_equal(verify.read_region(uri, whole(values), origin=origin), values)


EDITS = {  # zarr.json edited: each what a reader would otherwise take as written
    "dtype": lambda m: {**m, "data_type": "int32"},
    "larger shape": lambda m: {**m, "shape": [m["shape"][0] * 2, *m["shape"][1:]]},
    "smaller shape": lambda m: {**m, "shape": [m["shape"][0] - 1, *m["shape"][1:]]},
    "chunk shape": lambda m: {**m, "chunk_grid": {"name": "regular", "configuration": {
        "chunk_shape": [c * 2 for c in m["chunk_grid"]["configuration"]["chunk_shape"]]}}},
    "fill value": lambda m: {**m, "fill_value": 7.0},
    "no checksum": lambda m: {**m, "codecs": m["codecs"][:-1]},
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_an_edited_zarr_json_is_damage(tmp_path, edit):
    values = np.random.default_rng(1).standard_normal((12, 4)).astype("float32")
    uri, origin = version(tmp_path, values, (4, 4))
    path = Path(uri, "zarr.json")
    path.write_text(json.dumps(EDITS[edit](json.loads(path.read_text()))))

    for deep in (True, False):
        [problem] = verify.verify_array(uri, deep=deep, origin=origin)
        assert "metadata (zarr.json) other than was written" in str(problem)
        assert problem.chunk is None and problem.version == origin["version"]
    with pytest.raises(dx.DataError, match=r"metadata \(zarr.json\) other than was written"):
        verify.read_region(uri, ((0, 4), (0, 4)), origin=origin)


def test_what_a_manifest_binds_leaves_the_attributes_free(tmp_path):
    """Attributes are no part of the data (deepx_flow sets one after the manifest): a new
    one reads the same."""
    import zarr
    values = np.arange(24.0).reshape(6, 4)
    uri, origin = version(tmp_path, values, (2, 4))
    zarr.open_array(uri, mode="r+").update_attributes({"note": "looked at"})
    assert verify.verify_array(uri, origin=origin) == []
    assert np.array_equal(verify.read_region(uri, whole(values), origin=origin), values)


def test_a_manifest_edited_replaced_or_lost_is_damage(tmp_path):
    values = np.arange(48.0).reshape(12, 4)
    uri, origin = version(tmp_path, values, (4, 4))
    other, _ = version(tmp_path, values + 1, (4, 4))
    path = Path(uri, manifests.NAME)
    written = path.read_bytes()
    # Two chunks swapped, and the sizes in the manifest rewritten to match.
    first, second = chunk_file(uri, (0, 0)), chunk_file(uri, (2, 0))
    a, b = first.read_bytes(), second.read_bytes()
    first.write_bytes(b)
    second.write_bytes(a)
    found = json.loads(written)
    found["chunks"]["c/0/0"][0], found["chunks"]["c/2/0"][0] = len(b), len(a)
    cases = {"edited": json.dumps(found).encode(), "another version's": Path(
        other, manifests.NAME).read_bytes(), "not JSON": b"{", "deleted": None}
    for case, data in cases.items():
        if data is None:
            path.unlink()
        else:
            path.write_bytes(data)
        for deep in (True, False):
            [problem] = verify.verify_array(uri, deep=deep, origin=origin)
            assert "manifest" in problem.problem and problem.chunk is None, case
        with pytest.raises(dx.DataError, match="manifest"):
            verify.read_region(uri, whole(values), origin=origin)
    path.write_bytes(written)  # the manifest back: the swap is found chunk by chunk
    assert [p.chunk for p in verify.verify_array(uri, origin=origin)] == [(0, 0), (2, 0)]


def test_a_manifest_a_process_checked_stays_what_it_reads_by(tmp_path):
    """A process keeps the manifest that matched the recorded digest: what it says stays
    true whatever happens to the file later, so a read in that process checks the chunks
    against it (a deleted manifest is still found by `verify_array`, which reads it again)."""
    values = np.arange(48.0).reshape(12, 4)
    uri, origin = version(tmp_path, values, (4, 4))
    assert np.array_equal(verify.read_region(uri, whole(values), origin=origin), values)
    Path(uri, manifests.NAME).unlink()
    assert np.array_equal(verify.read_region(uri, whole(values), origin=origin), values)
    [problem] = verify.verify_array(uri, origin=origin)
    assert "lost its manifest" in problem.problem
    first, second = chunk_file(uri, (0, 0)), chunk_file(uri, (1, 0))
    a, b = first.read_bytes(), second.read_bytes()
    first.write_bytes(b)
    second.write_bytes(a)
    with pytest.raises(dx.DataError, match=rf"chunk \(0, 0\).*({MOVED})"):
        verify.read_region(uri, whole(values), origin=origin)


def test_a_process_keeps_the_manifests_it_used_last_as_the_docs_say(tmp_path):
    """docs/assets.md: a process keeps the manifests that matched, the CACHED it used last;
    one let go is read and checked again, so a change to it is found then, while a change
    to one kept is not seen."""
    import fsspec
    page = " ".join((Path(__file__).resolve().parents[2] / "docs" / "assets.md").read_text()
                    .split())
    assert f"the manifests that matched their recorded digests, the {manifests.CACHED} it " \
           f"used last" in page
    fs = fsspec.filesystem("file")
    roots, digests = [], []
    for i in range(manifests.CACHED + 1):
        root = tmp_path / f"v{i}"
        root.mkdir()
        data = json.dumps({"format": 2, "metadata": {"i": i}, "chunks": {}}).encode()
        (root / manifests.NAME).write_bytes(data)
        roots.append(str(root))
        digests.append(manifests.digest(data))
        assert manifests.load(fs, roots[-1], digests[-1]).metadata == {"i": i}
    for root in (roots[0], roots[-1]):
        Path(root, manifests.NAME).write_text(json.dumps(  # edited after it was checked
            {"format": 2, "metadata": {"i": -1}, "chunks": {}}))
    assert manifests.load(fs, roots[-1], digests[-1]).metadata == {"i": manifests.CACHED}
    with pytest.raises(manifests.Problem, match="other than the one written"):
        manifests.load(fs, roots[0], digests[0])  # the oldest was let go


def test_a_plain_array_is_read_as_before(tmp_path):
    """Arrays that are not a stored version (no recorded digest) are read with their chunks'
    own checksums, as Zarr would: the manifest is not asked for."""
    values = np.arange(48.0).reshape(12, 4)
    uri, _ = version(tmp_path, values, (4, 4))
    Path(uri, manifests.NAME).unlink()
    assert np.array_equal(verify.read_region(uri, whole(values)), values)


def format_1(uri) -> None:
    """Make the version at `uri` look as versions stored before this format did: a
    manifest of keys and sizes only (and no digest in their rows)."""
    found = json.loads(Path(uri, manifests.NAME).read_text())
    Path(uri, manifests.NAME).write_text(json.dumps({"format": 1, "checksum": "crc32c", "chunks": {
        key: size for key, (size, _) in found["chunks"].items()}}))


def test_a_version_of_the_older_format_is_upgraded_once(tmp_path):
    values = np.arange(48.0).reshape(12, 4)
    uri, origin = version(tmp_path, values, (4, 4))
    written = Path(uri, manifests.NAME).read_bytes()
    format_1(uri)
    older = {**origin, "manifest": None}
    assert verify.verify_array(uri, origin=older) == []  # checked as far as it can be

    digest = verify.upgrade(uri, older)
    assert digest == origin["manifest"] and Path(uri, manifests.NAME).read_bytes() == written
    first, second = chunk_file(uri, (0, 0)), chunk_file(uri, (1, 0))
    a, b = first.read_bytes(), second.read_bytes()
    first.write_bytes(b)
    second.write_bytes(a)
    with pytest.raises(dx.DataError, match=MOVED):
        verify.read_region(uri, whole(values), origin={**origin, "manifest": digest})


@pytest.mark.parametrize("manifest", ["format 1", "none"])
def test_an_older_version_missing_a_chunk_is_not_upgraded(tmp_path, manifest):
    values = np.arange(48.0).reshape(12, 4)
    uri, origin = version(tmp_path, values, (4, 4))
    if manifest == "none":  # stored before manifests: a chunk not there may have been empty
        Path(uri, manifests.NAME).unlink()
    else:
        format_1(uri)
    before = Path(uri, manifests.NAME).read_bytes() if manifest != "none" else None
    chunk_file(uri, (1, 0)).unlink()
    with pytest.raises(dx.DataError, match=r"chunk \(1, 0\)"):
        verify.upgrade(uri, {**origin, "manifest": None})
    after = Path(uri, manifests.NAME)
    assert (after.read_bytes() if after.exists() else None) == before  # nothing written


def test_an_array_without_checksums_is_bound_by_the_crc_of_its_chunks(tmp_path):
    """Versions stored before chunks carried a CRC-32C are upgraded with the CRC of each
    chunk's whole stored bytes, which reads then compute."""
    import zarr
    uri = str(tmp_path / "old.zarr")
    values = np.arange(48.0).reshape(12, 4)
    old = zarr.create_array(uri, shape=(12, 4), chunks=(4, 4), dtype="float64",
                            compressors=None, config={"write_empty_chunks": True})
    old[...] = values
    origin = {"asset": "a", "version": "old", "manifest": verify.upgrade(uri)}
    assert np.array_equal(verify.read_region(uri, whole(values), origin=origin), values)
    assert verify.verify_array(uri, origin=origin) == []
    shutil.copyfile(chunk_file(uri, (2, 0)), chunk_file(uri, (0, 0)))  # the same size
    with pytest.raises(dx.DataError, match=r"chunk \(0, 0\).*not the ones written"):
        verify.read_region(uri, whole(values), origin=origin)
    assert [p.chunk for p in verify.verify_array(uri, origin=origin)] == [(0, 0)]


def test_a_version_in_an_object_store_is_checked_the_same(tmp_path):
    """fsspec's in-memory file system stands for object storage: its chunks are read
    through fsspec, and checked against the manifest as local files are."""
    import fsspec
    uri = f"memory://deepx-tests/{uuid.uuid4().hex}.zarr"
    values = np.arange(48.0).reshape(12, 4)
    origin = {"asset": "a", "version": "v", "manifest": write_checked(
        uri, values, grid(values.shape, (4, 4)))}
    fs, root = fsspec.core.url_to_fs(uri)
    try:
        assert np.array_equal(verify.read_region(uri, whole(values), origin=origin), values)
        a, b = fs.cat_file(f"{root}/c/0/0"), fs.cat_file(f"{root}/c/2/0")
        fs.pipe_file(f"{root}/c/0/0", b)
        fs.pipe_file(f"{root}/c/2/0", a)
        with pytest.raises(dx.DataError, match=MOVED):
            verify.read_region(uri, whole(values), origin=origin)
        assert [p.chunk for p in verify.verify_array(uri, origin=origin)] == [(0, 0), (2, 0)]
    finally:
        fs.rm(root, recursive=True)
