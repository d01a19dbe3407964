"""One connection to the broker: frames out under one lock, frames in from one thread.

Frames out are sent at once (`send`), or queued (`queue`) and sent together by the next `send`
or `flush`: the host's lines that arrived in one read go to the broker in one write. Whatever
was queued goes before what is sent after it, so the broker sees frames in the order made.
"""

from __future__ import annotations

import struct
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

from agent_bridge.ipc import protocol

try:  # the C module, as ipc.blocking uses it: `socket` costs the relay's start its imports
    import _socket as sockets
except ImportError:  # not CPython
    import socket as sockets  # type: ignore[no-redef]
from agent_bridge.ipc.frames import LineParts, RelayFrame, relay_frame

READ_CHUNK = 1 << 16


class Link:
    def __init__(self, sock: Any) -> None:
        self.sock = sock
        self.alive = True
        self._send_lock = threading.Lock()
        self._decoder = protocol.FrameDecoder()
        self._ready: deque[dict[str, Any]] = deque()
        self._queued: list[bytes] = []
        self.parts = LineParts()  # a broker's line that comes in parts

    def send(self, frames: Sequence[RelayFrame]) -> None:
        self.send_json([relay_frame(f) for f in frames])

    def send_json(self, objs: list[dict[str, Any]]) -> None:
        data = [protocol.encode(obj) for obj in objs]
        with self._send_lock:
            if self._queued:
                data[:0], self._queued = self._queued, []
            self.sock.sendall(b"".join(data))

    def queue(self, frames: Sequence[RelayFrame]) -> None:
        """Frames for the next `send` or `flush`. Raises ProtocolError for one too large."""
        data = [protocol.encode(relay_frame(f)) for f in frames]
        with self._send_lock:
            self._queued.extend(data)

    def flush(self) -> None:
        with self._send_lock:
            if not self._queued:
                return
            data, self._queued = b"".join(self._queued), []
            self.sock.sendall(data)

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
