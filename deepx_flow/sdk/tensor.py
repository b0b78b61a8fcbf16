"""The `Tensor` handle users build graphs with.

A Tensor wraps one IR node and remembers the tensors it was built from, the way micrograd's
`Value` does, so a graph is collected by walking back from its outputs. Shape and dtype are
known as soon as a tensor is built: every operator's type rule runs at once, and mistakes are
reported at the line that made them. Python operators map onto the IR operators, and NumPy's
functions onto them too (`sdk/numpy_dispatch.py`).

An input node may carry the data bound to it (`data`, a `sdk.bindings.Binding`): a NumPy
array used as an operand (`t + array`) or a dask array (`dx.from_dask`). The node itself stays
plain data, an ordinary input that YAML writes as one; `dx.run` binds what the tensors carry.
A Tensor is lazy, so NumPy may never turn it into an array behind the user's back:
`np.asarray(t)` and `list(t)` fail at once, naming `dx.run` (NumPy would otherwise iterate
it element by element through `__getitem__`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from deepx_flow.compiler.infer import new_node
from deepx_flow.errors import GraphError, no_attribute
from deepx_flow.ir import dtypes
from deepx_flow.ir.node import Node


class Tensor:
    """A lazy tensor: one node of a graph, with its shape and dtype.

    Build tensors with `dx.input`, the constant and random constructors and the operators;
    compute them with `dx.run` or `dx.persist`.
    """

    __slots__ = ("node", "parents", "name", "data")
    __array_priority__ = 100  # so numpy_scalar + tensor defers to Tensor.__radd__

    def __init__(self, node: Node, parents: tuple["Tensor", ...] = (), name: str | None = None,
                 data=None):
        self.node = node
        self.parents = parents
        self.name = name
        self.data = data  # the Binding of an input node that carries its data, else None

    def __getattr__(self, name: str):
        # Python calls this only for a name the tensor does not have: say which was meant.
        raise no_attribute("Tensor", name, dir(type(self)))

    # -- description -------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self.node.shape

    @property
    def dtype(self) -> str:
        return self.node.dtype

    @property
    def ndim(self) -> int:
        return len(self.node.shape)

    @property
    def size(self) -> int:
        return self.node.size

    @property
    def nbytes(self) -> int:
        return self.size * dtypes.itemsize(self.dtype)

    def named(self, name: str) -> "Tensor":
        """The same tensor, with the name it takes as a graph output."""
        return Tensor(self.node, self.parents, name, self.data)

    def __repr__(self) -> str:
        label = f" '{self.name}'" if self.name else ""
        return f"<Tensor{label} {self.node.op} shape={self.shape} dtype={self.dtype}>"

    def _repr_html_(self) -> str:
        from deepx_flow.sdk.display import tensor_html
        return tensor_html(self)

    def compute(self, **kwargs):
        """This tensor computed, as a NumPy array: `dx.run(self, **kwargs)`, as Dask's
        `.compute()`.

        Parameters
        ----------
        **kwargs
            Passed to `dx.run`: `inputs=`, `client=`, `scheduler=`, `cluster=`,
            `progress=`, `recovery=`. Data the tensor's graph carries (`dx.from_dask`
            arrays, NumPy operands) is bound without being named in `inputs`.
        """
        from deepx_flow.sdk.run import run
        return run(self, **kwargs)

    # -- NumPy's protocols --------------------------------------------------------------
    def __array__(self, dtype=None, copy=None):
        from deepx_flow.sdk.numpy_dispatch import refuse_conversion
        refuse_conversion(self, "np.asarray")

    def __iter__(self):
        from deepx_flow.sdk.numpy_dispatch import refuse_conversion
        refuse_conversion(self, "iterating over it")

    def __float__(self):
        from deepx_flow.sdk.numpy_dispatch import refuse_conversion
        refuse_conversion(self, "float()")

    def __int__(self):
        from deepx_flow.sdk.numpy_dispatch import refuse_conversion
        refuse_conversion(self, "int()")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        from deepx_flow.sdk.numpy_dispatch import array_ufunc
        return array_ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        from deepx_flow.sdk.numpy_dispatch import array_function
        return array_function(func, types, args, kwargs)

    def __bool__(self):
        raise GraphError("a Tensor has no truth value while the graph is being built; use "
                         "dx.where for choices", self.node.id)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    # -- arithmetic ---------------------------------------------------------------------
    def __add__(self, other): return binary("add", self, other)
    def __radd__(self, other): return binary("add", other, self)
    def __sub__(self, other): return binary("sub", self, other)
    def __rsub__(self, other): return binary("sub", other, self)
    def __mul__(self, other): return binary("mul", self, other)
    def __rmul__(self, other): return binary("mul", other, self)
    def __truediv__(self, other): return binary("div", self, other)
    def __rtruediv__(self, other): return binary("div", other, self)
    def __pow__(self, other): return binary("pow", self, other)
    def __rpow__(self, other): return binary("pow", other, self)
    def __neg__(self): return apply("neg", [self])
    def __abs__(self): return apply("abs", [self])
    def __pos__(self): return self
    def __lt__(self, other): return binary("lt", self, other)
    def __le__(self, other): return binary("le", self, other)
    def __gt__(self, other): return binary("gt", self, other)
    def __ge__(self, other): return binary("ge", self, other)
    def __eq__(self, other): return binary("eq", self, other)  # type: ignore[override]
    def __ne__(self, other): return binary("ne", self, other)  # type: ignore[override]
    __hash__ = object.__hash__

    def __matmul__(self, other):
        from deepx_flow.sdk.functions import matmul
        return matmul(self, other)

    def __rmatmul__(self, other):
        from deepx_flow.sdk.functions import matmul
        return matmul(other, self)

    def __getitem__(self, index):
        from deepx_flow.sdk.indexing import getitem
        return getitem(self, index)

    # -- methods that mirror the functions ----------------------------------------------
    def astype(self, dtype) -> "Tensor":
        from deepx_flow.sdk.functions import cast
        return cast(self, dtype)

    def sum(self, axis=None, keepdims=False): return reduce_("sum", self, axis, keepdims)
    def mean(self, axis=None, keepdims=False): return reduce_("mean", self, axis, keepdims)
    def prod(self, axis=None, keepdims=False): return reduce_("prod", self, axis, keepdims)
    def max(self, axis=None, keepdims=False): return reduce_("max", self, axis, keepdims)
    def min(self, axis=None, keepdims=False): return reduce_("min", self, axis, keepdims)

    def argmax(self, axis=None, keepdims=False) -> "Tensor":
        from deepx_flow.sdk.functions import argmax
        return argmax(self, axis, keepdims)

    def argmin(self, axis=None, keepdims=False) -> "Tensor":
        from deepx_flow.sdk.functions import argmin
        return argmin(self, axis, keepdims)

    def reshape(self, *shape) -> "Tensor":
        from deepx_flow.sdk.functions import reshape
        return reshape(self, shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list))
                       else shape)

    def transpose(self, *axes) -> "Tensor":
        from deepx_flow.sdk.functions import transpose
        return transpose(self, axes[0] if len(axes) == 1 and (
            axes[0] is None or isinstance(axes[0], (tuple, list))) else (axes or None))

    @property
    def T(self) -> "Tensor":
        return self.transpose()


def apply(op: str, inputs: list[Tensor], shape=None, dtype=None, **attrs: Any) -> Tensor:
    """Build the node for `op` over `inputs`, run its type rule and wrap it in a Tensor."""
    try:
        node = new_node(op, [t.node for t in inputs], shape, dtype, **attrs)
    except GraphError as err:
        # Name the operands, since the new node has no id a user would recognise yet.
        operands = ", ".join(f"{t.node.id}{t.shape}" for t in inputs) or "no inputs"
        raise GraphError(f"{err} (operands: {operands})") from None
    return Tensor(node, tuple(inputs))


def as_tensor(value, like: Tensor | None = None) -> Tensor:
    """A Tensor as is; a Python scalar as a 0-d constant typed like `like` (NEP 50), a NumPy
    scalar as one of its own dtype; a NumPy array as a constant input carrying the array
    (`sdk.bindings.constant`)."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]  # a NumPy scalar: of its own dtype, as NEP 50 has 0-d arrays
    if isinstance(value, np.generic):
        dtype = dtypes.normalize(value.dtype)
        return apply("full", [], shape=(), dtype=dtype, value=value.item())
    if isinstance(value, (bool, int, float)):
        other = like.dtype if like is not None else (
            "bool" if isinstance(value, bool) else
            "int64" if isinstance(value, int) else "float64")
        return apply("full", [], shape=(), dtype=dtypes.scalar_dtype(value, other), value=value)
    if isinstance(value, np.ndarray):
        from deepx_flow.sdk.bindings import constant
        return constant(value)
    raise GraphError(f"cannot use {type(value).__name__} as a tensor operand")


def binary(op: str, a, b) -> Tensor:
    like = a if isinstance(a, Tensor) else b
    return apply(op, [as_tensor(a, like), as_tensor(b, like)])


def reduce_(op: str, x: Tensor, axis=None, keepdims: bool = False) -> Tensor:
    from deepx_flow.ops.common import flag, normalize_axes
    try:
        axes = normalize_axes(Node(f"new {op}", op, (), x.shape, x.dtype), axis, x.ndim)
        keepdims = flag(keepdims, f"{op}: keepdims")
    except GraphError as err:
        raise GraphError(f"{err} (operand: {x.node.id}{x.shape})") from None
    return apply(op, [x], axes=axes, keepdims=keepdims)
