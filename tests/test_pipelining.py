"""A client may send requests without waiting for answers (ipc/protocol.py: answers carry
the request's id and come in request order). Sends that arrive together are committed
together; every request still gets its own answer, in order, and a bad one fails alone.
Deliveries keep commit order whether they come from the database or straight from the send
that wrote them."""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

import pytest
import trio

from agent_bridge.ipc.client import open_bridge_client
from tests.reliability.harness import rows

pytestmark = pytest.mark.slow


def frame(obj: dict[str, Any]) -> bytes:
    """The framing written out by hand from its description: 4-byte big-endian length, then UTF-8 JSON."""
    payload = json.dumps(obj).encode()
    return struct.pack(">I", len(payload)) + payload


def read_frames(sock: socket.socket, count: int) -> list[dict[str, Any]]:
    buf, frames = b"", []
    while len(frames) < count:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {len(frames)} of {count} frames"
        buf += chunk
        while len(buf) >= 4 and len(buf) >= 4 + struct.unpack(">I", buf[:4])[0]:
            n = struct.unpack(">I", buf[:4])[0]
            frames.append(json.loads(buf[4 : 4 + n]))
            buf = buf[4 + n :]
    return frames


class Pushes:
    """What a connected session was pushed, in order; acknowledges as it goes."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.changed = trio.Event()

    async def collect(self, client, pushes) -> None:
        async for push in pushes:
            if push.get("push") == "message":
                self.messages.append(push["message"])
                await client.request("ack", ids=[push["message"]["id"]])
                self.changed.set()
                self.changed = trio.Event()

    async def until(self, count: int) -> None:
        with trio.fail_after(60):
            while len(self.messages) < count:
                await self.changed.wait()


def hello(name: str, project: str = "/w/pipe") -> dict[str, Any]:
    return {"agent": "codex", "project": project, "name": name, "hostSessionId": name}


async def test_pipelined_requests_are_answered_one_by_one_in_order(broker, home):
    sock_path = broker.status()["socket"]
    async with (
        open_bridge_client(sock_path, hello("pipe-rx")) as (rx, rx_pushes),
        trio.open_nursery() as nursery,
    ):
        received = Pushes()
        nursery.start_soon(received.collect, rx, rx_pushes)
        requests = [
            {"v": 1, "id": 1, "op": "hello", "agent": "codex", "project": "/w/pipe", "name": "pipe-tx"},
            {"v": 1, "id": 2, "op": "send", "to": "pipe-rx", "text": "one"},
            {"v": 1, "id": 3, "op": "send", "to": "nobody-here", "text": "lost"},
            {"v": 1, "id": 4, "op": "send", "to": "pipe-rx", "text": "two", "extra": 1},
            {"v": 1, "id": 5, "op": "whoami"},
            {"v": 1, "id": 6, "op": "send", "to": "pipe-rx", "text": "three"},
            {"v": 1, "id": 7, "op": "send", "to": "pipe-rx", "text": "   "},
            {"v": 1, "id": 8, "op": "send", "to": "pipe-rx", "text": "four"},
            {"v": 1, "id": 9, "op": "send", "to": "pipe-rx", "text": "five", "reply_to": "no-such-message"},
        ]

        def exchange() -> list[dict[str, Any]]:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(30)
                s.connect(sock_path)
                s.sendall(b"".join(frame(r) for r in requests))  # all at once: nothing waits for an answer
                return [f for f in read_frames(s, len(requests)) if "push" not in f]

        answers = await trio.to_thread.run_sync(exchange)
        assert [a["id"] for a in answers] == list(range(1, 10))
        by_id = {a["id"]: a for a in answers}
        assert [i for i in by_id if by_id[i]["ok"]] == [1, 2, 5, 6, 8]
        assert "no session is addressed by 'nobody-here'" in by_id[3]["error"]["message"]
        assert "unknown argument 'extra'" in by_id[4]["error"]["message"]
        assert "text" in by_id[7]["error"]["message"]
        assert "reply_to: no message with id 'no-such-message'" in by_id[9]["error"]["message"]
        assert by_id[5]["result"]["name"] == "pipe-tx"
        sent = [by_id[i]["result"]["message"] for i in (2, 6, 8)]
        assert [m["text"] for m in sent] == ["one", "three", "four"]
        assert all(m["from"]["name"] == "pipe-tx" and m["to"]["name"] == "pipe-rx" for m in sent)

        await received.until(3)
        assert [m["id"] for m in received.messages] == [m["id"] for m in sent]
        assert received.messages == sent  # pushed exactly as the sender was answered
        # only the good ones were stored, in request order
        stored = rows(
            home, "SELECT m.body FROM messages m JOIN receipts r ON r.message_id = m.id ORDER BY r.rowid"
        )
        assert [b for b, in stored] == ["one", "three", "four"]
        nursery.cancel_scope.cancel()


async def test_concurrent_pipelined_senders_and_decisions_arrive_in_commit_order(broker, home):
    """Two senders with 32 sends in flight each, and decisions recorded meanwhile: the
    receiver is pushed every committed message once, in commit (receipt) order."""
    sock_path = broker.status()["socket"]
    per_sender, window = 300, 32
    async with (
        open_bridge_client(sock_path, hello("order-rx")) as (rx, rx_pushes),
        open_bridge_client(sock_path, hello("order-tx1")) as (tx1, _),
        open_bridge_client(sock_path, hello("order-tx2")) as (tx2, _),
        open_bridge_client(sock_path, hello("order-owner")) as (owner, _),
        trio.open_nursery() as nursery,
    ):
        received = Pushes()
        nursery.start_soon(received.collect, rx, rx_pushes)
        answered: dict[str, list[str]] = {"order-tx1": [], "order-tx2": []}

        async def sender(client, name: str) -> None:
            slots = trio.Semaphore(window)
            results: dict[int, str] = {}

            async def one(i: int) -> None:
                try:
                    results[i] = (await client.request("send", to="order-rx", text=f"{name}-{i}"))["message"][
                        "id"
                    ]
                finally:
                    slots.release()

            async with trio.open_nursery() as inner:
                for i in range(per_sender):
                    await slots.acquire()
                    inner.start_soon(one, i)
            answered[name] = [results[i] for i in range(per_sender)]

        async def decider() -> None:
            for i in range(10):
                await owner.request("decide", topic=f"t{i}", text=f"choice {i}", scope="all")

        async with trio.open_nursery() as load:
            load.start_soon(sender, tx1, "order-tx1")
            load.start_soon(sender, tx2, "order-tx2")
            load.start_soon(decider)

        committed = rows(
            home,
            "SELECT m.id, m.body FROM receipts r JOIN messages m ON m.id = r.message_id "
            "JOIN peers p ON p.id = r.peer_id WHERE p.name = 'order-rx' ORDER BY r.rowid",
        )
        assert len(committed) == 2 * per_sender + 10
        await received.until(len(committed))
        got = [m["id"] for m in received.messages]
        assert got == [mid for mid, _ in committed], "pushed out of commit order, twice, or not at all"
        for name, ids in answered.items():
            mine = [m for m in received.messages if m["from"]["name"] == name]
            assert sorted(m["id"] for m in mine) == sorted(ids)  # every answered send arrived
            assert sorted(m["text"] for m in mine) == sorted(f"{name}-{i}" for i in range(per_sender))
        assert sum(m["kind"] == "decision" for m in received.messages) == 10
        nursery.cancel_scope.cancel()


async def test_a_backlog_bigger_than_any_batch_reaches_a_consumer_that_acks_as_it_reads(broker, home):
    """The MCP server acknowledges inside its push loop. A session that comes back to 1,000
    waiting messages gets them in bursts; each ack's answer is behind many pushes and must
    still reach it (a bounded push buffer in the client deadlocked here)."""
    sock_path = broker.status()["socket"]
    async with open_bridge_client(sock_path, hello("backlog-rx")):
        pass  # known to the broker, now offline
    async with open_bridge_client(sock_path, hello("backlog-tx")) as (tx, _):
        for i in range(0, 1000, 50):
            async with trio.open_nursery() as burst:
                for j in range(i, i + 50):
                    burst.start_soon(lambda j=j: tx.request("send", to="backlog-rx", text=f"m{j}"))
    async with (
        open_bridge_client(sock_path, hello("backlog-rx")) as (rx, pushes),
        trio.open_nursery() as nursery,
    ):
        received = Pushes()
        nursery.start_soon(received.collect, rx, pushes)
        await received.until(1000)
        committed = rows(
            home,
            "SELECT m.id FROM receipts r JOIN messages m ON m.id = r.message_id "
            "JOIN peers p ON p.id = r.peer_id WHERE p.name = 'backlog-rx' ORDER BY r.rowid",
        )
        assert [m["id"] for m in received.messages] == [mid for mid, in committed]
        nursery.cancel_scope.cancel()
