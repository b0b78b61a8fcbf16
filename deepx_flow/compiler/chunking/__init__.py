"""The partitioner's rules: how each kind of operator is chunked, one file per kind.

A rule (`rule.py`) says which axes of a node are chunked alike with its operands' (step 1 of
`compiler/partition.py`), which must stay whole, what sets its tasks' memory, which axes it
sums over, and how many tasks and chunks it makes. The partitioner asks the rule of each
node and branches on no kind itself. The rules live in the compiler, beside the costs they
read (`compiler/costs.py`); the operators (`ops/`) stay plain descriptions.

A new kind of operator is a new rule registered here; an operator of a kind that needs more
than its kind's rule (reshape, concat and transpose among the layouts) is registered by name.
"""

from __future__ import annotations

from deepx_flow.compiler.chunking.axis_whole import AxisWhole
from deepx_flow.compiler.chunking.elementwise import Elementwise
from deepx_flow.compiler.chunking.gather import Gather
from deepx_flow.compiler.chunking.indexed import Indexed
from deepx_flow.compiler.chunking.layout import Concat, Layout, Reshape, Transpose
from deepx_flow.compiler.chunking.matmul import Matmul
from deepx_flow.compiler.chunking.reduce import Reduce
from deepx_flow.compiler.chunking.rule import Chunking, Rule
from deepx_flow.compiler.chunking.scan import Scan
from deepx_flow.compiler.chunking.source import Source
from deepx_flow.compiler.chunking.window import Window
from deepx_flow.ir import Node
from deepx_flow.ops import (AXIS_WHOLE, ELEMENTWISE, GATHER, INDEXED, LAYOUT, MATMUL, REDUCE,
                            SCAN, SOURCE, WINDOW, get_op)

BY_KIND: dict[str, Rule] = {
    SOURCE: Source(), ELEMENTWISE: Elementwise(), MATMUL: Matmul(), REDUCE: Reduce(),
    AXIS_WHOLE: AxisWhole(), SCAN: Scan(), LAYOUT: Layout(), GATHER: Gather(),
    WINDOW: Window(), INDEXED: Indexed(),
}
BY_OP: dict[str, Rule] = {"transpose": Transpose(), "reshape": Reshape(), "concat": Concat()}


def rule_for(node: Node) -> Rule:
    """The rule that chunks `node`."""
    return BY_OP.get(node.op) or BY_KIND[get_op(node.op).kind]


def task_count(kind: str, n_main: int, n_out: int, fanin: int, along: int = 1) -> int:
    """Tasks of a node of `kind`: its `n_main` main tasks (one per chunk of the result; per
    chunk of the reduced space for a reduction; per tile and K chunk for a matmul) and, for
    reductions and matmuls whose main tasks leave several partials per result chunk, the
    tree that combines them (`fanin` at a time) and one finishing task per result chunk.
    A scan with `along` chunks along its axis adds its totals and carries (`scan.py`)."""
    return BY_KIND[kind].task_count(n_main, n_out, fanin, along)


__all__ = ["BY_KIND", "BY_OP", "Chunking", "Rule", "rule_for", "task_count"]
