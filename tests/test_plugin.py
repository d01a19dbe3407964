"""The plugin's files (agent_bridge/hosts/plugin.py): what is committed is what install's tables
give, the plugin registers exactly what `install` registers, and its skill is short."""

from __future__ import annotations

import json
from pathlib import Path

from agent_bridge.hosts import claude, codex, plugin, skill
from agent_bridge.hosts.edits import EVENTS, hook_command

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "agent_bridge" / "marketplace" / plugin.NAME


def test_the_committed_files_are_what_the_tables_give():
    assert plugin.FOLDER == ROOT / "agent_bridge" / "marketplace"
    assert plugin.stale(ROOT) == [], "run python docs/generate.py"


def test_a_changed_or_extra_file_is_stale(tmp_path):
    for path, text in plugin.repository_files().items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text, encoding="utf-8")
    hooks = tmp_path / "agent_bridge/marketplace/agent-bridge/hooks/hooks.json"
    hooks.write_text(hooks.read_text(encoding="utf-8").replace("stop", "st0p"), encoding="utf-8")
    (hooks.parent / "extra.json").write_text("{}", encoding="utf-8")
    assert sorted(plugin.stale(tmp_path)) == ["agent_bridge/marketplace/agent-bridge/hooks/extra.json",
                                              "agent_bridge/marketplace/agent-bridge/hooks/hooks.json"]


def test_the_plugin_registers_what_install_registers():
    """Each host's hook events, command lines and handler keys are install's (with `agent-bridge`
    on PATH and no recorded home); the MCP server runs `agent-bridge mcp --agent HOST`."""
    for host, hooks_file, servers_file in ((claude.HOST, "hooks/hooks.json", ".mcp.json"),
                                           (codex.HOST, "hooks/codex-hooks.json", "codex.mcp.json")):
        hooks = json.loads((FOLDER / hooks_file).read_text(encoding="utf-8"))["hooks"]
        registered = {(event, handler["command"], handler.get("asyncRewake", False))
                      for event, groups in hooks.items() for group in groups for handler in group["hooks"]}
        wanted = {(event, hook_command(["agent-bridge"], arg, host.name, {}), False) for event, arg in EVENTS}
        wanted |= {(event, hook_command(["agent-bridge"], arg, host.name, {}), bool(keys.get("asyncRewake")))
                   for event, arg, keys in host.extra_hooks}
        assert registered == wanted, host.name
        server = json.loads((FOLDER / servers_file).read_text(encoding="utf-8"))["mcpServers"]["agent-bridge"]
        assert [server["command"], *server["args"]] == ["agent-bridge", "mcp", "--agent", host.name]
    manifest = json.loads((FOLDER / ".codex-plugin" / "plugin.json").read_text(encoding="utf-8"))
    assert (manifest["mcpServers"], manifest["hooks"]) == ("./codex.mcp.json", "./hooks/codex-hooks.json")
    market = json.loads((ROOT / ".claude-plugin" / "marketplace.json").read_text(encoding="utf-8"))
    assert (ROOT / market["plugins"][0]["source"] / ".claude-plugin" / "plugin.json").is_file()


def test_the_skill_says_when_to_use_the_bridge_in_under_1200_bytes():
    text = (FOLDER / plugin.SKILL).read_text(encoding="utf-8")
    assert text == skill.SKILL_TEXT and len(text.encode("utf-8")) < 1200
    assert skill.is_ours(text) and text.startswith("---\nname:") is False
    for tool in ("send", "inbox", "peers", "decisions", "decide", "delegate"):
        assert f"`{tool}`" in text
    assert "mcp__" not in text  # no one host's tool names: right under either
