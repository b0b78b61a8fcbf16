"""The gateway's operations (`deepx_flow/gateway/operations.py`), without a transport: a
graph executed in a thread gives dx.run's results from stored files; the same id and
request attach, another request is refused; failures, cancellations and a dead gateway's
operations end in a final state, and nothing unfinished is listed."""

import json
import subprocess
import sys
import time

import numpy as np
import pytest
from sqlmodel import select

import deepx_flow as dx
from deepx_flow.gateway.graphs import graph_of
from deepx_flow.gateway.errors import NotFound
from deepx_flow.gateway.operations import Operations
from deepx_flow.kernels.faults import Fault
from deepx_flow.meta import open_db
from deepx_flow.meta.models import Operation, Run
from deepx_flow.processes import this_process
from deepx_flow.errors import InputError
from tests.helpers import faults_on

SPEC = {"deepx": 1, "name": "scaled",
        "inputs": {"x": {"shape": [6, 4], "dtype": "float32"}},
        "nodes": [{"id": "y", "op": "mul", "args": ["x", 3.0]},
                  {"id": "s", "op": "sum", "args": ["y"], "attrs": {"axes": [1]}}],
        "outputs": ["y", "s"]}


@pytest.fixture
def ops(client, tmp_path):
    return Operations(open_db(), tmp_path / "results", client)


def _x(seed=0):
    return np.random.default_rng(seed).standard_normal((6, 4)).astype(np.float32)


def test_an_execution_gives_dx_runs_results_from_its_stored_files(ops, client):
    x = _x()
    op_id, started = ops.execute(graph_of(SPEC, 100), SPEC, {"x": x})
    assert started
    found = ops.get(op_id, wait_seconds=None)
    assert found.state == "succeeded" and found.ended_at >= found.created_at
    want = dx.run(graph_of(SPEC, 100), inputs={"x": x}, client=client)
    got = ops.outputs(found)
    assert list(got) == ["y", "s"]
    for name in got:
        np.testing.assert_array_equal(got[name], want[name])
    with open_db().read() as s:
        assert s.get(Run, found.run_id).status == "succeeded"
    listed = json.loads(found.outputs)
    assert listed[1] == {"name": "s", "datatype": "FP32", "shape": [6], "file": "1.npy"}


def test_some_outputs_only_and_unknown_ones_refused(ops):
    op_id, _ = ops.execute(graph_of(SPEC, 100), SPEC, {"x": _x()}, outputs=["s"])
    assert list(ops.outputs(ops.get(op_id, wait_seconds=None))) == ["s"]
    with pytest.raises(InputError, match="'z' asked for, but the graph's outputs are y, s"):
        ops.execute(graph_of(SPEC, 100), SPEC, {"x": _x()}, outputs=["z"])


def test_the_same_id_and_request_attach_and_another_request_is_refused(ops):
    first, started = ops.execute(graph_of(SPEC, 100), SPEC, {"x": _x()}, operation_id="job-1")
    again, started_again = ops.execute(graph_of(SPEC, 100), SPEC, {"x": _x()},
                                       operation_id="job-1")
    assert (first, started, again, started_again) == ("job-1", True, "job-1", False)
    assert ops.get("job-1", wait_seconds=None).state == "succeeded"
    with open_db().read() as s:
        assert len(s.exec(select(Run).where(Run.id == ops.get("job-1").run_id)).all()) == 1
    with pytest.raises(InputError, match="'job-1' was used for another request"):
        ops.execute(graph_of(SPEC, 100), SPEC, {"x": _x(1)}, operation_id="job-1")
    with pytest.raises(InputError, match="is not 1 to 128 letters"):
        ops.execute(graph_of(SPEC, 100), SPEC, {"x": _x()}, operation_id="../etc")


def _operation_ids():
    with open_db().read() as s:
        return set(s.exec(select(Operation.id)).all())


