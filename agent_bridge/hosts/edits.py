"""The edits install and uninstall make to the hosts' configuration files, shared by the host
modules (agent_bridge/hosts/claude.py, codex.py): what is registered (the MCP server's command
line, the hook command lines and how to recognise ours), the JSON edits, and the record of the
empty containers install filled. The TOML edits are in hosts.tomledit, on top of this module.

Editing rules: a file that does not parse is refused (clear error, nothing written, also not the
other files). JSON files are edited in place (agent_bridge.hosts.jsonedit): only the values that change
are written, in the file's own layout, and everything else stays byte for byte. TOML files are
edited with tomlkit (format-preserving, hosts.tomledit): tables are appended or removed, keys set,
renamed or removed in place, so comments and layout stay. Either way the result must parse to exactly
the expected document, else the edit is refused.

Beneath the host modules: it imports no host module and not the registry (agent_bridge.hosts),
so the host modules, install and doctor (through hosts.checks) all import it, and nothing imports
back.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from agent_bridge.common import paths
from agent_bridge.hosts import hostconfig, jsonedit

SERVER_NAME = "agent-bridge"
HOOK_TIMEOUT = 10  # seconds the host gives one hook run; ours take well under one
# The hook events install registers (host event name, `agent-bridge hook` argument). PostToolUse
# is SPEC §3 "Reach" item 1; an install from before it has only the other two, and doctor says so.
EVENTS = (("SessionStart", "session-start"), ("PostToolUse", "post-tool-use"), ("Stop", "stop"))
REQUIRED_EVENTS = ("SessionStart", "Stop")  # without these the bridge's hooks do not work at all
# A host may register more hooks (`Host.extra_hooks`): Claude Code's idle-wake waiter, a second
# Stop handler. Uninstall removes every one of these, whichever host and version added it.
WAKE = ("Stop", "wake")
PROMPT = ("UserPromptSubmit", "user-prompt-submit")  # marks a turn's start for the waiter
INTERRUPT = ("Interrupt", "interrupt")  # Codex: a turn cut short marks the session idle
ALL_HOOKS = (*EVENTS, WAKE, PROMPT, INTERRUPT)


JsonPath = tuple[str, ...]  # keys from the document's root to a value
RECORD = "install-record.json"  # in the state folder: the empty containers install filled, per file


class InstallError(Exception):
    """A file we must not or cannot edit. Nothing is written."""


@dataclass
class FileEdit:
    path: Path
    before: str | None  # None: the file does not exist yet
    after: str | None  # None: the file is to be deleted
    notes: list[str] = field(default_factory=list)
    private: bool = True  # a new file gets 0600 (user scope) or 0644 (project files, shared)
    # containers install filled (agent_bridge.cli.install's docstring)
    was_empty: list[JsonPath] = field(default_factory=list)
    exact: bool = False  # `before`/`after` keep the file's own line ends (JSON edited in place)
    # folders to remove, innermost first, when deleting this file leaves them empty (a command
    # file's folders, which install made)
    prune: tuple[Path, ...] = ()

    @property
    def changed(self) -> bool:
        return self.before != self.after


# --- what to register -------------------------------------------------------------


def bridge_env() -> dict[str, str]:
    """`{"AGENT_BRIDGE_HOME": …}` when it is set and not the default, else {}."""
    explicit = os.environ.get("AGENT_BRIDGE_HOME")
    if not explicit:
        return {}
    chosen = paths.home()
    default = paths.home({k: v for k, v in os.environ.items() if k != "AGENT_BRIDGE_HOME"})
    return {} if chosen == default else {"AGENT_BRIDGE_HOME": str(chosen)}


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


def hook_command(run: list[str], event_arg: str, agent: str, env: dict[str, str]) -> str:
    """The shell command line of one hook (both hosts run command hooks through a shell). The
    PostToolUse hook, which runs after every tool call, is this interpreter running
    `hooks/quick.py` without `site` where `run` names this machine's agent-bridge by absolute
    path (user scope); a project's files name the command on PATH."""
    prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in env.items())
    if event_arg == "post-tool-use" and Path(run[0]).is_absolute():
        script = str((Path(__file__).parent.parent / "hooks" / "quick.py").absolute())
        return prefix + shlex.join([sys.executable, "-I", "-S", script, event_arg, "--agent", agent])
    return prefix + shlex.join([*run, "hook", event_arg, "--agent", agent])


