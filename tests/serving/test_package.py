"""A model trained by dx.train, packaged as a version of a model repository and served:
its answers equal dx.run's of the same forward graph over the trained parameters, and
ONNX Runtime's of the same graph exported; the version is written whole or not at all and
records the digests and the checkpoint it came from."""

import json

import numpy as np
import onnxruntime as ort
import pytest

import deepx_flow as dx
from deepx_flow.errors import GraphError, InputError
from deepx_flow.runtime.run import cluster_spec
from deepx_flow.serving.repository import ModelRepository


@pytest.fixture(scope="module")
def trained(client_module):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 6))
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
    logits = dx.nn.Sequential(dx.nn.Linear(6, 16, dtype="float64"), dx.relu,
                              dx.nn.Linear(16, 2, dtype="float64"))
    fit = dx.train(lambda p, a, b: dx.nn.cross_entropy(logits(p, a), b), logits.init(seed=1),
                   data=(x, y), batch_size=32, epochs=2, progress=False,
                   client=client_module)
    return fit, logits, x


@pytest.fixture(scope="module")
def client_module():
    from distributed import Client, LocalCluster
    from tests.helpers import threaded_memory_off
    with threaded_memory_off(), LocalCluster(n_workers=2, threads_per_worker=1,
                                             processes=False, dashboard_address=None) as c, \
            Client(c, set_as_default=False) as client:
        yield client


def test_a_packaged_training_serves_dx_runs_and_onnx_runtimes_answers(trained, tmp_path,
                                                                      client_module):
    fit, logits, x = trained
    forward = lambda p, x: dx.softmax(logits(p, x), axis=1)  # noqa: E731
    first = dx.serving.package("classifier", forward, fit, {"x": x[:1]}, tmp_path)
    second = dx.serving.package("classifier", forward, fit, {"x": x[:1]}, tmp_path)
    assert (first.name, second.name) == ("1", "2")
    manifest = json.loads((second / "package.json").read_text())
    assert manifest["checkpoint"] == fit.checkpoint and manifest["training"] == fit.training_id
    assert len(manifest["graph_sha256"]) == len(manifest["weights_sha256"]) == 64
    assert not [p for p in (tmp_path / "classifier").iterdir() if p.name.startswith(".")]

    models = ModelRepository(tmp_path, cluster_spec())
    try:
        models.load_all()
        meta = models.model("classifier").metadata()
        assert meta["versions"] == ["2"] and meta["inputs"] == [
            {"name": "x", "datatype": "FP64", "shape": [-1, 6]}]
        rows = x[:9]
        _, got = models.infer("classifier", "", {"x": rows})
        want = dx.run(forward(fit.params, dx.input("x", rows.shape, "float64")),
                      inputs={**fit.inputs, "x": rows}, client=client_module)
        np.testing.assert_allclose(got["output"], want, rtol=1e-12, atol=1e-12)
        # the same graph exported, as ONNX Runtime computes it
        path = tmp_path / "classifier.onnx"
        dx.onnx.save(forward(fit.params, dx.input("x", rows.shape, "float64")), path,
                     inputs=fit.inputs)
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        [reference] = session.run(None, {"x": rows})
        np.testing.assert_allclose(got["output"], reference, rtol=1e-5, atol=1e-12)
    finally:
        models.stop()


def test_a_package_that_cannot_be_built_writes_nothing(trained, tmp_path):
    fit, logits, x = trained
    with pytest.raises(GraphError, match="forward raised ZeroDivisionError"):
        dx.serving.package("m", lambda p, x: 1 / 0, fit, {"x": x[:1]}, tmp_path)
    with pytest.raises(GraphError, match="does not read input"):
        dx.serving.package("m", lambda p, x, y: logits(p, x), fit,
                           {"x": x[:1], "y": x[:1]}, tmp_path)
    with pytest.raises(InputError, match="not a dx.train result"):
        dx.serving.package("m", lambda p, x: x, [1, 2], {"x": x[:1]}, tmp_path)
    with pytest.raises(InputError, match="model name"):
        dx.serving.package("../m", lambda p, x: x, fit, {"x": x[:1]}, tmp_path)
    assert not (tmp_path / "m").exists() or not list((tmp_path / "m").iterdir())


