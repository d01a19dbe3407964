"""`agent-bridge doctor` (SPEC §2): checks the state folder, the broker, its socket, the schema
version, the dashboard URL, and whether Claude Code and Codex will actually use the MCP server
and both hooks: registered, runnable, for this home, and accepted by the host (Codex hook trust
and project trust, asked of the installed Codex through `codex app-server`; Claude Code's
approval of a project `.mcp.json` server, read from the files Claude Code records it in; the
same hooks registered at two scopes). Prints each check with what to do about it; exits 1 when
any check fails, and says "All checks passed" only when nothing failed or warned. Standard
library, the read path and the blocking client only: no trio.

Where the hosts keep their configuration: agent_bridge/install.py (Claude Code `~/.claude.json`,
`.mcp.json`, `.claude/settings.json`, `.claude/settings.local.json`; Codex `config.toml` and
`hooks.json` under `$CODEX_HOME` or the project's `.codex`), read through agent_bridge.hostconfig.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_bridge import hostconfig, install, paths
from agent_bridge.tomledit import toml_string

OK, WARN, FAIL, SKIP = "ok", "warn", "FAIL", "skip"
PROBE_TIMEOUT = 1.0  # seconds for the broker ping and the dashboard request
SERVER = install.SERVER_NAME


@dataclass
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""


def check_home(home: Path) -> Check:
    if not home.exists():
        return Check("home folder", FAIL, f"{home} does not exist", "agent-bridge up --detach (creates it, 0700)")
    if not home.is_dir():
        return Check("home folder", FAIL, f"{home} is not a folder", f"move {home} aside, or set AGENT_BRIDGE_HOME")
    if sys.platform == "win32":
        return Check("home folder", OK, str(home))
    st = home.stat()
    if st.st_uid != os.getuid():
        return Check("home folder", FAIL, f"{home} belongs to uid {st.st_uid}, not you", "use a folder of your own (AGENT_BRIDGE_HOME)")
    mode = st.st_mode & 0o777
    if mode & 0o077:
        return Check("home folder", FAIL, f"{home} has mode {mode:04o}; others can reach the socket and database",
                     f"chmod 700 {shlex.quote(str(home))}")
    return Check("home folder", OK, f"{home} (mode {mode:04o})")


def check_broker(home: Path) -> tuple[Check, dict[str, Any] | None]:
    record = paths.read_broker_json(home)
    if record is None:
        failed = last_start_failure(home)
        if failed:
            return Check("broker", FAIL, f"not running; the last start failed: {failed}",
                         "fix that, then: agent-bridge up --detach"), None
        return Check("broker", FAIL, "not running (no broker.json)",
                     "agent-bridge up --detach (an MCP server also starts one when it connects)"), None
    pid = record.get("pid")
    if not isinstance(pid, int) or not paths.pid_alive(pid):
        return Check("broker", FAIL, f"not running: broker.json names pid {pid}, which is gone (stale record)",
                     "agent-bridge up --detach (replaces the stale record)"), None
    return Check("broker", OK, f"running, pid {pid}"), record


def last_start_failure(home: Path) -> str | None:
    """Why the last `agent-bridge up` (maybe started by an MCP server) could not start."""
    try:
        return (home / paths.START_FAILURE).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def check_socket(home: Path, record: dict[str, Any] | None) -> Check:
    if record is None:
        return Check("socket", SKIP, "no broker to reach")
    from agent_bridge.ipc import blocking, protocol

    sock = str(record.get("socket"))
    try:
        blocking.call(home, "ping", timeout=PROBE_TIMEOUT)
    except (blocking.BrokerUnavailable, OSError, protocol.ProtocolError) as exc:
        return Check("socket", FAIL, f"{sock} does not answer: {exc}", "agent-bridge down; agent-bridge up --detach")
    except protocol.RemoteError as exc:
        return Check("socket", FAIL, f"{sock} answered with an error: {exc.message}", "agent-bridge down; agent-bridge up --detach")
    if sys.platform != "win32" and os.path.exists(sock):
        mode = os.stat(sock).st_mode & 0o777
        if mode & 0o077:
            return Check("socket", FAIL, f"{sock} answers but has mode {mode:04o}", "agent-bridge down; agent-bridge up --detach")
    return Check("socket", OK, f"{sock} answers")


def check_schema(home: Path) -> Check:
    from agent_bridge.store import reader
    from agent_bridge.store.schema import CURRENT_VERSION, SchemaTooNew, user_version

    db = paths.db_path(home)
    try:
        conn = reader.open_readonly(db)
    except SchemaTooNew as exc:
        return Check("schema", FAIL, str(exc), "upgrade agent-bridge (pip install -U agent-bridge)")
    except Exception as exc:  # noqa: BLE001 - any database error is a finding here
        return Check("schema", FAIL, f"cannot read {db}: {exc}", f"move {db} aside; the broker creates a new one")
    if conn is None:
        return Check("schema", WARN, f"no database yet at {db}", "agent-bridge up --detach (creates it)")
    try:
        version = user_version(conn)
    finally:
        conn.close()
    if version < CURRENT_VERSION:
        return Check("schema", WARN, f"version {version}; the next broker start upgrades it to {CURRENT_VERSION} (with a backup)",
                     "agent-bridge down; agent-bridge up --detach")
    return Check("schema", OK, f"version {version}")


def check_dashboard(home: Path, record: dict[str, Any] | None) -> Check:
    if record is None:
        return Check("dashboard", SKIP, "no broker serves it", "agent-bridge dashboard (serves it read-only)")
    url_file = home / paths.DASHBOARD_URL
    try:
        url = url_file.read_text(encoding="utf-8").strip()
    except OSError:
        return Check("dashboard", FAIL, f"{url_file} is missing", "agent-bridge down; agent-bridge up --detach")
    if sys.platform != "win32" and url_file.stat().st_mode & 0o077:
        return Check("dashboard", FAIL, f"{url_file} is readable by others (it holds the login token)",
                     f"chmod 600 {shlex.quote(str(url_file))}")
    base = str(record.get("web") or "").rstrip("/")
    if not base or not url.startswith(base + "/"):
        return Check("dashboard", FAIL, f"{url_file} does not match the broker's web address {base or '(none)'}",
                     "agent-bridge down; agent-bridge up --detach")
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(base + "/", timeout=PROBE_TIMEOUT) as response:  # noqa: S310 - loopback URL
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code  # 403 without the cookie: it answers, which is what we check
    except (urllib.error.URLError, OSError) as exc:
        return Check("dashboard", FAIL, f"{base} does not answer: {exc}", "agent-bridge down; agent-bridge up --detach")
    return Check("dashboard", OK, f"{base} answers (HTTP {status}); open it with: agent-bridge dashboard --open")


# --- host registrations ---------------------------------------------------------------


def _load_json(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(data, None); (None, None) when the file does not exist; (None, why) when it cannot be used."""
    try:
        text = hostconfig.read_text(path)
        return (None, None) if text is None else (hostconfig.parse_json_object(path, text), None)
    except hostconfig.ConfigError as exc:
        return None, str(exc)


