"""`@dx.asset` and `dx.Definitions`: named tensors, their upstream assets and code versions.

An asset is a function that builds a tensor graph. Its parameters name the upstream assets
it reads (as in Dagster); `deps=` adds upstream assets it depends on without reading them.
`code_version` is the user's statement that the body changed: a new one makes the asset
stale. The body runs only when a materialization composes the graph.

A partitioned asset (`partitions=`, see `partitions.py`) takes a `partition` parameter
that is not an upstream asset: the partition being built.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable

from deepx_flow.errors import DeepxError, GraphError, did_you_mean


@dataclass(frozen=True)
class AssetDef:
    """One asset: how to build it and what it depends on."""

    name: str
    fn: Callable = field(repr=False)
    params: tuple[str, ...]  # upstream assets passed to the body, by parameter name
    deps: tuple[str, ...]  # all upstream assets: params, then deps= not passed
    code_version: str | None = None
    description: str | None = None
    metadata: dict = field(default_factory=dict)
    storage: str = "zarr"  # the storage engine that keeps its versions
    checks: tuple = ()  # dx.checks objects
    partitions: object = None  # StaticPartitions, TimeWindowPartitions, or None
    partition_axis: int | None = None  # partitions are slices along this axis
    takes_partition: bool = False  # the body has a `partition` parameter
    recovery: object = None  # dx.Recovery or a mapping of task settings for its tasks

    def __repr__(self) -> str:
        from deepx_flow.assets.display import asset_repr
        return asset_repr(self)

    def _repr_html_(self) -> str:
        from deepx_flow.assets.display import asset_html
        return asset_html(self)


def asset(fn: Callable | None = None, *, name: str | None = None, deps=(),
          code_version: str | None = None, description: str | None = None,
          metadata: dict | None = None, storage: str = "zarr", checks=(), partitions=None,
          partition_axis: int | None = None, recovery=None):
    """Declare an asset; use as `@dx.asset` or `@dx.asset(code_version="2", ...)`.

    `recovery` (a dx.Recovery, or a mapping such as {"retries": 3, "timeout": 600}) sets
    retries, backoff and time limits for the tasks that compute this asset."""
    from deepx_flow.assets.checks import check_names

    def wrap(f: Callable) -> AssetDef:
        asset_name = name or f.__name__
        if not asset_name.isidentifier():
            raise GraphError(f"asset name must be an identifier, got {asset_name!r}")
        params = []
        for p in inspect.signature(f).parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise GraphError(f"asset {asset_name}: *args and **kwargs cannot name "
                                 f"upstream assets; use named parameters")
            params.append(p.name)
        takes_partition = "partition" in params
        if takes_partition:
            if partitions is None:
                raise GraphError(f"asset {asset_name} takes a 'partition' parameter but has "
                                 f"no partitions=")
            params.remove("partition")
        if partition_axis is not None and partitions is None:
            raise GraphError(f"asset {asset_name}: partition_axis needs partitions=")
        try:
            check_names(checks)
        except GraphError as err:
            raise GraphError(f"asset {asset_name}: {err}") from None
        extra = tuple(d.name if isinstance(d, AssetDef) else str(d) for d in deps)
        return AssetDef(asset_name, f, tuple(params),
                        tuple(params) + tuple(d for d in extra if d not in params),
                        None if code_version is None else str(code_version),
                        description or inspect.getdoc(f), dict(metadata or {}), storage,
                        tuple(checks), partitions, partition_axis, takes_partition,
                        _recovery(asset_name, recovery))
    return wrap(fn) if fn is not None else wrap


def _recovery(asset_name: str, recovery):
    """Check an asset's recovery settings when it is declared."""
    from deepx_flow.runtime.recovery import Recovery
    if recovery is None or isinstance(recovery, Recovery):
        return recovery
    try:
        Recovery().merged(dict(recovery))
    except (TypeError, ValueError) as err:
        raise GraphError(f"asset {asset_name}: recovery must be a dx.Recovery or a mapping "
                         f"of task settings: {err}") from None
    except DeepxError as err:
        raise GraphError(f"asset {asset_name}: {err}") from None
    return dict(recovery)


class Definitions:
    """The assets (and schedules) of a project, checked: unique names, every upstream
    asset defined, no cycles. `order` is a topological order of the asset names."""

    def __init__(self, assets=(), schedules=()):
        self.assets: dict[str, AssetDef] = {}
        for a in assets:
            if not isinstance(a, AssetDef):
                raise GraphError(f"Definitions(assets=...) takes @dx.asset functions, got "
                                 f"{a!r}")
            if a.name in self.assets:
                raise GraphError(f"two assets are named {a.name!r}")
            self.assets[a.name] = a
        for a in self.assets.values():
            for dep in a.deps:
                if dep not in self.assets:
                    raise GraphError(f"asset {a.name} depends on {dep!r}, which is not "
                                     f"defined{did_you_mean(dep, self.assets)}")
        self.order = _topological(self.assets)
        for a in self.assets.values():
            for dep in a.deps:
                _check_partitioned_read(a, self.assets[dep])
        from deepx_flow.assets.schedule import checked_schedules
        self.schedules = checked_schedules(self, schedules)

    def downstream(self, name: str) -> list[str]:
        """Assets that read `name` directly."""
        return [a.name for a in self.assets.values() if name in a.deps]

    def __getitem__(self, name: str) -> AssetDef:
        return self.assets[name]

    def __repr__(self) -> str:
        from deepx_flow.assets.display import definitions_repr
        return definitions_repr(self)

    def _repr_html_(self) -> str:
        from deepx_flow.assets.display import definitions_html
        return definitions_html(self)


def reads_partition_by_partition(a: AssetDef, dep: AssetDef) -> bool:
    """Whether each partition of `a` reads the same partition of `dep` (else it reads `dep`
    whole: all its partitions concatenated along its partition axis)."""
    return a.partitions is not None and a.partitions == dep.partitions


def _check_partitioned_read(a: AssetDef, dep: AssetDef) -> None:
    if dep.partitions is None or reads_partition_by_partition(a, dep):
        return
    if dep.partition_axis is None:
        raise GraphError(f"asset {a.name} reads {dep.name}, whose partitions are separate "
                         f"tensors: give {a.name} the same partitions, or give {dep.name} "
                         f"a partition_axis so it can be read whole")


def _topological(assets: dict[str, AssetDef]) -> list[str]:
    order, state = [], {}

    def visit(name, path):
        if state.get(name) == "done":
            return
        if state.get(name) == "visiting":
            cycle = path[path.index(name):] + [name]
            raise GraphError(f"assets depend on each other in a cycle: {' -> '.join(cycle)}")
        state[name] = "visiting"
        for dep in assets[name].deps:
            visit(dep, path + [name])
        state[name] = "done"
        order.append(name)

    for name in assets:
        visit(name, [])
    return order
