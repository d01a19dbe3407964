"""`agent-bridge install` and `agent-bridge uninstall` (`[--claude] [--codex] [--scope user|project] [--dry-run]`).

Registers the MCP server (`agent-bridge mcp --agent …`) and the SessionStart and Stop hooks in
each host's own configuration files, using the files and keys the hosts document:

Claude Code
- MCP servers: "Connect Claude Code to tools via MCP", MCP installation scopes
  (https://code.claude.com/docs/en/mcp#mcp-installation-scopes): user scope is the top-level
  `mcpServers` object of `~/.claude.json`; project scope is `.mcp.json` at the project root.
  Entry shape as `claude mcp add` writes it: `{"type": "stdio", "command", "args", "env"}`.
- Hooks: "Hooks reference" (https://code.claude.com/docs/en/hooks#configuration) and "Settings"
  (https://code.claude.com/docs/en/settings): the `hooks` object of `~/.claude/settings.json`
  (user) or `.claude/settings.json` (project): event -> [matcher group {"matcher"?, "hooks":
  [{"type": "command", "command", "timeout"}]}]. SessionStart and Stop need no matcher.

Codex
- MCP servers: "Model Context Protocol" (https://developers.openai.com/codex/mcp) and "Config"
  (https://github.com/openai/codex/blob/main/docs/config.md): `[mcp_servers.<name>]` with
  `command`, `args`, `env` in `$CODEX_HOME/config.toml` (CODEX_HOME defaults to `~/.codex`), or
  `.codex/config.toml` of a trusted project. Codex starts MCP servers with a cleared environment, so a non-default
  AGENT_BRIDGE_HOME goes into `env`.
- Hooks: "Hooks" (https://developers.openai.com/codex/hooks): `~/.codex/hooks.json` or
  `<repo>/.codex/hooks.json`, the same event -> matcher group -> handler shape (handler keys
  `type`, `command`, `timeout`; codex-rs/config HookHandlerConfig). Codex before 0.130 runs
  hooks only with `[features] codex_hooks = true`; from 0.130 hooks are on by default, the key is
  `[features] hooks` and `codex_hooks` is a deprecated alias that Codex warns about on every run
  (Codex hooks docs; openai/codex #20522 made `hooks` canonical, first reported deprecated with
  0.130.0; `codex exec` 0.171 prints the warning). So install asks `codex --version`:
  before 0.130 it adds `codex_hooks = true`; from 0.130 it adds nothing and renames a
  `codex_hooks` key (an earlier install wrote one) to `hooks` in place. With no codex on PATH a
  current Codex is assumed: nothing is added and an existing key keeps its spelling.

What is written: user scope names the absolute path of the agent-bridge being run (this user's
machine, this user's files). Project scope writes files meant to be committed, so it names the
command `agent-bridge` as found on PATH, and records AGENT_BRIDGE_HOME only when the user set
one explicitly (with a warning that it is machine-specific).

Uninstall removes what install adds: our server entry, our hook handlers (found by their
command line), the feature key install added or switched on (marked by a trailing comment), and
containers left empty by that; a file left holding nothing is deleted (after its backup).

Editing rules: a file that does not parse is refused (clear error, nothing written, also not the
other files). JSON files are rewritten from their parsed form (JSON has no comments) in their
own indentation; only our keys change. `config.toml` is edited as text (agent_bridge.tomledit):
tables are appended or removed, keys inserted, replaced or removed in place, so comments and
layout stay; the result must parse to exactly the expected document, else the edit is refused.
Every changed file is backed up to `<file>.agent-bridge-backup-<timestamp>` first.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import json
import os
import re
import shlex
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from agent_bridge import hostconfig, paths
from agent_bridge.tomledit import TomlText, toml_string, toml_value

SERVER_NAME = "agent-bridge"
PATH_COMMAND = "agent-bridge"  # what project-scope files name: found on PATH on every machine
HOOK_TIMEOUT = 10  # seconds the host gives one hook run; ours take well under one
CLAUDE = "claude"
CODEX = "codex"
HOST_TITLES = {CLAUDE: "Claude Code", CODEX: "Codex"}
EVENTS = (("SessionStart", "session-start"), ("Stop", "stop"))
HOOKS_KEY_SINCE = (0, 130, 0)  # Codex renamed [features] codex_hooks to hooks (on by default)
TABLE_MARK = "agent-bridge: added by `agent-bridge install`"  # comment above our [mcp_servers] table
ADDED_MARK = "added by agent-bridge install"  # trailing comment of a feature key install added
SWITCHED_MARK = "switched on by agent-bridge install (was false)"

codex_home = hostconfig.codex_home


class InstallError(Exception):
    """A file we must not or cannot edit. Nothing is written."""


@dataclass
class FileEdit:
    path: Path
    before: str | None  # None: the file does not exist yet
    after: str | None  # None: the file is to be deleted
    notes: list[str] = field(default_factory=list)
    private: bool = True  # a new file gets 0600 (user scope) or 0644 (project files, shared)

    @property
    def changed(self) -> bool:
        return self.before != self.after


# --- what to register -------------------------------------------------------------


def launcher() -> list[str]:
    """How to run the installed agent-bridge, by absolute path.

    The program running now when it is the `agent-bridge` script (the one the user chose);
    else the one on PATH; else this interpreter with `-m agent_bridge`.
    """
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else ""
    if Path(argv0).name in ("agent-bridge", "agent-bridge.exe") and Path(argv0).exists():
        return [str(Path(argv0).absolute())]
    found = shutil.which("agent-bridge")
    if found:
        return [str(Path(found).absolute())]
    return [str(Path(sys.executable).absolute()), "-m", "agent_bridge"]


def run_for_scope(scope: str) -> list[str]:
    """User scope: this machine's absolute path. Project scope: the command on PATH, because the
    files are committed and read on teammates' machines, where this path means nothing."""
    return [PATH_COMMAND] if scope == "project" else launcher()


