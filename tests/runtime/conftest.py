"""Shared Dask clusters for runtime tests: started once per session, on loopback only."""

import logging

import pytest
from distributed import Client, LocalCluster


def _client(n_workers: int):
    cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=False,
                           dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR)
    return cluster, Client(cluster)


@pytest.fixture(scope="session")
def client():
    cluster, c = _client(2)
    yield c
    c.close()
    cluster.close()


@pytest.fixture(scope="session")
def client3():
    cluster, c = _client(3)
    yield c
    c.close()
    cluster.close()
