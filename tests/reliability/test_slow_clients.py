"""SPEC §8: nothing a client sends (or fails to read) can hold up the broker or another
session's delivery. Clients that send half a frame and stall, that never say anything, and a
session that never reads its pushes, against a real broker while other sessions work.

No timed assertions: "not delayed" is shown causally, by the other sessions finishing their
work while the stalled clients are still connected and still stalled."""

from __future__ import annotations

import json
import socket as stdsocket
import struct

import pytest
import trio

from agent_bridge.ipc import blocking, protocol
from agent_bridge.ipc.client import open_bridge_client
from tests.conftest import wait_for

pytestmark = pytest.mark.slow

HELLO_TIMEOUT_BOUND = 60  # generous: the broker drops a connection that never says hello after 10 s


def frame(obj: dict) -> bytes:
    payload = json.dumps(obj).encode()
    return struct.pack(">I", len(payload)) + payload


def hello(name: str, **extra) -> dict:
    return {"agent": "codex", "project": "/w/slow", "name": name, "hostSessionId": name, **extra}


def raw_connect(path: str, first: bytes = b"", *, rcvbuf: int | None = None) -> stdsocket.socket:
    """A plain socket (a local connect and a short first write never block for long)."""
    sock = stdsocket.socket(stdsocket.AF_UNIX, stdsocket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(stdsocket.SOL_SOCKET, stdsocket.SO_RCVBUF, rcvbuf)
    sock.settimeout(10)
    sock.connect(path)
    if first:
        sock.sendall(first)
    sock.setblocking(False)  # from here on only looked at, never waited on
    return sock


def closed_by_peer(sock: stdsocket.socket) -> bool:
    """The broker closed its end (EOF or reset), reading past whatever it had sent."""
    while True:
        try:
            data = sock.recv(65536, stdsocket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        except ConnectionResetError:
            return True
        if not data:
            return True


async def exchange(sock_path: str, rounds: int) -> list[str]:
    """Two sessions exchange `rounds` messages, each pushed, shown and acknowledged."""
    got: list[str] = []
    async with open_bridge_client(sock_path, hello("busy-a")) as (a, _), \
            open_bridge_client(sock_path, hello("busy-b")) as (b, pushes):
        for i in range(rounds):
            await a.request("send", to="busy-b", text=f"m{i}")
            async for push in pushes:
                if push.get("push") == "message":
                    got.append(push["message"]["text"])
                    await b.request("ack", ids=[push["message"]["id"]])
                    break
    return got


async def test_half_frames_and_silent_clients_do_not_delay_others(broker):
    sock_path = broker.status()["socket"]
    with trio.fail_after(120):
        silent = [raw_connect(sock_path) for _ in range(20)]  # connect, say nothing
        # a length prefix and part of the payload, then nothing
        halves = [
            raw_connect(sock_path, struct.pack(">I", 1000) + b'{"v":1,"id":1,"op":"pi') for _ in range(20)
        ]
        # the largest frame allowed, announced, a little of it sent
        big = raw_connect(sock_path, struct.pack(">I", protocol.MAX_FRAME) + b"{" * 4096)
        # sessions that start a request and stall in the middle of it
        sessions = [
            raw_connect(
                sock_path,
                frame({"v": 1, "id": 1, "op": "hello", **hello(f"stall-{i}")})
                + struct.pack(">I", 500)
                + b"{",
            )
            for i in range(5)
        ]

        assert await exchange(sock_path, 50) == [f"m{i}" for i in range(50)]
        stalled = [*silent, *halves, big, *sessions]
        closed = [i for i, s in enumerate(stalled) if closed_by_peer(s)]
        assert closed == [], f"finished only after the broker gave up on stallers {closed}"

        # ... and the broker does give up on the ones that never finished their first frame
        async def dropped():
            return all(closed_by_peer(s) for s in [*silent, *halves, big])

        await wait_for(dropped, timeout=HELLO_TIMEOUT_BOUND, interval=0.2, what="stalled connections dropped")
        assert broker.status()["pid"] == broker.pid
        for s in stalled:
            s.close()


async def test_a_session_that_never_reads_delays_no_one(broker, home):
    """A session whose socket is full: the broker's pushes to it block. Requests that push to
    it (a hook pairing its identity, a Stop hook acknowledging its messages) and everybody
    else's hellos and deliveries go on; the broker then drops it."""
    sock_path = broker.status()["socket"]
    host = {"pid": 4_000_000, "start": 123456789, "exe": "claude"}
    with trio.fail_after(120):
        stalled = raw_connect(
            sock_path,
            frame(
                {
                    "v": 1,
                    "id": 1,
                    "op": "hello",
                    "agent": "claude",
                    "project": "/w/slow",
                    "name": "never-reads",
                    "host": host,
                }
            ),
            rcvbuf=4096,
        )
        async with open_bridge_client(sock_path, hello("writer")) as (a, _):

            async def connected_names():
                return {p["name"] for p in await a.request("peers", project="/w/slow") if p["connected"]}

            await wait_for(_has(connected_names, "never-reads"), what="the stalled session connected")
            for i in range(40):  # ~640 KB: far more than the socket buffers hold
                await a.request("send", to="never-reads", text=f"{i:04d}" + "x" * 15_996)

            # A hook pairs the stalled session with its host session: the broker pushes the
            # new identity to it, which cannot be written now.
            identified = await trio.to_thread.run_sync(
                lambda: blocking.call(
                    home,
                    "identify",
                    timeout=60,
                    hostSessionId="stalled-host",
                    agent="claude",
                    host=host,
                    chain=[],
                    cwd="/w/slow",
                    source="startup",
                    event="SessionStart",
                )
            )
            assert identified["paired"] is True
            # another session connects and works meanwhile
            async with open_bridge_client(sock_path, hello("newcomer")) as (c, c_pushes):
                await a.request("send", to="newcomer", text="hello newcomer")
                async for push in c_pushes:
                    if push.get("push") == "message":
                        assert push["message"]["text"] == "hello newcomer"
                        break
                # the Stop hook of the stalled session: its active messages, acknowledged
                stop = await trio.to_thread.run_sync(
                    lambda: blocking.call(
                        home,
                        "stop_check",
                        timeout=60,
                        hostSessionId="stalled-host",
                        agent="claude",
                        host=host,
                        chain=[],
                        cwd="/w/slow",
                        event="Stop",
                    )
                )
                assert len(stop["messages"]) == 40
                assert "never-reads" in await connected_names(), (
                    "the others waited for the stalled session to be dropped"
                )
                assert not closed_by_peer_quiet(stalled)

            # the broker gives up on the session that does not read
            async def gone():
                return "never-reads" not in await connected_names()

            await wait_for(gone, timeout=60, interval=0.2, what="the non-reading session dropped")
        stalled.close()
    assert broker.status()["pid"] == broker.pid


def closed_by_peer_quiet(sock: stdsocket.socket) -> bool:
    """Without draining what the broker did send: is the socket already at EOF? (Its queue
    is full, so this only tells a reset apart.)"""
    try:
        sock.recv(1, stdsocket.MSG_DONTWAIT | stdsocket.MSG_PEEK)
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    return False


def _has(fn, name):
    async def inner():
        return name in await fn()

    return inner
