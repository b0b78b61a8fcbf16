"""The overview's pure parts: registered workers joined with the scheduler's report, the
memory chart's columns, the link to Dask's dashboard (only ever an http URL built from a
parsed host and an int port), sizes and first lines of errors."""

from __future__ import annotations

from urllib.parse import urlsplit

from hypothesis import given, settings
from hypothesis import strategies as st

from deepx_flow.ui import cluster_state as cs

GIB = 1 << 30


def identity(workers: dict) -> dict:
    """A scheduler identity shaped as distributed's `Scheduler.identity` gives it."""
    return {"type": "Scheduler", "services": {"dashboard": 8787}, "workers": workers}


def live_info(memory, limit, gpu_used=None, gpu_total=None, name="w"):
    info = {"name": name, "host": "10.0.0.1", "nthreads": 1, "memory_limit": limit,
            "metrics": {"memory": memory, "managed_bytes": memory // 2}}
    if gpu_used is not None:  # what a worker with pynvml adds
        info["metrics"]["gpu"] = {"utilization": 3, "memory-used": gpu_used}
        info["gpu"] = {"name": "NVIDIA H100", "memory-total": gpu_total}
    return info


def registered(address, limit, scheduler="tcp://10.0.0.1:8786"):
    return {"address": address, "scheduler": scheduler, "name": address[-1], "host": "10.0.0.1",
            "nthreads": 1, "memory_limit": limit, "storage": "host 8.00 GiB"}


def test_registered_workers_are_joined_with_the_live_ones_by_address():
    reg = [registered("tcp://10.0.0.1:1", 8 * GIB), registered("tcp://10.0.0.1:2", 4 * GIB)]
    live = cs.live_workers(identity({
        "tcp://10.0.0.1:1": live_info(2 * GIB, 8 * GIB),
        "tcp://10.0.0.1:3": live_info(GIB, 16 * GIB, name="new")}))
    rows = cs.worker_rows(reg, live, "10.0.0.1:8786")
    assert [r["worker"] for r in rows] == ["tcp://10.0.0.1:1", "tcp://10.0.0.1:2",
                                           "tcp://10.0.0.1:3"]
    assert [r["state"] for r in rows] == ["live", "registered, not seen live",
                                          "live, not registered"]
    assert [r["memory used"] for r in rows] == ["2.00 GiB", "-", "1.00 GiB"]
    assert [r["memory registered"] for r in rows] == ["8.00 GiB", "4.00 GiB", "16.00 GiB"]
    assert [r["used"] for r in rows] == ["25%", "-", "6%"]
    assert rows[2]["scheduler"] == "tcp://10.0.0.1:8786"  # the one read, with its protocol
    assert all(set(r) == set(cs.WORKER_COLUMNS) for r in rows)
    # Not read: only what was registered, and it says so.
    assert [r["state"] for r in cs.worker_rows(reg, None)] == ["registered"] * 2
    assert [r["memory used"] for r in cs.worker_rows(reg, None)] == ["-", "-"]


def test_gpu_memory_used_is_shown_where_the_worker_reports_it():
    live = cs.live_workers(identity({
        "tcp://a:1": live_info(GIB, 8 * GIB, gpu_used=20 * GIB, gpu_total=80 * GIB),
        "tcp://b:1": live_info(GIB, 8 * GIB),
        "tcp://c:1": live_info(GIB, 8 * GIB, gpu_used=GIB, gpu_total=40 * GIB)}))
    devices = [{"worker": "tcp://a:1", "index": 0, "name": "H100", "memory_total": 80 * GIB,
                "healthy": True},
               {"worker": "tcp://a:1", "index": 1, "name": "H100", "memory_total": 80 * GIB,
                "healthy": False},
               {"worker": "tcp://b:1", "index": 0, "name": "A10", "memory_total": 24 * GIB,
                "healthy": True}]
    rows = cs.gpu_rows(devices, live)
    assert [(r["worker"], r["gpu"]) for r in rows] == [
        ("tcp://a:1", "0"), ("tcp://a:1", "1"), ("tcp://b:1", "0"), ("tcp://c:1", "-")]
    # a reports its own (first) GPU; b has no pynvml; c is not registered
    assert [r["memory used"] for r in rows] == ["20.00 GiB", "-", "-", "1.00 GiB"]
    assert [r["memory registered"] for r in rows] == ["80.00 GiB", "80.00 GiB", "24.00 GiB",
                                                      "40.00 GiB"]
    assert [r["used"] for r in rows] == ["25%", "-", "-", "2%"]
    assert [r["healthy"] for r in rows] == ["yes", "no", "yes", "-"]
    assert rows[3]["name"] == "NVIDIA H100"
    assert [r["memory used"] for r in cs.gpu_rows(devices, None)] == ["-"] * 3


sizes = st.one_of(st.none(), st.integers(0, 1 << 42))
addresses = st.sampled_from([f"tcp://10.0.0.{i}:{p}" for i in range(3) for p in (1, 2)])


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(addresses, sizes, max_size=6),
       st.dictionaries(addresses, st.tuples(st.integers(0, 1 << 40), sizes), max_size=6))
def test_the_chart_has_one_entry_per_row_of_the_workers_table(reg_limits, live_values):
    reg = [registered(a, limit) for a, limit in sorted(reg_limits.items())]
    live = cs.live_workers(identity({a: live_info(m, limit)
                                     for a, (m, limit) in live_values.items()}))
    cols = cs.memory_columns(reg, live)
    rows = cs.worker_rows(reg, live)
    assert cols["worker"] == [r["worker"] for r in rows]
    for a, used, limit, used_gib in zip(cols["worker"], cols["used"], cols["registered"],
                                        cols["used_gib"]):
        assert used == (live_values[a][0] if a in live_values else 0)
        expected = reg_limits[a] if a in reg_limits else live_values[a][1]
        assert limit == (expected or 0)
        assert used_gib == used / GIB
    assert cs.memory_columns(reg, None)["used"] == [0] * len(reg)


def test_odd_reports_are_shown_as_missing_not_raised():
    live = cs.live_workers({"workers": {"tcp://a:1": {"metrics": None, "memory_limit": "x",
                                                      "gpu": "?"}, "tcp://b:1": "junk"}})
    assert live["tcp://a:1"]["memory"] is None and live["tcp://a:1"]["limit"] is None
    assert live["tcp://b:1"]["gpu_total"] is None
    assert cs.live_workers(None) == {} and cs.live_workers({"workers": None}) == {}


def test_the_dask_dashboard_link():
    assert cs.dashboard_url("tcp://127.0.0.1:8786", 8787) == "http://127.0.0.1:8787/status"
    assert cs.dashboard_url("scheduler.example:8786", 80) == "http://scheduler.example:80/status"
    assert cs.dashboard_url("ucx://[::1]:8786", 8787) == "http://[::1]:8787/status"
    assert cs.dashboard_url("tls://node-1.cluster", 1) == "http://node-1.cluster:1/status"
    for port in (0, 65536, -1, "8787", 8787.0, True, None):
        assert cs.dashboard_url("tcp://127.0.0.1:8786", port) is None
    for address in ('tcp://a"b:1', "tcp://<script>:1", "tcp://a b:1", "tcp://[::zz]:1",
                    "tcp://[::1]x:1", "tcp://:1", "javascript:alert(1)//x:1", "tcp://a/b:1"):
        assert cs.dashboard_url(address, 8787) is None
    assert cs.dashboard_port({"services": {"dashboard": 8787}}) == 8787
    assert cs.dashboard_port({"services": {}}) is None and cs.dashboard_port(None) is None


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=40), st.one_of(st.integers(-5, 70000), st.text(max_size=5)))
def test_the_dashboard_link_is_an_http_url_with_the_schedulers_host_or_nothing(address, port):
    url = cs.dashboard_url(address, port)
    if url is None:
        return
    parts = urlsplit(url)
    assert parts.scheme == "http" and parts.path == "/status"
    assert parts.port == port and not parts.query and not parts.fragment
    location = cs.scheduler_key(address).split("://", 1)[1]
    assert parts.hostname in location.lower()
    assert not set(url) & set("\"'<> `\\\n\t")


