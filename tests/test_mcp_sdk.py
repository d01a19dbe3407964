"""The MCP SDK adapter (agent_bridge.mcp_sdk): everything it assumes about the installed SDK
holds, and its pipe reports a response as written exactly when the host's pipe has it. An SDK
upgrade that breaks any of this fails here, loudly, instead of silently stopping delivery."""

from __future__ import annotations

import io
import json
import os
from typing import Any

import anyio
import pytest
import trio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.stdio import stdio_server

from agent_bridge import mcp_sdk


def test_the_installed_sdk_has_everything_the_adapter_uses():
    mcp_sdk.check()  # raises SDKDrift naming what moved


def test_the_adapter_reaches_the_tools_and_the_lowlevel_server():
    server = MCPServer("t")

    @server.tool()
    def probe(x: int) -> str:
        return str(x)

    (tool,) = mcp_sdk.tool_schemas(server)
    assert tool.parameters["properties"]["x"]["type"] == "integer"
    assert mcp_sdk.lowlevel(server).name == "t"


async def test_the_pipe_reports_written_responses_and_never_a_cancelled_one():
    """A real SDK server over OS pipes with a HostPipe as its stdout: a tool call's response is
    reported once its bytes are in the pipe; a call the host cancelled is never answered and
    never reported."""
    server = MCPServer("t")
    reported: list[str] = []
    started = trio.Event()

    @server.tool()
    async def hold(tag: str, seconds: float, ctx: Context) -> str:
        pipe.watch(mcp_sdk.request_id(ctx), lambda: reported.append(tag))
        started.set()
        await trio.sleep(seconds)
        return tag

    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    pipe = mcp_sdk.HostPipe(out_w)
    stdin = anyio.wrap_file(io.TextIOWrapper(os.fdopen(in_r, "rb"), encoding="utf-8"))
    host_in = trio.lowlevel.FdStream(in_w)
    host_out = trio.lowlevel.FdStream(out_r)
    buffer = b""

    async def send(*messages: dict[str, Any]) -> None:
        await host_in.send_all(b"".join(json.dumps(m).encode() + b"\n" for m in messages))

    async def receive() -> dict[str, Any]:
        nonlocal buffer
        while b"\n" not in buffer:
            buffer += await host_out.receive_some(65536)
        line, buffer = buffer.split(b"\n", 1)
        return json.loads(line)

    def call(rid: int, tag: str, seconds: float) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                "params": {"name": "hold", "arguments": {"tag": tag, "seconds": seconds}}}

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            async def serve() -> None:
                async with stdio_server(stdin=stdin, stdout=pipe) as (read, write):  # type: ignore[arg-type]
                    await mcp_sdk.lowlevel(server).run(read, write, mcp_sdk.lowlevel(server).create_initialization_options())

            nursery.start_soon(serve)
            await send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
            assert (await receive())["id"] == 1
            await send({"jsonrpc": "2.0", "method": "notifications/initialized"})

            await send(call(2, "cancelled", 5))
            await started.wait()
            await send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}})
            await send(call(3, "answered", 0))
            answer = await receive()
            assert answer["id"] == 3 and answer["result"]["content"][0]["text"] == "answered"
            assert reported == ["answered"]
            await host_in.aclose()
            nursery.cancel_scope.cancel()
    await host_out.aclose()


def test_a_drifted_sdk_is_named(monkeypatch: pytest.MonkeyPatch):
    """The check really looks: with the private attribute gone it fails, naming it."""
    original = MCPServer.__init__

    def without_tool_manager(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        del self._tool_manager

    monkeypatch.setattr(MCPServer, "__init__", without_tool_manager)
    with pytest.raises(mcp_sdk.SDKDrift, match="_tool_manager"):
        mcp_sdk.check()
