"""The Open Inference Protocol over HTTP and gRPC, driven by tritonclient.http and .grpc,
unmodified, against a real `deepx-flow serve --model-repository`: metadata, readiness,
inference in JSON and binary equal to ONNX Runtime's, the repository's index, load and unload,
statistics that count what was sent, and a model that cannot be loaded refused by name
while the others serve."""

import shutil

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.gateway.test_serve import Served
from tests.onnx.test_onnx_import import close, cnn_model, mlp_model


def runtime(path, feed):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("serving")
    repo = root / "models"
    (repo / "mlp" / "1").mkdir(parents=True)
    mlp_model(repo / "mlp" / "1" / "model.onnx")
    (repo / "garbage" / "1").mkdir(parents=True)
    (repo / "garbage" / "1" / "model.onnx").write_bytes(b"not a model")
    (repo / "empty").mkdir()
    (repo / "cnn" / "1").mkdir(parents=True)
    cnn_model(repo / "cnn" / "1" / "model.onnx")
    server = Served(root, "--model-repository", str(repo))
    yield server, repo
    assert server.stop() == 0


def _client(served):
    return httpclient.InferenceServerClient(url=served[0].url.removeprefix("http://"))


def _infer(client, x, binary, outputs=("logits", "probs")):
    given = httpclient.InferInput("x", list(x.shape), "FP32")
    given.set_data_from_numpy(x, binary_data=binary)
    asked = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in outputs]
    return client.infer("mlp", [given], outputs=asked, request_id="r1")


def test_health_and_metadata(served):
    client = _client(served)
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "deepx_flow" and "model_repository" in meta["extensions"]
    model = client.get_model_metadata("mlp")
    assert model["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 784]}]
    assert [o["name"] for o in model["outputs"]] == ["logits", "probs"]
    assert model["versions"] == ["1"]
    assert client.is_model_ready("mlp") and client.is_model_ready("mlp", "1")
    assert not client.is_model_ready("mlp", "2") and not client.is_model_ready("garbage")


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_infer_gives_onnx_runtimes_outputs(served, binary):
    client = _client(served)
    x = np.random.default_rng(7).standard_normal((5, 784)).astype(np.float32)
    result = _infer(client, x, binary)
    want = runtime(served[1] / "mlp" / "1" / "model.onnx", {"x": x})
    close(result.as_numpy("logits"), want["logits"])
    close(result.as_numpy("probs"), want["probs"])
    assert result.get_response()["model_name"] == "mlp"
    assert result.get_response()["id"] == "r1"
    only = _infer(client, x, binary, outputs=("probs",))
    assert only.as_numpy("logits") is None
    np.testing.assert_array_equal(only.as_numpy("probs"), result.as_numpy("probs"))


def test_bad_requests_are_400_and_unknown_models_404(served):
    client = _client(served)
    x = np.zeros((2, 784), np.float32)
    cases = [("mlp", "x", x.astype(np.float64), "FP64", "400", "input 'x' is FP32, not FP64"),
             ("mlp", "x", x[:, :5], "FP32", "400", "has shape [-1, 784]"),
             ("mlp", "y", x, "FP32", "400", "no input(s) 'y'"),
             ("nope", "x", x, "FP32", "404", "model 'nope' is not in the repository"),
             ("garbage", "x", x, "FP32", "404", "not an ONNX model")]
    for model, name, data, datatype, status, says in cases:
        given = httpclient.InferInput(name, list(data.shape), datatype)
        given.set_data_from_numpy(data)
        with pytest.raises(InferenceServerException) as err:
            client.infer(model, [given])
        assert err.value.status() == status and says in err.value.message(), \
            (model, err.value)
    with pytest.raises(InferenceServerException) as err:
        client.infer("mlp", [httpclient.InferInput("x", [2, 784], "FP32")
                             .set_data_from_numpy(x)], model_version="9")
    assert err.value.status() == "404" and "no version '9'" in err.value.message()
    assert client.is_server_live()  # still serving


def test_the_repository_index_load_unload_and_statistics(served):
    client = _client(served)
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert index["mlp"]["state"] == "READY" and index["mlp"]["version"] == "1"
    assert index["garbage"]["state"] == "UNAVAILABLE"
    assert "not an ONNX model" in index["garbage"]["reason"]
    assert "no version folder" in index["empty"]["reason"]
    with pytest.raises(InferenceServerException) as err:
        client.load_model("garbage")
    assert err.value.status() == "400" and "failed to load" in err.value.message()

    client.unload_model("mlp")
    assert not client.is_model_ready("mlp")
    x = np.ones((3, 784), np.float32)
    with pytest.raises(InferenceServerException) as err:
        _infer(client, x, True)
    assert err.value.status() == "404" and "is not loaded (unloaded)" in err.value.message()
    # a second version appears; a load serves it, with statistics of its own
    shutil.copytree(served[1] / "mlp" / "1", served[1] / "mlp" / "2")
    client.load_model("mlp")
    assert client.get_model_metadata("mlp")["versions"] == ["2"]
    for rows in (3, 1, 3):
        _infer(client, np.ones((rows, 784), np.float32), True)
    with pytest.raises(InferenceServerException):
        _infer(client, np.ones((1, 5), np.float32), True)
    [stats] = client.get_inference_statistics("mlp")["model_stats"]
    assert stats["version"] == "2" and stats["inference_count"] == 7
    assert stats["execution_count"] == 3
    assert stats["inference_stats"]["success"]["count"] == 3
    assert stats["inference_stats"]["fail"]["count"] == 1
    assert {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]} == \
        {1: 1, 3: 2}
    assert [s["name"] for s in client.get_inference_statistics()["model_stats"]] == ["cnn",
                                                                                "mlp"]
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert index["mlp"]["version"] == "2"


