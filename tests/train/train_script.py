"""A training run for the resume tests, run as its own process:

    python train_script.py ASSET OUT.npz

It trains a small float64 MLP on fixed data with checkpoints every 10 steps into asset ASSET
(resuming from the newest one if there is one), on the embedded cluster, and saves the final
parameters to OUT.npz. The metadata database and asset root come from DEEPX_DB_URL and
DEEPX_ASSET_ROOT.
"""

import sys

import numpy as np

import deepx_flow as dx


def main(asset: str, out: str) -> None:
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2000, 8))
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1).astype(np.int64)
    model = dx.nn.Sequential(dx.nn.Linear(8, 16, dtype="float64"), dx.nn.tanh,
                             dx.nn.Linear(16, 3, dtype="float64"))
    fit = dx.train(lambda p, xb, yb: dx.nn.cross_entropy(model(p, xb), yb),
                   model.init(seed=3), data=(x, y), batch_size=20, epochs=2, seed=9,
                   optimizer=dx.optim.Adam(lr=0.01), steps_per_graph=5,
                   checkpoint=asset, checkpoint_every=10, resume=True, progress=False)
    np.savez(out, **fit.values)
    print(f"done {fit.steps} steps, training {fit.training_id}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
