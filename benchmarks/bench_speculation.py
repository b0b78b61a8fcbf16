"""What speculative backups cost a run when nothing is wrong, and what they gain when one
worker is ten times slower than the rest.

Why: slowness must never be fatal, and one slow machine (thermal throttling, a noisy
neighbour, a failing disk) must not hold a whole run back. deepx_flow gives a task that runs
far past its peers a backup on another worker and takes whichever finishes first. Targets:
on an undisturbed run the backups cost nothing (none start, the time is the same); with one
worker made 10x slower the run finishes within 1.3x of the undisturbed time.

What runs: batch inference over a float32 Zarr array on local disk (1,572,864 x 256, stored
in chunks of 65,536 rows, written once before timing) read by `read_zarr`, one stored chunk
per task (`DEEPX_CHUNKS_PER_THREAD=6`): the features standardized by their column means,
then a two-layer perceptron's class probabilities, ``softmax(relu((x - mean) @ w1) @ w2)``
(256 -> 512 -> 16), each result checked against NumPy in float64. A LocalCluster of 4 worker processes with one
thread each (on this 2-core machine a worker's task shares a core, as on a loaded node).
"Slow" is the fault engine's `Fault("slow", worker=..., factor=10)` on one worker: each of
its tasks takes 10 times as long (its kernel, then a wait of 9 times that), as a worker
running at a tenth of its speed. Taking turns, median of `repeat` after a warm-up:

- undisturbed, backups off (`dx.Recovery(speculate=False)`): the baseline;
- undisturbed, default settings (backups on): the cost of watching for stragglers;
- one slow worker, backups off: what a straggler costs without them;
- one slow worker, default settings: what backups win back.

Run: `python benchmarks/bench_speculation.py [--quick]`. --quick (a smoke test of every
case in about 15 s): 2 workers, stored chunks of 8,192 rows, 3 per worker thread (6 tasks a
step, of about a tenth of a second), backups after at least 0.25 s instead of 1 s (so that
a task 10x slower is still far past it), one timed run of each case and no warm-up.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

import common
import deepx_flow as dx
from deepx_flow.kernels.faults import Fault, FaultInjection

# Each worker process imports this script again (multiprocessing's spawn), so the metadata
# database's modules (SQLModel, SQLAlchemy: about a second each) are imported where used.

COLUMNS, HIDDEN, CLASSES = 256, 512, 16
STORED_ROWS, FACTOR, WORKERS = 65_536, 10, 4
# One stored chunk per task (24 at full size, 6 per worker thread): a run of tasks of about
# a second, as a batch job over a large stored array is. --quick: 3 per worker thread.
CHUNKS_PER_THREAD, QUICK_CHUNKS_PER_THREAD = 6, 3


def write_input(path: Path, rows: int, stored_rows: int) -> np.ndarray:
    import zarr
    values = np.random.default_rng(0).standard_normal((rows, COLUMNS), dtype=np.float32)
    arr = zarr.create_array(str(path), shape=values.shape, chunks=(stored_rows, COLUMNS),
                            dtype="float32", zarr_format=3)
    arr[:] = values
    return values


def weights():
    return (dx.random.normal((COLUMNS, HIDDEN), seed=1, dtype="float32") * COLUMNS ** -0.5,
            dx.random.normal((HIDDEN, CLASSES), seed=2, dtype="float32") * HIDDEN ** -0.5)


def graph(path: Path):
    """Batch inference: standardize the stored features by their column means, then a
    two-layer perceptron's class probabilities, one row of scores per stored row."""
    x = dx.read_zarr(str(path))
    w1, w2 = weights()
    centered = x - x.mean(axis=0, keepdims=True)
    return dx.softmax(dx.relu(centered @ w1) @ w2, axis=1)


def reference(values: np.ndarray, w1: np.ndarray, w2: np.ndarray) -> np.ndarray:
    x = values.astype(np.float64)
    logits = np.maximum((x - x.mean(axis=0, keepdims=True)) @ w1, 0) @ w2
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def events_of_last_run(db) -> list:
    from sqlmodel import select

    from deepx_flow.meta.models import Event, Run
    with db.read() as s:
        run = s.exec(select(Run).order_by(Run.started_at.desc())).first()
        return s.exec(select(Event).where(Event.run_id == run.id)).all()


