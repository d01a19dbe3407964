"""opencode (npm `opencode-ai`): where it keeps its MCP servers and plugins, what doctor checks.

Configuration (opencode's config documentation, and what 1.18.33 reads, NOTES.md "opencode"):
- The user's `$XDG_CONFIG_HOME/opencode/opencode.json` (default `~/.config/opencode/`), a project's
  `opencode.json`; either may be `opencode.jsonc`, and both are JSONC (comments, trailing
  commas): install edits them in place and keeps every comment (hosts.jsonedit).
- MCP server: `"mcp": {"agent-bridge": {"type": "local", "command": [...], "environment": {...},
  "enabled": true}}`. opencode gives it `OPENCODE=1` and `OPENCODE_PID`, no session id; its
  tools reach the model as `agent-bridge_<tool>`.
- No command hooks: plugins, `*.js` in `<config>/plugin/` (user) or `<project>/.opencode/plugin/`.
  Install writes `agent-bridge.js` there (hosts.opencode_plugin), which runs our hook commands.

Jobs: `opencode run --format json`, the task on stdin, the bridge and the access in
`OPENCODE_CONFIG_CONTENT` (`Opencode.job_command`).

Process: the `opencode` program (argv[0] `opencode`; npm's executable is `bin/opencode.exe`,
seen with 1.18.33 under `ps`). The plugin runs inside it, so the hooks it starts and the MCP
servers it starts share it as their nearest agent host. One process may run several sessions
(`opencode serve`, the TUI's session list) over one MCP server, which gets no session id: the
plugin names the session in each agent-bridge tool call's arguments, and `agent-bridge mcp` is
then a router (relay.router) with one relay per session (`sessions_per_server`), each given its
`ses_…` id as `--host-session-id`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_bridge.hosts.base import (
    FAIL,
    OK,
    SKIP,
    WARN,
    Check,
    HookInput,
    Host,
    JobCommand,
    JobLaunch,
    JobReport,
)

if TYPE_CHECKING:
    from agent_bridge.hosts.edits import FileEdit

PLUGIN_NAME = "agent-bridge.js"
Version = tuple[int, int, int]
# The newest opencode whose plugin hooks and config were checked with the real CLI (tests/hosts).
CHECKED: Version = (1, 18, 33)
# What the plugin gives (SPEC §3 "Reach"), as doctor says it: seen with 1.18.33 (tests/hosts/test_opencode.py)
REACH = ("1 between tool calls: the plugin adds them to the tool's result; 2 at Stop: none, at session.idle "
         "way 3 takes them; 3 when idle: the plugin starts a turn (promptAsync), not in `opencode run`; "
         "4 at start and compaction: the note in the system prompt")
JOB_SINCE: Version = (1, 18, 33)  # the newest whose headless run (stdin, --format json) was checked


class Opencode(Host):
    name = "opencode"
    title = "opencode"
    process_prefixes = ("opencode",)
    exclusive = False  # `opencode serve` runs several sessions in one process
    sessions_per_server = True  # over one MCP server: the plugin names each tool call's session
    defers_ack = True  # the plugin acknowledges once opencode stored the tool result (opencode_plugin)

    def is_set_up(self) -> bool:
        return config_dir().is_dir()

    def config_file(self, scope: str, cwd: Path) -> Path:
        """`opencode.json`, or the `opencode.jsonc` the user has instead."""
        folder = cwd if scope == "project" else config_dir()
        jsonc = folder / "opencode.jsonc"
        plain = folder / "opencode.json"
        return jsonc if jsonc.exists() and not plain.exists() else plain

    def plugin_folder(self, scope: str, cwd: Path) -> Path:
        return cwd / ".opencode" / "plugin" if scope == "project" else config_dir() / "plugin"

    def hooks_file(self, scope: str, cwd: Path) -> Path:
        return self.plugin_folder(scope, cwd) / PLUGIN_NAME

    def install_edits(self, scope: str, cwd: Path, run: list[str], env: dict[str, str],
                      *, private: bool) -> list[FileEdit]:
        from functools import partial

        from agent_bridge.hosts.edits import mcp_args

        path = self.config_file(scope, cwd)
        command, args = mcp_args(run, self.name)
        return [edit_jsonc(path, partial(ensure_server, path=path, command=[command, *args], env=env),
                           private=private),
                self.plugin_edit(scope, cwd, run, env, private=private)]

    def plugin_edit(self, scope: str, cwd: Path, run: list[str] | None, env: dict[str, str],
                    *, private: bool) -> FileEdit:
        import shlex

        from agent_bridge.hosts import opencode_plugin
        from agent_bridge.hosts.edits import hook_command, owned_file_edit

        folder = self.plugin_folder(scope, cwd)
        text = None
        if run is not None:
            hooks = {event: shlex.split(hook_command(run, event, self.name, {}))
                     for event in ("session-start", "post-tool-use")}
            hooks["ack"] = [*run, "hook", "ack", "--agent", self.name]
            hooks["status"] = [*run, "hook", "status", "--agent", self.name]
            from agent_bridge.common import paths
            from agent_bridge.hosts.edits import SERVER_NAME

            text = opencode_plugin.plugin_text(hooks, env, str(paths.home() / paths.PENDING_DIR), SERVER_NAME)
        # the folders install made go when empty: `plugin/`, and a project's `.opencode/`
        prune = (folder, folder.parent) if scope == "project" else (folder,)
        edit = owned_file_edit(folder / PLUGIN_NAME, text, opencode_plugin.is_ours, private=private,
                               prune=prune)
        edit.notes = [note.replace("slash command", "opencode plugin") for note in edit.notes]
        return edit

    def uninstall_edits(self, scope: str, cwd: Path, *, private: bool) -> list[FileEdit]:
        from functools import partial

        path = self.config_file(scope, cwd)
        drop = partial(remove_server, path=path)
        return [edit_jsonc(path, drop, private=private),
                self.plugin_edit(scope, cwd, None, {}, private=private)]

    def tools_sentence(self, *, plugin: bool = False) -> str:
        return ("Message other agent sessions with the `agent-bridge_send`, `agent-bridge_inbox` and "
                "`agent-bridge_decisions` tools: they reach Claude Code and Codex sessions too, "
                "running or not.")

    def post_tool_use_output(self, text: str) -> dict[str, Any]:
        """Read by the plugin, which adds `text` to the tool's result."""
        return {"hookSpecificOutput": {"hookEventName": "PostToolUse", "additionalContext": text}}

    def wake(self, text: str, hook: HookInput) -> bool:
        return False  # no idle wake for opencode yet: messages wait for the next turn's tool calls

    def runs_waiter(self, hook: HookInput, env: Any) -> bool:
        return False  # the plugin starts no waiter (yet): `session.idle` -> `promptAsync` is to come

    def prompt_queued(self, hook: HookInput) -> bool:
        return False  # the plugin reports no queued prompt

    def wakes_only_in_front(self, env: Any) -> bool:
        return True

    def turn_interrupted(self, hook: HookInput, since: float) -> bool:
        return False  # not known yet: the plugin will read `session.status` (idle after an abort)

    def owner_types(self, env: Any) -> bool:
        """`opencode run` is a script's prompt; the TUI a person's. The plugin does not say yet: yes."""
        return True

    def next_step(self, scope: str) -> str:
        return ("opencode: start a new session; the agent-bridge tools are `agent-bridge_*`, and the plugin "
                f"{self.hooks_file(scope, Path.cwd())} hands over messages and decisions.")

    def doctor_checks(self, home: Path, cwd: Path) -> list[Check]:
        from agent_bridge.hosts import opencode_plugin
        from agent_bridge.hosts.checks import SERVER, server_check
        from agent_bridge.hosts.hostconfig import ConfigError, read_text

        files = [self.config_file("user", cwd), self.config_file("project", cwd)]
        if not config_dir().is_dir() and not any(f.exists() for f in files):
            return [Check("opencode", SKIP, f"no {config_dir()} folder: opencode not set up for this user")]
        fix = "agent-bridge install --opencode"
        candidates: list[tuple[str, Any, str | None]] = []
        for path in files:
            try:
                text = read_text(path)
                data = load_jsonc(path, text)
            except ConfigError as exc:
                candidates.append((str(path), None, str(exc)))
                continue
            servers = data.get("mcp")
            entry = servers.get(SERVER) if isinstance(servers, dict) else None
            if isinstance(entry, dict):
                command = entry.get("command")
                words = command if isinstance(command, list) and command else [None]
                environment = entry.get("environment")
                candidates.append((str(path), {"command": words[0], "args": words[1:],
                                               "env": environment if isinstance(environment, dict) else {}},
                                   None if entry.get("enabled", True) is not False else
                                   f'{path}: mcp.{SERVER} has "enabled": false'))
        checks = [server_check("opencode MCP server", candidates, home, fix, env_required=False)]
        plugins = [self.hooks_file(s, cwd) for s in ("user", "project")]
        found = []
        for plugin in plugins:
            try:
                text = plugin.read_text(encoding="utf-8")
            except OSError:
                continue
            if opencode_plugin.is_ours(text):
                found.append(plugin)
        if found:
            checks.append(Check("opencode plugin", OK, f"{', '.join(map(str, found))}: identity, the "
                                "decisions note and messages between tool calls"))
            checks.append(Check("opencode reach", OK, REACH))
        else:
            checks.append(Check("opencode plugin", FAIL, f"no agent-bridge plugin in {plugins[0].parent}",
                                fix))
            checks.append(Check("opencode reach", WARN, "none of the four ways without the plugin: messages "
                                "wait for an `inbox` call", fix))
        version = opencode_version()
        if version is None:
            checks.append(Check("opencode version", WARN, "no `opencode` on PATH answers --version",
                                "install opencode (npm install -g opencode-ai)"))
        else:
            checked = ".".join(map(str, CHECKED))
            status = OK if version >= CHECKED else WARN
            said = f"{'.'.join(map(str, version))} (plugin hooks checked with {checked})"
            checks.append(Check("opencode version", status, said,
                                "" if status == OK else f"update opencode to {checked} or newer"))
        return checks

    def job_check(self) -> str | None:
        import shutil

        program = shutil.which("opencode")
        if program is None:
            return "no opencode on PATH: install opencode (npm install -g opencode-ai) to run opencode jobs"
        version = opencode_version(program)
        if version is None or version < JOB_SINCE:
            shown = "unknown" if version is None else ".".join(map(str, version))
            return (f"opencode {shown} is older than {'.'.join(map(str, JOB_SINCE))}, whose headless run "
                    "was checked: install a newer one (npm install -g opencode-ai)")
        return None

    def job_command(self, launch: JobLaunch) -> JobCommand:
        """`opencode run --format json` (`-s SESSION` to continue), the task on stdin (opencode
        1.18.33 reads stdin when it is not a terminal; nothing the agent wrote is read as a flag,
        and a task given as arguments would reach the model re-quoted). The bridge and the access
        come in `OPENCODE_CONFIG_CONTENT`, merged last over the user's config and touching none
        of their files: `mcp.agent-bridge` is the job's MCP server; `read` denies `edit` (every
        tool that writes files) and `bash` (opencode then does not offer them to the model, seen
        with 1.18.33), `edit` allows both, since nobody is there to approve. `OPENCODE_PURE`
        keeps the user's plugins (ours among them) out of the job, so the decisions note goes
        before the task."""
        import json
        import shutil

        from agent_bridge.hosts.edits import SERVER_NAME, mcp_command

        allowed = "deny" if launch.access == "read" else "allow"
        overlay = {
            "mcp": {SERVER_NAME: {"type": "local", "command": mcp_command(launch.bridge),
                                  "environment": dict(launch.env), "enabled": True}},
            "permission": {"edit": allowed, "bash": allowed},
        }
        argv = [shutil.which("opencode") or "opencode", "run", "--format", "json"]
        if launch.thread:
            argv += ["-s", launch.thread]
        if launch.model:
            argv += ["-m", launch.model]
        task = launch.task if launch.thread or not launch.note else f"{launch.note}\n\n{launch.task}"
        env = {"OPENCODE_CONFIG_CONTENT": json.dumps(overlay, ensure_ascii=False), "OPENCODE_PURE": "1"}
        return JobCommand(argv, env, task.encode("utf-8"))

    def job_report(self, stdout: bytes) -> JobReport:
        """`opencode run --format json` (1.18.33): every event carries `sessionID`; `text` events
        are what the model said, `tool_use` events its tool calls, `step_finish` with reason
        `stop` ends the run; `error` ends it in error."""
        from agent_bridge.hosts.base import json_lines, one_line

        report = JobReport()
        said: str | None = None
        for event in json_lines(stdout):
            kind = event.get("type")
            found = event.get("part")
            part: dict[str, Any] = found if isinstance(found, dict) else {}
            if report.thread is None and isinstance(event.get("sessionID"), str):
                report.thread = event["sessionID"]
            if kind == "text" and isinstance(part.get("text"), str):
                said = part["text"]
                report.last_step = one_line(said)
            elif kind == "tool_use":
                report.last_step = one_line(str(part.get("tool") or "a tool"))
            elif kind == "step_finish" and part.get("reason") == "stop":
                report.answer = said or ""
            elif kind == "error":
                raw = event.get("error")
                error: dict[str, Any] = raw if isinstance(raw, dict) else {}
                data: dict[str, Any] = error["data"] if isinstance(error.get("data"), dict) else {}
                report.failed = one_line(str(data.get("message") or error.get("name") or "the run failed"))
                report.answer = said or ""
        return report


