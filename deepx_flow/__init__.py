"""deepx_flow: a dataflow engine for tensor pipelines on GPU clusters.

    import deepx_flow as dx
    x = dx.input("x", shape=(200_000, 512), dtype="float32")
    w = dx.random.normal((512, 1024), seed=0, dtype="float32")
    y = dx.relu(x @ w + 1.0).sum(axis=1)
    print(dx.compile(y).explain())
    out = dx.run(y, inputs={"x": x_np})

Names whose modules need the metadata database (assets, runs, placement: SQLAlchemy and
SQLModel, a third of a second to import) are imported on first use. A Dask worker imports
this package to run deepx_flow's kernels and needs none of them: its first task would wait
for those imports.
"""

import importlib
from typing import TYPE_CHECKING

from deepx_flow.errors import (CheckFailed, ClusterError, DatabaseError, DataError, DeepxError,
                               ExecutionError, GraphError, InputError, PlanError, SettingsError,
                               SpecError, UnknownNameError, no_attribute)
from deepx_flow.ir import Graph, Node
from deepx_flow import nn, optim
from deepx_flow.sdk import random
from deepx_flow.sdk.build import build_graph
from deepx_flow.sdk.grad import grad
from deepx_flow.sdk.functions import (abs, acosh, add, arange, argmax, argmin, asinh, atanh, cast,
                                      ceil, clip, concat, concatenate, cos, cosh, cumsum, div,
                                      equal, erf, exp, flip, floor, full, gather_nd, gelu, greater,
                                      greater_equal, input, less, less_equal, log, log_softmax,
                                      matmul, max, maximum, mean, min, minimum, mul, neg, not_equal,
                                      ones, pad, pow, prod, read_zarr, reciprocal, relu, reshape,
                                      round, scatter, scatter_add, scatter_nd, sigmoid, sign, sin,
                                      sinh, softmax, softplus, sqrt, sub, sum, take,
                                      take_along_axis, tan, tanh, transpose, where, zeros)
from deepx_flow.sdk.tensor import Tensor
from deepx_flow.sdk.dask_interop import from_dask, to_dask
from deepx_flow.sdk.numpy_dispatch import NumpyInteropError
from deepx_flow.registry.cluster import ClusterSpec, load_cluster_file
from deepx_flow.runtime.recovery import Recovery
from deepx_flow.runtime.cluster import shutdown
from deepx_flow.spec.yaml_io import from_yaml, to_yaml
from deepx_flow.train import Fit, train

__version__ = "0.1.0"

if TYPE_CHECKING:  # what type checkers and editors see of the names imported on first use
    from deepx_flow.assets import (DailyPartitions, Definitions, HourlyPartitions,
                                   MonthlyPartitions, Partition, StaticPartitions,
                                   TimeWindowPartitions, WeeklyPartitions, asset, checks, load,
                                   materialize, status)
    from deepx_flow.assets.schedule import schedule
    from deepx_flow.runtime.placement import Placement, placement
    from deepx_flow.runtime.run import Persisted
    from deepx_flow.sdk.run import compile, persist, run
    from deepx_flow.runtime.run_history import runs

# name -> the module it is imported from on first use; "module:" is the module itself
_ON_FIRST_USE = {
    **dict.fromkeys(["DailyPartitions", "Definitions", "HourlyPartitions", "MonthlyPartitions",
                     "Partition", "StaticPartitions", "TimeWindowPartitions",
                     "WeeklyPartitions", "asset", "load", "materialize", "status"],
                    "deepx_flow.assets"),
    "checks": "deepx_flow.assets.checks:",
    "onnx": "deepx_flow.onnx:",  # needs the optional onnx package
    "serving": "deepx_flow.serving:",
    "schedule": "deepx_flow.assets.schedule",
    "Placement": "deepx_flow.runtime.placement", "placement": "deepx_flow.runtime.placement",
    "Persisted": "deepx_flow.runtime.run",
    **dict.fromkeys(["compile", "persist", "run"], "deepx_flow.sdk.run"),
    **dict.fromkeys(["Cancellation", "RunCancelled"], "deepx_flow.runtime.cancel"),
    "connect": "deepx_flow.gateway.client",
    "call": "deepx_flow.sdk.call",
    "runs": "deepx_flow.runtime.run_history",
    "phases": "deepx_flow.runtime.phases",
}


def __getattr__(name: str):
    module = _ON_FIRST_USE.get(name)
    if module is None:
        raise no_attribute("dx", name, set(__all__) | set(_ON_FIRST_USE))
    value = importlib.import_module(module.rstrip(":"))
    if not module.endswith(":"):
        value = getattr(value, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_ON_FIRST_USE))

__all__ = [
    "Definitions", "asset", "checks", "load", "materialize", "status", "DailyPartitions",
    "HourlyPartitions", "MonthlyPartitions", "Partition", "StaticPartitions",
    "TimeWindowPartitions", "WeeklyPartitions", "CheckFailed", "ClusterError",
    "DatabaseError", "DataError", "DeepxError", "ExecutionError", "GraphError",
    "InputError", "NumpyInteropError", "PlanError", "SettingsError", "SpecError",
    "UnknownNameError", "Graph", "Node", "Tensor", "build_graph", "grad", "nn", "optim",
    "random",
    "ClusterSpec", "load_cluster_file", "Persisted", "Placement", "compile", "persist",
    "placement", "run", "runs", "shutdown", "from_yaml", "to_yaml", "Recovery", "Fit", "train",
    "schedule", "Cancellation", "RunCancelled", "connect", "call", "phases",
    "abs", "acosh", "add", "arange", "argmax", "argmin", "asinh", "atanh", "cast", "ceil", "clip",
    "concat", "concatenate", "cos", "cosh", "cumsum", "div", "equal", "erf", "exp", "flip", "floor",
    "from_dask", "full", "gather_nd", "gelu", "greater", "greater_equal", "input", "less",
    "less_equal", "log", "log_softmax", "matmul", "max", "maximum", "mean", "min", "minimum", "mul",
    "neg", "not_equal", "ones", "pad", "pow", "prod", "read_zarr", "reciprocal", "relu", "reshape",
    "round", "scatter", "scatter_add", "scatter_nd", "sigmoid", "sign", "sin", "sinh", "softmax",
    "softplus", "sqrt", "sub", "sum", "take", "take_along_axis", "tan", "tanh", "to_dask",
    "transpose", "where", "zeros",
]
