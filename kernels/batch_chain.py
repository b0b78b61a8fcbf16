"""One task of a batch chain (`compiler.batch_chain`): a chunk of images through every layer
of a region of convolutions, poolings, elementwise kernels, reductions, flattens and
matmuls that may branch and join again, a block of images at a time.

Each stage is the kernel its node would run as a task of its own, called on the block, so
a chain gives what its nodes give one by one (to within BLAS's rounding: its kernels may
order a row's products differently for another row count). What changes is where the
activations live: a block's are a few hundred KiB to a few MiB, in cache from one layer to
the next, where a chunk's are written to memory and read back by the next task (a 3x3 conv
with 8 filters on 28x28 images writes 25 KB an image; a chunk of 65,536 images, 1.6 GB).

A served model runs the same tasks thousands of times (`serving/execute.py`): there, within
`kept_between_calls()`, a chain whose whole operands (its weights) are read-only takes up
the plans and buffers of its last call on as many images in this thread, where planning the
blocks again was half a one-row batch (a plan holds what it derived from the weights, which
a writeable operand could change under it). A thread keeps the latest REUSED_CALLS, weights
included, until later calls replace them, an unloaded model's too. Elsewhere a task runs
once, and what it kept goes with it (the plan's memory budget counts on that).
"""

from __future__ import annotations

import collections
import contextlib
import threading

import numpy as np

from deepx_flow.kernels import bfloat16, dispatch, fused, fused_numba, recycled, window

def batch_chain(stages, block, n_images, *arrays):
    """The chain's result for its chunks of images, the first `n_images` of `arrays`
    (images along axis 0); the rest are its whole operands (weights, biases).

    `stages` holds one (description, sources) per node, each after the stages it reads.
    A description is ("window", op, attrs), ("fused", program, finite), ("reduce", op,
    prologue, axes, accumulator dtype, elements reduced per result, dtype), ("reshape", shape
    of one image), ("softmax", op, axis) or ("matmul", epilogue, dtype); `sources` says where
    each operand of the node comes from: ("image", i), ("stage", j) or ("whole", k). `block`
    is how many images go through at a time (`compiler.batch_chain.images_per_block`), on a
    CPU. A fused stage's `finite` is None, or says that the max_pool that alone reads it may
    run before it (`compiler.pool_first`) when its operands at these positions are finite."""
    images, wholes = arrays[:n_images], arrays[n_images:]
    xp = dispatch.array_module(*arrays)
    n = images[0].shape[0]
    if xp is not np:
        # On a GPU the whole chunk is one block (its kernels want all the work at once) and
        # each layer's value is freed once its last reader has run: the task holds the
        # values still to be read (a skip connection's across the layers it skips).
        return _through(_pools_first(list(stages), wholes, xp), [None] * len(stages),
                        images, wholes)
    keeping = getattr(_local, "keeping", False) and all(
        isinstance(a, np.ndarray) and not a.flags.writeable for a in wholes)
    state = _reused(stages, wholes, n) if keeping else _Reuse(stages, wholes, len(stages))
    if state.stages is None:
        state.stages = _pools_first(list(stages), wholes, xp)
    block = max(1, min(n, block))
    out = None
    kept = state.kept  # each stage's buffers and plans, for every block
    for lo in range(0, max(n, 1), block):
        if lo and lo + block > n:  # a smaller last block: the full blocks' buffers go
            if not keeping:  # (plans hold them), as the budget assumes
                state.kept = None
            kept = state.last_kept()
        value = _through(state.stages, kept, [x[lo:lo + block] for x in images], wholes)
        if block >= n:
            return value.copy() if keeping else value  # (a kept buffer: the next call's)
        if out is None:
            out = recycled.empty((n,) + value.shape[1:], value.dtype)
        out[lo:lo + block] = value
    return out


@contextlib.contextmanager
def kept_between_calls():
    """Within it, this thread's chains keep their plans and buffers from call to call (of
    the same task on as many images, its whole operands read-only: `_reused`); their
    results are then copies."""
    before = getattr(_local, "keeping", False)
    _local.keeping = True
    try:
        yield
    finally:
        _local.keeping = before


