"""A metadata database as big as the dashboard must stay fast on: 10,000 runs and 1,000,000
task rows, with everything else a busy cluster leaves behind.

`bench_ui.py` measures the pages over it; run this file alone to get such a database for
profiling a page by hand:

    python benchmarks/seed_dashboard.py /tmp/big.db          # about a minute
    deepx-flow ui --db sqlite:////tmp/big.db

The rows are written with bulk inserts in one transaction (not through `dx.run`, which would
take days at this size), but they are shaped like real ones: each run's graph YAML, plan
explanation and task keys come from a plan compiled by deepx_flow, task times lie on
per-worker lanes, and the operators are the registered ones (`register_operators`). What is
written, at full scale:

- 64 workers (8 hosts x 8 GPUs) with a device and three storage tiers each, and the
  64 x 63 measured links between them;
- 500 graphs; 10,000 runs over the last 30 days (mostly succeeded, some failed with an error
  and its traceback, some interrupted, the newest few running), one of them big (25,000
  tasks on all 64 workers: more than the run page's timeline shows, `MAX_BARS`); the
  1,000,000 task rows spread over the others (~97 each); events (retries, drifts, lost
  workers, ~2,000 on the big run); ~20 chunk placements per run (5,000 for the big one);
- 200 assets x 50 versions (20 assets partitioned by day), two check results each;
- 20 schedules with 2,500 hourly ticks each (launched, skipped, failed).

`Scale.quick()` is a hundredth of that.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import dataclass
from types import SimpleNamespace

from sqlalchemy import insert, select

DAY = 86_400.0
HOST_NOT_HERE = "login-01"  # runs started elsewhere: opening the DB must not touch them
SCHEDULER = "ucx://10.0.0.1:8786"
BATCH = 50_000


@dataclass(frozen=True)
class Scale:
    runs: int = 10_000
    tasks: int = 1_000_000  # task rows in all, the big run's included
    big_run_tasks: int = 25_000
    big_run_events: int = 2_000
    big_run_placements: int = 5_000
    placements_per_run: int = 20
    graphs: int = 500
    hosts: int = 8
    gpus_per_host: int = 8
    assets: int = 200
    versions: int = 50
    partitioned_every: int = 10  # every 10th asset is partitioned by day
    schedules: int = 20
    ticks: int = 50_000

    @classmethod
    def quick(cls) -> "Scale":
        return cls(runs=100, tasks=10_000, big_run_tasks=2_500, big_run_events=100,
                   big_run_placements=200, placements_per_run=10, graphs=20, hosts=2,
                   gpus_per_host=4, assets=20, versions=5, schedules=4, ticks=500)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


# --- templates: real plans compiled by deepx_flow ------------------------------------------

@dataclass(frozen=True)
class Template:
    """What runs of one graph share: its YAML, its plan's explanation, and its task keys as
    (node id, token, suffix, chunk index) with each node's operator label."""

    yaml: str
    n_nodes: int
    explain: str
    keys: list  # (node id, token, suffix such as ".partial", "0, 1")
    labels: dict  # what a node's keys begin with (ir.keys.key_base) -> its operator label
    outputs: dict  # name -> (node id, token)


def _template(outputs, cluster) -> Template:
    import deepx_flow as dx
    from deepx_flow.ir.keys import key_base, key_name
    from deepx_flow.ir.program import operator_label
    from deepx_flow.spec.yaml_io import to_yaml

    plan = dx.compile(outputs, cluster=cluster)
    lowered = plan.lower({})
    keys = []
    for key in lowered.dsk:
        name = key_name(key)
        node, _, rest = name.partition("@")
        token, dot, suffix = rest.partition(".")
        index = ", ".join(map(str, key[1:])) if isinstance(key, tuple) else ""
        keys.append((node, token, dot + suffix, index))
    labels = {key_base(n.id, n.op): operator_label(n) for n in plan.fused.nodes}
    outs = {name: tuple(key.split("@", 1)) for name, (key, _) in lowered.outputs.items()}
    return Template(to_yaml(plan.graph), len(plan.graph.nodes), plan.explain(), keys, labels,
                    outs)


