"""Sources (inputs, stored arrays, constants, random tensors): no operands to join. A source
read by nodes that share its axes takes their grid: splitting a cheap source for its own
sake would only cut its users' tiles smaller. A stored array (`read_zarr` with
`storage_chunks`) reads fastest in its own chunks."""

from __future__ import annotations

from deepx_flow.compiler.chunking.rule import Rule


class Source(Rule):
    follows_users = True

    def stored_chunks(self, node):
        store = node.attr("storage_chunks") if node.op == "read_zarr" else None
        return tuple(store) if store else None
