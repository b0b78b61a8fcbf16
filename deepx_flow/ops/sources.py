"""Source operators: graph inputs, constants, ranges and counter-based random tensors.

Random tensors take their values from (seed, flat element index) alone, so a result never
depends on the chunk grid or on how many workers run it.
"""

from __future__ import annotations

import math

from deepx_flow.errors import GraphError, shown
from deepx_flow.ir import dtypes
from deepx_flow.ops.common import check_fits, check_shape, declared_dtype, is_number
from deepx_flow.ops.spec import SOURCE, OpSpec

MISSING = ("error", "fill")  # read_zarr: what a chunk that is not stored reads as
# read_zarr attributes of a stored version: which one (NAMED_BY: what its errors name), and
# the digest of its manifest, which its reads check (storage/manifest.py).
NAMED_BY = ("asset", "version", "partition")
STORED_AS = NAMED_BY + ("manifest",)


def _infer_declared(node, inputs):
    return check_shape(node, node.shape), declared_dtype(node)


def _infer_full(node, inputs):
    shape, dtype = _infer_declared(node, inputs)
    check_fits(node, node.attr("value"), dtype, "value")
    return shape, dtype


def _infer_arange(node, inputs):
    """`start + step * i` for i < n: finite numbers whose first and last values fit the
    dtype (the kernel computes in int64 or float64 and casts, which would wrap or overflow
    silently)."""
    shape, dtype = _infer_declared(node, inputs)
    if len(shape) != 1:
        raise GraphError(f"arange makes 1-D tensors, got shape {shape}", node.id)
    start, step = node.attr("start", 0), node.attr("step", 1)
    for key, value in (("start", start), ("step", step)):
        if not is_number(value):
            raise GraphError(f"arange: {key} must be a number, got {shown(value)}", node.id)
        if isinstance(value, float) and not math.isfinite(value):
            raise GraphError(f"arange: {key} must be finite, got {value}", node.id)
    if step == 0:
        raise GraphError("arange: step must not be zero", node.id)
    if shape[0]:
        check_fits(node, start, dtype, "first value")
        check_fits(node, start + step * (shape[0] - 1), dtype, "last value")
    return shape, dtype


# The kernel's parameters: numbers (the SDK makes them floats), finite, std >= 0, low < high.
RANDOM_PARAMS = {"random_normal": {"mean": 0.0, "std": 1.0},
                 "random_uniform": {"low": 0.0, "high": 1.0}}


def _infer_random(node, inputs):
    shape, dtype = _infer_declared(node, inputs)
    if not dtypes.is_float(dtype):
        raise GraphError(f"{node.op} makes floating-point tensors, not {dtype}", node.id)
    seed = node.attr("seed")
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63:
        raise GraphError(f"{node.op}: seed must be an integer in [0, 2**63), got {shown(seed)}",
                         node.id)
    params = {}
    for key, default in RANDOM_PARAMS[node.op].items():
        value = node.attr(key, default)
        if not is_number(value):
            raise GraphError(f"{node.op}: {key} must be a number, got {shown(value)}", node.id)
        try:
            params[key] = float(value)
        except OverflowError:  # an int past float64's range
            params[key] = math.inf
        if not math.isfinite(params[key]):
            raise GraphError(f"{node.op}: {key} must be finite, got {shown(value)}", node.id)
    if node.op == "random_normal" and params["std"] < 0:
        raise GraphError(f"random_normal: std must be >= 0, got {params['std']}", node.id)
    if node.op == "random_uniform":
        low, high = params["low"], params["high"]
        if not low < high:
            raise GraphError(f"random_uniform: low must be below high, got low={low}, "
                             f"high={high}", node.id)
        from deepx_flow.kernels.random import uniform_bounds
        lo, hi = uniform_bounds(low, high, dtype)
        if lo > hi:
            raise GraphError(f"random_uniform: no {dtype} value lies in [{low}, {high}); "
                             "widen the range or use a wider dtype", node.id)
    return shape, dtype


def _infer_read_zarr(node, inputs):
    uri = node.attr("uri")
    if not isinstance(uri, str) or not uri:
        raise GraphError(f"read_zarr: uri must be a path or URL, got {shown(uri)}", node.id)
    shape, dtype = _infer_declared(node, inputs)
    chunks = node.attr("storage_chunks")
    if chunks is not None and (not isinstance(chunks, (tuple, list)) or len(chunks) != len(shape)
                               or not all(type(c) is int and c > 0 for c in chunks)):
        raise GraphError(f"read_zarr: storage_chunks must be {len(shape)} positive integers "
                         f"(the stored chunk shape), got {shown(chunks)}", node.id)
    if node.attr("missing", "error") not in MISSING:
        raise GraphError(f"read_zarr: missing must be one of {', '.join(MISSING)} (what to do "
                         f"with a chunk that is not stored), got {shown(node.attr('missing'))}",
                         node.id)
    for key in STORED_AS:
        if not isinstance(node.attr(key, ""), str):
            raise GraphError(f"read_zarr: {key} must be a string, got {shown(node.attr(key))}",
                             node.id)
    return shape, dtype


def specs() -> list[OpSpec]:
    declared = ("shape", "dtype")
    return [
        OpSpec("input", SOURCE, 0, _infer_declared, declared=declared, flops_per_element=0,
               doc="named graph input"),
        OpSpec("full", SOURCE, 0, _infer_full, declared=declared, attrs=("value",),
               required_attrs=("value",), doc="tensor filled with one value"),
        OpSpec("arange", SOURCE, 0, _infer_arange, declared=declared, attrs=("start", "step"),
               doc="start + step * index"),
        # Random kernels hash counters in fixed-size blocks, so their scratch (at most
        # 1.5 MiB on a CPU, 24 MiB on a GPU) does not grow with the chunk: none per element.
        OpSpec("random_normal", SOURCE, 0, _infer_random, declared=declared,
               flops_per_element=30, attrs=("seed", "mean", "std"),
               required_attrs=("seed",), doc="normal values from (seed, element index)"),
        OpSpec("random_uniform", SOURCE, 0, _infer_random, declared=declared,
               flops_per_element=15, attrs=("seed", "low", "high"),
               required_attrs=("seed",), doc="uniform values in [low, high) from (seed, index)"),
        # Tasks read just their region, on the worker: a stored tensor is never loaded whole.
        # `missing`: "error" (default) or "fill" for a chunk that is not stored; `asset`,
        # `version`, `partition`, `manifest`: which stored asset version it is (STORED_AS).
        OpSpec("read_zarr", SOURCE, 0, _infer_read_zarr, declared=declared, flops_per_element=0,
               attrs=("uri", "storage_chunks", "missing") + STORED_AS,
               required_attrs=("uri",),
               doc="a stored Zarr array (a path or fsspec URL), read chunk by chunk, each "
                   "chunk checked"),
    ]
