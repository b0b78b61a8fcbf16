"""Which processes this one can look up by pid: a process's identity, and the one rule
for whether another process's pid means anything here.

A pid names a process only within one PID namespace of one running kernel. The host name
does not tell those apart: containers with their own PID namespaces may share a host name
(host networking, `--uts=host`), and two machines of the same name may share an NFS root.
Looked up by pid from the wrong one, a live process looks gone (or an unrelated process looks
like it). So a process is recorded with its PID space (`pid_space`): the kernel's boot id
(`/proc/sys/kernel/random/boot_id`, new at each boot, shared by the containers on it) and the
PID namespace (`/proc/self/ns/pid`: its device and inode, which namespaces(7) says are equal
exactly for processes in one namespace). Another process's pid is looked up here only when
its host name and PID space are both this process's (`can_look_up`); anything else (another
space, or one not recorded, as by versions of deepx_flow before this) is someone else's to
judge, and callers fall back to what they can know without its pid.

Where the PID space cannot be read on Linux (no /proc, or a /proc of another PID namespace,
whose pids are not this process's), it is None, which matches nothing: such a process
looks up no other process's pid. Other systems have no PID namespaces; their
space is "" (the host's processes all see each other, as the host name said before).
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Process:
    """A process as others can find it again: its host name, PID space and pid."""

    host: str
    space: str | None  # `pid_space`: boot id and PID namespace; None when not known
    pid: int


def this_process() -> Process:
    """This process's identity."""
    return Process(socket.gethostname(), pid_space(), os.getpid())


def pid_space() -> str | None:
    """This process's PID space: "<boot id>/<namespace device>:<inode>" on Linux, "" on
    systems without PID namespaces, None when it cannot be read (it then matches none)."""
    return _space_of(os.getpid())  # by pid: a child forked after a lookup is looked at anew


@lru_cache(maxsize=8)
def _space_of(pid: int) -> str | None:
    if not sys.platform.startswith("linux"):
        return ""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        ns = os.stat("/proc/self/ns/pid")
        # A /proc mounted for another PID namespace (unshare --pid without a /proc of its
        # own) names processes by that namespace's pids, not by ours: none can be looked up.
        if os.readlink("/proc/self") != str(pid):
            return None
    except OSError:
        return None
    return f"{boot}/{ns.st_dev}:{ns.st_ino}" if boot else None


def can_look_up(other: Process, me: Process) -> bool:
    """Whether `other`'s pid names a process `me` can see: the same host name, and the same
    PID space (one boot of one kernel, one PID namespace), known to both."""
    return other.host == me.host and me.space is not None and other.space == me.space


__all__ = ["Process", "can_look_up", "pid_space", "this_process"]
