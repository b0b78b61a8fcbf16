"""The gateway's calls, whatever the transport: each takes the contract's request fields
(graphs as spec objects or JSON text, tensors as arrays) and answers with the contract's
JSON shape, or raises the DeepxError whose text the client is shown. The transports
(`http_app`, `grpc_server`) only decode requests into these calls and encode what they
answer; so HTTP and gRPC say the same things in the same words.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from deepx_flow.contract.tensors import Reference
from deepx_flow.errors import InputError, shown
from deepx_flow.gateway import capabilities as caps
from deepx_flow.gateway.asset_calls import AssetCalls
from deepx_flow.gateway.graphs import analyze, graph_of, spec_document
from deepx_flow.gateway.operations import Operations
from deepx_flow.runtime.progress import run_link


class Gateway:
    """One server's state: its limits, the Dask client it runs on, its operations."""

    def __init__(self, client, db, results: Path, limits: caps.Limits | None = None,
                 models=None):
        self.client, self.db = client, db
        self.models = models  # a serving.ModelRepository, or None
        self.limits = limits or caps.Limits()
        self.operations = Operations(db, results, client)
        self.operations.interrupt_orphaned()
        self.operations.prune()
        self.assets = AssetCalls(db, self.operations, client, self.limits.max_graph_nodes)

    def capabilities(self) -> dict:
        return caps.capabilities(self.limits)

    def _graph(self, spec):
        return graph_of(spec, self.limits.max_graph_nodes)

    def analyze(self, spec) -> dict:
        from deepx_flow.runtime.run import cluster_spec
        return analyze(self._graph(spec), cluster_spec(None, self.client))

    def start(self, spec, inputs: dict, outputs: list | None = None,
              operation_id: str | None = None) -> str:
        """Check the graph and `inputs` (name -> array, or a tensors.Reference to storage)
        and start running it: the operation's id (that of the first, for a request sent
        again with its id)."""
        doc = spec_document(spec)
        graph = self._graph(doc)
        if outputs is not None and (not isinstance(outputs, list)
                                    or not all(isinstance(o, str) for o in outputs)):
            raise InputError(f"outputs is {shown(outputs)}, not a list of output names")
        stored = {name: (self.assets.stored(ref), ref.described())
                  for name, ref in inputs.items() if isinstance(ref, Reference)}
        arrays = {name: a for name, a in inputs.items() if name not in stored}
        op_id, _ = self.operations.execute(graph, doc, arrays, outputs, operation_id, stored)
        return op_id

    async def execute(self, spec, inputs: dict, outputs: list | None = None,
                      wait_seconds: float | None = None,
                      operation_id: str | None = None) -> dict:
        """`start`, then wait up to `wait_seconds` (None: until it ends) without holding a
        thread; the operation as `operation` answers it."""
        wait = checked_wait(wait_seconds)  # before anything starts
        op_id = await asyncio.to_thread(self.start, spec, inputs, outputs, operation_id)
        return await self.operation(op_id, wait)

    async def operation(self, operation_id: str, wait_seconds: float | None = 0.0) -> dict:
        """An operation's state once it ended or `wait_seconds` passed; with its outputs
        (name -> array) once it succeeded."""
        wait = checked_wait(wait_seconds)
        await asyncio.to_thread(self.operations.get, operation_id)  # NotFound, at once
        await self.operations.settled(operation_id, wait)
        found = await asyncio.to_thread(self.operations.get, operation_id)
        return await asyncio.to_thread(self._answer, found)

    async def cancel(self, operation_id: str, wait_seconds: float = 30.0) -> dict:
        """Stop a running operation and wait (up to `wait_seconds`) for it to end: the
        operation without its outputs (one that had ended keeps them: ask for it again)."""
        await asyncio.to_thread(self.operations.cancel, operation_id)
        answer = await self.operation(operation_id, wait_seconds)
        answer.pop("outputs", None)
        return answer

    async def materialize(self, name, partitions=None, force: bool = False,
                          wait_seconds: float | None = None,
                          operation_id: str | None = None, upstream: bool = False) -> dict:
        """Start materializing an asset, then wait as `execute` does; the operation."""
        wait = checked_wait(wait_seconds)
        op_id = await asyncio.to_thread(self.assets.materialize, name, partitions, force,
                                        operation_id, upstream)
        return await self.operation(op_id, wait)

    def runs(self, status: str | None = None, limit: int | None = None) -> dict:
        from deepx_flow.gateway.catalog import list_runs
        return list_runs(self.db, status, limit)

    def run(self, run_id: str) -> dict:
        from deepx_flow.gateway.catalog import get_run
        return get_run(self.db, run_id)

    def registry(self) -> dict:
        from deepx_flow.gateway.catalog import registry
        return registry(self.db, str(self.client.scheduler.address))

    def _answer(self, found) -> dict:
        answer = {"operation": found.id, "state": found.state, "kind": found.kind,
                  "run_id": found.run_id, "created_at": found.created_at,
                  "ended_at": found.ended_at}
        if found.error:
            answer["error"] = found.error
        if found.run_id:
            answer["dashboard"] = run_link(found.run_id)
        progress = self.operations.progress(found)
        if progress is not None:
            answer["progress"] = progress
        summary = self.operations.summary(found)
        if summary is not None:  # a materialization: what it made (also when it failed)
            answer["materialized"] = summary
        elif found.state == "succeeded":
            answer["outputs"] = self.operations.outputs(found)
        return answer


MAX_WAIT_SECONDS = 86_400


def checked_wait(seconds) -> float | None:
    """A wait in seconds: None (until the end), or a number from 0 to a day."""
    if seconds is None:
        return None
    if type(seconds) not in (int, float) or not 0 <= seconds <= MAX_WAIT_SECONDS:
        raise InputError(f"wait_seconds is {shown(seconds)}, not a number of seconds from 0 "
                         f"to {MAX_WAIT_SECONDS:,} (leave it out to wait until the run ends)")
    return float(seconds)
