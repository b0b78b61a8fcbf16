"""Versions stored before manifests bound each chunk to its position (a format-1 manifest of
keys and sizes, no digest in their row) are never taken as bound: `assets verify` checks
what it can and reports them as of the older format; `--upgrade`, or their first read by
`dx.load`, binds them once (a format-2 manifest written anew, its digest recorded), after
which a moved chunk is found; one that is damaged is not upgraded."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import zarr

import deepx_flow as dx
from deepx_flow.assets import catalog
from deepx_flow.cli.main import main
from deepx_flow.meta.models import AssetMaterialization
from tests.storage.test_manifest import MOVED, format_1


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setenv("DEEPX_MIN_CHUNK_BYTES", str(1 << 14))  # several chunks per version


def stored_older(client, env):
    """A version of `base` as versions were stored before: its row (now without a digest)
    and the digest it had."""
    @dx.asset
    def base():
        return dx.random.normal((1024, 16), seed=3, dtype="float64")

    dx.materialize(dx.Definitions(assets=[base]), client=client)
    row = catalog.latest(env, "base")
    format_1(row.uri)
    with env.session() as s:
        s.get(AssetMaterialization, row.id).manifest_digest = None
    return catalog.latest(env, "base"), row.manifest_digest


def swap_two_chunks(row) -> None:
    a, b = sorted(p for p in Path(row.uri, "c").rglob("*") if p.is_file())[:2]
    first, second = a.read_bytes(), b.read_bytes()
    assert first != second
    a.write_bytes(second)
    b.write_bytes(first)


def test_verify_reports_an_older_version_and_upgrade_binds_it(client, env, capsys):
    row, digest = stored_older(client, env)
    assert main(["assets", "verify", "--db", env.url]) == 0
    out = capsys.readouterr().out
    assert "ok, older format: chunk positions not bound" in out and "--upgrade" in out

    assert main(["assets", "verify", "--upgrade", "--db", env.url]) == 0
    assert "upgraded" in capsys.readouterr().out
    assert catalog.latest(env, "base").manifest_digest == digest  # the manifest written

    swap_two_chunks(row)
    assert main(["assets", "verify", "--db", env.url]) == 2
    assert re.search(MOVED, capsys.readouterr().out)
    with pytest.raises(dx.DataError, match=MOVED):
        dx.run(dx.load("base"), client=client)


def test_an_older_version_is_bound_on_its_first_read(client, env):
    row, digest = stored_older(client, env)
    written = np.asarray(zarr.open_array(row.uri, mode="r")[...])
    np.testing.assert_array_equal(dx.run(dx.load("base"), client=client), written)
    assert catalog.latest(env, "base").manifest_digest == digest
    swap_two_chunks(row)
    with pytest.raises(dx.DataError, match=MOVED):
        dx.run(dx.load("base"), client=client)


def test_a_damaged_older_version_is_not_upgraded(client, env, capsys):
    row, _ = stored_older(client, env)
    victim = sorted(p for p in Path(row.uri, "c").rglob("*") if p.is_file())[1]
    victim.write_bytes(victim.read_bytes()[:-1])
    assert main(["assets", "verify", "--upgrade", "--db", env.url]) == 2
    assert "DAMAGED" in capsys.readouterr().out
    with pytest.raises(dx.DataError):
        dx.load("base")
    assert catalog.latest(env, "base").manifest_digest is None
