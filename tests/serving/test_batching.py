"""Dynamic batching: 64 concurrent one-row requests to a model whose config asks for it run
in batches of more than one row, and every response is its own row's answer; a model's
config is checked at load (a field not honoured, a GPU kind, inputs that are not the
model's) and refused with its reason while the others serve; the batcher itself never
hands a request rows that are not its own."""

import concurrent.futures
import threading

import httpx
import numpy as np
import pytest

from deepx_flow.errors import ExecutionError
from deepx_flow.runtime.run import cluster_spec
from deepx_flow.serving.batcher import Batcher, batch_sizes
from deepx_flow.serving.repository import ModelRepository
from tests.gateway.test_serve import Served
from tests.onnx.test_onnx_import import close, mlp_model
from tests.serving.test_oip import runtime

BATCHED = """
max_batch_size: 64
input [ { name: "x", data_type: TYPE_FP32, dims: [ 784 ] } ]
dynamic_batching { max_queue_delay_microseconds: 50000 }
instance_group [ { count: 2 } ]
"""
# one replica in the gateway's process, of a model whose batches take well under
# ON_LOOP_S: its batches run on the event loop
ON_LOOP = """
max_batch_size: 64
dynamic_batching { max_queue_delay_microseconds: 500 }
instance_group [ { count: 1, kind: KIND_CPU } ]
"""


def _repository(root, configs: dict):
    for name, config in configs.items():
        (root / name / "1").mkdir(parents=True)
        mlp_model(root / name / "1" / "model.onnx", seed=3)
        if config is not None:
            (root / name / "config.pbtxt").write_text(config)
    return root


@pytest.mark.timeout(600)
def test_concurrent_one_row_requests_are_batched_and_each_gets_its_own_row(tmp_path):
    repo = _repository(tmp_path / "models", {
        "mlp": BATCHED,
        "unknown_field": BATCHED + "optimization { priority: PRIORITY_MAX }\n",
        "gpu": "instance_group [ { kind: KIND_GPU } ]\n",
        "wrong_input": 'input [ { name: "x", data_type: TYPE_FP64, dims: [ -1, 784 ] } ]\n',
        "fixed": 'max_batch_size: 8\ninput [ { name: "x", data_type: TYPE_FP32, '
                 'dims: [ 5, 784 ] } ]\n'})
    served = Served(tmp_path, "--model-repository", str(repo))
    try:
        url = served.url
        index = {m["name"]: m for m in httpx.post(url + "/v2/repository/index",
                                                  timeout=60).json()}
        assert index["mlp"]["state"] == "READY"
        for name, says in [("unknown_field", 'no field named "optimization"'),
                           ("gpu", "KIND_GPU"),
                           ("wrong_input", "input 'x' is declared FP64[-1, 784], but the "
                                           "model's is FP32[-1, 784]"),
                           ("fixed", "input 'x' is declared FP32[5, 784], but the model's "
                                     "is FP32[784]")]:
            assert index[name]["state"] == "UNAVAILABLE" and says in index[name]["reason"], \
                index[name]
        rows = np.random.default_rng(5).standard_normal((64, 784)).astype(np.float32)
        together = threading.Barrier(64)  # (connected first, then all sent at once)

        def one(i):
            body = {"inputs": [{"name": "x", "shape": [1, 784], "datatype": "FP32",
                                "data": rows[i].tolist()}], "outputs": [{"name": "probs"}]}
            with httpx.Client(timeout=120) as client:
                assert client.get(url + "/v2/health/ready").status_code == 200
                together.wait(60)
                answer = client.post(url + "/v2/models/mlp/infer", json=body)
            assert answer.status_code == 200, answer.text
            return np.array(answer.json()["outputs"][0]["data"], np.float32)

        with concurrent.futures.ThreadPoolExecutor(64) as pool:
            got = list(pool.map(one, range(64)))
        want = runtime(repo / "mlp" / "1" / "model.onnx", {"x": rows})["probs"]
        for i in range(64):  # each its own row, not a neighbour's
            close(got[i], want[i])
        [stats] = httpx.get(url + "/v2/models/mlp/stats", timeout=60).json()["model_stats"]
        sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}
        assert sum(size * n for size, n in sizes.items()) == 64 == stats["inference_count"]
        assert max(sizes) > 1 and stats["execution_count"] < 64, sizes
        assert stats["inference_stats"]["success"]["count"] == 64
        assert stats["inference_stats"]["queue"]["count"] == 64
        # a request over max_batch_size is refused alone
        body = {"inputs": [{"name": "x", "shape": [65, 784], "datatype": "FP32",
                            "data": np.zeros((65, 784)).ravel().tolist()}]}
        answer = httpx.post(url + "/v2/models/mlp/infer", json=body, timeout=120)
        assert answer.status_code == 400 and "max_batch_size is 64" in answer.json()["error"]
    finally:
        assert served.stop() == 0


