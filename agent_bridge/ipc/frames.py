"""A session connection's frames as types: typed inside, JSON at the edge (ipc.protocol has the
wire itself: the framing, the requests, the answers). Standard library only: the relay imports it.

Two families, each with one encoder and one decoder:

- relay frames (`"relay": <kind>`), from an `agent-bridge mcp` relay to the broker once its `mcp`
  request is answered: `Line`, `Written`, `Acked`, `Offered`, `Ping`, `Eof`, `Wire`
  (`relay_frame`, `read_relay`);
- pushes (`"push": <kind>`), from the broker to a session's connection: `Line`, `Held`, `Acked`,
  `Offered`, `Identity`, `Delivery` (`push_frame`, `read_push`).

`Line`, `Acked` and `Offered` have the same fields in both. A line longer than one frame takes
goes in parts (`line_frames`; `LineParts` joins them again). The decoders are as lenient as the
readers were before they had types: the broker refuses a relay frame it cannot use (the relay is
a program of ours: a wrong frame is a bug or a stranger), the relay skips a push it cannot use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias

from agent_bridge.ipc.protocol import PROTOCOL_VERSION, ProtocolError, encode, encode_line, encode_text

if TYPE_CHECKING:  # the relay reads frames too, and needs no rows
    from agent_bridge.common.rows import Message

# Characters of a line per frame: at most 800 KB of UTF-8 (4 bytes a character), under MAX_FRAME.
LINE_PART = 200_000


class Line(NamedTuple):
    """One JSON-RPC line of the host's (relay -> broker) or for it (broker -> relay), or a part."""

    line: str
    more: bool = False  # a part: the rest of the line follows
    seq: int | None = None  # (a push) writing it shows messages `ids`: answer Written(seq) once written
    ids: Sequence[str] = ()


class Written(NamedTuple):
    """The relay wrote line `seq` to the host's pipe."""

    seq: int


class Acked(NamedTuple):
    """Relay -> broker: shown by the relay while no broker answered. Push: acknowledged (recorded)."""

    ids: list[str]


class Offered(NamedTuple):
    """Relay -> broker: offered by the relay then, maybe shown. Push: offered elsewhere (a Stop hook)."""

    ids: list[str]


class Ping(NamedTuple):
    """The relay's keepalive."""


class Eof(NamedTuple):
    """The host closed the relay's stdin."""


class Wire(NamedTuple):
    """The relay reads line frames as bytes (ipc.protocol: relay wire 2): send them so."""

    wire: int


class Held(NamedTuple):
    """A message in the session's inbox, for the relay to hold; `again`: a cancelled result put it back."""

    message: dict[str, Any]  # the message's JSON object, as the agent reads it
    again: bool = False


class Identity(NamedTuple):
    """Who this session is now (its `whoami` object)."""

    session: dict[str, Any]


class Delivery(NamedTuple):
    """A message pushed to a bridge-protocol session (`"push": "message"`)."""

    message: dict[str, Any]


RelayFrame: TypeAlias = Line | Written | Acked | Offered | Ping | Eof | Wire
PushFrame: TypeAlias = Line | Held | Acked | Offered | Identity | Delivery
Notice: TypeAlias = Identity | Acked | Offered  # what other requests queue for a session (Session.notify)

PING, EOF = Ping(), Eof()


def line_frames(line: str, seq: int | None = None, ids: Sequence[str] = ()) -> list[Line]:
    """One line as frames: a line longer than a frame takes in parts, each but the last with
    `more`; the last carries `seq` and `ids`."""
    if len(line) <= LINE_PART:
        return [Line(line, False, seq, ids)]
    parts = [line[i:i + LINE_PART] for i in range(0, len(line), LINE_PART)]
    return [*(Line(part, True) for part in parts[:-1]), Line(parts[-1], False, seq, ids)]


class LineParts:
    """Joins the parts of a line again: `add` returns the whole line with its last part."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def add(self, frame: Line) -> str | None:
        if not self.parts and not frame.more:
            return frame.line
        self.parts.append(frame.line)
        if frame.more:
            return None
        line, self.parts = "".join(self.parts), []
        return line


# --- encoders: a typed frame as the JSON object that goes on the wire -----------------------


def _line(key: str, frame: Line) -> dict[str, Any]:
    obj: dict[str, Any] = {"v": PROTOCOL_VERSION, key: "line", "line": frame.line}
    if frame.more:
        obj["more"] = True
    if frame.seq is not None:
        obj["seq"] = frame.seq
        obj["ids"] = frame.ids
    return obj


_RELAY_ENCODERS: dict[type, Callable[[Any], dict[str, Any]]] = {
    Line: lambda f: _line("relay", f),
    Written: lambda f: {"v": PROTOCOL_VERSION, "relay": "written", "seq": f.seq},
    Acked: lambda f: {"v": PROTOCOL_VERSION, "relay": "acked", "ids": f.ids},
    Offered: lambda f: {"v": PROTOCOL_VERSION, "relay": "offered", "ids": f.ids},
    Ping: lambda f: {"v": PROTOCOL_VERSION, "relay": "ping"},
    Eof: lambda f: {"v": PROTOCOL_VERSION, "relay": "eof"},
    Wire: lambda f: {"v": PROTOCOL_VERSION, "relay": "wire", "wire": f.wire},
}


def _held(frame: Held) -> dict[str, Any]:
    obj = {"v": PROTOCOL_VERSION, "push": "held", "message": frame.message}
    if frame.again:
        obj["again"] = True
    return obj


_PUSH_ENCODERS: dict[type, Callable[[Any], dict[str, Any]]] = {
    Line: lambda f: _line("push", f),
    Held: _held,
    Acked: lambda f: {"v": PROTOCOL_VERSION, "push": "acked", "ids": f.ids},
    Offered: lambda f: {"v": PROTOCOL_VERSION, "push": "offered", "ids": f.ids},
    Identity: lambda f: {"v": PROTOCOL_VERSION, "push": "identity", "session": f.session},
    Delivery: lambda f: {"v": PROTOCOL_VERSION, "push": "message", "message": f.message},
}


def encode_relay(frame: RelayFrame, raw_lines: bool) -> bytes:
    """A relay frame's bytes; `raw_lines`: a `Line` as bytes (relay wire 2, ipc.protocol)."""
    if raw_lines and type(frame) is Line:
        return encode_line("relay", frame.line, frame.more, None, ())
    return encode(relay_frame(frame))


