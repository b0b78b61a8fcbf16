"""Checkpoints: a training's parameters and optimizer state as a version of an asset.

A checkpoint is one 1-D tensor holding every parameter, then every state tensor, flattened
in row-major order and converted to their common dtype (exactly: float32 parameters stay
float32; mixed float16/float32 ones are held as float32), written like any asset version
(`storage` engines, a row in `asset_materializations`), so a trained model is an asset with
lineage: what reads it is stale once it is trained again. Its row in `training_checkpoints`
records the step, the layout and the training's configuration hash.

The configuration hash covers what decides the arithmetic of the remaining steps: the step
graph (model, loss, optimizer, parameter shapes), the optimizer's settings (learning rate and
schedule), the seed, the batch size, the data and the window size of the data order.
Resuming (`dx.train(..., resume=True)`) starts from the newest checkpoint in the asset with
the same hash, so it ends with the parameters an uninterrupted run of the same seed would
have; a checkpoint of another configuration is never used.
"""

from __future__ import annotations

import functools
import json
import time
import uuid
from dataclasses import dataclass

import numpy as np
from dask.base import tokenize

from deepx_flow.errors import DataError
from deepx_flow.ir import Graph, dtypes
from deepx_flow.meta.models import AssetMaterialization, TrainingCheckpoint
from deepx_flow.sdk.build import build_graph
from deepx_flow.sdk.functions import concat, input as placeholder, reshape
from deepx_flow.train.step import StepGraph


def config_hash(step: StepGraph, optimizer, seed: int, batch_size: int, data_token: str,
                window_blocks: int) -> str:
    """What decides the remaining steps' arithmetic: the step graph, the optimizer's settings
    (its learning rate and schedule enter the graph as inputs, so the graph alone does not
    say them), the seed, the batch size, the data and its windows (the data order)."""
    return tokenize(tuple(step.graph.nodes), step.graph.outputs, repr(optimizer), seed,
                    batch_size, data_token, window_blocks)


@dataclass(frozen=True)
class Packing:
    """The graph that packs parameters and state into one vector, and the layout."""

    graph: Graph
    layout: list[dict]
    dtype: str


def packing(step: StepGraph) -> Packing:
    entries = [(name, "param", i) for name, i in step.params.items()] + \
        [(name, "state", i) for name, i in step.state.items()]
    nodes = [step.graph[i] for _, _, i in entries]
    dtype = functools.reduce(lambda a, b: dtypes.ufunc_result(np.add, a, b),
                             [n.dtype for n in nodes])  # bfloat16 and float16: float32
    pieces, layout, offset = [], [], 0
    for (name, kind, input_id), node in zip(entries, nodes):
        t = placeholder(input_id, node.shape, node.dtype)
        pieces.append(reshape(t, (node.size,)).astype(dtype) if node.dtype != dtype
                      else reshape(t, (node.size,)))
        layout.append({"name": name, "kind": kind, "input": input_id,
                       "shape": list(node.shape), "dtype": node.dtype, "offset": offset})
        offset += node.size
    return Packing(build_graph({"packed": concat(pieces)}), layout, dtype)


def write(db, client, plan, pack: Packing, sources: dict, asset: str, training_id: str,
          step: int, epoch: int, config: str) -> str:
    """Pack the current values on the cluster, store them as a new version of `asset`, and
    record it; returns the version."""
    from deepx_flow.assets import catalog
    from deepx_flow.assets.root import asset_root
    from deepx_flow.runtime.recording import ended_by
    from deepx_flow.runtime.run import Persisted, _submit
    from deepx_flow.storage.engines import get_engine
    from deepx_flow.train import records
    began = time.time()
    futures, keys, recorder, _ = _submit(plan, pack.graph, sources, client, "checkpoint",
                                         db=db)
    if recorder is not None:
        recorder.watch()  # drained while the chunks are written; ended below
    node = plan.graph[dict(pack.graph.outputs)["packed"]]
    with ended_by(recorder):  # the checkpoint's run ends with it
        persisted = Persisted("packed", node.shape, node.dtype,
                              plan.partition.chunks[node.id], futures["packed"], client,
                              keys["packed"], recorder)
        version = uuid.uuid4().hex
        uri = f"{asset_root().rstrip('/')}/{asset}/{version}.zarr"
        try:
            info = get_engine("zarr").write(persisted, uri, run=recorder)  # its tasks too
        finally:
            persisted.release()
        row = AssetMaterialization(
            version=version, asset=asset, code_version=None, upstream_versions="{}",
            shape=json.dumps(list(node.shape)), dtype=node.dtype,
            chunks=json.dumps(list(info.get("chunks") or ())), nbytes=info.get("nbytes"),
            storage="zarr", uri=info.get("uri"), manifest_digest=info.get("manifest_digest"),
            run_id=recorder.run_id if recorder else None,
            seconds=time.time() - began, created_at=time.time())
        catalog.record_all(db, [(row, [])])
        records.add_checkpoint(db, TrainingCheckpoint(
            training_id=training_id, asset=asset, version=version, step=step, epoch=epoch,
            config_hash=config, layout=json.dumps(pack.layout), created_at=time.time()))
    return version