def mcp_command(bridge: list[str]) -> list[str]:
    """A job's MCP server command line, from `bridge` (`[agent-bridge, "mcp", ...]`). Where
    `bridge` names this machine's agent-bridge by absolute path (the broker's launcher), on
    POSIX: this interpreter running `relay/quick.py` without `site`, which answers the handshake
    the job's host waits for before anything else is imported, then runs the relay."""
    if os.name != "posix" or not Path(bridge[0]).is_absolute() or "mcp" not in bridge:
        return bridge
    script = str((Path(__file__).parent.parent / "relay" / "quick.py").absolute())
    return [sys.executable, "-I", "-S", script, *bridge[bridge.index("mcp"):]]


def mcp_args(run: list[str], agent: str) -> tuple[str, list[str]]:
    return run[0], [*run[1:], "mcp", "--agent", agent]


_HOOK_PATTERNS = {
    event_arg: re.compile(
        rf"(agent[-_]bridge\S*\s+hook|agent_bridge[/\\\\]hooks[/\\\\]quick\.py'?)\s+{event_arg}(\s|$)"
    )
    for _, event_arg in ALL_HOOKS
}


def is_our_hook(command: object, event_arg: str) -> bool:
    return isinstance(command, str) and bool(_HOOK_PATTERNS[event_arg].search(command))


# --- JSON files ---------------------------------------------------------------------

NOTHING_CHANGED = "fix or move it aside and run the command again. Nothing was changed."


def read_config(
    loader: Callable[[Path, str | None], dict[str, Any]], path: Path
) -> tuple[str | None, dict[str, Any]]:
    """A host's configuration file: its text (None when there is none yet) and what `loader` parses
    it to. A file that cannot be read or parsed is refused (InstallError)."""
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


def _read_exact(path: Path) -> str | None:
    """The file's text with its own line ends (CRLF stays CRLF), or None when it does not exist."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise InstallError(f"cannot read {path}: {exc}; {NOTHING_CHANGED}") from None


def edit_json(path: Path, mutate: Callable[[dict[str, Any], list[str]], None], *, private: bool) -> FileEdit:
    before = _read_exact(path)
    try:
        data = hostconfig.parse_json_object(path, before)
    except hostconfig.ConfigError as exc:
        raise InstallError(f"{exc}; {NOTHING_CHANGED}") from None
    updated = copy.deepcopy(data)
    notes: list[str] = []
    mutate(updated, notes)
    restored = _restore_empty(path, data, updated)
    if updated == data:
        return FileEdit(path, before, before, [], private, exact=True)
    if not updated and before is not None and not restored:
        return FileEdit(
            path, before, None, [*notes, "deleted the file (nothing else was in it)"], private, exact=True
        )
    filled = filled_empty(data, updated) if before is not None and before.strip() else []  # a new file: none
    return FileEdit(path, before, json_text(path, before, data, updated), notes, private, filled, exact=True)


def json_text(path: Path, before: str | None, data: dict[str, Any], updated: dict[str, Any]) -> str:
    """The file's new text: `before` edited in place, or for a new (or blank) file, indented JSON."""
    if before is None or not before.strip():
        return dump_json_like(updated, before)
    try:
        after = jsonedit.rewrite(before, data, updated)
        if json.loads(after) == updated:
            return after
    except (jsonedit.EditError, ValueError, RecursionError):
        pass
    return dump_json_like(updated, before)  # a layout the in-place editor cannot follow: the old way


def filled_empty(data: Any, updated: Any, at: JsonPath = ()) -> list[JsonPath]:
    """The paths of the objects and lists that were empty in `data` and hold something in `updated`."""
    if isinstance(data, dict) and isinstance(updated, dict):
        if not data and updated:
            return [at]
        return [p for k, v in data.items() if k in updated for p in filled_empty(v, updated[k], (*at, k))]
    if isinstance(data, list) and isinstance(updated, list) and not data and updated:
        return [at]
    return []


