"""A MobileNetV3-style network as exporters write it (issue 31's acceptance): depthwise
convolutions, batch norms folded or not, HardSigmoid and hard-swish, written at opset 11 (and
at 14 with HardSwish nodes), loads unmodified and equals ONNX Runtime within 1e-4 of its
largest output, on images read from Zarr in several chunks."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import deepx_flow as dx  # noqa: E402
from tests.onnx.mobilenet import mobilenet_v3  # noqa: E402


@pytest.mark.parametrize("fold_bn,hard_swish_op", [(False, False), (True, False),
                                                   (False, True)])
def test_a_mobilenet_v3_equals_onnx_runtime(client, tmp_path, fold_bn, hard_swish_op):
    import zarr
    path = mobilenet_v3(tmp_path / "mobilenet.onnx", size=96, fold_bn=fold_bn,
                        hard_swish_op=hard_swish_op)
    images = np.random.default_rng(2).standard_normal((12, 3, 96, 96)).astype(np.float32)
    zarr.create_array(str(tmp_path / "images.zarr"), data=images, chunks=(4, 3, 96, 96))
    written = {n.op_type for n in onnx.load(path).graph.node}
    assert {"Conv", "HardSigmoid"} <= written and ("HardSwish" in written) == hard_swish_op
    assert ("BatchNormalization" in written) != fold_bn
    model = dx.onnx.load(path)
    assert model.written_opset == (14 if hard_swish_op else 11)
    assert "BatchNormalization" not in model.ops  # folded into the convolutions on loading
    depthwise = [n for n in model.proto.graph.node if n.op_type == "Conv" and any(
        a.name == "group" and a.i > 1 for a in n.attribute)]
    assert len(depthwise) == 6
    logits = model(images=dx.read_zarr(str(tmp_path / "images.zarr")))["logits"]
    got = dx.run(logits, client=client)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    (want,) = session.run(None, {"images": images})
    assert got.shape == want.shape == (12, 10)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())
