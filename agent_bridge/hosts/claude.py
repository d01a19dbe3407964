"""Claude Code: where it keeps its MCP servers and hooks, what its hooks print, what doctor checks.

Configuration (the files and keys Claude Code documents):
- MCP servers: "Connect Claude Code to tools via MCP", MCP installation scopes
  (https://code.claude.com/docs/en/mcp#mcp-installation-scopes): user scope is the top-level
  `mcpServers` object of `~/.claude.json`; project scope is `.mcp.json` at the project root.
  Entry shape as `claude mcp add` writes it: `{"type": "stdio", "command", "args", "env"}`.
- Hooks: "Hooks reference" (https://code.claude.com/docs/en/hooks#configuration) and "Settings"
  (https://code.claude.com/docs/en/settings): the `hooks` object of `~/.claude/settings.json`
  (user) or `.claude/settings.json` (project): event -> [matcher group {"matcher"?, "hooks":
  [{"type": "command", "command", "timeout"}]}]. SessionStart, PostToolUse and Stop need no matcher
  (none: every source, every tool).
- Hook answers ("Hooks reference", #sessionstart, #posttooluse and #stop): SessionStart and
  PostToolUse add `hookSpecificOutput.additionalContext`; Stop blocks with `{"decision": "block",
  "reason"}`, which Claude reads as its next instruction. From 2.1.163 (its changelog) Stop also
  takes `hookSpecificOutput.additionalContext`, which keeps the turn going without the TUI's
  "Stop hook reported a problem" label and without the "blocking error from command" system
  message that repeats the hook's command line to the model (both seen with 2.1.332): the Stop
  hook answers so when the running Claude Code is that new (`stop_output`).
- Which Claude Code runs the session: every entry Claude Code writes to the session transcript
  (`transcript_path` in each hook input) carries `"version"` (seen with 2.1.197 and 2.1.332). The
  transcript is the running host's own record of itself, so a Stop hook reads it there rather than
  asking `claude --version` (another install may be on PATH, and it costs a process).

Process: the `claude` program (its process name, seen with Claude Code 2.1.197). One conversation
per process: `/clear` gives the same process a new session id, which replaces the old one.
It passes its session id to MCP servers in CLAUDE_CODE_SESSION_ID.
"""

from __future__ import annotations

from functools import partial
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
    from agent_bridge.hosts.edits import FileEdit

Version = tuple[int, int, int]
STOP_CONTEXT_SINCE: Version = (2, 1, 163)  # Stop takes hookSpecificOutput.additionalContext (changelog)
# `asyncRewake` hooks run in the background and wake the model on exit 2: seen with 2.1.332 (the
# key is in 2.1.197's settings schema too, but no run of it was seen, so it is not relied on).
ASYNC_REWAKE_SINCE: Version = (2, 1, 332)
# seconds Claude Code lets the waiter run (its hook `timeout`); it ends with its host anyway
WAKE_TIMEOUT = 86_400
# The waiter's Stop handler (agent_bridge/hooks/wake.py). Registered whatever the installed version:
# the waiter itself leaves at once where the running Claude Code would not run it in the background.
WAKE_HOOK = ("Stop", "wake", {"asyncRewake": True, "timeout": WAKE_TIMEOUT})
# Marks a turn's start, so that the waiter leaves a busy session's messages to PostToolUse and Stop.
PROMPT_HOOK: tuple[str, str, dict[str, Any]] = ("UserPromptSubmit", "user-prompt-submit", {})
# Jobs: the newest Claude Code whose `-p` flags were checked (tests/hosts/test_job_hosts.py).
JOB_SINCE: Version = (2, 1, 332)
JOB_HOOK_TIMEOUT = 30  # seconds for a job's SessionStart and PostToolUse hooks
# A job's SessionStart hook runs when its session resumes (`continue`) or is compacted, not at its
# start: the first run's note goes before the task, as for Codex (the hook, a Python process
# beside the MCP server's, cost the start about 100 ms, docs/performance.md).
JOB_SESSION_START = "resume|compact"
# Every built-in tool that edits files or runs commands (2.1.332's tool names): denied under read.
READ_DENIED = ("Bash", "Edit", "Write", "NotebookEdit", "MultiEdit", "BashOutput", "KillShell")
TRANSCRIPT_TAIL = 64 << 10  # bytes read from the end of a transcript per step when looking for a version
TRANSCRIPT_TAIL_MAX = 4 << 20  # give up (and answer as for an older host) past this much of the tail


