"""The cluster as the overview page shows it: the workers and GPUs registered in the metadata
database joined with what the live Dask scheduler reports, the memory chart's columns, and
the link to Dask's own dashboard.

Pure: registered rows and the scheduler's identity (plain dicts) in, table rows and plotting
columns out. Reading the database and the scheduler is the page's business
(`ui/pages/overview.py`, `ui/scheduler_watch.py`).

What a worker reports (distributed's `Scheduler.identity`): `memory_limit`; under `metrics`,
`memory` (its process memory, as its monitor measured it) and `managed_bytes` (what Dask
holds in it); with pynvml on the worker (dask-cuda workers), `metrics["gpu"]["memory-used"]`
and, from its startup, `gpu` = {"name", "memory-total"} for its GPU.
"""

from __future__ import annotations

import ipaddress
import re

MISSING = "-"
GIB = float(1 << 30)

# A DNS name or IPv4 address, nothing that could leave the href's host part.
_HOST_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?\Z")


def scheduler_key(address: str) -> str:
    """`address` as the registry records a scheduler: with its protocol (tcp:// when none is
    given, as Dask assumes)."""
    address = address.strip()
    return address if "://" in address else f"tcp://{address}"


def bytes_text(n) -> str:
    """A size as the tables show it: GiB with two decimals, or MiB below a GiB ('-': unknown)."""
    if n is None or isinstance(n, bool) or not isinstance(n, (int, float)):
        return MISSING
    if abs(n) >= GIB:
        return f"{n / GIB:.2f} GiB"
    return f"{n / (1 << 20):.1f} MiB"


def percent_text(used, total) -> str:
    """`used` as a share of `total` ('-' when either is unknown, or `total` is 0)."""
    if _size(used) is None or not _size(total):
        return MISSING
    return f"{100.0 * used / total:.0f}%"


def _size(n) -> int | None:
    """A byte count the scheduler or database gave, or None when it is not one."""
    if isinstance(n, bool) or not isinstance(n, (int, float)) or n < 0:
        return None
    return int(n)


def live_workers(identity: dict | None) -> dict[str, dict]:
    """Per worker address: what the scheduler says of its memory and GPU right now
    (`memory`, `managed`, `limit`, `gpu_used`, `gpu_total`, `gpu_name`; None when the worker
    does not report it)."""
    workers = (identity or {}).get("workers") or {}
    live = {}
    for address, info in workers.items():
        info = info if isinstance(info, dict) else {}
        metrics = info.get("metrics") if isinstance(info.get("metrics"), dict) else {}
        gpu_now = metrics.get("gpu") if isinstance(metrics.get("gpu"), dict) else {}
        gpu = info.get("gpu") if isinstance(info.get("gpu"), dict) else {}
        live[str(address)] = {
            "name": str(info.get("name", address)), "host": str(info.get("host", "")),
            "threads": info.get("nthreads"), "memory": _size(metrics.get("memory")),
            "managed": _size(metrics.get("managed_bytes")),
            "limit": _size(info.get("memory_limit")) or None,
            "gpu_used": _size(gpu_now.get("memory-used")),
            "gpu_total": _size(gpu.get("memory-total")),
            "gpu_name": gpu.get("name") if isinstance(gpu.get("name"), str) else None}
    return live


WORKER_COLUMNS = ("worker", "name", "host", "threads", "state", "memory used",
                  "memory registered", "used", "managed by Dask", "storage", "scheduler")


def worker_rows(registered: list[dict], live: dict[str, dict] | None,
                scheduler: str | None = None) -> list[dict]:
    """One row per worker, registered ones first (in their order), then live workers the
    registry does not know (of `scheduler`, the one read). `registered` rows: address,
    scheduler, name, host, nthreads, memory_limit, storage (text), and `gone` when the
    registry counts it gone (the scheduler may still report it: then it is live). `live`:
    `live_workers(...)`, or None when the scheduler was not read (the rows then show only
    what was registered)."""
    rows = []
    known = set()
    for reg in registered:
        address = reg["address"]
        known.add(address)
        now = (live or {}).get(address)
        if now:
            state = "live"
        elif reg.get("gone"):
            state = "gone"
        else:
            state = "registered" if live is None else "registered, not seen live"
        row = _worker_row(address, reg.get("name"), reg.get("host"), reg.get("nthreads"),
                          state, now, reg.get("memory_limit"), reg.get("storage"))
        rows.append({**row, "scheduler": reg.get("scheduler") or ""})
    for address, now in sorted((live or {}).items()):
        if address not in known:
            row = _worker_row(address, now["name"], now["host"], now["threads"],
                              "live, not registered", now, now["limit"], None)
            rows.append({**row, "scheduler": scheduler_key(scheduler) if scheduler else ""})
    return rows