def _load_toml(path: Path) -> tuple[dict[str, Any] | None, str | None]:
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
        data, error = _load_json(path)
        if error:
            errors.append(error)
        if not data or not isinstance(data.get("hooks"), dict):
            continue
        for event, event_arg in install.EVENTS:
            for group in data["hooks"].get(event) or ():
                if not isinstance(group, dict):
                    continue
                for handler in group.get("hooks") or ():
                    if isinstance(handler, dict) and install.is_our_hook(handler.get("command"), event_arg):
                        found.setdefault(event, (path, handler["command"]))
    return found


def _hooks_check(name: str, files: list[Path], home: Path, fix: str) -> Check:
    errors: list[str] = []
    found = _find_hooks(files, errors)
    if errors:
        return Check(name, FAIL, "; ".join(errors), "fix the file by hand, then: " + fix)
    missing = [event for event, _ in install.EVENTS if event not in found]
    if missing:
        return Check(name, FAIL, f"{' and '.join(missing)} hook not registered (looked in {', '.join(map(str, files))})", fix)
    for event, (path, command) in found.items():
        problem = _program_problem(_hook_program(command)) or _home_problem(_hook_home(command), home, f"the {event} hook")
        if problem:
            return Check(name, FAIL, f"{event} hook in {path}: {problem}", fix)
    where = sorted({str(p) for p, _ in found.values()})
    return Check(name, OK, f"SessionStart and Stop registered in {', '.join(where)}")


def _our_hook_commands(files: list[Path]) -> dict[str, list[tuple[Path, str]]]:
    """Event -> (file, command line) of each of our hooks registered in those files."""
    found: dict[str, list[tuple[Path, str]]] = {}
    for path in files:
        data, _ = _load_json(path)
        hooks = data.get("hooks") if data else None
        if not isinstance(hooks, dict):
            continue
        for event, event_arg in install.EVENTS:
            groups = hooks.get(event)
            if isinstance(groups, list):
                found.setdefault(event, []).extend((path, h["command"]) for _, h in install.our_handlers(groups, event_arg))
    return found


