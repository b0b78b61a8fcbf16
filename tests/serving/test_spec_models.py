"""Graph specs with bound weights as served models: `model.yaml` beside `weights.npz`, the
arrays bound to the spec's inputs of their names and the others the request's, a batch
axis where the spec holds together with another size there; answers equal NumPy's in
float64; a weights file or spec that does not fit is refused at load with its reason."""

import numpy as np
import pytest
import yaml

from deepx_flow.errors import InputError
from deepx_flow.runtime.run import cluster_spec
from deepx_flow.serving.repository import ModelRepository

SPEC = {"deepx": 1,
        "inputs": {"x": {"shape": [1, 4], "dtype": "float32"},
                   "w": {"shape": [4, 3], "dtype": "float32"},
                   "b": {"shape": [3], "dtype": "float32"}},
        "nodes": [{"id": "xw", "op": "matmul", "args": ["x", "w"]},
                  {"id": "z", "op": "add", "args": ["xw", "b"]},
                  {"id": "y", "op": "relu", "args": ["z"]}],
        "outputs": ["y"]}


def _weights(seed=0, w_shape=(4, 3)):
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal(w_shape).astype(np.float32),
            "b": rng.standard_normal(3).astype(np.float32)}


def _model(root, name, spec=SPEC, weights=None):
    folder = root / name / "1"
    folder.mkdir(parents=True)
    (folder / "model.yaml").write_text(yaml.safe_dump(spec))
    if weights is not None:
        np.savez(folder / "weights.npz", **weights)


def test_a_spec_with_bound_weights_serves_batches_as_numpy_computes_them(tmp_path):
    weights = _weights()
    _model(tmp_path, "scorer", weights=weights)
    fixed = dict(SPEC, nodes=SPEC["nodes"] + [
        {"id": "flat", "op": "reshape", "args": ["y"], "shape": [3]}], outputs=["flat"])
    _model(tmp_path, "fixed", spec=fixed, weights=weights)
    _model(tmp_path, "wrong_shape", weights=_weights(w_shape=(5, 3)))
    _model(tmp_path, "stray", weights={**weights, "v": np.zeros(2, np.float32)})
    _model(tmp_path, "typo", spec=dict(SPEC, nodes=[dict(SPEC["nodes"][0], op="matmull")]
                                       + SPEC["nodes"][1:]), weights=weights)
    models = ModelRepository(tmp_path, cluster_spec())
    try:
        models.load_all()
        index = {m["name"]: m for m in models.index()}
        assert index["scorer"]["state"] == index["fixed"]["state"] == "READY"
        for name, says in [
                ("wrong_shape", "array 'w' is float32(5, 3), but the spec's input is "
                                "float32(4, 3)"),
                ("stray", "array 'v' binds no input of the spec"),
                ("typo", "unknown operator 'matmull'")]:
            assert index[name]["state"] == "UNAVAILABLE" and says in index[name]["reason"], \
                index[name]
        meta = models.model("scorer").metadata()
        assert meta["platform"] == "deepx_flow_graph"
        assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
        assert meta["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, 3]}]
        x = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)
        _, got = models.infer("scorer", "", {"x": x})
        want = np.maximum(x.astype(np.float64) @ weights["w"] + weights["b"], 0)
        np.testing.assert_allclose(got["y"], want, rtol=1e-6, atol=1e-6)
        # a spec whose own shapes fix its batch: served at that shape only
        assert models.model("fixed").metadata()["inputs"][0]["shape"] == [1, 4]
        with pytest.raises(InputError, match=r"has shape \[1, 4\]"):
            models.infer("fixed", "", {"x": x})
        _, one = models.infer("fixed", "", {"x": x[:1]})
        np.testing.assert_allclose(one["flat"], want[0], rtol=1e-6, atol=1e-6)
        # weights are the model's: a request cannot send them
        with pytest.raises(InputError, match="no input"):
            models.infer("scorer", "", {"x": x, "w": weights["w"]})
    finally:
        models.stop()


def test_the_digest_covers_the_weights(tmp_path):
    _model(tmp_path, "scorer", weights=_weights(0))
    models = ModelRepository(tmp_path, cluster_spec())
    try:
        first = models.load("scorer").digest
        np.savez(tmp_path / "scorer" / "1" / "weights.npz", **_weights(1))
        assert models.load("scorer").digest != first
    finally:
        models.stop()


def test_a_model_is_prepared_for_each_batch_size_and_each_batch_gets_its_own_answer(
        tmp_path):
    """With dynamic batching, a model is built, compiled and lowered at load for every
    size a padded batch runs as; each batch then fills the prepared graph with its own
    rows (nothing of an earlier batch is left in it)."""
    weights = _weights(3)
    _model(tmp_path, "scorer", weights=weights)
    (tmp_path / "scorer" / "config.pbtxt").write_text(
        "max_batch_size: 8\ndynamic_batching { }\n")
    models = ModelRepository(tmp_path, cluster_spec())
    try:
        models.load_all()
        model = models.model("scorer")
        assert sorted(shapes[0][1][0] for shapes in model._executables) == [1, 2, 4, 8]
        rng = np.random.default_rng(4)
        for rows in (8, 3, 8, 1, 5):
            x = rng.standard_normal((rows, 4)).astype(np.float32)
            _, got = models.infer("scorer", "", {"x": x})
            want = np.maximum(x.astype(np.float64) @ weights["w"] + weights["b"], 0)
            np.testing.assert_allclose(got["y"], want, rtol=1e-6, atol=1e-6)
        assert len(model._executables) == 4  # padded batches: no size past those
    finally:
        models.stop()