def test_sizes_shares_and_first_lines():
    assert cs.bytes_text(None) == "-" and cs.bytes_text("7") == "-" and cs.bytes_text(True) == "-"
    assert cs.bytes_text(3 * GIB // 2) == "1.50 GiB" and cs.bytes_text(5 << 20) == "5.0 MiB"
    assert cs.percent_text(1, 4) == "25%" and cs.percent_text(0, 4) == "0%"
    assert cs.percent_text(None, 4) == "-" and cs.percent_text(1, 0) == "-"
    assert cs.first_line("\n  ValueError: bad  \nTraceback") == "ValueError: bad"
    assert cs.first_line(None) == "" and cs.first_line("x" * 500) == "x" * 200
    assert cs.storage_text([("host", 8 * GIB), ("disk", None)]) == "host 8.00 GiB, disk -"
    assert cs.storage_text([]) == "-"
    assert cs.scheduler_key(" 10.0.0.1:8786") == "tcp://10.0.0.1:8786"
    assert cs.scheduler_key("ucx://h:1") == "ucx://h:1"


def test_an_address_registered_under_two_schedulers_is_one_bar():
    from deepx_flow.ui.cluster_state import memory_columns
    registered = [{"address": "tcp://a:1", "memory_limit": 2 * 2**30},
                  {"address": "tcp://b:1", "memory_limit": 2**30},
                  {"address": "tcp://a:1", "memory_limit": 4 * 2**30}]  # another scheduler
    cols = memory_columns(registered, None)
    assert cols["worker"] == ["tcp://a:1", "tcp://b:1"]
    assert cols["registered"] == [2 * 2**30, 2**30]
