"""The checks of a host's registration that `agent-bridge doctor` shares between the host modules:
reading the host's files, our hooks and MCP server entry found in them, whether the programs they
name run and for which state folder, the same hooks at two scopes, the ways of reach (SPEC §3).
Each host module builds its `Host.doctor_checks` from these; the files are read through
agent_bridge.hosts.hostconfig.

Beneath the host modules, like hosts.edits (whose registrations these recognise): it imports no
host module and not the registry.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

from agent_bridge.hosts import hostconfig
from agent_bridge.hosts.base import FAIL, OK, WARN, Check
from agent_bridge.hosts.edits import (
    EVENTS,
    PROMPT,
    REQUIRED_EVENTS,
    SERVER_NAME,
    WAKE,
    bridge_env,
    is_our_hook,
    our_handlers,
)

SERVER = SERVER_NAME

def load_json(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(data, None); (None, None) when the file does not exist; (None, why) when it cannot be used."""
    try:
        text = hostconfig.read_text(path)
        return (None, None) if text is None else (hostconfig.parse_json_object(path, text), None)
    except hostconfig.ConfigError as exc:
        return None, str(exc)


def load_toml(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    try:
        text = hostconfig.read_text(path)
        return (None, None) if text is None else (hostconfig.parse_toml(path, text), None)
    except hostconfig.ConfigError as exc:
        return None, str(exc)


def _program_problem(command: object) -> str | None:
    """Why the registered program cannot run, or None."""
    if not isinstance(command, str) or not command:
        return "it names no program"
    if os.sep in command or (os.altsep and os.altsep in command):
        if not os.path.isfile(command) or not os.access(command, os.X_OK):
            return f"{command} does not exist or is not executable"
        return None
    import shutil

    return None if shutil.which(command) else f"{command} is not on PATH"


def _hook_program(command: str) -> str:
    """The program of a hook command line (after any VAR=value prefixes)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return ""
    for word in words:
        if "=" in word.split("/", 1)[0]:
            continue
        return word
    return ""


def _hook_home(command: str) -> str | None:
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    for word in words:
        if word.startswith("AGENT_BRIDGE_HOME="):
            return word.split("=", 1)[1]
        if "=" not in word.split("/", 1)[0]:
            return None
    return None


def _home_problem(registered: str | None, home: Path, what: str) -> str | None:
    """A registration pinned to another state folder than the one doctor checks."""
    if registered is None:
        return None
    if Path(registered).expanduser().absolute() != home:
        return f"{what} uses AGENT_BRIDGE_HOME={registered}, but this home is {home}"
    return None


def _find_hooks(files: list[Path], errors: list[str]) -> dict[str, tuple[Path, str]]:
    """Event -> (file, command) of our hooks found in `files` (hooks objects of those files)."""
    found: dict[str, tuple[Path, str]] = {}
    for path in files:
        data, error = load_json(path)
        if error:
            errors.append(error)
        if not data or not isinstance(data.get("hooks"), dict):
            continue
        for event, event_arg in EVENTS:
            for group in data["hooks"].get(event) or ():
                if not isinstance(group, dict):
                    continue
                for handler in group.get("hooks") or ():
                    if isinstance(handler, dict) and is_our_hook(handler.get("command"), event_arg):
                        found.setdefault(event, (path, handler["command"]))
    return found


def hooks_check(name: str, files: list[Path], home: Path, fix: str) -> Check:
    errors: list[str] = []
    found = _find_hooks(files, errors)
    if errors:
        return Check(name, FAIL, "; ".join(errors), "fix the file by hand, then: " + fix)
    missing = [event for event, _ in EVENTS if event not in found]
    required = [event for event in missing if event in REQUIRED_EVENTS]
    looked = f"(looked in {', '.join(map(str, files))})"
    if required:
        return Check(name, FAIL, f"{' and '.join(required)} hook not registered {looked}", fix)
    for event, (path, command) in found.items():
        problem = _program_problem(_hook_program(command)) or _home_problem(
            _hook_home(command), home, f"the {event} hook"
        )
        if problem:
            return Check(name, FAIL, f"{event} hook in {path}: {problem}", fix)
    where = sorted({str(p) for p, _ in found.values()})
    if missing:  # an install from before PostToolUse: it works, but messages wait for the turn's end
        return Check(
            name,
            WARN,
            f"{', '.join(sorted(found))} registered in {', '.join(where)}; {' and '.join(missing)} "
            f"not {looked}: messages reach a working session only when its turn ends",
            fix,
        )
    return Check(name, OK, f"{', '.join(event for event, _ in EVENTS)} registered in {', '.join(where)}")


def registered_events(files: list[Path]) -> set[str]:
    """The host events (EVENTS) whose agent-bridge hook is registered in any of `files`,
    plus "wake" and "user-prompt-submit" when the idle-wake waiter's hooks (WAKE,
    PROMPT) are."""
    found = set(_find_hooks(files, []))
    for event, arg in (WAKE, PROMPT):
        for path in files:
            data, _ = load_json(path)
            groups = (
                data.get("hooks", {}).get(event) if data and isinstance(data.get("hooks"), dict) else None
            )
            if isinstance(groups, list) and our_handlers(groups, arg):
                found.add(arg)
    return found


def reach_check(title: str, registered: set[str], stop: str, wake: str) -> Check:
    """Which of the ways of SPEC §3 "Reach" the installed setup of one host will use: 1 between
    tool calls (PostToolUse), 2 at Stop (`stop`: how), 3 when idle (`wake`: how, or why not), 4
    at SessionStart, compaction included."""
    parts = [
        "1 between tool calls: "
        + ("PostToolUse hook" if "PostToolUse" in registered else "no (PostToolUse hook missing)"),
        "2 at Stop: " + (stop if "Stop" in registered else "no (Stop hook missing)"),
        "3 when idle: " + wake,
        "4 at start, resume, compaction: "
        + ("SessionStart hook" if "SessionStart" in registered else "no (SessionStart hook missing)"),
    ]
    missing = not {"PostToolUse", "Stop", "SessionStart"} <= registered
    return Check(f"{title} reach", WARN if missing else OK, "; ".join(parts),
                 "agent-bridge install" if missing else "")


def our_hook_commands(files: list[Path]) -> dict[str, list[tuple[Path, str]]]:
    """Event -> (file, command line) of each of our hooks registered in those files."""
    found: dict[str, list[tuple[Path, str]]] = {}
    for path in files:
        data, _ = load_json(path)
        hooks = data.get("hooks") if data else None
        if not isinstance(hooks, dict):
            continue
        for event, event_arg in EVENTS:
            groups = hooks.get(event)
            if isinstance(groups, list):
                found.setdefault(event, []).extend(
                    (path, h["command"]) for _, h in our_handlers(groups, event_arg)
                )
    return found


def duplicate_hooks(
    user_files: list[Path], project_files: list[Path], *, same_command_runs_once: bool
) -> list[str]:
    """Events whose hook is registered at user scope and at project scope, as 'Event: file, file'.
    Claude Code runs a command line that several settings files register once, and each distinct
    one separately (seen with Claude Code 2.1.197: the same `echo` at both scopes ran once, two
    different command lines ran twice), so there only differing command lines count. Codex runs the
    matching hooks of every file, identical ones too (Codex hooks documentation; seen with Codex
    0.171: the same command in both hooks.json files ran twice)."""
    user = our_hook_commands(user_files)
    project = our_hook_commands(project_files)
    found = []
    for event, _ in EVENTS:
        both = user.get(event, []) + project.get(event, [])
        if not user.get(event) or not project.get(event):
            continue
        if same_command_runs_once and len({command for _, command in both}) == 1:
            continue
        found.append(f"{event}: {', '.join(str(path) for path, _ in both)}")
    return found


def server_check(
    name: str, candidates: list[tuple[str, Any, str | None]], home: Path, fix: str, *, env_required: bool
) -> Check:
    errors = [error for _, _, error in candidates if error]
    entries = [(where, entry) for where, entry, error in candidates if not error]
    if errors and not entries:
        return Check(name, FAIL, "; ".join(errors), "fix the file by hand, then: " + fix)
    if not entries:
        return Check(name, FAIL, f'no "{SERVER}" MCP server registered', fix)
    for where, entry in entries:  # every registration the host may start, not only the first found
        problem = _server_problem(entry, home, env_required=env_required)
        if problem:
            return Check(name, FAIL, f"{where}: {problem}", fix)
    return Check(name, OK, f"registered in {', '.join(where for where, _ in entries)}")


def _server_problem(entry: Any, home: Path, *, env_required: bool) -> str | None:
    """Why the host could not start this MCP server entry for this home, or None."""
    if not isinstance(entry, dict):
        return f'the "{SERVER}" entry is not an object/table'
    args = entry.get("args") or []
    if not isinstance(args, list) or "mcp" not in args:
        return f"it does not run `agent-bridge mcp` (args {args!r})"
    problem = _program_problem(entry.get("command"))
    if problem:
        return problem
    raw_env = entry.get("env")
    env = raw_env if isinstance(raw_env, dict) else {}
    registered = env.get("AGENT_BRIDGE_HOME")
    problem = _home_problem(registered, home, "the MCP server")
    if problem is None and env_required and registered is None and bridge_env():
        # Codex starts MCP servers with a cleared environment: without `env` it uses the default home.
        problem = (
            "the MCP server gets no AGENT_BRIDGE_HOME (Codex clears the environment), "
            f"but this home is {home}"
        )
    return problem
