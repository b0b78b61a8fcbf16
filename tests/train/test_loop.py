"""`dx.train` against a NumPy float64 training loop of the same model, data order and
optimizer; the same parameters on 1, 2 and 3 workers; failures that stop a run."""

from __future__ import annotations

import numpy as np
import pytest

import deepx_flow as dx
from deepx_flow.train.data import batch_pieces, dataset_of, epoch_order, window_blocks_for
from tests.helpers import cluster_with_memory

RNG = np.random.default_rng(3)
N, F, H, C = 300, 6, 5, 4
X = RNG.standard_normal((N, F))
LABELS = RNG.integers(0, C, size=N)
MODEL = dx.nn.Sequential(dx.nn.Linear(F, H, dtype="float64"), dx.nn.tanh,
                         dx.nn.Linear(H, C, dtype="float64"))


def loss_fn(p, x, y):
    return dx.nn.cross_entropy(MODEL(p, x), y)


def numpy_training(start, data, batch, epochs, seed, lr=0.1, momentum=0.9, ordered_as=None,
                   window_blocks=None):
    """The same run written out in NumPy: manual gradients, SGD with momentum, rows in the
    order of `ordered_as` (by default `data`, whose blocks decide the order)."""
    p = {k: v.astype(np.float64).copy() for k, v in start.items()}
    buf = {k: np.zeros_like(v) for k, v in p.items()}
    x_all, y_all = data
    ds = dataset_of(ordered_as or data)
    losses = []
    for epoch in range(epochs):
        windows = epoch_order(ds, seed, epoch, window_blocks or ds.blocks)
        for pieces in batch_pieces(windows, batch):
            rows = np.concatenate([windows[q.window][q.lo:q.hi] for q in pieces])
            x, y = x_all[rows], y_all[rows]
            h = np.tanh(x @ p["0.weight"] + p["0.bias"])
            z = h @ p["2.weight"] + p["2.bias"]
            z = z - z.max(1, keepdims=True)
            prob = np.exp(z) / np.exp(z).sum(1, keepdims=True)
            losses.append(-np.log(prob[np.arange(len(y)), y]).mean())
            dz = (prob - np.eye(C)[y]) / len(y)
            dh = (dz @ p["2.weight"].T) * (1 - h * h)
            g = {"2.weight": h.T @ dz, "2.bias": dz.sum(0), "0.weight": x.T @ dh,
                 "0.bias": dh.sum(0)}
            for k in p:
                buf[k] = momentum * buf[k] + g[k]
                p[k] = p[k] - lr * buf[k]
    return p, losses


@pytest.fixture(scope="module")
def start(client):
    params = MODEL.init(seed=1)
    return dict(zip(params, dx.run(list(params.values()), client=client)))