REUSED_CALLS = 16  # a thread keeps the state of this many (chain, size) calls, the latest
_local = threading.local()


class _Reuse:
    """A chain's state for chunks of one size: its stages (pooling first where it may),
    and each stage's plans and buffers for its full blocks and for a smaller last block,
    with the whole operands they were made for."""

    __slots__ = ("chain", "wholes", "stages", "kept", "_last")

    def __init__(self, chain, wholes, n_stages: int):
        self.chain, self.wholes, self.stages = chain, wholes, None
        self.kept, self._last = [_Kept() for _ in range(n_stages)], None

    def last_kept(self) -> list:
        if self._last is None:
            self._last = [_Kept() for _ in self.chain]
        return self._last


def _reused(stages, wholes, n: int) -> _Reuse:
    """The state this thread kept for the chain `stages` (the very object: a task's, called
    again) on `n` images, where its whole operands are those it was made for (the same
    memory, held here so that no other array can take its place); else a fresh one, kept
    in place of the least recently used."""
    calls = getattr(_local, "calls", None)
    if calls is None:
        calls = _local.calls = collections.OrderedDict()
    key = (id(stages), n)
    state = calls.get(key)
    if state is None or state.chain is not stages or not _same_memory(state.wholes, wholes):
        state = calls[key] = _Reuse(stages, wholes, len(stages))
    calls.move_to_end(key)
    while len(calls) > REUSED_CALLS:
        calls.popitem(last=False)
    return state


def _same_memory(held, wholes) -> bool:
    return len(held) == len(wholes) and all(
        a is b or (a.shape == b.shape and a.strides == b.strides and a.dtype == b.dtype
                   and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])
        for a, b in zip(held, wholes))


def _pools_first(stages: list, wholes, xp) -> list:
    """The stages with each max_pool that may run before the elementwise stage it alone
    reads moved ahead of it (same numbers: `compiler.pool_first`), the elementwise work then
    a quarter after a 2x2 pooling: the pooling reads the stage's images, the stage reads the
    pooling, and the stages after read the stage where they read the pooling."""
    for i in range(len(stages) - 1):
        (kernel, sources), (pool, pool_sources) = stages[i], stages[i + 1]
        if kernel[0] != "fused" or kernel[2] is None or pool[:2] != ("window", "max_pool") \
                or pool_sources != (("stage", i),):
            continue
        if not all(bool(xp.isfinite(wholes[sources[p][1]]).all()) for p in kernel[2]):
            continue
        at = next(k for k, src in enumerate(sources) if src[0] != "whole")
        stages[i] = (pool, (sources[at],))
        stages[i + 1] = (kernel[:2] + (None,),
                         sources[:at] + (("stage", i),) + sources[at + 1:])
    return stages


class _Kept:
    """What a stage keeps from block to block on a CPU: its buffers (by tag, see
    `window.buffer`) and its plans (the choices made for a block size: layouts, compiled
    loops; by block shape)."""

    __slots__ = ("buffers", "plans")

    def __init__(self):
        self.buffers, self.plans = {}, {}


class _Value:
    """A stage's value for one block: the array, whether it is laid out channels first
    ((C, images, ...), axes 0 and 1 swapped), whether it was made here (else it is the
    task's input: read only), and how many stages are still to read it."""

    __slots__ = ("array", "channels_first", "owned", "readers")

    def __init__(self, array, channels_first: bool, owned: bool, readers: int):
        self.array, self.channels_first = array, channels_first
        self.owned, self.readers = owned, readers


