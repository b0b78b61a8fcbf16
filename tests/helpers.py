"""Helpers shared by the tests: small cluster specs that force chunk grids."""

from __future__ import annotations

from deepx_flow.registry.cluster import ClusterSpec, WorkerSpec


def cluster_with_memory(memory: int, workers: int = 2, threads: int = 1) -> ClusterSpec:
    """A CPU cluster description whose per-task budget is memory * fraction / threads."""
    return ClusterSpec(f"test-{memory}", tuple(
        WorkerSpec(f"w{i}", "localhost", threads, memory) for i in range(workers)))
