"""Recovery of single tasks, for real on local clusters, with faults injected by the
fault engine (`kernels/faults.py`): a task that raises is retried after its backoff, a task
that hangs on one worker gets a backup (or, with a timeout, drifts to another), a slow
worker loses races to backups and is excluded, a lost GPU excludes its worker, an out-of-memory
error re-plans the run with smaller chunks, a task that kills its workers and a cluster with
no workers left fail with a message that says so. Every result is compared with NumPy in
float64, and what happened is read back from the metadata database."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter

import numpy as np
import pytest
from distributed import Client, LocalCluster
from sqlmodel import select

import deepx_flow as dx
from deepx_flow.ir.keys import node_of
from deepx_flow.kernels import faults
from deepx_flow.kernels.faults import Fault, FaultInjection
from deepx_flow.meta import open_db
from deepx_flow.meta.models import Event, Run, Task
from tests.helpers import (assert_sums_close, cluster_with_memory, faults_on,
                           threaded_memory_off)

SHAPE = (2000, 256)


def graph():
    x = dx.random.normal(SHAPE, seed=5, dtype="float64")
    return x, (dx.tanh(x) * 2.0).sum(axis=1)


def expected(client):
    """NumPy's float64 result, and the size of its terms (for `assert_sums_close`)."""
    x, _ = graph()
    terms = np.tanh(dx.run(x, client=client)) * 2.0
    return Sums(terms.sum(axis=1), np.abs(terms).sum(axis=1))


class Sums:
    """Row sums and the sums of their terms' sizes: `==` compares within the precision the
    terms allow (`assert_sums_close`)."""

    def __init__(self, value, terms):
        self.value, self.terms = value, terms

    def check(self, actual) -> None:
        assert_sums_close(actual, self.value, self.terms)


def local_cluster(n: int, processes: bool = False):
    if processes:
        return LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                            memory_limit="1GiB", dashboard_address="127.0.0.1:0",
                            silence_logs=logging.CRITICAL)
    with threaded_memory_off():
        return LocalCluster(n_workers=n, threads_per_worker=1, processes=False,
                            memory_limit="1GiB", dashboard_address="127.0.0.1:0",
                            silence_logs=logging.CRITICAL)


def last_run(db):
    with db.read() as s:
        return s.exec(select(Run).order_by(Run.started_at.desc())).first()


def rows(db, model, run_id):
    with db.read() as s:
        return s.exec(select(model).where(model.run_id == run_id)).all()


def node_id(y, op: str, spec) -> str:
    return next(n.id for n in dx.compile(y, cluster=spec).fused.nodes if n.op == op)


@pytest.fixture(scope="module")
def three():
    """Three single-thread workers in this process (the faults' switches are shared)."""
    with local_cluster(3) as cluster, Client(cluster, set_as_default=False) as client:
        yield client


SPEC = cluster_with_memory(2**18, workers=3)  # ~150 small tasks


# -- retries -----------------------------------------------------------------------------------

def test_a_failing_task_is_retried_after_its_backoff_and_every_attempt_recorded(three):
    db = open_db()
    _, y = graph()
    want = expected(three)
    source = node_id(y, "random_normal", SPEC)
    with faults_on(three, Fault("raise", node=source, times=2)):
        out = dx.run(y, client=three, cluster=SPEC,
                     recovery=dx.Recovery(retries=2, backoff=0.3))
    want.check(out)
    run = last_run(db)
    assert run.status == "succeeded"
    tasks = rows(db, Task, run.id)
    retried = [t for t in tasks if t.status == "retried"]
    assert 1 <= len(retried) <= 2
    for failed in retried:
        assert "RuntimeError: injected fault in a task of " + source in failed.error
        later = [t for t in tasks if t.key == failed.key and t.attempts > failed.attempts]
        assert later, f"no later attempt of {failed.key}"
        # Each retry waits the backoff (0.3 s after a first failure, 0.6 s after a second)
        # inside its attempt, before the kernel runs.
        assert min(t.stop for t in later) >= failed.stop + 0.3 * 2 ** (failed.attempts - 1)
    final = {t.key: t for t in tasks if t.status == "memory"}
    assert all(final[f.key].attempts > f.attempts for f in retried)


