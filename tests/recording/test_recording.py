"""Runs record themselves: the run row, one task row per Dask task, and chunk placements that
agree with the scheduler's own `who_has`, on SQLite and PostgreSQL."""

from __future__ import annotations

import logging
import signal
import time

import numpy as np
import pytest
from distributed import Client, LocalCluster, wait

import deepx_flow as dx
from deepx_flow.meta import open_db, queries
from deepx_flow.meta.db import close_all
from deepx_flow.compiler.inline import inlined_nodes
from deepx_flow.runtime.inputs import bind_inputs
from deepx_flow.spec.yaml_io import from_yaml


@pytest.fixture(scope="module")
def client3p():
    """Three worker processes, as on a real node (placement is per process)."""
    with LocalCluster(n_workers=3, threads_per_worker=1, processes=True,
                      memory_limit="1GiB", dashboard_address="127.0.0.1:0",
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as c:
        yield c


@pytest.fixture
def record_db(db_url, monkeypatch):
    """Runs in this test record into the fresh database at `db_url`."""
    monkeypatch.setenv("DEEPX_DB_URL", db_url)
    yield open_db(db_url)
    close_all()


@pytest.fixture
def no_record_warnings(caplog):
    """Recording logs (never raises) its failures; a test fails on any."""
    caplog.set_level(logging.WARNING, logger="deepx_flow.runtime.recording")
    yield
    assert not [r for r in caplog.records if r.name == "deepx_flow.runtime.recording"]


def _held(rows):
    return {(r.chunk, r.worker) for r in rows}


def _who_has(client, persisted):
    return {(",".join(str(i) for i in key[1:]), worker)
            for key, workers in client.who_has(persisted.futures).items() for worker in workers}


def test_placement_agrees_with_who_has(client3p, record_db, no_record_warnings):
    x = dx.random.normal((1200, 900), seed=3)
    h = dx.tanh(x) * 2.0
    outs = dx.persist({"h": h, "s": h.sum(axis=1), "t": h.T + 1.0}, client=client3p)
    for p in outs.values():
        p.wait()
        rows = dx.placement(p).rows
        n_chunks = int(np.prod([len(c) for c in p.chunks]))
        assert len({r.chunk for r in rows}) == n_chunks  # every chunk has a row
        assert _held(rows) == _who_has(client3p, p)
        assert all(r.state == "memory" and r.nbytes > 0 and r.tier == "host" for r in rows)

    # A later run reads `h` on other workers: the copies transfers made are recorded too.
    both = dx.persist(dx.input("a", h.shape, h.dtype) @ dx.input("b", (900, 400), "float32"),
                      inputs={"a": outs["h"],
                              "b": dx.persist(dx.random.uniform((900, 400), seed=1),
                                              client=client3p).wait()}, client=client3p)
    both.wait()
    assert _held(dx.placement(outs["h"]).rows) == _who_has(client3p, outs["h"])

    key = outs["t"].key
    outs["t"].release()
    assert dx.placement(key).rows == []
    released = queries.placements(record_db, tensor=key, current=False)
    assert released and {r.state for r in released} == {"released"}


def test_run_and_task_rows(client3p, record_db, no_record_warnings):
    x = dx.input("x", (3000, 500), "float32")
    y = dx.relu(x @ dx.random.normal((500, 64), seed=0) + 1.0).sum(axis=1)
    xv = np.random.default_rng(0).standard_normal((3000, 500), dtype="float32")
    dx.run(y, inputs={"x": xv}, client=client3p)

    (run,) = queries.list_runs(record_db)
    plan = dx.compile(y, client=client3p)
    lowered = plan.lower(bind_inputs(plan.graph, {"x": xv}))
    assert run.status == "succeeded" and run.kind == "run" and run.error is None
    assert run.n_tasks == len(lowered.dsk) and run.n_workers == 3
    assert run.ended_at >= run.started_at and "compute/communication" in run.explain
    # The stored YAML is the graph that ran.
    with record_db.session() as session:
        from deepx_flow.meta.models import GraphRecord
        stored = session.get(GraphRecord, run.graph_hash)
    assert from_yaml(stored.yaml) == plan.graph

    tasks = queries.run_tasks(record_db, run.id)
    assert sorted(t.key for t in tasks) == sorted(str(k) for k in lowered.dsk)
    workers = set(client3p.scheduler_info()["workers"])
    for t in tasks:
        assert t.worker in workers and t.status == "memory" and t.attempts == 1
        assert t.start <= t.stop and t.bytes_out > 0
    # w is read inside the matmul's tasks (one tile along N): no task of its own.
    assert {t.operator for t in tasks} == {"input", "sum"} | {
        t.operator for t in tasks if t.operator.startswith("matmul+epilogue[")}
    assert any(t.operator.startswith("matmul+epilogue[") for t in tasks)
    w_node = next(n.id for n in plan.fused.nodes if n.op == "random_normal")
    assert [w_node] == [i for ids in inlined_nodes(lowered.dsk, plan.fused).values()
                        for i in ids]
    # dx.run gathered and dropped its outputs: nothing of this run is held any more.
    assert queries.placements(record_db, run_id=run.id) == []


def test_failed_task_is_recorded(client3p, record_db, tmp_path, no_record_warnings):
    import zarr
    store = tmp_path / "x.zarr"
    z = zarr.create_array(store, shape=(400, 100), chunks=(100, 100), dtype="float64")
    z[:] = 1.0
    (store / "c" / "2" / "0").write_bytes(b"not a compressed chunk")  # chunk rows 200-299
    x = dx.input("x", (400, 100), "float64")
    with pytest.raises(dx.DataError, match=r"chunk \(2, 0\) is damaged"):
        dx.run(x * 2.0, inputs={"x": str(store)}, client=client3p)

    (run,) = queries.list_runs(record_db)
    assert run.status == "failed" and run.error
    failed = [t for t in queries.run_tasks(record_db, run.id) if t.status == "erred"]
    assert failed and all(t.error for t in failed)


def test_worker_loss_marks_chunks_lost(record_db, no_record_warnings):
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, memory_limit="1GiB",
                      dashboard_address="127.0.0.1:0", silence_logs=logging.CRITICAL) as cluster, \
            Client(cluster) as client:
        p = dx.persist(dx.random.normal((4000, 2000), seed=5) + 1.0, client=client).wait()
        before = _who_has(client, p)
        victim = sorted({w for _, w in before})[0]
        pid = client.run(lambda: __import__("os").getpid(), workers=[victim])[victim]
        __import__("os").kill(pid, signal.SIGKILL)
        # Once the scheduler sees the worker gone, Dask recomputes the lost chunks from their
        # lineage (the nanny starts a replacement worker at a new address).
        deadline = time.monotonic() + 60
        while victim in client.scheduler_info()["workers"]:
            assert time.monotonic() < deadline, "the scheduler never noticed the killed worker"
            time.sleep(0.05)
        wait(p.futures, timeout=120)
        rows = dx.placement(p, current=False).rows
        lost = {(r.chunk, r.worker) for r in rows if r.state == "lost"}
        assert lost == {(c, w) for c, w in before if w == victim}
        assert _held(dx.placement(p).rows) == _who_has(client, p)
        run_id = rows[0].run_id
        events = queries.run_events(record_db, run_id)
        assert any(e.kind == "worker-lost" and e.worker == victim for e in events)
        p.release()


