"""The message bridge through real processes (SPEC §3): send, hops, inbox, offline delivery,
replay after broker restarts and MCP reloads, catch-up, identity pairing, channel events,
liveness."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from contextlib import AsyncExitStack
from typing import Any

import pytest
import trio
from pydantic import BaseModel, ConfigDict

from agent_bridge.common import paths, procinfo
from agent_bridge.ipc import blocking
from agent_bridge.store import reader
from tests.conftest import BrokerProcess, call, call_error, mcp_server_pids, mcp_session, run_cli, wait_for

pytestmark = pytest.mark.slow


async def inbox(session, **args):
    return await call(session, "inbox", **args)


async def inbox_until(session, count: int, timeout: float = 20.0) -> list[dict[str, Any]]:  # noqa: ASYNC109
    """Peek until `count` messages are waiting, then take them."""

    async def ready():
        return len(await inbox(session, peek=True, wait_seconds=1)) >= count

    await wait_for(ready, timeout=timeout, what=f"{count} messages")
    return await inbox(session)


def count_rows(home, sql: str) -> int:
    with reader.reading(home / "bridge.db") as conn:
        return conn.execute(sql).fetchone()[0]


async def test_send_reply_hops_and_errors(broker, env, home):
    with trio.fail_after(90):
        async with AsyncExitStack() as stack:
            a = await stack.enter_async_context(mcp_session(env, "--project", "/w/one"))
            b = await stack.enter_async_context(mcp_session(env, "--agent", "codex", "--project", "/w/one"))
            b_me = await call(b, "whoami")
            first = (await call(a, "send", to="codex-one", text="hi there"))["message"]
            assert first["hop"] == 1 and first["replyTo"] is None and first["kind"] == "message"
            assert first["from"]["name"] == "claude-one" and first["to"] == {
                "id": b_me["id"],
                "name": "codex-one",
            }
            got = await inbox_until(b, 1)
            assert [m["id"] for m in got] == [first["id"]] and got[0]["text"] == "hi there"
            reply = (await call(b, "send", to=got[0]["from"]["id"], text="hello back", reply_to=first["id"]))[
                "message"
            ]
            assert reply["hop"] == 2 and reply["replyTo"] == first["id"]
            assert [m["hop"] for m in await inbox_until(a, 1)] == [2]

            before = count_rows(home, "SELECT count(*) FROM messages")
            assert "no session" in await call_error(a, "send", to="nobody-here", text="x")
            assert "empty" in await call_error(a, "send", to="codex-one", text="   ")
            assert "16000" in await call_error(a, "send", to="codex-one", text="x" * 16001)
            assert "reply_to" in await call_error(a, "send", to="codex-one", text="x", reply_to="no-such-id")
            assert count_rows(home, "SELECT count(*) FROM messages") == before
            assert "wait_seconds" in await call_error(a, "inbox", wait_seconds=61)


async def test_hops_are_capped_at_100(broker, env):
    with trio.fail_after(120):
        async with AsyncExitStack() as stack:
            a = await stack.enter_async_context(mcp_session(env, "--project", "/w/cap"))
            b = await stack.enter_async_context(mcp_session(env, "--agent", "codex", "--project", "/w/cap"))
            last = (await call(a, "send", to="codex-cap", text="0"))["message"]
            for i in range(1, 101):
                sender, to = (b, "claude-cap") if i % 2 else (a, "codex-cap")
                last = (await call(sender, "send", to=to, text=str(i), reply_to=last["id"]))["message"]
            assert last["hop"] == 100


async def test_peek_then_consume(broker, env):
    with trio.fail_after(60):
        async with AsyncExitStack() as stack:
            a = await stack.enter_async_context(mcp_session(env, "--project", "/w/p"))
            b = await stack.enter_async_context(mcp_session(env, "--agent", "codex", "--project", "/w/p"))
            for text in ("one", "two", "three"):
                await call(a, "send", to="codex-p", text=text)
            peeked = await inbox_until_peek(b, 3)
            assert [m["text"] for m in peeked] == ["one", "two", "three"]  # oldest first
            assert [m["text"] for m in await inbox(b, peek=True)] == ["one", "two", "three"]
            assert [m["text"] for m in await inbox(b)] == ["one", "two", "three"]
            assert await inbox(b) == []


async def inbox_until_peek(session, count):
    async def ready():
        got = await inbox(session, peek=True, wait_seconds=1)
        return got if len(got) >= count else None

    return await wait_for(ready, what=f"{count} messages")


def relay_line(message: dict[str, Any]) -> dict[str, Any]:
    """A host line as the relay hands it to the broker."""
    return {"v": 1, "relay": "line", "line": json.dumps(message)}


async def relay_answer(relay: Any, rid: int) -> dict[str, Any]:
    """The broker's frame carrying the answer to host request `rid`."""
    while True:
        frame = await relay.receive()
        assert frame is not None, "the broker closed the relay's connection"
        if frame.get("push") == "line" and json.loads(frame["line"]).get("id") == rid:
            return frame


