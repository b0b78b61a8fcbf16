"""The served models as a gateway records them in the metadata database: counts equal to
the requests sent, a request rate from the records before, and a model unloaded or that
failed to load recorded with its reason."""

import time

import numpy as np
import pytest

from deepx_flow.errors import InputError
from deepx_flow.runtime.run import cluster_spec
from deepx_flow.serving.records import record
from deepx_flow.serving.repository import ModelRepository
from tests.onnx.test_onnx_import import mlp_model


def test_records_count_the_requests_and_their_rate(tmp_path, db):
    (tmp_path / "mlp" / "1").mkdir(parents=True)
    mlp_model(tmp_path / "mlp" / "1" / "model.onnx")
    (tmp_path / "junk" / "1").mkdir(parents=True)
    (tmp_path / "junk" / "1" / "model.onnx").write_bytes(b"\x00")
    models = ModelRepository(tmp_path, cluster_spec())
    try:
        models.load_all()
        first = {r.model: r for r in record(models, db, gateway="g:1")}
        assert first["mlp"].requests == 0 and first["mlp"].requests_per_second == 0.0
        assert first["junk"].state == "UNAVAILABLE" and "failed to load" in first["junk"].reason
        assert first["mlp"].digest == models.model("mlp").digest
        began = time.time()
        for rows in (2, 3, 4):
            models.infer("mlp", "", {"x": np.ones((rows, 784), np.float32)})
        with pytest.raises(InputError):
            models.infer("mlp", "", {"x": np.ones((1, 3), np.float32)})
        time.sleep(0.2)
        [again] = [r for r in record(models, db, gateway="g:1") if r.model == "mlp"]
        elapsed = again.updated_at - first["mlp"].updated_at
        assert (again.requests, again.failures, again.rows, again.executions) == (3, 1, 9, 3)
        assert again.requests_per_second == pytest.approx(3 / elapsed)
        assert 0 < again.latency_seconds < time.time() - began
        models.unload("mlp")
        [gone] = [r for r in record(models, db, gateway="g:1") if r.model == "mlp"]
        assert gone.state == "UNAVAILABLE" and gone.reason == "unloaded"
        assert gone.version is None and gone.replicas is None
    finally:
        models.stop()
