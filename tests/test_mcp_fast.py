"""The tool calls the broker serves without the MCP SDK's request path (broker.mcp.fast) are
answered exactly as the SDK answers them: the same bytes on the wire for a result, the same
words for a failure. Compared with the installed SDK itself, never with our own encoder."""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp.client import Client
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import methods
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from agent_bridge.broker.mcp.fast import (
    Shape,
    argument_problem,
    cancelled_request,
    error_text,
    log_line,
    result_line,
)
from agent_bridge.broker.mcp.server import serve_lines as _serve_lines
from agent_bridge.common import tools
from tests.test_delivery import RawHost

# Text an answer can carry: any Unicode a message, a name or a decision may hold (never a lone
# surrogate: the store refuses those), control characters and the line separators included.
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=200)
REQUEST_ID = st.one_of(st.integers(min_value=-(2**53), max_value=2**53), TEXT)


def sdk_line(request_id: int | str, texts: list[str], *, is_error: bool, version: str) -> str:
    """The line the SDK sends for this `tools/call` result on a connection that negotiated
    `version` in its handshake: the SDK's steps, with its own functions (mcp.server.runner:
    the result model dumped, then shaped to that version's surface; mcp.shared.
    jsonrpc_dispatcher: a JSONRPCResponse; mcp.server.stdio: `model_dump_json(by_alias=True,
    exclude_unset=True)`)."""
    result = types.CallToolResult(
        content=[types.TextContent(type="text", text=t) for t in texts], is_error=is_error
    )
    dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    shaped = methods.serialize_server_result("tools/call", version, dumped)
    return types.JSONRPCResponse(jsonrpc="2.0", id=request_id, result=shaped).model_dump_json(
        by_alias=True, exclude_unset=True
    )


@pytest.mark.parametrize("version", HANDSHAKE_PROTOCOL_VERSIONS)
@settings(max_examples=150, deadline=None)
@given(request_id=REQUEST_ID, texts=st.lists(TEXT, min_size=1, max_size=3), is_error=st.booleans())
def test_a_result_line_is_the_sdks_to_the_byte(
    version: str, request_id: int | str, texts: list[str], is_error: bool
) -> None:
    """Every protocol version a host can negotiate in its handshake (the only connections the
    fast path serves: see mcp_fast.FastCalls.take)."""
    line = result_line(request_id, texts, is_error=is_error)
    assert line == sdk_line(request_id, texts, is_error=is_error, version=version)


@settings(max_examples=200, deadline=None)
@given(text=TEXT)
def test_a_log_line_is_the_sdks_to_the_byte(text: str) -> None:
    """The arrival notice every message gets (`notifications/message`), against the SDK's
    steps: ServerSession.send_log_message's model dump, then the dispatcher's notification,
    then the stdio writer."""
    notification = types.LoggingMessageNotification(
        params=types.LoggingMessageNotificationParams(level="info", data=text, logger="agent-bridge")
    )
    data = notification.model_dump(by_alias=True, mode="json", exclude_none=True)
    line = types.JSONRPCNotification(jsonrpc="2.0", method=data["method"], params=dict(data["params"]))
    assert log_line("info", "agent-bridge", text) == line.model_dump_json(by_alias=True, exclude_unset=True)


# Any JSON value an argument may carry, booleans beside the numbers they are not.
ARGUMENT_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=3), inner, max_size=2),
    max_leaves=4,
)
# A value of each JSON type a schema names (the ones a plain call carries).
OF_TYPE = {
    "string": st.text(max_size=5), "boolean": st.booleans(), "integer": st.integers(),
    "number": st.integers() | st.floats(allow_nan=False), "array": st.lists(st.text(max_size=3), max_size=2),
    "object": st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
}


@settings(max_examples=600, deadline=None)
@given(tool=st.sampled_from(sorted(tools.TOOLS)), data=st.data())
def test_a_tool_s_shape_judges_arguments_as_argument_problem_does(tool: str, data: st.DataObject) -> None:
    """`Shape.plain`, read once from the tool's schema for the calls served beside the SDK,
    takes exactly the arguments `argument_problem` finds nothing wrong with and that hold every
    required one. Each argument the tool takes is left out, or given a value of its type, a
    boolean (never a number), or any JSON value; sometimes one it does not take is added."""
    schema = tools.TOOLS[tool].schema
    arguments: dict[str, Any] = {}
    for name, spec in schema.get("properties", {}).items():
        kind = spec.get("type")
        value = data.draw(st.sampled_from(["absent", "typed", "boolean", "any"]), label=name)
        if value == "typed" and kind in OF_TYPE:
            arguments[name] = data.draw(OF_TYPE[kind])
        elif value == "boolean":
            arguments[name] = data.draw(st.booleans())
        elif value == "any":
            arguments[name] = data.draw(ARGUMENT_VALUES)
    if data.draw(st.integers(0, 9), label="unknown") == 0:
        arguments[data.draw(st.sampled_from(["unknown", "Text", ""]))] = data.draw(ARGUMENT_VALUES)
    expected = (argument_problem(tool, schema, arguments) is None
                and set(schema.get("required", [])) <= set(arguments))
    assert Shape.of(schema).plain(arguments) == expected


