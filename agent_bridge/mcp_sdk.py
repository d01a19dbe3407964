"""Every contact with the MCP SDK beyond its documented surface, in one place.

The SDK (2.x) offers no public way to advertise a hand-edited tool schema, to add a handler for
`notifications/initialized`, to serve an `MCPServer` over streams we own, or to learn when a
response has reached the host. The acknowledgement rule (SPEC §3, "What 'shown' means") needs
that last one: a message counts as shown once the bytes carrying it are written to the host's
pipe. So this module owns the stdout side of the stdio transport (`HostPipe`): the SDK's stdio
writer hands each outgoing line to it, and it reports which response ids it wrote.

`check()` asserts every assumption made here; `tests/test_mcp_sdk.py` runs it, so an SDK
upgrade that moves any of these fails loudly there instead of silently stopping delivery.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
import trio
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

WATCH_MAX = 256  # responses awaited at once; a cancelled request's watch is dropped eventually


# What sending to a host that went away raises through the SDK (its streams are anyio's).
HOST_GONE: tuple[type[BaseException], ...] = (
    BrokenPipeError, anyio.BrokenResourceError, anyio.ClosedResourceError, trio.BrokenResourceError,
    trio.ClosedResourceError,
)


class SDKDrift(RuntimeError):
    """The installed MCP SDK no longer has what this module relies on."""


def lowlevel(server: MCPServer) -> Server[Any]:
    """The low-level `Server` under an `MCPServer` (its initialization options, its run loop)."""
    return server._lowlevel_server


def tool_schemas(server: MCPServer) -> list[Any]:
    """The registered tools whose `parameters` (the advertised input schema) may be edited."""
    return list(server._tool_manager.list_tools())


def on_initialized(server: MCPServer, handler: Callable[[Any, Any], Any]) -> None:
    """Call `handler(ctx, params)` when the host sends `notifications/initialized`."""
    lowlevel(server).add_notification_handler("notifications/initialized", types.NotificationParams, handler)


def on_cancelled(server: MCPServer, handler: Callable[[types.RequestId], Any]) -> None:
    """Call `await handler(request_id)` when the host sends `notifications/cancelled`. The SDK
    itself stops the request's handler and never answers it; this is for a request whose
    answer was already written when the cancel came (the host then ignores that answer)."""

    async def cancelled(ctx: Any, params: types.CancelledNotificationParams) -> None:
        if params.request_id is not None:
            await handler(params.request_id)

    lowlevel(server).add_notification_handler("notifications/cancelled", types.CancelledNotificationParams, cancelled)


def check_tool_calls(server: MCPServer, problem: Callable[[str, Any, Any], str | None]) -> None:
    """Look at every `tools/call` before the SDK validates it: an unknown tool is a JSON-RPC
    error (-32602, invalid params, as the MCP specification says); `problem(name, schema,
    arguments)` (the tool's advertised input schema and the raw arguments) naming a problem
    makes the call a tool error with that text. The SDK's own validation is lax (pydantic
    turns "yes" into true and "0" into 0, and drops arguments it does not know)."""

    async def check(ctx: ServerRequestContext[Any, Any], call_next: Callable[[Any], Awaitable[Any]]) -> Any:
        params = ctx.params
        if ctx.method == "tools/call" and ctx.request_id is not None and isinstance(params, Mapping):
            name = params.get("name")
            schemas = {tool.name: tool.parameters for tool in tool_schemas(server)}
            if not isinstance(name, str) or name not in schemas:
                raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {name!r}")
            text = problem(name, schemas[name], params.get("arguments"))
            if text is not None:
                return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)
        return await call_next(ctx)

    server.middleware.append(check)


def on_set_level(server: MCPServer, handler: Callable[[str], None]) -> None:
    """Serve `logging/setLevel` (which declares the `logging` capability): `handler(level)`."""

    async def set_level(ctx: Any, params: types.SetLevelRequestParams) -> types.EmptyResult:
        handler(params.level)
        return types.EmptyResult()

    lowlevel(server).add_request_handler("logging/setLevel", types.SetLevelRequestParams, set_level)


def request_id(ctx: Context) -> types.RequestId | None:
    """The JSON-RPC id of the request a tool call is answering, as the host sent it."""
    return ctx.request_context.request_id


def check() -> None:
    """Raise SDKDrift naming every assumption the installed SDK breaks."""
    server = MCPServer("drift-check")
    problems = []
    if not isinstance(getattr(server, "_lowlevel_server", None), Server):
        problems.append("MCPServer._lowlevel_server is no longer the low-level Server")
    list_tools = getattr(getattr(server, "_tool_manager", None), "list_tools", None)
    if list_tools is None:
        problems.append("MCPServer._tool_manager.list_tools is gone")
    else:
        server.add_tool(lambda x: str(x), name="probe", structured_output=False)
        if not all(isinstance(getattr(t, "parameters", None), dict) for t in list_tools()):
            problems.append("MCPServer._tool_manager.list_tools() no longer yields tools with a `parameters` dict")
    if not callable(getattr(Server, "add_notification_handler", None)):
        problems.append("Server.add_notification_handler is gone")
    if not callable(getattr(Server, "add_request_handler", None)):
        problems.append("Server.add_request_handler is gone")
    if not isinstance(getattr(server, "middleware", None), list):
        problems.append("MCPServer.middleware is no longer a list of middleware")
    context_fields = getattr(ServerRequestContext, "__dataclass_fields__", {})
    if not {"method", "params", "request_id"} <= set(context_fields):
        problems.append("ServerRequestContext no longer has method, params and request_id")
    if not all(getattr(t, "name", None) == "probe" for t in (list_tools() if list_tools else [])):
        problems.append("MCPServer._tool_manager.list_tools() no longer yields tools with a `name`")
    if getattr(types, "INVALID_PARAMS", None) != -32602:
        problems.append("mcp_types.INVALID_PARAMS is no longer -32602")
    if "request_id" not in getattr(types.CancelledNotificationParams, "model_fields", {}):
        problems.append("CancelledNotificationParams.request_id is gone")
    if not isinstance(inspect.getattr_static(Context, "request_context", None), property):
        problems.append("Context.request_context is no longer a property")
    if "stdout" not in inspect.signature(stdio_server).parameters:
        problems.append("stdio_server() no longer takes an explicit stdout")
    source = inspect.getsource(stdio_server)
    if "await stdout.write(" not in source or "await stdout.flush()" not in source:
        problems.append("stdio_server() no longer writes each message with stdout.write() then stdout.flush()")
    if problems:
        raise SDKDrift("; ".join(problems))


def _key(rid: object) -> str:
    return json.dumps(rid)


class HostPipe:
    """The host's end of stdout: every byte the host receives goes through here.

    The SDK's stdio writer calls `write(line)` then `flush()` for each JSON-RPC message; we
    write a line to the pipe in `flush()` and, once the kernel took all of it, call the
    callback registered for that response id (`watch`). Our own notifications go out with
    `send_message`, under the same lock, so lines never interleave.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._stream = trio.lowlevel.FdStream(fd) if sys.platform != "win32" else None
        self._lock = trio.Lock()
        self._buffer: list[str] = []
        self._watches: OrderedDict[str, Callable[[], None]] = OrderedDict()

    def watch(self, rid: types.RequestId | None, written: Callable[[], None]) -> None:
        """Call `written()` (synchronously: it must not block) once the successful response to
        request `rid` has been written to the host. A response never written (the host
        cancelled the request, or the pipe broke) never calls it."""
        if rid is None:
            return
        self._watches[_key(rid)] = written
        while len(self._watches) > WATCH_MAX:
            self._watches.popitem(last=False)

    def forget(self, rid: types.RequestId | None) -> None:
        if rid is not None:
            self._watches.pop(_key(rid), None)

    # --- what stdio_server's writer calls --------------------------------------------

    async def write(self, text: str) -> None:
        self._buffer.append(text)

    async def flush(self) -> None:
        text, self._buffer = "".join(self._buffer), []
        if text:
            await self._send(text.encode("utf-8"))
            if self._watches:
                self._report(text)

    # --- our own messages -------------------------------------------------------------

    async def send_message(self, method: str, params: dict[str, Any]) -> None:
        """Write one JSON-RPC notification; returns once the host's pipe has all of it."""
        line = json.dumps({"jsonrpc": "2.0", "method": method, "params": params}, ensure_ascii=False)
        await self._send((line + "\n").encode("utf-8"))

    async def _send(self, data: bytes) -> None:
        async with self._lock:
            try:
                if self._stream is not None:
                    await self._stream.send_all(data)
                else:  # Windows: no non-blocking pipes; a worker thread writes
                    await trio.to_thread.run_sync(_write_all, self._fd, data)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise BrokenPipeError("the host closed its end of stdout") from exc

    def _report(self, text: str) -> None:
        for line in text.splitlines():
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if not isinstance(message, dict) or "id" not in message:
                continue
            written = self._watches.pop(_key(message["id"]), None)
            result = message.get("result")
            if written is not None and isinstance(result, dict) and not result.get("isError"):
                written()

    async def aclose(self) -> None:
        if self._stream is not None:
            await self._stream.aclose()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


@asynccontextmanager
async def open_stdio(stdin: Any = None) -> AsyncIterator[tuple[Any, Any, HostPipe]]:
    """The SDK's stdio transport with stdout replaced by a HostPipe: (read, write, pipe).
    `stdin`: an async iterator of lines to read instead of the SDK's own stdin reader.

    fd 1 is moved to a private descriptor and pointed at stderr while serving (as the SDK
    does), so stray output from this process or its children never reaches the host."""
    private = os.dup(1)
    os.set_inheritable(private, False)
    os.dup2(2, 1)
    pipe = HostPipe(private)
    try:
        async with stdio_server(stdin=stdin, stdout=pipe) as (read_stream, write_stream):  # type: ignore[arg-type]
            yield read_stream, write_stream, pipe
    finally:
        try:
            os.dup2(private, 1)
        except OSError:
            pass
        with trio.CancelScope(shield=True):
            await pipe.aclose()
