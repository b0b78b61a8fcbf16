"""One- and three-worker clusters, for training on different numbers of workers."""

import pytest

from tests.conftest import _session_client


@pytest.fixture(scope="session")
def client1():
    yield from _session_client(1)


@pytest.fixture(scope="session")
def client3():
    yield from _session_client(3)
