"""A pytest plugin that records every chunking the partitioner chooses while the tests run,
to show that a refactoring of it (issue 35: the partitioner as rules) changes none: run the
suite before and after with DEEPX_RECORD_PARTITIONS=FOLDER and the same
`--hypothesis-seed` (one JSON-lines file per test process), then
`python tests/partition_recorder.py BEFORE AFTER` lists every graph and cluster both runs
planned whose chunks, reduction spaces, K chunks, fan-ins, budget or refusal differ (exit 1
where any does). A graph is known by its nodes, the cluster and the settings the
partitioner reads; the few a test names at random are in one run only.

tests/conftest.py loads it only when the variable is set: the tests run as ever without."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path


def _key(graph, cluster, config) -> str:
    """The same for the same graph, cluster and settings in any run."""
    nodes = [(n.id, n.op, tuple(n.inputs), tuple(n.shape), str(n.dtype),
              repr(n.attrs)) for n in graph.nodes]
    # (the settings the partitioner reads: others, such as the session's database, vary)
    knobs = None if config is None else tuple(getattr(config, name) for name in (
        "memory_fraction", "min_chunk_bytes", "chunks_per_thread", "min_task_seconds",
        "reduce_fanin", "max_tasks"))
    text = repr((nodes, repr(cluster), knobs))
    return hashlib.sha256(text.encode()).hexdigest()


def _outcome(partition) -> dict:
    return {"chunks": partition.chunks, "spaces": partition.spaces,
            "k_chunks": partition.k_chunks, "fanin": partition.fanin,
            "budget": partition.budget}


def install(folder: str) -> None:
    """Wrap the partitioner where the compiler calls it, recording what it gives."""
    from deepx_flow.compiler import compile as compile_module
    from deepx_flow.errors import PlanError
    chosen = compile_module.partition_graph
    out = Path(folder) / f"partitions-{os.getpid()}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)

    def recorded(graph, cluster, config=None, splits=None):
        key = _key(graph, cluster, config)
        try:
            partition = chosen(graph, cluster, config, splits)
        except PlanError as err:
            line = {"key": key, "refused": str(err)}
            raise
        else:
            line = {"key": key, **_outcome(partition)}
            return partition
        finally:
            with open(out, "a") as f:
                f.write(json.dumps(line, default=list) + "\n")
    compile_module.partition_graph = recorded


def _read(folder: Path) -> dict:
    seen = {}
    for path in sorted(folder.glob("partitions-*.jsonl")):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            seen[entry.pop("key")] = entry
    return seen


def main(argv) -> int:
    before, after = _read(Path(argv[0])), _read(Path(argv[1]))
    both = sorted(set(before) & set(after))
    differ = [k for k in both if before[k] != after[k]]
    for k in differ[:20]:
        print(f"{k[:12]}: before {json.dumps(before[k])[:300]}\n{'':14}after  "
              f"{json.dumps(after[k])[:300]}")
    print(f"{len(both)} plans in both runs ({len(before)} before, {len(after)} after), "
          f"{len(differ)} differ")
    return 1 if differ or not both else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