def test_without_retries_the_error_names_the_operator_and_the_chunk(three):
    _, y = graph()
    source = node_id(y, "random_normal", SPEC)
    with faults_on(three, Fault("raise", node=source, times=1)):
        with pytest.raises(dx.ExecutionError) as info:
            dx.run(y, client=three, cluster=SPEC)
    message = str(info.value)
    assert f"operator random_normal (node {source}), chunk (" in message
    assert "RuntimeError: injected fault" in message


def test_retries_can_be_given_to_one_operator(three):
    x, y = graph()
    source = node_id(y, "random_normal", SPEC)
    recovery = dx.Recovery(retries=0, backoff=0.0, operators={"random_normal": {"retries": 1}})
    with faults_on(three, Fault("raise", node=source, times=1)):
        out = dx.run(y, client=three, cluster=SPEC, recovery=recovery)
    expected(three).check(out)
    # The sums read x inside their own tasks, so its retries are theirs too; read by two
    # operators, x is a task of its own, and the sums run without retries.
    two = [y, x.sum(axis=0)]
    sums = node_id(two, "sum", SPEC)
    with faults_on(three, Fault("raise", node=sums, times=1)):
        with pytest.raises(dx.ExecutionError, match=f"node {sums}"):
            dx.run(two, client=three, cluster=SPEC, recovery=recovery)


# -- timeouts and drift ------------------------------------------------------------------------

@pytest.mark.timeout(300)
def test_a_task_hung_on_one_worker_drifts_and_the_run_finishes():
    """Acceptance: every task that lands on one worker sleeps until the test ends; with a
    1 s timeout those tasks drift to the other workers, the worker is excluded, and the
    run's result is right. Worker processes, as in production."""
    db = open_db()
    _, y = graph()
    with local_cluster(3, processes=True) as cluster, Client(cluster) as client:
        want = expected(client)
        victim = sorted(client.scheduler_info()["workers"])[0]
        with faults_on(client, Fault("hang", worker=victim)):
            out = dx.run(y, client=client, cluster=SPEC, recovery=dx.Recovery(timeout=1.0))
        want.check(out)
    run = last_run(db)
    assert run.status == "succeeded"
    events = rows(db, Event, run.id)
    # Every task that ran past 1.0 s drifted: the hung ones, and on a busy machine perhaps a
    # slow one of a healthy worker.
    drifts = [e for e in events if e.kind == "drift"]
    assert all("over its limit of 1.0 s" in e.message for e in drifts)
    drifted_away = [e for e in drifts if e.worker == victim]
    assert drifted_away and any(e.kind == "suspect" and e.worker == victim for e in events)
    # A second offence (exclude_after=2) excludes it from the run: a drift away from it, or
    # a backup of a task waiting behind a hung attempt there that finished first.
    excluded = any(e.kind == "exclude" and e.worker == victim for e in events)
    beaten = [e for e in events if e.kind == "backup-won" and e.worker == victim]
    assert excluded == (len(drifted_away) + len(beaten) >= 2)
    tasks = rows(db, Task, run.id)
    assert {t.key for t in tasks if t.status == "drifted"} == {e.key for e in drifts}
    assert not [t for t in tasks if t.worker == victim and t.status == "memory"]


# -- speculation: slow is never fatal by default ------------------------------------------------

