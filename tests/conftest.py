"""Shared fixtures: a private home folder, a real broker process, real MCP stdio sessions."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from agent_bridge.common import paths
from agent_bridge.ipc import blocking

# A test run never shows notifications on the desktop it runs on: the brokers the tests start
# find no session bus unless a test gives them its own (tests/test_alerts_desktop.py).
for _variable in ("DBUS_SESSION_BUS_ADDRESS", "DISPLAY"):
    os.environ.pop(_variable, None)

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "agent_bridge"]
READY_TIMEOUT = 30.0


def wait_until(predicate, timeout: float = READY_TIMEOUT, interval: float = 0.02, what: str = "condition"):
    """Poll a condition with a deadline (no fixed sleeps: returns as soon as it holds)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)


@pytest.fixture
def home() -> Iterator[Path]:
    # Short and private: the socket path must fit sun_path.
    with tempfile.TemporaryDirectory(prefix="ab-") as folder:
        yield Path(folder) / "home"
        stop_broker_of(Path(folder) / "home")


def is_broker(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return any(b"agent_bridge" in a or b"agent-bridge" in a for a in argv) and b"up" in argv


def stop_broker_of(home: Path) -> None:
    """A broker a test's sessions started (a relay starts one when none runs) ends with the
    test: none outlives the folder it serves."""
    record = paths.running_broker(home)
    pid = record["pid"] if record is not None else paths.lock_holder(home)  # one still starting
    if not pid or pid == os.getpid() or not is_broker(int(pid)):  # a test may hold the lock itself
        return
    try:
        os.kill(int(pid), signal.SIGTERM)  # the lock says this pid is that broker
    except (ProcessLookupError, PermissionError):
        return
    wait_until(lambda: paths.lock_holder(home) is None, what=f"the broker of {home} to stop")


@pytest.fixture
def env(home: Path) -> dict[str, str]:
    e = dict(os.environ)
    for key in ("AGENT_BRIDGE_HOST_SESSION_ID", "CLAUDE_CODE_SESSION_ID", "AGENT_BRIDGE_HOP_LIMIT",
                "AGENT_BRIDGE_HOST_PID", "AGENT_BRIDGE_FAULT"):
        e.pop(key, None)
    e["AGENT_BRIDGE_HOME"] = str(home)
    e["AGENT_BRIDGE_WEB_PORT"] = "0"
    e["PYTHONUNBUFFERED"] = "1"
    return e


def run_cli(
    env: dict[str, str], *args: str, input: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *args], env=env, input=input, capture_output=True, text=True, timeout=timeout
    )


class BrokerProcess:
    """A real `agent-bridge up` in the foreground, as a child we can stop or kill -9."""

    def __init__(self, env: dict[str, str], home: Path) -> None:
        self.env = env
        self.home = home
        self.proc: subprocess.Popen | None = None

    def start(self, extra_env: dict[str, str] | None = None) -> BrokerProcess:
        env = {**self.env, **(extra_env or {})}
        self.proc = subprocess.Popen(
            [*CLI, "up"], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        proc = self.proc

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"broker exited with {proc.returncode}: {proc.stderr.read().decode()}")
            record = paths.read_broker_json(self.home)
            if not record or record.get("pid") != proc.pid:
                return False
            try:
                return blocking.call(self.home, "ping", timeout=1.0) == "pong"
            except (blocking.BrokerUnavailable, OSError):
                return False

        wait_until(ready, what="broker ready")
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def status(self) -> dict[str, Any]:
        return blocking.call(self.home, "status", timeout=5.0)


@pytest.fixture
def broker(env: dict[str, str], home: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(env, home)
    try:
        yield b.start()
    finally:
        b.kill()


def tool_json(result: Any) -> Any:
    assert not result.is_error, result.content[0].text
    return json.loads(result.content[0].text)


def tool_error(result: Any) -> str:
    assert result.is_error, f"expected a tool error, got {result.content[0].text}"
    return result.content[0].text


def _claude_style_session_class() -> Any:
    from mcp import ClientSession

    class ClaudeStyleSession(ClientSession):
        """The SDK client, declaring the experimental `claude/channel` capability: a host that
        takes channel notifications (the SDK's client declares no experimental ones). Claude
        Code 2.1.197 declares it only with channels switched on, which these tests never saw."""

        def _build_capabilities(self, version: str) -> Any:
            caps = super()._build_capabilities(version)
            return caps.model_copy(update={"experimental": {"claude/channel": {}}})

    return ClaudeStyleSession


@asynccontextmanager
async def mcp_session(
    env: dict[str, str], *args: str, cwd: str | None = None, extra_env: dict[str, str] | None = None,
    channel: bool = False, message_handler: Any = None, bindings: Any = None, logging_callback: Any = None,
) -> AsyncIterator[Any]:
    """A real `agent-bridge mcp` process driven by the official MCP client over stdio."""
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "agent_bridge", "mcp", *args],
        env={**env, **(extra_env or {})},
        cwd=cwd,
    )
    session_class = _claude_style_session_class() if channel else ClientSession
    async with stdio_client(params) as (read, write):
        kwargs: dict[str, Any] = {}
        if message_handler is not None:
            kwargs["message_handler"] = message_handler
        if bindings is not None:
            kwargs["notification_bindings"] = bindings
        if logging_callback is not None:
            kwargs["logging_callback"] = logging_callback
        async with session_class(read, write, **kwargs) as session:
            await session.initialize()
            yield session


def mcp_server_pids(marker: str) -> list[int]:
    """Pids of `agent-bridge mcp` processes whose command line contains `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"agent_bridge" in argv and b"mcp" in argv and marker.encode() in argv:
            found.append(int(entry))
    return found


async def call(session: Any, tool: str, **args: Any) -> Any:
    return tool_json(await session.call_tool(tool, args))


async def call_error(session: Any, tool: str, **args: Any) -> str:
    return tool_error(await session.call_tool(tool, args))


async def load_dashboard(broker: BrokerProcess) -> None:
    """Have the broker load its dashboard's server now, as a browser would. It loads it at the
    first request or once its sessions settle (dashboard/deferred.py): some 10 MB and 0.2 s of
    CPU, once, which a test that watches the broker between two moments must not count."""
    import httpx

    async with httpx.AsyncClient() as web:
        assert (await web.get(broker.status()["web"] + "/")).status_code == 403  # no cookie


async def wait_for(predicate, timeout: float = 20.0, interval: float = 0.02, what: str = "condition"):  # noqa: ASYNC109
    """Async polling with a fail_after guard."""
    with trio.fail_after(timeout):
        while True:
            value = await predicate()
            if value:
                return value
            await trio.sleep(interval)
