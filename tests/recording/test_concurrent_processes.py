"""Four processes running graphs at once against one SQLite file: every run, task and
placement row arrives, and no process sees "database is locked"."""

from __future__ import annotations

import logging
import multiprocessing as mp

import numpy as np

from deepx_flow.meta import open_db, queries

PROCESSES = 4
RUNS_EACH = 5


def _worker(url: str, seed: int, out) -> None:
    """One process: its own in-process Dask cluster, RUNS_EACH runs and one persist, all
    recorded into `url`. Reports results, run ids and any recording warning."""
    import os
    os.environ["DEEPX_DB_URL"] = url
    warnings: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            warnings.append(record.getMessage())

    logging.getLogger("deepx_flow.runtime.recording").addHandler(Collect(logging.WARNING))
    from distributed import Client, LocalCluster

    import deepx_flow as dx
    try:
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                          dashboard_address="127.0.0.1:0",
                          silence_logs=logging.CRITICAL) as cluster, Client(cluster) as client:
            ok = True
            for i in range(RUNS_EACH):
                xv = np.random.default_rng([seed, i]).standard_normal((600, 400))
                x = dx.input("x", xv.shape, "float64")
                got = dx.run((dx.tanh(x) * 2.0).sum(axis=0), inputs={"x": xv}, client=client)
                ok &= bool(np.allclose(got, (np.tanh(xv) * 2.0).sum(axis=0)))
            p = dx.persist(dx.random.uniform((800, 300), seed=seed) + 1.0, client=client).wait()
            held = {(",".join(map(str, k[1:])), w) for k, ws in
                    client.who_has(p.futures).items() for w in ws}
            out.put({"seed": seed, "ok": ok, "warnings": warnings, "persist_key": p.key,
                     "held": sorted(held)})
    except Exception as err:
        out.put({"seed": seed, "ok": False, "warnings": warnings, "error": repr(err)})


def test_four_processes_share_one_sqlite_file(tmp_path):
    url = f"sqlite:///{(tmp_path / 'shared.db').as_posix()}"
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(url, seed, out)) for seed in range(PROCESSES)]
    for p in procs:
        p.start()
    reports = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for report in reports:
        assert report.get("error") is None, report
        assert report["ok"], report
        assert report["warnings"] == [], report  # e.g. "database is locked"

    db = open_db(url)
    runs = queries.list_runs(db, limit=1000)
    assert len(runs) == PROCESSES * (RUNS_EACH + 1)
    assert {r.status for r in runs} == {"succeeded"}
    for run in runs:
        tasks = queries.run_tasks(db, run.id)
        # Every task of the run is there once (no two runs share a key: their data differ).
        assert len(tasks) == run.n_tasks == len({t.key for t in tasks}), run.id
    for report in reports:
        rows = queries.placements(db, tensor=report["persist_key"])
        assert sorted((r.chunk, r.worker) for r in rows) == [tuple(h) for h in report["held"]]
