"""The contract's asset calls, whatever the transport: define an asset from a graph spec,
list the assets and their versions, materialize one (an operation), read a stored version
or a slice of it, and read one as a graph's input by reference.

The assets served are those defined through the contract, kept in the metadata database's
`asset_definitions` (so every gateway on that database serves the same ones, after a
restart too). They are materialized by `dx.materialize` and read by `dx.load`, the SDK's
own entry points: the same versions, lineage, staleness and checks as Python's.

A definition is checked and written in one write transaction that holds the definitions'
lock (SQLite's BEGIN IMMEDIATE, a PostgreSQL advisory lock), so two gateways defining at
once cannot record a cycle or an input that no longer fits its upstream asset between
them. A stored definition that can no longer be built (an operator renamed by an upgrade)
is listed as broken and refused by name; the others are served.
"""

from __future__ import annotations

import hashlib
import json

from sqlalchemy import text
from sqlmodel import select

from deepx_flow.errors import CheckFailed, DataError, DeepxError, GraphError, InputError, shown
from deepx_flow.gateway.asset_specs import asset_from_row, checked_definition
from deepx_flow.gateway.errors import NotFound
from deepx_flow.meta.models import AssetDefinition

MAX_VERSIONS = 1000
_PG_LOCK_ID = 74_700_32  # arbitrary: PostgreSQL sessions defining assets take turns on it