def test_the_batcher_splits_rows_and_refuses_outputs_it_cannot_split():
    seen = []

    def run(replica, arrays, outputs):
        seen.append(arrays["x"].shape[0])
        return {"y": arrays["x"] * 2, "total": arrays["x"].sum(keepdims=True)[0]}

    batcher = Batcher("m", lambda r, a, o: {"y": run(r, a, o)["y"]}, 1, 8, 200_000)
    with batcher.arriving():  # (as a request being read: the batch waits for it)
        futures = [batcher.submit({"x": np.full((n, 2), i, np.float64)}, None, n)
                   for i, n in enumerate([1, 2, 3])]
    for i, (f, n) in enumerate(zip(futures, [1, 2, 3])):
        np.testing.assert_array_equal(f.result(30)["y"], np.full((n, 2), 2.0 * i))
    assert seen == [8]  # one batch of every row (6), padded to 8
    # requests that cannot go together (other sizes past the batch axis) are not batched
    seen.clear()
    with batcher.arriving():
        a = batcher.submit({"x": np.ones((1, 2))}, None, 1)
        b = batcher.submit({"x": np.ones((1, 3))}, None, 1)
    assert a.result(30)["y"].shape == (1, 2) and b.result(30)["y"].shape == (1, 3)
    assert seen == [1, 1]
    batcher.stop()

    whole = Batcher("sums", lambda r, a, o: {"total": a["x"].sum(axis=0)}, 1, 8, 200_000)
    with whole.arriving():
        futures = [whole.submit({"x": np.ones((2, 2))}, None, 2) for _ in range(2)]
    for f in futures:
        with pytest.raises(ExecutionError, match="cannot be split into each request's rows"):
            f.result(30)
    whole.stop()
    assert isinstance(whole.submit({"x": np.ones((1, 2))}, None, 1).exception(1),
                      ExecutionError)


def _metric(text: str, name: str, **labels) -> float:
    """The value of one sample of Prometheus's text format."""
    import re
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        found = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if found and ",".join(sorted(found.group(1).split(","))) == want:
            return float(found.group(2))
    raise AssertionError(f"no {name}{{{want}}} in the metrics")


@pytest.mark.timeout(300)
def test_the_metrics_count_the_requests_sent(tmp_path):
    repo = _repository(tmp_path / "models", {"mlp": BATCHED})
    served = Served(tmp_path, "--model-repository", str(repo))
    try:
        url = served.url
        sent = {1: 5, 3: 2}  # rows: requests
        for rows, n in sent.items():
            for _ in range(n):
                body = {"inputs": [{"name": "x", "shape": [rows, 784], "datatype": "FP32",
                                    "data": [0.25] * (rows * 784)}]}
                assert httpx.post(url + "/v2/models/mlp/infer", json=body,
                                  timeout=120).status_code == 200
        bad = {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32",
                           "data": [0.0] * 3}]}
        assert httpx.post(url + "/v2/models/mlp/infer", json=bad, timeout=120).status_code \
            == 400
        text = httpx.get(served.metrics + "/metrics", timeout=60).text
        assert text == httpx.get(url + "/metrics", timeout=60).text  # on both ports
        model = {"model": "mlp", "version": "1"}
        assert _metric(text, "deepx_inference_request_success_total", **model) == 7
        assert _metric(text, "deepx_inference_request_failure_total", **model) == 1
        assert _metric(text, "deepx_inference_count_total", **model) == 11
        executions = _metric(text, "deepx_inference_exec_count_total", **model)
        assert _metric(text, "deepx_inference_batch_size_count", **model) == executions
        assert _metric(text, "deepx_inference_batch_size_sum", **model) == 11
        assert _metric(text, "deepx_inference_request_duration_seconds_count", **model) == 8
        assert _metric(text, "deepx_inference_request_duration_seconds_bucket",
                       le="+Inf", **model) == 8
        assert _metric(text, "deepx_inference_queue_duration_seconds_count", **model) == 7
        assert 0 < _metric(text, "deepx_inference_request_duration_seconds_sum", **model)
    finally:
        assert served.stop() == 0


