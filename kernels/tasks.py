"""The functions Dask tasks call: one per task kind of the lowering.

Each is a pure function of chunks. A task may receive an operand as several pieces with a
layout (the grid of pieces and the slice of each) when the operand's chunks do not line up
with the region the task needs; `_operands` assembles those first. Device choice goes through
`deepx_flow.kernels.dispatch`: sources make NumPy or CuPy arrays depending on the worker, and
every other kernel works on whatever array module its operands use. Sums (reductions, the
softmax normalizer, scans) add up in float64 for float operands; see the reductions section.
bfloat16 (NumPy only) computes in float32 and rounds each node's result once
(`kernels.bfloat16`): a matmul in float32 BLAS, its K-partial products and their sums in
float32; softmax, convolution and pooling on values widened to float32.
"""

from __future__ import annotations

import math

import numpy as np

from deepx_flow.ir.dtypes import accumulator, ufunc_result
from deepx_flow.ir.program import whole_axes
from deepx_flow.kernels import bfloat16, compiled, dispatch, fused, fused_cpu, recycled, \
    reduce_numba, softmax
from deepx_flow.kernels.random import random_chunk


def _assemble(layout, pieces):
    """Join `pieces` (C order over the layout's grid) after slicing each to its region."""
    grid, slices = layout
    xp = dispatch.array_module(*pieces)
    blocks = [p[tuple(slice(lo, hi) for lo, hi in s)] for p, s in zip(pieces, slices)]
    for axis in reversed(range(len(grid))):
        step = grid[axis]
        blocks = [_concatenate(xp, blocks[i:i + step], axis) if step > 1 else blocks[i]
                  for i in range(0, len(blocks), step)]
    return blocks[0]


def _concatenate(xp, blocks, axis):
    if xp is not np:
        return xp.concatenate(blocks, axis=axis)
    shape = list(blocks[0].shape)
    shape[axis] = sum(b.shape[axis] for b in blocks)
    dtype = np.result_type(*blocks)
    # Blocks in Fortran order (transposed reads) are joined in Fortran order, as NumPy would,
    # so a matmul still takes them as a transpose flag.
    fortran = all(b.flags.f_contiguous and not b.flags.c_contiguous for b in blocks)
    out = recycled.empty(shape[::-1], dtype).T if fortran else recycled.empty(shape, dtype)
    return np.concatenate(blocks, axis=axis, out=out)


def _operands(layouts, pieces):
    """Split the flat `pieces` among operands and assemble the ones that need it."""
    out, at = [], 0
    for layout in layouts:
        if not layout:
            out.append(pieces[at])
            at += 1
        else:
            n = len(layout[1])
            out.append(_assemble(layout, pieces[at:at + n]))
            at += n
    return out, pieces[at:]


# -- sources ------------------------------------------------------------------------------
def _device_module():
    """NumPy, or CuPy on a worker with a GPU: where new arrays are made."""
    if dispatch.device_engine() == "numpy":
        return np
    import cupy
    return cupy



def source_chunk(op, attrs, full_shape, region, dtype):
    """A chunk of a constant, a range or a random tensor, made on this worker's device."""
    xp = _device_module()
    shape = tuple(hi - lo for lo, hi in region)
    if op == "full":
        if dtype == "bfloat16":
            return np.full(shape, bfloat16.to_bfloat16(np.float64(attrs["value"])))
        return xp.full(shape, attrs["value"], dtype=dtype)
    if op == "read_zarr":
        from deepx_flow.ops.sources import STORED_AS
        from deepx_flow.storage.readers import read_region
        block = read_region(attrs["uri"], region, attrs.get("missing", "error"),
                            {k: attrs.get(k) for k in STORED_AS})
        return xp.asarray(block).astype(dtype, copy=False)
    if op == "arange":
        (lo, hi), = region
        start, step = attrs.get("start", 0), attrs.get("step", 1)
        index = xp.arange(lo, hi, dtype="float64" if isinstance(step, float) or isinstance(
            start, float) else "int64")
        return bfloat16.astype(start + step * index, dtype)
    names = ("mean", "std") if op == "random_normal" else ("low", "high")
    params = {k: attrs[k] for k in names if k in attrs}
    return random_chunk(op, attrs["seed"], params, full_shape, region, dtype, xp=xp)