def test_training_equals_a_numpy_loop_and_does_not_depend_on_the_workers(client, client1,
                                                                         client3, start):
    opt = dx.optim.SGD(lr=0.1, momentum=0.9)
    expected, expected_losses = numpy_training(start, (X, LABELS), 40, 2, seed=5)
    fits = [dx.train(loss_fn, start, data=(X, LABELS), batch_size=40, epochs=2, optimizer=opt,
                     seed=5, steps_per_graph=3, progress=False, client=c)
            for c in (client1, client, client3)]
    for fit in fits:
        assert fit.steps == 2 * (N // 40) == len(fit.history)
        assert [h["step"] for h in fit.history] == list(range(1, fit.steps + 1))
        np.testing.assert_allclose([h["loss"] for h in fit.history], expected_losses,
                                   rtol=1e-10)
        for k in start:
            np.testing.assert_allclose(fit.values[k], expected[k], rtol=1e-10, atol=1e-12)
    for k in start:  # the runs on 1, 2 and 3 workers agree with each other closer still
        np.testing.assert_allclose(fits[1].values[k], fits[0].values[k], rtol=1e-12)
        np.testing.assert_allclose(fits[2].values[k], fits[0].values[k], rtol=1e-12)
    assert np.abs(expected["0.weight"] - start["0.weight"]).max() > 1e-2


@pytest.mark.parametrize("memory", [None, 60_000])
def test_stored_data_streams_in_windows_and_trains_the_same(client, start, tmp_path, memory):
    # With 60 kB per worker a window holds 2 of the 5 stored chunks (a quarter of the
    # memory for two windows), so batches span windows and windows span graphs.
    import zarr
    xs = zarr.create_array(str(tmp_path / "x.zarr"), shape=X.shape, chunks=(64, F),
                           dtype="float64")
    xs[:] = X
    ys = zarr.create_array(str(tmp_path / "y.zarr"), shape=LABELS.shape, chunks=(64,),
                           dtype="int64")
    ys[:] = LABELS
    data = (dx.read_zarr(str(tmp_path / "x.zarr")), str(tmp_path / "y.zarr"))
    assert dataset_of(data).blocks == 5
    opt = dx.optim.SGD(lr=0.1, momentum=0.9)
    cluster = cluster_with_memory(memory) if memory else None
    fit = dx.train(loss_fn, start, data=data, batch_size=32, epochs=2, optimizer=opt, seed=2,
                   steps_per_graph=4, progress=False, client=client, cluster=cluster)
    blocks = window_blocks_for(dataset_of(data), memory or 2**40)
    assert blocks == (2 if memory else 5)
    expected, _ = numpy_training(start, (X, LABELS), 32, 2, seed=2, ordered_as=data,
                                 window_blocks=blocks)
    for k in start:
        np.testing.assert_allclose(fit.values[k], expected[k], rtol=1e-10, atol=1e-12)


def test_held_out_loss_every_n_steps_and_at_the_end(client, start):
    fit = dx.train(loss_fn, start, data=(X[:200], LABELS[:200]), batch_size=50, epochs=3,
                   optimizer=dx.optim.Adam(lr=0.01), steps_per_graph=5, progress=False,
                   eval_data=(X[200:], LABELS[200:]), eval_every=4, client=client)
    assert [e["step"] for e in fit.evaluations] == [4, 8, 12]
    for e in fit.evaluations:  # each is the held-out loss of the parameters of its step
        assert np.isfinite(e["loss"])
    final = dx.run(loss_fn(fit.params, dx.input("x", (100, F), "float64"),
                           dx.input("y", (100,), "int64")),
                   inputs={**fit.inputs, "x": X[200:], "y": LABELS[200:]}, client=client)
    np.testing.assert_allclose(fit.evaluations[-1]["loss"], final, rtol=1e-12)


def test_a_label_out_of_range_stops_the_run_at_its_step(client, start):
    bad = LABELS.copy()
    bad[7] = C  # one class too many
    with pytest.raises(dx.ExecutionError, match=r"the loss is nan at step 1 "):
        dx.train(loss_fn, start, data=(X, bad), batch_size=N, epochs=1, progress=False,
                 client=client)


def test_mistakes_are_named_before_anything_runs(client, start):
    with pytest.raises(dx.InputError, match="larger than the 300 rows"):
        dx.train(loss_fn, start, data=(X, LABELS), batch_size=301, client=client)
    with pytest.raises(dx.GraphError, match="floating-point scalar"):
        dx.train(lambda p, x, y: MODEL(p, x), start, data=(X, LABELS), batch_size=10,
                 client=client)
    with pytest.raises(dx.GraphError, match="eval_every needs eval_data"):
        dx.train(loss_fn, start, data=(X, LABELS), batch_size=10, eval_every=3,
                 client=client)
    with pytest.raises(dx.GraphError, match="only floating-point parameters"):
        dx.train(loss_fn, {**start, "0.bias": np.zeros(H, np.int64)}, data=(X, LABELS),
                 batch_size=10, client=client)


def test_runs_show_prints_the_training_metrics(client, start, tmp_path, capsys):
    from deepx_flow.cli.main import main
    from deepx_flow.train import records
    from deepx_flow.meta import open_db
    db = f"sqlite:///{tmp_path / 'deepx.db'}"
    fit = dx.train(loss_fn, start, data=(X[:200], LABELS[:200]), batch_size=5, epochs=1,
                   optimizer=dx.optim.SGD(lr=0.05), steps_per_graph=8, progress=False,
                   eval_data=(X[200:], LABELS[200:]), eval_every=20, client=client, db=db)
    stored = records.metrics(open_db(db), fit.training_id)
    assert [s for s, _ in stored["loss"]] == list(range(1, 41))
    np.testing.assert_allclose([v for _, v in stored["loss"]],
                               [h["loss"] for h in fit.history], rtol=1e-12)
    assert [s for s, _ in stored["eval_loss"]] == [20, 40]
    assert all(v == 0.05 for _, v in stored["lr"])
    from sqlmodel import select
    from deepx_flow.meta.models import Run
    with open_db(db).read() as s:
        run_id = s.exec(select(Run.id).where(Run.training_id == fit.training_id)).first()
    capsys.readouterr()
    assert main(["runs", "show", run_id, "--db", db]) == 0
    out = capsys.readouterr().out
    assert f"training {fit.training_id}  succeeded: 40 of 40 steps" in out
    table = out[out.index("metrics by step"):].split("\n\n")[0]
    assert "eval loss" in table and "grad norm" in table
    lines = [line.split() for line in table.splitlines()[3:]]
    assert len(lines) == 20 and lines[0][0] == "1" and lines[-1][0] == "40"
    assert float(lines[-1][1]) == pytest.approx(fit.history[-1]["loss"], rel=1e-3)


def dropout_loss(p, x, y, step):
    h = dx.nn.dropout(dx.tanh(x @ p["0.weight"] + p["0.bias"]), 0.3, seed=4, step=step)
    return dx.nn.cross_entropy(h @ p["2.weight"] + p["2.bias"], y)


def test_dropout_draws_a_mask_per_step_whatever_the_workers(client, client1, start):
    """A loss taking `step` gets each step's number (its dropout masks then differ from
    step to step and depend on nothing else) and `step=None` when evaluated."""
    fits = [dx.train(dropout_loss, start, data=(X[:200], LABELS[:200]), batch_size=50,
                     epochs=2, optimizer=dx.optim.SGD(lr=0.1), steps_per_graph=3,
                     eval_data=(X[200:], LABELS[200:]), progress=False, client=c)
            for c in (client1, client)]
    for k in start:
        np.testing.assert_allclose(fits[1].values[k], fits[0].values[k], rtol=1e-12)
    plain = dx.train(loss_fn, start, data=(X[:200], LABELS[:200]), batch_size=50, epochs=2,
                     optimizer=dx.optim.SGD(lr=0.1), progress=False, client=client)
    assert np.abs(plain.values["0.weight"] - fits[0].values["0.weight"]).max() > 1e-3
    # The first step by hand: the mask of step 1, the SGD update.
    x, y = dx.input("x", (50, F), "float64"), dx.input("y", (50,), "int64")
    params = {k: dx.input("p" + k.replace(".", "_"), v.shape, "float64")
              for k, v in start.items()}
    # The first 50 rows of the epoch's order, taken in increasing order (`train.data`).
    rows = np.sort(np.concatenate([w for w in epoch_order(dataset_of((X[:200], LABELS[:200])),
                                                          0, 0, 1)])[:50])
    grads = dx.grad(dropout_loss(params, x, y, step=1), list(params.values()))
    feed = {"x": X[rows], "y": LABELS[rows],
            **{"p" + k.replace(".", "_"): v for k, v in start.items()}}
    one = dx.train(dropout_loss, start, data=(X[:200], LABELS[:200]), batch_size=50,
                   epochs=1, optimizer=dx.optim.SGD(lr=0.1), progress=False, client=client,
                   eval_data=(X[200:], LABELS[200:]), eval_every=1)
    by_hand = dx.run(grads, inputs=feed, client=client)
    # Evaluations run without dropout: the held-out loss of step 1's parameters.
    after_one = {k: start[k] - 0.1 * g for k, g in zip(start, by_hand)}
    held_out = dx.run(loss_fn({k: dx.input("q" + k.replace(".", "_"), v.shape, "float64")
                               for k, v in start.items()},
                              dx.input("x", (100, F), "float64"),
                              dx.input("y", (100,), "int64")),
                      inputs={"x": X[200:], "y": LABELS[200:],
                              **{"q" + k.replace(".", "_"): v for k, v in after_one.items()}},
                      client=client)
    np.testing.assert_allclose(one.evaluations[0]["loss"], held_out, rtol=1e-12)


def test_metrics_of_the_loss_function_are_recorded_each_step_and_evaluated(client, start,
                                                                           tmp_path):
    from deepx_flow.meta import open_db
    from deepx_flow.train import records

    def with_accuracy(p, x, y):
        logits = MODEL(p, x)
        hit = (logits.argmax(axis=1) == y).astype("float64").mean()
        return dx.nn.cross_entropy(logits, y), {"accuracy": hit}

    db = f"sqlite:///{tmp_path / 'deepx.db'}"
    fit = dx.train(with_accuracy, start, data=(X[:200], LABELS[:200]), batch_size=40,
                   epochs=2, optimizer=dx.optim.Adam(lr=0.05), progress=False, client=client,
                   eval_data=(X[200:], LABELS[200:]), eval_every=5, db=db)
    assert all(0 <= h["accuracy"] <= 1 for h in fit.history)
    assert all(h["accuracy"] * 40 == round(h["accuracy"] * 40) for h in fit.history)
    assert [e["step"] for e in fit.evaluations] == [5, 10]
    logits = dx.run(MODEL(fit.params, dx.input("x", (100, F), "float64")),
                    inputs={**fit.inputs, "x": X[200:]}, client=client)
    assert fit.evaluations[-1]["accuracy"] == (logits.argmax(1) == LABELS[200:]).mean()
    stored = records.metrics(open_db(db), fit.training_id)
    assert [v for _, v in stored["accuracy"]] == [h["accuracy"] for h in fit.history]
    assert [v for _, v in stored["eval_accuracy"]] == [e["accuracy"] for e in fit.evaluations]
    with pytest.raises(dx.GraphError, match="metric 'bad' must be a numeric scalar"):
        dx.train(lambda p, x, y: (loss_fn(p, x, y), {"bad": x}), start, data=(X, LABELS),
                 batch_size=10, client=client)


def test_reserved_metric_names_are_refused(client, start):
    with pytest.raises(dx.GraphError, match="may not be named 'loss'"):
        dx.train(lambda p, x, y: (loss_fn(p, x, y), {"loss": loss_fn(p, x, y)}), start,
                 data=(X, LABELS), batch_size=10, client=client)


def test_resuming_in_process_continues_only_a_run_configured_alike(client, start, tmp_path):
    from sqlmodel import select
    from deepx_flow.meta import open_db
    from deepx_flow.meta.models import Training
    db = f"sqlite:///{tmp_path / 'deepx.db'}"
    data = (X[:120], LABELS[:120])
    common = dict(data=data, batch_size=20, seed=3, progress=False, client=client, db=db,
                  checkpoint="small", checkpoint_every=4)
    first = dx.train(loss_fn, start, epochs=1, optimizer=dx.optim.Adam(lr=0.02), **common)
    assert first.steps == 6 and first.checkpoint is not None
    resumed = dx.train(loss_fn, start, epochs=2, optimizer=dx.optim.Adam(lr=0.02),
                       resume=True, **common)
    assert [h["step"] for h in resumed.history] == list(range(7, 13))
    unbroken = dx.train(loss_fn, start, data=data, batch_size=20, seed=3, epochs=2,
                        optimizer=dx.optim.Adam(lr=0.02), progress=False, client=client)
    for k in start:
        np.testing.assert_array_equal(resumed.values[k], unbroken.values[k])
    # Another learning rate is another configuration: its checkpoints are not used.
    other = dx.train(loss_fn, start, epochs=1, optimizer=dx.optim.Adam(lr=0.05),
                     resume=True, **common)
    assert [h["step"] for h in other.history][0] == 1
    with open_db(db).read() as s:
        rows = {t.id: t for t in s.exec(select(Training))}
    assert rows[resumed.training_id].resumed_from == first.checkpoint
    assert rows[other.training_id].resumed_from is None
    # A checkpoint past the planned steps (step 12, and 6 planned) is an error.
    with pytest.raises(dx.GraphError, match="past the 6 steps this run plans"):
        dx.train(loss_fn, start, epochs=1, optimizer=dx.optim.Adam(lr=0.02), resume=True,
                 **common)


def test_a_failure_while_setting_up_ends_the_training_row(client, start, tmp_path):
    from sqlmodel import select
    from deepx_flow.meta import open_db
    from deepx_flow.meta.models import Training
    db = f"sqlite:///{tmp_path / 'deepx.db'}"
    with pytest.raises(dx.DeepxError):
        dx.train(loss_fn, start, data=(X, LABELS), batch_size=10, client=client, db=db,
                 eval_data=(X[:, :3], LABELS), progress=False)  # held-out columns too narrow
    with open_db(db).read() as s:
        assert [t.status for t in s.exec(select(Training))] == ["failed"]
