"""Task priorities: a node's short tasks (its ragged last chunks) run after its full ones.

Why: the partitioner picks chunk sizes whose tasks end together when the longest go first
(`compiler.partition._finish_time`, the classic longest-first rule for finishing soonest on
parallel machines). Dask runs tasks in graph order instead, and a worker holds a queued task
besides its running one, so a short task taken early could leave its thread idle at the end
while the other thread ran two full ones: a 10-operation chain over 6.1 tasks' worth of rows
took 1.42 s or 1.77 s by which task went where. So a task at most half the size of its
node's full ones gets a lower priority, which Dask orders before anything else.
"""

from __future__ import annotations

import math

from deepx_flow.ir.keys import key_name

SHORT = 0.5  # a task this fraction of a full one or less runs last


class ShortLast:
    """The Dask `priority` annotation of a lowered graph: -1 for a short task, else 0. Dask
    calls it on the scheduler for each key, so it must pickle."""

    def __init__(self, grids: dict):
        # key name -> (chunk sizes per index, the elements of a full task)
        self.grids = {name: (grid, math.prod(max(sizes, default=0) for sizes in grid))
                      for name, grid in grids.items()
                      if any(len(set(sizes)) > 1 for sizes in grid)}  # regular: no short ones

    def __call__(self, key) -> int:
        found = self.grids.get(key_name(key)) if isinstance(key, tuple) else None
        if found is None:
            return 0
        grid, full = found
        index = key[1:]
        if len(index) != len(grid):
            return 0
        size = math.prod(sizes[i] for sizes, i in zip(grid, index))
        return -1 if size <= SHORT * full else 0
