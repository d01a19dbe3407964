"""The relay's frames, read for one session: the host's lines go to the MCP server, the
relay's reports (written, acknowledged, offered, ping, end of input) to the `Bridge`."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from agent_bridge.broker.mcp import sdk as mcp_sdk
from agent_bridge.broker.mcp.bridge import Bridge
from agent_bridge.broker.mcp.fast import (
    FastCalls,
    cancelled_request,
)
from agent_bridge.broker.serving import send_quietly
from agent_bridge.common import jsonlimit, ledger
from agent_bridge.ipc import protocol
from agent_bridge.ipc.frames import (
    Acked,
    Eof,
    Line,
    LineParts,
    Offered,
    Ping,
    Wire,
    Written,
    read_relay,
)


class RelayReader:
    """The relay's frames (ipc.frames.read_relay), each carried out by its handler
    (RELAY_HANDLERS): host lines to the MCP server (or served by `fast`), "written" reports to
    the pipe, what the relay showed or offered while no broker answered to the showing machine.
    A handler returns None to go on reading, or how the reading ends."""

    def __init__(self, bridge: Bridge, pipe: mcp_sdk.RelayPipe, lines: trio.MemorySendChannel[str],
                 fast: FastCalls) -> None:
        self.bridge, self.pipe, self.lines, self.fast = bridge, pipe, lines, fast
        self.conn = bridge.relay
        self.parts = LineParts()

    async def run(self) -> bool:
        """Until the relay says its host closed stdin (True) or goes away (False)."""
        conn = self.conn
        while True:
            try:
                # None at the end of the stream; closed by close_when_silent after IDLE_TIMEOUT
                # without a frame (a dead relay), or when another connection took the session.
                obj = await conn.receive()
                if obj is None:
                    return False
                frame = read_relay(obj)
            except trio.ClosedResourceError:
                return False
            except protocol.ProtocolError as exc:
                await send_quietly(conn, protocol.error(None, "protocol", str(exc)))
                return False
            if frame is None:
                ended = await self.stray_request(obj)
            else:
                ended = await RELAY_HANDLERS[type(frame)](self, frame)
            if ended is not None:
                return ended

    async def stray_request(self, obj: dict[str, Any]) -> bool | None:
        """A request where the host's lines belong: answered, the session goes on."""
        try:
            request_id, op, _ = protocol.parse_request(obj)
        except protocol.BadArguments as exc:
            await self.conn.send(protocol.error(exc.request_id, "bad_request", str(exc)))
            return None
        except protocol.ProtocolError as exc:
            await send_quietly(self.conn, protocol.error(None, "protocol", str(exc)))
            return False
        await self.conn.send(
            protocol.error(request_id, "bad_request", f"{op}: not available on an MCP relay connection")
        )
        return None

    async def on_line(self, frame: Line) -> bool | None:
        line = self.parts.add(frame)
        if line is None:
            return None
        if jsonlimit.too_deep(line):  # the relay answers these; a client speaking for one may not
            answer = invalid_request_line(jsonlimit.members(line) or {}, str(jsonlimit.TooDeep()))
            if answer is not None:
                await self.pipe.send_line(answer)
            return None
        if '"notifications/cancelled"' in line:
            rid = cancelled_request(line)
            if rid is not None:
                await self.bridge.cancelled(rid)
        if not self.fast.take(line):
            await self.lines.send(line)
        return None

    async def on_written(self, frame: Written) -> bool | None:
        self.pipe.written(frame.seq)
        return None

    async def on_acked(self, frame: Acked) -> bool | None:
        """The relay showed these itself while no broker answered."""
        self.bridge.shown_by_relay(frame.ids[: ledger.IDS_MAX])
        return None

    async def on_offered(self, frame: Offered) -> bool | None:
        """And offered these then: maybe shown."""
        await self.bridge.offered_by_relay(frame.ids[: ledger.IDS_MAX])
        return None

    async def on_ping(self, frame: Ping) -> bool | None:
        return None

    async def on_eof(self, frame: Eof) -> bool | None:
        return True

    async def on_wire(self, frame: Wire) -> bool | None:
        """The relay reads line frames as bytes: they go so from now on."""
        if frame.wire != protocol.LINES_WIRE:
            problem = f"relay frame: wire {frame.wire} is not spoken here (only {protocol.LINES_WIRE})"
            await send_quietly(self.conn, protocol.error(None, "protocol", problem))
            return False
        self.bridge.out.raw_lines = True
        return None


RELAY_HANDLERS: dict[type, Callable[[RelayReader, Any], Awaitable[bool | None]]] = {
    Line: RelayReader.on_line,
    Written: RelayReader.on_written,
    Acked: RelayReader.on_acked,
    Offered: RelayReader.on_offered,
    Ping: RelayReader.on_ping,
    Eof: RelayReader.on_eof,
    Wire: RelayReader.on_wire,
}


def invalid_request_line(message: dict[str, Any], problem: str) -> str | None:
    """JSON-RPC "Invalid Request" for a line that is not parsed (`message`: its top-level
    members, as far as they could be read), with the request's id when it has a usable one,
    else null; None for a notification, which gets no answer."""
    if "id" not in message and isinstance(message.get("method"), str):
        return None
    rid = message.get("id")
    if isinstance(rid, bool) or not isinstance(rid, (int, str)) or protocol.unstorable_text(rid):
        rid = None
    error = {"code": -32600, "message": f"Invalid Request: {problem}"}
    return json.dumps({"jsonrpc": "2.0", "id": rid, "error": error}, ensure_ascii=False)
