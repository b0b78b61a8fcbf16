"""`dx.run(..., cancel=token)`: `token.cancel()` from another thread stops the run on the
cluster; it raises RunCancelled and is recorded interrupted, and the cluster runs on."""

import threading
import time

import numpy as np
import pytest
from sqlmodel import select

import deepx_flow as dx
from deepx_flow.kernels.faults import Fault
from deepx_flow.meta import open_db
from deepx_flow.meta.models import Run
from tests.helpers import faults_on


def _graph():
    x = dx.random.uniform((64, 1000), seed=1)
    return (dx.sin(x) * 2.0).sum(axis=1)


@pytest.mark.timeout(120)
def test_a_cancelled_run_raises_is_recorded_interrupted_and_the_cluster_runs_on(client):
    """Every task hangs until the test ends: only the cancellation ends the run."""
    db = open_db()
    token = dx.Cancellation()
    timer = threading.Timer(1.0, token.cancel, kwargs={"reason": "the client asked"})
    with faults_on(client, Fault("hang")):
        timer.start()
        began = time.monotonic()
        with pytest.raises(dx.RunCancelled,
                           match="was cancelled before it finished: the client asked"):
            dx.run(_graph(), client=client, cancel=token)
        assert time.monotonic() - began < 60
    with db.read() as s:
        run = s.exec(select(Run).order_by(Run.started_at.desc())).first()
    assert run.status == "interrupted" and "cancelled" in run.error
    # the cluster is fine, and a fresh token runs the same graph to the end
    x = np.asarray(dx.run(dx.random.uniform((64, 1000), seed=1), client=client),
                   dtype=np.float64)
    got = dx.run(_graph(), client=client, cancel=dx.Cancellation())
    np.testing.assert_allclose(got, (np.sin(x) * 2.0).sum(axis=1), rtol=1e-5)


@pytest.mark.timeout(120)
def test_a_token_cancelled_before_the_run_stops_it_at_once(client):
    token = dx.Cancellation()
    token.cancel()
    with faults_on(client, Fault("hang")):
        with pytest.raises(dx.RunCancelled, match="cancelled"):
            dx.run(_graph(), client=client, cancel=token)


def test_a_token_cancelled_after_its_run_changes_nothing(client):
    token = dx.Cancellation()
    got = dx.run(dx.arange(5, dtype="int64") + 1, client=client, cancel=token)
    token.cancel()
    np.testing.assert_array_equal(got, np.arange(5) + 1)


def test_cancel_must_be_a_cancellation():
    with pytest.raises(dx.InputError, match="not a dx.Cancellation"):
        dx.run(dx.arange(3), cancel=True)
