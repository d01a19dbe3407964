"""`agent-bridge install [--claude] [--codex] [--scope user|project] [--dry-run]` (issue 5 point 4).

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
  `type`, `command`, `timeout`; codex-rs/config HookHandlerConfig). Hooks sit behind
  `[features] codex_hooks = true` in config.toml on the versions that need the flag; newer
  versions turn hooks on by default and read `hooks` as the canonical key and `codex_hooks` as
  its alias, so `codex_hooks = true` works on both.

Editing rules: a file that does not parse is refused (clear error, nothing written, also not the
other files). JSON files are rewritten from their parsed form (JSON has no comments) in their
own indentation; only our keys change. `config.toml` is edited as text (there is no TOML writer
in the standard library): tables are appended, keys inserted or replaced in place, so comments
and layout stay; the result must parse to exactly the old document plus our keys, else the edit
is refused. Every changed file is backed up to `<file>.agent-bridge-backup-<timestamp>` first.
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
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from agent_bridge import paths

SERVER_NAME = "agent-bridge"
HOOK_TIMEOUT = 10  # seconds the host gives one hook run; ours take well under one
CLAUDE = "claude"
CODEX = "codex"
HOST_TITLES = {CLAUDE: "Claude Code", CODEX: "Codex"}
EVENTS = (("SessionStart", "session-start"), ("Stop", "stop"))


class InstallError(Exception):
    """A file we must not or cannot edit. Nothing is written."""


@dataclass
class FileEdit:
    path: Path
    before: str | None  # None: the file does not exist yet
    after: str
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


# --- config locations -------------------------------------------------------------


@dataclass(frozen=True)
class Locations:
    claude_mcp: Path
    claude_settings: Path
    codex_config: Path
    codex_hooks: Path
    project: bool


def codex_home() -> Path:
    """`$CODEX_HOME`, default `~/.codex` (openai/codex docs/config.md)."""
    explicit = os.environ.get("CODEX_HOME")
    return Path(explicit).expanduser() if explicit else Path.home() / ".codex"


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


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise InstallError(f"cannot read {path}: {exc}") from None


def load_json_object(path: Path, text: str | None) -> dict[str, Any]:
    if text is None or not text.strip():
        return {}
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InstallError(
            f"{path} is not valid JSON ({exc}); fix or move it aside and run install again. Nothing was changed."
        ) from None
    if not isinstance(data, dict):
        raise InstallError(f"{path} must hold a JSON object, found {type(data).__name__}. Nothing was changed.")
    return data


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
    before = read_text(path)
    data = load_json_object(path, before)
    updated = copy.deepcopy(data)
    notes: list[str] = []
    mutate(updated, notes)
    if updated == data and before is not None:
        return FileEdit(path, before, before, [], private)
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


def _merge_env(current: object, env: dict[str, str], path: Path) -> dict[str, str]:
    if current is None:
        current = {}
    if not isinstance(current, dict):
        raise InstallError(f'{path}: the "{SERVER_NAME}" server\'s env must be an object. Nothing was changed.')
    merged = {k: v for k, v in current.items() if k != "AGENT_BRIDGE_HOME"}
    merged.update(env)
    return merged


def ensure_json_hooks(data: dict[str, Any], notes: list[str], path: Path, commands: dict[str, str]) -> None:
    """`commands`: event name (SessionStart, Stop) -> our command line."""
    hooks = _object_at(data, "hooks", path)
    for event, event_arg in EVENTS:
        groups = hooks.setdefault(event, [])
        if not isinstance(groups, list):
            raise InstallError(f'{path}: "hooks.{event}" must be a list. Nothing was changed.')
        ours = [
            (group, handler)
            for group in groups
            if isinstance(group, dict) and isinstance(group.get("hooks"), list)
            for handler in group["hooks"]
            if isinstance(handler, dict) and is_our_hook(handler.get("command"), event_arg)
        ]
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
        emptied = []
        for group, handler in ours[1:]:  # one registration is enough: extra ones would run twice
            group["hooks"].remove(handler)
            notes.append(f"removed a duplicate {event} hook")
            if not group["hooks"]:
                emptied.append(id(group))
        groups[:] = [g for g in groups if id(g) not in emptied]


# --- TOML (Codex config.toml) ---------------------------------------------------------

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_HEADER = re.compile(r"^\s*(\[\[?)\s*(?P<key>[^\]#]*?)\s*(\]\]?)\s*(#.*)?$")
_KEY_LINE = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z0-9_-]+|\"[^\"]*\"|'[^']*')\s*=")


def toml_string(value: str) -> str:
    """A TOML basic string (JSON escapes are valid TOML escapes; DEL must be escaped too)."""
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def toml_key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else toml_string(key)


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }" if value else "{}"
    raise InstallError(f"cannot write a TOML value of type {type(value).__name__}")


def parse_dotted_key(text: str) -> list[str] | None:
    """`mcp_servers."agent-bridge"` -> ["mcp_servers", "agent-bridge"]; None if not a plain key."""
    parts: list[str] = []
    rest = text.strip()
    while rest:
        if rest[0] in "\"'":
            end = rest.find(rest[0], 1)
            if end < 0:
                return None
            raw = rest[: end + 1]
            try:
                parts.append(tomllib.loads(f"k = {raw}")["k"])
            except tomllib.TOMLDecodeError:
                return None
            rest = rest[end + 1 :].lstrip()
        else:
            match = _BARE_KEY.match(rest)
            if not match:
                return None
            parts.append(match.group(0))
            rest = rest[match.end() :].lstrip()
        if rest.startswith("."):
            rest = rest[1:].lstrip()
        elif rest:
            return None
    return parts


class TomlText:
    """Minimal, layout-preserving edits of a TOML document's lines."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines(keepends=True)
        if self.lines and not self.lines[-1].endswith("\n"):
            self.lines[-1] += "\n"

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def _headers(self) -> list[tuple[int, list[str] | None]]:
        """Table headers (line, key path; None for `[[array tables]]`), skipping the lines of
        multi-line values, which may look like headers."""
        found = []
        i = 0
        while i < len(self.lines):
            if _KEY_LINE.match(self.lines[i]):
                i = self._value_end(i, len(self.lines))
                continue
            m = _HEADER.match(self.lines[i])
            if m:
                found.append((i, parse_dotted_key(m.group("key")) if m.group(1) == "[" else None))
            i += 1
        return found

    def section(self, key: list[str]) -> tuple[int, int] | None:
        """(header line, end line exclusive) of the standard table `[key]`, or None."""
        headers = self._headers()
        for n, (i, path) in enumerate(headers):
            if path == key:
                end = headers[n + 1][0] if n + 1 < len(headers) else len(self.lines)
                return i, end
        return None

    def _value_end(self, start: int, stop: int) -> int:
        """The line after the key/value pair that starts at `start` (multi-line arrays too)."""
        for end in range(start + 1, stop + 1):
            try:
                tomllib.loads("".join(self.lines[start:end]))
                return end
            except tomllib.TOMLDecodeError:
                continue
        return start + 1

    def find_key(self, section: tuple[int, int], key: str) -> tuple[int, int] | None:
        start, stop = section
        i = start + 1
        while i < stop:
            m = _KEY_LINE.match(self.lines[i])
            if m:
                end = self._value_end(i, stop)
                if parse_dotted_key(m.group("key")) == [key]:
                    return i, end
                i = end
            else:
                i += 1
        return None

    def set_key(self, section: tuple[int, int], key: str, value: object) -> None:
        line = f"{toml_key(key)} = {toml_value(value)}\n"
        found = self.find_key(section, key)
        if found is not None:
            indent = _KEY_LINE.match(self.lines[found[0]]).group("indent")  # type: ignore[union-attr]
            self.lines[found[0] : found[1]] = [indent + line]
            return
        self.lines.insert(self._insert_at(section), line)

    def remove_key(self, section: tuple[int, int], key: str) -> None:
        found = self.find_key(section, key)
        if found is not None:
            del self.lines[found[0] : found[1]]

    def _insert_at(self, section: tuple[int, int]) -> int:
        """After the section's last key/value pair (trailing blank and comment lines stay below)."""
        start, stop = section
        at = start + 1
        i = start + 1
        while i < stop:
            if _KEY_LINE.match(self.lines[i]):
                i = self._value_end(i, stop)
                at = i
            else:
                i += 1
        return at

    def append_table(self, key: list[str], values: dict[str, object], comment: str | None = None) -> None:
        block = []
        if self.lines and self.lines[-1].strip():
            block.append("\n")
        if comment:
            block.append(f"# {comment}\n")
        block.append("[" + ".".join(toml_key(k) for k in key) + "]\n")
        block.extend(f"{toml_key(k)} = {toml_value(v)}\n" for k, v in values.items())
        self.lines.extend(block)