async def play_relay(sock: str, project: str) -> tuple[Any, dict[str, Any]]:
    """Connect to the broker as a session's relay and initialize its MCP session, as a host
    would: (the relay's connection, this session)."""
    from agent_bridge.ipc import protocol
    from agent_bridge.ipc.stream import FramedStream

    relay = FramedStream(await trio.open_unix_socket(sock))
    await relay.send(protocol.request(1, "mcp", agent="codex", project=project))
    hello = await relay.receive()
    assert hello is not None and hello["ok"], hello
    await relay.send(relay_line({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}))
    await relay_answer(relay, 1)
    await relay.send(relay_line({"jsonrpc": "2.0", "method": "notifications/initialized"}))
    return relay, hello["result"]["session"]


async def test_long_poll_wakes_on_arrival(home):
    """An inbox call waiting for a message returns when one arrives, not when its wait runs
    out. The broker runs in this process (the real MCP tools it serves, over its real socket)
    and the test is the session's relay, so the send goes out only once the poll is provably
    waiting (a task waits on the inbox's arrival event); the poll asks to wait far longer than
    the deadline it must meet."""
    from agent_bridge.common import tools
    from agent_bridge.ipc.client import open_bridge_client
    from tests.test_absorb_offers import broker_in_process

    with trio.fail_after(60):
        async with broker_in_process(home) as (broker, sock):
            relay, me = await play_relay(sock, "/w/lp")
            bridge = broker.sessions[me["id"]].conn.bridge  # type: ignore[attr-defined]

            async def waiting() -> bool:
                return bridge.arrived.statistics().tasks_waiting == 1

            await relay.send(relay_line({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
                "name": "inbox", "arguments": {"wait_seconds": tools.INBOX_WAIT_MAX, "peek": True}}}))
            await wait_for(waiting, what="the poll waiting")
            async with open_bridge_client(sock, {"agent": "claude", "project": "/w/lp"}, keepalive=False) as (
                tx,
                _,
            ):
                await tx.request("send", to=me["name"], text="wake up")
            # woken by the arrival, well before its own wait ends
            with trio.fail_after(tools.INBOX_WAIT_MAX / 2):
                result = json.loads((await relay_answer(relay, 2))["line"])
            await relay.aclose()
    assert [m["text"] for m in json.loads(result["result"]["content"][0]["text"])] == ["wake up"]


async def test_a_result_on_its_way_to_the_host_is_not_offered_again(home):
    """The relay writes an inbox result to the host, then reports it written; the host's next
    request can reach the broker in between. That request must not get the same messages again
    (they would reach the agent twice, the second time marked as a repeat). The broker runs in
    this process and the test is the relay, holding back the "written" report on purpose."""
    from agent_bridge.ipc.client import open_bridge_client
    from tests.test_absorb_offers import broker_in_process

    def inbox_call(rid: int) -> dict[str, Any]:
        return relay_line({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                           "params": {"name": "inbox", "arguments": {}}})

    def texts(frame: dict[str, Any]) -> list[str]:
        return [m["text"] for m in json.loads(json.loads(frame["line"])["result"]["content"][0]["text"])]

    with trio.fail_after(60):
        async with broker_in_process(home) as (broker, sock):
            relay, me = await play_relay(sock, "/w/way")
            async with open_bridge_client(
                sock, {"agent": "claude", "project": "/w/way"}, keepalive=False
            ) as (tx, _):
                await tx.request("send", to=me["name"], text="once")
            bridge = broker.sessions[me["id"]].conn.bridge  # type: ignore[attr-defined]

            async def arrived() -> bool:
                return bridge.showing.has_queued()

            await wait_for(arrived, what="the message in the session's inbox")
            await relay.send(inbox_call(2))
            first = await relay_answer(relay, 2)
            assert texts(first) == ["once"] and isinstance(first.get("seq"), int)
            await relay.send(inbox_call(3))  # before reporting the first result written
            second = await relay_answer(relay, 3)
            assert texts(second) == [], "a message on its way to the host was offered again"
            await relay.send({"v": 1, "relay": "written", "seq": first["seq"]})
            await relay.send(inbox_call(4))
            assert texts(await relay_answer(relay, 4)) == []
            await relay.aclose()


