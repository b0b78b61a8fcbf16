"""What one materialization did, in words: the text `print(dx.materialize(...))` and
`deepx-flow materialize` show, and the HTML table a notebook shows.

Each stored asset gets one line, with its checks' verdicts (a failed check with its
message). An asset with many partitions is summed up in one line (how many, the first and
the last, their shape when they share one) and its checks counted over the partitions,
naming the partitions where one failed: a daily backfill of a year is a dozen lines, not
hundreds. What was not materialized is said per asset, with why.
"""

from __future__ import annotations

import json
from collections import defaultdict

from deepx_flow.registry.cluster import format_bytes

SHOWN_PARTITIONS = 4  # more partitions of one asset than this are summed up
NAMED_FAILURES = 3  # partitions named where a check failed


def split_target(target: str) -> tuple[str, str | None]:
    """("asset", "partition") of "asset[partition]"; ("asset", None) of "asset"."""
    asset, _, rest = target.partition("[")
    return asset, (rest[:-1] if rest else None)


def _shape(row) -> str:
    return f"{tuple(json.loads(row.shape))} {row.dtype}"


def _check_words(results) -> str:
    """'checks: a passed, b failed (why)' for one target's check results."""
    words = [f"{c.check} passed" if c.passed else f"{c.check} FAILED ({c.message})"
             for c in results]
    return "checks: " + ", ".join(words) if words else ""


def _named(partitions: list[str]) -> str:
    shown = ", ".join(partitions[:NAMED_FAILURES])
    return shown + (f" and {len(partitions) - NAMED_FAILURES} more"
                    if len(partitions) > NAMED_FAILURES else "")


def _checks_over(targets: list[str], checks: dict) -> str:
    """The checks of many partitions of one asset, counted: 'checks: a passed on all 330,
    b FAILED on 2 (2025-03-04, 2025-06-07)'."""
    failed, seen = defaultdict(list), {}
    for target in targets:
        for c in checks.get(target, ()):
            seen.setdefault(c.check, 0)
            seen[c.check] += 1
            if not c.passed:
                failed[c.check].append(split_target(target)[1])
    words = []
    for name, count in seen.items():
        if failed[name]:
            words.append(f"{name} FAILED on {len(failed[name])} of {count} "
                         f"({_named(failed[name])})")
        else:
            words.append(f"{name} passed on all {count}")
    return "checks: " + ", ".join(words) if words else ""


def _by_asset(names) -> dict[str, list[str]]:
    grouped = defaultdict(list)
    for name in names:
        grouped[split_target(name)[0]].append(name)
    return grouped


def lines(done) -> list[tuple[str, str, str]]:
    """(what, stored, checks) per asset, or per target where there are few partitions:
    the rows the text and the HTML are made of."""
    out = []
    for asset, targets in _by_asset(done.versions).items():
        if len(targets) <= SHOWN_PARTITIONS:
            for target in targets:
                row = done.versions[target]
                out.append((target, f"version {row.version[:12]} {_shape(row)} -> {row.uri}",
                            _check_words(done.checks.get(target, ()))))
            continue
        rows = [done.versions[t] for t in targets]
        parts = sorted(split_target(t)[1] for t in targets)
        shapes = {_shape(r) for r in rows}
        shape = f"each {shapes.pop()}" if len(shapes) == 1 else f"{len(shapes)} shapes"
        nbytes = sum(r.nbytes or 0 for r in rows)
        out.append((asset, f"{len(targets)} partitions {parts[0]} ... {parts[-1]}, {shape}, "
                           f"{format_bytes(nbytes)} in all",
                    _checks_over(targets, done.checks)))
    for asset, targets in _by_asset(done.skipped).items():
        reasons = defaultdict(list)
        for target in targets:
            reasons[done.skipped[target]].append(target)
        for why, which in reasons.items():
            what = which[0] if len(which) == 1 else f"{asset} ({len(which)} partitions)"
            out.append((what, f"not materialized: {why}", ""))
    return out


def materialized_text(done) -> str:
    if not done.versions and not done.skipped:
        return "nothing to materialize"
    text = []
    for what, stored, checks in lines(done):
        text.append(f"{what}: {stored}" + (f"; {checks}" if checks else ""))
    return "\n".join(text)


def materialized_html(done) -> str:
    from deepx_flow.text_table import html_table
    if not done.versions and not done.skipped:
        return "<p>nothing to materialize</p>"
    runs = ", ".join(done.run_ids) or "not recorded"
    return html_table(("asset", "stored", "checks"), lines(done),
                      f"materialized in {done.seconds:.2f} s; "
                      f"run{'s' if len(done.run_ids) > 1 else ''}: {runs}",
                      css_class="deepx-materialized")


__all__ = ["materialized_text", "materialized_html", "split_target", "SHOWN_PARTITIONS"]
