"""A health check (`claude mcp list`: Claude Code 2.1.332 starts the server, sends MCP
2026-07-28's `server/discover` probe, then `initialize`, `notifications/initialized` and
`tools/list`, and closes stdin; seen with a recording server) is answered by a relay with no
broker running, and starts none (SPEC §3 "Reach", last paragraph). A session that stays starts one
at its first request only a broker answers, or once it has stayed connector.START_GRACE."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agent_bridge.common import paths
from agent_bridge.relay.main import STATIC
from tests.conftest import CLI, wait_until

pytestmark = pytest.mark.slow

CLIENT = {"name": "claude-code", "title": "Claude Code", "version": "2.1.332"}
PROBE = {"jsonrpc": "2.0", "id": "server-discover-probe-1", "method": "server/discover", "params": {"_meta": {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientInfo": CLIENT,
    "io.modelcontextprotocol/clientCapabilities": {"roots": {"listChanged": True}}}}}
INITIALIZE = {"method": "initialize", "jsonrpc": "2.0", "id": 0, "params": {
    "protocolVersion": "2025-11-25", "capabilities": {"roots": {"listChanged": True}}, "clientInfo": CLIENT}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
TOOLS_LIST = {"method": "tools/list", "jsonrpc": "2.0", "id": 1}


def lines(*messages: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(m).encode() + b"\n" for m in messages)


def test_a_health_check_is_answered_with_no_broker_and_starts_none(env: dict[str, str], home: Path) -> None:
    done = subprocess.run([*CLI, "mcp", "--agent", "claude", "--project", "/w/health"],
                          input=lines(PROBE, INITIALIZE, INITIALIZED, TOOLS_LIST), env=env,
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    answers = {a["id"]: a for a in map(json.loads, done.stdout.splitlines())}
    assert answers["server-discover-probe-1"]["error"]["code"] == -32601  # so the host sends initialize
    assert answers[0]["result"]["serverInfo"]["name"] == "agent-bridge"
    assert answers[1]["result"] == json.loads(STATIC.read_text())["tools/list"]
    assert paths.running_broker(home) is None
    assert not paths.db_path(home).exists()


def test_a_session_that_stays_starts_the_broker_by_itself(env: dict[str, str], home: Path) -> None:
    proc = subprocess.Popen([*CLI, "mcp", "--agent", "claude", "--project", "/w/health"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(lines(PROBE, INITIALIZE, INITIALIZED, TOOLS_LIST))
        proc.stdin.flush()
        for _ in range(3):
            proc.stdout.readline()
        wait_until(lambda: paths.running_broker(home) is not None, what="the broker the session started")
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)


def test_a_tool_call_starts_the_broker_at_once_and_is_answered(env: dict[str, str], home: Path) -> None:
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "whoami", "arguments": {}}}
    done = subprocess.run([*CLI, "mcp", "--agent", "claude", "--project", "/w/health"],
                          input=lines(INITIALIZE, INITIALIZED, call), env=env, capture_output=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    answers = {a["id"]: a for a in map(json.loads, done.stdout.splitlines())}
    assert not answers[2]["result"].get("isError"), answers[2]
    assert json.loads(answers[2]["result"]["content"][0]["text"])["project"] == "/w/health"