def _through(stages, kept, images, wholes):
    """One block of images through every stage. Between convolutions and poolings the
    activations are laid out channels first, (C, images, *spatial): the conv's GEMM makes
    them so, and a pooling, an elementwise kernel or a reduction along other axes does not
    mind; they are put back in (images, C, ...) order where a stage needs it and at the
    end. A value is dropped once its last reader has run."""
    from deepx_flow.kernels import tasks  # tasks imports this module's neighbours
    xp = dispatch.array_module(*images)
    readers = [0] * len(stages)
    pooled = [True] * len(stages)  # every reader a pooling: it may be given a strided view
    for stage, sources in stages:
        for kind, i in sources:
            if kind == "stage":
                readers[i] += 1
                pooled[i] = pooled[i] and stage[:2] in (("window", "max_pool"),
                                                        ("window", "avg_pool"))
    values: list = [None] * len(stages)
    inputs = [_Value(x, False, False, 0) for x in images]
    for j, ((stage, sources), keeps) in enumerate(zip(stages, kept)):
        kind = stage[0]
        taken = [values[i] if k == "stage" else inputs[i] if k == "image" else None
                 for k, i in sources]
        extras = [wholes[i] for k, i in sources if k == "whole"]
        if kind == "window":
            value, first = taken[0].array, taken[0].channels_first
            if not first and value.shape[1] == 1:  # one channel: the same bytes
                value = value.reshape((1,) + value.shape[:1] + value.shape[2:])
                first = True
            out = _window(stage[1], stage[2], value, extras, keeps, first,
                          pooled[j] and readers[j] > 0)
            result = _Value(out, first or stage[1] == "conv", True, readers[j])
        elif kind == "fused" or (kind == "reduce" and taken[0].channels_first
                                 and 1 not in stage[3]):
            result = _elementwise(stage, sources, taken, wholes, keeps, xp, tasks,
                                  readers[j])
        else:
            value = taken[0].array
            if taken[0].channels_first:
                value = _images_first(value, keeps and keeps.buffers, xp)
            if kind == "reshape":
                # a view of what it reads: its bytes are this stage's own where they were
                # copied here, or made here and read by no other stage
                out = value.reshape((value.shape[0],) + tuple(stage[1]))
                own = value is not taken[0].array or (taken[0].owned and taken[0].readers == 1)
                if value is taken[0].array:  # the two share bytes: neither is written over
                    taken[0].owned = False
                result = _Value(out, False, own, readers[j])
            elif kind == "reduce":
                out = _reduce(stage, [value] + extras, tasks)
                result = _Value(out, False, True, readers[j])
            elif kind == "softmax":
                _, op, axis = stage
                result = _Value(tasks.softmax_chunk(op, axis, ((),), value), False, True,
                                readers[j])
            else:  # matmul
                result = _Value(_matmul(stage, value, extras, keeps, xp, tasks), False,
                                True, readers[j])
        for (k, i), v in zip(sources, taken):
            if k == "stage":
                v.readers -= 1
                if v.readers == 0:
                    values[i] = None  # read by no stage still to run
        values[j] = result
        del taken, result  # (on a GPU, a dropped value's memory is freed now)
    last = values[-1]
    if last.channels_first:
        return xp.ascontiguousarray(xp.moveaxis(last.array, 0, 1))
    return last.array


