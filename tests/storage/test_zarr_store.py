"""Writing persisted tensors to Zarr v3 on a real cluster, checked against NumPy float64.

A 40 kB memory budget splits a (100, 37) float64 tensor into a 4 x 2 grid of plan chunks, so
every write is several tasks on two workers.
"""

import os
import uuid

import numpy as np
import pytest
import zarr
from distributed import get_task_stream

import deepx_flow as dx
from deepx_flow.errors import ExecutionError, InputError
from deepx_flow.storage.zarr_store import (delete_array, is_complete, is_regular, reader_uri,
                                           write_persisted)
from tests.helpers import cluster_with_memory

SPEC = cluster_with_memory(40_000)
SHAPE = (100, 37)  # 4 x 2 plan chunks under SPEC


@pytest.fixture
def x_np():
    return np.random.default_rng(0).standard_normal(SHAPE)


def persisted(client, x_np):
    x = dx.input("x", SHAPE, "float64")
    return dx.persist(x * 2.0 + 1.0, inputs={"x": x_np}, client=client, cluster=SPEC)


def read_back(client, uri, shape, dtype):
    """The stored array as a dx input: read chunk by chunk by the workers."""
    return dx.run(dx.input("x", shape, dtype) * 1, inputs={"x": uri}, client=client)


def test_regular_grid_one_zarr_chunk_per_plan_chunk(client, x_np, tmp_path):
    p = persisted(client, x_np)
    assert is_regular(p.chunks) and len(p.futures) == 8
    uri = str(tmp_path / "y.zarr")
    with get_task_stream(client) as stream:
        info = write_persisted(p, uri)
    expected = x_np * 2.0 + 1.0

    # One write task per plan chunk, named by its chunk index. (They are sent to the worker
    # holding their chunk, but may be moved by work stealing, so where they ran is not
    # checked.)
    writes = [tuple(t["key"][1:]) for t in stream.data
              if isinstance(t["key"], tuple) and t["key"][0].startswith("dx-store@")]
    assert sorted(writes) == sorted(f.key[1:] for f in p.futures)

    assert info["uri"] == uri and info["shape"] == SHAPE and info["dtype"] == "float64"
    plan_chunk = tuple(c[0] for c in p.chunks)
    assert info["chunks"] == plan_chunk and info["nbytes"] == 100 * 37 * 8
    assert info["stored_bytes"] > 0 and info["seconds"] > 0
    stored = zarr.open_array(uri, mode="r")
    assert stored.chunks == plan_chunk and stored.nchunks == len(p.futures)
    np.testing.assert_array_equal(stored[:], expected)
    np.testing.assert_array_equal(read_back(client, reader_uri(uri), SHAPE, "float64"),
                                  expected)
    np.testing.assert_array_equal(dx.run(dx.read_zarr(uri) + 0.0, client=client), expected)
    assert is_complete(uri)


def test_irregular_grid_assembles_each_zarr_chunk(client, tmp_path):
    """Concatenating a generated tensor and an input gives a grid whose chunks differ in the
    middle (e.g. rows 13, ..., 13, 9, 13, ...): Zarr chunks then span several plan chunks."""
    a_np = np.random.default_rng(1).standard_normal((50, 37))
    counting = dx.arange(100 * 37, dtype="float64").reshape((100, 37))
    y = dx.concat([counting, dx.input("a", (50, 37), "float64")], axis=0)
    p = dx.persist(y, inputs={"a": a_np}, client=client, cluster=SPEC)
    assert not is_regular(p.chunks), p.chunks
    # A local path without ".zarr" is given to readers as a file:// URL.
    uri = str(tmp_path / "concat-v1")
    info = write_persisted(p, uri)
    expected = np.concatenate([np.arange(100 * 37, dtype="float64").reshape(100, 37),
                               a_np])

    assert info["chunks"] == (max(p.chunks[0]), max(p.chunks[1]))
    np.testing.assert_array_equal(zarr.open_array(uri, mode="r")[:], expected)
    assert reader_uri(uri) == "file://" + uri
    np.testing.assert_array_equal(read_back(client, reader_uri(uri), (150, 37), "float64"),
                                  expected)
    assert is_complete(uri)


@pytest.mark.parametrize("shape, dtype", [((), "float64"), ((7,), "int32"), ((0, 5), "float64"),
                                          ((33, 3), "bool")])
