"""Checked chunks (`storage/verify.py`): a stored array written the way deepx_flow writes it,
then one chunk deleted, truncated or changed by one bit, at random. The damage is found by a
read of any region that needs the chunk (and only by those), by `verify_array` (deep: every
kind; quick, from the listing: deleted and truncated), and names the chunk; regions that do
not need it read the values written."""

from __future__ import annotations

import itertools
import re
import math
import uuid
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import deepx_flow as dx
from deepx_flow.storage import verify, zarr_store
from deepx_flow.storage.readers import read_region
from tests.helpers import unreadable

DAMAGES = ("delete", "truncate", "flip")


def write_checked(uri: str, values: np.ndarray, chunks) -> str:
    """Write `values` as a plan with chunk grid `chunks` would be stored: create, one
    write_block per Zarr chunk (the task materializations run), then the manifest; return
    the manifest's digest (what the version's row records)."""
    zarr_store.create_array(uri, values.shape, values.dtype, chunks)
    for _, region, _, _ in zarr_store.zarr_chunk_regions("t", values.shape, chunks):
        block = values[tuple(slice(lo, hi) for lo, hi in region)]
        zarr_store.write_block(uri, region, values.dtype.name, (), block)
    return zarr_store.mark_complete(uri)


def damage(path, how: str, at: int, bit: int) -> None:
    """Delete the file, cut it to `at` bytes (fewer than it has), or flip bit `bit` of byte
    `at` (taken modulo its size)."""
    data = path.read_bytes()
    if how == "delete":
        path.unlink()
    elif how == "truncate":
        path.write_bytes(data[:at % len(data)])
    else:
        changed = bytearray(data)
        changed[at % len(data)] ^= 1 << bit
        path.write_bytes(bytes(changed))


def grid(shape, chunk):
    return tuple(tuple(min(c, n - i) for i in range(0, n, c)) for n, c in zip(shape, chunk))


arrays = st.integers(1, 3).flatmap(lambda ndim: st.tuples(
    st.lists(st.integers(1, 9), min_size=ndim, max_size=ndim),
    st.lists(st.integers(1, 4), min_size=ndim, max_size=ndim)))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arrays, st.sampled_from(DAMAGES), st.integers(0, 10**6), st.integers(0, 7),
       st.integers(0, 10**6), st.sampled_from(["float32", "int16", "float64"]))
def test_one_damaged_chunk_is_found_and_named(tmp_path, spec, how, pick, bit, at, dtype):
    shape, chunk = tuple(spec[0]), tuple(spec[1])
    values = (np.arange(math.prod(shape)) % 251 - 100).astype(dtype).reshape(shape)
    values.flat[::3] = 0  # some chunks all zeros: they are stored too
    uri = str(tmp_path / f"{uuid.uuid4().hex}.zarr")
    write_checked(uri, values, grid(shape, chunk))
    indices = verify.chunk_indices(shape, chunk)
    assert verify.verify_array(uri) == []
    bad = indices[pick % len(indices)]
    damage(Path(uri, "c", *map(str, bad)), how, at, bit)

    found = verify.verify_array(uri)
    assert [p.chunk for p in found] == [bad]
    assert found[0].uri == uri and str(bad) in str(found[0])
    quick = verify.verify_array(uri, deep=False)
    assert [p.chunk for p in quick] == ([] if how == "flip" else [bad])

    for idx in indices:  # each stored chunk's region read alone
        region = verify.chunk_region(idx, shape, chunk)
        if idx == bad:
            with pytest.raises(dx.DataError) as err:
                read_region(uri, region)
            assert err.value.chunk == bad
        else:
            block = read_region(uri, region)
            assert np.array_equal(block, values[tuple(slice(lo, hi) for lo, hi in region)])
    with pytest.raises(dx.DataError, match=rf"chunk {re.escape(str(bad))} is "
                                           rf"(missing|damaged)"):
        read_region(uri, tuple((0, n) for n in shape))


def test_a_stored_asset_version_is_named_in_the_error(tmp_path):
    uri = str(tmp_path / "v.zarr")
    write_checked(uri, np.ones((6, 4)), grid((6, 4), (2, 4)))
    (tmp_path / "v.zarr" / "c" / "1" / "0").unlink()
    origin = {"asset": "features", "version": "0123456789abcdef", "partition": "2026-01-02"}
    with pytest.raises(dx.DataError) as err:
        read_region(uri, ((0, 6), (0, 4)), origin=origin)
    message = str(err.value)
    assert message.startswith("asset features partition 2026-01-02 version 0123456789ab: "
                              "chunk (1, 0) is missing")
    assert (err.value.asset, err.value.version, err.value.partition, err.value.chunk) == \
        ("features", "0123456789abcdef", "2026-01-02", (1, 0))
    assert len(message.splitlines()) == 1


