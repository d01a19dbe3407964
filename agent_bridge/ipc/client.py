"""The Trio client of the bridge protocol, used by the MCP server, the demo and benchmarks.

`open_bridge_client(...)` owns its nursery: a reader task that routes responses to their
requests and pushes into a channel (unbounded, see below), and a keepalive task.
"""

from __future__ import annotations

import itertools
import math
import socket as stdsocket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from agent_bridge.ipc import peercred, protocol
from agent_bridge.ipc.protocol import RemoteError
from agent_bridge.ipc.stream import FramedStream

KEEPALIVE_INTERVAL = 15.0  # the broker drops a connection silent for 45 s


class BrokerGone(ConnectionError):
    """The connection to the broker closed (or could not be opened).

    `maybe_processed`: the request had been sent, so the broker may have carried it out.
    """

    def __init__(self, message: str, *, maybe_processed: bool = False) -> None:
        super().__init__(message)
        self.maybe_processed = maybe_processed


class _Pending:
    __slots__ = ("event", "frame")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.frame: dict[str, Any] | None = None


class BridgeClient:
    def __init__(self, conn: FramedStream, pushes: trio.MemorySendChannel[dict[str, Any]]) -> None:
        self.conn = conn
        self._pushes = pushes
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._posted: set[int] = set()  # requests whose answers nobody waits for
        self.closed = trio.Event()
        self.hello: dict[str, Any] | None = None

    async def request(self, op: str, **args: Any) -> Any:
        if self.closed.is_set():
            raise BrokerGone("not connected to the broker")
        request_id = next(self._ids)
        pending = self._pending[request_id] = _Pending()
        try:
            try:
                await self.conn.send(protocol.request(request_id, op, **args))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                raise BrokerGone("the broker connection closed") from None
            await pending.event.wait()
        finally:
            self._pending.pop(request_id, None)
        frame = pending.frame
        if frame is None:
            raise BrokerGone("the broker connection closed before it answered", maybe_processed=True)
        if frame.get("ok"):
            return frame.get("result")
        err = frame.get("error") or {}
        raise RemoteError(str(err.get("code")), str(err.get("message")))

    async def post(self, op: str, **args: Any) -> None:
        """Send a request without waiting for its answer, which is dropped. Returns once the
        frame is in the socket: the broker reads it even if this process dies right after."""
        if self.closed.is_set():
            raise BrokerGone("not connected to the broker")
        request_id = next(self._ids)
        self._posted.add(request_id)
        try:
            await self.conn.send(protocol.request(request_id, op, **args))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._posted.discard(request_id)
            raise BrokerGone("the broker connection closed") from None

    async def _read(self) -> None:
        try:
            while True:
                try:
                    frame = await self.conn.receive()
                except protocol.ProtocolError:
                    return
                if frame is None:
                    return
                if "push" in frame:
                    self._pushes.send_nowait(frame)  # unbounded (see open_bridge_client): never waits
                    continue
                if frame.get("id") in self._posted:
                    self._posted.discard(frame["id"])  # type: ignore[arg-type]
                    continue
                pending = self._pending.get(frame.get("id"))  # type: ignore[arg-type]
                if pending is not None:
                    pending.frame = frame
                    pending.event.set()
                elif frame.get("ok") is False:
                    return  # an error with no request id: the broker is closing this connection
        finally:
            self.closed.set()
            for pending in self._pending.values():
                pending.event.set()
            await self._pushes.aclose()

    async def _keepalive(self) -> None:
        while True:
            await trio.sleep(KEEPALIVE_INTERVAL)
            try:
                await self.request("ping")
            except (BrokerGone, RemoteError):
                return


async def connect_unix(path: str) -> trio.SocketStream:
    """Connect, and make sure this user's broker is at the other end before anything is sent."""
    try:
        stream = await trio.open_unix_socket(path)
    except OSError as exc:
        raise BrokerGone(f"cannot connect to {path}: {exc}") from None
    try:
        peercred.check_server(stream.socket, path)
    except OSError as exc:  # NotOurBroker, or the check itself failed
        await trio.aclose_forcefully(stream)
        raise BrokerGone(str(exc)) from None
    return stream


async def connect(address: str) -> trio.abc.Stream:
    """The broker's Unix socket, or on Windows its named pipe (`address` from broker.json)."""
    if sys.platform == "win32":
        from agent_bridge.ipc.pipe import connect_pipe

        try:
            return await connect_pipe(address)
        except (OSError, trio.TooSlowError) as exc:
            raise BrokerGone(f"cannot connect to {address}: {exc}") from None
    return await connect_unix(address)


@asynccontextmanager
async def open_bridge_client(
    socket_path: str,
    hello: dict[str, Any] | None = None,
    *,
    keepalive: bool = True,
    connector: Callable[[str], Awaitable[trio.abc.Stream]] = connect,
) -> AsyncIterator[tuple[BridgeClient, trio.MemoryReceiveChannel[dict[str, Any]]]]:
    """Connect, say hello (when given), and yield (client, pushes). Closing the block closes
    the connection; a closed connection ends the pushes channel. `connector`: how to reach
    `socket_path` (tests pass a fake pipe)."""
    stream = await connector(socket_path)
    sock = getattr(stream, "socket", None)
    if isinstance(sock, trio.socket.SocketType):
        try:
            sock.setsockopt(stdsocket.SOL_SOCKET, stdsocket.SO_SNDBUF, 1 << 20)
        except OSError:
            pass
    # Unbounded: the one reader also carries the answers, and a consumer that awaits a request
    # (an ack) while handling a push must get that answer even when a burst of pushes is ahead
    # of it. A bounded channel made that a deadlock. What waits here is what the broker pushed
    # and the session has not acknowledged: the MCP server's inbox holds the same anyway.
    send, receive = trio.open_memory_channel[dict[str, Any]](math.inf)
    client = BridgeClient(FramedStream(stream), send)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client._read)
            try:
                if hello is not None:
                    client.hello = await client.request("hello", **hello)
                if keepalive:
                    nursery.start_soon(client._keepalive)
                yield client, receive
            finally:
                # Close before cancelling: a checkpoint after the cancel would replace the
                # block's exception (say BrokerGone during hello) with a Cancelled the nursery
                # then swallows ("generator didn't yield").
                await client.conn.aclose()
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # The nursery's own tasks never raise: a group holds the block's one exception.
        # Raise it as itself, so callers can catch BrokerGone and RemoteError.
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