def _elementwise(stage, sources, taken, wholes, keeps, xp, tasks, readers: int) -> _Value:
    """A fused elementwise stage, or a reduction along other axes than the images' and the
    channels' with its prologue, in the layout of its operands: channels first if any image
    operand is (the others are seen so too: a view), whole operands reshaped to match."""
    first = any(v.channels_first for v in taken if v is not None)
    # what is the same for every block of a size (the last may be smaller): the whole
    # operands as seen here, the result's shape, the compiled loop
    key = tuple(None if v is None else (v.array.shape, v.channels_first) for v in taken)
    buffers = keeps and keeps.buffers
    plan = keeps.plans.get(key) if keeps else None
    if plan is None:
        plan = _plan_elementwise(stage, sources, taken, wholes, xp, first)
        if keeps:
            keeps.plans[key] = plan
    elif "step" in plan:  # ran on a block of this size before: its choices hold
        return plan["step"](taken, readers)
    arrays = [plan["wholes"][n] if v is None
              else xp.moveaxis(v.array, 0, 1) if first and not v.channels_first
              else v.array for n, v in enumerate(taken)]
    shape = plan["shape"]
    if stage[0] == "reduce":
        if plan["compiled"]:  # its prologue compiled into a buffer, then reduced alone:
            # the values and the blocks of rows they are added up by are the same
            values = window.buffer(buffers, "prologue", shape, stage[2][-1][2], xp)
            run = plan.get("run")
            if run is None:
                run = plan["run"] = fused_numba.prepare(stage[2], arrays, values)
            arrays = [run(arrays, values)]
            stage = stage[:2] + ((),) + stage[3:]
        return _Value(_reduce(stage, arrays, tasks, shape), first, True, readers)
    # written over an image operand read by no later stage, made here, of the result's
    # layout and shape and read once here (`out` is ignored where the dtype differs)
    out = None
    for (kind, i), v in zip(sources, taken):
        if kind == "stage" and v.owned and v.readers == 1 and v.channels_first == first \
                and v.array.shape == shape and sources.count((kind, i)) == 1:
            out = v.array
            break
    if out is None and xp is np and stage[1][-1][2] != "bfloat16":  # this stage's buffer,
        # used again by the next block (a fresh one faults its pages in on a worker)
        out = window.buffer(buffers, "fused_out", shape, stage[1][-1][2], xp)
    if plan["compiled"] and out is not None and out.shape == shape:
        run = plan.get("run")
        if run is None:
            run = plan["run"] = fused_numba.prepare(stage[1], arrays, out)
        if all(v is None or v.channels_first == first for v in taken):
            plan["step"] = _compiled_step(run, arrays, taken, out, first)
        return _Value(run(arrays, out), first, True, readers)
    value = fused.evaluate(stage[1], arrays, shape, out=out, scratch=buffers)
    return _Value(value, first, True, readers)


def _compiled_step(run, arrays, taken, out, first: bool):
    """A compiled elementwise stage as it ran on a block, for the next blocks of that size:
    the same whole operands, and written over the same operand (or into the same buffer),
    which the chain's structure decides, not the block."""
    images = [n for n, v in enumerate(taken) if v is not None]
    over = next((n for n in images if taken[n].array is out), None)
    template = [None if v is not None else a for a, v in zip(arrays, taken)]  # the wholes

    def step(taken, readers: int) -> _Value:
        operands = template[:]
        for n in images:
            operands[n] = taken[n].array
        return _Value(run(operands, operands[over] if over is not None else out), first,
                      True, readers)
    return step


def _plan_elementwise(stage, sources, taken, wholes, xp, first: bool) -> dict:
    """An elementwise stage's whole operands in the layout of its image operands, by
    position; the result's shape; whether its program (a reduction's prologue) runs
    compiled (`fused_numba`)."""
    ndim = max(v.array.ndim for v in taken if v is not None)
    seen = {n: _channels_first(wholes[i], ndim, xp) if first else wholes[i]
            for n, ((kind, i), v) in enumerate(zip(sources, taken)) if v is None}
    shapes = [seen[n].shape if v is None else v.array.shape for n, v in enumerate(taken)]
    if first:
        shapes = [s if v is None or v.channels_first else (s[1], s[0]) + s[2:]
                  for s, v in zip(shapes, taken)]
    dtypes = [seen[n].dtype.name if v is None else v.array.dtype.name
              for n, v in enumerate(taken)]
    program = stage[1] if stage[0] == "fused" else stage[2]  # a reduction's prologue
    compiled = xp is np and bool(program) and fused_numba.compilable(program, dtypes)
    return {"wholes": seen, "shape": tuple(np.broadcast_shapes(*shapes)),
            "compiled": compiled}


