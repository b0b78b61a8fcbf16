"""Axes joined into classes that are chunked alike (union-find), and chunk arithmetic.

A key is `(tensor or index space, axis)`: a node's id for its result, or an index space a
rule names (a matmul's K, `<id>#k`; the operand space a reduction reduces, `<id>#in`). Each
class has an extent, a chunk size (whole to start with), whether it must stay whole (and
for which node), and a preferred multiple for its chunk size (a stored array's chunk).
"""

from __future__ import annotations

import math


class Classes:
    """Union-find over axes, each class with an extent, a chunk size, and whether it must
    stay whole."""

    def __init__(self):
        self.parent: dict = {}
        self.extent: dict = {}
        self.size: dict = {}
        self.whole: dict = {}   # class root -> the node that keeps it whole
        self.step: dict = {}    # class root -> preferred multiple for its chunk size
        self.halvings = 0       # chunk sizes change only when this does

    def add(self, key, extent: int):
        if key not in self.parent:
            self.parent[key] = key
            self.extent[key] = extent
            self.size[key] = extent

    def find(self, key):
        root = key
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[key] != root:  # path compression
            self.parent[key], key = root, self.parent[key]
        return root

    def union(self, a, b):
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return
        assert self.extent[ra] == self.extent[rb], (a, b)
        self.parent[rb] = ra
        if rb in self.whole:
            self.whole.setdefault(ra, self.whole[rb])
        if rb in self.step:
            self.step[ra] = math.lcm(self.step.get(ra, 1), self.step[rb])

    def keep_whole(self, key, reason: str):
        self.whole.setdefault(self.find(key), reason)

    def whole_reason(self, key) -> str | None:
        return self.whole.get(self.find(key))

    def chunk(self, key) -> int:
        root = self.find(key)
        return min(self.size[root], self.extent[root])

    def splittable(self, key) -> bool:
        root = self.find(key)
        return root not in self.whole and self.size[root] > 1 and self.extent[root] > 1

    def prefer(self, key, step: int):
        root = self.find(key)
        self.step[root] = math.lcm(self.step.get(root, 1), step)

    def split_in(self, key, pieces: int):
        """Chunk the class in `pieces` chunks (as even as they go), or finer if already."""
        root = self.find(key)
        self.size[root] = min(self.size[root], -(-self.extent[root] // pieces))
        self.halvings += 1

    def halve(self, key):
        """Halve the class's chunk size, rounded up to its preferred step while that still
        makes it smaller."""
        root = self.find(key)
        size = self.size[root]
        half = -(-size // 2)
        step = self.step.get(root, 1)
        rounded = -(-half // step) * step
        self.size[root] = rounded if rounded < size else half
        self.halvings += 1

    def align(self, t, out_shape, out_key: str):
        """Join each axis of operand `t` with the result axis (of `out_key`, shaped
        `out_shape`) it broadcasts against."""
        offset = len(out_shape) - t.ndim
        for j, extent in enumerate(t.shape):
            i = j + offset
            if extent == out_shape[i] and extent != 1:
                self.union((t.id, j), (out_key, i))


def regular_chunks(extent: int, size: int) -> tuple[int, ...]:
    """`extent` split into chunks of `size` with a smaller last chunk (at least one chunk)."""
    if extent == 0:
        return (0,)
    size = max(1, min(size, extent))
    full, rest = divmod(extent, size)
    return (size,) * full + ((rest,) if rest else ())


def count(extent: int, size: int) -> int:
    """How many chunks `regular_chunks(extent, size)` makes."""
    return -(-extent // size) if extent else 1


def combined_tasks(n_main: int, n_out: int, fanin: int) -> int:
    """Tasks of a node whose `n_main` main tasks leave several partials per each of its
    `n_out` result chunks: those, the tree that combines the partials `fanin` at a time,
    and one finishing task per result chunk."""
    parts, tree = n_main // n_out, 0
    while parts > fanin:
        parts = -(-parts // fanin)
        tree += parts
    return n_main + n_out * (tree + 1)