HOST = Opencode()


def config_dir() -> Path:
    """`$XDG_CONFIG_HOME/opencode`, default `~/.config/opencode` (opencode reads it there on
    every platform)."""
    base = os.environ.get("XDG_CONFIG_HOME")
    return (Path(base) if base else Path.home() / ".config") / "opencode"


def opencode_version(program: str | None = None) -> Version | None:
    """`opencode --version` ("1.18.33"), or None when there is none on PATH or it does not answer."""
    import re
    import shutil

    from agent_bridge.hosts.base import version_output

    printed = version_output(program or shutil.which("opencode"))
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", printed) if printed is not None else None
    if match is None:
        return None
    major, minor, patch = (int(g) for g in match.groups())
    return major, minor, patch


# --- the JSONC config, edited in place --------------------------------------------------------


def load_jsonc(path: Path, text: str | None) -> dict[str, Any]:
    from agent_bridge.hosts import jsonedit
    from agent_bridge.hosts.hostconfig import ConfigError

    if text is None or not text.strip():
        return {}
    try:
        data = jsonedit.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{path} is not valid JSON with comments ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a JSON object, found {type(data).__name__}")
    return data


def edit_jsonc(path: Path, mutate: Any, *, private: bool) -> FileEdit:
    """As hosts.edits.edit_json, for a JSONC file: edited in place around its comments (or written
    anew when it is new or blank); an edit whose result does not parse to the document wanted is
    refused."""
    import copy
    import json

    from agent_bridge.hosts import jsonedit
    from agent_bridge.hosts.edits import (
        NOTHING_CHANGED,
        FileEdit,
        InstallError,
        dump_json_like,
        filled_empty,
        read_record,
    )
    from agent_bridge.hosts.hostconfig import ConfigError

    try:
        with open(path, encoding="utf-8", newline="") as f:
            before: str | None = f.read()
    except FileNotFoundError:
        before = None
    except (OSError, UnicodeDecodeError) as exc:
        raise InstallError(f"cannot read {path}: {exc}; {NOTHING_CHANGED}") from None
    try:
        data = load_jsonc(path, before)
    except ConfigError as exc:
        raise InstallError(f"{exc}; {NOTHING_CHANGED}") from None
    updated = copy.deepcopy(data)
    notes: list[str] = []
    mutate(updated, notes)
    if updated == data:
        return FileEdit(path, before, before, [], private, exact=True)
    if not updated and before is not None and () not in read_record().get(str(path), []):
        # nothing else in it, and install did not find it as `{}`: install made it
        return FileEdit(path, before, None, [*notes, "deleted the file (nothing else was in it)"], private,
                        exact=True)
    if before is None or not before.strip():
        return FileEdit(path, before, dump_json_like(updated, before), notes, private, exact=True)
    try:
        after = jsonedit.rewrite(before, data, updated)
        ok = jsonedit.loads(after) == updated
    except (jsonedit.EditError, ValueError, RecursionError):
        ok = False
    if not ok:
        raise InstallError(f"{path}: cannot edit it in place, keeping its comments; add the entry by hand:\n"
                           + json.dumps({"mcp": {"agent-bridge": updated.get("mcp", {}).get("agent-bridge")}},
                                        indent=2))
    return FileEdit(path, before, after, notes, private, filled_empty(data, updated), exact=True)


