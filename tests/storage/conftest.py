"""A real two-worker Dask cluster for the storage tests: threads in this process, talking
over inproc comms, so nothing listens on the network."""

import logging

import pytest
from distributed import Client, LocalCluster


@pytest.fixture(scope="session")
def client():
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                      dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as cluster, \
            Client(cluster, set_as_default=False) as c:
        yield c