def _restore_empty(path: Path, data: dict[str, Any], updated: dict[str, Any]) -> bool:
    """Put back the containers install found empty (install-record.json) that removing our entries
    dropped as emptied; True when the file itself was one (it is kept, holding `{}`)."""
    restored = False
    for at in sorted(read_record().get(str(path), []), key=len):
        if not at:
            restored = not updated  # the file was `{}`: it stays so
            continue
        old = _get(data, at)
        if not isinstance(old, (dict, list)) or _get(updated, at) is not None:
            continue  # gone before uninstall, or still there (holding something else)
        parent = updated
        for key in at[:-1]:
            if not isinstance(parent.get(key), dict):
                parent[key] = {}
            parent = parent[key]
        parent[at[-1]] = type(old)()
    return restored


def _get(doc: Any, at: JsonPath) -> Any:
    for key in at:
        if not isinstance(doc, dict) or key not in doc:
            return None
        doc = doc[key]
    return doc


def record_path() -> Path:
    return paths.home() / RECORD


def owned_file_edit(path: Path, text: str | None, is_ours: Callable[[str], bool], *, private: bool,
                    prune: tuple[Path, ...] = ()) -> FileEdit:
    """A whole file that is ours (a slash command's): written as `text`, or deleted when `text` is
    None. A file at `path` that is not ours is refused by install and left alone by uninstall."""
    before = _read_exact(path)
    if before is not None and not is_ours(before):
        if text is None:
            return FileEdit(path, before, before, [], private, exact=True)
        raise InstallError(
            f"{path} exists and is not one agent-bridge wrote; move it away and run install again"
        )
    notes = ["removed our slash command" if text is None else
             "added our slash command" if before is None else "updated our slash command"]
    return FileEdit(path, before, text, notes, private, exact=True, prune=prune)


def read_record() -> dict[str, list[JsonPath]]:
    """File path -> the containers install found empty and filled (missing or unreadable: none)."""
    try:
        raw = json.loads(record_path().read_text(encoding="utf-8"))
        return {str(f): [tuple(p) for p in ps if isinstance(p, list) and all(isinstance(k, str) for k in p)]
                for f, ps in raw.get("files", {}).items() if isinstance(ps, list)}
    except (OSError, ValueError, AttributeError, TypeError):
        return {}


def write_record(command: str, edits: list[FileEdit]) -> None:
    """After the edits are written: install adds what it filled; uninstall forgets its files."""
    record = read_record()
    for edit in edits:
        if not edit.changed:
            continue
        key = str(edit.path)
        if command == "uninstall":
            record.pop(key, None)
        elif edit.was_empty:
            record[key] = sorted(set(record.get(key, [])) | set(edit.was_empty))
    _write_raw(command, {**_read_raw(), "files": {f: [list(p) for p in ps] for f, ps in record.items()}})


