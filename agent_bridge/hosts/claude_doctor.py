"""What `agent-bridge doctor` checks of Claude Code: the MCP server at user, local and project
scope, the hooks, whether Claude Code will start the project's `.mcp.json` server (its approval
records), which reach paths (SPEC §3) the installed version uses, and the owner's slash commands.

The host module (hosts.claude) calls `claude_checks` from `Claude.doctor_checks`; nothing here
runs in a hook.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent_bridge.hosts.base import FAIL, OK, SKIP, WARN, Check
from agent_bridge.hosts.claude_transcript import (
    ASYNC_REWAKE_SINCE,
    Version,
    claude_version,
    stop_takes_context,
)


def claude_checks(home: Path, cwd: Path, commands_folder: Callable[[str, Path], Path]) -> list[Check]:
    """doctor's checks of Claude Code: the MCP server at every scope, the hooks, the project
    server's approval, the reach paths, the slash commands (in `commands_folder(scope, cwd)`)."""
    from agent_bridge.hosts.checks import (
        SERVER,
        duplicate_hooks,
        hooks_check,
        load_json,
        registered_events,
        server_check,
    )

    user_json = Path.home() / ".claude.json"
    project_mcp = cwd / ".mcp.json"
    user_settings = [Path.home() / ".claude" / "settings.json"]
    project_settings = [cwd / ".claude" / "settings.json", cwd / ".claude" / "settings.local.json"]
    settings = user_settings + project_settings
    installed = (Path.home() / ".claude").is_dir() or user_json.exists() or project_mcp.exists()
    if not installed:
        return [Check("Claude Code", SKIP, "no ~/.claude folder: Claude Code not set up for this user")]
    server = SERVER
    fix = "agent-bridge install --claude"
    candidates: list[tuple[str, Any, str | None]] = []  # (where, entry, parse error)
    data, error = load_json(user_json)
    if error:
        candidates.append((str(user_json), None, error))
    if data:
        servers = data.get("mcpServers")
        if isinstance(servers, dict) and server in servers:
            candidates.append((f"{user_json} (user scope)", servers[server], None))
        projects = data.get("projects")
        local = projects.get(str(cwd)) if isinstance(projects, dict) else None
        if (
            isinstance(local, dict)
            and isinstance(local.get("mcpServers"), dict)
            and server in local["mcpServers"]
        ):
            candidates.append((f"{user_json} (local scope of {cwd})", local["mcpServers"][server], None))
    data, error = load_json(project_mcp)
    if error:
        candidates.append((str(project_mcp), None, error))
    in_project = bool(data and isinstance(data.get("mcpServers"), dict) and server in data["mcpServers"])
    if in_project:
        candidates.append((f"{project_mcp} (project scope)", data["mcpServers"][server], None))  # type: ignore[index]
    found = [server_check("Claude Code MCP server", candidates, home, fix, env_required=False),
             hooks_check("Claude Code hooks", settings, home, fix)]
    if in_project:
        found.append(project_approval(cwd, user_json, user_settings + project_settings))
    found.append(reach(registered_events(settings)))
    found.append(commands_check(commands_folder, cwd, fix))
    twice = duplicate_hooks(user_settings, project_settings, same_command_runs_once=True)
    if twice:
        found.append(
            Check(
                "Claude Code hooks scope",
                FAIL,
                "registered at user and project scope with different "
                "command lines (" + "; ".join(twice) + "): Claude Code runs each of them, so every "
                "session runs the hook twice",
                "keep one: agent-bridge uninstall --claude --scope project (or --scope user)",
            )
        )
    return found

def commands_check(commands_folder: Callable[[str, Path], Path], cwd: Path, fix: str) -> Check:
    """The owner's slash commands (agent_bridge.hosts.slash), at either scope."""
    from agent_bridge.hosts import slash

    name = "Claude Code slash commands"
    for scope in ("user", "project"):
        folder = commands_folder(scope, cwd)
        paths = [slash.command_path(folder, n) for n in slash.COMMANDS]
        ours = [p for p in paths
                if p.is_file() and slash.is_ours(p.read_text(encoding="utf-8", errors="replace"))]
        if len(ours) == len(paths):
            return Check(name, OK, f"/{slash.NAMESPACE}:{', :'.join(slash.COMMANDS)} ({scope} scope)")
        if ours:
            missing = ", ".join(p.name for p in paths if p not in ours)
            return Check(name, WARN, f"{scope} scope lacks {missing} in {folder / slash.NAMESPACE}", fix)
    return Check(name, WARN, f"none installed (/{slash.NAMESPACE}:send, :inbox, …)", fix)


