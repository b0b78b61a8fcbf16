"""Settings read from the environment, in one place.

Only this module reads environment variables; everything else asks it. Each setting has a
default that suits a single machine, and a row in `READERS`: the variable that sets it and
what that may hold, checked whenever the settings are read; then `CHECKS` looks at values
that each setting allows but that do not go together (a heartbeat timeout shorter than the
beat).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from deepx_flow.errors import SettingsError, shown


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
    # How old an unpublished version folder whose writer cannot be seen from this process
    # (another host, boot or PID namespace: `processes.py`) must be before it is collected
    # (seconds): the run's row is written just after the folder.
    gc_grace_s: float = 3600.0
    # An object store (any fsspec URL, e.g. s3://bucket/deepx) the workers can write to; it
    # is registered as each worker's "object" storage tier.
    object_store: str | None = None
    # How often a driver that holds a cluster it registered marks its workers seen in the
    # registry (seconds), and how long a worker not seen counts as alive: several beats,
    # generous for a busy machine (`registry/heartbeat.py`).
    heartbeat_s: float = 5.0
    heartbeat_timeout_s: float = 60.0
    # How long the gateway keeps an operation that ended, its outputs included, for clients
    # to ask for it again (seconds); then its row and results are removed.
    operation_ttl_s: float = 7 * 86_400.0
    # Where the dashboard (`deepx-flow ui`) is served: runs print their page's link there.
    dashboard_url: str = "http://127.0.0.1:5006"
    # How long an interactive run goes on before its progress bar shows (seconds; 0 shows
    # it from the start): quick cells print nothing.
    progress_after_s: float = 2.0
    # Bytes of free chunk-sized buffers a worker keeps for reuse (`kernels/recycled.py`; 0
    # turns the pool off); None: a tenth of the worker's memory limit.
    buffer_pool_bytes: int | None = None
    # A YAML file of composite operators to add to the operator table (its format): the
    # gateway expands them, and `sdks/generate.py` writes them into every SDK.
    extra_operators: str | None = None


# -- reading them: one row per variable --------------------------------------------------------
#
# Each variable is parsed by its kind, which also says in words what it allows; a value outside
# that is one SettingsError naming the variable. An unset or empty variable means the default.

LARGEST_INT = 2**63 - 1  # what a count or a size may reach: an int64, as NumPy and Dask hold it
WEEK_S = 7 * 24 * 3600.0  # the longest time a setting may give: longer is no longer a timing,
# and waits far longer overflow the timers they go to (threading's limit is about 292 years)


@dataclass(frozen=True)
class Number:
    """A finite int or float from `low` (excluded when `above`) to `high`."""

    kind: type
    low: float
    high: float = LARGEST_INT
    above: bool = False
    unit: str = ""

    def parse(self, text: str):
        value = self.kind(text)  # ValueError for text that is not such a number
        if not (math.isfinite(value) and (value > self.low if self.above else value >= self.low)
                and value <= self.high):
            raise ValueError(text)
        return value

    @property
    def allowed(self) -> str:
        what = "a whole number" if self.kind is int else "a number"
        what += f" of {self.unit}" if self.unit else ""
        low = f"above {self.low:g}" if self.above else f"{self.low:g} or more"
        # (whole numbers in full: ",g" writes 31,622,400 as 3.16224e+07)
        most = f"{self.high:,.0f}" if float(self.high).is_integer() else f"{self.high:,g}"
        high = "" if self.high == LARGEST_INT else f" and at most {most}"
        return f"{what}, {low}{high}"


@dataclass(frozen=True)
class Text:
    """Text that is `what` (a path, URL or address: checked where it is used, which names
    the variable); with `prefixes`, it must start with one of them (a trailing / is
    dropped)."""

    what: str
    prefixes: tuple[str, ...] = ()

    def parse(self, text: str) -> str:
        text = text.strip()
        if self.prefixes and not text.startswith(self.prefixes):
            raise ValueError(text)
        return text.rstrip("/") if self.prefixes else text

    @property
    def allowed(self) -> str:
        starts = f" starting with {' or '.join(self.prefixes)}" if self.prefixes else ""
        return f"{self.what}{starts}"


@dataclass(frozen=True)
class Flag:
    """On or off, in the words people write for it."""

    words = {"1": True, "true": True, "yes": True, "on": True,
             "0": False, "false": False, "no": False, "off": False}

    def parse(self, text: str) -> bool:
        return self.words[text.strip().lower()]  # KeyError for anything else

    allowed = "1, true, yes or on, or 0, false, no or off"


@dataclass(frozen=True)
class Address:
    """A Dask scheduler address (`address_problem`)."""

    allowed = "a Dask scheduler address such as tcp://10.0.0.1:8786"

    def parse(self, text: str) -> str:
        text = text.strip()
        if address_problem(text):
            raise ValueError(text)
        return text


def address_problem(address) -> str | None:
    """What keeps `address` from being a Dask scheduler address (scheme://host:port, or
    host:port for TCP), None when nothing does: found by Dask's own parser, imported only
    for an address to check."""
    if not isinstance(address, str):
        return "not a string"
    from distributed.comm.addressing import parse_address, parse_host_port
    from distributed.comm.registry import get_backend
    try:
        scheme, location = parse_address(address)
        get_backend(scheme)  # a protocol Dask knows
        if scheme == "inproc":  # the one protocol that is not host:port
            return None
        _, port = parse_host_port(location)
    except (ValueError, TypeError) as err:
        return str(err)
    return None if 0 < port < 2**16 else f"port {port} is not in 1 to 65535"


@dataclass(frozen=True)
class Reader:
    """How the variable `variable` becomes the field `field` of Settings."""

    variable: str
    field: str
    kind: Number | Text | Flag | Address


SECONDS = dict(unit="seconds", high=WEEK_S)

READERS = (
    Reader("DEEPX_MEMORY_FRACTION", "memory_fraction", Number(float, 0, 1, above=True)),
    Reader("DEEPX_MIN_CHUNK_BYTES", "min_chunk_bytes", Number(int, 1, unit="bytes")),
    Reader("DEEPX_CHUNKS_PER_THREAD", "chunks_per_thread", Number(int, 1)),
    Reader("DEEPX_MIN_TASK_SECONDS", "min_task_seconds", Number(float, 0, **SECONDS)),
    Reader("DEEPX_REDUCE_FANIN", "reduce_fanin", Number(int, 2)),
    Reader("DEEPX_MAX_TASKS", "max_tasks", Number(int, 1, unit="tasks")),
    Reader("DEEPX_MAX_SPEC_BYTES", "max_spec_bytes", Number(int, 1, unit="bytes")),
    Reader("DEEPX_MAX_NODES", "max_nodes", Number(int, 1, unit="nodes")),
    Reader("DEEPX_SCHEDULER", "scheduler_address", Address()),
    Reader("DEEPX_DB_URL", "db_url", Text("a SQLAlchemy URL")),
    Reader("DEEPX_RECORD", "record", Flag()),
    Reader("DEEPX_ASSET_ROOT", "asset_root", Text("a path or fsspec URL")),
    Reader("DEEPX_GC_GRACE_S", "gc_grace_s", Number(float, 0, **SECONDS)),
    Reader("DEEPX_OBJECT_STORE", "object_store", Text("an fsspec URL")),
    Reader("DEEPX_HEARTBEAT_S", "heartbeat_s", Number(float, 0, above=True, **SECONDS)),
    Reader("DEEPX_HEARTBEAT_TIMEOUT_S", "heartbeat_timeout_s",
           Number(float, 0, above=True, **SECONDS)),
    Reader("DEEPX_OPERATION_TTL_S", "operation_ttl_s",
           Number(float, 0, above=True, unit="seconds", high=366 * 86_400)),
    Reader("DEEPX_DASHBOARD_URL", "dashboard_url", Text("a URL", ("http://", "https://"))),
    Reader("DEEPX_PROGRESS_AFTER_S", "progress_after_s", Number(float, 0, **SECONDS)),
    Reader("DEEPX_BUFFER_POOL_BYTES", "buffer_pool_bytes", Number(int, 0, unit="bytes")),
    Reader("DEEPX_EXTRA_OPERATORS", "extra_operators", Text("the path of a YAML operator table")),
)


def settings() -> Settings:
    """Read the settings from the environment (`DEEPX_*` variables, `READERS`).

    Raises
    ------
    SettingsError
        A variable holds a value its setting does not allow: the message names it and says
        what is allowed; or values allowed alone are not together (`CHECKS`), named both.
    """
    values = {}
    for reader in READERS:
        text = os.environ.get(reader.variable, "")
        if not text.strip():
            continue  # unset or empty: the default
        try:
            values[reader.field] = reader.kind.parse(text)
        except (ValueError, KeyError, OverflowError):
            raise SettingsError(f"{reader.variable} must be {reader.kind.allowed}, got "
                                f"{shown(text)}") from None
    found = Settings(**values)
    for check in CHECKS:
        problem = check(found)
        if problem:
            raise SettingsError(problem)
    return found


# -- checks across settings: values each allowed alone, but not together ----------------------

def _heartbeat_problem(found: Settings) -> str | None:
    # A worker is marked seen once a beat, so one not seen for less than a beat and a bit (the
    # mark's own round trip) is alive: a shorter timeout counts live workers gone between beats.
    if found.heartbeat_timeout_s > found.heartbeat_s:
        return None
    return (f"DEEPX_HEARTBEAT_TIMEOUT_S ({found.heartbeat_timeout_s:g} s) must be more than "
            f"DEEPX_HEARTBEAT_S ({found.heartbeat_s:g} s): workers are marked seen once a "
            f"beat, so live ones would count as gone between beats")


CHECKS = (_heartbeat_problem,)  # each: the settings -> what is wrong with them, or None
