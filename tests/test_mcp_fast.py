"""The tool calls the broker serves without the MCP SDK's request path (broker.mcp.fast) are
answered exactly as the SDK answers them: the same bytes on the wire for a result, the same
words for a failure. Compared with the installed SDK itself, never with our own encoder."""

from __future__ import annotations

import json
from functools import partial
from types import SimpleNamespace
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
from trio.testing import wait_all_tasks_blocked

from agent_bridge import __version__
from agent_bridge.broker.mcp.fast import (
    FastCalls,
    Shape,
    argument_problem,
    cancelled_request,
    error_text,
    log_line,
    modern_stamp,
    result_line,
)
from agent_bridge.broker.mcp.server import serve_lines as _serve_lines
from agent_bridge.common import tools
from tests.test_delivery import MODERN_META, RawHost

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


# --- the 2026 protocol: no handshake, every request with its envelope in `_meta` -----------------


@settings(max_examples=60, deadline=None)
@given(request_id=REQUEST_ID, texts=st.lists(TEXT, min_size=1, max_size=3), is_error=st.booleans(),
       version=TEXT)
def test_a_2026_result_line_is_the_sdks_to_the_byte(
    request_id: int | str, texts: list[str], is_error: bool, version: str
) -> None:
    """On a connection of the 2026 protocol the SDK adds `resultType` and its `serverInfo` stamp
    to a result (`modern_stamp`): against the line of a real call the SDK's low-level Server
    serves, its envelope in `_meta`, whatever the server's version string holds."""

    async def probe(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        return types.CallToolResult(content=[types.TextContent(type="text", text=t) for t in texts],
                                    is_error=is_error)

    server = Server("agent-bridge", version=version, on_call_tool=probe)
    call = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
            "params": {"name": "probe", "arguments": {}, "_meta": MODERN_META}}
    (line,) = trio.run(partial(_serve_lines, server, "other", [call], 1, raw=True))
    stamp = modern_stamp(server.server_info_stamp)
    assert result_line(request_id, texts, is_error=is_error, stamp=stamp) == line


class _Pipe:
    """Where FastCalls writes its answers: what it uses of the relay's pipe (mcp_sdk.RelayPipe)."""

    def __init__(self) -> None:
        self.lines: dict[Any, str] = {}

    async def send_response(self, request_id: Any, line: str, *, shows: bool) -> None:
        self.lines[request_id] = line


async def served_beside_the_sdk(lines: list[str], handshake: str | None = None) -> list[bool]:
    """Which of a host's `tools/call` lines, in order, one session's FastCalls serves beside the
    SDK (the tools' bodies and the relay's pipe stand in): a host that initialized with the
    version `handshake`, else one of the 2026 protocol, the SDK having accepted the envelope of
    each line it was left (`sdk_called`, as the SDK's call of the tool does)."""
    async def body(bridge: Any, call: Any, **arguments: Any) -> list[str]:
        return ["done"]

    taken = []
    async with trio.open_nursery() as nursery:
        initialized = None if handshake is None else SimpleNamespace(protocol_version=handshake)
        bridge = SimpleNamespace(pipe=_Pipe(), mcp_session=initialized)
        fast = FastCalls(bridge, nursery, dict.fromkeys(tools.TOOLS, body),
                         {name: tool.schema for name, tool in tools.TOOLS.items()})
        for line in lines:
            taken.append(fast.take(line))
            if not taken[-1]:
                session = initialized or SimpleNamespace(protocol_version="2026-07-28")
                fast.sdk_called(json.loads(line)["id"], session, modern=handshake is None)
                bridge.mcp_session = session
        await wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    return taken


def _call(rid: int, meta: dict[str, Any] | None) -> str:
    params: dict[str, Any] = {"name": "whoami", "arguments": {}}
    if meta is not None:
        params["_meta"] = meta
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params})


