"""Every contact with the MCP SDK beyond its documented surface, in one place.

The broker's MCP server (broker.mcp.host) is the SDK's low-level `Server`, registered through
its public handlers. What the SDK (2.x) has no public way for is learning when a response has
reached the host. The acknowledgement rule (SPEC §3, "What 'shown' means") needs
that last one: a message counts as shown once the bytes carrying it are written to the host's
pipe. So this module owns the stdout side of the stdio transport (`RelayPipe`): the SDK's stdio
writer hands each outgoing line to it, it sends the line to the session's relay, and it reports
which responses the relay wrote.

`check()` asserts every assumption made here; `tests/test_mcp_sdk.py` runs it, so an SDK
upgrade that moves any of these fails loudly there instead of silently stopping delivery.
"""

from __future__ import annotations

import inspect
import itertools
import json
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
import trio
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from agent_bridge.core import showing
from agent_bridge.ipc.frames import line_frames, push_frame

WATCH_MAX = 256  # responses awaited at once; a cancelled request's watch is dropped eventually


# What sending to a host that went away raises through the SDK (its streams are anyio's).
HOST_GONE: tuple[type[BaseException], ...] = (
    BrokenPipeError, anyio.BrokenResourceError, anyio.ClosedResourceError, trio.BrokenResourceError,
    trio.ClosedResourceError,
)


def handshake_era(session: Any) -> bool:
    """Whether the host's connection is of the handshake era (`initialize`), not of the 2026
    protocol, whose every request carries its own envelope (`session`: the SDK's, of a request)."""
    return getattr(session, "protocol_version", None) not in MODERN_PROTOCOL_VERSIONS


def logs_between_requests(session: Any) -> bool:
    """Whether the host's protocol takes `notifications/message` outside a request: the
    handshake era does; from 2026-07-28 a log rides only the stream of a request that opted in
    (SEP-2577), and the SDK drops the rest."""
    return handshake_era(session)


class SDKDrift(RuntimeError):
    """The installed MCP SDK no longer has what this module relies on."""


def check() -> None:
    """Raise SDKDrift naming every assumption the installed SDK breaks."""
    problems = []
    for method in ("add_notification_handler", "add_request_handler", "create_initialization_options", "run"):
        if not callable(getattr(Server, method, None)):
            problems.append(f"Server.{method} is gone")
    if not isinstance(getattr(Server, "server_info_stamp", None), property):  # fast.modern_stamp's source
        problems.append("Server.server_info_stamp is gone")
    context_fields = getattr(ServerRequestContext, "__dataclass_fields__", {})
    if not {"session", "meta", "request_id"} <= set(context_fields):
        problems.append("ServerRequestContext no longer has session, meta and request_id")
    if getattr(types, "INVALID_PARAMS", None) != -32602:
        problems.append("mcp_types.INVALID_PARAMS is no longer -32602")
    if "request_id" not in getattr(types.CancelledNotificationParams, "model_fields", {}):
        problems.append("CancelledNotificationParams.request_id is gone")
    if not {"stdin", "stdout"} <= set(inspect.signature(stdio_server).parameters):
        problems.append("stdio_server() no longer takes an explicit stdin and stdout")
    source = inspect.getsource(stdio_server)
    if "await stdout.write(" not in source or "await stdout.flush()" not in source:
        problems.append(
            "stdio_server() no longer writes each message with stdout.write() then stdout.flush()"
        )
    if problems:
        raise SDKDrift("; ".join(problems))


def _key(rid: object) -> str:
    return showing.key(rid)  # "7" and 7 are one request, as the SDK correlates them


