"""The Stop hook fetches, writes, then acknowledges (SPEC §3, "What 'shown' means"): a hook that
gives up before writing acknowledges nothing, and the messages come out at the next Stop,
marked as offered before."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from agent_bridge.common import ledger, paths
from agent_bridge.ipc.client import open_bridge_client
from agent_bridge.store import reader
from tests.conftest import wait_for
from tests.hooks.conftest import hook_env, run_hook

pytestmark = pytest.mark.slow


def stop_input(sid: str, project: Path) -> dict[str, Any]:
    return {"session_id": sid, "cwd": str(project), "hook_event_name": "Stop", "stop_hook_active": False,
            "last_assistant_message": "Done."}


def receipts(home: Path, ids: list[str]) -> list[tuple[Any, Any]]:
    marks = ",".join("?" * len(ids))
    with reader.reading(home / "bridge.db") as conn:
        return list(
            conn.execute(f"SELECT offered_at, acked_at FROM receipts WHERE message_id IN ({marks})", ids)
        )


async def stop_hook(home: Path, project: Path, sid: str) -> Any:
    return await trio.to_thread.run_sync(
        lambda: run_hook("stop", "claude", stop_input(sid, project), hook_env(home))
    )


async def send_three(home: Path, to: str) -> list[str]:
    record = paths.read_broker_json(home)
    assert record is not None
    hello = {"agent": "codex", "project": "/w/sender", "hostSessionId": "hs-sender"}
    async with open_bridge_client(record["socket"], hello) as (tx, _):
        return [(await tx.request("send", to=to, text=f"question {i}"))["message"]["id"] for i in range(3)]


async def test_a_stop_hook_past_its_deadline_acknowledges_nothing(broker, env, home, project):
    with trio.fail_after(120):
        record = paths.read_broker_json(home)
        async with open_bridge_client(record["socket"], {"agent": "claude", "project": str(project),
                                                         "hostSessionId": "hs-paused"}):
            ids = await send_three(home, "hs-paused")

            os.kill(broker.pid, signal.SIGSTOP)  # past the hook's deadline
            try:
                gave_up = await stop_hook(home, project, "hs-paused")
            finally:
                os.kill(broker.pid, signal.SIGCONT)
            assert (gave_up.returncode, gave_up.stdout) == (0, b"")

            # The broker now carries out the fetch the hook gave up on: offered, never acknowledged.
            async def offered() -> bool:
                return all(delivered is not None for delivered, _ in receipts(home, ids))

            await wait_for(offered, what="the abandoned fetch carried out")
            assert [acked for _, acked in receipts(home, ids)] == [None, None, None]

            second = await stop_hook(home, project, "hs-paused")
            answer = json.loads(second.stdout)
            assert answer["decision"] == "block"
            assert all(i in answer["reason"] for i in ids)
            assert answer["reason"].count("a repeat") == 3  # offered before: said so

            async def acknowledged() -> bool:
                return all(acked is not None for _, acked in receipts(home, ids))

            await wait_for(acknowledged, what="the messages acknowledged after the hook wrote them")
            assert (await stop_hook(home, project, "hs-paused")).stdout == b""


async def test_an_acknowledgement_left_in_the_home_folder_is_applied_before_the_next_fetch(
    broker, env, home, project
):
    """A Stop hook (or MCP server) that showed messages and could not reach the broker leaves
    the acknowledgement in the home folder; once its writer is gone, the broker applies it
    before it hands out that session's messages again."""
    with trio.fail_after(120):
        record = paths.read_broker_json(home)
        async with open_bridge_client(record["socket"], {"agent": "claude", "project": str(project),
                                                         "hostSessionId": "hs-ledger"}) as (rx, _):
            ids = await send_three(home, "hs-ledger")
            ledger.save(home, rx.hello["session"]["id"], ids[:2], ids[:2], pid=dead_pid())
            answer = json.loads((await stop_hook(home, project, "hs-ledger")).stdout)
            assert (
                ids[2] in answer["reason"]
                and ids[0] not in answer["reason"]
                and ids[1] not in answer["reason"]
            )
            assert "a repeat" not in answer["reason"]
            assert not (home / ledger.FOLDER).exists() or os.listdir(home / ledger.FOLDER) == []

            async def acknowledged() -> bool:
                return all(acked is not None for _, acked in receipts(home, ids))

            await wait_for(acknowledged, what="all three acknowledged")


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid
