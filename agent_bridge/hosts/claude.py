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

Process: the `claude` program (its process name, seen with Claude Code 2.1.197). One conversation
per process: `/clear` gives the same process a new session id, which replaces the old one.
It passes its session id to MCP servers in CLAUDE_CODE_SESSION_ID.

Which Claude Code runs a session, and what its transcript says, is hosts.claude_transcript; what
doctor checks, hosts.claude_doctor.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_bridge.hosts.base import (
    Check,
    HookInput,
    Host,
    JobCommand,
    JobLaunch,
    JobReport,
    json_lines,
    one_line,
)
from agent_bridge.hosts.claude_transcript import (
    ASYNC_REWAKE_SINCE,
    Version,
    claude_version,
    interrupted_at,
    queued_prompts,
    stop_takes_context,
    transcript_version,
)

if TYPE_CHECKING:
    from agent_bridge.hosts.edits import FileEdit


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


class Claude(Host):
    name = "claude"
    title = "Claude Code"
    process_prefixes = ("claude",)
    exclusive = True
    session_env = "CLAUDE_CODE_SESSION_ID"
    extra_hooks = (WAKE_HOOK, PROMPT_HOOK)  # beside edits.EVENTS, by install and in the plugin

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
                           extra=self.extra_hooks),
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

    def tools_sentence(self, *, plugin: bool = False) -> str:
        # The names Claude Code 2.1.332 lists its deferred MCP tools under (ToolSearch "select:" takes
        # them): `mcp__plugin_<plugin>_<server>__` for a plugin's server. Its own SendMessage reaches
        # running Claude Code sessions only.
        prefix = "mcp__plugin_agent-bridge_agent-bridge__" if plugin else "mcp__agent-bridge__"
        return (
            f"Message other agent sessions with `{prefix}send`, `…inbox`, `…decisions`: they reach "
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

    def doctor_checks(self, home: Path, cwd: Path) -> list[Check]:
        from agent_bridge.hosts.claude_doctor import claude_checks

        return claude_checks(home, cwd, self.commands_folder)

    def next_step(self, scope: str) -> str:
        return (
            "Claude Code: start a new session (or run /mcp to reconnect); "
            + ("approve the project's .mcp.json server when asked; " if scope == "project" else "")
            + "/hooks lists the SessionStart, PostToolUse and Stop hooks; /agent-bridge:inbox, :send, "
            ":questions, :answer, :decide and :jobs run your commands there."
        )

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
