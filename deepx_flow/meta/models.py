"""The metadata database's tables, as SQLModel classes.

One class per table. Times are seconds since the epoch (floats, UTC): Dask reports task
times that way, and the dashboard's timelines need sub-second resolution on every backend.
Sizes are bytes (64-bit integers). Strings that name Dask things (worker addresses, keys)
are stored as Dask prints them.

What each table records:
- `workers`, `devices`, `storage_tiers`: memory and compute-storage registration, per
  scheduler (the same address can be a different worker on another cluster);
- `operators`: operator registration (built-in and from entry points);
- `links`: network registration, one row per measured worker pair;
- `graphs`: every graph that ran, by content hash, with its YAML;
- `runs`: one row per `dx.run` / `dx.persist`, with its plan summary and outcome;
- `tasks`: one row per Dask task that finished or failed in a run;
- `chunk_placements`: where each chunk a run computed is (one row per run, chunk and
  worker);
- `events`: things that happened to a run besides its tasks (worker lost, drift, ...);
- `asset_materializations`, `asset_check_results`: stored asset versions and their checks;
- `schedules`, `schedule_ticks`: the schedules a scheduler daemon runs, and every tick it
  evaluated (launched, skipped, failed), one row per schedule and tick time;
- `trainings`, `training_metrics`, `training_checkpoints`: each `dx.train` call, its metrics
  per step (loss, learning rate, gradient norm, throughput, held-out loss, user metrics) and
  the asset versions it checkpointed; `runs.training_id` names the training a run (one graph
  of its steps) belongs to.

Changing a table means adding a migration in `migrations.py` and bumping `SCHEMA_VERSION`.
"""

from __future__ import annotations

from typing import Optional

from sqlalchemy import BigInteger, Column, Index, Text, UniqueConstraint
from sqlmodel import Field, SQLModel


def _big(**kw):
    return Field(default=None, sa_column=Column(BigInteger, **kw))


def _text(**kw):
    return Field(default=None, sa_column=Column(Text, **kw))


class SchemaInfo(SQLModel, table=True):
    """The schema version of this database (one row)."""

    __tablename__ = "deepx_schema"
    id: int = Field(default=1, primary_key=True)
    version: int


class Worker(SQLModel, table=True):
    __tablename__ = "workers"
    __table_args__ = (UniqueConstraint("scheduler", "address"),)
    id: Optional[int] = Field(default=None, primary_key=True)
    scheduler: str = Field(index=True)
    address: str
    name: str
    host: str
    protocol: str  # tcp, ucx, inproc, ...
    nthreads: int
    memory_limit: Optional[int] = _big()  # the worker's host memory limit
    memory_reserved: Optional[int] = _big()  # held by the worker process when registered
    status: str = "running"  # running, gone
    first_seen: float
    last_seen: float


class Device(SQLModel, table=True):
    __tablename__ = "devices"
    id: Optional[int] = Field(default=None, primary_key=True)
    worker_id: int = Field(foreign_key="workers.id", index=True)
    index: int = 0
    kind: str = "gpu"
    name: str
    memory_total: Optional[int] = _big()
    memory_free: Optional[int] = _big()
    memory_usable: Optional[int] = _big()  # what the planner budgets (registry/gpu_memory.py)
    healthy: bool = True
    registered_at: float


class StorageTier(SQLModel, table=True):
    __tablename__ = "storage_tiers"
    id: Optional[int] = Field(default=None, primary_key=True)
    worker_id: int = Field(foreign_key="workers.id", index=True)
    tier: str  # device, host, disk, object
    location: str  # device name, "memory", a local path or an object-store URL
    capacity: Optional[int] = _big()
    registered_at: float


class Operator(SQLModel, table=True):
    __tablename__ = "operators"
    name: str = Field(primary_key=True)
    kind: str
    engines: str  # comma-separated: numpy,cupy
    fusable: bool
    flops_per_element: float
    temp_bytes_per_element: float
    source: str = "builtin"  # or the distribution that registered it through an entry point
    doc: Optional[str] = _text()
    registered_at: float


