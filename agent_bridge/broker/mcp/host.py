"""The MCP side of one agent session, served by the broker (SPEC §5).

`agent-bridge mcp` (agent_bridge.relay.main) is a standard-library relay: it pumps the host's
JSON-RPC lines to the broker over the bridge socket and writes the broker's lines to the host's
stdout. Here, in the session's own task beside its delivery task, the MCP SDK serves those lines
(`serve_relay`), and tool calls go to the broker's op handlers in-process, as this session.

Pushed messages wait in an in-memory inbox until the agent is shown them (the `inbox` tool, or a
channel notification for active messages to a host that declared it takes them). Shown means
written to the host's pipe (SPEC §3): the offer is recorded before a line leaves for the relay,
and the acknowledgement waits for the relay's "written" frame, which it sends once the bytes are
in the host's pipe. So a cancelled call, a broken pipe or a crash loses nothing, and a message
offered again after an acknowledgement that never came is marked `"repeat": true`. Replays are
deduplicated by message id.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from agent_bridge.broker.delivery import deliver
from agent_bridge.broker.mcp import sdk as mcp_sdk
from agent_bridge.broker.mcp.bridge import ACK_FLUSH_AT_EXIT, CHANNEL_CAPABILITY, Bridge, SessionLink
from agent_bridge.broker.mcp.calls import TOOL_BODIES
from agent_bridge.broker.mcp.fast import FastCalls, modern_stamp
from agent_bridge.broker.mcp.reader import RelayReader
from agent_bridge.broker.mcp.sends import TOOL as SENDS_TOOL
from agent_bridge.broker.mcp.sends import SendCalls
from agent_bridge.broker.mcp.server import build_server
from agent_bridge.broker.mcp.stdin import GuardedStdin
from agent_bridge.broker.serving import STORAGE_ERRORS, attach_session, close_when_silent
from agent_bridge.broker.state import Broker
from agent_bridge.common import ledger, tools
from agent_bridge.ipc import protocol
from agent_bridge.ipc.protocol import RemoteError
from agent_bridge.ipc.stream import FramedStream

DELIVERY_FIRST = 5.0  # seconds the host's lines wait for the session's backlog to be in its inbox
LINES_BUFFER = 16  # host lines read ahead of the MCP server: a relay that outruns it waits

log = logging.getLogger("agent_bridge.mcp")


async def serve_relay(broker: Broker, conn: FramedStream, request_id: int, args: dict[str, Any]) -> None:
    """One `agent-bridge mcp` relay's connection: its `mcp` request is the session's hello;
    then the host's lines are served by the MCP SDK, beside the session's delivery task."""
    link = SessionLink(conn)
    acked = args.pop("acked", None)  # shown by the relay while no broker answered
    offered = args.pop("offered", None)  # offered by it then, maybe shown: repeats if shown again
    session = await attach_session(broker, conn, request_id, args, to=link)
    if session is None:
        return
    bridge = link.bridge = Bridge(broker, session, conn)
    pipe = bridge.pipe = mcp_sdk.RelayPipe(bridge.out)
    stdin_closed = False
    try:
        # Before the delivery task reads what is unacknowledged (and marks what was offered).
        if isinstance(acked, list) and acked:
            try:
                await bridge.call("ack", ids=acked[: ledger.IDS_MAX])
            except RemoteError as exc:
                log.warning("could not record a relay's acknowledgements: %s", exc)
        if isinstance(offered, list) and offered:
            await bridge.offered_by_relay([i for i in offered if isinstance(i, str)][: ledger.IDS_MAX])
        # The secret lets this relay resume exactly this session later (broker.sessions.identity).
        # "wire": this broker reads and, once the relay says it does too, sends line frames as
        # bytes (ipc.protocol, relay wire 2); an older relay never asks, and is sent JSON frames.
        hello = {"session": session.public(), "hopLimit": broker.settings.hop_limit, "secret": session.secret,
                 "wire": protocol.LINES_WIRE}
        conn.read_lines("relay")
        await conn.send(protocol.ok(request_id, hello))
        server = build_server(bridge)
        init = server.create_initialization_options(
            experimental_capabilities={CHANNEL_CAPABILITY: {}} if session.peer.agent == "claude" else None
        )
        lines_in, lines_out = trio.open_memory_channel[str](LINES_BUFFER)

        async def read_relay(fast: FastCalls) -> None:
            nonlocal stdin_closed
            async with lines_in:
                stdin_closed = await RelayReader(bridge, pipe, lines_in, fast).run()

        async with trio.open_nursery() as nursery:
            fast = FastCalls(
                bridge, nursery, TOOL_BODIES, {name: tool.schema for name, tool in tools.TOOLS.items()}
            )
            sends = SendCalls(bridge, fast.running)
            fast.queues[SENDS_TOOL] = sends.add
            fast.places[SENDS_TOOL] = sends.reserve  # a send the SDK serves keeps its line's place
            bridge.sends = pipe.listener = sends  # the SDK's calls of it, and its answers, find it
            bridge.fast = fast  # the SDK's calls tell it which 2026 envelopes it accepts
            fast.modern = modern_stamp(server.server_info_stamp)
            nursery.start_soon(sends.run)
            nursery.start_soon(deliver, broker, session)
            nursery.start_soon(bridge.ack_loop)
            with trio.move_on_after(DELIVERY_FIRST):  # the host's first `inbox` sees the backlog
                await link.delivered.wait()
            nursery.start_soon(read_relay, fast)
            nursery.start_soon(close_when_silent, conn, session.name)
            guard = GuardedStdin()  # answers the lines the SDK would drop (lone surrogates)
            async with mcp_sdk.open_relay_stdio(guard.lines(lines_out), pipe) as (read_stream, write_stream):
                guard.answer_through(write_stream)
                await server.run(read_stream, write_stream, init)
            if stdin_closed:
                bridge.showing.eof()  # the host closed stdin: no cancel can follow
            with trio.move_on_after(ACK_FLUSH_AT_EXIT):
                await bridge.flush_acks()  # what the host was shown last
            nursery.cancel_scope.cancel()
    except* (trio.BrokenResourceError, trio.ClosedResourceError, BrokenPipeError):
        pass  # the relay went away, maybe while a line was on its way to it
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            try:
                await bridge.flush_acks()
                await broker.persist_offers(session)
            except STORAGE_ERRORS as exc:  # kept in memory; the next connection's pushes are still marked
                log.warning("could not record the offers of %s: %s", session.name, exc)
        await broker.detach(session)
