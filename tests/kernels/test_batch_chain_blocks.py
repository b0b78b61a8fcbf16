"""A chain's task (`kernels/batch_chain.py`) keeps each stage's buffers and plans from block
to block, and lets them go before a smaller last block: the compiler's budget counts one
block's buffers (`compiler.batch_chain.working_set`), not a full block's and the last one's
at once. Its results are the stages' one by one."""

import tracemalloc

import numpy as np

from deepx_flow.kernels import batch_chain, window

F32 = "float32"
# a 1x1 convolution, its bias and relu, a depthwise 3x3 convolution, then its bias and relu
STAGES = (
    (("window", "conv", {}), (("image", 0), ("whole", 0))),
    (("fused", (("add", (("in", 0), ("in", 1)), F32), ("relu", (("t", 0),), F32)), None),
     (("stage", 0), ("whole", 1))),
    (("window", "conv", {"pads": (1, 1, 1, 1), "groups": 32}), (("stage", 1), ("whole", 2))),
    (("fused", (("add", (("in", 0), ("in", 1)), F32), ("relu", (("t", 0),), F32)), None),
     (("stage", 2), ("whole", 3))),
)


def _operands(n, rng):
    x = rng.standard_normal((n, 8, 40, 40)).astype(np.float32)
    weights = [rng.standard_normal((32, 8, 1, 1)).astype(np.float32),
               rng.standard_normal((32, 1, 1)).astype(np.float32),
               rng.standard_normal((32, 1, 3, 3)).astype(np.float32),
               rng.standard_normal((32, 1, 1)).astype(np.float32)]
    return x, weights


def _one_by_one(x, w):
    h = np.maximum(window.conv(x, w[0], {}) + w[1], 0)
    return np.maximum(window.conv(h, w[2], {"pads": (1, 1, 1, 1), "groups": 32}) + w[3], 0)


def _peak(n, block):
    x, w = _operands(n, np.random.default_rng(n))
    tracemalloc.start()
    try:
        got = batch_chain.batch_chain(STAGES, block, 1, x, *w)
        return tracemalloc.get_traced_memory()[1], got, _one_by_one(x, w)
    finally:
        tracemalloc.stop()


def test_a_smaller_last_block_does_not_keep_the_full_blocks_buffers():
    block = 4
    _peak(2 * block, block)  # compiled once, outside the measure
    full_peak, got, want = _peak(3 * block, block)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    ragged_peak, got, want = _peak(3 * block - 1, block)  # blocks of 4, 4 and 3
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # one block's buffers (4 images of 32 x 40 x 40 float32: 0.8 MiB a buffer), not a full
    # block's and the last block's at once
    assert ragged_peak <= full_peak, (ragged_peak, full_peak)
