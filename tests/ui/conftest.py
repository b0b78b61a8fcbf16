"""One database seeded by real work, and one dashboard serving it, for all browser tests.

The seed is what a user's day leaves behind: a `dx.run`, a run that failed, a `dx.persist`
(chunk placements), assets materialized with checks and partitions, a schedule tick that
launched a run, and the cluster's registration (workers, storage tiers, operators, measured
links). The cluster stays up while the tests run, so the overview page can read the scheduler too.

Without /usr/bin/chromium the browser tests skip, unless DEEPX_REQUIRE_BROWSER=1 (set by
`.ci/run`, which installs it) makes that a failure.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

CHROMIUM = "/usr/bin/chromium"


def browser_or_skip() -> None:
    reason = None
    if not Path(CHROMIUM).is_file():
        reason = f"{CHROMIUM} is missing (apt install chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            reason = "playwright is not installed (pip install -e '.[dev]')"
    if reason:
        if os.environ.get("DEEPX_REQUIRE_BROWSER") == "1":
            pytest.fail(f"DEEPX_REQUIRE_BROWSER=1 but {reason}")
        pytest.skip(reason)


def _seed(url: str, client, asset_root: Path) -> SimpleNamespace:
    import deepx_flow as dx
    from deepx_flow.meta import open_db
    from deepx_flow.registry.network import probe_network
    from deepx_flow.registry.operators import register_operators
    from deepx_flow.registry.register import register_cluster
    from deepx_flow.runtime.run import cluster_spec
    from deepx_flow.scheduler.daemon import SchedulerDaemon

    db = open_db(url)
    x = dx.random.normal((16_000, 256), seed=3, dtype="float64")  # 8 chunks of 4 MiB
    dx.run((dx.tanh(x) * 2.0).sum(axis=0), client=client)
    _failed_run(dx, client, asset_root.parent)
    # Planned for workers with 64 KiB free each, so the kept tensor is 8 chunks on both.
    spec = cluster_spec(client=client)
    small = dataclasses.replace(spec, workers=tuple(
        dataclasses.replace(w, memory=w.reserved + 64 * 2**10) for w in spec.workers))
    kept = dx.persist(dx.exp(dx.random.uniform((300, 40), seed=5)) + 1.0, client=client,
                      cluster=small)

    @dx.asset(code_version="1", checks=[dx.checks.all_finite])
    def features():
        return dx.random.normal((200, 16), seed=11, dtype="float32")

    @dx.asset(checks=[dx.checks.shape((16,))])
    def feature_mean(features):
        return features.mean(axis=0)

    @dx.asset(partitions=dx.DailyPartitions(start="2026-01-01", end="2026-01-03"),
              partition_axis=0)
    def daily(partition):
        return dx.random.uniform((10, 4), seed=partition.index, dtype="float32")

    defs = dx.Definitions(assets=[features, feature_mean, daily], schedules=[
        dx.schedule("0 * * * *", "feature_mean", name="hourly_mean")])
    dx.materialize(defs, client=client, db=url)
    at = {"now": 1_800_000_000.0}
    daemon = SchedulerDaemon(defs, db, client, definitions="tests/ui/conftest.py",
                             out=io.StringIO(), clock=lambda: at["now"])
    daemon.start()
    at["now"] += 3600.0
    daemon.evaluate(at["now"])
    daemon.drain()
    register_cluster(client, db)
    probe_network(client, db, nbytes=1 << 16)
    register_operators(db)
    fit = _training(dx, client, url)
    served = _serving(db, client, asset_root.parent)
    return SimpleNamespace(url=url, db=db, defs=defs, persisted=kept, fit=fit,
                           served=served)


def _serving(db, client, folder: Path):
    """A model repository served for real (an MLP on two replicas of the cluster's workers,
    one file that is not a model), 7 requests of 11 rows and one refused, recorded as a
    gateway records them."""
    import numpy as np

    from deepx_flow.errors import InputError
    from deepx_flow.runtime.run import cluster_spec
    from deepx_flow.serving.records import record
    from deepx_flow.serving.repository import ModelRepository
    from tests.onnx.test_onnx_import import mlp_model
    root = folder / "models"
    (root / "mlp" / "1").mkdir(parents=True)
    mlp_model(root / "mlp" / "1" / "model.onnx")
    (root / "mlp" / "config.pbtxt").write_text("instance_group [ { count: 2 } ]\n")
    (root / "broken" / "1").mkdir(parents=True)
    (root / "broken" / "1" / "model.onnx").write_bytes(b"not a model")
    models = ModelRepository(root, cluster_spec(None, client), client)
    try:
        models.load_all()
        for rows in (1, 1, 1, 1, 1, 3, 3):
            models.infer("mlp", "", {"x": np.ones((rows, 784), np.float32)})
        with pytest.raises(InputError):
            models.infer("mlp", "", {"x": np.ones((1, 5), np.float32)})
        return record(models, db, gateway="seed-host:4242")
    finally:
        models.stop()


def _training(dx, client, url):
    """A short training (2 graphs of 6 steps, a held-out loss every 4 steps)."""
    import numpy as np
    rng = np.random.default_rng(0)
    x = rng.standard_normal((120, 5))
    y = (x[:, 0] > 0).astype(np.int64)
    model = dx.nn.Linear(5, 2, dtype="float64")
    return dx.train(lambda p, a, b: dx.nn.cross_entropy(model(p, a), b), model.init(seed=1),
                    data=(x[:100], y[:100]), batch_size=8, epochs=1, steps_per_graph=6,
                    eval_data=(x[100:], y[100:]), eval_every=4, progress=False,
                    client=client, db=url)


def _failed_run(dx, client, folder: Path) -> None:
    """A run that fails for real: one chunk of its Zarr input is corrupt (a DataError; the
    run and its erred task are recorded)."""
    import zarr
    store = folder / "corrupt.zarr"
    z = zarr.create_array(store, shape=(400, 100), chunks=(100, 100), dtype="float64")
    z[:] = 1.0
    (store / "c" / "2" / "0").write_bytes(b"not a compressed chunk")  # rows 200-299
    x = dx.input("x", (400, 100), "float64")
    with pytest.raises(dx.DataError):
        dx.run(x * 2.0, inputs={"x": str(store)}, client=client)


@pytest.fixture(scope="package")
def seeded(tmp_path_factory):
    """The seeded database (its url, the opened `db`, the `defs` it materialized), and the
    scheduler address of the cluster that did the work (`scheduler`, `client`)."""
    browser_or_skip()
    from distributed import Client, LocalCluster
    root = tmp_path_factory.mktemp("ui-seed")
    url = f"sqlite:///{(root / 'deepx.db').as_posix()}"
    with pytest.MonkeyPatch.context() as mp, \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                         host="127.0.0.1", protocol="tcp", dashboard_address="127.0.0.1:0",
                         silence_logs=logging.ERROR) as cluster, \
            Client(cluster, set_as_default=False) as client:
        mp.setenv("DEEPX_DB_URL", url)
        mp.setenv("DEEPX_ASSET_ROOT", str(root / "assets"))
        seed = _seed(url, client, root / "assets")
        seed.scheduler, seed.client = cluster.scheduler_address, client
        seed.dask_dashboard = cluster.dashboard_link
        yield seed


@pytest.fixture(scope="package")
def dashboard(seeded):
    """The dashboard serving the seeded database on loopback: its base URL."""
    from deepx_flow.ui.server import serve
    from tests.helpers import free_port
    from tests.ui.test_server import wait_until_serving
    port = free_port()
    server = serve(db=seeded.url, port=port, scheduler=seeded.scheduler, threaded=True)
    try:
        wait_until_serving(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture(scope="package")
def chromium():
    """The one headless Chromium of the browser tests. Playwright's sync API runs its event
    loop on this thread while it is open, so a second `sync_playwright()` beside it fails
    ("Sync API inside the asyncio loop"): every module shares this one."""
    browser_or_skip()
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture(scope="package")
def browser(dashboard, chromium):
    """The browser, once the seeded dashboard serves."""
    return chromium
