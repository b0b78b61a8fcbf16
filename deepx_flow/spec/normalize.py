"""Normal forms for what a YAML spec may abbreviate: operator attributes and scalar literals.

The IR stores attributes explicitly and normalized (sorted non-negative axes, explicit
`keepdims`, full slice bounds), so that a computation is the same node however a spec spelled
it, and kernels need no defaults. A spec may leave out what NumPy or the SDK would default,
count axes from the end, and write a number in place of an operand. This module turns such
writing into the IR's form; the reader calls it once a node's operands are typed, because
most of these rules need the operands' number of dimensions.

Scalar literals are typed exactly as the SDK types Python scalars (NEP 50 weak scalars): in
`args: [h, 1.0]` the literal takes `h`'s dtype, so the YAML and the Python forms of a
computation give the very same `full` node, content-hash id included. The writer uses the
same rule to decide which constants it may write back as literals.
"""

from __future__ import annotations

from typing import Any

from deepx_flow.ir import dtypes
from deepx_flow.ir.node import Node, make_attrs, make_id
from deepx_flow.ops import OPS, REDUCE
from deepx_flow.ops.common import normalize_axes, normalize_axis

# Attribute defaults a spec may leave out; they are the SDK's defaults, so a YAML graph and the
# same graph built in Python are equal. Attributes not listed here have no default.
DEFAULTS: dict[str, dict[str, Any]] = {
    "arange": {"start": 0, "step": 1},
    "random_normal": {"mean": 0.0, "std": 1.0},
    "random_uniform": {"low": 0.0, "high": 1.0},
    "scatter_elements": {"reduction": "none"},
    "scatter_nd": {"reduction": "none"},
    "cumsum": {"exclusive": False, "reverse": False},
}

# Random parameters are floats in the IR (the SDK calls float() on them); `mean: 0` in a spec
# must not give a node that differs from the SDK's in its content hash.
FLOAT_ATTRS = ("mean", "std", "low", "high")


def normalize_attrs(op: str, attrs: dict[str, Any], inputs: list[Node],
                    node_id: str) -> dict[str, Any]:
    """The attributes a node of `op` stores, given what a spec wrote and the typed operands.

    Parameters
    ----------
    op : str
        A key of `OPS`.
    attrs : dict
        Attributes as written; a null value means "the default".
    inputs : list of Node
        The node's operands, already typed.
    node_id : str
        For error messages.

    Returns
    -------
    dict
        Attributes with defaults filled in and axes and slice bounds normalized. Attributes
        the operator does not know are passed through untouched, so that the operator's own
        check reports them by name.

    Raises
    ------
    GraphError
        An axis is not an integer, is out of range or is repeated.
    """
    out = {k: v for k, v in attrs.items() if v is not None}
    for key, value in DEFAULTS.get(op, {}).items():
        out.setdefault(key, value)
    for key in FLOAT_ATTRS:
        if key in out and type(out[key]) is int and abs(out[key]) < 2**1023:
            out[key] = float(out[key])  # larger ints stay, for the rule to refuse by name
    # A draft node gives the shared axis helpers the op and id their messages name.
    draft = Node(node_id, op, (), (), "")
    # Reductions with a compiler prologue broadcast all their operands: use the widest.
    ndim = max((t.ndim for t in inputs), default=0)
    if OPS[op].kind == REDUCE:
        out["axes"] = normalize_axes(draft, out.get("axes"), ndim)
        out.setdefault("keepdims", False)
    elif op in ("softmax", "log_softmax"):
        out["axis"] = normalize_axis(draft, out.get("axis", -1), ndim)
    elif op in ("concat", "take", "scatter_elements", "gather_elements", "cumsum") and inputs:
        out["axis"] = normalize_axis(draft, out.get("axis", 0), inputs[0].ndim)
    elif op == "transpose":
        axes = out.get("axes")
        if axes is None:
            out["axes"] = tuple(reversed(range(ndim)))
        elif isinstance(axes, (list, tuple)):
            out["axes"] = tuple(normalize_axis(draft, a, ndim) for a in axes)
    elif op == "flip" and inputs:  # np.flip's axis: null (every axis), an int or a list
        axes = out.get("axes")
        if axes is None:
            out["axes"] = tuple(range(ndim))
        elif isinstance(axes, (list, tuple)) and all(type(a) is int for a in axes):
            out["axes"] = tuple(sorted({normalize_axis(draft, a, ndim) for a in axes}))
        elif type(axes) is int:
            out["axes"] = (normalize_axis(draft, axes, ndim),)
    elif op == "slice" and len(inputs) == 1:
        out.update(_slice_bounds(out, inputs[0].shape))
    elif op in ("conv", "max_pool", "avg_pool") and inputs and inputs[0].ndim >= 3:
        # what the SDK's functions write (nn/convolution.py), one value per spatial axis
        spatial = inputs[0].ndim - 2
        out.setdefault("strides", (1,) * spatial)
        out.setdefault("pads", (0,) * (2 * spatial))
        out.setdefault("dilations", (1,) * spatial)
        if op == "conv":
            out.setdefault("groups", 1)
        if op == "avg_pool" and type(out.setdefault("count_include_pad", 0)) is bool:
            out["count_include_pad"] = int(out["count_include_pad"])  # (the IR's 0 or 1)
    return out


