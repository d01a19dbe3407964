"""The Windows named-pipe transport (agent_bridge/ipc/pipe.py), as far as it can be checked on
Linux: the pipe's name, its flags and its security descriptor, the listener interface, the
platform choice in the broker and both clients, and the broker's protocol through the pipe
listener's accept loop over a FAKE pipe (Trio memory streams, or a socketpair for the blocking
client, standing in for pipe instances).

What is NOT tested anywhere (no Windows machine here): every Win32 call in pipe.py
(CreateNamedPipeW, ConnectNamedPipe, the SID and DACL, overlapped reads and writes through
Trio's IOCP, CreateFileW on the client side)."""

from __future__ import annotations

import inspect
import json
import os
import re
import socket
import sys
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing

from agent_bridge.broker import root
from agent_bridge.broker.routing import handle_connection
from agent_bridge.broker.state import Broker
from agent_bridge.broker.storage import serve_store
from agent_bridge.common import paths
from agent_bridge.common.config import Settings
from agent_bridge.ipc import blocking, client, pipe
from agent_bridge.ipc.client import open_bridge_client
from agent_bridge.ipc.listener import serve_unix
from agent_bridge.ipc.protocol import RemoteError

PIPE = r"\\.\pipe\agent-bridge-alice-0123456789ab"


# --- the name, the flags, the security descriptor ---------------------------------------------


