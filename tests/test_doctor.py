"""`agent-bridge doctor` on a healthy and on a broken setup, and on setups the hosts would not
use (checked against what the real Claude Code and Codex do where a host binary is provided)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import apsw
import pytest

from agent_bridge.common import paths
from agent_bridge.store.writer import Store
from tests.hostbin import CLAUDE_OFFLINE_ENV, host_program
from tests.hosts import clis

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
    """This user's environment with HOME pointed at `user_home`, and without a `codex` on PATH
    (tests that want one add it), so that what doctor asks Codex does not depend on the machine."""
    out = {k: v for k, v in env.items() if k not in ("CODEX_HOME", "XDG_STATE_HOME")}
    out["HOME"] = str(user_home)
    folders = out.get("PATH", os.defpath).split(os.pathsep)
    out["PATH"] = os.pathsep.join(f for f in folders if not (Path(f) / "codex").exists())
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
        "Claude Code MCP server": "ok", "Claude Code hooks": "ok", "Claude Code reach": "ok",
        "Claude Code slash commands": "ok",
        "Codex MCP server": "ok", "Codex hooks": "ok", "Codex hooks feature": "ok", "Codex reach": "ok",
        "Codex hooks trust": "skip",  # no codex on PATH to ask
        "opencode": "skip",  # no ~/.config/opencode: not set up for this user
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
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    (bridge / paths.BROKER_JSON).write_text(
        json.dumps({"pid": int(gone.stdout), "socket": str(bridge / "broker.sock")})
    )
    # Claude Code: an MCP entry whose program is gone, and no hooks at all.
    (user_home / ".claude.json").write_text(
        json.dumps(
            {
                "mcpServers": {
                    "agent-bridge": {"type": "stdio", "command": "/gone/bin/agent-bridge", "args": ["mcp"]}
                }
            }
        )
    )
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
        "Claude Code MCP server": "FAIL", "Claude Code hooks": "FAIL", "Claude Code reach": "warn",
        "Claude Code slash commands": "warn",
        "Codex MCP server": "FAIL", "Codex hooks": "FAIL", "Codex hooks feature": "FAIL",
        "Codex hooks trust": "skip", "Codex reach": "warn",
        "opencode": "skip",  # not set up for this user
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



def plain_env(user_home: Path, bridge: Path) -> dict[str, str]:
    env = with_user({k: v for k, v in os.environ.items() if k != "AGENT_BRIDGE_HOST_PID"}, user_home)
    env["AGENT_BRIDGE_HOME"] = str(bridge)
    return env


def with_path(env: dict[str, str], folder: Path) -> dict[str, str]:
    return dict(env, PATH=f"{folder}{os.pathsep}{env['PATH']}")


def stand_in_codex(folder: Path, version: str) -> Path:
    """A `codex` that answers only `--version` (a release we cannot install here); as an app-server
    it answers nothing, which doctor must report rather than pass."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "codex").write_text(f"#!/bin/sh\necho 'codex-cli {version}'\n")
    (folder / "codex").chmod(0o755)
    return folder


@pytest.mark.slow
def test_a_warning_is_never_all_checks_passed(broker, env, user_home, workdir, tmp_path):
    env = with_user(env, user_home)
    assert run(env, workdir, "install", "--claude", "--codex").returncode == 0
    config = user_home / ".codex" / "config.toml"
    if "codex_hooks" not in config.read_text():  # what install wrote before it asked Codex's version
        config.write_text(config.read_text() + "\n[features]\ncodex_hooks = true\n")
    result = run(with_path(env, stand_in_codex(tmp_path / "bin", "0.150.0")), workdir, "doctor")
    found = statuses(result.stdout)
    assert found["Codex hooks feature"] == "warn" and "deprecated" in result.stdout, result.stdout
    assert found["Codex hooks trust"] == "warn" and "could not ask Codex" in result.stdout, result.stdout
    not_ok = [name for name, status in found.items() if status not in ("ok", "warn")]
    assert not_ok in ([], ["opencode"]), result.stdout  # opencode: skipped where it is not set up
    assert "All checks passed" not in result.stdout
    assert "No check failed; 2 warnings: Codex hooks feature, Codex hooks trust." in result.stdout
    assert result.returncode == 0


