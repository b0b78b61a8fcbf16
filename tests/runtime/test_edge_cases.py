"""Keys never collide between different computations; 0-d and empty tensors; persisted data.

Each test here once failed: two YAML graphs with the same node ids returned each other's
results, 0-d inputs came back 1-d, reshapes of empty tensors divided by zero, and persisted
handles lost their client.
"""

import logging

import numpy as np
import pytest
from distributed import LocalCluster

import deepx_flow as dx
from tests.helpers import cluster_with_memory

SPEC = """\
deepx: 1
inputs:
  x: {{shape: [4], dtype: float64}}
nodes:
  - {{id: y, op: {op}, args: [x]}}
outputs: [y]
"""


def test_same_ids_different_graphs_do_not_share_results(client):
    x = np.array([1.0, 2.0, 3.0, 4.0])
    g_exp = dx.from_yaml(SPEC.format(op="exp"))
    g_log = dx.from_yaml(SPEC.format(op="log"))
    first = dx.run(g_exp, inputs={"x": x}, client=client)["y"]
    second = dx.run(g_log, inputs={"x": x}, client=client)["y"]
    np.testing.assert_allclose(first, np.exp(x))
    np.testing.assert_allclose(second, np.log(x))


def test_same_random_id_with_another_seed_is_recomputed(client):
    text = ("deepx: 1\nnodes:\n  - {{id: r, op: random_normal, shape: [5], dtype: float64, "
            "attrs: {{seed: {seed}}}}}\noutputs: [r]\n")
    a = dx.run(dx.from_yaml(text.format(seed=1)), client=client)["r"]
    b = dx.run(dx.from_yaml(text.format(seed=2)), client=client)["r"]
    assert not np.array_equal(a, b)


def test_zero_dimensional_inputs_and_transposes(client):
    z = dx.input("z", (), "float64")
    got = dx.run([z * 2.0 + 1.0, z.sum(), z.T + 1.0], inputs={"z": np.array(2.5)},
                 client=client)
    assert [g.shape for g in got] == [(), (), ()]
    assert [float(g) for g in got] == [6.0, 2.5, 3.5]


@pytest.mark.parametrize("shape,new", [((0, 4), (4, 0)), ((5, 0), (0, 5)), ((7, 0), (1, 7, 0))])
def test_reshape_of_empty_tensors(client, shape, new):
    x = dx.input("x", shape, "float64")
    got = dx.run(x.reshape(new) + 1.0, inputs={"x": np.zeros(shape)}, client=client,
                 cluster=cluster_with_memory(2**20))
    assert got.shape == new


def test_softmax_of_an_empty_axis_is_empty(client):
    x = dx.input("e", (2, 0), "float64")
    got = dx.run(dx.softmax(x, axis=1), inputs={"e": np.zeros((2, 0))}, client=client)
    assert got.shape == (2, 0)


def test_scalars_that_do_not_fit_the_dtype_are_graph_errors():
    u = dx.input("u", (3,), "uint8")
    with pytest.raises(dx.GraphError, match="300 does not fit in uint8"):
        u + 300


def test_persist_with_a_scheduler_address_keeps_its_client():
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, host="127.0.0.1",
                      protocol="tcp", dashboard_address="127.0.0.1:0",
                      silence_logs=logging.ERROR) as cluster:
        x = dx.input("x", (6,), "float64")
        handle = dx.persist(dx.exp(x), inputs={"x": np.arange(6.0)},
                            scheduler=cluster.scheduler_address)
        np.testing.assert_allclose(handle.to_numpy(), np.exp(np.arange(6.0)))
        # A later run without a client reads it on the same cluster.
        y = dx.input("y", (6,), "float64")
        np.testing.assert_allclose(dx.run(y * 2.0, inputs={"y": handle}),
                                   2 * np.exp(np.arange(6.0)))
        handle.client.close()


def test_gathering_through_a_closed_client_raises_instead_of_waiting():
    import threading
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, host="127.0.0.1",
                      protocol="tcp", dashboard_address="127.0.0.1:0",
                      silence_logs=logging.ERROR) as cluster:
        x = dx.input("x", (6,), "float64")
        handle = dx.persist(dx.exp(x), inputs={"x": np.arange(6.0)},
                            scheduler=cluster.scheduler_address)
        handle.client.close()
        raised = []

        def gather():
            try:
                handle.to_numpy()
            except Exception as err:  # what distributed raises for a closed client
                raised.append(err)
        thread = threading.Thread(target=gather, daemon=True)
        thread.start()
        thread.join(60)
        assert not thread.is_alive(), "gathering through a closed client hung"
        assert raised


def test_released_persisted_input_is_an_input_error(client):
    x = dx.input("x", (6,), "float64")
    handle = dx.persist(dx.exp(x), inputs={"x": np.arange(6.0)}, client=client)
    handle.release()
    with pytest.raises(dx.InputError, match="released"):
        dx.run(dx.input("y", (6,), "float64") + 1.0, inputs={"y": handle}, client=client)


def test_progress_bar_on_request(client, capsys):
    x = dx.input("x", (300, 7), "float64")
    dx.run(x * 2.0, inputs={"x": np.ones((300, 7))}, client=client, progress=True,
           cluster=cluster_with_memory(8 * 2**10))
    err = capsys.readouterr().err  # shown at once, however quick the run
    assert err.startswith("deepx_flow run ") and " tasks" in err.splitlines()[0]
    total = int(err.splitlines()[0].split(": ")[1].split()[0])
    assert f"{total}/{total} [" in err


def test_persisted_input_on_another_cluster_is_an_input_error(client, client3):
    x = dx.input("x", (6,), "float64")
    handle = dx.persist(dx.exp(x), inputs={"x": np.arange(6.0)}, client=client)
    with pytest.raises(dx.InputError, match="held by the cluster at"):
        dx.run(dx.input("y", (6,), "float64") + 1.0, inputs={"y": handle}, client=client3)


def test_persist_by_address_reuses_one_client_and_accepts_other_spellings():
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, host="127.0.0.1",
                      protocol="tcp", dashboard_address="127.0.0.1:0",
                      silence_logs=logging.ERROR) as cluster:
        address = cluster.scheduler_address
        x = dx.input("x", (6,), "float64")
        handles = [dx.persist(x * float(i), inputs={"x": np.arange(6.0)}, scheduler=address)
                   for i in range(3)]
        n_clients = handles[0].client.run_on_scheduler(
            lambda dask_scheduler: len(dask_scheduler.clients))
        assert n_clients <= 3  # the scheduler's own, the fixture's, and one shared
        other = address.replace("127.0.0.1", "localhost")
        y = dx.input("y", (6,), "float64")
        got = dx.run(y + 1.0, inputs={"y": handles[2]}, scheduler=other)
        np.testing.assert_allclose(got, np.arange(6.0) * 2 + 1)
        handles[0].client.close()  # before its cluster goes away
