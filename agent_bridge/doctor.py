"""`agent-bridge doctor` (SPEC §2): checks the state folder, the broker, its socket, the schema
version, the dashboard URL, and whether Claude Code and Codex will actually use the MCP server
and both hooks: registered, runnable, for this home, and accepted by the host (Codex hook trust
and project trust, asked of the installed Codex through `codex app-server`; Claude Code's
approval of a project `.mcp.json` server, read from the files Claude Code records it in; the
same hooks registered at two scopes). Prints each check with what to do about it; exits 1 when
any check fails, and says "All checks passed" only when nothing failed or warned. Standard
library, the read path and the blocking client only: no trio.

Each host's checks are in its module under agent_bridge/hosts (`Host.doctor_checks`), built from
the shared helpers here; the files are read through agent_bridge.hostconfig.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any

from agent_bridge import hostconfig, hosts, install, paths
from agent_bridge.hosts.base import FAIL, OK, SKIP, WARN, Check

__all__ = ["FAIL", "OK", "SKIP", "WARN", "Check", "main", "run_checks"]
PROBE_TIMEOUT = 1.0  # seconds for the broker ping and the dashboard request
SERVER = install.SERVER_NAME


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


def check_socket_folder(home: Path, record: dict[str, Any] | None) -> Check | None:
    """The folder outside the state folder that holds (or would hold) the socket, when the home
    path is too long for one inside it (SPEC §8, sockets): a symlink or another user's folder
    there is someone trying to deny the broker or pose as it. None when the socket is at home."""
    if sys.platform == "win32":
        return None
    preferred = Path(paths.socket_path(home)).parent
    used = record.get("socket") if record else None
    actual = Path(used).parent if isinstance(used, str) else None
    if preferred == home and actual in (None, home):
        return None
    if actual is not None and actual != home:
        problem = paths.socket_folder_problem(actual)
        if problem:
            return Check("socket folder", FAIL, f"the broker's socket folder {problem}: another user may pose as "
                         "the broker", "agent-bridge down; remove it (ask an administrator if it is not yours); "
                         "agent-bridge up --detach")
    problem = paths.socket_folder_problem(preferred)
    if problem:
        where = f"; the broker uses {actual} instead" if actual is not None and actual != preferred else ""
        return Check("socket folder", FAIL, f"{problem}: another user may be trying to deny or pose as your broker"
                     f"{where}", f"remove {preferred} (ask an administrator if it is not yours), or set "
                     "XDG_RUNTIME_DIR or a shorter AGENT_BRIDGE_HOME")
    return Check("socket folder", OK, str(actual or preferred))


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
    if status == 403:  # what a browser without the login cookie gets: the server is fine
        return Check("dashboard", OK, f"{base} answers; it opens with its tokenized URL: agent-bridge dashboard --open")
    return Check("dashboard", OK, f"{base} answers (HTTP {status}); open it with: agent-bridge dashboard --open")


# --- host registrations ---------------------------------------------------------------


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
        for event, event_arg in install.EVENTS:
            for group in data["hooks"].get(event) or ():
                if not isinstance(group, dict):
                    continue
                for handler in group.get("hooks") or ():
                    if isinstance(handler, dict) and install.is_our_hook(handler.get("command"), event_arg):
                        found.setdefault(event, (path, handler["command"]))
    return found


def hooks_check(name: str, files: list[Path], home: Path, fix: str) -> Check:
    errors: list[str] = []
    found = _find_hooks(files, errors)
    if errors:
        return Check(name, FAIL, "; ".join(errors), "fix the file by hand, then: " + fix)
    missing = [event for event, _ in install.EVENTS if event not in found]
    required = [event for event in missing if event in install.REQUIRED_EVENTS]
    looked = f"(looked in {', '.join(map(str, files))})"
    if required:
        return Check(name, FAIL, f"{' and '.join(required)} hook not registered {looked}", fix)
    for event, (path, command) in found.items():
        problem = _program_problem(_hook_program(command)) or _home_problem(_hook_home(command), home, f"the {event} hook")
        if problem:
            return Check(name, FAIL, f"{event} hook in {path}: {problem}", fix)
    where = sorted({str(p) for p, _ in found.values()})
    if missing:  # an install from before PostToolUse: it works, but messages wait for the turn's end
        return Check(name, WARN, f"{', '.join(sorted(found))} registered in {', '.join(where)}; {' and '.join(missing)} "
                     f"not {looked}: messages reach a working session only when its turn ends", fix)
    return Check(name, OK, f"{', '.join(event for event, _ in install.EVENTS)} registered in {', '.join(where)}")


def registered_events(files: list[Path]) -> set[str]:
    """The host events (install.EVENTS) whose agent-bridge hook is registered in any of `files`,
    plus "wake" and "user-prompt-submit" when the idle-wake waiter's hooks (install.WAKE,
    install.PROMPT) are."""
    found = set(_find_hooks(files, []))
    for event, arg in (install.WAKE, install.PROMPT):
        for path in files:
            data, _ = load_json(path)
            groups = data.get("hooks", {}).get(event) if data and isinstance(data.get("hooks"), dict) else None
            if isinstance(groups, list) and install.our_handlers(groups, arg):
                found.add(arg)
    return found


def reach_check(title: str, registered: set[str], stop: str, wake: str) -> Check:
    """Which of the ways of SPEC §3 "Reach" the installed setup of one host will use: 1 between
    tool calls (PostToolUse), 2 at Stop (`stop`: how), 3 when idle (`wake`: how, or why not), 4
    at SessionStart, compaction included."""
    parts = [
        "1 between tool calls: " + ("PostToolUse hook" if "PostToolUse" in registered else "no (PostToolUse hook missing)"),
        "2 at Stop: " + (stop if "Stop" in registered else "no (Stop hook missing)"),
        "3 when idle: " + wake,
        "4 at start, resume, compaction: " + ("SessionStart hook" if "SessionStart" in registered
                                              else "no (SessionStart hook missing)"),
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
        for event, event_arg in install.EVENTS:
            groups = hooks.get(event)
            if isinstance(groups, list):
                found.setdefault(event, []).extend((path, h["command"]) for _, h in install.our_handlers(groups, event_arg))
    return found


def duplicate_hooks(user_files: list[Path], project_files: list[Path], *, same_command_runs_once: bool) -> list[str]:
    """Events whose hook is registered at user scope and at project scope, as 'Event: file, file'.
    Claude Code runs a command line that several settings files register once, and each distinct
    one separately (seen with Claude Code 2.1.197: the same `echo` at both scopes ran once, two
    different command lines ran twice), so there only differing command lines count. Codex runs the
    matching hooks of every file, identical ones too (Codex hooks documentation; seen with Codex
    0.171: the same command in both hooks.json files ran twice)."""
    user = our_hook_commands(user_files)
    project = our_hook_commands(project_files)
    found = []
    for event, _ in install.EVENTS:
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
    if problem is None and env_required and registered is None and install.bridge_env():
        # Codex starts MCP servers with a cleared environment: without `env` it uses the default home.
        problem = f"the MCP server gets no AGENT_BRIDGE_HOME (Codex clears the environment), but this home is {home}"
    return problem


def run_checks(home: Path, cwd: Path) -> list[Check]:
    try:
        paths.check_home(home)  # the one ownership check every command goes through
    except paths.HomeError as exc:
        # Someone else's folder: nothing in it is read (their broker.json could point the
        # probes at their socket, their bridge.db is not ours to report on).
        checks = [Check("home folder", FAIL, str(exc), "use a folder of your own (AGENT_BRIDGE_HOME)")]
        checks += [Check(name, SKIP, "not read: the state folder is not yours")
                   for name in ("broker", "socket", "schema", "dashboard")]
    else:
        broker, record = check_broker(home)
        checks = [check_home(home), broker, check_socket(home, record), check_schema(home), check_dashboard(home, record)]
        folder = check_socket_folder(home, record)
        if folder is not None:
            checks.insert(3, folder)
    for host in hosts.ALL:
        checks += host.doctor_checks(home, cwd)
    return checks


def nothing_connected(checks: list[Check]) -> bool:
    """No host is set up to use the bridge: every host check was skipped (no host folder)."""
    titles = tuple(h.title for h in hosts.ALL)
    return all(c.status == SKIP for c in checks if c.name.startswith(titles))


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
    if nothing_connected(checks):  # the bridge works, but no session will ever use it
        print("No check failed, but nothing is connected yet: neither Claude Code nor Codex is set up to use "
              "agent-bridge.\nConnect them: agent-bridge install --claude (and/or --codex), then start a session.")
        return 0
    print("All checks passed.")
    return 0
