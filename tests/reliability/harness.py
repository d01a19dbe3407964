"""Helpers of the reliability tests: a broker that kills itself at a chosen point, sessions
that record exactly what their agent was shown, database counts, and a Trio loop in a thread
for Hypothesis tests that need one long-lived connection across examples."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import apsw
import trio

from agent_bridge.common import paths
from agent_bridge.store import reader
from tests.conftest import CLI, BrokerProcess, run_cli, wait_for

T = TypeVar("T")

KILLED = -9  # Popen.returncode of a process that died of SIGKILL


def rows(home: Path, sql: str, args: tuple = ()) -> list[tuple]:
    """Read bridge.db as the hooks and the dashboard do (read-only), through the platform's own
    VFS even while a test has made a fault-injecting one the default."""
    conn = apsw.Connection(str(home / "bridge.db"), flags=apsw.SQLITE_OPEN_READONLY, vfs="unix")
    try:
        conn.set_busy_timeout(reader.BUSY_TIMEOUT_MS)
        with conn:
            return [tuple(r) for r in conn.execute(sql, args)]
    finally:
        conn.close()


def count(home: Path, sql: str, args: tuple = ()) -> int:
    return int(rows(home, sql, args)[0][0])


def start_faulty_broker(env: dict[str, str], home: Path, point: str) -> BrokerProcess:
    """A broker that SIGKILLs itself at `point` (common/faults.py). The MCP servers never see
    AGENT_BRIDGE_FAULT, so the broker they restart is a normal one."""
    assert "AGENT_BRIDGE_FAULT" not in env
    return BrokerProcess(env, home).start({"AGENT_BRIDGE_FAULT": point})


async def wait_killed(broker: BrokerProcess, timeout: float = 120) -> int:  # noqa: ASYNC109
    """Wait for the faulty broker to die; returns its exit status."""
    assert broker.proc is not None
    return await trio.to_thread.run_sync(functools.partial(broker.proc.wait, timeout))


async def wait_new_broker(home: Path, old_pid: int, timeout: float = 60) -> int:  # noqa: ASYNC109
    """Wait until another broker (restarted by an MCP server) answers; returns its pid."""

    async def replaced() -> int | None:
        record = paths.read_broker_json(home)
        if record and record.get("pid") != old_pid and paths.pid_alive(record["pid"]):
            return int(record["pid"])
        return None

    return await wait_for(replaced, timeout=timeout, what="a restarted broker")


def stop_any_broker(env: dict[str, str]) -> None:
    run_cli(env, "down", timeout=60)


@dataclass
class Agent:
    """What one agent saw: the ids and texts its `inbox` calls returned, in order."""

    name: str
    session: Any
    shown: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    calling: tuple[str, float] | None = None  # the tool call under way and when it began (trio time)
    cancelled_in: tuple[str, float] | None = None  # the call a timeout cancelled, and how long it had run

    async def call_tool(self, tool: str, args: dict[str, Any]) -> Any:
        """`session.call_tool`, remembering which call is under way for `Progress.report`."""
        self.calling = (tool, trio.current_time())
        try:
            return await self.session.call_tool(tool, args)
        except trio.Cancelled:
            self.cancelled_in = (tool, trio.current_time() - self.calling[1])
            raise
        finally:
            self.calling = None

    def state(self, now: float) -> str:
        busy = f", in {self.calling[0]} for {now - self.calling[1]:.1f} s" if self.calling else ""
        if self.cancelled_in is not None:
            busy += f", cancelled in {self.cancelled_in[0]} after {self.cancelled_in[1]:.1f} s"
        return f"{self.name}: shown {len(self.shown)}, errors {len(self.errors)}{busy}"

    @property
    def ids(self) -> list[str]:
        return [m["id"] for m in self.shown]

    async def inbox_once(self, wait: float = 1) -> list[dict[str, Any]]:
        result = await self.call_tool("inbox", {"wait_seconds": wait})
        if result.is_error:
            self.errors.append(result.content[0].text)
            return []
        got = json.loads(result.content[0].text)
        self.shown.extend(got)
        return got

    async def read_until_set(self, stop: trio.Event) -> None:
        """Read until `stop`; never cancelled mid-call, which would drop what a call returned."""
        while not stop.is_set():
            await self.inbox_once()

    async def read_until(self, predicate: Callable[[], bool], timeout: float = 60) -> None:  # noqa: ASYNC109
        with trio.fail_after(timeout):
            while not predicate():
                await self.inbox_once()


class Progress:
    """Where a long test is: the phases it passed and what each agent is doing, so a test that
    runs out of time says where it stopped instead of only that it did."""

    def __init__(self, agents: dict[str, Agent] | None = None) -> None:
        self.start = trio.current_time()
        self.phases: list[tuple[float, str]] = []
        self.agents = agents if agents is not None else {}

    def reached(self, phase: str) -> None:
        self.phases.append((trio.current_time() - self.start, phase))

    def report(self) -> str:
        now = trio.current_time()
        passed = "; ".join(f"{at:.1f} s {phase}" for at, phase in self.phases) or "none"
        agents = "; ".join(agent.state(now) for agent in self.agents.values())
        return f"after {now - self.start:.1f} s. Phases passed: {passed}. Agents: {agents}"


@contextmanager
def within(seconds: float, progress: Progress) -> Iterator[None]:
    """`trio.fail_after`, failing with where the test had got to."""
    try:
        with trio.fail_after(seconds):
            yield
    except trio.TooSlowError:
        raise AssertionError(f"ran out of its {seconds:g} s {progress.report()}") from None


class TrioThread:
    """A Trio loop in a thread, holding long-lived async resources (a live MCP session, a
    dashboard) for synchronous Hypothesis tests, which run each example outside Trio."""

    def __init__(self) -> None:
        self._token: trio.lowlevel.TrioToken | None = None
        self._ready = threading.Event()
        self._stop: trio.Event | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.value: Any = None

    def start(
        self, resource: Callable[[TrioThread, trio.Event], Awaitable[None]], timeout: float = 120
    ) -> TrioThread:
        """`resource(self, stop)` sets `self.value` once ready, then waits for `stop`."""

        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            self._stop = trio.Event()
            await resource(self, self._stop)

        def run() -> None:
            try:
                trio.run(main)
            except BaseException as exc:  # reported to the test thread
                self._error = exc
            finally:
                self._ready.set()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise AssertionError("the Trio thread did not become ready")
        if self._error is not None:
            raise self._error
        return self

    def ready(self) -> None:
        """Called by the resource inside the loop once `value` is set."""
        self._ready.set()

    def run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        assert self._token is not None
        return trio.from_thread.run(fn, *args, trio_token=self._token)

    def stop(self, timeout: float = 60) -> None:
        if (
            self._token is not None
            and self._stop is not None
            and self._thread is not None
            and self._thread.is_alive()
        ):
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        if self._thread is not None:
            self._thread.join(timeout)
        if self._error is not None:
            raise self._error


def run_agent_bridge(
    env: dict[str, str], *args: str, stdin: bytes = b"", timeout: float = 60
) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], env=env, input=stdin, capture_output=True, timeout=timeout)


def vm_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


def all_cmdlines() -> dict[int, bytes]:
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    found[int(entry)] = f.read()
            except OSError:
                continue
    return found
