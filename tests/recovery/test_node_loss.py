"""Node loss across hosts: three "hosts" made as network namespaces on this machine (the
scheduler's, with a bridge, and two worker hosts wired to it by veth pairs; addresses only
inside them), a run across the four workers of the two worker hosts, and one whole worker
host lost mid-run. The run must finish with the right result, be recorded as succeeded with
a worker-lost event, and leave no chunk recorded on the lost host.

Two ways to lose the host: every process on it killed with SIGKILL (its kernel still closes
the sockets, so the scheduler knows at once), or its link cut (nothing is said: the
scheduler drops its workers when their heartbeats have been missing for WORKER_TTL, 5-10 s
here).

The root namespace has no address on that network, so the driver (the process calling
dx.run) runs in the scheduler's namespace too: it is this module run as a script. Skips
where network namespaces cannot be made (not root, no `ip`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import deepx_flow as dx
from tests.helpers import assert_sums_close, cluster_with_memory

REPO = Path(__file__).resolve().parents[2]
SUBNET = "10.213.77"  # private and unlikely to clash; it exists only inside the namespaces
SCHEDULER_IP = f"{SUBNET}.1"
HOST_IPS = {"b": f"{SUBNET}.2", "c": f"{SUBNET}.3"}  # the worker hosts; "c" is lost
WORKERS_PER_HOST = 2
ADDRESS = f"tcp://{SCHEDULER_IP}:8786"
# A cut link shows only as silence: the scheduler drops a worker whose heartbeats stop for
# WORKER_TTL, connecting gives up after CONNECT_TIMEOUT, and a silent open connection is
# dropped by TCP keepalive after TCP_TIMEOUT (the least Dask allows; defaults are 5 min, 30 s
# and 30 s).
WORKER_TTL = "5s"
CONNECT_TIMEOUT = "5s"
TCP_TIMEOUT = "11s"
# After a cut link Dask sometimes leaves a task "processing" on a B worker that never got it
# (about one run in ten here); deepx_flow starts a backup of it elsewhere once it has waited
# past its peers (it waits on a worker with an idle thread, so it counts as running).
RECOVERY = dx.Recovery()


def graph():
    x = dx.random.normal((3000, 256), seed=11, dtype="float64")
    u = dx.random.uniform((256, 64), seed=12, dtype="float64")
    return x, u, (dx.tanh(x @ (u - 0.5)) * 2.0 + 1.0).sum(axis=1)


def spec():
    return cluster_with_memory(2**18, workers=2 * WORKERS_PER_HOST)  # a few hundred tasks


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["kill", "cut"])
def test_a_run_survives_losing_a_whole_worker_host(hosts, tmp_path, how):
    assert dx.compile(graph()[2], cluster=spec()).stats().tasks >= 200
    hosts.start_cluster()
    driver = hosts.start("a", "driver", [sys.executable, "-m", "tests.recovery.test_node_loss",
                                         str(tmp_path)])
    ready = json.loads(hosts.wait_for_file(tmp_path / "ready.json", driver, 90).read_text())
    hosts.wait_for_file(tmp_path / "started", driver, 60)
    time.sleep(0.3 * ready["undisturbed_s"])  # well inside the run
    lost_at = time.time()
    if how == "kill":
        killed = hosts.kill_all("c")
        assert len(killed) == WORKERS_PER_HOST, killed
    else:
        hosts.ip("link", "set", "vc", "down", ns="a")
    try:
        driver.wait(timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the run did not finish after host c was lost\n{hosts.logs()}")
    assert driver.returncode == 0, f"the driver failed\n{hosts.logs()}"

    x, u, reference, out = (np.load(tmp_path / f"{n}.npy") for n in ("x", "u", "ref", "out"))
    terms = np.tanh(x @ (u - 0.5)) * 2.0 + 1.0
    assert_sums_close(reference, terms.sum(axis=1), np.abs(terms).sum(axis=1), 1e-10)
    np.testing.assert_array_equal(out, reference)

    from sqlmodel import select

    from deepx_flow.meta import open_db
    from deepx_flow.meta.db import close_all
    from deepx_flow.meta.models import ChunkPlacement, Event, Run, Task

    db = open_db(f"sqlite:///{tmp_path / 'deepx.db'}")
    on_c = f"tcp://{HOST_IPS['c']}:"
    try:
        with db.read() as s:
            runs = s.exec(select(Run).order_by(Run.started_at)).all()
            lost = runs[-1]
            ran_on = set(s.exec(select(Task.worker).where(Task.run_id == runs[-2].id)).all())
            events = s.exec(select(Event).where(Event.run_id == lost.id)).all()
            held = s.exec(select(ChunkPlacement.worker).where(
                ChunkPlacement.state.in_(("memory", "spilled")))).all()
    finally:
        close_all()
    assert [r.status for r in runs] == ["succeeded"] * 5
    # The undisturbed run went across both worker hosts; the lost host's workers were
    # noticed during the last run, and no chunk is recorded as still held by them.
    assert {a.rsplit(":", 1)[0] for a in ran_on} == {f"tcp://{ip}" for ip in HOST_IPS.values()}
    # One worker-lost event per worker of host c: every run going when it went gets one.
    gone = [e for e in events if e.kind == "worker-lost" and e.worker.startswith(on_c)]
    assert len({e.worker for e in gone}) == WORKERS_PER_HOST == len(gone), \
        f"not one worker-lost event per worker of host c: {[(e.kind, e.worker) for e in events]}"
    assert not [w for w in held if w.startswith(on_c)], "chunks recorded on the lost host"
    print(f"{how}: undisturbed run {ready['undisturbed_s']:.1f} s, host lost after "
          f"{0.3 * ready['undisturbed_s']:.1f} s, noticed after "
          f"{min(e.at for e in gone) - lost_at:.1f} s, run took "
          f"{lost.ended_at - lost.started_at:.1f} s, events {[e.kind for e in events]}")


class Hosts:
    """Network namespaces "a" (the scheduler's: a bridge with SCHEDULER_IP) and one per
    worker host, each on a veth pair whose other end ("v<host>") is a port of a's bridge;
    and the processes started in them. Names carry our pid, so runs side by side (or one
    aborted earlier) do not clash."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.ns = {h: f"dxnl{os.getpid()}{h}" for h in ("a", *HOST_IPS)}
        self.made: list[str] = []
        self.procs: list[subprocess.Popen] = []
        self.env = dict(os.environ, DEEPX_DB_URL=f"sqlite:///{tmp / 'deepx.db'}",
                        DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL=WORKER_TTL,
                        DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT=CONNECT_TIMEOUT,
                        DASK_DISTRIBUTED__COMM__TIMEOUTS__TCP=TCP_TIMEOUT,
                        PYTHONPATH=os.pathsep.join(
                            p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))

    def ip(self, *args, ns: str | None = None) -> str:
        argv = ["ip", *(["-n", self.ns[ns]] if ns else []), *args]
        done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=30)
        if done.returncode:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
        return done.stdout

    def make(self) -> None:
        for name in self.ns.values():
            try:
                self.ip("netns", "add", name)
            except RuntimeError as err:
                pytest.skip(f"cannot create network namespaces: {err}")
            self.made.append(name)
        for h in self.ns:
            self.ip("link", "set", "lo", "up", ns=h)
        self.ip("link", "add", "br0", "type", "bridge", ns="a")
        self.ip("addr", "add", f"{SCHEDULER_IP}/24", "dev", "br0", ns="a")
        self.ip("link", "set", "br0", "up", ns="a")
        for h, addr in HOST_IPS.items():
            self.ip("link", "add", f"v{h}", "type", "veth", "peer", "name", "eth0",
                    "netns", self.ns[h], ns="a")
            self.ip("link", "set", f"v{h}", "master", "br0", "up", ns="a")
            self.ip("addr", "add", f"{addr}/24", "dev", "eth0", ns=h)
            self.ip("link", "set", "eth0", "up", ns=h)

    def start(self, host: str, name: str, argv: list[str]) -> subprocess.Popen:
        # `ip netns exec` execs the command itself: the pid is the Python process's.
        with open(self.tmp / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(["ip", "netns", "exec", self.ns[host], *argv], cwd=REPO,
                                    env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        self.procs.append(proc)
        return proc

    def start_cluster(self) -> None:
        """The scheduler in a, WORKERS_PER_HOST workers in each worker host. No nannies:
        a host that dies takes its nannies with it, so they would restart nothing."""
        self.start("a", "scheduler", [
            sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", SCHEDULER_IP,
            "--port", ADDRESS.rsplit(":", 1)[1], "--no-dashboard"])
        for h, addr in HOST_IPS.items():
            for i in range(WORKERS_PER_HOST):
                self.start(h, f"worker-{h}{i}", [
                    sys.executable, "-m", "distributed.cli.dask_worker", ADDRESS,
                    "--host", addr, "--name", f"{h}{i}", "--nthreads", "1", "--no-nanny",
                    "--memory-limit", "1GiB", "--no-dashboard", "--death-timeout", "120",
                    "--local-directory", str(self.tmp / f"worker-{h}{i}")])

    def pids(self, host: str) -> list[int]:
        return [int(p) for p in self.ip("netns", "pids", self.ns[host]).split()]

    def kill_all(self, host: str) -> list[int]:
        pids = self.pids(host)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    def wait_for_file(self, path: Path, driver: subprocess.Popen, timeout: float) -> Path:
        deadline = time.monotonic() + timeout
        while not path.exists():
            if driver.poll() is not None:
                pytest.fail(f"the driver exited ({driver.returncode})\n{self.logs()}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {path.name} after {timeout} s\n{self.logs()}")
            time.sleep(0.01)
        return path

    def logs(self, tail: int = 3000) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-tail:]}"
                         for p in sorted(self.tmp.glob("*.log")))

    def close(self) -> None:
        """Kill what we started and anything else in the namespaces, then delete them (a
        namespace with a process left in it would live on, nameless)."""
        try:
            for proc in self.procs:
                proc.kill()
            for h, name in self.ns.items():
                if name in self.made:
                    self.kill_all(h)
            for proc in self.procs:
                proc.wait(timeout=30)
        finally:
            for name in self.made:
                _ip_quietly("netns", "del", name)


