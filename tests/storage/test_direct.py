"""Reading Zarr chunks straight from local files gives what Zarr gives, or says what is wrong."""

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings, strategies as st
from numcodecs import Zstd

import deepx_flow as dx
from deepx_flow.storage import direct, verify
from deepx_flow.storage.readers import read_region
from tests.helpers import race_counts

CODECS = {
    "raw": {"compressors": None},
    "zstd": {"compressors": [zarr.codecs.ZstdCodec(level=1)]},
    "zstd+crc32c": verify.array_codecs(),
    "crc32c": {"compressors": [zarr.codecs.Crc32cCodec()]},
}


@st.composite
def arrays(draw):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=ndim, max_size=ndim)))
    chunks = tuple(draw(st.integers(1, n)) for n in shape)
    region = []
    for n in shape:
        lo = draw(st.integers(0, n - 1))
        region.append((lo, draw(st.integers(lo + 1, n))))
    dtype = draw(st.sampled_from(["float32", "float64", "int16", "uint8", "bool"]))
    return shape, chunks, tuple(region), dtype


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=arrays(), codec=st.sampled_from(sorted(CODECS)), seed=st.integers(0, 2**16))
def test_a_region_reads_as_zarr_reads_it(tmp_path_factory, case, codec, seed):
    shape, chunks, region, dtype = case
    uri = str(tmp_path_factory.mktemp("d") / "a.zarr")
    data = (np.random.default_rng(seed).standard_normal(shape) * 50).astype(dtype)
    arr = zarr.create_array(uri, shape=shape, chunks=chunks, dtype=dtype,
                            config={"write_empty_chunks": True}, **CODECS[codec])
    arr[...] = data
    opened = zarr.open_array(uri, mode="r")
    assert direct.layout_of(opened) is not None  # the direct path is the one tested
    index = tuple(slice(lo, hi) for lo, hi in region)
    got = read_region(uri, region)
    np.testing.assert_array_equal(got, data[index])
    assert got.dtype == data.dtype and got.flags.writeable


def test_an_array_read_as_one_chunk_needs_no_copy_and_edge_chunks_are_cut(tmp_path):
    uri = str(tmp_path / "a.zarr")
    data = np.arange(70.0).reshape(10, 7)
    arr = zarr.create_array(uri, shape=data.shape, chunks=(4, 7), dtype="float64",
                            **verify.array_codecs())
    arr[...] = data
    np.testing.assert_array_equal(read_region(uri, ((4, 8), (0, 7))), data[4:8])
    np.testing.assert_array_equal(read_region(uri, ((6, 10), (2, 5))), data[6:10, 2:5])
    np.testing.assert_array_equal(read_region(uri, ((0, 10), (0, 7))), data)


def test_missing_chunks_fill_only_when_asked(tmp_path):
    uri = str(tmp_path / "a.zarr")
    arr = zarr.create_array(uri, shape=(6, 2), chunks=(2, 2), dtype="float32", fill_value=-1)
    arr[:2] = 5.0  # chunks 1 and 2 never written
    with pytest.raises(dx.DataError, match=r"chunk \(1, 0\) is missing"):
        read_region(uri, ((0, 6), (0, 2)))
    got = read_region(uri, ((0, 6), (0, 2)), missing="fill")
    np.testing.assert_array_equal(got, np.r_[np.full((2, 2), 5.0), np.full((4, 2), -1.0)])


def test_a_chunk_of_the_wrong_size_is_damage(tmp_path):
    """A chunk file from another array (a valid frame of another size) is refused, not read
    as a part or padded."""
    uri = str(tmp_path / "a.zarr")
    arr = zarr.create_array(uri, shape=(4, 3), chunks=(2, 3), dtype="float64",
                            compressors=[zarr.codecs.ZstdCodec(level=1)])
    arr[...] = 1.0
    other = Zstd(level=1).encode(np.zeros(5).tobytes())
    (tmp_path / "a.zarr" / "c" / "1" / "0").write_bytes(other)
    with pytest.raises(dx.DataError, match=r"chunk \(1, 0\) is damaged: it decompresses to "
                                           r"40 bytes, not the 48"):
        read_region(uri, ((0, 4), (0, 3)))