def edit_codex_config(path: Path, command: str, args: list[str], env: dict[str, str], *, private: bool) -> FileEdit:
    before = read_text(path)
    text = before or ""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InstallError(
            f"{path} is not valid TOML ({exc}); fix or move it aside and run install again. Nothing was changed."
        ) from None
    expected = copy.deepcopy(data)
    doc = TomlText(text)
    notes: list[str] = []
    manual = (
        f'add this to {path} by hand:\n[mcp_servers.{SERVER_NAME}]\ncommand = {toml_string(command)}\n'
        f"args = {toml_value(args)}\n" + (f"env = {toml_value(env)}\n" if env else "") + "\n[features]\ncodex_hooks = true"
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
        doc.append_table(["mcp_servers", SERVER_NAME], values, "agent-bridge: added by `agent-bridge install`")
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

    features = expected.setdefault("features", {})
    if not isinstance(features, dict):
        raise InstallError(f"{path}: features must be a table. Nothing was changed.")
    switched_off = [k for k in ("hooks", "codex_hooks") if features.get(k) is False]
    if switched_off or not (features.get("hooks") is True or features.get("codex_hooks") is True):
        section = doc.section(["features"])
        if section is None and "features" in data:
            raise InstallError(f"{path}: [features] is not a table this command can edit; {manual}")
        if section is None:
            doc.append_table(["features"], {"codex_hooks": True})
        for key in switched_off or ["codex_hooks"]:
            section = doc.section(["features"])
            doc.set_key(section, key, True)  # type: ignore[arg-type]
            features[key] = True
        notes.append("turned on hooks: [features] " + ", ".join(f"{k} = true" for k in switched_off or ["codex_hooks"]))

    after = doc.text if notes else (before or "")
    if notes:
        try:
            result = tomllib.loads(after)
        except tomllib.TOMLDecodeError as exc:
            raise InstallError(f"{path}: editing it would break it ({exc}); {manual}") from None
        if result != expected:
            raise InstallError(f"{path}: cannot edit it without changing other settings; {manual}")
    return FileEdit(path, before, after, notes, private)


# --- the plan -----------------------------------------------------------------------


def plan(hosts: list[str], scope: str, run: list[str], env: dict[str, str], cwd: Path | None = None) -> list[FileEdit]:
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
            edits.append(edit_codex_config(where.codex_config, command, args, env, private=private))
        edits.append(edit_json(hooks_file, partial(ensure_json_hooks, path=hooks_file, commands=commands), private=private))
    return edits


def backup_path(path: Path) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.localtime())
    return paths.free_path(path.parent, f"{path.name}.agent-bridge-backup-{stamp}")


