"""`agent-bridge doctor` on a healthy and on a broken setup (issue 5 point 6)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import apsw
import pytest

from agent_bridge import paths
from agent_bridge.store.writer import Store

SCRIPT = Path(sys.executable).with_name("agent-bridge")
CLI = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "agent_bridge"]


@pytest.fixture
def user_home(tmp_path: Path) -> Path:
    home = tmp_path / "user"
    (home / ".claude").mkdir(parents=True)
    (home / ".codex").mkdir()
    return home


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    folder = tmp_path / "app"
    folder.mkdir()
    return folder


def with_user(env: dict[str, str], user_home: Path) -> dict[str, str]:
    out = {k: v for k, v in env.items() if k not in ("CODEX_HOME", "XDG_STATE_HOME")}
    out["HOME"] = str(user_home)
    return out


def run(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


def statuses(output: str) -> dict[str, str]:
    """Check name -> status, from doctor's report lines (`  <status>  <name>  <detail>`)."""
    found = {}
    for line in output.splitlines():
        m = re.match(r"^  (ok|warn|FAIL|skip)\s+(.+?)\s{2,}", line)
        if m:
            found[m.group(2).strip()] = m.group(1)
    return found


@pytest.mark.slow
def test_healthy_setup_passes_every_check(broker, env, home, user_home, workdir):
    env = with_user(env, user_home)
    installed = run(env, workdir, "install", "--claude", "--codex")
    assert installed.returncode == 0, installed.stderr
    result = run(env, workdir, "doctor")
    assert result.returncode == 0, result.stdout + result.stderr
    found = statuses(result.stdout)
    assert found == {
        "home folder": "ok", "broker": "ok", "socket": "ok", "schema": "ok", "dashboard": "ok",
        "Claude Code MCP server": "ok", "Claude Code hooks": "ok",
        "Codex MCP server": "ok", "Codex hooks": "ok", "Codex hooks feature": "ok",
    }, result.stdout
    assert f"pid {broker.pid}" in result.stdout and "All checks passed" in result.stdout


def test_broken_setup_fails_and_says_what_to_fix(tmp_path, user_home, workdir):
    bridge = tmp_path / "bridge"
    bridge.mkdir(mode=0o755)
    os.chmod(bridge, 0o755)
    store = Store.open(paths.db_path(bridge))
    store.close()
    conn = apsw.Connection(str(paths.db_path(bridge)))
    conn.execute("PRAGMA user_version = 42")
    conn.close()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (bridge / paths.BROKER_JSON).write_text(json.dumps({"pid": int(gone.stdout), "socket": str(bridge / "broker.sock")}))
    # Claude Code: an MCP entry whose program is gone, and no hooks at all.
    (user_home / ".claude.json").write_text(json.dumps(
        {"mcpServers": {"agent-bridge": {"type": "stdio", "command": "/gone/bin/agent-bridge", "args": ["mcp"]}}}
    ))
    # Codex: hooks switched off, a config that does not parse in the project.
    (user_home / ".codex" / "config.toml").write_text("[features]\nhooks = false\n")
    (workdir / ".codex").mkdir()
    (workdir / ".codex" / "config.toml").write_text("[mcp_servers.agent-bridge\n")

    env = with_user({k: v for k, v in os.environ.items() if k != "AGENT_BRIDGE_HOST_PID"}, user_home)
    env["AGENT_BRIDGE_HOME"] = str(bridge)
    result = run(env, workdir, "doctor")
    assert result.returncode == 1
    found = statuses(result.stdout)
    assert found == {
        "home folder": "FAIL", "broker": "FAIL", "socket": "skip", "schema": "FAIL", "dashboard": "skip",
        "Claude Code MCP server": "FAIL", "Claude Code hooks": "FAIL",
        "Codex MCP server": "FAIL", "Codex hooks": "FAIL", "Codex hooks feature": "FAIL",
    }, result.stdout
    out = result.stdout
    assert f"chmod 700 {bridge}" in out
    assert "stale record" in out and "agent-bridge up --detach" in out
    assert "schema version 42" in out and "upgrade agent-bridge" in out
    assert "/gone/bin/agent-bridge does not exist" in out and "agent-bridge install --claude" in out
    assert "not valid TOML" in out and "agent-bridge install --codex" in out
    assert "hooks = false" in out
    assert out.count("fix:") >= 8
    assert "checks failed" in out


def test_broker_down_after_install_is_the_one_failure(tmp_path, user_home, workdir):
    bridge = tmp_path / "bridge"
    env = with_user({k: v for k, v in os.environ.items() if k != "AGENT_BRIDGE_HOST_PID"}, user_home)
    env["AGENT_BRIDGE_HOME"] = str(bridge)
    assert run(env, workdir, "install").returncode == 0
    paths.ensure_home(bridge)
    Store.open(paths.db_path(bridge)).close()
    result = run(env, workdir, "doctor")
    assert result.returncode == 1
    found = statuses(result.stdout)
    assert [name for name, status in found.items() if status == "FAIL"] == ["broker"], result.stdout
    assert found["schema"] == "ok" and found["Codex hooks"] == "ok" and found["Claude Code hooks"] == "ok"
    assert "1 check failed: broker." in result.stdout


def test_a_registration_for_another_home_fails(tmp_path, user_home, workdir):
    env = with_user({k: v for k, v in os.environ.items() if k != "AGENT_BRIDGE_HOST_PID"}, user_home)
    env["AGENT_BRIDGE_HOME"] = str(tmp_path / "one")
    assert run(env, workdir, "install", "--codex").returncode == 0
    env["AGENT_BRIDGE_HOME"] = str(tmp_path / "two")
    result = run(env, workdir, "doctor")
    found = statuses(result.stdout)
    assert found["Codex MCP server"] == "FAIL" and found["Codex hooks"] == "FAIL"
    assert f"AGENT_BRIDGE_HOME={tmp_path / 'one'}" in result.stdout