async def test_a_2026_call_is_served_beside_the_sdk_only_with_an_envelope_the_sdk_accepted() -> None:
    """`FastCalls.take` on one session's lines (the tool's body and the relay's pipe stand in
    for the session's): a call whose envelope the SDK has not accepted for this session is the
    SDK's, and noted; once the SDK called the tool for it on a 2026 connection, a call with the
    same envelope is served here, with the SDK's session of that envelope and its answer stamped
    as that era's. Another envelope, none, or one accepted on a handshake-era connection (where
    the SDK refuses them) stay the SDK's."""
    served: list[Any] = []

    async def whoami(bridge: Any, call: Any, **arguments: Any) -> list[str]:
        served.append(call)
        return ["me"]

    other = {**MODERN_META, "io.modelcontextprotocol/clientInfo": {"name": "claude-code", "version": "9"}}
    modern_session = SimpleNamespace(protocol_version="2026-07-28")
    async with trio.open_nursery() as nursery:
        bridge = SimpleNamespace(pipe=_Pipe(), mcp_session=None)
        fast = FastCalls(bridge, nursery, {"whoami": whoami}, {"whoami": tools.TOOLS["whoami"].schema})
        fast.modern = modern_stamp({"name": "agent-bridge", "version": "1"})
        assert not fast.take(_call(1, MODERN_META))  # not judged yet
        fast.sdk_called(1, modern_session, modern=True)  # the SDK accepted it, and serves it
        bridge.mcp_session = modern_session
        assert fast.take(_call(2, MODERN_META))
        assert not fast.take(_call(3, other))
        assert not fast.take(_call(4, None))  # the SDK refuses a call without its envelope here
        assert not fast.take(_call(5, {"progressToken": 5}))
        fast.sdk_called(3, SimpleNamespace(protocol_version="2026-07-28"), modern=True)
        assert fast.take(_call(6, other))
        await wait_all_tasks_blocked()

        handshake = SimpleNamespace(pipe=_Pipe(), mcp_session=SimpleNamespace(protocol_version="2025-11-25"))
        legacy = FastCalls(handshake, nursery, {"whoami": whoami}, {"whoami": tools.TOOLS["whoami"].schema})
        legacy.modern = fast.modern
        assert not legacy.take(_call(1, MODERN_META))
        legacy.sdk_called(1, handshake.mcp_session, modern=False)  # (the SDK refuses it there)
        assert not legacy.take(_call(2, MODERN_META))
        assert legacy.take(_call(3, None))
        await wait_all_tasks_blocked()
    calls = {(c.request_id, c.stamp): c.session for c in served}  # (each in a task of its own: any order)
    assert calls == {(2, fast.modern): modern_session, (6, fast.modern): fast.envelopes[1][1],
                     (3, ""): handshake.mcp_session}
    assert len(served) == 3
    assert bridge.pipe.lines == {
        rid: result_line(rid, ["me"], is_error=False, stamp=fast.modern) for rid in (2, 6)}
    assert handshake.pipe.lines == {3: result_line(3, ["me"], is_error=False)}


@pytest.mark.slow
async def test_a_2026_host_is_answered_beside_the_sdk_as_the_sdk_answers_it(broker, env) -> None:
    """Through a real `agent-bridge mcp`, a host of the 2026 protocol (a `server/discover`
    probe, then every request with its envelope, as Claude Code 2.1.332 with a broker running):
    `whoami` served by the SDK (the session's first call) and again beside it get the same
    result, stamped as that era's; a `send` to itself and the `inbox` that shows it work beside
    it too. A request without the envelope, or with a version the SDK does not serve, is still
    the SDK's to refuse."""
    with trio.fail_after(60):
        host = await RawHost.start_modern(env, "--project", "/w/fast-2026",
                                          "--host-session-id", "hs-fast-2026")
        try:
            async def call(name: str, meta: dict[str, Any] | None = MODERN_META, **arguments: Any) -> Any:
                params: dict[str, Any] = {"name": name, "arguments": arguments}
                if meta is not None:
                    params["_meta"] = meta
                return await host.answer(await host.request("tools/call", params))

            by_sdk, beside = await call("whoami"), await call("whoami")
            assert by_sdk["result"] == beside["result"]
            assert by_sdk["result"]["resultType"] == "complete"
            assert by_sdk["result"]["_meta"] == {
                "io.modelcontextprotocol/serverInfo": {"name": "agent-bridge", "version": __version__}}
            me = json.loads(beside["result"]["content"][0]["text"])
            sent = await call("send", to=me["id"], text="to myself, beside the SDK")
            assert sent["result"]["isError"] is False, sent
            mid = json.loads(sent["result"]["content"][0]["text"])["message"]["id"]
            shown = await call("inbox", wait_seconds=10)
            assert [m["id"] for m in json.loads(shown["result"]["content"][0]["text"])] == [mid]
            assert shown["result"]["_meta"] == by_sdk["result"]["_meta"]

            bare = await call("whoami", meta=None)
            assert bare["error"]["code"] == types.INVALID_PARAMS, bare
            unserved = await call("whoami",
                                  meta={**MODERN_META, types.PROTOCOL_VERSION_META_KEY: "2099-01-01"})
            assert unserved["error"]["code"] == types.UNSUPPORTED_PROTOCOL_VERSION, unserved
        finally:
            await host.end()
