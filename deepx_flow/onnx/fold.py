"""Batch norms folded into the convolutions before them, as ONNX Runtime's optimizer folds
them: a pure rewrite of an ONNX graph, applied when a model is loaded.

Exporters write a network's inference batch norms as BatchNormalization nodes after its
convolutions (Paddle2ONNX and PyTorch without fusion do). Each is an elementwise pass over
the convolution's whole output, per channel `(y - mean) * gamma / sqrt(var + eps) + beta`;
folded, the convolution's weights and bias carry it and the pass is gone:

    W' = W * s,  b' = (b - mean) * s + beta,  s = gamma / sqrt(var + eps)  (per out channel)

computed in float64 and rounded once to the weights' type. A pair is folded only where the
result is the same computation: the Conv's weights (and bias) and the BatchNormalization's
four parameters are initializers, the batch norm is in inference mode with one output, and
nothing but it reads the Conv's output (which is not a graph output). The results agree
with the unfolded graph's to float rounding, as ONNX Runtime's do.
"""

from __future__ import annotations

from collections import Counter

import numpy as np


def fold_batch_norms(proto):
    """`proto` with each foldable Conv -> BatchNormalization pair as one Conv (a new model;
    `proto` itself when there is none)."""
    from onnx import numpy_helper
    graph = proto.graph
    initializers = {t.name: t for t in graph.initializer}
    readers = Counter(name for node in graph.node for name in node.input)
    outputs = {o.name for o in graph.output}
    producer = {out: node for node in graph.node for out in node.output}
    pairs = []
    for bn in graph.node:
        if bn.op_type != "BatchNormalization" or bn.domain not in ("", "ai.onnx"):
            continue
        conv = producer.get(bn.input[0])
        if conv is None or conv.op_type != "Conv" or conv.domain not in ("", "ai.onnx"):
            continue
        training = any(a.name == "training_mode" and a.i for a in bn.attribute)
        params = list(bn.input[1:5]) + list(conv.input[1:])
        if training or len([o for o in bn.output if o]) != 1 or \
                readers[conv.output[0]] != 1 or conv.output[0] in outputs or \
                not all(p in initializers for p in params if p):
            continue
        pairs.append((conv, bn))
    if not pairs:
        return proto
    folded = type(proto)()
    folded.CopyFrom(proto)
    graph = folded.graph
    arrays = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    replaced: dict[str, object] = {}
    removed = set()
    for conv, bn in pairs:
        eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
        gamma, beta, mean, var = (arrays[n].astype(np.float64) for n in bn.input[1:5])
        scale = gamma / np.sqrt(var + eps)
        w = arrays[conv.input[1]]
        bias = arrays[conv.input[2]].astype(np.float64) if len(conv.input) > 2 and \
            conv.input[2] else np.zeros(w.shape[0])
        new_w = (w.astype(np.float64) * scale.reshape((-1,) + (1,) * (w.ndim - 1)))
        new_b = (bias - mean) * scale + beta
        stem = f"{conv.name or conv.output[0]}_folded"
        replaced[conv.output[0]] = (numpy_helper.from_array(new_w.astype(w.dtype), stem + "_W"),
                                    numpy_helper.from_array(new_b.astype(w.dtype), stem + "_B"),
                                    bn.output[0])
        removed.add(bn.name or bn.output[0])
    nodes = []
    for node in graph.node:
        if node.op_type == "BatchNormalization" and (node.name or node.output[0]) in removed:
            continue
        if node.op_type == "Conv" and node.output[0] in replaced:
            w, b, out = replaced[node.output[0]]
            graph.initializer.extend([w, b])
            new = type(node)()
            new.CopyFrom(node)
            del new.input[:]
            new.input.extend([node.input[0], w.name, b.name])
            new.output[0] = out
            nodes.append(new)
            continue
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    # the folded convolutions' old weights and the batch norms' parameters, now unread
    read = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    kept = [t for t in graph.initializer if t.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return folded
