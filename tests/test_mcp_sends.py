"""A session's plain `send` calls, queued and sent together (broker.mcp.sends), through a real
`agent-bridge mcp` and a real broker, by a host written from the MCP specification (JSON-RPC
2.0 lines on the server's stdin, tests.test_delivery.RawHost).

Several sends in one write are each answered with their own message or error, in the words the
`send` op gives any client. A `notifications/cancelled` for a send still waiting for the commit
before it takes it back: nothing of it is stored and it is never answered. One whose commit is
under way is stored and never answered. The broker is made to stand still (SIGSTOP) inside a
send's transaction, its test-only fault point, so the cancel is read while the send waits."""

from __future__ import annotations

import json
import os
import signal
import uuid
from functools import partial
from typing import Any

import pytest
import trio

from agent_bridge.common import tools
from agent_bridge.ipc.client import open_bridge_client
from agent_bridge.ipc.protocol import RemoteError
from tests.conftest import BrokerProcess, wait_until
from tests.reliability.harness import rows
from tests.reliability.test_shutdown import proc_state
from tests.test_delivery import MODERN_META, RawHost, socket_of

pytestmark = pytest.mark.slow

PROJECT = "/w/sends"


RX = {"agent": "codex", "project": PROJECT, "name": "rx"}  # the recipient, a bridge-protocol session
MESSAGE_ID = "6f1c1f52-1b0e-4c39-9d52-2b8a2f0c6a01"


def send_line(rid: int, **arguments: Any) -> dict[str, Any]:
    params = {"name": "send", "arguments": arguments}
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}


def cancel_line(rid: int) -> dict[str, Any]:
    params = {"requestId": rid, "reason": "user pressed Esc"}
    return {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params}


def modern_send(rid: int, *, fresh: bool = False, **arguments: Any) -> dict[str, Any]:
    """A `send` call of a host of the 2026 protocol: every request carries its envelope in
    `_meta`. The fast path serves it once the SDK accepted that envelope for a call of the
    session (broker.mcp.fast); before, and with an envelope not sent before (`fresh`: a client
    version of this call's own), the SDK does."""
    line = send_line(rid, **arguments)
    meta = dict(MODERN_META)
    if fresh:
        meta["io.modelcontextprotocol/clientInfo"] = {"name": "claude-code", "version": f"2.1.332-{rid}"}
    line["params"]["_meta"] = meta
    return line


async def modern_host(env, session: str, *, first_call: bool = True) -> RawHost:
    """A host of the 2026 protocol (no handshake: a `server/discover` probe, as Claude Code
    2.1.332 makes it), its first tool call made (`first_call`)."""
    host = await RawHost.start_modern(env, "--project", PROJECT, "--host-session-id", session)
    if first_call:
        rid = await host.request("tools/call", {"name": "whoami", "arguments": {}, "_meta": MODERN_META})
        assert "result" in await host.answer(rid), host.lines
    return host


def text_of(answer: dict[str, Any]) -> Any:
    return json.loads(answer["result"]["content"][0]["text"])


def stored(home, text: str) -> int:
    return len(rows(home, "SELECT id FROM messages WHERE body = ?", (text,)))


def test_the_queued_tool_is_the_op_of_its_name() -> None:
    """What broker.mcp.sends runs for the tool is what the SDK's registration runs for it."""
    tool = tools.TOOLS["send"]
    assert tool.op == "send" and not tool.body