def test_claude_hooks_at_two_scopes_with_different_commands_fail(tmp_path, user_home, workdir):
    env = plain_env(user_home, tmp_path / "bridge")
    assert run(env, workdir, "install", "--claude").returncode == 0  # the absolute path
    assert "Claude Code hooks scope" not in statuses(run(env, workdir, "doctor").stdout)
    assert run(env, workdir, "install", "--claude", "--scope", "project").returncode == 0  # `agent-bridge`
    result = run(env, workdir, "doctor")
    assert statuses(result.stdout)["Claude Code hooks scope"] == "FAIL", result.stdout
    assert "agent-bridge uninstall --claude --scope project" in result.stdout


def test_codex_hooks_at_two_scopes_fail(tmp_path, user_home, workdir):
    env = plain_env(user_home, tmp_path / "bridge")
    assert run(env, workdir, "install", "--codex").returncode == 0
    assert run(env, workdir, "install", "--codex", "--scope", "project").returncode == 0
    result = run(env, workdir, "doctor")
    assert statuses(result.stdout)["Codex hooks scope"] == "FAIL", result.stdout
    assert "agent-bridge uninstall --codex --scope project" in result.stdout


APPROVE = {"enabledMcpjsonServers": ["agent-bridge"]}


def approval_states(user_home: Path, workdir: Path) -> dict[str, dict[str, dict]]:
    """Approval records as Claude Code 2.1.197 writes them (its approval dialog writes
    `.claude/settings.local.json`; its folder trust dialog `~/.claude.json` projects[folder]), and
    the other places it reads the same keys from."""
    trusted = {"projects": {str(workdir): {"hasTrustDialogAccepted": True}}}
    return {
        "pending": {"claude_json": trusted},
        "approved": {"local": APPROVE, "claude_json": trusted},
        "all approved": {"local": {"enableAllProjectMcpServers": True}, "claude_json": trusted},
        "rejected": {"local": {"disabledMcpjsonServers": ["agent-bridge"]}, "claude_json": trusted},
        "approved, folder not trusted": {"local": APPROVE, "claude_json": {"projects": {}}},
        "approved in user settings": {"user": APPROVE, "claude_json": trusted},
        "approved in project settings": {"project": APPROVE, "claude_json": trusted},
        "approved in ~/.claude.json": {
            "claude_json": {"projects": {str(workdir): {"hasTrustDialogAccepted": True, **APPROVE}}}},
        "approved, rejected in user settings": {
            "local": APPROVE, "user": {"disabledMcpjsonServers": ["agent-bridge"]}, "claude_json": trusted},
    }


def set_state(user_home: Path, workdir: Path, state: dict[str, dict], project_settings: dict) -> None:
    """Write one approval state; the project's settings.json keeps the hooks install put there."""
    (workdir / ".claude" / "settings.local.json").write_text(json.dumps(state.get("local", {})))
    (user_home / ".claude" / "settings.json").write_text(json.dumps(state.get("user", {})))
    (workdir / ".claude" / "settings.json").write_text(
        json.dumps({**project_settings, **state.get("project", {})})
    )
    (user_home / ".claude.json").write_text(
        json.dumps({"hasCompletedOnboarding": True, **state["claude_json"]})
    )


EXPECTED_APPROVAL = {"pending": "warn", "approved": "ok", "all approved": "ok", "rejected": "FAIL",
                     "approved, folder not trusted": "warn", "approved in user settings": "ok",
                     "approved in project settings": "ok", "approved in ~/.claude.json": "ok",
                     "approved, rejected in user settings": "FAIL"}


def test_claude_project_server_approval(tmp_path, user_home, workdir):
    env = plain_env(user_home, tmp_path / "bridge")
    assert run(env, workdir, "install", "--claude", "--scope", "project").returncode == 0
    project_settings = json.loads((workdir / ".claude" / "settings.json").read_text())
    seen = {}
    for name, state in approval_states(user_home, workdir).items():
        set_state(user_home, workdir, state, project_settings)
        seen[name] = statuses(run(env, workdir, "doctor").stdout)["Claude Code project server"]
    assert seen == EXPECTED_APPROVAL
    set_state(user_home, workdir, approval_states(user_home, workdir)["pending"], project_settings)
    out = run(env, workdir, "doctor").stdout
    assert "pending approval" in out and 'choose "Use this MCP server"' in out


