"""`agent-bridge hook post-tool-use` (SPEC §3 "Reach" item 1): between tool calls it hands the
session's waiting active messages to the model as the host's PostToolUse additionalContext;
fetch, write, then acknowledge; with nothing waiting it reads bridge.db and contacts nobody."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio

from agent_bridge.common import paths
from agent_bridge.ipc.client import open_bridge_client
from agent_bridge.store import reader
from tests.conftest import wait_for
from tests.hooks.conftest import HOOK, build_db, full_pipe, hook_env, log_lines, offered_check, run_hook


def post_input(sid: str, project: Path) -> dict[str, Any]:
    return {"session_id": sid, "transcript_path": None, "cwd": str(project), "hook_event_name": "PostToolUse",
            "tool_name": "Bash", "tool_input": {"command": "ls"}, "tool_response": {"stdout": "a\nb\n"},
            "tool_use_id": "toolu_1", "turn_id": "t-1"}


def context_of(result: subprocess.CompletedProcess[bytes]) -> str:
    assert result.returncode == 0, result.stderr.decode()
    answer = json.loads(result.stdout)
    assert answer == {
        "hookSpecificOutput": {
            "hookEventName": "PostToolUse",
            "additionalContext": answer["hookSpecificOutput"]["additionalContext"],
        }
    }
    return answer["hookSpecificOutput"]["additionalContext"]


def acked(home: Path, ids: list[str]) -> list[Any]:
    marks = ",".join("?" * len(ids))
    with reader.reading(home / "bridge.db") as conn:
        return [
            row[0]
            for row in conn.execute(f"SELECT acked_at FROM receipts WHERE message_id IN ({marks})", ids)
        ]


@pytest.mark.parametrize("agent", ["claude", "codex"])
def test_nothing_waiting_reads_the_database_and_contacts_nobody(agent, hook_home, project):
    """No broker record, a database with the session and nothing for it: no output, no log
    line, and no identity report left (which a hook that went past the read-only check leaves
    when no broker runs)."""
    build_db(hook_home, [("camera", "Hold to look", "all")],
             peers=[{"agent": agent, "name": f"{agent}-app", "project": str(project), "kind": "interactive",
                     "host_session_id": "hs-idle"}])
    for sid in ("hs-idle", "hs-unknown"):
        result = run_hook("post-tool-use", agent, post_input(sid, project), hook_env(hook_home), cwd=project)
        assert (result.returncode, result.stdout, result.stderr) == (0, b"", b"")
    assert log_lines(hook_home) == []
    assert not (hook_home / paths.REPORTS_DIR).exists()


def test_no_database_exits_silently(hook_home, project):
    result = run_hook(
        "post-tool-use", "claude", post_input("hs-x", project), hook_env(hook_home), cwd=project
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, b"", b"")
    assert not (hook_home / paths.REPORTS_DIR).exists()


@pytest.mark.parametrize("raw", [b"not json", b"[1]", b'{"session_id": 3}', b'{"session_id": ""}'])
def test_malformed_input_exits_0_and_logs_one_line(raw, hook_home, project):
    build_db(hook_home, [])
    result = run_hook("post-tool-use", "codex", raw, hook_env(hook_home), cwd=project)
    assert (result.returncode, result.stdout, result.stderr) == (0, b"", b"")
    lines = log_lines(hook_home)
    assert len(lines) == 1 and "post-tool-use (codex)" in lines[0], lines


async def send(home: Path, to: str, texts: list[str], *, reply_hop: int = 0) -> list[str]:
    record = paths.read_broker_json(home)
    assert record is not None
    hello = {"agent": "codex", "project": "/w/sender", "hostSessionId": "hs-sender"}
    async with open_bridge_client(record["socket"], hello) as (tx, _):
        return [(await tx.request("send", to=to, text=t))["message"]["id"] for t in texts]


async def hook(
    home: Path, project: Path, sid: str, agent: str = "claude"
) -> subprocess.CompletedProcess[bytes]:
    return await trio.to_thread.run_sync(
        lambda: run_hook("post-tool-use", agent, post_input(sid, project), hook_env(home), cwd=project))


@pytest.mark.slow
@pytest.mark.parametrize("agent", ["claude", "codex"])
async def test_waiting_messages_are_handed_over_then_acknowledged(agent, broker, env, home, project):
    with trio.fail_after(120):
        record = paths.read_broker_json(home)
        async with open_bridge_client(record["socket"], {"agent": agent, "project": str(project),
                                                         "hostSessionId": "hs-busy"}) as (rx, _):
            assert (await hook(home, project, "hs-busy", agent)).stdout == b""
            ids = await send(home, "hs-busy", ["use port 8080", "and rebuild"])
            await rx.request("decide", topic="db", text="PostgreSQL")  # a passive notice: never handed over
            text = context_of(await hook(home, project, "hs-busy", agent))
            assert "use port 8080" in text and "and rebuild" in text and all(i in text for i in ids)
            assert "not from the user" in text and "PostgreSQL" not in text
            assert None not in acked(home, ids)  # acknowledged once written
            assert (await hook(home, project, "hs-busy", agent)).stdout == b""  # nothing again
        assert not any("post-tool-use" in line for line in log_lines(home))


def start_hook(home: Path, project: Path, stdout: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*HOOK, "hook", "post-tool-use", "--agent", "claude"], stdin=subprocess.PIPE,
                            stdout=stdout, stderr=subprocess.DEVNULL, env=hook_env(home), cwd=project)


@pytest.mark.slow
async def test_a_hook_killed_before_its_write_acknowledges_nothing(broker, env, home, project):
    """The hook's stdout is a full pipe, so its write cannot happen: once the broker has handed it
    the message (offered), the hook is killed (SIGKILL). Nothing was written, nothing is
    acknowledged; the next tool call's hook shows the message, marked as a repeat."""
    with trio.fail_after(120):
        record = paths.read_broker_json(home)
        async with open_bridge_client(record["socket"], {"agent": "claude", "project": str(project),
                                                         "hostSessionId": "hs-kill"}):
            [mid] = await send(home, "hs-kill", ["the build is red"])
            read_end, write_end, filler = full_pipe()
            proc = start_hook(home, project, write_end)
            os.close(write_end)
            try:
                assert proc.stdin is not None
                proc.stdin.write(json.dumps(post_input("hs-kill", project)).encode())
                proc.stdin.close()

                await wait_for(offered_check(home, mid), what="the hook fetched the message")
                proc.kill()
                proc.wait(timeout=30)
                with os.fdopen(read_end, "rb") as pipe:
                    assert pipe.read() == b"x" * filler  # not a byte of the hook's answer
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=30)
            assert acked(home, [mid]) == [None]
            text = context_of(await hook(home, project, "hs-kill"))
            assert "the build is red" in text and "a repeat" in text
            assert acked(home, [mid]) != [None]