def _duplicate_hooks(user_files: list[Path], project_files: list[Path], *, same_command_runs_once: bool) -> list[str]:
    """Events whose hook is registered at user scope and at project scope, as 'Event: file, file'.
    Claude Code runs a command line that several settings files register once, and each distinct
    one separately (seen with Claude Code 2.1.197: the same `echo` at both scopes ran once, two
    different command lines ran twice), so there only differing command lines count. Codex runs the
    matching hooks of every file, identical ones too (Codex hooks documentation; seen with Codex
    0.171: the same command in both hooks.json files ran twice)."""
    user = _our_hook_commands(user_files)
    project = _our_hook_commands(project_files)
    found = []
    for event, _ in install.EVENTS:
        both = user.get(event, []) + project.get(event, [])
        if not user.get(event) or not project.get(event):
            continue
        if same_command_runs_once and len({command for _, command in both}) == 1:
            continue
        found.append(f"{event}: {', '.join(str(path) for path, _ in both)}")
    return found


def claude_checks(home: Path, cwd: Path) -> list[Check]:
    user_json = Path.home() / ".claude.json"
    project_mcp = cwd / ".mcp.json"
    user_settings = [Path.home() / ".claude" / "settings.json"]
    project_settings = [cwd / ".claude" / "settings.json", cwd / ".claude" / "settings.local.json"]
    settings = user_settings + project_settings
    installed = (Path.home() / ".claude").is_dir() or user_json.exists() or project_mcp.exists()
    if not installed:
        return [Check("Claude Code", SKIP, "no ~/.claude folder: Claude Code not set up for this user")]
    fix = "agent-bridge install --claude"
    candidates: list[tuple[str, Any, str | None]] = []  # (where, entry, parse error)
    data, error = _load_json(user_json)
    if error:
        candidates.append((str(user_json), None, error))
    if data:
        servers = data.get("mcpServers")
        if isinstance(servers, dict) and SERVER in servers:
            candidates.append((f"{user_json} (user scope)", servers[SERVER], None))
        projects = data.get("projects")
        local = projects.get(str(cwd)) if isinstance(projects, dict) else None
        if isinstance(local, dict) and isinstance(local.get("mcpServers"), dict) and SERVER in local["mcpServers"]:
            candidates.append((f"{user_json} (local scope of {cwd})", local["mcpServers"][SERVER], None))
    data, error = _load_json(project_mcp)
    if error:
        candidates.append((str(project_mcp), None, error))
    in_project = bool(data and isinstance(data.get("mcpServers"), dict) and SERVER in data["mcpServers"])
    if in_project:
        candidates.append((f"{project_mcp} (project scope)", data["mcpServers"][SERVER], None))  # type: ignore[index]
    checks = [_server_check("Claude Code MCP server", candidates, home, fix, env_required=False),
              _hooks_check("Claude Code hooks", settings, home, fix)]
    if in_project:
        checks.append(claude_project_approval(cwd, user_json, user_settings + project_settings))
    twice = _duplicate_hooks(user_settings, project_settings, same_command_runs_once=True)
    if twice:
        checks.append(Check("Claude Code hooks scope", FAIL, "registered at user and project scope with different "
                            "command lines (" + "; ".join(twice) + "): Claude Code runs each of them, so every "
                            "session runs the hook twice",
                            "keep one: agent-bridge uninstall --claude --scope project (or --scope user)"))
    return checks


