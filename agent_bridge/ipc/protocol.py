"""The bridge wire protocol (version 1). Pure data: no Trio, no I/O; the hooks import it.

A frame is a 4-byte big-endian unsigned length N (1 <= N <= MAX_FRAME) followed by N bytes of
UTF-8 JSON holding one object. Every object carries `"v": 1`.

Client -> broker requests:   {"v":1, "id": <int>, "op": "<name>", ...arguments}
Broker -> client responses:  {"v":1, "id": <same int>, "ok": true, "result": <any>}
                             {"v":1, "id": <same int or null>, "ok": false,
                              "error": {"code": "<code>", "message": "<for people>"}}
Broker -> client pushes:     {"v":1, "push": "message", "message": {...}}   (a delivery)
                             {"v":1, "push": "acked", "ids": [...]}         (acked elsewhere)
                             {"v":1, "push": "offered", "ids": [...]}       (offered elsewhere)
                             {"v":1, "push": "identity", "session": {...}}  (who this is now)

The first request on a connection is either `hello` (it becomes a session's connection) or a
control request (`identify`, `stop_check`, `stop_ack`, `wait_active`, `status`, `shutdown`,
`ping`; from the command line also `decide`, `send`, `retract`, `forget`, `connected`,
`answer`) from a hook or the CLI.
A frame that breaks these rules gets an error with code "protocol" and the connection is closed.
`hello` answers {"session": {...}, "hopLimit": n, "secret": "..."}: presenting
"resume": {"id": <session id>, "secret": <that secret>} in a later hello gets that session back.
A hello for a host session id another connection holds with an equal or stronger claim gets
the error code "refused" (try again later), not "bad_request" (fix the request).

An `agent-bridge mcp` relay's first request is `mcp`, with hello's arguments and answer; the
broker then serves the MCP session of the relay's host itself (broker.mcp.host), and the
connection carries the host's JSON-RPC lines, not requests (ipc.frames has them as types):

Relay -> broker:  {"v":1, "relay": "line", "line": "<one JSON-RPC line from the host>"}
                  {"v":1, "relay": "written", "seq": n}   (line n is in the host's pipe)
                  {"v":1, "relay": "acked", "ids": [...]} (it showed these while no broker answered)
                  {"v":1, "relay": "offered", "ids": [...]} (it offered these then: maybe shown)
                  {"v":1, "relay": "ping"}                (keepalive, every 15 s)
                  {"v":1, "relay": "eof"}                 (the host closed stdin)
Broker -> relay:  {"v":1, "push": "line", "line": "<one line for the host's stdout>"}
                  {"v":1, "push": "line", "line": "...", "seq": n, "ids": [...]}
                      (writing it shows messages `ids`: answer "written" once it is written)
                  {"v":1, "push": "identity", "session": {...}}  (who this is now)
                  {"v":1, "push": "held", "message": {...}}      (in this session's inbox;
                      "again": true when a cancelled result puts it back)
                  {"v":1, "push": "acked", "ids": [...]}         (acknowledged: recorded)
The relay keeps the held messages that it has not written, to answer `inbox` itself while no
broker answers (offers and acknowledgements then go to the ledger file), and the ids it wrote
that no "acked" has confirmed; the `mcp` request of its next connection carries those as
"acked": [...] and what it offered as "offered": [...] (together at most 10,000 ids; the rest
follows as frames), recorded before that session's delivery starts: nothing shown twice
unmarked.
A line longer than one frame takes comes in parts, each but the last with `"more": true`.

Line frames as bytes (relay wire 2). A broker that takes them says `"wire": 2` in its answer
to `mcp`. A relay that also does then sends {"v":1, "relay": "wire", "wire": 2} as its first
frame, and from then on both ends may carry a line (a part of one) in a frame whose payload is
not JSON: the line's own UTF-8 bytes after one byte saying what it is.
                  "L" <line>               a line (a line's last part)
                  "l" <part>               a part of a line (whole characters): the rest follows
                  "S" {"seq":n,"ids":[...]} "\n" <line>
                                           (a push) writing it shows messages `ids`
For example, the relay's `ping` line: 00 00 00 29, "L", {"jsonrpc":"2.0","id":1,"method":"ping"}.
Each end reads both forms after `mcp` (a JSON line frame still means the same), and a relay or
broker without wire 2 never sees the bytes form: an older relay is served JSON frames, and
a relay finding an older broker (no "wire" in the answer) sends them.
The relay acknowledges nothing itself: "written" comes after the bytes are in the host's pipe,
and ids it could not report (no broker) go to the ledger file, then to the next broker.

A client need not wait for an answer before its next request: requests on one connection are
carried out and answered in the order they were sent (consecutive sends may share a commit).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from typing import Any, NamedTuple

from agent_bridge.common import jsonlimit, tools

PROTOCOL_VERSION = 1
MAX_FRAME = 1 << 20  # 1 MiB: a decision is at most ~16 KiB, a message body at most 64 KiB
HEADER = struct.Struct(">I")
# The relay connection's line frames as bytes (see the docstring): measured through two relays,
# a line inside a JSON string was escaped by one end and parsed by the other at every hop.
LINES_WIRE = 2
LINE, PART, SHOWS = b"L", b"l", b"S"  # the first byte of a line frame's payload
LINE_TAGS = frozenset(b"LlS")



class Op(NamedTuple):
    """Where a request may come and what resending it does. The broker's handlers (in the
    broker.ops modules, registered with broker.state's `session_op` and `control_op`) are
    checked against this table when they load (broker.ops.handlers)."""

    session: bool  # answered on a session's connection (after `hello`)
    control: bool  # answered as a control request (hooks, the command line)
    idempotent: bool  # carrying it out twice changes nothing: resent after a lost connection


# Every request of the protocol: the one list to extend for a new op. A tool's op comes from
# its entry in agent_bridge.common.tools (a session's request; a control request too for the CLI's).
OPS: dict[str, Op] = {
    "hello": Op(session=False, control=False, idempotent=False),  # turns a connection into a session's
    "mcp": Op(session=False, control=False, idempotent=False),  # the same, for a relay: the broker serves MCP
    **{tool.op: Op(session=True, control=tool.cli, idempotent=tool.idempotent)
       for tool in tools.TOOLS.values() if tool.op is not None},
    "retractions": Op(session=True, control=False, idempotent=True),  # beside `decisions` with history
    "offer": Op(session=True, control=False, idempotent=True),
    "withdraw": Op(session=True, control=False, idempotent=False),
    "ack": Op(session=True, control=False, idempotent=True),
    "learn_identity": Op(session=True, control=False, idempotent=True),
    "ping": Op(session=True, control=True, idempotent=True),
    "status": Op(session=True, control=True, idempotent=True),
    "identify": Op(session=False, control=True, idempotent=False),
    "stop_check": Op(session=False, control=True, idempotent=False),
    "stop_ack": Op(session=False, control=True, idempotent=False),
    "wait_active": Op(session=False, control=True, idempotent=True),  # a wake waiter: until a message waits
    "shutdown": Op(session=False, control=True, idempotent=False),
    "retract": Op(session=False, control=True, idempotent=False),  # `agent-bridge retract`
    "forget": Op(session=False, control=True, idempotent=False),  # `agent-bridge forget`
    "connected": Op(session=False, control=True, idempotent=True),  # `agent-bridge sessions`
    "answer": Op(session=False, control=True, idempotent=False),  # `agent-bridge answer`
    "jobs": Op(session=False, control=True, idempotent=True),  # `agent-bridge jobs`
    "job_cancel": Op(session=False, control=True, idempotent=False),  # `agent-bridge jobs cancel`
}
SESSION_OPS = frozenset(name for name, op in OPS.items() if op.session)
CONTROL_OPS = frozenset(name for name, op in OPS.items() if op.control)
IDEMPOTENT_OPS = frozenset(name for name, op in OPS.items() if op.idempotent)
ALL_OPS = frozenset(OPS)


class ProtocolError(ValueError):
    """A frame that does not follow the protocol. Closes the connection that sent it."""


# One encoder for every frame: `json.dumps` with options builds a new JSONEncoder per call, and
# `JSONEncoder.encode` builds its C encoder (json.encoder.c_make_encoder) per call; this one is
# built once. Without circular-reference markers it keeps no state between calls.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False)
_c_make_encoder: Any = getattr(json.encoder, "c_make_encoder", None)  # None without the C accelerator
_iterencode: Any = _c_make_encoder and _c_make_encoder(
    None, _ENCODER.default, json.encoder.encode_basestring, None, ":", ",", False, False, True
)


def _encode_json(obj: dict[str, Any]) -> str:
    return "".join(_iterencode(obj, 0)) if _iterencode is not None else _ENCODER.encode(obj)


def encode(obj: dict[str, Any]) -> bytes:
    return encode_text(_encode_json(obj))


def encode_json(obj: Any) -> str:
    """A value as a frame writes it: compact JSON, not escaped to ASCII."""
    return _encode_json(obj)


def encode_text(text: str) -> bytes:
    """A frame of JSON text written as `encode` writes its object (parts put together from
    `encode_json`'s text and the rows' own, common.rows.Message.to_json_text)."""
    payload = text.encode("utf-8")
    if len(payload) > MAX_FRAME:
        raise ProtocolError(f"frame of {len(payload)} bytes exceeds the limit of {MAX_FRAME}")
    return HEADER.pack(len(payload)) + payload


def encode_ok(request_id: int, result_text: str) -> bytes:
    """`encode(ok(request_id, result))`, given the result's JSON text as `encode_json` writes it."""
    return encode_text(_OK_HEAD + str(int(request_id)) + ',"ok":true,"result":' + result_text + "}")


