"""What an operator declares: its kind, shape and dtype rule, engines, cost and fusability.

The compiler never special-cases an operator by name when a declared property will do: the
partitioner reads `kind`, the fuser reads `fusable`, the cost model reads the per-element
figures. `infer` is the operator's type rule: given the node (whose declared shape or dtype
may be None when the graph came from YAML without them) and its input nodes, it returns the
output shape and dtype or raises GraphError naming the node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from deepx_flow.errors import GraphError, closest, shown
from deepx_flow.ir.node import Node

# Kinds, which decide how the partitioner chunks and the lowering tiles an operator.
SOURCE = "source"            # no inputs: input, full, arange, random_*
ELEMENTWISE = "elementwise"  # NumPy broadcasting over operands, one output element per position
MATMUL = "matmul"            # (..., M, K) @ (..., K, N)
REDUCE = "reduce"            # sum/mean/max/min over axes, as tree reductions
AXIS_WHOLE = "axis_whole"    # needs one whole axis in each chunk (softmax, log_softmax)
LAYOUT = "layout"            # moves elements: transpose, reshape, concat, slice
GATHER = "gather"            # elements at indices along an axis read whole: take
WINDOW = "window"            # sliding windows over spatial axes, chunked by batch: conv, pools
INDEXED = "indexed"          # elements written or read at computed positions, chunked as the
#                              operator's `Tiling` says: scatters, take_along_axis, gather_nd
SCAN = "scan"                # running sums along an axis: chunked like the operand, each
#                              chunk scanned with the carry of those before it (cumsum)

InferFn = Callable[[Node, list[Node]], tuple[tuple[int, ...], str]]
# vjp(emit, node, inputs, g) -> one entry per input: a node holding the input's share of
# the cotangent `g` (in the node's shape or the input's; `differentiate` sums it down to the
# input's shape and casts it to its dtype), or None where no gradient flows through that
# input (a where's condition, a cast to an integer). `emit` is a `compiler.emit.Emitter`.
VjpFn = Callable[..., tuple]
Region = tuple[tuple[int, int], ...]  # per axis, [start, stop) of a block of a tensor


@dataclass(frozen=True)
class Tiling:
    """How an INDEXED operator's tasks divide the work, which no kind-wide rule gives.

    Parameters
    ----------
    aligned : callable
        `aligned(node, inputs) -> [(operand position, operand axis, result axis)]`: operand
        axes chunked like result axes (the partitioner joins them where the extents agree;
        elsewhere the lowering assembles what a task reads).
    whole : callable
        `whole(node, inputs) -> result axes` that every task holds whole.
    regions : callable
        `regions(node, inputs, region) -> [operand region]`: what the task computing
        `region` of the result reads of each operand (possibly empty).
    """

    aligned: Callable[[Node, list[Node]], list[tuple[int, int, int]]]
    whole: Callable[[Node, list[Node]], tuple[int, ...]]
    regions: Callable[[Node, list[Node], Region], list[Region]]


@dataclass(frozen=True)
class OpSpec:
    """One registered operator.

    Parameters
    ----------
    name : str
        Operator name as used in nodes and YAML.
    kind : str
        One of the kinds above.
    arity : int or None
        Number of inputs, or None for any number (concat).
    infer : callable
        `infer(node, inputs) -> (shape, dtype)`; raises GraphError on bad operands.
    fusable : bool
        Whether the operator can join a fused elementwise kernel.
    flops_per_element : float
        Arithmetic per output element (per input element for reductions); matmul uses 2*M*N*K.
    temp_bytes_per_element : float
        Scratch memory per output element beyond inputs and output (random tensors hash
        64-bit counters, softmax keeps an exponentiated copy).
    engines : tuple of str
        Engines that implement the operator.
    attrs : tuple of str
        Attribute names the operator accepts.
    compiler_attrs : tuple of str
        Attributes only the compiler writes (a matmul's fused epilogue, a reduction's fused
        prologue): accepted, as a compiled graph is still a graph, but not offered to users.
    doc : str
        One line for `deepx-flow ops`.
    required_attrs : tuple of str
        Attributes that must be present.
    declared : tuple of str
        Which of "shape" and "dtype" the node states rather than derives.
    vjp : callable or None
        The vector-Jacobian rule (see `VjpFn`) the `differentiate` pass applies; None for an
        operator no gradient passes through (comparisons, sources, compiled nodes).
    tiling : Tiling or None
        For INDEXED operators: how their tasks divide the work.
    """

    name: str
    kind: str
    arity: int | None
    infer: InferFn
    fusable: bool = False
    flops_per_element: float = 1.0
    temp_bytes_per_element: float = 0.0
    engines: tuple[str, ...] = ("numpy", "cupy")
    attrs: tuple[str, ...] = ()
    compiler_attrs: tuple[str, ...] = ()
    doc: str = ""
    required_attrs: tuple[str, ...] = field(default=())
    # Which of "shape" and "dtype" the node states (sources, reshape, cast) instead of
    # having them derived from its inputs.
    declared: tuple[str, ...] = ()
    vjp: VjpFn | None = None
    tiling: Tiling | None = None

    def check_arity(self, node: Node) -> None:
        if self.arity is not None and len(node.inputs) != self.arity:
            raise GraphError(f"{self.name} takes {self.arity} input(s), got {len(node.inputs)}",
                             node.id)
        if self.arity is None and not node.inputs and self.name != "fused":
            raise GraphError(f"{self.name} needs at least one input", node.id)
        known = set(self.attrs) | set(self.compiler_attrs)
        for key, _ in node.attrs:
            if key not in known:
                allowed = ", ".join(self.attrs) or "none"
                close = closest(key, self.attrs)
                hint = f"; did you mean {close!r}?" if close is not None else ""
                raise GraphError(f"{self.name} has no attribute {shown(key)} (allowed: "
                                 f"{allowed}){hint}", node.id)
        for key in self.required_attrs:
            if node.attr(key) is None:
                raise GraphError(f"{self.name} needs attribute {shown(key)}", node.id)
