"""bfloat16 in Zarr v3 (the extension data type "bfloat16", `storage/zarr_bfloat16.py`):
tensors persisted and read back as they are, by the workers, with deepx_flow's direct chunk
reader and through Zarr; the metadata other implementations read; fill values; Zarr v2
refused; the entry point zarr-python loads the type from."""

from __future__ import annotations

import json
from importlib.metadata import EntryPoint

import ml_dtypes
import numpy as np
import pytest

import deepx_flow as dx
from deepx_flow.storage.zarr_bfloat16 import BFloat16, zarr
from deepx_flow.storage.zarr_store import is_complete, write_persisted
from tests.helpers import cluster_with_memory

BF16 = np.dtype(ml_dtypes.bfloat16)
SPEC = cluster_with_memory(40_000)
SHAPE = (100, 37)


def same(got, want) -> bool:
    got, want = np.asarray(got), np.asarray(want)
    return got.dtype == want.dtype == BF16 and np.array_equal(got.view(np.uint16),
                                                              want.view(np.uint16))


@pytest.fixture
def x_bf16():
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(BF16)
    x[0, :4] = np.array([np.inf, -np.inf, -0.0, 3.3e38], BF16)
    return x


def test_a_persisted_tensor_is_stored_as_bfloat16_and_read_back_as_it_was(client, x_bf16,
                                                                           tmp_path):
    x = dx.input("x", SHAPE, "bfloat16")
    p = dx.persist(x * 2.0, inputs={"x": x_bf16}, client=client, cluster=SPEC)
    uri = str(tmp_path / "y.zarr")
    info = write_persisted(p, uri)
    with np.errstate(over="ignore"):  # 3.3e38 * 2 is inf in bfloat16 too
        want = (x_bf16.astype(np.float32) * 2).astype(BF16)
    assert info["dtype"] == "bfloat16" and info["nbytes"] == 100 * 37 * 2
    assert is_complete(uri)
    meta = json.loads((tmp_path / "y.zarr" / "zarr.json").read_text())
    assert meta["data_type"] == "bfloat16" and meta["zarr_format"] == 3
    assert meta["codecs"][0] == {"name": "bytes", "configuration": {"endian": "little"}}
    stored = zarr.open_array(uri, mode="r")
    assert stored.dtype == BF16 and same(stored[:], want)

    back = dx.read_zarr(uri)  # the direct chunk reader: local files, our codecs
    assert back.dtype == "bfloat16"
    assert same(dx.run(back, client=client), want)
    assert same(dx.run(dx.input("y", SHAPE, "bfloat16") * 1.0, inputs={"y": uri},
                       client=client), want)


def test_arrays_zarr_writes_are_read_through_zarr_and_directly(client, tmp_path, x_bf16):
    """An array another program wrote (big-endian, unchecked chunks, a NaN fill value, chunks
    left out): the direct reader leaves big-endian chunks to Zarr; both give the values."""
    from zarr.codecs import BytesCodec
    uri = str(tmp_path / "big.zarr")
    array = zarr.create_array(uri, shape=SHAPE, chunks=(30, 37), dtype=BF16,
                              serializer=BytesCodec(endian="big"), compressors=None,
                              fill_value=np.nan)
    array[:60] = x_bf16[:60]
    got = dx.run(dx.read_zarr(uri, missing="fill"), client=client)
    want = x_bf16.copy()
    want[60:] = np.nan
    assert np.array_equal(np.isnan(got.astype(np.float32)), np.isnan(want.astype(np.float32)))
    assert same(got[:60], want[:60])


def test_fill_values_take_bfloat16_bits_in_hex(tmp_path):
    uri = tmp_path / "fill.zarr"
    zarr.create_array(str(uri), shape=(4,), chunks=(2,), dtype=BF16, fill_value=1.5)
    meta = json.loads((uri / "zarr.json").read_text())
    assert meta["fill_value"] == 1.5
    meta["fill_value"] = "0x3fc0"  # 1.5 as bfloat16 (as float16 bits it would be 1.9375)
    (uri / "zarr.json").write_text(json.dumps(meta))
    assert same(zarr.open_array(str(uri), mode="r")[:], np.full(4, 1.5, BF16))


def test_zarr_v2_has_no_bfloat16(tmp_path):
    with pytest.raises(ValueError, match="Zarr v2 has no bfloat16"):
        zarr.create_array(str(tmp_path / "v2.zarr"), shape=(2,), dtype=BF16, zarr_format=2)


def test_zarr_python_finds_the_type_through_its_entry_point():
    """pyproject.toml names `BFloat16` under zarr-python's `zarr.data_type` group."""
    import tomllib
    from pathlib import Path
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    value = project["project"]["entry-points"]["zarr.data_type"]["bfloat16"]
    assert EntryPoint("bfloat16", value, "zarr.data_type").load() is BFloat16
    assert BFloat16._zarr_v3_name == "bfloat16"
