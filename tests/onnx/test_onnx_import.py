"""`dx.onnx.load` and the `deepx-flow onnx` command: models built with `onnx.helper` give
ONNX Runtime's outputs, an MLP on an input three times a worker's memory included; every
model deepx_flow cannot take is one error naming the file or the ONNX node."""

from __future__ import annotations

import logging
import subprocess
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import deepx_flow as dx  # noqa: E402
from deepx_flow.errors import InputError, SpecError  # noqa: E402
from deepx_flow.ir.keys import node_of  # noqa: E402
from tests.helpers import WorkerRss  # noqa: E402


def mlp_model(path, features=784, hidden=256, classes=10, opset=17, seed=0):
    rng = np.random.default_rng(seed)
    weights = {"W1": rng.uniform(-0.05, 0.05, (features, hidden)).astype(np.float32),
               "b1": rng.uniform(-0.05, 0.05, hidden).astype(np.float32),
               "W2": rng.uniform(-0.1, 0.1, (hidden, classes)).astype(np.float32),
               "b2": rng.uniform(-0.1, 0.1, classes).astype(np.float32)}
    nodes = [helper.make_node("Gemm", ["x", "W1", "b1"], ["h"], name="fc1"),
             helper.make_node("Relu", ["h"], ["a"], name="act"),
             helper.make_node("Gemm", ["a", "W2", "b2"], ["logits"], name="fc2"),
             helper.make_node("Softmax", ["logits"], ["probs"], axis=1, name="softmax")]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", features])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes]),
         helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", classes])],
        [numpy_helper.from_array(a, n) for n, a in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]),
              str(path))
    return str(path)


def runtime(path, feed):
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))


def close(got, want):
    """Within 1e-5 relative, and an absolute 1e-5 of the output's scale (float32 sums of
    784 terms in another order)."""
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def test_an_mlp_gives_onnx_runtimes_outputs(client, tmp_path):
    path = mlp_model(tmp_path / "mlp.onnx")
    model = dx.onnx.load(path)
    assert model.input_names == ["x"] and model.output_names == ["logits", "probs"]
    assert model.input_types["x"] == ((None, 784), "float32")
    data = np.random.default_rng(1).standard_normal((3000, 784)).astype(np.float32)
    outs = model(x=dx.input("x", data.shape, "float32"))
    logits, probs = dx.run([outs["logits"], outs["probs"]],
                           inputs={**model.inputs, "x": data}, client=client)
    want = runtime(path, {"x": data})
    close(logits, want["logits"])
    close(probs, want["probs"])
    # one output alone reads the weights it needs
    only = model.inputs_for(outs["logits"])
    assert set(only) == set(model.inputs)
    np.testing.assert_array_equal(dx.run(outs["logits"], inputs={**only, "x": data},
                                         client=client), logits)


LIMIT = 160 * 2**20


@pytest.mark.slow
def test_an_mlp_on_an_input_three_times_a_workers_memory(tmp_path):
    """Two workers of 160 MiB read 480 MiB of features from Zarr chunk by chunk; the
    results equal ONNX Runtime's on the whole array, and no worker's memory passed its
    limit. A worker's imports alone take about 120 MiB of the 160, so the stored chunks
    are 6 MiB (2,048 rows): a chunk is decoded whole, and 25 MiB ones (8,192 rows) left a
    worker no room for a second while the first was in use."""
    import zarr
    rows = 3 * LIMIT // (784 * 4)
    store = zarr.create_array(str(tmp_path / "x.zarr"), shape=(rows, 784), chunks=(2048, 784),
                              dtype="float32")
    rng = np.random.default_rng(2)
    for start in range(0, rows, 32768):
        stop = min(rows, start + 32768)
        store[start:stop] = rng.standard_normal((stop - start, 784), dtype=np.float32)
    path = mlp_model(tmp_path / "mlp.onnx")
    got, peak = run_on_small_workers(path, str(tmp_path / "x.zarr"), "probs", LIMIT)
    want = runtime(path, {"x": store[:]})["probs"]
    close(got, want)
    assert 0 < peak < LIMIT, f"a worker's memory reached {peak / 2**20:.0f} MiB"