@pytest.mark.timeout(300)
@pytest.mark.parametrize("config", [BATCHED, ON_LOOP], ids=["threads", "on_loop"])
def test_a_graceful_stop_under_load_answers_every_request_it_accepted(tmp_path, config):
    """16 clients send one-row requests back to back; SIGTERM comes in the middle. Every
    request the server accepted is answered with its own row's values, those sent after
    are refused at the connection, some were in flight when the signal came, and the exit
    code is 0: with replicas in threads and with batches on the event loop."""
    import signal
    import threading
    import time
    repo = _repository(tmp_path / "models", {"mlp": config})
    served = Served(tmp_path, "--model-repository", str(repo))
    rows = np.random.default_rng(9).standard_normal((64, 784)).astype(np.float32)
    want = runtime(repo / "mlp" / "1" / "model.onnx", {"x": rows})["probs"]
    answered, refused, stopped_at = [], [], []

    def client(k):
        with httpx.Client(timeout=120) as http:
            for n in range(10_000):
                i = (k * 7 + n) % 64
                body = {"inputs": [{"name": "x", "shape": [1, 784], "datatype": "FP32",
                                    "data": rows[i].tolist()}], "outputs": [{"name": "probs"}]}
                sent = time.monotonic()
                try:
                    answer = http.post(served.url + "/v2/models/mlp/infer", json=body)
                except httpx.TransportError:
                    refused.append(i)
                    return
                answered.append((i, sent, time.monotonic(), answer))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    while len(answered) < 50:  # under load
        time.sleep(0.01)
    stopped_at.append(time.monotonic())
    served.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(120)
    assert served.proc.wait(60) == 0
    assert len(refused) == 16  # each client's last request found the server gone
    for i, _, _, answer in answered:  # every request accepted was answered, rightly
        assert answer.status_code == 200, answer.text
        close(np.array(answer.json()["outputs"][0]["data"], np.float32), want[i])
    in_flight = [a for a in answered if a[1] < stopped_at[0] < a[2]]
    assert in_flight, "no request was in flight when the stop came"


def test_a_lone_request_does_not_wait_for_the_queue_delay():
    """Nothing queued and nothing arriving: the batch of one runs at once, not after the
    delay (here 5 s)."""
    import time
    batcher = Batcher("m", lambda r, a, o: {"y": a["x"] * 2}, 1, 8, 5_000_000)
    began = time.monotonic()
    np.testing.assert_array_equal(batcher.submit({"x": np.ones((1, 2))}, None, 1)
                                  .result(30)["y"], np.full((1, 2), 2.0))
    assert time.monotonic() - began < 2.5
    batcher.stop()


def test_batches_are_padded_to_a_few_sizes_and_answer_only_their_rows():
    seen = []

    def run(replica, arrays, outputs):
        seen.append(arrays["x"].shape[0])
        return {"y": arrays["x"] * 3}

    batcher = Batcher("m", run, 1, 64, 200_000)
    for rows in (1, 3, 5, 6, 7, 9, 17, 33, 64):
        x = np.arange(rows * 2, dtype=np.float64).reshape(rows, 2) + 1
        with batcher.arriving():
            got = batcher.submit({"x": x}, None, rows).result(30)["y"]
        np.testing.assert_array_equal(got, x * 3)  # its own rows, none of the padding
    assert seen == [1, 4, 8, 8, 8, 16, 24, 40, 64]
    # a few sizes, none padding more than 7 rows (nor more than doubling a small batch)
    assert batch_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    from deepx_flow.serving.model import BUILT_SHAPES
    for top in list(range(1, 300)) + [1000, 4096, 1 << 20]:
        sizes = batch_sizes(top)
        assert sizes == sorted(set(sizes)) and sizes[-1] == top and sizes[0] == 1
        assert all(b - a <= max(8, a) for a, b in zip(sizes, sizes[1:]))
        assert len(sizes) <= BUILT_SHAPES // 2  # (every prepared size stays kept)
    batcher.stop()
    alone = Batcher("m", run, 1, 0, 0)  # no batching: run as sent
    seen.clear()
    assert alone.submit({"x": np.ones((5, 2))}, None, 5).result(30)["y"].shape == (5, 2)
    assert seen == [5]
    alone.stop()


