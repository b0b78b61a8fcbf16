"""`dx.from_dask` and `dx.to_dask`: deepx_flow graphs inside Dask and xarray code.

`from_dask(array)` makes a dask array a graph input. The node is an ordinary `input` (YAML
writes it as one; its name is `dask_<token of the array>` unless named), and the tensor
carries the array (`sdk/bindings.py`), so `dx.run` binds it without being told. When the graph
runs, the array's own tasks join the run's task graph, and each task that needs a region of
the input reads the dask chunks under it (their keys are its dependencies) and cuts and joins
them to the plan's chunk grid on the worker (`runtime/inputs.py`): no chunk goes through the
driver. A graph written to YAML and read back needs the array again, as any input does:
`dx.run(graph, inputs={"dask_...": array})`.

`to_dask(t)` compiles `t` for the cluster in use and returns a `dask.array.Array` whose
chunks are the plan's output chunks and whose graph is the plan's lowered task graph (inputs
bound), so `.compute()`, `.persist()`, `da.compute`, arithmetic on it and xarray's wrapping
work as on any dask array, with any Dask scheduler. Dask runs that graph: the run is not
recorded in the metadata database, and deepx_flow's recovery (speculative backups, drift,
re-planning after running out of memory) does not watch it; `dx.run` does both.
"""

from __future__ import annotations

import numpy as np

from deepx_flow.errors import GraphError, shown
from deepx_flow.ir import Graph
from deepx_flow.ir.node import Node
from deepx_flow.sdk.bindings import bound_tensor, with_bound_inputs
from deepx_flow.sdk.tensor import Tensor


def from_dask(array, name: str | None = None) -> Tensor:
    """A dask array as a graph input whose chunks are computed by the run's own tasks.

    Parameters
    ----------
    array : dask.array.Array
        Its chunk sizes must be known (not NaN: call `array.compute_chunk_sizes()` first)
        and its dtype one deepx_flow has (`dx.input`'s). An xarray `DataArray` backed by
        dask is taken as its `.data`.
    name : str, optional
        The input's name (an identifier); by default `dask_<token of the array>`, which is
        the same for the same dask array in every process.

    Returns
    -------
    Tensor
        An input of the array's shape and dtype that carries the array: `dx.run`,
        `dx.persist`, `t.compute()` and `dx.to_dask` bind it (an `inputs=` entry of the same
        name binds something else instead).
    """
    from dask.base import tokenize

    from deepx_flow.runtime.inputs import check_dask_array, is_dask_array
    if not is_dask_array(array) and is_dask_array(getattr(array, "data", None)):
        array = array.data  # an xarray.DataArray, or anything else wrapping a dask array
    if not is_dask_array(array):
        raise GraphError(f"dx.from_dask takes a dask.array.Array, got a "
                         f"{type(array).__name__}; NumPy arrays enter as dx.input (or as "
                         f"operands), Zarr arrays through dx.read_zarr")
    if name is None:
        name = f"dask_{tokenize(array.name)[:16]}"
    elif not isinstance(name, str) or not name.isidentifier():
        raise GraphError(f"dx.from_dask: name must be an identifier, got {shown(name)}")
    shape, dtype = check_dask_array(array, f"dx.from_dask: the dask array {array.name}")
    return bound_tensor(Node(name, "input", (), shape, dtype), array, array.name, name)


def to_dask(outputs, inputs: dict | None = None, client=None, cluster=None):
    """Tensors as dask arrays backed by their compiled plan.

    Parameters
    ----------
    outputs : Tensor, a list or dict of Tensors, or a Graph
        What to compute. A list or dict (or Graph) gives a list or dict of arrays from one
        plan: they share its tasks (computed once by `dask.compute(*arrays)`).
    inputs : dict, optional
        Input name -> data, as for `dx.run` (NumPy arrays, `.npy` or Zarr paths, dask arrays,
        `dx.persist` outputs); data the tensors carry is bound without it.
    client : distributed.Client, optional
        Plan for this client's cluster (chunk sizes from its workers' memory). Without it,
        for the Dask client in use, else this machine as the embedded cluster would be.
        The arrays may be computed by any Dask scheduler.
    cluster : ClusterSpec or path, optional
        Plan for this cluster description instead.

    Returns
    -------
    dask.array.Array, or a list or dict of them
        Chunked as the plan's outputs, NumPy chunks (moved to host from GPU workers).
    """
    import dask.array as da
    from dask.highlevelgraph import HighLevelGraph

    from deepx_flow.compiler.infer import infer_types
    from deepx_flow.compiler.validate import validate_graph
    from deepx_flow.ir import dtypes
    from deepx_flow.runtime.cluster import current_client
    from deepx_flow.runtime.inputs import bind_inputs, check_sources_on
    from deepx_flow.runtime.plan_cache import cached_compile
    from deepx_flow.runtime.run import cluster_spec
    from deepx_flow.sdk.build import build_graph

    graph = infer_types(validate_graph(build_graph(outputs)))
    sources = bind_inputs(graph, with_bound_inputs(outputs, inputs))
    active = client or current_client()
    if active is not None:
        check_sources_on(sources, active)
    plan = cached_compile(graph, cluster_spec(cluster, active))
    lowered = plan.lower(sources, to_host=plan.cluster.has_devices)
    arrays = {}
    for name, node_id in graph.outputs:
        key, chunks = lowered.outputs[name]
        node = graph[node_id]
        meta = np.empty((0,) * node.ndim, dtype=np.dtype(dtypes.normalize(node.dtype)))
        layer = HighLevelGraph.from_collections(key, lowered.dsk, dependencies=())
        arrays[name] = da.Array(layer, key, chunks, meta=meta)
    if isinstance(outputs, Tensor):
        return arrays[graph.outputs[0][0]]
    if isinstance(outputs, (dict, Graph)):
        return arrays
    return [arrays[name] for name, _ in graph.outputs]