class AssetCalls:
    """The asset calls of one gateway: `db` keeps definitions and versions, `operations`
    carries out materializations, `client` (Dask) reads."""

    def __init__(self, db, operations, client, max_nodes: int):
        self.db, self.operations, self.client = db, operations, client
        self.max_nodes = max_nodes

    # -- definitions -----------------------------------------------------------------------

    def _rows(self, session=None) -> dict[str, AssetDefinition]:
        query = select(AssetDefinition).order_by(AssetDefinition.defined_at,
                                                 AssetDefinition.name)
        if session is not None:
            return {r.name: r for r in session.exec(query)}
        with self.db.read() as reading:
            return {r.name: r for r in reading.exec(query)}

    def definitions(self, rows: dict | None = None):
        """The Definitions of the assets defined through the contract that can be built,
        and name -> why for those that cannot (or read one that cannot)."""
        from deepx_flow.assets.definition import Definitions
        rows = self._rows() if rows is None else rows
        built, broken = {}, {}
        for name, row in rows.items():
            try:
                built[name] = asset_from_row(row, self.max_nodes)
            except DeepxError as err:
                broken[name] = f"its stored definition cannot be built: {err}"
        changed = True
        while changed:  # what reads a broken asset is broken too
            changed = False
            for name, a in list(built.items()):
                bad = next((d for d in a.deps if d in broken), None)
                if bad is not None:
                    broken[name] = f"it depends on asset {bad}, which is broken"
                    del built[name]
                    changed = True
        return Definitions(built.values()), broken

    def define(self, name, graph, dependencies=(), description="", partitions=(),
               partition_axis=None, checks=()) -> dict:
        """Define (or define again) an asset; the asset as `assets` lists it. Refused, with
        nothing recorded, when its upstream assets are not defined, when they would form a
        cycle, or when an input's shape or dtype is not its upstream asset's, its own or
        that of an asset reading it."""
        row = checked_definition(name, graph, dependencies, description, partitions,
                                 partition_axis, checks, self.max_nodes)
        with self.db.session() as session:
            if session.get_bind().dialect.name == "postgresql":
                session.exec(text(f"SELECT pg_advisory_xact_lock({_PG_LOCK_ID})"))
            rows = self._rows(session)
            found = rows.get(row.name)
            rows[row.name] = row
            defs = self._checked(rows, row.name)
            fields = ("spec", "dependencies", "description", "partitions", "checks",
                      "code_version")
            if found is None:
                session.add(row)
            elif any(getattr(found, f) != getattr(row, f) for f in fields):
                for field in (*fields, "defined_at"):
                    setattr(found, field, getattr(row, field))
        return self._answer(defs, row.name)

    def _checked(self, rows: dict, name: str):
        """The Definitions with `rows[name]` as now defined: InputError if it breaks them."""
        try:
            defs, broken = self.definitions(rows)
        except GraphError as err:  # an upstream asset not defined, a cycle
            raise InputError(str(err)) from None
        if name in broken:
            raise InputError(f"asset {name}: {broken[name]}")
        readers = [a.name for a in defs.assets.values() if name in a.params]
        for checked in [name, *readers]:
            _check_reads(defs, rows, checked, self.max_nodes)
        return defs

    def assets(self) -> dict:
        """Every asset defined through the contract, with its status: upstream assets before
        those that read them, else in the order they were defined."""
        rows = self._rows()
        defs, broken = self.definitions(rows)
        statuses = _statuses(defs, self.db)
        answers = {name: self._answer(defs, name, status) for name, status in statuses.items()}
        for name, why in broken.items():
            answers[name] = _broken_answer(rows[name], why)
        return {"assets": [answers[n] for n in [*defs.order, *broken]]}

    def _answer(self, defs, name: str, status=None) -> dict:
        from deepx_flow.assets import catalog
        a = defs[name]
        if status is None:
            status = _statuses(defs, self.db, [name])[name]
        reasons = "; ".join(status.reasons)
        if not status.stale:
            state = "fresh"
        elif not catalog.history(self.db, name)[:1]:
            state = "never materialized"
        else:
            state = "stale: " + reasons
        return {"name": name, "dependencies": list(a.deps), "code_version": a.code_version,
                "description": a.description or "", "status": state,
                "latest_version": status.version or "",
                "partitions": a.partitions.keys() if a.partitions is not None else [],
                **({} if a.partition_axis is None else {"partition_axis": a.partition_axis}),
                "defined_by": a.metadata["defined_by"], "checks": a.metadata["checks"]}

    def _defined(self, name, where: str = "") -> tuple:
        """The Definitions and the asset `name` of them; NotFound (its message beginning
        with `where`) if it is not defined, a server's DeepxError if it is broken."""
        if not isinstance(name, str) or not name:
            raise NotFound(f"{where}no asset {shown(name)}")
        defs, broken = self.definitions()
        if name in broken:
            raise DeepxError(f"{where}asset {name!r}: {broken[name]}; define it again")
        if name not in defs.assets:
            raise NotFound(f"{where}no asset {name!r} is defined on this gateway")
        return defs, defs[name]

    # -- versions ----------------------------------------------------------------------------

    def versions(self, name) -> dict:
        """The stored versions of the asset, newest first, at most MAX_VERSIONS (those
        whose blocking check failed too: `checks_passed` says)."""
        from deepx_flow.assets import catalog
        from deepx_flow.contract.tensors import datatype_of
        self._defined(name)
        rows = catalog.history(self.db, name)[:MAX_VERSIONS]
        return {"versions": [
            {"version": r.version, "partition": r.partition or "",
             "datatype": datatype_of(r.dtype), "shape": json.loads(r.shape or "[]"),
             "uri": r.uri or "", "run_id": r.run_id or "", "created_at": r.created_at,
             "code_version": r.code_version or "",
             "lineage": catalog.upstream_versions(r),
             "checks_passed": r.checks_passed is not False} for r in rows]}

    # -- materializing ------------------------------------------------------------------------

    def materialize(self, name, partitions=None, force: bool = False,
                    operation_id: str | None = None, upstream: bool = False) -> str:
        """Start materializing the asset (its partitions, or all; only what is stale unless
        `force`), and with `upstream` the assets it depends on, all the way up: the
        operation's id. Without it, upstream assets are read from their stored versions."""
        from deepx_flow.assets.materialize import materialize
        defs, a = self._defined(name)
        keys = _partition_keys(a, partitions)
        for flag, value in (("force", force), ("upstream", upstream)):
            if type(value) is not bool:
                raise InputError(f"{flag} is {shown(value)}, not true or false")
        digest = hashlib.sha256(json.dumps(
            ["materialize", name, a.code_version, keys, force, upstream]).encode()).hexdigest()
        targets = [name] if a.partitions is None else \
            [f"{name}[{k}]" for k in (keys or a.partitions.keys())]

        def work(token, took_run_id):
            from deepx_flow.gateway.operations import _RunIdTaker
            try:
                made = materialize(defs, ("+" if upstream else "") + name, partitions=keys,
                                   only_stale=not force, client=self.client,
                                   db=self.db.url, cancel=token,
                                   progress=_RunIdTaker(took_run_id))
            except CheckFailed as err:  # failed, and what was made is said too
                err.summary = materialized_summary(err.materialized)
                raise
            summary = materialized_summary(made)
            for t in targets:  # not made, not skipped: it was fresh
                if t not in summary["versions"] and t not in summary["skipped"]:
                    summary["skipped"][t] = "fresh"
            return {}, summary
        op_id, _ = self.operations.start("materialize", digest, name, work, operation_id)
        return op_id

    # -- reading --------------------------------------------------------------------------------

    def read(self, name, version: str = "", partition: str = "", ranges=None):
        """A stored version of the asset (the newest usable one, or `version`; one
        `partition`, or a partitioned asset with a partition axis whole), or the slice
        `ranges` ([start, stop) per leading axis) of it, as a NumPy array."""
        from deepx_flow.sdk.run import run
        _, a = self._defined(name)
        tensor = self._stored(a, version, partition)
        if ranges is not None:
            tensor = tensor[_slices(name, ranges, tensor.shape)]
        return run(tensor, client=self.client, progress=False)

    def stored(self, ref):
        """The lazy tensor a tensors.Reference names: a stored asset's version (read and
        verified as dx.load reads it) or a Zarr array; checked against the datatype and
        shape the reference gave."""
        from deepx_flow.contract.tensors import dtype_of
        from deepx_flow.sdk.functions import read_zarr
        where = f"input {ref.name!r}"
        if ref.zarr_uri is not None:
            try:
                tensor = read_zarr(ref.zarr_uri)
            except DeepxError as err:
                raise InputError(f"{where}: {err}") from None
        else:
            _, a = self._defined(ref.asset, where + ": ")
            tensor = self._stored(a, ref.version, ref.partition, where + ": ")
        if ref.datatype is not None and dtype_of(ref.datatype, ref.name) != tensor.dtype:
            raise InputError(f"{where}: said to be {ref.datatype}, but the stored array is "
                             f"{tensor.dtype}")
        if ref.shape is not None and tuple(ref.shape) != tensor.shape:
            raise InputError(f"{where}: said to have shape {list(ref.shape)}, but the stored "
                             f"array has {list(tensor.shape)}")
        return tensor

    def _stored(self, a, version, partition, where: str = ""):
        """The stored tensor of asset `a` (`version` and `partition` as `read` takes
        them): NotFound where there is none, DataError where it is damaged; each message
        begins with `where`."""
        from deepx_flow.assets.stored import load
        for what, value in (("version", version), ("partition", partition)):
            if value is not None and not isinstance(value, str):
                raise InputError(f"{where}{what} is {shown(value)}, not text")
        if partition and a.partitions is None:
            raise InputError(f"{where}asset {a.name!r} is not partitioned; leave partition "
                             f"out")
        if partition and partition not in a.partitions.keys():
            raise NotFound(f"{where}asset {a.name!r} has no partition {partition!r}")
        if not partition and not version and a.partitions is not None and \
                a.partition_axis is None:
            raise InputError(f"{where}asset {a.name!r}'s partitions are separate tensors "
                             f"(it has no partition_axis): give a partition (its keys: "
                             f"{', '.join(a.partitions.keys())})")
        try:
            return load(a, version or None, partition or None, self.db.url)
        except DataError:
            raise
        except InputError as err:
            message = str(err).replace(f" in {self.db.display_url}", "")
            error = InputError if "ambiguous" in message or "is of partition" in message \
                else NotFound
            raise error(where + message) from None