def test_under_load_a_batch_waits_for_the_requests_in_the_server():
    """A request in another replica's batch means more are coming (its client, answered,
    sends again): the next batch waits up to the delay for them instead of running its
    one request at once, while a lone request still runs at once."""
    import threading
    release, seen = threading.Event(), []

    def run(replica, arrays, outputs):
        seen.append(arrays["x"].shape[0])
        if len(seen) == 1:
            assert release.wait(60)  # the first batch holds its replica
        return {"y": arrays["x"] + 1}

    batcher = Batcher("m", run, 2, 8, 3_000_000)  # a delay of 3 s: far past any timing
    first = batcher.submit({"x": np.zeros((1, 2))}, None, 1)
    while not seen:
        threading.Event().wait(0.01)
    second = batcher.submit({"x": np.ones((1, 2))}, None, 1)  # waits: `first` is pending
    threading.Event().wait(0.2)
    third = batcher.submit({"x": np.full((1, 2), 2.0)}, None, 1)  # joins `second`
    for want, f in ((2.0, second), (3.0, third)):
        np.testing.assert_array_equal(f.result(30)["y"], np.full((1, 2), want))
    release.set()
    np.testing.assert_array_equal(first.result(30)["y"], np.ones((1, 2)))
    assert seen == [1, 2]  # the second batch held both requests
    batcher.stop()


def test_a_request_read_inside_arriving_and_queued_from_a_thread_runs_at_once():
    """gRPC reads a request inside `arriving()` and queues it from a worker thread: the
    request is counted once (queued, no longer arriving), so alone it runs at once
    instead of waiting the delay (here 5 s) for itself."""
    import threading
    import time
    batcher = Batcher("m", lambda r, a, o: {"y": a["x"] * 2}, 1, 8, 5_000_000)
    began = time.monotonic()
    with batcher.arriving() as arrival:
        got = {}
        worker = threading.Thread(target=lambda: got.update(
            f=batcher.submit({"x": np.ones((1, 2))}, None, 1, arrival)))
        worker.start()
        worker.join(30)
        np.testing.assert_array_equal(got["f"].result(30)["y"], np.full((1, 2), 2.0))
    assert time.monotonic() - began < 2.5
    assert not batcher._arriving and not batcher._pending  # nothing left counted
    batcher.stop()


def test_a_request_cancelled_while_queued_is_dropped_and_the_replica_serves_on():
    """A caller gone while its request waits in the queue (a gRPC deadline) cancels it:
    the batch leaves it out, the others of the batch get their answers, and the replica
    keeps serving the requests after."""
    import threading
    entered, release = threading.Event(), threading.Event()

    def run(replica, arrays, outputs):
        if arrays["x"][0, 0] == 0:
            entered.set()
            assert release.wait(60)  # the first batch holds the only replica
        return {"y": arrays["x"] + 1}

    batcher = Batcher("m", run, 1, 8, 0)
    first = batcher.submit({"x": np.zeros((1, 2))}, None, 1)
    assert entered.wait(30)
    gone = batcher.submit({"x": np.full((1, 2), 5.0)}, None, 1)
    kept = batcher.submit({"x": np.full((1, 2), 6.0)}, None, 1)
    assert gone.cancel()
    release.set()
    np.testing.assert_array_equal(first.result(30)["y"], np.ones((1, 2)))
    np.testing.assert_array_equal(kept.result(30)["y"], np.full((1, 2), 7.0))
    after = batcher.submit({"x": np.full((1, 2), 8.0)}, None, 1)
    np.testing.assert_array_equal(after.result(30)["y"], np.full((1, 2), 9.0))
    assert gone.cancelled() and not batcher._pending
    batcher.stop()


