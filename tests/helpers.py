"""Helpers shared by the tests: small cluster specs that force chunk grids, a free port."""

from __future__ import annotations

import socket

from deepx_flow.registry.cluster import ClusterSpec, WorkerSpec


def cluster_with_memory(memory: int, workers: int = 2, threads: int = 1) -> ClusterSpec:
    """A CPU cluster description whose per-task budget is memory * fraction / threads."""
    return ClusterSpec(f"test-{memory}", tuple(
        WorkerSpec(f"w{i}", "localhost", threads, memory) for i in range(workers)))


def free_port() -> int:
    """A loopback port nothing listens on now (bound once, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
