"""A fresh metadata database and asset root for each asset test."""

import pytest

from deepx_flow.meta import open_db
from deepx_flow.meta.db import close_all


@pytest.fixture
def env(db_url, tmp_path, monkeypatch):
    """The opened metadata database; assets are stored under tmp_path/assets."""
    monkeypatch.setenv("DEEPX_DB_URL", db_url)
    monkeypatch.setenv("DEEPX_ASSET_ROOT", str(tmp_path / "assets"))
    yield open_db(db_url)
    close_all()
