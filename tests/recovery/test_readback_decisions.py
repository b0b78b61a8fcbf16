"""The pure parts of reading lost chunks back (`runtime/readback.py`): which stored chunks of
a lost lineage are read and which computed again, the storage rate, where each chunk lies,
and the expected task times (`RunWatch.expected`) the decisions use."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import deepx_flow as dx
from deepx_flow.errors import InputError
from deepx_flow.runtime.drift import MEASURED_AFTER, RunWatch
from deepx_flow.runtime.readback import (DEFAULT_STORE_RATE, READ_OPEN_S, StoreRate, decide,
                                        lost_lineage, stored_chunks)
from deepx_flow.runtime.recovery import TaskPolicy
from deepx_flow.storage import zarr_store


def chain_decision(held=(), readable=("a",), seconds=None, read_s=0.5):
    """root -> a -> b -> c (each needs the next); `a` is stored."""
    deps = {"root": ["a"], "a": ["b"], "b": ["c"], "c": []}
    seconds = seconds or {"root": 1.0, "a": 1.0, "b": 1.0, "c": 1.0}
    return decide("root", deps.__getitem__, lambda k: k in held, lambda k: k in readable,
                  seconds.__getitem__, lambda k: read_s)


def test_a_stored_chunk_is_read_when_its_lost_lineage_costs_more():
    [choice] = chain_decision(read_s=0.5)
    assert (choice.key, choice.read, choice.tasks) == ("a", True, 3)
    assert choice.recompute_s == pytest.approx(3.0)
    assert choice.reason.startswith("reading it back about 0.500 s; computing it again runs 3")


def test_it_is_computed_again_when_that_is_cheaper():
    [choice] = chain_decision(read_s=5.0)
    assert not choice.read
    assert choice.reason.startswith("computing it again runs 3 tasks (about 3.000 s)")


def test_a_held_dependency_ends_the_lineage():
    """`b` is still on a worker: computing `a` again costs `a` alone."""
    [choice] = chain_decision(held=("b",), read_s=1.5)
    assert (choice.read, choice.tasks, choice.recompute_s) == (False, 1, 1.0)


def test_nothing_below_a_chunk_that_is_read_is_looked_at():
    """`c` is stored too, but reading `a` means `c` is not needed."""
    choices = chain_decision(readable=("a", "c"), read_s=0.5)
    assert [c.key for c in choices] == ["a"]
    # Computing `a` again instead: then `c` is needed, and decided in its turn.
    choices = chain_decision(readable=("a", "c"), read_s=2.5,
                             seconds={"root": 1.0, "a": 1.0, "b": 1.0, "c": 5.0})
    assert [(c.key, c.read) for c in choices] == [("a", True)]
    choices = chain_decision(readable=("a", "c"), read_s=2.5,
                             seconds={"root": 1.0, "a": 0.5, "b": 0.5, "c": 1.0})
    assert [(c.key, c.read) for c in choices] == [("a", False), ("c", False)]


def test_the_root_itself_can_be_read():
    choices = decide("a", {"a": ["b"], "b": []}.__getitem__, lambda k: False,
                     lambda k: k == "a", lambda k: 1.0, lambda k: 0.1)
    assert [(c.key, c.read, c.tasks) for c in choices] == [("a", True, 2)]


@st.composite
def lineages(draw):
    """A random DAG (edges from lower to higher numbers), held and stored sets, task times
    and read times."""
    n = draw(st.integers(2, 14))
    deps = {k: sorted(draw(st.sets(st.integers(k + 1, n - 1), max_size=3)))
            if k < n - 1 else [] for k in range(n)}
    held = draw(st.sets(st.integers(1, n - 1)))
    readable = draw(st.sets(st.integers(0, n - 1)))
    seconds = draw(st.lists(st.floats(0.0, 10.0), min_size=n, max_size=n))
    reads = draw(st.lists(st.floats(0.0, 10.0), min_size=n, max_size=n))
    return deps, held, readable, seconds, reads


@settings(max_examples=300, deadline=None)
@given(lineages())
def test_every_choice_compares_a_read_with_its_whole_lost_lineage(case):
    deps, held, readable, seconds, reads = case
    choices = decide(0, deps.__getitem__, held.__contains__, readable.__contains__,
                     seconds.__getitem__, reads.__getitem__)
    read = {c.key for c in choices if c.read}
    assert len({c.key for c in choices}) == len(choices)  # each chunk decided once
    for c in choices:
        lineage = lost_lineage(c.key, deps.__getitem__, held.__contains__)
        assert c.key in readable and c.key not in held
        assert c.tasks == len(lineage) == len(set(lineage))
        assert c.recompute_s == pytest.approx(sum(seconds[k] for k in lineage))
        assert c.read == (reads[c.key] < c.recompute_s)
        # It is needed: reachable from the root through lost chunks not read back.
        assert c.key in _needed(0, deps, held, read)
    # Every stored chunk that is needed was decided.
    decided = {c.key for c in choices}
    assert {k for k in _needed(0, deps, held, read) if k in readable} <= decided


def _needed(root, deps, held, read) -> set:
    """What computing `root` again needs, when the chunks in `read` are read back."""
    seen, todo = {root}, [root]
    while todo:
        key = todo.pop()
        if key in read:
            continue
        for dep in deps[key]:
            if dep not in seen and dep not in held:
                seen.add(dep)
                todo.append(dep)
    return seen


def test_the_walk_is_bounded():
    deps = {k: [k + 1] for k in range(100)}
    deps[100] = []
    assert len(lost_lineage(0, deps.__getitem__, lambda k: False, limit=10)) == 10


# -- the storage rate ---------------------------------------------------------------------------

def test_storage_is_assumed_at_a_default_rate_until_a_write_measured_it():
    rate = StoreRate()
    assert rate.rate() == DEFAULT_STORE_RATE
    rate.add(0, 1.0)  # nothing measured by an empty write
    assert rate.rate() == DEFAULT_STORE_RATE
    rate.add(100e6, 1.0)
    rate.add(300e6, 1.0)
    assert rate.rate() == pytest.approx(200e6)
    assert rate.read_seconds(50e6) == pytest.approx(READ_OPEN_S + 0.25)


# -- where each chunk lies ---------------------------------------------------------------------

@pytest.mark.parametrize("chunks", [((4, 4, 2), (3, 3)), ((3, 5, 2), (6,)), ((10,), (2, 4))],
                         ids=["regular", "irregular", "one-row"])
def test_every_chunk_is_mapped_to_the_writes_that_store_its_region(chunks, tmp_path):
    shape = tuple(sum(c) for c in chunks)
    uri = str(tmp_path / "t.zarr")
    tasks = zarr_store.write_tasks(uri, "t@x", shape, "float64", chunks, "store-t")
    stored = stored_chunks("t@x", chunks, tasks, uri)
    starts = [np.cumsum((0,) + c[:-1]) for c in chunks]
    grid = list(itertools.product(*(range(len(c)) for c in chunks)))
    assert set(stored) == {("t@x", *idx) for idx in grid}
    for idx in grid:
        s = stored[("t@x", *idx)]
        assert s.path == uri
        assert s.region == tuple((int(st_[i]), int(st_[i]) + c[i])
                                 for st_, c, i in zip(starts, chunks, idx))
        for write in s.writes:  # every write listed reads this chunk ...
            assert ("t@x", *idx) in tasks[write].dependencies
    # ... and every write that reads a chunk is listed for it.
    for key, task in tasks.items():
        for dep in task.dependencies:
            assert key in stored[dep].writes


# -- expected task times -----------------------------------------------------------------------

def test_expected_time_is_the_estimate_then_the_measured_mean_then_the_median():
    policy = TaskPolicy(0, 0.5, 30.0, None, True, 4.0, 1.0, expected_s=0.25)
    w = RunWatch({"n": policy}, lambda key: key[0])
    assert w.expected(("n", 0)) == 0.25
    assert w.expected(("other", 0)) == 0.0  # no policy, nothing measured
    times = [1.0, 3.0, 8.0, 2.0]
    for i, t in enumerate(times):
        w.started(("n", i), "w1", 100.0)
        assert w.finished(("n", i), 100.0 + t) == pytest.approx(t)
        done = times[:i + 1]
        want = float(np.median(done)) if len(done) >= MEASURED_AFTER else float(np.mean(done))
        assert w.expected(("n", 0)) == pytest.approx(want)
    assert w.finished(("n", 99), 5.0) is None  # never seen starting


def test_read_back_must_be_true_or_false():
    assert dx.Recovery().read_back is True
    with pytest.raises(InputError, match="read_back='yes' is not True or False"):
        dx.Recovery(read_back="yes")