@pytest.mark.timeout(600)
def test_batches_on_the_event_loop_answer_http_and_grpc_each_its_own_row(tmp_path):
    """A one-replica model in the gateway's process whose batches are quick computes them
    on the event loop: 48 concurrent JSON requests and 16 over gRPC (tritonclient) are
    batched together, each answered with its own row; the infer call refuses another
    method (405) and a bad request (400) as every call does."""
    import tritonclient.grpc as grpcclient
    from threadpoolctl import threadpool_limits
    repo = _repository(tmp_path / "models", {"mlp": ON_LOOP})
    models = ModelRepository(repo, cluster_spec(None, None), None)
    try:
        with threadpool_limits(1, user_api="blas"):  # (as `serve` computes its replicas)
            models.load("mlp")
        assert models._entries["mlp"].batcher.on_loop  # (what the server does with it)
    finally:
        models.stop()
    served = Served(tmp_path, "--model-repository", str(repo))
    try:
        rows = np.random.default_rng(11).standard_normal((64, 784)).astype(np.float32)
        want = runtime(repo / "mlp" / "1" / "model.onnx", {"x": rows})["probs"]

        # each client connected first, then all sent at once: requests read in one turn
        # of the loop are one batch, and a fast loop takes requests spread over the time
        # of 64 connections being opened one by one
        together = threading.Barrier(64)

        def over_http(i):
            body = {"inputs": [{"name": "x", "shape": [1, 784], "datatype": "FP32",
                                "data": rows[i].tolist()}], "outputs": [{"name": "probs"}]}
            with httpx.Client(timeout=120) as client:
                assert client.get(served.url + "/v2/health/ready").status_code == 200
                together.wait(60)
                answer = client.post(served.url + "/v2/models/mlp/infer", json=body)
            assert answer.status_code == 200, answer.text
            return np.array(answer.json()["outputs"][0]["data"], np.float32)

        def over_grpc(i):
            with grpcclient.InferenceServerClient(served.grpc) as client:
                assert client.is_server_ready()
                given = grpcclient.InferInput("x", [1, 784], "FP32")
                given.set_data_from_numpy(rows[i:i + 1])
                together.wait(60)
                return client.infer("mlp", [given]).as_numpy("probs")[0]

        with concurrent.futures.ThreadPoolExecutor(64) as pool:
            got = list(pool.map(lambda i: (over_grpc if i % 4 == 3 else over_http)(i),
                                range(64)))
        for i in range(64):  # each its own row, not a neighbour's
            close(got[i], want[i])
        [stats] = httpx.get(served.url + "/v2/models/mlp/stats",
                            timeout=60).json()["model_stats"]
        sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}
        assert sum(size * n for size, n in sizes.items()) == 64 == stats["inference_count"]
        assert max(sizes) > 1, sizes
        answer = httpx.get(served.url + "/v2/models/mlp/infer", timeout=60)
        assert answer.status_code == 405 and answer.headers["allow"] == "POST"
        assert answer.json()["error"] == \
            "GET is not a method of /v2/models/mlp/infer in the contract"
        answer = httpx.post(served.url + "/v2/models/mlp/versions/1/infer", timeout=60,
                            json={"inputs": [{"name": "x", "shape": [1, 3],
                                              "datatype": "FP32", "data": [1, 2, 3]}]})
        assert answer.status_code == 400 and "has shape [-1, 784]" in answer.json()["error"]
    finally:
        assert served.stop() == 0


