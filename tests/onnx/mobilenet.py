"""A MobileNetV3-style network written as Paddle2ONNX and PyTorch write one at opset 11 (issue
31): a stem convolution, inverted residual blocks (1x1 expansion, a depthwise 3x3 or 5x5
convolution with groups = channels, some with stride 2, squeeze-and-excitation, a 1x1
projection, a residual sum), BatchNormalization nodes after the convolutions (or folded into
them), hard-swish as `x * HardSigmoid(x)` (opset 11 has no HardSwish; with `hard_swish_op`
the model is written at opset 14 with HardSwish nodes), global average pooling and a
classifier. Used by tests/onnx/test_onnx_mobilenet.py and benchmarks/bench_inference.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

# (kernel, expanded channels, out channels, squeeze-excite, hard-swish, stride), after
# MobileNetV3-Small's first blocks
BLOCKS = [(3, 16, 16, True, False, 2), (3, 72, 24, False, False, 2),
          (3, 88, 24, False, False, 1), (5, 96, 40, True, True, 2),
          (5, 240, 40, True, True, 1), (5, 120, 48, True, True, 1)]
CLASSES = 10


class _Builder:
    def __init__(self, seed: int, fold_bn: bool, hard_swish_op: bool):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.weights = [], {}
        self.fold_bn, self.hard_swish_op = fold_bn, hard_swish_op
        self.count = 0

    def name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}_{self.count}"

    def node(self, op: str, inputs: list, **attrs) -> str:
        from onnx import helper
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def weight(self, stem: str, array: np.ndarray) -> str:
        name = self.name(stem)
        self.weights[name] = array.astype(np.float32)
        return name

    def conv_bn(self, x: str, c_in: int, c_out: int, k: int, stride: int = 1,
                groups: int = 1) -> str:
        fan_in = c_in // groups * k * k
        w = self.rng.standard_normal((c_out, c_in // groups, k, k)) * np.sqrt(2.0 / fan_in)
        gamma = self.rng.uniform(0.5, 1.5, c_out)
        beta = self.rng.uniform(-0.2, 0.2, c_out)
        mean = self.rng.uniform(-0.1, 0.1, c_out)
        var = self.rng.uniform(0.5, 1.5, c_out)
        pads = [k // 2] * 4
        if self.fold_bn:  # the exporter folded the batch norm into the convolution
            scale = gamma / np.sqrt(var + 1e-5)
            return self.node("Conv", [x, self.weight("w", w * scale[:, None, None, None]),
                                      self.weight("b", beta - mean * scale)],
                             kernel_shape=[k, k], strides=[stride, stride], pads=pads,
                             group=groups)
        y = self.node("Conv", [x, self.weight("w", w)], kernel_shape=[k, k],
                      strides=[stride, stride], pads=pads, group=groups)
        return self.node("BatchNormalization", [y, self.weight("gamma", gamma),
                                                self.weight("beta", beta),
                                                self.weight("mean", mean),
                                                self.weight("var", var)], epsilon=1e-5)

    def hard_swish(self, x: str) -> str:
        if self.hard_swish_op:
            return self.node("HardSwish", [x])
        gate = self.node("HardSigmoid", [x], alpha=1.0 / 6.0, beta=0.5)
        return self.node("Mul", [x, gate])

    def squeeze_excite(self, x: str, c: int) -> str:
        squeezed = max(8, c // 4)
        pooled = self.node("GlobalAveragePool", [x])
        w1 = self.rng.standard_normal((squeezed, c, 1, 1)) * np.sqrt(2.0 / c)
        w2 = self.rng.standard_normal((c, squeezed, 1, 1)) * np.sqrt(1.0 / squeezed)
        h = self.node("Relu", [self.node("Conv", [pooled, self.weight("se_w", w1),
                                                  self.weight("se_b", np.zeros(squeezed))],
                                         kernel_shape=[1, 1])])
        s = self.node("Conv", [h, self.weight("se_w", w2), self.weight("se_b", np.zeros(c))],
                      kernel_shape=[1, 1])
        # Paddle2ONNX writes the gate as HardSigmoid(alpha=0.2, beta=0.5)
        return self.node("Mul", [x, self.node("HardSigmoid", [s], alpha=0.2, beta=0.5)])


def mobilenet_v3(path, size: int = 224, seed: int = 0, fold_bn: bool = False,
                 hard_swish_op: bool = False) -> str:
    """Write the network to `path` (input "images" (N, 3, size, size) float32, output
    "logits" (N, 10)); opset 11, or 14 with `hard_swish_op`."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    b = _Builder(seed, fold_bn, hard_swish_op)
    x = b.hard_swish(b.conv_bn("images", 3, 16, 3, stride=2))
    c = 16
    for k, expanded, out, se, hs, stride in BLOCKS:
        act = b.hard_swish if hs else (lambda v: b.node("Relu", [v]))
        y = act(b.conv_bn(x, c, expanded, 1))
        y = act(b.conv_bn(y, expanded, expanded, k, stride=stride, groups=expanded))
        if se:
            y = b.squeeze_excite(y, expanded)
        y = b.conv_bn(y, expanded, out, 1)
        x = b.node("Add", [x, y]) if stride == 1 and c == out else y
        c = out
    x = b.hard_swish(b.conv_bn(x, c, 288, 1))
    x = b.node("Flatten", [b.node("GlobalAveragePool", [x])], axis=1)
    w = b.rng.standard_normal((288, CLASSES)) * np.sqrt(1.0 / 288)
    logits = b.node("Gemm", [x, b.weight("fc_w", w), b.weight("fc_b", np.zeros(CLASSES))])
    b.nodes[-1].output[0] = "logits"
    graph = helper.make_graph(
        b.nodes, "mobilenet_v3",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 3, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", CLASSES])],
        [numpy_helper.from_array(a, n) for n, a in b.weights.items()])
    opset = 14 if hard_swish_op else 11
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="paddle2onnx-style")
    model.ir_version = 6 if opset == 11 else 7
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return str(Path(path))
