"""Where a run's time goes (`dx.phases`, `runtime/phases.py`): the cluster's work is told
apart from the run's fixed costs, driven by a task that really hangs for a while."""

from __future__ import annotations

import threading
import time

import numpy as np

import deepx_flow as dx
from deepx_flow.kernels.faults import Fault, FaultInjection
from deepx_flow.runtime.phases import PHASES

HANG_S = 1.5


def graph():
    x = dx.input("x", (4096, 64), "float64")
    return (dx.exp(x * 0.25) - x).sum(axis=0)


def expected(data):
    return (np.exp(data * 0.25) - data).sum(axis=0)


def test_a_runs_phases_tell_the_clusters_work_from_its_fixed_costs(client):
    data = np.random.default_rng(3).standard_normal((4096, 64))
    y = graph()
    dx.run(y, inputs={"x": data}, client=client)  # planned and cached: a run as in a loop
    # One task hangs until the fault rules are removed, HANG_S after the run starts.
    client.register_plugin(FaultInjection([Fault("hang", times=1)]))
    releaser = threading.Timer(HANG_S, client.unregister_worker_plugin,
                               args=(FaultInjection.name,))
    start = time.perf_counter()
    releaser.start()
    try:
        with dx.phases() as timed:
            out = dx.run(y, inputs={"x": data}, client=client)
        wall = time.perf_counter() - start
    finally:
        releaser.join()
    np.testing.assert_allclose(out, expected(data), rtol=1e-12)
    assert set(timed) <= set(PHASES)
    assert {"check", "connect", "plan", "lower", "record", "submit", "cluster",
            "gather", "finish"} <= set(timed)
    assert all(seconds >= 0 for seconds in timed.values())
    # The phases follow one another: together they are the call, less what lies between.
    assert sum(timed.values()) <= wall + 1e-3
    assert sum(timed.values()) >= 0.9 * wall - 0.05
    # The hung task is the cluster's time, not a fixed cost.
    assert timed["cluster"] >= HANG_S - 0.2
    fixed = sum(s for name, s in timed.items() if name != "cluster")
    assert fixed < timed["cluster"]


def test_phases_sum_over_the_runs_of_a_block_and_nothing_is_kept_outside_one(client):
    data = np.random.default_rng(4).standard_normal((4096, 64))
    y = graph()
    with dx.phases() as one:
        dx.run(y, inputs={"x": data}, client=client)
    with dx.phases() as two:
        for _ in range(2):
            np.testing.assert_allclose(dx.run(y, inputs={"x": data}, client=client),
                                       expected(data), rtol=1e-12)
        with dx.phases() as inner:  # a block inside another collects its own runs
            dx.run(y, inputs={"x": data}, client=client)
    assert set(one) == set(two) == set(inner)
    before = dict(two)
    dx.run(y, inputs={"x": data}, client=client)  # outside every block: nothing collected
    assert two == before
    # (gather is 0 where the cluster's last callback came after it: all the cluster's)
    assert all(seconds >= 0 for seconds in (*one.values(), *two.values()))
    assert one["submit"] > 0 and two["submit"] > 0 and two["cluster"] > 0