def _slice_bounds(attrs: dict[str, Any], shape: tuple[int, ...]) -> dict[str, Any]:
    """Python slicing rules per axis: missing or null bounds, negative bounds from the end.

    Bounds that are not one integer (or null) per axis are returned unchanged, so that the
    slice operator's own check reports them against the input's shape.
    """
    n = len(shape)
    starts = attrs.get("starts", (None,) * n)
    stops = attrs.get("stops", (None,) * n)
    steps = attrs.get("steps", (1,) * n)

    def ints(values, allow_none=True):
        return isinstance(values, (list, tuple)) and len(values) == n and all(
            (v is None and allow_none) or (type(v) is int) for v in values)

    if not (ints(starts) and ints(stops) and ints(steps, allow_none=False)
            and all(s >= 1 for s in steps)):
        return {"starts": starts, "stops": stops, "steps": steps}
    out_starts, out_stops = [], []
    for lo, hi, step, dim in zip(starts, stops, steps, shape, strict=True):
        lo, hi, _ = slice(lo, hi, step).indices(dim)
        out_starts.append(lo)
        out_stops.append(max(lo, hi))
    return {"starts": tuple(out_starts), "stops": tuple(out_stops), "steps": tuple(steps)}


# -- scalar literals ----------------------------------------------------------------------
def is_literal(value: Any) -> bool:
    """Whether an `args` entry is a scalar literal (a number or a bool), not a node id."""
    return isinstance(value, (bool, int, float))


def literal_dtype(value: bool | int | float, position: int, op: str,
                  arg_dtypes: list[str | None]) -> str:
    """The dtype of a literal written at `position` of a node's args, as the SDK would give it.

    Parameters
    ----------
    value : bool, int or float
        The literal.
    position : int
        Its index in `args`.
    op : str
        The node's operator.
    arg_dtypes : list of (str or None)
        The dtype of each operand, None where the operand is itself a literal.

    Returns
    -------
    str
        The literal's dtype: weak against the first operand that is not a literal (for `where`,
        the first of the two values; its condition is typed on its own), else the value's own
        default dtype (bool, int64, float64).
    """
    if op == "where":
        group = (1, 2) if position > 0 else ()
    else:
        group = range(len(arg_dtypes))
    like = next((arg_dtypes[j] for j in group if j < len(arg_dtypes)
                 and arg_dtypes[j] is not None), None)
    if like is None:
        like = "bool" if isinstance(value, bool) else "int64" if isinstance(value, int) \
            else "float64"
    return dtypes.scalar_dtype(value, like)


def literal_node(value: bool | int | float, dtype: str) -> Node:
    """The 0-d `full` node of a literal, with the id the SDK gives the same constant."""
    attrs = make_attrs(value=value)
    return Node(make_id("full", (), (), dtype, attrs), "full", (), (), dtype, attrs)