def bridge_env() -> dict[str, str]:
    """`{"AGENT_BRIDGE_HOME": …}` when it is set and not the default, else {}."""
    explicit = os.environ.get("AGENT_BRIDGE_HOME")
    if not explicit:
        return {}
    chosen = paths.home()
    default = paths.home({k: v for k, v in os.environ.items() if k != "AGENT_BRIDGE_HOME"})
    return {} if chosen == default else {"AGENT_BRIDGE_HOME": str(chosen)}


def hook_command(run: list[str], event_arg: str, agent: str, env: dict[str, str]) -> str:
    """The shell command line of one hook (both hosts run command hooks through a shell)."""
    prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in env.items())
    return prefix + shlex.join([*run, "hook", event_arg, "--agent", agent])


def mcp_args(run: list[str], agent: str) -> tuple[str, list[str]]:
    return run[0], [*run[1:], "mcp", "--agent", agent]


_HOOK_PATTERNS = {
    event_arg: re.compile(rf"agent[-_]bridge\S*\s+hook\s+{event_arg}(\s|$)") for _, event_arg in EVENTS
}


def is_our_hook(command: object, event_arg: str) -> bool:
    return isinstance(command, str) and bool(_HOOK_PATTERNS[event_arg].search(command))


def hooks_feature_key(version: tuple[int, int, int] | None) -> str:
    """The [features] key the installed Codex reads (a current Codex when none is on PATH)."""
    return "codex_hooks" if version is not None and version < HOOKS_KEY_SINCE else "hooks"


# --- config locations -------------------------------------------------------------


@dataclass(frozen=True)
class Locations:
    claude_mcp: Path
    claude_settings: Path
    codex_config: Path
    codex_hooks: Path
    project: bool


def locations(scope: str, cwd: Path | None = None) -> Locations:
    if scope == "project":
        root = (cwd or Path.cwd()).absolute()
        return Locations(
            root / ".mcp.json", root / ".claude" / "settings.json",
            root / ".codex" / "config.toml", root / ".codex" / "hooks.json", True,
        )
    home = Path.home()
    return Locations(
        home / ".claude.json", home / ".claude" / "settings.json",
        codex_home() / "config.toml", codex_home() / "hooks.json", False,
    )


