"""`claude mcp list` and `codex mcp list` with the bridge installed and no broker running: the
real CLIs report the server and no broker starts (SPEC §3 "Reach", last paragraph). Claude Code
2.1.332 starts the server and talks to it (a `server/discover` probe, `initialize`, `tools/list`);
Codex 0.171.0 lists its configuration without starting it (seen)."""

from __future__ import annotations

import subprocess

import pytest

from agent_bridge.common import paths
from tests.hosts.conftest import World

pytestmark = pytest.mark.slow


def run(world: World, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(world.host_bin / argv[0]), *argv[1:]], env={
        **world.base_env(), "CODEX_HOME": str(world.codex_home)}, cwd=world.project, capture_output=True,
        text=True, timeout=120)


def test_health_checks_start_no_broker(world: World) -> None:
    world.bridge("down")
    assert paths.running_broker(world.bridge_home) is None
    claude = run(world, "claude", "mcp", "list")
    assert claude.returncode == 0, claude.stderr
    line = next(x for x in claude.stdout.splitlines() if x.startswith("agent-bridge:"))
    assert "Connected" in line, claude.stdout
    codex = run(world, "codex", "mcp", "list")
    assert codex.returncode == 0 and "agent-bridge" in codex.stdout, codex.stderr
    assert paths.running_broker(world.bridge_home) is None