def _worker_row(address, name, host, threads, state, now, limit, storage) -> dict:
    used = now["memory"] if now else None
    return {"worker": address, "name": name or "", "host": host or "",
            "threads": MISSING if threads is None else str(threads), "state": state,
            "memory used": bytes_text(used), "memory registered": bytes_text(limit),
            "used": percent_text(used, limit),
            "managed by Dask": bytes_text(now["managed"] if now else None),
            "storage": storage or MISSING}


GPU_COLUMNS = ("worker", "gpu", "name", "memory used", "memory registered", "used", "healthy")


def gpu_rows(devices: list[dict], live: dict[str, dict] | None) -> list[dict]:
    """One row per GPU: registered `devices` (worker address, index, name, memory_total,
    healthy; ordered by worker, then index), then GPUs that live workers report but the
    registry does not list. A worker reports the memory used on its own GPU only, which the
    registry records first for it; the other rows show '-'."""
    rows, first_of = [], set()
    for dev in devices:
        worker = dev["worker"]
        now = (live or {}).get(worker) if worker not in first_of else None
        first_of.add(worker)
        used = now["gpu_used"] if now else None
        total = dev.get("memory_total")
        rows.append({"worker": worker, "gpu": str(dev.get("index", 0)),
                     "name": dev.get("name") or "", "memory used": bytes_text(used),
                     "memory registered": bytes_text(total), "used": percent_text(used, total),
                     "healthy": "yes" if dev.get("healthy", True) else "no"})
    for worker, now in sorted((live or {}).items()):
        if worker not in first_of and (now["gpu_total"] or now["gpu_used"] is not None):
            rows.append({"worker": worker, "gpu": MISSING, "name": now["gpu_name"] or "",
                         "memory used": bytes_text(now["gpu_used"]),
                         "memory registered": bytes_text(now["gpu_total"]),
                         "used": percent_text(now["gpu_used"], now["gpu_total"]),
                         "healthy": MISSING})
    return rows


def memory_columns(registered: list[dict], live: dict[str, dict] | None) -> dict:
    """The memory chart's columns, one entry per worker address of `worker_rows` (same
    order; the first row of an address listed twice): the memory used now and the limit
    registered for it (0 where unknown), in bytes and GiB."""
    cols = {"worker": [], "used": [], "registered": [], "used_gib": [], "registered_gib": []}
    live = live or {}
    # One bar per address: an address registered under two schedulers (listed when no
    # scheduler is given) would repeat a factor of the chart's axis, which Bokeh refuses.
    entries, known = [], set()
    for r in registered:
        if r["address"] not in known:
            known.add(r["address"])
            entries.append((r["address"], r.get("memory_limit")))
    entries += [(a, now["limit"]) for a, now in sorted(live.items()) if a not in known]
    for address, limit in entries:
        used = (live.get(address) or {}).get("memory") or 0
        limit = _size(limit) or 0
        cols["worker"].append(address)
        cols["used"].append(used)
        cols["registered"].append(limit)
        cols["used_gib"].append(used / GIB)
        cols["registered_gib"].append(limit / GIB)
    return cols


def storage_text(tiers: list[tuple[str, int | None]]) -> str:
    """A worker's storage tiers as one cell: 'host 8.00 GiB, disk 100.00 GiB'."""
    return ", ".join(f"{tier} {bytes_text(capacity)}" for tier, capacity in tiers) or MISSING


def dashboard_port(identity: dict | None):
    """The port of the scheduler's Bokeh dashboard, as its identity lists it (None if none)."""
    services = (identity or {}).get("services")
    return services.get("dashboard") if isinstance(services, dict) else None


def dashboard_url(scheduler: str, port) -> str | None:
    """The URL of Dask's own dashboard: http, the host of the scheduler address the operator
    gave, the dashboard's port (an int in 1-65535), and Dask's `/status` page. None when
    the host or the port is not one (nothing else reaches the link)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        return None
    location = scheduler_key(scheduler).split("://", 1)[1]
    if location.startswith("["):  # [IPv6]:port
        host, _, rest = location[1:].partition("]")
        if rest and not rest.startswith(":"):
            return None
        try:
            host = f"[{ipaddress.IPv6Address(host).compressed}]"
        except ValueError:
            return None
    else:
        host = location.rsplit(":", 1)[0] if ":" in location else location
        if not _HOST_NAME.match(host):
            return None
    return f"http://{host}:{port}/status"


def first_line(text: str | None, limit: int = 200) -> str:
    """The first non-empty line of an error, cut to `limit` characters."""
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()[:limit]
    return ""