@pytest.mark.parametrize("size", [0, 1, 255, 256, 300, 65_791, 65_792, 70_000, 5_000_000])
def test_the_frame_header_states_the_decompressed_size(size):
    frame = Zstd(level=1).encode(bytes(size))
    assert direct.frame_content_size(memoryview(frame)) == size
    assert direct.frame_content_size(memoryview(b"not a frame")) is None


def test_arrays_the_direct_path_cannot_read_go_through_zarr(tmp_path):
    """Sharded arrays and other codecs are read by Zarr itself, with the same results."""
    uri = str(tmp_path / "s.zarr")
    data = np.arange(64.0).reshape(8, 8)
    arr = zarr.create_array(uri, shape=(8, 8), chunks=(2, 2), shards=(4, 4), dtype="float64")
    arr[...] = data
    assert direct.layout_of(zarr.open_array(uri, mode="r")) is None
    np.testing.assert_array_equal(read_region(uri, ((1, 7), (2, 8))), data[1:7, 2:8])
    uri = str(tmp_path / "b.zarr")
    arr = zarr.create_array(uri, shape=(8,), chunks=(3,), dtype="float64",
                            compressors=[zarr.codecs.BloscCodec()])
    arr[...] = data[0]
    assert direct.layout_of(zarr.open_array(uri, mode="r")) is None
    np.testing.assert_array_equal(read_region(uri, ((2, 8),)), data[0, 2:8])


# Reads a region again and again, counting what each read gave: the values written, a
# DataError, or anything else.
READER = """
import json, sys
import numpy as np
from deepx_flow.errors import DataError
from deepx_flow.storage.readers import read_region
uri, reads, expected = sys.argv[1], int(sys.argv[2]), np.load(sys.argv[3])
counts = {"same": 0, "error": 0, "wrong": 0}
print("reading", flush=True)
for _ in range(reads):
    try:
        got = read_region(uri, tuple((0, n) for n in expected.shape))
    except DataError:
        counts["error"] += 1
        continue
    counts["same" if np.array_equal(got, expected) else "wrong"] += 1
print(json.dumps(counts), flush=True)
"""


def test_a_chunk_cut_short_while_it_is_read_is_damage_not_a_signal(tmp_path):
    """Chunk files cut to a third of their size and written back, over and over, while
    another process reads them: every read gives the values written or a DataError. Chunk
    files were memory-mapped, and touching a mapped page past a file's new end killed the
    reading process with SIGBUS."""
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    uri = str(tmp_path / "a.zarr")
    values = np.random.default_rng(5).standard_normal((512, 2048)).astype("float32")
    arr = zarr.create_array(uri, shape=values.shape, chunks=(128, 2048), dtype="float32",
                            **verify.array_codecs())
    arr[...] = values  # 4 chunks of 1 MiB
    np.save(tmp_path / "expected.npy", values)
    files = sorted(p for p in Path(uri, "c").rglob("*") if p.is_file())
    saved = {f: f.read_bytes() for f in files}
    def start_reader():
        return subprocess.Popen([sys.executable, "-c", READER, uri, "40",
                                 str(tmp_path / "expected.npy")],
                                stdout=subprocess.PIPE, text=True)
    def cut_and_restore():
        for f in files:
            os.truncate(f, len(saved[f]) // 3)
        time.sleep(0.002)
        for f in files:
            with open(f, "r+b") as out:
                out.write(saved[f])
        time.sleep(0.002)
    counts = race_counts(start_reader, cut_and_restore)
    assert counts["wrong"] == 0 and counts["error"] > 0, counts
