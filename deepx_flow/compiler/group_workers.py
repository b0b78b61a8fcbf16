"""Pass: run each worker's consecutive tasks of a step in pieces as one task.

Before: a lowered Dask graph (its keys in an order where every task comes after the keys it
reads) and `pinned`: the worker of some of its tasks (those that read or make a parameter's
pieces: `train/pieces.py`).
After: an equal computation with far fewer tasks, each placed on a worker.

A task gets a worker: its pinned one; else the one worker of what it reads, when that has
one (a task reading the results of several workers, a gather or a sum of partial results,
gets none: it is not grouped, and Dask places it); else, for a task that reads nothing in
the graph (a scalar), that of its first reader. Then a level: the most, over what it reads, of that
task's level, plus one where that task is on another worker. The tasks of one worker and
one level are one group (several, in order, where they would hold more than a budget): a
group reads another worker's results only from lower levels, so the groups' graph has no
cycle, and a step costs the scheduler a round per level instead of one per task. A value read
outside its group, or kept, is taken out of the group's result by a small task of its own,
so a reader fetches that value, not the whole result. A group's task runs its members in
order and lets each result go after its last reader (`kernels.grouped.run_group`).
(`group.py` groups a replicated step's tasks by batch shard instead.)
"""

from __future__ import annotations

from collections import defaultdict

from deepx_flow.compiler.taskspec import data_node, dependency_order, ref, refs_of, task
from deepx_flow.kernels.grouped import run_group, take_output

GROUP_SUFFIX = "-group"


def group_by_worker(dsk: dict, pinned: dict, keep, name: str, nbytes=None,
                    budget: int | None = None) -> tuple[dict, dict]:
    """The graph with each (worker, level)'s tasks as one task, and key -> worker of every
    task of it; see the module docstring. With `nbytes(key)` (the bytes of a key's value)
    and `budget`, a group holds at most `budget` bytes of what it reads and makes: past
    that its worker's later tasks of the level start another group (still no cycle: a
    group reads only groups of lower levels and the earlier groups of its own)."""
    reads = {key: [r for r in refs_of(node) if r in dsk] for key, node in dsk.items()}
    readers = defaultdict(list)
    for key, rs in reads.items():
        for r in rs:
            readers[r].append(key)
    worker = dict(pinned)
    for key in dsk:
        if key not in worker and reads[key]:
            found = {worker[r] for r in reads[key] if r in worker}
            if len(found) == 1:
                worker[key] = found.pop()
    for key in reversed(list(dsk)):
        if key not in worker:
            theirs = [worker[r] for r in readers[key] if r in worker]
            if theirs:
                worker[key] = theirs[0]
    if not worker:
        return dsk, {}
    level = {}
    for key in dsk:
        level[key] = max((level[r] + (worker.get(r) != worker.get(key)) for r in reads[key]),
                         default=0)
    members = defaultdict(list)
    held: dict = defaultdict(int)  # (worker, level) -> bytes its open group reads and makes
    part: dict = defaultdict(int)  # (worker, level) -> the number of its open group
    for key in dsk:
        if key not in worker:
            continue
        at = (worker[key], level[key])
        if nbytes is not None and budget is not None:
            size = nbytes(key) + sum(nbytes(r) for r in reads[key])
            if held[at] and held[at] + size > budget:
                part[at] += 1
                held[at] = 0
            held[at] += size
        members[(worker[key], level[key], part[at])].append(key)
    home = {key: h for h, keys in members.items() for key in keys if len(keys) > 1}
    groups = {h: keys for h, keys in members.items() if len(keys) > 1}
    labels = {h: i for i, h in enumerate(sorted(groups, key=lambda h: (h[1], h[0], h[2])))}

    def group_key(h):
        return (name + GROUP_SUFFIX, h[1], str(labels[h]))

    # What is read outside its group, or kept, is taken out of the group's result as a task
    # of its own: a reader then fetches that value only, not the whole result.
    given: dict = defaultdict(dict)  # group -> {key: position in its result}
    out: dict = {}
    where_out: dict = {}
    for key in dsk:
        if key not in home:
            out[key] = dsk[key]
            if key in worker:
                where_out[key] = worker[key]
        elif key in keep or any(home.get(r) != home[key] for r in readers[key]):
            given[home[key]].setdefault(key, len(given[home[key]]))
            out[key] = task(key, take_output, ref(group_key(home[key])), given[home[key]][key])
            where_out[key] = worker[key]
    for h, keys in groups.items():
        inside = set(keys)
        outside = list(dict.fromkeys(r for key in keys for r in refs_of(dsk[key])
                                     if r not in inside))
        gk = group_key(h)
        out[gk] = task(gk, run_group, data_node(gk + ("members",), tuple(dsk[k] for k in keys)),
                       tuple((r, None) for r in outside), tuple(given[h]),
                       *[ref(r) for r in outside])
        where_out[gk] = h[0]
    # every key in an order where each task comes after what it reads
    return {k: out[k] for k in dependency_order(out)}, where_out