def main(quick: bool = False) -> None:
    from deepx_flow.meta import open_db
    # --quick keeps every case but makes them small: tasks of about a tenth of a second
    # instead of about a second, so backups start after 0.25 s instead of the default 1 s (a
    # task 10x slower must still run far past it, backups and exclusions still happen), 2
    # workers, one timed run of each and no warm-up.
    workers = 2 if quick else WORKERS
    stored_rows = 8192 if quick else STORED_ROWS
    per_thread = QUICK_CHUNKS_PER_THREAD if quick else CHUNKS_PER_THREAD
    os.environ.setdefault("DEEPX_CHUNKS_PER_THREAD", str(per_thread))
    rows = stored_rows * per_thread * workers  # one stored chunk per task
    repeat, warmup = (1, 0) if quick else (5, 1)
    speculation = {"speculation_min": 0.25} if quick else {}  # full size: the defaults
    machine = common.machine_info()
    busy = None if quick else common.wait_until_quiet()
    folder = Path(tempfile.mkdtemp(prefix="deepx-bench-spec-"))
    db = open_db()
    try:
        path = folder / "x.zarr"
        values = write_input(path, rows, stored_rows)
        y = graph(path)
        with common.local_cluster(workers, memory_limit="4GiB") as client:
            w1, w2 = (w.astype(np.float64) for w in dx.run(list(weights()), client=client))
            want = reference(values, w1, w2)
            victim = sorted(client.scheduler_info()["workers"])[0]
            counts: dict = {}

            def case(name: str, speculate: bool):
                def timed():
                    recovery = (dx.Recovery(**speculation) if speculate
                                else dx.Recovery(speculate=False))
                    out = dx.run(y, client=client, recovery=recovery)
                    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-6)
                    events = events_of_last_run(db)
                    tally = counts.setdefault(name, [])
                    tally.append({k: sum(e.kind == k for e in events)
                                  for k in ("backup", "backup-won", "exclude")})
                return timed

            @contextlib.contextmanager
            def around(name):
                if name.startswith("slow"):
                    client.register_plugin(FaultInjection([Fault("slow", worker=victim,
                                                                 factor=FACTOR)]))
                try:
                    yield
                finally:
                    if name.startswith("slow"):
                        client.unregister_worker_plugin(FaultInjection.name)

            plan = dx.compile(y, client=client)
            names = ("undisturbed, backups off", "undisturbed, backups on",
                     "slow worker, backups off", "slow worker, backups on")
            times = common.interleaved({name: case(name, name.endswith("on"))
                                        for name in names}, repeat=repeat, warmup=warmup,
                                       around=around)
        base = times["undisturbed, backups off"]["median_s"]
        table, rows_out = [], {}
        for name, t in times.items():
            timed_counts = counts[name][-repeat:]  # the warm-up's are dropped
            backups = sum(c["backup"] for c in timed_counts) / repeat
            won = sum(c["backup-won"] for c in timed_counts) / repeat
            excluded = sum(c["exclude"] for c in timed_counts) / repeat
            ratio = t["median_s"] / base
            table.append((name, common.fmt(t["median_s"]), common.fmt(ratio),
                          f"{backups:g}", f"{won:g}", f"{excluded:g}"))
            rows_out[name] = {**t, "ratio_to_undisturbed": ratio, "backups": backups,
                              "backups_won": won, "workers_excluded": excluded}
        common.print_table(("case", "median s", "x undisturbed", "backups", "won",
                            "excluded"), table,
                           f"{rows:,} x {COLUMNS} float32 from Zarr ({values.nbytes / 2**20:.0f}"
                           f" MiB), {plan.stats().tasks} tasks, {workers} workers, one "
                           f"{FACTOR}x slower")
        on, off = rows_out["undisturbed, backups on"], rows_out["undisturbed, backups off"]
        slow_on = rows_out["slow worker, backups on"]
        targets = [
            common.target("no backups on an undisturbed run", on["backups"],
                          on["backups"] == 0),
            common.target("undisturbed with backups on, x backups off",
                          on["median_s"] / off["median_s"],
                          on["median_s"] / off["median_s"] <= 1.1),
            common.target("one worker 10x slower, backups on: x undisturbed <= 1.3",
                          slow_on["ratio_to_undisturbed"],
                          slow_on["ratio_to_undisturbed"] <= 1.3),
        ]
        common.write_results("bench_speculation", {
            "machine": machine, "busy_before": busy, "params": {"rows": rows, "columns": COLUMNS,
                                           "stored_rows": stored_rows, "workers": workers,
                                           "chunks_per_thread": per_thread,
                                           "slow_factor": FACTOR, "repeat": repeat,
                                           "warmup": warmup, "tasks": plan.stats().tasks,
                                           "recovery": speculation or "defaults"},
            "cases": rows_out, "targets": targets}, quick)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small, fast run")
    main(**vars(parser.parse_args()))