def test_real_claude_agrees_on_project_server_approval(tmp_path, user_home, workdir):
    """For each record, what `claude mcp list` says: "Pending approval", a connection attempt (here
    "Failed to connect": agent-bridge is left off PATH so that no server starts), or nothing."""
    claude = host_program("claude")
    env = plain_env(user_home, tmp_path / "bridge")
    assert run(env, workdir, "install", "--claude", "--scope", "project").returncode == 0
    project_settings = json.loads((workdir / ".claude" / "settings.json").read_text())
    host_env = {"HOME": str(user_home), "PATH": "/usr/bin:/bin", **CLAUDE_OFFLINE_ENV}
    for name, state in approval_states(user_home, workdir).items():
        set_state(user_home, workdir, state, project_settings)
        listed = subprocess.run([str(claude), "mcp", "list"], env=host_env, cwd=workdir, capture_output=True,
                                text=True, timeout=120).stdout
        host_says_it_starts = (
            "agent-bridge: agent-bridge mcp --agent claude - " in listed and "Pending" not in listed
        )
        assert host_says_it_starts == (EXPECTED_APPROVAL[name] == "ok"), (name, listed)


def test_real_codex_hook_trust_and_project_trust(tmp_path, user_home, workdir):
    codex = host_program("codex")
    env = with_path(plain_env(user_home, tmp_path / "bridge"), codex.parent)
    assert run(env, workdir, "install", "--codex").returncode == 0
    result = run(env, workdir, "doctor")
    found = statuses(result.stdout)
    assert found["Codex hooks trust"] == "FAIL" and "not trusted (untrusted)" in result.stdout, result.stdout
    assert "open /hooks" in result.stdout

    # Trust them as the fix says (the values are Codex's own, from hooks/list).
    lines = result.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if "trusted_hash" in line) - 1
    end = max(i for i, line in enumerate(lines) if "trusted_hash" in line) + 1
    snippet = "\n".join(line.strip() for line in lines[at:end]) + "\n"
    assert snippet.count("trusted_hash") == 4  # SessionStart, PostToolUse, Stop, UserPromptSubmit
    config = user_home / ".codex" / "config.toml"
    config.write_text(config.read_text() + "\n" + snippet)
    result = run(env, workdir, "doctor")
    assert statuses(result.stdout)["Codex hooks trust"] == "ok", result.stdout

    # A project config in an untrusted project: Codex ignores it.
    assert run(env, workdir, "uninstall", "--codex").returncode == 0
    assert run(env, workdir, "install", "--codex", "--scope", "project").returncode == 0
    result = run(env, workdir, "doctor")
    assert statuses(result.stdout)["Codex project config"] == "FAIL", result.stdout
    assert f'[projects."{workdir}"] trust_level = "trusted"' in result.stdout
    config.write_text(config.read_text() + f'\n[projects."{workdir}"]\ntrust_level = "trusted"\n')
    assert statuses(run(env, workdir, "doctor").stdout)["Codex project config"] == "ok"


