"""Element types of the IR and NumPy's rules for combining them.

Dtypes are kept as NumPy names (`"float32"`), so nodes stay plain data. Result types follow
NumPy exactly (we ask NumPy on zero-size arrays), except for Python scalars, which are "weak"
as in NumPy 2 (NEP 50): `x_float32 + 1.0` stays float32.
"""

from __future__ import annotations

import numpy as np

from deepx_flow.errors import GraphError, shown

DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64")


def normalize(dtype, node: str | None = None) -> str:
    """Return the canonical name of `dtype`, or raise GraphError for an unsupported one."""
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = str(dtype)
    if name not in DTYPES:
        raise GraphError(f"unsupported dtype {shown(dtype)}; use one of {', '.join(DTYPES)}", node)
    return name


def itemsize(dtype: str) -> int:
    return np.dtype(dtype).itemsize


def is_float(dtype: str) -> bool:
    return np.dtype(dtype).kind == "f"


def accumulator(dtype: str) -> str:
    """The dtype that sums of `dtype` add up in, inside each chunk and across the tree:
    float64 for every float, so that a float16 or float32 sum or mean is the float64 answer
    rounded once at the end, whatever the chunk grid; the dtype itself for everything else
    (integer sums are exact in their result dtype already)."""
    return "float64" if is_float(dtype) else dtype


def ufunc_result(ufunc, *dtypes: str) -> str:
    """The dtype NumPy gives when `ufunc` is applied to arrays of `dtypes`."""
    args = [np.zeros((1,), dtype=d) for d in dtypes]
    with np.errstate(all="ignore"):
        return np.dtype(ufunc(*args).dtype).name


def scalar_dtype(value, other: str) -> str:
    """The dtype a Python scalar takes when combined with a tensor of dtype `other` (NEP 50)."""
    if isinstance(value, (bool, np.bool_)):
        return other
    if isinstance(value, (int, np.integer)):
        if other == "bool":
            return "int64"
        if np.dtype(other).kind in "iu":
            info = np.iinfo(other)
            if not info.min <= value <= info.max:
                raise GraphError(f"the scalar {value} does not fit in {other} (range "
                                 f"{info.min}..{info.max}); cast the tensor first")
        return other
    if isinstance(value, (float, np.floating)):
        return other if is_float(other) else "float64"
    raise GraphError(f"cannot use {type(value).__name__} {shown(value)} as a tensor scalar")
