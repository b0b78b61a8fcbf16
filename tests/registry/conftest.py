"""Clusters and a fresh metadata database for the registry tests (loopback only)."""

import logging

import pytest
from distributed import Client, LocalCluster

from deepx_flow.meta import open_db
from tests.helpers import threaded_memory_off


@pytest.fixture
def sqlite_db(tmp_path):
    return open_db(f"sqlite:///{(tmp_path / 'd.db').as_posix()}")


@pytest.fixture(scope="module")
def client():
    """Two threaded workers in this process (inproc comms), 1 GiB memory limit each."""
    with threaded_memory_off(), \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=False, memory_limit="1GiB",
                         dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as cluster, \
            Client(cluster, set_as_default=False) as c:
        yield c
