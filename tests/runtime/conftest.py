"""Shared Dask clusters for runtime tests (the two-worker `client` is in tests/conftest.py)."""

import pytest

from tests.conftest import _session_client


@pytest.fixture(scope="session")
def client3():
    yield from _session_client(3)
