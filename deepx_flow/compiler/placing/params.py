"""The trained parameters of a step graph, as the placement pass sees them: their size, how
many optimizer state tensors each has, and the matmuls that use each as their weight."""

from __future__ import annotations

import math
from dataclasses import dataclass

from deepx_flow.ir import Graph, dtypes


@dataclass(frozen=True)
class WeightUse:
    """A matmul `x @ w` that reads the parameter as `w` (K, N): `rows` rows of x (every axis
    of x but K) in the step's whole batch, and the activations' item size."""

    rows: int
    k: int
    n: int
    itemsize: int


@dataclass(frozen=True)
class TrainedParameter:
    name: str       # the user's name ("0.weight")
    node: str       # its placeholder in the step graph
    shape: tuple[int, ...]
    dtype: str
    state_slots: int  # optimizer state tensors of its shape (Adam: 2)
    uses: tuple[WeightUse, ...]  # matmuls reading it as their weight (forward only)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * dtypes.itemsize(self.dtype)

    @property
    def copies(self) -> int:
        """Tensors of its size a worker keeps per copy: itself, its gradient, its state."""
        return 2 + self.state_slots

    @property
    def kept_between_steps(self) -> int:
        """Tensors of its size kept from step to step: itself and its state. A parameter in
        pieces has its gradient's piece only for a moment, from the layer's backward pass to
        its update (the step's tasks update each piece as soon as its gradient is summed)."""
        return 1 + self.state_slots


def trained_parameters(graph: Graph, params: dict[str, str], state: dict[str, str]
                       ) -> list[TrainedParameter]:
    """`params`: user name -> placeholder id; `state`: "slot/name" -> placeholder id."""
    slots: dict[str, int] = {}
    for key in state:
        name = key.split("/", 1)[1]
        slots[name] = slots.get(name, 0) + 1
    users = graph.consumers()
    out = []
    for name, node_id in params.items():
        node = graph[node_id]
        uses = []
        for user in users[node_id]:
            u = graph[user]
            if u.op == "matmul" and len(u.inputs) >= 2 and u.inputs[1] == node_id \
                    and node.ndim == 2 and u.inputs[0] != node_id:
                x = graph[u.inputs[0]]
                uses.append(WeightUse(math.prod(x.shape[:-1]), node.shape[0], node.shape[1],
                                      dtypes.itemsize(x.dtype)))
        out.append(TrainedParameter(name, node_id, tuple(node.shape), node.dtype,
                                    slots.get(name, 0), tuple(uses)))
    return out