async def test_offline_recipient_gets_the_message_when_it_returns(broker, env, home):
    host_id = "host-session-offline"
    with trio.fail_after(90):
        async with mcp_session(
            env, "--agent", "codex", "--project", "/w/off", "--host-session-id", host_id
        ) as b:
            b_me = await call(b, "whoami")
            assert b_me["hostSessionId"] == host_id
        async with mcp_session(env, "--project", "/w/off") as a:
            async def gone():
                peers = await call(a, "peers")
                return all(not p["connected"] for p in peers if p["id"] == b_me["id"])

            await wait_for(gone, what="b disconnected")
            sent = (await call(a, "send", to=host_id, text="while you were out"))["message"]
            assert sent["to"]["id"] == b_me["id"]
        assert count_rows(home, "SELECT count(*) FROM receipts WHERE acked_at IS NULL") == 1
        async with mcp_session(
            env, "--agent", "codex", "--project", "/w/off", "--host-session-id", host_id
        ) as b2:
            me = await call(b2, "whoami")
            assert me["id"] == b_me["id"] and me["name"] == b_me["name"]  # the same session
            got = await inbox_until(b2, 1)
            assert [m["id"] for m in got] == [sent["id"]]


async def test_replay_after_broker_restart_and_mcp_reload_is_exactly_once(env, home):
    broker = BrokerProcess(env, home).start()
    host_id = "host-session-replay"
    try:
        with trio.fail_after(150):
            async with mcp_session(env, "--project", "/w/r") as a:
                async with mcp_session(
                    env, "--agent", "codex", "--project", "/w/r", "--host-session-id", host_id
                ) as b:
                    await call(a, "send", to="codex-r", text="before the crash")
                    await call(a, "decide", topic="db", text="PostgreSQL")
                    pending = await inbox_until_peek(b, 2)  # pushed to b, not yet shown
                    assert [m["kind"] for m in pending] == ["message", "decision"]
                    # the MCP servers start a new broker by themselves (a start of the test's own
                    # would race theirs, and lose whenever one of them is first)
                    await trio.to_thread.run_sync(broker.kill)
                    # both MCP servers reconnect by themselves; the replay is deduplicated
                    await call(a, "whoami")
                    got = await inbox(b)
                    assert [m["id"] for m in got] == [m["id"] for m in pending]
                    await trio.sleep(1)  # give a (wrong) second push a chance to arrive
                    assert await inbox(b, wait_seconds=1) == []
                    await call(a, "send", to="codex-r", text="after the restart")
                    await call(a, "decide", topic="ui", text="dark")
                    unseen = await inbox_until_peek(b, 2)
                # b's MCP server is gone (host reload) before it showed those two
                async with mcp_session(
                    env, "--agent", "codex", "--project", "/w/r", "--host-session-id", host_id
                ) as b2:
                    got = await inbox_until(b2, 2)
                    assert [m["id"] for m in got] == [m["id"] for m in unseen]
                    assert await inbox(b2, wait_seconds=1) == []
                # every receipt of b acknowledged, nothing left over
                unacked_b = (
                    "SELECT count(*) FROM receipts r JOIN peers p ON p.id = r.peer_id "
                    f"WHERE r.acked_at IS NULL AND p.host_session_id = '{host_id}'"
                )
                assert count_rows(home, unacked_b) == 0
    finally:
        broker.kill()