class Claude(Host):
    name = "claude"
    title = "Claude Code"
    process_prefixes = ("claude",)
    exclusive = True
    session_env = "CLAUDE_CODE_SESSION_ID"

    def is_set_up(self) -> bool:
        return (Path.home() / ".claude").is_dir() or (Path.home() / ".claude.json").is_file()

    def mcp_file(self, scope: str, cwd: Path) -> Path:
        return cwd / ".mcp.json" if scope == "project" else Path.home() / ".claude.json"

    def hooks_file(self, scope: str, cwd: Path) -> Path:
        return (cwd if scope == "project" else Path.home()) / ".claude" / "settings.json"

    def install_edits(self, scope: str, cwd: Path, run: list[str], env: dict[str, str],
                      *, private: bool) -> list[FileEdit]:
        from agent_bridge.hosts.edits import edit_json, ensure_json_server, hooks_edit, mcp_args

        server_file = self.mcp_file(scope, cwd)
        command, args = mcp_args(run, self.name)
        ensure = partial(ensure_json_server, path=server_file, command=command, args=args, env=env)
        return [edit_json(server_file, ensure, private=private),
                hooks_edit(self.hooks_file(scope, cwd), run, self.name, env, private=private,
                                   extra=(WAKE_HOOK, PROMPT_HOOK)),
                *self.command_edits(scope, cwd, run, env, private=private)]

    def commands_folder(self, scope: str, cwd: Path) -> Path:
        """Where Claude Code reads custom commands: `~/.claude/commands` (user) or
        `<project>/.claude/commands`; `commands/agent-bridge/send.md` is `/agent-bridge:send`
        (seen with 2.1.332)."""
        return (cwd if scope == "project" else Path.home()) / ".claude" / "commands"

    def command_edits(self, scope: str, cwd: Path, run: list[str] | None, env: dict[str, str],
                      *, private: bool) -> list[FileEdit]:
        """The owner's slash commands (agent_bridge.hosts.slash): written for `run`, removed when None."""
        import shlex

        from agent_bridge.hosts import slash
        from agent_bridge.hosts.edits import owned_file_edit

        folder = self.commands_folder(scope, cwd)
        prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in env.items())
        return [
            owned_file_edit(
                slash.command_path(folder, name),
                None if run is None else slash.command_text(name, prefix + shlex.join([*run, "slash", name])),
                slash.is_ours, private=private, prune=(folder / slash.NAMESPACE, folder),
            )
            for name in slash.COMMANDS
        ]

    def uninstall_edits(self, scope: str, cwd: Path, *, private: bool) -> list[FileEdit]:
        from agent_bridge.hosts.edits import edit_json, hooks_removal, remove_json_server

        server_file = self.mcp_file(scope, cwd)
        return [edit_json(server_file, partial(remove_json_server, path=server_file), private=private),
                hooks_removal(self.hooks_file(scope, cwd), private=private),
                *self.command_edits(scope, cwd, None, {}, private=private)]

    def tools_sentence(self) -> str:
        # The names Claude Code 2.1.332 lists its deferred MCP tools under (ToolSearch "select:" takes
        # them); its own SendMessage reaches running Claude Code sessions only.
        return (
            "Message other agent sessions with `mcp__agent-bridge__send`, `…inbox`, `…decisions`: they reach "
            "Codex and sessions not running too, which SendMessage does not."
        )

    def runs_waiter(self, hook: HookInput, env: Any) -> bool:
        """Claude Code 2.1.332+ runs an asyncRewake hook in the background, but not under `-p`:
        there (CLAUDE_CODE_ENTRYPOINT=sdk-cli, seen with 2.1.332) it runs synchronously and
        would hold the run open until the hook's timeout."""
        if env.get("CLAUDE_CODE_ENTRYPOINT") == "sdk-cli":
            return False
        version = transcript_version(hook.transcript_path)
        return version is not None and version >= ASYNC_REWAKE_SINCE

    def owner_types(self, env: Any) -> bool:
        """Not under `claude -p` (CLAUDE_CODE_ENTRYPOINT=sdk-cli, seen with 2.1.332): a script's prompt."""
        return bool(env.get("CLAUDE_CODE_ENTRYPOINT") != "sdk-cli")

    def prompt_queued(self, hook: HookInput) -> bool:
        """A prompt typed while a turn runs is queued, its UserPromptSubmit hook run at once, and it
        runs as the next turn once the Stop hooks are done (seen with 2.1.332 in the TUI: the
        transcript's `queue-operation` entries "enqueue" after that hook, "dequeue" when it runs)."""
        return queued_prompts(hook.transcript_path) > 0

    def wakes_only_in_front(self, env: Any) -> bool:
        """The waiter is Claude Code's own background hook (not spawned): it ends with the host."""
        return True

    def turn_interrupted(self, hook: HookInput, since: float) -> bool:
        """Esc runs no hook in Claude Code 2.1.332 (no Stop, StopFailure or Notification: seen in
        its TUI); it writes a user entry with `interruptedMessageId` ("[Request interrupted by
        user]") to the transcript. One written after `since` ended the busy turn."""
        return interrupted_at(hook.transcript_path) > since

    def wake(self, text: str, hook: HookInput) -> bool:
        """asyncRewake: the hook's stderr, given to the model when it exits 2 (which it does next)."""
        import os

        view = memoryview((text + "\n").encode("utf-8"))
        while view:
            view = view[os.write(2, view):]
        return True

    def stop_output(self, reason: str, hook: HookInput | None = None) -> dict[str, Any]:
        """additionalContext when the running Claude Code takes it on Stop (2.1.163+), else the
        block decision, which every version takes."""
        version = transcript_version(hook.transcript_path) if hook is not None else None
        if stop_takes_context(version):
            return {"hookSpecificOutput": {"hookEventName": "Stop", "additionalContext": reason}}
        return {"decision": "block", "reason": reason}

    def next_step(self, scope: str) -> str:
        return (
            "Claude Code: start a new session (or run /mcp to reconnect); "
            + ("approve the project's .mcp.json server when asked; " if scope == "project" else "")
            + "/hooks lists the SessionStart, PostToolUse and Stop hooks; /agent-bridge:inbox, :send, "
            ":questions, :answer, :decide and :jobs run your commands there."
        )

    def doctor_checks(self, home: Path, cwd: Path) -> list[Check]:
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
        found.append(self.commands_check(cwd, fix))
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

    def commands_check(self, cwd: Path, fix: str) -> Check:
        """The owner's slash commands (agent_bridge.hosts.slash), at either scope."""
        from agent_bridge.hosts import slash

        name = "Claude Code slash commands"
        for scope in ("user", "project"):
            folder = self.commands_folder(scope, cwd)
            paths = [slash.command_path(folder, n) for n in slash.COMMANDS]
            ours = [p for p in paths
                    if p.is_file() and slash.is_ours(p.read_text(encoding="utf-8", errors="replace"))]
            if len(ours) == len(paths):
                return Check(name, OK, f"/{slash.NAMESPACE}:{', :'.join(slash.COMMANDS)} ({scope} scope)")
            if ours:
                missing = ", ".join(p.name for p in paths if p not in ours)
                return Check(name, WARN, f"{scope} scope lacks {missing} in {folder / slash.NAMESPACE}", fix)
        return Check(name, WARN, f"none installed (/{slash.NAMESPACE}:send, :inbox, …)", fix)

    # --- jobs (SPEC §4.7): `claude -p`, the bridge on its command line ---------------------

    def job_check(self) -> str | None:
        import shutil

        program = shutil.which("claude")
        if program is None:
            return ("claude (Claude Code) is not on PATH: "
                    "install it (npm install -g @anthropic-ai/claude-code)")
        version = claude_version()
        if version is None or version < JOB_SINCE:
            return (f"Claude Code {'.'.join(map(str, JOB_SINCE))} or newer runs jobs; "
                    "update it (npm install -g @anthropic-ai/claude-code)")
        return None

    def job_command(self, launch: JobLaunch) -> JobCommand:
        """`claude -p` reading its prompt from stdin (so nothing the agent wrote is read as a flag),
        streaming JSON lines, with only the job's bridge as MCP server (`--strict-mcp-config`;
        hosts.edits.mcp_command) and the bridge's SessionStart and PostToolUse hooks (`--settings`).
        SessionStart runs on `resume` and `compact` only: a first run's note goes before the task,
        as for Codex, and the session starts without waiting for the hook. Read access denies every
        tool that edits or runs commands (`--disallowedTools`, seen with 2.1.332: the model gets
        "No such tool available" and nothing is written), not a permission mode alone; edit access
        is `acceptEdits`. The bridge's tools are allowed by name: `-p` has nobody to approve them."""
        import json

        from agent_bridge.hosts.edits import hook_command, mcp_command

        run = launch.bridge[: launch.bridge.index("mcp")]
        server = mcp_command(launch.bridge)
        servers = {"mcpServers": {"agent-bridge": {
            "type": "stdio", "command": server[0], "args": server[1:], "env": launch.env}}}
        hooks: dict[str, list[dict[str, Any]]] = {
            event: [{"hooks": [{"type": "command", "timeout": JOB_HOOK_TIMEOUT,
                                "command": hook_command(run, arg, self.name, launch.env)}]}]
            for event, arg in (("SessionStart", "session-start"), ("PostToolUse", "post-tool-use"))
        }
        hooks["SessionStart"][0]["matcher"] = JOB_SESSION_START
        argv = [shutil_which_or("claude"), "-p", "--output-format", "stream-json", "--verbose",
                "--mcp-config", json.dumps(servers), "--strict-mcp-config",
                "--settings", json.dumps({"hooks": hooks}),
                "--allowedTools", "mcp__agent-bridge"]
        if launch.access == "read":
            argv += ["--disallowedTools", *READ_DENIED, "--permission-mode", "default"]
        else:
            argv += ["--permission-mode", "acceptEdits"]
        if launch.model:
            argv.append(f"--model={launch.model}")
        argv += ["--resume", launch.thread] if launch.thread else ["--session-id", launch.job_id]
        # `-p` may send its first request before its MCP servers connect unless told to wait
        # (NOTES: MCP_CONNECTION_NONBLOCKING=0); a job's first step should have the bridge's tools
        env = {"CLAUDE_CODE_ENTRYPOINT": "sdk-cli", "MCP_CONNECTION_NONBLOCKING": "0"}
        task = launch.task if launch.thread or not launch.note else f"{launch.note}\n\n{launch.task}"
        return JobCommand(argv, env, task.encode("utf-8"))

    def job_report(self, stdout: bytes) -> JobReport:
        """stream-json (2.1.332): `system`/`init` carries `session_id`; each `assistant` message's
        content blocks are the steps; the last line, `result`, carries the answer (`result`) and
        `is_error`."""
        report = JobReport()
        for event in json_lines(stdout):
            if isinstance(event.get("session_id"), str):
                report.thread = event["session_id"]
            kind = event.get("type")
            if kind == "assistant":
                step = claude_step(event.get("message"))
                if step:
                    report.last_step = step
            elif kind == "result":
                text = event.get("result")
                if event.get("is_error") or event.get("subtype") != "success":
                    report.failed = one_line(str(text or event.get("subtype") or "the run failed"))
                report.answer = text if isinstance(text, str) else ""
        return report




