"""Data that tensors carry to their run: NumPy arrays used as operands, and dask arrays.

A graph's nodes are plain data (YAML writes them), so an array can only enter a graph as an
input node whose data is bound when it runs. For the data a user hands to the graph builder
itself, the tensor of that input node carries the data (`Tensor.data`, a `Binding`), and
`dx.run` binds it without being told: `bound_inputs(outputs)` collects the bindings behind a
run's outputs, and `with_bound_inputs` puts them under the inputs the run was given (which
win, so a run may bind other data to the same input).

- `constant(array)`: an input named `const_<token of the array's contents>`, carrying a copy
  of the array (taken when the tensor is built, so a later change to the array changes
  nothing). It travels inside the task graph at run time, as a NumPy input does.
- An imported ONNX model's large weights (`onnx/values.py`): an input carrying the path of
  a `.npy` file holding it, which each task reads its region of where it runs
  (`carried_array` loads it whole, for what needs the array itself: an export, a package).
- `dx.from_dask(array)` (`sdk/dask_interop.py`): an input named after the dask array (or as
  asked), carrying the dask array, whose graph joins the run's (`runtime/inputs.py`).

Written as YAML, both are ordinary inputs: the data is supplied again at run time
(`dx.run(graph, inputs={"const_...": array})`), as for any input.
"""

from __future__ import annotations

import numpy as np

from deepx_flow.compiler.infer import infer_node
from deepx_flow.errors import GraphError
from deepx_flow.ir import dtypes
from deepx_flow.ir.node import Node
from deepx_flow.runtime.inputs import Binding, checked_inputs
from deepx_flow.sdk.tensor import Tensor


def carried_array(binding: Binding):
    """The data a Binding carries, a `.npy` file's read whole into a NumPy array."""
    if isinstance(binding.value, str):
        from deepx_flow.storage.readers import array_info, read_region
        shape, _ = array_info(binding.value)
        return np.asarray(read_region(binding.value, tuple((0, n) for n in shape)))
    return binding.value


def constant(array: np.ndarray) -> Tensor:
    """A NumPy array as a graph tensor: an input named by the array's contents that carries
    a copy of it (see the module docstring)."""
    from dask.base import tokenize
    dtype = dtypes.normalize(array.dtype)
    array = np.array(array, order="C", copy=True)
    token = tokenize(array)
    node = Node(f"const_{token[:16]}", "input", (), tuple(int(s) for s in array.shape), dtype)
    return Tensor(infer_node(node, []), (), None, Binding(array, token))


def bound_tensor(node: Node, value, token: str, name: str | None = None) -> Tensor:
    """A tensor of the input `node` carrying `value` (identified by `token`)."""
    return Tensor(infer_node(node, []), (), name, Binding(value, token))


def bound_inputs(outputs) -> dict[str, Binding]:
    """Input name -> the Binding that the tensors behind `outputs` carry (a Tensor, a list or
    dict of them; a Graph carries none). Two different data bound to one input name are a
    GraphError naming it."""
    roots = [outputs] if isinstance(outputs, Tensor) else \
        list(outputs.values()) if isinstance(outputs, dict) else \
        list(outputs) if isinstance(outputs, (list, tuple)) else []
    found: dict[str, Binding] = {}
    seen: set[int] = set()
    stack = [t for t in roots if isinstance(t, Tensor)]
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        if t.data is not None:
            other = found.setdefault(t.node.id, t.data)
            if other.token != t.data.token:
                raise GraphError(f"two different {other.kind}s are bound to input "
                                 f"'{t.node.id}'; give each from_dask array its own name",
                                 t.node.id)
        stack.extend(t.parents)
    return found


def with_bound_inputs(outputs, inputs: dict | None) -> dict:
    """`inputs` over the data the tensors behind `outputs` carry (`bound_inputs`): what a run
    binds. Bindings stay `Binding`s, which `runtime.inputs.bind_inputs` takes with their
    tokens (no second hash of the data)."""
    merged: dict = dict(bound_inputs(outputs))
    merged.update(checked_inputs(inputs))
    return merged
