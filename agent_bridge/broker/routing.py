"""An accepted connection, routed by its first request: a bridge-protocol session (`hello`,
broker.connection), an MCP relay's session (`mcp`, broker.mcp.host), or control requests
(hooks, the command line: a few requests, then it closes)."""

from __future__ import annotations

from typing import Any

import trio

from agent_bridge.broker.connection import serve_session
from agent_bridge.broker.serving import answer, send_quietly
from agent_bridge.broker.state import Broker
from agent_bridge.ipc import protocol
from agent_bridge.ipc.stream import FramedStream

HELLO_TIMEOUT = 10.0  # a connection that says nothing this long is dropped


async def handle_connection(broker: Broker, stream: trio.abc.Stream) -> None:
    conn = FramedStream(stream)
    try:
        first = None
        with trio.move_on_after(HELLO_TIMEOUT):
            first = await conn.receive()
        if first is None:
            return
        try:
            request_id, op, args = protocol.parse_request(first)
        except protocol.BadArguments as exc:
            if first.get("op") in ("hello", "mcp"):  # no session without a valid hello
                await send_quietly(conn, protocol.error(exc.request_id, "bad_request", str(exc)))
                return
            await conn.send(protocol.error(exc.request_id, "bad_request", str(exc)))
            following = await _next_control(conn)
            if following is None:
                return
            request_id, op, args = following
        if op == "hello":
            await serve_session(broker, conn, request_id, args)
        elif op == "mcp":  # an `agent-bridge mcp` relay: the broker serves its host's MCP session
            # Imported here, not at the top: the MCP side (the SDK, pydantic) costs half a second
            # of CPU, which the broker spends on a thread after it is ready (root._preload_mcp),
            # not before it answers anyone. Not a cycle: mcp_host imports nothing above it.
            from agent_bridge.broker.mcp import host as mcp_host

            await mcp_host.serve_relay(broker, conn, request_id, args)
        else:
            await _serve_control(broker, conn, request_id, op, args)
    except protocol.ProtocolError as exc:
        await send_quietly(conn, protocol.error(None, "protocol", str(exc)))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the client left before its answer (a refused hello, a hook that timed out): not a failure
    finally:
        await conn.aclose()


async def _serve_control(
    broker: Broker, conn: FramedStream, request_id: int, op: str, args: dict[str, Any]
) -> None:
    """Hooks and the CLI: one or a few requests, then the connection closes."""
    while True:
        if op not in protocol.CONTROL_OPS:
            await conn.send(protocol.error(request_id, "bad_request", f"{op}: send hello first"))
        else:
            await conn.send(await answer(broker, None, request_id, op, args))
            if op == "shutdown":
                broker.stop.set()
                return
        following = await _next_control(conn)
        if following is None:
            return
        request_id, op, args = following


async def _next_control(conn: FramedStream) -> tuple[int, str, dict[str, Any]] | None:
    """The next control request; one with arguments that cannot be carried out is answered
    here and skipped. None once the client has closed."""
    while True:
        frame = await conn.receive()
        if frame is None:
            return None
        try:
            return protocol.parse_request(frame)
        except protocol.BadArguments as exc:
            await conn.send(protocol.error(exc.request_id, "bad_request", str(exc)))


