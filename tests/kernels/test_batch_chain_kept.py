"""A chain called again within `kept_between_calls` (a served model's batches, its weights
read-only) takes up its plans and buffers from its last call on as many images in this
thread: its results are those of a fresh call and of a float64 reference, whatever the
order of sizes; a result is never written over by a later call; weights in other memory
are not mistaken for the ones a plan was made for, and writeable ones are never trusted;
outside the context, and in another thread, nothing is kept."""

import threading

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from deepx_flow.kernels import batch_chain

F32 = "float32"
POOL = {"kernel": (2, 2), "strides": (2, 2)}
# a 1x1 convolution, its bias and relu, a 2x2 max pooling (which may run before the bias
# and relu: their operands are finite), a depthwise 3x3 convolution, its bias and relu
STAGES = (
    (("window", "conv", {}), (("image", 0), ("whole", 0))),
    (("fused", (("add", (("in", 0), ("in", 1)), F32), ("relu", (("t", 0),), F32)), (1,)),
     (("stage", 0), ("whole", 1))),
    (("window", "max_pool", POOL), (("stage", 1),)),
    (("window", "conv", {"pads": (1, 1, 1, 1), "groups": 16}), (("stage", 2), ("whole", 2))),
    (("fused", (("add", (("in", 0), ("in", 1)), F32), ("relu", (("t", 0),), F32)), None),
     (("stage", 3), ("whole", 3))),
)
BLOCK = 4


def _weights(seed: int, writeable: bool = False) -> list:
    rng = np.random.default_rng(seed)
    out = [rng.standard_normal((16, 3, 1, 1)).astype(np.float32),
           rng.standard_normal((16, 1, 1)).astype(np.float32),
           rng.standard_normal((16, 1, 3, 3)).astype(np.float32),
           rng.standard_normal((16, 1, 1)).astype(np.float32)]
    for a in out:
        a.flags.writeable = writeable  # (as serving binds them: read-only)
    return out


def _reference(x, w) -> np.ndarray:
    """The chain in float64, written out."""
    x, w = x.astype(np.float64), [a.astype(np.float64) for a in w]
    h = np.maximum(np.einsum("nchw,oc->nohw", x, w[0][:, :, 0, 0]) + w[1], 0)
    n, c, hh, ww = h.shape
    h = h.reshape(n, c, hh // 2, 2, ww // 2, 2).max(axis=(3, 5))
    p = np.pad(h, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = sum(p[:, :, i:i + h.shape[2], j:j + h.shape[3]] * w[2][None, :, 0, i, j, None, None]
              for i in range(3) for j in range(3))
    return np.maximum(out + w[3], 0)


def _images(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 3, 8, 8)).astype(np.float32)


def _check(got, x, w):
    np.testing.assert_allclose(got, _reference(x, w), rtol=1e-4, atol=1e-4)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from([1, 3, 4, 5, 8, 11]), min_size=2, max_size=8))
def test_kept_calls_give_fresh_calls_results_in_any_order_of_sizes(sizes):
    w = _weights(0)
    xs = [_images(n, k) for k, n in enumerate(sizes)]
    fresh = [batch_chain.batch_chain(STAGES, BLOCK, 1, x, *w) for x in xs]  # (nothing kept)
    done = []
    with batch_chain.kept_between_calls():
        for x, want in zip(xs, fresh):
            for _ in range(2):  # (the second takes up what the first kept)
                got = batch_chain.batch_chain(STAGES, BLOCK, 1, x, *w)
                np.testing.assert_array_equal(got, want)
                _check(got, x, w)
                done.append((got, got.copy()))
    for got, then in done:
        np.testing.assert_array_equal(got, then)  # no later call wrote over it


def test_weights_in_other_memory_get_a_plan_of_their_own():
    x = _images(3, 1)
    with batch_chain.kept_between_calls():
        first, second = _weights(1), _weights(2)
        _check(batch_chain.batch_chain(STAGES, BLOCK, 1, x, *first), x, first)
        _check(batch_chain.batch_chain(STAGES, BLOCK, 1, x, *second), x, second)
        # the same values in another array: taken up again or not, the answer holds
        copies = [a.copy() for a in second]
        _check(batch_chain.batch_chain(STAGES, BLOCK, 1, x, *copies), x, copies)
        # a bias made non-finite: its pooling may no longer go first, nor keep its plan
        worse = [a.copy() for a in second]
        worse[1][0] = -np.inf
        got = batch_chain.batch_chain(STAGES, BLOCK, 1, x, *worse)
    with np.errstate(invalid="ignore"):
        _check(got, x, worse)


def test_writeable_weights_are_never_trusted_to_stay_as_they_were():
    """Weights an in-process caller may write between calls (writeable): each call plans
    anew, so a bias refilled in place, made non-finite, is seen."""
    x = _images(3, 6)
    w = _weights(7, writeable=True)
    with batch_chain.kept_between_calls():
        before = _kept_here()
        _check(batch_chain.batch_chain(STAGES, BLOCK, 1, x, *w), x, w)
        w[1][...] = -np.inf  # (its pooling may no longer go first)
        w[2] *= 2
        got = batch_chain.batch_chain(STAGES, BLOCK, 1, x, *w)
        assert _kept_here() == before  # nothing kept for them
    with np.errstate(invalid="ignore"):
        _check(got, x, w)


def _kept_here() -> int:
    return len(getattr(batch_chain._local, "calls", {}))


def test_nothing_is_kept_outside_the_context_and_each_thread_keeps_its_own():
    w = _weights(3)
    seen = {}

    def run(name, kept: bool):
        x = _images(5, 4)
        if kept:
            with batch_chain.kept_between_calls():
                for _ in range(3):
                    _check(batch_chain.batch_chain(STAGES, BLOCK, 1, x, *w), x, w)
        else:
            _check(batch_chain.batch_chain(STAGES, BLOCK, 1, x, *w), x, w)
        seen[name] = _kept_here()

    threads = [threading.Thread(target=run, args=(f"kept{i}", True)) for i in range(2)]
    threads.append(threading.Thread(target=run, args=("plain", False)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {"kept0": 1, "kept1": 1, "plain": 0}


def test_a_thread_keeps_the_latest_calls_only():
    w = _weights(5)
    with batch_chain.kept_between_calls():
        for n in range(1, batch_chain.REUSED_CALLS + 6):
            x = _images(n, n)
            _check(batch_chain.batch_chain(STAGES, BLOCK, 1, x, *w), x, w)
    assert _kept_here() == batch_chain.REUSED_CALLS