async def test_sends_in_one_write_are_answered_each_in_order_and_a_bad_one_alone(broker, env, home):
    with trio.fail_after(90):
        async with open_bridge_client(socket_of(home), RX) as (rx, _):
            try:
                await rx.request("send", to="nobody-here", text="x")
            except RemoteError as exc:
                refused = exc.message  # the op's own words, to any client
            else:
                raise AssertionError("a send to nobody was stored")
            host = await RawHost.start(env, "--project", PROJECT, "--host-session-id", "hs-sends")
            try:
                ids = [host.next_id() for _ in range(5)]
                await host.send(
                    send_line(ids[0], to="rx", text="one"),
                    send_line(ids[1], to="rx", text="two"),
                    send_line(ids[2], to="nobody-here", text="lost"),
                    send_line(ids[3], to="rx", text="three", reply_to=None),
                    send_line(ids[4], to="rx", text="four", message_id=MESSAGE_ID),
                )
                answers = [await host.answer(rid) for rid in ids]
            finally:
                await host.close()
            assert [a["id"] for a in answers] == ids
            assert all(len(host.answers(rid)) == 1 for rid in ids)
            bad = answers[2]["result"]
            assert bad["isError"] is True
            assert bad["content"] == [{"type": "text", "text": f"Error executing tool send: {refused}"}]
            assert [a["result"]["isError"] for i, a in enumerate(answers) if i != 2] == [False] * 4
            good = [text_of(a) for i, a in enumerate(answers) if i != 2]
            assert [g["message"]["text"] for g in good] == ["one", "two", "three", "four"]
            assert [g["message"]["to"]["name"] for g in good] == ["rx"] * 4
            assert good[3]["message"]["id"] == MESSAGE_ID
            assert stored(home, "lost") == 0
            in_order = rows(home, "SELECT body FROM messages WHERE to_peer = ? ORDER BY rowid",
                            (good[0]["message"]["to"]["id"],))
            assert [body for (body,) in in_order] == ["one", "two", "three", "four"]


class StandingBroker:
    """A real broker that stops itself (SIGSTOP) inside the first send's transaction."""

    def __init__(self, env: dict[str, str], home) -> None:
        self.broker = BrokerProcess(env, home).start({"AGENT_BRIDGE_FAULT": "send:before-commit/stop"})

    def wait_stopped(self) -> None:
        wait_until(lambda: proc_state(self.broker.pid) == "T", what="the broker to stand still in a commit")

    def go_on(self) -> None:
        os.kill(self.broker.pid, signal.SIGCONT)

    def stop(self) -> None:
        self.go_on()
        self.broker.stop()


async def sending_host(env) -> RawHost:
    """The sending host, its first tool call made (its session is a real one)."""
    host = await RawHost.start(env, "--project", PROJECT, "--host-session-id", "hs-sender")
    await host.tool("whoami")
    return host


@pytest.mark.parametrize("protocol", ["2025", "2026", "2026-fresh"])
async def test_a_send_cancelled_while_it_waits_for_the_commit_before_it_is_never_stored(env, home, protocol):
    """2025: a handshake-era host, whose plain sends the fast path serves: the cancelled one is
    never answered. 2026: every request carries its envelope, one the SDK accepted for the
    host's first call, so the fast path serves them alike. 2026-fresh: each call's envelope is
    new, so the SDK serves it, in the place its line kept in line (broker.mcp.sends): whatever
    answers the cancelled one is no result (a host ignores answers to what it cancelled).
    Never stored, on every path."""
    line = {"2025": send_line, "2026": modern_send, "2026-fresh": partial(modern_send, fresh=True)}[protocol]
    standing = StandingBroker(env, home)
    try:
        with trio.fail_after(90):
            async with open_bridge_client(socket_of(home), RX):
                host = await (sending_host(env) if protocol == "2025" else modern_host(env, "hs-cancel"))
                try:
                    first, second, third = host.next_id(), host.next_id(), host.next_id()
                    await host.send(line(first, to="rx", text="first"))
                    await trio.to_thread.run_sync(standing.wait_stopped)
                    # while the first send's commit stands still: a second send and its cancel
                    await host.send(line(second, to="rx", text="second"), cancel_line(second))
                    standing.go_on()
                    assert text_of(await host.answer(first))["message"]["text"] == "first"
                    await host.send(line(third, to="rx", text="third"))
                    await host.answer(third)  # queued behind the second: its answer would be out by now
                    if protocol == "2026-fresh":
                        assert all(a.get("error") or a["result"]["isError"] for a in host.answers(second))
                    else:
                        assert host.answers(second) == []
                    assert (stored(home, "first"), stored(home, "second"), stored(home, "third")) == (1, 0, 1)
                finally:
                    await host.close()
    finally:
        standing.stop()