def test_only_a_quick_model_with_one_replica_here_runs_on_the_event_loop(tmp_path,
                                                                          monkeypatch):
    """Two replicas (the parallelism asked for), no batching (nothing measured at warm-up),
    or a batch measured slower than ON_LOOP_S keep the replicas' threads. The bound is set
    here, not this machine's speed: on a busy CI machine the MLP's batch of 64 rows, 0.4 ms
    of CPU time here, once measured past the 2 ms default (bench_serving measures the
    speed)."""
    from threadpoolctl import threadpool_limits
    from deepx_flow.serving import repository
    quick, slow = 1.0, 1e-9  # (seconds: past any warm batch of the MLP, and short of all)
    for n, (config, bound, on_loop) in enumerate((
            (ON_LOOP, quick, True), (ON_LOOP, slow, False),
            (ON_LOOP.replace("count: 1", "count: 2"), quick, False),
            ('instance_group [ { count: 1, kind: KIND_CPU } ]\n', quick, False))):
        monkeypatch.setattr(repository, "ON_LOOP_S", bound)
        repo = _repository(tmp_path / f"m{n}", {"mlp": config})
        models = ModelRepository(repo, cluster_spec(None, None), None)
        try:
            with threadpool_limits(1, user_api="blas"):  # (as `serve` computes replicas)
                models.load("mlp")
            assert models._entries["mlp"].batcher.on_loop is on_loop, (config, bound)
            x = np.random.default_rng(2).standard_normal((3, 784)).astype(np.float32)
            close(models.infer("mlp", "", {"x": x})[1]["probs"],  # (from no loop: at once)
                  runtime(repo / "mlp" / "1" / "model.onnx", {"x": x})["probs"])
        finally:
            models.stop()


def test_on_the_loop_the_requests_of_one_turn_run_as_one_batch():
    """Requests queued in one turn of the event loop run as one batch, each given its own
    rows; one cancelled while queued is left out; a request from a thread with no loop
    runs at once, alone; requests whose loop ended before it came to them are answered
    by stop()."""
    import asyncio
    seen = []

    def run(replica, arrays, outputs):
        seen.append(arrays["x"].shape[0])
        return {"y": arrays["x"] * 2}

    batcher = Batcher("m", run, 1, 8, 500, on_loop=True)

    async def turn():
        loop = asyncio.get_running_loop()
        futures = [batcher.submit({"x": np.full((1, 2), float(i))}, None, 1, loop=loop)
                   for i in range(5)]
        gone = batcher.submit({"x": np.full((1, 2), 9.0)}, None, 1, loop=loop)
        gone.cancel()
        got = await asyncio.gather(*futures)
        return got, gone

    got, gone = asyncio.run(turn())
    for i, outputs in enumerate(got):
        np.testing.assert_array_equal(outputs["y"], np.full((1, 2), 2.0 * i))
    assert seen == [8] and gone.cancelled()  # 5 rows, padded to 8; the cancelled one out
    assert not batcher._pending and not batcher._queue
    alone = batcher.submit({"x": np.ones((2, 2))}, None, 2)
    np.testing.assert_array_equal(alone.result(0)["y"], np.full((2, 2), 2.0))  # done
    ended = asyncio.new_event_loop()
    left = batcher.submit({"x": np.ones((1, 2))}, None, 1, loop=ended)
    ended.close()  # before it ran the batch
    batcher.stop()
    np.testing.assert_array_equal(left.result()["y"], np.full((1, 2), 2.0))
    assert seen == [8, 2, 1] and not batcher._pending


def test_a_batch_that_fails_past_its_model_is_answered_and_the_loop_serves_on():
    """A bug past the model's run (here: the statistics' callback raising) answers every
    request of the batch with the error, on the loop as in a replica's thread, and the
    next batch is served."""
    import asyncio
    broken = [True]

    def done(*batch):
        if broken[0]:
            broken[0] = False
            raise RuntimeError("statistics broke")

    for on_loop in (True, False):
        broken[0] = True
        batcher = Batcher("m", lambda r, a, o: {"y": a["x"] + 1}, 1, 8, 500, done=done,
                          on_loop=on_loop)

        async def two_batches():
            loop = asyncio.get_running_loop()
            first = [batcher.submit({"x": np.zeros((1, 2))}, None, 1, loop=loop)
                     for _ in range(3)]
            failed = await asyncio.gather(*first, return_exceptions=True)
            second = await batcher.submit({"x": np.ones((1, 2))}, None, 1, loop=loop)
            return failed, second

        failed, second = asyncio.run(two_batches())
        assert all(isinstance(e, ExecutionError) and "statistics broke" in str(e)
                   for e in failed), failed
        np.testing.assert_array_equal(second["y"], np.full((1, 2), 2.0))
        batcher.stop()  # (a replica's thread counts its batch answered after answering it)
        assert not batcher._pending


