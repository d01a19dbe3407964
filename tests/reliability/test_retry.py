"""Safe retry across a crash (SPEC §3 "Conversations agents can rely on", §8): a `send` with a
`message_id` in flight when the broker is killed -9, between its commit and its answer or just
before its commit, is sent again by the relay to the broker it starts next, and the message is
stored exactly once, shown to its recipient exactly once. The broker kills itself at the named
point (AGENT_BRIDGE_FAULT, common/faults.py); the MCP servers are real processes driven by the
MCP client over stdio."""

from __future__ import annotations

import uuid
from contextlib import AsyncExitStack
from typing import Any

import pytest
import trio

from tests.conftest import call, mcp_session
from tests.reliability.harness import KILLED, count, start_faulty_broker, stop_any_broker, wait_killed

pytestmark = pytest.mark.slow

LOST_DURING = "may or may not have been recorded"


async def open_pair(stack: AsyncExitStack, env: dict[str, str], project: str) -> tuple[Any, Any]:
    """A sender and a receiver (`rx`), real MCP servers known by their host session ids."""
    pair = []
    for agent, name in (("claude", "tx"), ("codex", "rx")):
        args = ("--agent", agent, "--name", name, "--project", project, "--host-session-id", name)
        pair.append(await stack.enter_async_context(mcp_session(env, *args)))
    return pair[0], pair[1]


@pytest.mark.parametrize(("point", "duplicate"), [("send:after-commit", True), ("send:before-commit", False)])
async def test_a_send_with_a_message_id_survives_a_kill_between_its_commit_and_its_answer(
    env, home, point, duplicate
):
    broker = start_faulty_broker(env, home, point)
    try:
        with trio.fail_after(180):
            async with AsyncExitStack() as stack:
                sender, receiver = await open_pair(stack, env, "/w/retry")
                mid = str(uuid.uuid4())
                result = await call(sender, "send", to="rx", text="exactly once", message_id=mid)
                assert await wait_killed(broker) == KILLED  # the faulty broker died inside that send
                # The relay sent the call again to the broker it started: committed before the kill,
                # the message is returned as stored; rolled back, it is stored now. Either way once.
                assert result["message"]["id"] == mid
                assert result.get("duplicate", False) is duplicate
                stored = "SELECT count(*) FROM messages WHERE id = ? OR send_id = ?"
                assert count(home, stored, (mid, mid)) == 1
                assert count(home, "SELECT count(*) FROM receipts WHERE message_id = ?", (mid,)) == 1
                shown = []
                with trio.fail_after(60):
                    while not shown:
                        shown = await call(receiver, "inbox", wait_seconds=5)
                assert [m["id"] for m in shown] == [mid]
                assert await call(receiver, "inbox", peek=True) == []
                (receipt,) = await call(sender, "sent", ids=[mid])
                assert receipt["text"] == "exactly once"
    finally:
        broker.kill()
        stop_any_broker(env)


async def test_a_send_without_a_message_id_in_flight_at_the_kill_is_answered_unsure(env, home):
    """Without a message_id the relay cannot send it again safely: the agent is told it may or
    may not have been recorded, and to check `sent` first (or retry with a message_id)."""
    broker = start_faulty_broker(env, home, "send:after-commit")
    try:
        with trio.fail_after(180):
            async with AsyncExitStack() as stack:
                sender, _ = await open_pair(stack, env, "/w/unsure")
                failed = await sender.call_tool("send", {"to": "rx", "text": "maybe"})
                assert failed.is_error
                text = failed.content[0].text
                assert LOST_DURING in text and "`sent`" in text and "message_id" in text
                assert await wait_killed(broker) == KILLED
                (receipt,) = await call(sender, "sent")  # what the agent does: look, not resend
                assert receipt["text"] == "maybe"
    finally:
        broker.kill()
        stop_any_broker(env)
