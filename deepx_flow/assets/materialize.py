"""Materializing assets: compose the selected bodies into one graph, compile and run it
once, store each asset as a new version, and record the versions.

Upstream assets outside the selection are read from their latest stored version (lazily:
`read_zarr` tasks read only the chunks the plan needs). Publishing is data first, row last:
each version is written to a fresh location, and the database row that makes it visible is
added only after the write finished, so a crash leaves the previous version readable.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from deepx_flow.assets import catalog
from deepx_flow.assets.selection import select as select_assets
from deepx_flow.assets.status import stale_assets
from deepx_flow.config import settings
from deepx_flow.errors import GraphError, InputError
from deepx_flow.meta import open_db
from deepx_flow.meta.models import AssetMaterialization
from deepx_flow.sdk.tensor import Tensor


@dataclass(frozen=True)
class Materialized:
    """What one `materialize` call stored: the new version rows, by asset name."""

    versions: dict[str, AssetMaterialization]
    run_id: str | None
    seconds: float

    def __str__(self) -> str:
        if not self.versions:
            return "nothing to materialize"
        return "\n".join(f"{name}: version {row.version[:12]} {tuple(json.loads(row.shape))} "
                         f"{row.dtype} -> {row.uri}" for name, row in self.versions.items())


def asset_root() -> str:
    return settings().asset_root or str(Path.cwd() / ".deepx" / "assets")


def load(name: str, version: str | None = None, db=None) -> Tensor:
    """The stored asset `name` (its latest version, or `version`) as a lazy tensor."""
    database = open_db(db)
    if version is None:
        row = catalog.latest(database, name)
    else:
        row = next((r for r in catalog.history(database, name)
                    if r.version.startswith(version)), None)
    if row is None:
        raise InputError(f"asset {name!r} has no stored version" +
                         (f" {version!r}" if version else "") + " in " + database.display_url)
    return _stored_tensor(row)


def materialize(defs, select="*", *, only_stale: bool = False, client=None,
                db=None) -> Materialized:
    """Materialize the assets `select` picks (see `deepx_flow.assets.selection`)."""
    from deepx_flow.runtime.run import persist
    from deepx_flow.storage.engines import get_engine

    database = open_db(db)
    names = select_assets(defs, select)
    if only_stale:
        names = stale_assets(defs, names, database)
    if not names:
        return Materialized({}, None, 0.0)
    engines = {name: get_engine(defs[name].storage) for name in names}
    began = time.perf_counter()
    tensors, used = _compose(defs, names, database)
    handles = persist(tensors, client=client)
    try:
        for handle in handles.values():
            handle.wait()
        failed = [n for n, h in handles.items() if any(f.status == "error" for f in h.futures)]
        if failed:
            handles[failed[0]].to_numpy()  # raises the task's ExecutionError
        recorder = next(iter(handles.values())).recorder
        run_id = recorder.run_id if recorder is not None else None
        versions: dict[str, AssetMaterialization] = {}
        for name in names:  # upstream first: a version records the upstream versions it read
            read = {**used[name], **{dep: versions[dep].version for dep in defs[name].deps
                                     if dep in versions}}
            versions[name] = _store(defs[name], handles[name], engines[name], read, run_id,
                                    began, database)
    finally:
        for handle in handles.values():
            handle.release()
    return Materialized(versions, run_id, time.perf_counter() - began)


def _compose(defs, names: list[str], db) -> tuple[dict[str, Tensor], dict[str, dict]]:
    """Call the selected bodies in topological order with their upstream tensors: selected
    ones as built here, others read from their latest stored version."""
    tensors: dict[str, Tensor] = {}
    stored: dict[str, AssetMaterialization] = {}
    used: dict[str, dict] = {}
    for name in names:
        a = defs[name]
        args, used[name] = {}, {}
        for dep in a.deps:
            if dep in tensors:
                continue
            row = stored.get(dep) or catalog.latest(db, dep)
            if row is None:
                raise InputError(f"asset {name} reads {dep}, which has never been "
                                 f"materialized: select it too (e.g. '+{name}')")
            stored[dep] = row
            used[name][dep] = row.version
        for param in a.params:
            args[param] = tensors[param] if param in tensors else _stored_tensor(stored[param])
        try:
            out = a.fn(**args)
        except GraphError as err:
            raise GraphError(f"asset {name}: {err}", err.node) from None
        if not isinstance(out, Tensor):
            raise GraphError(f"asset {name} must return a dx.Tensor, got "
                             f"{type(out).__name__}")
        tensors[name] = out
    return tensors, used


def _stored_tensor(row: AssetMaterialization) -> Tensor:
    from deepx_flow.sdk.functions import read_zarr
    from deepx_flow.storage.engines import get_engine
    if not row.uri:
        raise InputError(f"asset {row.asset} version {row.version[:12]} has no stored data "
                         f"to read (storage {row.storage!r})")
    # Engines that keep files give a URI read_zarr reads chunk by chunk; others refuse.
    return read_zarr(get_engine(row.storage).reader_uri(row.uri))


def _store(a, handle, engine, used: dict, run_id, began: float,
           db) -> AssetMaterialization:
    version = uuid.uuid4().hex
    uri = f"{asset_root().rstrip('/')}/{a.name}/{version}.zarr"
    info = engine.write(handle, uri)
    row = AssetMaterialization(
        version=version, asset=a.name, code_version=a.code_version,
        upstream_versions=json.dumps(used, sort_keys=True), shape=json.dumps(handle.shape),
        dtype=handle.dtype, chunks=json.dumps(list(info.get("chunks") or ())),
        nbytes=info.get("nbytes"), storage=a.storage, uri=info.get("uri", uri), run_id=run_id,
        seconds=time.perf_counter() - began, created_at=time.time())
    catalog.record(db, row, [])
    return row
