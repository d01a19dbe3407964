"""The agent hosts agent-bridge works with: one module per host, and this registry.

A host module holds everything agent-bridge knows about one host: the names its processes run
under, where its configuration files are, how `install` registers the MCP server and the hooks
there, what its hooks print, and what `doctor` checks. Everything else asks this registry, so
supporting another host (Gemini CLI, OpenCode) is one new module with a `Host` subclass and its
`HOST`, listed in `ALL` below.

Light: the hooks import this package, so it loads only the standard library's cheapest parts.
"""

from __future__ import annotations

import os

from agent_bridge.common import procinfo
from agent_bridge.hosts import claude, codex
from agent_bridge.hosts.base import Check, Host

__all__ = ["ALL", "DEFAULT", "EXCLUSIVE", "NAMES", "Check", "Host", "by_name", "current_host", "find_host",
           "for_process"]

ALL: tuple[Host, ...] = (claude.HOST, codex.HOST)
NAMES: tuple[str, ...] = tuple(h.name for h in ALL)
DEFAULT: Host = claude.HOST  # the agent assumed when neither `--agent` nor the host process says
EXCLUSIVE: frozenset[str] = frozenset(h.name for h in ALL if h.exclusive)


def by_name(name: str) -> Host | None:
    """The host called `name` (an `--agent` value), or None for an agent we have no module for."""
    for host in ALL:
        if host.name == name:
            return host
    return None


def for_process(*names: str) -> Host | None:
    """The host whose program any of these process names (executable or argv[0] basenames) is."""
    lowered = [n.lower() for n in names if n]
    for host in ALL:
        if any(n.startswith(host.process_prefixes) for n in lowered):
            return host
    return None


def find_host(chain: list[procinfo.Proc], host_pid: int | None = None) -> procinfo.Proc | None:
    """The nearest agent host in `chain` (or the process AGENT_BRIDGE_HOST_PID names)."""
    if host_pid is not None:
        for proc in chain:
            if proc.pid == host_pid:
                return proc
        found = procinfo.describe(host_pid)
        return found[0] if found else None
    for proc in chain:
        if for_process(proc.exe, os.path.basename(proc.argv0)) is not None:
            return proc
    return None


def current_host(
    env: dict[str, str] | os._Environ[str] | None = None,
) -> tuple[procinfo.Proc | None, list[procinfo.Proc]]:
    """(this process's agent host, its ancestor chain). Call early, before anything detaches."""
    chain = procinfo.ancestry()
    return find_host(chain, procinfo.host_override(env)), chain