@pytest.mark.timeout(300)
def test_a_task_hung_on_one_worker_gets_a_backup_by_default_and_the_run_finishes(three):
    """No timeout is set: the hung attempt is not abandoned nor failed, it gets a backup on
    another worker once it runs far past its finished peers, and the backup's result is
    used. The run's result is right, and the hung attempt is recorded as superseded.

    Only what the fault decides is asserted of particular tasks: on a busy machine a
    healthy worker's task can run long enough to get a backup too, and lose or win."""
    db = open_db()
    _, y = graph()
    want = expected(three)
    source = node_id(y, "random_normal", SPEC)
    victim = sorted(three.scheduler_info()["workers"])[0]
    with faults_on(three, Fault("hang", node=source, worker=victim, times=1)):
        out = dx.run(y, client=three, cluster=SPEC)  # default dx.Recovery()
        # The hang lasts until the faults are removed: the run finished without it.
        [hung] = [f for f in faults.fired if f.kind == "hang"]
    want.check(out)
    assert hung.worker == victim
    run = last_run(db)
    assert run.status == "succeeded"
    events = rows(db, Event, run.id)
    backups = {e.key: e for e in events if e.kind == "backup"}
    won = {e.key: e for e in events if e.kind == "backup-won"}
    # The hung task got a backup elsewhere, which finished first, and its result was used.
    assert backups[hung.task].worker == victim and won[hung.task].worker == victim
    assert set(won) <= set(backups)
    # The worker's first backup came past the default floor (speculation_min, 1.0 s): it was
    # not suspect yet (once beaten, its tasks are backed up past half of it).
    first = min((e for e in backups.values() if e.worker == victim), key=lambda e: e.at)
    assert "past 1.0 s" in first.message
    assert not [e for e in events if e.kind in ("drift", "timed-out")]  # no timeout was set
    tasks = rows(db, Task, run.id)
    [slow] = [t for t in tasks if t.key == hung.task and t.worker == victim]
    assert slow.status == "superseded"
    backup_rows = {(t.tensor.removesuffix("~backup"), chunk_of(t.key)): t for t in tasks
                   if t.tensor.endswith("~backup") and t.status == "memory"}
    backup = backup_rows[(slow.tensor, chunk_of(slow.key))]
    assert backup.worker != victim
    # The task took the backup's result, on the worker that holds it.
    assert [t.worker for t in tasks if t.key == hung.task and t.status == "memory"] == \
        [backup.worker]
    # Every attempt superseded because its backup finished first had a backup that did.
    originals = [t for t in tasks if t.status == "superseded" and "~backup" not in t.tensor]
    assert {t.key for t in originals} == set(won)
    assert all((t.tensor, chunk_of(t.key)) in backup_rows for t in originals)
    # Nothing of the backups is left on the scheduler, nor wanted by the supervisor (a backup
    # dropped as the run finished is released a moment later).
    assert wait_for(lambda: three.run_on_scheduler(_backups_left) == [], 60)


def chunk_of(key: str) -> str:
    """The chunk index of a task key as the database writes it: "('x@t', 9, 1)" -> "9, 1"."""
    return key.partition(",")[2].rstrip(")").strip()


def wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _backups_left(dask_scheduler=None) -> list:
    from deepx_flow.runtime.supervisor import CLIENT
    wanted = dask_scheduler.clients.get(CLIENT)
    return [str(k) for k in dask_scheduler.tasks if "~backup" in str(k)] + \
        ([str(ts.key) for ts in wanted.wants_what] if wanted is not None else [])


@pytest.mark.timeout(300)
def test_a_slow_worker_loses_races_to_backups_and_is_excluded():
    """One worker runs every task 30 times slower: its tasks get backups elsewhere, each
    backup that finishes first is an offence, and the second excludes it from the run.
    Worker processes: a threaded worker counts the whole test process's memory as its own."""
    db = open_db()
    x = dx.random.normal((3000, 4000), seed=9, dtype="float64")  # ~20 tasks of 4 MiB
    y = dx.exp(x * 1e-3).sum(axis=1)
    with local_cluster(3, processes=True) as cluster, Client(cluster) as client:
        terms = np.exp(dx.run(x, client=client) * 1e-3)
        want = Sums(terms.sum(axis=1), terms.sum(axis=1))  # positive terms
        victim = sorted(client.scheduler_info()["workers"])[0]
        with faults_on(client, Fault("slow", worker=victim, factor=30)):
            out = dx.run(y, client=client,
                         recovery=dx.Recovery(speculation_min=0.5, speculation_factor=2))
    want.check(out)
    events = rows(db, Event, last_run(db).id)
    # The slow worker lost a race; on a busy machine a healthy one may lose one too. Each
    # worker beaten twice (exclude_after=2), and only such a worker, is excluded.
    beaten = Counter(e.worker for e in events if e.kind == "backup-won")
    assert beaten[victim] >= 1
    excluded = [e.worker for e in events if e.kind == "exclude"]
    assert sorted(excluded) == sorted(w for w, n in beaten.items() if n >= 2)


def _spilled_bytes(address, dask_scheduler=None) -> int:
    return dask_scheduler.workers[address].memory.spilled