def templates(scale: Scale) -> tuple[list[Template], Template]:
    """Three everyday graphs (an MLP forward pass, an elementwise chain, a normalization)
    and one big one with at least `scale.big_run_tasks` tasks."""
    import deepx_flow as dx
    from deepx_flow.registry.cluster import ClusterSpec, WorkerSpec

    cluster = ClusterSpec("dgx-h100", tuple(WorkerSpec(f"w{i}", "localhost", 1, 2**20)
                                            for i in range(4)))

    def mlp(rows, layers=3):
        h = dx.random.normal((rows, 256), seed=0, dtype="float32")
        w = dx.random.normal((256, 256), seed=1, dtype="float32")
        for _ in range(layers):
            h = dx.tanh(h @ w) * 0.5 + 1.0
        return h.sum(axis=1)

    x = dx.random.uniform((2048, 512), seed=2, dtype="float32")
    chain = dx.maximum((x * 1.5 + 0.5) * x - x, -1.0) * 0.5 + 0.25
    y = dx.random.normal((4096, 128), seed=3)
    norm = (y - y.mean(axis=0)) / dx.sqrt(((y - y.mean(axis=0)) ** 2).mean(axis=0) + 1e-6)
    small = [_template(mlp(4096), cluster), _template(chain, cluster),
             _template(norm, cluster)]
    rows = 4096
    while True:
        big = _template(mlp(rows), cluster)
        if len(big.keys) >= scale.big_run_tasks:
            return small, big
        rows *= 2


# --- the seed ------------------------------------------------------------------------------

def seed(url: str, scale: Scale = Scale(), rng_seed: int = 0) -> SimpleNamespace:
    """Fill the empty database at `url` (created at the current schema); return what the
    pages can be asked about: `big_run`, `typical_run`, `failed_run`, `asset`,
    `partitioned_asset`, `tensor` (the big run's output, with the most placements),
    `schedule`, and the row counts (`counts`)."""
    from deepx_flow.meta import open_db
    from deepx_flow.registry.operators import register_operators

    rng = random.Random(rng_seed)
    db = open_db(url)
    small, big = templates(scale)
    now = time.time()
    counts: dict[str, int] = {}
    with db.begin() as conn:
        def put(model, rows):
            for i in range(0, len(rows), BATCH):
                conn.execute(insert(model.__table__), rows[i:i + BATCH])
            counts[model.__tablename__] = counts.get(model.__tablename__, 0) + len(rows)

        workers = _cluster(put, scale, now)
        graphs = _graphs(put, scale, small, big, rng, now)
        runs = _runs(put, conn, scale, graphs, workers, rng, now)
        assets = _assets(put, conn, scale, runs, rng, now)
        schedule = _schedules(put, scale, assets, runs, rng, now)
    counts["operators"] = len(register_operators(db))
    return SimpleNamespace(url=url, counts=counts, schedule=schedule, **runs.facts,
                           asset=assets.names[0], partitioned_asset=assets.partitioned)


def _cluster(put, scale: Scale, now: float) -> list[str]:
    from deepx_flow.meta.models import Device, Link, StorageTier, Worker

    addresses, workers, devices, tiers = [], [], [], []
    for h in range(scale.hosts):
        for g in range(scale.gpus_per_host):
            wid = len(addresses) + 1
            address = f"ucx://10.0.{h // 250}.{10 + h % 250}:{40000 + g}"
            addresses.append(address)
            workers.append(dict(id=wid, scheduler=SCHEDULER, address=address,
                                name=f"gpu-node-{h:02d}-{g}", host=f"gpu-node-{h:02d}",
                                protocol="ucx", nthreads=1, memory_limit=240 * 2**30,
                                memory_reserved=900 * 2**20, status="running",
                                first_seen=now - 30 * DAY, last_seen=now - 5.0))
            devices.append(dict(worker_id=wid, index=g, kind="gpu",
                                name="NVIDIA H100 80GB HBM3", memory_total=85_520_809_984,
                                memory_free=81_000_000_000, healthy=(h, g) != (3, 5),
                                registered_at=now - 30 * DAY))
            for tier, location, capacity in (
                    ("device", f"cuda:{g}", 80 * 2**30), ("host", "memory", 240 * 2**30),
                    ("disk", f"/scratch/deepx/{g}", 3 * 2**40)):
                tiers.append(dict(worker_id=wid, tier=tier, location=location,
                                  capacity=capacity, registered_at=now - 30 * DAY))
    put(Worker, workers)
    put(Device, devices)
    put(StorageTier, tiers)
    links = [dict(scheduler=SCHEDULER, source=a, target=b,
                  protocol="ucx", bandwidth=(45e9 if a.split(":")[1] == b.split(":")[1]
                                             else 11e9) * (0.9 + 0.1 * (i % 7) / 7),
                  latency=(4e-6 if a.split(":")[1] == b.split(":")[1] else 2e-5),
                  measured_at=now - DAY)
             for i, (a, b) in enumerate((a, b) for a in addresses for b in addresses if a != b)]
    put(Link, links)
    return addresses