def materialized_summary(made) -> dict:
    """What a materialization operation keeps and answers: the versions made by target,
    the runs, what was skipped and why, every check's result."""
    return {"versions": {t: row.version for t, row in made.versions.items()},
            "run_ids": list(made.run_ids),
            "skipped": dict(made.skipped),
            "checks": [{"target": t, "check": c.check, "passed": c.passed,
                        "blocking": c.blocking, "message": c.message}
                       for t, cs in made.checks.items() for c in cs]}


def _broken_answer(row: AssetDefinition, why: str) -> dict:
    return {"name": row.name, "dependencies": json.loads(row.dependencies),
            "code_version": row.code_version, "description": row.description or "",
            "status": f"broken: {why}", "latest_version": "", "partitions": [],
            "defined_by": "contract", "checks": json.loads(row.checks)}


def _statuses(defs, db, names=None) -> dict:
    from deepx_flow.assets.status import status
    table = status(defs, db.url)
    return {r.asset: r for r in table.rows if names is None or r.asset in names}


def _partition_keys(a, partitions) -> list[str] | None:
    if partitions is None or partitions == []:
        return None
    if a.partitions is None:
        raise InputError(f"asset {a.name!r} is not partitioned; leave partitions out")
    if not isinstance(partitions, list) or not all(isinstance(k, str) for k in partitions):
        raise InputError(f"partitions is {shown(partitions)}, not a list of keys")
    unknown = [k for k in partitions if k not in a.partitions.keys()]
    if unknown:
        raise NotFound(f"asset {a.name!r} has no partition(s) "
                       f"{', '.join(map(shown, unknown))} (its keys: "
                       f"{', '.join(a.partitions.keys())})")
    return partitions


