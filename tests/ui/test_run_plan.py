"""Rebuilding a run's plan from the metadata database: a real `dx.run`'s plan comes back
exactly as the run recorded it; bad records (a missing or too big graph, YAML that is not
a spec or asks for Python objects, a graph no cluster can fit) are said, never raised, and
nothing in them is executed or read as a file."""

from __future__ import annotations

import time
import uuid

import pytest

import deepx_flow as dx
from deepx_flow.meta import open_db, store
from deepx_flow.meta.db import close_all
from deepx_flow.meta.models import Device, Run, Worker
from deepx_flow.meta.queries import list_runs
from deepx_flow.registry.cluster import DeviceSpec
from deepx_flow.spec.yaml_io import to_yaml
from deepx_flow.ui.run_plan import MAX_REBUILT_NODES, cluster_from_rows, rebuild, run_cluster

SCHEDULER = "tcp://10.0.0.1:8786"


def test_the_rebuilt_plan_is_the_plan_the_run_recorded(client, tmp_path, monkeypatch):
    url = f"sqlite:///{(tmp_path / 'deepx.db').as_posix()}"
    monkeypatch.setenv("DEEPX_DB_URL", url)
    monkeypatch.setenv("DEEPX_MIN_CHUNK_BYTES", str(1 << 16))  # several chunks per tensor
    try:
        x = dx.random.normal((4000, 64), seed=3, dtype="float64")
        dx.run((dx.tanh(x) * 2.0).sum(axis=0) + dx.exp(x).mean(), client=client)
        db = open_db(url)
        (run,) = list_runs(db)
        rebuilt = rebuild(db, run)
        assert rebuilt.problem == "" and not rebuilt.chunks_differ
        assert rebuilt.plan.explain() == run.explain  # grids, costs, budget, cluster name
        assert run.n_chunks > 2
        assert rebuilt.cluster_note.startswith(f"planned for {run.n_workers} registered")
    finally:
        close_all()


def add_run(db, text: str, n_nodes: int = 1, graph_hash: str | None = None) -> Run:
    run = Run(id=uuid.uuid4().hex, graph_hash=graph_hash or uuid.uuid4().hex[:16],
              started_at=time.time(), scheduler=SCHEDULER, cluster="c", n_workers=1,
              n_tasks=1, n_chunks=1, host="h", pid=1, username="u")
    store.begin_run(db, run, text, n_nodes)
    return run


def register(db, memory: int, device_memory: int | None = None, at: float = 0.0,
             usable: int | None = None) -> None:
    with db.session() as session:
        worker = Worker(scheduler=SCHEDULER, address="tcp://10.0.0.2:1", name="w0",
                        host="10.0.0.2", protocol="tcp", nthreads=1, memory_limit=memory,
                        memory_reserved=0, first_seen=at, last_seen=at)
        session.add(worker)
        session.flush()
        if device_memory:
            session.add(Device(worker_id=worker.id, name="GPU", memory_total=device_memory,
                               memory_usable=usable, registered_at=at))


def test_a_graph_that_cannot_fit_says_why(db):
    register(db, memory=1 << 16)  # 64 KiB: a softmax over rows of 100,000 cannot fit
    x = dx.random.normal((4, 100_000), seed=1)
    run = add_run(db, to_yaml(dx.softmax(x, axis=-1)), 2)
    rebuilt = rebuild(db, run)
    assert rebuilt.plan is None
    assert f"run {run.id}: compiling its graph {run.graph_hash}" in rebuilt.problem
    assert "PlanError" in rebuilt.problem


def test_python_tags_are_refused_and_nothing_runs(db, tmp_path):
    marker = tmp_path / "ran"
    run = add_run(db, f"!!python/object/apply:os.system ['touch {marker}']\n")
    rebuilt = rebuild(db, run)
    assert rebuilt.plan is None and "cannot read its graph" in rebuilt.problem
    assert "ConstructorError" in rebuilt.problem
    assert not marker.exists()


def test_a_file_name_is_text_not_a_file_to_read(db, tmp_path):
    spec = tmp_path / "real.yaml"  # a valid spec on disk, named by the record's text
    spec.write_text(to_yaml(dx.random.normal((4, 4), seed=1)))
    rebuilt = rebuild(db, add_run(db, str(spec)))
    assert rebuilt.plan is None and "SpecError" in rebuilt.problem


@pytest.mark.parametrize("text, says", [
    ("deepx: 1\nnodes: [\n", "line 3, column 1"),
    ("deepx: 1\noutputs: [nowhere]\n", "nowhere"),
    ("", "without its YAML")])
def test_records_that_are_not_specs_say_what_is_wrong(db, text, says):
    run = add_run(db, text)
    rebuilt = rebuild(db, run)
    assert rebuilt.plan is None and run.id in rebuilt.problem and says in rebuilt.problem


def test_a_missing_or_too_big_graph_is_said(db):
    run = Run(id="r1", graph_hash="0123456789abcdef", started_at=1.0, scheduler=SCHEDULER,
              cluster="c", n_workers=1, n_tasks=1, n_chunks=1, host="h", pid=1,
              username="u")
    assert rebuild(db, run).problem == \
        "run r1: its graph 0123456789abcdef is not in the graphs table"
    big = add_run(db, "deepx: 1\n", n_nodes=MAX_REBUILT_NODES + 1)
    assert f"has {MAX_REBUILT_NODES + 1:,} nodes" in rebuild(db, big).problem


def test_the_cluster_is_the_registered_workers_else_this_machine(db):
    run = add_run(db, "deepx: 1\n")
    cluster, note = run_cluster(db, run)
    assert cluster.name == "local" and "no workers" in note
    register(db, memory=8 << 30, device_memory=80 << 30, at=run.started_at - 1)
    cluster, note = run_cluster(db, run)
    (worker,) = cluster.workers
    assert (cluster.name, worker.memory, worker.address) == ("c", 8 << 30, "tcp://10.0.0.2:1")
    assert worker.device == DeviceSpec("gpu", "GPU", 80 << 30)
    assert worker.budget == 80 << 30  # a GPU worker plans with its device's memory
    assert note == f"planned for 1 registered worker(s) of {SCHEDULER}"


def test_a_gpu_registered_with_its_usable_memory_is_planned_with_it(db):
    run = add_run(db, "deepx: 1\n")
    register(db, memory=8 << 30, device_memory=80 << 30, usable=77 << 30,
             at=run.started_at - 1)
    (worker,) = run_cluster(db, run)[0].workers
    assert worker.device.usable == 77 << 30 and worker.budget == 77 << 30


def test_workers_registered_after_the_run_are_not_its_own(db):
    run = add_run(db, "deepx: 1\n")
    register(db, memory=8 << 30, at=run.started_at + 60)
    assert run_cluster(db, run)[0].name == "local"


def test_cluster_from_rows_keeps_reserved_memory():
    w = Worker(id=1, scheduler=SCHEDULER, address="a", name="w", host="h", protocol="tcp",
               nthreads=2, memory_limit=1000, memory_reserved=300, first_seen=0, last_seen=0)
    (spec,) = cluster_from_rows("c", [w], {}).workers
    assert (spec.threads, spec.memory, spec.reserved, spec.budget) == (2, 1000, 300, 700)
