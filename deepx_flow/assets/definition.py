"""`@dx.asset` and `dx.Definitions`: named tensors, their upstream assets and code versions.

An asset is a function that builds a tensor graph. Its parameters name the upstream assets
it reads (as in Dagster); `deps=` adds upstream assets it depends on without reading them.
`code_version` is the user's statement that the body changed: a new one makes the asset
stale. The body runs only when a materialization composes the graph.
"""

from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass, field
from typing import Callable

from deepx_flow.errors import GraphError


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
    checks: tuple = ()


def asset(fn: Callable | None = None, *, name: str | None = None, deps=(),
          code_version: str | None = None, description: str | None = None,
          metadata: dict | None = None, storage: str = "zarr", checks=()):
    """Declare an asset; use as `@dx.asset` or `@dx.asset(code_version="2", ...)`."""
    def wrap(f: Callable) -> AssetDef:
        params = []
        for p in inspect.signature(f).parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise GraphError(f"asset {name or f.__name__}: *args and **kwargs cannot "
                                 f"name upstream assets; use named parameters")
            params.append(p.name)
        extra = tuple(d.name if isinstance(d, AssetDef) else str(d) for d in deps)
        asset_name = name or f.__name__
        if not asset_name.isidentifier():
            raise GraphError(f"asset name must be an identifier, got {asset_name!r}")
        return AssetDef(asset_name, f, tuple(params),
                        tuple(params) + tuple(d for d in extra if d not in params),
                        None if code_version is None else str(code_version),
                        description or inspect.getdoc(f), dict(metadata or {}), storage,
                        tuple(checks))
    return wrap(fn) if fn is not None else wrap


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
                    hint = difflib.get_close_matches(dep, self.assets, n=1)
                    raise GraphError(f"asset {a.name} depends on {dep!r}, which is not "
                                     f"defined" + (f" (did you mean {hint[0]!r}?)" if hint
                                                   else ""))
        self.order = _topological(self.assets)
        self.schedules = tuple(schedules)

    def downstream(self, name: str) -> list[str]:
        """Assets that read `name` directly."""
        return [a.name for a in self.assets.values() if name in a.deps]

    def __getitem__(self, name: str) -> AssetDef:
        return self.assets[name]


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
