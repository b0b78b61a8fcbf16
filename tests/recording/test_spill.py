"""Chunks a worker spills to its disk show as "spilled" (tier disk) in the placement table,
and as held in memory again once read back."""

from __future__ import annotations

import logging
import time

from distributed import Client, LocalCluster

import deepx_flow as dx
from deepx_flow.meta import open_db
from deepx_flow.meta.db import close_all
from deepx_flow.registry.cluster import ClusterSpec, WorkerSpec


def _spilled_keys(dask_worker):
    return [list(k) for k in dask_worker.data.slow]


def test_spilled_chunks_are_recorded(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'spill.db'}"
    monkeypatch.setenv("DEEPX_DB_URL", url)
    # One worker whose managed memory passes its spill target (60% of 1 GiB) long before
    # the 800 MiB tensor is all in: chunks of at most 64 MiB (the plan's 128 MiB budget).
    spec = ClusterSpec("spill-test", (WorkerSpec("w0", "localhost", 1, 2**28),))
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, memory_limit="1GiB",
                      dashboard_address="127.0.0.1:0", silence_logs=logging.CRITICAL,
                      local_directory=str(tmp_path)) as cluster, Client(cluster) as client:
        x = dx.persist(dx.random.uniform((100, 2**20), seed=4, dtype="float64"),
                       client=client, cluster=spec).wait()
        deadline = time.monotonic() + 30
        while True:  # the spill reporter looks once a second
            spilled = {tuple(k) for keys in client.run(_spilled_keys).values() for k in keys}
            rows = dx.placement(x).rows
            recorded = {r.chunk for r in rows if r.state == "spilled"}
            if spilled and recorded == {",".join(map(str, k[1:])) for k in spilled}:
                break
            assert time.monotonic() < deadline, (spilled, [(r.chunk, r.state) for r in rows])
            time.sleep(0.3)
        assert all(r.tier == "disk" for r in rows if r.state == "spilled")
        assert all(r.tier == "host" for r in rows if r.state == "memory")
        # The values are intact (reading them back unspills some chunks).
        got = x.to_numpy()
        assert got.shape == (100, 2**20) and 0 <= got.min() and got.max() < 1
        x.release()
    close_all()
    assert open_db(url)  # the file is a valid database after the cluster went away
