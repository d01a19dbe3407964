"""`agent-bridge mcp` ends on SIGINT and SIGTERM while its host still holds stdin open, as
hosts end their MCP servers (Claude Code: SIGINT, then SIGTERM, then SIGKILL), with exit 0, no
traceback, and nothing acknowledged that it did not show."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from typing import Any

import pytest
import trio

from agent_bridge.ipc.client import open_bridge_client
from tests.conftest import call, mcp_session, wait_until
from tests.test_delivery import RawHost, hello, socket_of

pytestmark = pytest.mark.slow

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw-host", "version": "1"},
    },
}


def start_server(env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent_bridge", "mcp", *args],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
    proc.stdin.flush()
    answer = json.loads(proc.stdout.readline())
    assert answer["id"] == 1 and "result" in answer, answer
    proc.stdin.write(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
    proc.stdin.flush()
    return proc


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_ends_the_server_while_stdin_stays_open(broker, env, signum):
    proc = start_server(env, "--agent", "claude", "--project", "/w/signal")
    try:
        wait_until(lambda: broker.status()["sessions"] == 1, what="session connected")
        proc.send_signal(signum)
        try:
            code = proc.wait(timeout=20)  # stdin stays open: only the signal can end it
        except subprocess.TimeoutExpired:
            pytest.fail(f"agent-bridge mcp still runs 20 s after {signum.name} with stdin open")
        assert proc.stderr is not None
        err = proc.stderr.read().decode()
        assert code == 0, err
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
        wait_until(lambda: broker.status()["sessions"] == 0, what="session gone")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


async def test_a_signalled_server_acknowledges_nothing_it_did_not_show(broker, env):
    """A message waiting for a session whose server is then signalled stays unacknowledged:
    the next server for the same host session shows it."""
    host = "signal-host-session"
    proc = start_server(env, "--agent", "codex", "--project", "/w/sigack", "--host-session-id", host)
    try:
        wait_until(lambda: broker.status()["sessions"] == 1, what="receiver connected")
        async with mcp_session(env, "--agent", "codex", "--project", "/w/sigsend") as sender:
            await call(sender, "send", to=host, text="kept across the signal")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
    async with mcp_session(
        env, "--agent", "codex", "--project", "/w/sigack", "--host-session-id", host
    ) as again:
        shown = await call(again, "inbox")
    assert [m["text"] for m in shown] == ["kept across the signal"]


async def start_raw_host(env: dict[str, str], *args: str) -> RawHost:
    """A raw JSON-RPC host (tests/test_delivery.py) whose server's stderr is kept for reading."""
    return await RawHost.start(env, *args, keep_stderr=True)


async def read_to_end(stream: Any) -> bytes:
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    return data


@pytest.mark.parametrize("count", [1, 3], ids=["one message", "three messages"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
async def test_a_signal_during_a_waiting_inbox_call_loses_nothing(broker, env, home, signum, count):
    """The host's `inbox` call waits for a message; messages arrive; the host signals its MCP
    server before reading the result (its session ended). The server ends cleanly, and the
    next server for the same host session shows every message the first did not write to its
    stdout; what it did write and is shown again is marked as a repeat."""
    hsid = f"hs-sigwait-{signum.name}-{count}"
    args = ("--agent", "codex", "--project", "/w/sigwait", "--host-session-id", hsid)
    with trio.fail_after(90):
        rx = await start_raw_host(env, *args)
        try:
            waiting = await rx.request("tools/call", rx.call_tool("inbox", wait_seconds=60))
            # A later request answered while the inbox call is not: the server is waiting in it.
            await rx.response(await rx.request("ping", {}))
            assert waiting not in rx.responses
            async with open_bridge_client(socket_of(home), hello(f"{hsid}-tx")) as (tx, _):
                sent = [
                    (await tx.request("send", to=hsid, text=f"note {i}"))["message"]["id"]
                    for i in range(count)
                ]
            rx.proc.send_signal(signum)  # the result may or may not be in the pipe by now
            code = await rx.proc.wait()  # bounded by fail_after: stdin is still open
            await rx.drain()  # everything the first server wrote to its stdout
            assert rx.proc.stderr is not None
            err = (await read_to_end(rx.proc.stderr)).decode(errors="replace")
        finally:
            with trio.CancelScope(shield=True):
                if rx.proc.returncode is None:
                    await rx.kill()
        assert code == 0, err
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
        written = {m["id"] for m in rx.inbox_items()}

        again = await start_raw_host(env, *args)
        shown: list[dict[str, Any]] = []
        try:
            with trio.move_on_after(20):  # then what is missing is reported below
                while not set(sent) - written <= {m["id"] for m in shown}:
                    shown.extend(await again.tool("inbox", wait_seconds=1))
        finally:
            await again.close()
    lost = set(sent) - written - {m["id"] for m in shown}
    assert lost == set(), (
        f"{len(lost)} of {len(sent)} messages neither written by the first server nor shown after"
    )
    unmarked_again = [m["id"] for m in shown if m["id"] in written and not m.get("repeat")]
    assert unmarked_again == [], "a message written by the first server was shown again unmarked"