def run_on_small_workers(model_path: str, data: str, output: str, limit: int):
    """The model's `output` on the Zarr array `data`, computed by 2 worker processes of
    `limit` bytes each; and the largest worker memory sampled meanwhile."""
    from distributed import Client, LocalCluster
    model = dx.onnx.load(model_path)
    with LocalCluster(n_workers=2, threads_per_worker=1, memory_limit=limit, processes=True,
                      dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as client, WorkerRss(client) as rss:
        got = dx.run(model(x=dx.read_zarr(data))[output], client=client)
    return got, rss.peak


def test_graph_inputs_are_checked_against_the_model(tmp_path):
    model = dx.onnx.load(mlp_model(tmp_path / "mlp.onnx"))
    with pytest.raises(InputError, match="input 'x' is float32\\(\\?, 784\\) in the model, "
                                         "got float64"):
        model(x=dx.input("x", (5, 784), "float64"))
    with pytest.raises(InputError, match="got float32\\(5, 783\\)"):
        model(x=dx.input("x", (5, 783), "float32"))
    with pytest.raises(InputError, match="unknown input\\(s\\) 'y'; missing input\\(s\\) 'x'"):
        model(y=dx.input("y", (5, 784), "float32"))
    with pytest.raises(InputError, match="must be a deepx_flow tensor"):
        model(x=[[1.0]])


def _one_node_model(path, node, inputs, outputs, opset=17, initializers=()):
    graph = helper.make_graph([node], "g", inputs, outputs, list(initializers))
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]),
              str(path))
    return str(path)


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def test_what_cannot_be_converted_is_one_error_naming_the_node(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        dx.onnx.load(tmp_path / "missing.onnx")
    (tmp_path / "junk.onnx").write_bytes(b"\x00not a protobuf at all\xff" * 10)
    with pytest.raises(SpecError, match="junk.onnx"):
        dx.onnx.load(tmp_path / "junk.onnx")
    unsupported = _one_node_model(
        tmp_path / "det.onnx", helper.make_node("Det", ["x"], ["y"], name="the_det"),
        [_vi("x", [3, 3])], [_vi("y", [])])
    with pytest.raises(SpecError, match="ONNX node 'the_det' \\(Det\\): operator Det is not "
                                        "supported"):
        dx.onnx.load(unsupported)
    old = _one_node_model(tmp_path / "old.onnx", helper.make_node("Crop", ["x"], ["y"],
                                                                  name="the_crop"),
                          [_vi("x", [1, 1, 3, 3])], [_vi("y", [1, 1, 3, 3])], opset=1)
    with pytest.raises(SpecError, match="opset 1 cannot be upgraded to 13 with "
                                        "onnx.version_converter: operator.s. Crop have no "
                                        "form at opset 13"):
        dx.onnx.load(old)
    complex64 = _one_node_model(tmp_path / "c64.onnx",
                                helper.make_node("Identity", ["x"], ["y"]),
                                [_vi("x", [3], TensorProto.COMPLEX64)],
                                [_vi("y", [3], TensorProto.COMPLEX64)])
    with pytest.raises(SpecError, match="data type COMPLEX64 is not supported"):
        dx.onnx.load(complex64)(x=dx.input("x", (3,), "float32"))
    zero = _one_node_model(
        tmp_path / "zero.onnx",
        helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["y"], name="still"),
        [_vi("x", [4])], [_vi("y", [0])],
        initializers=[numpy_helper.from_array(np.array([v], np.int64), n)
                      for n, v in (("s", 0), ("e", 4), ("a", 0), ("st", 0))])
    with pytest.raises(SpecError, match="node name: still.*'step' cannot be 0"):
        dx.onnx.load(zero)  # ONNX's own shape inference names it


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "deepx_flow.cli.main", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_the_onnx_command_inspects_and_runs_a_model(tmp_path):
    import zarr
    path = mlp_model(tmp_path / "mlp.onnx", features=20, hidden=16, classes=3)
    data = np.random.default_rng(3).standard_normal((1000, 20)).astype(np.float32)
    np.save(tmp_path / "x.npy", data)
    z = zarr.create_array(str(tmp_path / "x.zarr"), shape=data.shape, chunks=(256, 20),
                          dtype="float32")
    z[:] = data
    env_db = f"sqlite:///{tmp_path / 'deepx.db'}"
    res = _cli("onnx", "inspect", "mlp.onnx", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "every operator is supported" in res.stdout and "(?, 20)" in res.stdout
    res = _cli("onnx", "run", "mlp.onnx", "--input", "x=x.zarr", "--output", "probs=p.zarr",
               "--output", "logits=l.npy", "--db", env_db, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    want = runtime(path, {"x": data})
    close(zarr.open_array(str(tmp_path / "p.zarr"), mode="r")[:], want["probs"])
    close(np.load(tmp_path / "l.npy"), want["logits"])
    res = _cli("onnx", "run", "mlp.onnx", "--input", "x=x.npy", "--db", env_db, cwd=tmp_path)
    assert res.returncode == 0 and "probs: shape (1000, 3) float32" in res.stdout, res.stderr


def test_the_onnx_command_refuses_in_one_line_with_exit_2(tmp_path):
    mlp_model(tmp_path / "mlp.onnx", features=20, hidden=16, classes=3)
    _one_node_model(tmp_path / "det.onnx", helper.make_node("Det", ["x"], ["y"], name="d"),
                    [_vi("x", [3, 3])], [_vi("y", [])])
    np.save(tmp_path / "x.npy", np.zeros((4, 21), np.float32))
    cases = [(("onnx", "run", "det.onnx"), "operator Det is not supported"),
             (("onnx", "run", "mlp.onnx", "--input", "x=x.npy"), "input 'x' is float32(?, 20)"),
             (("onnx", "run", "mlp.onnx", "--input", "x=none.npy"), "none.npy does not exist"),
             (("onnx", "run", "mlp.onnx", "--output", "nope=o.npy"), "--output names nope"),
             (("onnx", "inspect", "absent.onnx"), "absent.onnx does not exist")]
    for args, message in cases:
        res = _cli(*args, cwd=tmp_path)
        assert res.returncode == 2, (args, res.stdout, res.stderr)
        assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    res = _cli("onnx", "inspect", "det.onnx", cwd=tmp_path)
    assert res.returncode == 0 and "not supported: Det" in res.stdout


def cnn_model(path, seed=0, stride=1):
    """Conv 1->4 (3x3, same, `stride`) -> Relu -> MaxPool 2 -> Conv 4->8 (3x3, stride 1,
    pads 1) -> Relu -> GlobalAveragePool -> Flatten -> Gemm 8->10: a small image
    classifier."""
    rng = np.random.default_rng(seed)
    weights = {"W1": rng.uniform(-0.5, 0.5, (4, 1, 3, 3)).astype(np.float32),
               "B1": rng.uniform(-0.1, 0.1, 4).astype(np.float32),
               "W2": rng.uniform(-0.3, 0.3, (8, 4, 3, 3)).astype(np.float32),
               "B2": rng.uniform(-0.1, 0.1, 8).astype(np.float32),
               "W3": rng.uniform(-0.5, 0.5, (10, 8)).astype(np.float32),
               "B3": rng.uniform(-0.1, 0.1, 10).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "W1", "B1"], ["c1"], auto_pad="SAME_UPPER",
                              kernel_shape=[3, 3], strides=[stride, stride], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p1", "W2", "B2"], ["c2"], pads=[1, 1, 1, 1],
                              name="conv2"),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "W3", "B3"], ["logits"], transB=1)]
    graph = helper.make_graph(
        nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 16, 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(a, n) for n, a in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              str(path))
    return str(path)


