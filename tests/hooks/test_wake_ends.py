"""When a turn ends without a Stop, and whose end the idle-wake waiter watches.

- Codex 0.171 runs its hooks in an app-server daemon its TUI starts and that outlives the TUI:
  the waiter watches that TUI (`wake.front_of`: the process that started a host leading a session
  of its own) and ends with it, so a closed session is never woken. Stand-ins here: a "TUI"
  process in the test's session that starts a "daemon" with a session of its own, as seen with
  the real ones (tests/hosts/test_codex_tui.py drives the real Codex).
- Esc: Codex runs its Interrupt hook (`hook interrupt` marks the session idle and arms the
  waiter); Claude Code runs none and writes an `interruptedMessageId` entry to its transcript,
  which the waiter reads while the session is marked busy (tests/hosts/test_claude_tui.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import trio

from agent_bridge.common import paths, procinfo
from agent_bridge.hooks import wake
from agent_bridge.ipc.client import open_bridge_client
from tests.conftest import wait_for
from tests.hooks.conftest import HOOK, hook_env, waiter_locks_held
from tests.hooks.test_wake import acked_at, finished, send, start_waiter, transcript
from tests.hooks.test_wake import host as host  # noqa: F401 - the stand-in host fixture

pytestmark = pytest.mark.slow

SLEEPER = [sys.executable, "-c", "import sys; sys.stdin.read()"]


class Tui:
    """A stand-in TUI (in the test's session) and the daemon it started (a session of its own)."""

    def __init__(self, *, tui_leads_session: bool = False) -> None:
        starter = (
            "import subprocess, sys\n"
            f"d = subprocess.Popen({SLEEPER!r}, stdin=subprocess.PIPE, start_new_session=True)\n"
            "print(d.pid, flush=True)\n"
            "sys.stdin.read()\n"
        )
        self.tui = subprocess.Popen([sys.executable, "-c", starter], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, start_new_session=tui_leads_session)
        assert self.tui.stdout is not None
        self.daemon_pid = int(self.tui.stdout.readline())

    def proc(self, pid: int) -> procinfo.Proc:
        found = procinfo.describe(pid)
        assert found is not None
        return found[0]

    def quit(self) -> None:
        self.tui.kill()
        self.tui.wait(timeout=30)

    def close(self) -> None:
        self.quit()
        try:
            os.kill(self.daemon_pid, 9)
        except ProcessLookupError:
            pass


async def holding(home: Path, count: int) -> bool:
    return await trio.to_thread.run_sync(waiter_locks_held, home) == count


def append(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text)


@pytest.fixture
def tui() -> Any:
    made = Tui()
    try:
        yield made
    finally:
        made.close()


def test_a_daemon_host_is_watched_through_the_process_that_started_it(tui):
    daemon = tui.proc(tui.daemon_pid)
    assert wake.front_of(daemon) == tui.proc(tui.tui.pid)
    assert wake.front_of(tui.proc(tui.tui.pid)) is None  # the TUI itself is no daemon: `codex exec`'s case
    tui.quit()
    assert wake.front_of(daemon) is None  # its starter ended (re-parented): nobody to watch through


def test_a_daemon_started_by_another_daemon_has_no_front():
    """A job: the broker (a session of its own) starts `codex exec` in a session of its own."""
    made = Tui(tui_leads_session=True)
    try:
        assert wake.front_of(made.proc(made.daemon_pid)) is None
    finally:
        made.close()


def codex_env(home: Path, tmp_path: Path, host_pid: int, **extra: str) -> dict[str, str]:
    """Hook environment with a `codex` on PATH (the waiter runs only where `codex queue` can)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "codex").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "codex").chmod(0o755)
    env = hook_env(home, AGENT_BRIDGE_HOST_PID=str(host_pid), **extra)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    return env


def codex_hook(event: str, sid: str, project: Path, env: dict[str, str]) -> subprocess.CompletedProcess[Any]:
    payload = {"session_id": sid, "turn_id": "turn-1", "cwd": str(project), "hook_event_name": event,
               "transcript_path": "", "model": "gpt-test", "permission_mode": "default"}
    if event == "UserPromptSubmit":
        payload["prompt"] = "go"
    arg = {"UserPromptSubmit": "user-prompt-submit", "Interrupt": "interrupt", "Stop": "stop"}[event]
    return subprocess.run([*HOOK, "hook", arg, "--agent", "codex"], input=json.dumps(payload).encode(),
                          env=env, cwd=project, capture_output=True, timeout=60)


def test_codex_interrupt_marks_the_session_idle_and_arms_no_waiter_without_a_tui(
    home, project, tmp_path, host
):
    """Esc in Codex: its Interrupt hook marks the turn's end (no Stop runs). `host` is no daemon
    (as `codex exec`): no TUI to watch, so no waiter starts, unless AGENT_BRIDGE_CODEX_WAKE=1."""
    env = codex_env(home, tmp_path, host.pid)
    assert codex_hook("UserPromptSubmit", "th-esc", project, env).returncode == 0
    assert wake.is_busy(wake.read_mark(home, "th-esc"))
    done = codex_hook("Interrupt", "th-esc", project, env)
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    assert wake.read_mark(home, "th-esc").startswith("idle ")
    assert not wake.lock_path(home, "th-esc").exists()  # no waiter was started


async def test_codex_waiter_ends_when_its_tui_quits_though_the_daemon_runs_on(
    broker, home, project, tmp_path, tui
):
    """The waiter an Interrupt (or Stop) hook of a daemon host starts watches the TUI that started
    the daemon: the TUI quits, the waiter ends and the session's files go, while the daemon (which
    would still run a queued message's turn) goes on. A message sent then waits, unacknowledged."""
    with trio.fail_after(120):
        record = paths.read_broker_json(home)
        async with open_bridge_client(record["socket"], {"agent": "codex", "project": str(project),
                                                         "hostSessionId": "th-tui"}):
            env = codex_env(home, tmp_path, tui.daemon_pid)
            done = await trio.to_thread.run_sync(lambda: codex_hook("Interrupt", "th-tui", project, env))
            assert done.returncode == 0, done.stderr
            await wait_for(lambda: holding(home, 1), what="the waiter (watching the TUI) holds its lock")
            tui.quit()
            await wait_for(lambda: holding(home, 0), what="the waiter ended with the TUI")
            assert procinfo.describe(tui.daemon_pid) is not None  # the daemon runs on
            assert not wake.lock_path(home, "th-tui").exists()
            assert not wake.session_mark(home, "th-tui").exists()
            mid = await send(home, "th-tui", "for a closed session")
            assert acked_at(home, mid) is None


def interrupt_entry(at: float) -> str:
    """The transcript entry Claude Code 2.1.332 writes at Esc (as seen; trimmed)."""
    stamp = datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return json.dumps({"type": "user", "message": {"role": "user", "content": [
        {"type": "text", "text": "[Request interrupted by user]"}]}, "timestamp": stamp,
        "interruptedMessageId": "msg_2", "version": "2.1.332"}) + "\n"


async def test_claude_esc_ends_the_busy_turn_for_the_waiter(broker, env, home, project, host):
    """A busy session (its UserPromptSubmit hook ran) whose turn the person cut short with Esc:
    no Stop runs, the transcript says so, and the waiter hands the waiting message over. An
    interruption from before the turn began counts for nothing."""
    with trio.fail_after(120):
        record = paths.read_broker_json(home)
        async with open_bridge_client(record["socket"], {"agent": "claude", "project": str(project),
                                                         "hostSessionId": "hs-esc"}):
            run_env = hook_env(home, AGENT_BRIDGE_HOST_PID=str(host.pid), CLAUDE_CODE_ENTRYPOINT="cli")
            path = Path(transcript(project, "2.1.332"))
            append(path, interrupt_entry(time.time() - 3600))  # an earlier turn's Esc
            waiter = start_waiter(home, project, "hs-esc", host)
            await wait_for(lambda: holding(home, 1), what="the waiter")
            prompt = json.dumps({"session_id": "hs-esc", "cwd": str(project), "transcript_path": str(path),
                                 "hook_event_name": "UserPromptSubmit", "prompt": "go"}).encode()
            submitted = await trio.to_thread.run_sync(lambda: subprocess.run(
                [*HOOK, "hook", "user-prompt-submit", "--agent", "claude"], input=prompt, env=run_env,
                cwd=project, capture_output=True, timeout=60))
            assert submitted.returncode == 0
            mid = await send(home, "hs-esc", "after your Esc")
            await trio.sleep(1.0)  # (a look for the opposite: the waiter stands aside while busy)
            assert waiter.poll() is None and acked_at(home, mid) is None
            append(path, interrupt_entry(time.time()))
            code, _, err = await finished(waiter)
            assert code == 2 and "after your Esc" in err.decode(), err
            assert acked_at(home, mid) is not None
