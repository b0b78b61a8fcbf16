"""The registry centre: memory, compute-storage, operator and network registration."""

from deepx_flow.registry.cluster import (ClusterSpec, DeviceSpec, LinkSpec, WorkerSpec,
                                         load_cluster_file, local_cluster_spec)

__all__ = ["ClusterSpec", "DeviceSpec", "LinkSpec", "WorkerSpec", "load_cluster_file",
           "local_cluster_spec"]
