"""`agent-bridge install` and `agent-bridge uninstall` on fixture configuration files, run as a
user runs them, with HOME pointed at a temporary folder; and against the real hosts where what
they read matters (Codex's feature key, a project-scope server started by Claude Code)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import agent_bridge
from tests.hostbin import CLAUDE_OFFLINE_ENV, host_program

SCRIPT = Path(sys.executable).with_name("agent-bridge")
CLI = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "agent_bridge"]
RUN = CLI[0] if SCRIPT.exists() else sys.executable  # what the registrations must name
# The PostToolUse hook, by absolute path: the installing interpreter (the script's), without `site`,
# running hooks/quick.py (tests/hooks/test_quick.py)
INTERPRETER = SCRIPT.read_text().splitlines()[0][2:].strip() if SCRIPT.exists() else sys.executable
QUICK = f"{INTERPRETER} -I -S {Path(agent_bridge.__file__).parent / 'hooks' / 'quick.py'}"

CLAUDE_JSON = {
    "numStartups": 12,
    "mcpServers": {
        "github": {"type": "stdio", "command": "npx", "args": ["-y", "gh-mcp"], "env": {"TOKEN": "x"}}
    },
    "projects": {"/work/app": {"allowedTools": [], "mcpServers": {}}},
}
CLAUDE_SETTINGS = {
    "permissions": {"allow": ["Bash(ls:*)"]},
    "hooks": {
        "SessionStart": [{"matcher": "startup", "hooks": [{"type": "command", "command": "echo hello"}]}],
        "PreToolUse": [
            {"matcher": "Bash", "hooks": [{"type": "command", "command": "check.sh", "timeout": 5}]}
        ],
    },
}
CODEX_TOML = """\
# My Codex setup
model = "o3"  # the default model

[mcp_servers.docs]
# documentation lookups
command = "npx"
args = [
  "-y",
  "docs-mcp",  # pinned below
]

[mcp_servers.docs.env]
DOCS_TOKEN = "abc"

