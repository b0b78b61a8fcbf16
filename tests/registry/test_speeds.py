"""Measured operator speeds: a run's finished tasks are folded into the registry per operator
and worker (decayed sums), the next plan's expected task times come from them, and
`deepx-flow ops` lists them. On SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlmodel import select

import deepx_flow as dx
from deepx_flow.cli.main import main
from deepx_flow.meta.models import OperatorSpeed as SpeedRow
from deepx_flow.registry.speeds import DECAY, SpeedSamples, worker_speeds
from deepx_flow.runtime.recovery import Recovery, task_policies
from deepx_flow.runtime.run import cluster_spec


def samples(tasks):
    """Two workers on one host; node "n" is a 'fused[exp]' of 1e6 FLOPs and 8e5 bytes a
    task, node "r" a read of 0 FLOPs and 4e5 bytes."""
    s = SpeedSamples({"n": ("fused[exp]", 1e6, 8e5), "r": ("read_zarr", 0.0, 4e5)},
                     {"tcp://h:1": ("h", "0"), "tcp://h:2": ("h", "1")})
    for node, worker, seconds in tasks:
        s.add(node, worker, 100.0, 100.0 + seconds)
    return s


def test_speeds_are_decayed_sums_of_work_over_seconds_per_worker(db):
    samples([("n", "tcp://h:1", 0.5), ("n", "tcp://h:1", 0.5), ("n", "tcp://h:2", 2.0),
             ("r", "tcp://h:2", 0.1)]).record(db)
    first = worker_speeds(db, "h", "0")
    assert first["fused[exp]"].flops_per_s == pytest.approx(2e6 / 1.0)
    assert first["fused[exp]"].tasks == 2
    # Worker 0 has no read_zarr rows of its own: it takes its host's.
    assert first["read_zarr"].bytes_per_s == pytest.approx(4e5 / 0.1)
    assert first["read_zarr"].seconds(0.0, 8e5) == pytest.approx(0.2)
    assert worker_speeds(db, "h", "1")["fused[exp]"].seconds(1e6, 0) == pytest.approx(2.0)

    samples([("n", "tcp://h:1", 4.0)]).record(db)  # the machine got slower
    again = worker_speeds(db, "h", "0")["fused[exp]"]
    expected = (2e6 * DECAY + 1e6) / (1.0 * DECAY + 4.0)
    assert again.flops_per_s == pytest.approx(expected) and again.tasks == 3
    assert worker_speeds(db, "other-host", "0") == {}
    with db.read() as s:
        assert len(s.exec(select(SpeedRow)).all()) == 3


def test_too_short_or_unknown_tasks_measure_nothing(db):
    samples([("n", "tcp://h:1", 1e-5), ("n", "tcp://elsewhere:9", 1.0),
             ("unknown", "tcp://h:1", 1.0)]).record(db)
    with db.read() as s:
        assert s.exec(select(SpeedRow)).all() == []


def test_a_finished_run_teaches_the_next_plan_its_speeds(client, db_url, monkeypatch,
                                                         capsys):
    monkeypatch.setenv("DEEPX_DB_URL", db_url)
    x = dx.random.normal((4000, 1000), seed=3, dtype="float64")
    y = dx.tanh(x).sum(axis=1)
    before = dx.compile(y, client=client)
    assert not any(p.expected_measured for p in task_policies(before, Recovery()).values())
    dx.run(y, client=client)

    spec = cluster_spec(None, client)
    labels = set(spec.workers[0].speeds) | set(spec.workers[1].speeds)
    # x is generated inside the sum's tasks: measured as the pair.
    label = "sum+prologue[tanh(in0)] <- random_normal"
    assert label in labels and not labels & {"random_normal", "sum+prologue[tanh(in0)]"}
    plan = dx.compile(y, client=client)
    source = next(n.id for n in plan.fused.nodes if n.op == "random_normal")
    sums = next(n.id for n in plan.fused.nodes if n.op == "sum")
    policies = task_policies(plan, Recovery(), inlined={sums: frozenset({source})})
    assert policies[sums].expected_measured and policies[sums].expected_s > 0

    # The plan's compute estimate follows: the measured seconds of its tasks, shared among
    # the threads (rates, not measurements, for nothing here).
    stats = plan.stats()
    measured = sum(s.tasks * sum(w.speeds[label].seconds(
                       s.flops / s.tasks, (s.bytes_in + s.bytes_out) / s.tasks)
                       for w in spec.workers) / len(spec.workers)
                   for s in stats.nodes if s.tasks) / spec.total_threads
    assert stats.compute_seconds == pytest.approx(measured)
    assert stats.compute_seconds != before.stats().compute_seconds

    assert main(["ops", "--db", db_url]) == 0
    out = capsys.readouterr().out
    assert "Measured on this database's workers" in out and "random_normal" in out


def test_drivers_recording_at_once_lose_no_update(db):
    """Eight drivers finish runs at the same moment: every task is counted (the row's
    update is arithmetic in the database, not read, changed and written back)."""
    import threading
    runs = [samples([("n", "tcp://h:1", 0.5), ("n", "tcp://h:1", 0.5)]) for _ in range(8)]
    errors = []

    def record(s):
        try:
            s.record(db)
        except Exception as err:  # reported below, with the others
            errors.append(err)
    threads = [threading.Thread(target=record, args=(s,)) for s in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    speed = worker_speeds(db, "h", "0")["fused[exp]"]
    assert speed.tasks == 16 and speed.flops_per_s == pytest.approx(2e6)  # 2 per second


def test_listing_operators_needs_no_database(tmp_path, capsys):
    """`deepx-flow ops` lists the operators where there is no database (and creates none)
    or an unusable one (an empty file), saying why no speeds are shown."""
    missing = tmp_path / "none.db"
    assert main(["ops", "--db", f"sqlite:///{missing}"]) == 0
    out = capsys.readouterr().out
    assert "random_normal" in out and "does not exist" in out and not missing.exists()
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    assert main(["ops", "--db", f"sqlite:///{empty}"]) == 0
    out = capsys.readouterr().out
    assert "random_normal" in out and "No measured operator speeds" in out