def claude_project_approval(cwd: Path, user_json: Path, settings: list[Path]) -> Check:
    """Whether Claude Code will start the `.mcp.json` server here, from the records Claude Code
    2.1.197 writes and reads (seen with the real CLI: its approval dialog writes
    `enabledMcpjsonServers`, `enableAllProjectMcpServers` or `disabledMcpjsonServers` to
    `.claude/settings.local.json`; the same keys in `~/.claude/settings.json`,
    `.claude/settings.json` and `~/.claude.json` `projects[<folder>]` count too; a rejection wins
    over an approval; a folder whose trust dialog was not accepted stays pending; `claude mcp
    list` shows "Pending approval" until both hold). Pending is a warning, not a failure: an
    interactive session asks for the approval at its start, and a `claude -p` run starts the
    server without it (seen with 2.1.197); only a rejection keeps every session from it."""
    name = "Claude Code project server"
    sources: list[tuple[str, dict[str, Any]]] = []
    for path in settings:
        data, _ = _load_json(path)
        if data:
            sources.append((str(path), data))
    data, _ = _load_json(user_json)
    projects = data.get("projects") if data else None
    entry = projects.get(str(cwd)) if isinstance(projects, dict) else None
    if isinstance(entry, dict):
        sources.append((f"{user_json} (projects[{cwd}])", entry))

    def listed(key: str) -> list[str]:
        return [where for where, d in sources if isinstance(d.get(key), list) and SERVER in d[key]]

    rejected = listed("disabledMcpjsonServers")
    if rejected:
        return Check(name, FAIL, f'the .mcp.json server "{SERVER}" was rejected ({", ".join(rejected)})',
                     f'enable it with /mcp in Claude Code, or remove "{SERVER}" from disabledMcpjsonServers there')
    approved = listed("enabledMcpjsonServers") + [w for w, d in sources if d.get("enableAllProjectMcpServers") is True]
    fix = (f'start `claude` in {cwd}, trust the folder and choose "Use this MCP server" '
           "(Claude Code records it in .claude/settings.local.json), or approve it with /mcp")
    if not approved:
        return Check(name, WARN, f'"{SERVER}" in {cwd / ".mcp.json"} is pending approval: an interactive Claude '
                     "Code session asks for it and does not start it until you approve it", fix)
    trusted = [p for p in (cwd, *cwd.parents) if isinstance(projects, dict) and isinstance(projects.get(str(p)), dict)
               and projects[str(p)].get("hasTrustDialogAccepted") is True]
    if not trusted:
        return Check(name, WARN, f"approved, but {cwd} is not a trusted folder in {user_json}: an interactive "
                     "Claude Code session keeps the server pending until you trust the folder", fix)
    if trusted[0] != cwd:
        return Check(name, WARN, f"approved; the folder trust is recorded for {trusted[0]}, not {cwd}, and Claude "
                     "Code may still treat the server as pending", fix)
    return Check(name, OK, f"approved in {approved[0]}")


# --- Codex: ask Codex itself ------------------------------------------------------------------

APP_SERVER_TIMEOUT = 15.0  # seconds for the whole `codex app-server` exchange (about 0.4 s here)


class ProbeError(Exception):
    pass