@pytest.mark.timeout(300)
def test_a_slow_worker_whose_data_spilled_to_disk_gets_no_backups():
    """The same slow worker, but with data spilled to disk: it is short of memory, and a
    backup would copy its tasks' inputs to another worker. None of its tasks gets one; the
    run ends, right, on its own attempts."""
    db = open_db()
    x = dx.random.normal((3000, 4000), seed=9, dtype="float64")
    y = dx.exp(x * 1e-3).sum(axis=1)
    with local_cluster(3, processes=True) as cluster, Client(cluster) as client:
        terms = np.exp(dx.run(x, client=client) * 1e-3)
        want = Sums(terms.sum(axis=1), terms.sum(axis=1))
        victim = sorted(client.scheduler_info()["workers"])[0]
        held = client.scatter(np.ones(2**20), workers=[victim])
        client.run(lambda dask_worker: dask_worker.data.evict(), workers=[victim])
        assert wait_for(lambda: client.run_on_scheduler(_spilled_bytes, victim) > 0, 30), \
            "the scheduler never heard of the spilled data"
        with faults_on(client, Fault("slow", worker=victim, factor=30)):
            out = dx.run(y, client=client,
                         recovery=dx.Recovery(speculation_min=0.5, speculation_factor=2))
        assert client.run_on_scheduler(_spilled_bytes, victim) > 0  # still, to the end
        del held
    want.check(out)
    run = last_run(db)
    tasks = rows(db, Task, run.id)
    assert any(t.worker == victim for t in tasks)  # it did run the run's tasks, slowly
    events = rows(db, Event, run.id)
    assert not [e for e in events if e.kind == "backup" and e.worker == victim]


# -- GPU loss ----------------------------------------------------------------------------------

def test_a_lost_device_excludes_its_worker_and_its_task_runs_elsewhere():
    """A CUDA error that breaks the device: the task runs again on another worker (without
    using up its retries), the worker gets none of this run's or later runs' tasks."""
    db = open_db()
    _, y = graph()
    with local_cluster(3) as cluster, Client(cluster, set_as_default=False) as client:
        want = expected(client)
        victim = sorted(client.scheduler_info()["workers"])[0]
        with faults_on(client, Fault("device-lost", worker=victim, times=1)):
            out = dx.run(y, client=client, cluster=SPEC)  # retries=0
            run = last_run(db)
            again = dx.run(y, client=client, cluster=SPEC)
            second = last_run(db)
    want.check(out)
    want.check(again)
    events = rows(db, Event, run.id)
    lost = [e for e in events if e.kind == "device-lost"]
    assert len(lost) == 1 and lost[0].worker == victim
    assert "cudaErrorECCUncorrectable" in lost[0].message
    assert any(e.kind == "exclude" and e.worker == victim for e in events)
    tasks = rows(db, Task, run.id)
    failed = [t for t in tasks if t.status == "retried"]
    assert len(failed) == 1 and failed[0].worker == victim
    redo = [t for t in tasks if t.key == failed[0].key and t.status == "memory"]
    assert len(redo) == 1 and redo[0].worker != victim
    # Tasks already sent to the worker may finish there; none starts there once the
    # exclusion has reached it (seconds later at most, however busy the machine).
    [excluded] = [e for e in events if e.kind == "exclude" and e.worker == victim]
    assert not [t for t in tasks if t.worker == victim and t.start > excluded.at + 5.0]
    assert any(e.kind == "exclude" and e.worker == victim for e in rows(db, Event, second.id))
    assert not [t for t in rows(db, Task, second.id) if t.worker == victim]


async def _lose_worker(address, dask_scheduler=None):
    await dask_scheduler.remove_worker(address, stimulus_id="test-lose-worker", close=True)


def _processing_on(address, dask_scheduler=None) -> int:
    ws = dask_scheduler.workers.get(address)
    return -1 if ws is None else len(ws.processing)


@pytest.mark.timeout(300)
def test_a_run_whose_only_allowed_worker_is_lost_goes_on_on_the_excluded_one():
    """Restrictions away from an excluded worker are strict (so work stealing cannot hand it
    a task), until no worker the task may use is left: then the run goes on where it can."""
    db = open_db()
    _, y = graph()
    sums = node_id(y, "sum", SPEC)
    with local_cluster(2) as cluster, Client(cluster, set_as_default=False) as client:
        want = expected(client)
        victim, other = sorted(client.scheduler_info()["workers"])
        with faults_on(client, Fault("device-lost", worker=victim, times=1)):
            dx.run(y, client=client, cluster=SPEC)
        done, failed = {}, []

        def second_run():
            try:
                done["out"] = dx.run(y, client=client, cluster=SPEC)
            except BaseException as err:
                failed.append(err)
        thread = threading.Thread(target=second_run)
        with faults_on(client, Fault("hang", worker=other, node=sums)):
            thread.start()
            deadline = time.monotonic() + 60
            while client.run_on_scheduler(_processing_on, other) < 1 \
                    and time.monotonic() < deadline:
                time.sleep(0.05)
            client.run_on_scheduler(_lose_worker, other)
            thread.join(60)  # the hung tasks are still hung: the run must go on without them
            finished = not thread.is_alive()
        thread.join(60)
    assert finished and not failed, failed
    want.check(done["out"])
    run = last_run(db)
    assert any(e.kind == "exclude" and e.worker == victim for e in rows(db, Event, run.id))
    assert any(t.worker == victim for t in rows(db, Task, run.id))