async def test_a_send_cancelled_during_its_commit_is_stored_whole(env, home):
    """The cancel is read once the commit is done: the send is stored, and its answer, made by
    then, may still be written (a host ignores the answer to a call it cancelled)."""
    standing = StandingBroker(env, home)
    try:
        with trio.fail_after(90):
            async with open_bridge_client(socket_of(home), RX) as (rx, pushes):
                host = await sending_host(env)
                try:
                    first, after = host.next_id(), host.next_id()
                    await host.send(send_line(first, to="rx", text="first"))
                    await trio.to_thread.run_sync(standing.wait_stopped)
                    await host.send(cancel_line(first))
                    standing.go_on()
                    await host.send(send_line(after, to="rx", text="after"))
                    await host.answer(after)
                    assert len(host.answers(first)) <= 1
                    assert (stored(home, "first"), stored(home, "after")) == (1, 1)
                    texts = []
                    async for push in pushes:  # the recipient gets it, once, in order
                        if push.get("push") == "message":
                            texts.append(push["message"]["text"])
                            await rx.request("ack", ids=[push["message"]["id"]])
                            if len(texts) == 2:
                                break
                    assert texts == ["first", "after"]
                finally:
                    await host.close()
    finally:
        standing.stop()


async def test_a_modern_host_s_sends_in_one_write_are_stored_in_the_order_they_came(broker, env, home):
    """The SDK serves each of these in a task of its own, and Trio runs tasks woken together in
    any order; each keeps the place its line came in the session's queue (broker.mcp.sends), so
    the messages are stored, pushed and answered in that order. Some carry a message_id, whose
    check is one more step before the commit."""
    texts = [f"modern {i}" for i in range(8)]
    keys = {i: str(uuid.UUID(int=i + 1)) for i in (1, 4, 6)}
    with trio.fail_after(90):
        async with open_bridge_client(socket_of(home), RX):
            host = await modern_host(env, "hs-modern-sends", first_call=False)  # these are its first
            try:
                ids = [host.next_id() for _ in texts]
                await host.send(*(
                    modern_send(rid, to="rx", text=text, **({"message_id": keys[i]} if i in keys else {}))
                    for i, (rid, text) in enumerate(zip(ids, texts, strict=True))
                ))
                answers = [await host.answer(rid) for rid in ids]
            finally:
                await host.close()
    assert [a["result"]["isError"] for a in answers] == [False] * len(texts), answers
    assert [text_of(a)["message"]["text"] for a in answers] == texts
    to_id = text_of(answers[0])["message"]["to"]["id"]
    in_order = rows(home, "SELECT body FROM messages WHERE to_peer = ? ORDER BY rowid", (to_id,))
    assert [body for (body,) in in_order] == texts


async def test_sends_the_sdk_refuses_hold_up_none_of_the_sends_after_them(broker, env, home):
    """A `send` call the fast path leaves to the SDK keeps its place in line, and one the SDK
    answers without calling the tool (arguments it refuses, the 2026 envelope on a handshake
    connection) gives that place up when its answer is written: the sends around it are stored
    in order and answered, and it stores nothing."""
    with trio.fail_after(90):
        async with open_bridge_client(socket_of(home), RX):
            host = await sending_host(env)
            try:
                ids = [host.next_id() for _ in range(6)]
                refused = [
                    send_line(ids[1], to="rx", text="refused 1", colour="red"),  # an argument it lacks
                    {**send_line(ids[2], to="rx", text="refused 2"),
                     "params": {"name": "send", "arguments": "to rx"}},  # arguments not an object
                    modern_send(ids[3], to="rx", text="refused 3"),  # a 2026 request on a 2025 connection
                    send_line(ids[4], to="rx", text=7),  # text not a string
                ]
                await host.send(send_line(ids[0], to="rx", text="before"), *refused,
                                send_line(ids[5], to="rx", text="after"))
                answers = [await host.answer(rid) for rid in ids]
            finally:
                await host.close()
    assert text_of(answers[0])["message"]["text"] == "before"
    assert text_of(answers[5])["message"]["text"] == "after"
    for answer in answers[1:5]:  # each an error, a tool's or the protocol's
        assert answer.get("error") or answer["result"]["isError"], answer
    assert [stored(home, f"refused {i}") for i in range(1, 5)] == [0, 0, 0, 0]
    to_id = text_of(answers[0])["message"]["to"]["id"]
    in_order = rows(home, "SELECT body FROM messages WHERE to_peer = ? ORDER BY rowid", (to_id,))
    assert [body for (body,) in in_order] == ["before", "after"]