async def test_catch_up_delivers_only_missed_current_decisions(broker, env, home):
    host_id = "host-session-catchup"
    with trio.fail_after(120):
        async with mcp_session(env, "--project", "/w/cu") as a:
            async with mcp_session(
                env, "--agent", "codex", "--project", "/w/cu", "--host-session-id", host_id
            ) as b:
                await call(a, "decide", topic="seen", text="b saw this")
                await call(a, "decide", topic="changed", text="first version")
                got = await inbox_until(b, 2)
                assert sorted(m["decision"]["topic"] for m in got) == ["changed", "seen"]
            await call(a, "decide", topic="changed", text="second version")  # b offline
            await call(a, "decide", topic="new", text="recorded while b was away")
            await call(a, "decide", topic="elsewhere", text="not b's project", scope={"project": "/w/other"})
            await inbox(a)
            async with mcp_session(
                env, "--agent", "codex", "--project", "/w/cu", "--host-session-id", host_id
            ) as b2:
                got = await inbox_until(b2, 2)
                assert [(m["decision"]["topic"], m["decision"]["text"]) for m in got] == [
                    ("changed", "second version"),
                    ("new", "recorded while b was away"),
                ]
                assert await inbox(b2, wait_seconds=1) == []
            # reconnecting again (another reload) queues nothing new
            async with mcp_session(
                env, "--agent", "codex", "--project", "/w/cu", "--host-session-id", host_id
            ) as b3:
                assert await inbox(b3, wait_seconds=1.5) == []
            # relocated to another folder: that folder's current decisions arrive
            async with mcp_session(
                env, "--agent", "codex", "--project", "/w/other", "--host-session-id", host_id
            ) as b4:
                got = await inbox_until(b4, 1)
                assert [m["decision"]["topic"] for m in got] == ["elsewhere"]