class OperatorSpeed(SQLModel, table=True):
    """How fast an operator (as tasks run it: alone, fused, with an epilogue) went on one
    worker, from recorded tasks: decayed sums of the cost model's work and the seconds it
    took (`registry/speeds.py`)."""

    __tablename__ = "operator_speeds"
    __table_args__ = (UniqueConstraint("operator", "host", "worker"),)
    id: Optional[int] = Field(default=None, primary_key=True)
    operator: str  # the task's operator label
    host: str
    worker: str  # the worker's name
    flops: float  # the cost model's FLOPs of the tasks counted (decayed sum)
    bytes: float  # their bytes in and out (decayed sum)
    seconds: float  # the seconds they computed (decayed sum)
    tasks: int  # tasks counted, all time
    updated_at: float


class Link(SQLModel, table=True):
    __tablename__ = "links"
    __table_args__ = (UniqueConstraint("scheduler", "source", "target"),)
    id: Optional[int] = Field(default=None, primary_key=True)
    scheduler: str = Field(index=True)
    source: str  # worker address
    target: str
    protocol: str
    bandwidth: float  # bytes/s
    latency: float  # seconds
    measured_at: float


class GraphRecord(SQLModel, table=True):
    __tablename__ = "graphs"
    hash: str = Field(primary_key=True)
    yaml: Optional[str] = _text()
    n_nodes: int
    created_at: float


class Run(SQLModel, table=True):
    __tablename__ = "runs"
    id: str = Field(primary_key=True)  # a uuid4 hex
    graph_hash: str = Field(foreign_key="graphs.hash", index=True)
    kind: str = "run"  # run (results gathered) or persist (left on the cluster)
    status: str = Field(default="running", index=True)  # running, succeeded, failed, interrupted
    started_at: float = Field(index=True)
    ended_at: Optional[float] = None
    scheduler: str
    cluster: str  # the ClusterSpec's name
    n_workers: int
    n_tasks: int
    n_chunks: int
    compute_comm_ratio: Optional[float] = None  # the plan's estimate (None when infinite)
    explain: Optional[str] = _text()
    outputs: Optional[str] = _text()  # JSON: output name -> tensor key
    error: Optional[str] = _text()
    host: str
    pid: int
    username: str
    training_id: Optional[str] = Field(default=None, index=True)  # a dx.train's graphs
    # The driver's PID space (`processes.pid_space`: boot id and PID namespace): its pid is
    # looked up only from a process of the same host and space. None: not recorded.
    pid_space: Optional[str] = None


class Task(SQLModel, table=True):
    __tablename__ = "tasks"
    __table_args__ = (Index("ix_tasks_run_key", "run_id", "key"),)
    id: Optional[int] = Field(default=None, primary_key=True)
    run_id: str = Field(foreign_key="runs.id")
    key: str  # the Dask key as text: "('node@token', 0, 1)"
    tensor: str  # the tensor key (node id @ content token), or an internal step of it
    operator: str  # operator, or the fused group: "fused(tanh,mul,add)", "sum<exp,mul>"
    worker: Optional[str] = None
    start: Optional[float] = None
    stop: Optional[float] = None
    bytes_in: Optional[int] = _big()
    bytes_out: Optional[int] = _big()
    comm_seconds: Optional[float] = None  # fetching its inputs from other workers
    attempts: int = 1
    status: str = "memory"  # memory (finished) or erred
    error: Optional[str] = _text()


class ChunkPlacement(SQLModel, table=True):
    """Where a chunk a run computed is, on one worker: one row per (run, tensor, chunk,
    worker), updated in place as the chunk is copied, spilled, released or lost. Per run,
    since tensor keys are content hashes: two runs of one graph compute the same keys."""

    __tablename__ = "chunk_placements"
    # By state: the chunks still held (memory, spilled, stored) are few among the released
    # ones, and the registry sums the bytes each storage tier holds over those alone.
    __table_args__ = (UniqueConstraint("run_id", "tensor", "chunk", "worker"),
                      Index("ix_chunk_placements_run", "run_id"),
                      Index("ix_chunk_placements_state", "state"))
    id: Optional[int] = Field(default=None, primary_key=True)
    run_id: str = Field(foreign_key="runs.id")
    tensor: str  # tensor key (node id @ content token)
    chunk: str  # chunk index, comma-separated: "0,1"
    worker: str
    device: Optional[str] = None
    tier: str = "host"  # device, host, disk (spilled), object
    nbytes: Optional[int] = _big()
    state: str = "memory"  # memory, spilled, stored, lost, released
    updated_at: float


