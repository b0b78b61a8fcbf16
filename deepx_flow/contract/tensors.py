"""Tensors on the wire, one codec for every transport: NumPy arrays to and from the Open
Inference Protocol's tensors (name, datatype, shape, data), as JSON objects (HTTP) and as
`deepx.v1.Tensor` messages (gRPC), with raw little-endian bytes cut into bounded chunks.

Nothing is guessed: a datatype this server does not take, a shape that is not a list of
non-negative integers, data of the wrong size or kind (a float where an integer is due, an
integer out of its type's range, a BOOL byte that is neither 0 nor 1), two kinds of data at
once or none: each is an `InputError` naming the tensor. JSON has no NaN or infinities:
they travel as the strings "NaN", "Infinity" and "-Infinity", as in protobuf's JSON mapping.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from deepx_flow.errors import InputError, shown
from deepx_flow.ir import dtypes

# OIP's datatype names -> deepx_flow's dtypes (BYTES, OIP's strings, is not a tensor type here)
DATATYPES = {"BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32",
             "UINT64": "uint64", "INT8": "int8", "INT16": "int16", "INT32": "int32",
             "INT64": "int64", "FP16": "float16", "BF16": "bfloat16", "FP32": "float32",
             "FP64": "float64"}
DATATYPE_OF = {dtype: datatype for datatype, dtype in DATATYPES.items()}

# The typed field of a TensorContents message that holds each datatype (FP16 and BF16 have
# none: they travel as raw bytes, as in OIP).
CONTENTS_FIELD = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
                  "INT32": "int_contents", "INT64": "int64_contents",
                  "UINT8": "uint_contents", "UINT16": "uint_contents",
                  "UINT32": "uint_contents", "UINT64": "uint64_contents",
                  "FP32": "fp32_contents", "FP64": "fp64_contents"}
CONTENTS_FIELDS = tuple(sorted(set(CONTENTS_FIELD.values())))

NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def dtype_of(datatype, tensor: str) -> str:
    """deepx_flow's dtype for OIP's `datatype`; an InputError naming `tensor` otherwise."""
    if datatype.__class__ is str and datatype in DATATYPES:
        return DATATYPES[datatype]
    hint = " (strings are not tensors here)" if datatype == "BYTES" else ""
    raise InputError(f"tensor {shown(tensor)}: datatype {shown(datatype)} is not one of "
                     f"{', '.join(DATATYPES)}{hint}")


def datatype_of(dtype) -> str:
    """OIP's datatype name for a NumPy dtype deepx_flow computes in."""
    return DATATYPE_OF[dtypes.normalize(dtype)]


def checked_shape(shape, tensor: str, max_bytes: int | None = None,
                  itemsize: int = 1) -> tuple[int, ...]:
    """`shape` as a tuple of non-negative ints, at most `max_bytes` in all when given."""
    if not isinstance(shape, (list, tuple)) or \
            not all(type(d) is int and d >= 0 for d in shape):
        raise InputError(f"tensor {shown(tensor)}: shape {shown(shape)} is not a list of "
                         f"non-negative integers")
    shape = tuple(shape)
    if max_bytes is not None and math.prod(shape) * itemsize > max_bytes:
        raise InputError(f"tensor {shown(tensor)}: shape {list(shape)} is "
                         f"{math.prod(shape) * itemsize:,} bytes, over the limit of "
                         f"{max_bytes:,}")
    return shape


def from_raw(tensor: str, datatype: str, shape, raw) -> np.ndarray:
    """The array of `raw` bytes (row-major, little-endian) of this datatype and shape."""
    dtype = np.dtype(dtype_of(datatype, tensor)).newbyteorder("<")
    shape = checked_shape(shape, tensor)
    want = math.prod(shape) * dtype.itemsize
    if len(raw) != want:
        raise InputError(f"tensor {shown(tensor)}: {len(raw):,} bytes of data, but a "
                         f"{datatype} tensor of shape {list(shape)} is {want:,}")
    array = np.frombuffer(raw, dtype=dtype).reshape(shape)
    if datatype == "BOOL" and array.view(np.uint8).max(initial=0) > 1:
        raise InputError(f"tensor {shown(tensor)}: a BOOL byte is neither 0 nor 1")
    return array.astype(dtype.newbyteorder("="), copy=False)


