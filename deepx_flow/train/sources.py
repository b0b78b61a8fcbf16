"""What a training step's batch placeholders are bound to: the rows of a batch, read by the
task that uses them (`BatchSource`). Parameters and state are bound to the chunks the step
before made (`runtime.inputs.KeySource`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from deepx_flow.compiler.taskspec import ref, task
from deepx_flow.kernels.tasks import to_device


@dataclass(frozen=True)
class BatchSource:
    """A batch placeholder bound to rows of a data column: `rows` are the batch's row
    indices, in order. Each chunk's task reads its rows where it runs: from the column's
    array, sent to every worker once (`data`, a key), or from storage through the worker's
    cache of decoded blocks (`train.data.read_rows`), so a batch never passes through one
    worker on its way to the others."""

    column: object
    rows: np.ndarray
    data: object  # key of the column's array on the workers, or None for stored data
    scope: str
    token: str

    def task(self, key, region):
        (lo, hi), rest = region[0], region[1:]
        index = self.rows[lo:hi]
        if self.data is not None:
            return task(key, take_rows, ref(self.data), index, rest)
        return task(key, read_batch_rows, self.column, index, rest, self.scope)


def take_rows(array, index, rest):
    """Rows `index` of an array held on the worker, and the region `rest` of other axes."""
    from deepx_flow.kernels import recycled
    tail = tuple(slice(lo, hi) for lo, hi in rest)
    if tail:
        return to_device(array[(index,) + tail])
    # Recycled memory: fresh pages cost as much as the copy here (`kernels.recycled`).
    return to_device(np.take(array, index, axis=0,
                             out=recycled.empty((len(index),) + array.shape[1:], array.dtype)))


def read_batch_rows(column, index, rest, scope):
    """Rows `index` of a stored column, read through this worker's block cache."""
    from deepx_flow.train.data import read_rows
    rows = read_rows(column, index, scope)
    tail = tuple(slice(lo, hi) for lo, hi in rest)
    return to_device(rows[(slice(None),) + tail] if tail else rows)
