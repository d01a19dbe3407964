"""Codex: where it keeps its MCP servers and hooks, what its hooks print, what doctor checks.

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
- Hook answers (codex-rs/hooks/schema/generated/*.command.output.schema.json): SessionStart adds
  `hookSpecificOutput.additionalContext`; Stop blocks with `{"decision": "block", "reason"}`.
- Trust: Codex runs a hook only once the user trusted it, and reads a project's `.codex` only in a
  trusted project; doctor asks the installed Codex (`codex app-server`) rather than guessing.

Process: the `codex` program (seen with Codex 0.171). One process may run several threads
(conversations), so a new thread id does not replace the others. It passes the thread id in
each tool call's `_meta["x-codex-turn-metadata"]`.

Light at import (the hooks load it): subprocess, json and the edit and check helpers
(hosts.edits, hosts.checks) are imported inside the functions that use them.
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
    json_lines,
    one_line,
)

if TYPE_CHECKING:
    from tomlkit.toml_document import TOMLDocument

    from agent_bridge.hosts.edits import FileEdit

QUEUE_TIMEOUT = 30.0  # seconds for `codex queue`; it answered in 0.16 s here
# Idle wake through `codex queue` (runs_waiter): on unless "0"; "1" also where no TUI is known
# (wakes_only_in_front)
WAKE_ENV = "AGENT_BRIDGE_CODEX_WAKE"
HOOKS_KEY_SINCE = (0, 130, 0)  # Codex renamed [features] codex_hooks to hooks (on by default)
TABLE_MARK = "agent-bridge: added by `agent-bridge install`"  # comment above our [mcp_servers] table
ADDED_MARK = "added by agent-bridge install"  # trailing comment of a feature key install added
SWITCHED_MARK = "switched on by agent-bridge install (was false)"
# Marks a turn's start, so that the idle-wake waiter leaves a busy session's messages to PostToolUse and Stop.
PROMPT_HOOK: tuple[str, str, dict[str, Any]] = ("UserPromptSubmit", "user-prompt-submit", {})
# A turn cut short (Esc) runs no Stop hook but this one (seen with 0.171.0): the session is idle.
# Codex 0.171.0 clamps an Interrupt hook's timeout to 3 s, with a warning on the screen (seen).
INTERRUPT_HOOK: tuple[str, str, dict[str, Any]] = ("Interrupt", "interrupt", {"timeout": 3})


JOB_SINCE = (0, 171, 0)  # the newest Codex whose `exec` flags were checked (tests/hosts/test_job_hosts.py)


class Codex(Host):
    name = "codex"
    title = "Codex"
    process_prefixes = ("codex",)
    exclusive = False

    def is_set_up(self) -> bool:
        return codex_home().is_dir()

    def config_file(self, scope: str, cwd: Path) -> Path:
        return cwd / ".codex" / "config.toml" if scope == "project" else codex_home() / "config.toml"

    def hooks_file(self, scope: str, cwd: Path) -> Path:
        return cwd / ".codex" / "hooks.json" if scope == "project" else codex_home() / "hooks.json"

    def install_edits(self, scope: str, cwd: Path, run: list[str], env: dict[str, str],
                      *, private: bool, version: tuple[int, int, int] | None = None) -> list[FileEdit]:
        """`version`: the installed Codex's, asked of `codex --version` when not given."""
        from agent_bridge.hosts.edits import hooks_edit, mcp_args

        version = codex_version() if version is None else version
        command, args = mcp_args(run, self.name)
        return [
            edit_codex_config(
                self.config_file(scope, cwd), command, args, env, private=private, version=version
            ),
            hooks_edit(
                self.hooks_file(scope, cwd), run, self.name, env, private=private,
                extra=(PROMPT_HOOK, INTERRUPT_HOOK)
            ),
        ]

    def uninstall_edits(self, scope: str, cwd: Path, *, private: bool) -> list[FileEdit]:
        from agent_bridge.hosts.edits import hooks_removal

        return [remove_codex_config(self.config_file(scope, cwd), private=private),
                hooks_removal(self.hooks_file(scope, cwd), private=private)]

    spawned_waiter = True  # Codex hooks have no background mode: the Stop hook starts the waiter

    def runs_waiter(self, hook: HookInput, env: Any) -> bool:
        """Unless turned off (AGENT_BRIDGE_CODEX_WAKE=0 where Codex runs), with a codex on PATH for
        `codex queue`. Seen with Codex 0.171.0: an interactive Codex runs its hooks, and keeps its
        threads, in an app-server daemon its TUI starts, which outlives the TUI; a message queued
        after the TUI quit still runs a turn there, with nobody watching. So the waiter wakes only
        while that TUI runs (`wakes_only_in_front`)."""
        return env.get(WAKE_ENV) != "0" and codex_program() is not None and bool(hook.session_id)

    def wakes_only_in_front(self, env: Any) -> bool:
        """Yes, unless AGENT_BRIDGE_CODEX_WAKE=1 says to wake where the hooks cannot name the TUI
        too: a TUI that joined a daemon an earlier TUI left running (`codex resume` after `/quit`,
        seen with 0.171.0) runs its hooks in a daemon nobody's child, and a `codex exec` run (in
        the terminal's session) is itself the host; its waiter ends with the run."""
        return bool(env.get(WAKE_ENV) != "1")

    # Seen with 0.171.0 in the TUI: after Esc, `codex queue --resume` exits 0 but no turn runs.
    wakes_after_interrupt = False

    def turn_interrupted(self, hook: HookInput, since: float) -> bool:
        """Codex runs its Interrupt hooks then (`agent_bridge.hooks.interrupt` marks the session
        idle): nothing to look for."""
        return False

    def owner_types(self, env: Any) -> bool:
        """Nothing a Codex 0.171 hook sees tells `codex exec` from its TUI (both run the hooks with
        the same input): yes. A `codex exec` started with `--job` has a job record, which the
        UserPromptSubmit hook checks besides."""
        return True

    def prompt_queued(self, hook: HookInput) -> bool:
        """Not known for Codex: nothing it shows a Stop hook was seen to say so (0.171.0). A prompt
        typed during a turn there runs as the next turn, marked busy by its UserPromptSubmit hook
        only if that runs when it starts (not verified)."""
        return False

    def wake(self, text: str, hook: HookInput) -> bool:
        """`codex queue --thread ID --message TEXT --resume` (Codex 0.171): an idle interactive
        session runs it as a new turn at once (seen 0.18 s after the call), as a user message, so
        `text` is framed as not coming from the user. True when Codex says it queued it (exit 0).
        It cannot reach a running `codex exec` ("already has an active writer"), and without an
        app-server daemon it only queues for the next resume."""
        import subprocess

        program = codex_program()
        if program is None:
            return False
        try:
            done = subprocess.run(
                [program, "queue", "--thread", hook.session_id, "--message", text, "--resume"],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=QUEUE_TIMEOUT,
            )
        except (OSError, subprocess.SubprocessError):
            return False
        return done.returncode == 0

    def tools_sentence(self) -> str:
        # Codex 0.171 gives the model the MCP tools as functions of one namespace, mcp__agent_bridge.
        return ("Message other agent sessions (Claude Code too, and sessions not running) with the "
                "mcp__agent_bridge tools `send`, `inbox`, `decisions`.")

    def next_step(self, scope: str) -> str:
        return (
            "Codex: start a new session; review and trust the new hooks with /hooks when Codex asks"
            + ("; project config is read only in a trusted project" if scope == "project" else "")
            + "."
        )

    def doctor_checks(self, home: Path, cwd: Path) -> list[Check]:
        return codex_checks(home, cwd)

    # --- jobs (SPEC §4.7): `codex exec`, the bridge in `-c` overrides ------------------------

    def job_check(self) -> str | None:
        if codex_program() is None:
            return "codex is not on PATH: install it (npm install -g @openai/codex)"
        version = codex_version()
        if version is None or version < JOB_SINCE:
            return (f"Codex {'.'.join(map(str, JOB_SINCE))} or newer runs jobs; "
                    "update it (npm install -g @openai/codex)")
        return None

    def job_command(self, launch: JobLaunch) -> JobCommand:
        """`codex exec --json`, the prompt on stdin (`-`: nothing the agent wrote is read as a flag),
        the job's bridge as a required MCP server given by `-c` (so it is there whatever install
        did), access by Codex's own sandbox (`-s read-only`: a write by the model's shell or patch
        tool fails, seen with 0.171.0; `workspace-write` for edit). Hooks given this way would not
        be trusted, and `codex exec` skips untrusted hooks, so the decisions note goes before the
        task. `codex exec resume THREAD -` continues a thread."""
        from agent_bridge.hosts.edits import mcp_command

        server = "mcp_servers.agent-bridge"
        command = mcp_command(launch.bridge)
        env = launch.env.items()
        sandbox = "read-only" if launch.access == "read" else "workspace-write"
        argv = [codex_program() or "codex", "exec"]
        if launch.thread:
            argv += ["resume", launch.thread]
        argv += ["--json", "--skip-git-repo-check",
                 "-c", f"{server}.command={toml_string(command[0])}",
                 "-c", f"{server}.args=[{', '.join(toml_string(a) for a in command[1:])}]",
                 "-c", f"{server}.env={{{', '.join(f'{k} = {toml_string(v)}' for k, v in env)}}}",
                 "-c", f"{server}.required=true",
                 "-c", f'{server}.default_tools_approval_mode="approve"',  # nobody to approve in exec
                 "-c", f"sandbox_mode={toml_string(sandbox)}",
                 "-c", 'approval_policy="never"']
        if launch.model:
            argv += ["-c", f"model={toml_string(launch.model)}"]
        argv.append("-")
        task = launch.task if launch.thread or not launch.note else f"{launch.note}\n\n{launch.task}"
        return JobCommand(argv, {}, task.encode("utf-8"))

    def job_report(self, stdout: bytes) -> JobReport:
        """`codex exec --json` (0.171.0): `thread.started` carries `thread_id`; `item.completed`
        items are the steps (`agent_message` text is the answer so far); `turn.failed` and `error`
        end a run in error; `turn.completed` ends it."""
        report = JobReport()
        said: str | None = None
        for event in json_lines(stdout):
            kind = event.get("type")
            item = event.get("item") if isinstance(event.get("item"), dict) else {}
            if kind == "thread.started" and isinstance(event.get("thread_id"), str):
                report.thread = event["thread_id"]
            elif kind == "item.completed" and item:
                if item.get("type") == "agent_message":
                    said = str(item.get("text") or "")
                    report.last_step = one_line(said)
                elif item.get("type") == "command_execution":
                    report.last_step = one_line(f"$ {item.get('command')}")
                elif item.get("type") == "mcp_tool_call":
                    report.last_step = one_line(f"{item.get('server')}.{item.get('tool')}")
                elif item.get("type") == "file_change":
                    report.last_step = one_line("edit " + " ".join(
                        str(c.get("path")) for c in item.get("changes") or () if isinstance(c, dict)))
            elif kind == "turn.completed":
                report.answer = said or ""
            elif kind in ("turn.failed", "error"):
                error = event.get("error")
                said_error = (error if isinstance(error, dict) else event).get("message")
                report.failed = one_line(str(said_error or "the run failed"))
                report.answer = said or ""
        return report