def codex_app_server(program: str, cwd: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(config layers, hooks) as the installed Codex sees them for `cwd`: `codex app-server`'s
    `config/read` (with `includeLayers`: a project layer Codex ignores carries `disabledReason`)
    and `hooks/list` (each hook's `key`, `sourcePath`, `command`, `currentHash`, `trustStatus`).
    Read-only: it starts no session, and with plugins off it contacts nothing."""
    requests = [
        {"id": 1, "method": "initialize", "params": {"clientInfo": {"name": "agent-bridge-doctor", "version": "1"}}},
        {"method": "initialized"},
        {"id": 2, "method": "config/read", "params": {"cwd": str(cwd), "includeLayers": True}},
        {"id": 3, "method": "hooks/list", "params": {"cwds": [str(cwd)]}},
    ]
    # Plugins off for this probe: with them, Codex 0.171 looks up its plugin marketplace on the
    # network at start (seen as a DNS query); the answers asked for here do not depend on them.
    try:
        proc = subprocess.Popen([program, "-c", "features.plugins=false", "app-server"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=cwd)
    except OSError as exc:
        raise ProbeError(f"cannot run {program} app-server: {exc}") from None
    answers: dict[int, dict[str, Any]] = {}
    timer = threading.Timer(APP_SERVER_TIMEOUT, proc.kill)  # a hung app-server cannot hang doctor
    timer.start()
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("".join(json.dumps(r) + "\n" for r in requests))
        proc.stdin.flush()
        for line in proc.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if isinstance(message, dict) and message.get("id") in (1, 2, 3):
                answers[message["id"]] = message
            if len(answers) == 3:
                break
    except OSError:  # it exited before reading its requests: reported below as no answer
        pass
    finally:
        timer.cancel()
        proc.kill()
        proc.wait()
    for n in (2, 3):
        if n not in answers:
            raise ProbeError(f"{program} app-server did not answer (it exited, or took over {APP_SERVER_TIMEOUT:.0f} s)")
        error = answers[n].get("error")
        if error is not None:
            raise ProbeError(f"{program} app-server: {error.get('message', error) if isinstance(error, dict) else error}")
    layers = answers[2].get("result", {}).get("layers") or []
    hooks = [h for entry in answers[3].get("result", {}).get("data") or [] for h in entry.get("hooks") or []]
    return layers, hooks


_CODEX_EVENTS = {"sessionStart": "session-start", "stop": "stop"}  # hooks/list eventName -> our hook


def codex_trust_checks(program: str, cwd: Path, project_dir: Path, in_project: bool) -> list[Check]:
    try:
        layers, hooks = codex_app_server(program, cwd)
    except ProbeError as exc:
        return [Check("Codex hooks trust", WARN, f"could not ask Codex: {exc}", "run `codex` and check /hooks")]
    checks = []
    ignored = [layer for layer in layers if isinstance(layer, dict) and (layer.get("name") or {}).get("type") == "project"
               and layer.get("disabledReason")]
    if in_project:
        if ignored:
            checks.append(Check(
                "Codex project config", FAIL, f"Codex ignores {project_dir}: {ignored[0]['disabledReason']}",
                f"trust the project: start `codex` in {cwd} and accept the trust prompt, or run `codex exec --trust` "
                f'there once, or add [projects."{cwd}"] trust_level = "trusted" to {hostconfig.codex_home() / "config.toml"}',
            ))
        else:
            checks.append(Check("Codex project config", OK, f"{project_dir} is read (trusted project)"))
    ours = [h for h in hooks if isinstance(h, dict) and h.get("eventName") in _CODEX_EVENTS
            and install.is_our_hook(h.get("command"), _CODEX_EVENTS[h["eventName"]])]
    untrusted = [h for h in ours if h.get("trustStatus") != "trusted" and not h.get("isManaged")]
    config = hostconfig.codex_home() / "config.toml"
    if not ours:
        checks.append(Check("Codex hooks trust", SKIP, "Codex lists no agent-bridge hook here"))
    elif untrusted:
        snippet = "".join(f'\n  [hooks.state.{toml_string(str(h.get("key")))}]\n  trusted_hash = '
                          f'{toml_string(str(h.get("currentHash")))}' for h in untrusted)
        states = ", ".join(sorted({str(h.get("trustStatus")) for h in untrusted}))
        checks.append(Check(
            "Codex hooks trust", FAIL,
            f"{len(untrusted)} agent-bridge hook(s) not trusted ({states}): Codex skips them, `codex exec` without a word",
            f"start `codex`, open /hooks and trust the agent-bridge SessionStart and Stop hooks; or, having read "
            f"them, add to {config}:{snippet}",
        ))
    else:
        checks.append(Check("Codex hooks trust", OK, f"{len(ours)} agent-bridge hooks trusted"))
    return checks


def codex_checks(home: Path, cwd: Path) -> list[Check]:
    user_dir = install.codex_home()
    project_dir = cwd / ".codex"
    if not user_dir.is_dir() and not project_dir.is_dir():
        return [Check("Codex", SKIP, f"no {user_dir} folder: Codex not set up for this user")]
    fix = "agent-bridge install --codex"
    candidates: list[tuple[str, Any, str | None]] = []
    features: list[tuple[Path, dict[str, Any]]] = []
    in_project = False
    for config in (user_dir / "config.toml", project_dir / "config.toml"):
        data, error = _load_toml(config)
        if error:
            candidates.append((str(config), None, error))
        if not data:
            continue
        servers = data.get("mcp_servers")
        if isinstance(servers, dict) and SERVER in servers:
            candidates.append((str(config), servers[SERVER], None))
            in_project = in_project or config.parent == project_dir
        if isinstance(data.get("features"), dict):
            features.append((config, data["features"]))
    user_hooks, project_hooks = [user_dir / "hooks.json"], [project_dir / "hooks.json"]
    in_project = in_project or bool(_our_hook_commands(project_hooks))
    checks = [_server_check("Codex MCP server", candidates, home, fix, env_required=True),
              _hooks_check("Codex hooks", user_hooks + project_hooks, home, fix)]
    program = hostconfig.codex_program()
    version = hostconfig.codex_version(program) if program else None
    checks.append(_codex_feature_check(features, version, fix))
    if program is None:
        checks.append(Check("Codex hooks trust", SKIP, "no codex on PATH: cannot ask Codex whether it trusts the hooks"))
    else:
        checks += codex_trust_checks(program, cwd, project_dir, in_project)
    twice = _duplicate_hooks(user_hooks, project_hooks, same_command_runs_once=False)
    if twice:
        checks.append(Check("Codex hooks scope", FAIL, "registered at user and project scope (" + "; ".join(twice)
                            + "): Codex runs the matching hooks of every file, so each runs twice",
                            "keep one: agent-bridge uninstall --codex --scope project (or --scope user)"))
    return checks


def _codex_feature_check(features: list[tuple[Path, dict[str, Any]]], version: tuple[int, int, int] | None,
                         fix: str) -> Check:
    name = "Codex hooks feature"
    wanted = install.hooks_feature_key(version)
    shown = ".".join(map(str, version)) if version else "not on PATH"
    off = [f"{path}: [features] {key} = false" for path, table in features for key in ("hooks", "codex_hooks")
           if table.get(key) is False]
    if off:
        return Check(name, FAIL, "hooks are switched off: " + "; ".join(off), fix)
    if wanted == "codex_hooks":
        if any(table.get("codex_hooks") is True for _, table in features):
            return Check(name, OK, f"[features] codex_hooks = true (Codex {shown} needs it)")
        return Check(name, FAIL, f"Codex {shown} runs hooks only with [features] codex_hooks = true", fix)
    deprecated = [str(path) for path, table in features if "codex_hooks" in table]
    if deprecated and version:
        return Check(name, WARN, f"[features] codex_hooks is deprecated (Codex {shown} warns on every run): "
                     + ", ".join(deprecated), fix)
    return Check(name, OK, f"hooks are on (Codex {shown}: on by default)" if version else
                 "hooks are on unless switched off (no codex on PATH to ask its version)")


def _server_check(
    name: str, candidates: list[tuple[str, Any, str | None]], home: Path, fix: str, *, env_required: bool
) -> Check:
    errors = [error for _, _, error in candidates if error]
    entries = [(where, entry) for where, entry, error in candidates if not error]
    if errors and not entries:
        return Check(name, FAIL, "; ".join(errors), "fix the file by hand, then: " + fix)
    if not entries:
        return Check(name, FAIL, f'no "{SERVER}" MCP server registered', fix)
    where, entry = entries[0]
    if not isinstance(entry, dict):
        return Check(name, FAIL, f'{where}: the "{SERVER}" entry is not an object/table', fix)
    args = entry.get("args") or []
    if not isinstance(args, list) or "mcp" not in args:
        return Check(name, FAIL, f"{where}: it does not run `agent-bridge mcp` (args {args!r})", fix)
    problem = _program_problem(entry.get("command"))
    if problem:
        return Check(name, FAIL, f"{where}: {problem}", fix)
    raw_env = entry.get("env")
    env = raw_env if isinstance(raw_env, dict) else {}
    registered = env.get("AGENT_BRIDGE_HOME")
    problem = _home_problem(registered, home, "the MCP server")
    if problem is None and env_required and registered is None and install.bridge_env():
        # Codex starts MCP servers with a cleared environment: without `env` it uses the default home.
        problem = f"the MCP server gets no AGENT_BRIDGE_HOME (Codex clears the environment), but this home is {home}"
    if problem:
        return Check(name, FAIL, f"{where}: {problem}", fix)
    return Check(name, OK, f"registered in {where}")


def run_checks(home: Path, cwd: Path) -> list[Check]:
    broker, record = check_broker(home)
    checks = [check_home(home), broker, check_socket(home, record), check_schema(home), check_dashboard(home, record)]
    checks += claude_checks(home, cwd)
    checks += codex_checks(home, cwd)
    return checks


def main() -> int:
    home = paths.home()
    checks = run_checks(home, Path.cwd())
    print(f"agent-bridge doctor: home {home}")
    width = max(len(c.name) for c in checks)
    for c in checks:
        print(f"  {c.status:<4}  {c.name:<{width}}  {c.detail}")
        if c.fix and c.status in (FAIL, WARN):
            first, *more = c.fix.split("\n")
            print(f"        {'':<{width}}  fix: {first}")
            for line in more:
                print(f"        {'':<{width}}       {line}")
    failed = [c for c in checks if c.status == FAIL]
    warned = [c for c in checks if c.status == WARN]
    if failed:
        print(f"{len(failed)} check{'s' if len(failed) != 1 else ''} failed: {', '.join(c.name for c in failed)}.")
        return 1
    if warned:  # the hosts may not use the setup as it stands: say so, never "all passed"
        print(f"No check failed; {len(warned)} warning{'s' if len(warned) != 1 else ''}: "
              f"{', '.join(c.name for c in warned)}.")
        return 0
    print("All checks passed.")
    return 0
