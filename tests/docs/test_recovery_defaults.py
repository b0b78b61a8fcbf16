"""docs/recovery.md states `dx.Recovery`'s defaults in words and numbers; they are the
code's: each phrase below is built from the default it states, so a changed default fails
here until the page says the new one."""

from __future__ import annotations

from pathlib import Path

import deepx_flow as dx
from deepx_flow.runtime.drift import MAX_TIMEOUTS

PAGE = Path(__file__).resolve().parents[2] / "docs" / "recovery.md"
TIMES = {1: "once", 2: "twice"}


def test_the_stated_recovery_defaults_are_the_codes():
    text = " ".join(PAGE.read_text().split())
    r = dx.Recovery()
    assert r.retries == 0 and r.timeout is None and r.speculate
    stated = [
        "Defaults: no retries, no absolute timeout (slowness never fails a run)",
        f"a backup past {r.speculation_factor:g}x the expected time but never before "
        f"{r.speculation_min:g} s",
        f"exclude a worker after {r.exclude_after} offences",
        f"wait {r.worker_wait:g} s for workers",
        f"re-plan {TIMES.get(r.replan_on_oom, f'{r.replan_on_oom} times')}",
        # the table of what fails
        f"({r.speculation_factor:g}x the median of the run's finished tasks of the same "
        f"step, at least {r.speculation_min:g} s)",
        f"a worker beaten {TIMES.get(r.exclude_after, f'{r.exclude_after} times')} is "
        "`exclude`d",
        f"fails a task that times out {MAX_TIMEOUTS} times",
        f"(\"no workers for {r.worker_wait:g} s\")",
    ]
    assert [s for s in stated if s not in text] == []
