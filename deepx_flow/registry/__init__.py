"""The registry centre: memory, compute-storage, operator and network registration.

- `cluster.py`: ClusterSpec (what the compiler plans with), cluster files;
- `live.py`: the spec of a running Dask cluster, from a probe on each worker;
- `storage_tiers.py`: the storage tiers a worker reports (device, host, disk, object);
- `register.py`: `register_cluster(client, db)`, the same recorded in the metadata database,
  with measured links;
- `heartbeat.py`: which registered workers are alive (the rule readers apply), and the
  heartbeat by which a driver keeps the cluster it holds seen, and marks it gone at its end;
- `network.py`: `probe_network(client, db)`, bandwidth and latency between worker pairs;
- `operators.py`: built-in operators and those of `deepx_flow.kernels` entry points.

Only `cluster.py` is imported here: the others need Dask or the database.
"""

from deepx_flow.registry.cluster import (ClusterSpec, DeviceSpec, LinkSpec, WorkerSpec,
                                         load_cluster_file, local_cluster_spec)

__all__ = ["ClusterSpec", "DeviceSpec", "LinkSpec", "WorkerSpec", "load_cluster_file",
           "local_cluster_spec"]
