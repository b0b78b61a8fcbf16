"""Fixtures shared by all tests."""

from __future__ import annotations

import os
import signal
import uuid

import dask
import hypothesis
import pytest

# Dask's statistical profiler samples the frames of a worker's other threads every 10 ms
# (sys._current_frames). In the threaded workers these tests run inside the pytest process it
# crashed the interpreter once (a segfault in distributed/profile.py, the frame race seen in
# other sampling profilers on CPython 3.11), taking the whole session down. No test reads
# worker profiles. Worker processes read this from the environment Dask passes them too.
dask.config.set({"distributed.worker.profile.enabled": False})

# A LocalCluster closes the nanny of a worker that left the scheduler and did not come back
# within `lost-worker-timeout` (15 s): on a busy 2-core machine a nanny restarting a killed
# worker process can take longer (imports, with three other workers computing), and the
# cluster then stays a worker short for good. The tests that kill workers expect them
# replaced, as on a machine with room to start them.
dask.config.set({"distributed.deploy.lost-worker-timeout": "300s"})

# Hypothesis fails an example that takes over 200 ms by default: a timing assertion that a busy
# CI machine (2 cores, another process beside the tests) breaks with no defect to find. The
# properties are what the tests check; how long an example takes is the benchmarks' business.
hypothesis.settings.register_profile("deepx", deadline=None)
hypothesis.settings.load_profile("deepx")

# The folders whose tests may run two at a time (the test command runs `pytest -n 2 -m
# parallel`, then the rest one at a time): computations checked against NumPy, ONNX Runtime or
# a compiler, with no timing, no process killed, no server and nothing shared between
# processes (each xdist worker has its own session database and cluster). The others
# (clusters of processes, faults, recording, the dashboard, benchmarks) keep the machine to
# themselves, as their time margins assume.
PARALLEL_FOLDERS = ("compiler", "kernels", "onnx", "sdk", "spec")

# Every chunking the partitioner chooses, recorded where asked (tests/partition_recorder.py).
if os.environ.get("DEEPX_RECORD_PARTITIONS"):
    from tests import partition_recorder
    partition_recorder.install(os.environ["DEEPX_RECORD_PARTITIONS"])


def pytest_collection_modifyitems(config, items):
    root = config.rootpath / "tests"
    for item in items:
        parts = item.path.relative_to(root).parts if item.path.is_relative_to(root) else ()
        if parts and parts[0] in PARALLEL_FOLDERS:
            item.add_marker(pytest.mark.parallel)


# A command started in the background by a script (`cmd &`) begins with SIGINT ignored, and
# so does every process it starts. Tests of Ctrl-C (a notebook's "interrupt kernel", a
# terminal's Ctrl-C to a materialization or the scheduler) then test nothing: the signal is
# dropped. The suite runs as from a terminal, wherever it is started: Python's own handler
# here, and the default in the processes the tests start (an exec resets a handled signal).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# --- metadata database ---------------------------------------------------------------------
#
# Tests never write `.deepx/deepx.db` into the working directory: the whole session records
# into a SQLite file in a temporary folder. Tests of the database itself use `db_url`, a fresh
# empty database per test, on SQLite and on the PostgreSQL server at DEEPX_TEST_PG_URL (which
# `.ci/run` starts; DEEPX_REQUIRE_PG=1 there makes a missing server a failure, not a skip).


@pytest.fixture(scope="session", autouse=True)
def _session_db_url(tmp_path_factory):
    """Point DEEPX_DB_URL at a session-wide SQLite file, and DEEPX_ASSET_ROOT at a folder
    beside it, so runs are not recorded, and checkpoints and asset versions not stored, in
    the repo (a test that needs its own sets them again)."""
    folder = tmp_path_factory.mktemp("deepx-db")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DEEPX_DB_URL", f"sqlite:///{(folder / 'deepx.db').as_posix()}")
        mp.setenv("DEEPX_ASSET_ROOT", str(folder / "assets"))
        yield


def _postgres_database():
    """Create a database with a unique name on the test server, yield its URL, drop it."""
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url
    from sqlalchemy.pool import NullPool

    server = os.environ.get("DEEPX_TEST_PG_URL")
    if not server:
        reason = "DEEPX_TEST_PG_URL is not set (no PostgreSQL server to test against)"
        if os.environ.get("DEEPX_REQUIRE_PG") == "1":
            pytest.fail(f"DEEPX_REQUIRE_PG=1 but {reason}")
        pytest.skip(reason)
    name = f"deepx_test_{uuid.uuid4().hex[:16]}"
    admin = create_engine(server, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        try:
            yield make_url(server).set(database=name).render_as_string(hide_password=False)
        finally:
            from deepx_flow.meta.db import close_all
            from deepx_flow.registry.heartbeat import forget_database

            # A session cluster registered there would mark itself gone at exit, in a
            # database dropped by then.
            forget_database(make_url(server).set(database=name).render_as_string(
                hide_password=False))
            close_all()
            with admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """The URL of a fresh, empty metadata database (nothing created in it yet)."""
    from deepx_flow.meta.db import close_all

    if request.param == "sqlite":
        yield f"sqlite:///{(tmp_path / 'deepx.db').as_posix()}"
    else:
        yield from _postgres_database()
    close_all()  # no engine keeps connections to a database that is gone


@pytest.fixture
def db(db_url):
    """The metadata database at `db_url`, opened (so created at the current schema)."""
    from deepx_flow.meta.db import open_db

    return open_db(db_url)


# --- Dask clusters ---------------------------------------------------------------------------


def _session_client(n_workers: int):
    """A LocalCluster of threaded workers (1 thread each) on loopback, and its Client."""
    import logging

    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=False,
                      dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as c:
        yield c


@pytest.fixture(scope="module")
def scheduler():
    """The address of two threaded workers in this process that talk TCP, so a new client
    (a CLI command, a subprocess) can connect."""
    import logging

    from distributed import LocalCluster
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, host="127.0.0.1",
                      protocol="tcp", dashboard_address="127.0.0.1:0",
                      silence_logs=logging.ERROR) as cluster:
        yield cluster.scheduler_address


@pytest.fixture(scope="session")
def client():
    """Two threaded workers, shared by the whole session."""
    yield from _session_client(2)