def relay_frame(frame: RelayFrame) -> dict[str, Any]:
    """A relay frame as its JSON object."""
    return _RELAY_ENCODERS[type(frame)](frame)


def push_frame(frame: PushFrame) -> dict[str, Any]:
    """A push as its JSON object."""
    return _PUSH_ENCODERS[type(frame)](frame)


def delivery_bytes(message: Message) -> bytes:
    """`encode(push_frame(Delivery(message.to_json())))`, from the message's own text when it
    has one (common.rows.Message.to_json_text: written once for its send's answer and its push)."""
    text = message.to_json_text()
    if text is None:
        return encode(push_frame(Delivery(message.to_json())))
    return encode_text(_DELIVERY_HEAD + text + "}")


_DELIVERY_HEAD = '{"v":' + str(PROTOCOL_VERSION) + ',"push":"message","message":'


# --- decoders: a JSON object from the wire as a typed frame ---------------------------------


def _read_line(obj: dict[str, Any]) -> Line | None:
    line = obj.get("line")
    return Line(line, bool(obj.get("more"))) if isinstance(line, str) else None


def _read_written(obj: dict[str, Any]) -> Written | None:
    seq = obj.get("seq")
    return Written(seq) if isinstance(seq, int) else None


def _strings(obj: dict[str, Any]) -> list[str] | None:
    ids = obj.get("ids")
    return [i for i in ids if isinstance(i, str)] if isinstance(ids, list) else None


def _read_relay_acked(obj: dict[str, Any]) -> Acked | None:
    ids = _strings(obj)
    return None if ids is None else Acked(ids)


def _read_relay_offered(obj: dict[str, Any]) -> Offered | None:
    ids = _strings(obj)
    return None if ids is None else Offered(ids)


def _read_wire(obj: dict[str, Any]) -> Wire | None:
    wire = obj.get("wire")
    return Wire(wire) if isinstance(wire, int) and not isinstance(wire, bool) else None


_RELAY_DECODERS: dict[str, Callable[[dict[str, Any]], RelayFrame | None]] = {
    "line": _read_line,
    "written": _read_written,
    "acked": _read_relay_acked,
    "offered": _read_relay_offered,
    "ping": lambda obj: PING,
    "eof": lambda obj: EOF,
    "wire": _read_wire,
}


def read_relay(obj: dict[str, Any]) -> RelayFrame | None:
    """A relay frame; None for an object that is not one (a request where the host's lines
    belong). Raises ProtocolError for a kind it does not know or a frame without what its kind
    needs (ids not strings are dropped)."""
    kind = obj.get("relay")
    if kind is None:
        return None
    decode = _RELAY_DECODERS.get(kind) if isinstance(kind, str) else None
    frame = decode(obj) if decode is not None else None
    if frame is None:
        raise ProtocolError(f"relay frame: unknown kind {kind!r}")
    return frame


def _read_push_line(obj: dict[str, Any]) -> Line | None:
    line = obj.get("line")
    if not isinstance(line, str):
        return None
    seq = obj.get("seq")
    if not isinstance(seq, int):
        return Line(line, bool(obj.get("more")))
    return Line(line, bool(obj.get("more")), seq, _strings(obj) or [])


def _read_held(obj: dict[str, Any]) -> Held | None:
    message = obj.get("message")
    return Held(message, bool(obj.get("again"))) if isinstance(message, dict) else None


def _read_push_ids(obj: dict[str, Any]) -> list[str] | None:
    ids = obj.get("ids")
    return [str(i) for i in ids] if isinstance(ids, list) else None


def _read_push_acked(obj: dict[str, Any]) -> Acked | None:
    ids = _read_push_ids(obj)
    return None if ids is None else Acked(ids)


def _read_push_offered(obj: dict[str, Any]) -> Offered | None:
    ids = _read_push_ids(obj)
    return None if ids is None else Offered(ids)


def _read_identity(obj: dict[str, Any]) -> Identity | None:
    session = obj.get("session")
    return Identity(session) if isinstance(session, dict) else None


def _read_delivery(obj: dict[str, Any]) -> Delivery | None:
    message = obj.get("message")
    return Delivery(message) if isinstance(message, dict) else None


_PUSH_DECODERS: dict[str, Callable[[dict[str, Any]], PushFrame | None]] = {
    "line": _read_push_line,
    "held": _read_held,
    "acked": _read_push_acked,
    "offered": _read_push_offered,
    "identity": _read_identity,
    "message": _read_delivery,
}


def read_push(obj: dict[str, Any]) -> PushFrame | None:
    """A push; None for an object that is not one, of a kind this version does not know, or
    without what its kind needs: the reader skips it."""
    kind = obj.get("push")
    decode = _PUSH_DECODERS.get(kind) if isinstance(kind, str) else None
    return decode(obj) if decode is not None else None