# -- gather -------------------------------------------------------------------------------
def take_chunk(axis, layouts, *pieces):
    """`np.take(x, indices, axis)` of a block of x (its axis whole) and of indices; an index
    outside -n..n-1 raises, naming it (CuPy's take would wrap it)."""
    from deepx_flow.kernels.scatter import checked_index
    (x, indices), _ = _operands(layouts, pieces)
    xp = dispatch.array_module(x)
    return xp.take(x, checked_index(xp, indices, x.shape[axis], "take", axis), axis=axis)


def indexed_chunk(op, attrs, layouts, *pieces):
    """A block of a scatter or an element gather (`kernels.scatter`), from the operand
    regions its tiling gives (`ops.scatter`)."""
    from deepx_flow.kernels import scatter
    arrays, _ = _operands(layouts, pieces)
    return scatter.KERNELS[op](*arrays, **attrs)


# -- sliding windows ----------------------------------------------------------------------
def window_chunk(op, attrs, layouts, *pieces):
    """A block of images through `conv` (with its weights) or a pooling (`kernels/window`)."""
    from deepx_flow.kernels import window
    arrays, _ = _operands(layouts, pieces)
    if bfloat16.is_bfloat16(arrays[0]):  # in float32, rounded once
        return bfloat16.to_bfloat16(window_chunk(op, attrs, ((),) * len(arrays),
                                                 *[bfloat16.widen(a) for a in arrays]))
    if op == "conv":
        return window.conv(arrays[0], arrays[1], attrs)
    return window.pool(op, arrays[0], attrs)


def batch_chain_chunk(stages, block, n_images, layouts, *pieces):
    """A chunk of images through a batch chain's nodes (`kernels.batch_chain`)."""
    from deepx_flow.kernels import batch_chain
    arrays, _ = _operands(layouts, pieces)
    return batch_chain.batch_chain(stages, block, n_images, *arrays)


# -- elementwise --------------------------------------------------------------------------
def fused_chunk(program, out_shape, layouts, *pieces):
    arrays, _ = _operands(layouts, pieces)
    return fused.evaluate(program, arrays, out_shape)


def cast_chunk(dtype, layouts, *pieces):
    (x,), _ = _operands(layouts, pieces)
    return bfloat16.astype(x, dtype)


def concat_chunk(dtype, axis, layouts, *pieces):
    """A chunk of a concat that joins pieces of several operands, each cast to `dtype`."""
    arrays, _ = _operands(layouts, pieces)
    xp = dispatch.array_module(*arrays)
    return _concatenate(xp, [xp.asarray(bfloat16.astype(a, dtype)) for a in arrays], axis)


# -- matmul -------------------------------------------------------------------------------
def matmul_chunk(epilogue, out_shape, dtype, layouts, *pieces):
    """One tile of a matmul (or one K-partial product), with its fused epilogue."""
    (a, b, *extras), _ = _operands(layouts, pieces)
    xp = dispatch.array_module(a, b)
    if bfloat16.is_bfloat16(a) or bfloat16.is_bfloat16(b):
        product = _bfloat16_matmul(a, b, partial=dtype is None and not epilogue)
    else:
        into = recycled.empty((a.shape[0], b.shape[1]), np.result_type(a, b)) \
            if xp is np and a.ndim == b.ndim == 2 else None
        product = xp.matmul(a, b, out=into)
    product = xp.broadcast_to(product, out_shape) if product.shape != tuple(out_shape) \
        else product
    if epilogue:
        # The epilogue overwrites the product where its dtype allows: no second tile-sized
        # allocation (fresh memory faults in page by page on a Dask worker, see below).
        return fused.evaluate(epilogue, [product, *extras], out_shape, out=product)
    return product if dtype is None or product.dtype == dtype else product.astype(dtype)


