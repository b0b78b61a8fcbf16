"""Source operators: graph inputs, constants, ranges and counter-based random tensors.

Random tensors take their values from (seed, flat element index) alone, so a result never
depends on the chunk grid or on how many workers run it.
"""

from __future__ import annotations

from deepx_flow.errors import GraphError, shown
from deepx_flow.ir import dtypes
from deepx_flow.ops.common import check_shape, declared_dtype
from deepx_flow.ops.spec import SOURCE, OpSpec


def _infer_declared(node, inputs):
    return check_shape(node, node.shape), declared_dtype(node)


def _infer_full(node, inputs):
    value = node.attr("value")
    if not isinstance(value, (bool, int, float)):
        raise GraphError(f"full: value must be a number or bool, got {shown(value)}", node.id)
    return _infer_declared(node, inputs)


def _infer_arange(node, inputs):
    shape, dtype = _infer_declared(node, inputs)
    if len(shape) != 1:
        raise GraphError(f"arange makes 1-D tensors, got shape {shape}", node.id)
    for key in ("start", "step"):
        if not isinstance(node.attr(key, 0), (int, float)):
            raise GraphError(f"arange: {key} must be a number", node.id)
    return shape, dtype


def _infer_random(node, inputs):
    shape, dtype = _infer_declared(node, inputs)
    if not dtypes.is_float(dtype):
        raise GraphError(f"{node.op} makes floating-point tensors, not {dtype}", node.id)
    seed = node.attr("seed")
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63:
        raise GraphError(f"{node.op}: seed must be an integer in [0, 2**63), got {shown(seed)}",
                         node.id)
    return shape, dtype


def _infer_read_zarr(node, inputs):
    uri = node.attr("uri")
    if not isinstance(uri, str) or not uri:
        raise GraphError(f"read_zarr: uri must be a path or URL, got {shown(uri)}", node.id)
    shape, dtype = _infer_declared(node, inputs)
    chunks = node.attr("storage_chunks")
    if chunks is not None and (not isinstance(chunks, (tuple, list)) or len(chunks) != len(shape)
                               or not all(isinstance(c, int) and c > 0 for c in chunks)):
        raise GraphError(f"read_zarr: storage_chunks must be {len(shape)} positive integers "
                         f"(the stored chunk shape), got {shown(chunks)}", node.id)
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
        OpSpec("read_zarr", SOURCE, 0, _infer_read_zarr, declared=declared, flops_per_element=0,
               attrs=("uri", "storage_chunks"), required_attrs=("uri",),
               doc="a stored Zarr array (a path or fsspec URL), read chunk by chunk"),
    ]
