"""A chunk of a stored asset lost with its worker is read back from storage when that is
cheaper than computing its lineage again (and computed again with `read_back=False`).

The stage: asset `a` (a matmul of two random matrices plus a function of the first, written
to Zarr chunk by chunk; read by two operators, the first's blocks are tasks of their own,
which the test counts) and asset `b` (reads `a`). One task of `b` hangs on each worker, so chunks of `a` stay in
memory, still needed, after they were written; then the worker holding most of them is
killed.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections import Counter

import numpy as np
import pytest
from distributed import Client, LocalCluster
from sqlmodel import select

import deepx_flow as dx
from deepx_flow.ir.keys import node_of
from deepx_flow.kernels.faults import Fault, FaultInjection
from deepx_flow.meta import open_db
from deepx_flow.meta.models import Event, Task
from tests.helpers import assert_sums_close

ROWS, INNER, COLS = 8192, 2048, 128  # `a`: 8 row blocks of 1 MiB, each 16 MiB of lineage
A_NODE = ("matmul", "add")  # the node of `a`'s chunks: a matmul with the add fused into it


def definitions():
    @dx.asset
    def a():
        x = dx.random.normal((ROWS, INNER), seed=1, dtype="float64")
        w = dx.random.normal((INNER, COLS), seed=2, dtype="float64")
        return x @ w + dx.tanh(x[:, :COLS])

    @dx.asset
    def b(a):
        return dx.tanh(a).sum(axis=1)
    return dx.Definitions([a, b])


def _pid():
    return os.getpid()


def held_chunks(dask_scheduler=None):
    """(key, state, holders, has waiters) of the chunks of a; states of the writes of a."""
    chunks, writes = [], []
    for key, ts in dask_scheduler.tasks.items():
        if not isinstance(key, tuple):
            continue
        if key[0].startswith(A_NODE):
            chunks.append((key, ts.state, sorted(w.address for w in ts.who_has or ()),
                           bool(ts.waiters)))
        elif key[0].startswith("store-a-"):
            writes.append(ts.state)
    return chunks, writes


def workers(dask_scheduler=None) -> set:
    return set(dask_scheduler.workers)


def lose_chunks_of_a(client, read_back: bool):
    """Materialize with one worker killed while it holds written chunks of `a` that hung
    tasks of `b` still need. Returns the run."""
    client.register_plugin(FaultInjection([Fault("hang", node="sum", times=1)]))
    done, failed = {}, []

    def materialize():
        try:
            # No backups: on a busy machine the hung task's backup won, its inputs were
            # then no longer needed, and the killed worker lost nothing to read back.
            done["result"] = dx.materialize(definitions(), client=client,
                                            recovery=dx.Recovery(read_back=read_back,
                                                                 speculate=False))
        except BaseException as err:
            failed.append(err)
    thread = threading.Thread(target=materialize)
    thread.start()
    try:
        deadline, victim = time.monotonic() + 120, None
        while victim is None and time.monotonic() < deadline and thread.is_alive():
            chunks, writes = client.run_on_scheduler(held_chunks)
            if writes and all(s == "memory" for s in writes):
                # The worker holding the most chunks still needed (and only there).
                holders = Counter(c[2][0] for c in chunks
                                  if c[1] == "memory" and c[3] and len(c[2]) == 1)
                victim = holders.most_common(1)[0][0] if holders else None
            time.sleep(0.05)
        assert victim is not None, "no written chunk of a stayed in memory for a hung task"
        os.kill(client.run(_pid, workers=[victim])[victim], signal.SIGKILL)
        # Once the scheduler has removed the worker, what it lost is being read back or
        # computed again: the decision is taken as the worker is removed.
        while time.monotonic() < deadline and victim in client.run_on_scheduler(workers):
            time.sleep(0.05)
    finally:
        release_hung_tasks(client)
        thread.join(180)
    assert not failed, failed
    return done["result"]


def release_hung_tasks(client) -> None:
    """Remove the faults (the hung tasks go on); a worker that just died can make the
    broadcast fail once."""
    for attempt in range(5):
        try:
            client.unregister_worker_plugin(FaultInjection.name)
            return
        except OSError:  # CommClosedError
            time.sleep(1.0)
    client.unregister_worker_plugin(FaultInjection.name)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("read_back", [True, False], ids=["read-back", "recompute"])
def test_a_lost_stored_chunk_is_read_back_instead_of_computed_again(read_back, tmp_path,
                                                                    monkeypatch):
    monkeypatch.setenv("DEEPX_ASSET_ROOT", str(tmp_path / "assets"))
    db = open_db()
    with LocalCluster(n_workers=3, threads_per_worker=2, processes=True,
                      memory_limit="200MiB", dashboard_address="127.0.0.1:0",
                      silence_logs=logging.CRITICAL) as cluster, Client(cluster) as client:
        done = lose_chunks_of_a(client, read_back)
        x = dx.run(dx.random.normal((ROWS, INNER), seed=1, dtype="float64"), client=client)
        w = dx.run(dx.random.normal((INNER, COLS), seed=2, dtype="float64"), client=client)
        a = dx.run(dx.load("a"), client=client)
        b = dx.run(dx.load("b"), client=client)
    want = x @ w + np.tanh(x[:, :COLS])
    assert_sums_close(a, want, np.abs(x) @ np.abs(w) + np.abs(np.tanh(x[:, :COLS])))
    assert_sums_close(b, np.tanh(want).sum(axis=1), np.abs(np.tanh(want)).sum(axis=1))

    with db.read() as s:
        events = s.exec(select(Event).where(Event.run_id == done.run_id)).all()
        tasks = s.exec(select(Task).where(Task.run_id == done.run_id)).all()
    assert any(e.kind == "worker-lost" for e in events)
    read = {e.key for e in events if e.kind == "read-back"}
    made = Counter((t.tensor, t.key) for t in tasks if t.status == "memory")
    again = {key for (tensor, key), n in made.items()
             if n > 1 and node_of(tensor).startswith(A_NODE)}

    def block_of(key):  # "('matmul-..@..', 3, 0)" -> "3, 0)"
        return key.split(", ", 1)[1]
    # x's blocks (8 of them; w has 1): each chunk of `a` needs one.
    x_tensor = Counter(tensor for tensor, _ in made
                       if node_of(tensor).startswith("random_normal")).most_common(1)[0][0]
    x_runs = {block_of(key): n for (tensor, key), n in made.items() if tensor == x_tensor}
    if read_back:
        # A lost chunk read back ran twice (the second time a read); its x block once.
        assert read and read == again, ([(e.kind, e.key) for e in events], again)
        assert all("reading it back about" in e.message for e in events
                   if e.kind == "read-back")
        assert [x_runs[block_of(k)] for k in read] == [1] * len(read)
    else:
        # Computed again, with the x block under it.
        assert again and not read and not [e for e in events if e.kind == "recompute"]
        assert [x_runs[block_of(k)] for k in again] == [2] * len(again)
