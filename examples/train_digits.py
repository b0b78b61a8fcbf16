"""Train an MLP on the handwritten digits scikit-learn ships, and report held-out accuracy.

    python examples/train_digits.py

The 1,797 8x8 digits come with scikit-learn (no download). The model is a function of named
parameter tensors; `dx.train` runs forward, backward and the Adam update on the embedded
local cluster, several steps per Dask graph; inference is the same model, forward only.
"""

import sys

import numpy as np

try:
    from sklearn.datasets import load_digits
except ImportError:  # the `examples` extra is not installed: say so, without a traceback
    print('train_digits.py needs scikit-learn, for its bundled digits: pip install -e '
          '".[examples]"', file=sys.stderr)
    sys.exit(2)

import deepx_flow as dx


def main(epochs: int = 15, seed: int = 0) -> float:
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)  # pixels in [0, 1]
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    train, test = order[:1500], order[1500:]

    model = dx.nn.Sequential(dx.nn.Linear(64, 128), dx.nn.relu, dx.nn.Linear(128, 10))
    fit = dx.train(lambda p, xb, yb: dx.nn.cross_entropy(model(p, xb), yb),
                   model.init(seed=seed), data=(x[train], y[train]), batch_size=50,
                   epochs=epochs, seed=seed, steps_per_graph=30,
                   optimizer=dx.optim.Adam(lr=3e-3, schedule=dx.optim.Cosine(epochs * 30)),
                   eval_data=(x[test], y[test]), eval_every=150)
    print(f"{fit.steps} steps: training loss {fit.history[0]['loss']:.3f} -> "
          f"{fit.history[-1]['loss']:.3f}, held-out loss {fit.evaluations[-1]['loss']:.3f}")

    # Inference: the same model, forward only, on the trained parameters.
    images = dx.input("images", x[test].shape, "float32")
    predicted = dx.run(model(fit.params, images).argmax(axis=1),
                       inputs={**fit.inputs, "images": x[test]})
    accuracy = float((predicted == y[test]).mean())
    print(f"held-out accuracy: {accuracy:.4f} ({len(test)} digits)")
    return accuracy


if __name__ == "__main__":
    main()
