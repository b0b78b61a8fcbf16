"""What a materialization makes: targets (an asset, or one partition of it), what each
reads, and the stages a blocking check splits them into. Pure functions of the definitions.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from deepx_flow.assets.definition import reads_partition_by_partition
from deepx_flow.assets.partitions import resolve_keys
from deepx_flow.errors import InputError


@dataclass(frozen=True, order=True)
class Target:
    asset: str
    partition: str | None = None

    def __str__(self) -> str:  # also the key in a version's upstream_versions
        return self.asset if self.partition is None else f"{self.asset}[{self.partition}]"


def targets_for(defs, names: list[str], partitions=None,
                now: dt.datetime | None = None) -> list[Target]:
    """The targets of `names` (topological order): one per unpartitioned asset, one per
    chosen partition key of a partitioned one (`partitions`: None for all keys, a key, a
    list, or "first...last")."""
    out = []
    for name in names:
        a = defs[name]
        if a.partitions is None:
            out.append(Target(name))
            continue
        try:
            keys = resolve_keys(a.partitions, partitions, now)
        except InputError as err:
            raise InputError(f"asset {name}: {err}") from None
        out.extend(Target(name, key) for key in keys)
    if partitions is not None and not any(t.partition is not None for t in out):
        raise InputError(f"partitions={partitions!r} was given, but no selected asset is "
                         f"partitioned")
    return out


def reads(defs, target: Target, now: dt.datetime | None = None) -> dict[str, list[Target]]:
    """Per upstream asset of `target`, the targets it reads: the same partition, every
    partition (an upstream read whole), or the unpartitioned asset."""
    a = defs[target.asset]
    out = {}
    for dep in a.deps:
        d = defs[dep]
        if d.partitions is None:
            out[dep] = [Target(dep)]
        elif reads_partition_by_partition(a, d):
            out[dep] = [Target(dep, target.partition)]
        else:
            out[dep] = [Target(dep, key) for key in d.partitions.keys(now)]
    return out


def stages(defs, targets: list[Target], now: dt.datetime | None = None) -> list[list[Target]]:
    """Split `targets` so that whatever reads an asset with blocking checks comes in a later
    stage than it: a stage runs only after the checks of the ones before it passed."""
    chosen, level = set(targets), {}
    for t in targets:  # topological order: upstream levels are known
        ups = [u for group in reads(defs, t, now).values() for u in group if u in chosen]
        level[t] = max((level[u] + (1 if _blocks(defs[u.asset]) else 0) for u in ups),
                       default=0)
    return [[t for t in targets if level[t] == n] for n in range(max(level.values(),
                                                                       default=-1) + 1)]


def _blocks(a) -> bool:
    return any(c.blocking for c in a.checks)


__all__ = ["Target", "targets_for", "reads", "stages"]
