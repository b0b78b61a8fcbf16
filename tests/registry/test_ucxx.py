"""A graph runs over UCX (UCXX: `protocol="ucx"` or `"ucxx"`), with no GPU: UCX's TCP
transport carries the transfers between two worker processes. The registry records the
protocol and `deepx-flow registry probe` measures the links over it, as on GPU nodes where
UCX takes NVLink and InfiniBand instead.

`distributed-ucxx` pins dask and distributed to the version dask-cuda pins (2026.7.1), so
`.ci/run` runs this module in a virtual environment of its own with that version (which also
proves the base install on it), and DEEPX_REQUIRE_UCXX=1 there makes a UCXX that cannot start
a failure. In the main environment, without distributed-ucxx, it skips and says so.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import numpy as np
import pytest
from sqlmodel import select

import deepx_flow as dx
from deepx_flow.meta import open_db
from deepx_flow.meta.models import Link, Worker

pytestmark = pytest.mark.slow


def _ucxx_or_skip() -> None:
    try:
        import distributed_ucxx  # noqa: F401
        import ucxx  # noqa: F401
    except Exception as e:  # not installed (the main environment), or a broken install
        reason = (f"distributed-ucxx is not importable here ({type(e).__name__}: {e}); "
                  ".ci/run tests UCXX in .venv-ucxx (pip install distributed-ucxx-cu12)")
        if os.environ.get("DEEPX_REQUIRE_UCXX") == "1":
            pytest.fail(f"DEEPX_REQUIRE_UCXX=1 but {reason}")
        pytest.skip(reason)


# distributed-ucxx serves both names: "ucx" (what `dask scheduler --protocol ucx` and
# dask-cuda use) and its legacy "ucxx".
@pytest.mark.timeout(300)
@pytest.mark.parametrize("protocol", ["ucx", "ucxx"])
def test_a_graph_runs_over_ucx_and_the_registry_records_it(tmp_path, monkeypatch, protocol):
    _ucxx_or_skip()
    from distributed import Client, LocalCluster

    db_url = f"sqlite:///{tmp_path / 'deepx.db'}"
    monkeypatch.setenv("DEEPX_DB_URL", db_url)
    monkeypatch.setenv("UCX_TLS", "tcp")  # no GPU, NVLink or InfiniBand here
    with LocalCluster(protocol=protocol, host="127.0.0.1", n_workers=2, threads_per_worker=1,
                      processes=True, dashboard_address="127.0.0.1:0",
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        address = client.scheduler.address
        assert address.startswith(f"{protocol}://127.0.0.1:")
        # A reduction over chunks spread on both workers: partial sums cross between them.
        x = dx.input("x", shape=(40_000, 64), dtype="float64")
        data = np.random.default_rng(0).standard_normal((40_000, 64))
        out = dx.run((dx.tanh(x) * 2.0).sum(axis=0), inputs={"x": data}, client=client)
        expected = (np.tanh(data) * 2.0).sum(axis=0)
        np.testing.assert_allclose(out, expected, rtol=0,
                                   atol=1e-12 * np.abs(np.tanh(data) * 2.0).sum(axis=0).max())

        db = open_db(db_url)
        with db.read() as s:
            workers = s.exec(select(Worker).where(Worker.scheduler == address)).all()
        assert len(workers) == 2 and {w.protocol for w in workers} == {protocol}

        env = {**os.environ, "DEEPX_DB_URL": db_url, "UCX_TLS": "tcp"}
        probe = subprocess.run([sys.executable, "-m", "deepx_flow.cli.main", "registry",
                                "probe", "--scheduler", address, "--bytes", "4MiB"],
                               env=env, capture_output=True, text=True, timeout=180)
        assert probe.returncode == 0, probe.stderr[-2000:]
        assert "Measured 2 link(s)" in probe.stdout, probe.stdout
        with db.read() as s:
            links = s.exec(select(Link).where(Link.scheduler == address)).all()
        assert len(links) == 2 and {link.protocol for link in links} == {protocol}
        assert all(link.bandwidth > 1e6 and 0 < link.latency < 1.0 for link in links)
