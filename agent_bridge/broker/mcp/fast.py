"""Tool calls served straight from the host's line, beside the MCP SDK (broker.mcp.host).

The SDK's way from a line to its answer (parse the line into pydantic models, a task and a
context per request, its middleware, result models, serialize them again) costs more than the
tool's own work. Measured through the relays (bench/bench_mcp_tool_call.py, the same run, with
and without this module, alternately three times, 2026-12): a `send` + `inbox` pair's p50 was
1.7-2.2 ms with it and 2.7-3.9 ms without, `decisions` 4.8-6.4 ms against 5.5-8.1 ms. So a
`tools/call` of one of the session's own tools is served here when everything about it is
plain: the line holds no escaped surrogate, the request has only the fields JSON-RPC gives
it, the tool is ours, its arguments are exactly what the tool's advertised schema asks for
(`argument_problem` finds nothing, nothing required is missing), and the connection's era is
known:
- the handshake era: the host has initialized, and the request carries none of the protocol's
  reserved `_meta` keys (the SDK refuses the 2026 envelope there);
- the 2026 protocol (no handshake; Claude Code 2.1.332 speaks it to a running broker): the
  request's envelope (its reserved `_meta` keys) is one the SDK already accepted for a tool call
  of this session (`FastCalls.sdk_called`). The SDK judges an envelope the same way each time,
  and a host sends the same one with every request. Before that, every call is the SDK's: the
  SDK's own way cost the broker 1.2 ms of CPU a message through two relays against 0.18 ms here
  (docs/performance.md, stop 62).
The tool's body is the one the SDK runs (broker.mcp.calls' `TOOL_BODIES`; a `send` is queued and
runs the same op with the others queued, broker.mcp.sends), and the answer is the one the SDK
would write for the connection's era (`result_line`, with `modern_stamp` in the 2026 protocol:
tests/test_mcp_fast.py checks both against the SDK's own lines).

Everything else goes to the SDK as before: the handshake, `tools/list`, every notification,
a call to another tool or with anything unusual in it (an unknown argument, a value of the
wrong type, a missing one, a reused request id), answered through the SDK by the server's
own handler (mcp_host.call_tool: the same argument checks and words).
A `notifications/cancelled` for a call served here stops it (it is then never answered, as
the SDK does for its own), and still goes on to the SDK, whose cancel hook does the rest
(Bridge.request_cancelled: an answer already written is offered again as a repeat).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NamedTuple

import trio
from mcp.server.mcpserver.exceptions import ToolError

from agent_bridge.broker.mcp import sdk as mcp_sdk
from agent_bridge.common import jsonlimit
from agent_bridge.core import showing

log = logging.getLogger("agent_bridge.mcp")


class ToolCall(NamedTuple):
    """What a tool's body needs of the request beyond its arguments."""

    request_id: int | str | None  # the JSON-RPC id, as the host sent it
    meta: Any  # the request's `_meta`: a dict here, the SDK's model there (Codex puts its thread id in it)
    session: Any  # the SDK's ServerSession: of the host's handshake, or of the request's 2026 envelope
    # What a result adds after `isError` on a connection of the 2026 protocol (`modern_stamp`);
    # nothing on one of the handshake era
    stamp: str = ""


# `_meta` keys of the protocol's own (mcp_types.PROTOCOL_VERSION_META_KEY, ...)
RESERVED_META = "io.modelcontextprotocol/"
ENVELOPES_MAX = 8  # 2026 envelopes the SDK accepted, kept per session (a host sends one, the same each time)
UNCHECKED_MAX = 64  # 2026 requests left to the SDK whose envelope is not known accepted yet

# A tool's body: (the session's Bridge, the call, **arguments) -> the result's text blocks.
Body = Callable[..., Awaitable[list[str]]]


JSON_TYPES: dict[str, tuple[type, ...]] = {
    "boolean": (bool,), "string": (str,), "integer": (int,), "number": (int, float),
    "object": (dict,), "array": (list,),
}


def argument_problem(tool: str, schema: Any, arguments: Any) -> str | None:
    """What is wrong with a tool call's arguments, judged by the tool's advertised input
    schema as the host reads it (SPEC §5): an argument it does not list, or a value not of
    its JSON type (no "yes" or 1 for a boolean, no "0" for a number), or a required one
    missing. None if nothing is. One line, in the project's words (never the validation
    library's dump)."""
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return f"{tool}: arguments must be an object"
    properties = schema.get("properties", {}) if isinstance(schema, dict) else {}
    for name, value in arguments.items():
        if name not in properties:
            known = ", ".join(sorted(properties)) or "none"
            return f"{tool}: unknown argument {name!r} (it takes: {known})"
        expected = properties[name].get("type") if isinstance(properties[name], dict) else None
        if not isinstance(expected, str) or expected not in JSON_TYPES:
            continue  # any value (a scope): the broker judges it
        if not isinstance(value, JSON_TYPES[expected]) or (isinstance(value, bool) and expected != "boolean"):
            wanted = "true or false" if expected == "boolean" else f"a JSON {expected}"
            return f"{name}: expected {wanted}, got {json.dumps(value, ensure_ascii=False)}"
    required = schema.get("required", []) if isinstance(schema, dict) else []
    missing = [name for name in required if name not in arguments]
    if missing:
        s = "s" if len(missing) > 1 else ""
        return (f"{tool}: missing required argument{s} {', '.join(missing)} "
                f"(it takes: {', '.join(sorted(properties))})")
    return None


