"""The intermediate representation: one frozen node type and immutable graphs of them."""

from deepx_flow.ir.graph import Graph
from deepx_flow.ir.node import Node, make_id

__all__ = ["Graph", "Node", "make_id"]
