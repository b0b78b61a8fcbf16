"""Lineage cuts through storage, for a training whose parameters are in pieces.

Every `LINEAGE_STEPS` steps a training binds its parameters and optimizer state to their
values as data, so that Dask can let go of the steps that made them (and a lost worker
costs the steps since, not the whole run). With replicated parameters the driver takes the
values back and sends them in the next graph. Parameters in pieces may not fit anywhere
whole, the driver included: each split tensor is written to a Zarr array instead, each chunk
by the worker that holds it (`zarr_store.write_persisted`), and the input is bound to that
array, whose regions the next step's tasks read where they run (the pieces' owners, as
`Pieces.placement` pins them). A worker lost after the cut is recovered from the array and
the steps since: the data never passes through the driver.

A cut is the folder `<asset root>/training-cuts/<scope>/<step>-<rewinds>/`, holding an
array `<input>.zarr` per split tensor (`scope`: a random id per `dx.train` call); each cut
deletes the one before it once the inputs are bound to the new one, and the training
deletes its `<scope>` folder when it ends. Only the latest is needed: it is what a rewind
goes back to.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from dask.base import tokenize

from deepx_flow.errors import ExecutionError
from deepx_flow.runtime.inputs import FileSource, KeySource

FOLDER = "training-cuts"


class ValuesLost(ExecutionError):
    """A cut could not be written because chunks it was writing were lost with a worker
    and Dask could not compute them again: the training goes back to the cut before."""


def cuts_folder(scope: str) -> str:
    """Where the training `scope` stores its cuts: absolute, since workers may run in
    another folder; an fsspec URL stays one."""
    from deepx_flow.assets.root import asset_root
    root = asset_root().rstrip("/")
    root = root if "://" in root else str(Path(root).resolve())
    return f"{root}/{FOLDER}/{scope}"


def store(client, held: dict, values: dict, shapes: dict, folder: str) -> dict:
    """Write each of `values` (input id -> KeySource of chunks the cluster holds, their
    futures in `held` by key) to a Zarr array under `folder`, chunk by chunk where the chunks
    are; input id -> the FileSource reading it. An ExecutionError (what was written deleted)
    when a chunk cannot be written."""
    from deepx_flow.compiler.lower import Lowered
    from deepx_flow.runtime.run import Persisted
    from deepx_flow.storage.zarr_store import write_persisted
    out = {}
    for input_id, source in values.items():
        if not isinstance(source, KeySource):
            raise TypeError(f"{input_id}: only chunks held on the cluster are stored, "
                            f"not a {type(source).__name__}")
        keys = Lowered({}, {"x": (source.key, source.chunks)}).output_keys("x")
        persisted = Persisted(input_id, shapes[input_id], source.dtype, source.chunks,
                              [held[k] for k in keys], client, source.key)
        try:
            info = write_persisted(persisted, f"{folder}/{input_id}.zarr")
        except ExecutionError as err:
            lost = [f.key for f in persisted.futures if f.status in ("cancelled", "lost")]
            if lost:
                raise ValuesLost(f"storing {input_id!r} at {folder}: its chunk {lost[0]} "
                                 f"was lost with a worker ({err})") from err
            raise
        out[input_id] = FileSource(info["uri"], tokenize(info["uri"],
                                                         info["manifest_digest"]))
    return out


def remove(folder: str | None) -> None:
    """Delete a cut (or a training's folder of cuts) that no input reads any more. Best
    effort: a folder that cannot be deleted is left where `cuts_folder` says."""
    if folder is None:
        return
    if "://" in folder:
        import fsspec
        fs, path = fsspec.core.url_to_fs(folder)
        try:
            fs.rm(path, recursive=True)
        except (FileNotFoundError, OSError):
            pass
        return
    shutil.rmtree(folder, ignore_errors=True)