_OK_HEAD = '{"v":' + str(PROTOCOL_VERSION) + ',"id":'


def decode_payload(payload: bytes | bytearray) -> dict[str, Any]:
    try:
        obj = jsonlimit.loads(payload)
    except UnicodeDecodeError:
        raise ProtocolError("frame is not valid UTF-8") from None
    except jsonlimit.TooDeep as exc:
        raise ProtocolError(f"frame: {exc}") from None
    except ValueError as exc:
        raise ProtocolError(f"frame is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"frame must hold a JSON object, got {type(obj).__name__}")
    version = obj.get("v")
    if version != PROTOCOL_VERSION or isinstance(version, bool):
        raise ProtocolError(
            f"unsupported protocol version {version!r}; this broker speaks v{PROTOCOL_VERSION}"
        )
    return obj


def encode_line(key: str, line: str, more: bool = False, seq: int | None = None,
                ids: Sequence[str] = ()) -> bytes:
    """A line frame as bytes (relay wire 2): `key` is "relay" or "push" (ipc.frames.Line's
    fields). Raises ProtocolError past MAX_FRAME (ipc.frames.line_frames cuts long lines)."""
    data = line.encode("utf-8")
    if seq is not None:
        head = SHOWS + _encode_json({"seq": seq, "ids": list(ids)}).encode("utf-8") + b"\n"
    else:
        head = PART if more else LINE
    size = len(head) + len(data)
    if size > MAX_FRAME:
        raise ProtocolError(f"frame of {size} bytes exceeds the limit of {MAX_FRAME}")
    return HEADER.pack(size) + head + data


def decode_line(payload: bytes | bytearray, key: str) -> dict[str, Any]:
    """A line frame's payload (relay wire 2) as the JSON frame that means the same, whose "line"
    ipc.frames reads. Raises ProtocolError for bytes that are not UTF-8 or a bad "S" head."""
    tag = payload[:1]
    obj: dict[str, Any] = {"v": PROTOCOL_VERSION, key: "line"}
    start = 1
    if tag == SHOWS:
        end = payload.find(b"\n")
        if end < 0:
            raise ProtocolError("line frame: no end to its head")
        try:
            head = jsonlimit.loads(payload[1:end])
        except ValueError as exc:
            raise ProtocolError(f"line frame: its head is not valid JSON: {exc}") from None
        seq = head.get("seq") if isinstance(head, dict) else None
        if not isinstance(seq, int) or isinstance(seq, bool):
            raise ProtocolError("line frame: its head needs an integer seq")
        ids = head.get("ids")
        obj["seq"], obj["ids"] = seq, ids if isinstance(ids, list) else []
        start = end + 1
    elif tag == PART:
        obj["more"] = True
    try:
        obj["line"] = str(payload[start:], "utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("line frame is not valid UTF-8") from None
    return obj


class FrameDecoder:
    """Incremental decoder: feed bytes, get whole frames. Holds at most one frame's bytes.

    A bad frame raises ProtocolError. Good frames that arrived before it in the same bytes are
    returned first, and the error is raised by the next call (`feed(b"")` raises it without
    new bytes): every request before the bad frame is still answered.
    """

    def __init__(self, max_frame: int = MAX_FRAME, lines: str | None = None) -> None:
        self._buffer = bytearray()
        self._max = max_frame
        self._error: ProtocolError | None = None
        # "relay" or "push": line frames as bytes (relay wire 2) are read too, as those frames
        self.lines = lines

    def feed(self, data: bytes | bytearray) -> list[dict[str, Any]]:
        if self._error is not None:
            raise self._error
        buffer = self._buffer
        buffer += data
        frames: list[dict[str, Any]] = []
        at = 0  # the frames taken are cut from the buffer once, at the end (not one by one)
        try:
            while len(buffer) - at >= HEADER.size:
                (length,) = HEADER.unpack_from(buffer, at)
                try:
                    if length == 0 or length > self._max:
                        raise ProtocolError(f"frame length {length} outside 1..{self._max}")
                    start = at + HEADER.size
                    if len(buffer) - start < length:
                        break
                    at = start + length
                    if self.lines is not None and buffer[start] in LINE_TAGS:
                        frames.append(decode_line(buffer[start:at], self.lines))
                    else:
                        frames.append(decode_payload(buffer[start:at]))
                except ProtocolError as exc:
                    if not frames:
                        raise
                    self._error = exc
                    break
        finally:
            del buffer[:at]
        return frames

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame waiting for the rest."""
        return len(self._buffer)


class BadArguments(ValueError):
    """A well-formed request whose arguments cannot be carried out as sent (text that is not
    valid Unicode). Answered with a `bad_request` error; the connection and the requests
    pipelined behind it go on."""

    def __init__(self, request_id: int, message: str) -> None:
        super().__init__(message)
        self.request_id = request_id


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _plainly_storable(value: Any) -> bool:
    """True when no string in `value` can hold a lone surrogate: `unstorable_text`'s answer for
    the common case, with no path built and no call per ASCII string (`isascii` reads a flag).
    False sends the caller to the full walk, which says where (or finds nothing after all)."""
    kind = type(value)
    if kind is str:
        return value.isascii() or _encodes(value)
    if kind is dict:
        for key in value:
            if type(key) is not str or not (key.isascii() or _encodes(key)):
                return False
        items = value.values()
    elif kind is list:
        items = value
    else:
        return not isinstance(value, (str, dict, list))  # a subclass: the full walk decides
    for item in items:
        if type(item) is str:
            if not (item.isascii() or _encodes(item)):
                return False
        elif isinstance(item, (str, dict, list)) and not _plainly_storable(item):
            return False
    return True


def unstorable_text(value: Any, where: str = "") -> str | None:
    """Where in `value` a string holds a lone surrogate (JSON admits `"\\ud800"`; UTF-8, and so
    SQLite and every reader, cannot hold it), or None."""
    return None if _plainly_storable(value) else _where_unstorable(value, where)


def _where_unstorable(value: Any, where: str) -> str | None:
    if isinstance(value, str):
        return None if _encodes(value) else where or "the text"
    if isinstance(value, dict):
        for key, item in value.items():
            found = _where_unstorable(key, where or "a key") or _where_unstorable(
                item, f"{where}.{key}" if where else str(key)
            )
            if found:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = _where_unstorable(item, f"{where}[{i}]")
            if found:
                return found
    return None


class Request(NamedTuple):
    """A request as its handler takes it."""

    id: int
    op: str
    args: dict[str, Any]  # its arguments: JSON, as the op's handler reads them


def parse_request(obj: dict[str, Any]) -> Request:
    """A request object as (id, op, arguments). Raises ProtocolError, or BadArguments for
    arguments holding text that cannot be stored."""
    request_id = obj.get("id")
    if not isinstance(request_id, int) or isinstance(request_id, bool) or not 0 <= request_id < 2**53:
        raise ProtocolError("request: `id` must be a non-negative integer")
    op = obj.get("op")
    if not isinstance(op, str) or op not in ALL_OPS:
        raise ProtocolError(f"request: unknown op {op!r}")
    args = {k: v for k, v in obj.items() if k not in ("v", "id", "op")}
    where = unstorable_text(args)
    if where is not None:
        raise BadArguments(
            request_id,
            f"{op}: {where} holds a lone surrogate (an unpaired \\ud800-\\udfff escape); text must be valid "
            f"Unicode",
        )
    return Request(request_id, op, args)


def request(request_id: int, op: str, **args: Any) -> dict[str, Any]:
    return {"v": PROTOCOL_VERSION, "id": request_id, "op": op, **args}


def ok(request_id: int, result: Any) -> dict[str, Any]:
    return {"v": PROTOCOL_VERSION, "id": request_id, "ok": True, "result": result}


def error(request_id: int | None, code: str, message: str) -> dict[str, Any]:
    return {"v": PROTOCOL_VERSION, "id": request_id, "ok": False, "error": {"code": code, "message": message}}


def push(kind: str, **fields: Any) -> dict[str, Any]:
    return {"v": PROTOCOL_VERSION, "push": kind, **fields}


class Refused(Exception):
    """The broker will not take this session now: another connection holds its host session id
    with an equal or stronger claim (broker.sessions.identity). Answered with the error code "refused":
    the client tries again later."""


class RemoteError(Exception):
    """An error response from the broker."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
