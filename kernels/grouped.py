"""Running a group of tasks as one task (`deepx_flow.compiler.group`)."""

from __future__ import annotations


def run_group(members, outside, wanted, *values):
    """Run the tasks `members` in order, their inputs from outside the group being `values`
    (for the keys `outside`); return the results of the keys `wanted`, in that order."""
    results = dict(zip(outside, values))
    for member in members:
        results[member.key] = member({k: results[k] for k in member.dependencies})
    return tuple(results[k] for k in wanted)


def take_output(results, i):
    """Result `i` of a group's task."""
    return results[i]