# A worker process holds about 105 MiB before any task; Dask pauses one at 80% of its limit,
# which at 160 MiB left the conv net's intermediate chunks too little room (the run waited on
# paused workers).
CNN_LIMIT = 256 * 2**20


@pytest.mark.slow
def test_a_conv_net_on_an_input_three_times_a_workers_memory(tmp_path):
    """Images (N, 1, 16, 16) three times a worker's 256 MiB, read from Zarr in chunks of
    4,096 images; the logits equal ONNX Runtime's on the whole array, and no worker's memory
    passed its limit. The first convolution strides by 2: the bytes read are the test, and
    a quarter of the arithmetic after it keeps it short."""
    import zarr
    rows = 3 * CNN_LIMIT // (16 * 16 * 4)
    store = zarr.create_array(str(tmp_path / "x.zarr"), shape=(rows, 1, 16, 16),
                              chunks=(4096, 1, 16, 16), dtype="float32")
    rng = np.random.default_rng(4)
    for start in range(0, rows, 65536):
        stop = min(rows, start + 65536)
        store[start:stop] = rng.standard_normal((stop - start, 1, 16, 16), dtype=np.float32)
    path = cnn_model(tmp_path / "cnn.onnx", stride=2)
    got, peak = run_on_small_workers(path, str(tmp_path / "x.zarr"), "logits", CNN_LIMIT)
    want = runtime(path, {"x": store[:]})["logits"]
    close(got, want)
    assert 0 < peak < CNN_LIMIT, f"a worker's memory reached {peak / 2**20:.0f} MiB"


