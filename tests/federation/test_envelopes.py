"""Federation bodies (core/envelopes.py): hand-written JSON as the spec shows it decodes to the
typed envelopes, the encoder's output decodes to what was encoded, and every bad body is one
line naming what was wrong (never a crash, never a partial value)."""

from __future__ import annotations

import json

import pytest

from agent_bridge.core import envelopes as env
from agent_bridge.core.envelopes import (
    Author,
    DecisionEnvelope,
    EnvelopeError,
    MessageEnvelope,
    PresenceEnvelope,
    PresenceSession,
    ReceiptEnvelope,
    RetractionEnvelope,
)

MID = "0f8fad5b-d9cb-469f-a165-70867728950e"
PEER = "7c9e6679-7425-40de-944b-e07fc1f90ae7"

MESSAGE = (
    '{"v":1,"id":"0f8fad5b-d9cb-469f-a165-70867728950e",'
    '"from":{"id":"7c9e6679-7425-40de-944b-e07fc1f90ae7","name":"claude-app","agent":"claude"},'
    '"to":{"id":"c0ffee00-0000-4000-8000-000000000001","name":"codex-app"},'
    '"text":"Ready for review? café","hop":1,"replyTo":null,"createdAt":1790000000000,"sendId":null}'
)
RECEIPT = '{"v":1,"messageId":"0f8fad5b-d9cb-469f-a165-70867728950e","state":"shown","at":1790000000500}'
DECISION = (
    '{"v":1,"type":"decision","id":"d1","topic":"db","text":"PostgreSQL",'
    '"scope":{"projectKey":"github.com/Org/Repo"},'
    '"author":{"id":"cli","name":"cli","agent":"cli"},"createdAt":1790000000000,'
    '"supersedes":null,"sourceMessageId":null}'
)
RETRACTION = (
    '{"v":1,"type":"retraction","id":"r1","topic":"db","retracts":"d1","reason":"wrong",'
    '"author":{"id":"cli","name":"cli","agent":"cli"},"createdAt":1790000001000}'
)
PRESENCE = (
    '{"v":1,"at":1790000000000,"sessions":[{"id":"7c9e6679-7425-40de-944b-e07fc1f90ae7",'
    '"name":"claude-app","agent":"claude","project":"/home/me/app","projectKey":"github.com/Org/Repo",'
    '"kind":"interactive","state":"idle"},{"id":"s2","name":"codex-tmp","agent":"codex",'
    '"project":"C:/work/tmp","projectKey":null,"kind":"job","state":"busy"}]}'
)
FIRST = json.loads(PRESENCE)["sessions"][0]
CLAUDE = Author(PEER, "claude-app", "claude")


def test_hand_written_bodies_decode() -> None:
    m = env.decode_message(MESSAGE.encode())
    assert m == MessageEnvelope(
        id=MID, sender=Author(PEER, "claude-app", "claude"), to_id="c0ffee00-0000-4000-8000-000000000001",
        to_name="codex-app", text="Ready for review? café", hop=1, reply_to=None,
        created_at=1790000000000, send_id=None,
    )
    assert env.decode_receipt(RECEIPT.encode()) == ReceiptEnvelope(MID, "shown", 1790000000500)
    d = env.decode_decision(DECISION.encode())
    assert d == DecisionEnvelope("d1", "db", "PostgreSQL", "github.com/Org/Repo", Author("cli", "cli", "cli"),
                                 1790000000000, None, None)
    everywhere = DECISION.replace('{"projectKey":"github.com/Org/Repo"}', '"all"')
    all_scope = env.decode_decision(everywhere.encode())
    assert isinstance(all_scope, DecisionEnvelope) and all_scope.project_key is None
    r = env.decode_decision(RETRACTION.encode())
    assert r == RetractionEnvelope("r1", "db", "d1", "wrong", Author("cli", "cli", "cli"), 1790000001000)
    p = env.decode_presence(PRESENCE.encode())
    assert p.at == 1790000000000 and len(p.sessions) == 2
    assert p.sessions[1] == PresenceSession("s2", "codex-tmp", "codex", "C:/work/tmp", None, "job", "busy")


def test_unknown_fields_are_ignored_for_later_versions() -> None:
    body = json.loads(RECEIPT)
    body["extra"] = {"anything": [1, 2]}
    assert env.decode_receipt(json.dumps(body).encode()).state == "shown"


@pytest.mark.parametrize(
    "value",
    [
        MessageEnvelope(MID, CLAUDE, "x1", "codex-app", "hi\n\u2603", 3, MID, 5, MID),
        ReceiptEnvelope(MID, "acknowledged", 7),
        DecisionEnvelope("d2", "camera", "Hold to look", None, CLAUDE, 9, "d1", MID),
        RetractionEnvelope("r2", "camera", "d2", None, Author("cli", "cli", "cli"), 10),
        PresenceEnvelope(11, (PresenceSession(PEER, "claude-a", "claude", "/a", "h.x/o/r", "job", "idle"),)),
        PresenceEnvelope(12, ()),
    ],
)
def test_what_is_encoded_decodes_to_itself(value: env.Envelope) -> None:
    body = env.encode(value)
    decode = {
        MessageEnvelope: env.decode_message, ReceiptEnvelope: env.decode_receipt,
        DecisionEnvelope: env.decode_decision, RetractionEnvelope: env.decode_decision,
        PresenceEnvelope: env.decode_presence,
    }[type(value)]
    assert decode(body) == value


