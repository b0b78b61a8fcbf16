"""`dx.grad`: gradients as tensors of the same graph.

The gradient tensors are built by the `differentiate` pass (`deepx_flow.compiler`) and are
ordinary tensors: they can be explained, compiled, written as YAML, combined with other
tensors (an optimizer's update) and run like any other.
"""

from __future__ import annotations

from typing import Sequence

from deepx_flow.compiler.differentiate import differentiate, grad_output_name
from deepx_flow.errors import GraphError
from deepx_flow.sdk.build import build_graph, tensors_of
from deepx_flow.sdk.tensor import Tensor, as_tensor


def grad(y: Tensor, wrt: Tensor | Sequence[Tensor], cotangent=None):
    """The gradient of `y` with respect to each tensor of `wrt`.

    Parameters
    ----------
    y : Tensor
        A floating-point scalar (a loss), or any floating-point tensor when `cotangent` is
        given.
    wrt : Tensor or sequence of Tensor
        Floating-point tensors `y` depends on: parameter inputs, or any tensor of its graph.
    cotangent : Tensor, optional
        A tensor of `y`'s shape and dtype: the result is then the vector-Jacobian product
        `sum(cotangent * y)`'s gradient.

    Returns
    -------
    Tensor or list of Tensor
        One gradient per `wrt` tensor, of its shape and dtype (a single tensor for a single
        `wrt`).

    Raises
    ------
    GraphError
        When `y` does not depend on a `wrt` tensor, or only through an operator that has no
        gradient (a comparison, a cast to an integer): the error names that node.
    """
    single = isinstance(wrt, Tensor)
    targets = [wrt] if single else list(wrt)
    for t in [y, *targets]:
        if not isinstance(t, Tensor):
            raise GraphError(f"dx.grad takes dx.Tensors, got a {type(t).__name__}")
    outputs = {"of": y, **{f"wrt{i}": t for i, t in enumerate(targets)}}
    if cotangent is not None:
        outputs["cotangent"] = as_tensor(cotangent, y)
    graph = differentiate(build_graph(outputs), [t.node.id for t in targets], of="of",
                          cotangent=None if cotangent is None else outputs["cotangent"].node.id)
    tensors = tensors_of(graph, list(outputs.values()))
    named = dict(graph.outputs)
    grads = [tensors[named[grad_output_name(t.node.id)]] for t in targets]
    return grads[0] if single else grads
