"""`claude mcp list` and `codex mcp list` with the bridge installed and no broker running: the
real CLIs report the server and no broker starts (SPEC §3 "Reach", last paragraph). Claude Code
2.1.337 starts the server and talks to it (a `server/discover` probe, `initialize`, `tools/list`)
in a folder the user trusted (in another, a user-scope server is "Not checked");
Codex 0.171.0 lists its configuration without starting it (seen)."""

from __future__ import annotations

import json
import shlex
import subprocess
import tomllib
import uuid
from pathlib import Path

import pytest
import trio

from agent_bridge.broker.mcp.fast import RESERVED_META
from agent_bridge.common import paths
from tests.hosts.conftest import AGENT_BRIDGE, World, plan, result_text, tool_results
from tests.test_mcp_fast import served_beside_the_sdk

pytestmark = pytest.mark.slow


def run(world: World, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(world.host_bin / argv[0]), *argv[1:]], env={
        **world.base_env(), "CODEX_HOME": str(world.codex_home)}, cwd=world.project, capture_output=True,
        text=True, timeout=120)


def test_health_checks_start_no_broker(world: World) -> None:
    world.bridge("down")
    assert paths.running_broker(world.bridge_home) is None
    world.trust_for_claude(world.project)  # as the user's first `claude` there would
    claude = run(world, "claude", "mcp", "list")
    assert claude.returncode == 0, claude.stderr
    line = next(x for x in claude.stdout.splitlines() if x.startswith("agent-bridge:"))
    assert "Connected" in line, claude.stdout
    codex = run(world, "codex", "mcp", "list")
    assert codex.returncode == 0 and "agent-bridge" in codex.stdout, codex.stderr
    assert paths.running_broker(world.bridge_home) is None


def line_copier(world: World, server: list[str]) -> tuple[Path, Path]:
    """A server command that copies the host's lines (to the returned log) on their way to
    `server`, the MCP server command it runs in its place; (the command, the log)."""
    log = world.root / "host-lines.log"
    copier = world.root / "copy-lines.sh"
    command = " ".join(shlex.quote(part) for part in server)
    copier.write_text(f"#!/bin/sh\ntee -a {shlex.quote(str(log))} | exec {command}\n")
    copier.chmod(0o755)
    return copier, log


def test_claude_code_speaks_the_2026_protocol_to_a_running_broker(world: World) -> None:
    """With a broker running, the server answers Claude Code's `server/discover` probe, and the
    host then writes every request with the 2026 envelope in its `_meta` (no `initialize`): the
    requests tests/test_mcp_sends.py's 2026 host writes.
    Seen through a second server entry that copies the host's lines on their way to the bridge."""
    world.restart_broker({}, down=False)
    copier, log = line_copier(world, [
        "env", f"AGENT_BRIDGE_HOME={world.bridge_home}", AGENT_BRIDGE, "mcp", "--project", str(world.project),
        "--host-session-id", "hs-lines"])
    try:
        added = run(world, "claude", "mcp", "add", "line-copier", "--", str(copier))
        assert added.returncode == 0, added.stderr
        listed = run(world, "claude", "mcp", "list")
        assert listed.returncode == 0, listed.stderr
        line = next(x for x in listed.stdout.splitlines() if x.startswith("line-copier:"))
        assert "Connected" in line, listed.stdout
    finally:
        run(world, "claude", "mcp", "remove", "line-copier")
        world.bridge("down", check=False)
    requests = [m for m in map(json.loads, log.read_text().splitlines()) if "id" in m]
    assert requests[0]["method"] == "server/discover", requests
    assert [m["method"] for m in requests].count("initialize") == 0, requests
    for request in requests:
        meta = request.get("params", {}).get("_meta", {})
        assert meta.get("io.modelcontextprotocol/protocolVersion") == "2026-07-28", request


