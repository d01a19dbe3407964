"""The MCP SDK adapter (agent_bridge.broker.mcp.sdk): everything it assumes about the installed SDK
holds, and its pipe reports a response as written exactly when the relay says the host's pipe
has it. An SDK
upgrade that breaks any of this fails here, loudly, instead of silently stopping delivery."""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types
import pytest
import trio
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server

from agent_bridge.broker.mcp import sdk as mcp_sdk
from agent_bridge.ipc import protocol
from agent_bridge.ipc.stream import FramedStream


def test_the_installed_sdk_has_everything_the_adapter_uses():
    mcp_sdk.check()  # raises SDKDrift naming what moved


async def test_the_pipe_reports_written_responses_and_never_a_cancelled_one():
    """A real SDK server whose stdout is a RelayPipe on a real socket; the test is the relay.
    A tool call's response carries a sequence number and is reported written only when the
    relay says it wrote it; a call the host cancelled is never answered and never reported."""
    reported: list[str] = []
    started = trio.Event()

    async def hold(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        tag, seconds = (params.arguments or {})["tag"], (params.arguments or {})["seconds"]
        pipe.watch(ctx.request_id, [f"id-{tag}"], lambda: reported.append(tag))
        started.set()
        await trio.sleep(seconds)
        return types.CallToolResult(content=[types.TextContent(type="text", text=tag)])

    server: Server[Any] = Server("t", on_call_tool=hold)

    broker_end, relay_end = trio.socket.socketpair()
    conn = FramedStream(trio.SocketStream(broker_end))
    relay = FramedStream(trio.SocketStream(relay_end))
    pipe = mcp_sdk.RelayPipe(conn)
    lines_in, lines_out = trio.open_memory_channel[str](16)

    async def send(*messages: dict[str, Any]) -> None:
        for m in messages:
            await lines_in.send(json.dumps(m))

    async def receive() -> tuple[dict[str, Any], dict[str, Any]]:
        frame = await relay.receive()
        assert frame is not None and frame["push"] == "line"
        return json.loads(frame["line"]), frame

    def call(rid: int, tag: str, seconds: float) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                "params": {"name": "hold", "arguments": {"tag": tag, "seconds": seconds}}}

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            async def serve() -> None:
                async with mcp_sdk.open_relay_stdio(lines_out, pipe) as (read, write):
                    await server.run(read, write, server.create_initialization_options())

            nursery.start_soon(serve)
            await send(
                {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "initialize",
                    "params": {
                        "protocolVersion": "2025-06-18",
                        "capabilities": {},
                        "clientInfo": {"name": "t", "version": "1"},
                    },
                }
            )
            assert (await receive())[0]["id"] == 1
            await send({"jsonrpc": "2.0", "method": "notifications/initialized"})

            await send(call(2, "cancelled", 5))
            await started.wait()
            await send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}})
            await send(call(3, "answered", 0))
            answer, frame = await receive()
            assert answer["id"] == 3 and answer["result"]["content"][0]["text"] == "answered"
            assert frame["ids"] == ["id-answered"] and reported == []  # not written yet: not reported
            pipe.written(frame["seq"])
            assert reported == ["answered"]
            await lines_in.aclose()
            nursery.cancel_scope.cancel()
    await conn.aclose()
    await relay.aclose()


async def test_a_line_longer_than_a_frame_goes_in_parts():
    """An answer bigger than the protocol's frame limit reaches the relay whole, in parts."""
    broker_end, relay_end = trio.socket.socketpair()
    conn = FramedStream(trio.SocketStream(broker_end))
    relay = FramedStream(trio.SocketStream(relay_end))
    pipe = mcp_sdk.RelayPipe(conn)
    line = json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"text": "é" * (protocol.MAX_FRAME // 2 + 10)}})
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            async def write() -> None:
                await pipe.write(line + "\n")
                await pipe.flush()

            nursery.start_soon(write)
            parts = []
            while True:
                frame = await relay.receive()
                assert frame is not None
                parts.append(frame["line"])
                if not frame.get("more"):
                    break
    assert len(parts) > 1 and "".join(parts) == line
    await conn.aclose()
    await relay.aclose()


def test_a_drifted_sdk_is_named(monkeypatch: pytest.MonkeyPatch):
    """The check really looks: with a stdio writer that no longer takes our stdout it fails,
    naming it."""

    def stdio_server(stdin: Any = None) -> None:
        pass

    monkeypatch.setattr(mcp_sdk, "stdio_server", stdio_server)
    with pytest.raises(mcp_sdk.SDKDrift, match="stdio_server"):
        mcp_sdk.check()
