"""The typed frames of a session connection (ipc.frames) against the wire as docs/ipc.md writes
it: the decoders read bytes written here by hand from those examples, and the encoders must
produce exactly the compact JSON a relay or broker of another version sends and reads."""

from __future__ import annotations

import struct

import pytest

from agent_bridge.ipc import frames, protocol
from agent_bridge.ipc.frames import (
    EOF,
    PING,
    Acked,
    Delivery,
    Held,
    Identity,
    Line,
    LineParts,
    Offered,
    Written,
    line_frames,
    push_frame,
    read_push,
    read_relay,
    relay_frame,
)


def wire(text: str) -> bytes:
    """One frame as it travels: a 4-byte big-endian length, then the UTF-8 JSON."""
    payload = text.encode("utf-8")
    return struct.pack(">I", len(payload)) + payload


def received(text: str) -> dict:
    (obj,) = protocol.FrameDecoder().feed(wire(text))
    return obj


# --- relay -> broker (docs/ipc.md "Relay -> broker") ---------------------------------------

RELAY_EXAMPLES = [
    ('{"v":1,"relay":"line","line":"{\\"jsonrpc\\":\\"2.0\\",\\"id\\":1,\\"method\\":\\"ping\\"}"}',
     Line('{"jsonrpc":"2.0","id":1,"method":"ping"}')),
    ('{"v":1,"relay":"line","line":"{\\"jsonrpc\\":","more":true}', Line('{"jsonrpc":', more=True)),
    ('{"v":1,"relay":"written","seq":7}', Written(7)),
    ('{"v":1,"relay":"acked","ids":["m1","m2"]}', Acked(["m1", "m2"])),
    ('{"v":1,"relay":"offered","ids":["m3"]}', Offered(["m3"])),
    ('{"v":1,"relay":"ping"}', PING),
    ('{"v":1,"relay":"eof"}', EOF),
]


@pytest.mark.parametrize(("text", "frame"), RELAY_EXAMPLES)
def test_relay_frames_read_from_the_documented_wire(text: str, frame: object) -> None:
    assert read_relay(received(text)) == frame
    assert type(read_relay(received(text))) is type(frame)


@pytest.mark.parametrize(("text", "frame"), RELAY_EXAMPLES)
def test_relay_frames_written_as_the_documented_wire(text: str, frame: frames.RelayFrame) -> None:
    assert protocol.encode(relay_frame(frame)) == wire(text)


def test_the_broker_reads_a_frame_with_extra_or_odd_members_as_before() -> None:
    # Members a later relay may add are ignored; ids that are not strings are dropped.
    assert read_relay(received('{"v":1,"relay":"ping","at":3}')) == PING
    assert read_relay(received('{"v":1,"relay":"acked","ids":["a",1,null,"b"]}')) == Acked(["a", "b"])
    assert read_relay(received('{"v":1,"relay":"line","line":"x","more":0}')) == Line("x")


def test_a_request_is_not_a_relay_frame() -> None:
    assert read_relay(received('{"v":1,"id":3,"op":"whoami"}')) is None


@pytest.mark.parametrize("text", [
    '{"v":1,"relay":"shout"}',  # a kind no version sends
    '{"v":1,"relay":["line"]}',  # not even a string (nor hashable)
    '{"v":1,"relay":"line"}',  # a line without its line
    '{"v":1,"relay":"line","line":5}',
    '{"v":1,"relay":"written","seq":"7"}',
    '{"v":1,"relay":"acked","ids":"m1"}',
    '{"v":1,"relay":"offered"}',
])
def test_the_broker_refuses_a_relay_frame_it_cannot_use(text: str) -> None:
    with pytest.raises(protocol.ProtocolError, match="relay frame: unknown kind"):
        read_relay(received(text))


# --- broker -> relay (docs/ipc.md "Broker -> relay", and the bridge protocol's pushes) ------

SESSION = {"id": "s1", "name": "blue-fox", "agent": "codex", "project": "/w", "kind": "interactive"}
MESSAGE = {"id": "m1", "from": {"name": "red-owl"}, "text": "hi", "hop": 0, "kind": "message"}

PUSH_EXAMPLES = [
    ('{"v":1,"push":"line","line":"{\\"jsonrpc\\":\\"2.0\\",\\"id\\":1,\\"result\\":{}}"}',
     Line('{"jsonrpc":"2.0","id":1,"result":{}}')),
    ('{"v":1,"push":"line","line":"{}","seq":4,"ids":["m1","m2"]}', Line("{}", seq=4, ids=["m1", "m2"])),
    ('{"v":1,"push":"line","line":"{","more":true}', Line("{", more=True)),
    ('{"v":1,"push":"identity","session":{"id":"s1","name":"blue-fox","agent":"codex","project":"/w",'
     '"kind":"interactive"}}', Identity(SESSION)),
    ('{"v":1,"push":"held","message":{"id":"m1","from":{"name":"red-owl"},"text":"hi","hop":0,"kind":"message"}}',
     Held(MESSAGE)),
    ('{"v":1,"push":"held","message":{"id":"m1","from":{"name":"red-owl"},"text":"hi","hop":0,"kind":"message"},'
     '"again":true}', Held(MESSAGE, again=True)),
    ('{"v":1,"push":"acked","ids":["m1"]}', Acked(["m1"])),
    ('{"v":1,"push":"offered","ids":["m1","m2"]}', Offered(["m1", "m2"])),
    ('{"v":1,"push":"message","message":{"id":"m1","from":{"name":"red-owl"},"text":"hi","hop":0,'
     '"kind":"message"}}', Delivery(MESSAGE)),
]