def toml_string(value: str) -> str:
    """`value` as a TOML basic string, for a `-c key=value` override (JSON's escapes are TOML's)."""
    import json

    return json.dumps(value, ensure_ascii=False)


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

    _ensure_hooks_feature(path, data, expected, doc, notes, feature if version else None, manual)
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


def _ensure_hooks_feature(path: Path, data: dict[str, Any], expected: dict[str, Any], doc: TOMLDocument,
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


# --- doctor: ask Codex itself ------------------------------------------------------------

APP_SERVER_TIMEOUT = 15.0  # seconds for the whole `codex app-server` exchange (about 0.4 s here)


class ProbeError(Exception):
    pass


def codex_app_server(program: str, cwd: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(config layers, hooks) as the installed Codex sees them for `cwd`: `codex app-server`'s
    `config/read` (with `includeLayers`: a project layer Codex ignores carries `disabledReason`)
    and `hooks/list` (each hook's `key`, `sourcePath`, `command`, `currentHash`, `trustStatus`).
    Read-only: it starts no session, and with plugins off it contacts nothing."""
    import json
    import subprocess
    import threading

    from agent_bridge.common import jsonlimit

    requests = [
        {
            "id": 1,
            "method": "initialize",
            "params": {"clientInfo": {"name": "agent-bridge-doctor", "version": "1"}},
        },
        {"method": "initialized"},
        {"id": 2, "method": "config/read", "params": {"cwd": str(cwd), "includeLayers": True}},
        {"id": 3, "method": "hooks/list", "params": {"cwds": [str(cwd)]}},
    ]
    # Plugins off for this probe: with them, Codex 0.171 looks up its plugin marketplace on the
    # network at start (seen as a DNS query); the answers asked for here do not depend on them.
    try:
        proc = subprocess.Popen(
            [program, "-c", "features.plugins=false", "app-server"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=cwd,
        )
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
                message = jsonlimit.loads(line)
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
            raise ProbeError(
                f"{program} app-server did not answer (it exited, or took over {APP_SERVER_TIMEOUT:.0f} s)"
            )
        error = answers[n].get("error")
        if error is not None:
            raise ProbeError(
                f"{program} app-server: {error.get('message', error) if isinstance(error, dict) else error}"
            )
    layers = answers[2].get("result", {}).get("layers") or []
    hooks = [h for entry in answers[3].get("result", {}).get("data") or [] for h in entry.get("hooks") or []]
    return layers, hooks


# hooks/list eventName -> our hook (the names Codex 0.171's app-server gives)
_CODEX_EVENTS = {"sessionStart": "session-start", "postToolUse": "post-tool-use", "stop": "stop",
                 "userPromptSubmit": "user-prompt-submit"}


def codex_trust_checks(program: str, cwd: Path, project_dir: Path, in_project: bool) -> list[Check]:
    import tomlkit

    from agent_bridge.hosts.edits import is_our_hook

    try:
        layers, hooks = codex_app_server(program, cwd)
    except ProbeError as exc:
        return [
            Check("Codex hooks trust", WARN, f"could not ask Codex: {exc}", "run `codex` and check /hooks")
        ]
    checks = []
    ignored = [
        layer
        for layer in layers
        if isinstance(layer, dict)
        and (layer.get("name") or {}).get("type") == "project"
        and layer.get("disabledReason")
    ]
    if in_project:
        if ignored:
            checks.append(
                Check(
                    "Codex project config",
                    FAIL,
                    f"Codex ignores {project_dir}: {ignored[0]['disabledReason']}",
                    f"trust the project: start `codex` in {cwd} and accept the trust prompt, or run "
                    f'`codex exec --trust` there once, or add [projects."{cwd}"] trust_level = "trusted" '
                    f'to {codex_home() / "config.toml"}',
                )
            )
        else:
            checks.append(Check("Codex project config", OK, f"{project_dir} is read (trusted project)"))
    ours = [h for h in hooks if isinstance(h, dict) and h.get("eventName") in _CODEX_EVENTS
            and is_our_hook(h.get("command"), _CODEX_EVENTS[h["eventName"]])]
    untrusted = [h for h in ours if h.get("trustStatus") != "trusted" and not h.get("isManaged")]
    config = codex_home() / "config.toml"
    if not ours:
        checks.append(Check("Codex hooks trust", SKIP, "Codex lists no agent-bridge hook here"))
    elif untrusted:
        snippet = "".join(
            f"\n  [hooks.state.{tomlkit.string(str(h.get('key'))).as_string()}]\n  trusted_hash = "
            f"{tomlkit.string(str(h.get('currentHash'))).as_string()}"
            for h in untrusted
        )
        states = ", ".join(sorted({str(h.get("trustStatus")) for h in untrusted}))
        checks.append(
            Check(
                "Codex hooks trust",
                FAIL,
                f"{len(untrusted)} agent-bridge hook(s) not trusted ({states}): Codex skips them, "
                "`codex exec` without a word",
                "start `codex`, open /hooks and trust the agent-bridge SessionStart, PostToolUse and Stop "
                f"hooks; or, having read them, add to {config}:{snippet}",
            )
        )
    else:
        checks.append(Check("Codex hooks trust", OK, f"{len(ours)} agent-bridge hooks trusted"))
    return checks


def codex_checks(home: Path, cwd: Path) -> list[Check]:
    from agent_bridge.hosts.checks import (
        SERVER,
        duplicate_hooks,
        hooks_check,
        load_toml,
        our_hook_commands,
        reach_check,
        registered_events,
        server_check,
    )

    user_dir = codex_home()
    project_dir = cwd / ".codex"
    if not user_dir.is_dir() and not project_dir.is_dir():
        return [Check("Codex", SKIP, f"no {user_dir} folder: Codex not set up for this user")]
    fix = "agent-bridge install --codex"
    candidates: list[tuple[str, Any, str | None]] = []
    features: list[tuple[Path, dict[str, Any]]] = []
    in_project = False
    for config in (user_dir / "config.toml", project_dir / "config.toml"):
        data, error = load_toml(config)
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
    in_project = in_project or bool(our_hook_commands(project_hooks))
    found = [server_check("Codex MCP server", candidates, home, fix, env_required=True),
             hooks_check("Codex hooks", user_hooks + project_hooks, home, fix)]
    program = codex_program()
    version = codex_version(program) if program else None
    found.append(_codex_feature_check(features, version, fix))
    if program is None:
        found.append(
            Check("Codex hooks trust", SKIP, "no codex on PATH: cannot ask Codex whether it trusts the hooks")
        )
    else:
        found += codex_trust_checks(program, cwd, project_dir, in_project)
    found.append(
        reach_check(
            "Codex",
            registered_events(user_hooks + project_hooks),
            "the block decision (Codex has no additionalContext on Stop)",
            codex_wake_text(os.environ.get(WAKE_ENV)),
        )
    )
    twice = duplicate_hooks(user_hooks, project_hooks, same_command_runs_once=False)
    if twice:
        found.append(
            Check(
                "Codex hooks scope",
                FAIL,
                "registered at user and project scope ("
                + "; ".join(twice)
                + "): Codex runs the matching hooks of every file, so each runs twice",
                "keep one: agent-bridge uninstall --codex --scope project (or --scope user)",
            )
        )
    return found


def _codex_feature_check(features: list[tuple[Path, dict[str, Any]]], version: tuple[int, int, int] | None,
                         fix: str) -> Check:
    name = "Codex hooks feature"
    wanted = hooks_feature_key(version)
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


HOST = Codex()


def codex_wake_text(setting: str | None) -> str:
    """doctor's line on Codex's idle wake, for AGENT_BRIDGE_CODEX_WAKE's value here."""
    if setting == "0":
        return "off (AGENT_BRIDGE_CODEX_WAKE=0 here): an idle Codex sees a message at its next turn"
    when = (
        "; also where no TUI is known (AGENT_BRIDGE_CODEX_WAKE=1 here)" if setting == "1" else
        ". It does not fire: in `codex exec`; in a TUI of `codex resume` that joined an app-server "
        "daemon an earlier TUI left running (its hooks cannot tell whether that TUI is open: "
        "AGENT_BRIDGE_CODEX_WAKE=1 wakes there too); after Esc (Codex runs no queued turn then); "
        "there the message waits for the next turn"
    )
    return ("`codex queue` by a waiter the Stop or Interrupt hook starts, on by default, while the TUI "
            "that started the session's app-server daemon runs (its daemon outlives it)" + when)