def _matmul(stage, value, extras, keeps, xp, tasks):
    """A matmul stage on a block, with its epilogue, as its task computes it
    (`tasks.matmul_chunk`); on a CPU the product goes into a buffer of the stage's and an
    exact epilogue (a bias) runs compiled over it (`fused_numba`), planned once per block
    size: a dense layer's block of a few dozen rows took ten times its GEMM otherwise."""
    _, epilogue, dtype = stage
    b, operands = extras[0], list(extras[1:])
    key = ("matmul", value.shape, value.dtype, b.dtype)
    plan = keeps.plans.get(key) if keeps else None
    if plan is None:
        plan = False
        if xp is np and value.ndim == b.ndim == 2 and value.dtype == b.dtype \
                and value.dtype.name in fused_numba.DTYPES \
                and (epilogue or dtype in (None, value.dtype)):
            shape = (value.shape[0], b.shape[1])
            exact = not epilogue or (fused_numba.compilable(
                epilogue, [value.dtype.name] + [a.dtype.name for a in operands])
                and np.broadcast_shapes(shape, *(a.shape for a in operands)) == shape)
            if exact:
                product = window.buffer(keeps.buffers, "product", shape, value.dtype, xp)
                run = fused_numba.prepare(epilogue, [product] + operands, product) \
                    if epilogue else None
                plan = (product, run)
        if keeps:
            keeps.plans[key] = plan
    if not plan:
        return tasks.matmul_chunk(epilogue, (value.shape[0], b.shape[1]), dtype,
                                  ((),) * (1 + len(extras)), value, *extras)
    product, run = plan
    np.matmul(value, b, out=product)
    return run([product] + operands, product) if run is not None else product


def _reduce(stage, arrays, tasks, shape=None):
    """A reduction stage on a block (dims kept), as its task of its own computes it: one
    partial, finished."""
    _, op, prologue, axes, acc, count, dtype = stage
    if shape is None:
        shape = tuple(np.broadcast_shapes(*(a.shape for a in arrays)))
    partial = tasks.reduce_partial(op, prologue, axes, acc, shape, ((),) * len(arrays),
                                   *arrays)
    return tasks.finish_reduce(op, axes, True, count, dtype, partial)


def _window(op: str, attrs: dict, value, extras, keeps, channels_first: bool,
            view_ok: bool = False):
    """A conv (its result channels first) or a pooling of a block; bfloat16 in float32,
    rounded once, as `tasks.window_chunk` computes it. `view_ok`: a conv's result may be a
    strided view (its readers are poolings, which read strided slices anyway)."""
    if bfloat16.is_bfloat16(value):
        wide = _window(op, attrs, bfloat16.widen(value), [bfloat16.widen(e) for e in extras],
                       keeps, channels_first)
        return bfloat16.to_bfloat16(wide)
    if op == "conv":
        if not keeps:  # on a GPU: the whole chunk, once
            return window.conv(value, extras[0], attrs, None, channels_first, True)
        key = (value.shape, value.dtype, channels_first)  # one a block size
        run = keeps.plans.get(key)
        if run is None:
            run = keeps.plans[key] = window.conv_plan(
                value, extras[0], attrs, keeps.buffers, channels_first,
                out_channels_first=True, view_ok=view_ok)
        return run(value)
    if not keeps:
        return window.pool(op, value, attrs)
    key = (op, value.shape, value.strides, value.dtype)  # a view or not, the last block
    run = keeps.plans.get(key)
    if run is None:
        run = keeps.plans[key] = window.pool_plan(op, value, attrs, keeps.buffers)
    return run(value)


def _channels_first(operand, ndim: int, xp):
    """An operand of an elementwise stage (constant along the images axis), seen from
    activations laid out (C, images, ...): its first two axes of `ndim` swapped."""
    full = operand.reshape((1,) * (ndim - operand.ndim) + operand.shape)
    return xp.swapaxes(full, 0, 1)


def _images_first(value, scratch: dict, xp):
    """Activations laid out (C, images, ...) copied into (images, C, ...) order."""
    out = window.buffer(scratch, "images_first", (value.shape[1], value.shape[0])
                        + value.shape[2:], value.dtype, xp)
    xp.copyto(out, xp.moveaxis(value, 0, 1))
    return out