def ensure_server(data: dict[str, Any], notes: list[str], path: Path, command: list[str],
                  env: dict[str, str]) -> None:
    """`mcp.agent-bridge` as opencode documents a local server (other keys of the entry stay)."""
    from agent_bridge.hosts.edits import SERVER_NAME, InstallError

    servers = data.setdefault("mcp", {})
    if not isinstance(servers, dict):
        raise InstallError(f'{path}: "mcp" must be a JSON object. Nothing was changed.')
    current = servers.get(SERVER_NAME)
    if current is not None and not isinstance(current, dict):
        raise InstallError(f'{path}: "mcp.{SERVER_NAME}" must be a JSON object. Nothing was changed.')
    entry = dict(current or {})
    entry.update({"type": "local", "command": command})
    given = entry.get("environment")
    environment = {}
    if isinstance(given, dict):
        environment = {k: v for k, v in given.items() if k != "AGENT_BRIDGE_HOME"}
    environment.update(env)
    if environment:
        entry["environment"] = environment
    else:
        entry.pop("environment", None)
    entry["enabled"] = True
    if entry != current:
        servers[SERVER_NAME] = entry
        notes.append(f'{"added" if current is None else "updated"} MCP server "{SERVER_NAME}"')


def remove_server(data: dict[str, Any], notes: list[str], *, path: Path) -> None:
    """Remove `mcp.agent-bridge`; an `mcp` object left empty goes too, unless install found it empty."""
    from agent_bridge.hosts.edits import SERVER_NAME, read_record

    servers = data.get("mcp")
    if not isinstance(servers, dict) or SERVER_NAME not in servers:
        return
    del servers[SERVER_NAME]
    notes.append(f'removed MCP server "{SERVER_NAME}"')
    if not servers and ("mcp",) not in read_record().get(str(path), []):
        del data["mcp"]
