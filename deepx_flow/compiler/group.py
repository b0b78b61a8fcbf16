"""Pass: compute each data-parallel shard's tasks as one task (training steps).

Before: a lowered Dask graph (after `inline_reads`), its keys in an order where every task
comes after the keys it reads, and `roots`: the chunk keys of a batch, each with its shard
(its chunk index along the batch axis).
After: an equal computation with far fewer tasks. Every task is labelled with the shards its
inputs come from, transitively. The tasks of one shard (the forward and backward pass of its
rows, its partial gradients) become one task, and so do the tasks that combine several
shards (the tree sums of the gradients, the loss, the optimizer's update); a task that reads
no shard joins the group of its readers when they are all in one group. A group's task runs
its members in order on one worker (`kernels.grouped.run_group`) and returns the values read
outside it; each such key stays in the graph as a small task taking its value out of the
group's result, so readers, outputs and the next step find it under its own key.

Why: a training step of a 2-layer MLP lowers to about 50 tasks per batch of a few thousand
rows, and the scheduler's cost per task (about a millisecond on a busy 2-core machine, a
round trip for every level of the step's dependency chain) was most of the step's time.
What it gives up: Dask no longer balances the members of a group across workers (a shard's
work was on one worker's thread anyway, as one chain of dependent tasks), and a member that
fails makes its whole group run again.
"""

from __future__ import annotations

from collections import defaultdict

from deepx_flow.compiler.taskspec import data_node, ref, refs_of, task
from deepx_flow.kernels.grouped import run_group, take_output

ALL = "all"  # the group of tasks that read several shards
GROUP_SUFFIX = "-group"  # a group's key is (name + GROUP_SUFFIX, shard or ALL)


def group_by_shard(dsk: dict, roots: dict, keep, name: str) -> dict:
    """The graph with each shard's tasks, and the tasks combining shards, as one task each;
    see the module docstring. `name` starts the groups' keys (unique to this graph)."""
    reads = {key: [r for r in refs_of(node) if r in dsk] for key, node in dsk.items()}
    shards: dict = {}
    for key in dsk:
        found = {roots[key]} if key in roots else set()
        for r in reads[key]:
            found |= shards[r]
        shards[key] = frozenset(found)
    group = {key: (next(iter(s)) if len(s) == 1 else ALL) for key, s in shards.items() if s}
    readers = defaultdict(set)
    for key, rs in reads.items():
        for r in rs:
            readers[r].add(key)
    for key in reversed(list(dsk)):  # a task that reads no shard goes with its readers
        if key not in group and key not in keep:
            theirs = {group.get(r) for r in readers[key]}
            if len(theirs) == 1 and None not in theirs:
                group[key] = theirs.pop()

    members = defaultdict(list)
    for key in dsk:
        if key in group:
            members[group[key]].append(key)
    out = {key: node for key, node in dsk.items() if key not in group}
    for label, keys in members.items():
        if len(keys) < 2:
            for key in keys:
                out[key] = dsk[key]
            continue
        inside = set(keys)
        outside = sorted({r for key in keys for r in refs_of(dsk[key]) if r not in inside},
                         key=repr)
        wanted = [key for key in keys if key in keep or readers[key] - inside]
        group_key = (name + GROUP_SUFFIX, str(label))
        out[group_key] = task(group_key, run_group,
                              data_node(group_key + ("members",), tuple(dsk[k] for k in keys)),
                              tuple(outside), tuple(wanted), *[ref(r) for r in outside])
        for i, key in enumerate(wanted):
            out[key] = task(key, take_output, ref(group_key), i)
    return out