def test_a_package_whose_files_changed_is_refused_at_load_and_the_others_serve(
        trained, tmp_path):
    """package.json records the SHA-256 of the graph and of the parameters: a byte changed
    in either, or a file gone, and the model is refused with its reason; an intact
    package beside it serves."""
    fit, logits, x = trained
    forward = lambda p, x: logits(p, x)  # noqa: E731
    for name in ("intact", "weights_flipped", "graph_edited", "weights_gone"):
        dx.serving.package(name, forward, fit, {"x": x[:1]}, tmp_path)
    weights = tmp_path / "weights_flipped" / "1" / "weights.npz"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(bytes(data))
    spec = tmp_path / "graph_edited" / "1" / "model.yaml"
    spec.write_text(spec.read_text().replace('"deepx": 1', '"deepx": 1 '))
    (tmp_path / "weights_gone" / "1" / "weights.npz").unlink()
    models = ModelRepository(tmp_path, cluster_spec())
    try:
        models.load_all()
        index = {m["name"]: m for m in models.index()}
        assert index["intact"]["state"] == "READY"
        for name, says in [("weights_flipped", "weights.npz: damaged or changed since"),
                           ("graph_edited", "model.yaml: damaged or changed since"),
                           ("weights_gone", "weights.npz: missing")]:
            assert index[name]["state"] == "UNAVAILABLE", index[name]
            assert says in index[name]["reason"], index[name]
        _, got = models.infer("intact", "", {"x": x[:3]})
        assert got["output"].shape == (3, 2)
    finally:
        models.stop()


def test_each_package_is_a_version_of_its_models_asset_bound_to_its_checkpoint(
        trained, tmp_path, client_module):
    """A package is recorded as a version of the asset model.<name>: its code version the
    graph's digest, its manifest digest package.json's, its upstream the training
    checkpoint whose parameters it binds; package.json names the asset version, the row
    the version folder. It holds no array: dx.load says what it is."""
    import hashlib

    import uuid

    from deepx_flow.assets import catalog
    from deepx_flow.meta import open_db
    _, logits, x = trained
    # (the session's database is shared: names of this run's own)
    scorer, plain = (f"{n}_{uuid.uuid4().hex[:8]}" for n in ("scorer", "plain"))
    y = (x[:, 0] > 0).astype(np.int64)
    fit = dx.train(lambda p, a, b: dx.nn.cross_entropy(logits(p, a), b), logits.init(seed=2),
                   data=(x, y), batch_size=64, epochs=1, progress=False, client=client_module,
                   checkpoint=f"{scorer}_training")
    assert fit.checkpoint is not None
    forward = lambda p, x: logits(p, x)  # noqa: E731
    folders = [dx.serving.package(scorer, forward, fit, {"x": x[:1]}, tmp_path)
               for _ in range(2)]
    db = open_db()
    rows = {r.version: r for r in catalog.history(db, f"model.{scorer}")}
    assert len(rows) == 2
    [checkpoint] = [r for r in catalog.history(db, f"{scorer}_training")
                    if r.version == fit.checkpoint]
    for folder in folders:
        manifest = json.loads((folder / "package.json").read_text())
        row = rows[manifest["asset_version"]]
        assert manifest["asset"] == row.asset == f"model.{scorer}"
        assert row.code_version == manifest["graph_sha256"]
        assert row.manifest_digest == hashlib.sha256(
            (folder / "package.json").read_bytes()).hexdigest()
        assert catalog.upstream_versions(row) == {checkpoint.asset: fit.checkpoint}
        assert row.uri == str(folder.resolve()) and row.storage == "model-package"
    with pytest.raises(InputError, match="is a served model's package"):
        dx.load(f"model.{scorer}")
    # `deepx-flow assets verify` checks a package's files against what is recorded
    from deepx_flow.cli.main import main
    assert main(["assets", "verify", f"model.{scorer}", "--db", db.url]) == 0
    weights = folders[0] / "weights.npz"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(bytes(data))
    assert main(["assets", "verify", f"model.{scorer}", "--db", db.url]) == 2
    # parameters given as arrays: a version with no upstream
    arrays = dx.serving.package(plain, forward, dict(fit.values), {"x": x[:1]}, tmp_path)
    [row] = catalog.history(db, f"model.{plain}")
    assert row.version == json.loads((arrays / "package.json").read_text())["asset_version"]
    assert catalog.upstream_versions(row) == {}
    # a checkpoint the database given does not hold: refused before anything is written
    with pytest.raises(InputError, match="is not in the metadata database"):
        dx.serving.package("elsewhere", forward, fit, {"x": x[:1]}, tmp_path,
                           db=f"sqlite:///{tmp_path / 'other.db'}")
    assert not (tmp_path / "elsewhere").exists()