def test_a_missing_chunk_of_an_input_array_is_an_error_unless_fill_is_asked(tmp_path, client):
    import zarr
    path = tmp_path / "sparse.zarr"
    # Zarr's default skips chunks equal to the fill value: chunk (1,) is never written.
    arr = zarr.create_array(str(path), shape=(6,), chunks=(2,), dtype="float64",
                            fill_value=-1.0, zarr_format=3)
    arr[:] = np.array([1.0, 2.0, -1.0, -1.0, 5.0, 6.0])
    assert not (path / "c" / "1").exists()

    with pytest.raises(dx.DataError, match=r"chunk \(1,\) is missing.*missing='fill'"):
        dx.run(dx.read_zarr(str(path)) * 2, client=client)
    with pytest.raises(dx.DataError, match=r"chunk \(1,\) is missing"):
        dx.run(dx.input("x", (6,), "float64") * 2, inputs={"x": str(path)}, client=client)
    out = dx.run(dx.read_zarr(str(path), missing="fill") * 2, client=client)
    assert np.array_equal(out, np.array([2.0, 4.0, -2.0, -2.0, 10.0, 12.0]))
    with pytest.raises(dx.GraphError, match="missing must be one of error, fill"):
        dx.read_zarr(str(path), missing="zeros")


@pytest.mark.parametrize("store", ["local files", "memory"])
def test_a_zarr_array_given_as_an_input_is_checked_as_its_path_is(tmp_path, client, store):
    """One rule for every way in: a chunk that is not stored is a DataError whether the
    array is given by path or as a zarr.Array (which np.asarray would read as the fill)."""
    import zarr
    where = str(tmp_path / "sparse.zarr") if store == "local files" else \
        zarr.storage.MemoryStore()
    arr = zarr.create_array(where, shape=(6,), chunks=(2,), dtype="float64", fill_value=-1.0,
                            zarr_format=3, **verify.array_codecs())
    arr[:] = np.array([1.0, 2.0, -1.0, -1.0, 5.0, 6.0])  # chunk (1,) is not written
    x = dx.input("x", (6,), "float64")
    with pytest.raises(dx.DataError, match=r"chunk \(1,\) is missing"):
        dx.run(x * 2, inputs={"x": arr}, client=client)
    arr[2:4] = np.array([3.0, 4.0])
    np.testing.assert_array_equal(dx.run(x * 2, inputs={"x": arr}, client=client),
                                  np.arange(1.0, 7.0) * 2)


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_array_that_is_no_stored_version_says_what_to_do(tmp_path, how):
    """A Zarr array that is not a stored asset version (one a user gave) has no lineage to
    compute it from again: its damage says to write it again from its source or restore a
    copy, as a stored version's says to materialize it again; by path, by `verify_array`,
    and given as a zarr.Array."""
    import zarr
    uri = str(tmp_path / "plain.zarr")
    write_checked(uri, np.arange(12.0).reshape(6, 2), grid((6, 2), (2, 2)))
    damage(Path(uri, "c", "1", "0"), how, 5, 3)
    with pytest.raises(dx.DataError) as by_path:
        read_region(uri, ((0, 6), (0, 2)))
    errors = [by_path.value, *verify.verify_array(uri)]
    with pytest.raises(dx.DataError) as given:
        verify.read_opened(zarr.open_array(uri, mode="r"), "input 'x'")
    errors.append(given.value)
    assert len(errors) == 3
    for err in errors:
        assert err.chunk == (1, 0), err
        assert re.search(r"write the array again from its source, or restore it from a "
                         r"copy$", str(err)), str(err)
        assert len(str(err).splitlines()) == 1


def test_a_write_that_left_a_chunk_out_is_not_marked_complete(tmp_path):
    uri = str(tmp_path / "partial.zarr")
    values = np.arange(12.0).reshape(6, 2)
    zarr_store.create_array(uri, values.shape, values.dtype, grid((6, 2), (2, 2)))
    for idx, region, _, _ in zarr_store.zarr_chunk_regions("t", values.shape,
                                                          grid((6, 2), (2, 2))):
        if idx != (2, 0):  # the last write never happened
            zarr_store.write_block(uri, region, "float64", (),
                                   values[tuple(slice(lo, hi) for lo, hi in region)])
    with pytest.raises(dx.ExecutionError, match=r"chunk \(2, 0\) was not written"):
        zarr_store.mark_complete(uri)
    assert not zarr_store.is_complete(uri)


def test_every_chunk_is_in_the_manifest_with_its_stored_size_and_checksum(tmp_path):
    import json

    import google_crc32c
    uri = str(tmp_path / "m.zarr")
    values = np.zeros((5, 3), dtype="float32")  # all chunks empty: all written anyway
    write_checked(uri, values, grid((5, 3), (2, 2)))
    manifest = verify.read_manifest(uri)
    keys = {f"c/{i}/{j}" for i, j in itertools.product(range(3), range(2))}
    assert set(manifest["chunks"]) == keys and manifest["checksum"] == "crc32c"
    assert manifest["format"] == 2
    for key, (size, crc) in manifest["chunks"].items():
        stored = (tmp_path / "m.zarr" / key).read_bytes()
        assert len(stored) == size
        assert crc == google_crc32c.value(stored[:-4]) == int.from_bytes(stored[-4:], "little")
    metadata = json.loads((tmp_path / "m.zarr" / "zarr.json").read_text())
    attributes = metadata.pop("attributes")  # complete, and who wrote it (assets/gc.py)
    assert attributes.pop(zarr_store.COMPLETE_ATTR) is True
    assert set(attributes) == {zarr_store.WRITER_ATTR}
    assert manifest["metadata"] == metadata



