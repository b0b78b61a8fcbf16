"""`dx.train`: data-parallel training, several steps per Dask graph.

The step graph (`train.step`) is compiled once for the cluster, like any graph: its batch
axis is chunked over the workers, each chunk's gradient is a partial product that stays on
the worker that made it, and the partials are tree-summed. A run then lowers that one plan
once per step, binding each step's parameter and state placeholders to the chunk keys the
step before produced (so parameters and optimizer state stay on the workers between steps),
its scalars to the step's learning rate and bias corrections, and its batch placeholders to
the rows of the step's batch in the epoch's order (`train.data`, `train.sources`). Each
batch chunk's tasks then become one task, and the tasks combining chunks one more
(`compiler.group`); chunk s runs on worker s mod n. `steps_per_graph` steps go to the
scheduler as one graph; the next graph is submitted before the driver waits for the losses
of the one before, so the driver is never a round trip per step and the workers never wait
for it.

What the driver keeps: the futures of the last step's parameters and state; the loss,
gradient norm and metrics of every step (the history, also recorded: `train.book`). A loss
that is not finite (a diverging run, a label out of range) stops the run with an
ExecutionError naming the step.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field, replace

import numpy as np
from dask.base import tokenize

from distributed.client import FutureCancelledError

from deepx_flow.compiler.group import ALL, GROUP_SUFFIX, group_by_shard
from deepx_flow.compiler.group_workers import group_by_worker
from deepx_flow.train.pieces import chunk_bytes
from deepx_flow.compiler.placing.gather import gathered_where_used
from deepx_flow.compiler.lower import Lowered
from deepx_flow.config import LARGEST_INT, settings
from deepx_flow.errors import ExecutionError, GraphError, PlanError, shown
from deepx_flow.ir import dtypes
from deepx_flow.ir.keys import key_name, node_of
from deepx_flow.ops.common import flag
from deepx_flow.registry.live import scheduler_workers
from deepx_flow.runtime.inputs import ArraySource, KeySource
from deepx_flow.storage.readers import read_region
from deepx_flow.sdk.tensor import Tensor
from deepx_flow.train.book import Book, Saver
from deepx_flow.train.data import (EpochRows, check_batch_size, dataset_of,
                                   window_blocks_for)
from deepx_flow.train.evaluate import evaluator
from deepx_flow.train.sources import BatchSource
from deepx_flow.train.step import build_step, takes_step


# Every this many steps the driver takes the parameters and state back and the next graph
# starts from them as data: Dask keeps every task a held result descends from (to compute it
# again if a worker is lost), so without this cut the scheduler would hold every step of a
# long training, and a lost worker could mean computing them all again.
LINEAGE_STEPS = 64
# How many times a training goes back to the values the driver holds after losing others.
MAX_REWINDS = 3


@dataclass
class Fit:
    """What `dx.train` gives back.

    Attributes
    ----------
    values : dict of str to ndarray
        The trained parameters.
    history : list of dict
        One entry per step: step, epoch, loss, grad_norm, the loss function's own metrics
        (when it returns `(loss, {name: scalar})`), lr, samples_per_second, and the seconds
        since the start when its graph's results came back.
    evaluations : list of dict
        One entry per evaluation: step, epoch, the held-out loss and metrics.
    steps : int
        Steps in the run (a resumed run counts the steps before it too).
    training_id : str or None
        Its row in the metadata database (None when recording is off).
    checkpoint : str or None
        The asset version of its last checkpoint.
    placement : dict of str to str
        Where each parameter and its state lived: "replicated", "sharded" or
        "tensor_parallel" (`train.pieces`).
    """

    values: dict[str, np.ndarray]
    history: list[dict] = field(default_factory=list)
    evaluations: list[dict] = field(default_factory=list)
    steps: int = 0
    training_id: str | None = None
    checkpoint: str | None = None
    placement: dict[str, str] = field(default_factory=dict)

    @property
    def params(self) -> dict[str, Tensor]:
        """The trained parameters as tensors (graph inputs bound to their values by
        `dx.run(..., inputs=fit.inputs)`)."""
        from deepx_flow.sdk.functions import input as placeholder
        return {name: placeholder(_input_name(name), v.shape, v.dtype.name)
                for name, v in self.values.items()}

    @property
    def inputs(self) -> dict[str, np.ndarray]:
        return {_input_name(name): v for name, v in self.values.items()}

    def _facts(self) -> list[tuple[str, str]]:
        losses = [h["loss"] for h in self.history if "loss" in h]
        facts = [("steps", f"{self.steps:,}"),
                 ("loss", f"{losses[0]:.4g} -> {losses[-1]:.4g}" if losses else "-"),
                 ("parameters", f"{len(self.values)} tensors, "
                                f"{sum(v.size for v in self.values.values()):,} values")]
        if self.evaluations:
            last = self.evaluations[-1]
            facts.append(("held-out", ", ".join(f"{k} {v:.4g}" for k, v in last.items()
                                                if k not in ("step", "epoch")
                                                and isinstance(v, (int, float)))))
        facts += [("training", self.training_id or "not recorded"),
                  ("checkpoint", self.checkpoint or "-")]
        return facts

    def __repr__(self) -> str:
        return "<Fit: " + "; ".join(f"{k} {v}" for k, v in self._facts()) + ">"

    def _repr_html_(self) -> str:
        from deepx_flow.text_table import html_facts
        return html_facts("dx.train result", self._facts())


def _input_name(name: str) -> str:
    return "trained_" + "".join(c if c.isalnum() else "_" for c in name)


def train(loss_fn, params: dict, data, batch_size: int, epochs: int = 1, optimizer=None,
          seed: int = 0, steps_per_graph: int = 8, eval_data=None, eval_every: int | None = None,
          checkpoint: str | None = None, checkpoint_every: int | None = None,
          resume: bool = False, window_blocks: int | None = None,
          progress: bool | None = None, client=None, scheduler: str | None = None,
          cluster=None, db=None, plan_only: bool = False, placement: str = "auto"):
    """Train `params` to minimize `loss_fn(params, *batch)` over `data`.

    Parameters
    ----------
    loss_fn : callable
        `loss_fn(params, *columns) -> scalar Tensor`, e.g.
        `lambda p, x, y: dx.nn.cross_entropy(model(p, x), y)`, or `-> (loss, {name: scalar})`
        to record metrics of its own (accuracy) every step; with a `step` parameter it gets
        each step's number (for `dx.nn.dropout`), and `step=None` when evaluated.
    params : dict of str to Tensor or ndarray
        The starting parameters by name (`model.init(seed)`).
    data : tuple
        The training columns (features, labels, ...): NumPy arrays, `dx.read_zarr` tensors
        or Zarr paths, with one row per sample.
    batch_size : int
        Rows per step; a last part of an epoch shorter than a batch is left out.
    epochs : int
        Passes over the data.
    optimizer : dx.optim.Optimizer
        Default `dx.optim.Adam()`.
    seed : int
        The data order of epoch e depends only on (seed, e).
    steps_per_graph : int
        Steps submitted to the scheduler as one graph.
    eval_data : tuple, optional
        Held-out columns; their loss (and metrics) are computed every `eval_every` steps and
        at the end.
    checkpoint : str, optional
        An asset name: the parameters and optimizer state are stored as a version of it
        every `checkpoint_every` steps and at the end (`train.checkpoint`).
    resume : bool
        Start from the newest checkpoint in `checkpoint` of a training configured alike
        (same model, loss, optimizer and its settings, seed, batch size, data and windows),
        if there is one.
    window_blocks : int, optional
        Stored blocks (chunks of rows) per window of the data order. By default as many as
        keep two windows within a quarter of the smallest worker's memory: the order then
        depends on the cluster's memory; give it to have the same order anywhere.
    progress : bool, optional
        A progress bar with the loss (default: in notebooks and terminals).
    client, scheduler, cluster
        Where to run and what to plan for, as in `dx.run`.
    db : str or Database, optional
        The metadata database (default the configured one): the training, its runs (the
        one computing random initial parameters too), its metrics per step and its
        checkpoints are recorded there.
    plan_only : bool
        Plan the training step for `cluster` (a cluster file or spec; by default the one
        in use) and return that plan, a `StepPlan`, without computing anything: where each
        parameter and its optimizer state live, the memory per worker, the predicted step
        time and its compute/communication ratio (`plan.explain()`). The parameters'
        shapes are read from the tensors given, which are not computed.

    placement : str
        Where the parameters and their optimizer state live (`compiler/placing`): "auto"
        keeps them whole on every worker (data parallelism) while that fits the workers'
        memory, and otherwise lets the placement pass split the largest along an axis, one
        piece per worker (`train.pieces`); "replicated", "sharded" and "tensor_parallel"
        ask for one strategy for every parameter it applies to.

    Returns
    -------
    Fit, or StepPlan with `plan_only`.
    """
    from deepx_flow.optim import Adam
    from deepx_flow.runtime.progress import wanted
    from deepx_flow.meta import open_db
    from deepx_flow.runtime.run import cluster_spec, lasting_client
    optimizer = Adam() if optimizer is None else optimizer
    _check_arguments(loss_fn, optimizer, epochs, steps_per_graph, eval_data, eval_every, seed,
                     checkpoint, checkpoint_every, resume)
    show = wanted(progress)
    dataset = dataset_of(data)
    check_batch_size(dataset, batch_size)
    _check_placement(placement)
    if flag(plan_only, "plan_only"):
        return _plan_only(loss_fn, params, dataset, batch_size, optimizer, client, scheduler,
                          cluster, placement)
    schedule = _schedule(dataset, batch_size, epochs)
    planned = cluster_spec(cluster) if cluster is not None else None
    active = lasting_client(client, scheduler)
    spec = planned or cluster_spec(None, active)
    values = _start_values(params, active, spec, open_db(db) if settings().record else None)
    shapes = {k: (v.shape, v.dtype.name) for k, v in values.items()}
    columns = [((batch_size,) + c.shape[1:], c.dtype) for c in dataset.columns]
    stepped = takes_step(loss_fn)

    def traced_step(number: int):
        f = (lambda p, *c: loss_fn(p, *c, step=number)) if stepped else loss_fn
        return build_step(f, shapes, optimizer, columns)

    step = traced_step(1)
    split = _split_plan(step, spec, active, placement)
    plan_of = _planner(step, traced_step if stepped else None, spec, split)
    plan, step = plan_of(1)
    pieces = None
    if split is not None:
        from deepx_flow.train.pieces import Pieces
        pieces = Pieces.of(plan, split.splits, scheduler_workers(active))
    if window_blocks is None:
        limit = min((w.memory for w in spec.workers), default=2**30)
        window_blocks = window_blocks_for(dataset, limit)
    book = Book.open(db, checkpoint, step, seed, batch_size, dataset, optimizer, epochs,
                      len(schedule), window_blocks)
    runner = None
    from tqdm.auto import tqdm
    bar = tqdm(total=len(schedule), desc="train", unit="step", disable=not show)
    try:
        evaluate = evaluator(loss_fn, values, eval_data, active, spec, book.db) \
            if eval_data else None
        # in pieces, read where they are used: the driver never holds them whole
        start_values = book.resume_values(len(schedule), in_place=pieces is not None) \
            if resume else None
        done = book.resumed_step if start_values else 0
        bar.update(done)
        order = EpochRows(dataset, seed, window_blocks, batch_size)
        runner = _Runner(plan_of if stepped else (lambda n: (plan, step)), step, dataset,
                         active, optimizer, values, order, start_values, done, pieces,
                         _placed(step, spec, split))
        saver = Saver(book, step, spec, active) if checkpoint else None
        fit = Fit(values={}, training_id=book.training_id,
                  placement={p.parameter.name: p.strategy for p in split.placement.placed}
                  if split is not None else {name: "replicated" for name in step.params})
        started = time.perf_counter()
        marks = [m for m in (eval_every if evaluate else None, checkpoint_every) if m]
        marks.append(LINEAGE_STEPS)
        _run_to_the_end(runner, schedule, done, steps_per_graph, marks, fit, started, bar,
                        book, batch_size, evaluate, eval_every, saver, checkpoint_every)
        fit.checkpoint = fit.checkpoint or book.resumed_from
        fit.steps = len(schedule)
    except BaseException as err:
        if runner is not None:
            runner.release(err)
        book.end("failed", f"{type(err).__name__}: {err}")
        raise
    finally:
        bar.close()
    runner.release()
    book.end("succeeded")
    return fit


def _run_to_the_end(runner, schedule, done, steps_per_graph, marks, fit, started, bar, book,
                    batch_size, evaluate, eval_every, saver, checkpoint_every) -> None:
    """Take the steps after the first `done` and the last evaluation, checkpoint and
    parameters; after a lost worker took values no task can compute again, go back to the
    last cut and take the steps from there again (at most MAX_REWINDS
    times)."""
    rewinds = 0
    while True:
        try:
            _steps(runner, schedule, done, steps_per_graph, marks, fit, started, bar, book,
                   batch_size, evaluate, eval_every, saver, checkpoint_every)
            last = schedule[-1]
            if evaluate and (not fit.evaluations
                             or fit.evaluations[-1]["step"] != last.number):
                _record_eval(fit, evaluate(runner.current()), last, book)
            if saver and book.saved_step != last.number:
                fit.checkpoint = saver.save(runner, last)
            fit.values = runner.gather()
            return
        except (FutureCancelledError, ExecutionError) as err:
            if not _lost(err):
                raise
            # A worker was lost holding values no task can compute again (Dask had let
            # go of the steps before them): go back to the last cut (values the driver
            # holds, or stored) and take the steps from there again; they give the same
            # numbers.
            rewinds += 1
            if rewinds > MAX_REWINDS:
                raise ExecutionError(f"the training lost values it could not compute "
                                     f"again {rewinds} times: {err}") from err
            if runner.pieces is not None:  # a lost worker's replacement has a new address
                from deepx_flow.train.pieces import running_workers
                runner.pieces = runner.pieces.on(running_workers(runner.client) or
                                                 runner.pieces.workers)
            done = runner.rewind()
            book.rewind(done)
            fit.history = [h for h in fit.history if h["step"] <= done]
            fit.evaluations = [e for e in fit.evaluations if e["step"] <= done]
            bar.n = done
            bar.refresh()


def _steps(runner, schedule, done, steps_per_graph, marks, fit, started, bar, book,
           batch_size, evaluate, eval_every, saver, checkpoint_every) -> None:
    """Take the steps after the first `done`: graphs of steps submitted ahead, their results
    collected, evaluations, checkpoints and lineage cuts where they fall."""
    pending = None
    for segment in _segments(done, len(schedule), steps_per_graph, marks):
        submitted = runner.submit([schedule[i] for i in segment], book)
        if pending is not None:
            _collect(pending, fit, started, bar, book, batch_size)
        pending = submitted
        last = schedule[segment[-1]]
        at_eval = evaluate and eval_every and last.number % eval_every == 0
        at_save = saver and checkpoint_every and last.number % checkpoint_every == 0
        at_cut = last.number % LINEAGE_STEPS == 0
        if at_eval or at_save or at_cut:
            _collect(pending, fit, started, bar, book, batch_size)
            pending = None
        if at_cut:
            runner.cut(last.number)
        if at_eval:
            _record_eval(fit, evaluate(runner.current()), last, book)
        if at_save:
            fit.checkpoint = saver.save(runner, last)
    if pending is not None:
        _collect(pending, fit, started, bar, book, batch_size)


@dataclass(frozen=True)
class _Planned:
    """One step of the run: its number (from 1), epoch, and batch within the epoch."""

    number: int
    epoch: int
    batch: int


@dataclass(frozen=True)
class _Schedule:
    """Every step of the run, each epoch `per_epoch` full batches: a sequence whose steps are
    made when asked for (a training may have more steps than memory holds)."""

    per_epoch: int
    epochs: int

    def __len__(self) -> int:
        return self.per_epoch * self.epochs

    def __getitem__(self, i: int) -> _Planned:
        i = i + len(self) if i < 0 else i
        if not 0 <= i < len(self):
            raise IndexError(i)
        return _Planned(i + 1, i // self.per_epoch, i % self.per_epoch)


def _schedule(dataset, batch_size, epochs) -> _Schedule:
    """Every step of the run: each epoch is `rows // batch_size` full batches. Steps are
    numbered in the metadata database's 64-bit integers: more is a GraphError."""
    per_epoch = dataset.rows // batch_size
    if per_epoch * epochs > LARGEST_INT:
        raise GraphError(f"epochs={shown(epochs)} of {per_epoch:,} steps each is more steps "
                         f"than the metadata database numbers (2**63 - 1)")
    return _Schedule(per_epoch, epochs)