def _graphs(put, scale: Scale, small, big, rng, now: float) -> list[tuple[str, Template]]:
    from deepx_flow.meta.models import GraphRecord

    graphs = [(f"{rng.getrandbits(64):016x}", small[i % len(small)])
              for i in range(scale.graphs - 1)] + [(f"{rng.getrandbits(64):016x}", big)]
    put(GraphRecord, [dict(hash=h, yaml=t.yaml, n_nodes=t.n_nodes, created_at=now - 30 * DAY)
                      for h, t in graphs])
    return graphs


SITE = "/opt/deepx/lib/python3.11/site-packages/deepx_flow"
TRACEBACK = f"""Traceback (most recent call last):
  File "{SITE}/kernels/dispatch.py", line 88, in run
    return kernel(*chunks, **attrs)
  File "{SITE}/kernels/cupy_engine.py", line 141, in matmul
    return a @ b
cupy.cuda.memory.OutOfMemoryError: Out of memory allocating 1,073,741,824 bytes \
(allocated so far: 80,530,636,800 bytes)."""


def _runs(put, conn, scale: Scale, graphs, workers, rng, now: float):
    from deepx_flow.meta.models import ChunkPlacement, Event, Run, Task

    n = scale.runs
    big_index = n // 2  # in the middle of the list: not on the runs page's first page
    per_run = (scale.tasks - scale.big_run_tasks) // (n - 1)
    extra = (scale.tasks - scale.big_run_tasks) - per_run * (n - 1)
    first = now - 30 * DAY
    step = 30 * DAY / n
    runs, tasks, events, places = [], [], [], []
    facts = {}
    for r in range(n):
        run_id = f"{rng.getrandbits(128):032x}"
        is_big = r == big_index
        graph_hash, t = graphs[-1] if is_big else graphs[rng.randrange(len(graphs) - 1)]
        small_index = r - (r > big_index)  # the big run's task count is its own
        n_tasks = scale.big_run_tasks if is_big else per_run + (small_index < extra)
        k = len(workers) if is_big else rng.choice((2, 4, 8, 8, 16))
        lanes = workers if is_big else rng.sample(workers, min(k, len(workers)))
        started = first + r * step + rng.random() * step * 0.5
        duration = 3600.0 if is_big else rng.uniform(5.0, 600.0)
        running = r >= n - 3
        roll = rng.random()
        status = ("running" if running else "succeeded" if is_big or roll < 0.9
                  else "failed" if roll < 0.97 else "interrupted")
        error = None
        if status == "failed":
            error = (f"task ('{t.keys[-1][0]}@{r:06x}{t.keys[-1][1][6:]}', 0) failed after "
                     f"3 attempts on {lanes[0]}:\n{TRACEBACK}")
        elif status == "interrupted":
            error = "its driver process ended before the run did (pid 4242 on login-01)"
        token = f"{r:06x}"
        out_node, out_token = next(iter(t.outputs.values()))
        runs.append(dict(
            id=run_id, graph_hash=graph_hash, kind="persist" if r % 5 == 0 else "run",
            status=status, started_at=started,
            ended_at=None if running else started + duration, scheduler=SCHEDULER,
            cluster="dgx-h100", n_workers=len(lanes), n_tasks=n_tasks, n_chunks=n_tasks // 2,
            compute_comm_ratio=rng.choice((None, 12.5, 31.0, 4.2)), explain=t.explain,
            outputs=json.dumps({"out0": f"{out_node}@{token}{out_token[6:]}"}), error=error,
            host=HOST_NOT_HERE, pid=4242, username=rng.choice(("alice", "bob", "chen", "dana"))))
        tasks += _tasks(run_id, t, token, n_tasks, lanes, started, duration, status, rng)
        events += _events(run_id, scale.big_run_events if is_big else None, status, lanes,
                          started, duration, t, token, rng)
        n_places = scale.big_run_placements if is_big else scale.placements_per_run
        state = ("memory" if r >= n - 50 and r % 5 == 0 else "stored" if r % 5 == 0
                 else "released")
        places += [dict(run_id=run_id, tensor=f"{out_node}@{token}{out_token[6:]}",
                        chunk=f"{c},0", worker=lanes[c % len(lanes)],
                        device=f"cuda:{c % 8}", tier=("device", "host", "disk")[c % 3],
                        nbytes=64 * 2**20, state=state, updated_at=started + duration)
                   for c in range(n_places)]
        if is_big:
            facts["big_run"] = run_id
            facts["tensor"] = f"{out_node}@{token}{out_token[6:]}"
        elif status == "failed" and "failed_run" not in facts:
            facts["failed_run"] = run_id
        elif status == "succeeded" and r > n // 4 and "typical_run" not in facts:
            facts["typical_run"] = run_id
        if len(tasks) >= BATCH:
            put(Run, runs)
            put(Task, tasks)
            put(Event, events)
            put(ChunkPlacement, places)
            runs, tasks, events, places = [], [], [], []
    put(Run, runs)
    put(Task, tasks)
    put(Event, events)
    put(ChunkPlacement, places)
    ids = [row[0] for row in conn.execute(select(Run.__table__.c.id, Run.__table__.c.status))
           if row[1] == "succeeded"]
    return SimpleNamespace(facts=facts, succeeded=ids)