def claude_version() -> Version | None:
    """The version of the `claude` on PATH ("2.1.332 (Claude Code)"), or None."""
    import shutil

    from agent_bridge.hosts.base import version_output

    printed = version_output(shutil.which("claude"))
    return parse_version(printed) if printed is not None else None


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


def stop_takes_context(version: Version | None) -> bool:
    """Whether this Claude Code version takes `additionalContext` on Stop (unknown: no)."""
    return version is not None and version >= STOP_CONTEXT_SINCE


def parse_version(text: object) -> Version | None:
    """"2.1.332" (or "2.1.332 (Claude Code)") -> (2, 1, 332); None for anything else."""
    if not isinstance(text, str):
        return None
    parts = text.strip().split(" ", 1)[0].split(".")
    if len(parts) != 3 or not all(p.isdigit() and len(p) <= 6 for p in parts):
        return None
    return int(parts[0]), int(parts[1]), int(parts[2])


def transcript_version(path: str) -> Version | None:
    """The version of the Claude Code that last wrote this session transcript (JSON lines, each
    entry Claude Code writes carrying `"version"`), from its newest complete line that has one;
    None when there is no such line (or no readable file)."""
    import json

    if not path:
        return None
    try:
        with open(path, "rb") as f:
            end = f.seek(0, 2)
            size = min(end, TRANSCRIPT_TAIL)
            while True:
                f.seek(end - size)
                lines = f.read(size).split(b"\n")
                if size < end:
                    lines = lines[1:]  # the first one may be cut
                for line in reversed(lines):
                    if b'"version"' not in line:
                        continue
                    try:
                        entry = json.loads(line)
                    except ValueError:
                        continue
                    version = parse_version(entry.get("version")) if isinstance(entry, dict) else None
                    if version is not None:
                        return version
                if size >= end or size >= TRANSCRIPT_TAIL_MAX:
                    return None
                size = min(end, size * 4)
    except OSError:
        return None