def _segments(start: int, n: int, per_graph: int, marks: list[int]):
    """Runs of step indices from `start`: at most `per_graph` long, ending at every step
    whose number (index + 1) is a multiple of a mark (evaluations, checkpoints)."""
    while start < n:
        end = min(n, start + per_graph)
        for mark in marks:
            end = min(end, (start // mark + 1) * mark)
        yield list(range(start, end))
        start = end


class _Runner:
    """Lowers and submits graphs of steps, and holds the futures between them."""

    def __init__(self, plan_of, step, dataset, client, optimizer, values, order,
                 resumed=None, done: int = 0, pieces=None, placed: str = ""):
        self.plan_of, self.step, self.dataset, self.order = plan_of, step, dataset, order
        # The parameters' placement, as `StepPlan.explain` has it: each graph's recorded
        # plan starts with it, so the dashboard shows it with the plan.
        self.placed = placed
        self.client, self.optimizer = client, optimizer
        # The parameters in pieces over the workers (`train.pieces`), and the futures of
        # the pieces sent to them; None when every worker holds them whole.
        self.pieces, self.sent = pieces, []
        self.names = {**step.params, **step.state}
        self.sources = {}
        start = {}
        for name, input_id in self.names.items():
            if resumed is not None:
                start[input_id] = resumed[input_id]
            elif name in values:
                start[input_id] = values[name]
            else:  # optimizer state starts at zero
                node = step.graph[input_id]
                start[input_id] = np.zeros(node.shape, node.dtype)
        self.rewinds = 0
        self.cut_folder = None  # the latest cut stored (`train.stored_cut`), if any
        self._bind(start, done)
        self.held: dict = {}  # key -> future: the last step's outputs
        self.recorders: list = []  # of the graphs submitted whose runs may not have ended
        # Columns held in memory go to every worker once; stored ones are read there.
        self.scope = uuid.uuid4().hex
        self.data = self._send_columns()

    def _send_columns(self) -> list:
        """The in-memory data columns, sent to every worker (None for stored columns)."""
        return [self.client.scatter(c.array, broadcast=True, hash=False)
                if c.array is not None else None for c in self.dataset.columns]

    def submit(self, planned: list, book):
        from deepx_flow.runtime.run import _submit
        dsk: dict = {}
        reported = ["loss", "grad_norm"] + ["metric_" + m for m in self.step.metrics]
        keys: dict = {name: [] for name in reported}
        lowered = first = None
        roots: dict = {}
        pinned: dict = {}
        for index, p in enumerate(planned):
            plan, _ = self.plan_of(p.number)
            first = first or plan
            sources = dict(self.sources)
            for k, value in self.optimizer.scalars(p.number).items():
                scalar = np.array(value, dtype=np.float64)
                sources[self.step.scalars[k]] = ArraySource(scalar, tokenize(scalar))
            rows = self.order.rows(p.epoch, p.batch)
            for i, input_id in enumerate(self.step.batch):
                data = self.data[i]
                sources[input_id] = BatchSource(
                    self.dataset.columns[i], rows, None if data is None else data.key,
                    self.scope, tokenize(self.dataset.token, rows, i))
            lowered = plan.lower(sources, to_host=plan.cluster.has_devices)
            dsk.update(lowered.dsk)
            if self.pieces is not None:
                pinned.update(self.pieces.placement(lowered, sources))
                # the batch's chunks dealt to the workers, so the data stays parallel
                workers = self.pieces.workers
                pinned.update({key: workers[shard % len(workers)] for key, shard in
                               self._shards(lowered, plan).items()})
            else:
                roots.update({key: (index, shard)
                              for key, shard in self._shards(lowered, plan).items()})
            for name in reported:
                keys[name] += lowered.output_keys(name)
            for input_id in self.names.values():
                key, chunks = lowered.outputs["new_" + input_id]
                self.sources[input_id] = KeySource(key, chunks, self.step.graph[input_id].dtype)
        keep = {k for name in reported for k in keys[name]}
        keep |= {k for i in self.names.values() for k in lowered.output_keys("new_" + i)}
        # Named after no node: a group runs many operators, none of whose settings is its own.
        token = key_name(keys["loss"][-1]).split("@")[-1]
        if self.pieces is None:
            dsk = group_by_shard(dsk, roots, keep, f"train-step-{token}")
            pinned = self._placement(dsk)
        else:
            # Each worker's tasks between two exchanges as one task, holding at most half a
            # task's budget: what a group reads stays in memory until all of it has run.
            dsk, pinned = group_by_worker(dsk, pinned, keep, f"train-step-{token}",
                                          chunk_bytes(first), first.partition.budget // 2)
        merged = Lowered(dsk, lowered.outputs)
        futures, _, recorder, extra = _submit(
            first, self.step.graph, {}, self.client, "train",
            hold={"new_" + i for i in self.names.values()},
            extend=lambda _: [k for name in reported for k in keys[name]], lowered=merged,
            db=book.db, placement=pinned,
            explain=f"{self.placed}\n\n{first.explain()}"
            if self.placed and settings().record else None)
        old = self.held
        self.held = {f.key: f for fs in futures.values() for f in fs}
        for f in old.values():
            f.release()
        if recorder is not None:
            book.link(recorder.run_id)
            recorder.watch(extra)  # ends once its losses are computed
            self.recorders = [r for r in self.recorders if r.status == "running"]
            self.recorders.append(recorder)
        n = len(planned)
        by_name = {name: extra[i * n:(i + 1) * n] for i, name in enumerate(reported)}
        return planned, by_name, self.optimizer

    def _placement(self, dsk) -> dict:
        """Shard s of every step on worker s mod n (their rows split over the workers);
        left to itself, Dask would run every shard where the parameters were updated."""
        workers = sorted(scheduler_workers(self.client))
        if len(workers) < 2:
            return {}
        return {key: workers[int(key[2]) % len(workers)] for key in dsk
                if key_name(key).endswith(GROUP_SUFFIX) and key[2] != ALL}

    def _shards(self, lowered, plan) -> dict:
        """The step's batch chunk keys with their shard: the chunk of the first column (the
        features) their rows lie in; a chunk of another column spanning several of those
        belongs to none."""
        chunks = plan.partition.chunks
        bounds = np.cumsum((0,) + chunks[self.step.batch[0]][0])
        starts = {i: np.cumsum((0,) + chunks[i][0]) for i in self.step.batch}
        roots = {}
        for key in lowered.dsk:
            input_id = node_of(key_name(key))
            if input_id in starts and len(key) > 1:
                lo, hi = starts[input_id][key[1]], starts[input_id][key[1] + 1]
                shard = int(np.searchsorted(bounds, lo, side="right")) - 1
                if hi <= bounds[shard + 1]:
                    roots[key] = shard
        return roots

    def cut(self, number: int) -> None:
        """Bind the parameters and state to their values after step `number`, as data (see
        LINEAGE_STEPS), and let go of the steps that made them. Split inputs are stored
        by the workers that hold their pieces (`train.stored_cut`); the rest the driver
        takes back."""
        from deepx_flow.train import stored_cut
        split = [i for i in self.names.values() if self.pieces is not None
                 and i in self.pieces.splits and isinstance(self.sources[i], KeySource)]
        stored, folder = {}, self.cut_folder
        try:
            if split:
                folder = f"{stored_cut.cuts_folder(self.scope)}/{number}-{self.rewinds}"
                shapes = {i: self.step.graph[i].shape for i in split}
                stored = stored_cut.store(self.client, self.held,
                                          {i: self.sources[i] for i in split}, shapes, folder)
            rest = [i for i in self.names.values() if i not in stored]
            self._bind({**self._values(rest), **stored}, number)
        except BaseException:
            if folder != self.cut_folder:  # the cut before stays what a rewind goes to
                stored_cut.remove(folder)
            raise
        for f in self.held.values():
            f.release()
        self.held = {}
        if folder != self.cut_folder:  # the cut before is read by no input now
            stored_cut.remove(self.cut_folder)
            self.cut_folder = folder

    def rewind(self) -> int:
        """Go back to the values of the last cut (or the start); the steps done then."""
        for f in self.held.values():
            f.release()
        self.held = {}
        # The steps taken again get keys of their own: the same keys as the futures just
        # cancelled could be cancelled with them while the scheduler lets go of those.
        self.rewinds += 1
        # The columns sent to the workers may be what was lost: Dask keeps one copy of data
        # no task computes (its memory manager drops the others), so send them again.
        for f in self.data:
            if f is not None:
                f.release()
        self.data = self._send_columns()
        number, arrays = self.restart
        self._bind(arrays, number)
        return number

    def _bind(self, arrays: dict, number: int) -> None:
        """Bind the inputs to `arrays` (input id -> array), the values after step `number`,
        which travel inside the next graph: the scheduler can send them again to whichever
        worker needs them, also after a worker is lost. They are the point `rewind` goes
        back to."""
        self.restart = (number, dict(arrays))
        sent, self.sent = self.sent, []
        try:
            for input_id, array in arrays.items():
                if not isinstance(array, np.ndarray):  # stored (a cut, a checkpoint):
                    self.sources[input_id] = replace(  # read where it is used
                        array, token=tokenize(array.token, self.rewinds))
                    continue
                token = tokenize(array, self.rewinds)
                if self.pieces is not None and input_id in self.pieces.splits:
                    # Each piece straight to its worker: whole, it would go through the
                    # scheduler to every worker that reads a piece of it.
                    self.sources[input_id], futures = self._send(
                        input_id, array, f"{input_id}-start-{token}")
                    self.sent += futures
                else:
                    self.sources[input_id] = ArraySource(array, token)
        finally:
            for f in sent:
                f.release()
        self.bound = dict(self.sources)

    def _send(self, input_id, array, key):
        """Send a split input's pieces to their workers; where one is gone or stays paused,
        deal every piece again to the workers running then (the pieces sent before go
        where they were: a task reads a piece wherever it is)."""
        from deepx_flow.train.pieces import SEND_ATTEMPTS, running_workers
        for attempt in range(SEND_ATTEMPTS):
            try:  # (each try under keys of its own: the last try's may still be let go)
                return self.pieces.send(self.client, input_id, array, f"{key}-{attempt}")
            except (TimeoutError, OSError, KeyError) as err:
                # the scheduler's answers for a worker paused or gone (a KeyError names
                # its address); anything else is no reason to try again
                if isinstance(err, KeyError) and "://" not in str(err):
                    raise
                failed = err
                time.sleep(min(2.0 ** attempt, 8.0))
                workers = running_workers(self.client)
                if workers:
                    self.pieces = self.pieces.on(workers)
        raise ExecutionError(f"could not send the pieces of {input_id!r} to the workers "
                             f"after {SEND_ATTEMPTS} tries: {type(failed).__name__}: "
                             f"{failed}") from failed

    def _values(self, input_ids) -> dict:
        from deepx_flow.runtime.run import _gather
        out = {}
        for input_id in input_ids:
            source = self.sources[input_id]
            node = self.step.graph[input_id]
            if isinstance(source, ArraySource):
                out[input_id] = source.array
                continue
            if self.bound.get(input_id) is source:  # bound by `_bind`: no step since
                out[input_id] = _whole(self.restart[1][input_id], node.shape)
                continue
            futures = [self.held[k] for k in Lowered({}, {"x": (source.key, source.chunks)})
                       .output_keys("x")]
            out[input_id] = _gather(self.client, futures, node.shape, node.dtype,
                                    source.chunks)
        return out

    def current(self) -> dict:
        """The latest parameters as sources (what an evaluation reads)."""
        return {name: self.sources[input_id] for name, input_id in self.step.params.items()}

    def current_inputs(self) -> dict:
        """Input id -> source of the latest parameters and state (what a checkpoint packs)."""
        return {input_id: self.sources[input_id] for input_id in self.names.values()}

    def gather(self) -> dict[str, np.ndarray]:
        """The latest parameters, by name."""
        values = self._values(self.step.params.values())
        return {name: values[input_id] for name, input_id in self.step.params.items()}

    def release(self, err: BaseException | None = None) -> None:
        """Let go of what the cluster holds for the training, and end the run of every
        graph it submitted: each has ended once its losses are computed (a graph whose
        futures were cancelled, as interrupted); those still going when the training stops
        with `err` fail with it (interrupted, for Ctrl-C). None is left `running`."""
        for recorder in self.recorders:
            if err is not None:
                recorder.fail(err)  # a run that has ended already keeps its outcome
            elif not recorder.finish_if_done():
                recorder.finish("the training ended before this graph's steps were done",
                                status="interrupted")
        self.recorders = []
        for f in list(self.held.values()) + [d for d in self.data if d is not None] + \
                self.sent:
            f.release()
        self.held, self.data, self.sent = {}, [], []
        if self.pieces is not None:  # its stored cuts, and any a failed cut left
            from deepx_flow.train import stored_cut
            stored_cut.remove(stored_cut.cuts_folder(self.scope))
            self.cut_folder = None


def _whole(value, shape) -> np.ndarray:
    """A bound value read whole: an array, or what a cut or a checkpoint stored."""
    from deepx_flow.train.checkpoint import PackedSource, read_packed
    whole = tuple((0, n) for n in shape)
    if isinstance(value, PackedSource):
        return read_packed(*value.where, whole)
    return value if isinstance(value, np.ndarray) else read_region(value.path, whole)


def _lost(err: BaseException) -> bool:
    """Whether `err` says Dask cancelled what the run waited for because values it needed
    were lost with a worker and cannot be computed again (gathering raises that as the
    cause of an ExecutionError), or that a cut could not be stored for that reason."""
    from deepx_flow.train.stored_cut import ValuesLost
    return isinstance(err, (FutureCancelledError, ValuesLost)) or \
        isinstance(err.__cause__, FutureCancelledError)


def _collect(submitted, fit: Fit, started: float, bar, book, batch_size: int) -> None:
    """Wait for a graph's losses, gradient norms and metrics; add them to the history and
    the database; raise on a loss that is not finite."""
    planned, by_name, optimizer = submitted
    futures = [f for fs in by_name.values() for f in fs]
    values = futures[0].client.gather(futures) if futures else []
    n = len(planned)
    got = {name: values[i * n:(i + 1) * n] for i, name in enumerate(by_name)}
    now = time.perf_counter() - started
    before = fit.history[-1]["seconds"] if fit.history else 0.0
    rate = n * batch_size / max(now - before, 1e-9)
    rows = []
    for j, p in enumerate(planned):
        entry = {"step": p.number, "epoch": p.epoch,
                 **{name.removeprefix("metric_"): float(np.asarray(got[name][j]))
                    for name in by_name},
                 "lr": optimizer.scalars(p.number)["lr"], "samples_per_second": rate,
                 "seconds": now}
        fit.history.append(entry)
        rows += [(p.number, p.epoch, k, v) for k, v in entry.items()
                 if k not in ("step", "epoch", "seconds") and math.isfinite(v)]
        loss = entry["loss"]
        if not math.isfinite(loss):
            book.metrics(rows, p.number - 1)
            raise ExecutionError(f"the loss is {loss} at step {p.number} (epoch {p.epoch}, "
                                 f"batch {p.batch}): the run diverged or a label is out of "
                                 "range; lower the learning rate or check the data")
    book.metrics(rows, planned[-1].number if planned else None)
    if planned:
        bar.update(n)
        bar.set_postfix(loss=f"{fit.history[-1]['loss']:.4g}", refresh=False)


def _record_eval(fit: Fit, scores: dict, planned, book) -> None:
    fit.evaluations.append({"step": planned.number, "epoch": planned.epoch, **scores})
    book.metrics([(planned.number, planned.epoch, "eval_" + name, value)
                  for name, value in scores.items()])


def _planner(step, traced_step, spec, split):
    """`plan_of(number)`: the step graph and plan of step `number`, one for all steps
    unless `traced_step` traces each step's own (a loss taking the step: dropout's masks).
    With `split` (a StepPlan in pieces) the step compiles with its splits and regrids, in
    the memory its parameters leave."""
    from deepx_flow.runtime.plan_cache import cached_compile
    # One batch chunk per worker thread: each shard's group then holds all of that thread's
    # rows, and the update copied into every group runs once per thread (`compiler.group`).
    # (The floors on a chunk's size stay: without them the planner also splits the
    # parameters' axes, into more and slower matmuls.)
    step_settings = replace(settings(), chunks_per_thread=1)
    compile_spec, splits, gathered = spec, {}, set()
    if split is not None:
        from deepx_flow.train.step_plan import less_memory
        compile_spec = less_memory(spec, split.placement.kept + split.activations)
        step_settings = replace(step_settings, max_tasks=step_settings.max_tasks *
                                len(spec.workers))
        splits, gathered = split.splits, split.gathered

    def plan_of(number: int):
        traced = step if number == 1 or traced_step is None else traced_step(number)
        plan = cached_compile(gathered_where_used(traced.graph, gathered), compile_spec,
                              step_settings, splits=splits)
        return (plan if plan.cluster is spec else replace(plan, cluster=spec)), traced
    return plan_of


def _check_placement(placement) -> None:
    from deepx_flow.compiler.placing.choose import STRATEGIES
    if placement != "auto" and placement not in STRATEGIES:
        raise GraphError(f"placement must be 'auto' or one of {', '.join(STRATEGIES)}, got "
                         f"{shown(placement)}")


def _split_plan(step, spec, client, placement: str):
    """The step planned with its parameters in pieces (`train.step_plan`), or None where
    they stay whole on every worker: on one worker, with placement="replicated", and with
    "auto" while they fit whole (and where no placement fits: the step's own plan then
    says why). A placement asked for that cannot be made raises its PlanError."""
    from deepx_flow.compiler.placing import place_parameters
    from deepx_flow.train.step_plan import plan_step
    workers = len(scheduler_workers(client))
    if placement == "replicated" or workers < 2 or len(spec.workers) < 2:
        return None
    if placement == "auto":
        try:
            place_parameters(step.graph, step.params, step.state, spec, strategy="replicated")
            return None
        except PlanError:
            pass
        try:
            planned = plan_step(step.graph, step.params, step.state, spec)
        except PlanError:
            return None
    else:
        planned = plan_step(step.graph, step.params, step.state, spec, placement=placement)
    return planned if planned.splits else None


def _placed(step, spec, split) -> str:
    """What the placement pass says of the parameters: the split plan's placement, or all
    of them replicated ("" where even that cannot be said: the step's plan then says why)."""
    from deepx_flow.compiler.placing import place_parameters
    if split is not None:
        return split.placement.explain()
    try:
        return place_parameters(step.graph, step.params, step.state, spec,
                                strategy="replicated").explain()
    except PlanError:
        return ""


def _plan_only(loss_fn, params, dataset, batch_size, optimizer, client, scheduler, cluster,
               placement="auto"):
    """The training step planned for the cluster (`train.step_plan`), nothing computed."""
    from deepx_flow.runtime.run import cluster_spec, lasting_client
    from deepx_flow.train.step_plan import plan_step
    spec = cluster_spec(cluster) if cluster is not None else \
        cluster_spec(None, lasting_client(client, scheduler))
    shapes = {name: _shape_of(name, value) for name, value in _named(params).items()}
    columns = [((batch_size,) + c.shape[1:], c.dtype) for c in dataset.columns]
    f = (lambda p, *c: loss_fn(p, *c, step=1)) if takes_step(loss_fn) else loss_fn
    step = build_step(f, shapes, optimizer, columns)
    return plan_step(step.graph, step.params, step.state, spec, placement=placement)


def _named(params) -> dict:
    """`params`, checked to be a dict of named values (not yet the values)."""
    if not isinstance(params, dict) or not params:
        raise GraphError(f"params must be a dict of named tensors or arrays, got "
                         f"{shown(params)}")
    for name in params:
        if not isinstance(name, str) or not name:
            raise GraphError(f"parameter names are non-empty strings, got {shown(name)}")
    return params


def _shape_of(name: str, value) -> tuple[tuple[int, ...], str]:
    """A parameter's shape and dtype, read without computing it."""
    if not (hasattr(value, "shape") and hasattr(value, "dtype")):  # (Tensor, NumPy, Zarr)
        value = np.asarray(value)
    shape, dtype = value.shape, dtypes.normalize(value.dtype)
    _check_float(name, dtype)
    return tuple(int(s) for s in shape), dtype


def _check_float(name: str, dtype) -> None:
    if not dtypes.is_float(dtype):
        raise GraphError(f"parameter {shown(name)} is {dtype}; only floating-point "
                         "parameters are trained")


def _start_values(params: dict, client, spec, db=None) -> dict[str, np.ndarray]:
    """The starting parameters as arrays: tensors (random initializers) are computed on
    `client` (planned for `spec`), in a run recorded in `db` (the training's database)."""
    from deepx_flow.runtime.inputs import is_zarr_array
    from deepx_flow.storage.verify import read_opened
    names = [k for k, v in _named(params).items() if isinstance(v, Tensor)]
    computed = dict(zip(names, _computed([params[k] for k in names], client, spec, db))) \
        if names else {}
    out = {}
    for name, value in params.items():
        if is_zarr_array(value):  # a chunk not stored is an error, as for any input
            value = read_opened(value, f"parameter {shown(name)}: the Zarr array given")
        array = computed[name] if name in computed else np.asarray(value)
        _check_float(name, array.dtype)
        out[name] = array
    return out


def _computed(tensors: list, client, spec, db) -> list[np.ndarray]:
    """`dx.run(tensors)`, its run recorded in `db` (default: the configured database)."""
    from deepx_flow.runtime.plan_cache import cached_compile
    from deepx_flow.runtime.run import _compute, check_gatherable
    from deepx_flow.sdk.run import checked
    graph, bound = checked(tensors)
    check_gatherable({name: (graph[node].shape, graph[node].dtype)
                      for name, node in graph.outputs})
    out = _compute(cached_compile(graph, spec), graph, bound, client, False, db=db)
    return [out[name] for name, _ in graph.outputs]


def _check_arguments(loss_fn, optimizer, epochs, steps_per_graph, eval_data, eval_every, seed,
                     checkpoint, checkpoint_every, resume) -> None:
    """GraphError naming the first argument of `train` that it cannot take."""
    from deepx_flow.optim import Optimizer
    if not isinstance(optimizer, Optimizer):
        raise GraphError(f"optimizer must be a dx.optim optimizer (dx.optim.Adam(), ...), got "
                         f"{type(optimizer).__name__} {shown(optimizer)}")
    if not callable(loss_fn):
        raise GraphError(f"loss_fn must be a function of (params, *columns), got "
                         f"{type(loss_fn).__name__} {shown(loss_fn)}")
    for name, value in (("epochs", epochs), ("steps_per_graph", steps_per_graph)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise GraphError(f"{name} must be a positive integer, got {shown(value)}")
    for name, value in (("eval_every", eval_every), ("checkpoint_every", checkpoint_every)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < 1):
            raise GraphError(f"{name} must be a positive integer, got {shown(value)}")
    if eval_every is not None and eval_data is None:
        raise GraphError("eval_every needs eval_data (the held-out columns)")
    if (checkpoint_every is not None or resume) and checkpoint is None:
        raise GraphError("checkpoint_every and resume need checkpoint= (the asset name the "
                         "checkpoints are versions of)")
    if checkpoint is not None and (not isinstance(checkpoint, str)
                                   or not checkpoint.isidentifier()):
        raise GraphError(f"checkpoint must be an asset name (an identifier), got "
                         f"{shown(checkpoint)}")
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= LARGEST_INT:
        raise GraphError(f"seed must be an integer from 0 to 2**63 - 1 (the metadata "
                         f"database records it), got {shown(seed)}")