def detected_hosts() -> list[str]:
    """The hosts whose user config folders exist; both when neither does."""
    found = []
    if (Path.home() / ".claude").is_dir() or (Path.home() / ".claude.json").is_file():
        found.append(CLAUDE)
    if codex_home().is_dir():
        found.append(CODEX)
    return found or [CLAUDE, CODEX]


# --- JSON files ---------------------------------------------------------------------

NOTHING_CHANGED = "fix or move it aside and run the command again. Nothing was changed."


def _load(loader: Callable[[Path, str | None], dict[str, Any]], path: Path) -> tuple[str | None, dict[str, Any]]:
    try:
        text = hostconfig.read_text(path)
        return text, loader(path, text)
    except hostconfig.ConfigError as exc:
        raise InstallError(f"{exc}; {NOTHING_CHANGED}") from None


def dump_json_like(data: dict[str, Any], original: str | None) -> str:
    """JSON in the original file's indentation (2 spaces for a new file), ending in a newline."""
    indent: str | int = 2
    if original:
        for line in original.splitlines()[1:]:
            stripped = line.lstrip(" \t")
            if stripped and stripped != line:
                lead = line[: len(line) - len(stripped)]
                indent = "\t" if lead.startswith("\t") else len(lead)
                break
    return json.dumps(data, indent=indent, ensure_ascii=False) + "\n"


def edit_json(path: Path, mutate: Callable[[dict[str, Any], list[str]], None], *, private: bool) -> FileEdit:
    before, data = _load(hostconfig.parse_json_object, path)
    updated = copy.deepcopy(data)
    notes: list[str] = []
    mutate(updated, notes)
    if updated == data:
        return FileEdit(path, before, before, [], private)
    if not updated and before is not None:
        return FileEdit(path, before, None, [*notes, "deleted the file (nothing else was in it)"], private)
    return FileEdit(path, before, dump_json_like(updated, before), notes, private)


def _object_at(data: dict[str, Any], key: str, path: Path) -> dict[str, Any]:
    value = data.setdefault(key, {})
    if not isinstance(value, dict):
        raise InstallError(f'{path}: "{key}" must be a JSON object, found {type(value).__name__}. Nothing was changed.')
    return value


def ensure_json_server(
    data: dict[str, Any], notes: list[str], path: Path, command: str, args: list[str], env: dict[str, str]
) -> None:
    """Claude Code's `mcpServers.agent-bridge` entry (other keys of the entry are kept)."""
    servers = _object_at(data, "mcpServers", path)
    current = servers.get(SERVER_NAME)
    if current is not None and not isinstance(current, dict):
        raise InstallError(f'{path}: the "{SERVER_NAME}" server entry must be an object. Nothing was changed.')
    entry: dict[str, Any] = dict(current or {})
    entry["type"] = "stdio"
    entry["command"] = command
    entry["args"] = list(args)
    merged = _merge_env(entry.get("env"), env, path)
    if merged:
        entry["env"] = merged
    else:
        entry.pop("env", None)
    if current == entry:
        return
    servers[SERVER_NAME] = entry
    notes.append(f'{"added" if current is None else "updated"} MCP server "{SERVER_NAME}"')


def remove_json_server(data: dict[str, Any], notes: list[str], path: Path) -> None:
    servers = data.get("mcpServers")
    if not isinstance(servers, dict) or SERVER_NAME not in servers:
        return
    del servers[SERVER_NAME]
    if not servers:
        del data["mcpServers"]
    notes.append(f'removed MCP server "{SERVER_NAME}"')


def _merge_env(current: object, env: dict[str, str], path: Path) -> dict[str, str]:
    if current is None:
        current = {}
    if not isinstance(current, dict):
        raise InstallError(f'{path}: the "{SERVER_NAME}" server\'s env must be an object. Nothing was changed.')
    merged = {k: v for k, v in current.items() if k != "AGENT_BRIDGE_HOME"}
    merged.update(env)
    return merged


