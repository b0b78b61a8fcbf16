"""Running a served model's graph in this thread, without a scheduler: what each batch of
requests does, where a round trip through the cluster's scheduler would cost more than
the model.

An `Executable` is a graph for one set of input shapes (a batch size, for most models),
prepared once: compiled for `cluster` as any run's graph is, lowered with the weights it
carries bound and a slot for each input a request gives, and its tasks put in Dask's order.
A call fills the slots with a batch's arrays and runs the tasks in that order, dropping
each value once its last reader ran; each output is assembled from its chunks. Preparing
(lowering, ordering, hashing the weights) costs ten times what running a small model's
batch does, so it is done once per shape, not per batch. A request too large for one task
goes to the cluster as a chunked plan instead (`repository.py`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from deepx_flow.errors import DeepxError, ExecutionError
from deepx_flow.kernels.batch_chain import kept_between_calls
from deepx_flow.kernels.tasks import to_device
from deepx_flow.runtime.inputs import region_block


@dataclass(frozen=True)
class Slot:
    """A graph input filled at each call: its chunk tasks cut the call's array."""

    name: str

    @property
    def token(self) -> str:  # (the chunk keys' content address: the same every call)
        return f"slot-{self.name}"

    def key(self) -> tuple:
        return ("slot", self.name)

    def task(self, key, region):
        from deepx_flow.compiler.taskspec import ref, task
        return task(key, _block, ref(self.key()), tuple(region))


def _block(array, region):  # (a task: its imports are the module's, not each call's)
    return to_device(region_block(array, region))


class Executable:
    """`graph` (checked and typed) computed for `cluster`, with `carried` (input name ->
    value: the weights a model binds) bound; called with the other inputs' arrays, it
    gives every output (name -> array)."""

    def __init__(self, graph, carried: dict, cluster):
        from dask.order import order

        from deepx_flow.runtime.inputs import bind_inputs
        from deepx_flow.runtime.plan_cache import cached_compile
        self.graph = graph
        self.slots = [Slot(n.id) for n in graph.inputs if n.id not in carried]
        # the weights checked and bound as any run's inputs are; zeros stand in for the
        # slots (unwritten pages: they cost nothing) and are replaced before lowering
        stand_ins = {s.name: np.zeros(graph[s.name].shape, graph[s.name].dtype)
                     for s in self.slots}
        # the weights read-only: no call writes them, and a kernel that keeps its plans
        # from call to call keeps them only over read-only operands (`kernels.batch_chain`)
        sources = bind_inputs(graph, {**{n: _read_only(v) for n, v in carried.items()},
                                      **stand_ins})
        sources.update({s.name: s for s in self.slots})
        self.plan = cached_compile(graph, cluster)
        lowered = self.plan.lower(sources, to_host=False)
        self.output_keys = {name: lowered.output_keys(name) for name, _ in graph.outputs}
        self.chunks = {name: lowered.outputs[name][1] for name, _ in graph.outputs}
        wanted = {k for keys in self.output_keys.values() for k in keys}
        rank = order(lowered.dsk)
        steps = sorted(lowered.dsk.items(), key=lambda item: rank[item[0]])
        last_reader = {}
        for at, (key, node) in enumerate(steps):
            for dep in getattr(node, "dependencies", ()):
                last_reader[dep] = at
        dropped = [[] for _ in steps]
        for dep, at in last_reader.items():
            if dep not in wanted:
                dropped[at].append(dep)
        self.steps = [(key, node, tuple(drop)) for (key, node), drop in zip(steps, dropped)]

    def __call__(self, arrays: dict) -> dict[str, np.ndarray]:
        values = {s.key(): arrays[s.name] for s in self.slots}
        try:
            with kept_between_calls():  # (the same tasks again: their plans are kept)
                for key, node, drop in self.steps:
                    values[key] = node(values)
                    for dep in drop:
                        del values[dep]
        except DeepxError:
            raise
        except Exception as err:  # a kernel's failure: said, with its kind
            raise ExecutionError(f"a task failed: {type(err).__name__}: {err}") from err
        out = {}
        for name, node_id in self.graph.outputs:
            node = self.plan.graph[node_id]
            out[name] = _assembled([values[k] for k in self.output_keys[name]], node.shape,
                                   node.dtype, self.chunks[name])
        return out


def _read_only(value):
    """A bound value as a read-only view (a NumPy array's, or a Binding's array's). A weight
    bound as its `.npy` file (`storage/weights.py`) is mapped read-only: this process runs
    the model whole, so its tasks would read the file again at every call."""
    from deepx_flow.runtime.inputs import Binding
    if isinstance(value, Binding):
        return Binding(_read_only(value.value), value.token)
    if isinstance(value, str) and value.endswith(".npy"):
        return np.load(value, mmap_mode="r")
    if isinstance(value, np.ndarray):
        view = value.view()
        view.flags.writeable = False
        return view
    return value


def _assembled(parts, shape, dtype, chunks) -> np.ndarray:
    if len(parts) == 1:
        return np.asarray(parts[0], dtype=dtype).reshape(shape)
    out = np.empty(shape, dtype=dtype)
    starts = [tuple(itertools.accumulate((0,) + c[:-1])) for c in chunks]
    for part, idx in zip(parts, itertools.product(*(range(len(c)) for c in chunks))):
        out[tuple(slice(s[i], s[i] + c[i]) for s, c, i in zip(starts, chunks, idx))] = part
    return out
