"""One task of a batch chain (`compiler.batch_chain`): a chunk of images through every layer
of a run of convolutions, poolings, elementwise kernels, flattens and matmuls, a block of
images at a time.

Each stage is the kernel its node would run as a task of its own, called on the block, so
a chain gives what its nodes give one by one (to within BLAS's rounding: its kernels may
order a row's products differently for another row count). What changes is where the
activations live: a block's are a few hundred KiB to a few MiB, in cache from one layer to
the next, where a chunk's are written to memory and read back by the next task (a 3x3 conv
with 8 filters on 28x28 images writes 25 KB an image; a chunk of 65,536 images, 1.6 GB).
"""

from __future__ import annotations

import numpy as np

from deepx_flow.kernels import bfloat16, dispatch, fused, recycled, window

def batch_chain(stages, block, pieces_per_stage, x, *operands):
    """The chain's result for the images `x` (axis 0).

    `stages` holds one description per node: ("window", op, attrs), ("fused", program,
    position of the images among its operands, pool first), ("reshape", shape of one image),
    ("softmax", op, axis) or ("matmul", epilogue, dtype); `pieces_per_stage` says how many of
    `operands` (weights, biases: whole) each stage takes after its images; `block` is how
    many images go through at a time (`compiler.batch_chain.images_per_block`), on a CPU.
    "pool first" is None, or
    says that the max_pool after that stage may run before it (`compiler.pool_first`) when
    the stage's operands at these positions are finite."""
    xp = dispatch.array_module(x, *operands)
    per_stage, at = [], 0
    for count in pieces_per_stage:
        per_stage.append(operands[at:at + count])
        at += count
    stages, per_stage = _pools_first(list(stages), per_stage, xp)
    n = x.shape[0]
    if xp is not np:
        # On a GPU the whole chunk is one block (its kernels want all the work at once) and
        # each layer frees its buffers when the next has run: the task holds what one layer
        # as a task of its own would, which the partitioner fitted.
        return _through(stages, per_stage, [None] * len(stages), x)
    block = max(1, min(n, block))
    out = None
    scratch = [{} for _ in stages]  # each stage's buffers, used again for every block
    for lo in range(0, max(n, 1), block):
        value = _through(stages, per_stage, scratch, x[lo:lo + block])
        if block >= n:
            return value
        if out is None:
            out = recycled.empty((n,) + value.shape[1:], value.dtype)
        out[lo:lo + block] = value
    return out


def _pools_first(stages: list, per_stage: list, xp) -> tuple[list, list]:
    """The stages with each max_pool that may run before the elementwise stage it follows
    moved ahead of it (same numbers: `compiler.pool_first`), the elementwise work then a
    quarter after a 2x2 pooling."""
    i = 0
    while i < len(stages) - 1:
        stage = stages[i]
        if stage[0] == "fused" and stage[3] is not None and \
                stages[i + 1][:2] == ("window", "max_pool") and all(
                bool(xp.isfinite(per_stage[i][j]).all()) for j in stage[3]):
            stages[i], stages[i + 1] = stages[i + 1], stages[i]
            per_stage[i], per_stage[i + 1] = per_stage[i + 1], per_stage[i]
            i += 1  # the stage moved is done
        i += 1
    return stages, per_stage


def _through(stages, per_stage, scratch, value):
    """One block of images through every stage. Between convolutions and poolings the
    activations are laid out channels first, (C, images, *spatial): the conv's GEMM makes
    them so, and a pooling or an elementwise kernel does not mind; they are put back in
    (images, C, ...) order where a stage needs it and at the end."""
    from deepx_flow.kernels import tasks  # tasks imports this module's neighbours
    xp = dispatch.array_module(value)
    owned = False  # whether `value` was made here (else it is the task's input: read only)
    channels_first = False
    for stage, extras, buffers in zip(stages, per_stage, scratch):
        kind = stage[0]
        if kind == "window":
            _, op, attrs = stage
            if not channels_first and value.shape[1] == 1:  # one channel: the same bytes
                value = value.reshape((1,) + value.shape[:1] + value.shape[2:])
                channels_first = True
            value = _window(op, attrs, value, extras, buffers, channels_first)
            channels_first = channels_first or op == "conv"
        elif kind == "fused":
            _, program, position, _ = stage
            arrays = [_channels_first(e, value.ndim, xp) for e in extras] if channels_first \
                else list(extras)
            arrays.insert(position, value)
            # written over the activations it reads (each block is read before it is
            # written; `out` is ignored where the dtype differs)
            value = fused.evaluate(program, arrays, value.shape, out=value if owned else None,
                                   scratch=buffers)
        else:
            if channels_first:
                value = _images_first(value, buffers, xp)
                channels_first = False
            if kind == "reshape":
                value = value.reshape((value.shape[0],) + tuple(stage[1]))
            elif kind == "softmax":
                _, op, axis = stage
                value = tasks.softmax_chunk(op, axis, ((),), value)
            else:  # matmul
                _, epilogue, dtype = stage
                value = tasks.matmul_chunk(epilogue, (value.shape[0], extras[0].shape[1]),
                                           dtype, ((),) * (1 + len(extras)), value, *extras)
        owned = owned or kind != "reshape"  # a reshape is a view of what it reads
    return xp.ascontiguousarray(xp.moveaxis(value, 0, 1)) if channels_first else value


def _window(op: str, attrs: dict, value, extras, buffers: dict, channels_first: bool):
    """A conv (its result channels first) or a pooling of a block; bfloat16 in float32,
    rounded once, as `tasks.window_chunk` computes it."""
    if bfloat16.is_bfloat16(value):
        wide = _window(op, attrs, bfloat16.widen(value), [bfloat16.widen(e) for e in extras],
                       buffers, channels_first)
        return bfloat16.to_bfloat16(wide)
    if op == "conv":
        return window.conv(value, extras[0], attrs, buffers, channels_first,
                           out_channels_first=True)
    return window.pool(op, value, attrs, buffers)


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
