"""Codex's config.toml edited with tomlkit (agent_bridge/hosts/edits.py): the layouts the
end-to-end install tests do not reach, each checked to the byte, and the re-parse guard."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import tomlkit

from agent_bridge.hosts import codex_config as codex
from agent_bridge.hosts.edits import InstallError
from agent_bridge.hosts.tomledit import finish_toml

# a Codex that needs [features] codex_hooks, and one that reads `hooks`
OLD, CURRENT = (0, 129, 0), (0, 150, 0)
MARK = "# agent-bridge: added by `agent-bridge install`\n"


def install(
    path: Path, text: str, version: tuple[int, int, int] | None, env: dict[str, str] | None = None
) -> str:
    path.write_text(text)
    edit = codex.edit_codex_config(path, "/bin/agent-bridge", ["mcp", "--agent", "codex"], env or {},
                                   private=True, version=version)
    assert edit.after is not None
    path.write_text(edit.after)
    return edit.after


def uninstall(path: Path) -> str | None:
    edit = codex.remove_codex_config(path, private=True)
    return edit.after


def test_a_key_added_to_features_goes_below_its_last_key_not_between_our_mark_and_table(tmp_path):
    ours = (
        MARK
        + '[mcp_servers.agent-bridge]\ncommand = "/bin/agent-bridge"\nargs = ["mcp", "--agent", "codex"]\n'
    )
    original = "[features]\nweb = true\n\n" + ours + "\n# the next table's comment\n[x]\ny = 1\n"
    after = install(tmp_path / "config.toml", original, OLD)
    assert after == original.replace(
        "web = true\n", "web = true\ncodex_hooks = true  # added by agent-bridge install\n"
    )
    assert (
        uninstall(tmp_path / "config.toml")
        == "[features]\nweb = true\n\n# the next table's comment\n[x]\ny = 1\n"
    )


def test_the_deprecated_key_is_renamed_in_place(tmp_path):
    original = "[features]\n# mine\ncodex_hooks = true  # on\nother = 1\n\n[x]\ny = 1\n"
    after = install(tmp_path / "config.toml", original, CURRENT)
    assert after.startswith("[features]\n# mine\nhooks = true  # on\nother = 1\n\n[x]\ny = 1\n\n" + MARK)
    assert tomllib.loads(after)["features"] == {"hooks": True, "other": 1}


def test_comments_below_our_table_stay_when_nothing_follows_it(tmp_path):
    (tmp_path / "config.toml").write_text(
        'a = 1\n\n[mcp_servers.agent-bridge]\ncommand = "x"\n\n# last words\n'
    )
    assert uninstall(tmp_path / "config.toml") == "a = 1\n\n# last words\n"


LAYOUTS = [
    'model = "o3"\n',
    "# only a comment\n",
    'model = "o3"\n\n\n',  # blank lines at the end: install adds none before its table
    '[mcp_servers]\n\n[mcp_servers.docs]\ncommand = "d"\n',  # an explicit, empty [mcp_servers] stays
    "[features]\nother = 1  # why\n",
    '[features]\ncodex_hooks = false  # noisy\n\n[profiles.x]\nmodel = "o3"\n',
    '[mcp_servers.docs]\ncommand = "d"\n\n[mcp_servers.docs.env]\nK = "v"\n# below docs\n',
]


@pytest.mark.parametrize("version", [None, OLD, CURRENT])
@pytest.mark.parametrize("original", LAYOUTS)
def test_install_then_uninstall_gives_the_file_back(original, version, tmp_path):
    path = tmp_path / "config.toml"
    after = install(path, original, version, {"AGENT_BRIDGE_HOME": '/a "quoted" \\ path é'})
    assert tomllib.loads(after)["mcp_servers"]["agent-bridge"]["env"] == {
        "AGENT_BRIDGE_HOME": '/a "quoted" \\ path é'
    }
    for line in original.splitlines():
        assert line in after.splitlines() or "codex_hooks = false" in line
    if "codex_hooks = false" not in original:
        assert uninstall(path) == original.rstrip("\n") + "\n"
    else:  # switched on, then back off: the line is rewritten without its comment (a current Codex:
        # renamed to the key it reads)
        back = original.replace("false  # noisy", "false")
        assert uninstall(path) == (back.replace("codex_hooks", "hooks") if version == CURRENT else back)


def test_the_text_must_parse_to_what_was_meant(tmp_path):
    """The guard behind every TOML edit: the standard library's reading of the new text, not
    tomlkit's, must equal the document the edit meant to make."""
    doc = tomlkit.parse("a = 1\n")
    doc["b"] = 2
    finish_toml(tmp_path / "c.toml", "a = 1\n", doc, {"a": 1, "b": 2}, ["added b"], "do it by hand", True)
    with pytest.raises(InstallError, match="without changing other settings; do it by hand"):
        finish_toml(tmp_path / "c.toml", "a = 1\n", doc, {"a": 1, "b": 3}, ["added b"], "do it by hand", True)


def test_the_by_hand_instructions_are_valid_toml():
    text = codex.by_hand(
        {"command": 'C:\\bin\\"agent".exe', "args": ["mcp"], "env": {"AGENT_BRIDGE_HOME": "/h"}}, True
    )
    assert tomllib.loads(text) == {
        "mcp_servers": {
            "agent-bridge": {
                "command": 'C:\\bin\\"agent".exe',
                "args": ["mcp"],
                "env": {"AGENT_BRIDGE_HOME": "/h"},
            }
        },
        "features": {"codex_hooks": True},
    }