def test_a_folder_in_a_chunks_place_is_a_missing_chunk(tmp_path):
    """Zarr reads a folder where a chunk file should be as the fill value, like a chunk
    that is not there; so must the check, which looked for the path alone."""
    uri = str(tmp_path / "io.zarr")
    write_checked(uri, np.arange(12.0).reshape(6, 2), grid((6, 2), (2, 2)))
    chunk = tmp_path / "io.zarr" / "c" / "1" / "0"
    chunk.unlink()
    chunk.mkdir()
    with pytest.raises(dx.DataError, match=r"chunk \(1, 0\) is missing"):
        read_region(uri, ((0, 6), (0, 2)))
    assert np.array_equal(read_region(uri, ((0, 2), (0, 2))), [[0.0, 1.0], [2.0, 3.0]])
    assert [p.chunk for p in verify.verify_array(uri)] == [(1, 0)]


def test_what_a_failed_read_says_decides_whether_it_is_damage(tmp_path):
    """Damage is what decoding the stored bytes says (a checksum, a codec); an OSError (a
    permission, the network, a timeout) says nothing about them and is reported as it is."""
    uri = str(tmp_path / "d.zarr")
    write_checked(uri, np.ones((4, 2)), grid((4, 2), (2, 2)))
    (tmp_path / "d.zarr" / "c" / "1" / "0").write_bytes(b"garbage")
    with pytest.raises(dx.DataError) as err:
        read_region(uri, ((0, 4), (0, 2)))
    assert verify.is_damage(err.value.__cause__)  # what the crc32c check raised
    for io in (PermissionError(13, "Permission denied"), TimeoutError("read timed out"),
               ConnectionResetError(104, "Connection reset by peer")):
        assert not verify.is_damage(io)


@pytest.mark.parametrize("what", ["manifest", "chunk folder"])
def test_a_store_that_cannot_be_read_is_not_reported_as_damage(tmp_path, what):
    """A permission error reading the manifest or listing the chunks says nothing of the
    data: an ExecutionError saying the store could not be read, not a DataError that would
    have the version called damaged (and a materialization compute it again)."""
    uri = str(tmp_path / "p.zarr")
    digest = write_checked(uri, np.arange(12.0).reshape(6, 2), grid((6, 2), (2, 2)))
    origin = {"asset": "a", "version": uuid.uuid4().hex, "partition": None,
              "manifest": digest}
    target = Path(uri, verify.MANIFEST) if what == "manifest" else Path(uri, "c")
    with unreadable(target):
        for given in (origin, None):  # bound by a row, or whatever manifest it has
            for deep in (True, False):
                with pytest.raises(dx.ExecutionError, match="could not be read") as info:
                    verify.verify_array(uri, deep=deep, origin=given)
                assert not isinstance(info.value, dx.DataError)
                assert "PermissionError" in str(info.value)
    assert verify.verify_array(uri, origin=origin) == []


@pytest.mark.parametrize("lost", ["zarr.json", "the folder"])
def test_a_version_whose_array_is_gone_is_damage_not_an_unreadable_store(tmp_path, lost):
    """A deleted zarr.json or version folder is a FileNotFoundError, an OSError as a
    permission error is, but it says the data is lost: a DataError naming the version,
    from a read and from `verify_array`, never "could not be read"."""
    import shutil
    uri = str(tmp_path / "g.zarr")
    digest = write_checked(uri, np.arange(12.0).reshape(6, 2), grid((6, 2), (2, 2)))
    origin = {"asset": "a", "version": uuid.uuid4().hex, "partition": None,
              "manifest": digest}
    if lost == "zarr.json":
        Path(uri, "zarr.json").unlink()
    else:
        shutil.rmtree(uri)
    for given in (origin, None):
        for deep in (True, False):
            problems = verify.verify_array(uri, deep=deep, origin=given)
            assert len(problems) == 1 and problems[0].chunk is None, problems
            assert "cannot be opened" in str(problems[0])
    with pytest.raises(dx.DataError, match="^asset a version .*cannot be opened"):
        read_region(uri, ((0, 6), (0, 2)), origin=origin)


def test_a_version_written_before_manifests_says_why_a_chunk_may_be_missing(tmp_path):
    """Versions stored before checks existed skipped chunks equal to the fill value: such a
    chunk is still refused (it may as well be lost), with a message that says so."""
    import zarr
    uri = str(tmp_path / "old.zarr")
    old = zarr.create_array(uri, shape=(4, 2), chunks=(2, 2), dtype="float64", zarr_format=3)
    old[:] = np.array([[1.0, 2.0], [3.0, 4.0], [0.0, 0.0], [0.0, 0.0]])
    assert verify.read_manifest(uri) is None
    [problem] = verify.verify_array(uri, deep=False)
    assert problem.chunk == (1, 0) and "no manifest" in str(problem)