def apply(edit: FileEdit) -> Path | None:
    """Write one edit atomically, after backing the old file up. Returns the backup's path."""
    backup = None
    mode = 0o600 if edit.private else 0o644
    if edit.path.exists():
        mode = edit.path.stat().st_mode & 0o7777
        backup = backup_path(edit.path)
        shutil.copy2(edit.path, backup)
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
    new = edit.after.splitlines(keepends=True)
    fromfile = str(edit.path) if edit.before is not None else "/dev/null"
    return "".join(difflib.unified_diff(old, new, fromfile=fromfile, tofile=str(edit.path)))


def main(ns: argparse.Namespace) -> int:
    hosts = [h for h, chosen in ((CLAUDE, ns.claude), (CODEX, ns.codex)) if chosen] or detected_hosts()
    titles = ", ".join(f"{HOST_TITLES[h]} ({ns.scope} scope)" for h in hosts)
    run = launcher()
    env = bridge_env()
    try:
        edits = plan(hosts, ns.scope, run, env)
    except InstallError as exc:
        print(f"agent-bridge install: refused: {exc}", file=sys.stderr)
        return 1
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
    for edit in changed:
        try:
            backup = apply(edit)
        except OSError as exc:
            print(f"agent-bridge install: cannot write {edit.path}: {exc}", file=sys.stderr)
            return 1
        saved = f" (backup: {backup})" if backup else " (new file)"
        print(f"  {edit.path}: {'; '.join(edit.notes)}{saved}")
    for edit in edits:
        if not edit.changed:
            print(f"  {edit.path}: already up to date")
    print(next_steps(hosts, ns.scope))
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
