"""A chunk of a stored asset version deleted, truncated or changed by one bit, chosen at
random (seeded), in an unpartitioned and in a partitioned asset. The damage is found by
`dx.load`, by `deepx-flow assets verify` and by a downstream materialization; with
`recompute_damaged=False` that materialization fails and publishes nothing, by default it
computes the damaged version again from its lineage, records the event, and stores a result
equal to NumPy's from the undamaged data."""

from __future__ import annotations

import json
import re
import zlib
from pathlib import Path

import numpy as np
import pytest
import zarr
from sqlmodel import select

import deepx_flow as dx
from deepx_flow.assets import catalog
from deepx_flow.cli.main import main
from deepx_flow.meta.models import Event
from tests.helpers import unreadable

DAMAGES = ("delete", "truncate", "flip")
PARTS = dx.StaticPartitions(["p0", "p1", "p2"])


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setenv("DEEPX_MIN_CHUNK_BYTES", str(1 << 14))  # several chunks per version


def pipeline():
    @dx.asset
    def base():
        return dx.random.normal((2048, 16), seed=3, dtype="float64")

    @dx.asset(partitions=PARTS, partition_axis=0)
    def part(partition, base):
        return base[:512] * (partition.index + 1.0)

    @dx.asset
    def base_rows(base):
        return base.sum(axis=1)

    @dx.asset
    def part_rows(part):  # every partition, read whole
        return part.sum(axis=1)

    return dx.Definitions(assets=[base, part, base_rows, part_rows])


def stored(row) -> np.ndarray:
    return np.asarray(zarr.open_array(row.uri, mode="r")[...])


def chunk_files(row) -> list[Path]:
    return sorted(p for p in Path(row.uri, "c").rglob("*") if p.is_file())


def damage(path: Path, how: str, rng) -> None:
    data = path.read_bytes()
    if how == "delete":
        path.unlink()
    elif how == "truncate":
        path.write_bytes(data[:int(rng.integers(0, len(data)))])
    else:
        changed = bytearray(data)
        changed[int(rng.integers(0, len(data)))] ^= 1 << int(rng.integers(0, 8))
        path.write_bytes(bytes(changed))


@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.parametrize("target", ["base", "part[p1]"])
def test_a_damaged_chunk_is_found_and_mended_from_lineage(client, env, capsys, how, target):
    rng = np.random.default_rng(zlib.crc32(f"{how} {target}".encode()))  # the same each run
    defs = pipeline()
    dx.materialize(defs, client=client)
    asset, _, partition = target.rstrip("]").partition("[")
    partition = partition or None
    row = catalog.latest(env, asset, partition)
    good = {p: stored(catalog.latest(env, "part", p)) for p in PARTS.keys()}
    good[None] = stored(catalog.latest(env, "base"))
    files = chunk_files(row)
    assert len(files) >= 2
    victim = files[int(rng.integers(0, len(files)))]
    chunk = tuple(int(p) for p in victim.relative_to(Path(row.uri, "c")).parts)
    damage(victim, how, rng)
    named = [f"asset {asset}", f"version {row.version[:12]}", f"chunk {chunk}"] + \
        ([f"partition {partition}"] if partition else [])

    # dx.load: the listing finds a deleted or truncated chunk at once, a read the rest.
    with pytest.raises(dx.DataError) as err:
        dx.run(dx.load(asset, partition=partition), client=client)
    assert all(n in str(err.value) for n in named), str(err.value)
    assert (err.value.asset, err.value.version, err.value.partition, err.value.chunk) == \
        (asset, row.version, partition, chunk)

    # assets verify: exit 2, the damaged version named; the others whole.
    assert main(["assets", "verify", "--db", env.url]) == 2
    out, errors = capsys.readouterr()
    assert all(n in errors for n in named) and len(errors.splitlines()) == 1
    assert out.count("DAMAGED") == 1 and f"chunk {chunk}" in out

    # A downstream materialization told not to mend: fails, publishes nothing.
    downstream = "base_rows" if asset == "base" else "part_rows"
    before = len(catalog.history(env, downstream))
    with pytest.raises(dx.DataError, match=re.escape(f"chunk {chunk}")):
        dx.materialize(defs, downstream, client=client,
                       recovery=dx.Recovery(recompute_damaged=False))
    assert len(catalog.history(env, downstream)) == before

    # By default: the damaged version is computed again, the run records it, and the result
    # is NumPy's from the undamaged data.
    done = dx.materialize(defs, downstream, client=client)
    mended = catalog.latest(env, asset, partition)
    assert mended.version != row.version
    assert np.array_equal(stored(mended), good[partition])
    new = done.versions[downstream]
    assert json.loads(new.upstream_versions)[target] == mended.version
    expected = good[None].sum(axis=1) if asset == "base" else \
        np.concatenate([good[p] for p in PARTS.keys()]).sum(axis=1)
    np.testing.assert_allclose(stored(new), expected, rtol=1e-12,
                               atol=1e-12 * np.abs(good[None]).sum(axis=1).max())
    with env.read() as session:
        events = session.exec(select(Event).where(Event.run_id == new.run_id,
                                                  Event.kind == "recompute")).all()
    assert len(events) == 1 and all(n in events[0].message for n in named)
    assert main(["assets", "verify", downstream, "--latest", "--db", env.url]) == 0


def test_a_version_whose_store_cannot_be_read_is_not_called_damaged(client, env, capsys):
    """A permission error reading a version's manifest is reported as what it is: dx.load
    and a materialization that reads the version raise an ExecutionError saying the store
    could not be read, `assets verify` says NOT CHECKED and exits 1, and nothing is
    computed again. It read as damage: DAMAGED, exit 2, and the version recomputed."""
    defs = pipeline()
    dx.materialize(defs, "base", client=client)
    row = catalog.latest(env, "base")
    with unreadable(Path(row.uri, "deepx_manifest.json")):
        with pytest.raises(dx.ExecutionError, match="could not be read") as err:
            dx.load("base")
        assert not isinstance(err.value, dx.DataError) and "PermissionError" in str(err.value)
        assert main(["assets", "verify", "--db", env.url]) == 1
        out, errors = capsys.readouterr()
        assert "DAMAGED" not in out and "NOT CHECKED" in out
        assert "could not be read" in errors and "not damage" in errors
        with pytest.raises(dx.ExecutionError, match="could not be read"):
            dx.materialize(defs, "base_rows", client=client)
    assert [r.version for r in catalog.history(env, "base")] == [row.version]
    assert catalog.history(env, "base_rows") == []
    assert main(["assets", "verify", "--db", env.url]) == 0