def test_a_lost_device_marks_the_registry(db):
    from deepx_flow.meta import store
    from deepx_flow.meta.models import Device, Worker
    with db.session() as s:
        for address in ("tcp://a:1", "tcp://b:1"):
            w = Worker(scheduler="tcp://s:1", address=address, name=address, host="h",
                       protocol="tcp", nthreads=1, first_seen=0, last_seen=0)
            s.add(w)
            s.flush()
            s.add(Device(worker_id=w.id, name="H100", registered_at=0))
    store.write_records(db, None, [], [], [(1.0, "device-lost", "tcp://a:1", "k", "ECC")])
    with db.read() as s:
        health = {w.address: d.healthy for d, w in s.exec(
            select(Device, Worker).where(Device.worker_id == Worker.id)).all()}
    assert health == {"tcp://a:1": False, "tcp://b:1": True}


# -- out of memory: plan again with smaller chunks ---------------------------------------------

def test_running_out_of_memory_plans_the_run_again_with_smaller_chunks(monkeypatch):
    """A device with less memory than it registered: tasks whose chunks exceed 3 MiB run
    out of memory. The first plan's 4 MiB chunks fail; the run is planned again with half
    the budget (2 MiB chunks) and finishes."""
    monkeypatch.setenv("DEEPX_MIN_CHUNK_BYTES", str(2**16))
    monkeypatch.setenv("DEEPX_CHUNKS_PER_THREAD", "2")  # 4 chunks: memory sets their size
    db = open_db()
    x = dx.random.normal((4096, 512), seed=3, dtype="float64")
    y = (dx.tanh(x) * 2.0).sum(axis=1)
    spec = cluster_with_memory(2**25, workers=2)
    first = max(dx.compile(y, cluster=spec).chunks[node_id(y, "random_normal", spec)][0])
    assert first * 512 * 8 > 3 * 2**20  # the first plan's chunks do not fit
    with local_cluster(2) as cluster, Client(cluster, set_as_default=False) as client:
        terms = np.tanh(dx.run(x, client=client)) * 2.0
        want = Sums(terms.sum(axis=1), np.abs(terms).sum(axis=1))
        with faults_on(client, Fault("oom", over_bytes=3 * 2**20)):
            with pytest.raises(dx.ExecutionError) as info:
                dx.run(y, client=client, cluster=spec, recovery=dx.Recovery(replan_on_oom=0))
            assert info.value.kind == "oom" and "ran out of memory" in str(info.value)
            assert "OutOfMemoryError: Out of memory allocating" in str(info.value)
            out = dx.run(y, client=client, cluster=spec)
    want.check(out)
    run = last_run(db)
    assert run.status == "succeeded"
    replans = [e for e in rows(db, Event, run.id) if e.kind == "replan"]
    assert len(replans) == 1 and "memory fraction 0.25" in replans[0].message
    with db.read() as s:
        failed = s.exec(select(Run).where(Run.status == "failed", Run.graph_hash
                                          == run.graph_hash)).all()
    assert failed and all("OutOfMemoryError" in r.error for r in failed)


# -- a task that kills its workers; no workers at all -------------------------------------------

@pytest.mark.timeout(600)
def test_a_task_that_kills_its_workers_fails_naming_its_operator_and_chunk():
    import dask
    _, y = graph()
    sums = node_id(y, "sum", SPEC)
    with dask.config.set({"distributed.scheduler.allowed-failures": 1}):
        with local_cluster(2, processes=True) as cluster, Client(cluster) as client:
            # Not removed after: its workers keep dying, and the cluster goes with the test.
            client.register_plugin(FaultInjection([Fault("exit", node=sums)]))
            with pytest.raises(dx.ExecutionError) as info:
                dx.run(y, client=client, cluster=SPEC)
            # The nannies restart the killed workers; closing the cluster while one is
            # between processes hit a Dask race ("can only join a started process"). A
            # worker process takes minutes to start on a machine as busy as CI's can be
            # (120 s was too little there with 20 processes on 2 cores).
            client.wait_for_workers(2, timeout=420)
    assert info.value.kind == "killed-worker"
    message = str(info.value)
    assert f"(node {sums}), chunk (" in message
    assert "its worker process died each time it ran it" in message
    assert "KilledWorker" in message


