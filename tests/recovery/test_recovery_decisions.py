"""The pure parts of recovery, driven with events and values alone: drift decisions
(`RunWatch`), time limits and per-operator settings (`Recovery`, `task_policies`), the retry
backoff and how errors are classified."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import deepx_flow as dx
from deepx_flow.errors import InputError
from deepx_flow.kernels import faults
from deepx_flow.kernels.attempt import backoff_seconds, classify
from deepx_flow.runtime.drift import (MAX_TIMEOUTS, MEASURED_AFTER, Drift, Exclude, FailTask,
                                      GiveUp, RunWatch, Speculate, Suspect)
from deepx_flow.runtime.recovery import Recovery, TaskPolicy, operators_of, task_policies
from tests.helpers import cluster_with_memory


def policy(timeout=None, speculate=False, factor=4.0, floor=0.0, expected=1.0,
           measured=False):
    return TaskPolicy(0, 0.5, 30.0, timeout, speculate, factor, floor, expected, measured)


def node_of(key):
    return key[0]


def watch(limit=2.0, exclude_after=2, worker_wait=60.0, **nodes):
    policies = {"n": policy(timeout=limit)}
    policies.update(nodes)
    return RunWatch(policies, node_of, exclude_after, worker_wait)


def kinds(actions):
    return [type(a).__name__ for a in actions]


def test_an_attempt_within_its_limit_is_left_alone():
    w = watch(limit=2.0)
    w.started(("n", 0), "w1", at=100.0)
    assert w.tick(101.9) == []
    w.finished(("n", 0), at=102.0)
    assert w.tick(500.0) == []


def test_an_attempt_over_its_limit_drifts_and_its_worker_becomes_suspect():
    w = watch(limit=2.0)
    w.started(("n", 0), "w1", at=100.0)
    actions = w.tick(102.5)
    assert kinds(actions) == ["Drift", "Suspect"]
    drift = actions[0]
    assert drift == Drift(("n", 0), "w1", 100.0, frozenset({"w1"}), drift.reason)
    assert "over its limit of 2.0 s" in drift.reason
    assert w.tick(103.0) == []  # decided once


def test_repeated_offences_exclude_the_worker_and_later_drifts_avoid_it():
    w = watch(limit=1.0, exclude_after=2)
    w.started(("n", 0), "w1", at=0.0)
    w.started(("n", 1), "w1", at=0.0)
    actions = w.tick(2.0)
    assert kinds(actions) == ["Drift", "Suspect", "Drift", "Exclude"]
    assert actions[3] == Exclude("w1", actions[3].reason)
    assert "2 of its tasks drifted away or beaten by a backup" in actions[3].reason
    w.started(("n", 2), "w2", at=3.0)
    drift = w.tick(5.0)[0]
    assert drift.avoid == {"w1", "w2"}  # excluded for the rest of the run, and where it ran


def test_a_task_that_times_out_everywhere_fails_instead_of_drifting_forever():
    w = watch(limit=1.0, exclude_after=99)
    at = 0.0
    for attempt in range(1, MAX_TIMEOUTS + 1):
        w.started(("n", 0), f"w{attempt}", at=at)
        at += 2.0
        actions = w.tick(at)
        if attempt < MAX_TIMEOUTS:
            assert isinstance(actions[0], Drift)
        else:
            assert kinds(actions) == ["FailTask"]
            assert actions[0] == FailTask(("n", 0), f"w{attempt}", actions[0].reason)
            assert f"timed out {MAX_TIMEOUTS} times" in actions[0].reason


# -- speculation: backups of slow tasks ----------------------------------------------------

def test_a_task_far_past_its_peers_gets_one_backup_and_goes_on():
    w = RunWatch({"n": policy(speculate=True, factor=3.0, floor=0.0, expected=100.0)},
                 node_of)
    w.started(("n", 0), "w1", at=0.0)
    assert w.tick(1000.0) == []  # an estimate from the cost model alone starts nothing
    for i in range(MEASURED_AFTER):
        w.started(("n", i + 1), "w2", at=10.0)
        w.finished(("n", i + 1), at=10.0 + 2.0 * (i + 1))  # 2, 4, 6 s: median 4
    w.started(("n", 9), "w1", at=20.0)
    assert [a.key for a in w.tick(25.0)] == [("n", 0)]  # the first is now far past 12 s
    assert w.tick(31.9) == []
    actions = w.tick(32.5)
    assert actions == [Speculate(("n", 9), "w1", frozenset({"w1"}), actions[0].reason)]
    assert "past 12.0 s (3x its expected time)" in actions[0].reason
    assert w.tick(100.0) == []  # one backup per task
    assert ("n", 9) in w.running  # the first attempt goes on: nothing is failed or dropped


def test_a_measured_operator_speed_is_trusted_before_any_peer_finished():
    w = RunWatch({"n": policy(speculate=True, factor=4.0, floor=5.0, expected=0.5,
                              measured=True)}, node_of)
    w.started(("n", 0), "w1", at=0.0)
    assert w.tick(4.9) == []  # the floor: never before speculation_min
    assert kinds(w.tick(5.1)) == ["Speculate"]


def test_a_backup_that_wins_gives_its_first_workers_an_offence_and_excludes_it_later():
    w = RunWatch({"n": policy(speculate=True, factor=2.0, floor=0.0, expected=1.0,
                              measured=True)}, node_of, exclude_after=2)
    for i in range(2):
        w.started(("n", i), "slow", at=0.0)
        assert kinds(w.tick(2.5)) == ["Speculate"]
        w.backup_started(("n", i), "fast", at=2.6)
        actions = w.backup_finished(("n", i), at=3.6)
        assert kinds(actions) == (["Suspect"] if i == 0 else ["Exclude"])
        assert ("n", i) not in w.running and w.durations["n"][-1] == 1.0
    assert "slow" in w.excluded and "beaten by a backup" in w.excluded["slow"]
    # A backup that lost (the first attempt finished first) is no offence.
    w.started(("n", 5), "w3", at=0.0)
    w.tick(10.0)
    assert w.finished(("n", 5), at=10.5) == 10.5 and w.offences["w3"] == 0


def test_a_task_gets_one_backup_even_when_that_backup_fails():
    w = RunWatch({"n": policy(speculate=True, factor=2.0, floor=0.0, expected=1.0,
                              measured=True)}, node_of)
    w.started(("n", 0), "w1", at=0.0)
    assert kinds(w.tick(2.5)) == ["Speculate"]
    w.backup_started(("n", 0), "w2", at=2.6)
    w.backup_stopped(("n", 0))  # it failed (or could not start): not tried again
    assert w.tick(3.0) == [] and w.tick(100.0) == []
    assert ("n", 0) in w.running  # the first attempt goes on


def test_a_task_on_a_worker_short_of_memory_gets_no_backup_until_the_worker_recovers():
    w = RunWatch({"n": policy(speculate=True, factor=2.0, floor=0.0, expected=1.0,
                              measured=True)}, node_of)
    w.started(("n", 0), "spilling", at=0.0)
    w.started(("n", 1), "fine", at=0.0)
    short = {"spilling"}
    actions = w.tick(2.5, short_of_memory=lambda worker: worker in short)
    assert [(a.key, a.worker) for a in actions] == [(("n", 1), "fine")]
    assert w.tick(50.0, short_of_memory=lambda worker: worker in short) == []
    short.clear()  # its memory came back: now it is slow for some other reason
    actions = w.tick(51.0, short_of_memory=lambda worker: worker in short)
    assert [(a.key, a.worker) for a in actions] == [(("n", 0), "spilling")]


def test_with_speculation_off_a_slow_task_is_left_alone():
    w = RunWatch({"n": policy(speculate=False, expected=0.1, measured=True)}, node_of)
    w.started(("n", 0), "w1", at=0.0)
    assert w.tick(10_000.0) == []


def test_time_queued_behind_other_work_on_a_worker_is_not_running_time():
    w = RunWatch({"n": policy(timeout=1.0)}, node_of)
    w.started(("n", 0), "w1", at=0.0)
    assert w.tick(100.0, running_for=lambda key: None) == []
    assert kinds(w.tick(100.0, running_for=lambda key: 1.5)) == ["Drift", "Suspect"]


def test_a_lost_device_excludes_its_worker_at_once_and_once():
    w = watch()
    w.started(("n", 0), "w1", at=0.0)
    first = w.device_failed(("n", 0), "w1", "device lost", "cudaErrorECCUncorrectable")
    assert kinds(first) == ["Exclude"] and "cudaErrorECCUncorrectable" in first[0].reason
    assert ("n", 0) not in w.running
    assert w.device_failed(("n", 1), "w1", "device lost", "again") == []


def test_no_workers_gives_up_after_the_wait_and_only_then():
    w = watch(worker_wait=10.0)
    assert w.workers(0, at=100.0) == []
    assert w.tick(109.0) == []
    assert w.workers(1, at=109.5) == []  # a replacement came: the clock restarts
    assert w.workers(0, at=110.0) == []
    actions = w.tick(120.5)
    assert actions == [GiveUp(actions[0].reason)] and "no workers for 10 s" in actions[0].reason
    assert w.tick(200.0) == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.floats(0.0, 5.0)), min_size=1, max_size=30),
       st.integers(1, 4))
def test_drift_decisions_hold_their_promises(attempts, exclude_after):
    """Whatever the durations: only attempts over the limit drift, a worker is excluded
    exactly when its offences reach the threshold, and drifts avoid excluded workers."""
    limit = 2.0
    w = watch(limit=limit, exclude_after=exclude_after)
    offences: dict = {}
    for i, (worker_no, ran) in enumerate(attempts):
        worker = f"w{worker_no}"
        at = 10.0 * i
        w.started(("n", i), worker, at=at)
        actions = w.tick(at + ran)
        drifted = [a for a in actions if isinstance(a, Drift)]
        assert bool(drifted) == (ran > limit)
        for d in drifted:
            assert w.excluded.keys() <= d.avoid and worker in d.avoid
        if ran > limit and worker not in offences.get("excluded", set()):
            offences[worker] = offences.get(worker, 0) + 1
        excluded_now = {a.worker for a in actions if isinstance(a, Exclude)}
        if excluded_now:
            assert excluded_now == {worker} and offences[worker] == exclude_after
            offences.setdefault("excluded", set()).add(worker)
        suspects = [a for a in actions if isinstance(a, Suspect)]
        assert not suspects or (offences[worker] == 1 and exclude_after > 1)
        w.finished(("n", i), at=at + ran)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.1, 10.0), min_size=MEASURED_AFTER, max_size=12),
       st.floats(0.0, 200.0), st.floats(1.0, 8.0), st.floats(0.0, 20.0))
def test_a_backup_starts_exactly_past_the_factor_of_the_median_and_the_floor(
        peers, ran, factor, floor):
    import statistics
    w = RunWatch({"n": policy(speculate=True, factor=factor, floor=floor)}, node_of)
    for i, took in enumerate(peers):
        w.started(("n", i), "w2", at=0.0)
        w.finished(("n", i), at=took)
    w.started(("n", "slow"), "w1", at=1000.0)
    actions = w.tick(1000.0 + ran)
    limit = max(floor, factor * statistics.median(peers))
    ran = (1000.0 + ran) - 1000.0  # as the watch measures it
    assert kinds(actions) == (["Speculate"] if ran > limit else [])


# -- limits and settings ---------------------------------------------------------------------

def test_default_settings_never_fail_a_run_for_slowness():
    default = Recovery()
    assert default.timeout is None and default.speculate
    assert (default.speculation_factor, default.speculation_min) == (4.0, 1.0)


def test_operator_and_asset_settings_override_the_runs():
    x = dx.random.normal((512, 256), seed=1)
    w = dx.random.normal((256, 64), seed=2)
    y = dx.relu(x @ w).sum(axis=1)
    plan = dx.compile(y, cluster=cluster_with_memory(2**20, workers=2))
    recovery = Recovery(retries=1, timeout=30.0,
                        operators={"matmul": {"retries": 4}, "relu": {"timeout": 7.0}})
    policies = task_policies(plan, recovery)
    by_op = {}
    for node in plan.fused.nodes:
        by_op.setdefault(node.op, []).append(policies[node.id])
    matmul = by_op["matmul"][0]
    assert matmul.retries == 4
    # relu is fused into the matmul's epilogue: its timeout applies to those tasks too.
    assert "relu" in operators_of(next(n for n in plan.fused.nodes if n.op == "matmul"))
    assert matmul.timeout == 7.0
    assert by_op["random_normal"][0].retries == 1 and by_op["random_normal"][0].timeout == 30.0
    # Every node with tasks of its own has an expected time (a source read inside its
    # reader's tasks has none).
    tasks = {s.node: s.tasks for s in plan.stats().nodes}
    assert all(p.expected_s > 0 for n, p in policies.items() if tasks[n])
    owner = {plan.fused.nodes[0].id: {"retries": 9}}
    assert task_policies(plan, recovery, owner)[plan.fused.nodes[0].id].retries == 9


@pytest.mark.parametrize("kwargs, words", [
    ({"retries": -1}, "retries=-1 is negative"),
    ({"retries": 1.5}, "retries=1.5 is not a whole number"),
    ({"timeout": 0}, "timeout=0 must be positive"),
    ({"backoff": "1s"}, "backoff='1s' is not a number"),
    ({"exclude_after": 0}, "exclude_after=0 must be at least 1"),
    ({"operators": {"matmul": {"retrys": 2}}}, "operator 'matmul': unknown recovery "
                                               "setting(s) ['retrys']"),
    ({"operators": {"matmul": {"timeout": -3}}}, "operator 'matmul': timeout=-3 is negative"),
    ({"speculate": "yes"}, "speculate='yes' is not True or False"),
    ({"speculate": None}, "speculate=None must be set (only timeout may be None)"),
    ({"speculation_min": None}, "speculation_min=None must be set"),
    ({"speculation_factor": 0.5}, "speculation_factor=0.5 must be at least 1"),
    # issue 30, item 6: accepted before, and then waited forever or overflowed a timer
    ({"backoff": float("inf")}, "backoff=inf is more than a week"),
    ({"timeout": float("inf")}, "timeout=inf is more than a week (604,800 s); None means "
                                "no limit"),
    ({"speculation_factor": float("inf")}, "speculation_factor=inf is not finite"),
    ({"worker_wait": float("nan")}, "worker_wait=nan is not a number"),
    ({"retries": 2**70}, "retries=1180591620717411303424 is more than 1,000,000"),
    ({"operators": 5}, "operators=5 is not a mapping"),
    ({"operators": {"matmul": 3}}, "operator 'matmul': 3 is not a mapping"),
    ({"operators": {"matmul": {1: 2}}}, "unknown recovery setting(s) ['1']"),
])
def test_bad_settings_are_refused_with_the_setting_named(kwargs, words):
    with pytest.raises(InputError) as info:
        Recovery(**kwargs)
    assert words in str(info.value)


@given(st.integers(0, 12), st.floats(0.0, 10.0), st.floats(0.0, 100.0))
def test_backoff_doubles_from_the_first_wait_up_to_the_cap(failed, first, cap):
    wait = backoff_seconds(failed, (first, cap))
    if failed == 0 or first == 0:
        assert wait == 0.0
    else:
        assert wait == min(cap, first * 2 ** (failed - 1))
        assert backoff_seconds(failed + 1, (first, cap)) >= wait
    assert backoff_seconds(failed, None) == 0.0


@pytest.mark.parametrize("err, kind", [
    (faults.OutOfMemoryError("Out of memory allocating 1,024 bytes"), "oom"),
    (MemoryError(), "oom"),
    (RuntimeError("CUBLAS_STATUS_ALLOC_FAILED"), "oom"),
    (faults.CUDARuntimeError("cudaErrorECCUncorrectable: uncorrectable ECC error"),
     "device-lost"),
    (RuntimeError("cudaErrorIllegalAddress: an illegal memory access was encountered"),
     "device-lost"),
    (ValueError("shapes do not match"), None),
])
def test_errors_are_classified_by_what_real_hardware_says(err, kind):
    assert classify(err) == kind


def test_a_suspect_workers_tasks_are_backed_up_sooner():
    w = RunWatch({"n": policy(speculate=True, factor=4.0, floor=2.0, expected=1.0,
                              measured=True)}, node_of, exclude_after=3)
    w.started(("n", 0), "slow", at=0.0)
    w.started(("n", 1), "fine", at=0.0)
    assert [a.key for a in w.tick(4.1)] == [("n", 0), ("n", 1)]  # past 4 x 1 s, both
    w.backup_started(("n", 0), "fine", at=4.1)
    assert kinds(w.backup_finished(("n", 0), at=5.0)) == ["Suspect"]
    w.started(("n", 2), "slow", at=10.0)
    w.started(("n", 3), "fine", at=10.0)
    actions = w.tick(12.1)  # past 2 x 1 s (half the factor, half the floor): the suspect's
    assert [a.key for a in actions] == [("n", 2)]
    assert "past 2.0 s (2x its expected time)" in actions[0].reason
    assert [a.key for a in w.tick(14.1)] == [("n", 3)]  # the others', past 4 s as before
