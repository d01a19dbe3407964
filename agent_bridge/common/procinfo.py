"""Process ancestry, to pair a hook with the MCP server of the same host (SPEC §3).

Each side computes its ancestor chain (pid, start time, executable name) before anything
detaches, and names its *host*: the nearest ancestor that is an agent host (a program of one of
the hosts in agent_bridge.hosts, such as `claude` or `codex`, or the pid in AGENT_BRIDGE_HOST_PID;
`hosts.find_host` asks the registry).
Two processes belong to the same host when their hosts match on pid **and** start time (pids are
reused). Light: the standard library only.
"""

from __future__ import annotations

import os
import sys
from typing import NamedTuple

MAX_HOPS = 12


class Proc(NamedTuple):  # not a dataclass: the hooks must not pay for importing `dataclasses`
    pid: int
    start: int  # clock ticks since boot (Linux /proc) or epoch seconds (`ps -o lstart=` elsewhere)
    exe: str  # basename of the program, e.g. "claude", "node", "sh"
    argv0: str = ""

    def to_json(self) -> list[object]:
        return [self.pid, self.start, self.exe]


def _linux_proc(pid: int) -> tuple[Proc, int] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    # comm is in parentheses and may contain spaces or parentheses: split on the last ')'.
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2 :].split()
    ppid, start = int(fields[1]), int(fields[19])
    argv0 = ""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv0 = f.read().split(b"\0", 1)[0].decode("utf-8", "replace")
    except OSError:
        pass
    return Proc(pid, start, comm, argv0), ppid


def _ps_proc(pid: int) -> tuple[Proc, int] | None:
    import subprocess  # here, not at the top: on Linux the hooks never need it

    try:
        out = subprocess.run(
            ["ps", "-o", "ppid=,lstart=,comm=", "-p", str(pid)],
            capture_output=True,
            text=True,
            timeout=2,
            env={**os.environ, "LC_ALL": "C"},  # lstart in the C locale's words, whatever the user's
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    if not out:
        return None
    parts = out.split()
    try:
        ppid = int(parts[0])
        start = lstart_epoch(" ".join(parts[1:6]))
    except (ValueError, IndexError):
        return None
    comm = os.path.basename(" ".join(parts[6:]))
    return Proc(pid, start, comm, comm), ppid


def lstart_epoch(lstart: str) -> int:
    """`ps -o lstart=` ("Mon Nov 30 21:46:35 2026", local time, C locale) as epoch seconds.

    A value every process computes alike: the start time must match across the hook and the
    MCP server, so nothing per-process (such as Python's randomized `hash()`) may enter it."""
    import time

    return int(time.mktime(time.strptime(" ".join(lstart.split()), "%a %b %d %H:%M:%S %Y")))


def describe(pid: int) -> tuple[Proc, int] | None:
    """(the process, its parent pid), or None if it is gone."""
    if sys.platform.startswith("linux"):
        return _linux_proc(pid)
    if sys.platform == "win32":
        return None
    return _ps_proc(pid)


def ancestry(pid: int | None = None, max_hops: int = MAX_HOPS) -> list[Proc]:
    """The chain from `pid` (default: this process's parent) up, nearest first."""
    chain: list[Proc] = []
    current = os.getppid() if pid is None else pid
    seen: set[int] = set()
    while current > 0 and current not in seen and len(chain) < max_hops:
        seen.add(current)
        found = describe(current)
        if found is None:
            break
        proc, parent = found
        chain.append(proc)
        current = parent
    return chain


def host_override(env: dict[str, str] | os._Environ[str] | None = None) -> int | None:
    env = os.environ if env is None else env
    raw = env.get("AGENT_BRIDGE_HOST_PID", "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        return None
    return value if value > 0 else None


def host_json(proc: Proc | None) -> dict[str, object] | None:
    return None if proc is None else {"pid": proc.pid, "start": proc.start, "exe": proc.exe}
