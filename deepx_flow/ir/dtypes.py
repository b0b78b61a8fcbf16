"""Element types of the IR and NumPy's rules for combining them.

Dtypes are kept as NumPy names (`"float32"`), so nodes stay plain data. Result types follow
NumPy exactly (we ask NumPy on one-element arrays), except for Python scalars, which are
"weak" as in NumPy 2 (NEP 50): `x_float32 + 1.0` stays float32.

bfloat16 is a storage type: 8 exponent bits like float32, 8 significant bits. NumPy knows it
through `ml_dtypes` (imported here, which registers the name "bfloat16" with NumPy); its dtype
kind is "V", not "f", so nothing here asks `kind` about floats. Its promotion is NumPy's
float16 rule with bfloat16 in float16's place, which among floats is JAX's and ml_dtypes':
bfloat16 with bfloat16, bool, int8 or uint8 (or a Python int or float) gives bfloat16; with
int16 or uint16 float32; with wider integers float64; with float32 float32, with float64
float64; and with float16 (each lacks the other's range or precision) float32. Arithmetic
on it computes in float32 and rounds once per operator result (`kernels/bfloat16.py`).
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np

from deepx_flow.errors import GraphError, shown

DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "bfloat16", "float32", "float64")
FLOATS = ("float16", "bfloat16", "float32", "float64")
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


# (a NumPy dtype's name, looked up: `np.dtype(x).name` costs 3 us, a serving request's
# answer asks it several times)
_NAME_OF = {np.dtype(n): n for n in DTYPES}


def normalize(dtype, node: str | None = None) -> str:
    """Return the canonical name of `dtype`, or raise GraphError for an unsupported one."""
    if dtype.__class__ is str and dtype in DTYPES:  # a canonical name already (most calls)
        return dtype
    name = _NAME_OF.get(dtype) if isinstance(dtype, np.dtype) else None
    if name is not None:  # (None too for one of another byte order: below)
        return name
    try:
        name = np.dtype(dtype).name
    except Exception:  # NumPy raises TypeError, ValueError, KeyError... for what is no dtype
        name = None
    if name not in DTYPES:
        raise GraphError(f"unsupported dtype {shown(dtype)}; use one of {', '.join(DTYPES)}", node)
    return name


def itemsize(dtype: str) -> int:
    return np.dtype(dtype).itemsize


def is_float(dtype: str) -> bool:
    """Whether `dtype` is a floating-point type (bfloat16 included, whose NumPy kind is V)."""
    if isinstance(dtype, np.dtype) and dtype in _NAME_OF:  # (NumPy's own: looked up)
        return _NAME_OF[dtype] in FLOATS
    return (dtype if dtype.__class__ is str and dtype in DTYPES else np.dtype(dtype).name) \
        in FLOATS


def finfo(dtype: str):
    """Machine limits of a float dtype (`np.finfo`; ml_dtypes' for bfloat16, which NumPy's
    finfo refuses)."""
    return ml_dtypes.finfo(dtype) if np.dtype(dtype) == BFLOAT16 else np.finfo(dtype)


def accumulator(dtype: str) -> str:
    """The dtype that sums of `dtype` add up in, inside each chunk and across the tree:
    float64 for every float, so that a float16 or float32 sum or mean is the float64 answer
    rounded once at the end, whatever the chunk grid; the dtype itself for everything else
    (integer sums are exact in their result dtype already)."""
    return "float64" if is_float(dtype) else dtype


@functools.lru_cache(maxsize=4096)
def ufunc_result(ufunc, *dtypes: str) -> str:
    """The dtype NumPy gives when `ufunc` is applied to arrays of `dtypes`.

    bfloat16 follows NumPy's float16 rule in float16's place (see the module docstring).
    Remembered (a few hundred combinations exist): asking NumPy takes tens of microseconds,
    and typing a graph asks once a node.
    """
    return numpy_result(ufunc, dtypes)


def numpy_result(fn, dtypes, shape: tuple[int, ...] = (1,)) -> str:
    """The dtype of `fn(*arrays)` for arrays of `shape` and `dtypes`, as NumPy computes it.

    bfloat16 is asked as float16, and a float16 answer is bfloat16 again, or float32 where
    float16 and bfloat16 meet: NumPy's float16 rule with bfloat16 in float16's place (see the
    module docstring). ml_dtypes' own loops agree where they exist, but some give float32
    (its matmul) and it has no promotion with float16 at all.
    """
    names = [np.dtype(d).name for d in dtypes]
    args = [np.ones(shape, dtype="float16" if d == "bfloat16" else d) for d in names]
    with np.errstate(all="ignore"):
        result = np.dtype(fn(*args).dtype).name
    if "bfloat16" in names and result == "float16":
        return "float32" if "float16" in names else "bfloat16"
    return result


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
