"""A send or decide that resolved its recipient before a concurrent identity merge (a hook
tells the broker that a pending connection is an earlier session: `learn` → `absorb_peer`)
still lands on the live session, and the sender is told the truth.

Driven deterministically: the broker runs in this process with a pause point that runs the
merge, through the real `identify` path, exactly between resolving and storing. Real store,
real Unix socket, real bridge clients."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import trio

from agent_bridge.broker.routing import handle_connection
from agent_bridge.broker.state import Broker
from agent_bridge.broker.storage import serve_store
from agent_bridge.common import paths
from agent_bridge.common.config import Settings
from agent_bridge.ipc.client import open_bridge_client
from agent_bridge.ipc.listener import serve_unix
from tests.reliability.harness import rows

HOST = {"pid": 4242, "start": 17, "exe": "codex"}  # the host instance the pending connection runs under


@asynccontextmanager
async def broker_in_process(
    home: Path, pause: Callable[[Broker, str], Awaitable[None]]
) -> AsyncIterator[str]:
    paths.ensure_home(home)
    async with trio.open_nursery() as nursery:
        store = await nursery.start(partial(serve_store, paths.db_path(home), lambda line: None))
        broker = Broker(store, Settings(), home, trio.Event())
        broker.pause = partial(pause, broker)
        socket_path = await nursery.start(
            serve_unix, str(home / "b.sock"), partial(handle_connection, broker)
        )
        yield socket_path
        nursery.cancel_scope.cancel()


def merge_at(point: str) -> tuple[Callable[[Broker, str], Awaitable[None]], list[dict[str, Any]]]:
    """A pause that, the first time the broker reaches `point`, has a hook report that the
    pending connection on HOST is host session "earlier" (an existing record)."""
    results: list[dict[str, Any]] = []

    async def pause(broker: Broker, reached: str) -> None:
        if reached == point and not results:
            results.append(
                await broker.identify({"hostSessionId": "earlier", "agent": "codex", "host": HOST})
            )

    return pause, results


async def first_push(pushes: Any, kind: str) -> dict[str, Any]:
    async for frame in pushes:
        if frame.get("push") == "message" and frame["message"]["kind"] == kind:
            return frame["message"]
    raise AssertionError("connection closed before the push")


async def setup(socket_path: str) -> str:
    """The earlier session: a record with host session id "earlier", not connected now."""
    hello = {"agent": "codex", "project": "/w/race", "hostSessionId": "earlier"}
    async with open_bridge_client(socket_path, hello, keepalive=False) as (client, _):
        return str(client.hello["session"]["id"])  # type: ignore[index]


async def test_a_send_resolved_before_a_merge_reaches_the_merged_session(home):
    pause, merged = merge_at("send:resolved")
    with trio.fail_after(30):
        async with broker_in_process(home, pause) as sock:
            earlier = await setup(sock)
            pending_hello = {"agent": "codex", "project": "/w/race", "host": HOST}
            sender_hello = {"agent": "claude", "project": "/w/race", "hostSessionId": "sender"}
            async with (
                open_bridge_client(sock, pending_hello, keepalive=False) as (pending, pushes),
                open_bridge_client(sock, sender_hello, keepalive=False) as (sender, _),
            ):
                old_id = pending.hello["session"]["id"]  # type: ignore[index]
                assert old_id != earlier
                result = await sender.request("send", to=old_id, text="addressed before the merge")
                assert merged and merged[0]["paired"]  # the merge ran between resolving and storing
                assert result["message"]["to"]["id"] == earlier
                got = await first_push(pushes, "message")
                assert got["id"] == result["message"]["id"]
                assert (await pending.request("whoami"))["id"] == earlier
    assert rows(home, "SELECT to_peer FROM messages") == [(earlier,)]
    assert rows(home, "SELECT peer_id FROM receipts") == [(earlier,)]


async def test_a_decide_resolved_before_a_merge_notifies_the_merged_session(home):
    pause, merged = merge_at("decide:resolved")
    with trio.fail_after(30):
        async with broker_in_process(home, pause) as sock:
            earlier = await setup(sock)
            pending_hello = {"agent": "codex", "project": "/w/race", "host": HOST}
            author_hello = {"agent": "claude", "project": "/w/race", "hostSessionId": "author"}
            async with (
                open_bridge_client(sock, pending_hello, keepalive=False) as (pending, pushes),
                open_bridge_client(sock, author_hello, keepalive=False) as (author, _),
            ):
                await pending.request("whoami")  # a tool call: a real session, in the fan-out
                result = await author.request("decide", topic="db", text="PostgreSQL")
                assert merged and merged[0]["paired"]
                assert "codex-race" in result["deliveredTo"]
                got = await first_push(pushes, "decision")
                assert got["decision"]["id"] == result["decision"]["id"]
    decision = result["decision"]["id"]
    assert rows(
        home,
        "SELECT host_key, peer_id FROM decision_deliveries WHERE decision_id = ? ORDER BY host_key",
        (decision,),
    ) == [
        ("author", rows(home, "SELECT id FROM peers WHERE host_session_id = 'author'")[0][0]),
        ("earlier", earlier),
    ]
