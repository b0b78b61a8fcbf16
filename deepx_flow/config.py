"""Settings read from the environment, in one place.

Only this module reads environment variables; everything else asks it. Each setting has a
default that suits a single machine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from deepx_flow.errors import InputError, PlanError, shown


@dataclass(frozen=True)
class Settings:
    # Fraction of a worker's memory the planner may fill with task working sets; the rest is
    # headroom for results waiting to be sent, communication buffers and the interpreter.
    memory_fraction: float = 0.5
    # Smallest chunk the planner creates when it splits only to make parallel tasks.
    min_chunk_bytes: int = 4 * 2**20
    # Chunks per worker thread the planner aims for on large tensors (parallelism, not memory):
    # several, so that a slow chunk or a slow read does not leave a thread idle at the end.
    chunks_per_thread: int = 4
    # Shortest expected task the planner makes when it splits only for parallelism: Dask and
    # deepx_flow spend about a millisecond on each task, which should stay a small part of it.
    min_task_seconds: float = 0.02
    # How many partial results one tree-reduction task combines.
    reduce_fanin: int = 8
    # The most tasks a plan may have. A Dask scheduler keeps a few kB per task and lowering
    # takes about 14 us per task here (281,088 tasks in 3.9 s), so a million tasks is a large
    # but workable graph; billions would exhaust the driver and the scheduler.
    max_tasks: int = 1_000_000
    # The largest graph spec file read (bytes), checked before it is parsed: a spec takes
    # about 100 bytes a node, so 16 MiB holds well over the node limit below, and a larger
    # file is refused at once instead of parsed for minutes.
    max_spec_bytes: int = 16 * 2**20
    # The most nodes a graph may have, counted while a spec is read and while a graph is
    # built in Python: reading a spec takes about 0.2 ms a node here and compiling a
    # twentieth of that (benchmarks/bench_graph_size.py), so a graph at the limit is read
    # in tens of seconds; far larger ones are more often a mistake than a model.
    max_nodes: int = 100_000
    # Scheduler address to use instead of starting an embedded cluster.
    scheduler_address: str | None = None
    # Metadata database: any SQLAlchemy URL; by default a SQLite file `.deepx/deepx.db` in
    # the working directory.
    db_url: str | None = None
    # Record runs, tasks and chunk placements in the metadata database.
    record: bool = True
    # Where assets' stored versions go (a path or fsspec URL); default .deepx/assets here.
    asset_root: str | None = None
    # An object store (any fsspec URL, e.g. s3://bucket/deepx) the workers can write to; it
    # is registered as each worker's "object" storage tier.
    object_store: str | None = None
    # How often a driver that holds a cluster it registered marks its workers seen in the
    # registry (seconds), and how long a worker not seen counts as alive: several beats,
    # generous for a busy machine (`registry/heartbeat.py`).
    heartbeat_s: float = 5.0
    heartbeat_timeout_s: float = 60.0
    # Where the dashboard (`deepx-flow ui`) is served: runs print their page's link there.
    dashboard_url: str = "http://127.0.0.1:5006"
    # How long an interactive run goes on before its progress bar shows (seconds; 0 shows
    # it from the start): quick cells print nothing.
    progress_after_s: float = 2.0


def _positive_int(env, name: str, default: int, unit: str = "tasks") -> int:
    """A positive integer from `env[name]` (a number of `unit`), or `default` when unset."""
    text = env.get(name)
    if text is None or not text.strip():
        return default
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise PlanError(f"{name} must be a positive integer (a number of {unit}), got "
                        f"{shown(text)}")
    return value


def _seconds(env, name: str, default: float, zero_ok: bool = False) -> float:
    """A number of seconds from `env[name]`: positive (or 0 when `zero_ok`), finite."""
    text = env.get(name)
    if text is None or not text.strip():
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (0 <= value if zero_ok else 0 < value) or value == float("inf"):
        raise InputError(f"{name} must be a {'' if zero_ok else 'positive '}number of "
                         f"seconds{', 0 or more' if zero_ok else ''}, got {shown(text)}")
    return value


def settings() -> Settings:
    """Read the settings from the environment (`DEEPX_*` variables)."""
    env = os.environ
    return Settings(
        memory_fraction=float(env.get("DEEPX_MEMORY_FRACTION", Settings.memory_fraction)),
        min_chunk_bytes=int(env.get("DEEPX_MIN_CHUNK_BYTES", Settings.min_chunk_bytes)),
        chunks_per_thread=int(env.get("DEEPX_CHUNKS_PER_THREAD", Settings.chunks_per_thread)),
        min_task_seconds=float(env.get("DEEPX_MIN_TASK_SECONDS", Settings.min_task_seconds)),
        reduce_fanin=int(env.get("DEEPX_REDUCE_FANIN", Settings.reduce_fanin)),
        max_tasks=_positive_int(env, "DEEPX_MAX_TASKS", Settings.max_tasks),
        max_spec_bytes=_positive_int(env, "DEEPX_MAX_SPEC_BYTES", Settings.max_spec_bytes,
                                     "bytes"),
        max_nodes=_positive_int(env, "DEEPX_MAX_NODES", Settings.max_nodes, "nodes"),
        scheduler_address=env.get("DEEPX_SCHEDULER") or None,
        db_url=env.get("DEEPX_DB_URL") or None,
        asset_root=env.get("DEEPX_ASSET_ROOT") or None,
        record=env.get("DEEPX_RECORD", "1").strip().lower() not in ("0", "false", "no", "off"),
        object_store=env.get("DEEPX_OBJECT_STORE") or None,
        heartbeat_s=_seconds(env, "DEEPX_HEARTBEAT_S", Settings.heartbeat_s),
        heartbeat_timeout_s=_seconds(env, "DEEPX_HEARTBEAT_TIMEOUT_S",
                                              Settings.heartbeat_timeout_s),
        dashboard_url=(env.get("DEEPX_DASHBOARD_URL") or Settings.dashboard_url).rstrip("/"),
        progress_after_s=_seconds(env, "DEEPX_PROGRESS_AFTER_S", Settings.progress_after_s,
                                  zero_ok=True),
    )