def _edit(original: str, /, **changes: object) -> bytes:
    body = json.loads(original)
    for key, value in changes.items():
        if value is KeyError:
            del body[key]
        else:
            body[key] = value
    return json.dumps(body).encode()


BAD_MESSAGES = [
    (b"", "not JSON"),
    (b"\xff\xfe", "not UTF-8"),
    (b"[1,2]", "expected a JSON object"),
    (b"{" * 20 + b"}" * 20, "nested deeper"),
    (b'{"v":2}', "v: expected 1"),
    (b'{"v":true}', "v: expected 1"),
    (_edit(MESSAGE, id=KeyError), "id: missing"),
    (_edit(MESSAGE, id=7), "id: expected a string, got a number"),
    (_edit(MESSAGE, id="has space"), "id: expected an id"),
    (_edit(MESSAGE, text=""), "text: must not be empty"),
    (_edit(MESSAGE, text="x" * 16_001), "text: at most 16000"),
    (_edit(MESSAGE, hop=0), "hop: expected 1..100"),
    (_edit(MESSAGE, hop=True), "hop: expected an integer, got a boolean"),
    (_edit(MESSAGE, hop=1.5), "hop: expected an integer, got a number"),
    (_edit(MESSAGE, createdAt=-1), "createdAt: expected 0.."),
    (_edit(MESSAGE, to="codex-app"), "to: expected an object, got a string"),
    (_edit(MESSAGE, to={"name": "codex-app"}), "to.id: missing"),
    (_edit(MESSAGE, **{"from": {"id": PEER, "name": "x", "agent": "no spaces"}}), "from.agent: expected"),
    (MESSAGE.replace("café", "\\ud800").encode(), "not valid text"),
    (b'{"v":1,"pad":"' + b"x" * env.MAX_BODY + b'"}', "more than the"),
]


@pytest.mark.parametrize(("body", "error"), BAD_MESSAGES)
def test_bad_message_bodies_are_one_clear_line(body: bytes, error: str) -> None:
    with pytest.raises(EnvelopeError) as caught:
        env.decode_message(body)
    text = str(caught.value)
    assert error in text and "\n" not in text and len(text) < 200


@pytest.mark.parametrize(
    ("decode", "body", "error"),
    [
        (env.decode_receipt, _edit(RECEIPT, state="read"), "state: expected one of stored, shown"),
        (env.decode_receipt, _edit(RECEIPT, at="now"), "at: expected an integer"),
        (env.decode_decision, _edit(DECISION, type="vote"), 'type: expected "decision" or "retraction"'),
        (env.decode_decision, _edit(DECISION, scope={"project": "/home/me/app"}), "scope: expected"),
        (env.decode_decision, _edit(DECISION, scope={"sessions": ["a"]}), "scope: expected"),
        (env.decode_decision, _edit(DECISION, scope={"projectKey": "not a key"}), "scope.projectKey"),
        (env.decode_decision, _edit(DECISION, topic=" "), "topic: must not be empty"),
        (env.decode_decision, _edit(DECISION, text="x" * 4001), "text: at most 4000"),
        (env.decode_decision, _edit(RETRACTION, retracts=None), "retracts: expected a string, got null"),
        (env.decode_presence, _edit(PRESENCE, sessions={}), "sessions: expected an array"),
        (env.decode_presence, _edit(PRESENCE, sessions=[1]), "sessions[0]: expected an object"),
        (env.decode_presence, _edit(PRESENCE, sessions=[{**FIRST, "state": "gone"}]),
         "sessions[0].state: expected busy, idle or offline"),
        (env.decode_presence, _edit(PRESENCE, sessions=[{**FIRST, "kind": "bot"}]),
         "sessions[0].kind"),
        (env.decode_presence, _edit(PRESENCE, sessions=[FIRST] * 2001),
         "sessions: at most 2000"),
    ],
)
def test_bad_bodies_of_every_kind(decode: object, body: bytes, error: str) -> None:
    assert callable(decode)
    with pytest.raises(EnvelopeError) as caught:
        decode(body)
    assert error in str(caught.value)


def test_the_encoder_refuses_a_body_past_its_limit() -> None:
    sessions = tuple(PresenceSession(f"s{i}", "n", "claude", "/" + "p" * 4000, None, "job", "idle")
                     for i in range(300))
    with pytest.raises(EnvelopeError, match="more than the"):
        env.encode(PresenceEnvelope(1, sessions))