def _bfloat16_matmul(a, b, partial=False):
    """a @ b with a bfloat16 operand: in float32 BLAS (or the wider dtype of the product) on
    operands widened exactly; a bfloat16 product is rounded once, unless it is a K-partial
    product (`partial`), which stays float32 to be added up and rounded once by
    `finish_matmul`."""
    product = np.matmul(bfloat16.widen(a), bfloat16.widen(b))
    bf16 = ufunc_result(np.matmul, a.dtype.name, b.dtype.name) == "bfloat16"
    return bfloat16.to_bfloat16(product) if bf16 and not partial else product


# Rows per block of a matmul chain: BLAS runs as fast on 1,024 to 4,096 rows of 256 columns as
# on 262,144 (measured, 2-core EPYC, single-threaded OpenBLAS: a 262,144-row two-layer MLP
# chunk took 0.346 s in blocks of 1,024 or 4,096 rows and 0.41 s as two whole matmuls), and
# a block's activations stay in cache instead of filling a fresh chunk-sized array.
CHAIN_BLOCK_ELEMENTS = 1 << 20


def matmul_chain(stages, out_shape, layouts, *pieces):
    """A chain of matmuls with their epilogues (`compiler.inline.chained_matmuls`), a block
    of rows at a time. `stages` holds (epilogue, dtype, number of epilogue operands) per
    matmul; the pieces are the first one's left operand, then per matmul its right operand
    and its epilogue operands. Each block gives what the matmuls as tasks of their own give,
    to within BLAS's rounding (its kernels may order a row's products differently for
    another row count)."""
    arrays, _ = _operands(layouts, pieces)
    a, rest = arrays[0], arrays[1:]
    layers = []
    for epilogue, dtype, n_extras in stages:
        layers.append((rest[0], rest[1:1 + n_extras], epilogue, dtype))
        rest = rest[1 + n_extras:]
    xp = dispatch.array_module(*arrays)
    m = a.shape[0]
    widest = max(b.shape[1] for b, _, _, _ in layers)
    rows = m if xp is not np else max(1, min(m, CHAIN_BLOCK_ELEMENTS // max(1, widest)))
    if rows >= m:  # one block: the layers one after the other
        values = a
        for b, extras, epilogue, dtype in layers:
            values = _layer(xp, values, b, extras, epilogue, dtype, 0, m, None)
        return values
    # Each layer's products go to a buffer of their own, allocated once (a fresh block per
    # block would fault in page by page on a worker).
    products: list = [None] * len(layers)
    out = None
    for lo in range(0, m, rows):
        hi = min(lo + rows, m)
        values = a[lo:hi]
        for i, (b, extras, epilogue, dtype) in enumerate(layers):
            if products[i] is None:
                products[i] = np.empty((rows, b.shape[1]), ufunc_result(
                    np.matmul, values.dtype.name, b.dtype.name))
            values = _layer(np, values, b, extras, epilogue, dtype, lo, hi,
                            products[i][:hi - lo])
        if out is None:
            out = recycled.empty((m, values.shape[1]), values.dtype)
        out[lo:hi] = values
    return out


def _layer(xp, values, b, extras, epilogue, dtype, lo, hi, into):
    """One matmul of a chain on rows lo:hi, its epilogue applied (into `into` if given)."""
    product = _bfloat16_matmul(values, b) if bfloat16.is_bfloat16(values) or \
        bfloat16.is_bfloat16(b) else xp.matmul(values, b, out=into)
    if epilogue:
        block = [_rows_of(e, 2, 0, lo, hi) for e in extras]
        product = fused.evaluate(epilogue, [product, *block], product.shape, out=product)
    return product if product.dtype == dtype else product.astype(dtype)


def finish_matmul(epilogue, out_shape, dtype, n_parts, layouts, *pieces):
    """Sum the last K-partial products and apply the epilogue; `dtype` is the product's
    (bfloat16 partial products are float32, rounded here once)."""
    parts, rest = pieces[:n_parts], pieces[n_parts:]
    total = combine_partials("sum", *parts)
    # Overwrite the sum only when it is new (one part is the input itself, which Dask may
    # still hold for another reader).
    new = n_parts > 1
    if dtype == "bfloat16":
        total, new = bfloat16.to_bfloat16(total), True
    extras, _ = _operands(layouts, rest)
    if epilogue:
        return fused.evaluate(epilogue, [total, *extras], out_shape, out=total if new else None)
    return total if total.dtype == dtype else total.astype(dtype)


# -- reductions ---------------------------------------------------------------------------
# Sums add up in `dtypes.accumulator` of their dtype (float64 for floats): partials are float64,
# combined in float64, and rounded to the result's dtype once, in `finish_reduce`. NumPy has no
# loop that adds float32 into a float64 total: `sum(dtype=float64)` casts through its ufunc
# buffer, 4x the time of a float32 sum. So on NumPy arrays a float32 operand is cast, a block
# of rows of about `REDUCE_BLOCK_ELEMENTS` elements at a time, into one float64 scratch block
# that stays in cache and is summed there. The scratch is allocated once per task: Dask workers
# run with MALLOC_TRIM_THRESHOLD_ set, which pins glibc's mmap threshold at 128 KiB, so every
# larger allocation is fresh memory that faults in page by page; a buffer allocated per block
# made worker-side sums 10x slower than the same code in a plain process. Measured in a worker
# (2-core EPYC, a (262144, 256) float32 chunk of 256 MiB): float32 sum 8.9 ms, NumPy's cast
# through its buffer 36-40 ms, the scratch block 23-27 ms. A prologue is computed in the same
# blocks (`_reduce_blocks`), into one reused buffer: its values never fill a chunk-sized array.
# (On this VM memory that was freed and is touched again can cost far more than its page
# faults: the same 256 MiB first write took 27 ms or 605 ms in one run, so fewer fresh
# chunk-sized arrays per task matters more than any arithmetic here.) The blocks are 64K
# elements (256 KiB of float32, 512 KiB of float64 scratch), so that a block, its prologue's
# temporaries and the scratch stay in a core's L2 cache; the prologue is prepared once per task
# (`fused_cpu.prepared_blocks`), so a block costs only its ufunc calls. Measured in one
# process (Xeon, 2 MiB of L2 a core; a (131072, 256) float32 chunk): at 256K-element blocks
# through `fused.evaluate` a column mean of (x - m)**2 took 84-115 ms, a 13-instruction chain
# summed 230 ms; prepared, 63 and 190 ms; prepared at 64K, 50 and 150 ms (16K: 63 and 176).
REDUCE_BLOCK_ELEMENTS = 1 << 16


def reduce_partial(op, prologue, axes, acc_dtype, space_shape, layouts, *pieces):
    """Reduce one chunk of the operand (computing its prologue first), keeping dims; sums add
    up in `acc_dtype`."""
    arrays, _ = _operands(layouts, pieces)
    if prologue and dispatch.array_module(*arrays) is np and \
            math.prod(space_shape) > REDUCE_BLOCK_ELEMENTS and \
            _block_axis(space_shape) not in whole_axes(prologue):  # a softmax's axis
        return _reduce_blocks(op, prologue, arrays, axes, acc_dtype, tuple(space_shape))
    x = fused.evaluate(prologue, arrays, space_shape) if prologue else arrays[0]
    xp = dispatch.array_module(x)
    if tuple(x.shape) != tuple(space_shape):
        x = xp.broadcast_to(x, space_shape)
    if op in ("sum", "mean"):
        return _sum(xp, x, axes, acc_dtype)
    if op == "prod":
        return xp.prod(x, axis=axes, keepdims=True, dtype=acc_dtype)
    return (xp.max if op == "max" else xp.min)(x, axis=axes, keepdims=True)


def _sum(xp, x, axes, dtype):
    """The sum over `axes` (an axis or several; dims kept), added up in `dtype` (see the
    comment above)."""
    axes = tuple(a % x.ndim for a in ((axes,) if isinstance(axes, int) else axes))
    if xp is not np or dtype is None or x.dtype == dtype or x.size <= REDUCE_BLOCK_ELEMENTS:
        return xp.sum(x, axis=axes, keepdims=True, dtype=dtype)
    summed = reduce_numba.column_sums((), [x], {}, x.shape, axes, dtype,
                                      _block_shape(x.shape)[_block_axis(x.shape)])
    if summed is not None:
        return summed
    return _reduce_by_rows("sum", x.shape, x.dtype, axes, dtype,
                           lambda rows, _: x[rows])


def _reduce_blocks(op, prologue, arrays, axes, acc_dtype, space_shape):
    """`reduce_partial` on NumPy arrays with a prologue, computed a block of rows at a time
    into one reused buffer and reduced there: its values never fill a chunk-sized array (a
    fresh, page-faulting allocation on a worker, and a round trip through memory)."""
    ndim = len(space_shape)
    # What every block shares (a mean, sqrt of a variance) is computed once, not per block.
    axis = _block_axis(space_shape)
    dtypes = [a.dtype.name for a in arrays]
    blocked = fused_cpu.engine_for(prologue, dtypes) == "blocked"
    summing = op in ("sum", "mean") and "bfloat16" not in dtypes and \
        all(dtype != "bfloat16" for _, _, dtype in prologue) and compiled.allowed()
    fixed = run = None
    if blocked or summing:
        fused_cpu.check_call(prologue, [a.shape for a in arrays], space_shape)
        fixed = fused_cpu.hoisted(prologue, arrays, {
            k for k, a in enumerate(arrays) if _rows_of(a, ndim, axis, 0, 1) is a})
    if summing:  # an exact program's sum is one compiled loop, to the same bits
        # (values hoisted by NumPy only where the NumPy path hoists them too: numexpr
        # computes its exp with other bits)
        summed = reduce_numba.column_sums(prologue, arrays, fixed if blocked else {},
                                          space_shape, axes, acc_dtype,
                                          _block_shape(space_shape)[axis])
        if summed is not None:
            return summed
    if blocked:
        # Prepared once for every block: a block then costs its ufunc calls alone.
        run = fused_cpu.prepared_blocks(prologue, dtypes, _block_shape(space_shape), fixed)
    else:
        fixed = None

    def block_of(rows, into):
        lo, hi = rows[-1].start, rows[-1].stop
        pieces = [_rows_of(a, ndim, len(rows) - 1, lo, hi) for a in arrays]
        if run is not None:
            return run(pieces, into)
        return fused.evaluate(prologue, pieces, into.shape, out=into, fixed=fixed)

    return _reduce_by_rows(op, space_shape, prologue[-1][2], axes, acc_dtype, block_of)


def _reduce_by_rows(op, shape, dtype, axes, acc_dtype, block_of):
    """`op` over `axes` (dims kept) of values of `shape` and `dtype`, a block of rows of about
    REDUCE_BLOCK_ELEMENTS elements at a time along the first axis longer than 1.
    `block_of(rows, into)` gives the values at index `rows` (slices up to that axis), into
    `into` (a reused block of `dtype`) where it computes them; a sum (or product) casts each
    block into one `acc_dtype` scratch block and adds (multiplies) it up there."""
    axes = tuple(a % len(shape) for a in ((axes,) if isinstance(axes, int) else axes))
    axis = _block_axis(shape)
    block_shape = _block_shape(shape)
    rows = block_shape[axis]
    values = np.empty(block_shape, dtype)  # untouched (no page faults) where unused
    accumulated = op in ("sum", "mean", "prod")  # added (multiplied) up in acc_dtype
    combine = "sum" if op == "mean" else op
    ufunc = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[combine]
    cast = np.empty(block_shape, acc_dtype) \
        if accumulated and acc_dtype and np.dtype(dtype) != acc_dtype else None
    # Along a reduced axis the blocks' results are combined as they come, in the order and
    # arithmetic of `combine_partials`, into one array (a list of them held every block's
    # result: 64 partials of 512 KiB for a 16 MiB chunk of 256 x 256 slices); a block whose
    # reduced axes are all 1 long is its own result and is added as it is.
    total, parts = None, []
    for lo in range(0, shape[axis], rows):
        hi = min(lo + rows, shape[axis])
        head = (slice(None),) * axis
        v = block_of(head + (slice(lo, hi),), values[head + (slice(0, hi - lo),)])
        if cast is not None:
            np.copyto(cast[head + (slice(0, hi - lo),)], v, casting="unsafe")
            v = cast[head + (slice(0, hi - lo),)]
        if axis not in axes:
            parts.append(ufunc.reduce(v, axis=axes, keepdims=True))
            continue
        part = v if all(v.shape[a] == 1 for a in axes) else \
            ufunc.reduce(v, axis=axes, keepdims=True)
        if total is None:
            # Its own copy (the block buffers are used again); a sum starts from 0 as
            # add.reduce does, so that a -0.0 alone sums to +0.0 as it did.
            total = np.add(part, part.dtype.type(0)) if combine == "sum" and part is v \
                else np.array(part)
        else:
            ufunc(total, part, out=total)
    return total if axis in axes else np.concatenate(parts, axis=axis)


def _block_shape(shape) -> tuple[int, ...]:
    """The shape of `_reduce_by_rows`'s blocks of values of `shape`: about
    REDUCE_BLOCK_ELEMENTS elements, cut along `_block_axis`."""
    shape = tuple(shape)
    axis = _block_axis(shape)
    rows = max(1, REDUCE_BLOCK_ELEMENTS // math.prod(shape[axis + 1:]))
    return shape[:axis] + (min(rows, shape[axis]),) + shape[axis + 1:]


def _block_axis(shape) -> int:
    """The axis `_reduce_by_rows` cuts into blocks of rows: the first one longer than 1."""
    return next((a for a, n in enumerate(shape) if n > 1), 0)


def _rows_of(a, ndim, axis, lo, hi):
    """Rows lo:hi along `axis` of the space of an operand that broadcasts to an `ndim`-d
    space (an axis it has as 1, or lacks, is kept whole)."""
    at = axis - (ndim - a.ndim)
    if at < 0 or a.shape[at] == 1:
        return a
    return a[(slice(None),) * at + (slice(lo, hi),)]


def combine_partials(op, *parts):
    """Combine same-shaped partial results: a step of a tree reduction, in the parts' dtype (a
    reduction's partial sums are in its accumulator dtype already)."""
    if len(parts) == 1:
        return parts[0]
    xp = dispatch.array_module(*parts)
    fn = {"sum": xp.add, "prod": xp.multiply, "max": xp.maximum, "min": xp.minimum}[op]
    out = xp.asarray(fn(parts[0], parts[1]))  # NumPy gives 0-d results as scalars
    for part in parts[2:]:
        fn(out, part, out=out)  # in place: one result array however many parts
    return out


def finish_reduce(op, axes, keepdims, count, dtype, *parts):
    """The last tree-reduction step: combine, divide for a mean (in the accumulator's dtype),
    drop reduced axes, and round to the result's dtype."""
    out = combine_partials("sum" if op == "mean" else op, *parts)
    xp = dispatch.array_module(out)
    if op == "mean":
        with np.errstate(invalid="ignore", divide="ignore"):
            out = xp.true_divide(out, count) if count else out * xp.nan
    if not keepdims:
        out = out.reshape(tuple(s for i, s in enumerate(out.shape) if i not in axes))
    return bfloat16.astype(out, dtype)


# -- scans -------------------------------------------------------------------------------
def scan_total(axis, acc_dtype, layouts, *pieces):
    """A chunk's sum along a scan's axis (kept as 1), in `acc_dtype`: what it adds to the
    carry of the chunks after it (`compiler.lower`)."""
    (x,), _ = _operands(layouts, pieces)
    return _sum(dispatch.array_module(x), x, (axis,), acc_dtype)


def scan_chunk(axis, exclusive, reverse, dtype, layouts, *pieces):
    """A chunk of a scan (`kernels.scan`): its running sums plus its carry, the piece after
    the operand's where the chunk has chunks before it in scan order."""
    from deepx_flow.kernels import scan
    (x,), rest = _operands(layouts, pieces)
    return scan.scan(x, axis, exclusive, reverse, dtype, rest[0] if rest else None)


# -- whole-axis operators -----------------------------------------------------------------
def softmax_chunk(op, axis, layouts, *pieces):
    """softmax or log_softmax along `axis`, stabilized by subtracting the maximum (the
    arithmetic is `kernels.softmax`'s)."""
    (x,), _ = _operands(layouts, pieces)
    if bfloat16.is_bfloat16(x):  # in float32, rounded once
        return bfloat16.to_bfloat16(softmax_chunk(op, axis, ((),), bfloat16.widen(x)))
    xp = dispatch.array_module(x)
    x = x.astype(softmax.value_dtype(x.dtype), copy=False)
    if x.size == 0:
        return x.copy()
    if xp is np and axis % x.ndim == x.ndim - 1 and x.size > REDUCE_BLOCK_ELEMENTS:
        return _softmax_rows(op, x)
    stats = softmax.normalize(x, axis, xp)
    return softmax.finish(op, stats, xp, out=stats.exps if op == "softmax" else stats.shifted)


def _softmax_rows(op, x):
    """softmax or log_softmax along the last axis of a NumPy array, a block of rows at a time:
    the shifted values, their exponentials and the float64 normalizer stay in cache-sized
    buffers (allocated once), and only the result is written to memory. On a worker
    whole-chunk temporaries cost a fresh, page-faulting allocation each (see `_sum`): for a
    (262144, 256) float32 chunk this took 300-400 ms a task there against 150 ms here."""
    n = x.shape[-1]
    rows_in = x.reshape(-1, n)
    out = recycled.empty(rows_in.shape, x.dtype)
    rows = max(1, REDUCE_BLOCK_ELEMENTS // n)
    exps = np.empty((rows, n), x.dtype)
    wide = np.empty((rows, n), accumulator(x.dtype.name))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for lo in range(0, rows_in.shape[0], rows):
            hi = min(lo + rows, rows_in.shape[0])
            r = hi - lo
            stats = softmax.normalize(rows_in[lo:hi], 1, np, shifted=out[lo:hi],
                                      exps=exps[:r], wide=wide[:r])
            softmax.finish(op, stats, np, out=out[lo:hi])
    return out.reshape(x.shape)


# -- layout -------------------------------------------------------------------------------
def transpose_chunk(axes, layouts, *pieces):
    (x,), _ = _operands(layouts, pieces)
    return x.transpose(axes).copy()  # a C-ordered copy (ascontiguousarray would make 0-d 1-d)


def transpose_view(axes, x):
    """A transposed view of one whole chunk, computed by the task that reads it (a matmul
    passes it to BLAS as a transpose flag)."""
    return x.transpose(axes)


def reshape_chunk(out_shape, offset, layouts, *pieces):
    """The run of `prod(out_shape)` elements starting at `offset` in the operand block."""
    (x,), _ = _operands(layouts, pieces)
    n = math.prod(out_shape)
    flat = x.reshape(-1)
    if offset or flat.size != n:
        flat = flat[offset:offset + n].copy()  # a view would keep the whole block alive
    return flat.reshape(out_shape)


def slice_chunk(steps, layouts, *pieces):
    (x,), _ = _operands(layouts, pieces)
    if all(s == 1 for s in steps):
        return x
    return x[tuple(slice(None, None, s) for s in steps)].copy()


def flip_chunk(axes, layouts, *pieces):
    """The operand's region reversed along `axes`, as a C-ordered copy."""
    return flip_view(axes, layouts, *pieces).copy()


def flip_view(axes, layouts, *pieces):
    """The operand's region reversed along `axes`: a view with negative strides, computed
    by the task that reads it."""
    (x,), _ = _operands(layouts, pieces)
    return x[tuple(slice(None, None, -1) if a in axes else slice(None) for a in range(x.ndim))]


def to_host(x):
    """Move a result chunk to host memory (a NumPy array) for gathering."""
    return dispatch.to_host(x)


def to_device(x):
    """Move a host array onto this worker's device when it has one (identity on CPUs)."""
    engine = dispatch.device_engine()
    return x if engine == "numpy" else dispatch.asarray_on_engine(x, engine)