def _fake_host() -> subprocess.Popen:
    """A process standing in for the agent host (Claude Code); both the hook and the MCP
    server name it through AGENT_BRIDGE_HOST_PID, as a wrapper-launched host would."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])


def _identify(home, host_pid: int, session_id: str, agent: str = "claude") -> dict:
    proc, _ = procinfo.describe(host_pid)
    return blocking.call(
        home, "identify", timeout=5,
        hostSessionId=session_id, agent=agent, host=procinfo.host_json(proc), chain=[], cwd="/w/id",
        source="startup", event="SessionStart",
    )


@pytest.mark.parametrize("hook_first", [True, False])
async def test_identity_pairing_either_order(broker, env, home, hook_first):
    host = _fake_host()
    session_id = f"claude-session-{hook_first}"
    try:
        e = {**env, "AGENT_BRIDGE_HOST_PID": str(host.pid)}
        with trio.fail_after(90):
            async with mcp_session(env, "--project", "/w/id") as a:
                await call(a, "decide", topic="known", text="before the session existed")
                if hook_first:
                    assert _identify(home, host.pid, session_id)["paired"] is False
                async with mcp_session(e, "--project", "/w/id") as s:
                    if not hook_first:
                        me = await call(s, "whoami")
                        assert me["hostSessionId"] is None  # pending: works, no catch-up yet
                        assert await inbox(s, wait_seconds=1) == []
                        result = await trio.to_thread.run_sync(_identify, home, host.pid, session_id)
                        assert result["paired"] is True
                    me = await call(s, "whoami")
                    assert me["hostSessionId"] == session_id
                    got = await inbox_until(s, 1)  # the catch-up, once identity is known
                    assert [m["decision"]["topic"] for m in got] == ["known"]
                    # /clear: a new host session id on the same host keeps the bridge session
                    # but counts as a new identity for catch-up
                    await trio.to_thread.run_sync(_identify, home, host.pid, session_id + "-cleared")
                    after = await call(s, "whoami")
                    assert after["id"] == me["id"] and after["hostSessionId"] == session_id + "-cleared"
                    got = await inbox_until(s, 1)
                    assert [m["decision"]["topic"] for m in got] == ["known"]
    finally:
        host.kill()
        host.wait()


async def test_mcp_reload_recovers_identity_from_the_persisted_map(broker, env, home):
    host = _fake_host()
    try:
        e = {**env, "AGENT_BRIDGE_HOST_PID": str(host.pid)}
        with trio.fail_after(90):
            async with mcp_session(e, "--project", "/w/map") as s:
                await trio.to_thread.run_sync(_identify, home, host.pid, "map-session")
                first = await call(s, "whoami")
                assert first["hostSessionId"] == "map-session"
            # a reloaded MCP server under the same host: no hook runs, the map is enough
            async with mcp_session(e, "--project", "/w/map") as s2:
                again = await call(s2, "whoami")
                assert again["id"] == first["id"] and again["hostSessionId"] == "map-session"
    finally:
        host.kill()
        host.wait()


class ChannelParams(BaseModel):
    model_config = ConfigDict(extra="allow")
    content: str
    meta: dict[str, Any] = {}


async def test_channel_notifications_only_for_active_messages(env, home):
    from mcp.client.extension import NotificationBinding

    broker = BrokerProcess(env, home).start({"AGENT_BRIDGE_HOP_LIMIT": "2"})
    events: list[ChannelParams] = []

    async def on_channel(params: ChannelParams) -> None:
        events.append(params)

    binding = NotificationBinding(
        method="notifications/claude/channel", params_type=ChannelParams, handler=on_channel
    )
    try:
        with trio.fail_after(90):
            async with mcp_session(env, "--agent", "codex", "--project", "/w/ch") as a:
                async with mcp_session(env, "--project", "/w/ch", channel=True, bindings=[binding]) as c:
                    first = (await call(a, "send", to="claude-ch", text="active one"))["message"]  # hop 1 < 2
                    await wait_for(_async(lambda: len(events) >= 1), what="channel event")
                    assert "active one" in events[0].content and "codex-ch" in events[0].content
                    assert "not from the user" in events[0].content
                    assert events[0].meta["message_id"] == first["id"]
                    # shown through the channel: acknowledged, not shown again by inbox
                    assert await inbox(c, wait_seconds=1) == []
                    reply = (await call(c, "send", to="codex-ch", text="ok", reply_to=first["id"]))["message"]
                    passive = (await call(a, "send", to="claude-ch", text="passive", reply_to=reply["id"]))[
                        "message"
                    ]
                    assert passive["hop"] == 3  # >= hop limit 2: passive
                    await call(a, "decide", topic="t", text="decision notices are passive")
                    got = await inbox_until(c, 2)
                    assert [m["text"] for m in got][0] == "passive"
                    assert len(events) == 1  # no channel event for the passive message or the decision
    finally:
        broker.kill()


def _async(predicate):
    async def inner():
        return predicate()

    return inner


async def test_killed_mcp_server_is_marked_disconnected(broker, env):
    with trio.fail_after(90):
        async with mcp_session(env, "--project", "/w/alive") as a:
            async with mcp_session(env, "--agent", "codex", "--project", "/w/doomed") as doomed:
                await call(doomed, "whoami")  # a real session (a health check would leave no trace)
                pids = mcp_server_pids("/w/doomed")
                assert len(pids) == 1
                assert any(p["name"] == "codex-doomed" and p["connected"] for p in await call(a, "peers"))
                os.kill(pids[0], signal.SIGKILL)

                async def disconnected():
                    return any(
                        p["name"] == "codex-doomed" and not p["connected"] for p in await call(a, "peers")
                    )

                await wait_for(disconnected, what="codex-doomed disconnected")


async def test_sigkill_the_broker_repeatedly_loses_nothing_and_duplicates_nothing(env, home):
    """One session sends, another receives, decisions are recorded, and the broker is killed
    with SIGKILL again and again; the MCP servers start a new one themselves each time."""
    BrokerProcess(env, home).start()
    sent: dict[str, float] = {}  # message id -> when send returned
    decided: list[str] = []
    received: list[str] = []
    latencies: list[float] = []
    kills = 0
    try:
        with trio.fail_after(240):
            async with mcp_session(env, "--project", "/w/chaos") as a:
                async with mcp_session(
                    env, "--agent", "codex", "--project", "/w/chaos", "--host-session-id", "chaos-b"
                ) as b:
                    stop = trio.Event()

                    async def sender():
                        n = 0
                        while not stop.is_set():
                            n += 1
                            result = await a.call_tool("send", {"to": "chaos-b", "text": f"m{n}"})
                            if not result.is_error:
                                sent[json.loads(result.content[0].text)["message"]["id"]] = (
                                    trio.current_time()
                                )
                            if n % 10 == 0:
                                d = await a.call_tool("decide", {"topic": f"t{n % 30}", "text": f"v{n}"})
                                if not d.is_error:
                                        decided.append(json.loads(d.content[0].text)["decision"]["id"])
                            await trio.sleep(0.005)

                    async def receiver():
                        while True:
                            result = await b.call_tool("inbox", {"wait_seconds": 1})
                            if result.is_error:
                                continue
                            for m in json.loads(result.content[0].text):
                                received.append(m["id"])
                                if m["id"] in sent:
                                    latencies.append(trio.current_time() - sent[m["id"]])

                    async def killer():
                        nonlocal kills
                        for _ in range(4):
                            await trio.sleep(1.5)
                            old_pid = paths.read_broker_json(home)["pid"]
                            os.kill(old_pid, signal.SIGKILL)
                            kills += 1

                            async def replaced(old_pid=old_pid):
                                now = paths.read_broker_json(home)
                                return now and now["pid"] != old_pid and paths.pid_alive(now["pid"])

                            await wait_for(replaced, timeout=30, what="a new broker")
                        await trio.sleep(1)
                        stop.set()

                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(receiver)
                        nursery.start_soon(killer)
                        await sender()

                        async def all_arrived():
                            return set(sent) <= set(received)

                        await wait_for(all_arrived, timeout=60, what="every successful send delivered")
                        await trio.sleep(1.5)  # a duplicate replay would show up in this window
                        nursery.cancel_scope.cancel()
        assert kills == 4
        assert len(sent) > 20
        assert set(sent) <= set(received), "a send that returned success was lost"
        assert len(received) == len(set(received)), "a message reached the agent twice"
        # every decision notification b got is a distinct message
        with reader.reading(home / "bridge.db") as conn:
            rows = conn.execute(
                "SELECT dd.decision_id, count(*) FROM decision_deliveries dd WHERE dd.host_key = 'chaos-b' "
                "GROUP BY dd.decision_id HAVING count(*) > 1"
            ).fetchall()
        assert rows == []
        latencies.sort()
        print(
            f"\nchaos: {len(sent)} sent, {kills} kills, latency "
            f"p50={latencies[len(latencies) // 2] * 1000:.1f}ms "
            f"p99={latencies[int(len(latencies) * 0.99)] * 1000:.1f}ms max={latencies[-1] * 1000:.0f}ms"
        )
    finally:
        run_cli(env, "down")


async def test_a_line_nested_too_deep_from_a_relay_client_is_refused_and_the_session_goes_on(home):
    """A client speaking the relay protocol for itself (no relay to catch it first) sends a
    `tools/call` whose scope nests 1,500 deep: it gets JSON-RPC -32600 with its id, and the
    session answers its next call."""
    from agent_bridge.common import jsonlimit
    from tests.test_absorb_offers import broker_in_process

    deep = '{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"decide","arguments":' \
        '{"topic":"t","text":"x","scope":' + "[" * 1500 + "]" * 1500 + "}}}"
    with trio.fail_after(60):
        async with broker_in_process(home) as (broker, sock):
            relay, _ = await play_relay(sock, "/w/deep")
            await relay.send({"v": 1, "relay": "line", "line": deep})
            answer = json.loads((await relay_answer(relay, 7))["line"])
            assert answer["error"]["code"] == -32600
            assert f"nested deeper than {jsonlimit.MAX_DEPTH} levels" in answer["error"]["message"]
            await relay.send(relay_line({"jsonrpc": "2.0", "id": 8, "method": "tools/call",
                                         "params": {"name": "whoami", "arguments": {}}}))
            assert "result" in json.loads((await relay_answer(relay, 8))["line"])
            await relay.aclose()
