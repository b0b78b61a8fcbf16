"""The arguments of `dx.run`, `dx.persist` and `dx.compile` are checked where they come in
(issue 30, item 6): each that cannot be used is one `DeepxError` naming the argument and
what it takes, before a cluster is started or contacted; before, these escaped as
TypeError, ValueError or AttributeError, or were taken silently.

The runs that get this far use the session's two-worker `client`, so a check that let a
bad value through would show as a wrong result or a raw error, not as a hang."""

from __future__ import annotations

import os

import numpy as np
import pytest

import deepx_flow as dx
from deepx_flow.errors import ClusterError, InputError
from deepx_flow.runtime import cluster as runtime_cluster

A = np.arange(16, dtype="float32").reshape(4, 4)


def graph():
    x = dx.input("x", shape=(4, 4), dtype="float32")
    return x + 1


@pytest.fixture
def no_cluster(monkeypatch):
    """Fail the test if a cluster is started or a client made: the argument must be refused
    before that."""
    def refuse(*args, **kwargs):
        raise AssertionError("a cluster was started or contacted for a bad argument")
    monkeypatch.setattr(runtime_cluster, "shared_client", refuse)
    monkeypatch.setattr(runtime_cluster, "current_client", lambda: None)
    monkeypatch.delenv("DEEPX_SCHEDULER", raising=False)


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(inputs=5), InputError, ["inputs must be a dict", "got int 5"]),
    (dict(inputs=[A]), InputError, ["inputs must be a dict", "got list"]),
    (dict(inputs={1: A}), InputError, ["inputs must be named by strings", "the key 1 (int)"]),
    (dict(inputs={"x": A}, client=5), InputError,
     ["client must be a distributed.Client", "got int 5"]),
    (dict(inputs={"x": A}, client=0), InputError, ["client must be", "got int 0"]),
    (dict(inputs={"x": A}, scheduler="abc"), InputError,
     ["scheduler must be a Dask scheduler address", "'abc'", "missing port"]),
    (dict(inputs={"x": A}, scheduler="tcp://127.0.0.1:99999"), InputError,
     ["scheduler must be", "port 99999"]),
    (dict(inputs={"x": A}, scheduler=8786), InputError, ["scheduler must be", "8786"]),
    (dict(inputs={"x": A}, recovery=5), InputError,
     ["recovery must be a dx.Recovery", "got int 5"]),
    (dict(inputs={"x": A}, recovery={"retries": 2}), InputError, ["recovery must be"]),
    (dict(inputs={"x": A}, progress="yes"), InputError,
     ["progress must be True, False or None", "'yes'"]),
    (dict(inputs={"x": A}, cluster=5), InputError,
     ["cluster must be a dx.ClusterSpec or the path of a cluster file", "got int 5"]),
    (dict(inputs={"x": A}, cluster="/dev/zero"), ClusterError,
     ["cluster file /dev/zero is not a regular file"]),
    (dict(inputs={"x": [[1, 2], [3]]}), InputError, ["input 'x'", "list"]),
    (dict(inputs={"x": None}), InputError, ["input 'x'", "NoneType None is not an array"]),
])
def test_a_bad_argument_is_an_error_naming_it_before_any_cluster(no_cluster, kwargs, error,
                                                                words):
    with pytest.raises(error) as info:
        dx.run(graph(), **kwargs)
    message = str(info.value)
    assert "\n" not in message and all(w in message for w in words), message
    if "progress" not in kwargs:  # persist has no progress bar
        with pytest.raises(error):
            dx.persist(graph(), **kwargs)


def test_compile_checks_its_client_and_cluster(no_cluster):
    with pytest.raises(InputError, match="client must be a distributed.Client"):
        dx.compile(graph(), client="tcp://127.0.0.1:8786")
    with pytest.raises(InputError, match="cluster must be a dx.ClusterSpec"):
        dx.compile(graph(), cluster=["8xH100"])


def test_a_closed_client_is_refused(client):
    from distributed import Client
    closed = Client(client.scheduler.address, set_as_default=False)
    closed.close()
    with pytest.raises(ClusterError, match="the client given is closed"):
        dx.run(graph(), inputs={"x": A}, client=closed)


def test_a_bad_scheduler_setting_is_refused_where_it_is_read(no_cluster, monkeypatch):
    monkeypatch.setenv("DEEPX_SCHEDULER", "abc")
    with pytest.raises(dx.SettingsError, match="DEEPX_SCHEDULER must be a Dask scheduler "
                                               "address"):
        dx.run(graph(), inputs={"x": A})


def test_a_missing_input_is_said_with_every_input_that_was_given(no_cluster):
    x = dx.input("x", shape=(4, 4), dtype="float32")
    z = dx.input("z", shape=(4,), dtype="float32")
    with pytest.raises(InputError) as info:
        dx.run(x + z, inputs={"x": A})
    assert str(info.value) == "input 'z' (4,) float32 was not given (inputs given: x)"


def test_an_npz_named_npy_is_said_to_be_an_archive(no_cluster, tmp_path):
    path = tmp_path / "a.npy"
    with open(path, "wb") as f:  # np.savez adds .npz to a name; a file object keeps it
        np.savez(f, a=A)
    with pytest.raises(InputError) as info:
        dx.run(graph(), inputs={"x": str(path)})
    assert str(info.value) == (f"input 'x': {path} is a .npz archive of arrays, not a .npy "
                               "array; save the array with np.save, or give np.load(path)[name]")


def test_a_npy_link_to_a_device_is_not_said_to_be_missing(no_cluster, tmp_path):
    link = tmp_path / "z.npy"
    os.symlink("/dev/zero", link)
    with pytest.raises(InputError) as info:
        dx.run(graph(), inputs={"x": str(link)})
    message = str(info.value)
    assert "does not exist" not in message
    assert f"input 'x' (given as '{link}')" in message
    assert "/dev/zero is not a regular file (a device or other special file)" in message
    with pytest.raises(InputError, match="is not a regular file \\(a folder\\)"):
        dx.run(graph(), inputs={"x": str(tmp_path)})


def test_a_missing_file_is_still_said_to_be_missing(no_cluster, tmp_path):
    with pytest.raises(InputError, match=f"input 'x': input file {tmp_path}/no.npy does not "
                                         "exist"):
        dx.run(graph(), inputs={"x": str(tmp_path / "no.npy")})


def test_good_arguments_still_run(client, tmp_path):
    path = tmp_path / "a.npy"
    np.save(path, A)
    for inputs in ({"x": A}, {"x": str(path)}, {"x": path}):
        out = dx.run(graph(), inputs=inputs, client=client, progress=False,
                     recovery=dx.Recovery(retries=1, timeout=600.0))
        np.testing.assert_array_equal(out, A + 1)
    held = dx.persist(graph(), inputs={"x": A}, client=client, recovery=None)
    np.testing.assert_array_equal(held.to_numpy(), A + 1)
    held.release()
