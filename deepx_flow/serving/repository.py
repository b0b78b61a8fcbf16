"""A model repository in Triton's layout, and the models of it this server has loaded.

    models/                      (--model-repository models)
      mlp/
        config.pbtxt             (optional: batching, replicas; `config.py`)
        1/model.onnx
        2/model.onnx             (the newest version is the one served)
      scorer/
        1/model.yaml             (a graph spec: `model.py`'s SpecModel)
        1/weights.npz            (arrays bound to its inputs of those names)

Every model is loaded when the server starts; the repository extension's `load` reads a
model again from disk (a new version, a fixed file) and `unload` stops serving it. A model
that cannot be loaded (a file that is not a valid ONNX model, an operator deepx_flow does not
convert, a graph that does not take its declared inputs) is UNAVAILABLE with its reason, in
the index and in the error of its load; the other models keep serving, and a model that was
serving keeps its loaded version when a reload fails.

Requests go through the model's batcher (`batcher.py`): its replicas each run one batch at
a time; with `dynamic_batching` in the config, requests that arrive together run as one
batch. Each request is checked (names, datatypes, shapes, rows) before it is queued, so a
bad one fails alone. A request too large for one task of the smallest worker (its inputs,
outputs and the model's weights past the cluster's task budget) runs instead as a chunked
plan on the whole cluster, as `dx.run` runs any graph, its chunks spread over the workers.
A model whose weights alone are past it gets no replicas: every request runs so (an
model's large weights are files each task reads its region of, `storage/weights.py`).

Statistics are kept per model as the protocol's statistics extension reports them:
requests' rows (`inference_count`), executions (`execution_count`: a batch of requests is
one), time in success, failure and queue, and per batch size.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import contextlib
import copy
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from deepx_flow.errors import DeepxError, InputError, shown
from deepx_flow.gateway.errors import NotFound
from deepx_flow.registry.cluster import format_bytes
from deepx_flow.serving.batcher import Batcher, batch_sizes
from deepx_flow.serving.config import ServingConfig, checked_against, read_config
from deepx_flow.serving.model import ServedModel, load_model

log = logging.getLogger(__name__)

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def answer(self) -> dict:
        return {"count": self.count, "ns": self.ns}


# Request and queue latency buckets, in seconds (a millisecond model to a slow batch).
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                   2.5, 5.0, 10.0)


@dataclass
class Histogram:
    """Observations counted by the bucket they fall in (upper bounds `bounds`, then +Inf),
    and their sum: what a Prometheus histogram reports."""

    bounds: tuple = LATENCY_BUCKETS
    counts: list = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    sum: float = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def cumulative(self) -> list[tuple[str, int]]:
        """(upper bound, observations at or under it), +Inf last."""
        out, total = [], 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts):
            total += count
            out.append((bound, total))
        return out


@dataclass
class Statistics:
    """One model version's counters, as the statistics extension and the metrics report
    them."""

    last_inference: int = 0  # milliseconds since the epoch
    inference_count: int = 0
    execution_count: int = 0
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    batches: dict = field(default_factory=dict)  # batch size -> Duration of compute
    chunked: int = 0  # requests run as a chunked plan on the cluster
    latency: Histogram = field(default_factory=Histogram)  # each request, end to end
    queue_latency: Histogram = field(default_factory=Histogram)  # each request's wait

    def answer(self, name: str, version: str) -> dict:
        zero = Duration().answer()
        return {"name": name, "version": version, "last_inference": self.last_inference,
                "inference_count": self.inference_count,
                "execution_count": self.execution_count,
                "inference_stats": {"success": self.success.answer(),
                                    "fail": self.fail.answer(), "queue": self.queue.answer(),
                                    "compute_input": zero,
                                    "compute_infer": self.compute_infer.answer(),
                                    "compute_output": zero},
                "batch_stats": [{"batch_size": size, "compute_input": zero,
                                 "compute_infer": d.answer(), "compute_output": zero}
                                for size, d in sorted(self.batches.items())]}


@dataclass
class Entry:
    """A model of the repository: the version served (if any) and how its last load went."""

    model: ServedModel | None = None
    state: str = "UNAVAILABLE"  # READY, UNAVAILABLE
    reason: str = ""
    stats: Statistics = field(default_factory=Statistics)
    config: ServingConfig = field(default_factory=ServingConfig)
    batcher: Batcher | None = None
    replicas: object = None  # replica.Replicas on the cluster's workers, or None (here)


class ModelRepository:
    """The models under `root` this server serves: on the workers of `client` (a Dask
    client) as resident replicas, or without one in this process, computed for `cluster`
    (a ClusterSpec)."""

    def __init__(self, root, cluster, client=None):
        self.root, self.cluster = Path(root), cluster
        if not self.root.is_dir():
            raise InputError(f"model repository {self.root} is not a folder")
        # A client of its own that talks to the workers directly: an actor's calls go
        # through the scheduler otherwise (Dask's default for a client).
        self.client = None if client is None else _direct_client(client)
        # what one task of the smallest worker may hold: a request past it runs chunked
        # (read once: the settings are read from the environment, a cost per request)
        self.task_budget = cluster.task_budget()
        # large requests, each a chunked plan on the whole cluster: a few at a time
        self._large = concurrent.futures.ThreadPoolExecutor(2, "deepx-large-request")
        self._lock = threading.Lock()
        self._entries: dict[str, Entry] = {}

    def load_all(self) -> None:
        """Load every model of the repository (those that fail are UNAVAILABLE)."""
        for name in self.names():
            try:
                self.load(name)
            except DeepxError:
                pass  # its entry says why

    def names(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir()
                      if p.is_dir() and NAME.fullmatch(p.name))

    # -- the repository extension ---------------------------------------------------------------

    def index(self, ready_only: bool = False) -> list[dict]:
        """Every model of the repository (and those loaded that left it): name, version,
        state, and the reason of one that is not ready."""
        with self._lock:
            entries = dict(self._entries)
        out = []
        for name in sorted(set(self.names()) | set(entries)):
            entry = entries.get(name, Entry(reason="not loaded"))
            if ready_only and entry.state != "READY":
                continue
            out.append({"name": name, "version": entry.model.version if entry.model else "",
                        "state": entry.state, "reason": entry.reason})
        return out

    def load(self, name) -> ServedModel:
        """(Re)load model `name` from disk, its newest version: the model, or a DeepxError
        saying why it cannot be served (recorded as its reason; a version that was serving
        keeps serving)."""
        folder = self._folder(name)
        try:
            config = read_config(folder, name)
            version, path = _newest_version(folder, config.model_file)
            model = load_model(name, version, path, self.cluster)
            checked_against(config, model, folder / "config.pbtxt")
            sizes = batch_sizes(config.max_batch_size) if config.dynamic_batching else []
            replicas, warm_batch_s = None, None
            if self.client is not None and model.weight_bytes > self.task_budget:
                # No worker's task holds its weights: no replica, no warm-up in this
                # process; every request runs as a chunked plan on the cluster.
                log.info("model %r version %s: weights of %s, past a task's %s: every "
                         "request runs chunked on the cluster", name, model.version,
                         format_bytes(model.weight_bytes), format_bytes(self.task_budget))
            elif self.client is not None and not config.in_gateway:
                from deepx_flow.serving.replica import Replicas
                gpus = [w.address for w in self.cluster.workers
                        if w.device is not None and w.address]
                replicas = Replicas(self.client, model, config.replicas, gpus, sizes)
            else:
                warm_batch_s = model.prepare(sizes)
        except DeepxError as err:
            with self._lock:
                entry = self._entries.setdefault(name, Entry())
                entry.reason = f"failed to load: {err}"
                if entry.model is None:
                    entry.state = "UNAVAILABLE"
            raise InputError(f"model {name!r}: failed to load: {err}") from None
        run = replicas.run if replicas is not None else \
            (lambda replica, arrays, outputs: model.infer(arrays, outputs))
        on_loop = replicas is None and config.replicas == 1 and warm_batch_s is not None \
            and warm_batch_s <= ON_LOOP_S
        batcher = Batcher(name, run, config.replicas,
                          config.max_batch_size if config.dynamic_batching else 0,
                          config.max_queue_delay_us, config.preferred_batch_sizes,
                          done=lambda *batch: self._executed(name, model, *batch),
                          on_loop=on_loop,
                          run_async=replicas.run_async if replicas is not None else None)
        if self.client is None or model.weight_bytes <= self.task_budget:
            log.info("model %r version %s: batches run %s", name, model.version,
                     "on the event loop" if on_loop else
                     f"in {config.replicas} replica(s)" + (" on the workers, sent from the "
                                                           "event loop" if replicas else ""))
        with self._lock:
            entry = self._entries.setdefault(name, Entry())
            if entry.model is None or entry.model.version != model.version:
                entry.stats = Statistics()
            old, old_replicas = entry.batcher, entry.replicas
            entry.model, entry.state, entry.reason = model, "READY", ""
            entry.config, entry.batcher, entry.replicas = config, batcher, replicas
        if old is not None:
            old.stop()  # the requests it holds are answered by the version they came for
        if old_replicas is not None:
            old_replicas.release()
        return model

    def unload(self, name) -> None:
        """Stop serving model `name` (it stays in the repository's index)."""
        with self._lock:
            entry = self._entries.get(name)
            old = entry.batcher if entry is not None else None
            old_replicas = entry.replicas if entry is not None else None
            if entry is not None:
                entry.model, entry.state, entry.reason = None, "UNAVAILABLE", "unloaded"
                entry.batcher = entry.replicas = None
        if old is not None:
            old.stop()
        if old_replicas is not None:
            old_replicas.release()
        if entry is None:
            self._folder(name)  # NotFound for a model not in the repository

    def stop(self) -> None:
        """Stop serving every model, answering the requests queued first."""
        with self._lock:
            batchers = [e.batcher for e in self._entries.values() if e.batcher is not None]
            replicas = [e.replicas for e in self._entries.values() if e.replicas is not None]
        for b in batchers:
            b.stop()
        for r in replicas:
            r.release()
        self._large.shutdown(wait=True)
        if self.client is not None:
            self.client.close()

    def placement(self, name) -> list[str]:
        """The workers model `name`'s replicas run on (empty: in this process)."""
        with self._lock:
            entry = self._entries.get(name)
        return entry.replicas.workers() if entry is not None and entry.replicas else []

    # -- serving ---------------------------------------------------------------------------------

    def model(self, name, version: str = "") -> ServedModel:
        """The model serving `name` (at `version`, when given): NotFound otherwise."""
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise NotFound(f"no model {shown(name)}")
        with self._lock:
            entry = self._entries.get(name)
        if entry is None or entry.model is None:
            why = "is not in the repository" if entry is None and name not in self.names() \
                else f"is not loaded ({entry.reason if entry else 'not loaded'})"
            raise NotFound(f"model {name!r} {why}")
        if version and version != entry.model.version:
            raise NotFound(f"model {name!r} has no version {version!r} loaded (serving "
                           f"version {entry.model.version})")
        return entry.model

    def ready(self, name, version: str = "") -> bool:
        try:
            self.model(name, version)
            return True
        except NotFound:
            return False

    @contextlib.contextmanager
    def arriving(self, name):
        """Around reading a request for model `name`: its batcher knows one is on its way.
        Yields the request's arrival (None without a batcher), for `submit`."""
        with self._lock:
            entry = self._entries.get(name)
            batcher = entry.batcher if entry is not None else None
        if batcher is None or batcher.on_loop:  # (a loop's batches wait for no arrival:
            yield None  # only a replica thread's gathering reads them)
            return
        with batcher.arriving() as arrival:
            yield arrival

    def submit(self, name, version: str, arrays: dict, outputs=None, arrival=None,
               loop=None) -> tuple:
        """Check one request and queue it: (the model, a Future of its outputs by name);
        counted in the model's statistics when it ends. A bad request is refused here, and
        counted failed, before it can join a batch. `loop`: the running event loop of the
        caller (called on its thread), which then gets an asyncio Future."""
        with self._lock:
            entry = self._entries.get(name)
        model = self.model(name, version)
        batcher, config = entry.batcher, entry.config
        began = time.perf_counter_ns()
        try:
            model.check(arrays, outputs)
            rows = _rows(model, arrays)
            if config.max_batch_size and rows > config.max_batch_size:
                raise InputError(f"model {name!r}: a request of {rows} rows; its "
                                 f"max_batch_size is {config.max_batch_size}")
        except DeepxError:
            self._ended(name, model, began, False)
            raise
        if self.client is not None and model.footprint(arrays) > self.task_budget:
            future = self._large.submit(self._chunked, name, model, arrays, outputs, rows)
            if loop is not None:  # (an asyncio Future, set on `loop`, as the batcher's)
                future = asyncio.wrap_future(future, loop=loop)
        else:
            future = batcher.submit(arrays, outputs, rows, arrival, loop)
        future.add_done_callback(lambda f: self._ended(
            name, model, began, not f.cancelled() and f.exception() is None))
        return model, future

    def _chunked(self, name: str, model: ServedModel, arrays: dict, outputs, rows: int):
        """Run one large request as a chunked plan on the cluster (the scheduler places its
        chunks on the workers)."""
        from deepx_flow.runtime.run import run_graph
        wanted = model.check(arrays, outputs)
        graph, carried = model._graph(arrays)
        began = time.perf_counter_ns()
        results = run_graph(graph, inputs={**carried, **arrays}, client=self.client,
                            cluster=self.cluster, progress=False)  # planned for its memory
        with self._lock:
            stats = self._stats(name, model)
            if stats is not None:
                stats.chunked += 1
        self._executed(name, model, rows, time.perf_counter_ns() - began, [0], True)
        return {n: results[n] for n in wanted}

    def infer(self, name, version: str, arrays: dict, outputs=None) -> tuple:
        """`submit`, waiting for the outputs: (the model, its outputs by name)."""
        model, future = self.submit(name, version, arrays, outputs)
        return model, future.result()

    def _stats(self, name: str, model: ServedModel) -> Statistics | None:
        """The statistics of `model` (None once another version replaced it); under the
        lock."""
        entry = self._entries.get(name)
        return entry.stats if entry is not None and entry.model is model else None

    def _ended(self, name: str, model: ServedModel, began: int, succeeded: bool) -> None:
        ns = time.perf_counter_ns() - began
        with self._lock:
            stats = self._stats(name, model)
            if stats is not None:
                stats.last_inference = int(time.time() * 1000)
                (stats.success if succeeded else stats.fail).add(ns)
                stats.latency.observe(ns / 1e9)

    def _executed(self, name: str, model: ServedModel, rows: int, ns: int, queued: list,
                  succeeded: bool) -> None:
        with self._lock:
            stats = self._stats(name, model)
            if stats is None:
                return
            stats.queue.add(sum(queued), len(queued))
            for wait in queued:
                stats.queue_latency.observe(wait / 1e9)
            if succeeded:
                stats.compute_infer.add(ns)
                stats.inference_count += rows
                stats.execution_count += 1
                stats.batches.setdefault(rows, Duration()).add(ns)

    def snapshot(self) -> list[tuple[str, str, Statistics]]:
        """(name, version, a copy of its statistics) of every loaded model."""
        with self._lock:
            return [(n, e.model.version, copy.deepcopy(e.stats))
                    for n, e in sorted(self._entries.items()) if e.model is not None]

    def statistics(self, name: str = "", version: str = "") -> list[dict]:
        """The statistics of one model (at `version`), or of every loaded one."""
        if name:
            model = self.model(name, version)
            with self._lock:
                return [self._entries[name].stats.answer(name, model.version)]
        with self._lock:
            return [e.stats.answer(n, e.model.version)
                    for n, e in sorted(self._entries.items()) if e.model is not None]

    def _folder(self, name) -> Path:
        if not isinstance(name, str) or not NAME.fullmatch(name) or \
                not (self.root / name).is_dir():
            raise NotFound(f"model {shown(name)} is not in the repository {self.root}")
        return self.root / name


def _direct_client(client):
    from distributed import Client
    return Client(client.scheduler.address, direct_to_workers=True, set_as_default=False,
                  timeout="30s")


# A model whose largest batch, warm, takes at most this much CPU time (its thread's, so that
# a busy machine does not make a quick model look slow) runs its batches on the event
# loop that reads the requests, when it has one replica in the gateway's process: in a
# thread of its own, each kernel of a batch gave the GIL back to the loop and waited to
# take it again, about 37 hand-overs a batch of the MLP, which made the batch take 3 ms
# instead of 0.4 and cost the loop the same again. A longer batch runs in its thread,
# where it holds the loop up for no longer than a kernel.
ON_LOOP_S = 0.002

MODEL_FILES = ("model.onnx", "model.yaml", "model.yml", "model.json")


def _newest_version(folder: Path, model_file: str | None) -> tuple[str, Path]:
    """The newest version folder's number and model file (`model_file`, or the first of
    MODEL_FILES there)."""
    names = (model_file,) if model_file else MODEL_FILES
    versions = sorted((int(p.name), p) for p in folder.iterdir()
                      if p.is_dir() and p.name.isdigit() and p.name.isascii())
    if not versions:
        raise InputError(f"{folder}: no version folder (1/, 2/, ...) with a "
                         f"{' or '.join(names)}")
    number, path = versions[-1]
    found = next((path / n for n in names if (path / n).is_file()), None)
    if found is None:
        raise InputError(f"{path}: no {' or '.join(names)}")
    return str(number), found


def _rows(model: ServedModel, arrays: dict) -> int:
    """A request's rows: the size of its inputs' first axis where that axis varies (the
    batch), else 1."""
    for spec in model.inputs:
        if spec.shape and spec.shape[0] == -1 and spec.name in arrays:
            return int(arrays[spec.name].shape[0])
    return 1