def to_raw(array: np.ndarray) -> bytes:
    """An array's elements as row-major little-endian bytes."""
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()


def from_values(tensor: str, datatype: str, shape, values) -> np.ndarray:
    """The array of typed `values` (a flat sequence, or nested lists matching `shape`),
    each checked to be exactly a value of `datatype`."""
    dtype = dtype_of(datatype, tensor)
    shape = checked_shape(shape, tensor)
    quick = _plain_numbers(tensor, datatype, dtype, shape, values)
    if quick is not None:
        return quick
    flat = list(_flattened(values, tensor))
    if len(flat) != math.prod(shape):
        raise InputError(f"tensor {shown(tensor)}: {len(flat):,} values, but shape "
                         f"{list(shape)} holds {math.prod(shape):,}")
    if datatype == "BOOL":
        if not all(v is True or v is False for v in flat):
            raise InputError(f"tensor {shown(tensor)}: a BOOL value is not true or false")
        return np.array(flat, dtype=bool).reshape(shape)
    if dtypes.is_float(dtype):
        numbers = []
        for v in flat:
            if type(v) in (int, float):
                numbers.append(_float(v, tensor, datatype))
            elif v.__class__ is str and v in NON_FINITE:
                numbers.append(NON_FINITE[v])
            else:
                raise InputError(f"tensor {shown(tensor)}: {shown(v)} is not a number "
                                 f"(or \"NaN\", \"Infinity\", \"-Infinity\")")
        with np.errstate(over="ignore"):
            array = np.array(numbers, dtype=np.float64).astype(dtype)
        if np.isinf(array).sum() != sum(math.isinf(v) for v in numbers):
            raise InputError(f"tensor {shown(tensor)}: a value is beyond {datatype}'s range")
        return array.reshape(shape)
    info = np.iinfo(dtype)
    for v in flat:
        if type(v) is float and v.is_integer() and abs(v) >= 2**63:  # (a JSON parser reads
            # integers past 64 bits as floats)
            raise InputError(f"tensor {shown(tensor)}: {v:.0f} is outside {datatype}'s range "
                             f"[{info.min}, {info.max}]")
        if type(v) is not int:
            raise InputError(f"tensor {shown(tensor)}: {shown(v)} is not an integer")
        if not info.min <= v <= info.max:
            raise InputError(f"tensor {shown(tensor)}: {v} is outside {datatype}'s range "
                             f"[{info.min}, {info.max}]")
    return np.array(flat, dtype=dtype).reshape(shape)


def _plain_numbers(tensor: str, datatype: str, dtype: str, shape, values):
    """The array of `values` when they are a flat list of plain numbers of the datatype's
    kind (what clients send, and most of a request's work to check one by one), or
    `Numbers`, checked by NumPy as a whole; None for anything else (nested lists,
    non-finite strings, a value too large for a machine integer), which `from_values`
    checks one by one."""
    floats = dtypes.is_float(dtype)
    if type(values) is Numbers and floats:
        wide = values.array
    else:
        if type(values) is not list:
            return None
        kinds = set(map(type, values))  # (bool is a type of its own here, not an int)
        if datatype == "BOOL" or not kinds <= ({int, float} if floats else {int}):
            return None
        if len(values) != math.prod(shape):
            raise InputError(f"tensor {shown(tensor)}: {len(values):,} values, but shape "
                             f"{list(shape)} holds {math.prod(shape):,}")
        try:
            wide = np.array(values, dtype=np.float64 if floats else np.int64)
        except OverflowError:
            return None
    if wide.size != math.prod(shape):
        raise InputError(f"tensor {shown(tensor)}: {wide.size:,} values, but shape "
                         f"{list(shape)} holds {math.prod(shape):,}")
    if floats:
        if wide.size and not np.abs(wide).max() <= _largest(dtype):
            with np.errstate(over="ignore"):  # (some may round down to the largest)
                array = wide.astype(dtype)
            if np.isinf(array).sum() != np.isinf(wide).sum():
                raise InputError(f"tensor {shown(tensor)}: a value is beyond {datatype}'s "
                                 f"range")
            return array.reshape(shape)
        return wide.astype(dtype).reshape(shape)
    info = np.iinfo(dtype)
    if wide.size and (wide.min() < info.min or wide.max() > info.max):
        bad = wide[(wide < info.min) | (wide > info.max)][0]
        raise InputError(f"tensor {shown(tensor)}: {bad} is outside {datatype}'s range "
                         f"[{info.min}, {info.max}]")
    return wide.astype(dtype).reshape(shape)


