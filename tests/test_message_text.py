"""A message written from its own text (common.rows.Message.to_json_text, stop 57): the frames
and tool texts that carry one are the very bytes the standard library's encoder writes for the
same objects, which is what went on the wire before. The oracle is `json.dumps` of `to_json()`,
never the template itself."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agent_bridge.broker.mcp.calls import messages_json
from agent_bridge.broker.mcp.fast import text_json
from agent_bridge.broker.mcp.outbox import Outbox
from agent_bridge.broker.ops.messages import SendResult
from agent_bridge.common.rows import Author, Decision, Message, MessageJSON
from agent_bridge.ipc import protocol
from agent_bridge.ipc.frames import Delivery, Held, delivery_bytes, push_frame

# Any text a JSON string can hold, with what needs escaping made likely: quotes, backslashes,
# controls, the line separators JSON leaves alone, characters past the BMP and lone surrogates.
TEXT = st.text(
    alphabet=st.one_of(
        st.sampled_from(['"', "\\", "\n", "\t", "\x00", "\x1f", "\x7f", "\u2028", "é", "😀", "\ud800", "/"]),
        st.characters(),
    ),
    max_size=40,
)
MAYBE = st.none() | TEXT
INTS = st.integers(min_value=-(2**63), max_value=2**63)


@st.composite
def messages(draw: Any) -> Message:
    return Message(
        id=draw(TEXT), sender=Author(draw(MAYBE), draw(MAYBE), draw(MAYBE)), to_id=draw(TEXT),
        to_name=draw(MAYBE), text=draw(TEXT), hop=draw(INTS), reply_to=draw(MAYBE),
        kind=draw(st.sampled_from(["message", "decision", "answer", "job"])), created_at=draw(INTS),
        repeat=draw(st.booleans()),
    )


def outcome(make: Any) -> Any:
    """What `make()` gives: its bytes, or the type of what it raised (text with a lone surrogate
    is no UTF-8: a frame of it cannot be written either way)."""
    try:
        return make()
    except UnicodeEncodeError as exc:
        return type(exc)


def compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def spaced(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


@settings(max_examples=400, deadline=None)
@given(messages())
def test_a_message_s_text_is_what_the_encoder_writes_for_its_object(m: Message) -> None:
    for text, encode, is_spaced in ((m.to_json_text(), compact, False), (m.to_json_text(True), spaced, True)):
        if text is None:  # written by the caller's encoder: a repeat, a sender of another machine
            assert m.repeat or "@" in (m.sender.id or "")
        else:
            assert text == encode(m.to_json())
            assert m.to_json_text(is_spaced) == text  # remembered: the same text again


@settings(max_examples=300, deadline=None)
@given(messages())
def test_a_push_carries_the_bytes_the_frame_s_object_encodes_to(m: Message) -> None:
    pushed = outcome(lambda: delivery_bytes(m))
    assert pushed == outcome(lambda: protocol.encode(push_frame(Delivery(m.to_json()))))
    if isinstance(pushed, bytes):
        assert protocol.decode_payload(pushed[4:])["message"] == json.loads(compact(m.to_json()))


PLAIN = Message(
    "m1", Author("s1", "claude-sender", "claude"), "r1", "claude-receiver", "hi", 0, None, "message", 5
)


def test_notices_and_other_values_are_left_to_the_encoder() -> None:
    decision = Decision("d1", "db", "use Postgres", "all", Author("o", "owner", None), 1, None, None, True)
    odd = [
        PLAIN._replace(kind="decision", decision=decision),
        PLAIN._replace(repeat=True),
        PLAIN._replace(sender=Author("s1@laptop", "claude-sender", "claude")),  # its from gets "machine"
        PLAIN._replace(hop=True),  # equal to 1, written `true`
        PLAIN._replace(created_at=5.0),
        PLAIN._replace(text=7),  # not text
    ]
    for m in odd:
        assert m.to_json_text() is None and m.to_json_text(True) is None
        assert delivery_bytes(m) == protocol.encode(push_frame(Delivery(m.to_json())))
    assert PLAIN.to_json_text() == compact(PLAIN.to_json())
    long = PLAIN._replace(text='a "long" text\n' * 2000)  # past what is remembered: written each time
    assert long.to_json_text() == compact(long.to_json())
    assert long.to_json_text(True) == spaced(long.to_json())
    assert PLAIN._replace(hop=True).to_json_text() is None  # not the remembered text of its equal


@settings(max_examples=200, deadline=None)
@given(messages(), st.booleans(), st.none() | INTS, st.booleans(), st.integers(0, 2**53 - 1))
def test_a_send_answer_is_the_frame_and_the_tool_text_it_was(
    m: Message, connected: bool, last_seen: int | None, duplicate: bool, request_id: int
) -> None:
    result = SendResult()
    result.message = m
    result["message"] = m.to_json()
    result["recipientConnected"] = connected
    result["recipientLastSeen"] = last_seen
    if duplicate:
        result["duplicate"] = True
    assert result.text(protocol.encode_json) == compact(dict(result))
    assert result.text(spaced, spaced=True) == spaced(dict(result))
    assert outcome(lambda: protocol.encode_ok(request_id, result.text(protocol.encode_json))) == outcome(
        lambda: protocol.encode(protocol.ok(request_id, dict(result)))
    )


def test_a_broadcast_answer_and_a_lone_message_are_written_whole() -> None:
    broadcast = SendResult(messages=[PLAIN.to_json()], recipients=["claude-receiver"])
    assert broadcast.text(protocol.encode_json) == compact(dict(broadcast))
    alone = SendResult()
    alone.message = PLAIN
    alone["message"] = PLAIN.to_json()
    assert alone.text(protocol.encode_json) == compact(dict(alone))
    assert alone.text(spaced, spaced=True) == spaced(dict(alone))


@settings(max_examples=200, deadline=None)
@given(st.lists(messages(), max_size=4), st.lists(st.booleans(), min_size=4, max_size=4))
def test_an_inbox_and_a_held_push_are_what_the_encoder_writes(
    batch: list[Message], marked: list[bool]
) -> None:
    # as the showing machine hands them out: the arrived objects, or copies marked as repeats
    listed = [dict(MessageJSON(m), repeat=True) if again else MessageJSON(m)
              for m, again in zip(batch, marked, strict=False)]
    assert outcome(lambda: messages_json(listed)) == outcome(lambda: text_json(listed))
    outbox = Outbox.__new__(Outbox)  # its encoding alone: no connection
    outbox.raw_lines = True
    for m in listed:
        assert outcome(lambda m=m: outbox._encode(push_frame(Held(m)))) == outcome(
            lambda m=m: protocol.encode(push_frame(Held(dict(m))))
        )


def test_a_message_s_json_object_cannot_change_under_its_text() -> None:
    m = MessageJSON(PLAIN)
    assert m == PLAIN.to_json() and m.text() == compact(PLAIN.to_json())
    for change in (lambda: m.__setitem__("repeat", True), lambda: m.update(text="other"),
                   lambda: m.pop("text"), lambda: m.setdefault("repeat", True), m.clear, m.popitem):
        try:
            change()
        except TypeError:
            continue
        raise AssertionError("changed")
    assert m == PLAIN.to_json()
    assert dict(m, repeat=True)["repeat"] is True  # a changed copy is a plain dict


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | INTS | st.floats(allow_nan=False) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES, st.integers(0, 2**53 - 1) | TEXT)
def test_a_tool_s_json_text_is_escaped_in_its_answer_as_any_text_is(value: Any, request_id: Any) -> None:
    from agent_bridge.broker.mcp.fast import result_line

    text = text_json(value)
    assert text == json.dumps(value, ensure_ascii=False)
    line = result_line(request_id, [text], is_error=False)
    assert line == result_line(request_id, [str(text)], is_error=False)  # escaped the general way
    expected = {"jsonrpc": "2.0", "id": request_id, "result": {
        "content": [{"text": json.dumps(value, ensure_ascii=False), "type": "text"}], "isError": False}}
    assert line == compact(expected)
