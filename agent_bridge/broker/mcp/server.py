"""The session's MCP server on the SDK's low-level `Server`, and the host's lines fed to one
(serve_lines: the static answers and the tests)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, cast

import mcp_types as types
import trio
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.shared.exceptions import MCPError

from agent_bridge import __version__
from agent_bridge.broker.mcp import sdk as mcp_sdk
from agent_bridge.broker.mcp.bridge import CHANNEL_CAPABILITY, Bridge
from agent_bridge.broker.mcp.calls import INSTRUCTIONS, TOOL_BODIES, call_tool
from agent_bridge.broker.mcp.fast import (
    Body,
    ToolCall,
)
from agent_bridge.broker.mcp.observe import capture
from agent_bridge.common import tools
from agent_bridge.common.tools import Tool


def _blocks(texts: list[str]) -> list[types.ContentBlock]:
    return [types.TextContent(type="text", text=text) for text in texts]


def build_server(bridge: Bridge, table: Mapping[str, Tool] = tools.TOOLS,
                 bodies: Mapping[str, Body] = TOOL_BODIES) -> Server[Any]:
    """The session's MCP server: the SDK's low-level `Server` with the tools of `table`, served
    by `bodies`. It declares what the SDK's `MCPServer` declared for this server before (empty
    prompts and resources, so hosts that list them get empty lists) and `logging`."""

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(
            tools=[
                types.Tool(name=tool.name, description=tool.description, input_schema=tool.schema)
                for tool in table.values()
            ]
        )

    async def on_call(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        if bridge is not None and bridge.fast is not None:  # None: the static answers' probes (static.py)
            # the request's 2026 envelope, if it has one, is one the SDK accepts
            bridge.fast.sdk_called(ctx.request_id, ctx.session, modern=not mcp_sdk.handshake_era(ctx.session))
        tool = table.get(params.name)
        if tool is None:  # JSON-RPC invalid params, as the MCP specification says
            raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {params.name!r}")
        texts, failed = await call_tool(bridge, tool, bodies[tool.name], params.arguments,
                                        ToolCall(ctx.request_id, ctx.meta, ctx.session))
        return types.CallToolResult(content=_blocks(texts), is_error=failed)

    async def set_level(
        ctx: ServerRequestContext[Any], params: types.SetLevelRequestParams
    ) -> types.EmptyResult:
        bridge.log_level = params.level
        return types.EmptyResult()

    async def on_initialized(ctx: ServerRequestContext[Any], params: types.NotificationParams) -> None:
        await capture(bridge, ctx.session)

    async def on_cancelled(ctx: ServerRequestContext[Any], params: types.CancelledNotificationParams) -> None:
        if params.request_id is not None:
            await bridge.cancelled(params.request_id)  # read first by RelayReader: a no-op then

    async def no_prompts(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=[])

    async def no_resources(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[])

    async def no_templates(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=[])

    async def no_prompt(
        ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams
    ) -> types.GetPromptResult:
        raise MCPError(types.INVALID_PARAMS, f"Unknown prompt: {params.name}")

    async def no_resource(
        ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        raise MCPError(types.INVALID_PARAMS, f"Unknown resource: {params.uri}", data={"uri": str(params.uri)})

    server: Server[Any] = Server(
        "agent-bridge", version=__version__, instructions=INSTRUCTIONS,
        on_list_tools=list_tools, on_call_tool=on_call, on_list_prompts=no_prompts, on_get_prompt=no_prompt,
        on_list_resources=no_resources, on_list_resource_templates=no_templates, on_read_resource=no_resource,
    )
    # Public, but not as constructor arguments: `on_set_logging_level` warns that the 2026
    # protocol drops logging, which hosts of the handshake era still use.
    server.add_request_handler("logging/setLevel", types.SetLevelRequestParams, set_level)
    server.add_notification_handler("notifications/initialized", types.NotificationParams, on_initialized)
    server.add_notification_handler(
        "notifications/cancelled", types.CancelledNotificationParams, on_cancelled
    )
    return server



async def serve_lines(
    server: Server[Any], agent: str, requests: list[dict[str, Any]], answers: int, *, raw: bool = False
) -> list[Any]:
    """Feed `requests` to `server` as a host would; its first `answers` lines, parsed (as
    written, with `raw`)."""
    init = server.create_initialization_options(
        experimental_capabilities={CHANNEL_CAPABILITY: {}} if agent == "claude" else None
    )
    out: list[Any] = []
    done = trio.Event()

    class Capture:
        async def write(self, text: str) -> None:
            # not splitlines(): U+2028 is text
            out.extend(line if raw else json.loads(line) for line in text.split("\n") if line)
            if len(out) >= answers:
                done.set()

        async def flush(self) -> None:
            pass

    async def lines() -> Any:
        for request in requests:
            yield json.dumps(request)
        await trio.sleep_forever()

    async def serve() -> None:
        async with mcp_sdk.open_relay_stdio(lines(), cast(mcp_sdk.RelayPipe, Capture())) as (read, write):
            await server.run(read, write, init)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            await done.wait()
            nursery.cancel_scope.cancel()
    return out
