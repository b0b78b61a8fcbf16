"""What the collectives of a step cost on a cluster's links, as NCCL runs them on nodes of
several GPUs: hierarchically (Thakur et al. 2005; Patarasuk and Yuan 2009).

Over n = m hosts x g workers each, an all-gather of a tensor of P bytes first gathers across
the hosts, each worker with its peers of the same rank on the others (all hosts' links busy
at once: (m-1)/m * P/g bytes sent by each), then inside each host ((g-1)/g * P over the
host's links); a reduce-scatter is the same in reverse, an all-reduce one of each; in an
all-to-all each worker sends the others their parts of its 1/n. On one host it is a ring
over the host's links; hosts of unequal sizes are one ring over the slower links.
Collectives of small tensors are bucketed, as PyTorch's DDP and FSDP bucket them (25 MiB),
so each tensor pays its share of a bucket's latency.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from deepx_flow.registry.cluster import ClusterSpec

BUCKET = 25 * 2**20
FACTOR = {"all_gather": 1, "reduce_scatter": 1, "all_reduce": 2, "all_to_all": 1}


@dataclass(frozen=True)
class Collectives:
    hosts: int            # m
    per_host: int         # g
    host_bandwidth: float
    host_latency: float
    cluster_bandwidth: float
    cluster_latency: float

    @classmethod
    def of(cls, spec: ClusterSpec) -> "Collectives":
        counts = Counter(w.host for w in spec.workers)
        host, between = spec.link("host"), spec.link("cluster")
        if len(counts) == 1:
            return cls(1, len(spec.workers), host.bandwidth, host.latency, 0.0, 0.0)
        if len(set(counts.values())) > 1:  # one ring over the links between hosts
            return cls(len(spec.workers), 1, 0.0, 0.0, between.bandwidth, between.latency)
        return cls(len(counts), next(iter(counts.values())), host.bandwidth, host.latency,
                       between.bandwidth, between.latency)

    @property
    def workers(self) -> int:
        return self.hosts * self.per_host

    def _parts(self, nbytes: float, kind: str = "all_gather") -> tuple[float, float]:
        """Bytes each worker sends inside its host and between hosts, for an all-gather or
        a reduce-scatter of `nbytes`, or an all-to-all of a tensor of `nbytes` spread over
        the workers (each sends the other workers their parts of its 1/n)."""
        m, g = self.hosts, self.per_host
        if kind == "all_to_all":
            n = m * g
            return nbytes / n * (g - 1) / n, nbytes / n * (n - g) / n
        return (g - 1) / g * nbytes, (m - 1) / m * nbytes / g

    def sent(self, kind: str, nbytes: float) -> float:
        """Bytes each worker sends for the collective `kind` of a tensor of `nbytes`."""
        return FACTOR[kind] * sum(self._parts(nbytes, kind))

    def seconds(self, kind: str, nbytes: float) -> float:
        if self.workers <= 1:
            return 0.0
        inside, between = self._parts(nbytes, kind)
        moving = (inside / self.host_bandwidth if inside else 0.0) + \
            (between / self.cluster_bandwidth if between else 0.0)
        steps = (self.per_host - 1) * self.host_latency + \
            (self.hosts - 1) * self.cluster_latency
        return FACTOR[kind] * (moving + steps * nbytes / BUCKET)
