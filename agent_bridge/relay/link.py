"""One connection to the broker: frames out under one lock, frames in from one thread.

Frames out are sent at once (`send`), or queued (`queue`) and sent together by the next `send`
or `flush`: the host's lines that arrived in one read go to the broker in one write. Whatever
was queued goes before what is sent after it, so the broker sees frames in the order made.

Read by a thread of its own (`receive`, which waits), or `pumped` (relay.pump): read only
when the socket is readable (`receive_ready`), and never waited on to send either: what the
socket does not take at once waits in `backlog` until it is writable (`drain`), so the one
thread that reads is never stuck sending to a broker that is stuck sending to it.
"""

from __future__ import annotations

import json
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from agent_bridge.ipc import protocol

try:  # the C module, as ipc.blocking uses it: `socket` costs the relay's start its imports
    import _socket as sockets
except ImportError:  # not CPython
    import socket as sockets  # type: ignore[no-redef]
from agent_bridge.ipc.frames import LINE_PART, LineParts, RelayFrame, encode_relay, line_frames

# The start of a host line's frame, as ipc.frames encodes a `Line` (without `more` or `seq`).
LINE_HEAD = f'{{"v":{protocol.PROTOCOL_VERSION},"relay":"line","line":'
encode_string: Callable[[str], str] = json.encoder.encode_basestring  # as protocol.encode does (C)

READ_CHUNK = 1 << 16


class Link:
    def __init__(self, sock: Any) -> None:
        self.sock = sock
        self.ended = threading.Event()  # set once it has ended and what was in flight on it is settled
        self._send_lock = threading.Lock()
        self._decoder = protocol.FrameDecoder(lines="push")  # a broker of wire 2 may send lines as bytes
        self.raw_lines = False  # the broker reads line frames as bytes: they go so (Relay.join)
        self._ready: deque[dict[str, Any]] = deque()
        self._queued: list[bytes] = []
        self.parts = LineParts()  # a broker's line that comes in parts
        self.pumped = False  # read by the pump (relay.pump) from now on, sent to without waiting
        self.backlog = bytearray()  # (pumped) bytes the socket has not taken yet
        self.stalled = 0.0  # (pumped) when the backlog last failed to shrink
        self.heard = 0.0  # (pumped) when the broker's last bytes came

    def send(self, frames: Sequence[RelayFrame]) -> None:
        data = [encode_relay(f, self.raw_lines) for f in frames]
        with self._send_lock:
            if self._queued:
                data[:0], self._queued = self._queued, []
            self._write(b"".join(data))

    def send_json(self, objs: list[dict[str, Any]]) -> None:
        data = [protocol.encode(obj) for obj in objs]
        with self._send_lock:
            if self._queued:
                data[:0], self._queued = self._queued, []
            self._write(b"".join(data))

    def queue_line(self, line: str) -> None:
        """A host's line as a `Line` frame for the next `send` or `flush`: the frame's bytes made
        here, not through its JSON object (every host line comes this way)."""
        if len(line) > LINE_PART:  # in parts
            self.queue(line_frames(line))
            return
        if self.raw_lines:  # the line's own bytes (relay wire 2)
            frame = protocol.encode_line("relay", line)
            with self._send_lock:
                self._queued.append(frame)
            return
        payload = (LINE_HEAD + encode_string(line) + "}").encode("utf-8")
        if len(payload) > protocol.MAX_FRAME:
            raise protocol.ProtocolError(
                f"frame of {len(payload)} bytes exceeds the limit of {protocol.MAX_FRAME}")
        frame = protocol.HEADER.pack(len(payload)) + payload
        with self._send_lock:
            self._queued.append(frame)

    def queue(self, frames: Sequence[RelayFrame]) -> None:
        """Frames for the next `send` or `flush`. Raises ProtocolError for one too large."""
        data = [encode_relay(f, self.raw_lines) for f in frames]
        with self._send_lock:
            self._queued.extend(data)

    def flush(self) -> None:
        with self._send_lock:
            if not self._queued:
                return
            data, self._queued = b"".join(self._queued), []
            self._write(data)

    def _write(self, data: bytes) -> None:
        """Under the send lock."""
        if not self.pumped:
            self.sock.sendall(data)
        elif self.backlog:
            self.backlog += data
        else:
            self._send_some(data)

    def _send_some(self, data: bytes | bytearray) -> None:
        try:
            sent = self.sock.send(data, sockets.MSG_DONTWAIT)
        except BlockingIOError:
            sent = 0
        if sent < len(data):
            if not self.backlog or sent:
                self.stalled = time.monotonic()
            self.backlog[:] = data[sent:]
        else:
            self.backlog.clear()

    def drain(self) -> None:
        """(Pumped) the socket is writable: as much of the backlog as it takes."""
        with self._send_lock:
            if self.backlog:
                self._send_some(self.backlog)

    def pump(self) -> None:
        """Read by the pump from now on: its frames come from `take_ready`, then `receive_ready`."""
        self.heard = time.monotonic()
        self.pumped = True

    def take_ready(self) -> list[dict[str, Any]]:
        """The frames decoded already (read with the hello's answer)."""
        ready = list(self._ready)
        self._ready.clear()
        return ready

    def receive_ready(self) -> list[dict[str, Any]] | None:
        """(Pumped) the socket is readable: the frames its bytes complete; None at end of stream."""
        try:
            data = self.sock.recv(READ_CHUNK, sockets.MSG_DONTWAIT)
        except BlockingIOError:  # woken for nothing
            return []
        if not data:
            return None
        self.heard = time.monotonic()
        return self._decoder.feed(data)

    def keep_alive(self, seconds: float) -> None:
        """`receive` raises TimeoutError after `seconds` of silence, and a send that cannot go on
        for that long fails. On a socket the kernel times them (SO_RCVTIMEO, SO_SNDTIMEO): a
        socket with a Python timeout polls before every send and every receive, two system
        calls a message; a named pipe keeps its own `settimeout`."""
        if not hasattr(self.sock, "setsockopt"):  # a named pipe (a socket here may be _socket's)
            self.sock.settimeout(seconds)
            return
        whole = int(seconds)
        timeval = struct.pack("ll", whole, int((seconds - whole) * 1e6))
        self.sock.settimeout(None)
        self.sock.setsockopt(sockets.SOL_SOCKET, sockets.SO_RCVTIMEO, timeval)
        self.sock.setsockopt(sockets.SOL_SOCKET, sockets.SO_SNDTIMEO, timeval)

    def receive(self) -> dict[str, Any] | None:
        """The next frame; None at end of stream. Raises TimeoutError after `keep_alive`'s
        seconds of silence."""
        while not self._ready:
            try:
                data = self.sock.recv(READ_CHUNK)
            except BlockingIOError:  # SO_RCVTIMEO ran out
                raise TimeoutError("the broker was silent") from None
            if not data:
                return None
            self._ready.extend(self._decoder.feed(data))
        return self._ready.popleft()

    @property
    def more_ready(self) -> bool:
        """Whether a frame is decoded and waiting: `receive` returns it without a read."""
        return bool(self._ready)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