def tail_lines(path: str) -> list[bytes]:
    """The whole lines in the last TRANSCRIPT_TAIL bytes of a transcript; [] when unreadable."""
    if not path:
        return []
    try:
        with open(path, "rb") as f:
            end = f.seek(0, 2)
            f.seek(max(0, end - TRANSCRIPT_TAIL))
            lines = f.read(TRANSCRIPT_TAIL).split(b"\n")
    except OSError:
        return []
    return lines[1:] if end > TRANSCRIPT_TAIL else lines  # the first one may be cut


def interrupted_at(path: str) -> float:
    """When the last turn cut short by Esc was (epoch seconds), from the `interruptedMessageId`
    entries in the last TRANSCRIPT_TAIL bytes of the transcript; 0.0 when none or unreadable."""
    import json
    from datetime import datetime

    for line in reversed(tail_lines(path)):
        if b'"interruptedMessageId"' not in line:
            continue
        try:
            entry = json.loads(line)
            stamp = entry["timestamp"]
            return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return 0.0


def queued_prompts(path: str) -> int:
    """How many prompts wait in the session's queue, from the `queue-operation` entries in the
    last TRANSCRIPT_TAIL bytes of its transcript ("enqueue" adds one; "dequeue" and "remove" take
    one; a "dequeue" of what was queued before the tail counts for nothing). 0 when unreadable."""
    import json

    lines = tail_lines(path)
    pending = 0
    for line in lines:
        if b'"queue-operation"' not in line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict) or entry.get("type") != "queue-operation":
            continue
        operation = entry.get("operation")
        if operation == "enqueue":
            pending += 1
        elif operation in ("dequeue", "remove"):
            pending = max(0, pending - 1)
        elif operation == "clear":
            pending = 0
    return pending


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


HOST = Claude()


def shutil_which_or(program: str) -> str:
    """The absolute path of `program` on PATH, or its bare name (the start then fails with a clear error)."""
    import shutil

    return shutil.which(program) or program


def claude_step(message: object) -> str | None:
    """One line for an assistant message of stream-json: its tool call, else its text."""
    if not isinstance(message, dict):
        return None
    line = None
    for block in message.get("content") or ():
        if not isinstance(block, dict):
            continue
        if block.get("type") == "tool_use":
            line = f"{block.get('name')} {one_line(str(block.get('input') or ''), 150)}"
        elif block.get("type") == "text" and str(block.get("text") or "").strip():
            line = one_line(str(block["text"]))
    return line