def our_handlers(groups: list[Any], event_arg: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [
        (group, handler)
        for group in groups
        if isinstance(group, dict) and isinstance(group.get("hooks"), list)
        for handler in group["hooks"]
        if isinstance(handler, dict) and is_our_hook(handler.get("command"), event_arg)
    ]


def _drop(groups: list[Any], pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
    """Remove these handlers, and the matcher groups they leave empty."""
    emptied = []
    for group, handler in pairs:
        group["hooks"].remove(handler)
        if not group["hooks"]:
            emptied.append(id(group))
    groups[:] = [g for g in groups if id(g) not in emptied]


def ensure_json_hooks(data: dict[str, Any], notes: list[str], path: Path, commands: dict[str, str]) -> None:
    """`commands`: event name (SessionStart, Stop) -> our command line."""
    hooks = _object_at(data, "hooks", path)
    for event, event_arg in EVENTS:
        groups = hooks.setdefault(event, [])
        if not isinstance(groups, list):
            raise InstallError(f'{path}: "hooks.{event}" must be a list. Nothing was changed.')
        ours = our_handlers(groups, event_arg)
        wanted = commands[event]
        if not ours:
            groups.append({"hooks": [{"type": "command", "command": wanted, "timeout": HOOK_TIMEOUT}]})
            notes.append(f"added {event} hook")
            continue
        _, first = ours[0]
        if first.get("command") != wanted or first.get("type") != "command":
            first["type"] = "command"
            first["command"] = wanted
            notes.append(f"updated {event} hook")
        if ours[1:]:  # one registration is enough: extra ones would run twice
            _drop(groups, ours[1:])
            notes.extend(f"removed a duplicate {event} hook" for _ in ours[1:])


def remove_json_hooks(data: dict[str, Any], notes: list[str], path: Path) -> None:
    hooks = data.get("hooks")
    if not isinstance(hooks, dict):
        return
    for event, event_arg in EVENTS:
        groups = hooks.get(event)
        if not isinstance(groups, list):
            continue
        ours = our_handlers(groups, event_arg)
        if not ours:
            continue
        _drop(groups, ours)
        notes.append(f"removed {event} hook")
        if not groups:
            del hooks[event]
    if not hooks:
        del data["hooks"]


# --- Codex config.toml ----------------------------------------------------------------


def _codex_doc(path: Path) -> tuple[str | None, dict[str, Any], TomlText]:
    before, data = _load(hostconfig.parse_toml, path)
    return before, data, TomlText(before or "")


def _finish_toml(path: Path, before: str | None, doc: TomlText, expected: dict[str, Any], notes: list[str],
                 manual: str, private: bool) -> FileEdit:
    """The edit, after checking that the edited text parses to exactly `expected`."""
    if not notes:
        return FileEdit(path, before, before, [], private)
    after = doc.text
    try:
        result = hostconfig.parse_toml(path, after)
    except hostconfig.ConfigError as exc:
        raise InstallError(f"{path}: editing it would break it ({exc}); {manual}") from None
    if result != expected:
        raise InstallError(f"{path}: cannot edit it without changing other settings; {manual}")
    if not after.strip() and before is not None:
        return FileEdit(path, before, None, [*notes, "deleted the file (nothing else was in it)"], private)
    return FileEdit(path, before, after, notes, private)


def edit_codex_config(
    path: Path, command: str, args: list[str], env: dict[str, str], *, private: bool,
    version: tuple[int, int, int] | None = None,
) -> FileEdit:
    before, data, doc = _codex_doc(path)
    expected = copy.deepcopy(data)
    notes: list[str] = []
    feature = hooks_feature_key(version)
    manual = (
        f'add this to {path} by hand:\n[mcp_servers.{SERVER_NAME}]\ncommand = {toml_string(command)}\n'
        f"args = {toml_value(args)}\n" + (f"env = {toml_value(env)}\n" if env else "")
        + (f"\n[features]\n{feature} = true" if feature == "codex_hooks" else "")
    )

    servers = expected.setdefault("mcp_servers", {})
    if not isinstance(servers, dict):
        raise InstallError(f"{path}: mcp_servers must be a table. Nothing was changed.")
    current = servers.get(SERVER_NAME)
    if current is not None and not isinstance(current, dict):
        raise InstallError(f"{path}: mcp_servers.{SERVER_NAME} must be a table. Nothing was changed.")
    merged_env = _merge_env((current or {}).get("env"), env, path)
    if current is None:
        values: dict[str, object] = {"command": command, "args": args}
        if merged_env:
            values["env"] = merged_env
        doc.append_table(["mcp_servers", SERVER_NAME], values, TABLE_MARK)
        servers[SERVER_NAME] = dict(values)
        notes.append(f'added MCP server "{SERVER_NAME}"')
    elif (current.get("command"), current.get("args"), current.get("env") or {}) != (command, args, merged_env):
        section = doc.section(["mcp_servers", SERVER_NAME])
        if section is None:
            raise InstallError(f"{path}: mcp_servers.{SERVER_NAME} is not a [table] this command can edit; {manual}")
        doc.set_key(section, "command", command)
        section = doc.section(["mcp_servers", SERVER_NAME])
        doc.set_key(section, "args", args)  # type: ignore[arg-type]
        env_section = doc.section(["mcp_servers", SERVER_NAME, "env"])
        if env_section is not None:
            if "AGENT_BRIDGE_HOME" in env:
                doc.set_key(env_section, "AGENT_BRIDGE_HOME", env["AGENT_BRIDGE_HOME"])
            else:
                doc.remove_key(env_section, "AGENT_BRIDGE_HOME")
        else:
            section = doc.section(["mcp_servers", SERVER_NAME])
            if merged_env:
                doc.set_key(section, "env", merged_env)  # type: ignore[arg-type]
            else:
                doc.remove_key(section, "env")  # type: ignore[arg-type]
        entry = dict(current, command=command, args=args)
        if merged_env or env_section is not None:
            entry["env"] = merged_env
        else:
            entry.pop("env", None)
        servers[SERVER_NAME] = entry
        notes.append(f'updated MCP server "{SERVER_NAME}"')
    if not servers and "mcp_servers" not in data:
        del expected["mcp_servers"]

    _ensure_hooks_feature(path, data, expected, doc, notes, feature if version else None, manual)
    return _finish_toml(path, before, doc, expected, notes, manual, private)


def _ensure_hooks_feature(path: Path, data: dict[str, Any], expected: dict[str, Any], doc: TomlText,
                          notes: list[str], feature: str | None, manual: str) -> None:
    """Make the installed Codex run hooks, in the key it reads (see the module docstring).
    `feature` None: the version is unknown (no codex on PATH), so the spelling the user has is
    kept; only a key that switches hooks off is switched on."""
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
    section = doc.section(["features"])
    if section is None and "features" in data:
        raise InstallError(f"{path}: [features] is not a table this command can edit; {manual}")
    if section is None:
        doc.append_table(["features"], {})
        section = doc.section(["features"])
        assert section is not None
    expected["features"] = features
    if deprecated is not None and deprecated in features:
        if feature in features:
            doc.remove_key(section, deprecated)
            notes.append(f"removed the deprecated [features] {deprecated} ({feature} is set)")
        else:
            doc.rename_key(section, deprecated, feature)
            notes.append(f"renamed the deprecated [features] {deprecated} to {feature}")
            features[feature] = features[deprecated]
        del features[deprecated]
        section = doc.section(["features"])
        assert section is not None
    if features.get(feature) is False:
        doc.set_key(section, feature, True, SWITCHED_MARK)
        notes.append(f"turned on hooks: [features] {feature} = true (was false)")
    elif feature not in features:  # only for a Codex that gates hooks behind the flag
        doc.set_key(section, feature, True, ADDED_MARK)
        notes.append(f"turned on hooks: [features] {feature} = true")
    features[feature] = True


def remove_codex_config(path: Path, *, private: bool) -> FileEdit:
    before, data, doc = _codex_doc(path)
    expected = copy.deepcopy(data)
    notes: list[str] = []
    manual = f"remove [mcp_servers.{SERVER_NAME}] from {path} by hand"
    servers = expected.get("mcp_servers")
    if isinstance(servers, dict) and SERVER_NAME in servers:
        tables = doc.tables_under(["mcp_servers", SERVER_NAME])
        if doc.section(["mcp_servers", SERVER_NAME]) is None:
            raise InstallError(f"{path}: mcp_servers.{SERVER_NAME} is not a [table] this command can edit; {manual}")
        for table in reversed(tables):
            doc.remove_section(table, marker=TABLE_MARK)
        del servers[SERVER_NAME]
        if not servers and doc.section(["mcp_servers"]) is None:
            del expected["mcp_servers"]
        notes.append(f'removed MCP server "{SERVER_NAME}"')
    features = expected.get("features")
    section = doc.section(["features"])
    if isinstance(features, dict) and section is not None:
        for key in ("hooks", "codex_hooks"):
            text = doc.key_text(section, key) or ""
            if ADDED_MARK in text:
                doc.remove_key(section, key)
                del features[key]
                notes.append(f"removed [features] {key} (added by install)")
            elif SWITCHED_MARK in text:
                doc.set_key(section, key, False)
                features[key] = False
                notes.append(f"switched [features] {key} back to false")
            section = doc.section(["features"])
            assert section is not None
        if not features and doc.section_is_empty(section) and notes:
            doc.remove_section(section)
            del expected["features"]
    return _finish_toml(path, before, doc, expected, notes, manual, private)


# --- the plan -----------------------------------------------------------------------


def plan(hosts: list[str], scope: str, run: list[str], env: dict[str, str], cwd: Path | None = None,
         codex_version: tuple[int, int, int] | None = None) -> list[FileEdit]:
    """Every file edit the installation needs (unchanged files included). Raises InstallError."""
    where = locations(scope, cwd)
    private = not where.project
    edits: list[FileEdit] = []
    for host in hosts:
        commands = {event: hook_command(run, arg, host, env) for event, arg in EVENTS}
        command, args = mcp_args(run, host)
        if host == CLAUDE:
            server_file, hooks_file = where.claude_mcp, where.claude_settings
            edits.append(
                edit_json(server_file, partial(ensure_json_server, path=server_file, command=command, args=args, env=env),
                          private=private)
            )
        else:
            hooks_file = where.codex_hooks
            edits.append(edit_codex_config(where.codex_config, command, args, env, private=private, version=codex_version))
        edits.append(edit_json(hooks_file, partial(ensure_json_hooks, path=hooks_file, commands=commands), private=private))
    return edits


def removal_plan(hosts: list[str], scope: str, cwd: Path | None = None) -> list[FileEdit]:
    """Every file edit that removes what install added (unchanged files included)."""
    where = locations(scope, cwd)
    private = not where.project
    edits: list[FileEdit] = []
    for host in hosts:
        if host == CLAUDE:
            hooks_file = where.claude_settings
            edits.append(edit_json(where.claude_mcp, partial(remove_json_server, path=where.claude_mcp), private=private))
        else:
            hooks_file = where.codex_hooks
            edits.append(remove_codex_config(where.codex_config, private=private))
        edits.append(edit_json(hooks_file, partial(remove_json_hooks, path=hooks_file), private=private))
    return edits


def backup_path(path: Path) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.localtime())
    return paths.free_path(path.parent, f"{path.name}.agent-bridge-backup-{stamp}")


def apply(edit: FileEdit) -> Path | None:
    """Write (or delete) one file atomically, after backing the old one up. Returns the backup's path."""
    backup = None
    mode = 0o600 if edit.private else 0o644
    if edit.path.exists():
        mode = edit.path.stat().st_mode & 0o7777
        backup = backup_path(edit.path)
        shutil.copy2(edit.path, backup)
    if edit.after is None:
        edit.path.unlink(missing_ok=True)
        return backup
    edit.path.parent.mkdir(parents=True, exist_ok=True)
    tmp = edit.path.with_name(f".{edit.path.name}.agent-bridge-{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(edit.after)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, edit.path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return backup


def unified_diff(edit: FileEdit) -> str:
    old = (edit.before or "").splitlines(keepends=True)
    new = (edit.after or "").splitlines(keepends=True)
    fromfile = str(edit.path) if edit.before is not None else "/dev/null"
    tofile = str(edit.path) if edit.after is not None else "/dev/null"
    return "".join(difflib.unified_diff(old, new, fromfile=fromfile, tofile=tofile))


def _write_all(command: str, edits: list[FileEdit]) -> int:
    for edit in [e for e in edits if e.changed]:
        try:
            backup = apply(edit)
        except OSError as exc:
            print(f"agent-bridge {command}: cannot write {edit.path}: {exc}", file=sys.stderr)
            return 1
        saved = f" (backup: {backup})" if backup else " (new file)"
        print(f"  {edit.path}: {'; '.join(edit.notes)}{saved}")
    for edit in edits:
        if not edit.changed:
            print(f"  {edit.path}: {'already up to date' if command == 'install' else 'nothing of ours'}")
    return 0


def _hosts(ns: argparse.Namespace, default: Callable[[], list[str]]) -> list[str]:
    return [h for h, chosen in ((CLAUDE, ns.claude), (CODEX, ns.codex)) if chosen] or default()


def main(ns: argparse.Namespace) -> int:
    hosts = _hosts(ns, detected_hosts)
    titles = ", ".join(f"{HOST_TITLES[h]} ({ns.scope} scope)" for h in hosts)
    run = run_for_scope(ns.scope)
    env = bridge_env()
    version = hostconfig.codex_version() if CODEX in hosts else None
    try:
        edits = plan(hosts, ns.scope, run, env, codex_version=version)
    except InstallError as exc:
        print(f"agent-bridge install: refused: {exc}", file=sys.stderr)
        return 1
    for warning in scope_warnings(ns.scope, env):
        print(f"agent-bridge install: warning: {warning}", file=sys.stderr)
    changed = [e for e in edits if e.changed]
    if not changed:
        print(f"agent-bridge install: nothing to change; {titles} already set up with {shlex.join(run)}.")
        return 0
    if ns.dry_run:
        print(f"agent-bridge install --dry-run: {titles}; these changes would be made (nothing was written):")
        for edit in changed:
            print(unified_diff(edit), end="")
        return 0
    print(f"agent-bridge install: {titles}, running {shlex.join(run)}")
    if _write_all("install", edits):
        return 1
    print(next_steps(hosts, ns.scope))
    return 0


def scope_warnings(scope: str, env: dict[str, str]) -> list[str]:
    if scope != "project":
        return []
    found = []
    if env:
        found.append(
            f"AGENT_BRIDGE_HOME={env['AGENT_BRIDGE_HOME']} is recorded in the project files; it is a path on this "
            "machine, and every teammate who uses these files gets it too (unset it to write portable files)"
        )
    if shutil.which(PATH_COMMAND) is None:
        found.append(f"`{PATH_COMMAND}` is not on PATH here; the project files name it, so the hosts will not "
                     "find it until it is (install it with pipx, or activate its virtualenv before starting them)")
    return found


def uninstall_main(ns: argparse.Namespace) -> int:
    hosts = _hosts(ns, lambda: [CLAUDE, CODEX])
    titles = ", ".join(f"{HOST_TITLES[h]} ({ns.scope} scope)" for h in hosts)
    try:
        edits = removal_plan(hosts, ns.scope)
    except InstallError as exc:
        print(f"agent-bridge uninstall: refused: {exc}", file=sys.stderr)
        return 1
    changed = [e for e in edits if e.changed]
    if not changed:
        print(f"agent-bridge uninstall: nothing to change; no agent-bridge entries for {titles}.")
        return 0
    if ns.dry_run:
        print(f"agent-bridge uninstall --dry-run: {titles}; these changes would be made (nothing was written):")
        for edit in changed:
            print(unified_diff(edit), end="")
        return 0
    print(f"agent-bridge uninstall: {titles}")
    if _write_all("uninstall", edits):
        return 1
    print("Running sessions keep their MCP server until they restart. Your agent-bridge state folder "
          "(messages, decisions) is untouched.")
    return 0


def next_steps(hosts: list[str], scope: str) -> str:
    lines = ["Next:"]
    if CLAUDE in hosts:
        lines.append(
            "  Claude Code: start a new session (or run /mcp to reconnect); "
            + ("approve the project's .mcp.json server when asked; " if scope == "project" else "")
            + "/hooks lists the SessionStart and Stop hooks."
        )
    if CODEX in hosts:
        lines.append(
            "  Codex: start a new session; review and trust the new hooks with /hooks when Codex asks"
            + ("; project config is read only in a trusted project" if scope == "project" else "")
            + "."
        )
    lines.append("  Check everything with: agent-bridge doctor")
    return "\n".join(lines)