def test_inputs_that_do_not_fit_are_refused_before_anything_runs(ops, client):
    before = _operation_ids()
    bad = {"x": np.zeros((5, 4), np.float32)}  # the spec says (6, 4)
    with pytest.raises(InputError) as err:
        ops.execute(graph_of(SPEC, 100), SPEC, bad)
    with pytest.raises(InputError) as same:
        dx.run(graph_of(SPEC, 100), inputs=bad, client=client)
    assert str(err.value) == str(same.value)
    with pytest.raises(InputError, match="input 'x' .* was not given"):
        ops.execute(graph_of(SPEC, 100), SPEC, {})
    assert _operation_ids() == before


def test_a_run_that_fails_is_failed_with_the_deepx_error_text(ops, client):
    from deepx_flow.kernels.faults import Fault
    with faults_on(client, Fault("raise")):
        op_id, _ = ops.execute(graph_of(SPEC, 100), SPEC, {"x": _x()})
        found = ops.get(op_id, wait_seconds=None)
        with pytest.raises(dx.ExecutionError) as err:
            dx.run(graph_of(SPEC, 100), inputs={"x": _x()}, client=client)
    assert found.state == "failed" and found.error
    assert found.error.split(":")[0] == str(err.value).split(":")[0]
    assert not (ops.results / op_id).exists()


@pytest.mark.timeout(120)
def test_a_cancelled_operation_is_interrupted(ops, client):
    with faults_on(client, Fault("hang")):
        op_id, _ = ops.execute(graph_of(SPEC, 100), SPEC, {"x": _x()})
        assert ops.get(op_id, wait_seconds=0.5).state == "running"
        ops.cancel(op_id)
        found = ops.get(op_id, wait_seconds=60)
    assert found.state == "interrupted" and "cancelled" in found.error
    assert ops.outputs(found) == {}
    with open_db().read() as s:
        assert s.get(Run, found.run_id).status == "interrupted"


def test_unknown_ids_are_not_found(ops):
    for bad in ("nope", "../x", ""):
        with pytest.raises(NotFound):
            ops.get(bad)


def test_a_dead_gateways_running_operations_are_interrupted_and_their_files_removed(ops):
    me = this_process()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    pid = int(dead.stdout)
    with open_db().session() as s:
        s.add(Operation(id="left", kind="execute", request_digest="0" * 64,
                        created_at=time.time() - 5, host=me.host, pid=pid,
                        pid_space=me.space))
    (ops.results / "left").mkdir(parents=True)
    (ops.results / "left" / ".0.npy.partial").write_bytes(b"half")
    if me.space is None:
        pytest.skip("this process cannot look up others by pid here")
    assert ops.interrupt_orphaned() == ["left"]
    found = ops.get("left")
    assert found.state == "interrupted" and f":{pid} that ran it stopped" in found.error
    assert not (ops.results / "left").exists()
    assert ops.interrupt_orphaned() == []


def test_a_scalar_output_keeps_its_shape(ops, client):
    spec = {"deepx": 1, "inputs": {"x": {"shape": [6, 4], "dtype": "float32"}},
            "nodes": [{"id": "t", "op": "sum", "args": ["x"]}], "outputs": ["t"]}
    x = _x()
    op_id, _ = ops.execute(graph_of(spec, 100), spec, {"x": x})
    got = ops.outputs(ops.get(op_id, wait_seconds=None))["t"]
    want = dx.run(graph_of(spec, 100), inputs={"x": x}, client=client)["t"]
    assert got.shape == want.shape == ()
    np.testing.assert_array_equal(got, want)


def test_the_graphs_name_is_the_operations_target_and_a_failed_store_leaves_nothing(
        ops, monkeypatch):
    op_id, _ = ops.execute(graph_of(SPEC, 100), SPEC, {"x": _x()})
    assert ops.get(op_id, wait_seconds=None).target == "scaled"

    def full_disk(folder, arrays):
        (folder / ".0.npy.partial").write_bytes(b"half")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(Operations, "_write", staticmethod(full_disk))
    op_id, _ = ops.execute(graph_of(SPEC, 100), SPEC, {"x": _x(2)})
    found = ops.get(op_id, wait_seconds=None)
    assert found.state == "failed" and "No space left" in found.error
    assert not (ops.results / op_id).exists()


