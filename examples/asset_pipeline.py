"""An asset pipeline, notebook style: read raw data, project it, check it, store versions,
see what is stale, re-run only that, and read the results back.

    python examples/asset_pipeline.py                  # runs every step below
    deepx-flow assets status -m examples/asset_pipeline.py
    deepx-flow materialize -m examples/asset_pipeline.py "*centroid"
    deepx-flow scheduler -m examples/asset_pipeline.py  # the nightly schedule

Runs on the embedded local Dask cluster; the metadata database is `.deepx/deepx.db` and the
stored versions go under `.deepx/assets` in the working directory (DEEPX_DB_URL and
DEEPX_ASSET_ROOT move them). The raw features are a Zarr array this script writes first,
standing in for data that lands from elsewhere.
"""

import os
from pathlib import Path

import numpy as np

import deepx_flow as dx

RAW = Path(os.environ.get("EXAMPLE_RAW", ".deepx/example/features.zarr"))
ROWS, DIM, OUT = 40_000, 256, 64
DAYS = dx.DailyPartitions(start="2026-01-01", end="2026-01-08")  # one week of logs


@dx.asset(code_version="1", description="Raw feature vectors, as they landed.")
def features():
    return dx.read_zarr(str(RAW.resolve()))


@dx.asset(code_version="1")
def projection():
    """A fixed random projection: the same values on any cluster, for any chunking."""
    return dx.random.normal((DIM, OUT), seed=7, dtype="float32") * DIM ** -0.5


@dx.asset(code_version="1", checks=[dx.checks.all_finite, dx.checks.in_range(-1, 1)])
def embeddings(features, projection):
    return dx.tanh(features @ projection)


@dx.asset(checks=[dx.checks.shape((OUT,))])
def centroid(embeddings):
    return embeddings.mean(axis=0)


@dx.asset(partitions=DAYS, partition_axis=0, code_version="1")
def daily_activity(partition):
    """One day of activity counts per user: a slice of a (days * 1000, 16) tensor."""
    return dx.random.uniform((1000, 16), seed=100 + partition.index, dtype="float32")


@dx.asset
def weekly_activity(daily_activity):
    return daily_activity.sum(axis=0)  # reads the whole week: every daily partition


defs = dx.Definitions(
    assets=[features, projection, embeddings, centroid, daily_activity, weekly_activity],
    schedules=[dx.schedule("0 2 * * *", select="embeddings+", only_stale=True)])


def write_raw_features() -> np.ndarray:
    import zarr
    data = np.random.default_rng(0).standard_normal((ROWS, DIM), dtype=np.float32)
    RAW.parent.mkdir(parents=True, exist_ok=True)
    zarr.save_array(str(RAW), data, zarr_format=3)
    return data


def main() -> None:
    raw = write_raw_features()
    print(dx.status(defs), "\n")

    done = dx.materialize(defs, "*centroid")  # centroid and all its upstream assets
    print(done, "\n")
    for name, results in done.checks.items():
        for c in results:
            print(f"  check {name}.{c.check}: {'passed' if c.passed else 'FAILED'} "
                  f"({c.message})")

    # A backfill: three days of a partitioned asset, each stored as its own version.
    print(dx.materialize(defs, "daily_activity", partitions="2026-01-01...2026-01-03"), "\n")
    print(dx.status(defs), "\n")
    # The rest of the week and what reads the week whole: only what is stale runs.
    print(dx.materialize(defs, "daily_activity+", only_stale=True), "\n")

    # Read back lazily; dx.run of a stored asset gives NumPy.
    emb = dx.run(dx.load("embeddings"))
    proj = dx.run(dx.load("projection")).astype(np.float64)
    expected = np.tanh(raw.astype(np.float64) @ proj)
    print(f"embeddings {emb.shape}: max |error| vs NumPy float64 "
          f"{np.abs(emb - expected).max():.2e}")
    week = dx.run(dx.load(daily_activity))  # the asset itself: all partitions, concatenated
    print(f"daily_activity read whole: {week.shape}; weekly sums match: "
          f"{np.allclose(week.sum(axis=0), dx.run(dx.load('weekly_activity')), rtol=1e-5)}")
    assert np.abs(emb - expected).max() < 1e-4
    print("\n" + str(dx.status(defs)))


if __name__ == "__main__":
    main()