@functools.cache
def _largest(dtype: str) -> float:
    """The largest finite value of a float dtype (bfloat16's included)."""
    import ml_dtypes
    return float(ml_dtypes.finfo(dtype).max)


def _float(v, tensor: str, datatype: str) -> float:
    try:
        return float(v)
    except OverflowError:  # an integer past any float
        raise InputError(f"tensor {shown(tensor)}: a value is beyond {datatype}'s "
                         f"range") from None


def to_values(array: np.ndarray) -> list:
    """An array's elements, row-major, as JSON values (non-finite floats as strings)."""
    if dtypes.is_float(array.dtype):
        flat = array.astype(np.float64).ravel().tolist()
        if np.isfinite(array).all():  # (most answers: no value to write as a string)
            return flat
        return [v if math.isfinite(v) else
                ("NaN" if math.isnan(v) else "Infinity" if v > 0 else "-Infinity")
                for v in flat]
    return array.ravel().tolist()


def _flattened(values, tensor: str) -> Iterator:
    """The values of nested lists, in order, at any depth (a stack, not recursion: the
    JSON parsers bound the depth, at 1024, as `loads_with_numbers` flattens too)."""
    if not isinstance(values, (list, tuple)):
        raise InputError(f"tensor {shown(tensor)}: data is {shown(values)}, not a list")
    stack = [iter(values)]
    while stack:
        for v in stack[-1]:
            if isinstance(v, (list, tuple)):
                stack.append(iter(v))
                break
            yield v
        else:
            stack.pop()


# -- references to storage ------------------------------------------------------------------

@dataclass(frozen=True)
class Reference:
    """An input tensor read from storage instead of sent: a Zarr array (`zarr_uri`) or a
    stored asset (`asset`, with a `version` and a `partition` where given); `datatype` and
    `shape`, when the client gave them, are checked against what is stored."""

    name: str
    zarr_uri: str | None = None
    asset: str | None = None
    version: str = ""
    partition: str = ""
    datatype: str | None = None
    shape: tuple | None = None

    def described(self) -> dict:
        """What the request said, for its digest."""
        return {"zarr_uri": self.zarr_uri, "asset": self.asset, "version": self.version,
                "partition": self.partition, "datatype": self.datatype,
                "shape": None if self.shape is None else list(self.shape)}


def reference_of(name: str, where, datatype=None, shape=None) -> Reference:
    """A Reference from the JSON form `{"zarr_uri": URI}` or `{"asset": {"name": ...,
    "version": ..., "partition": ...}}`."""
    if datatype is not None:
        dtype_of(datatype, name)
    if shape is not None:
        shape = tuple(checked_shape(shape, name))
    if not isinstance(where, dict) or len(where) != 1 or \
            next(iter(where)) not in ("zarr_uri", "asset"):
        raise InputError(f"tensor {shown(name)}: reference is {shown(where)}, not "
                         f"{{\"zarr_uri\": URI}} or {{\"asset\": {{\"name\": NAME}}}}")
    if "zarr_uri" in where:
        uri = where["zarr_uri"]
        if not isinstance(uri, str) or not uri:
            raise InputError(f"tensor {shown(name)}: zarr_uri is {shown(uri)}, not a path "
                             f"or URL")
        return Reference(name, zarr_uri=uri, datatype=datatype, shape=shape)
    asset = where["asset"]
    if not isinstance(asset, dict) or set(asset) - {"name", "version", "partition"} or \
            not all(isinstance(v, str) for v in asset.values()) or not asset.get("name"):
        raise InputError(f"tensor {shown(name)}: asset reference is {shown(asset)}, not "
                         f"{{\"name\": NAME}} with an optional version and partition")
    return Reference(name, asset=asset["name"], version=asset.get("version", ""),
                     partition=asset.get("partition", ""), datatype=datatype, shape=shape)