def test_real_claude_runs_hooks_of_both_scopes(tmp_path, user_home, workdir):
    """What doctor's scope check stands on: with the user-scope and the project-scope install both
    present, a real `claude -p` session runs the SessionStart hook twice."""
    claude = host_program("claude")
    import http.server
    import threading

    class Model(http.server.BaseHTTPRequestHandler):  # the smallest Messages API stream: one "ok"
        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers.get("content-length", 0)))
            events = [
                {
                    "type": "message_start",
                    "message": {
                        "id": "m",
                        "type": "message",
                        "role": "assistant",
                        "model": "m",
                        "content": [],
                        "stop_reason": None,
                        "stop_sequence": None,
                        "usage": {"input_tokens": 1, "output_tokens": 1},
                    },
                },
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ok"}},
                {"type": "content_block_stop", "index": 0},
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": 1},
                },
                {"type": "message_stop"},
            ]
            body = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Model)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    bridge = tmp_path / "bridge"
    env = with_path(plain_env(user_home, bridge), SCRIPT.parent)
    env.pop("AGENT_BRIDGE_HOME")  # project files stay portable; both scopes then use the default home
    try:
        assert run(env, workdir, "install", "--claude").returncode == 0
        assert run(env, workdir, "install", "--claude", "--scope", "project").returncode == 0
        assert statuses(run(env, workdir, "doctor").stdout)["Claude Code hooks scope"] == "FAIL"
        # Only the hooks matter here: no MCP server (`claude -p` would start even an unapproved project one).
        (workdir / ".mcp.json").unlink()
        (user_home / ".claude.json").write_text(json.dumps({
            "hasCompletedOnboarding": True, "projects": {str(workdir): {"hasTrustDialogAccepted": True}},
        }))
        host_env = {"HOME": str(user_home), "PATH": env["PATH"], **CLAUDE_OFFLINE_ENV,
                    "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{server.server_address[1]}"}
        session = subprocess.run(
            [
                str(claude),
                "-p",
                "hi",
                "--dangerously-skip-permissions",
                "--output-format",
                "stream-json",
                "--verbose",
                "--include-hook-events",
            ],
            env=host_env,
            cwd=workdir,
            capture_output=True,
            text=True,
            timeout=120,
        )
        events = [json.loads(line) for line in session.stdout.splitlines() if line.startswith("{")]
        started = [
            e for e in events if e.get("subtype") == "hook_started" and e.get("hook_event") == "SessionStart"
        ]
        assert len(started) == 2, session.stdout[-2000:]
    finally:
        server.shutdown()
        # in case anything started one
        subprocess.run([*CLI, "down"], env=env, capture_output=True, timeout=60)


def test_real_codex_runs_the_session_start_hook_only_when_doctor_says_trusted(tmp_path, user_home, workdir):
    """The trust check stands for what `codex exec` does: an untrusted hook is skipped without a
    word, a trusted one runs (seen here as the SessionStart hook's report appearing in the state
    folder, beside what install keeps there; the MCP server is switched off for these runs so that
    only the hook can write there)."""
    codex = host_program("codex")
    bridge = tmp_path / "bridge"
    env = with_path(plain_env(user_home, bridge), codex.parent)
    assert run(env, workdir, "install", "--codex").returncode == 0
    config = user_home / ".codex" / "config.toml"
    config.write_text(
        'model = "test-model"\nmodel_provider = "fake"\ncheck_for_update_on_startup = false\n'
        '[model_providers.fake]\nname = "fake"\nbase_url = "http://127.0.0.1:9/v1"\nwire_api = "responses"\n'
        'env_key = "FAKE_KEY"\nrequires_openai_auth = false\nsupports_websockets = false\n'
        "request_max_retries = 0\nstream_max_retries = 0\n\n" + config.read_text())
    installed = set(os.listdir(bridge)) if bridge.exists() else set()  # install's backups and record

    def session_start_ran() -> bool:
        proc = subprocess.Popen(
            [
                str(codex),
                "exec",
                "-c",
                "features.plugins=false",
                "-c",
                "mcp_servers.agent-bridge.enabled=false",
                "--skip-git-repo-check",
                "--json",
                "hello",
            ],
            env=dict(env, FAKE_KEY="x"),
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        try:
            assert proc.stdout is not None
            turn = False
            for line in proc.stdout:  # SessionStart hooks run once the turn starts, before its first request
                kind = json.loads(line).get("type")
                turn = turn or kind == "turn.started"
                # that request failed (the model is a closed port)
                if turn and kind in ("error", "turn.failed"):
                    break
        finally:
            os.killpg(proc.pid, 9)
            proc.wait()
        return bridge.exists() and bool(set(os.listdir(bridge)) - installed)

    result = run(env, workdir, "doctor")
    assert statuses(result.stdout)["Codex hooks trust"] == "FAIL", result.stdout
    assert not session_start_ran()

    lines = result.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if "trusted_hash" in line) - 1
    end = max(i for i, line in enumerate(lines) if "trusted_hash" in line) + 1
    config.write_text(config.read_text() + "\n" + "\n".join(line.strip() for line in lines[at:end]) + "\n")
    assert statuses(run(env, workdir, "doctor").stdout)["Codex hooks trust"] == "ok"
    assert session_start_ran()


def reach_line(output: str, host: str) -> str:
    return next(line for line in output.splitlines() if f"{host} reach" in line)