@pytest.mark.parametrize(("text", "frame"), PUSH_EXAMPLES)
def test_pushes_read_from_the_documented_wire(text: str, frame: object) -> None:
    got = read_push(received(text))
    assert got == frame
    assert type(got) is type(frame)


@pytest.mark.parametrize(("text", "frame"), PUSH_EXAMPLES)
def test_pushes_written_as_the_documented_wire(text: str, frame: frames.PushFrame) -> None:
    assert protocol.encode(push_frame(frame)) == wire(text)


@pytest.mark.parametrize("text", [
    '{"v":1,"push":"weather","line":"x"}',  # a kind a later broker may add
    '{"v":1,"push":"line"}',
    '{"v":1,"push":"identity","session":"s1"}',
    '{"v":1,"push":"held","message":null}',
    '{"v":1,"push":"acked","ids":{}}',
    '{"v":1,"push":{"kind":"line"},"line":"x"}',
    '{"v":1,"id":1,"ok":true,"result":"pong"}',  # an answer, not a push
])
def test_the_relay_skips_a_push_it_cannot_use(text: str) -> None:
    assert read_push(received(text)) is None


def test_a_push_line_without_a_usable_seq_shows_nothing() -> None:
    # Only a line with an integer seq is reported written; its ids that are not strings are dropped.
    assert read_push(received('{"v":1,"push":"line","line":"x","seq":"4","ids":["m1"]}')) == Line("x")
    assert read_push(received('{"v":1,"push":"line","line":"x","seq":4,"ids":["m1",2]}')) == Line(
        "x", seq=4, ids=["m1"]
    )
    assert read_push(received('{"v":1,"push":"line","line":"x","seq":4}')) == Line("x", seq=4, ids=[])
    assert read_push(received('{"v":1,"push":"acked","ids":["m1",2]}')) == Acked(["m1", "2"])


# --- lines in parts ----------------------------------------------------------------------------

def test_a_long_line_goes_in_parts_that_each_fit_a_frame_and_join_again() -> None:
    # The widest character UTF-8 has, so every part is as large as a part can get.
    line = "\U0001f600" * (2 * frames.LINE_PART + 5)
    parts = line_frames(line, seq=9, ids=["m1"])
    assert [len(p.line) for p in parts] == [frames.LINE_PART, frames.LINE_PART, 5]
    assert [p.more for p in parts] == [True, True, False]
    assert [p.seq for p in parts] == [None, None, 9] and list(parts[-1].ids) == ["m1"]
    for part in parts:
        assert len(protocol.encode(push_frame(part))) <= protocol.MAX_FRAME + protocol.HEADER.size
    joined = LineParts()
    assert [joined.add(read_push(received(protocol.encode(push_frame(p))[4:].decode()))) for p in parts] == [
        None, None, line]


def test_lines_of_one_part_and_the_empty_line() -> None:
    assert line_frames("") == [Line("")]
    assert line_frames("x" * frames.LINE_PART) == [Line("x" * frames.LINE_PART)]
    assert len(line_frames("x" * (frames.LINE_PART + 1))) == 2


def test_parts_join_from_the_documented_wire() -> None:
    joined = LineParts()
    assert joined.add(read_relay(received('{"v":1,"relay":"line","line":"{\\"a\\":","more":true}'))) is None
    assert joined.add(read_relay(received('{"v":1,"relay":"line","line":"1}"}'))) == '{"a":1}'
    assert joined.add(read_relay(received('{"v":1,"relay":"line","line":"{}"}'))) == "{}"


# --- what other requests queue for a session (Session.notify) --------------------------------

def test_notices_coalesce_per_kind_and_leave_as_the_documented_pushes() -> None:
    from agent_bridge.broker.sessions.session import Session
    from agent_bridge.common.rows import Peer

    session = Session(conn=None, peer=Peer("s1", "blue-fox", "codex", "/w", None, "interactive", 0, 0))  # type: ignore[arg-type]
    session.notify(Acked(["m1"]))
    session.notify(Identity({"id": "s1"}))
    session.notify(Offered(["m3"]))
    session.notify(Acked(["m2", "m1"]))
    session.notify(Identity(SESSION))
    assert session.wake.is_set()
    assert [protocol.encode(push_frame(n)) for n in session.notices] == [
        wire('{"v":1,"push":"acked","ids":["m1","m2"]}'),
        wire('{"v":1,"push":"identity","session":{"id":"s1","name":"blue-fox","agent":"codex","project":"/w",'
             '"kind":"interactive"}}'),
        wire('{"v":1,"push":"offered","ids":["m3"]}'),
    ]
