"""Pass: compute each data-parallel shard's tasks of a training step as one task.

Before: a lowered Dask graph of one or more consecutive steps (after `inline_reads`), its keys
in an order where every task comes after the keys it reads, and `roots`: the chunk keys of
each step's batch, each with its (step, shard) (its chunk index along the batch axis).
After: an equal computation with far fewer tasks, one per shard and step.

Every task is labelled with the latest step its inputs come from, transitively, and the
shards of that step. The tasks of one shard of a step (the forward and backward pass of its
rows, its partial gradients) become one group. The tasks that combine a step's shards (the
tree sums of the gradients, the loss, the optimizer's update) are copied into every shard's
group of the next step, which first sums the partials and updates the parameters itself and
then runs its own rows on them: each worker keeps its own copy of the parameters (the same
numbers: the same operations in the same order), and a step costs one round of the
scheduler instead of three (partials to one worker, its update, parameters back). The last
step of the graph has nothing to copy into: what combines its shards is one more group. A
task that reads no shard joins the group of its readers when they are all in one group.
When every step has one shard (a small batch, or one worker thread), all the graph's steps
are one group: one task for the whole chain.

A group's task runs its members in order on one worker (`kernels.grouped.run_group`) and
returns the values read outside it. Another group reads such a value straight from that
result (from its own copy of the update where there is one); a kept key, or one read by a
task in no group, stays in the graph as a small task taking its value out.

Why: a training step of a 2-layer MLP lowers to about 50 tasks per batch of a few thousand
rows, and the scheduler's cost per task (about a millisecond on a busy 2-core machine, a
round trip for every level of the step's dependency chain) was most of the step's time.
What it gives up: Dask no longer balances the members of a group across workers (a shard's
work was on one worker's thread anyway, as one chain of dependent tasks); a member that
fails makes its whole group run again; each worker computes the update (cheap next to the
shard's matmuls) and receives the other shards' partial gradients.
"""

from __future__ import annotations

from collections import defaultdict

from deepx_flow.compiler.taskspec import data_node, ref, refs_of, task
from deepx_flow.kernels.grouped import run_group, take_output

ALL = "all"  # the shard label of tasks that combine several shards
GROUP_SUFFIX = "-group"  # a group's key is (name + GROUP_SUFFIX, step, shard or ALL)


def group_by_shard(dsk: dict, roots: dict, keep, name: str) -> dict:
    """The graph with each (step, shard)'s tasks as one task; see the module docstring.
    `roots` maps batch chunk keys to (step, shard); `name` starts the groups' keys."""
    reads = {key: [r for r in refs_of(node) if r in dsk] for key, node in dsk.items()}
    readers = defaultdict(set)
    for key, rs in reads.items():
        for r in rs:
            readers[r].add(key)
    homes = _homes(dsk, reads, readers, roots, keep)
    members = defaultdict(list)
    for key in dsk:
        for home in homes.get(key, ()):
            members[home].append(key)
    for home, keys in list(members.items()):  # one task alone gains nothing from a group
        if len(keys) == 1 and homes[keys[0]] == [home]:
            del homes[keys[0]], members[home]

    def source(key, reader_home):
        """The group a reader in `reader_home` (None: no group) reads `key` from; None when
        it is computed in that group itself."""
        found = homes[key]
        if reader_home in found:
            return None
        same_shard = [h for h in found if reader_home and h[1] == reader_home[1]]
        return (same_shard or found)[0]

    given: dict = defaultdict(dict)  # home -> {key: position in the group's result}
    taken_out: dict = {}  # keys kept or read outside any group, in order (a set)
    for key in dsk:
        if key not in homes:
            continue
        for r in sorted(readers[key], key=repr):
            for home in homes.get(r, [None]):
                src = source(key, home)
                if src is not None:
                    given[src].setdefault(key, len(given[src]))
                    if home is None:
                        taken_out[key] = None
        if key in keep:
            given[homes[key][0]].setdefault(key, len(given[homes[key][0]]))
            taken_out[key] = None

    def group_key(home):
        return (name + GROUP_SUFFIX, home[0], str(home[1]))

    out = {key: node for key, node in dsk.items() if key not in homes}
    for home, keys in members.items():
        inside = set(keys)
        outside = list(dict.fromkeys(r for key in keys for r in refs_of(dsk[key])
                                     if r not in inside))
        where, args = [], []
        for r in outside:
            if r in homes:
                src = source(r, home)
                where.append((r, given[src][r]))
                args.append(ref(group_key(src)))
            else:
                where.append((r, None))
                args.append(ref(r))
        gk = group_key(home)
        out[gk] = task(gk, run_group, data_node(gk + ("members",), tuple(dsk[k] for k in keys)),
                       tuple(where), tuple(given[home]), *args)
    for key in taken_out:
        src = homes[key][0]
        out[key] = task(key, take_output, ref(group_key(src)), given[src][key])
    return out


def _homes(dsk, reads, readers, roots, keep) -> dict:
    """Key -> the groups, (step, shard or ALL), it is computed in (several for a task that
    combines shards and is copied into the next step's shard groups)."""
    found: dict = {}
    for key in dsk:
        labels = [found[r] for r in reads[key] if r in found]
        if key in roots:
            step, shard = roots[key]
            labels.append((step, frozenset([shard])))
        if labels:
            latest = max(step for step, _ in labels)
            found[key] = (latest, frozenset().union(*(s for step, s in labels if step == latest)))
    label = {key: (step, next(iter(s)) if len(s) == 1 else ALL)
             for key, (step, s) in found.items()}
    for key in reversed(list(dsk)):  # a task that reads no shard goes with its readers
        if key not in label and key not in keep:
            theirs = {label.get(r) for r in readers[key]}
            if len(theirs) == 1 and None not in theirs:
                label[key] = theirs.pop()
    shards = defaultdict(set)
    for step, shard in roots.values():
        shards[step].add(shard)
    if len(set().union(*shards.values())) == 1:
        # One shard in every step: the steps are one chain on one worker with nothing to
        # send between them, so they run as one task, without a scheduler round per step.
        first = min(shards)
        return {key: [(first, shard)] for key, (_, shard) in label.items()}
    homes = {}
    for key, (step, shard) in label.items():
        if shard == ALL and shards.get(step + 1):
            homes[key] = [(step + 1, s) for s in sorted(shards[step + 1])]
        else:
            homes[key] = [(step, shard)]
    return homes


def group_labels(dsk: dict, labels: dict) -> dict:
    """Node id of each group's task in `dsk` (its key's name) -> what the task runs, as the
    run's task rows name it: "group[matmul, mean+prologue, sum]", the kinds of operator
    (`labels`: node id -> operator label, `ir.program.operator_label`) of its members, without
    their formulas (a step's group holds dozens). A group is named after no node of the plan,
    so it has no label of its own."""
    from deepx_flow.ir.keys import key_name, node_of
    from deepx_flow.ir.program import short_label
    found = {}
    for key, node in dsk.items():
        name = key_name(key)
        if not name.endswith(GROUP_SUFFIX) or name in found:
            continue
        args = getattr(node, "args", ())
        if len(args) < 2 or args[0] is not run_group:
            continue
        kinds = sorted({labels.get(node_of(m.key), "?").split("[")[0] for m in args[1].value})
        found[name] = short_label(f"group[{', '.join(kinds)}]")
    return found
