"""Pass: compute source reads and views inside the tasks that use them.

Before: a lowered Dask graph, and for some of its keys an inline call that computes the same
chunk (`Lowered.inlinable`): either a *view* (a transpose, a reshape that keeps the layout, a
slice or concat of whole chunks: no copy, so free to compute in every task that reads it) or
a *source* (a Zarr, `.npy` or stored-asset read, a random or constant chunk: worth computing
where it is used, but only once).
After: every task that read a view computes the view itself; a source chunk read by exactly
one reference of one task (after views are inlined) is read inside that task. Those keys
are gone from the graph, unless they are outputs. Results are unchanged; what changes is
that no chunk is copied to make a view, and a source chunk is not held in worker memory as a
task result of its own between its read and its use (dask.array fuses its reads the same
way).

A source chunk with several readers stays a task: reading it once and sharing the result
is cheaper than reading it again per reader. So is one read twice by the same task (`x.T @ x`
reads each chunk of `x` as both operands).
"""

from __future__ import annotations

from collections import Counter

from deepx_flow.compiler.taskspec import refs_of, substitute

VIEW, SOURCE = "view", "source"
MAX_NESTING = 16


def inline_reads(dsk: dict, inlinable: dict, keep) -> dict:
    """The graph with views and single-use source chunks computed where they are read.

    Parameters
    ----------
    dsk : dict
        Key -> task, in an order where every task comes after the keys it reads (the
        lowering's order).
    inlinable : dict
        Key -> (VIEW or SOURCE, the inline call computing that key's chunk).
    keep : set
        Keys that must stay in the graph (the outputs).
    """
    if not inlinable:
        return dsk
    readers: dict = {}  # key -> Counter of the tasks reading it, one count per reference
    for key, node in dsk.items():
        for ref in refs_of(node):
            readers.setdefault(ref, Counter())[key] += 1

    # Views are inlined everywhere, but not nested deeper than MAX_NESTING: Dask runs nested
    # calls recursively, and a chain of thousands of concats is all views.
    depth: dict = {}
    views = set()
    for key, node in dsk.items():
        if inlinable.get(key, (None,))[0] == VIEW:
            depth[key] = 1 + max((depth.get(r, 0) for r in refs_of(node)), default=0)
            if depth[key] <= MAX_NESTING:
                views.add(key)
            else:
                depth[key] = 0
    # References to each key once the views reading it are inlined into their readers (a
    # kept view also reads it in its own task). Readers come after what they read.
    references: dict = {}
    for key in reversed(list(dsk)):
        references[key] = sum(count * (references[reader] + (reader in keep))
                              if reader in views else count
                              for reader, count in readers.get(key, {}).items())

    calls: dict = {}  # key -> its inline call, with the calls it reads substituted
    for key in dsk:
        kind, call = inlinable.get(key, (None, None))
        if key in views or (kind == SOURCE and key not in keep and references[key] == 1):
            calls[key] = substitute(call, calls)
    return {key: substitute(node, calls) for key, node in dsk.items()
            if key not in calls or key in keep}
