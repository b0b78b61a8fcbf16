"""What the collectives of a step cost on a cluster's links: ring algorithms, as NCCL and
Gloo run them (Patarasuk and Yuan 2009; Thakur et al. 2005).

Over n workers, an all-gather or a reduce-scatter of a tensor of P bytes sends (n-1)/n * P
from each worker and takes n-1 steps; an all-reduce is one of each. A ring over several
hosts runs at the bandwidth of the links between hosts (each GPU has its own, as on DGX
nodes), one inside a host at the host link's.
"""

from __future__ import annotations

from dataclasses import dataclass

from deepx_flow.registry.cluster import ClusterSpec


@dataclass(frozen=True)
class Ring:
    workers: int
    bandwidth: float  # bytes/s each worker sends at
    latency: float    # seconds per step

    @classmethod
    def of(cls, cluster: ClusterSpec) -> "Ring":
        link = cluster.typical_link
        return cls(len(cluster.workers), link.bandwidth, link.latency)

    def sent(self, kind: str, nbytes: float) -> float:
        """Bytes each worker sends for the collective `kind` of a tensor of `nbytes`."""
        n = self.workers
        if n <= 1:
            return 0.0
        share = (n - 1) / n * nbytes
        return {"all_gather": share, "reduce_scatter": share, "all_reduce": 2 * share}[kind]

    def seconds(self, kind: str, nbytes: float) -> float:
        n = self.workers
        if n <= 1:
            return 0.0
        steps = (n - 1) * (2 if kind == "all_reduce" else 1)
        return self.sent(kind, nbytes) / self.bandwidth + steps * self.latency