def waiting_for_lock(path: Path) -> bool:
    """Whether a process is queued in the kernel for an flock on `path` (/proc/locks: `->`)."""
    inode = os.stat(path).st_ino
    with open("/proc/locks", encoding="ascii") as f:
        return any("->" in line and line.split()[-3].endswith(f":{inode}") for line in f)


@pytest.mark.slow
async def test_parallel_hooks_hand_a_message_over_once(broker, env, home, project):
    """Two PostToolUse hooks of parallel tool calls: A has fetched the message and is still
    writing it (its stdout a full pipe); B, started then, waits for A's hand-over instead of
    fetching the same message (it queues on the session's hand-over lock, seen in /proc/locks).
    Once A has written and acknowledged, B finds nothing: the message reached the host once."""
    from agent_bridge.hooks import handover

    with trio.fail_after(120):
        record = paths.read_broker_json(home)
        async with open_bridge_client(record["socket"], {"agent": "claude", "project": str(project),
                                                         "hostSessionId": "hs-par"}):
            [mid] = await send(home, "hs-par", ["only once, please"])
            read_end, write_end, filler = full_pipe()
            first = start_hook(home, project, write_end)
            os.close(write_end)
            second = start_hook(home, project, subprocess.PIPE)
            try:
                assert first.stdin is not None and second.stdin is not None
                first.stdin.write(json.dumps(post_input("hs-par", project)).encode())
                first.stdin.close()

                await wait_for(offered_check(home, mid), what="the first hook fetched the message")
                second.stdin.write(json.dumps(post_input("hs-par", project)).encode())
                second.stdin.close()
                second.stdin = None  # communicate() must not flush it
                slot = handover.slot_path(home, "hs-par")

                async def queued_or_done() -> bool:
                    return waiting_for_lock(slot) or second.poll() is not None

                await wait_for(queued_or_done, what="the second hook to wait or finish")
                assert second.poll() is None, second.stdout.read() if second.stdout else ""
                # the host reads the first hook's answer: it writes, acknowledges, exits
                read = b""
                while chunk := await trio.to_thread.run_sync(os.read, read_end, 1 << 20):
                    read += chunk  # until the first hook exits (its end of the pipe closes)
                first.wait(timeout=30)
                assert len(read) > filler and mid in read[filler:].decode("utf-8", "replace")
                out, _ = await trio.to_thread.run_sync(lambda: second.communicate(timeout=60))
                assert out == b""  # nothing left: handed over once
            finally:
                os.close(read_end)
                for proc in (first, second):
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait(timeout=30)
            assert acked(home, [mid]) != [None]


def test_the_light_path_keeps_the_shared_limits():
    """post_tool_use and the store reader hold copies of two limits so that the path taken when
    nothing waits imports neither `hooks.common` nor `domain`."""
    from agent_bridge.common import domain
    from agent_bridge.hooks import common, post_tool_use

    assert post_tool_use.STDIN_MAX == common.STDIN_MAX
    assert reader.HOP_MAX == domain.HOP_MAX == domain.DECISION_HOP
