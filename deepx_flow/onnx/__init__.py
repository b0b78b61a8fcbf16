"""ONNX models as deepx_flow graphs and back (`dx.onnx`): import for chunked batch inference,
export of the graphs built here.

    model = dx.onnx.load("mlp.onnx")                  # checked and shape-inferred
    x = dx.read_zarr("data/images.zarr")              # (N, 784), N larger than memory
    scores = model(input=x)["logits"]                 # a deepx_flow tensor
    out = dx.run(scores.argmax(axis=1))               # the weights travel with the tensors

A model's graph becomes ordinary deepx_flow nodes: its batch axis is chunked to the
workers' memory like any tensor's, its elementwise chains fuse, and it can be
differentiated. Its initializers (the weights) become named inputs that carry their
arrays, so a run, persist, asset or export of the outputs binds them without being told
(`model.inputs` holds them by name as well); integer constants (shapes, axes, indices) and
small float ones computed from them are folded while the graph is built.

`dx.onnx.save(outputs, path, inputs=weights)` is the way back: a graph built here written
as an ONNX model, its bound inputs as initializers (`deepx_flow.onnx.export`).

`SUPPORTED` (in `deepx_flow.onnx.converters`) is the table of the ONNX operators that convert, with
the opsets they are read from; an operator, attribute or data type outside it is one
`dx.SpecError` naming the ONNX node and its op type. Needs the `onnx` package (the `onnx`
extra).
"""

from deepx_flow.onnx.export import save
from deepx_flow.onnx.model import OnnxModel, load
from deepx_flow.onnx.converters import SUPPORTED

__all__ = ["OnnxModel", "SUPPORTED", "load", "save"]
