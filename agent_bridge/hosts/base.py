"""What every host module provides (`Host`), and the doctor's check record they return.

Light: the hooks import the host modules, so nothing here may import more than the standard
library's cheapest parts (no `dataclasses`: it loads `inspect`, several milliseconds at every
session start). The edit and check helpers a host needs (hosts.edits, hosts.checks, beneath the
host modules) are imported inside its methods, for the same reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from agent_bridge.hosts.edits import FileEdit

OK, WARN, FAIL, SKIP = "ok", "warn", "FAIL", "skip"
VERSION_TIMEOUT = 10.0  # seconds for a host's `--version`; both answer in well under one


# `--version` answers by the program's file: a long-lived caller (the broker checks the host at
# every `delegate`) asks once per file as it is now. An update replaces the file (npm writes a new
# package), so its identity changes and the program is asked again.
_VERSIONS: dict[tuple[str, str, int, int, int], str | None] = {}


def version_output(program: str | None) -> str | None:
    """What `program --version` prints, or None when there is no program or it does not answer."""
    import os
    import subprocess

    if program is None:
        return None
    try:
        real = os.path.realpath(program)
        st = os.stat(real)
    except OSError:
        return None
    key = (program, real, st.st_ino, st.st_size, st.st_mtime_ns)
    if key in _VERSIONS:
        return _VERSIONS[key]
    try:
        out = subprocess.run([program, "--version"], capture_output=True, text=True, timeout=VERSION_TIMEOUT,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    printed = out.stdout if out.returncode == 0 else None
    if printed is not None:  # a failure is asked again next time
        _VERSIONS[key] = printed
    return printed


def json_lines(stdout: bytes) -> list[dict[str, Any]]:
    """The JSON objects of a run's stdout, one per line; a partial last line or a line that is not
    an object is skipped."""
    import json

    found = []
    for line in stdout.split(b"\n"):
        line = line.strip()
        if not line.startswith(b"{"):
            continue
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            found.append(value)
    return found


def one_line(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"



class HookInput:
    """The fields of the hook input we use. (A plain class: `dataclasses` costs an import of
    `inspect`, several milliseconds at every session start.)"""

    __slots__ = ("session_id", "cwd", "source", "stop_hook_active", "transcript_path", "prompt_id")

    def __init__(self, session_id: str, cwd: str, source: str, stop_hook_active: bool,
                 transcript_path: str = "", prompt_id: str = "") -> None:
        self.session_id = session_id
        self.cwd = cwd  # normalized absolute folder (domain.normalize_folder)
        self.source = source  # SessionStart source, "" when absent
        self.stop_hook_active = stop_hook_active
        self.transcript_path = transcript_path  # the host's transcript file, "" when absent
        self.prompt_id = prompt_id  # Claude Code's id of the prompt a Stop ends (2.1.332), "" when absent


class Check(NamedTuple):
    """One line of `agent-bridge doctor`: what was checked, how it went, what to do about it."""

    name: str
    status: str  # OK, WARN, FAIL or SKIP
    detail: str
    fix: str = ""


class JobLaunch:
    """One run of a job (SPEC §4.7), as the broker decided it; the host module turns it into a
    command line (`Host.job_command`). Nothing here is host-specific. (A plain class: see HookInput.)"""

    __slots__ = ("job_id", "name", "task", "note", "access", "cwd", "project", "model", "thread",
                 "bridge", "env", "out_dir")

    def __init__(self, job_id: str, name: str, task: str, note: str, access: str, cwd: Path,
                 project: Path, model: str | None, thread: str | None, bridge: list[str],
                 env: dict[str, str], out_dir: Path) -> None:
        self.job_id = job_id
        self.name = name  # "<agent>-job-<8 hex>": the job's bridge session name
        self.task = task  # the prompt for this run (the task, or a `continue` message); data, never flags
        self.note = note  # the SessionStart note with the project's decisions; the host puts it
        # before the task when its hooks will not run for the job
        self.access = access  # "read" or "edit" (a worktree job is "edit" inside its worktree)
        self.cwd = cwd  # the folder the job runs in: inside the project, or the job's worktree
        self.project = project  # the parent's project folder (the job session's project)
        self.model = model  # None: the host's default
        self.thread = thread  # the host thread/session to resume (`continue`), None for a new run
        self.bridge = bridge  # argv of the job's MCP server: [agent-bridge, "mcp", "--job", ...]
        self.env = env  # environment the job's bridge needs (AGENT_BRIDGE_HOME, ...), to add
        self.out_dir = out_dir  # <home>/jobs/<id>/: the host may write its config files here


class JobCommand:
    """How to start one run: argv (no shell), environment to add, and what goes to its stdin
    (None: /dev/null). The broker starts it in its own process group with stdout and stderr in
    `JobLaunch.out_dir`."""

    __slots__ = ("argv", "env", "stdin")

    def __init__(self, argv: list[str], env: dict[str, str], stdin: bytes | None = None) -> None:
        self.argv = argv
        self.env = env
        self.stdin = stdin


class JobReport:
    """What a run's output (the host's JSON lines on stdout, so far) says: the host thread id once
    known, the last step as one line, and the final answer once the run finished (None before)."""

    __slots__ = ("thread", "last_step", "answer", "failed")

    def __init__(self, thread: str | None = None, last_step: str | None = None,
                 answer: str | None = None, failed: str | None = None) -> None:
        self.thread = thread
        self.last_step = last_step
        self.answer = answer
        self.failed = failed  # the host's own error line when the run ended in error, else None


class Host:
    """One agent host. A module per host defines a subclass and one instance of it, `HOST`, and
    `agent_bridge.hosts` lists it; nothing else names a host."""

    name: str  # the `--agent` value and the `--<name>` flag of install/uninstall, e.g. "claude"
    title: str  # for people, e.g. "Claude Code"
    process_prefixes: tuple[str, ...]  # an ancestor process whose name starts so is this host
    exclusive: bool  # one conversation per host process: a new host session id replaces the old
    # one MCP server for all the host's sessions (opencode serve), its plugin naming the session of
    # each tool call: `agent-bridge mcp` routes each session's calls to a relay of its own (relay.router)
    sessions_per_server: bool = False
    session_env: str | None = None  # an environment variable in which the host passes its session id
    # The hook that hands messages over between tool calls prints them with their ids and does not
    # acknowledge them: the host's plugin does (`agent-bridge hook ack`) once the host took them.
    defers_ack = False
    # Hooks registered beside edits.EVENTS: (event, `agent-bridge hook` argument, more handler keys)
    extra_hooks: tuple[tuple[str, str, dict[str, Any]], ...] = ()

    def is_set_up(self) -> bool:
        """Whether this user has the host's configuration folder (install's default hosts)."""
        raise NotImplementedError

    def hooks_file(self, scope: str, cwd: Path) -> Path:
        """The JSON file whose `hooks` object registers our hooks (edits.EVENTS) at this scope."""
        raise NotImplementedError

    def install_edits(self, scope: str, cwd: Path, run: list[str], env: dict[str, str],
                      *, private: bool) -> list[FileEdit]:
        """Every file edit that registers the MCP server and both hooks (unchanged files included)."""
        raise NotImplementedError

    def uninstall_edits(self, scope: str, cwd: Path, *, private: bool) -> list[FileEdit]:
        """Every file edit that removes what `install_edits` added."""
        raise NotImplementedError

    def next_step(self, scope: str) -> str:
        """What the user does after install for the host to pick it up."""
        raise NotImplementedError

    # The two hook answers below are the forms Claude Code and Codex both document; a host whose
    # documentation gives other forms overrides them (`tests/test_hosts.py` lists which hosts
    # were checked against their documentation).

    def tools_sentence(self, *, plugin: bool = False) -> str:
        """One sentence of the SessionStart note (SPEC §4.5): which bridge tools to use, named as
        this host shows them to the model (`plugin`: its server is the plugin's, hosts.plugin), and
        why rather than the host's own messaging."""
        return ("The agent-bridge tools `send`, `inbox` and `decisions` reach every agent session here, "
                "Claude Code and Codex, running or not.")

    def session_start_output(self, note: str) -> dict[str, Any]:
        """The SessionStart hook's answer that adds `note` to the session's context."""
        return {"hookSpecificOutput": {"hookEventName": "SessionStart", "additionalContext": note}}

    def stop_output(self, reason: str, hook: HookInput | None = None) -> dict[str, Any]:
        """The Stop hook's answer that keeps the session going with `reason` as its next input.
        `hook`: the Stop hook's input, for a host whose answer depends on the running version."""
        return {"decision": "block", "reason": reason}

    def runs_waiter(self, hook: HookInput, env: Any) -> bool:
        """Whether this host runs the idle-wake waiter (`agent-bridge hook wake`) in the
        background, so that it may wait for the session's next message: never, unless the host
        module knows it does (SPEC §3 "Reach" item 3)."""
        return False

    def prompt_queued(self, hook: HookInput) -> bool:
        """Whether a prompt submitted while the turn ran waits to run as the next turn, so that
        the session does not go idle at this Stop (unknown: no)."""
        return False

    # How the waiter gets started: registered as a background hook (`spawned_waiter` False:
    # Claude Code's asyncRewake), or started by the Stop hook as a detached process (True: Codex).
    spawned_waiter = False

    def wakes_only_in_front(self, env: Any) -> bool:
        """For a spawned waiter: whether it wakes the session only while the process a person
        sees it in runs (`hooks.wake.front_of`), so that a host whose hooks run in a daemon that
        outlives that process never wakes a session nobody sees (yes, unless the host module
        says otherwise)."""
        return True

    # Whether a wake after the person cut a turn short runs a turn (the waiter wakes such an idle
    # session only then; else its messages wait for the next turn's hooks).
    wakes_after_interrupt = True

    def turn_interrupted(self, hook: HookInput, since: float) -> bool:
        """Whether the person cut the running turn short (Esc) after `since` (epoch seconds, when
        the turn was marked busy), for a host with no hook for that: then the session is idle
        although no Stop marked it so (unknown: no)."""
        return False

    def wake(self, text: str, hook: HookInput) -> bool:
        """Hand `text` to the idle session (the waiter's "write"); True once the host took it.
        After a wake the waiter exits when `spawned_waiter` is False (the host starts the next one
        at the next Stop), else it goes on waiting."""
        raise NotImplementedError

    def post_tool_use_output(self, text: str) -> dict[str, Any]:
        """The PostToolUse hook's answer that adds `text` to the model's next request of the turn
        (SPEC §3 "Reach" item 1)."""
        return {"hookSpecificOutput": {"hookEventName": "PostToolUse", "additionalContext": text}}

    def user_prompt_output(self, text: str) -> dict[str, Any]:
        """The UserPromptSubmit hook's answer that adds `text` to the model's context beside the
        prompt the user just typed (Claude Code documents it; Codex 0.171's
        user-prompt-submit.command.output schema has the same hookSpecificOutput)."""
        return {"hookSpecificOutput": {"hookEventName": "UserPromptSubmit", "additionalContext": text}}

    def owner_types(self, env: Any) -> bool:
        """Whether a prompt in this hook's session was typed by a person (an interactive session),
        not handed over by a script (`claude -p`, `codex exec`): unknown, yes; a job runner's
        session record says so as well."""
        return True

    def doctor_checks(self, home: Path, cwd: Path) -> list[Check]:
        """Whether this host will use the MCP server and both hooks for `home`."""
        raise NotImplementedError

    # --- jobs (SPEC §4.7): how this host runs headless. Process handling is the daemon's. ---

    def job_check(self) -> str | None:
        """None when this host's CLI can run jobs here; else one line saying what to do (the CLI
        is missing, or older than the version whose headless flags we rely on)."""
        raise NotImplementedError

    def job_command(self, launch: JobLaunch) -> JobCommand:
        """The command that runs `launch` headless with the bridge given on its command line or
        config overrides, the access enforced by the host's own sandbox or tool denial, and
        every value from the agent passed as data (never readable as a flag)."""
        raise NotImplementedError

    def job_report(self, stdout: bytes) -> JobReport:
        """Read the run's stdout so far (the host's JSON lines; a partial last line is ignored)."""
        raise NotImplementedError
