"""A NumPy interpreter of graphs as built (before compiling), for references in tests.

Each operator is written here from NumPy's own functions, in float64 where the graph says
float64, one whole array per node, with no chunks, fusion or Dask: what the engine computes
is checked against it, and finite differences of it check the engine's gradients.
"""

from __future__ import annotations

import math

import numpy as np

from deepx_flow.ir import Graph

GELU_K = math.sqrt(2.0 / math.pi)

UNARY = {
    "neg": np.negative, "abs": np.abs, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
    "tanh": np.tanh, "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "relu": lambda x: np.maximum(x, 0),
    "gelu": lambda x: 0.5 * x * (1 + np.tanh(GELU_K * (x + 0.044715 * x ** 3))),
    "erf": lambda x: np.vectorize(math.erf, otypes=[np.float64])(x),
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "floor": np.floor, "ceil": np.ceil,
    "round": np.rint, "sign": np.sign, "reciprocal": lambda x: 1 / x,
    "softplus": lambda x: np.logaddexp(0, x),
    "sinh": np.sinh, "cosh": np.cosh, "asinh": np.arcsinh, "acosh": np.arccosh,
    "atanh": np.arctanh,
}
BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
    "pow": np.power, "maximum": np.maximum, "minimum": np.minimum, "lt": np.less,
    "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "eq": np.equal,
    "ne": np.not_equal,
}
REDUCE = {"sum": np.sum, "mean": np.mean, "prod": np.prod, "max": np.max, "min": np.min}


def evaluate(graph: Graph, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every output of `graph` (by name), computed node by node with NumPy."""
    values: dict[str, np.ndarray] = {}
    with np.errstate(all="ignore"):
        for node in graph.nodes:
            values[node.id] = np.asarray(_one(node, [values[i] for i in node.inputs], inputs),
                                         dtype=node.dtype)
    return {name: values[node_id] for name, node_id in graph.outputs}


def _one(node, args, inputs):
    op, attrs = node.op, dict(node.attrs)
    if op == "input":
        return inputs[node.id]
    if op == "full":
        return np.full(node.shape, attrs["value"])
    if op == "arange":
        return attrs.get("start", 0) + attrs.get("step", 1) * np.arange(node.shape[0])
    if op in ("random_normal", "random_uniform"):
        from deepx_flow.kernels.tasks import source_chunk
        return source_chunk(op, attrs, node.shape, tuple((0, s) for s in node.shape),
                            node.dtype)
    if op in UNARY:
        return UNARY[op](args[0])
    if op in BINARY:
        return BINARY[op](*args)
    if op == "where":
        return np.where(*args)
    if op == "cast":
        return args[0].astype(node.dtype)
    if op == "matmul":
        return np.matmul(*args)
    if op in REDUCE:
        return REDUCE[op](args[0], axis=attrs["axes"], keepdims=attrs.get("keepdims", False))
    if op in ("softmax", "log_softmax"):
        x = args[0]
        shifted = x - x.max(axis=attrs["axis"], keepdims=True)
        log_norm = np.log(np.exp(shifted).sum(axis=attrs["axis"], keepdims=True))
        out = shifted - log_norm
        return np.exp(out) if op == "softmax" else out
    if op == "transpose":
        return np.transpose(args[0], attrs["axes"])
    if op == "reshape":
        return args[0].reshape(node.shape)
    if op == "concat":
        return np.concatenate(args, axis=attrs["axis"])
    if op == "take":
        return np.take(args[0], args[1], axis=attrs["axis"])
    if op == "arange":
        return attrs.get("start", 0) + attrs.get("step", 1) * np.arange(node.shape[0])
    if op == "slice":
        return args[0][tuple(slice(a, b, c) for a, b, c in
                             zip(attrs["starts"], attrs["stops"], attrs["steps"]))]
    if op == "flip":
        return np.flip(args[0], attrs["axes"])
    if op in ("conv", "max_pool", "avg_pool"):
        return _window(node, attrs, args)
    if op == "cumsum":
        return cumsum(args[0], attrs["axis"], attrs["exclusive"], attrs["reverse"], node.dtype)
    raise NotImplementedError(f"no reference for {op}")


def cumsum(x, axis: int, exclusive: bool = False, reverse: bool = False,
           dtype=np.float64) -> np.ndarray:
    """The running sums of `x` along `axis` by `np.cumsum` in `dtype`: from the end for
    `reverse`, each element left out of its own sum for `exclusive`."""
    v = np.asarray(x).astype(dtype)
    if reverse:
        v = np.flip(v, axis)
    out = np.cumsum(v, axis=axis, dtype=v.dtype)
    if exclusive and out.shape[axis]:
        zero = np.zeros_like(np.take(out, [0], axis=axis))
        out = np.concatenate([zero, np.delete(out, -1, axis=axis)], axis=axis)
    return np.flip(out, axis) if reverse else out


def _window(node, attrs, args):
    """conv and the pools as sums over kernel offsets of strided slices of the padded input
    (`ops.window`'s definitions), the conv's products per group with einsum."""
    x = args[0]
    n = x.ndim - 2
    kernel = args[1].shape[2:] if node.op == "conv" else tuple(attrs["kernel"])
    strides = attrs.get("strides") or (1,) * n
    dil = attrs.get("dilations") or (1,) * n
    pads = attrs.get("pads") or (0,) * (2 * n)
    out = node.shape[2:]
    widths = [(0, 0), (0, 0)] + [(pads[a], pads[n + a]) for a in range(n)]
    low = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    source = np.pad(x, widths, constant_values=low if node.op == "max_pool" else 0)
    inside = np.pad(np.ones(x.shape[2:]), widths[2:])
    taps = []
    for k in np.ndindex(*kernel):
        index = tuple(slice(k[a] * dil[a], k[a] * dil[a] + strides[a] * (out[a] - 1) + 1,
                            strides[a]) for a in range(n))
        taps.append((k, source[(slice(None), slice(None)) + index], inside[index]))
    if node.op == "max_pool":
        stacked = np.stack([t for _, t, _ in taps])
        return np.where(np.isnan(stacked).any(0), np.nan, stacked.max(0))
    if node.op == "avg_pool":
        total = sum(t for _, t, _ in taps)
        count = len(taps) if attrs.get("count_include_pad") else sum(c for _, _, c in taps)
        return total / count
    w = args[1]
    groups = attrs.get("groups", 1)
    cg, mg = x.shape[1] // groups, w.shape[0] // groups
    y = np.zeros(node.shape, dtype=np.result_type(x, w))
    for k, t, _ in taps:
        for g in range(groups):
            y[:, g * mg:(g + 1) * mg] += np.einsum(
                "nc...,mc->nm...", t[:, g * cg:(g + 1) * cg],
                w[(slice(g * mg, (g + 1) * mg), slice(None)) + k])
    return y