def _read_raw() -> dict[str, Any]:
    try:
        raw = json.loads(record_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


def _write_raw(command: str, raw: dict[str, Any]) -> None:
    try:
        home = paths.ensure_home(paths.home())
        paths.write_private(home / RECORD, json.dumps(raw, ensure_ascii=False, indent=2) + "\n")
    except OSError as exc:
        print(f"agent-bridge {command}: warning: cannot write {record_path()}: {exc}", file=sys.stderr)


def read_record_key(key: str) -> dict[str, Any]:
    """The record's object under `key` beside "files" (the plugin install's: hosts.plugin_install)."""
    value = _read_raw().get(key)
    return value if isinstance(value, dict) else {}


def write_record_key(key: str, value: dict[str, Any]) -> None:
    raw = _read_raw()
    if value:
        raw[key] = value
    else:
        raw.pop(key, None)
    _write_raw("install", raw)


def _object_at(data: dict[str, Any], key: str, path: Path) -> dict[str, Any]:
    value = data.setdefault(key, {})
    if not isinstance(value, dict):
        raise InstallError(
            f'{path}: "{key}" must be a JSON object, found {type(value).__name__}. Nothing was changed.'
        )
    return value


def ensure_json_server(
    data: dict[str, Any], notes: list[str], path: Path, command: str, args: list[str], env: dict[str, str]
) -> None:
    """Claude Code's `mcpServers.agent-bridge` entry (other keys of the entry are kept)."""
    servers = _object_at(data, "mcpServers", path)
    current = servers.get(SERVER_NAME)
    if current is not None and not isinstance(current, dict):
        raise InstallError(
            f'{path}: the "{SERVER_NAME}" server entry must be an object. Nothing was changed.'
        )
    entry: dict[str, Any] = dict(current or {})
    entry["type"] = "stdio"
    entry["command"] = command
    entry["args"] = list(args)
    merged = merge_env(entry.get("env"), env, path)
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


def merge_env(current: object, env: dict[str, str], path: Path) -> dict[str, str]:
    if current is None:
        current = {}
    if not isinstance(current, dict):
        raise InstallError(
            f'{path}: the "{SERVER_NAME}" server\'s env must be an object. Nothing was changed.'
        )
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


def ensure_json_hooks(data: dict[str, Any], notes: list[str], path: Path,
                      entries: list[tuple[str, str, str, dict[str, Any]]]) -> None:
    """`entries`: (event, hook argument, our command line, more handler keys) per hook. No
    matcher: SessionStart then runs for every source (startup, resume, clear, compact) and
    PostToolUse after every tool, on both hosts."""
    hooks = _object_at(data, "hooks", path)
    for event, event_arg, wanted, keys in entries:
        groups = hooks.setdefault(event, [])
        if not isinstance(groups, list):
            raise InstallError(f'{path}: "hooks.{event}" must be a list. Nothing was changed.')
        what = f"{event} hook" if (event, event_arg) != WAKE else f"{event} hook ({event_arg})"
        ours = our_handlers(groups, event_arg)
        if not ours:
            groups.append(
                {"hooks": [{"type": "command", "command": wanted, "timeout": HOOK_TIMEOUT, **keys}]}
            )
            notes.append(f"added {what}")
            continue
        _, first = ours[0]
        if first.get("command") != wanted or first.get("type") != "command" or any(
                first.get(k) != v for k, v in keys.items()):
            first["type"] = "command"
            first["command"] = wanted
            first.update(keys)
            notes.append(f"updated {what}")
        if ours[1:]:  # one registration is enough: extra ones would run twice
            _drop(groups, ours[1:])
            notes.extend(f"removed a duplicate {what}" for _ in ours[1:])


def hooks_edit(path: Path, run: list[str], agent: str, env: dict[str, str], *, private: bool,
               extra: tuple[tuple[str, str, dict[str, Any]], ...] = ()) -> FileEdit:
    """Register our hooks (EVENTS, then the host's `extra`: (event, hook argument, more handler
    keys)) for `agent` in the JSON hooks file `path` (the event -> matcher group -> handler form
    Claude Code and Codex share)."""
    entries: list[tuple[str, str, str, dict[str, Any]]] = [
        (event, arg, hook_command(run, arg, agent, env), {}) for event, arg in EVENTS]
    entries += [(event, arg, hook_command(run, arg, agent, env), dict(keys)) for event, arg, keys in extra]
    return edit_json(path, partial(ensure_json_hooks, path=path, entries=entries), private=private)


def hooks_removal(path: Path, *, private: bool) -> FileEdit:
    return edit_json(path, partial(remove_json_hooks, path=path), private=private)


def remove_json_hooks(data: dict[str, Any], notes: list[str], path: Path) -> None:
    hooks = data.get("hooks")
    if not isinstance(hooks, dict):
        return
    for event, event_arg in ALL_HOOKS:
        groups = hooks.get(event)
        if not isinstance(groups, list):
            continue
        ours = our_handlers(groups, event_arg)
        if not ours:
            continue
        _drop(groups, ours)
        notes.append(
            f"removed {event} hook" if (event, event_arg) != WAKE else f"removed {event} hook ({event_arg})"
        )
        if not groups:
            del hooks[event]
    if not hooks:
        del data["hooks"]