def test_recording_off(client3p, record_db, monkeypatch):
    monkeypatch.setenv("DEEPX_RECORD", "0")
    out = dx.run(dx.arange(10) * 2, client=client3p)
    np.testing.assert_array_equal(out, np.arange(10) * 2)
    assert queries.list_runs(record_db) == []


def test_time_spent_fetching_inputs_is_recorded(client3p, record_db, no_record_warnings):
    """Each finished task's comm_seconds is the time its worker spent fetching its inputs
    from other workers, as Dask's own task stream reports it; the run's measured ratio is
    its compute over that."""
    from distributed import get_task_stream
    x = dx.random.normal((12_000, 400), seed=2, dtype="float64")  # several 4 MiB chunks
    with get_task_stream(client=client3p) as stream:
        dx.run((x * 2.0).sum(), client=client3p)  # partial sums combined across workers
    fetched = {}
    for record in stream.data:
        transfers = [s for s in record["startstops"] if s["action"] == "transfer"]
        fetched[str(record["key"])] = sum(s["stop"] - s["start"] for s in transfers)

    (run,) = queries.list_runs(record_db)
    tasks = [t for t in queries.run_tasks(record_db, run.id) if t.status == "memory"]
    assert tasks and set(fetched) >= {t.key for t in tasks}
    for t in tasks:
        assert t.comm_seconds == pytest.approx(fetched[t.key], abs=1e-9)
    assert any(t.comm_seconds > 0 for t in tasks)  # the reduction gathered from 3 workers
    compute = sum(t.stop - t.start for t in tasks)
    assert queries.measured_ratio(queries.task_summary(record_db, run.id)) == \
        pytest.approx(compute / sum(t.comm_seconds for t in tasks))