def test_pipe_name_is_per_user_and_per_home(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setenv("USERNAME", "alice")
    name = paths.socket_path(tmp_path / "one")
    assert re.fullmatch(r"\\\\\.\\pipe\\agent-bridge-alice-[0-9a-f]{12}", name), name
    assert paths.socket_path(tmp_path / "one") == name  # stable: clients find it again
    assert paths.socket_path(tmp_path / "two") != name  # another home, another pipe
    monkeypatch.setenv("USERNAME", "bob")
    assert paths.socket_path(tmp_path / "one") != name  # another user, another pipe
    assert pipe.is_pipe_name(name)
    assert not pipe.is_pipe_name("/tmp/broker.sock") and not pipe.is_pipe_name(r"\\.\pipe\a\b")


def test_pipe_flags_reject_remote_clients_and_squatters():
    # values from the Windows SDK headers (winbase.h, fileapi.h), not from the code under test
    assert pipe.pipe_mode() & 0x00000008  # PIPE_REJECT_REMOTE_CLIENTS
    assert pipe.pipe_mode() & 0x00000006 == 0  # byte stream, byte reads (no message mode)
    first = pipe.pipe_open_mode(first=True)
    later = pipe.pipe_open_mode(first=False)
    assert first & 0x00000003 == 0x3 and later & 0x3 == 0x3  # PIPE_ACCESS_DUPLEX
    assert first & 0x40000000 and later & 0x40000000  # FILE_FLAG_OVERLAPPED
    assert first & 0x00080000 and not later & 0x00080000  # FILE_FLAG_FIRST_PIPE_INSTANCE, first only
    assert pipe.client_flags() & 0x00100000 and pipe.client_flags() & 0x00010000  # SQOS: identification only


def test_security_descriptor_allows_only_the_user():
    sid = "S-1-5-21-1004336348-1177238915-682003330-1001"
    assert pipe.security_sddl(sid) == f"D:P(D;;GA;;;NU)(A;;GA;;;{sid})"
    for bad in ("", "WD", "S-1-1-0)(A;;GA;;;WD", "alice"):
        with pytest.raises(ValueError):
            pipe.security_sddl(bad)


def test_serve_pipe_has_the_listener_interface_of_serve_unix():
    unix, named = inspect.signature(serve_unix), inspect.signature(pipe.serve_pipe)
    assert [p.kind for p in unix.parameters.values()] == [p.kind for p in named.parameters.values()]
    assert (
        list(named.parameters)[1:] == list(unix.parameters)[1:] == ["handler", "state_folder", "task_status"]
    )
    assert named.parameters["task_status"].default is trio.TASK_STATUS_IGNORED


async def test_serve_pipe_refuses_clearly_off_windows():
    if sys.platform == "win32":
        pytest.skip("this checks the refusal on other platforms")
    async def nothing(stream: trio.abc.Stream) -> None:
        raise AssertionError("never called")

    with pytest.raises(OSError, match="Windows"):
        await pipe.serve_pipe(PIPE, nothing)
    with pytest.raises(ValueError, match="not a named pipe"):
        await pipe.serve_pipe("/tmp/x.sock", nothing)


def test_the_broker_chooses_the_pipe_on_windows():
    assert root.ipc_listener("win32") is pipe.serve_pipe
    assert root.ipc_listener("linux") is serve_unix
    assert root.ipc_listener("darwin") is serve_unix


# --- the protocol through the pipe listener's accept loop, over a fake pipe ---------------------


class FakePipe:
    """Stands in for the named pipe: each client `connect` makes a pair of memory streams and
    hands the server end to the listener's `accept`, as ConnectNamedPipe would."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._send, self._receive = trio.open_memory_channel[trio.abc.Stream](16)
        self.accepted = 0

    async def connect(self, name: str) -> trio.abc.Stream:
        if name != self.name:
            raise FileNotFoundError(name)
        client_end, server_end = trio.testing.memory_stream_pair()
        await self._send.send(server_end)
        return client_end

    async def accept(self) -> trio.abc.Stream:
        stream = await self._receive.receive()
        self.accepted += 1
        return stream


async def start_broker_on_fake_pipe(nursery: trio.Nursery, home: Path, fake: FakePipe,
                                    handler: Any = None) -> Broker:
    paths.ensure_home(home)
    store = await nursery.start(partial(serve_store, paths.db_path(home), lambda line: None))
    broker = Broker(store, Settings(), home, trio.Event())
    broker.socket_path = fake.name
    nursery.start_soon(
        pipe.serve_connections, nursery, fake.accept, handler or partial(handle_connection, broker)
    )
    return broker


def hello(name: str) -> dict[str, Any]:
    return {"agent": "codex", "project": "/w/pipe", "name": name, "hostSessionId": f"pipe-{name}"}


async def next_message(pushes) -> dict[str, Any]:
    async for push in pushes:
        if push.get("push") == "message":
            return push["message"]
    raise AssertionError("the pushes ended")


async def test_the_protocol_over_a_fake_pipe(tmp_path):
    fake = FakePipe(PIPE)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await start_broker_on_fake_pipe(nursery, tmp_path / "home", fake)
            connect = fake.connect
            async with open_bridge_client(PIPE, hello("a"), connector=connect) as (a, _), \
                    open_bridge_client(PIPE, hello("b"), connector=connect) as (b, b_pushes):
                assert a.hello["session"]["name"] == "a"
                sent = (await a.request("send", to="b", text="over the pipe"))["message"]
                got = await next_message(b_pushes)
                assert (got["id"], got["text"]) == (sent["id"], "over the pipe")
                assert await b.request("ack", ids=[got["id"]]) == {"acked": 1}
                decided = await a.request("decide", topic="transport", text="named pipe", scope="all")
                assert decided["deliveredTo"] == ["a", "b"]
                assert (await next_message(b_pushes))["decision"]["topic"] == "transport"
                with pytest.raises(RemoteError, match="topic"):
                    await a.request("decide", topic=" ", text="x")

                # a client that sends garbage gets a protocol error; the listener goes on
                raw = await connect(PIPE)
                await raw.send_all(b"\x00\x00\x00\x05nope!")
                answer = b""
                while chunk := await raw.receive_some(65536):
                    answer += chunk
                assert b'"code":"protocol"' in answer
                async with open_bridge_client(PIPE, hello("c"), connector=connect) as (c, _):
                    assert (await c.request("whoami"))["name"] == "c"
                assert fake.accepted == 4
            nursery.cancel_scope.cancel()


async def test_a_failing_handler_does_not_stop_the_fake_pipe_listener(tmp_path, caplog):
    fake = FakePipe(PIPE)
    served: list[bytes] = []

    async def handler(stream: trio.abc.Stream) -> None:
        data = await stream.receive_some(100)
        if data == b"boom":
            raise RuntimeError("a handler bug")
        served.append(data)
        await stream.send_all(b"ok")

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pipe.serve_connections, nursery, fake.accept, handler)
            bad = await fake.connect(PIPE)
            await bad.send_all(b"boom")
            assert await bad.receive_some(10) == b""  # its stream was closed after the failure
            good = await fake.connect(PIPE)
            await good.send_all(b"hello")
            assert await good.receive_some(10) == b"ok"
            nursery.cancel_scope.cancel()
    assert served == [b"hello"]
    assert any("connection handler failed" in r.getMessage() for r in caplog.records)


async def test_the_mcp_client_connects_through_a_fake_pipe_on_windows(tmp_path, monkeypatch):
    """`open_bridge_client` with its default connector picks `pipe.connect_pipe` on win32."""
    fake = FakePipe(PIPE)
    monkeypatch.setattr(client, "sys", SimpleNamespace(platform="win32"))
    monkeypatch.setattr(pipe, "connect_pipe", fake.connect)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await start_broker_on_fake_pipe(nursery, tmp_path / "home", fake)
            async with open_bridge_client(PIPE, hello("mcp")) as (c, _):
                assert (await c.request("whoami"))["name"] == "mcp"
            with pytest.raises(client.BrokerGone, match="cannot connect"):
                async with open_bridge_client(r"\\.\pipe\agent-bridge-nobody-000000000000", hello("x")):
                    pass
            nursery.cancel_scope.cancel()


class FakeBlockingPipe:
    """pipe.BlockingPipe's interface over one end of a socketpair; the other end goes to the
    broker's accept loop. Made in a worker thread (the blocking client runs in one here)."""

    to_broker: trio.MemorySendChannel[socket.socket]

    def __init__(self, name: str, timeout: float) -> None:
        if name != PIPE:
            raise FileNotFoundError(name)
        mine, theirs = socket.socketpair()
        trio.from_thread.run(self.to_broker.send, theirs)
        self._sock = mine
        self._sock.settimeout(timeout)

    def settimeout(self, timeout: float) -> None:
        self._sock.settimeout(timeout)

    def sendall(self, data: bytes) -> None:
        self._sock.sendall(data)

    def recv(self, size: int) -> bytes:
        return self._sock.recv(size)

    def close(self) -> None:  # the blocking client closes what it opened, as BlockingPipe.close does
        self._sock.close()

    def __enter__(self) -> FakeBlockingPipe:
        return self

    def __exit__(self, *exc: object) -> None:
        self._sock.close()


async def test_the_hooks_blocking_client_uses_a_fake_pipe_on_windows(tmp_path, monkeypatch):
    home = tmp_path / "home"
    fake = FakePipe(PIPE)
    monkeypatch.setattr(blocking, "sys", SimpleNamespace(platform="win32"))
    monkeypatch.setattr(pipe, "BlockingPipe", FakeBlockingPipe)
    FakeBlockingPipe.to_broker, broker_ends = trio.open_memory_channel[socket.socket](4)

    async def accept() -> trio.abc.Stream:  # the broker's end of each socketpair
        return trio.SocketStream(trio.socket.from_stdlib_socket(await broker_ends.receive()))

    fake.accept = accept  # type: ignore[method-assign]
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await start_broker_on_fake_pipe(nursery, home, fake)
            paths.write_private(home / paths.BROKER_JSON, json.dumps({"pid": os.getpid(), "socket": PIPE}))
            assert await trio.to_thread.run_sync(partial(blocking.call, home, "ping", timeout=10)) == "pong"
            answer = await trio.to_thread.run_sync(partial(
                blocking.call, home, "identify", timeout=10, hostSessionId="hook-session", agent="claude"))
            assert answer == {"session": None, "paired": False}
            nursery.cancel_scope.cancel()


# --- the client's check of the server (issue 23): Win32 itself cannot run here ------------------


class MockWin32:
    """A MOCK of pipe._Win32, the ctypes layer that exists only on Windows: CreateFileW hands out
    a handle, and the server's and this process's SIDs are what the test says. What runs for
    real is pipe._open_client and pipe.check_server around it."""

    INVALID_HANDLE_VALUE = -1

    def __init__(self, server: str, me: str) -> None:
        self.server, self.me = server, me
        self.closed: list[int] = []

        class Kernel32:
            @staticmethod
            def CreateFileW(*args: Any) -> int:  # noqa: N802 - the Win32 name
                return 7

        self.kernel32 = Kernel32()

    def server_sid(self, handle: int) -> str:
        return self.server

    def user_sid(self) -> str:
        return self.me

    def close(self, handle: int) -> None:
        self.closed.append(handle)


def test_a_pipe_client_refuses_a_server_of_another_account_before_sending():
    from agent_bridge.ipc.peercred import NotOurBroker

    me = "S-1-5-21-1-2-3-1001"
    ours = MockWin32(server=me, me=me)
    assert pipe._open_client(ours, PIPE, pipe.client_flags()) == 7 and ours.closed == []
    squatter = MockWin32(server="S-1-5-21-1-2-3-1002", me=me)
    with pytest.raises(NotOurBroker, match="S-1-5-21-1-2-3-1002"):
        pipe._open_client(squatter, PIPE, pipe.client_flags())
    assert squatter.closed == [7]  # closed, nothing written to it