def test_odd_shapes_and_dtypes(client, tmp_path, shape, dtype):
    x_np = (np.arange(int(np.prod(shape))).reshape(shape) % 3).astype(dtype)
    p = dx.persist(dx.input("x", shape, dtype), inputs={"x": x_np}, client=client,
                   cluster=SPEC)
    uri = str(tmp_path / "odd.zarr")
    info = write_persisted(p, uri)
    assert info["shape"] == shape and info["dtype"] == dtype
    stored = zarr.open_array(uri, mode="r")
    assert stored.shape == shape and stored.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(stored[...], x_np)
    assert is_complete(uri)


def test_a_second_write_to_the_same_uri_is_refused(client, x_np, tmp_path):
    p = persisted(client, x_np)
    uri = str(tmp_path / "once.zarr")
    write_persisted(p, uri)
    with pytest.raises(InputError, match="already exists"):
        write_persisted(p, uri)
    (tmp_path / "a-file").write_text("not an array")
    with pytest.raises(InputError, match="already exists"):
        write_persisted(p, tmp_path / "a-file")
    assert is_complete(uri)  # the first version is untouched
    np.testing.assert_array_equal(zarr.open_array(uri, mode="r")[:], x_np * 2.0 + 1.0)


def test_a_failed_chunk_leaves_nothing_behind(client, tmp_path):
    """One chunk of the tensor cannot be computed (its input chunk on disk is corrupt), so
    its write task fails on the worker while the others succeed."""
    y = dx.input("x", SHAPE, "float64") * 2.0
    plan = dx.compile(y, cluster=SPEC)
    plan_chunk = tuple(c[0] for c in plan.partition.chunks[plan.graph.outputs[0][1]])
    source = str(tmp_path / "source.zarr")  # stored with the plan's chunks
    zarr.create_array(store=source, shape=SHAPE, dtype="float64", chunks=plan_chunk)[:] = 1.0
    (tmp_path / "source.zarr" / "c" / "1" / "0").write_bytes(b"not zstd data")
    p = dx.persist(y, inputs={"x": source}, client=client, cluster=SPEC)
    uri = str(tmp_path / "out.zarr")
    with pytest.raises(ExecutionError) as caught:
        write_persisted(p, uri)
    message = str(caught.value)
    assert uri in message and "chunk (1, 0) failed" in message
    assert "the partial array was deleted" in message
    assert not os.path.exists(uri) and not is_complete(uri)


def test_an_array_that_cannot_be_created_is_a_clear_error(client, x_np, tmp_path):
    p = persisted(client, x_np)
    (tmp_path / "plain-file").write_text("")
    uri = str(tmp_path / "plain-file" / "y.zarr")  # under a file, not a folder
    with pytest.raises(ExecutionError, match="cannot create the Zarr array .*y.zarr"):
        write_persisted(p, uri)
    assert not os.path.exists(uri)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0,
                    reason="root writes into read-only folders")
def test_a_read_only_folder_is_a_clear_error(client, x_np, tmp_path):
    p = persisted(client, x_np)
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(ExecutionError, match="cannot create the Zarr array"):
            write_persisted(p, str(folder / "y.zarr"))
        assert list(folder.iterdir()) == []
    finally:
        folder.chmod(0o755)


def test_is_complete_needs_the_marker(tmp_path):
    uri = str(tmp_path / "partial.zarr")
    assert not is_complete(uri)  # nothing there
    zarr.create_array(store=uri, shape=(4,), dtype="float64", chunks=(2,))[:] = 1.0
    assert not is_complete(uri)  # data, but no marker: a crashed write looks like this
    assert delete_array(uri) is True
    assert not os.path.exists(uri) and delete_array(uri) is False


def test_a_released_tensor_cannot_be_written(client, x_np, tmp_path):
    p = persisted(client, x_np)
    p.release()
    with pytest.raises(InputError, match="released"):
        write_persisted(p, str(tmp_path / "gone.zarr"))
    assert not (tmp_path / "gone.zarr").exists()


def test_an_fsspec_url(client, x_np):
    """fsspec's in-memory file system stands for object storage: the workers here are threads
    of this process, so they see the same file system as the driver."""
    uri = f"memory://deepx-tests/{uuid.uuid4().hex}/y.zarr"
    info = write_persisted(persisted(client, x_np), uri)
    assert info["uri"] == uri and reader_uri(uri) == uri and is_complete(uri)
    assert info["stored_bytes"] > 0
    np.testing.assert_array_equal(read_back(client, uri, SHAPE, "float64"), x_np * 2.0 + 1.0)
    with pytest.raises(InputError, match="already exists"):
        write_persisted(persisted(client, x_np), uri)
    assert delete_array(uri) and not is_complete(uri)