def test_an_operation_whose_gateway_went_silent_is_interrupted_wherever_it_ran(ops):
    """A gateway on another host (or in a new PID namespace) cannot be looked up by pid:
    its heartbeat going stale is what tells."""
    now = time.time()
    with open_db().session() as s:
        s.add(Operation(id="elsewhere-old", kind="execute", request_digest="1" * 64,
                        created_at=now - 600, heartbeat_at=now - 120, host="other-host",
                        pid=4242, pid_space="boot/x:1"))
        s.add(Operation(id="elsewhere-alive", kind="execute", request_digest="2" * 64,
                        created_at=now - 600, heartbeat_at=now - 5, host="other-host",
                        pid=4243, pid_space="boot/x:1"))
    assert ops.interrupt_orphaned(stale_after=60) == ["elsewhere-old"]
    found = ops.get("elsewhere-old")
    assert found.state == "interrupted" and "no heartbeat for 60 s" in found.error
    assert ops.get("elsewhere-alive").state == "running"
    with open_db().session() as s:  # (leave no running row for later tests' sweeps)
        s.get(Operation, "elsewhere-alive").state = "interrupted"


@pytest.mark.timeout(120)
def test_a_running_operations_heartbeat_is_kept(ops, client):
    with faults_on(client, Fault("hang")):
        op_id, _ = ops.execute(graph_of(SPEC, 100), SPEC, {"x": _x(7)})
        first = ops.get(op_id, wait_seconds=0.3)
        ops.beat()
        beat = ops.get(op_id).heartbeat_at
        assert first.state == "running" and beat is not None and beat >= first.created_at
        assert op_id not in ops.interrupt_orphaned(stale_after=0)  # its own: not swept
        ops.cancel(op_id)
        assert ops.get(op_id, wait_seconds=60).state == "interrupted"


def test_one_id_sent_at_once_from_many_threads_runs_once(ops):
    import concurrent.futures
    graph = graph_of(SPEC, 100)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        same = list(pool.map(lambda _: ops.execute(graph, SPEC, {"x": _x()},
                                                   operation_id="burst-1"), range(16)))
        assert sorted(started for _, started in same) == [False] * 15 + [True]

        def other(seed):
            try:
                return ops.execute(graph, SPEC, {"x": _x(seed)}, operation_id="burst-2")[1]
            except InputError as err:
                assert "was used for another request" in str(err)
                return None
        outcomes = list(pool.map(other, range(16)))
    assert outcomes.count(True) == 1 and outcomes.count(False) == 0
    for op_id in ("burst-1", "burst-2"):
        assert ops.get(op_id, wait_seconds=None).state == "succeeded"


def test_operations_that_ended_longer_ago_than_their_time_to_live_are_forgotten(
        client, db, tmp_path, monkeypatch):
    ops = Operations(db, tmp_path / "results", client)
    old, _ = ops.execute(graph_of(SPEC, 100), SPEC, {"x": _x(1)})
    assert ops.get(old, wait_seconds=60).state == "succeeded"
    assert (ops.results / old).is_dir()
    time.sleep(0.2)
    with faults_on(client, Fault("hang")):
        running, _ = ops.execute(graph_of(SPEC, 100), SPEC, {"x": _x(2)})
        assert ops.prune(ttl=3600) == []  # nothing that old
        assert ops.prune(ttl=0.1) == [old]  # the running one stays
        assert not (ops.results / old).exists()
        monkeypatch.setenv("DEEPX_OPERATION_TTL_S", "172800")
        with pytest.raises(NotFound, match=r"no operation '\w+' \(an operation is kept for 2 "
                                           r"days after it ends: DEEPX_OPERATION_TTL_S\)"):
            ops.get(old)
        assert ops.get(running).state == "running"
        ops.cancel(running)
        assert ops.get(running, wait_seconds=60).state == "interrupted"
    assert ops.prune() == []  # the default keeps them a week
