"""Frames over a Trio byte stream: one reader, writes serialized by one lock."""

from __future__ import annotations

import os
import select
import sys
from collections import deque
from typing import Any

import trio

from agent_bridge.ipc import protocol

RECEIVE_CHUNK = 65536
SEND_TIMEOUT = 10.0  # a peer that does not read for this long is dropped, not waited on


class FramedStream:
    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self._decoder = protocol.FrameDecoder()
        self._ready: deque[dict[str, Any]] = deque()
        self._send_lock = trio.Lock()
        self.closed = False
        # A Unix socket takes a frame without waiting almost always: written straight to its
        # descriptor, it costs no trip through the scheduler (trio's send_all yields once per
        # send even when nothing had to wait). Named pipes (Windows) always take the stream path.
        self._socket = (
            stream.socket if isinstance(stream, trio.SocketStream) and sys.platform != "win32" else None
        )
        self.last_read = trio.current_time()  # when bytes last came in (broker.connection's idle check)

    def read_lines(self, key: str) -> None:
        """Line frames as bytes (relay wire 2) are read from now on, as the JSON frames of `key`
        ("relay" or "push") that mean the same."""
        self._decoder.lines = key

    async def receive(self) -> dict[str, Any] | None:
        """The next frame, or None at end of stream. Raises ProtocolError on a bad frame."""
        while not self._ready:
            self._decoder.feed(b"")  # a bad frame that followed good ones: raised now
            try:
                data = await self._receive_some()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return None
            if not data:
                if self._decoder.pending:
                    raise protocol.ProtocolError("connection closed in the middle of a frame")
                return None
            self.last_read = trio.current_time()
            self._ready.extend(self._decoder.feed(data))
        return self._ready.popleft()

    async def _receive_some(self) -> bytes | bytearray:
        """The bytes that have arrived, waiting for some if none have.

        A Unix socket is read straight from its descriptor, as `_send_now` writes it: the same
        waits and yields as trio's `receive_some` (always a cancel point; a schedule point
        once, in the wait or, when the bytes were already there, after the read, so a client
        that keeps its socket full does not keep the other tasks from running), without the
        layers it passes through on every read (an async context manager, a conflict
        detector, error translation)."""
        if self._socket is None:
            return await self.stream.receive_some(RECEIVE_CHUNK)
        await trio.lowlevel.checkpoint_if_cancelled()
        waited = False
        while True:
            fd = self._socket.fileno()
            if fd < 0 or self.closed:
                raise trio.ClosedResourceError("the stream was closed")
            try:
                data = os.read(fd, RECEIVE_CHUNK)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(self._socket)
                waited = True
                continue
            except OSError as exc:  # ECONNRESET: the peer is gone
                raise trio.BrokenResourceError(f"peer gone: {exc}") from exc
            if not waited:
                await trio.lowlevel.cancel_shielded_checkpoint()
            return data

    def has_input(self) -> bool:
        """Whether a frame, or bytes of one, has arrived and not been taken yet (no waiting).
        A named pipe (Windows) tells only of the frames already read from it."""
        if self._ready:
            return True
        if self._socket is None or self.closed or self._socket.fileno() < 0:
            return False
        poller = select.poll()  # (not select.select: a busy broker's descriptors pass 1024)
        poller.register(self._socket.fileno(), select.POLLIN)
        return bool(poller.poll(0))

    def peek(self) -> dict[str, Any] | None:
        """The next frame if it has already arrived (no I/O), without taking it."""
        return self._ready[0] if self._ready else None

    def receive_nowait(self) -> dict[str, Any]:
        """Take the frame `peek` returned."""
        return self._ready.popleft()

    async def send(self, obj: dict[str, Any], *, timeout: float = SEND_TIMEOUT) -> None:  # noqa: ASYNC109
        """Send one frame. Raises trio.BrokenResourceError if the peer is gone or stalled."""
        await self._send_bytes(protocol.encode(obj), timeout)

    async def send_many(self, objs: list[dict[str, Any]], *, timeout: float = SEND_TIMEOUT) -> None:  # noqa: ASYNC109
        """Send frames back to back, in one write when the socket takes them."""
        if objs:
            await self._send_bytes(b"".join(protocol.encode(o) for o in objs), timeout)

    async def send_encoded(self, data: bytes, *, timeout: float = SEND_TIMEOUT) -> None:  # noqa: ASYNC109
        """Send frames already encoded (protocol.encode), back to back."""
        await self._send_bytes(data, timeout)

    async def _send_bytes(self, data: bytes, timeout: float) -> None:  # noqa: ASYNC109
        # Uncontended, the lock is taken without yielding: the frame goes on the wire in the same
        # scheduling step that produced it, so an answer leaves right after its commit
        # (broker.storage.StoreRunner relies on it) and a send costs one trip through the
        # scheduler, not two. Contended, wait in line.
        try:
            self._send_lock.acquire_nowait()
        except trio.WouldBlock:
            await self._send_lock.acquire()
        try:
            sent = self._send_now(data)
            if sent == len(data):
                return
            with trio.move_on_after(timeout) as scope:
                await self.stream.send_all(memoryview(data)[sent:])
            if scope.cancelled_caught:
                self.closed = True
                await trio.aclose_forcefully(self.stream)
                raise trio.BrokenResourceError("peer stopped reading")
        finally:
            self._send_lock.release()

    def _send_now(self, data: bytes) -> int:
        """Write what the socket takes right now, without waiting; 0 if it is not a Unix
        socket, is closed, or is full (the caller then sends the rest through trio)."""
        if self._socket is None or self.closed:
            return 0
        fd = self._socket.fileno()
        if fd < 0:
            return 0
        try:
            return os.write(fd, data)
        except BlockingIOError:
            return 0
        except OSError as exc:  # EPIPE, ECONNRESET: the peer is gone
            raise trio.BrokenResourceError(f"peer gone: {exc}") from exc

    async def aclose(self) -> None:
        self.closed = True
        await trio.aclose_forcefully(self.stream)
