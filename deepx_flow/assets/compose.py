"""Composing asset bodies into one tensor graph: each target's body is called with its
upstream tensors, those made in the same stage as built here, the others read (lazily) from
their stored versions.
"""

from __future__ import annotations

from deepx_flow.assets import catalog
from deepx_flow.assets.definition import reads_partition_by_partition
from deepx_flow.assets.stored import stored_tensor, whole
from deepx_flow.assets.targets import Target, reads
from deepx_flow.errors import GraphError, InputError
from deepx_flow.sdk.tensor import Tensor


def compose(defs, stage: list[Target], versions: dict[Target, str], written: dict, db,
            now=None) -> tuple[dict[Target, Tensor], dict[Target, dict[str, str]]]:
    """Tensors of the `stage`'s targets (topological order), and per target the upstream
    versions it reads, by "asset" or "asset[partition]".

    `versions` holds the version each target of the whole materialization will get;
    `written` the rows of targets stored by earlier stages.
    """
    tensors: dict[Target, Tensor] = {}
    used: dict[Target, dict[str, str]] = {}
    for t in stage:
        a = defs[t.asset]
        args, used[t] = {}, {}
        for dep, ups in reads(defs, t, now).items():
            d = defs[dep]
            if d.partitions is not None and not reads_partition_by_partition(a, d):
                made = {u.partition: tensors[u] for u in ups if u in tensors}
                value, from_storage = whole(d, made, db, now)
                used[t].update({str(u): versions[u] for u in ups if u in tensors})
                used[t].update(from_storage)
            else:
                value, used[t][str(ups[0])] = _one(t, ups[0], tensors, versions, written, db)
            if dep in a.params:
                args[dep] = value
        if a.takes_partition:
            args["partition"] = a.partitions.partition(t.partition, now)
        try:
            out = a.fn(**args)
        except GraphError as err:
            raise GraphError(f"asset {t}: {err}", err.node) from None
        except InputError as err:
            raise InputError(f"asset {t}: {err}") from None
        except Exception as err:  # a bug in the body: say which asset it is in
            raise GraphError(f"asset {t}: its body raised {type(err).__name__}: {err}") \
                from err
        if not isinstance(out, Tensor):
            raise GraphError(f"asset {t} must return a dx.Tensor, got {type(out).__name__}")
        tensors[t] = out
    return tensors, used


def _one(t: Target, up: Target, tensors, versions, written, db) -> tuple[Tensor, str]:
    if up in tensors:
        return tensors[up], versions[up]
    row = written.get(up) or catalog.latest(db, up.asset, up.partition)
    if row is None:
        why = "has no version whose blocking checks passed" if catalog.latest(
            db, up.asset, up.partition, usable=False) else "has never been materialized"
        raise InputError(f"asset {t} reads {up}, which {why}: materialize it first, or "
                         f"select it too (e.g. '+{t.asset}'; over the gateway, "
                         f"\"upstream\": true)")
    return stored_tensor(row, db), row.version


__all__ = ["compose"]
