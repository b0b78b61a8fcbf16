"""Stored asset versions read back as lazy tensors: `dx.load`, and what downstream assets
read when their upstream is not made in the same materialization.

A stored version becomes a `read_zarr` tensor, so a graph reads only the chunks it needs.
A partitioned asset with a partition axis reads whole as the concatenation, in key order,
of the newest usable version of every partition.

The tensor carries the digest of the version's manifest that its row records, and every
read checks the manifest, the metadata and each chunk against it (`storage/verify.py`). A
version recorded before rows held that digest is bound on its first read: its manifest is
written anew from its chunks as they are (`upgrade`), and the row records its digest, once.
"""

from __future__ import annotations

import json
import warnings

from deepx_flow.assets import catalog
from deepx_flow.errors import DatabaseError, DataError, InputError
from deepx_flow.meta import open_db
from deepx_flow.meta.models import AssetMaterialization
from deepx_flow.sdk.tensor import Tensor


def load(asset, version: str | None = None, partition: str | None = None, db=None) -> Tensor:
    """The stored asset as a lazy tensor: its newest usable version, or `version` (a
    prefix that names one version is enough; with `partition`, it must be of that
    partition), or one `partition`. `asset` is a name, or the asset itself: a
    partitioned asset given as itself with no partition reads all its partitions whole."""
    from deepx_flow.assets.definition import AssetDef

    database = open_db(db)
    name = asset.name if isinstance(asset, AssetDef) else str(asset)
    if version is not None:
        found = [r for r in catalog.history(database, name) if r.version.startswith(version)]
        if len({r.version for r in found}) > 1:
            raise InputError(f"version {version!r} of asset {name!r} is ambiguous: "
                             f"{len(found)} versions start with it; give more of it")
        if found and partition is not None and found[0].partition != partition:
            raise InputError(f"version {found[0].version[:12]} of asset {name!r} is of "
                             f"partition {found[0].partition!r}, not {partition!r}")
        if not found:
            raise InputError(f"asset {name!r} has no version {version!r} in "
                             f"{database.display_url}")
        return stored_tensor(found[0], database)
    if partition is None and isinstance(asset, AssetDef) and asset.partitions is not None:
        return whole(asset, {}, database)[0]
    row = catalog.latest(database, name, partition)
    if row is None:
        if partition is None and catalog.latest_partitions(database, name):
            raise InputError(f"asset {name!r} is partitioned: give partition=KEY, or pass "
                             f"the asset itself (dx.load({name})) to read all partitions")
        what = f"partition {partition!r} of asset {name!r}" if partition else f"asset {name!r}"
        raise InputError(f"{what} has no stored version (or none whose blocking checks "
                         f"passed) in {database.display_url}")
    return stored_tensor(row, database)


def whole(asset, made: dict, db, now=None) -> tuple[Tensor, dict[str, str]]:
    """Every partition of a partitioned `asset` concatenated along its partition axis:
    from `made` (partition key -> tensor built in this materialization) where there, else
    the newest usable stored version. Also returns the stored versions used, by
    "asset[key]"."""
    from deepx_flow.sdk.functions import concat
    keys = asset.partitions.keys(now)
    stored = catalog.latest_partitions(db, asset.name)
    missing = [k for k in keys if k not in made and k not in stored]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5
                                          else "")
        failed = set(catalog.latest_partitions(db, asset.name, usable=False))
        why = "have no version whose blocking checks passed" if set(missing) <= failed \
            else "have never been materialized"
        raise InputError(f"asset {asset.name} is read whole, but partitions {shown} {why}: "
                         f"materialize them first (a backfill)")
    parts = [made[k] if k in made else stored_tensor(stored[k], db) for k in keys]
    used = {f"{asset.name}[{k}]": stored[k].version for k in keys if k not in made}
    return (parts[0] if len(parts) == 1 else concat(parts, axis=asset.partition_axis)), used


# The storage of a model package's versions (`serving/package.py`): files of a model
# repository, recorded as an asset's versions for their lineage; no array to read.
PACKAGE_STORAGE = "model-package"


def stored_tensor(row: AssetMaterialization, db) -> Tensor:
    """The stored version `row` (recorded in `db`) as a lazy tensor whose reads check every
    chunk, after a check from a listing that its manifest is the one written, its metadata
    the one the manifest and the row record, and every chunk there at the size written (a
    DataError naming the version and what is wrong otherwise)."""
    from deepx_flow.sdk.functions import _read_zarr
    from deepx_flow.storage.engines import get_engine
    if row.storage == PACKAGE_STORAGE:
        raise InputError(f"asset {row.asset} version {row.version[:12]} is a served model's "
                         f"package (its files are in {row.uri}), not an array: serve it "
                         f"with deepx-flow serve --model-repository")
    if not row.uri:
        raise InputError(f"asset {row.asset} version {row.version[:12]} has no stored data "
                         f"to read (storage {row.storage!r})")
    engine = get_engine(row.storage)
    origin = stored_as(row)
    if callable(getattr(engine, "verify", None)):
        if origin["manifest"] is None and callable(getattr(engine, "upgrade", None)):
            origin["manifest"] = _bind(engine, row, origin, db)
        problems = engine.verify(row.uri, deep=False, origin=origin)
        if problems:
            raise problems[0]
    # Engines that keep files give a URI read_zarr reads chunk by chunk; others refuse.
    tensor = _read_zarr(engine.reader_uri(row.uri), **origin)
    recorded = (tuple(json.loads(row.shape)), row.dtype)
    if (tensor.shape, tensor.dtype) != recorded:
        from deepx_flow.storage.verify import describe
        raise DataError(f"{describe(row.uri, origin)}: its metadata (zarr.json) says shape "
                        f"{tensor.shape} {tensor.dtype}, but shape {recorded[0]} "
                        f"{recorded[1]} was written ({row.uri}); materialize {row.asset} "
                        f"again to replace it", uri=row.uri, asset=row.asset,
                        version=row.version, partition=row.partition,
                        problem="metadata other than was written")
    return tensor


def _bind(engine, row: AssetMaterialization, origin: dict, db) -> str | None:
    """The manifest digest of a version recorded without one, once its chunks are checked
    from a listing and its manifest is written anew (`engine.upgrade`) and recorded; None
    (read unbound, with a warning) where the storage or the database cannot be written."""
    problems = engine.verify(row.uri, deep=False, origin=origin)
    if problems:
        raise problems[0]
    try:
        return catalog.bind_manifest(db, row, engine.upgrade(row.uri, origin))
    except (OSError, DatabaseError) as err:
        warnings.warn(f"asset {row.asset} version {row.version[:12]} was stored before "
                      f"versions recorded their manifest's digest, and it could not be "
                      f"recorded now ({type(err).__name__}: {err}): it is read with each "
                      f"chunk's checksum checked, but not whether each chunk is in its place; "
                      f"run deepx-flow assets verify --upgrade where it can be written",
                      RuntimeWarning, stacklevel=3)
        return None


def stored_as(row: AssetMaterialization) -> dict:
    """Which stored version a read is of (read_zarr's `asset`, `version`, `partition`), and
    the digest of its manifest (`manifest`)."""
    return {"asset": row.asset, "version": row.version, "partition": row.partition,
            "manifest": row.manifest_digest}


__all__ = ["load", "whole", "stored_tensor", "stored_as"]
