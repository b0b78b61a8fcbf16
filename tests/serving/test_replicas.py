"""Replicas resident on the cluster's workers: spread one per worker, each loading the file
the gateway checked (a changed one is refused), answering as ONNX Runtime does; a replica
whose worker is lost is placed again on a live worker and the request still answered."""

import shutil
import time

import numpy as np
import pytest
from distributed import Client, LocalCluster

from deepx_flow.errors import DataError, InputError
from deepx_flow.runtime.run import cluster_spec
from deepx_flow.serving.replica import Replica
from deepx_flow.serving.repository import ModelRepository
from tests.helpers import threaded_memory_off
from tests.onnx.test_onnx_import import close, mlp_model
from tests.serving.test_oip import runtime


@pytest.fixture
def cluster():
    with threaded_memory_off(), LocalCluster(n_workers=3, threads_per_worker=1,
                                             processes=False, protocol="tcp",
                                             dashboard_address=None) as c, \
            Client(c, set_as_default=False) as client:
        yield c, client


def _repository(tmp_path, replicas: int, kind: str = "KIND_AUTO"):
    (tmp_path / "models" / "mlp" / "1").mkdir(parents=True)
    path = mlp_model(tmp_path / "models" / "mlp" / "1" / "model.onnx", seed=4)
    (tmp_path / "models" / "mlp" / "config.pbtxt").write_text(
        f"instance_group [ {{ count: {replicas}, kind: {kind} }} ]\n")
    return tmp_path / "models", path


@pytest.mark.timeout(300)
def test_replicas_spread_over_the_workers_and_survive_the_loss_of_one(tmp_path, cluster):
    local, client = cluster
    root, path = _repository(tmp_path, 2)
    models = ModelRepository(root, cluster_spec(None, client), client)
    try:
        models.load("mlp")
        placed = models.placement("mlp")
        assert len(set(placed)) == 2 and set(placed) <= set(client.scheduler_info(
            n_workers=-1)["workers"])
        x = np.random.default_rng(2).standard_normal((3, 784)).astype(np.float32)
        want = runtime(path, {"x": x})["probs"]
        for _ in range(4):
            close(models.infer("mlp", "", {"x": x})[1]["probs"], want)
        # lose the worker of the first replica: the next batch on it is placed again
        lost = placed[0]
        worker = next(w for w in local.workers.values() if w.address == lost)
        client.sync(worker.close)
        for _ in range(200):  # (which replica takes a request is the threads' race)
            close(models.infer("mlp", "", {"x": x})[1]["probs"], want)
            if lost not in models.placement("mlp"):
                break
        assert lost not in models.placement("mlp")
        assert len(models.placement("mlp")) == 2
    finally:
        models.stop()


@pytest.mark.timeout(300)
def test_from_the_event_loop_a_lost_replica_is_placed_again_and_its_batch_answered(
        tmp_path, cluster):
    """Batches sent from the loop over the replicas' connections: the worker of one is
    closed, its connection breaks at the next batch, the replica is placed again on a
    live worker (in a thread, made slow here: the loop serves on, the other replica's
    batches too) and that batch still answered."""
    import asyncio
    local, client = cluster
    root, path = _repository(tmp_path, 2)
    models = ModelRepository(root, cluster_spec(None, client), client)
    try:
        models.load("mlp")
        placed = models.placement("mlp")
        x = np.random.default_rng(5).standard_normal((2, 784)).astype(np.float32)
        want = runtime(path, {"x": x})["probs"]

        async def requests(n: int):
            loop = asyncio.get_running_loop()
            for _ in range(n):
                futures = [models.submit("mlp", "", {"x": x}, loop=loop)[1]
                           for _ in range(4)]
                for got in await asyncio.gather(*futures):
                    close(got["probs"], want)
                if placed[0] not in models.placement("mlp"):
                    return

        replicas = models._entries["mlp"].replicas
        place = replicas._place

        def slow_place(worker):
            time.sleep(1.5)
            return place(worker)

        replicas._place = slow_place
        gaps = []

        async def ticker():
            while True:
                began = time.monotonic()
                await asyncio.sleep(0.01)
                gaps.append(time.monotonic() - began)

        async def lose_one_then_serve():
            await requests(3)
            assert len(replicas._channels) == 2  # both replicas took batches
            assert all(held[1] is not None for held in replicas._channels.values())
            worker = next(w for w in local.workers.values() if w.address == placed[0])
            await asyncio.to_thread(client.sync, worker.close)
            ticking = asyncio.create_task(ticker())
            await requests(50)
            ticking.cancel()

        asyncio.run(asyncio.wait_for(lose_one_then_serve(), 240))
        assert max(gaps) < 1.0, max(gaps)  # (placing took 1.5 s: the loop never waited)
        assert placed[0] not in models.placement("mlp")
        assert len(models.placement("mlp")) == 2
    finally:
        models.stop()


