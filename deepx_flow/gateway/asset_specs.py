"""Assets defined by a graph spec (`assets:define`): checked, recorded, made into AssetDefs.

A client in any language defines an asset as Python code does with `@dx.asset`: a graph
spec with one output builds its tensor, each of the spec's inputs reads the upstream asset
of that name (its newest usable version, or the same partition when both are partitioned
alike), `dependencies` adds upstream assets it depends on without reading them. The body
is `dx.call(graph, upstream)`, so the nodes made are the SDK's and the asset has the same
lineage, staleness and checks as one written in Python. A partitioned asset's graph may
have an input named `partition` (int64, a scalar): it is given the index of the
partition being made (its place among the keys), so partitions can differ.

Its code version is the digest of what defines it (the spec, its dependencies, partitions
and checks; not its description): defining it again differently makes it stale, defining
it again the same changes nothing.

Checks come in the contract's form, one object each, with the names of `dx.checks`:

    {"kind": "all_finite"}
    {"kind": "in_range", "low": 0, "high": 1}     (either bound may be left out)
    {"kind": "shape", "shape": [-1, 16]}           (-1: any size along that axis)

and `"blocking": false` for a check that is recorded and warned about but does not stop
what reads the asset.
"""

from __future__ import annotations

import hashlib
import json
import math
import time

from deepx_flow.errors import InputError, SpecError, shown
from deepx_flow.meta.models import AssetDefinition

CHECK_KINDS = ("all_finite", "in_range", "shape")
PARTITION_INPUT = "partition"  # a graph input given the partition's index
CHECK_FIELDS = {"all_finite": set(), "in_range": {"low", "high"}, "shape": {"shape"}}


def checked_definition(name, spec, dependencies=(), description: str = "",
                       partitions=(), partition_axis=None, checks=(),
                       max_nodes: int = 100_000) -> AssetDefinition:
    """The row for an `assets:define` request, every field checked: a SpecError or
    InputError naming what is wrong otherwise. Partitions are static keys (none: not
    partitioned); `partition_axis` makes the partitions slices of one tensor."""
    from deepx_flow.gateway.graphs import graph_of, spec_document
    if not isinstance(name, str) or not name.isidentifier():
        raise InputError(f"asset name {shown(name)} is not an identifier (letters, digits "
                         f"and '_', not starting with a digit)")
    doc = spec_document(spec)
    try:
        graph = graph_of(doc, max_nodes)
    except SpecError as err:
        raise SpecError(f"asset {name}: {err}") from None
    if len(graph.outputs) != 1:
        raise SpecError(f"asset {name}: its graph has {len(graph.outputs)} outputs; an "
                        f"asset's graph has one (its tensor)")
    dependencies = _names(dependencies, f"asset {name}: dependencies")
    partitions = _names(partitions, f"asset {name}: partitions") or None
    index = next((n for n in graph.inputs if n.id == PARTITION_INPUT), None)
    if index is not None and (partitions is None or (index.dtype, index.shape) !=
                              ("int64", ())):
        raise InputError(f"asset {name}: its input {PARTITION_INPUT!r} is given the index of "
                         f"the partition being made, so it is an int64 scalar of a "
                         f"partitioned asset" + ("" if partitions is not None else
                                                 " (this asset has no partitions)"))
    if partitions is not None:
        from deepx_flow.assets.partitions import StaticPartitions
        from deepx_flow.errors import GraphError
        try:
            StaticPartitions(partitions)
        except GraphError as err:
            raise InputError(f"asset {name}: {err}") from None
    axis = _axis(name, partition_axis, partitions)
    rank = len(graph[graph.outputs[0][1]].shape)
    if axis is not None and axis >= rank:
        raise InputError(f"asset {name}: partition_axis {axis} is not an axis of its "
                         f"{rank}-dimensional tensor")
    if description is not None and not isinstance(description, str):
        raise InputError(f"asset {name}: description is {shown(description)}, not text")
    checks = [_check(name, c) for c in _list(checks, f"asset {name}: checks")]
    to_check(checks)  # and repeated names
    defining = {"spec": doc, "dependencies": dependencies, "partitions": partitions,
                "partition_axis": axis, "checks": checks}
    digest = hashlib.sha256(json.dumps(defining, sort_keys=True, separators=(",", ":"))
                            .encode()).hexdigest()
    return AssetDefinition(name=name, spec=json.dumps(doc, separators=(",", ":")),
                           dependencies=json.dumps(dependencies),
                           description=description or None,
                           partitions=json.dumps({"keys": partitions, "axis": axis})
                           if partitions else None,
                           checks=json.dumps(checks), code_version=digest[:16],
                           defined_at=time.time())


