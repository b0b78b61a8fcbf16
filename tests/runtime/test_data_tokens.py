"""A run after its input's data changed reads the new data, even while a persisted output
computed from the old data is still on the cluster.

Task keys are content addresses, and the cluster hands a run the chunks it holds under the
same keys. The keys of a file or Zarr input were made from the path and the root folder's
time and size (which do not change when a chunk file is rewritten), and those of a
`read_zarr` node from its path alone: the run after a rewrite returned the persisted
output's old values. Every way of reading a stored array is tried: a `zarr.Array`, a Zarr
path, a `.npy` path, `dx.read_zarr`; each just after the data was written (times that a
rewrite in the same clock tick would keep) and after it was still for a while (its listing
then names it).
"""

import logging
import time

import numpy as np
import pytest
from distributed import Client, LocalCluster

import deepx_flow as dx
from deepx_flow.storage import tokens
from deepx_flow.storage.tokens import data_token


@pytest.fixture(scope="module")
def one_worker():
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as cluster, \
            Client(cluster, set_as_default=False) as c:
        yield c


class Stored:
    """An array kept one of the ways a run can read it, and the graph that reads it."""

    def __init__(self, way: str, folder):
        import zarr
        self.way = way
        self.x = dx.input("x", (4, 6), "float64")
        if way.startswith("npy"):
            self.path = str(folder / "x.npy")
        else:
            self.path = str(folder / "x.zarr")
            self.array = zarr.create_array(self.path, shape=(4, 6), chunks=(2, 3),
                                           dtype="float64")

    def write(self, values: np.ndarray) -> None:
        import os
        if self.way.startswith("npy"):
            before = os.stat(self.path) if os.path.exists(self.path) else None
            np.save(self.path, values)  # rewritten in place: the same inode and size
            if before is not None and self.way == "npy in one clock tick":
                # as a file system whose clock ticks coarsely leaves a quick rewrite
                os.utime(self.path, ns=(before.st_atime_ns, before.st_mtime_ns))
        else:
            self.array[...] = values

    def result(self, client, persist: bool = False):
        """2 * the array, run (or persisted) with the array given as this way says."""
        if self.way == "read_zarr":
            graph, inputs = dx.read_zarr(self.path) * 2.0, None
        else:
            graph = self.x * 2.0
            inputs = {"x": self.array if self.way == "zarr.Array" else self.path}
        if persist:
            return dx.persist(graph, inputs=inputs, client=client).wait()
        return dx.run(graph, inputs=inputs, client=client)


WAYS = ["zarr.Array", "zarr path", "npy", "npy in one clock tick", "read_zarr"]


@pytest.mark.parametrize("way", WAYS)
def test_a_run_reads_data_written_after_a_persist_of_the_old(tmp_path, one_worker, way):
    stored = Stored(way, tmp_path)
    first, second = np.full((4, 6), 2.0), np.arange(24.0).reshape(4, 6)
    stored.write(first)
    held = stored.result(one_worker, persist=True)
    try:
        stored.write(second)
        np.testing.assert_array_equal(stored.result(one_worker), second * 2.0)
        np.testing.assert_array_equal(held.to_numpy(), first * 2.0)  # the persist's own
    finally:
        held.release()


@pytest.mark.parametrize("way", WAYS)
def test_data_still_for_a_while_is_named_by_its_listing(tmp_path, one_worker, way,
                                                        monkeypatch):
    """Files that have not changed for RACY_SECONDS are named by their listing (here 0.05 s,
    so that the test need not wait 2 s): the same token while they stay as they are, so a
    persisted output is taken again, and another once a file is rewritten in place."""
    monkeypatch.setattr(tokens, "RACY_SECONDS", 0.05)
    stored = Stored(way, tmp_path)
    first, second = np.full((4, 6), 2.0), np.full((4, 6), 5.0)  # same sizes, compressed too
    stored.write(first)
    time.sleep(0.2)
    before = data_token(stored.path)
    assert not before.startswith("once-") and data_token(stored.path) == before
    held = stored.result(one_worker, persist=True)
    try:
        again = stored.result(one_worker, persist=True)  # the same keys: the same chunks
        assert again.key == held.key
        again.release()
        stored.write(second)
        time.sleep(0.2)
        after = data_token(stored.path)
        assert after != before and not after.startswith("once-")
        np.testing.assert_array_equal(stored.result(one_worker), second * 2.0)
    finally:
        held.release()


def test_a_file_just_written_gets_a_token_used_once(tmp_path):
    """A rewrite within the file system's clock tick keeps a file's times: data changed in
    the last RACY_SECONDS is never named by them."""
    path = tmp_path / "a.npy"
    np.save(path, np.ones(3))
    first, second = data_token(str(path)), data_token(str(path))
    assert first.startswith("once-") and first != second


def test_what_cannot_be_listed_gets_a_token_used_once(tmp_path):
    missing = str(tmp_path / "gone.zarr")
    assert data_token(missing).startswith("once-")
    assert data_token(missing) != data_token(missing)
    # fsspec's memory file system lists no marker of an object's content
    import fsspec
    fs = fsspec.filesystem("memory")
    fs.pipe_file("/tokens-test/a.zarr/zarr.json", b"{}")
    assert data_token("memory://tokens-test/a.zarr").startswith("once-")
    fs.rm("/tokens-test", recursive=True)


def test_a_chunk_deleted_or_restored_with_its_old_times_changes_the_token(tmp_path,
                                                                          monkeypatch):
    """A copy restored with its modification time (cp -p, rsync -t) is still another
    change: the change time cannot be set back, and the token holds it."""
    import os
    import shutil
    import zarr
    monkeypatch.setattr(tokens, "RACY_SECONDS", 0.05)
    uri = str(tmp_path / "a.zarr")
    zarr.create_array(uri, shape=(4,), chunks=(2,), dtype="float64")[...] = np.arange(4.0)
    chunk = os.path.join(uri, "c", "1")
    time.sleep(0.2)
    before = data_token(uri)
    saved = str(tmp_path / "saved")
    shutil.copy2(chunk, saved)  # with its times
    os.unlink(chunk)
    time.sleep(0.2)
    gone = data_token(uri)
    shutil.copy2(saved, chunk)
    time.sleep(0.2)
    back = data_token(uri)
    assert len({before, gone, back}) == 3
    assert os.stat(chunk).st_mtime_ns == os.stat(saved).st_mtime_ns