def reach(registered: set[str], version: Version | None = None, *, asked: bool = False) -> Check:
    """doctor's line on which reach paths (SPEC §3) Claude Code will use, for the installed
    version (`claude --version`; the Stop hook itself decides per session from its transcript)."""
    from agent_bridge.hosts.checks import reach_check

    version = version if asked else claude_version()
    shown = ".".join(map(str, version)) if version else None
    if version is None:
        stop = (
            "additionalContext on Claude Code 2.1.163 and later, "
            "else the block decision (no claude on PATH to ask)"
        )
    elif stop_takes_context(version):
        stop = f"additionalContext, no error label (Claude Code {shown})"
    else:
        stop = f"the block decision, shown as a hook error (Claude Code {shown} is older than 2.1.163)"
    if "wake" not in registered or "user-prompt-submit" not in registered:
        wake = (
            "no (the waiter's Stop and UserPromptSubmit hooks are not both registered: "
            "run agent-bridge install)"
        )
    elif version is not None and version < ASYNC_REWAKE_SINCE:
        wake = f"no (Claude Code {shown}: the waiter needs 2.1.332 or later)"
    else:
        wake = "the asyncRewake waiter (interactive sessions; not claude -p)"
    return reach_check("Claude Code", registered, stop, wake)



def project_approval(cwd: Path, user_json: Path, settings: list[Path]) -> Check:
    """Whether Claude Code will start the `.mcp.json` server here, from the records Claude Code
    2.1.197 writes and reads (seen with the real CLI: its approval dialog writes
    `enabledMcpjsonServers`, `enableAllProjectMcpServers` or `disabledMcpjsonServers` to
    `.claude/settings.local.json`; the same keys in `~/.claude/settings.json`,
    `.claude/settings.json` and `~/.claude.json` `projects[<folder>]` count too; a rejection wins
    over an approval; a folder whose trust dialog was not accepted stays pending; `claude mcp
    list` shows "Pending approval" until both hold). Pending is a warning, not a failure: an
    interactive session asks for the approval at its start, and a `claude -p` run starts the
    server without it (seen with 2.1.197); only a rejection keeps every session from it."""
    from agent_bridge.hosts.checks import SERVER, load_json

    server = SERVER
    name = "Claude Code project server"
    sources: list[tuple[str, dict[str, Any]]] = []
    for path in settings:
        data, _ = load_json(path)
        if data:
            sources.append((str(path), data))
    data, _ = load_json(user_json)
    projects = data.get("projects") if data else None
    entry = projects.get(str(cwd)) if isinstance(projects, dict) else None
    if isinstance(entry, dict):
        sources.append((f"{user_json} (projects[{cwd}])", entry))

    def listed(key: str) -> list[str]:
        return [where for where, d in sources if isinstance(d.get(key), list) and server in d[key]]

    rejected = listed("disabledMcpjsonServers")
    if rejected:
        return Check(
            name,
            FAIL,
            f'the .mcp.json server "{server}" was rejected ({", ".join(rejected)})',
            f'enable it with /mcp in Claude Code, or remove "{server}" from disabledMcpjsonServers there',
        )
    approved = listed("enabledMcpjsonServers") + [
        w for w, d in sources if d.get("enableAllProjectMcpServers") is True
    ]
    fix = (f'start `claude` in {cwd}, trust the folder and choose "Use this MCP server" '
           "(Claude Code records it in .claude/settings.local.json), or approve it with /mcp")
    if not approved:
        return Check(
            name,
            WARN,
            f'"{server}" in {cwd / ".mcp.json"} is pending approval: an interactive Claude '
            "Code session asks for it and does not start it until you approve it",
            fix,
        )
    trusted = [
        p
        for p in (cwd, *cwd.parents)
        if isinstance(projects, dict)
        and isinstance(projects.get(str(p)), dict)
        and projects[str(p)].get("hasTrustDialogAccepted") is True
    ]
    if not trusted:
        return Check(
            name,
            WARN,
            f"approved, but {cwd} is not a trusted folder in {user_json}: an interactive "
            "Claude Code session keeps the server pending until you trust the folder",
            fix,
        )
    if trusted[0] != cwd:
        return Check(
            name,
            WARN,
            f"approved; the folder trust is recorded for {trusted[0]}, not {cwd}, and Claude "
            "Code may still treat the server as pending",
            fix,
        )
    return Check(name, OK, f"approved in {approved[0]}")