class Event(SQLModel, table=True):
    __tablename__ = "events"
    id: Optional[int] = Field(default=None, primary_key=True)
    run_id: Optional[str] = Field(default=None, foreign_key="runs.id", index=True)
    at: float
    kind: str  # worker-lost, drift, retry, ...
    worker: Optional[str] = None
    key: Optional[str] = None
    message: Optional[str] = _text()


class AssetMaterialization(SQLModel, table=True):
    """One stored version of an asset (or of one partition of it). The row is written after
    the data, so a version is visible only once it is complete."""

    __tablename__ = "asset_materializations"
    __table_args__ = (Index("ix_asset_materializations_asset", "asset", "created_at"),
                      Index("ix_asset_materializations_target", "asset", "partition",
                            "created_at"))
    id: Optional[int] = Field(default=None, primary_key=True)
    version: str = Field(unique=True)  # a uuid4 hex
    asset: str
    partition: Optional[str] = None
    code_version: Optional[str] = None
    upstream_versions: Optional[str] = _text()  # JSON: upstream asset -> version used
    shape: str  # JSON list
    dtype: str
    chunks: Optional[str] = None  # JSON list: the stored chunk shape
    nbytes: Optional[int] = _big()
    storage: str  # storage engine name
    uri: Optional[str] = _text()
    # The digest of the version's manifest (storage/manifest.py), which binds its metadata
    # and each chunk to its position; None for versions stored before, or by engines that
    # keep none.
    manifest_digest: Optional[str] = None
    run_id: Optional[str] = Field(default=None, foreign_key="runs.id")
    seconds: Optional[float] = None  # compute and write time of the materialization
    checks_passed: Optional[bool] = None
    created_at: float


class AssetCheckResult(SQLModel, table=True):
    __tablename__ = "asset_check_results"
    id: Optional[int] = Field(default=None, primary_key=True)
    materialization_id: int = Field(foreign_key="asset_materializations.id", index=True)
    check: str
    passed: bool
    blocking: bool = True
    value: Optional[float] = None
    message: Optional[str] = _text()
    created_at: float


class Schedule(SQLModel, table=True):
    """A cron schedule as the scheduler daemon last saw it (schedules live in code; this
    row lets the dashboard list them, and says which daemon runs them)."""

    __tablename__ = "schedules"
    name: str = Field(primary_key=True)
    cron: str
    selection: str  # the asset selection it materializes
    timezone: str = "UTC"
    definitions: Optional[str] = None  # the module or file the daemon loaded it from
    daemon: Optional[str] = None  # host:pid of the daemon running it
    heartbeat_at: Optional[float] = None  # the daemon's last sign of life
    stopped_at: Optional[float] = None  # when that daemon stopped cleanly (None: it runs, or died)
    updated_at: float


class ScheduleTick(SQLModel, table=True):
    """One tick of a schedule. The unique (schedule, tick_at) pair is what makes a restarted
    daemon never launch a tick twice: a tick is claimed by inserting its row first."""

    __tablename__ = "schedule_ticks"
    # By tick time: the dashboard lists every schedule's ticks newest first, a page at a time.
    __table_args__ = (UniqueConstraint("schedule", "tick_at"),
                      Index("ix_schedule_ticks_tick_at", "tick_at"))
    id: Optional[int] = Field(default=None, primary_key=True)
    schedule: str = Field(index=True)
    tick_at: float  # the cron time of the tick
    status: str  # launched, skipped, failed
    run_id: Optional[str] = None  # the run its materialization made
    message: Optional[str] = _text()  # why it was skipped or failed; what it materialized
    daemon: Optional[str] = None
    started_at: float
    finished_at: Optional[float] = None


class Training(SQLModel, table=True):
    """One `dx.train` call: what it trains with, how far it got, and how it ended."""

    __tablename__ = "trainings"
    id: str = Field(primary_key=True)  # a uuid4 hex
    status: str = Field(default="running", index=True)  # running, succeeded, failed
    started_at: float = Field(index=True)
    ended_at: Optional[float] = None
    asset: Optional[str] = Field(default=None, index=True)  # where checkpoints go
    config_hash: str  # what a resumed training must agree on (see train.checkpoint)
    optimizer: str
    seed: int
    batch_size: int
    epochs: int
    steps: int  # planned
    steps_done: int = 0
    resumed_from: Optional[str] = None  # the checkpoint version it started from
    error: Optional[str] = _text()
    host: str
    pid: int


