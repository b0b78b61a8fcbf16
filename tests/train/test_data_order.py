"""The data order: a permutation of the rows from (seed, epoch) alone, in windows of blocks."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

import deepx_flow as dx
from deepx_flow.train.data import (Dataset, batch_pieces, dataset_of, epoch_order,
                                   window_blocks_for)


def dataset(rows, block_rows):
    return Dataset((), rows, block_rows, "t")


@given(rows=st.integers(1, 500), block=st.integers(1, 64), window=st.integers(1, 9),
       seed=st.integers(0, 2**40), epoch=st.integers(0, 50), batch=st.integers(1, 80))
def test_each_epoch_is_a_permutation_cut_into_full_batches(rows, block, window, seed, epoch,
                                                           batch):
    data = dataset(rows, min(block, rows))
    windows = epoch_order(data, seed, epoch, window)
    order = np.concatenate(windows)
    assert sorted(order) == list(range(rows))
    # A window holds whole blocks.
    for w in windows:
        assert len({i // data.block_rows for i in w}) <= window
    # The same seed and epoch give the same order; the batches are its consecutive runs.
    np.testing.assert_array_equal(order, np.concatenate(epoch_order(data, seed, epoch, window)))
    batches = batch_pieces(windows, batch)
    assert len(batches) == rows // batch
    for b, pieces in enumerate(batches):
        rows_of = np.concatenate([windows[p.window][p.lo:p.hi] for p in pieces])
        np.testing.assert_array_equal(rows_of, order[b * batch:(b + 1) * batch])


def test_epochs_and_seeds_give_different_orders():
    data = dataset(1000, 100)
    orders = {tuple(np.concatenate(epoch_order(data, s, e, 3))) for s in (0, 1) for e in (0, 1)}
    assert len(orders) == 4


def test_windows_fit_a_quarter_of_a_worker_memory():
    x = np.zeros((10_000, 100), np.float32)  # 400 bytes a row, blocks of 4096 rows
    data = dataset_of((x, np.zeros(10_000, np.int64)))
    assert data.block_rows == 4096
    assert window_blocks_for(data, 2**30) == 3  # all blocks
    assert window_blocks_for(data, 16 * 2**20) == 1


def test_bad_data_is_named():
    with pytest.raises(dx.InputError, match="column 1 has 3 rows"):
        dataset_of((np.zeros((4, 2)), np.zeros(3)))
    with pytest.raises(dx.InputError, match="computed tensor"):
        dataset_of((dx.ones((4, 2)),))
    with pytest.raises(dx.InputError, match="data must be a tuple"):
        dataset_of(np.zeros(3))


@given(rows=st.integers(1, 300), batch=st.integers(1, 60), seed=st.integers(0, 2**20))
def test_a_batch_is_its_run_of_the_order_taken_in_increasing_order(rows, batch, seed):
    from deepx_flow.train.data import EpochRows
    batch = min(batch, rows)
    data = dataset(rows, min(17, rows))
    order = np.concatenate(epoch_order(data, seed, 1, 2))
    got = EpochRows(data, seed, 2, batch)
    for b in range(rows // batch):
        run = order[b * batch:(b + 1) * batch]
        np.testing.assert_array_equal(got.rows(1, b), np.sort(run))


@pytest.mark.parametrize("ordered", [True, False])
def test_rows_read_from_storage_are_the_stored_rows(tmp_path, ordered):
    """Rows of a stored column through the block cache: the rows asked for, in the order
    asked (sorted, as batches are, or not), from every stored chunk they fall in."""
    import zarr

    from deepx_flow.train.data import read_rows
    rng = np.random.default_rng(4)
    values = rng.standard_normal((1000, 3, 2)).astype(np.float32)
    z = zarr.create_array(str(tmp_path / "x.zarr"), shape=values.shape, chunks=(64, 3, 2),
                          dtype="float32")
    z[:] = values
    column = dataset_of((str(tmp_path / "x.zarr"),)).columns[0]
    for size in (1, 37, 500, 1000):
        index = rng.choice(1000, size=size, replace=False)
        if ordered:
            index = np.sort(index)
        np.testing.assert_array_equal(read_rows(column, index, scope=f"test-{ordered}"),
                                      values[index])


def test_a_block_asked_for_by_several_threads_at_once_is_decoded_once():
    import threading
    import time

    from deepx_flow.train.data import BlockCache
    cache, calls, got = BlockCache(), [], []

    def load():
        calls.append(1)
        time.sleep(0.2)  # a decode long enough for every thread to ask meanwhile
        return np.arange(10)

    def ask():
        got.append(cache.get(("scope", "uri", 0), load))

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert len(got) == 4 and all(g is got[0] for g in got)

    def fail():
        raise OSError("unreadable")

    with pytest.raises(OSError):  # a failed decode is not kept: the next ask tries again
        cache.get(("scope", "uri", 1), fail)
    assert cache.get(("scope", "uri", 1), lambda: np.ones(3)).tolist() == [1, 1, 1]