# -- JSON (HTTP) --------------------------------------------------------------------------

# The binary tensor extension's header: the length of a body's JSON part, after which come
# the raw bytes of each tensor that says `"parameters": {"binary_data_size": N}`, in order.
BINARY_HEADER = "Inference-Header-Content-Length"

def from_json(obj, raw: bytes | None = None) -> tuple[str, np.ndarray | Reference]:
    """(name, array) of an OIP JSON tensor: its `data`, or its `raw` bytes (the binary
    tensor extension: the bytes that followed the JSON, `binary_data_size` of them); or
    (name, Reference) of one whose `reference` says where it is stored."""
    if not isinstance(obj, dict):
        raise InputError(f"a tensor is {shown(obj)}, not an object with name, shape, "
                         f"datatype and data")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise InputError(f"a tensor's name is {shown(name)}, not a non-empty string")
    unknown = sorted(set(obj) - {"name", "shape", "datatype", "data", "parameters",
                                 "reference"})
    if unknown:
        raise InputError(f"tensor {shown(name)}: unknown field(s) {', '.join(unknown)}")
    if "reference" in obj:
        if "data" in obj or raw is not None:
            raise InputError(f"tensor {shown(name)}: both a reference and data")
        return name, reference_of(name, obj["reference"], obj.get("datatype"),
                                  obj.get("shape"))
    for field in ("shape", "datatype"):
        if field not in obj:
            raise InputError(f"tensor {shown(name)}: no {field}")
    if raw is not None:
        if "data" in obj:
            raise InputError(f"tensor {shown(name)}: both data and binary data")
        return name, from_raw(name, obj["datatype"], obj["shape"], raw)
    if "data" not in obj:
        raise InputError(f"tensor {shown(name)}: no data")
    return name, from_values(name, obj["datatype"], obj["shape"], obj["data"])


@dataclass(frozen=True, eq=False)
class Numbers:
    """A tensor's "data" as `loads_with_numbers` reads it: its numbers, in order (nested
    lists flattened, as `from_values` flattens them), as float64."""

    array: np.ndarray


FLOAT_DATATYPES = frozenset(n for n, d in DATATYPES.items() if dtypes.is_float(d))


def loads_with_numbers(text: bytes) -> dict | None:
    """The JSON object of `text`, as orjson would read it, but that the "data" of each
    tensor of its "inputs" of a float datatype, when every value in it is a number, is
    `Numbers`: read by simdjson straight into a buffer of doubles, without a Python float
    for each value (what decoding an inference request of 784 numbers mostly cost). None
    where simdjson reads no object from `text`: the caller reads it with orjson, whose
    errors say what is wrong."""
    import simdjson
    if text[:3] == b"\xef\xbb\xbf":  # (a byte-order mark: simdjson skips it, orjson not)
        return None
    try:
        doc = simdjson.Parser().parse(text)  # (a parser each: its values live as long)
    except (ValueError, RuntimeError, TypeError):
        return None
    if not isinstance(doc, simdjson.Object):
        return None
    out = {}
    try:
        for key in _keys(doc):  # (by key: items() gives every value made Python, data too)
            value = doc[key]
            if key == "inputs" and isinstance(value, simdjson.Array):
                out[key] = [_tensor_with_numbers(t, simdjson) for t in value]
            else:
                out[key] = _as_python(value, simdjson)
    except _RepeatedKey:
        return None
    return out


