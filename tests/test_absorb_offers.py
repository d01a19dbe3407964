"""A message a pending connection is showing when a hook tells the broker that connection is
an earlier session (`learn` → `absorb_peer`) keeps its offer: the Stop hook does not show it a
second time, and if the MCP server dies before acknowledging, the next one marks it a repeat.
Acknowledgements a gone process left in the home folder for the merged record still apply.

The broker runs in this process so the merge happens exactly between the offer and the ack:
real store, real Unix socket, real bridge clients, the real `identify` and `stop_check` paths."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from agent_bridge.broker.routing import handle_connection
from agent_bridge.broker.state import Broker
from agent_bridge.broker.storage import serve_store
from agent_bridge.common import ledger, paths
from agent_bridge.common.config import Settings
from agent_bridge.ipc.client import open_bridge_client
from agent_bridge.ipc.listener import serve_unix
from tests.conftest import wait_for
from tests.reliability.harness import rows

HOST = {"pid": 4343, "start": 23, "exe": "codex"}  # the host instance the pending connection runs under
PENDING = {"agent": "codex", "project": "/w/absorb", "host": HOST}


@asynccontextmanager
async def broker_in_process(home: Path) -> AsyncIterator[tuple[Broker, str]]:
    paths.ensure_home(home)
    async with trio.open_nursery() as nursery:
        store = await nursery.start(partial(serve_store, paths.db_path(home), lambda line: None))
        broker = Broker(store, Settings(), home, trio.Event())
        socket_path = await nursery.start(
            serve_unix, str(home / "b.sock"), partial(handle_connection, broker)
        )
        yield broker, socket_path
        nursery.cancel_scope.cancel()


async def earlier_session(sock: str) -> str:
    """A record with host session id "earlier", not connected now."""
    async with open_bridge_client(sock, {**PENDING, "hostSessionId": "earlier"}, keepalive=False) as (
        client,
        _,
    ):
        return str(client.hello["session"]["id"])  # type: ignore[index]


async def active_push(pushes: Any) -> dict[str, Any]:
    async for frame in pushes:
        if frame.get("push") == "message" and frame["message"]["kind"] == "message":
            return frame["message"]
    raise AssertionError("connection closed before the push")


async def offered_then_merged(broker: Broker, sock: str, pending: Any, pushes: Any) -> tuple[str, str]:
    """A sender sends to the pending connection, which offers the message (about to write it
    to its host); then a hook reports that connection is host session "earlier"."""
    sender_hello = {"agent": "claude", "project": "/w/absorb", "hostSessionId": "sender"}
    async with open_bridge_client(sock, sender_hello, keepalive=False) as (sender, _):
        await sender.request("send", to=pending.hello["session"]["id"], text="being shown")
    message = await active_push(pushes)
    await pending.request("offer", ids=[message["id"]])
    paired = await broker.identify({"hostSessionId": "earlier", "agent": "codex", "host": HOST})
    assert paired["paired"]
    return message["id"], (await pending.request("whoami"))["id"]


async def test_the_stop_hook_does_not_show_what_the_merged_connection_is_showing(home):
    with trio.fail_after(30):
        async with broker_in_process(home) as (broker, sock):
            earlier = await earlier_session(sock)
            async with open_bridge_client(sock, PENDING, keepalive=False) as (pending, pushes):
                mid, now_id = await offered_then_merged(broker, sock, pending, pushes)
                assert now_id == earlier
                stop = await broker.stop_check({"hostSessionId": "earlier", "agent": "codex", "host": HOST})
                assert stop["sessionId"] == earlier
                assert [m["id"] for m in stop["messages"]] == [], (
                    "shown by the MCP server and by the Stop hook"
                )
                await pending.request("ack", ids=[mid])
    assert rows(home, "SELECT peer_id, acked_at IS NOT NULL FROM receipts") == [(earlier, 1)]


async def test_an_offer_made_before_the_merge_marks_the_repeat_after_a_crash(home):
    with trio.fail_after(30):
        async with broker_in_process(home) as (broker, sock):
            earlier = await earlier_session(sock)
            async with open_bridge_client(sock, PENDING, keepalive=False) as (pending, pushes):
                mid, _ = await offered_then_merged(broker, sock, pending, pushes)
            # The MCP server died between writing and acknowledging; its host starts another.
            again = {"agent": "codex", "project": "/w/absorb", "hostSessionId": "earlier"}
            async with open_bridge_client(sock, again, keepalive=False) as (client, pushes):
                assert client.hello["session"]["id"] == earlier  # type: ignore[index]
                message = await active_push(pushes)
                assert message["id"] == mid
                assert message.get("repeat") is True, "shown twice, unmarked"
    assert rows(home, "SELECT peer_id, offered_at IS NOT NULL FROM receipts") == [(earlier, 1)]


@pytest.fixture
def gone_pid() -> int:
    """The pid of a process that has ended."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return gone.pid


async def test_an_acknowledgement_left_for_a_merged_record_still_applies(home, gone_pid):
    """A process that acknowledged for a record later merged away (its file names the old id)
    and died: the broker applies the acknowledgement to the record the old id leads to."""
    with trio.fail_after(30):
        async with broker_in_process(home) as (broker, sock):
            earlier = await earlier_session(sock)
            async with open_bridge_client(sock, PENDING, keepalive=False) as (pending, pushes):
                old_id = pending.hello["session"]["id"]  # type: ignore[index]
                mid, _ = await offered_then_merged(broker, sock, pending, pushes)
                ledger.save(home, old_id, [], [mid], pid=gone_pid)
                await broker.ingest_ledgers()
    assert rows(home, "SELECT peer_id, acked_at IS NOT NULL FROM receipts") == [(earlier, 1)]
    assert not list((home / ledger.FOLDER).iterdir())


async def test_offers_the_store_could_not_take_at_a_disconnect_are_written_before_the_next_connection(home):
    """The connection ends while the store fails (a full disk): its offer is written before
    that record's messages are pushed to its next connection, which shows it marked."""
    with trio.fail_after(30):
        async with broker_in_process(home) as (broker, sock):
            again = {"agent": "codex", "project": "/w/absorb", "hostSessionId": "disk"}
            async with open_bridge_client(sock, again, keepalive=False) as (client, pushes):
                own = client.hello["session"]["id"]  # type: ignore[index]
                await client.request("send", to=own, text="being shown")
                message = await active_push(pushes)
                await client.request("offer", ids=[message["id"]])
                real_offer = broker.db.offer

                async def failing_offer(*args: Any, **kwargs: Any) -> Any:
                    raise OSError(28, "No space left on device")

                broker.db.offer = failing_offer  # type: ignore[method-assign]  # a fault at this one write

            async def ended() -> bool:
                return own not in broker.sessions

            await wait_for(ended, what="the connection ended")
            assert rows(home, "SELECT offered_at IS NOT NULL FROM receipts") == [(0,)], "the write failed"
            broker.db.offer = real_offer  # type: ignore[method-assign]
            async with open_bridge_client(sock, again, keepalive=False) as (client, pushes):
                pushed = await active_push(pushes)
                assert pushed["id"] == message["id"]
                assert pushed.get("repeat") is True, "offered before the disconnect, shown again unmarked"
    assert rows(home, "SELECT offered_at IS NOT NULL FROM receipts") == [(1,)]