def test_a_replica_refuses_a_file_that_is_not_the_one_the_gateway_checked(tmp_path):
    root, path = _repository(tmp_path, 1)
    with pytest.raises(DataError, match="changed since the gateway checked it"):
        Replica("mlp", "1", path, "0" * 64)
    other = tmp_path / "other.onnx"
    shutil.copy(path, other)
    from deepx_flow.serving.model import load_model
    digest = load_model("mlp", "1", path, cluster_spec()).digest
    assert Replica("mlp", "1", str(other), digest).model.digest == digest


def test_replicas_go_on_the_gpu_workers_where_the_cluster_has_any(tmp_path, cluster):
    """The cluster as the registry describes it, one worker with a GPU (this machine has
    none: its spec says so, as a dask-cuda worker's registration would): both replicas go
    on that worker; without a GPU worker they spread over all."""
    import dataclasses

    from deepx_flow.registry.cluster import DeviceSpec
    _, client = cluster
    root, _ = _repository(tmp_path, 2)
    spec = cluster_spec(None, client)
    gpu_worker = spec.workers[1]
    with_gpu = dataclasses.replace(spec, workers=tuple(
        dataclasses.replace(w, device=DeviceSpec("gpu", "H100", 80 * 2**30))
        if w is gpu_worker else w for w in spec.workers))
    models = ModelRepository(root, with_gpu, client)
    try:
        models.load("mlp")
        assert models.placement("mlp") == [gpu_worker.address] * 2
    finally:
        models.stop()
    models = ModelRepository(root, spec, client)
    try:
        models.load("mlp")
        assert len(set(models.placement("mlp"))) == 2
    finally:
        models.stop()


@pytest.mark.timeout(300)
def test_a_request_too_large_for_one_task_runs_as_a_chunked_plan_on_the_cluster(
        tmp_path, cluster):
    """Workers described with 8 MiB each: a request of 3,000 rows (9.4 MB in) runs as a
    chunked plan over the cluster, its answers ONNX Runtime's; a small one goes to a
    replica."""
    import dataclasses

    from sqlmodel import select

    from deepx_flow.meta import open_db
    from deepx_flow.meta.models import Run
    _, client = cluster
    root, path = _repository(tmp_path, 1)
    spec = cluster_spec(None, client)
    small = dataclasses.replace(spec, workers=tuple(
        dataclasses.replace(w, memory=8 * 2**20, reserved=0) for w in spec.workers))
    models = ModelRepository(root, small, client)
    try:
        models.load("mlp")
        x = np.random.default_rng(6).standard_normal((3000, 784)).astype(np.float32)
        began = time.time()
        _, got = models.infer("mlp", "", {"x": x})
        close(got["probs"], runtime(path, {"x": x})["probs"])
        with open_db().read() as s:
            [run] = s.exec(select(Run).where(Run.started_at >= began)).all()
        assert run.status == "succeeded"
        # planned for the workers as described: the rows in several chunks
        from deepx_flow.compiler.compile import compile_graph
        graph, _ = models.model("mlp")._graph({"x": x})
        plan = compile_graph(graph, small)
        assert len(plan.partition.chunks["x"][0]) > 1
        assert run.n_tasks >= plan.stats().tasks
        models.infer("mlp", "", {"x": x[:2]})
        [(_, _, stats)] = models.snapshot()
        assert stats.chunked == 1 and stats.execution_count == 2
    finally:
        models.stop()


def test_kind_cpu_keeps_the_replicas_in_the_gateways_process(tmp_path, cluster):
    _, client = cluster
    root, path = _repository(tmp_path, 2, "KIND_CPU")
    models = ModelRepository(root, cluster_spec(None, client), client)
    try:
        models.load("mlp")
        assert models.placement("mlp") == []  # no actor: here
        x = np.random.default_rng(3).standard_normal((2, 784)).astype(np.float32)
        close(models.infer("mlp", "", {"x": x})[1]["probs"], runtime(path, {"x": x})["probs"])
    finally:
        models.stop()
    (root / "mlp" / "config.pbtxt").write_text(
        "instance_group [ { kind: KIND_CPU }, { kind: KIND_AUTO } ]\n")
    models = ModelRepository(root, cluster_spec(None, client), client)
    with pytest.raises(InputError, match="give a model's replicas one kind"):
        models.load("mlp")
    models.stop()