def test_replicas_awaited_from_the_loop_take_one_batch_each_and_larger_ones_when_busy():
    """With run_async (replicas on the workers) the loop sends each replica one batch at a
    time: while both are busy, requests queue and the next batches are larger; every
    request gets its own rows; a batch that fails is answered with its error and its
    replica serves on; a request from no loop runs at once, alone, with `run`."""
    import asyncio
    in_flight, most, batches = set(), [0], []

    async def run_async(replica, arrays, outputs):
        assert replica not in in_flight  # one batch a replica
        in_flight.add(replica)
        most[0] = max(most[0], len(in_flight))
        batches.append((replica, arrays["x"].shape[0]))
        try:
            await asyncio.sleep(0.01)
            if (arrays["x"] < 0).any():
                raise ExecutionError("a negative row")
            return {"y": arrays["x"] * 2}
        finally:
            in_flight.discard(replica)

    batcher = Batcher("m", lambda r, a, o: {"y": a["x"] * 3}, 2, 64, 500,
                      run_async=run_async)

    async def load():
        loop = asyncio.get_running_loop()
        futures = []
        for turn in range(10):
            futures += [batcher.submit({"x": np.full((1, 3), 10.0 * turn + i)}, None, 1,
                                       loop=loop) for i in range(6)]
            await asyncio.sleep(0.002)
        got = await asyncio.gather(*futures)
        bad = batcher.submit({"x": -np.ones((1, 3))}, None, 1, loop=loop)
        with pytest.raises(ExecutionError, match="a negative row"):
            await bad
        after = await batcher.submit({"x": np.ones((2, 3))}, None, 2, loop=loop)
        return got, after

    got, after = asyncio.run(load())
    for k, outputs in enumerate(got):
        np.testing.assert_array_equal(outputs["y"], np.full((1, 3), 2 * (10.0 * (k // 6)
                                                                         + k % 6)))
    np.testing.assert_array_equal(after["y"], np.full((2, 3), 2.0))
    assert most[0] == 2 and {r for r, _ in batches} == {0, 1}
    assert max(rows for _, rows in batches[:-2]) > 6  # queued while both were busy
    assert not batcher._pending and sorted(batcher._free) == [0, 1]
    alone = batcher.submit({"x": np.ones((1, 3))}, None, 1)  # from no loop: `run`
    np.testing.assert_array_equal(alone.result(0)["y"], np.full((1, 3), 3.0))
    batcher.stop()


def test_stopping_replicas_awaited_from_a_running_loop_answers_what_is_queued():
    """stop() from another thread (an unload) while the loop sends batches waits for the
    queued requests to be answered, each its own; one submitted after is refused."""
    import asyncio
    import threading

    async def run_async(replica, arrays, outputs):
        await asyncio.sleep(0.02)
        return {"y": arrays["x"] + 1}

    batcher = Batcher("m", None, 1, 4, 500, run_async=run_async)
    stopped, left = threading.Event(), []

    async def load():
        loop = asyncio.get_running_loop()
        futures = [batcher.submit({"x": np.full((1, 1), float(i))}, None, 1, loop=loop)
                   for i in range(20)]  # five batches of 4, one at a time
        stopper = threading.Thread(target=lambda: (batcher.stop(), stopped.set(),
                                                   left.append(len(batcher._pending))))
        stopper.start()
        while not batcher._stopped.is_set():
            await asyncio.sleep(0.001)
        late = batcher.submit({"x": np.zeros((1, 1))}, None, 1, loop=loop)
        got = await asyncio.gather(*futures)
        with pytest.raises(ExecutionError, match="unloaded"):
            await late
        await asyncio.to_thread(stopper.join, 60)
        return got

    got = asyncio.run(load())
    assert stopped.is_set() and left == [0]  # it returned once every one was answered
    for i, outputs in enumerate(got):
        np.testing.assert_array_equal(outputs["y"], [[i + 1.0]])
    assert not batcher._pending
