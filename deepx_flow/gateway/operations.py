"""Operations: the gateway's executions and materializations, carried out in threads,
recorded in the metadata database, found again by id.

A client's `graphs:execute` becomes an operation: a row in `operations` (state `running`)
and a thread that runs the graph through `dx.run`, the SDK's own entry point (an asset's
`:materialize` is one too, through `dx.materialize`, its row listing the versions made
instead of outputs). When the run
succeeds its outputs are written under the results folder, one `.npy` file each (written to
a temporary name, then renamed), and only then does the row say `succeeded` and list them:
a client that lost its connection asks for the operation by id and reads them; nothing
half-written is ever listed. A failed run's row holds its error, the same text as the
Python `DeepxError`; a cancelled one (`cancel`) is `interrupted`.

A gateway killed outright leaves its operations `running`. The next gateway to open the
database marks those whose process it can look up and finds gone `interrupted`
(`interrupt_orphaned`), as `meta/orphans.py` does for runs, and removes their results
folders, whose files no row lists.

An operation that ended is kept for DEEPX_OPERATION_TTL_S (a week), then forgotten
(`prune`): its row first, then its results folder, so no row ever lists files that are gone.

A client may choose the operation's id: sending the same request again with the same id
(after a lost connection) attaches to the first operation instead of running it twice; the
same id with another request is refused.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from pathlib import Path

import numpy as np
from sqlmodel import delete, select, update

from deepx_flow.contract.tensors import datatype_of, dtype_of, to_raw
from deepx_flow.errors import DeepxError, InputError, shown
from deepx_flow.gateway.errors import NotFound
from deepx_flow.meta.models import Operation
from deepx_flow.meta.orphans import driver_gone, process_started
from deepx_flow.processes import this_process
from deepx_flow.runtime.cancel import Cancellation, RunCancelled
from deepx_flow.runtime.futures import describe_error
from deepx_flow.runtime.inputs import bind_inputs
from deepx_flow.runtime.progress import RunProgress

log = logging.getLogger(__name__)

ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
FINAL = ("succeeded", "failed", "interrupted")
END_ATTEMPTS = 5


def request_digest(kind: str, graph_doc, inputs: dict, outputs: list,
                   references: dict | None = None) -> str:
    """SHA-256 of a request: its kind, its graph spec (canonical JSON), each input's name,
    datatype, shape and bytes (or where in storage it is read from, as the request said),
    and the outputs asked for."""
    h = hashlib.sha256()
    h.update(json.dumps([kind, graph_doc, sorted(outputs), references or {}], sort_keys=True,
                        separators=(",", ":")).encode())
    for name in sorted(inputs):
        array = inputs[name]
        h.update(json.dumps([name, datatype_of(array.dtype), list(array.shape)]).encode())
        h.update(hashlib.sha256(to_raw(array)).digest())
    return h.hexdigest()


def _reading(graph, stored: dict):
    """`graph` with the inputs in `stored` (name -> lazy tensor) read from storage, the
    others inputs still (dx.call: a stored tensor whose dtype or shape is not its input's
    is an InputError naming it)."""
    from deepx_flow.sdk.build import build_graph
    from deepx_flow.sdk.call import call
    from deepx_flow.sdk.functions import input as input_
    unknown = sorted(set(stored) - {node.id for node in graph.inputs})
    if unknown:
        raise InputError(f"input(s) {', '.join(map(shown, unknown))} given by reference, "
                         f"but the graph's inputs are "
                         f"{', '.join(n.id for n in graph.inputs) or 'none'}")
    given = {node.id: stored[node.id] if node.id in stored else
             input_(node.id, node.shape, node.dtype) for node in graph.inputs}
    return build_graph(call(graph, given))


def _kept_for() -> str:
    from deepx_flow.config import settings
    days = settings().operation_ttl_s / 86_400
    return f" (an operation is kept for {days:g} days after it ends: DEEPX_OPERATION_TTL_S)"


class _RunIdTaker(RunProgress):
    """Progress that shows nothing and hands on the run's id and task count as the run is
    submitted."""

    def __init__(self, took):
        super().__init__(show=False)
        self._took = took

    def attach(self, client, run_id: str, total: int, recorded: bool) -> None:
        super().attach(client, run_id, total, recorded)
        self._took(run_id, total)


class Operations:
    """The operations of one gateway: `db` (a Database) records them, `results` (a folder)
    holds the outputs of those that succeeded, `client` (a Dask client) runs them."""

    def __init__(self, db, results: Path, client):
        self.db, self.results, self.client = db, Path(results), client
        self.me = this_process()
        self._lock = threading.Lock()
        self._running: dict[str, tuple[threading.Thread, Cancellation, threading.Event]] = {}
        # operation id -> (its current run's id, the run's task count), while it runs here
        self._runs: dict[str, tuple[str, int]] = {}

    # -- starting ----------------------------------------------------------------------------

    def execute(self, graph, graph_doc, inputs: dict, outputs: list | None = None,
                operation_id: str | None = None, stored: dict | None = None) -> tuple[str, bool]:
        """Start running `graph` (from the spec `graph_doc`) on `inputs` (name -> array) and
        `stored` (name -> (lazy tensor, what the request said of it): inputs read from
        storage), returning the operation's id and whether this call started it (False:
        the same request came with this id before, and this attaches to that operation)."""
        names = [name for name, _ in graph.outputs]
        wanted = list(outputs) if outputs else names
        unknown = [n for n in wanted if n not in names]
        if unknown:
            raise InputError(f"output(s) {', '.join(map(shown, unknown))} asked for, but the "
                             f"graph's outputs are {', '.join(names)}")
        stored = stored or {}
        runnable = _reading(graph, {n: t for n, (t, _) in stored.items()}) if stored else graph
        bind_inputs(runnable, inputs)  # a missing or mismatched input: refused, not run
        digest = request_digest("execute", graph_doc, inputs, wanted,
                                {n: said for n, (_, said) in stored.items()})
        target = graph_doc.get("name") if isinstance(graph_doc, dict) else None

        def work(token, took_run_id):
            from deepx_flow.runtime.run import run_graph
            results = run_graph(runnable, inputs=inputs, client=self.client,
                                progress=_RunIdTaker(took_run_id), cancel=token)
            return {n: results[n] for n in wanted}, None
        return self.start("execute", digest, target if isinstance(target, str) else None,
                          work, operation_id)

    def start(self, kind: str, digest: str, target: str | None, work,
              operation_id: str | None = None) -> tuple[str, bool]:
        """Start an operation of `kind` that carries out `work(token, took_run_id)` in a
        thread of its own (it gives the arrays to store by name, and a JSON-able summary
        the row keeps instead, or None); its id, and whether this call started it (False:
        the same request, by its `digest`, came with this id before)."""
        if operation_id is not None and (not isinstance(operation_id, str)
                                         or not ID.fullmatch(operation_id)):
            raise InputError(f"operation id {shown(operation_id)} is not 1 to 128 letters, "
                             f"digits, '_', '.' or '-' (starting with a letter or digit)")
        operation_id = operation_id or uuid.uuid4().hex
        token, done = Cancellation(), threading.Event()
        thread = threading.Thread(target=self._carry_out, name=f"deepx-op-{operation_id}",
                                  args=(operation_id, work, token, done),
                                  daemon=True)
        # Listed as running here before its row exists, so that no reader ever finds the
        # row of an operation of this process that is not listed (which would mean its
        # thread ended without recording how).
        with self._lock:
            taken = operation_id in self._running
            if not taken:
                self._running[operation_id] = (thread, token, done)
        if taken or not self._record(operation_id, kind, digest, target):
            if not taken:
                with self._lock:
                    self._running.pop(operation_id, None)
            self._same_request(operation_id, digest)
            return operation_id, False
        thread.start()
        return operation_id, True

    def _record(self, operation_id: str, kind: str, digest: str, target: str | None) -> bool:
        """Record a new operation; False where its id is taken."""
        try:
            with self.db.session() as session:
                session.add(Operation(id=operation_id, kind=kind, request_digest=digest,
                                      target=target, created_at=time.time(), host=self.me.host,
                                      pid=self.me.pid, pid_space=self.me.space))
            return True
        except DeepxError:  # the id is taken (or the database failed: then this fails too)
            if self._row(operation_id) is None:
                raise
            return False

    def _same_request(self, operation_id: str, digest: str) -> None:
        """An id sent again must come with the request it was first sent with."""
        found, deadline = self._row(operation_id), time.monotonic() + 5
        while found is None and time.monotonic() < deadline:  # its first sending is
            time.sleep(0.05)                                  # being recorded now
            found = self._row(operation_id)
        if found is not None and found.request_digest != digest:
            raise InputError(f"operation id {operation_id!r} was used for another request; "
                             f"choose a new id")

    # -- carrying out ------------------------------------------------------------------------

    def _carry_out(self, operation_id, work, token, done) -> None:
        try:
            arrays, summary = work(token, lambda run_id, total: self._took_run(
                operation_id, run_id, total))
            kept = summary if summary is not None else self._store(operation_id, arrays)
            self._end(operation_id, "succeeded", outputs=json.dumps(kept))
        except RunCancelled as err:
            self._end(operation_id, "interrupted", error=str(err))
        except DeepxError as err:
            kept = getattr(err, "summary", None)  # what a failed materialization made
            self._end(operation_id, "failed", error=str(err),
                      **({} if kept is None else {"outputs": json.dumps(kept)}))
        except BaseException as err:  # a failure of this gateway's own: said, not hidden
            log.exception("deepx_flow: operation %s failed", operation_id)
            try:
                self._end(operation_id, "failed", error=describe_error(err))
            except DeepxError:  # the database refuses: `get` finds the row left running
                log.exception("deepx_flow: operation %s: its end was not recorded",
                              operation_id)
        finally:
            with self._lock:
                self._running.pop(operation_id, None)
                self._runs.pop(operation_id, None)
            done.set()

    def _took_run(self, operation_id: str, run_id: str, total: int) -> None:
        with self._lock:
            self._runs[operation_id] = (run_id, total)
        self._set(operation_id, run_id=run_id)

    def progress(self, found) -> dict | None:
        """How far the operation `found` (its row) has got: {"tasks_done", "tasks_total"} of
        its run (the current one, for a materialization of several); for one that
        succeeded, its last run's whole count; None before a run started, or once one that
        did not succeed ended (then its run's page says how far it got)."""
        if found.state == "succeeded" and found.run_id:
            from deepx_flow.meta.models import Run
            with self.db.read() as session:
                run = session.get(Run, found.run_id)
            return None if run is None else {"tasks_done": run.n_tasks,
                                             "tasks_total": run.n_tasks}
        with self._lock:
            current = self._runs.get(found.id)
        if found.state != "running" or current is None:
            return None
        from deepx_flow.runtime.supervisor import progress
        run_id, total = current
        try:
            done, _ = self.client.run_on_scheduler(progress, run_id=run_id)
        except Exception:  # (the scheduler is busy or gone: the count is a display only)
            done = 0
        return {"tasks_done": min(done, total), "tasks_total": total}

    def _store(self, operation_id: str, arrays: dict) -> list[dict]:
        """Write each output to its own file (a temporary name, then renamed, then the
        folder synced, so the names survive a crash as the row that lists them will); what
        the row will list. A store that fails leaves no folder behind."""
        folder = self.results / operation_id
        folder.mkdir(parents=True, exist_ok=True)
        try:
            listed = self._write(folder, arrays)
            descriptor = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return listed

    @staticmethod
    def _write(folder: Path, arrays: dict) -> list[dict]:
        listed = []
        for index, (name, array) in enumerate(arrays.items()):
            path = folder / f"{index}.npy"
            partial = folder / f".{index}.npy.partial"
            with open(partial, "wb") as f:
                # (not ascontiguousarray: it makes a 0-d result 1-d)
                np.save(f, np.asarray(array, order="C"), allow_pickle=False)
                f.flush()
                os.fsync(f.fileno())
            os.replace(partial, path)
            listed.append({"name": name, "datatype": datatype_of(array.dtype),
                           "shape": list(array.shape), "file": path.name})
        return listed

    def _set(self, operation_id: str, **values) -> None:
        with self.db.session() as session:
            session.exec(update(Operation).where(Operation.id == operation_id).values(**values))

    def _end(self, operation_id: str, state: str, **values) -> None:
        """Record the operation's end, trying again for a while (a busy database)."""
        for attempt in range(END_ATTEMPTS):
            try:
                with self.db.session() as session:
                    session.exec(update(Operation)
                                 .where(Operation.id == operation_id,
                                        Operation.state == "running")
                                 .values(state=state, ended_at=time.time(), **values))
                return
            except DeepxError:
                if attempt == END_ATTEMPTS - 1:
                    raise
                time.sleep(0.5 * (attempt + 1))

    # -- asking --------------------------------------------------------------------------------

    def get(self, operation_id: str, wait_seconds: float | None = 0.0) -> Operation:
        """The operation's row, once it ended or `wait_seconds` passed (None: until it
        ends); NotFound for an id never recorded."""
        if not isinstance(operation_id, str) or not ID.fullmatch(operation_id):
            raise NotFound(f"no operation {shown(operation_id)}")
        deadline = None if wait_seconds is None else time.monotonic() + max(0.0, wait_seconds)
        with self._lock:
            here = self._running.get(operation_id)
        if here is not None:
            here[2].wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        while True:
            with self.db.read() as session:
                found = session.get(Operation, operation_id)
            if found is None:
                raise NotFound(f"no operation {operation_id!r}{_kept_for()}")
            if found.state in FINAL or (deadline is not None and time.monotonic() >= deadline):
                return found
            if found.pid == self.me.pid and found.host == self.me.host and \
                    not self.running_here(operation_id):
                # ours, and its thread has ended without recording how: say so, once
                self._end(operation_id, "failed", error="the gateway could not record how "
                                                        "this operation ended")
                continue
            time.sleep(0.2)  # carried out by another gateway: its row says when it ends

    def running_here(self, operation_id: str) -> bool:
        """Whether this process carries the operation out and it has not ended."""
        with self._lock:
            return operation_id in self._running

    async def settled(self, operation_id: str, wait_seconds: float | None) -> None:
        """Return once the operation ended or `wait_seconds` passed (None: until it ends),
        holding no thread while it waits (a wait of hours must not hold one of the
        servers' threads, which cancels and every other call need)."""
        import asyncio
        loop = asyncio.get_running_loop()
        deadline = None if wait_seconds is None else loop.time() + wait_seconds
        while deadline is None or loop.time() < deadline:
            if self.running_here(operation_id):
                # (a short wait is kept to: a client that asks for 1 ms gets 1 ms, not 50)
                left = 0.05 if deadline is None else deadline - loop.time()
                await asyncio.sleep(max(0.0, min(0.05, left)))
                continue
            found = await asyncio.to_thread(self._row, operation_id)
            if found is None or found.state in FINAL or found.pid == self.me.pid:
                return  # (ours, its thread ended: `get` says how)
            # another gateway's: its row says when it ends
            left = 0.5 if deadline is None else deadline - loop.time()
            await asyncio.sleep(max(0.0, min(0.5, left)))

    def _row(self, operation_id: str) -> Operation | None:
        with self.db.read() as session:
            return session.get(Operation, operation_id)

    @staticmethod
    def summary(found: Operation) -> dict | None:
        """What a succeeded operation that stored no arrays kept instead (a
        materialization's versions), or None."""
        kept = json.loads(found.outputs or "[]")
        return kept if isinstance(kept, dict) else None

    def outputs(self, found: Operation) -> dict[str, np.ndarray]:
        """A succeeded operation's outputs by name, read from their files."""
        listed = json.loads(found.outputs or "[]")
        if isinstance(listed, dict):  # a summary, no arrays
            return {}
        folder = self.results / found.id
        arrays = {}
        for entry in listed:
            path = folder / entry["file"]
            try:
                array = np.load(path, mmap_mode="r", allow_pickle=False)
                if entry["datatype"] == "BF16" and array.dtype.kind == "V":
                    # (.npy has no bfloat16: it keeps its 2-byte elements as void, `<V2`)
                    array = array.view(np.dtype(dtype_of("BF16", entry["name"])))
                arrays[entry["name"]] = array
            except (OSError, ValueError) as err:
                raise DeepxError(f"operation {found.id!r}: its output {entry['name']!r} "
                                 f"cannot be read from {path}: {err}") from None
        return arrays

    def prune(self, ttl: float | None = None, batch: int = 500) -> list[str]:
        """Forget the operations that ended more than `ttl` seconds ago (default
        DEEPX_OPERATION_TTL_S): their rows, then their results folders, `batch` at a time
        (a gateway back after a long pause may have many); their ids."""
        from deepx_flow.config import settings
        cutoff = time.time() - (settings().operation_ttl_s if ttl is None else ttl)
        pruned = []
        while True:
            with self.db.session() as session:
                old = list(session.exec(select(Operation.id).where(
                    Operation.state.in_(FINAL), Operation.ended_at < cutoff).limit(batch)))
                if old:
                    session.exec(delete(Operation).where(Operation.id.in_(old)))
            for operation_id in old:
                shutil.rmtree(self.results / operation_id, ignore_errors=True)
            pruned += old
            if len(old) < batch:
                return pruned

    def cancel(self, operation_id: str) -> Operation:
        """Ask a running operation to stop (it ends interrupted once its run stops: wait
        for it with `settled`). One of a gateway that is gone is marked interrupted now."""
        found = self.get(operation_id)
        with self._lock:
            here = self._running.get(operation_id)
        if here is not None:
            here[1].cancel("cancelled by a client's request")
        elif found.state == "running":
            self.interrupt_orphaned()
        return self.get(operation_id)

    def stop(self, grace: float = 20.0) -> None:
        """Stop every operation this process runs (the gateway is stopping): each is
        cancelled, given up to `grace` seconds in all to end interrupted, and any still
        running then is marked interrupted."""
        with self._lock:
            running = dict(self._running)
        for thread, token, _ in running.values():
            token.cancel("the gateway stopped")
        deadline = time.monotonic() + grace
        for operation_id, (thread, _, _) in running.items():
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                self._end(operation_id, "interrupted",
                          error="the gateway stopped before it finished")

    # -- what a dead gateway left ----------------------------------------------------------------

    def beat(self) -> None:
        """Say that this gateway still carries out its running operations."""
        with self._lock:
            mine = list(self._running)
        if mine:
            with self.db.session() as session:
                session.exec(update(Operation).where(Operation.id.in_(mine))
                             .values(heartbeat_at=time.time()))

    def interrupt_orphaned(self, stale_after: float | None = None) -> list[str]:
        """Mark `interrupted` the running operations whose gateway is gone, and remove their
        results folders; return their ids. Gone: a process this one can look up by pid and
        finds gone, or any gateway whose heartbeat (`beat`, or the operation's start) is
        older than `stale_after` seconds (default DEEPX_HEARTBEAT_TIMEOUT_S)."""
        from deepx_flow.config import settings
        stale_after = settings().heartbeat_timeout_s if stale_after is None else stale_after
        with self.db.read() as session:
            running = session.exec(select(Operation).where(Operation.state == "running")).all()
        now, gone = time.time(), []
        for op in running:
            if self.running_here(op.id):
                continue
            if op.host == self.me.host and self.me.space is not None and \
                    op.pid_space == self.me.space and \
                    driver_gone(op.pid, op.created_at, process_started):
                # (this process's own pid counts too: driver_gone tells a reused pid by
                # its start time)
                gone.append((op.id, f"the gateway process {op.host}:{op.pid} that ran it "
                                    f"stopped before it finished"))
            elif now - (op.heartbeat_at or op.created_at) > stale_after:
                gone.append((op.id, f"the gateway {op.host}:{op.pid} that ran it sent no "
                                    f"heartbeat for {stale_after:g} s"))
        for operation_id, message in gone:
            with self.db.session() as session:
                session.exec(update(Operation)
                             .where(Operation.id == operation_id, Operation.state == "running")
                             .values(state="interrupted", ended_at=now, error=message))
            shutil.rmtree(self.results / operation_id, ignore_errors=True)
        return [op for op, _ in gone]