def _slices(name: str, ranges, shape) -> tuple:
    """[start, stop) pairs (one per leading axis) as slices, each within the axis."""
    if not isinstance(ranges, list) or len(ranges) > len(shape):
        raise InputError(f"slice of asset {name!r} is {shown(ranges)}, not a list of at most "
                         f"{len(shape)} [start, stop) ranges (its shape is {list(shape)})")
    out = []
    for axis, (r, size) in enumerate(zip(ranges, shape)):
        if not (isinstance(r, (list, tuple)) and len(r) == 2 and
                all(type(v) is int for v in r) and 0 <= r[0] <= r[1] <= size):
            raise InputError(f"slice of asset {name!r}: axis {axis} range {shown(r)} is not "
                             f"[start, stop) with 0 <= start <= stop <= {size}")
        out.append(slice(r[0], r[1]))
    return tuple(out)


def _check_reads(defs, rows, name: str, max_nodes: int) -> None:
    """Each input of `name`'s graph that reads an upstream asset has that asset's dtype and
    shape (the shape of one partition where both have the same partitions), when the
    upstream's shape is known before it is made: it is not a partitioned one read whole."""
    from deepx_flow.assets.definition import reads_partition_by_partition
    from deepx_flow.gateway.graphs import graph_of
    graph = graph_of(rows[name].spec, max_nodes)
    a = defs[name]
    for node in graph.inputs:
        if node.id not in a.params:
            continue  # the partition's index
        up = defs[node.id]
        up_graph = graph_of(rows[node.id].spec, max_nodes)
        made = up_graph[up_graph.outputs[0][1]]
        shape = made.shape
        if up.partitions is not None and not reads_partition_by_partition(a, up):
            # its partitions concatenated along its partition axis
            axis, parts = up.partition_axis, len(up.partitions.keys())
            shape = shape[:axis] + (shape[axis] * parts,) + shape[axis + 1:]
        if (made.dtype, shape) != (node.dtype, node.shape):
            raise InputError(f"asset {name}: input {node.id!r} is {node.dtype}{node.shape}, "
                             f"but asset {node.id} is {made.dtype}{shape}"
                             + ("" if shape == made.shape else
                                f" ({len(up.partitions.keys())} partitions of {made.shape})"))


__all__ = ["AssetCalls", "materialized_summary"]
