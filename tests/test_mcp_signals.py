"""`agent-bridge mcp` ends on SIGINT and SIGTERM while its host still holds stdin open, as
hosts end their MCP servers (Claude Code: SIGINT, then SIGTERM, then SIGKILL), with exit 0, no
traceback, and nothing acknowledged that it did not show."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from tests.conftest import call, mcp_session, wait_until

pytestmark = pytest.mark.slow

INITIALIZE = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw-host", "version": "1"}},
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
    async with mcp_session(env, "--agent", "codex", "--project", "/w/sigack", "--host-session-id", host) as again:
        shown = await call(again, "inbox")
    assert [m["text"] for m in shown] == ["kept across the signal"]
