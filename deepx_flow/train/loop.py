"""`dx.train`: data-parallel training, several steps per Dask graph.

The step graph (`train.step`) is compiled once for the cluster, like any graph: its batch
axis is chunked over the workers, each chunk's gradient is a partial product that stays on
the worker that made it, and the partials are tree-summed. A run then lowers that one plan
once per step, binding each step's parameter and state placeholders to the chunk keys the
step before produced (so parameters and optimizer state stay on the workers between steps),
its scalars to the step's learning rate and bias corrections, and its batch placeholders to
slices of the epoch's shuffled windows (`train.data`). `steps_per_graph` steps go to the
scheduler as one graph; the next graph is submitted before the driver waits for the losses
of the one before, so the driver is never a round trip per step and the workers never wait
for it.

What the driver keeps: the futures of the last step's parameters and state, and of the
windows a later graph still reads; the loss and gradient norm of every step (the history).
A loss that is not finite (a diverging run, a label out of range) stops the run with an
ExecutionError naming the step.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
from dask.base import tokenize

from deepx_flow.compiler.lower import Grid, Lowered
from deepx_flow.compiler.taskspec import data_node, ref, task
from deepx_flow.config import settings
from deepx_flow.errors import ExecutionError, GraphError, shown
from deepx_flow.kernels.tasks import cast_chunk, to_device
from deepx_flow.runtime.inputs import ArraySource
from deepx_flow.sdk.tensor import Tensor
from deepx_flow.train.data import (batch_pieces, check_batch_size, dataset_of, epoch_order,
                                   window_blocks_for)
from deepx_flow.train.step import build_step


@dataclass(frozen=True)
class KeySource:
    """A placeholder bound to the chunks of a tensor computed earlier (the step before)."""

    key: str
    chunks: tuple
    dtype: str

    @property
    def token(self) -> str:
        return self.key

    def task(self, key, region):
        layout, keys = Grid(self.chunks).layout(self.key, region)
        return task(key, cast_chunk, self.dtype, (layout,), *[ref(k) for k in keys])


@dataclass(frozen=True)
class BatchSource:
    """A batch placeholder bound to rows of the epoch's windows: `pieces` are (window key,
    first row, end row) runs that make up the batch, in order."""

    pieces: tuple
    token: str

    def task(self, key, region):
        (lo, hi), rest = region[0], region[1:]
        parts, at = [], 0
        for window_key, a, z in self.pieces:
            n = z - a
            s, e = max(lo, at), min(hi, at + n)
            if s < e:
                parts.append((window_key, a + s - at, a + e - at))
            at += n
        return task(key, take_rows, tuple((a, z) for _, a, z in parts), rest,
                    *[ref(k) for k, _, _ in parts])


def take_rows(spans, rest, *windows):
    """Rows `spans` of each window, joined, and the region `rest` of the other axes."""
    tail = tuple(slice(lo, hi) for lo, hi in rest)
    blocks = [w[(slice(a, z),) + tail] for (a, z), w in zip(spans, windows)]
    return to_device(blocks[0] if len(blocks) == 1 else np.concatenate(blocks))


def load_window(column, index):
    """One window of a stored column: its rows `index`, read by the worker."""
    return to_device(column.rows(index))


@dataclass
class Fit:
    """What `dx.train` gives back.

    Attributes
    ----------
    values : dict of str to ndarray
        The trained parameters.
    history : list of dict
        One entry per step: step, epoch, loss, grad_norm, lr, and the seconds since the
        start when its graph's results came back.
    evaluations : list of dict
        One entry per evaluation: step, epoch and the held-out loss.
    steps : int
        Steps taken.
    """

    values: dict[str, np.ndarray]
    history: list[dict] = field(default_factory=list)
    evaluations: list[dict] = field(default_factory=list)
    steps: int = 0

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


def _input_name(name: str) -> str:
    return "trained_" + "".join(c if c.isalnum() else "_" for c in name)


def train(loss_fn, params: dict, data, batch_size: int, epochs: int = 1, optimizer=None,
          seed: int = 0, steps_per_graph: int = 8, eval_data=None, eval_every: int | None = None,
          progress: bool | None = None, client=None, scheduler: str | None = None,
          cluster=None) -> Fit:
    """Train `params` to minimize `loss_fn(params, *batch)` over `data`.

    Parameters
    ----------
    loss_fn : callable
        `loss_fn(params, *columns) -> scalar Tensor`, e.g.
        `lambda p, x, y: dx.nn.cross_entropy(model(p, x), y)`.
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
        Held-out columns; their loss is computed every `eval_every` steps and at the end.
    progress : bool, optional
        A progress bar with the loss (default: in notebooks and terminals).
    client, scheduler, cluster
        Where to run and what to plan for, as in `dx.run`.
    """
    from deepx_flow.optim import Adam
    from deepx_flow.runtime.run import _interactive, cluster_spec, lasting_client
    optimizer = optimizer or Adam()
    _check_settings(epochs, steps_per_graph, eval_data, eval_every, seed)
    dataset = dataset_of(data)
    check_batch_size(dataset, batch_size)
    active = lasting_client(client, scheduler)
    spec = cluster_spec(cluster, active)
    values = _start_values(params, active)
    step = build_step(loss_fn, {k: (v.shape, v.dtype.name) for k, v in values.items()},
                      optimizer, [((batch_size,) + c.shape[1:], c.dtype)
                                  for c in dataset.columns])
    from deepx_flow.runtime.plan_cache import cached_compile
    plan = cached_compile(step.graph, spec, settings())
    evaluate = _evaluator(loss_fn, values, eval_data, active, spec) if eval_data else None
    limit = min((w.memory for w in spec.workers), default=2**30)
    window_blocks = window_blocks_for(dataset, limit, len(spec.workers))

    schedule, windows = _schedule(dataset, batch_size, epochs, seed, window_blocks)
    show = progress if progress is not None else _interactive()
    runner = _Runner(plan, step, dataset, active, optimizer, values, schedule, windows)
    fit = Fit(values={})
    started = time.perf_counter()
    from tqdm.auto import tqdm
    bar = tqdm(total=len(schedule), desc="train", unit="step", disable=not show)
    try:
        pending = None
        for segment in _segments(len(schedule), steps_per_graph, eval_every):
            submitted = runner.submit([schedule[i] for i in segment], segment)
            if pending is not None:
                _collect(pending, fit, started, bar)
            pending = submitted
            if evaluate and eval_every and (segment[-1] + 1) % eval_every == 0:
                _collect(pending, fit, started, bar)
                pending = None
                _record_eval(fit, evaluate(runner.current()), schedule[segment[-1]])
        if pending is not None:
            _collect(pending, fit, started, bar)
        fit.values = runner.gather()
        fit.steps = len(schedule)
        if evaluate and (not fit.evaluations or fit.evaluations[-1]["step"] != fit.steps):
            _record_eval(fit, evaluate(runner.current()), schedule[-1])
    except BaseException:
        runner.release()
        raise
    finally:
        bar.close()
    runner.release()
    return fit


@dataclass(frozen=True)
class _Planned:
    """One step of the run: its number (from 1), epoch, and batch pieces."""

    number: int
    epoch: int
    batch: int
    pieces: tuple


def _schedule(dataset, batch_size, epochs, seed, window_blocks):
    """Every step of the run, and each epoch's windows (their row indices)."""
    windows = {e: epoch_order(dataset, seed, e, window_blocks) for e in range(epochs)}
    steps = []
    for epoch in range(epochs):
        for b, pieces in enumerate(batch_pieces(windows[epoch], batch_size)):
            steps.append(_Planned(len(steps) + 1, epoch, b, tuple(pieces)))
    return steps, windows