class Shape(NamedTuple):
    """What `argument_problem` reads of a tool's schema, read once: each argument's JSON types
    (None: any value), and the required ones. `plain` asks what `argument_problem` and the
    required ones ask, for the calls served here (every `send` passes through it)."""

    types: dict[str, tuple[type, ...] | None]
    required: frozenset[str]

    @classmethod
    def of(cls, schema: Any) -> Shape:
        properties = schema.get("properties", {}) if isinstance(schema, dict) else {}
        types: dict[str, tuple[type, ...] | None] = {}
        for name, spec in properties.items():
            expected = spec.get("type") if isinstance(spec, dict) else None
            types[name] = JSON_TYPES.get(expected) if isinstance(expected, str) else None
        required = schema.get("required", []) if isinstance(schema, dict) else []
        return cls(types, frozenset(required))

    def plain(self, arguments: dict[str, Any]) -> bool:
        """Whether `argument_problem` finds nothing wrong with `arguments` (a dict) and every
        required one is there."""
        types = self.types
        for name, value in arguments.items():
            if name not in types:
                return False
            expected = types[name]
            if expected is None:
                continue
            if not isinstance(value, expected) or type(value) is bool and expected is not _BOOLEAN:
                return False
        return self.required <= arguments.keys()


_BOOLEAN = JSON_TYPES["boolean"]


def drop_null_optionals(schema: Any, arguments: Any) -> Any:
    """The arguments without the optional ones given as JSON null, which count as absent (SPEC
    §5: models send that). A required one given as null stays, for `argument_problem` to refuse."""
    if not isinstance(arguments, dict) or None not in arguments.values():
        return arguments
    required = schema.get("required", []) if isinstance(schema, dict) else []
    return {k: v for k, v in arguments.items() if v is not None or k in required}


# `json.dumps(value, ensure_ascii=False)`'s text, from a C encoder built once: `json.dumps` with
# an option builds a JSONEncoder and its C encoder at every call, which measured (2026-12-05) as
# much as the encoding of a `send` result itself; a message through two relays had five such
# calls. Without the C accelerator, json.dumps itself.
_TEXT_ENCODER = json.JSONEncoder(ensure_ascii=False, check_circular=False)
_c_make_encoder: Any = getattr(json.encoder, "c_make_encoder", None)
_text_iterencode: Any = _c_make_encoder and _c_make_encoder(
    None, _TEXT_ENCODER.default, json.encoder.encode_basestring, None, ": ", ", ", False, False, True
)
_string: Callable[[str], str] = json.encoder.encode_basestring  # a str as JSON, not escaped to ASCII (C)


class JSONText(str):
    """A tool's text that the JSON encoder wrote (`text_json`, or the rows' own text put together
    as it would: common.rows.Message.to_json_text). The encoder leaves no control character
    raw, so as a JSON string (`result_line`) only its quotes and backslashes need escaping: two
    passes of `str.replace` in C, where `encode_basestring` costs ~35 instructions a character
    (a message's `send` answer and its `inbox` result are ~700 characters each)."""


def text_json(value: Any) -> JSONText:
    """`json.dumps(value, ensure_ascii=False)`, byte for byte (a tool's JSON text)."""
    if _text_iterencode is None:
        return JSONText(json.dumps(value, ensure_ascii=False))
    return JSONText("".join(_text_iterencode(value, 0)))


def _text_string(text: str) -> str:
    """`text` as a JSON string, as `encode_basestring` writes it (see JSONText)."""
    if type(text) is JSONText:
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return _string(text)


def _rid(request_id: int | str) -> str:
    return _string(request_id) if isinstance(request_id, str) else str(int(request_id))


def result_line(request_id: int | str, texts: list[str], *, is_error: bool, stamp: str = "") -> str:
    """A `tools/call` answer of text blocks, byte for byte as the SDK puts it on the wire: shaped
    by the version's result model (which lists `text` before `type`), then compact JSON with the
    text as it is (`model_dump_json`), and on a connection of the 2026 protocol the members the
    SDK adds after `isError` (`stamp`: `modern_stamp`). Put together from its strings, each
    escaped once in C: the same bytes as the compact `json.dumps` of the object."""
    content = ",".join(['{"text":' + _text_string(text) + ',"type":"text"}' for text in texts])
    return ('{"jsonrpc":"2.0","id":' + _rid(request_id) + ',"result":{"content":[' + content
            + ('],"isError":true' if is_error else '],"isError":false') + stamp + "}}")


