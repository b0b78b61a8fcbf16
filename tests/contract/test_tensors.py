"""The wire codec (`deepx_flow/contract/tensors.py`): every datatype round-trips bit for bit
through raw bytes, JSON values, typed protobuf contents and bounded chunks; every malformed
tensor is one InputError naming it."""

import json
import math
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from deepx_flow.contract import tensors
from deepx_flow.contract.deepx.v1 import tensor_pb2
from deepx_flow.errors import InputError

DTYPES = sorted(tensors.DATATYPE_OF)


def _arrays(dtype):
    shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)
    if dtype == "bfloat16":  # hypothesis has no bfloat16: its bits from uint16
        return hnp.arrays("uint16", shapes).map(lambda a: a.view(np.dtype("bfloat16")))
    return hnp.arrays(dtype, shapes)


def _same_bits(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()


def _same_values(got, want):
    """Equal values, NaN where NaN (JSON carries no NaN payloads), zeros' signs kept."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype.kind == "b" or want.dtype.kind in "iu":
        np.testing.assert_array_equal(got, want)
        return
    g, w = got.astype(np.float64), want.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
    keep = ~np.isnan(w)
    np.testing.assert_array_equal(g[keep], w[keep])
    np.testing.assert_array_equal(np.signbit(g[keep]), np.signbit(w[keep]))


@settings(max_examples=30, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(DTYPES))
def test_raw_bytes_round_trip_bit_for_bit(data, dtype):
    array = data.draw(_arrays(dtype))
    raw = tensors.to_raw(array)
    _same_bits(tensors.from_raw("x", tensors.datatype_of(dtype), list(array.shape), raw),
               array)
    # and through a message, inline or announced as streamed and sent in chunks
    message = tensor_pb2.Tensor.FromString(
        tensors.to_message("x", array).SerializeToString())
    _same_bits(tensors.from_message(message), array)
    header = tensors.to_message("x", array, max_inline_bytes=-1)
    assert header.streamed and not header.raw_contents
    size = math.prod(array.shape) * array.itemsize
    assembler = tensors.Assembler({0: ("x", size)})
    for index, offset, piece in tensors.chunks(0, raw, data.draw(st.integers(1, 7))):
        assembler.add(index, offset, piece)
    _same_bits(tensors.from_message(header, assembler.finish()[0]), array)


@settings(max_examples=30, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(DTYPES))
def test_json_values_round_trip(data, dtype):
    array = data.draw(_arrays(dtype))
    obj = json.loads(json.dumps(tensors.to_json("x", array), allow_nan=False))
    name, got = tensors.from_json(obj)
    assert name == "x"
    _same_values(got, array)
    # nested lists as the shape's, which OIP's JSON allows too
    if array.ndim:
        obj["data"] = np.array(obj["data"], dtype=object).reshape(array.shape).tolist()
        _same_values(tensors.from_json(obj)[1], array)


@settings(max_examples=30, deadline=None)
@given(data=st.data(), datatype=st.sampled_from(sorted(tensors.CONTENTS_FIELD)))
def test_typed_contents_round_trip(data, datatype):
    array = data.draw(_arrays(tensors.DATATYPES[datatype]))
    message = tensor_pb2.Tensor(name="x", datatype=datatype, shape=list(array.shape))
    field = tensors.CONTENTS_FIELD[datatype]
    getattr(message.contents, field).extend(array.ravel().tolist())
    message.contents.SetInParent()  # an empty tensor's contents are still given
    _same_values(tensors.from_message(message), array)


@pytest.mark.parametrize("obj, says", [
    ({"name": "x", "shape": [2], "datatype": "FP32", "data": [1.0]}, "1 values, but shape"),
    ({"name": "x", "shape": [2], "datatype": "INT8", "data": [1, 300]}, "outside INT8"),
    ({"name": "x", "shape": [2], "datatype": "INT32", "data": [1, 2.5]}, "not an integer"),
    ({"name": "x", "shape": [1], "datatype": "INT32", "data": [True]}, "not an integer"),
    ({"name": "x", "shape": [1], "datatype": "BOOL", "data": [1]}, "not true or false"),
    ({"name": "x", "shape": [1], "datatype": "FP16", "data": [1e6]}, "beyond FP16"),
    ({"name": "x", "shape": [1], "datatype": "FP32", "data": ["nan"]}, "not a number"),
    ({"name": "x", "shape": [2], "datatype": "FP32", "data": [1.0, True]}, "not a number"),
    ({"name": "x", "shape": [2], "datatype": "FP32", "data": [1.0, 1e39]}, "beyond FP32"),
    ({"name": "x", "shape": [1], "datatype": "FP64", "data": [10**400]}, "beyond FP64"),
    ({"name": "x", "shape": [2], "datatype": "UINT8", "data": [3, -1]}, "-1 is outside"),
    ({"name": "x", "shape": [1], "datatype": "INT64", "data": [2**63]}, "outside INT64"),
    ({"name": "x", "shape": [2], "datatype": "UINT64", "data": [2**64 - 1, 2**64]},
     "outside UINT64"),
    ({"name": "x", "shape": [3], "datatype": "INT16", "data": [1, 2]}, "2 values, but"),
    # (an integer past 64 bits, as a JSON parser that reads it as a float gives it)
    ({"name": "x", "shape": [1], "datatype": "UINT64", "data": [float(2**64)]},
     "18446744073709551616 is outside UINT64"),
    ({"name": "x", "shape": [1], "datatype": "BYTES", "data": ["a"]}, "not tensors here"),
    ({"name": "x", "shape": [1], "datatype": "FP8", "data": [1]}, "not one of"),
    ({"name": "x", "shape": [-1], "datatype": "FP32", "data": []}, "non-negative"),
    ({"name": "x", "shape": [1.0], "datatype": "FP32", "data": [1]}, "non-negative"),
    ({"name": "x", "shape": "2", "datatype": "FP32", "data": [1, 2]}, "not a list"),
    ({"name": "x", "shape": [1], "datatype": "FP32", "data": 1}, "not a list"),
    ({"name": "x", "shape": [1], "datatype": "FP32"}, "no data"),
    ({"name": "x", "datatype": "FP32", "data": [1]}, "no shape"),
    ({"name": "x", "shape": [1], "datatype": "FP32", "data": [1], "dtype": "f"},
     "unknown field"),
    ({"name": "", "shape": [1], "datatype": "FP32", "data": [1]}, "name"),
    (["x"], "not an object"),
])
def test_malformed_json_tensors_are_named_input_errors(obj, says):
    with pytest.raises(InputError, match=says) as err:
        tensors.from_json(obj)
    if isinstance(obj, dict) and obj.get("name"):
        assert "'x'" in str(err.value)


def _read_body(text: bytes, fast: bool):
    """An inference body's input arrays, read as the infer call reads it (`fast`: simdjson's
    numbers first, orjson where it reads no object) or with orjson alone; or the error."""
    import orjson
    try:
        body = tensors.loads_with_numbers(text) if fast else None
        if body is None:
            body = orjson.loads(text)
        if not isinstance(body, dict):
            return "not an object"
        return tensors.from_json_list(body["inputs"], b"", "inputs")
    except (InputError, orjson.JSONDecodeError) as err:
        return type(err), str(err)


def _same_reading(text: bytes):
    fast, plain = _read_body(text, True), _read_body(text, False)
    if not isinstance(plain, dict):  # (an error: the same)
        assert fast == plain
        return
    assert isinstance(fast, dict) and fast.keys() == plain.keys()
    for name in plain:
        _same_values(fast[name], plain[name])


@settings(max_examples=40, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(DTYPES), nested=st.booleans())
def test_numbers_read_by_simdjson_are_orjsons_values(data, dtype, nested):
    """The infer call's reader (simdjson's numbers straight into arrays) gives what orjson
    and `from_json` give, for every datatype, flat and nested, NaN and infinities."""
    array = data.draw(_arrays(dtype))
    obj = tensors.to_json("x", array)
    if nested and array.ndim:
        obj["data"] = np.array(obj["data"], dtype=object).reshape(array.shape).tolist()
    text = json.dumps({"inputs": [obj, {**obj, "name": "y"}], "id": "r",
                       "parameters": {"p": [1, {"q": None}]}}).encode()
    _same_reading(text)
    fast = tensors.loads_with_numbers(text)
    assert fast["id"] == "r" and fast["parameters"] == {"p": [1, {"q": None}]}
    finite = array.dtype.kind == "f" and np.isfinite(array.astype(np.float64)).all() or \
        array.dtype.name == "bfloat16" and np.isfinite(array.astype(np.float64)).all()
    assert isinstance(fast["inputs"][0]["data"], tensors.Numbers) == bool(finite)


@pytest.mark.parametrize("text", [
    b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1.0, true]}]}',
    b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1.0, null]}]}',
    b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1.0, "2"]}]}',
    b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [[1.0], 2]}]}',
    b'{"inputs": [{"name": "x", "shape": [3], "datatype": "FP32", "data": [[1.0], 2]}]}',
    b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1e39]}]}',
    b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP64", "data": [1e400]}]}',
    b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP16", "data": [70000]}]}',
    b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP64", "data": [1' + b'0' * 30
    + b']}]}',
    b'{"inputs": [{"name": "x", "shape": [1], "datatype": "INT8", "data": [1.0]}]}',
    b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": {"a": 1}}]}',
    b'{"inputs": [{"name": "x", "shape": [1], "datatype": ["FP32"], "data": [1]}]}',
    b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1, 2]},'
    b' {"name": "x", "shape": [1], "datatype": "FP32", "data": [3]}]}',
    b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}], "inputs":'
    b' [{"name": "y", "shape": [1], "datatype": "FP32", "data": [2]}]}',
    b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [NaN]}]}',
    b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}',
    b'{"inputs": "x"}', b'[1, 2]', b'{"inputs": [[1.0, 2.0]]}',
    b'\xef\xbb\xbf{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}',
    b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1],'
    b' "data\\u0000": [2]}]}',
    b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1.0, '
    + b'[' * 100 + b'2.0' + b']' * 100 + b']}]}',
    b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": '
    + b'[' * 1100 + b'2.0' + b']' * 1100 + b'}]}',
])
def test_bodies_read_by_simdjson_are_refused_or_read_as_orjson_reads_them(text):
    _same_reading(text)


def test_malformed_raw_and_message_tensors_are_named_input_errors():
    with pytest.raises(InputError, match="7 bytes of data, but a FP32 tensor of shape"):
        tensors.from_raw("x", "FP32", [2], b"\0" * 7)
    with pytest.raises(InputError, match="neither 0 nor 1"):
        tensors.from_raw("x", "BOOL", [2], b"\x01\x02")
    both = tensor_pb2.Tensor(name="x", datatype="FP32", shape=[1], raw_contents=b"\0" * 4)
    both.contents.fp32_contents.append(1.0)
    with pytest.raises(InputError, match="holds contents and raw_contents"):
        tensors.from_message(both)
    wrong = tensor_pb2.Tensor(name="x", datatype="FP32", shape=[1])
    wrong.contents.int_contents.append(1)
    with pytest.raises(InputError, match="go in fp32_contents, not int_contents"):
        tensors.from_message(wrong)
    half = tensor_pb2.Tensor(name="x", datatype="FP16", shape=[1])
    half.contents.fp32_contents.append(1.0)
    with pytest.raises(InputError, match="travels as raw bytes"):
        tensors.from_message(half)
    empty = tensor_pb2.Tensor(name="x", datatype="FP32", shape=[3])
    with pytest.raises(InputError, match="0 bytes of data"):
        tensors.from_message(empty)


def test_chunks_out_of_order_short_or_too_long_are_refused():
    assembler = tensors.Assembler({0: ("x", 8)})
    with pytest.raises(InputError, match="a chunk at byte 4, where 0 bytes have come"):
        assembler.add(0, 4, b"\0" * 4)
    with pytest.raises(InputError, match="not a streamed tensor"):
        assembler.add(1, 0, b"\0")
    assembler.add(0, 0, b"\0" * 4)
    with pytest.raises(InputError, match="4 of its 8 bytes came"):
        assembler.finish()
    with pytest.raises(InputError, match="over its 8 bytes"):
        assembler.add(0, 4, b"\0" * 5)


def test_checked_shape_bounds_the_bytes():
    assert tensors.checked_shape([2, 3], "x", max_bytes=24, itemsize=4) == (2, 3)
    with pytest.raises(InputError, match="over the limit of 20"):
        tensors.checked_shape([2, 3], "x", max_bytes=20, itemsize=4)


def test_a_reference_reads_the_same_from_json_and_from_a_message():
    from deepx_flow.contract.deepx.v1 import tensor_pb2
    from deepx_flow.contract.tensors import Reference, from_json, from_message
    as_json = {"name": "x", "datatype": "FP32", "shape": [2, 3],
               "reference": {"asset": {"name": "raw", "version": "9f2c", "partition": "a"}}}
    message = tensor_pb2.Tensor(name="x", datatype="FP32", shape=[2, 3],
                                reference=tensor_pb2.TensorReference(
                                    asset=tensor_pb2.AssetReference(name="raw", version="9f2c",
                                                                    partition="a")))
    want = Reference("x", asset="raw", version="9f2c", partition="a", datatype="FP32",
                     shape=(2, 3))
    assert from_json(as_json) == ("x", want) and from_message(message) == want
    uri = tensor_pb2.Tensor(name="w", reference=tensor_pb2.TensorReference(zarr_uri="s3://b/w"))
    assert from_message(uri) == Reference("w", zarr_uri="s3://b/w")
    assert from_json({"name": "w", "reference": {"zarr_uri": "s3://b/w"}}) == \
        ("w", Reference("w", zarr_uri="s3://b/w"))


@pytest.mark.parametrize("tensor, says", [
    ({"name": "x", "reference": {"zarr_uri": ""}}, "not a path"),
    ({"name": "x", "reference": {"asset": {"version": "1"}}}, "not {\"name\": NAME}"),
    ({"name": "x", "reference": {"asset": {"name": "a", "tag": "1"}}}, "not {\"name\": NAME}"),
    ({"name": "x", "reference": {"zarr_uri": "a", "asset": {"name": "a"}}}, "not {\"zarr_uri"),
    ({"name": "x", "reference": "a.zarr"}, "not {\"zarr_uri"),
    ({"name": "x", "reference": {"zarr_uri": "a"}, "data": [1]}, "both a reference and data"),
    ({"name": "x", "reference": {"zarr_uri": "a"}, "datatype": "FP8"}, "FP8"),
    ({"name": "x", "reference": {"zarr_uri": "a"}, "shape": [-1]}, "shape"),
])
def test_a_bad_reference_is_named(tensor, says):
    from deepx_flow.contract.tensors import from_json
    with pytest.raises(InputError, match=re.escape(says)):
        from_json(tensor)
