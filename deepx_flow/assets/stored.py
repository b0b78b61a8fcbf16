"""Stored asset versions read back as lazy tensors: `dx.load`, and what downstream assets
read when their upstream is not made in the same materialization.

A stored version becomes a `read_zarr` tensor, so a graph reads only the chunks it needs.
A partitioned asset with a partition axis reads whole as the concatenation, in key order,
of the newest usable version of every partition.
"""

from __future__ import annotations

from deepx_flow.assets import catalog
from deepx_flow.errors import InputError
from deepx_flow.meta import open_db
from deepx_flow.meta.models import AssetMaterialization
from deepx_flow.sdk.tensor import Tensor


def load(asset, version: str | None = None, partition: str | None = None, db=None) -> Tensor:
    """The stored asset as a lazy tensor: its newest usable version, or `version` (a
    prefix is enough), or one `partition`. `asset` is a name, or the asset itself: a
    partitioned asset given as itself with no partition reads all its partitions whole."""
    from deepx_flow.assets.definition import AssetDef

    database = open_db(db)
    name = asset.name if isinstance(asset, AssetDef) else str(asset)
    if version is not None:
        row = next((r for r in catalog.history(database, name)
                    if r.version.startswith(version)), None)
        if row is None:
            raise InputError(f"asset {name!r} has no version {version!r} in "
                             f"{database.display_url}")
        return stored_tensor(row)
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
    return stored_tensor(row)


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
                         f"backfill them first")
    parts = [made[k] if k in made else stored_tensor(stored[k]) for k in keys]
    used = {f"{asset.name}[{k}]": stored[k].version for k in keys if k not in made}
    return (parts[0] if len(parts) == 1 else concat(parts, axis=asset.partition_axis)), used


def stored_tensor(row: AssetMaterialization) -> Tensor:
    """The stored version `row` as a lazy tensor whose reads check every chunk, after a check
    from a listing that every chunk the version wrote is there at the size written (a
    DataError naming the version and the first bad chunk otherwise)."""
    from deepx_flow.sdk.functions import _read_zarr
    from deepx_flow.storage.engines import get_engine
    if not row.uri:
        raise InputError(f"asset {row.asset} version {row.version[:12]} has no stored data "
                         f"to read (storage {row.storage!r})")
    engine = get_engine(row.storage)
    origin = stored_as(row)
    if callable(getattr(engine, "verify", None)):
        problems = engine.verify(row.uri, deep=False, origin=origin)
        if problems:
            raise problems[0]
    # Engines that keep files give a URI read_zarr reads chunk by chunk; others refuse.
    return _read_zarr(engine.reader_uri(row.uri), **origin)


def stored_as(row: AssetMaterialization) -> dict:
    """Which stored version a read is of (read_zarr's `asset`, `version`, `partition`)."""
    return {"asset": row.asset, "version": row.version, "partition": row.partition}


__all__ = ["load", "whole", "stored_tensor", "stored_as"]
