"""Quickstart: the notebook example as a script, on an embedded local Dask cluster.

    python examples/quickstart.py            # 200,000 x 512 input, as in the README
    python examples/quickstart.py --rows 20000

Builds a small MLP layer, prints the plan, runs it, and checks the result against NumPy.
"""

import argparse
import time

import numpy as np

import deepx_flow as dx


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    args = parser.parse_args()

    x = dx.input("x", shape=(args.rows, 512), dtype="float32")
    w = dx.random.normal((512, 1024), seed=0, dtype="float32")
    y = dx.relu(x @ w + 1.0).sum(axis=1)

    plan = dx.compile(y)                 # planned for this machine's embedded cluster
    print(plan.explain())

    x_np = np.random.default_rng(0).standard_normal((args.rows, 512), dtype="float32")
    start = time.perf_counter()
    out = dx.run(y, inputs={"x": x_np})  # starts a local Dask cluster, closes it after
    print(f"\nran in {time.perf_counter() - start:.1f} s: y has shape {out.shape}, "
          f"dtype {out.dtype}")

    # Check against NumPy: the random weights depend only on (seed, index), so recompute them.
    w_np = dx.run(w)
    ref = np.maximum(x_np @ w_np + 1.0, 0).sum(axis=1)
    err = np.abs(out - ref).max() / np.abs(ref).max()
    print(f"max relative difference from NumPy: {err:.2e}")
    assert err < 1e-4


if __name__ == "__main__":
    main()