def modern_stamp(server_info: dict[str, Any]) -> str:
    """What the SDK adds to a result on a connection of the 2026 protocol (mcp.server.runner
    `_serialize`): `resultType` "complete" (required from 2026-07-28), then `_meta` holding the
    server's `serverInfo` stamp (`Server.server_info_stamp`), as the members after `isError`."""
    meta = {RESERVED_META + "serverInfo": server_info}
    return ',"resultType":"complete","_meta":' + json.dumps(meta, ensure_ascii=False, separators=(",", ":"))


def log_line(level: str, logger: str, data: str) -> str:
    """A `notifications/message` (MCP logging) of text, byte for byte as the SDK's
    `ServerSession.send_log_message` puts it on the wire on a handshake-era connection; the
    SDK's way there (models, a memory channel, its writer task) cost more than the message's
    whole delivery to the session's inbox. Put together as `result_line` is."""
    return ('{"jsonrpc":"2.0","method":"notifications/message","params":{"level":' + _string(level)
            + ',"logger":' + _string(logger) + ',"data":' + _string(data) + "}}")


def error_text(tool: str, exc: BaseException | None) -> str:
    """A failed call's text, as the SDK's tool layer words it: a ToolError keeps its reason,
    anything else (a bug) says nothing of itself to the host."""
    return (
        f"Error executing tool {tool}: {exc}"
        if isinstance(exc, ToolError)
        else f"Error executing tool {tool}"
    )


def cancelled_request(line: str) -> Any | None:
    """The request id a host's `notifications/cancelled` line names, as the SDK would take it
    (JSON-RPC 2.0, a notification, an integer or string `requestId`); None for any other line."""
    try:
        message = jsonlimit.loads(line)
    except ValueError:
        return None
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0" or "id" in message:
        return None
    params = message.get("params")
    if message.get("method") != "notifications/cancelled" or not isinstance(params, dict):
        return None
    rid = params.get("requestId")
    return rid if isinstance(rid, (int, str)) and not isinstance(rid, bool) else None


_PARAMS = frozenset({"name", "arguments", "_meta"})  # what a plain `tools/call` request's params hold


