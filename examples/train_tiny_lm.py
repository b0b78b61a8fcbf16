"""Train a small character-level language model on text that ships with Python, and compare
its held-out loss with an independent NumPy implementation after the same steps.

    python examples/train_tiny_lm.py [--steps 60] [--memory]

The text is the source of Python's own `difflib` module (no download). The model is
`dx.nn.TransformerLM` (causal self-attention in blocks, layer norm, GELU, tied embeddings);
`dx.train` runs its forward pass, its backward pass (the compiler's `differentiate` pass)
and Adam on the embedded local cluster. The reference (`tiny_lm_numpy.py`) is the same
model and optimizer written out in NumPy in float64, full-softmax attention, with the
gradients derived by hand; both start from the same parameters and take the same full-batch
steps. `--memory` also measures the peak memory of the attention blocks at growing sequence
lengths: the forward pass's grows with the length, not with its square; the backward pass
(still) keeps the forward's tiles, which FlashAttention computes again.
"""

from __future__ import annotations

import argparse
import difflib
import inspect
import sys
import threading
import time
from pathlib import Path

import numpy as np

import deepx_flow as dx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_lm_numpy  # noqa: E402  (the reference, beside this file)

LENGTH = 64            # positions per sequence
TRAIN, HELD_OUT = 64, 16  # sequences


def corpus() -> tuple[np.ndarray, np.ndarray, int]:
    """Training and held-out sequences of character ids (with their next characters as
    targets), and the vocabulary's size."""
    text = inspect.getsource(difflib)
    need = (TRAIN + HELD_OUT) * LENGTH + 1
    text = text[:need]
    vocab = sorted(set(text))
    ids = np.array([vocab.index(c) for c in text], np.int64)

    def windows(start, count):
        x = np.stack([ids[start + i * LENGTH:start + (i + 1) * LENGTH] for i in range(count)])
        y = np.stack([ids[start + i * LENGTH + 1:start + (i + 1) * LENGTH + 1]
                      for i in range(count)])
        return x, y
    return windows(0, TRAIN), windows(TRAIN * LENGTH, HELD_OUT), len(vocab)


def main(steps: int = 60, lr: float = 3e-3, seed: int = 0) -> dict:
    (x, y), (hx, hy), vocab = corpus()
    model = dx.nn.TransformerLM(vocab=vocab, length=LENGTH, dim=32, heads=4, layers=2,
                                block=16)
    start = dx.run(model.init(seed))  # both trainings start here
    began = time.perf_counter()
    fit = dx.train(model.loss, start, data=(x, y), batch_size=TRAIN, epochs=steps,
                   optimizer=dx.optim.Adam(lr=lr), steps_per_graph=10, eval_data=(hx, hy),
                   seed=seed)
    took = time.perf_counter() - began
    held_out = fit.evaluations[-1]["loss"]
    losses, trained = tiny_lm_numpy.train(start, x, y, steps, layers=2, heads=4, lr=lr)
    reference, _ = tiny_lm_numpy.loss_and_grads(trained, hx, hy, 2, 4, grads=False)
    gap = abs(held_out - reference) / reference
    print(f"{fit.steps} steps of {TRAIN} x {LENGTH} characters ({vocab} distinct) in "
          f"{took:.1f} s: training loss {fit.history[0]['loss']:.4f} -> "
          f"{fit.history[-1]['loss']:.4f} (NumPy float64: {losses[0]:.4f} -> "
          f"{losses[-1]:.4f})")
    print(f"held-out loss: deepx_flow {held_out:.4f}, NumPy reference {reference:.4f} "
          f"({gap:.2%} apart)")
    return {"held_out": held_out, "reference": reference, "gap": gap,
            "losses": [h["loss"] for h in fit.history], "reference_losses": losses}


def attention_memory(lengths=(512, 1024, 2048, 4096), block: int = 128, dim: int = 16
                     ) -> list:
    """The attention blocks' peak memory per sequence length: the bytes of results a worker
    holds, sampled every half millisecond while they run (a worker in this process, so the
    sampler reads its store directly), for the forward pass and for forward and backward."""
    from distributed import Client, LocalCluster
    rows = []
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        worker = next(iter(cluster.workers.values()))
        for length in lengths:
            rng = np.random.default_rng(0)
            arrays = dict(zip("qkv", (rng.standard_normal((1, length, dim)).astype(np.float32)
                                      for _ in range(3))))
            q, k, v = (dx.input(n, (1, length, dim)) for n in "qkv")
            out = dx.nn.causal_attention(q, k, v, block=block)
            forward = _sampled(worker, lambda: dx.run(out.sum(axis=-1), inputs=arrays,
                                                       client=client, progress=False))
            grads = dx.grad(out.sum(), [q, k, v])
            backward = _sampled(worker, lambda: dx.run(grads, inputs=arrays, client=client,
                                                        progress=False))
            rows.append((length, forward, backward, length * length * 4))
    print(f"{'sequence':>9}  {'forward peak':>13}  {'with backward':>14}  "
          f"{'one score matrix':>17}")
    for length, forward, backward, full in rows:
        print(f"{length:>9}  {forward / 2**20:>9.2f} MiB  {backward / 2**20:>10.2f} MiB  "
              f"{full / 2**20:>13.2f} MiB")
    return rows


def _sampled(worker, run) -> int:
    """The most bytes of results `worker` held while `run()` ran."""
    peak, done = [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], worker.state.nbytes)
            time.sleep(0.0005)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        run()
    finally:
        done.set()
        sampler.join()
    return peak[0]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--memory", action="store_true",
                        help="also measure the attention blocks' peak memory")
    args = parser.parse_args()
    result = main(args.steps)
    if args.memory:
        attention_memory()
    sys.exit(0 if result["gap"] <= 0.02 else 1)
