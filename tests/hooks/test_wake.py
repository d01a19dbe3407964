"""`agent-bridge hook wake` (SPEC §3 "Reach" item 3): the idle-wake waiter Claude Code runs as an
asyncRewake Stop hook. It waits on the broker until an active message waits for its session,
hands it over on stderr and exits 2 (fetch, write, then acknowledge); one per session; it ends
with its host; it does not wait under `claude -p` or on a Claude Code that would not run it in
the background. The host is a stand-in process named by AGENT_BRIDGE_HOST_PID; tests/hosts
drive the real Claude Code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from agent_bridge.common import paths
from agent_bridge.ipc.client import open_bridge_client
from agent_bridge.store import reader
from tests.conftest import wait_for
from tests.hooks.conftest import HOOK, full_pipe, hook_env, log_lines, offered_check, waiter_locks_held

pytestmark = pytest.mark.slow


def transcript(folder: Path, version: str) -> str:
    path = folder / "t.jsonl"
    path.write_text(json.dumps({"type": "assistant", "version": version}) + "\n")
    return str(path)


def stop_input(sid: str, project: Path, transcript_path: str, prompt_id: str | None = None) -> bytes:
    data = {"session_id": sid, "transcript_path": transcript_path, "cwd": str(project),
            "hook_event_name": "Stop", "stop_hook_active": False}
    if prompt_id:
        data["prompt_id"] = prompt_id
    return json.dumps(data).encode()


def start_waiter(
    home: Path,
    project: Path,
    sid: str,
    host: subprocess.Popen[bytes],
    *,
    version: str = "2.1.332",
    entrypoint: str = "cli",
    stderr: Any = subprocess.PIPE,
    prompt_id: str | None = None,
) -> subprocess.Popen[bytes]:
    env = hook_env(home, AGENT_BRIDGE_HOST_PID=str(host.pid), CLAUDE_CODE_ENTRYPOINT=entrypoint)
    proc = subprocess.Popen([*HOOK, "hook", "wake", "--agent", "claude"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=stderr, env=env, cwd=project)
    assert proc.stdin is not None
    proc.stdin.write(stop_input(sid, project, transcript(project, version), prompt_id))
    proc.stdin.close()
    proc.stdin = None  # communicate() must not flush it
    return proc


@pytest.fixture
def host() -> Any:
    """A stand-in agent host process: alive until the test ends it (or ends)."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


async def send(home: Path, to: str, text: str) -> str:
    record = paths.read_broker_json(home)
    assert record is not None
    async with open_bridge_client(
        record["socket"], {"agent": "codex", "project": "/w/s", "hostSessionId": "hs-s"}
    ) as (tx, _):
        return (await tx.request("send", to=to, text=text))["message"]["id"]


def acked_at(home: Path, mid: str) -> Any:
    with reader.reading(home / "bridge.db") as conn:
        return conn.execute("SELECT acked_at FROM receipts WHERE message_id = ?", (mid,)).fetchone()[0]


holders = waiter_locks_held


async def finished(proc: subprocess.Popen[bytes]) -> tuple[int, bytes, bytes]:
    out, err = await trio.to_thread.run_sync(lambda: proc.communicate(timeout=60))
    return proc.returncode, out, err


async def test_an_active_message_wakes_the_waiter_which_exits_2_with_it(broker, env, home, project, host):
    with trio.fail_after(120):
        record = paths.read_broker_json(home)
        async with open_bridge_client(record["socket"], {"agent": "claude", "project": str(project),
                                                         "hostSessionId": "hs-idle"}):
            waiter = start_waiter(home, project, "hs-idle", host)
            await wait_for(lambda: trio.to_thread.run_sync(holders, home), what="the waiter holds its lock")
            second = start_waiter(home, project, "hs-idle", host)  # a later Stop: one waiter per session
            assert await finished(second) == (0, b"", b"")
            assert waiter.poll() is None
            mid = await send(home, "hs-idle", "wake up: the build is red")
            code, out, err = await finished(waiter)
            assert (code, out) == (2, b""), err
            text = err.decode()
            assert "wake up: the build is red" in text and "not from the user" in text and mid in text
            assert acked_at(home, mid) is not None
            assert holders(home) == 0