def asset_from_row(row: AssetDefinition, max_nodes: int = 100_000):
    """The AssetDef a recorded definition describes; its body calls the spec's graph on
    the upstream tensors named after its inputs."""
    from deepx_flow.assets.definition import AssetDef
    from deepx_flow.assets.partitions import StaticPartitions
    from deepx_flow.gateway.graphs import graph_of
    from deepx_flow.sdk.call import call

    graph = graph_of(row.spec, max_nodes)
    [(output, _)] = graph.outputs
    reads = tuple(node.id for node in graph.inputs if node.id != PARTITION_INPUT)
    takes_partition = len(reads) < len(graph.inputs)
    unread = tuple(d for d in json.loads(row.dependencies) if d not in reads)
    partitioned = json.loads(row.partitions) if row.partitions else None

    def body(partition=None, **upstream):
        if takes_partition:
            from deepx_flow.sdk.functions import full
            upstream[PARTITION_INPUT] = full((), partition.index, "int64")
        return call(graph, upstream)[output]

    return AssetDef(row.name, body, reads, reads + unread, row.code_version,
                    row.description, {"defined_by": "contract",
                                      "checks": json.loads(row.checks),
                                      "partition_axis": partitioned["axis"]
                                      if partitioned else None}, "zarr",
                    tuple(to_check(json.loads(row.checks))),
                    StaticPartitions(partitioned["keys"]) if partitioned else None,
                    partitioned["axis"] if partitioned else None, takes_partition, None)


def to_check(checks: list[dict]) -> list:
    """The `dx.checks` objects of checks in the contract's form (already checked)."""
    from deepx_flow.assets import checks as dx_checks
    from deepx_flow.errors import GraphError
    made = []
    for c in checks:
        kind = c["kind"]
        if kind == "all_finite":
            check = dx_checks.all_finite
        elif kind == "in_range":
            check = dx_checks.in_range(c.get("low"), c.get("high"))
        else:
            check = dx_checks.shape([None if n == -1 else n for n in c["shape"]])
        made.append(check if c.get("blocking", True) else check.non_blocking())
    try:
        dx_checks.check_names(made)
    except GraphError as err:
        raise InputError(f"checks: {err}; an asset has at most one check of each kind") \
            from None
    return made


def _check(asset: str, c) -> dict:
    """One check in the contract's form, checked; canonical (no defaults written)."""
    where = f"asset {asset}: check {shown(c)}"
    if not isinstance(c, dict) or c.get("kind") not in CHECK_KINDS:
        from deepx_flow.errors import did_you_mean
        kind = c.get("kind") if isinstance(c, dict) else None
        hint = did_you_mean(kind, CHECK_KINDS) if isinstance(kind, str) else ""
        raise InputError(f"asset {asset}: check kind {shown(kind)} is not one of "
                         f"{', '.join(CHECK_KINDS)}{hint}" if isinstance(c, dict) else
                         f"{where} is not an object such as {{\"kind\": \"all_finite\"}}")
    kind = c["kind"]
    unknown = set(c) - {"kind", "blocking"} - CHECK_FIELDS[kind]
    if unknown:
        raise InputError(f"{where}: {kind} takes no {', '.join(sorted(unknown))}")
    out = {"kind": kind}
    if "blocking" in c:
        if type(c["blocking"]) is not bool:
            raise InputError(f"{where}: blocking is true or false")
        if not c["blocking"]:
            out["blocking"] = False
    if kind == "in_range":
        for bound in ("low", "high"):
            value = c.get(bound)
            if value is None:
                continue
            try:
                number = float(value) if type(value) in (int, float) else math.nan
            except OverflowError:  # an integer past float's range
                number = math.nan
            if not math.isfinite(number):
                raise InputError(f"{where}: {bound} is not a finite number")
            out[bound] = number  # a float, as over gRPC: one code version either way
        if "low" not in out and "high" not in out:
            raise InputError(f"{where}: in_range needs a low or a high bound")
        if "low" in out and "high" in out and out["low"] > out["high"]:
            raise InputError(f"{where}: low is above high")
    if kind == "shape":
        sizes = c.get("shape")
        if not isinstance(sizes, list) or \
                not all(type(n) is int and -1 <= n < 2 ** 63 for n in sizes):
            raise InputError(f"{where}: shape is a list of sizes (-1 for any size)")
        out["shape"] = sizes
    return out


def _axis(asset: str, axis, partitions) -> int | None:
    if axis is None:
        return None
    if partitions is None:
        raise InputError(f"asset {asset}: partition_axis needs partitions")
    if type(axis) is not int or axis < 0:
        raise InputError(f"asset {asset}: partition_axis is {shown(axis)}, not an axis "
                         f"number (0, 1, ...)")
    return axis


def _list(values, what: str) -> list:
    if values is None:
        return []
    if not isinstance(values, (list, tuple)):
        raise InputError(f"{what} is {shown(values)}, not a list")
    return list(values)


def _names(values, what: str) -> list[str]:
    names = _list(values, what)
    bad = [v for v in names if not isinstance(v, str) or not v]
    if bad:
        raise InputError(f"{what}: {shown(bad[0])} is not a name")
    if len(set(names)) != len(names):
        raise InputError(f"{what}: {', '.join(sorted({n for n in names if names.count(n) > 1}))} "
                         f"given twice")
    return names