def test_over_grpc_tritonclient_gets_the_same(served):
    import tritonclient.grpc as grpcclient
    client = grpcclient.InferenceServerClient(url=served[0].grpc)
    assert client.is_server_live() and client.is_server_ready()
    assert client.get_server_metadata().name == "deepx_flow"
    meta = client.get_model_metadata("mlp")
    assert meta.inputs[0].name == "x" and list(meta.inputs[0].shape) == [-1, 784]
    assert client.is_model_ready("mlp") and not client.is_model_ready("garbage")
    x = np.random.default_rng(8).standard_normal((4, 784)).astype(np.float32)
    given = grpcclient.InferInput("x", list(x.shape), "FP32")
    given.set_data_from_numpy(x)
    result = client.infer("mlp", [given], outputs=[grpcclient.InferRequestedOutput("probs")],
                          request_id="g1")
    want = runtime(served[1] / "mlp" / "1" / "model.onnx", {"x": x})
    close(result.as_numpy("probs"), want["probs"])
    assert result.as_numpy("logits") is None and result.get_response().id == "g1"
    for model, data, code, says in [
            ("mlp", x.astype(np.float64), "StatusCode.INVALID_ARGUMENT", "not FP64"),
            ("nope", x, "StatusCode.NOT_FOUND", "model 'nope' is not in the repository")]:
        given = grpcclient.InferInput("x", list(data.shape),
                                      "FP64" if data.dtype == np.float64 else "FP32")
        given.set_data_from_numpy(data)
        with pytest.raises(InferenceServerException) as err:
            client.infer(model, [given])
        assert err.value.status() == code and says in err.value.message()
    names = {m.name for m in client.get_model_repository_index().models}
    assert {"mlp", "cnn", "garbage", "empty"} <= names
    stats = client.get_inference_statistics("mlp").model_stats[0]
    assert stats.name == "mlp" and stats.inference_count >= 4


def test_our_messages_are_tritons_on_the_wire_and_both_load_in_one_process():
    """Every field we declare has Triton's number, type and label (tritonclient's stubs are
    Triton's own), and both sets of stubs load together."""
    from tritonclient.grpc import model_config_pb2 as triton_config, service_pb2 as triton
    from deepx_flow.contract.inference import grpc_service_pb2, model_config_pb2
    from deepx_flow.gateway.oip_grpc import SERVICE

    def fields(message):
        return {f.name: (f.number, f.type, f.is_repeated) for f in message.fields}

    def same(ours, theirs, path):
        for name, nested in ours.nested_types_by_name.items():
            same(nested, theirs.nested_types_by_name[name], f"{path}.{name}")
        mine, tritons = fields(ours), fields(theirs)
        assert {n: mine[n] for n in mine} == {n: tritons[n] for n in mine}, path

    for module, reference in ((grpc_service_pb2, triton), (model_config_pb2, triton_config)):
        for name, message in module.DESCRIPTOR.message_types_by_name.items():
            same(message, reference.DESCRIPTOR.message_types_by_name[name], name)
    service = triton.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert SERVICE == service.full_name
    ours = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    for method in ours.methods:
        theirs = service.methods_by_name[method.name]
        assert (method.input_type.name, method.output_type.name) == \
            (theirs.input_type.name, theirs.output_type.name)
    wire = triton.ModelInferRequest(model_name="m", raw_input_contents=[b"ab"])
    read = grpc_service_pb2.ModelInferRequest.FromString(wire.SerializeToString())
    assert read.model_name == "m" and list(read.raw_input_contents) == [b"ab"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_conv_net_gives_onnx_runtimes_outputs(served, protocol):
    import tritonclient.grpc as grpcclient
    module = httpclient if protocol == "http" else grpcclient
    [spec] = _client(served).get_model_metadata("cnn")["inputs"]
    client = _client(served) if protocol == "http" else \
        grpcclient.InferenceServerClient(url=served[0].grpc)
    shape = [3] + spec["shape"][1:]  # three images
    x = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    given = module.InferInput("x", shape, "FP32")
    given.set_data_from_numpy(x)
    result = client.infer("cnn", [given])
    want = runtime(served[1] / "cnn" / "1" / "model.onnx", {"x": x})
    for name, value in want.items():
        close(result.as_numpy(name), value)