@pytest.mark.timeout(300)
def test_a_run_with_no_workers_left_fails_after_its_bounded_wait():
    db = open_db()
    _, y = graph()
    with local_cluster(1, processes=True) as cluster, Client(cluster) as client:
        with faults_on(client, Fault("hang")):
            closer = threading.Timer(1.0, cluster.scale, args=(0,))
            closer.start()
            began = time.monotonic()
            try:
                with pytest.raises(dx.ExecutionError) as info:
                    dx.run(y, client=client, cluster=SPEC,
                           recovery=dx.Recovery(worker_wait=2.0, speculate=False))
            finally:
                closer.join()
            waited = time.monotonic() - began
    assert info.value.kind == "no-workers"
    # How long past the 2 s it noticed is the machine's business (a busy one ticks later).
    gone = re.search(r"no workers for (\d+) s \(waited 2 s for a replacement\)",
                     str(info.value))
    assert gone and int(gone.group(1)) >= 2, str(info.value)
    assert waited >= 3.0  # it did wait for a replacement
    run = last_run(db)
    assert run.status == "failed" and "NoWorkers" in run.error
    assert any(e.kind == "no-workers" for e in rows(db, Event, run.id))


@pytest.mark.timeout(300)
def test_a_run_started_with_no_workers_gives_up_cleanly(caplog):
    """Giving up fails every task the run has waiting for a worker, whatever its state, with
    the reason; the supervisor hits no error on the way (it once passed keywords that
    Dask's released -> erred transition does not take, and stopped walking the tasks)."""
    _, y = graph()
    with LocalCluster(n_workers=0, processes=False, dashboard_address="127.0.0.1:0",
                      silence_logs=logging.CRITICAL) as cluster, \
            Client(cluster, set_as_default=False) as client:
        with caplog.at_level(logging.ERROR):
            with pytest.raises(dx.ExecutionError) as info:
                dx.run(y, client=client, cluster=SPEC, recovery=dx.Recovery(worker_wait=1.0))
            states = client.run_on_scheduler(_states_of, names={
                n.id for n in dx.compile(y, cluster=SPEC).fused.nodes})
    assert info.value.kind == "no-workers"
    gone = re.search(r"no workers for (\d+) s \(waited 1 s", str(info.value))
    assert gone and int(gone.group(1)) >= 1, str(info.value)
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert not set(states) & {"no-worker", "queued", "processing"}, states


def _states_of(names, dask_scheduler=None) -> list:
    return [ts.state for key, ts in dask_scheduler.tasks.items()
            if node_of(key) in names]


# -- per asset ---------------------------------------------------------------------------------

def test_an_assets_own_retries_apply_to_its_tasks(three, tmp_path, monkeypatch):
    """`@dx.asset(recovery=...)` retries that asset's tasks; the run's settings (none here)
    hold for the rest, so the same fault in an asset without them fails the stage."""
    monkeypatch.setenv("DEEPX_ASSET_ROOT", str(tmp_path / "assets"))

    def definitions(recovery):
        @dx.asset(recovery=recovery)
        def noise():
            return dx.random.normal((512, 64), seed=9, dtype="float64") * 2.0

        @dx.asset
        def total(noise):
            return noise.sum(axis=0)
        return dx.Definitions([noise, total])

    with faults_on(three, Fault("raise", node="random_normal", times=1)):
        done = dx.materialize(definitions({"retries": 1, "backoff": 0.0}), client=three)
    x = dx.run(dx.random.normal((512, 64), seed=9, dtype="float64"), client=three)
    assert_sums_close(dx.run(dx.load("total"), client=three), (x * 2.0).sum(axis=0),
                      np.abs(x * 2.0).sum(axis=0))
    assert any(t.status == "retried" for t in rows(open_db(), Task, done.run_id))
    with faults_on(three, Fault("raise", node="random_normal", times=1)):
        with pytest.raises(dx.ExecutionError, match="operator random_normal"):
            dx.materialize(definitions(None), client=three)
    with pytest.raises(dx.GraphError, match="asset noise: .*unknown recovery setting"):
        definitions({"retry": 1})
