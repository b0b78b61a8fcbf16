"""Tasks held until a test lets them go, so that what finishes before or after a point of the
test is the test's doing, not the machine's speed (a busy 2-core machine runs anything
slowly). Real hangs, of the fault-injection engine (`kernels/faults.py`)."""

from __future__ import annotations

import contextlib

from deepx_flow.ir.keys import node_of


@contextlib.contextmanager
def held(client, nodes):
    """The tasks of `nodes` (node ids) wait once they start, until the block ends: the test,
    not the machine's speed, says when they finish. (Real hangs, of the fault-injection
    engine: `kernels/faults.py`.)"""
    from deepx_flow.kernels.faults import Fault, FaultInjection
    client.register_plugin(FaultInjection([Fault("hang", node=n) for n in sorted(nodes)]))
    try:
        yield
    finally:
        client.unregister_worker_plugin(FaultInjection.name)


def submitted(plan, lowered, client, db):
    """`_submit` of `plan`, lowered as `lowered`, with no backup attempts (a held task would
    get one on another worker, not held, after a second): futures by output, the recorder."""
    from deepx_flow.runtime.recovery import Recovery
    from deepx_flow.runtime.run import _submit
    futures, _, recorder, _ = _submit(plan, plan.graph, {}, client, "run", db=db,
                                      lowered=lowered, recovery=Recovery(speculate=False))
    return futures, recorder


def output_nodes(lowered, name: str) -> set:
    """The ids of the nodes computing output `name`'s chunks."""
    return {node_of(k) for k in lowered.output_keys(name)}