[features]
# things I try
web_search_request = true
"""
CODEX_HOOKS = {
    "hooks": {"Stop": [{"hooks": [{"type": "command", "command": "notify-send done", "timeout": 3}]}]}
}


@pytest.fixture
def user_home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    return home


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    folder = tmp_path / "work" / "app"
    folder.mkdir(parents=True)
    return folder


def install_env(user_home: Path, bridge_home: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("AGENT_BRIDGE_HOME", "XDG_STATE_HOME", "CODEX_HOME", "CLAUDE_CONFIG_DIR")}
    env["HOME"] = str(user_home)
    if bridge_home is not None:
        env["AGENT_BRIDGE_HOME"] = str(bridge_home)
    return env


def install(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "install", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60
    )


def write_json(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


STATE = Path(".local", "state", "agent-bridge")  # the default state folder under HOME


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under `root` but the state folder (where install keeps its backups and record)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and STATE not in p.relative_to(root).parents}


def backups_of(path: Path) -> list[Path]:
    """The backups of `path`, oldest first: `<state>/backups/<time>/<its absolute path>`, in any
    state folder of the test (they all live in its temporary folder, beside `home`)."""
    root = next(p for p in path.parents if (p / "home").is_dir())
    rel = Path(*path.absolute().parts[1:])
    return sorted(b for b in root.rglob(f"backups/*/{rel}") if b.is_file())


def hook_commands(data: dict, event: str) -> list[str]:
    return [h["command"] for g in data["hooks"].get(event, []) for h in g["hooks"]]


def claude_fixture(user_home: Path) -> None:
    write_json(user_home / ".claude.json", CLAUDE_JSON)
    write_json(user_home / ".claude" / "settings.json", CLAUDE_SETTINGS)


def codex_fixture(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.toml").write_text(CODEX_TOML)
    write_json(folder / "hooks.json", CODEX_HOOKS)


def assert_subsequence(original: str, updated: str) -> None:
    """Every line of the original file is still there, in order (comments included)."""
    remaining = iter(updated.splitlines())
    for line in original.splitlines():
        assert any(line == candidate for candidate in remaining), f"lost or reordered: {line!r}"


def test_claude_user_scope_keeps_everything_and_is_idempotent(user_home, workdir):
    claude_fixture(user_home)
    originals = {
        p: p.read_text() for p in (user_home / ".claude.json", user_home / ".claude" / "settings.json")
    }
    env = install_env(user_home)
    first = install(env, workdir, "--claude")
    assert first.returncode == 0, first.stderr

    data = json.loads((user_home / ".claude.json").read_text())
    assert data["numStartups"] == 12 and data["projects"] == CLAUDE_JSON["projects"]
    assert data["mcpServers"]["github"] == CLAUDE_JSON["mcpServers"]["github"]
    assert data["mcpServers"]["agent-bridge"] == {
        "type": "stdio", "command": RUN, "args": [*CLI[1:], "mcp", "--agent", "claude"]
    }
    settings = json.loads((user_home / ".claude" / "settings.json").read_text())
    assert settings["permissions"] == CLAUDE_SETTINGS["permissions"]
    assert settings["hooks"]["PreToolUse"] == CLAUDE_SETTINGS["hooks"]["PreToolUse"]
    assert settings["hooks"]["SessionStart"][0] == CLAUDE_SETTINGS["hooks"]["SessionStart"][0]
    assert hook_commands(settings, "SessionStart") == [
        "echo hello",
        f"{RUN} hook session-start --agent claude",
    ]
    assert hook_commands(settings, "Stop") == [
        f"{RUN} hook stop --agent claude",
        f"{RUN} hook wake --agent claude",
    ]
    # The idle-wake waiter: in the background, waking the model on exit 2 (Claude Code's asyncRewake).
    assert settings["hooks"]["Stop"][1]["hooks"][0] == {
        "type": "command",
        "command": f"{RUN} hook wake --agent claude",
        "timeout": 86400,
        "asyncRewake": True,
    }
    assert hook_commands(settings, "PostToolUse") == [f"{QUICK} post-tool-use --agent claude"]
    assert "matcher" not in settings["hooks"]["PostToolUse"][0]  # after every tool
    assert hook_commands(settings, "UserPromptSubmit") == [f"{RUN} hook user-prompt-submit --agent claude"]
    assert settings["hooks"]["Stop"][0]["hooks"][0]["type"] == "command"
    assert isinstance(settings["hooks"]["Stop"][0]["hooks"][0]["timeout"], int)

    for path, text in originals.items():
        [backup] = backups_of(path)
        assert backup.read_text() == text
    assert not (user_home / ".codex").exists()  # --claude only

    before = snapshot(user_home)
    second = install(env, workdir, "--claude")
    assert second.returncode == 0 and "nothing to change" in second.stdout
    assert snapshot(user_home) == before  # no write, no new backup


def test_claude_project_scope_writes_the_project_files_only(user_home, workdir):
    claude_fixture(user_home)
    write_json(workdir / ".mcp.json", {"mcpServers": {"db": {"command": "db-mcp", "args": []}}})
    user_before = snapshot(user_home)
    result = install(install_env(user_home), workdir, "--claude", "--scope", "project")
    assert result.returncode == 0, result.stderr
    assert snapshot(user_home) == user_before

    mcp = json.loads((workdir / ".mcp.json").read_text())
    assert mcp["mcpServers"]["db"] == {"command": "db-mcp", "args": []}
    assert mcp["mcpServers"]["agent-bridge"] == {"type": "stdio", "command": "agent-bridge",
                                                 "args": ["mcp", "--agent", "claude"]}
    settings = json.loads((workdir / ".claude" / "settings.json").read_text())
    assert hook_commands(settings, "SessionStart") == ["agent-bridge hook session-start --agent claude"]
    assert hook_commands(settings, "Stop") == [
        "agent-bridge hook stop --agent claude",
        "agent-bridge hook wake --agent claude",
    ]
    assert len(backups_of(workdir / ".mcp.json")) == 1
    assert backups_of(workdir / ".claude" / "settings.json") == []  # a new file has nothing to back up
    assert (
        "nothing to change"
        in install(install_env(user_home), workdir, "--claude", "--scope", "project").stdout
    )


def test_codex_user_scope_keeps_comments_and_entries(user_home, workdir, tmp_path):
    codex_fixture(user_home / ".codex")
    bridge_home = tmp_path / "bridge-state"  # not the default: Codex must be told (it clears the env)
    env = install_env(user_home, bridge_home)
    result = install(env, workdir, "--codex")
    assert result.returncode == 0, result.stderr

    text = (user_home / ".codex" / "config.toml").read_text()
    assert_subsequence(CODEX_TOML, text)
    config = tomllib.loads(text)
    assert config["model"] == "o3"
    assert config["mcp_servers"]["docs"] == {
        "command": "npx",
        "args": ["-y", "docs-mcp"],
        "env": {"DOCS_TOKEN": "abc"},
    }
    assert config["mcp_servers"]["agent-bridge"] == {
        "command": RUN,
        "args": [*CLI[1:], "mcp", "--agent", "codex"],
        "env": {"AGENT_BRIDGE_HOME": str(bridge_home)},
    }
    # no codex on PATH: a current one, hooks on by default
    assert config["features"] == {"web_search_request": True}

    hooks = json.loads((user_home / ".codex" / "hooks.json").read_text())
    assert hook_commands(hooks, "Stop") == [
        "notify-send done", f"AGENT_BRIDGE_HOME={bridge_home} {RUN} hook stop --agent codex"
    ]
    assert hook_commands(hooks, "SessionStart") == [
        f"AGENT_BRIDGE_HOME={bridge_home} {RUN} hook session-start --agent codex"
    ]
    assert hook_commands(hooks, "PostToolUse") == [
        f"AGENT_BRIDGE_HOME={bridge_home} {QUICK} post-tool-use --agent codex"
    ]
    assert [b.read_text() for b in backups_of(user_home / ".codex" / "config.toml")] == [CODEX_TOML]
    assert len(backups_of(user_home / ".codex" / "hooks.json")) == 1
    assert not (user_home / ".claude.json").exists()

    before = snapshot(user_home)
    again = install(env, workdir, "--codex")
    assert again.returncode == 0 and "nothing to change" in again.stdout
    assert snapshot(user_home) == before


def test_codex_project_scope_creates_the_project_config(user_home, workdir):
    (user_home / ".codex").mkdir()
    result = install(install_env(user_home), workdir, "--codex", "--scope", "project")
    assert result.returncode == 0, result.stderr
    config = tomllib.loads((workdir / ".codex" / "config.toml").read_text())
    assert config == {
        "mcp_servers": {"agent-bridge": {"command": "agent-bridge", "args": ["mcp", "--agent", "codex"]}}
    }
    hooks = json.loads((workdir / ".codex" / "hooks.json").read_text())
    assert hook_commands(hooks, "SessionStart") == ["agent-bridge hook session-start --agent codex"]
    assert list((user_home / ".codex").iterdir()) == []
    assert (
        "nothing to change"
        in install(install_env(user_home), workdir, "--codex", "--scope", "project").stdout
    )


def test_dry_run_prints_a_diff_and_writes_nothing(user_home, workdir):
    claude_fixture(user_home)
    codex_fixture(user_home / ".codex")
    before = snapshot(user_home)
    result = install(install_env(user_home), workdir, "--claude", "--codex", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert snapshot(user_home) == before
    out = result.stdout
    for path in (".claude.json", ".claude/settings.json", ".codex/config.toml", ".codex/hooks.json"):
        assert f"+++ {user_home / path}" in out
    assert f"--- {user_home / '.codex' / 'config.toml'}" in out
    assert "+[mcp_servers.agent-bridge]" in out and "codex_hooks" not in out
    assert f'+            "command": "{RUN} hook stop --agent claude",' in out


@pytest.mark.parametrize("broken", ["config.toml", "settings.json", ".claude.json", "hooks.json"])
def test_an_unparsable_file_is_refused_and_nothing_is_written(broken, user_home, workdir):
    claude_fixture(user_home)
    codex_fixture(user_home / ".codex")
    target = {
        "config.toml": user_home / ".codex" / "config.toml",
        "settings.json": user_home / ".claude" / "settings.json",
        ".claude.json": user_home / ".claude.json",
        "hooks.json": user_home / ".codex" / "hooks.json",
    }[broken]
    target.write_text(target.read_text()[:-8] + "]] oops\n")
    before = snapshot(user_home)
    result = install(install_env(user_home), workdir, "--claude", "--codex")
    assert result.returncode == 1
    assert str(target) in result.stderr and "Nothing was changed" in result.stderr
    assert snapshot(user_home) == before


def test_a_stale_registration_is_updated_in_place(user_home, workdir):
    claude_fixture(user_home)
    settings = json.loads((user_home / ".claude" / "settings.json").read_text())
    settings["hooks"]["Stop"] = [
        {
            "hooks": [
                {
                    "type": "command",
                    "command": "/old/venv/bin/agent-bridge hook stop --agent claude",
                    "timeout": 30,
                }
            ]
        },
        {"hooks": [{"type": "command", "command": "/older/bin/agent-bridge hook stop --agent claude"}]},
    ]
    write_json(user_home / ".claude" / "settings.json", settings)
    (user_home / ".codex").mkdir()
    stale = CODEX_TOML + (
        '\n[mcp_servers.agent-bridge]  # the bridge\ncommand = "/old/venv/bin/agent-bridge"\n'
        'args = [\n  "mcp",\n  "--agent", "codex",\n]\n'
        'env = { AGENT_BRIDGE_HOME = "/old/home", LANG = "C" }\n'
        "startup_timeout_sec = 20\n"
    )
    (user_home / ".codex" / "config.toml").write_text(stale)
    result = install(install_env(user_home), workdir, "--claude", "--codex")
    assert result.returncode == 0, result.stderr

    settings = json.loads((user_home / ".claude" / "settings.json").read_text())
    assert hook_commands(settings, "Stop") == [f"{RUN} hook stop --agent claude",  # one left, updated
                                               f"{RUN} hook wake --agent claude"]
    assert settings["hooks"]["Stop"][0]["hooks"][0]["timeout"] == 30  # the user's own setting stays
    text = (user_home / ".codex" / "config.toml").read_text()
    assert "[mcp_servers.agent-bridge]  # the bridge" in text and "# My Codex setup" in text
    config = tomllib.loads(text)
    assert config["mcp_servers"]["agent-bridge"] == {
        "command": RUN,
        "args": [*CLI[1:], "mcp", "--agent", "codex"],
        "env": {"LANG": "C"},
        "startup_timeout_sec": 20,
    }
    assert text.count("[mcp_servers.agent-bridge]") == 1


def test_codex_hooks_switched_off_are_switched_on_in_place(user_home, workdir):
    (user_home / ".codex").mkdir()
    original = "[features]\ncodex_hooks = false  # was noisy\nother = 1\n"
    (user_home / ".codex" / "config.toml").write_text(original)
    assert install(install_env(user_home), workdir, "--codex").returncode == 0
    text = (user_home / ".codex" / "config.toml").read_text()
    assert text.startswith(
        "[features]\ncodex_hooks = true  # switched on by agent-bridge install (was false)\nother = 1\n"
    )
    # no codex on PATH: spelling kept
    assert tomllib.loads(text)["features"] == {"codex_hooks": True, "other": 1}
    assert uninstall(install_env(user_home), workdir, "--codex").returncode == 0
    assert (
        user_home / ".codex" / "config.toml"
    ).read_text() == "[features]\ncodex_hooks = false\nother = 1\n"


def test_without_codex_on_path_an_existing_key_keeps_its_spelling(user_home, workdir):
    (user_home / ".codex").mkdir()
    (user_home / ".codex" / "config.toml").write_text(EARLIER_INSTALL)
    result = install(install_env(user_home), workdir, "--codex")
    assert result.returncode == 0, result.stderr
    assert (user_home / ".codex" / "config.toml").read_text() == EARLIER_INSTALL


def test_an_inline_server_table_is_refused_with_instructions(user_home, workdir):
    (user_home / ".codex").mkdir()
    original = 'mcp_servers = { agent-bridge = { command = "/old/agent-bridge", args = ["mcp"] } }\n'
    (user_home / ".codex" / "config.toml").write_text(original)
    result = install(install_env(user_home), workdir, "--codex")
    assert result.returncode == 1
    assert "[mcp_servers.agent-bridge]" in result.stderr and "by hand" in result.stderr
    assert (user_home / ".codex" / "config.toml").read_text() == original
    assert not (user_home / ".codex" / "hooks.json").exists()


def test_without_flags_only_the_hosts_that_are_set_up_are_configured(user_home, workdir):
    (user_home / ".codex").mkdir()
    result = install(install_env(user_home), workdir)
    assert result.returncode == 0, result.stderr
    assert (user_home / ".codex" / "config.toml").exists() and (user_home / ".codex" / "hooks.json").exists()
    assert not (user_home / ".claude.json").exists() and not (user_home / ".claude").exists()


def test_without_flags_and_no_host_folders_both_are_configured(user_home, workdir):
    result = install(install_env(user_home), workdir, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert ".claude.json" in result.stdout and ".codex/config.toml" in result.stdout
    assert list(user_home.iterdir()) == []


def test_an_env_subtable_gets_the_new_home(user_home, workdir, tmp_path):
    (user_home / ".codex").mkdir()
    original = (
        '[mcp_servers.agent-bridge]\ncommand = "/old/agent-bridge"\nargs = ["mcp", "--agent", "codex"]\n\n'
        '[mcp_servers.agent-bridge.env]\n# where the state lives\n'
        'AGENT_BRIDGE_HOME = "/old/state"\nLANG = "C"\n'
    )
    (user_home / ".codex" / "config.toml").write_text(original)
    bridge_home = tmp_path / "new-state"
    result = install(install_env(user_home, bridge_home), workdir, "--codex")
    assert result.returncode == 0, result.stderr
    text = (user_home / ".codex" / "config.toml").read_text()
    assert "# where the state lives" in text and "[mcp_servers.agent-bridge.env]" in text
    server = tomllib.loads(text)["mcp_servers"]["agent-bridge"]
    assert server == {
        "command": RUN, "args": [*CLI[1:], "mcp", "--agent", "codex"],
        "env": {"AGENT_BRIDGE_HOME": str(bridge_home), "LANG": "C"},
    }
    assert "nothing to change" in install(install_env(user_home, bridge_home), workdir, "--codex").stdout


# --- Codex's hooks feature key follows the installed version --------------------------------


def stand_in_codex(folder: Path, version: str) -> Path:
    """A `codex` that only answers `--version`, standing in for a release we cannot install here
    (the real 0.171 is used in the tests below)."""
    folder.mkdir(parents=True, exist_ok=True)
    program = folder / "codex"
    program.write_text(f"#!/bin/sh\necho 'codex-cli {version}'\n")
    program.chmod(0o755)
    return folder


def with_path(env: dict[str, str], folder: Path) -> dict[str, str]:
    return dict(env, PATH=f"{folder}{os.pathsep}{env.get('PATH', '')}")


EARLIER_INSTALL = (  # what `agent-bridge install --codex` wrote before it asked Codex for its version
    "# agent-bridge: added by `agent-bridge install`\n[mcp_servers.agent-bridge]\n"
    f'command = "{RUN}"\nargs = {json.dumps([*CLI[1:], "mcp", "--agent", "codex"])}\n\n'
    "[features]\ncodex_hooks = true\n"
)


def test_stand_in_old_codex_gets_codex_hooks_and_uninstall_removes_it(user_home, workdir, tmp_path):
    (user_home / ".codex").mkdir()
    (user_home / ".codex" / "config.toml").write_text('model = "o3"\n')
    env = with_path(install_env(user_home), stand_in_codex(tmp_path / "bin", "0.129.0"))
    assert install(env, workdir, "--codex").returncode == 0
    text = (user_home / ".codex" / "config.toml").read_text()
    assert "codex_hooks = true  # added by agent-bridge install\n" in text
    assert tomllib.loads(text)["features"] == {"codex_hooks": True}
    assert "nothing to change" in install(env, workdir, "--codex").stdout

    removed = subprocess.run(
        [*CLI, "uninstall", "--codex"], env=env, cwd=workdir, capture_output=True, text=True
    )
    assert removed.returncode == 0, removed.stderr
    assert (user_home / ".codex" / "config.toml").read_text() == 'model = "o3"\n'


def test_stand_in_current_codex_gets_the_deprecated_key_renamed(user_home, workdir, tmp_path):
    (user_home / ".codex").mkdir()
    (user_home / ".codex" / "config.toml").write_text(EARLIER_INSTALL)
    env = with_path(install_env(user_home), stand_in_codex(tmp_path / "bin", "0.150.2"))
    result = install(env, workdir, "--codex")
    assert result.returncode == 0, result.stderr
    text = (user_home / ".codex" / "config.toml").read_text()
    assert text == EARLIER_INSTALL.replace("codex_hooks = true", "hooks = true")
    assert "renamed the deprecated [features] codex_hooks to hooks" in result.stdout


def codex_warnings(codex: Path, user_home: Path, cwd: Path) -> list[str]:
    """The messages the real `codex exec` reports before its first model request (the model is a
    closed port on 127.0.0.1, so it stops there; config warnings come first)."""
    config = user_home / ".codex" / "config.toml"
    config.write_text((
        'model = "test-model"\nmodel_provider = "fake"\ncheck_for_update_on_startup = false\n'
        '[model_providers.fake]\nname = "fake"\nbase_url = "http://127.0.0.1:9/v1"\nwire_api = "responses"\n'
        'env_key = "FAKE_KEY"\nrequires_openai_auth = false\nsupports_websockets = false\n'
        "request_max_retries = 0\nstream_max_retries = 0\n\n"
    ) + config.read_text())
    env = dict(install_env(user_home), FAKE_KEY="x")
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
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    found = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # ends at turn.started, or when codex exits
            event = json.loads(line)
            if event.get("type") == "turn.started":
                break
            if event.get("type") == "item.completed" and event["item"].get("type") == "error":
                found.append(event["item"]["message"])
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()
    return found


def test_real_codex_prints_no_deprecation_after_install(user_home, workdir, tmp_path):
    codex = host_program("codex")
    (user_home / ".codex").mkdir()
    (user_home / ".codex" / "config.toml").write_text(EARLIER_INSTALL)
    # the symptom
    assert any("codex_hooks` is deprecated" in m for m in codex_warnings(codex, user_home, workdir))
    (user_home / ".codex" / "config.toml").write_text(EARLIER_INSTALL)

    result = install(with_path(install_env(user_home), codex.parent), workdir, "--codex")
    assert result.returncode == 0, result.stderr
    assert tomllib.loads((user_home / ".codex" / "config.toml").read_text())["features"] == {"hooks": True}
    assert not [m for m in codex_warnings(codex, user_home, workdir) if "deprecated" in m]


# --- project scope: portable files ------------------------------------------------------------


def test_project_scope_records_an_explicit_home_with_a_warning(user_home, workdir, tmp_path):
    bridge_home = tmp_path / "state"
    result = install(
        install_env(user_home, bridge_home), workdir, "--claude", "--codex", "--scope", "project"
    )
    assert result.returncode == 0, result.stderr
    assert f"AGENT_BRIDGE_HOME={bridge_home} is recorded in the project files" in result.stderr
    assert "machine" in result.stderr
    server = json.loads((workdir / ".mcp.json").read_text())["mcpServers"]["agent-bridge"]
    assert server["command"] == "agent-bridge" and server["env"] == {"AGENT_BRIDGE_HOME": str(bridge_home)}
    for path in (
        workdir / ".mcp.json",
        workdir / ".claude" / "settings.json",
        workdir / ".codex" / "config.toml",
        workdir / ".codex" / "hooks.json",
    ):
        assert str(Path(RUN).parent) not in path.read_text(), path  # no path of this machine's install


def test_project_scope_without_agent_bridge_on_path_warns(user_home, workdir):
    env = dict(install_env(user_home), PATH="/usr/bin:/bin")
    result = install(env, workdir, "--claude", "--scope", "project")
    assert result.returncode == 0, result.stderr
    assert "`agent-bridge` is not on PATH here" in result.stderr


def test_real_claude_starts_the_project_server_from_path_on_another_machine(tmp_path):
    """The project files written on one machine, used on another: a fresh HOME, a project copied
    elsewhere, and agent-bridge on PATH somewhere else than where install ran."""
    claude = host_program("claude")
    if not SCRIPT.exists():
        pytest.skip("needs the agent-bridge console script")
    written = tmp_path / "machine-a" / "project"
    written.mkdir(parents=True)
    machine_a_bin = tmp_path / "machine-a" / "venv" / "bin"
    machine_a_bin.mkdir(parents=True)
    (machine_a_bin / "agent-bridge").symlink_to(SCRIPT)
    result = subprocess.run(
        [str(machine_a_bin / "agent-bridge"), "install", "--claude", "--scope", "project"],
        env=install_env(tmp_path / "machine-a"),
        cwd=written,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    project = tmp_path / "machine-b" / "checkout"
    shutil.copytree(written, project)
    shutil.rmtree(tmp_path / "machine-a")  # nothing of machine A exists on machine B
    teammate_home = tmp_path / "machine-b" / "home"
    teammate_bin = tmp_path / "machine-b" / "bin"
    teammate_bin.mkdir(parents=True)
    (teammate_bin / "agent-bridge").symlink_to(SCRIPT)
    teammate_home.mkdir()
    # The teammate approved the project's server and trusted the folder, as Claude Code records them
    # (seen from Claude Code 2.1.197's approval dialog: settings.local.json, ~/.claude.json).
    (project / ".claude" / "settings.local.json").write_text(
        json.dumps({"enabledMcpjsonServers": ["agent-bridge"]})
    )
    (teammate_home / ".claude.json").write_text(json.dumps(
        {"hasCompletedOnboarding": True, "projects": {str(project): {"hasTrustDialogAccepted": True}}}))
    env = {
        "HOME": str(teammate_home),
        "PATH": f"{teammate_bin}{os.pathsep}/usr/bin:/bin",
        **CLAUDE_OFFLINE_ENV,
    }
    # A broker up first, so that the server Claude Code starts finds it (and `down` stops it after).
    assert (
        subprocess.run(
            [*CLI, "up", "--detach"],
            env=dict(env, AGENT_BRIDGE_WEB_PORT="0"),
            capture_output=True,
            timeout=60,
        ).returncode
        == 0
    )
    try:
        listed = subprocess.run(
            [str(claude), "mcp", "list"], env=env, cwd=project, capture_output=True, text=True, timeout=120
        )
    finally:
        subprocess.run([*CLI, "down"], env=env, capture_output=True, timeout=60)
    assert "agent-bridge: agent-bridge mcp --agent claude - ✔ Connected" in listed.stdout, (
        listed.stdout + listed.stderr
    )


# --- uninstall ---------------------------------------------------------------------------------


def uninstall(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "uninstall", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60
    )


def test_uninstall_restores_the_user_files_exactly(user_home, workdir, tmp_path):
    claude_fixture(user_home)
    codex_fixture(user_home / ".codex")
    files = [user_home / ".claude.json", user_home / ".claude" / "settings.json",
             user_home / ".codex" / "config.toml", user_home / ".codex" / "hooks.json"]
    originals = {p: p.read_text() for p in files}
    env = install_env(user_home, tmp_path / "state")
    assert install(env, workdir, "--claude", "--codex").returncode == 0
    installed = {p: p.read_text() for p in files}
    assert all(installed[p] != originals[p] for p in files)

    dry = uninstall(env, workdir, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert {p: p.read_text() for p in files} == installed
    assert "-[mcp_servers.agent-bridge]" in dry.stdout and f"--- {user_home / '.claude.json'}" in dry.stdout

    result = uninstall(env, workdir)
    assert result.returncode == 0, result.stderr
    assert {p: p.read_text() for p in files} == originals  # byte for byte: everything else untouched
    for path in files:
        assert [b.read_text() for b in backups_of(path)][-1] == installed[path]  # backed up before removal
    before = snapshot(user_home)
    again = uninstall(env, workdir)
    assert again.returncode == 0 and "nothing to change" in again.stdout
    assert snapshot(user_home) == before


def test_uninstall_project_scope_deletes_the_files_it_emptied(user_home, workdir):
    write_json(workdir / ".mcp.json", {"mcpServers": {"db": {"command": "db-mcp", "args": []}}})
    env = install_env(user_home)
    assert install(env, workdir, "--claude", "--codex", "--scope", "project").returncode == 0
    user_before = snapshot(user_home)
    result = uninstall(env, workdir, "--claude", "--codex", "--scope", "project")
    assert result.returncode == 0, result.stderr
    assert json.loads((workdir / ".mcp.json").read_text()) == {
        "mcpServers": {"db": {"command": "db-mcp", "args": []}}
    }
    for gone in (
        workdir / ".claude" / "settings.json",
        workdir / ".codex" / "config.toml",
        workdir / ".codex" / "hooks.json",
    ):
        assert not gone.exists() and len(backups_of(gone)) == 1
    assert snapshot(user_home) == user_before


def test_uninstall_keeps_a_hook_group_shared_with_other_handlers(user_home, workdir):
    settings = {"hooks": {"Stop": [{"hooks": [
        {"type": "command", "command": "notify-send done"},
        {"type": "command", "command": "/opt/bin/agent-bridge hook stop --agent claude", "timeout": 10},
    ]}]}}
    write_json(user_home / ".claude" / "settings.json", settings)
    result = uninstall(install_env(user_home), workdir, "--claude")
    assert result.returncode == 0, result.stderr
    assert json.loads((user_home / ".claude" / "settings.json").read_text()) == {
        "hooks": {"Stop": [{"hooks": [{"type": "command", "command": "notify-send done"}]}]}
    }


def test_uninstall_refuses_an_unparsable_file(user_home, workdir):
    claude_fixture(user_home)
    (user_home / ".claude.json").write_text("{ nope")
    before = snapshot(user_home)
    result = uninstall(install_env(user_home), workdir, "--claude")
    assert result.returncode == 1
    assert (
        f"{user_home / '.claude.json'} is not valid JSON" in result.stderr
        and "Nothing was changed" in result.stderr
    )
    assert snapshot(user_home) == before


def test_uninstall_keeps_the_comment_of_the_table_that_follows(user_home, workdir):
    (user_home / ".codex").mkdir()
    ours = '[mcp_servers.agent-bridge]\ncommand = "/old/agent-bridge"\nargs = ["mcp"]\n\n'
    rest = '# my docs server\n[mcp_servers.docs]\ncommand = "docs"\n'
    (user_home / ".codex" / "config.toml").write_text('model = "o3"\n\n' + ours + rest)
    result = uninstall(install_env(user_home), workdir, "--codex")
    assert result.returncode == 0, result.stderr
    assert (user_home / ".codex" / "config.toml").read_text() == 'model = "o3"\n\n' + rest


def test_an_install_from_before_post_tool_use_gets_only_that_hook_added(user_home, workdir):
    """An earlier install registered SessionStart and Stop: doctor warns that messages then wait
    for the end of a turn, and install adds the PostToolUse hook alone, once."""
    claude_fixture(user_home)
    env = install_env(user_home, user_home / "bridge")
    assert install(env, workdir, "--claude").returncode == 0
    path = user_home / ".claude" / "settings.json"
    settings = json.loads(path.read_text())
    del settings["hooks"]["PostToolUse"]
    write_json(path, settings)
    doctor = subprocess.run(
        [*CLI, "doctor"], env=env, cwd=workdir, capture_output=True, text=True, timeout=60
    )
    line = next(x for x in doctor.stdout.splitlines() if "Claude Code hooks " in x)
    assert line.split()[0] == "warn" and "PostToolUse" in line and "turn ends" in line, doctor.stdout
    again = install(env, workdir, "--claude")
    assert again.returncode == 0 and "added PostToolUse hook" in again.stdout
    assert "added Stop" not in again.stdout and "added SessionStart" not in again.stdout
    assert json.loads(path.read_text())["hooks"]["PostToolUse"] == [
        {
            "hooks": [
                {
                    "type": "command",
                    "command": (
                        f"AGENT_BRIDGE_HOME={user_home / 'bridge'} {QUICK} post-tool-use --agent claude"
                    ),
                    "timeout": 10,
                }
            ]
        }
    ]
    assert "nothing to change" in install(env, workdir, "--claude").stdout
    removed = subprocess.run(
        [*CLI, "uninstall", "--claude"], env=env, cwd=workdir, capture_output=True, text=True, timeout=60
    )
    assert removed.returncode == 0 and "PostToolUse" not in json.loads(path.read_text()).get("hooks", {})


# Hand-written layouts, as people and hosts write them: 4 spaces and compact arrays, tabs and CRLF,
# one line, no final newline, empty containers that must still be there after uninstall.
CLAUDE_JSON_TEXT = (
    '{\n    "numStartups": 12,\n    "tipsHistory": {"a": 1, "b": 2},\n    "mcpServers": {},\n'
    '    "projects": {\n        "/work/app": {"allowedTools": [], "mcpServers": {}}\n    }\n}'
)
CLAUDE_SETTINGS_TEXT = (
    '{\r\n\t"permissions": {"allow": ["Bash(ls:*)"]},\r\n\t"hooks": {\r\n\t\t"SessionStart": [],\r\n'
    '\t\t"PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "check.sh"}]}]\r\n'
    '\t}\r\n}\r\n'
)
CODEX_HOOKS_TEXT = '{"hooks":{"Stop":[{"hooks":[{"type":"command","command":"notify-send done"}]}]}}\n'
MCP_JSON_TEXT = '{\n  "mcpServers": {}\n}\n'


def test_install_then_uninstall_gives_every_file_back_byte_for_byte(user_home, workdir, tmp_path):
    files = {
        user_home / ".claude.json": CLAUDE_JSON_TEXT,
        user_home / ".claude" / "settings.json": CLAUDE_SETTINGS_TEXT,
        user_home / ".codex" / "config.toml": CODEX_TOML,
        user_home / ".codex" / "hooks.json": CODEX_HOOKS_TEXT,
    }
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode())
    state = tmp_path / "state"
    env = install_env(user_home, state)
    done = install(env, workdir, "--claude", "--codex")
    assert done.returncode == 0, done.stderr

    # only our entries were added, in each file's own layout; every original line is still there
    claude = (user_home / ".claude.json").read_text()
    assert json.loads(claude)["mcpServers"]["agent-bridge"]["args"][-2:] == ["--agent", "claude"]
    assert '    "tipsHistory": {"a": 1, "b": 2},\n' in claude and '\n        "agent-bridge": {\n' in claude
    settings = (user_home / ".claude" / "settings.json").read_bytes().decode()
    # CRLF and tabs kept
    assert "\r\n\t\t\"Stop\": [\r\n" in settings and "\n" not in settings.replace("\r\n", "")
    assert [c.endswith(f"{RUN} hook session-start --agent claude")
            for c in hook_commands(json.loads(settings), "SessionStart")] == [True]
    codex_hooks = (user_home / ".codex" / "hooks.json").read_text()
    assert codex_hooks.startswith(
        '{"hooks":{"Stop":[{"hooks":[{"type":"command","command":"notify-send done"}]}'
    )
    assert codex_hooks.count("\n") == 1  # still one line

    # backups in the state folder, printed; nothing beside the files
    (folder,) = (state / "backups").iterdir()
    assert f"backups of the files as they were: {folder}" in done.stdout
    for path, text in files.items():
        assert [b.read_bytes().decode() for b in backups_of(path)] == [text]
    assert not [p for p in user_home.rglob("*") if "backup" in p.name]

    removed = uninstall(env, workdir)
    assert removed.returncode == 0, removed.stderr
    for path, text in files.items():  # byte for byte, empty "mcpServers": {} and "SessionStart": [] included
        assert path.read_bytes().decode() == text, path


def test_project_scope_leaves_nothing_for_git_status(user_home, workdir):
    (workdir / ".mcp.json").write_text(MCP_JSON_TEXT)
    env = install_env(user_home)
    before = snapshot(workdir)
    assert install(env, workdir, "--claude", "--codex", "--scope", "project").returncode == 0
    assert backups_of(workdir / ".claude" / "settings.json") == []  # a file install created has no backup
    assert len(backups_of(workdir / ".mcp.json")) == 1
    removed = uninstall(env, workdir, "--claude", "--codex", "--scope", "project")
    assert removed.returncode == 0, removed.stderr
    assert snapshot(workdir) == before  # `{"mcpServers": {}}` as it was; the files install made are gone
    files = sorted(p.relative_to(workdir) for p in workdir.rglob("*") if not p.is_dir())
    assert files == [Path(".mcp.json")]  # no backups here (git does not list the empty folders left)
    assert (user_home / STATE / "backups").is_dir()


def test_a_file_holding_an_empty_object_is_kept(user_home, workdir):
    (user_home / ".claude").mkdir()
    (user_home / ".claude" / "settings.json").write_text("{}\n")
    env = install_env(user_home)
    assert install(env, workdir, "--claude").returncode == 0
    assert uninstall(env, workdir, "--claude").returncode == 0
    assert (user_home / ".claude" / "settings.json").read_text() == "{}\n"


def test_install_warns_when_the_other_scope_is_installed(user_home, workdir):
    env = install_env(user_home)
    assert install(env, workdir, "--claude").returncode == 0
    project = install(env, workdir, "--claude", "--scope", "project")
    assert project.returncode == 0
    assert (
        "also installed at user scope" in project.stderr and str(user_home / ".claude.json") in project.stderr
    )
    assert "agent-bridge uninstall --scope user" in project.stderr
    again = install(env, workdir, "--claude")
    assert "also installed at project scope" in again.stderr and str(workdir / ".mcp.json") in again.stderr
    assert uninstall(env, workdir, "--claude", "--scope", "project").returncode == 0
    assert "also installed" not in install(env, workdir, "--claude").stderr


# --- the owner's slash commands (SPEC §4.6, agent_bridge.hosts.slash) ----------------------------

SLASH_NAMES = ("send", "inbox", "decide", "questions", "answer", "jobs")


def command_files(claude_dir: Path) -> dict[str, str]:
    folder = claude_dir / "commands" / "agent-bridge"
    return {p.stem: p.read_text() for p in sorted(folder.glob("*.md"))} if folder.is_dir() else {}


def test_slash_commands_are_added_and_removed_leaving_the_users_own(user_home, workdir, tmp_path):
    claude_fixture(user_home)
    mine = user_home / ".claude" / "commands" / "review.md"
    mine.parent.mkdir(parents=True)
    mine.write_bytes(b"---\ndescription: my review\n---\nReview $ARGUMENTS\r\n")
    before = snapshot(user_home)
    env = install_env(user_home, tmp_path / "state")
    done = install(env, workdir, "--claude")
    assert done.returncode == 0, done.stderr

    files = command_files(user_home / ".claude")
    assert sorted(files) == sorted(SLASH_NAMES)
    for name, text in files.items():
        line = f"AGENT_BRIDGE_HOME={tmp_path / 'state'} {RUN} slash {name}"
        assert f"allowed-tools: Bash({line}:*)\n" in text
        assert f"```!\n{line} <<'AGENT_BRIDGE_ARGUMENTS'\n$ARGUMENTS\nAGENT_BRIDGE_ARGUMENTS\n```\n" in text
        assert "disable-model-invocation: true\n" in text  # the model cannot act as the owner
        assert f"commands/agent-bridge/{name}.md: added our slash command (new file)" in done.stdout
    assert "argument-hint: TO TEXT\n" in files["send"]
    assert (user_home / ".claude" / "commands" / "agent-bridge" / "send.md").stat().st_mode & 0o777 == 0o600
    assert "nothing to change" in install(env, workdir, "--claude").stdout

    removed = uninstall(env, workdir, "--claude")
    assert removed.returncode == 0, removed.stderr
    assert "commands/agent-bridge/jobs.md: removed our slash command" in removed.stdout
    assert snapshot(user_home) == before  # the user's own command byte for byte, CRLF included
    assert not (user_home / ".claude" / "commands" / "agent-bridge").exists()
    assert [b.name for b in backups_of(user_home / ".claude" / "commands" / "agent-bridge" / "send.md")] == [
        "send.md"]  # kept like every file uninstall changes


def test_a_command_file_that_is_not_ours_is_refused_and_kept(user_home, workdir):
    claude_fixture(user_home)
    theirs = user_home / ".claude" / "commands" / "agent-bridge" / "send.md"
    theirs.parent.mkdir(parents=True)
    theirs.write_text("---\ndescription: someone else's\n---\nsend it\n")
    before = snapshot(user_home)
    env = install_env(user_home)
    done = install(env, workdir, "--claude")
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"agent-bridge install: refused: {theirs} exists and is not one agent-bridge wrote; "
        "move it away and run install again"
    )
    assert snapshot(user_home) == before  # nothing written, also not the other files

    theirs.unlink()
    assert install(env, workdir, "--claude").returncode == 0
    theirs.write_text("mine now\n")  # replaced by the user after install
    removed = uninstall(env, workdir, "--claude")
    assert removed.returncode == 0, removed.stderr
    assert theirs.read_text() == "mine now\n"
    assert sorted(command_files(user_home / ".claude")) == ["send"]


def test_project_scope_slash_commands_name_the_command_on_path(user_home, workdir):
    env = install_env(user_home)
    before = snapshot(workdir)
    assert install(env, workdir, "--claude", "--scope", "project").returncode == 0
    files = command_files(workdir / ".claude")
    assert sorted(files) == sorted(SLASH_NAMES)
    assert "```!\nagent-bridge slash decide <<'AGENT_BRIDGE_ARGUMENTS'\n" in files["decide"]
    assert (workdir / ".claude" / "commands" / "agent-bridge" / "send.md").stat().st_mode & 0o777 == 0o644
    assert command_files(user_home / ".claude") == {}
    assert uninstall(env, workdir, "--claude", "--scope", "project").returncode == 0
    assert snapshot(workdir) == before
    assert not (workdir / ".claude" / "commands").exists()


def test_codex_gets_the_skill_and_uninstall_takes_it_with_its_folders(user_home, workdir):
    """Codex has no custom prompts: install writes the agent-bridge skill where Codex loads skills
    (hosts/skill.py); uninstall removes it and the folders it made, and nothing else of HOME."""
    from agent_bridge.hosts import skill

    codex_fixture(user_home / ".codex")
    env = install_env(user_home)
    before = snapshot(user_home / ".codex")
    assert install(env, workdir, "--codex").returncode == 0
    written = user_home / ".codex" / "skills" / "agent-bridge" / "SKILL.md"
    assert written.read_text(encoding="utf-8") == skill.SKILL_TEXT
    done = subprocess.run([*CLI, "uninstall", "--codex"], env=env, cwd=workdir, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and "removed our skill (SKILL.md)" in done.stdout, done.stdout
    assert not (user_home / ".codex" / "skills").exists()
    assert snapshot(user_home / ".codex") == before


@pytest.mark.parametrize(("args", "why"), [
    (("--plugin", "--opencode"), "opencode has no plugin command"),
    (("--plugin", "--claude", "--scope", "project"), "for this user only"),
    (("--plugin", "--codex", "--dry-run"), "no dry run"),
])
def test_a_plugin_install_it_cannot_do_is_refused_in_one_line(user_home, workdir, args, why):
    before = snapshot(user_home)
    done = install(install_env(user_home), workdir, *args)
    assert done.returncode == 1 and why in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr and snapshot(user_home) == before


def test_a_codex_with_plugins_off_is_refused_before_anything_runs(user_home, workdir, tmp_path):
    """Codex 0.171 with [features] plugins = false answers `plugin add` with "not found": install
    --plugin says why instead (a stand-in codex on PATH records that it was never run)."""
    codex_fixture(user_home / ".codex")
    config = user_home / ".codex" / "config.toml"
    config.write_text(CODEX_TOML + "plugins = false\n", encoding="utf-8")
    ran = tmp_path / "ran"
    stand_in = tmp_path / "bin" / "codex"
    stand_in.parent.mkdir()
    stand_in.write_text(f"#!/bin/sh\necho \"$@\" >> {ran}\n", encoding="utf-8")
    stand_in.chmod(0o755)
    done = install(with_path(install_env(user_home), stand_in.parent), workdir, "--plugin", "--codex")
    assert done.returncode == 1 and "plugins = false" in done.stderr, done.stderr
    assert not ran.exists() and config.read_text(encoding="utf-8") == CODEX_TOML + "plugins = false\n"
