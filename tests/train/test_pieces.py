"""Parameters in pieces (`train/pieces.py`): a model whose parameters and Adam state are
twice a worker's memory trains on 4 workers and equals a NumPy float64 loop of the same
steps; each strategy gives the replicated run's numbers; 3 and 4 workers agree; lineage
cuts and checkpoints go through storage, never through the driver whole, and a checkpoint
resumes on a cluster of another size."""

from __future__ import annotations

import importlib
import logging
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import deepx_flow as dx
from deepx_flow.train.data import batch_pieces, dataset_of, epoch_order
from tests.helpers import worker_memory_sampled

LIMIT = 512 * 2**20


def mlp(widths):
    layers = []
    for a, b in zip(widths, widths[1:]):
        layers += [dx.nn.Linear(a, b, dtype="float64"), dx.nn.tanh]
    return dx.nn.Sequential(*layers[:-1])


def start_values(widths, seed):
    rng = np.random.default_rng(seed)
    out = {}
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        out[f"{2 * i}.weight"] = rng.standard_normal((a, b)) / np.sqrt(a)
        out[f"{2 * i}.bias"] = rng.standard_normal(b) * 0.1
    return out


def numpy_adam_training(start, widths, x_all, y_all, batch, seed, lr, steps):
    """The same steps in NumPy float64: tanh layers, cross-entropy, Adam as `dx.optim.Adam`
    computes it, rows in the order `dx.train` takes them (one block per window)."""
    b1, b2, eps = 0.9, 0.999, 1e-8
    p = {k: v.copy() for k, v in start.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(v) for k, v in p.items()}
    ds = dataset_of((x_all, y_all))
    windows = epoch_order(ds, seed, 0, 1)
    losses, n = [], len(widths) - 1
    for t, pieces in enumerate(batch_pieces(windows, batch), start=1):
        if t > steps:
            break
        rows = np.concatenate([windows[q.window][q.lo:q.hi] for q in pieces])
        x, y = x_all[rows], y_all[rows]
        hs = [x]
        for i in range(n):
            z = hs[-1] @ p[f"{2 * i}.weight"] + p[f"{2 * i}.bias"]
            hs.append(np.tanh(z) if i < n - 1 else z)
        z = hs[-1] - hs[-1].max(1, keepdims=True)
        prob = np.exp(z) / np.exp(z).sum(1, keepdims=True)
        losses.append(-np.log(prob[np.arange(len(y)), y]).mean())
        dz = prob
        dz[np.arange(len(y)), y] -= 1
        dz /= len(y)
        grads = {}
        for i in reversed(range(n)):
            grads[f"{2 * i}.weight"] = hs[i].T @ dz
            grads[f"{2 * i}.bias"] = dz.sum(0)
            if i:
                dz = (dz @ p[f"{2 * i}.weight"].T) * (1 - hs[i] * hs[i])
        c1, c2 = 1 - b1 ** t, 1 - b2 ** t
        for k, g in grads.items():
            m[k] = b1 * m[k] + (1 - b1) * g
            v[k] = b2 * v[k] + (1 - b2) * (g * g)
            p[k] = p[k] - (lr / c1) * m[k] / (np.sqrt(v[k]) / np.sqrt(c2) + eps)
        del grads
    return p, losses


def relative(a, b) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.timeout(900)
def test_a_model_twice_a_workers_memory_trains_in_pieces_and_equals_numpy():
    from distributed import Client, LocalCluster
    widths = [256] + [2976] * 6 + [10]
    start = start_values(widths, seed=2)
    with_adam = 3 * sum(v.nbytes for v in start.values())
    assert with_adam >= 2 * LIMIT  # parameters and Adam state: twice a worker's memory
    rng = np.random.default_rng(4)
    x = rng.standard_normal((640, 256))
    y = rng.integers(0, 10, 640)
    steps, lr = 20, 1e-4
    expected, losses = numpy_adam_training(start, widths, x, y, 32, 7, lr, steps)
    model = mlp(widths)
    with LocalCluster(n_workers=4, threads_per_worker=1, processes=True, host="127.0.0.1",
                      memory_limit=LIMIT, dashboard_address="127.0.0.1:0",
                      silence_logs=logging.CRITICAL) as cluster, Client(cluster) as client:
        with worker_memory_sampled(client) as peak:
            fit = dx.train(lambda p, a, b: dx.nn.cross_entropy(model(p, a), b), start,
                           data=(x, y), batch_size=32, epochs=1, seed=7, window_blocks=1,
                           optimizer=dx.optim.Adam(lr), steps_per_graph=4, progress=False,
                           client=client)
    assert fit.steps == steps
    # the large weights in pieces; the whole state would not fit one worker
    assert sum(s != "replicated" for s in fit.placement.values()) >= 5
    assert relative(np.array([h["loss"] for h in fit.history]), np.array(losses)) < 1e-5
    for name, value in expected.items():
        assert relative(fit.values[name], value) < 1e-5, name
        assert relative(fit.values[name], start[name]) > 1e-4  # it did train
    assert len(peak) == 4 and max(peak.values()) < LIMIT, {k: v / 2**20 for k, v in
                                                           peak.items()}