class FastCalls:
    """The session's calls served here (see the module's docstring), each in its own task in
    `nursery`, as the SDK runs each request in one: an `inbox` that waits holds up nothing. A
    tool with a queue (`queues`: `send`, broker.mcp.sends) has its calls queued there instead."""

    def __init__(self, bridge: Any, nursery: trio.Nursery, bodies: Mapping[str, Body],
                 schemas: Mapping[str, Any]) -> None:
        self.bridge = bridge  # mcp_host.Bridge: its pipe, its MCP session
        self.nursery = nursery
        self.bodies = bodies
        self.schemas = schemas
        self.shapes = {name: Shape.of(schemas.get(name)) for name in bodies}  # read once
        # request id (as JSON) -> what a cancel stops: its task's cancel scope, or its place in a queue
        self.running: dict[str, Any] = {}
        # tool -> where its plain calls are queued instead of run in a task each (broker.mcp.sends):
        # (request id as JSON, arguments, call) -> what a cancel of it stops
        self.queues: dict[str, Callable[[str, dict[str, Any], ToolCall], Any]] = {}
        # tool -> where a call of it that goes to the SDK keeps its place in that queue:
        # (request id as JSON) -> what a cancel of it stops
        self.places: dict[str, Callable[[str], Any]] = {}
        # The 2026 protocol (no handshake: every request carries its envelope in `_meta`). The
        # SDK judges an envelope (a supported version, the client's capabilities and info); one
        # it accepted for a tool call of this session is the same judgment every time, so a call
        # carrying an envelope equal to one of `envelopes` is served here, with the SDK's session
        # object of that envelope, its answer stamped as the SDK stamps it (`modern`, set by the
        # session: modern_stamp). A call with an envelope not seen yet goes to the SDK, and is
        # noted in `unchecked` until the SDK calls the tool (`sdk_called`): then the SDK accepted
        # that envelope on a connection of the 2026 era.
        self.modern = ""
        self.envelopes: list[tuple[dict[str, Any], Any]] = []  # (envelope, the SDK's session of it)
        self.unchecked: dict[str, dict[str, Any]] = {}

    def take(self, line: str) -> bool:
        """Serve `line` here if it is a plain call of one of the session's tools; False: the
        SDK's to answer (a cancel for a call served here is stopped, and the SDK's too). A call
        of a tool with a queue that goes to the SDK keeps its place in that queue (`places`)."""
        if self.bridge.pipe is None or "\\ud" in line or "\\uD" in line:
            return False  # a lone surrogate is mcp_stdin's to answer
        if '"tools/call"' not in line and '"notifications/cancelled"' not in line:
            return False
        try:
            message = jsonlimit.loads(line)
        except ValueError:
            return False
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            return False
        method = message.get("method")
        if method == "notifications/cancelled":
            self._cancel(message.get("params"))
            return False
        # exactly jsonrpc, id, method and params (jsonrpc and method are there: checked above)
        if method != "tools/call" or len(message) != 4 or "id" not in message or "params" not in message:
            return False
        request_id, params = message["id"], message["params"]
        if isinstance(request_id, bool) or not isinstance(request_id, (int, str)):
            return False
        key = showing.key(request_id)
        if key in self.running:
            return False  # a request id in use: the SDK's to refuse
        if self._serve_plain(key, request_id, params):
            return True
        name = params.get("name") if isinstance(params, dict) else None
        keep_place = self.places.get(name) if isinstance(name, str) else None
        if keep_place is not None:  # the SDK's call of it will come, or its answer without one
            self.running[key] = keep_place(key)
        return False

    def _serve_plain(self, key: str, request_id: int | str, params: Any) -> bool:
        """Serve a `tools/call` request (`params`) here if everything about it is plain."""
        if not isinstance(params, dict) or not params.keys() <= _PARAMS:
            return False
        meta = params.get("_meta")
        if meta is not None and not isinstance(meta, dict):
            return False
        envelope = {k: v for k, v in meta.items() if k.startswith(RESERVED_META)} if meta else None
        if envelope:
            session = next((s for e, s in self.envelopes if e == envelope), None)
            if session is None:  # the SDK's to judge (a handshake connection refuses it)
                self._unchecked(key, envelope)
                return False
            stamp = self.modern
        else:
            session, stamp = self.bridge.mcp_session, ""
            if session is None or not mcp_sdk.handshake_era(session):
                # before the SDK has seen the handshake end; or a connection of the 2026
                # protocol, whose SDK refuses a request without its envelope
                return False
        name = params.get("name")
        arguments = params.get("arguments", {})
        if not isinstance(name, str) or name not in self.bodies or not isinstance(arguments, dict):
            return False
        if None in arguments.values():
            arguments = drop_null_optionals(self.schemas.get(name), arguments)
        if not self.shapes[name].plain(arguments):
            return False
        call = ToolCall(request_id, meta, session, stamp)
        queue = self.queues.get(name)
        if queue is not None:
            self.running[key] = queue(key, arguments, call)
            return True
        scope = self.running[key] = trio.CancelScope()
        self.nursery.start_soon(self._serve, key, name, self.bodies[name], arguments, call, scope)
        return True

    def _unchecked(self, key: str, envelope: dict[str, Any]) -> None:
        if len(self.unchecked) >= UNCHECKED_MAX:  # the SDK refused those: the oldest goes
            del self.unchecked[next(iter(self.unchecked))]
        self.unchecked[key] = envelope

    def sdk_called(self, request_id: Any, session: Any, modern: bool) -> None:
        """The SDK calls a tool for the request `request_id`, with its `session`, on a connection
        of the 2026 protocol (`modern`) or of the handshake era: an envelope noted for it was
        accepted."""
        envelope = self.unchecked.pop(showing.key(request_id), None)
        if envelope is not None and modern and all(e != envelope for e, _ in self.envelopes):
            self.envelopes = [*self.envelopes[-(ENVELOPES_MAX - 1):], (envelope, session)]

    def _cancel(self, params: Any) -> None:
        if isinstance(params, dict) and "requestId" in params:
            scope = self.running.get(showing.key(params["requestId"]))
            if scope is not None:
                scope.cancel()

    async def _serve(self, key: str, name: str, body: Body, arguments: dict[str, Any], call: ToolCall,
                     scope: trio.CancelScope) -> None:
        texts: list[str] = []
        failure: BaseException | None = None
        try:
            with scope:
                try:
                    texts = await body(self.bridge, call, **arguments)
                except Exception as exc:  # noqa: BLE001 - answered as the SDK answers it
                    failure = exc
                    if not isinstance(exc, ToolError):
                        log.exception("tool %r raised an unexpected exception", name)
        finally:
            del self.running[key]
        if scope.cancel_called:
            return  # the host cancelled it: never answered
        assert call.request_id is not None
        if failure is not None:
            line = result_line(call.request_id, [error_text(name, failure)], is_error=True, stamp=call.stamp)
        else:
            line = result_line(call.request_id, texts, is_error=False, stamp=call.stamp)
        try:
            await self.bridge.pipe.send_response(call.request_id, line, shows=failure is None)
        except BrokenPipeError:
            pass  # the relay went away: the session ends with its connection