def test_conv_transpose_with_an_output_shape_pads_as_onnx_runtime(client, tmp_path):
    """An odd total padding from output_shape goes to the start (the spec's non-SAME_UPPER
    branch); the node tests only cover even ones."""
    w = np.ones((1, 1, 3, 3), np.float32)
    path = _one_node_model(
        tmp_path / "ct.onnx", helper.make_node("ConvTranspose", ["x", "w"], ["y"],
                                               output_shape=[4, 4], name="ct"),
        [_vi("x", [1, 1, 3, 3])], [_vi("y", [1, 1, 4, 4])],
        initializers=[numpy_helper.from_array(w, "w")])
    data = np.arange(9, dtype=np.float32).reshape(1, 1, 3, 3)
    model = dx.onnx.load(path)
    got = dx.run(model(x=dx.input("x", data.shape, "float32"))["y"],
                 inputs={**model.inputs, "x": data}, client=client)
    np.testing.assert_allclose(got, runtime(path, {"x": data})["y"], rtol=1e-6)


def test_a_malformed_node_is_a_spec_error_not_a_traceback(tmp_path):
    path = _one_node_model(
        tmp_path / "pow.onnx", helper.make_node("Pow", ["a", "b"], ["y"], name="neg_pow"),
        [], [_vi("y", [2], TensorProto.INT64)],
        initializers=[numpy_helper.from_array(np.array([2, 3], np.int64), "a"),
                      numpy_helper.from_array(np.array([-1, 2], np.int64), "b")])
    model = dx.onnx.load(path)
    with pytest.raises(SpecError, match="ONNX node 'neg_pow' \\(Pow\\): ValueError"):
        model({})


def test_a_models_weights_move_to_each_worker_once(client, tmp_path):
    """Batch inference over many chunks of images: each weight is one task, and each worker
    fetches it at most once however many of its chunks read it (Dask keeps it there)."""
    import zarr
    store = zarr.create_array(str(tmp_path / "x.zarr"), shape=(4096, 1, 16, 16),
                              chunks=(256, 1, 16, 16), dtype="float32")
    store[:] = np.random.default_rng(6).standard_normal((4096, 1, 16, 16), dtype=np.float32)
    path = cnn_model(tmp_path / "cnn.onnx")
    model = dx.onnx.load(path)
    weights = set(model.inputs)

    def fetched(dask_worker):
        return [k[0] if isinstance(k, tuple) else k
                for entry in dask_worker.transfer_incoming_log for k in entry["keys"]]

    from distributed import get_task_stream
    before = client.run(fetched)
    with get_task_stream(client=client) as stream:
        got = dx.run(model(x=dx.read_zarr(str(tmp_path / "x.zarr")))["logits"],
                     client=client)  # the weights travel with the tensors
    close(got, runtime(path, {"x": store[:]})["logits"])
    computed = [node_of(t["key"]) for t in stream.data]
    assert all(computed.count(w) == 1 for w in weights), computed  # each made once
    logits = model(x=dx.read_zarr(str(tmp_path / "x.zarr")))["logits"]
    chunks = dx.compile(logits, client=client).chunks[logits.node.id][0]
    assert len(chunks) >= 2 * len(client.run(fetched))  # several tasks per worker
    for worker, keys in client.run(fetched).items():
        new = keys[len(before[worker]):]
        counts = {w: sum(1 for k in new if node_of(k) == w) for w in weights}
        assert max(counts.values()) <= 1, (worker, counts)

