"""A local Zarr array's metadata is opened once per content of its metadata file: the same
answer from the cache, a rewritten array's new shape and dtype at once, a removed one an
InputError naming it."""

import shutil

import numpy as np
import pytest
import zarr

from deepx_flow.errors import InputError
from deepx_flow.storage import readers


def write(path, shape, dtype, chunks):
    arr = zarr.create_array(str(path), shape=shape, chunks=chunks, dtype=dtype,
                            overwrite=True)
    arr[...] = np.arange(np.prod(shape)).reshape(shape).astype(dtype)


def test_a_rewritten_array_is_read_again_and_a_removed_one_raises(tmp_path):
    path = tmp_path / "a.zarr"
    write(path, (8, 4), "float32", (4, 4))
    assert readers.zarr_info(str(path)) == ((8, 4), "float32")
    assert readers.storage_chunks(str(path)) == (4, 4)
    assert readers.zarr_info(str(path)) == ((8, 4), "float32")  # from the cache
    write(path, (6, 3), "int64", (2, 3))
    assert readers.zarr_info(str(path)) == ((6, 3), "int64")
    assert readers.storage_chunks(str(path)) == (2, 3)
    # a rewrite whose metadata has the same length, at once (the same inode and clock tick
    # would not tell it apart)
    write(path, (3, 6), "int64", (3, 2))
    assert readers.zarr_info(str(path)) == ((3, 6), "int64")
    assert readers.storage_chunks(str(path)) == (3, 2)
    shutil.rmtree(path)
    with pytest.raises(InputError, match="a.zarr"):
        readers.zarr_info(str(path))
    assert readers.storage_chunks(str(path)) is None
