"""A model repository in Triton's layout, and the models of it this server has loaded.

    models/                      (--model-repository models)
      mlp/
        1/model.onnx
        2/model.onnx             (the newest version is the one served)
      conv_net/
        1/model.onnx

Every model is loaded when the server starts; the repository extension's `load` reads a
model again from disk (a new version, a fixed file) and `unload` stops serving it. A model
that cannot be loaded (a file that is not a valid ONNX model, an operator deepx_flow does not
convert, a graph that does not take its declared inputs) is UNAVAILABLE with its reason, in
the index and in the error of its load; the other models keep serving, and a model that was
serving keeps its loaded version when a reload fails.

Statistics are kept per model as the protocol's statistics extension reports them:
requests' rows (`inference_count`), executions (`execution_count`: a batch of requests is
one), time in success and failure, and per batch size.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from deepx_flow.errors import DeepxError, InputError, shown
from deepx_flow.gateway.errors import NotFound
from deepx_flow.serving.model import ServedModel

MODEL_FILE = "model.onnx"
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


@dataclass
class Statistics:
    """One model version's counters, as the statistics extension reports them."""

    last_inference: int = 0  # milliseconds since the epoch
    inference_count: int = 0
    execution_count: int = 0
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    batches: dict = field(default_factory=dict)  # batch size -> Duration of compute

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


class ModelRepository:
    """The models under `root` this server serves, computed for `cluster` (a ClusterSpec)."""

    def __init__(self, root, cluster):
        self.root, self.cluster = Path(root), cluster
        if not self.root.is_dir():
            raise InputError(f"model repository {self.root} is not a folder")
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
            version, path = _newest_version(folder)
            model = ServedModel(name, version, path, self.cluster)
        except DeepxError as err:
            with self._lock:
                entry = self._entries.setdefault(name, Entry())
                entry.reason = f"failed to load: {err}"
                if entry.model is None:
                    entry.state = "UNAVAILABLE"
            raise InputError(f"model {name!r}: failed to load: {err}") from None
        with self._lock:
            entry = self._entries.setdefault(name, Entry())
            if entry.model is None or entry.model.version != model.version:
                entry.stats = Statistics()
            entry.model, entry.state, entry.reason = model, "READY", ""
        return model

    def unload(self, name) -> None:
        """Stop serving model `name` (it stays in the repository's index)."""
        with self._lock:
            entry = self._entries.get(name)
            if entry is not None:
                entry.model, entry.state, entry.reason = None, "UNAVAILABLE", "unloaded"
                return
        self._folder(name)  # NotFound for a model not in the repository

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

    def infer(self, name, version: str, arrays: dict, outputs=None) -> tuple:
        """Run one request: (the model, its outputs by name); counted in its statistics."""
        model = self.model(name, version)
        began = time.perf_counter_ns()
        try:
            result = model.infer(arrays, outputs)
        except DeepxError:
            self._count(name, model, time.perf_counter_ns() - began, None)
            raise
        rows = _rows(model, arrays)
        self._count(name, model, time.perf_counter_ns() - began, rows)
        return model, result

    def _count(self, name: str, model: ServedModel, ns: int, rows: int | None) -> None:
        with self._lock:
            entry = self._entries.get(name)
            if entry is None or entry.model is not model:
                return  # reloaded meanwhile: the new version counts from zero
            stats = entry.stats
            stats.last_inference = int(time.time() * 1000)
            if rows is None:
                stats.fail.add(ns)
                return
            stats.success.add(ns)
            stats.compute_infer.add(ns)
            stats.inference_count += rows
            stats.execution_count += 1
            stats.batches.setdefault(rows, Duration()).add(ns)

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


def _newest_version(folder: Path) -> tuple[str, Path]:
    versions = sorted((int(p.name), p) for p in folder.iterdir()
                      if p.is_dir() and p.name.isdigit() and p.name.isascii())
    if not versions:
        raise InputError(f"{folder}: no version folder (1/, 2/, ...) with a {MODEL_FILE}")
    number, path = versions[-1]
    if not (path / MODEL_FILE).is_file():
        raise InputError(f"{path}: no {MODEL_FILE}")
    return str(number), path / MODEL_FILE


def _rows(model: ServedModel, arrays: dict) -> int:
    """A request's rows: the size of its inputs' first axis where that axis varies (the
    batch), else 1."""
    for spec in model.inputs:
        if spec.shape and spec.shape[0] == -1 and spec.name in arrays:
            return int(arrays[spec.name].shape[0])
    return 1
