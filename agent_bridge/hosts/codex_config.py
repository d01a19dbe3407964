"""Codex's configuration as install sees it: where its folder is (CODEX_HOME), which Codex is
installed (`codex --version`), and install's and uninstall's edits of its config.toml.

Configuration (the files and keys Codex documents):
- MCP servers: "Model Context Protocol" (https://developers.openai.com/codex/mcp) and "Config"
  (https://github.com/openai/codex/blob/main/docs/config.md): `[mcp_servers.<name>]` with
  `command`, `args`, `env` in `$CODEX_HOME/config.toml` (CODEX_HOME defaults to `~/.codex`), or
  `.codex/config.toml` of a trusted project. Codex starts MCP servers with a cleared environment, so a
  non-default AGENT_BRIDGE_HOME goes into `env`.
- Hooks: "Hooks" (https://developers.openai.com/codex/hooks): `~/.codex/hooks.json` or
  `<repo>/.codex/hooks.json`, the same event -> matcher group -> handler shape as Claude Code
  (handler keys `type`, `command`, `timeout`; codex-rs/config HookHandlerConfig). Codex before
  0.130 runs hooks only with `[features] codex_hooks = true`; from 0.130 hooks are on by default,
  the key is `[features] hooks` and `codex_hooks` is a deprecated alias that Codex warns about on
  every run (Codex hooks docs; openai/codex #20522 made `hooks` canonical, first reported
  deprecated with 0.130.0; `codex exec` 0.171 prints the warning). So install asks `codex
  --version`: before 0.130 it adds `codex_hooks = true`; from 0.130 it adds nothing and renames a
  `codex_hooks` key (an earlier install wrote one) to `hooks` in place. With no codex on PATH a
  current Codex is assumed: nothing is added and an existing key keeps its spelling. Uninstall
  removes the feature key install added or switched on (marked by a trailing comment).

The TOML is edited with tomlkit (hosts.tomledit) so that comments and layout stay; each key or
table install adds carries a comment (TABLE_MARK, ADDED_MARK, SWITCHED_MARK) so that uninstall
removes exactly what install added.

Light at import (the hooks load it through hosts.codex): copy, re, tomlkit and the edit helpers
are imported inside the functions that use them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tomlkit.toml_document import TOMLDocument

    from agent_bridge.hosts.edits import FileEdit

# Idle wake through `codex queue` (runs_waiter): on unless "0"; "1" also where no TUI is known
# (wakes_only_in_front)
WAKE_ENV = "AGENT_BRIDGE_CODEX_WAKE"
HOOKS_KEY_SINCE = (0, 130, 0)  # Codex renamed [features] codex_hooks to hooks (on by default)
TABLE_MARK = "agent-bridge: added by `agent-bridge install`"  # comment above our [mcp_servers] table
ADDED_MARK = "added by agent-bridge install"  # trailing comment of a feature key install added
SWITCHED_MARK = "switched on by agent-bridge install (was false)"


def hooks_feature_key(version: tuple[int, int, int] | None) -> str:
    """The [features] key the installed Codex reads (a current Codex when none is on PATH)."""
    return "codex_hooks" if version is not None and version < HOOKS_KEY_SINCE else "hooks"


def codex_home() -> Path:
    """`$CODEX_HOME`, default `~/.codex` (openai/codex docs/config.md)."""
    explicit = os.environ.get("CODEX_HOME")
    return Path(explicit).expanduser() if explicit else Path.home() / ".codex"


def codex_program() -> str | None:
    """The `codex` the user would run (the one on PATH), or None."""
    import shutil

    return shutil.which("codex")


def codex_version(program: str | None = None) -> tuple[int, int, int] | None:
    """The installed Codex's version from `codex --version` ("codex-cli 0.171.0"), or None when
    there is no codex on PATH or it does not answer with a version."""
    import re

    from agent_bridge.hosts.base import version_output

    printed = version_output(program or codex_program())
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", printed) if printed is not None else None
    if match is None:
        return None
    major, minor, patch = (int(g) for g in match.groups())
    return major, minor, patch



# --- install: config.toml, edited with tomlkit so that comments and layout stay ------------


def edit_codex_config(
    path: Path, command: str, args: list[str], env: dict[str, str], *, private: bool,
    version: tuple[int, int, int] | None = None,
) -> FileEdit:
    import copy

    from agent_bridge.hosts.edits import SERVER_NAME, InstallError, merge_env
    from agent_bridge.hosts.tomledit import append_table, finish_toml, set_value, toml_doc, toml_table

    before, data, doc = toml_doc(path)
    expected = copy.deepcopy(data)
    notes: list[str] = []
    feature = hooks_feature_key(version)
    at = ("mcp_servers", SERVER_NAME)
    manual = f"add this to {path} by hand:\n" + by_hand(
        {"command": command, "args": args, **({"env": env} if env else {})}, feature == "codex_hooks")

    servers = expected.setdefault("mcp_servers", {})
    if not isinstance(servers, dict):
        raise InstallError(f"{path}: mcp_servers must be a table. Nothing was changed.")
    current = servers.get(SERVER_NAME)
    if current is not None and not isinstance(current, dict):
        raise InstallError(f"{path}: mcp_servers.{SERVER_NAME} must be a table. Nothing was changed.")
    merged_env = merge_env((current or {}).get("env"), env, path)
    if current is None:
        values: dict[str, object] = {"command": command, "args": args}
        if merged_env:
            values["env"] = merged_env
        append_table(doc, at, values, TABLE_MARK)
        servers[SERVER_NAME] = dict(values)
        notes.append(f'added MCP server "{SERVER_NAME}"')
    elif (current.get("command"), current.get("args"), current.get("env") or {}) != (
        command,
        args,
        merged_env,
    ):
        table = toml_table(doc, at)
        if table is None:
            raise InstallError(
                f"{path}: mcp_servers.{SERVER_NAME} is not a [table] this command can edit; {manual}"
            )
        set_value(doc, at, "command", command)
        set_value(doc, at, "args", args)
        env_table = toml_table(doc, (*at, "env"))
        if env_table is not None:
            if "AGENT_BRIDGE_HOME" in env:
                set_value(doc, (*at, "env"), "AGENT_BRIDGE_HOME", env["AGENT_BRIDGE_HOME"])
            elif "AGENT_BRIDGE_HOME" in env_table:
                del env_table["AGENT_BRIDGE_HOME"]
        elif merged_env:
            set_value(doc, at, "env", merged_env)
        elif "env" in table:
            del table["env"]
        entry = dict(current, command=command, args=args)
        if merged_env or env_table is not None:
            entry["env"] = merged_env
        else:
            entry.pop("env", None)
        servers[SERVER_NAME] = entry
        notes.append(f'updated MCP server "{SERVER_NAME}"')
    if not servers and "mcp_servers" not in data:
        del expected["mcp_servers"]

    ensure_hooks_feature(path, data, expected, doc, notes, feature if version else None, manual)
    return finish_toml(path, before, doc, expected, notes, manual, private)


def by_hand(server: dict[str, object], codex_hooks: bool) -> str:
    """The TOML a user adds by hand when install cannot edit the file itself."""
    import tomlkit

    from agent_bridge.hosts.edits import SERVER_NAME
    from agent_bridge.hosts.tomledit import append_table

    sample = tomlkit.document()
    append_table(sample, ("mcp_servers", SERVER_NAME), server)
    if codex_hooks:
        append_table(sample, ("features",), {"codex_hooks": True})
    return sample.as_string().rstrip("\n")


def ensure_hooks_feature(path: Path, data: dict[str, Any], expected: dict[str, Any], doc: TOMLDocument,
                          notes: list[str], feature: str | None, manual: str) -> None:
    """Make the installed Codex run hooks, in the key it reads (see the module docstring).
    `feature` None: the version is unknown (no codex on PATH), so the spelling the user has is
    kept; only a key that switches hooks off is switched on."""
    from agent_bridge.hosts.edits import InstallError
    from agent_bridge.hosts.tomledit import append_table, rename_key, set_value, toml_table

    features = expected.get("features", {})
    if not isinstance(features, dict):
        raise InstallError(f"{path}: features must be a table. Nothing was changed.")
    deprecated = "codex_hooks" if feature == "hooks" else None
    if feature is None:
        off = [key for key in ("hooks", "codex_hooks") if features.get(key) is False]
        feature = off[0] if off else "hooks"
    needs_edit = (
        (deprecated is not None and deprecated in features)
        or features.get(feature) is False
        or (feature == "codex_hooks" and feature not in features)
    )
    if not needs_edit:
        return
    table = toml_table(doc, ("features",))
    if table is None and "features" in data:
        raise InstallError(f"{path}: [features] is not a table this command can edit; {manual}")
    if table is None:
        table = append_table(doc, ("features",), {})
    expected["features"] = features
    if deprecated is not None and deprecated in features:
        if feature in features:
            del table[deprecated]
            notes.append(f"removed the deprecated [features] {deprecated} ({feature} is set)")
        else:
            rename_key(doc, ("features",), deprecated, feature)
            notes.append(f"renamed the deprecated [features] {deprecated} to {feature}")
            features[feature] = features[deprecated]
        del features[deprecated]
        table = toml_table(doc, ("features",))
        assert table is not None
    if features.get(feature) is False:
        set_value(doc, ("features",), feature, True, SWITCHED_MARK)
        notes.append(f"turned on hooks: [features] {feature} = true (was false)")
    elif feature not in features:  # only for a Codex that gates hooks behind the flag
        set_value(doc, ("features",), feature, True, ADDED_MARK)
        notes.append(f"turned on hooks: [features] {feature} = true")
    features[feature] = True


def remove_codex_config(path: Path, *, private: bool) -> FileEdit:
    import copy

    from agent_bridge.hosts.edits import SERVER_NAME, InstallError
    from agent_bridge.hosts.tomledit import (
        finish_toml,
        is_blank,
        key_comment,
        remove_table,
        set_value,
        toml_doc,
        toml_table,
    )

    before, data, doc = toml_doc(path)
    expected = copy.deepcopy(data)
    notes: list[str] = []
    manual = f"remove [mcp_servers.{SERVER_NAME}] from {path} by hand"
    at = ("mcp_servers", SERVER_NAME)
    servers = expected.get("mcp_servers")
    if isinstance(servers, dict) and SERVER_NAME in servers:
        if toml_table(doc, at) is None:
            raise InstallError(
                f"{path}: mcp_servers.{SERVER_NAME} is not a [table] this command can edit; {manual}"
            )
        remove_table(doc, at, marker=TABLE_MARK)
        del servers[SERVER_NAME]
        if not servers and toml_table(doc, ("mcp_servers",)) is None:
            del expected["mcp_servers"]
        notes.append(f'removed MCP server "{SERVER_NAME}"')
    features = expected.get("features")
    table = toml_table(doc, ("features",))
    if isinstance(features, dict) and table is not None:
        for key in ("hooks", "codex_hooks"):
            comment = key_comment(table, key)
            if ADDED_MARK in comment:
                del table[key]
                del features[key]
                notes.append(f"removed [features] {key} (added by install)")
            elif SWITCHED_MARK in comment:
                set_value(doc, ("features",), key, False)
                table = toml_table(doc, ("features",))
                assert table is not None
                features[key] = False
                notes.append(f"switched [features] {key} back to false")
        if not features and is_blank(table) and notes:
            remove_table(doc, ("features",))
            del expected["features"]
    return finish_toml(path, before, doc, expected, notes, manual, private)
