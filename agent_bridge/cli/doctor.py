"""`agent-bridge doctor` (SPEC §2): checks the state folder, the broker, its socket, the schema
version, the dashboard URL, and whether Claude Code and Codex will actually use the MCP server
and both hooks: registered, runnable, for this home, and accepted by the host (Codex hook trust
and project trust, asked of the installed Codex through `codex app-server`; Claude Code's
approval of a project `.mcp.json` server, read from the files Claude Code records it in; the
same hooks registered at two scopes). Prints each check with what to do about it; exits 1 when
any check fails, and says "All checks passed" only when nothing failed or warned. Standard
library, the read path and the blocking client only: no trio.

Each host's checks are in its module under agent_bridge/hosts (`Host.doctor_checks`), built from
the shared helpers in agent_bridge/hosts/checks.py.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any

from agent_bridge import hosts
from agent_bridge.common import paths
from agent_bridge.hosts.base import FAIL, OK, SKIP, WARN, Check

__all__ = ["FAIL", "OK", "SKIP", "WARN", "Check", "main", "run_checks"]
PROBE_TIMEOUT = 1.0  # seconds for the broker ping
# seconds for the dashboard's answer: the first request after a broker's start waits for it to
# load the dashboard's server (dashboard/deferred.py; 0.2-0.4 s here, more on a busy machine)
DASHBOARD_TIMEOUT = 5.0


def check_home(home: Path) -> Check:
    if not home.exists():
        return Check(
            "home folder", FAIL, f"{home} does not exist", "agent-bridge up --detach (creates it, 0700)"
        )
    if not home.is_dir():
        return Check(
            "home folder", FAIL, f"{home} is not a folder", f"move {home} aside, or set AGENT_BRIDGE_HOME"
        )
    if sys.platform == "win32":
        return Check("home folder", OK, str(home))
    st = home.stat()
    if st.st_uid != os.getuid():
        return Check(
            "home folder",
            FAIL,
            f"{home} belongs to uid {st.st_uid}, not you",
            "use a folder of your own (AGENT_BRIDGE_HOME)",
        )
    mode = st.st_mode & 0o777
    if mode & 0o077:
        return Check(
            "home folder",
            FAIL,
            f"{home} has mode {mode:04o}; others can reach the socket and database",
            f"chmod 700 {shlex.quote(str(home))}",
        )
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
        return Check(
            "broker",
            FAIL,
            f"not running: broker.json names pid {pid}, which is gone (stale record)",
            "agent-bridge up --detach (replaces the stale record)",
        ), None
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
        return Check(
            "socket", FAIL, f"{sock} does not answer: {exc}", "agent-bridge down; agent-bridge up --detach"
        )
    except protocol.RemoteError as exc:
        return Check(
            "socket",
            FAIL,
            f"{sock} answered with an error: {exc.message}",
            "agent-bridge down; agent-bridge up --detach",
        )
    if sys.platform != "win32" and os.path.exists(sock):
        mode = os.stat(sock).st_mode & 0o777
        if mode & 0o077:
            return Check(
                "socket",
                FAIL,
                f"{sock} answers but has mode {mode:04o}",
                "agent-bridge down; agent-bridge up --detach",
            )
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
            return Check(
                "socket folder",
                FAIL,
                f"the broker's socket folder {problem}: another user may pose as the broker",
                "agent-bridge down; remove it (ask an administrator if it is not yours); "
                "agent-bridge up --detach",
            )
    problem = paths.socket_folder_problem(preferred)
    if problem:
        where = f"; the broker uses {actual} instead" if actual is not None and actual != preferred else ""
        return Check(
            "socket folder",
            FAIL,
            f"{problem}: another user may be trying to deny or pose as your broker{where}",
            f"remove {preferred} (ask an administrator if it is not yours), or set "
            "XDG_RUNTIME_DIR or a shorter AGENT_BRIDGE_HOME",
        )
    return Check("socket folder", OK, str(actual or preferred))


def check_schema(home: Path) -> Check:
    from agent_bridge.store import reader
    from agent_bridge.store.migration import SchemaTooNew, user_version
    from agent_bridge.store.schema import CURRENT_VERSION

    db = paths.db_path(home)
    try:
        conn = reader.open_readonly(db)
    except SchemaTooNew as exc:
        return Check("schema", FAIL, str(exc), "upgrade agent-bridge (pip install -U agent-bridge)")
    except Exception as exc:  # noqa: BLE001 - any database error is a finding here
        return Check(
            "schema", FAIL, f"cannot read {db}: {exc}", f"move {db} aside; the broker creates a new one"
        )
    if conn is None:
        return Check("schema", WARN, f"no database yet at {db}", "agent-bridge up --detach (creates it)")
    try:
        version = user_version(conn)
    finally:
        conn.close()
    if version < CURRENT_VERSION:
        return Check(
            "schema",
            WARN,
            f"version {version}; the next broker start upgrades it to {CURRENT_VERSION} (with a backup)",
            "agent-bridge down; agent-bridge up --detach",
        )
    return Check("schema", OK, f"version {version}")


def check_dashboard(home: Path, record: dict[str, Any] | None) -> Check:
    if record is None:
        return Check("dashboard", SKIP, "no broker serves it", "agent-bridge dashboard (serves it read-only)")
    url_file = home / paths.DASHBOARD_URL
    try:
        url = url_file.read_text(encoding="utf-8").strip()
    except OSError:
        return Check(
            "dashboard", FAIL, f"{url_file} is missing", "agent-bridge down; agent-bridge up --detach"
        )
    if sys.platform != "win32" and url_file.stat().st_mode & 0o077:
        return Check("dashboard", FAIL, f"{url_file} is readable by others (it holds the login token)",
                     f"chmod 600 {shlex.quote(str(url_file))}")
    base = str(record.get("web") or "").rstrip("/")
    if not base or not url.startswith(base + "/"):
        return Check(
            "dashboard",
            FAIL,
            f"{url_file} does not match the broker's web address {base or '(none)'}",
            "agent-bridge down; agent-bridge up --detach",
        )
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(base + "/", timeout=DASHBOARD_TIMEOUT) as response:  # noqa: S310 - loopback URL
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code  # 403 without the cookie: it answers, which is what we check
    except (urllib.error.URLError, OSError) as exc:
        return Check(
            "dashboard", FAIL, f"{base} does not answer: {exc}", "agent-bridge down; agent-bridge up --detach"
        )
    if status == 403:  # what a browser without the login cookie gets: the server is fine
        return Check(
            "dashboard", OK, f"{base} answers; it opens with its tokenized URL: agent-bridge dashboard --open"
        )
    return Check(
        "dashboard", OK, f"{base} answers (HTTP {status}); open it with: agent-bridge dashboard --open"
    )


def check_federation(home: Path, record: dict[str, Any] | None) -> Check | None:
    """With [federation] in config.toml (SPEC §10): the table, the seed's mode and the extra,
    then the hub as the running broker sees it. None without the table: nothing to say."""
    from agent_bridge.federation import checks as federation_checks
    from agent_bridge.federation import settings as federation_settings
    from agent_bridge.federation.errors import FederationError
    from agent_bridge.ipc import blocking
    from agent_bridge.ipc.protocol import RemoteError

    problems = federation_checks.local_problems(home)
    if problems:
        return Check("federation", FAIL, problems[0], "fix config.toml's [federation] (docs/federation.md)")
    try:
        configured = federation_settings.load(home)
    except FederationError:  # said by local_problems already
        return None
    if configured is None:
        return None
    where = f"machine {configured.machine}, team {configured.team}, hub {configured.url}"
    if record is None:
        return Check("federation", WARN, f"{where}; no broker runs to reach the hub",
                     "agent-bridge up --detach")
    try:
        hub = blocking.call(home, "status", timeout=5.0).get("federation") or {}
    except (blocking.BrokerUnavailable, RemoteError, OSError) as exc:
        return Check("federation", WARN, f"{where}; the broker did not answer: {exc}")
    if hub.get("connected"):
        return Check("federation", OK, f"{where}: connected")
    why = hub.get("lastError") or "not connected yet"
    return Check("federation", FAIL, f"{where}: hub not reached ({why})",
                 "check url and ca in [federation], that the hub runs, and that it knows this machine's key "
                 "(agent-bridge machine)")


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
        checks = [
            check_home(home),
            broker,
            check_socket(home, record),
            check_schema(home),
            check_dashboard(home, record),
        ]
        folder = check_socket_folder(home, record)
        if folder is not None:
            checks.insert(3, folder)
        federation = check_federation(home, record)
        if federation is not None:
            checks.append(federation)
    for host in hosts.ALL:
        checks += plugin_checks(host, cwd, host.doctor_checks(home, cwd))
    return checks


def plugin_checks(host: hosts.Host, cwd: Path, found: list[Check]) -> list[Check]:
    """The host's checks with its plugin's (`install --plugin`): the plugin installed and enabled,
    `agent-bridge` on PATH for it; with the plugin alone, the config-edit checks that find nothing
    registered are skipped; with both, a warning (the host would run every hook twice)."""
    import shutil

    from agent_bridge.hosts import plugin, plugin_install
    from agent_bridge.hosts.edits import InstallError

    folder = plugin_install.installed(host.name)
    if folder is None:
        return found
    name = f"{host.title} plugin"
    try:
        edited = [str(e.path) for scope in ("user", "project")
                  for e in host.uninstall_edits(scope, cwd.absolute(), private=True) if e.changed]
    except InstallError:
        edited = []
    if shutil.which(plugin.RUN[0]) is None:
        mine = Check(name, FAIL, f"{plugin.ID} is installed, but `{plugin.RUN[0]}`, which it runs, is not on "
                     "PATH", "install agent-bridge so that the host finds it on PATH (pipx install)")
    else:
        mine = Check(name, OK, f"{plugin.ID} installed and enabled (from {folder})")
    program = shutil.which(host.name) if host.name == "codex" else None
    if program is not None and mine.status == OK:
        try:
            untrusted = plugin_install.untrusted_hooks(program, cwd)
        except InstallError as exc:
            untrusted = [str(exc)]
        if untrusted:
            mine = Check(name, FAIL, f"{plugin.ID} is installed, but Codex does not trust {len(untrusted)} "
                         f"of its hooks ({untrusted[0]}, …): `codex exec` skips them, the TUI asks",
                         f"agent-bridge install --{host.name} --plugin (or trust them in /hooks)")
    if edited:
        twice = Check(name + "s", WARN,
                      f"agent-bridge is installed twice: the plugin {plugin.ID} and the config edits "
                      f"({', '.join(edited)}): {host.title} starts two MCP servers and runs every hook twice",
                      f"keep one: agent-bridge uninstall --{host.name} (the edits) or "
                      f"agent-bridge uninstall --{host.name} --plugin")
        return [mine, *found, twice]
    title = host.title
    return [mine, *[c if c.status not in (FAIL, WARN) or not c.name.startswith(title) else
                    Check(c.name, SKIP, f"the plugin registers it ({c.detail})") for c in found]]


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
        print(
            f"{len(failed)} check{'s' if len(failed) != 1 else ''} failed: "
            f"{', '.join(c.name for c in failed)}."
        )
        return 1
    if warned:  # the hosts may not use the setup as it stands: say so, never "all passed"
        print(f"No check failed; {len(warned)} warning{'s' if len(warned) != 1 else ''}: "
              f"{', '.join(c.name for c in warned)}.")
        return 0
    if nothing_connected(checks):  # the bridge works, but no session will ever use it
        print(
            "No check failed, but nothing is connected yet: neither Claude Code nor Codex is set up to use "
            "agent-bridge.\nConnect them: agent-bridge install --claude (and/or --codex), "
            "then start a session."
        )
        return 0
    print("All checks passed.")
    return 0