class _RepeatedKey(Exception):
    """A key given twice (or holding a NUL) in an object read by key: orjson's reading
    (the last wins) then."""


def _keys(obj) -> list:
    keys = list(obj.keys())
    # (simdjson finds a repeated key's first value, orjson keeps the last; and its lookup
    # stops at a NUL in a key)
    if len(set(keys)) != len(keys) or any("\x00" in k for k in keys):
        raise _RepeatedKey()
    return keys


def _tensor_with_numbers(tensor, simdjson):
    if not isinstance(tensor, simdjson.Object):
        return _as_python(tensor, simdjson)
    obj = {key: tensor[key] for key in _keys(tensor)}
    data, datatype = obj.get("data"), obj.get("datatype")
    for key, value in obj.items():
        if key != "data":
            obj[key] = _as_python(value, simdjson)
    if isinstance(data, simdjson.Array):
        numbers = None
        if datatype.__class__ is str and datatype in FLOAT_DATATYPES:
            try:  # (refused, and read as a list, where a value is no number)
                numbers = np.frombuffer(data.as_buffer(of_type="d"), np.float64)
            except (TypeError, ValueError):
                pass
        obj["data"] = data.as_list() if numbers is None else Numbers(numbers)
    elif "data" in obj:
        obj["data"] = _as_python(data, simdjson)
    return obj


def _as_python(value, simdjson):
    if isinstance(value, simdjson.Object):
        return value.as_dict()
    if isinstance(value, simdjson.Array):
        return value.as_list()
    return value


def from_json_list(listed, raw: bytes, what: str) -> dict:
    """Name -> array of a list of OIP JSON tensors (`what`: "inputs" or "outputs") and the
    binary bytes that followed their JSON, each taken by the tensors that say their
    `binary_data_size`, in order, every byte taken once."""
    if not isinstance(listed, list):
        raise InputError(f"{what} is {shown(listed)}, not a list of tensors")
    arrays, at = {}, 0
    for obj in listed:
        size = None
        params = obj.get("parameters") if isinstance(obj, dict) else None
        if params is not None:
            if not isinstance(params, dict):
                raise InputError(f"a tensor's parameters are {shown(params)}, not an object")
            size = params.get("binary_data_size")
            if size is not None and (type(size) is not int or size < 0):
                raise InputError(f"binary_data_size is {shown(size)}, not a byte count")
        if size is not None:
            if at + size > len(raw):
                raise InputError(f"tensor {shown(obj.get('name'))}: binary_data_size {size:,} "
                                 f"passes the end of the {len(raw):,} binary bytes")
            name, array = from_json(obj, raw[at:at + size])
            at += size
        else:
            name, array = from_json(obj)
        if name in arrays:
            raise InputError(f"{what[:-1]} {shown(name)} is given twice")
        arrays[name] = array
    if at != len(raw):
        raise InputError(f"{len(raw) - at:,} binary bytes after the last of the {what}")
    return arrays


def byte_size(datatype, shape, tensor: str) -> int:
    """How many raw bytes a tensor of this datatype and shape is."""
    itemsize = np.dtype(dtype_of(datatype, tensor)).itemsize
    return math.prod(checked_shape(list(shape), tensor)) * itemsize


def to_json(name: str, array: np.ndarray) -> dict:
    """An OIP JSON tensor holding `array`'s values."""
    return {"name": name, "datatype": datatype_of(array.dtype), "shape": list(array.shape),
            "data": to_values(array)}


# -- protobuf (gRPC) ----------------------------------------------------------------------

