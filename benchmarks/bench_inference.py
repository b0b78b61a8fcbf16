"""Batch inference of ONNX models read from Zarr: deepx_flow against ONNX Runtime.

What: three models built with `onnx.helper`, run over samples stored in Zarr:

- an MLP 784-256-10 (Gemm, Relu, Gemm, Softmax) over 1,000,000 rows of 784 float32 (chunks of
  8,192 samples);
- a small convolutional network on 1 x 28 x 28 images (Conv 1->8 3x3, Relu, MaxPool 2,
  Conv 8->16 3x3, Relu, MaxPool 2, Flatten, Gemm 784->10) over 1,000,000 images (chunks of
  8,192);
- a MobileNetV3-style network as Paddle2ONNX writes one at opset 11 (`tests/onnx/mobilenet.py`:
  depthwise 3x3 and 5x5 convolutions, squeeze-and-excitation, batch norms, HardSigmoid and
  hard-swish) over 4,096 images of 3 x 224 x 224 (chunks of 64 images).

Contenders, on the same 2 cores, each timed from the stored samples to the results in memory:

- deepx_flow: `dx.onnx.load`, the model called on `dx.read_zarr`, `dx.run` on a LocalCluster of
  2 worker processes x 1 thread (the samples are read and decoded on the workers, chunk by
  chunk; the cluster is started before the clock);
- ONNX Runtime (CPU provider, 2 intra-op threads): the same file, run on each stored chunk as
  Zarr reads it, the outputs concatenated.

Targets: deepx_flow's samples/s at least 1.0x ONNX Runtime's for the MLP and 0.7x for the
convolutional network and the MobileNetV3. The outputs must agree (relative 1e-4, absolute
1e-4 of their scale).

Run: `python benchmarks/bench_inference.py [--quick] [--model NAME]` (--quick, a smoke test:
16,384 samples, two chunks, one run of each, no wait for a quiet machine; --model, one model
at full size, printed and not recorded: for working on it).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import common
import deepx_flow as dx

CHUNK = 8192
IMAGE_CHUNK = 64  # MobileNet images (3 x 224 x 224 float32) per stored chunk: 38 MiB

# The MobileNetV3-style model is the tests' (one builder for the test and the benchmark).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.onnx.mobilenet import mobilenet_v3  # noqa: E402


def mlp(path: Path) -> str:
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w = {"W1": rng.uniform(-0.05, 0.05, (784, 256)), "b1": rng.uniform(-0.05, 0.05, 256),
         "W2": rng.uniform(-0.1, 0.1, (256, 10)), "b2": rng.uniform(-0.1, 0.1, 10)}
    nodes = [helper.make_node("Gemm", ["x", "W1", "b1"], ["h"]),
             helper.make_node("Relu", ["h"], ["a"]),
             helper.make_node("Gemm", ["a", "W2", "b2"], ["z"]),
             helper.make_node("Softmax", ["z"], ["probs"], axis=1)]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 784])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(a.astype(np.float32), n) for n, a in w.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def cnn(path: Path) -> str:
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(1)
    w = {"W1": rng.uniform(-0.3, 0.3, (8, 1, 3, 3)), "B1": rng.uniform(-0.1, 0.1, 8),
         "W2": rng.uniform(-0.1, 0.1, (16, 8, 3, 3)), "B2": rng.uniform(-0.1, 0.1, 16),
         "W3": rng.uniform(-0.05, 0.05, (10, 784)), "B3": rng.uniform(-0.1, 0.1, 10)}
    nodes = [helper.make_node("Conv", ["x", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p1", "W2", "B2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("MaxPool", ["r2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["p2"], ["f"]),
             helper.make_node("Gemm", ["f", "W3", "B3"], ["logits"], transB=1)]
    graph = helper.make_graph(
        nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 28, 28])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(a.astype(np.float32), n) for n, a in w.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def write_samples(path: Path, shape: tuple, seed: int, chunk: int = CHUNK) -> str:
    import zarr
    z = zarr.create_array(str(path), shape=shape, chunks=(chunk,) + shape[1:],
                          dtype="float32")
    rng = np.random.default_rng(seed)
    # about 200 MiB a write, whole chunks
    step = chunk * max(1, 65536 * 784 // int(np.prod(shape[1:])) // chunk)
    for start in range(0, shape[0], step):
        stop = min(shape[0], start + step)
        z[start:stop] = rng.standard_normal((stop - start,) + shape[1:], dtype=np.float32)
    return str(path)


def run_deepx(model_path: str, data: str, client) -> tuple[float, np.ndarray]:
    began = time.perf_counter()
    model = dx.onnx.load(model_path)
    (out,) = model({model.input_names[0]: dx.read_zarr(data)}).values()
    result = dx.run(out, client=client)  # the weights travel with the tensors
    return time.perf_counter() - began, result


def run_onnxruntime(model_path: str, data: str) -> tuple[float, np.ndarray]:
    import onnxruntime as ort
    import zarr
    began = time.perf_counter()
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
    store = zarr.open_array(data, mode="r")
    name, chunk = session.get_inputs()[0].name, store.chunks[0]
    parts = [session.run(None, {name: store[start:start + chunk]})[0]
             for start in range(0, store.shape[0], chunk)]
    return time.perf_counter() - began, np.concatenate(parts)


MODELS = ("mlp", "cnn", "mobilenet_v3")


def main(quick: bool = False, repeat: int | None = None, only: str | None = None) -> dict:
    import onnxruntime as ort
    rows = 16_384 if quick else 1_000_000
    repeat = repeat or (1 if quick else 2)
    res = {"machine": common.machine_info(), "quick": quick, "blas": common.blas_info(),
           "parameters": {"rows": rows, "chunk": CHUNK, "workers": "2 processes x 1 thread",
                          "onnxruntime": ort.__version__, "repeat": repeat},
           # --quick, a smoke test, does not wait (up to 15 minutes) for a quiet machine.
           "busy_before": None if quick else common.wait_until_quiet()}
    table, results = [], {}
    with tempfile.TemporaryDirectory() as tmp, common.local_cluster(2) as client:
        tmp = Path(tmp)
        images = 128 if quick else 4096
        models = (("mlp", mlp, (rows, 784), CHUNK), ("cnn", cnn, (rows, 1, 28, 28), CHUNK),
                  ("mobilenet_v3", mobilenet_v3, (images, 3, 224, 224), IMAGE_CHUNK))
        for name, build, shape, chunk in models:
            if only and name != only:
                continue
            model_path = build(tmp / f"{name}.onnx")
            data = write_samples(tmp / f"{name}.zarr", shape, seed=len(name), chunk=chunk)
            count = shape[0]
            runs = {"deepx_flow": [], "onnxruntime": []}
            outputs = {}
            for _ in range(repeat):  # alternating, so a busy moment hits both alike
                seconds, outputs["deepx_flow"] = run_deepx(model_path, data, client)
                runs["deepx_flow"].append(seconds)
                seconds, outputs["onnxruntime"] = run_onnxruntime(model_path, data)
                runs["onnxruntime"].append(seconds)
            got, want = outputs["deepx_flow"], outputs["onnxruntime"]
            error = float(np.max(np.abs(got - want)) / np.abs(want).max())
            best = {k: min(v) for k, v in runs.items()}
            ratio = best["onnxruntime"] / best["deepx_flow"]
            results[name] = {"seconds": runs, "best_seconds": best, "samples": count,
                             "samples_per_second": {k: count / v for k, v in best.items()},
                             "deepx_vs_onnxruntime": ratio, "max_error_of_scale": error}
            table.append((name, f"{count:,}", common.fmt(count / best["deepx_flow"], 0),
                          common.fmt(count / best["onnxruntime"], 0), common.fmt(ratio),
                          f"{error:.1e}"))
    res["results"] = results
    if only:
        common.print_table(("model", "samples", "deepx_flow samples/s",
                            "ONNX Runtime samples/s", "deepx/ORT", "max |difference| / scale"),
                           table, "batch inference from Zarr, 2 cores (not recorded)")
        return res
    common.print_table(("model", "samples", "deepx_flow samples/s", "ONNX Runtime samples/s",
                        "deepx/ORT", "max |difference| / scale"), table,
                       "batch inference from Zarr, 2 cores")
    res["targets"] = {
        "mlp_vs_onnxruntime": common.target(
            "MLP samples/s at least 1.0x ONNX Runtime's", results["mlp"]["deepx_vs_onnxruntime"],
            results["mlp"]["deepx_vs_onnxruntime"] >= 1.0),
        "cnn_vs_onnxruntime": common.target(
            "convolutional network samples/s at least 0.7x ONNX Runtime's",
            results["cnn"]["deepx_vs_onnxruntime"], results["cnn"]["deepx_vs_onnxruntime"] >= 0.7),
        "mobilenet_v3_vs_onnxruntime": common.target(
            "MobileNetV3-style network (opset 11, depthwise convolutions) images/s at least "
            "0.7x ONNX Runtime's", results["mobilenet_v3"]["deepx_vs_onnxruntime"],
            results["mobilenet_v3"]["deepx_vs_onnxruntime"] >= 0.7),
        "same_outputs": common.target(
            "outputs agree: max |difference| / scale below 1e-4",
            max(r["max_error_of_scale"] for r in results.values()),
            all(r["max_error_of_scale"] < 1e-4 for r in results.values())),
    }
    common.write_results("bench_inference", res, quick)
    return res


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="16,384 samples (128 MobileNet images), one run of each")
    parser.add_argument("--model", choices=MODELS,
                        help="only this model, printed and not recorded")
    args = parser.parse_args()
    main(args.quick, only=args.model)