def _train(client, widths, placement, steps=4, **kwargs):
    model = mlp(widths)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((16 * steps, widths[0]))
    y = rng.integers(0, widths[-1], 16 * steps)
    return dx.train(lambda p, a, b: dx.nn.cross_entropy(model(p, a), b),
                    start_values(widths, seed=3), data=(x, y), batch_size=16,
                    **{"epochs": 1, **kwargs}, optimizer=dx.optim.Adam(1e-2),
                    steps_per_graph=2, progress=False, client=client, placement=placement)


@pytest.fixture(scope="module")
def client4():
    from tests.conftest import _session_client
    yield from _session_client(4)


def test_three_and_four_workers_agree_in_pieces(client3, client4):
    widths = [24, 64, 64, 64, 6]
    fits = {(n, placement): _train(c, widths, placement)
            for n, c in ((3, client3), (4, client4))
            for placement in ("sharded", "tensor_parallel")}
    for asked, fit in fits.items():
        assert any(s != "replicated" for s in fit.placement.values()), asked
    reference = fits[(4, "sharded")]
    for fit in fits.values():
        for name, value in reference.values.items():
            assert relative(fit.values[name], value) < 1e-6, name


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(widths=st.lists(st.integers(4, 40), min_size=3, max_size=5),
       placement=st.sampled_from(["sharded", "tensor_parallel"]))
def test_each_strategy_gives_the_replicated_numbers(client3, widths, placement):
    widths = widths[:-1] + [min(widths[-1], 8)]
    split = _train(client3, widths, placement, steps=3)
    whole = _train(client3, widths, "replicated", steps=3)
    assert set(whole.placement.values()) == {"replicated"}
    assert placement in split.placement.values()
    np.testing.assert_allclose([h["loss"] for h in split.history],
                               [h["loss"] for h in whole.history], rtol=1e-12)
    for name, value in whole.values.items():
        np.testing.assert_allclose(split.values[name], value, rtol=1e-10, atol=1e-13)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("cut_every", [64, 4])
def test_a_worker_killed_mid_step_in_pieces_ends_as_an_unbroken_run(client3, tmp_path,
                                                                    monkeypatch, cut_every):
    """A worker holding pieces is killed while the steps run: the training goes back to
    its last cut (the start values the driver sent, or a cut the workers stored every 4
    steps), deals the pieces to the workers there are, and ends with the parameters of a
    run that lost nothing."""
    import os
    import signal
    import time

    from distributed import Client, LocalCluster
    from sqlmodel import func, select

    from deepx_flow.meta import open_db
    from deepx_flow.meta.models import TrainingMetric
    widths = [24, 96, 96, 6]
    unbroken = _train(client3, widths, "tensor_parallel", steps=40)
    monkeypatch.setattr(importlib.import_module("deepx_flow.train.loop"), "LINEAGE_STEPS",
                        cut_every)
    db = f"sqlite:///{tmp_path / 'deepx.db'}"
    killed = []
    with LocalCluster(n_workers=3, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0",
                      silence_logs=logging.CRITICAL) as cluster, Client(cluster) as client:

        def kill_a_worker_mid_run():
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                time.sleep(0.05)
                with open_db(db).read() as s:
                    rows = s.exec(select(func.count()).select_from(TrainingMetric)).one()
                if rows > 4 * 10:  # past step 10 of 40
                    pid = next(iter(client.run(os.getpid).values()))
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    return

        killer = threading.Thread(target=kill_a_worker_mid_run, daemon=True)
        killer.start()
        model = mlp(widths)
        rng = np.random.default_rng(5)
        x = rng.standard_normal((16 * 40, widths[0]))
        y = rng.integers(0, widths[-1], 16 * 40)
        fit = dx.train(lambda p, a, b: dx.nn.cross_entropy(model(p, a), b),
                       start_values(widths, seed=3), data=(x, y), batch_size=16, epochs=1,
                       optimizer=dx.optim.Adam(1e-2), steps_per_graph=2, progress=False,
                       client=client, placement="tensor_parallel", db=db)
        killer.join(5)
    assert killed, "the worker was not killed before the training ended"
    assert [h["step"] for h in fit.history] == list(range(1, 41))
    assert "tensor_parallel" in fit.placement.values()
    for name, value in unbroken.values.items():
        assert relative(fit.values[name], value) < 1e-5, name


def _gathers_and_stores(monkeypatch):
    """Shapes the driver gathers from the cluster, and the folders cuts are stored in, as a
    training goes (the real functions run; they are only watched); a checkpoint read whole
    by the driver counts as gathering each of its tensors."""
    from deepx_flow.runtime import run
    from deepx_flow.train import checkpoint, stored_cut
    gathered, stored = [], []
    gather, store, read = run._gather, stored_cut.store, checkpoint.read

    def gathering(client, futures, shape, *args, **kwargs):
        gathered.append(tuple(shape))
        return gather(client, futures, shape, *args, **kwargs)

    def reading(db, row):
        out = read(db, row)
        gathered.extend(a.shape for a in out.values())
        return out

    def storing(client, held, values, shapes, folder):
        out = store(client, held, values, shapes, folder)
        stored.append((folder, {i: Path(s.path).exists() for i, s in out.items()}))
        return out

    monkeypatch.setattr(run, "_gather", gathering)
    monkeypatch.setattr(stored_cut, "store", storing)
    monkeypatch.setattr(checkpoint, "read", reading)
    return gathered, stored