def _tasks(run_id, t: Template, token, n_tasks, lanes, started, duration, status, rng):
    """`n_tasks` rows over the template's keys, each lane (worker) running one after the
    other; a failed run's last tasks erred, a few tasks needed a second attempt."""
    keys = t.keys
    stride = max(1, len(keys) // n_tasks) if len(keys) >= n_tasks else 1
    per_lane = -(-n_tasks // len(lanes))
    slot = duration / per_lane
    rows = []
    for i in range(n_tasks):
        node, tok, suffix, index = keys[(i * stride) % len(keys)]
        tensor = f"{node}@{token}{tok[6:]}{suffix}"
        start = started + (i // len(lanes)) * slot + rng.random() * slot * 0.1
        erred = status == "failed" and i >= n_tasks - 3
        rows.append(dict(
            run_id=run_id, key=f"('{tensor}', {index})" if index else tensor, tensor=tensor,
            operator=t.labels.get(node, node.split("-")[0]), worker=lanes[i % len(lanes)],
            start=start, stop=start + slot * rng.uniform(0.5, 0.85), bytes_in=16 * 2**20,
            bytes_out=8 * 2**20, attempts=2 if rng.random() < 0.01 else 1,
            status="erred" if erred else "memory",
            error=TRACEBACK if erred else None))
    return rows


def _events(run_id, how_many, status, lanes, started, duration, t, token, rng):
    if how_many is None:
        how_many = (rng.randint(2, 5) if status == "failed"
                    else 1 if rng.random() < 0.2 else 0)
    rows = []
    for i in range(how_many):
        kind = rng.choice(("retry", "drift", "retry", "worker-lost", "replan"))
        node, tok, suffix, index = t.keys[rng.randrange(len(t.keys))]
        worker = lanes[rng.randrange(len(lanes))]
        message = {"retry": "CUDA error: an illegal memory access was encountered; attempt 2",
                   "drift": f"timed out after 30.0 s (3x the median); moved off {worker}",
                   "worker-lost": f"worker {worker} left the cluster; its chunks are lost",
                   "replan": "out of memory: planned again with half the chunk size"}[kind]
        rows.append(dict(run_id=run_id, at=started + duration * (i + 1) / (how_many + 1),
                         kind=kind, worker=worker,
                         key=f"('{node}@{token}{tok[6:]}{suffix}', {index})",
                         message=message))
    return rows


def _assets(put, conn, scale: Scale, runs, rng, now: float):
    from deepx_flow.meta.models import AssetCheckResult, AssetMaterialization

    names = [f"features_{i:03d}" for i in range(scale.assets)]
    rows = []
    for i, name in enumerate(names):
        partitioned = i % scale.partitioned_every == scale.partitioned_every - 1
        upstream = names[i - 1] if i % 10 else None
        for v in range(scale.versions):
            at = now - 30 * DAY + (v * scale.assets + i) * (30 * DAY / (scale.assets
                                                                          * scale.versions))
            version = f"{rng.getrandbits(128):032x}"
            rows.append(dict(
                version=version, asset=name,
                partition=time.strftime("%Y-%m-%d", time.gmtime(at)) if partitioned else None,
                code_version=str(1 + v // 10),
                upstream_versions=json.dumps({upstream: f"{rng.getrandbits(128):032x}"}
                                             if upstream else {}),
                shape=json.dumps([65536, 1024]), dtype="float32",
                chunks=json.dumps([8192, 1024]), nbytes=65536 * 1024 * 4, storage="zarr",
                uri=f"file:///data/deepx/assets/{name}/{version}.zarr",
                run_id=rng.choice(runs.succeeded), seconds=rng.uniform(2.0, 90.0),
                checks_passed=rng.random() > 0.05, created_at=at))
    put(AssetMaterialization, rows)
    table = AssetMaterialization.__table__
    ids = [row[0] for row in conn.execute(select(table.c.id).order_by(table.c.id))]
    checks = []
    for mid, row in zip(ids, rows):
        passed = row["checks_passed"]
        checks.append(dict(materialization_id=mid, check="all_finite", passed=passed,
                           blocking=True, value=None if passed else 17.0,
                           message=None if passed else "17 elements are NaN or infinite",
                           created_at=row["created_at"]))
        checks.append(dict(materialization_id=mid, check="shape", passed=True, blocking=False,
                           value=None, message=None, created_at=row["created_at"]))
    put(AssetCheckResult, checks)
    partitioned = names[scale.partitioned_every - 1] if scale.assets >= scale.partitioned_every \
        else names[-1]
    return SimpleNamespace(names=names, partitioned=partitioned)


def _schedules(put, scale: Scale, assets, runs, rng, now: float) -> str:
    from deepx_flow.meta.models import Schedule, ScheduleTick

    names = [f"hourly_{assets.names[i % len(assets.names)]}" for i in range(scale.schedules)]
    put(Schedule, [dict(name=name, cron="0 * * * *", selection=name[len("hourly_"):],
                        timezone="UTC", definitions="pipelines/features.py",
                        daemon=f"{HOST_NOT_HERE}:4242", heartbeat_at=now - 10.0,
                        updated_at=now - 30 * DAY) for name in names])
    per = scale.ticks // scale.schedules
    last = now - now % 3600
    ticks = []
    for name in names:
        for k in range(per):
            at = last - (per - 1 - k) * 3600.0
            roll = rng.random()
            status = "launched" if roll < 0.85 else "skipped" if roll < 0.95 else "failed"
            message = {"launched": f"materialized {name[len('hourly_'):]}",
                       "skipped": "the previous tick's run is still going",
                       "failed": "cannot reach the scheduler ucx://10.0.0.1:8786"}[status]
            ticks.append(dict(schedule=name, tick_at=at, status=status,
                              run_id=rng.choice(runs.succeeded) if status == "launched"
                              else None, message=message, daemon=f"{HOST_NOT_HERE}:4242",
                              started_at=at + 0.5, finished_at=at + rng.uniform(5, 300)))
    put(ScheduleTick, ticks)
    return names[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", help="the SQLite file to create (must not exist)")
    parser.add_argument("--quick", action="store_true", help="a hundredth of the size")
    args = parser.parse_args()
    start = time.perf_counter()
    seeded = seed(f"sqlite:///{args.path}", Scale.quick() if args.quick else Scale())
    print(f"seeded {args.path} in {time.perf_counter() - start:.1f} s: {seeded.counts}")
    print({k: v for k, v in vars(seeded).items() if k not in ("counts", "url")})


if __name__ == "__main__":
    main()
