"""The registry page's reads over a real database: the bytes a storage tier holds are the sum
of its worker's held placements from that cluster's runs (summed in SQL, compared with a sum
in Python); clusters come most recently measured first; the tensor chooser and the chunk
grid read held and lost chunks, with their totals."""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlmodel import delete

from deepx_flow.meta.models import (ChunkPlacement, GraphRecord, Link, Run, StorageTier,
                                    Worker)
from deepx_flow.ui import registry_reads as reads

SCHEDULERS = ("tcp://s1:8786", "tcp://s2:8786")
ADDRESSES = ("tcp://w1:1", "tcp://w2:2", "tcp://w3:3")  # the same addresses on both clusters
TIERS = ("device", "host", "disk")
STATES = ("memory", "spilled", "stored", "lost", "released")


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    from deepx_flow.meta import open_db
    from deepx_flow.meta.db import close_all
    db = open_db(f"sqlite:///{tmp_path_factory.mktemp('registry') / 'deepx.db'}")
    with db.session() as s:
        s.add(GraphRecord(hash="g", n_nodes=1, created_at=0.0))
        for i, scheduler in enumerate(SCHEDULERS):
            s.add(Run(id=f"run{i}", graph_hash="g", started_at=100.0 + i, scheduler=scheduler,
                      cluster="c", n_workers=3, n_tasks=1, n_chunks=1, host="h", pid=1,
                      username="u"))
            for address in ADDRESSES:
                worker = Worker(scheduler=scheduler, address=address, name=address, host="h",
                                protocol="tcp", nthreads=1, first_seen=0.0, last_seen=10.0 + i)
                s.add(worker)
                s.flush()
                for tier in TIERS[i:]:  # the second cluster has no device tier
                    s.add(StorageTier(worker_id=worker.id, tier=tier, location=tier,
                                      capacity=None if tier == "disk" else 2**30,
                                      registered_at=0.0))
    yield db
    close_all()


placement_rows = st.lists(
    st.tuples(st.sampled_from(["run0", "run1"]), st.sampled_from(ADDRESSES),
              st.sampled_from(TIERS), st.sampled_from(STATES),
              st.one_of(st.none(), st.integers(0, 2**40))), max_size=40)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(placement_rows)
def test_a_tier_holds_the_bytes_of_its_workers_held_chunks_on_that_cluster(db, rows):
    with db.session() as s:
        s.exec(delete(ChunkPlacement))
        s.add_all([ChunkPlacement(run_id=run, tensor="x@t", chunk=str(i), worker=worker,
                                  tier=tier, state=state, nbytes=nbytes, updated_at=float(i))
                   for i, (run, worker, tier, state, nbytes) in enumerate(rows)])
    for n, scheduler in enumerate(SCHEDULERS):
        expected = defaultdict(lambda: [0, 0])
        for run, worker, tier, state, nbytes in rows:
            if run == f"run{n}" and state in reads.HELD:
                expected[worker, tier][0] += nbytes or 0
                expected[worker, tier][1] += 1
        tiers, total = reads.storage_tiers(db, scheduler)
        assert total == len(tiers) == len(ADDRESSES) * len(TIERS[n:])
        assert [(t["address"], t["tier"]) for t in tiers] == \
            [(a, tier) for a in ADDRESSES for tier in TIERS[n:]]
        for t in tiers:
            assert [t["held"], t["chunks"]] == expected.get((t["address"], t["tier"]), [0, 0])


def test_used_percent():
    assert reads.used_percent(512, 1024) == 50.0
    assert reads.used_percent(5, None) is None and reads.used_percent(5, 0) is None


def test_clusters_come_most_recently_measured_first(db):
    with db.session() as s:
        s.exec(delete(Link))
        s.add(Link(scheduler=SCHEDULERS[0], source=ADDRESSES[0], target=ADDRESSES[1],
                   protocol="tcp", bandwidth=1e9, latency=1e-4, measured_at=50.0))
    found = reads.schedulers(db)
    # s1 measured (even though s2's workers were seen later); s2 by when it was seen
    assert [(c.address, c.measured_at, c.seen_at) for c in found] == \
        [(SCHEDULERS[0], 50.0, 10.0), (SCHEDULERS[1], None, 11.0)]
    links, total = reads.links(db, SCHEDULERS[0])
    assert total == 1 and [(x.source, x.target) for x in links] == [ADDRESSES[:2]]
    assert reads.links(db, SCHEDULERS[1]) == ([], 0)


def test_the_grid_reads_held_and_lost_chunks_up_to_its_limit(db):
    with db.session() as s:
        s.exec(delete(ChunkPlacement))
        for i, state in enumerate(STATES * 3):
            s.add(ChunkPlacement(run_id="run0", tensor="old@t", chunk=str(i), worker="w",
                                 state=state, updated_at=1.0))
        s.add(ChunkPlacement(run_id="run1", tensor="new@t", chunk="0", worker="w",
                             state="memory", updated_at=2.0))
        s.add(ChunkPlacement(run_id="run1", tensor="gone@t", chunk="0", worker="w",
                             state="released", updated_at=3.0))
    assert reads.recent_tensors(db) == [("new@t", 1), ("old@t", 12)]
    assert reads.recent_tensors(db, runs=1) == [("new@t", 1)]  # run1 is the latest run
    rows, total = reads.tensor_placements(db, "old@t", limit=5)
    assert total == 12 and len(rows) == 5 and all(r.state in reads.SHOWN for r in rows)
    assert reads.tensor_placements(db, "gone@t") == ([], 0)
