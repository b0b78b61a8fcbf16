"""Shared Dask clusters for runtime tests: started once per session, on loopback only."""

import logging

import pytest
from distributed import Client, LocalCluster


def _session_client(n_workers: int):
    with LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=False,
                      dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as c:
        yield c


@pytest.fixture(scope="session")
def client():
    yield from _session_client(2)


@pytest.fixture(scope="session")
def client3():
    yield from _session_client(3)
