"""`dx.schedule`: materialize an asset selection on a cron schedule.

A schedule is a frozen value: when (a cron expression read in a time zone), what (an asset
selection) and how a daemon that fell behind catches up. Its cron string and time zone are
checked where it is written, so a typo fails when the project loads, not at 2 a.m.;
`Definitions` then checks its selection against the assets and that its name is unique.
The `deepx-flow scheduler` daemon (`deepx_flow.scheduler`) runs schedules.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from deepx_flow.errors import GraphError, InputError

CATCHUP = ("latest", "all")


@dataclass(frozen=True, slots=True)
class ScheduleDef:
    """One schedule: materialize `selection` at each time `cron` names in `timezone`."""

    name: str
    cron: str
    selection: str
    only_stale: bool = False
    timezone: str = "UTC"
    catchup: str = "latest"  # see deepx_flow.scheduler.ticks

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)


def schedule(cron: str, select="*", *, name: str | None = None, only_stale: bool = False,
             timezone: str = "UTC", catchup: str = "latest") -> ScheduleDef:
    """A cron schedule that materializes an asset selection.

    Parameters
    ----------
    cron : str
        Five fields (minute hour day month weekday), or six with seconds as the sixth
        (croniter's order: `"* * * * * */10"` is every ten seconds; `"*/10 * * * * *"`
        every second of minutes 0, 10, 20, ...), or an alias such as `"@daily"`.
    select : str or list of str
        An asset selection (`deepx_flow.assets.selection`); every asset by default.
    name : str, optional
        Unique within the Definitions; by default derived from the selection
        (`materialize_embeddings`).
    only_stale : bool
        Materialize only the selected assets that are stale.
    timezone : str
        The IANA time zone the cron fields are read in (`"Europe/Berlin"`).
    catchup : {"latest", "all"}
        What a daemon that missed several ticks does: run only the newest ("latest"), or
        run each missed tick once, oldest first ("all").
    """
    selection = _selection_text(select)
    name = name if name is not None else _default_name(selection)
    if not isinstance(name, str) or not name.isidentifier():
        raise GraphError(f"schedule name must be an identifier, got {name!r}")
    if catchup not in CATCHUP:
        raise GraphError(f"schedule {name}: catchup must be one of {', '.join(CATCHUP)}, got "
                         f"{catchup!r}")
    _check_timezone(name, timezone)
    _check_cron(name, cron, timezone)
    return ScheduleDef(name, " ".join(cron.split()), selection, bool(only_stale), timezone,
                       catchup)


def checked_schedules(defs, schedules) -> tuple[ScheduleDef, ...]:
    """`schedules` for `defs` (a Definitions whose assets are checked): each a ScheduleDef,
    names unique, each selection valid and not empty."""
    from deepx_flow.assets.selection import select

    seen: set[str] = set()
    for s in schedules:
        if not isinstance(s, ScheduleDef):
            raise GraphError(f"Definitions(schedules=...) takes dx.schedule(...) values, got "
                             f"{s!r}")
        if s.name in seen:
            raise GraphError(f"two schedules are named {s.name!r}; give one its own name=")
        seen.add(s.name)
        try:
            picked = select(defs, s.selection)
        except InputError as err:
            raise GraphError(f"schedule {s.name}: {err}") from None
        if not picked:
            raise GraphError(f"schedule {s.name}: selection {s.selection!r} picks no assets")
    return tuple(schedules)


def _selection_text(select) -> str:
    if isinstance(select, (list, tuple, set)):
        select = ", ".join(str(term) for term in select)
    if not isinstance(select, str) or not select.strip():
        raise GraphError(f"schedule selection must be a non-empty string or list of asset "
                         f"names, got {select!r}")
    return select.strip()


def _default_name(selection: str) -> str:
    words = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", selection)
    return "materialize_" + ("_".join(words) if words else "all")


def _check_timezone(name: str, timezone) -> None:
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise GraphError(f"schedule {name}: unknown time zone {timezone!r} (use an IANA name "
                         f"such as 'UTC' or 'Europe/Berlin')") from None


def _check_cron(name: str, cron, timezone: str) -> None:
    from croniter import CroniterError, croniter

    fields = cron.split() if isinstance(cron, str) else []
    alias = len(fields) == 1 and fields[0].startswith("@")
    if not alias and len(fields) not in (5, 6):
        raise GraphError(f"schedule {name}: cron {cron!r} must have 5 fields (minute hour day "
                         f"month weekday) or 6 (with seconds last)")
    if not croniter.is_valid(" ".join(fields)):
        raise GraphError(f"schedule {name}: cannot read cron {cron!r}")
    try:  # valid fields can still name no time at all ("0 0 30 2 *": 30 February)
        croniter(" ".join(fields), dt.datetime.now(ZoneInfo(timezone))).get_next(float)
    except CroniterError:
        raise GraphError(f"schedule {name}: cron {cron!r} never fires") from None
