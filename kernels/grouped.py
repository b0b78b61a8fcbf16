"""Running a group of tasks as one task (`deepx_flow.compiler.group`)."""

from __future__ import annotations


def run_group(members, where, wanted, *values):
    """Run the tasks `members` in order and return the results of the keys `wanted`, in that
    order. `where` says, for each key read from outside the group, which of `values` holds
    it: `(key, None)` the value itself, `(key, i)` item i of another group's result."""
    results = {key: value if i is None else value[i]
               for (key, i), value in zip(where, values)}
    # Each result is let go after its last reader in the group, unless it is wanted: a
    # group may run many tasks, and holding every chunk they made would add them all up.
    left = {}
    for member in members:
        for k in member.dependencies:
            left[k] = left.get(k, 0) + 1
    keep = set(wanted)
    for member in members:
        results[member.key] = member({k: results[k] for k in member.dependencies})
        for k in member.dependencies:
            left[k] -= 1
            if not left[k] and k not in keep:
                del results[k]
    return tuple(results[k] for k in wanted)


def take_output(results, i):
    """Result `i` of a group's task."""
    return results[i]