async def test_the_waiter_ends_with_its_host_and_takes_the_sessions_files_with_it(
    broker, env, home, project, host
):
    from agent_bridge.hooks import wake

    with trio.fail_after(120):
        waiter = start_waiter(home, project, "hs-gone", host)
        await wait_for(lambda: trio.to_thread.run_sync(holders, home), what="the waiter holds its lock")
        files = (wake.lock_path(home, "hs-gone"), wake.session_mark(home, "hs-gone"))
        files[1].write_text("idle", encoding="utf-8")  # the session's mark, as its hooks leave one
        assert files[0].exists() and files[1].exists()
        other = wake.lock_path(home, "hs-still-here")
        other.write_text("")
        host.kill()
        host.wait()  # reaped, as a host's parent does
        assert await finished(waiter) == (0, b"", b"")
        assert [f.exists() for f in files] == [False, False]  # two files per session no more
        assert other.exists()  # another session's files stay
        # a later waiter of a session of that name starts afresh on a new lock file
        again = wake.hold_lock(home, "hs-gone")
        assert again is not None and os.fstat(again).st_ino == os.stat(files[0]).st_ino
        os.close(again)


def waiters_running(home: Path) -> list[int]:
    """Pids of `hook wake` processes of this home (a waiter, or the child a stopped one left)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue  # gone meanwhile, or not ours
        if b"wake" in cmdline and f"AGENT_BRIDGE_HOME={home}".encode() in environ:
            found.append(int(entry.name))
    return found


async def test_a_waiter_stopped_as_claude_code_exits_leaves_at_once_and_its_files_go_with_the_host(
    broker, env, home, project, host
):
    """Claude Code sends its pending async hooks SIGTERM as it exits, while it still runs: the
    waiter leaves at once (the host's exit waits for nobody), and what it leaves behind removes
    the session's two files once the host has ended, then ends too: no file, no process."""
    from agent_bridge.hooks import wake

    with trio.fail_after(120):
        waiter = start_waiter(home, project, "hs-exit", host)
        await wait_for(lambda: trio.to_thread.run_sync(holders, home), what="the waiter holds its lock")
        files = (wake.lock_path(home, "hs-exit"), wake.session_mark(home, "hs-exit"))
        files[1].write_text("idle", encoding="utf-8")
        waiter.terminate()
        assert await finished(waiter) == (0, b"", b"")
        assert host.poll() is None and [f.exists() for f in files] == [True, True]  # the host runs on
        assert holders(home) == 0  # nobody keeps a later waiter of the session out
        host.kill()
        host.wait()
        await wait_for(lambda: trio.to_thread.run_sync(lambda: not any(f.exists() for f in files)),
                       what="the session's files removed")
        await wait_for(lambda: trio.to_thread.run_sync(lambda: not waiters_running(home)),
                       what="nothing of the waiter left running")
        assert [line for line in log_lines(home) if "wake" in line] == []  # no failure logged


async def test_a_session_that_goes_on_after_its_waiter_was_stopped_keeps_its_next_waiter(
    broker, env, home, project, host
):
    """A SIGTERM that is not the session's end: the next Stop's waiter takes the lock and waits;
    the files go when the host ends (the later waiter removes them, the stopped one's child
    leaves them to it), and no process stays."""
    from agent_bridge.hooks import wake

    with trio.fail_after(120):
        first = start_waiter(home, project, "hs-on", host)
        await wait_for(lambda: trio.to_thread.run_sync(holders, home), what="the waiter holds its lock")
        first.terminate()
        assert await finished(first) == (0, b"", b"")
        second = start_waiter(home, project, "hs-on", host)
        await wait_for(lambda: trio.to_thread.run_sync(holders, home), what="the next waiter holds the lock")
        assert second.poll() is None
        files = (wake.lock_path(home, "hs-on"), wake.session_mark(home, "hs-on"))
        files[1].write_text("idle", encoding="utf-8")
        host.kill()
        host.wait()
        assert await finished(second) == (0, b"", b"")
        await wait_for(lambda: trio.to_thread.run_sync(lambda: not waiters_running(home)),
                       what="nothing of either waiter left running")
        assert [f.exists() for f in files] == [False, False]


async def test_no_broker_the_waiter_still_ends_with_its_host(home, project, host):
    with trio.fail_after(120):
        waiter = start_waiter(home, project, "hs-nobroker", host)
        await wait_for(lambda: trio.to_thread.run_sync(holders, home), what="the waiter holds its lock")
        host.kill()
        assert await finished(waiter) == (0, b"", b"")
        assert log_lines(home) == []


@pytest.mark.parametrize(("version", "entrypoint"), [("2.1.332", "sdk-cli"), ("2.1.331", "cli"), ("", "cli")])
async def test_no_waiting_where_the_host_would_not_run_it_in_the_background(
        broker, env, home, project, host, version, entrypoint):
    """`claude -p` (CLAUDE_CODE_ENTRYPOINT=sdk-cli) runs an asyncRewake hook synchronously; an
    older or unknown Claude Code is not known to run it in the background: leave at once."""
    waiter = start_waiter(
        home, project, "hs-p", host, version=version or "not a version", entrypoint=entrypoint
    )
    assert await finished(waiter) == (0, b"", b"")
    assert not (home / "waiters").exists()


async def test_a_waiter_killed_before_its_write_acknowledges_nothing(broker, env, home, project, host):
    """Its stderr is a full pipe: once it has fetched the message (offered), it is killed."""
    with trio.fail_after(120):
        read_end, write_end, filler = full_pipe()
        record = paths.read_broker_json(home)
        async with open_bridge_client(record["socket"], {"agent": "claude", "project": str(project),
                                                         "hostSessionId": "hs-killed"}):
            waiter = start_waiter(home, project, "hs-killed", host, stderr=write_end)
            os.close(write_end)
            try:
                await wait_for(
                    lambda: trio.to_thread.run_sync(holders, home), what="the waiter holds its lock"
                )
                mid = await send(home, "hs-killed", "are you there?")

                await wait_for(offered_check(home, mid), what="the waiter fetched the message")
                waiter.kill()
                waiter.wait(timeout=30)
                with os.fdopen(read_end, "rb") as pipe:
                    assert pipe.read() == b"x" * filler
            finally:
                if waiter.poll() is None:
                    waiter.kill()
                    waiter.wait(timeout=30)
            assert acked_at(home, mid) is None
            # the next Stop's waiter shows it, a repeat
            again = start_waiter(home, project, "hs-killed", host)
            code, _, err = await finished(again)
            assert code == 2 and "are you there?" in err.decode() and "a repeat" in err.decode()
            assert acked_at(home, mid) is not None


async def test_what_waits_at_the_stop_is_the_stop_hooks_to_hand_over(broker, env, home, project, host):
    """Claude Code starts the Stop hook and the waiter of one Stop together. The waiter waits for
    the Stop hook's end mark (same prompt_id), so a message waiting at the Stop reaches the model
    through the Stop hook (additionalContext, no error label), not through the waiter."""
    with trio.fail_after(120):
        record = paths.read_broker_json(home)
        async with open_bridge_client(record["socket"], {"agent": "claude", "project": str(project),
                                                         "hostSessionId": "hs-stop"}):
            mid = await send(home, "hs-stop", "waiting at the stop")
            waiter = start_waiter(home, project, "hs-stop", host, prompt_id="prompt-1")
            await wait_for(lambda: trio.to_thread.run_sync(holders, home), what="the waiter holds its lock")
            stop_env = hook_env(home, AGENT_BRIDGE_HOST_PID=str(host.pid), CLAUDE_CODE_ENTRYPOINT="cli")
            stdin = stop_input("hs-stop", project, transcript(project, "2.1.332"), "prompt-1")
            stop = await trio.to_thread.run_sync(lambda: subprocess.run(
                [*HOOK, "hook", "stop", "--agent", "claude"], input=stdin, env=stop_env, cwd=project,
                capture_output=True, timeout=60))
            answer = json.loads(stop.stdout)
            assert "waiting at the stop" in answer["hookSpecificOutput"]["additionalContext"]
            assert "a repeat" not in answer["hookSpecificOutput"]["additionalContext"]
            assert acked_at(home, mid) is not None
            # The answer continued the turn: a message now is the turn's, at its next Stop.
            during = await send(home, "hs-stop", "while the turn goes on")
            await trio.sleep(1.5)  # the waiter would have taken it by now (it answers in milliseconds)
            assert waiter.poll() is None and acked_at(home, during) is None
            again = await trio.to_thread.run_sync(lambda: subprocess.run(
                [*HOOK, "hook", "stop", "--agent", "claude"], input=stdin, env=stop_env, cwd=project,
                capture_output=True, timeout=60))  # the continued turn's Stop (the same prompt)
            assert (
                "while the turn goes on"
                in json.loads(again.stdout)["hookSpecificOutput"]["additionalContext"]
            )
            last = await trio.to_thread.run_sync(lambda: subprocess.run(
                [*HOOK, "hook", "stop", "--agent", "claude"], input=stdin, env=stop_env, cwd=project,
                capture_output=True, timeout=60))  # nothing waits: the turn ends, the session is idle
            assert last.stdout == b""
            later = await send(home, "hs-stop", "after the stop")  # the waiter's, once the session is idle
            code, _, err = await finished(waiter)
            assert (
                code == 2 and "after the stop" in err.decode() and "waiting at the stop" not in err.decode()
            )
            assert "while the turn goes on" not in err.decode()
            assert acked_at(home, later) is not None


async def test_a_busy_session_is_left_to_its_post_tool_use_and_stop_hooks(broker, env, home, project, host):
    """While a turn runs (UserPromptSubmit marked it), the waiter leaves a message to the turn's
    PostToolUse or Stop hook (no error label there); once the turn's Stop hook has run, it hands
    over what comes next."""
    with trio.fail_after(120):
        record = paths.read_broker_json(home)
        async with open_bridge_client(record["socket"], {"agent": "claude", "project": str(project),
                                                         "hostSessionId": "hs-busy"}):
            hook_run = hook_env(home, AGENT_BRIDGE_HOST_PID=str(host.pid), CLAUDE_CODE_ENTRYPOINT="cli")
            version = transcript(project, "2.1.332")

            def run(event: str, stdin: bytes) -> subprocess.CompletedProcess[bytes]:
                return subprocess.run([*HOOK, "hook", event, "--agent", "claude"], input=stdin, env=hook_run,
                                      cwd=project, capture_output=True, timeout=60)

            stop_1 = stop_input("hs-busy", project, version, "prompt-1")
            assert (await trio.to_thread.run_sync(run, "stop", stop_1)).stdout == b""  # idle, nothing waits
            waiter = start_waiter(home, project, "hs-busy", host, prompt_id="prompt-1")
            await wait_for(lambda: trio.to_thread.run_sync(holders, home), what="the waiter holds its lock")
            prompt = json.dumps(
                {
                    "session_id": "hs-busy",
                    "cwd": str(project),
                    "hook_event_name": "UserPromptSubmit",
                    "prompt": "go",
                }
            ).encode()
            submitted = await trio.to_thread.run_sync(run, "user-prompt-submit", prompt)
            assert (submitted.returncode, submitted.stdout, submitted.stderr) == (0, b"", b"")
            mid = await send(home, "hs-busy", "for the busy turn")
            post = json.dumps({"session_id": "hs-busy", "cwd": str(project), "hook_event_name": "PostToolUse",
                               "tool_name": "Bash", "tool_input": {}, "tool_response": {}}).encode()
            between = json.loads((await trio.to_thread.run_sync(run, "post-tool-use", post)).stdout)
            assert "for the busy turn" in between["hookSpecificOutput"]["additionalContext"]
            assert acked_at(home, mid) is not None and waiter.poll() is None
            stop_2 = stop_input("hs-busy", project, version, "prompt-2")
            assert (await trio.to_thread.run_sync(run, "stop", stop_2)).stdout == b""  # the turn ends: idle
            later = await send(home, "hs-busy", "for the idle session")
            code, _, err = await finished(waiter)
            assert code == 2 and "for the idle session" in err.decode() and "busy turn" not in err.decode()
            assert acked_at(home, later) is not None


async def test_wait_active_answers_at_its_timeout_and_refuses_bad_arguments(broker, env, home, project):
    from agent_bridge.ipc import blocking, protocol

    def call(**args: Any) -> Any:
        return blocking.call(home, "wait_active", timeout=10, **args)

    with trio.fail_after(60):
        assert await trio.to_thread.run_sync(lambda: call(hostSessionId="hs-none", timeoutMs=0)) == {
            "active": False
        }
        for bad in (
            {"hostSessionId": "x", "timeoutMs": -1},
            {"hostSessionId": "x", "timeoutMs": 60_001},
            {"hostSessionId": "x", "timeoutMs": True},
            {"timeoutMs": 5},
            {"hostSessionId": "x", "extra": 1},
        ):
            with pytest.raises(protocol.RemoteError):
                await trio.to_thread.run_sync(lambda bad=bad: call(**bad))
        record = paths.read_broker_json(home)
        async with open_bridge_client(record["socket"], {"agent": "claude", "project": str(project),
                                                         "hostSessionId": "hs-wait"}):
            mid = await send(home, "hs-wait", "already here")
            assert await trio.to_thread.run_sync(lambda: call(hostSessionId="hs-wait", timeoutMs=50_000)) == {
                "active": True}
            assert acked_at(home, mid) is None  # it only says so: nothing handed over, nothing acknowledged


def test_a_late_stop_of_the_previous_turn_leaves_the_next_turns_busy_mark(tmp_path):
    """Claude Code 2.1.332 runs the UserPromptSubmit hook of a prompt typed while the previous
    turn's Stop hooks still run (seen in the TUI: the Stop hook of a continued turn ended after
    the next prompt's UserPromptSubmit hook). The late Stop must not mark the new turn idle: the
    host started it before the UserPromptSubmit hook (the stamps: start times in clock ticks)."""
    from agent_bridge.hooks import common, wake

    def hook(prompt_id: str) -> common.HookInput:
        return common.HookInput("hs-late", str(tmp_path), "", False, "", prompt_id)

    # turn 1's UserPromptSubmit (the id is the previous prompt's)
    wake.mark_busy(tmp_path, hook("prompt-0"), 100)
    wake.mark_idle(tmp_path, hook("prompt-1"), 200)  # turn 1's Stop
    assert wake.read_mark(tmp_path, "hs-late") == "idle prompt-1 200"
    wake.mark_busy(tmp_path, hook("prompt-1"), 300)  # turn 2's UserPromptSubmit
    # turn 1's second Stop hook, started before it, ending late
    wake.mark_idle(tmp_path, hook("prompt-1"), 250)
    assert wake.read_mark(tmp_path, "hs-late") == "busy 300"
    wake.mark_idle(tmp_path, hook("prompt-2"), 400)  # turn 2's own Stop
    assert wake.read_mark(tmp_path, "hs-late") == "idle prompt-2 400"
    # turn 3 typed as turn 2 ended: its UserPromptSubmit hook started in the same clock tick as
    # turn 2's second Stop hook, which ends after it
    wake.mark_busy(tmp_path, hook("prompt-2"), 450)
    wake.mark_idle(tmp_path, hook("prompt-2"), 450)
    assert wake.read_mark(tmp_path, "hs-late") == "busy 450"
    wake.mark_idle(tmp_path, hook("prompt-3"), 460)  # turn 3's own Stop
    assert wake.read_mark(tmp_path, "hs-late") == "idle prompt-3 460"
    wake.mark_busy(tmp_path, hook("prompt-3"), None)  # where nothing tells when a hook started: as before
    wake.mark_idle(tmp_path, hook("prompt-4"), 500)
    assert wake.read_mark(tmp_path, "hs-late") == "idle prompt-4 500"


async def test_a_late_stop_of_the_previous_turn_does_not_let_the_waiter_take_the_next_turns_message(
        broker, env, home, project, host):
    """The order the hooks ran in one loaded TUI run (tests/hosts/test_claude_tui.py): the Stop
    of turn 1 (its waiter arms), the UserPromptSubmit of turn 2, then a second Stop hook of turn
    1 (the one after its continued turn) ending late. A message sent now is turn 2's PostToolUse
    hook's, not the waiter's (Claude Code would label the waiter's "Stop hook feedback")."""
    with trio.fail_after(120):
        record = paths.read_broker_json(home)
        async with open_bridge_client(record["socket"], {"agent": "claude", "project": str(project),
                                                         "hostSessionId": "hs-late"}):
            hook_run = hook_env(home, AGENT_BRIDGE_HOST_PID=str(host.pid), CLAUDE_CODE_ENTRYPOINT="cli")
            version = transcript(project, "2.1.332")

            def run(event: str, stdin: bytes) -> subprocess.CompletedProcess[bytes]:
                return subprocess.run([*HOOK, "hook", event, "--agent", "claude"], input=stdin, env=hook_run,
                                      cwd=project, capture_output=True, timeout=60)

            stop_1 = stop_input("hs-late", project, version, "prompt-1")
            assert (await trio.to_thread.run_sync(run, "stop", stop_1)).stdout == b""
            waiter = start_waiter(home, project, "hs-late", host, prompt_id="prompt-1")
            await wait_for(lambda: trio.to_thread.run_sync(holders, home), what="the waiter holds its lock")
            # Turn 1's second Stop hook: started now, slow to end (its input comes later).
            def start_late() -> subprocess.Popen[bytes]:
                return subprocess.Popen(
                    [*HOOK, "hook", "stop", "--agent", "claude"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=hook_run,
                    cwd=project,
                )

            late = start_late()
            await trio.sleep(0.1)  # a later clock tick for the next hook's start
            prompt = json.dumps(
                {
                    "session_id": "hs-late",
                    "cwd": str(project),
                    "hook_event_name": "UserPromptSubmit",
                    # the TUI gives the previous id
                    "prompt_id": "prompt-1",
                    "prompt": "go",
                }
            ).encode()
            assert (await trio.to_thread.run_sync(run, "user-prompt-submit", prompt)).returncode == 0
            out, _ = await trio.to_thread.run_sync(lambda: late.communicate(stop_1, timeout=60))
            assert (late.returncode, out) == (0, b"")  # it ended after turn 2 began
            mid = await send(home, "hs-late", "for turn 2")
            await trio.sleep(1.5)  # the waiter would have taken it by now (it answers in milliseconds)
            assert waiter.poll() is None and acked_at(home, mid) is None
            post = json.dumps({"session_id": "hs-late", "cwd": str(project), "hook_event_name": "PostToolUse",
                               "tool_name": "Bash", "tool_input": {},
                               "tool_response": {}}).encode()
            between = json.loads((await trio.to_thread.run_sync(run, "post-tool-use", post)).stdout)
            assert "for turn 2" in between["hookSpecificOutput"]["additionalContext"]
            assert acked_at(home, mid) is not None and waiter.poll() is None
            stop_2 = stop_input("hs-late", project, version, "prompt-2")
            assert (await trio.to_thread.run_sync(run, "stop", stop_2)).stdout == b""  # turn 2 ends: idle
            later = await send(home, "hs-late", "for the idle session")
            code, _, err = await finished(waiter)
            assert code == 2 and "for the idle session" in err.decode() and "for turn 2" not in err.decode()
            assert acked_at(home, later) is not None


@pytest.mark.parametrize(("operations", "mark"), [(("enqueue",), "busy"), (("enqueue", "dequeue"), "idle")])
def test_a_stop_with_a_prompt_queued_leaves_the_session_busy(env, home, project, host, operations, mark):
    """A prompt typed while the turn ran (its UserPromptSubmit hook ran then, and marked the turn
    busy before this Stop's hook started) runs as the next turn once the Stop hooks are done: no
    UserPromptSubmit marks it then, so this Stop does not mark the session idle. Claude Code's
    transcript says so: a `queue-operation` "enqueue" not yet dequeued (seen with 2.1.332)."""
    path = project / "t.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in [{"type": "assistant", "version": "2.1.332"}, *(
        {"type": "queue-operation", "operation": op, "content": "next"} for op in operations)]))
    stop_env = hook_env(home, AGENT_BRIDGE_HOST_PID=str(host.pid), CLAUDE_CODE_ENTRYPOINT="cli")
    done = subprocess.run(
        [*HOOK, "hook", "stop", "--agent", "claude"],
        input=stop_input("hs-q", project, str(path), "prompt-1"),
        env=stop_env,
        cwd=project,
        capture_output=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (0, b"")
    from agent_bridge.hooks import wake

    assert wake.read_mark(home, "hs-q").split(" ")[0] == mark