def read(db, checkpoint: TrainingCheckpoint) -> dict[str, np.ndarray]:
    """Input id -> the array a checkpoint holds for it, read (once, whole) and checked."""
    from deepx_flow.storage.verify import read_region
    row, origin = _stored(db, checkpoint)
    shape = tuple(json.loads(row.shape))
    flat = np.asarray(read_region(row.uri, tuple((0, s) for s in shape), origin=origin))
    out = {}
    for entry in json.loads(checkpoint.layout):
        size = int(np.prod(entry["shape"], dtype=np.int64))
        part = flat[entry["offset"]:entry["offset"] + size]
        out[entry["input"]] = part.astype(entry["dtype"]).reshape(entry["shape"])
    return out


def sources(db, checkpoint: TrainingCheckpoint) -> dict[str, "PackedSource"]:
    """Input id -> a source that reads what a checkpoint holds for it where it is used,
    region by region (a training in pieces resumes so: no process reads it whole)."""
    row, origin = _stored(db, checkpoint)
    return {e["input"]: PackedSource((row.uri, int(e["offset"]), tuple(e["shape"]),
                                      e["dtype"], origin), tokenize(row.version, e["input"]))
            for e in json.loads(checkpoint.layout)}


def _stored(db, checkpoint: TrainingCheckpoint):
    """The checkpoint's stored version (its row) and what a read checks it against."""
    from deepx_flow.assets import catalog
    from deepx_flow.assets.stored import stored_as
    row = next((r for r in catalog.history(db, checkpoint.asset)
                if r.version == checkpoint.version), None)
    if row is None or row.uri is None:
        raise DataError(f"checkpoint {checkpoint.version} of asset {checkpoint.asset!r} "
                        "has no stored version (was it deleted?)")
    return row, stored_as(row)


@dataclass(frozen=True)
class PackedSource:
    """A tensor in a checkpoint's vector: `where` is (uri, offset, shape, dtype, origin);
    each task reads the region it needs (`read_packed`)."""

    where: tuple
    token: str

    @property
    def shape(self) -> tuple[int, ...]:
        return self.where[2]

    def task(self, key, region):
        from deepx_flow.compiler.taskspec import task
        return task(key, load_packed, *self.where, region)


def load_packed(*where_and_region):
    """Task: `read_packed` on the worker's device."""
    from deepx_flow.kernels.tasks import to_device
    return to_device(read_packed(*where_and_region))


def read_packed(uri, offset, shape, dtype, origin, region) -> np.ndarray:
    """Region `region` of the tensor of `shape` packed at `offset` of the checkpoint vector at
    `uri`, as `dtype`: its rows are contiguous in the vector, so the rows the region spans
    are read (checked, `storage.verify`) and the rest of its axes cut from them."""
    from deepx_flow.storage.verify import read_region
    if not shape:
        return np.asarray(read_region(uri, ((offset, offset + 1),), origin=origin)
                          ).reshape(()).astype(dtype)
    row = int(np.prod(shape[1:], dtype=np.int64))
    (lo, hi), rest = region[0], region[1:]
    flat = np.asarray(read_region(uri, ((offset + lo * row, offset + hi * row),),
                                  origin=origin))
    block = flat.reshape((hi - lo,) + tuple(shape[1:]))
    block = block[(slice(None),) + tuple(slice(a, b) for a, b in rest)]
    return np.ascontiguousarray(block.astype(dtype, copy=False))