def from_message(message, streamed: bytes | None = None) -> np.ndarray | Reference:
    """The array of a `deepx.v1.Tensor` holding typed contents or raw bytes, or of the
    bytes its chunks brought (`streamed`, for a tensor whose header says `streamed`); the
    Reference of one that says where it is stored."""
    name = message.name
    kinds = [k for k, held in (("contents", message.HasField("contents")),
                               ("raw_contents", bool(message.raw_contents)),
                               ("streamed", message.streamed),
                               ("reference", message.HasField("reference"))) if held]
    if len(kinds) > 1:
        raise InputError(f"tensor {shown(name)}: holds {' and '.join(kinds)}; give one")
    if message.streamed:
        return from_raw(name, message.datatype, list(message.shape), streamed or b"")
    if message.HasField("contents"):
        field = CONTENTS_FIELD.get(message.datatype)
        if field is None:
            dtype_of(message.datatype, name)  # unknown datatype: its own message
            raise InputError(f"tensor {shown(name)}: {message.datatype} travels as raw "
                             f"bytes, not typed contents")
        given = [f for f in CONTENTS_FIELDS if getattr(message.contents, f)]
        if any(f != field for f in given):
            raise InputError(f"tensor {shown(name)}: a {message.datatype} tensor's values "
                             f"go in {field}, not {', '.join(f for f in given if f != field)}")
        return from_values(name, message.datatype, list(message.shape),
                           list(getattr(message.contents, field)))
    if kinds == ["reference"]:
        ref = message.reference
        where = {"zarr_uri": ref.zarr_uri} if ref.WhichOneof("where") == "zarr_uri" else \
            {"asset": {"name": ref.asset.name, "version": ref.asset.version,
                       "partition": ref.asset.partition}}
        return reference_of(name, where, message.datatype or None,
                            list(message.shape) if message.shape else None)
    # raw bytes, or none at all: right only for a tensor with no elements
    return from_raw(name, message.datatype, list(message.shape), message.raw_contents)


def to_message(name: str, array: np.ndarray, max_inline_bytes: int | None = None):
    """A `deepx.v1.Tensor` with `array`'s raw bytes, or, past `max_inline_bytes`, its
    header alone marked `streamed` (send `chunks(...)` of `to_raw(array)` after it)."""
    from deepx_flow.contract.deepx.v1 import tensor_pb2
    message = tensor_pb2.Tensor(name=name, datatype=datatype_of(array.dtype),
                                shape=list(array.shape))
    if max_inline_bytes is not None and array.nbytes > max_inline_bytes:
        message.streamed = True
    else:
        message.raw_contents = to_raw(array)
    return message


# -- chunks -------------------------------------------------------------------------------

def chunks(tensor: int, raw: bytes, max_bytes: int) -> Iterator[tuple[int, int, memoryview]]:
    """(tensor, offset, bytes) pieces of `raw` of at most `max_bytes` each, in order."""
    if max_bytes <= 0:
        raise ValueError("max_bytes must be positive")
    view = memoryview(raw)
    for offset in range(0, len(view), max_bytes):
        yield tensor, offset, view[offset:offset + max_bytes]


class Assembler:
    """Collects the chunks of streamed tensors, each of a known size, checking that they
    come in order, whole and within their tensor (`InputError` naming the tensor)."""

    def __init__(self, sizes: dict[int, tuple[str, int]]):
        # tensor index -> (name, size in bytes)
        self.sizes = sizes
        self.buffers = {i: bytearray() for i in sizes}

    def add(self, tensor: int, offset: int, data) -> None:
        if tensor not in self.sizes:
            raise InputError(f"a chunk of tensor {tensor}, which is not a streamed tensor "
                             f"here (streamed: {sorted(self.sizes) or 'none'})")
        name, size = self.sizes[tensor]
        buffer = self.buffers[tensor]
        if offset != len(buffer):
            raise InputError(f"tensor {shown(name)}: a chunk at byte {offset:,}, where "
                             f"{len(buffer):,} bytes have come (chunks come in order)")
        if len(buffer) + len(data) > size:
            raise InputError(f"tensor {shown(name)}: chunks of over its {size:,} bytes")
        buffer += data

    def finish(self) -> dict[int, bytearray]:
        """Every tensor's bytes, once all have come whole."""
        for tensor, (name, size) in self.sizes.items():
            if len(self.buffers[tensor]) != size:
                raise InputError(f"tensor {shown(name)}: {len(self.buffers[tensor]):,} of its "
                                 f"{size:,} bytes came")
        return dict(self.buffers)