def _segments(n: int, per_graph: int, eval_every: int | None):
    """Runs of step indices: at most `per_graph` long, ending at every evaluation step."""
    start = 0
    while start < n:
        end = min(n, start + per_graph)
        if eval_every:
            end = min(end, (start // eval_every + 1) * eval_every)
        yield list(range(start, end))
        start = end


class _Runner:
    """Lowers and submits graphs of steps, and holds the futures between them."""

    def __init__(self, plan, step, dataset, client, optimizer, values, schedule, windows):
        self.plan, self.step, self.dataset = plan, step, dataset
        self.schedule, self.epoch_windows = schedule, windows
        self.client, self.optimizer = client, optimizer
        self.names = {**step.params, **step.state}
        self.sources = {}
        for name, input_id in step.params.items():
            array = values[name]
            self.sources[input_id] = ArraySource(array, tokenize(array))
        for full, input_id in step.state.items():
            node = step.graph[input_id]
            zeros = np.zeros(node.shape, node.dtype)
            self.sources[input_id] = ArraySource(zeros, tokenize(zeros))
        self.held: dict = {}     # key -> future: the last step's outputs
        self.windows: dict = {}  # window key -> future, for windows later graphs read

    def submit(self, planned: list, indices: list):
        from deepx_flow.runtime.run import _submit
        dsk: dict = {}
        window_tasks: dict = {}
        losses, norms = [], []
        lowered = None
        for p in planned:
            sources = dict(self.sources)
            for k, value in self.optimizer.scalars(p.number).items():
                scalar = np.array(value, dtype=np.float64)
                sources[self.step.scalars[k]] = ArraySource(scalar, tokenize(scalar))
            for i, input_id in enumerate(self.step.batch):
                pieces = []
                for piece in p.pieces:
                    wkey = self._window(p.epoch, piece.window, i, window_tasks)
                    pieces.append((wkey, piece.lo, piece.hi))
                sources[input_id] = BatchSource(tuple(pieces), tokenize(
                    self.dataset.token, p.epoch, p.batch, i, pieces))
            lowered = self.plan.lower(sources, to_host=self.plan.cluster.has_devices)
            dsk.update(lowered.dsk)
            losses += lowered.output_keys("loss")
            norms += lowered.output_keys("grad_norm")
            for input_id in self.names.values():
                key, chunks = lowered.outputs["new_" + input_id]
                self.sources[input_id] = KeySource(key, chunks, self.step.graph[input_id].dtype)
        dsk.update(window_tasks)
        merged = Lowered(dsk, lowered.outputs)
        keep_windows = [k for k in window_tasks if self._read_later(k, indices[-1])]
        futures, _, recorder, extra = _submit(
            self.plan, self.step.graph, {}, self.client, "train",
            hold={"new_" + i for i in self.names.values()},
            extend=lambda _: losses + norms + keep_windows, lowered=merged)
        old = self.held
        self.held = {f.key: f for fs in futures.values() for f in fs}
        for f in old.values():
            f.release()
        n = len(losses)
        self.windows.update(zip(keep_windows, extra[2 * n:]))
        if recorder is not None:
            recorder.watch(extra[:2 * n])
        return planned, extra[:n], extra[n:2 * n]

    def _window(self, epoch, w, column, made):
        key = (f"train-window-{self.dataset.token[:12]}", epoch, w, column)
        if key not in made and key not in self.windows:
            index = self.epoch_windows[epoch][w]
            col = self.dataset.columns[column]
            if col.array is not None:
                made[key] = task(key, to_device, data_node(key + ("data",), col.rows(index)))
            else:
                made[key] = task(key, load_window, col, index)
        return key

    def _read_later(self, key, last_index) -> bool:
        _, epoch, w, _ = key
        for p in self.schedule[last_index + 1:]:
            if p.epoch == epoch and any(piece.window == w for piece in p.pieces):
                return True
            if p.epoch > epoch:
                return False
        return False

    def current(self) -> dict:
        """The latest parameters as KeySources (what an evaluation reads)."""
        return {name: self.sources[input_id] for name, input_id in self.step.params.items()}

    def gather(self) -> dict[str, np.ndarray]:
        from deepx_flow.runtime.run import _gather
        out = {}
        for name, input_id in self.step.params.items():
            source = self.sources[input_id]
            node = self.step.graph[input_id]
            if isinstance(source, ArraySource):
                out[name] = source.array
                continue
            futures = [self.held[k] for k in Lowered({}, {"x": (source.key, source.chunks)})
                       .output_keys("x")]
            out[name] = _gather(self.client, futures, node.shape, node.dtype, source.chunks)
        return out

    def release(self):
        for f in list(self.held.values()) + list(self.windows.values()):
            f.release()
        self.held, self.windows = {}, {}


def _collect(submitted, fit: Fit, started: float, bar) -> None:
    planned, loss_futures, norm_futures = submitted
    client = loss_futures[0].client if loss_futures else None
    losses = client.gather(loss_futures) if client else []
    norms = client.gather(norm_futures) if client else []
    now = time.perf_counter() - started
    for p, loss, norm in zip(planned, losses, norms):
        loss = float(np.asarray(loss))
        if not math.isfinite(loss):
            raise ExecutionError(f"the loss is {loss} at step {p.number} (epoch {p.epoch}, "
                                 "batch {p.batch}): the run diverged or a label is out of "
                                 "range; lower the learning rate or check the data")
        fit.history.append({"step": p.number, "epoch": p.epoch, "loss": loss,
                            "grad_norm": float(np.asarray(norm)), "seconds": now})
    if planned:
        bar.update(len(planned))
        bar.set_postfix(loss=f"{fit.history[-1]['loss']:.4g}", refresh=False)


def _record_eval(fit: Fit, loss: float, planned) -> None:
    fit.evaluations.append({"step": planned.number, "epoch": planned.epoch, "loss": loss})


def _evaluator(loss_fn, values, eval_data, client, spec):
    """A function of the current parameter sources giving the held-out loss."""
    from deepx_flow.runtime.plan_cache import cached_compile
    from deepx_flow.runtime.run import _gather
    from deepx_flow.sdk.build import build_graph
    from deepx_flow.sdk.functions import input as placeholder
    columns = dataset_of(eval_data).columns
    if any(c.array is None for c in columns):
        from deepx_flow.sdk.functions import read_zarr
        tensors = [read_zarr(c.uri) if c.array is None else None for c in columns]
    else:
        tensors = [None] * len(columns)
    inputs = {}
    for i, (c, t) in enumerate(zip(columns, tensors)):
        if t is None:
            tensors[i] = placeholder(f"eval_{i}", c.shape, c.dtype)
            inputs[tensors[i].node.id] = c.array
    params = {name: placeholder(f"param_{i}", v.shape, v.dtype.name)
              for i, (name, v) in enumerate(values.items())}
    loss = loss_fn(params, *tensors)
    graph = build_graph({"loss": loss})
    plan = cached_compile(graph, spec, settings())
    fixed = {k: ArraySource(v, tokenize(v)) for k, v in inputs.items()}

    def evaluate(current) -> float:
        from deepx_flow.runtime.run import _submit
        sources = {**fixed, **{params[name].node.id: src for name, src in current.items()
                               if params[name].node.id in {n.id for n in graph.inputs}}}
        futures, _, recorder, _ = _submit(plan, graph, sources, client, "evaluate")
        if recorder is not None:
            recorder.watch([f for fs in futures.values() for f in fs])
        out = _gather(client, futures["loss"], (), graph[dict(graph.outputs)["loss"]].dtype,
                      plan.partition.chunks[dict(graph.outputs)["loss"]], plan)
        return float(out)
    return evaluate


def _start_values(params: dict, client) -> dict[str, np.ndarray]:
    """The starting parameters as arrays: tensors (random initializers) are computed."""
    if not isinstance(params, dict) or not params:
        raise GraphError(f"params must be a dict of named tensors or arrays, got "
                         f"{shown(params)}")
    from deepx_flow.runtime.run import run
    names = [k for k, v in params.items() if isinstance(v, Tensor)]
    computed = dict(zip(names, run([params[k] for k in names], client=client))) if names else {}
    out = {}
    for name, value in params.items():
        if not isinstance(name, str) or not name:
            raise GraphError(f"parameter names are non-empty strings, got {shown(name)}")
        array = computed[name] if name in computed else np.asarray(value)
        if array.dtype.kind != "f":
            raise GraphError(f"parameter {shown(name)} is {array.dtype}; only floating-point "
                             "parameters are trained")
        out[name] = array
    return out


def _check_settings(epochs, steps_per_graph, eval_data, eval_every, seed) -> None:
    for name, value in (("epochs", epochs), ("steps_per_graph", steps_per_graph)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise GraphError(f"{name} must be a positive integer, got {shown(value)}")
    if eval_every is not None and (not isinstance(eval_every, int) or eval_every < 1):
        raise GraphError(f"eval_every must be a positive integer, got {shown(eval_every)}")
    if eval_every is not None and eval_data is None:
        raise GraphError("eval_every needs eval_data (the held-out columns)")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise GraphError(f"seed must be a non-negative integer, got {shown(seed)}")
