"""`.npy` inputs are read with plain reads: every region reads as NumPy reads it, and a file
cut short is a DataError, never a signal that kills the worker.

They were read through a memory map (`np.load(mmap_mode="r")`): touching a mapped page past
the end of a file truncated meanwhile killed the reading process with SIGBUS.
"""

import os
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import deepx_flow as dx
from deepx_flow.storage import npy
from deepx_flow.storage.readers import array_info, read_region
from tests.helpers import race_counts

DTYPES = ["<f8", ">f8", "<f4", ">f4", "<f2", ">i4", "<i8", ">u2", "u1", "i1", "?", ">c8",
          "<c16"]


@st.composite
def cases(draw):
    ndim = draw(st.integers(0, 4))
    shape = tuple(draw(st.lists(st.integers(0, 7), min_size=ndim, max_size=ndim)))
    region = []
    for n in shape:
        lo = draw(st.integers(0, n))
        region.append((lo, draw(st.integers(lo, n))))
    return shape, tuple(region)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases(), dtype=st.sampled_from(DTYPES), fortran=st.booleans(),
       # every way of reading: per-run reads, whole rows, rows read one at a time
       read_cost=st.sampled_from([0, npy.READ_COST_BYTES, 1 << 40]),
       piece=st.sampled_from([1, npy.SPAN_PIECE_BYTES]), seed=st.integers(0, 2**16))
def test_a_region_reads_as_numpy_reads_it(tmp_path_factory, case, dtype, fortran, read_cost,
                                          piece, seed):
    shape, region = case
    values = (np.random.default_rng(seed).standard_normal(shape) * 100).astype(dtype)
    if fortran and values.ndim:
        values = np.asfortranarray(values)
    path = str(tmp_path_factory.mktemp("npy") / "a.npy")
    np.save(path, values)
    assert array_info(path) == (shape, values.dtype.name)
    saved = npy.READ_COST_BYTES, npy.SPAN_PIECE_BYTES
    npy.READ_COST_BYTES, npy.SPAN_PIECE_BYTES = read_cost, piece
    try:
        got = read_region(path, region)
    finally:
        npy.READ_COST_BYTES, npy.SPAN_PIECE_BYTES = saved
    expected = np.load(path)[tuple(slice(lo, hi) for lo, hi in region)]
    assert got.shape == expected.shape and got.dtype == expected.dtype.newbyteorder("=")
    assert got.dtype.isnative and got.flags.c_contiguous
    np.testing.assert_array_equal(got, expected)


def test_a_file_shorter_than_its_header_says_is_a_data_error(tmp_path):
    path = tmp_path / "a.npy"
    np.save(path, np.arange(1000.0))
    whole = os.path.getsize(path)
    os.truncate(path, 4096)
    message = f"is 4,096 bytes, the header says {whole:,}"
    with pytest.raises(dx.DataError, match=message):
        array_info(str(path))
    with pytest.raises(dx.DataError, match=message) as info:
        read_region(str(path), ((0, 10),))
    assert str(path) in str(info.value) and "write the file again" in str(info.value)
    os.truncate(path, 40)  # into the header
    with pytest.raises(dx.DataError, match="cannot be read as a .npy array"):
        read_region(str(path), ((0, 10),))
    with pytest.raises(dx.InputError, match="cannot be read as a .npy array"):
        array_info(str(path))


def test_a_file_replaced_by_a_smaller_array_is_a_data_error(tmp_path):
    path = tmp_path / "a.npy"
    np.save(path, np.zeros((4, 4)))
    np.save(path, np.zeros((2, 4)))  # after a run was planned on the first
    with pytest.raises(dx.DataError, match=r"holds shape \(2, 4\) now, which has no region"):
        read_region(str(path), ((0, 4), (0, 4)))


def test_a_run_given_a_file_cut_short_says_so(tmp_path, client):
    path = tmp_path / "a.npy"
    np.save(path, np.ones((2000, 64)))
    os.truncate(path, 300_000)
    with pytest.raises(dx.DataError, match="is 300,000 bytes, the header says 1,024,128"):
        dx.run(dx.input("x", (2000, 64), "float64") * 2.0, inputs={"x": str(path)},
               client=client)


# Reads regions again and again (whole rows, column blocks read from whole rows, runs read
# one by one), counting what each read gave: the values written, a DataError, or anything
# else; a signal kills it.
READER = """
import json, sys
import numpy as np
from deepx_flow.errors import DataError
from deepx_flow.storage import npy
from deepx_flow.storage.readers import read_region
path, reads, expected = sys.argv[1], int(sys.argv[2]), np.load(sys.argv[3])
n, m = expected.shape
regions = [((0, n), (0, m)), ((n // 3, n), (0, m)), ((0, n), (m // 4, m // 2)),
           ((n // 2, n), (1, 3))]
counts = {"same": 0, "error": 0, "wrong": 0}
print("reading", flush=True)
for i in range(reads):
    region = regions[i % len(regions)]
    npy.READ_COST_BYTES = 0 if i % 8 >= 4 else 1 << 40  # runs one by one, or whole rows
    try:
        got = read_region(path, region)
    except DataError:
        counts["error"] += 1
        continue
    want = expected[tuple(slice(lo, hi) for lo, hi in region)]
    counts["same" if np.array_equal(got, want) else "wrong"] += 1
print(json.dumps(counts), flush=True)
"""


def test_a_file_cut_short_while_it_is_read_is_damage_not_a_signal(tmp_path):
    """The file cut to a third of its size (or into its header) and written back, over and
    over, while another process reads regions of it: every read gives the values written
    or a DataError, and the reader lives."""
    values = np.random.default_rng(5).standard_normal((2048, 256))  # 4 MiB
    path = tmp_path / "a.npy"
    np.save(path, values)
    np.save(tmp_path / "expected.npy", values)
    saved = path.read_bytes()
    def start_reader():
        return subprocess.Popen([sys.executable, "-c", READER, str(path), "200",
                                 str(tmp_path / "expected.npy")], stdout=subprocess.PIPE,
                                text=True)
    cuts = [0]

    def cut_and_restore():
        os.truncate(path, len(saved) // 3 if cuts[0] % 4 else 64)
        cuts[0] += 1
        time.sleep(0.002)
        with open(path, "r+b") as out:
            out.write(saved)
        time.sleep(0.01)  # whole for a while: reads that give the values too
    counts = race_counts(start_reader, cut_and_restore)
    assert counts["wrong"] == 0 and counts["error"] > 0 and counts["same"] > 0, counts