def _sweep_abandoned() -> None:
    """Delete the namespaces of earlier test processes killed outright (their pid is gone),
    with whatever still runs in them."""
    listing = _ip_quietly("netns", "list")
    for name, pid in re.findall(r"^(dxnl(\d+)[a-z])\b", listing, re.MULTILINE):
        if Path(f"/proc/{pid}").exists():
            continue
        for p in _ip_quietly("netns", "pids", name).split():
            try:
                os.kill(int(p), signal.SIGKILL)
            except OSError:  # gone already, or not ours to kill (then the del fails too)
                pass
        _ip_quietly("netns", "del", name)


def _ip_quietly(*args) -> str:
    """`ip` where a failure is no news (cleaning up): its output, if any."""
    return subprocess.run(["ip", *args], check=False, capture_output=True, text=True,
                          timeout=30).stdout


@pytest.fixture
def hosts(tmp_path):
    if shutil.which("ip") is None:
        pytest.skip("cannot create network namespaces: no `ip` command (iproute2)")
    _sweep_abandoned()
    hosts = Hosts(tmp_path)
    try:
        hosts.make()
        yield hosts
    finally:
        hosts.close()


# --- the driver: run in namespace a by the test, as `python -m tests.recovery.test_node_loss`


def drive(out: Path) -> None:
    """Warm up, save an undisturbed run (and the random inputs, for a NumPy check), say when
    the last run's tasks have started (`started`), and save that run's result."""
    from distributed import Client

    with Client(ADDRESS, timeout=60) as client:
        client.wait_for_workers(2 * WORKERS_PER_HOST, timeout=60)
        x, u, y = graph()
        np.save(out / "x.npy", dx.run(x, client=client))
        np.save(out / "u.npy", dx.run(u, client=client))
        dx.run(y, client=client, cluster=spec(), recovery=RECOVERY)  # warm-up
        began = time.perf_counter()
        np.save(out / "ref.npy", dx.run(y, client=client, cluster=spec(), recovery=RECOVERY))
        ready = out / "ready.json.part"  # renamed when whole: the test reads it at once
        ready.write_text(json.dumps({"undisturbed_s": time.perf_counter() - began}))
        ready.rename(out / "ready.json")
        threading.Thread(target=_say_when_started, args=(client, out / "started"),
                         daemon=True).start()
        np.save(out / "out.npy", dx.run(y, client=client, cluster=spec(), recovery=RECOVERY))


def _say_when_started(client, path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not any(client.processing().values()) and time.monotonic() < deadline:
        time.sleep(0.01)
    path.touch()


if __name__ == "__main__":
    drive(Path(sys.argv[1]))