def test_lineage_cuts_in_pieces_are_stored_by_the_workers_not_the_driver(client3,
                                                                          monkeypatch):
    """Every LINEAGE_STEPS steps a training binds its values as data. In pieces, each split
    tensor is written to Zarr by the workers holding it and read back where it is used: the
    driver never gathers one, the numbers are the replicated run's (whose cuts go through
    the driver), and no cut is left behind."""
    widths = [24, 40, 56, 6]  # weights of shapes no bias or other weight has
    whole = _train(client3, widths, "replicated", steps=6)
    monkeypatch.setattr(importlib.import_module("deepx_flow.train.loop"), "LINEAGE_STEPS", 2)
    gathered, stored = _gathers_and_stores(monkeypatch)
    split = _train(client3, widths, "sharded", steps=6)
    shapes = {name: value.shape for name, value in whole.values.items()}
    in_pieces = [shapes[name] for name, s in split.placement.items() if s == "sharded"]
    assert in_pieces and not set(in_pieces) & set(gathered), (in_pieces, gathered)
    assert [folder.rsplit("/", 1)[-1] for folder, _ in stored] == ["2-0", "4-0", "6-0"]
    assert all(written and all(written.values()) for _, written in stored)
    assert len(stored[0][1]) == 3 * len(in_pieces)  # each split parameter and its Adam state
    assert not any(Path(folder).exists() for folder, _ in stored)  # deleted as it went
    np.testing.assert_allclose([h["loss"] for h in split.history],
                               [h["loss"] for h in whole.history], rtol=1e-12)
    for name, value in whole.values.items():
        np.testing.assert_allclose(split.values[name], value, rtol=1e-10, atol=1e-13)


@pytest.mark.timeout(600)
def test_a_checkpoint_in_pieces_resumes_on_a_cluster_of_another_size(client3, client4,
                                                                     tmp_path, monkeypatch):
    """Trained on 4 workers for an epoch with checkpoints, resumed on 3 for a second: the
    resumed steps read the checkpoint region by region where they run (the driver gathers a
    split tensor only for the values it returns) and end where a run of both epochs on 3
    workers ends."""
    widths = [24, 40, 56, 6]
    db = f"sqlite:///{tmp_path / 'deepx.db'}"
    common = dict(checkpoint="in_pieces", checkpoint_every=2, db=db)
    first = _train(client4, widths, "sharded", steps=4, **common)
    assert first.checkpoint is not None and "sharded" in first.placement.values()
    gathered, _ = _gathers_and_stores(monkeypatch)
    resumed = _train(client3, widths, "sharded", steps=4, epochs=2, resume=True, **common)
    assert [h["step"] for h in resumed.history] == [5, 6, 7, 8]
    shapes = {name: value.shape for name, value in first.values.items()}
    in_pieces = [shapes[name] for name, s in resumed.placement.items() if s == "sharded"]
    # the driver gathers each split parameter once, for `Fit.values`: no state, no start
    assert in_pieces and sorted(s for s in gathered if s in in_pieces) == sorted(in_pieces)
    unbroken = _train(client3, widths, "sharded", steps=4, epochs=2)
    for name, value in unbroken.values.items():
        assert relative(resumed.values[name], value) < 1e-6, name
        assert relative(resumed.values[name], first.values[name]) > 1e-4  # it trained on


def test_each_graph_of_steps_records_the_placement_the_dashboard_shows(client3, tmp_path):
    """A training's runs record the placement with the plan (`runs.explain`), and the run
    page's plan shows it: per parameter the choice and the bytes a worker keeps, and the
    step's predicted compute and communication."""
    from sqlmodel import select

    from deepx_flow.meta import open_db
    from deepx_flow.meta.models import Run
    from deepx_flow.ui.pages.run import RunView
    db = f"sqlite:///{tmp_path / 'deepx.db'}"
    fit = _train(client3, [24, 40, 56, 6], "sharded", steps=4, db=db)
    database = open_db(db)
    with database.read() as s:
        runs = list(s.exec(select(Run).where(Run.kind == "train")))
    assert len(runs) == 2  # 4 steps, 2 per graph
    for run in runs:
        shown = RunView(database, run).plan.object
        rows = {line.split()[0]: line for line in shown.splitlines() if line.strip()}
        for name, strategy in fit.placement.items():
            assert strategy in rows[name], (name, shown)
        assert "kept per worker:" in shown and "communication" in shown, shown
        assert shown.index("parameters on") < shown.index("Totals:")  # then the step's plan
