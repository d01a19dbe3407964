"""What the broker writes to one relay: the frames made in one turn of the scheduler, in one write.

A host's parallel tool calls are served each in its own task (broker.mcp.fast), or, for the
sends among them, together from a queue (broker.mcp.sends): their answers are made in the same
turn, one after the other. Each written on its own cost a write per answer, and each write wakes
the relay, which wakes the host: measured through two relays with 16 sends in flight, the
sending relay got one write per message (strace of the broker: 2,000 writes of one answer each
for 2,000 messages). Here the first frame of a turn waits one turn of the scheduler (more while
more frames keep coming, GATHER_TURNS at most) for the frames the other tasks make, then all of
them go in one write, in the order they were made. Frames already gathered by the task that made
them (a batch of sends' answers, broker.mcp.sends) do not wait: the turns after a commit run the
delivery work it started, and an answer held for them came back to its host later (measured with
16 sends in flight through two relays: 0.44 ms of the 1.6 ms a `send` spent in the broker, the
sender's next calls waiting on it; docs/performance.md, stop 63).

The write itself is shielded (SEND_TIMEOUT still bounds it: a relay that stops reading is
dropped): frames handed here by other tasks go with it, whoever is cancelled. A frame handed
here is on its way to the relay as far as the caller knows; if the connection breaks before it
is written, the relay never reports it written, so nothing it shows is acknowledged.
"""

from __future__ import annotations

from typing import Any

import trio

from agent_bridge.common.rows import MessageJSON
from agent_bridge.ipc import protocol
from agent_bridge.ipc.stream import FramedStream

GATHER_TURNS = 3  # turns of the scheduler a write waits at most while other tasks add frames to it
PENDING_MAX = 1 << 20  # bytes waiting for the write in progress before a sender waits for it too
_HELD_HEAD = '{"v":' + str(protocol.PROTOCOL_VERSION) + ',"push":"held","message":'


class Outbox:
    """Frames to one relay's connection, gathered per turn of the scheduler (see the module)."""

    def __init__(self, conn: FramedStream) -> None:
        self.conn = conn
        self.raw_lines = False  # the relay reads line frames as bytes (ipc.protocol: relay wire 2)
        self._frames: list[bytes] = []
        self._pending = 0  # bytes in _frames
        self._writing = False  # a task is gathering or writing: frames handed now go with its write
        self._written = trio.Event()  # set (and replaced) after each write

    @property
    def closed(self) -> bool:
        return self.conn.closed

    def _encode(self, obj: dict[str, Any]) -> bytes:
        push = obj.get("push")
        if self.raw_lines and push == "line":
            return protocol.encode_line("push", obj["line"], obj.get("more", False), obj.get("seq"),
                                        obj.get("ids", ()))
        if push == "held" and len(obj) == 3 and isinstance(message := obj["message"], MessageJSON):
            text = message.text()  # the message's own text (common.rows.Message.to_json_text)
            if text is not None:
                return protocol.encode_text(_HELD_HEAD + text + "}")
        return protocol.encode(obj)

    async def send(self, obj: dict[str, Any]) -> None:
        await self.send_many([obj])

    async def send_many(self, objs: list[dict[str, Any]], *, gather: bool = True) -> None:
        """Frames for the relay, in one write with the others of this turn (`gather`), or, not
        gathering, written now (with what a write in progress gathered). Raises ProtocolError
        for a frame too large (nothing of it sent), trio.ClosedResourceError once closed, and
        trio.BrokenResourceError when the write it started failed."""
        if self.conn.closed:
            raise trio.ClosedResourceError("the relay's connection is closed")
        data = [self._encode(obj) for obj in objs]
        if not data:
            return
        self._frames.extend(data)
        self._pending += sum(map(len, data))
        if self._writing:
            if self._pending > PENDING_MAX:  # backpressure: the relay is not reading fast enough
                await self._written.wait()
            return
        self._writing = True
        try:
            with trio.CancelScope(shield=True):
                for _ in range(GATHER_TURNS if gather else 0):
                    before = len(self._frames)
                    # the other tasks of this turn add theirs
                    await trio.lowlevel.cancel_shielded_checkpoint()
                    if len(self._frames) == before:
                        break
                while self._frames:
                    frames, self._frames, self._pending = self._frames, [], 0
                    await self.conn.send_encoded(b"".join(frames))
        except BaseException:
            self._frames, self._pending = [], 0  # never written: the relay reports none of them
            raise
        finally:
            self._writing = False
            self._written.set()
            self._written = trio.Event()