def test_the_sdk_line_helper_is_what_the_sdk_writes_for_a_tool() -> None:
    """The comparison above is only as good as `sdk_line`: here it is checked against a real
    tool call served by the SDK's low-level Server (the broker's) over the relay's stdio (the
    same writer the broker uses)."""
    text = 'a "quoted" line\u2028with a separator, é, 🙂, \x01 and a \\ backslash'

    async def probe(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        return types.CallToolResult(content=[types.TextContent(type="text", text=text),
                                             types.TextContent(type="text", text="second")])

    answers = _sdk_answers(Server("probe", on_call_tool=probe), {"name": "probe", "arguments": {}})
    assert answers[-1] == json.loads(sdk_line(2, [text, "second"], is_error=False, version=VERSION))


def test_a_failure_is_worded_as_the_sdk_words_it() -> None:
    """A ToolError keeps its reason after the SDK's prefix; anything else (a bug) tells the
    host nothing of itself. Both against the SDK's own tool layer (MCPServer's, which served
    the broker's tools before; its words are what hosts have seen since)."""
    server = MCPServer("probe")

    @server.tool(structured_output=False)
    async def refuses() -> str:
        raise ToolError("to: no session is addressed by 'nobody'")

    @server.tool(structured_output=False)
    async def crashes() -> str:
        raise RuntimeError("a secret from inside the broker")

    async def call(name: str) -> types.CallToolResult:
        async with Client(server) as client:  # the SDK's in-process client
            return await client.call_tool(name, {})

    refused = trio.run(call, "refuses")
    expected = error_text("refuses", ToolError("to: no session is addressed by 'nobody'"))
    assert refused.is_error and [c.text for c in refused.content] == [expected]  # type: ignore[union-attr]
    crashed = trio.run(call, "crashes")
    assert crashed.is_error and [c.text for c in crashed.content] == [  # type: ignore[union-attr]
        error_text("crashes", RuntimeError("a secret"))
    ]
    assert "secret" not in crashed.model_dump_json()


VERSION = "2025-06-18"  # a handshake-era version (each is checked byte for byte above)


def _sdk_answers(server: Server[Any], params: dict[str, Any]) -> list[Any]:
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}}
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params}
    return trio.run(_serve_lines, server, "other", [initialize, call], 2)


@pytest.mark.slow
async def test_what_the_fast_path_leaves_is_the_sdks_and_answered_alike(broker, env, home) -> None:
    """Through a real `agent-bridge mcp`: `whoami` served straight from its line and the same
    call written so that only the SDK takes it (`"arguments": null`) get the same answer; a
    call carrying the protocol's 2026 `_meta` envelope on a handshake connection is the SDK's
    to refuse (JSON-RPC INVALID_REQUEST), not served."""
    with trio.fail_after(60):
        host = await RawHost.start(env, "--project", "/w/fast", "--host-session-id", "hs-fast")
        try:
            plain = await host.response(await host.request("tools/call", host.call_tool("whoami")))
            by_sdk = await host.response(
                await host.request("tools/call", {"name": "whoami", "arguments": None})
            )
            assert plain == by_sdk
            assert json.loads(plain["content"][0]["text"])["hostSessionId"] == "hs-fast"

            rid = await host.request("tools/call", {"name": "whoami", "arguments": {}, "_meta": {
                types.PROTOCOL_VERSION_META_KEY: "2026-07-28"}})
            while rid not in host.responses:
                assert await host._read_one()
            assert host.responses[rid]["error"]["code"] == types.INVALID_REQUEST, host.responses[rid]
        finally:
            await host.close()


def _sdk_cancelled_request(line: str) -> Any:
    """What the SDK takes from a host line as the id of a cancelled request, None if it sees
    no cancel there: its own parser (as its stdio server reads lines) and its own rule."""
    from mcp.shared.jsonrpc_dispatcher import cancelled_request_id_from_params
    from pydantic import ValidationError

    try:
        message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValidationError:
        return None
    if not isinstance(message, types.JSONRPCNotification) or message.method != "notifications/cancelled":
        return None
    return cancelled_request_id_from_params(message.params)


_ids = st.one_of(st.integers(-(2**53), 2**53), st.text(max_size=8), st.booleans(), st.floats(allow_nan=False),
                 st.none(), st.lists(st.integers(), max_size=2))


@settings(max_examples=300, deadline=None)
@given(
    jsonrpc=st.sampled_from(["2.0", "1.0", 2, None]),
    method=st.sampled_from(["notifications/cancelled", "notifications/progress", "tools/call", None]),
    with_id=st.booleans(),
    params=st.one_of(st.fixed_dictionaries({}, optional={"requestId": _ids, "reason": st.text(max_size=5)}),
                     st.lists(st.integers(), max_size=2), st.none(), st.just("x")),
)
def test_a_cancel_is_recognised_exactly_as_the_sdk_recognises_it(jsonrpc, method, with_id, params):
    """The broker takes a crossed result back in order with the relay's frames (Bridge.crossed_by),
    before the SDK reads the cancel: it must see the same cancels, with the same request ids."""
    message: dict[str, Any] = {}
    if jsonrpc is not None:
        message["jsonrpc"] = jsonrpc
    if method is not None:
        message["method"] = method
    if with_id:
        message["id"] = 9
    if params is not None:
        message["params"] = params
    line = json.dumps(message)
    assert cancelled_request(line) == _sdk_cancelled_request(line)