def test_reach_says_per_host_which_paths_the_setup_uses(tmp_path, user_home, workdir):
    """Claude Code 2.1.332 on PATH (the real one): additionalContext at Stop; an older version
    string: the block decision; Codex: always the block decision. Without the PostToolUse hook
    (an earlier install) path 1 is reported missing, as a warning."""
    env = plain_env(user_home, tmp_path / "bridge")
    (user_home / ".claude").mkdir(parents=True, exist_ok=True)
    (user_home / ".codex").mkdir(parents=True, exist_ok=True)
    assert run(env, workdir, "install", "--claude", "--codex").returncode == 0
    old = tmp_path / "old-claude"
    old.mkdir()
    (old / "claude").write_text("#!/bin/sh\necho '2.1.162 (Claude Code)'\n")
    (old / "claude").chmod(0o755)
    out = run(with_path(env, old), workdir, "doctor").stdout
    line = reach_line(out, "Claude Code")
    assert line.split()[0] == "ok" and "2 at Stop: the block decision" in line and "2.1.162" in line, line
    assert (
        "1 between tool calls: PostToolUse hook" in line
        and "4 at start, resume, compaction: SessionStart hook" in line
    )
    codex = reach_line(out, "Codex")
    assert "2 at Stop: the block decision" in codex and "1 between tool calls: PostToolUse hook" in codex, (
        codex
    )

    settings = user_home / ".claude" / "settings.json"
    data = json.loads(settings.read_text())
    del data["hooks"]["PostToolUse"]
    settings.write_text(json.dumps(data))
    line = reach_line(run(with_path(env, old), workdir, "doctor").stdout, "Claude Code")
    assert line.split()[0] == "warn" and "1 between tool calls: no (PostToolUse hook missing)" in line, line


def test_reach_with_the_real_claude_code(tmp_path, user_home, workdir):
    claude = host_program("claude")
    env = with_path(plain_env(user_home, tmp_path / "bridge"), claude.parent)
    (user_home / ".claude").mkdir(parents=True, exist_ok=True)
    assert run(env, workdir, "install", "--claude").returncode == 0
    line = reach_line(run(env, workdir, "doctor").stdout, "Claude Code")
    assert f"2 at Stop: additionalContext, no error label (Claude Code {clis.CLAUDE_VERSION})" in line, line


@pytest.mark.slow
def test_nothing_connected_is_said_not_all_checks_passed(broker, env, tmp_path, workdir):
    bare = tmp_path / "bare-user"  # neither ~/.claude nor ~/.codex
    bare.mkdir()
    result = run(with_user(env, bare), workdir, "doctor")
    assert result.returncode == 0, result.stdout
    found = statuses(result.stdout)
    assert found["Claude Code"] == "skip" and found["Codex"] == "skip" and found["broker"] == "ok"
    assert "All checks passed" not in result.stdout
    assert "nothing is connected yet" in result.stdout and "agent-bridge install --claude" in result.stdout
    # the dashboard answers 403 to a request without its cookie: it works, and opens with its URL
    line = next(ln for ln in result.stdout.splitlines() if "dashboard" in ln and "answers" in ln)
    assert "HTTP 403" not in line and "tokenized URL" in line and "agent-bridge dashboard --open" in line


def test_a_project_server_whose_command_is_not_on_path_fails(tmp_path, user_home, workdir):
    env = plain_env(user_home, tmp_path / "bridge")
    assert run(env, workdir, "install", "--claude").returncode == 0  # user scope: an absolute path, fine
    (workdir / ".mcp.json").write_text(
        json.dumps(
            {
                "mcpServers": {
                    "agent-bridge": {
                        "type": "stdio",
                        "command": "agent-bridge",
                        "args": ["mcp", "--agent", "claude"],
                    }
                }
            }
        )
    )
    folders = env["PATH"].split(os.pathsep)
    env["PATH"] = os.pathsep.join(f for f in folders if not (Path(f) / "agent-bridge").exists())
    result = run(env, workdir, "doctor")
    found = statuses(result.stdout)
    assert found["Claude Code MCP server"] == "FAIL", result.stdout
    line = next(ln for ln in result.stdout.splitlines() if "Claude Code MCP server" in ln)
    assert str(workdir / ".mcp.json") in line and "agent-bridge is not on PATH" in line