def envelope(request: dict) -> dict:
    """A 2026 request's envelope: the protocol's reserved keys of its `_meta`."""
    meta = request.get("params", {}).get("_meta", {})
    return {k: v for k, v in meta.items() if k.startswith(RESERVED_META)}


def test_claude_code_s_tool_calls_carry_one_envelope_and_are_served_beside_the_sdk(world: World) -> None:
    """A Claude Code session's tool calls to a running broker (the 2026 protocol): every one
    carries the same envelope, so the SDK judges it for the first call and the broker's fast
    path serves the rest (broker.mcp.fast: it serves a 2026 call only with an envelope the SDK
    accepted), and each is answered as the SDK answers it: the same `whoami` result twice, the
    `send` to itself stored, an `inbox`. Seen through the bridge's own server entry, made to copy
    the host's lines on their way to the relay."""
    config = world.home / ".claude.json"
    data = json.loads(config.read_text())
    entry = data["mcpServers"]["agent-bridge"]
    copier, log = line_copier(world, [entry["command"], *entry.get("args", [])])
    data["mcpServers"]["agent-bridge"] = {**entry, "command": str(copier), "args": []}
    config.write_text(json.dumps(data))
    sid = str(uuid.uuid4())
    steps = plan(("whoami", {}), ("whoami", {}), ("send", {"to": sid, "text": "to myself"}),
                 ("inbox", {"wait_seconds": 5}))
    world.claude(steps, session_id=sid).wait()
    lines = [line for line in log.read_text().splitlines() if json.loads(line).get("method") == "tools/call"]
    calls = [json.loads(line) for line in lines]
    assert [c["params"]["name"] for c in calls] == ["whoami", "whoami", "send", "inbox"], calls
    assert envelope(calls[0])["io.modelcontextprotocol/protocolVersion"] == "2026-07-28", calls[0]
    assert all(envelope(c) == envelope(calls[0]) for c in calls), [envelope(c) for c in calls]
    # the host's own lines, as the broker's fast path judges them: all but the first are its
    assert trio.run(served_beside_the_sdk, lines) == [False, True, True, True], lines
    results = tool_results(world.claude_model.turns_of(sid)[-1].body)
    first, second, sent, shown = (json.loads(result_text(r)) for r in results)
    assert first == second and first["hostSessionId"] == sid
    assert sent["message"]["text"] == "to myself" and sent["message"]["from"]["id"] == first["id"], sent
    assert isinstance(shown, list), shown  # (a hook between the calls may have shown it already)


def test_codex_s_tool_calls_are_handshake_calls_all_served_beside_the_sdk(world: World) -> None:
    """Codex 0.171.0 initializes (the handshake era, what bench_message_throughput's default
    host speaks) with a broker running, and its tool calls carry no 2026 envelope: the broker's
    fast path serves every one. Seen through the bridge's own server entry, made to copy the
    host's lines on their way to the relay."""
    entry = tomllib.loads((world.codex_home / "config.toml").read_text())["mcp_servers"]["agent-bridge"]
    copier, log = line_copier(world, [entry["command"], *entry.get("args", [])])
    world.codex(plan(("whoami", {}), ("whoami", {}), ("inbox", {})), extra=(
        "-c", f"mcp_servers.agent-bridge.command={json.dumps(str(copier))}",
        "-c", "mcp_servers.agent-bridge.args=[]")).wait()
    messages = [json.loads(line) for line in log.read_text().splitlines()]
    initialize = next(m for m in messages if m.get("method") == "initialize")
    lines = [line for line, m in zip(log.read_text().splitlines(), messages, strict=True)
             if m.get("method") == "tools/call"]
    assert [json.loads(line)["params"]["name"] for line in lines] == ["whoami", "whoami", "inbox"], lines
    assert not any(envelope(json.loads(line)) for line in lines), lines
    version = initialize["params"]["protocolVersion"]
    assert trio.run(served_beside_the_sdk, lines, version) == [True, True, True], lines