class TrainingMetric(SQLModel, table=True):
    """One value of one metric at one step (`loss`, `lr`, `grad_norm`, `samples_per_second`,
    `eval_loss`, ...)."""

    __tablename__ = "training_metrics"
    __table_args__ = (Index("ix_training_metrics_training", "training_id", "name", "step"),)
    id: Optional[int] = Field(default=None, primary_key=True)
    training_id: str = Field(foreign_key="trainings.id")
    step: int
    epoch: int
    name: str
    value: float
    at: float


class TrainingCheckpoint(SQLModel, table=True):
    """A version of the training's asset holding its parameters and optimizer state after
    `step`, packed in one vector as `layout` (JSON) says."""

    __tablename__ = "training_checkpoints"
    id: Optional[int] = Field(default=None, primary_key=True)
    training_id: str = Field(foreign_key="trainings.id", index=True)
    asset: str = Field(index=True)
    version: str
    step: int
    epoch: int
    config_hash: str = Field(index=True)
    layout: str = _text()
    created_at: float


class Operation(SQLModel, table=True):
    """A request of the gateway that runs until it is done (`graphs:execute`, an asset's
    `:materialize`): its state, its stored results once it succeeded, so that a client that
    lost its connection asks again by id (`deepx_flow/gateway/operations.py`)."""

    __tablename__ = "operations"
    id: str = Field(primary_key=True)  # chosen by the client, or a uuid4 hex
    kind: str  # execute or materialize
    state: str = Field(default="running", index=True)  # running, succeeded, failed, interrupted
    # SHA-256 of the request: an id sent again must come with the same request
    request_digest: str
    target: Optional[str] = None  # the graph's name, or the asset materialized
    created_at: float = Field(index=True)
    ended_at: Optional[float] = None
    run_id: Optional[str] = Field(default=None, index=True)  # the run that carries it out
    # JSON: the results' names, datatypes, shapes, files (a list), or what an operation
    # that stores no arrays keeps instead (an object: a materialization's versions)
    outputs: Optional[str] = _text()
    error: Optional[str] = _text()
    # The gateway process that carries it out: one that died leaves it `running` until a
    # gateway finds that process gone (as `orphans.py` does for runs), or finds its
    # heartbeat stale (a gateway on another host, or in another PID namespace since a
    # container restarted, cannot be looked up by pid).
    host: str
    pid: int
    pid_space: Optional[str] = None
    heartbeat_at: Optional[float] = None


class AssetDefinition(SQLModel, table=True):
    """An asset defined through the gateway's contract (`assets:define`): the graph spec that
    builds it and the rest of its definition, so that every gateway on this database serves
    it, after a restart too (`deepx_flow/gateway/asset_specs.py` makes it an AssetDef)."""

    __tablename__ = "asset_definitions"
    name: str = Field(primary_key=True)
    spec: str = _text(nullable=False)  # JSON: the graph spec, one output
    dependencies: str = _text(nullable=False)  # JSON list: upstream assets not read
    description: Optional[str] = _text()
    # JSON {"keys": static keys, "axis": the partition axis or null}, or null: unpartitioned
    partitions: Optional[str] = _text()
    checks: str = _text(nullable=False)  # JSON list, in the contract's form
    code_version: str  # the digest of all the above: a new one makes the asset stale
    defined_at: float


class ServedModelRecord(SQLModel, table=True):
    """A model a gateway serves (`deepx-flow serve --model-repository`), as that gateway
    last recorded it (every DEEPX_HEARTBEAT_S): its version, state, replicas and request
    counts, for the dashboard's Serving page (`deepx_flow/serving/records.py`)."""

    __tablename__ = "served_models"
    gateway: str = Field(primary_key=True)  # host:pid of the gateway process
    model: str = Field(primary_key=True)
    version: Optional[str] = None  # the version served; None when none is
    digest: Optional[str] = None  # SHA-256 of its file
    state: str  # READY, UNAVAILABLE
    reason: Optional[str] = _text()
    replicas: Optional[str] = _text()  # JSON list of the workers its replicas run on
    requests: int = 0  # answered
    failures: int = 0
    rows: int = 0  # inferred (a request of 8 rows counts 8)
    executions: int = 0  # batches run
    latency_seconds: float = 0.0  # the answered requests' time, summed
    requests_per_second: float = 0.0  # over the time since the record before
    updated_at: float = Field(index=True)