class RelayPipe:
    """The host's end of stdout, one relay connection away: every byte the host receives goes
    through here.

    The SDK's stdio writer calls `write(line)` then `flush()` for each JSON-RPC message; we
    send the line to the relay in `flush()`. A line whose writing shows messages (a response
    someone `watch`es, a notification sent with `written=`) carries a sequence number and the
    message ids; the relay writes the line to the host, flushes, and only then answers
    "written" with that number, which calls the callback (`written(seq)`). A line the relay
    never wrote (the host cancelled, the relay died) never calls it.
    """

    def __init__(self, conn: Any) -> None:
        self._conn = conn  # the relay's FramedStream
        self._buffer: list[str] = []
        self._watches: OrderedDict[str, tuple[list[str], Callable[[], None]]] = OrderedDict()
        self._sent: dict[int, Callable[[], None]] = {}
        self._sent_rids: dict[str, int] = {}  # watched responses sent to the relay: their seq
        self._seq = itertools.count(1)
        # told the id of each answer the SDK writes while it is `listening()` (broker.mcp.sends:
        # a place kept for a call the SDK may answer without calling the tool)
        self.listener: Any = None

    def watch(self, rid: types.RequestId | None, ids: list[str], written: Callable[[], None]) -> None:
        """Call `written()` (synchronously: it must not block) once the successful response to
        request `rid`, which shows messages `ids`, has been written to the host. A response
        never written (the host cancelled the request, the relay went away) never calls it."""
        if rid is None:
            return
        self._watches[_key(rid)] = (ids, written)
        while len(self._watches) > WATCH_MAX:
            self._watches.popitem(last=False)

    def forget(self, rid: types.RequestId | None) -> bool:
        """Stop watching request `rid`; True if its response is already on its way to the host
        (sent to the relay, not yet reported written): it may still be shown."""
        if rid is None:
            return False
        self._watches.pop(_key(rid), None)
        seq = self._sent_rids.pop(_key(rid), None)
        return seq is not None and self._sent.pop(seq, None) is not None

    def written(self, seq: int) -> None:
        """The relay wrote line `seq` to the host."""
        callback = self._sent.pop(seq, None)
        if callback is not None:
            callback()
        if len(self._sent_rids) > WATCH_MAX:  # their seqs are reported by now, or never will be
            self._sent_rids = {k: v for k, v in self._sent_rids.items() if v in self._sent}

    # --- what stdio_server's writer calls --------------------------------------------

    async def write(self, text: str) -> None:
        self._buffer.append(text)

    async def flush(self) -> None:
        text, self._buffer = "".join(self._buffer), []
        for line in text.split("\n"):  # not splitlines(): U+2028 and friends are text inside a line
            if not line:
                continue
            listening = self.listener is not None and self.listener.listening()
            key, ids, written = (self._watched(line, listening) if self._watches or listening
                                 else (None, [], None))
            await self._send(line, ids, written, key)

    # --- our own messages -------------------------------------------------------------

    async def send_response(self, rid: types.RequestId, line: str, *, shows: bool) -> None:
        """A response serialized without the SDK (broker.mcp.fast), sent as `flush` sends the
        SDK's: the watch for `rid` ends, and counts only if the response `shows` (a result,
        not an error)."""
        key = _key(rid)
        watch = self._watches.pop(key, None)
        ids, written = watch if watch is not None and shows else ([], None)
        await self._send(line, ids, written, key)

    async def send_responses(self, answers: list[tuple[types.RequestId, str]]) -> None:
        """Responses that show nothing (`send`'s, broker.mcp.sends), serialized without the SDK:
        one write, now (not gathered with the turn's other frames: broker.mcp.outbox), where
        `send_response` for each would start a write of its own. A watch for one of them ends,
        as there."""
        for rid, _ in answers:
            self._watches.pop(_key(rid), None)
        frames = [push_frame(frame) for _, line in answers for frame in line_frames(line)]
        try:
            await self._conn.send_many(frames, gather=False)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise BrokenPipeError("the relay to the host is gone") from exc

    async def send_line(self, line: str) -> None:
        """One line that shows nothing (a notification serialized as the SDK would)."""
        await self._send(line, [], None)

    async def send_message(self, method: str, params: dict[str, Any], *, ids: list[str] | None = None,
                           written: Callable[[], None] | None = None) -> None:
        """Send one JSON-RPC notification; `written()` once the relay wrote it to the host."""
        line = json.dumps({"jsonrpc": "2.0", "method": method, "params": params}, ensure_ascii=False)
        await self._send(line, ids or [], written)

    async def _send(self, line: str, ids: list[str], written: Callable[[], None] | None,
                    key: str | None = None) -> None:
        """`line` to the relay; `written()` once it reports the line written. A watched response
        (`key`) counts as on its way (`forget`) from before the send: the frame may wait for the
        others of its turn (broker.mcp.outbox), and a cancel read meanwhile must find it."""
        seq = None
        if written is not None:
            seq = next(self._seq)
            self._sent[seq] = written
            if key is not None:
                self._sent_rids[key] = seq
        try:
            await self._conn.send_many([push_frame(frame) for frame in line_frames(line, seq, ids)])
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            if seq is not None:
                self._sent.pop(seq, None)
                if key is not None:
                    self._sent_rids.pop(key, None)
            raise BrokenPipeError("the relay to the host is gone") from exc

    def _watched(
        self, line: str, listening: bool = False
    ) -> tuple[str | None, list[str], Callable[[], None] | None]:
        """A response's key, and its watch if it shows messages; the listener told its key."""
        try:
            message = json.loads(line)
        except ValueError:
            return None, [], None
        if not isinstance(message, dict) or "id" not in message or "method" in message:
            return None, [], None
        key = _key(message["id"])
        if listening:
            self.listener.answered(key)
        watch = self._watches.pop(key, None)
        result = message.get("result")
        if watch is not None and isinstance(result, dict) and not result.get("isError"):
            return key, *watch
        return None, [], None


@asynccontextmanager
async def open_relay_stdio(lines: Any, pipe: RelayPipe) -> AsyncIterator[tuple[Any, Any]]:
    """The SDK's stdio transport over a relay: (read, write) streams of the MCP session.
    `lines`: the host's lines (an async iterator); `pipe`: where the answers go."""
    async with stdio_server(stdin=lines, stdout=pipe) as (read_stream, write_stream):  # type: ignore[arg-type]
        yield read_stream, write_stream
