"""Codex: where it keeps its MCP servers and hooks, what its hooks print, what doctor checks.

Configuration (the files and keys Codex documents, and how install edits them) is in
hosts.codex_config; what doctor asks of the installed Codex, in hosts.codex_doctor.

- Hook answers (codex-rs/hooks/schema/generated/*.command.output.schema.json): SessionStart adds
  `hookSpecificOutput.additionalContext`; Stop blocks with `{"decision": "block", "reason"}`.
- Trust: Codex runs a hook only once the user trusted it, and reads a project's `.codex` only in a
  trusted project; doctor asks the installed Codex (`codex app-server`) rather than guessing.

Process: the `codex` program (seen with Codex 0.171). One process may run several threads
(conversations), so a new thread id does not replace the others. It passes the thread id in
each tool call's `_meta["x-codex-turn-metadata"]`.

Light at import (the hooks load it): subprocess, json and the edit and check helpers
(hosts.edits, the config.toml edits of hosts.codex_config, hosts.codex_doctor) are imported
inside the functions that use them.
"""

from __future__ import annotations

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
from agent_bridge.hosts.codex_config import WAKE_ENV, codex_home, codex_program, codex_version

if TYPE_CHECKING:
    from agent_bridge.hosts.edits import FileEdit

QUEUE_TIMEOUT = 30.0  # seconds for `codex queue`; it answered in 0.16 s here
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
    extra_hooks = (PROMPT_HOOK, INTERRUPT_HOOK)  # beside edits.EVENTS, by install and in the plugin

    def is_set_up(self) -> bool:
        return codex_home().is_dir()

    def config_file(self, scope: str, cwd: Path) -> Path:
        return cwd / ".codex" / "config.toml" if scope == "project" else codex_home() / "config.toml"

    def hooks_file(self, scope: str, cwd: Path) -> Path:
        return cwd / ".codex" / "hooks.json" if scope == "project" else codex_home() / "hooks.json"

    def install_edits(self, scope: str, cwd: Path, run: list[str], env: dict[str, str],
                      *, private: bool, version: tuple[int, int, int] | None = None) -> list[FileEdit]:
        """`version`: the installed Codex's, asked of `codex --version` when not given."""
        from agent_bridge.hosts.codex_config import edit_codex_config
        from agent_bridge.hosts.edits import hooks_edit, mcp_args

        version = codex_version() if version is None else version
        command, args = mcp_args(run, self.name)
        return [
            edit_codex_config(
                self.config_file(scope, cwd), command, args, env, private=private, version=version
            ),
            hooks_edit(
                self.hooks_file(scope, cwd), run, self.name, env, private=private,
                extra=self.extra_hooks
            ),
            self.skill_edit(scope, cwd, write=True, private=private),
        ]

    def skills_folder(self, scope: str, cwd: Path) -> Path:
        """Where Codex 0.171 loads skills from: `$CODEX_HOME/skills` or `<project>/.codex/skills`."""
        return cwd / ".codex" / "skills" if scope == "project" else codex_home() / "skills"

    def skill_edit(self, scope: str, cwd: Path, *, write: bool, private: bool) -> FileEdit:
        """The agent-bridge skill (hosts.skill), written or removed: Codex has no custom prompts."""
        from agent_bridge.hosts import skill
        from agent_bridge.hosts.edits import owned_file_edit

        folder = self.skills_folder(scope, cwd)
        edit = owned_file_edit(skill.skill_path(folder), skill.SKILL_TEXT if write else None, skill.is_ours,
                               private=private, prune=(folder / skill.NAME, folder))
        edit.notes = [n.replace("slash command", "skill (SKILL.md)") for n in edit.notes]
        return edit

    def uninstall_edits(self, scope: str, cwd: Path, *, private: bool) -> list[FileEdit]:
        from agent_bridge.hosts.codex_config import remove_codex_config
        from agent_bridge.hosts.edits import hooks_removal

        return [remove_codex_config(self.config_file(scope, cwd), private=private),
                hooks_removal(self.hooks_file(scope, cwd), private=private),
                self.skill_edit(scope, cwd, write=False, private=private)]

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

    def tools_sentence(self, *, plugin: bool = False) -> str:
        # Codex 0.171 gives the model the MCP tools as functions of one namespace, mcp__agent_bridge,
        # a plugin's server's too (named by the server alone, NOTES.md "Plugins").
        return ("Message other agent sessions (Claude Code too, and sessions not running) with the "
                "mcp__agent_bridge tools `send`, `inbox`, `decisions`.")

    def next_step(self, scope: str) -> str:
        return (
            "Codex: start a new session; review and trust the new hooks with /hooks when Codex asks"
            + ("; project config is read only in a trusted project" if scope == "project" else "")
            + "."
        )

    def doctor_checks(self, home: Path, cwd: Path) -> list[Check]:
        from agent_bridge.hosts.codex_doctor import codex_checks

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



HOST = Codex()

