"""The bodies federation carries between machines (SPEC §10): typed frozen dataclasses inside,
JSON at the edge, one encode and one strict decode per kind. Standard library only.

A body comes from another machine, so decoding trusts nothing: a body larger than its limit, not
UTF-8, not JSON, nested too deep, missing a field, with a field of the wrong type or out of its
range raises `EnvelopeError`, one line naming the field; the caller stores nothing and acks the
delivery (core.federation.Inbound.rejected). Fields a body has beyond these are ignored, so a
later version may add one; a change of meaning is a new `v`. A body never names its sending
machine: the subject does (`<team>.<kind>.<from>…`), and the hub lets a machine publish only as
itself.

Bodies, by subject:

    <team>.msg.<from>.<to>     {"v":1,"id","from":{"id","name","agent"},"to":{"id","name"},
                                "text","hop","replyTo","createdAt","sendId"}
    <team>.rcpt.<from>.<to>    {"v":1,"messageId","state":"stored"|"shown"|"acknowledged","at"}
                               {"v":1,"decisionId","state":"stored","at"}  (a decision or
                                retraction of `to`'s that `from` stored: its end-to-end receipt)
    <team>.dec.<from>          {"v":1,"type":"decision","id","topic","text",
                                "scope":"all"|{"projectKey":"host/org/repo"},"author":{…},
                                "createdAt","supersedes","sourceMessageId"}
                               {"v":1,"type":"retraction","id","topic","retracts","reason",
                                "author":{…},"createdAt"}
    <team>.presence.<machine>  {"v":1,"at","sessions":[{"id","name","agent","project",
                                "projectKey","kind","state":"busy"|"idle"|"offline"}]}

Times are epoch milliseconds. A decision scoped to sessions never leaves its machine, and a
project decision travels with its project key (the normalized git origin, `projectkey`), never
its folder: another machine applies it to its own folders with that key.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from agent_bridge.common import domain, jsonlimit, questions

VERSION = 1
MAX_BODY = 128 * 1024  # bytes of a message, receipt or decision body (16,000 characters fit)
MAX_PRESENCE = 1024 * 1024  # bytes of a presence body
MAX_PRESENCE_SESSIONS = 2000  # sessions one machine may announce
MAX_DEPTH = 8  # levels of nesting: every body here nests 3 deep at most
TIME_MAX = 2**53  # epoch milliseconds, as JSON numbers carry them exactly

ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,99}\Z")  # uuids, and `cli`
PROJECT_KEY = re.compile(r"[a-z0-9.-]+(:[0-9]+)?(/[^\s/]+)+\Z")
RECEIPT_STATES = ("stored", "shown", "acknowledged")
SESSION_STATES = ("busy", "idle", "offline")
KINDS = ("interactive", "job")


class EnvelopeError(ValueError):
    """A body that cannot be taken: one line saying what was wrong."""


@dataclass(frozen=True)
class Author:
    id: str
    name: str
    agent: str


@dataclass(frozen=True)
class MessageEnvelope:
    id: str
    sender: Author  # `from`: a session on the sending machine
    to_id: str  # the recipient session on the receiving machine
    to_name: str
    text: str
    hop: int
    reply_to: str | None
    created_at: int
    send_id: str | None  # the caller's message_id of the send (a retry is a duplicate)


@dataclass(frozen=True)
class ReceiptEnvelope:
    message_id: str  # the message's id, or the decision's or retraction's (kind "dec")
    state: str  # RECEIPT_STATES ("stored" only for a decision)
    at: int
    kind: str = "msg"  # "msg": a message's receipt; "dec": a decision's or retraction's


@dataclass(frozen=True)
class DecisionEnvelope:
    id: str
    topic: str
    text: str
    project_key: str | None  # None: scope "all"
    author: Author
    created_at: int
    supersedes: str | None
    source_message_id: str | None


@dataclass(frozen=True)
class RetractionEnvelope:
    id: str
    topic: str
    retracts: str
    reason: str | None
    author: Author
    created_at: int


@dataclass(frozen=True)
class PresenceSession:
    id: str
    name: str
    agent: str
    project: str  # the folder on its machine (shown, never matched)
    project_key: str | None
    kind: str
    state: str  # SESSION_STATES


@dataclass(frozen=True)
class PresenceEnvelope:
    at: int
    sessions: tuple[PresenceSession, ...]


Envelope = MessageEnvelope | ReceiptEnvelope | DecisionEnvelope | RetractionEnvelope | PresenceEnvelope


# --- encoding -----------------------------------------------------------------------------


def _author(a: Author) -> dict[str, Any]:
    return {"id": a.id, "name": a.name, "agent": a.agent}


def to_json(env: Envelope) -> dict[str, Any]:
    if isinstance(env, MessageEnvelope):
        return {
            "v": VERSION, "id": env.id, "from": _author(env.sender),
            "to": {"id": env.to_id, "name": env.to_name}, "text": env.text, "hop": env.hop,
            "replyTo": env.reply_to, "createdAt": env.created_at, "sendId": env.send_id,
        }
    if isinstance(env, ReceiptEnvelope):
        which = "decisionId" if env.kind == "dec" else "messageId"
        return {"v": VERSION, which: env.message_id, "state": env.state, "at": env.at}
    if isinstance(env, DecisionEnvelope):
        scope: Any = "all" if env.project_key is None else {"projectKey": env.project_key}
        return {
            "v": VERSION, "type": "decision", "id": env.id, "topic": env.topic, "text": env.text,
            "scope": scope, "author": _author(env.author), "createdAt": env.created_at,
            "supersedes": env.supersedes, "sourceMessageId": env.source_message_id,
        }
    if isinstance(env, RetractionEnvelope):
        return {
            "v": VERSION, "type": "retraction", "id": env.id, "topic": env.topic,
            "retracts": env.retracts, "reason": env.reason, "author": _author(env.author),
            "createdAt": env.created_at,
        }
    return {
        "v": VERSION, "at": env.at,
        "sessions": [
            {"id": s.id, "name": s.name, "agent": s.agent, "project": s.project,
             "projectKey": s.project_key, "kind": s.kind, "state": s.state}
            for s in env.sessions
        ],
    }


def encode(env: Envelope) -> bytes:
    """The body to publish. Raises EnvelopeError when it would exceed its limit."""
    body = json.dumps(to_json(env), ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    limit = MAX_PRESENCE if isinstance(env, PresenceEnvelope) else MAX_BODY
    if len(body) > limit:
        raise EnvelopeError(f"body: {len(body)} bytes, more than the {limit} a machine takes")
    return body


# --- decoding -----------------------------------------------------------------------------


def decode_message(body: bytes) -> MessageEnvelope:
    d = _object(body, MAX_BODY)
    sender = _author_of(d, "from")
    to = _field(d, "to", dict)
    reply_to = _opt_id(d, "replyTo")
    return MessageEnvelope(
        id=_id(d, "id"),
        sender=sender,
        to_id=_id(to, "id", "to.id"),
        to_name=_name(to, "name", "to.name"),
        text=_checked(domain.normalize_message_text, _field(d, "text", str)),
        hop=_int(d, "hop", 1, domain.HOP_MAX),
        reply_to=reply_to,
        created_at=_time(d, "createdAt"),
        send_id=_opt_id(d, "sendId"),
    )


def decode_receipt(body: bytes) -> ReceiptEnvelope:
    d = _object(body, MAX_BODY)
    state = _field(d, "state", str)
    if state not in RECEIPT_STATES:
        raise EnvelopeError(f"state: expected one of {', '.join(RECEIPT_STATES)}; got {state[:40]!r}")
    if "decisionId" in d:
        if state != "stored":
            raise EnvelopeError(f"state: a decision's receipt is stored; got {state[:40]!r}")
        return ReceiptEnvelope(message_id=_id(d, "decisionId"), state=state, at=_time(d, "at"), kind="dec")
    return ReceiptEnvelope(message_id=_id(d, "messageId"), state=state, at=_time(d, "at"))


def decode_decision(body: bytes) -> DecisionEnvelope | RetractionEnvelope:
    """A `dec` subject's body: a decision or a retraction (its `type`)."""
    d = _object(body, MAX_BODY)
    kind = _field(d, "type", str)
    topic = _checked(domain.normalize_topic, _field(d, "topic", str))
    if kind == "decision":
        raw_scope = d.get("scope")
        if raw_scope == "all":
            project_key = None
        elif isinstance(raw_scope, dict) and isinstance(raw_scope.get("projectKey"), str):
            project_key = _project_key(raw_scope["projectKey"], "scope.projectKey")
            if project_key is None:
                raise EnvelopeError("scope.projectKey: must not be null in a project scope")
        else:
            raise EnvelopeError('scope: expected "all" or {"projectKey": "host/org/repo"}')
        return DecisionEnvelope(
            id=_id(d, "id"), topic=topic,
            text=_checked(domain.normalize_text, _field(d, "text", str)),
            project_key=project_key, author=_author_of(d, "author"),
            created_at=_time(d, "createdAt"), supersedes=_opt_id(d, "supersedes"),
            source_message_id=_opt_id(d, "sourceMessageId"),
        )
    if kind == "retraction":
        reason = d.get("reason")
        if reason is not None:
            reason = _checked(lambda r: questions.normalize_reason(r), reason)
        return RetractionEnvelope(
            id=_id(d, "id"), topic=topic, retracts=_id(d, "retracts"), reason=reason,
            author=_author_of(d, "author"), created_at=_time(d, "createdAt"),
        )
    raise EnvelopeError(f'type: expected "decision" or "retraction"; got {kind[:40]!r}')


def decode_presence(body: bytes) -> PresenceEnvelope:
    d = _object(body, MAX_PRESENCE)
    raw = _field(d, "sessions", list)
    if len(raw) > MAX_PRESENCE_SESSIONS:
        raise EnvelopeError(f"sessions: at most {MAX_PRESENCE_SESSIONS}, got {len(raw)}")
    sessions = []
    for i, s in enumerate(raw):
        where = f"sessions[{i}]"
        if not isinstance(s, dict):
            raise EnvelopeError(f"{where}: expected an object, got {_type(s)}")
        kind, state = _field(s, "kind", str, where), _field(s, "state", str, where)
        if kind not in KINDS:
            raise EnvelopeError(f"{where}.kind: expected interactive or job; got {kind[:40]!r}")
        if state not in SESSION_STATES:
            raise EnvelopeError(f"{where}.state: expected busy, idle or offline; got {state[:40]!r}")
        project = _field(s, "project", str, where)
        if not 1 <= len(project) <= 4096:
            raise EnvelopeError(f"{where}.project: expected 1..4096 characters")
        key = s.get("projectKey")
        sessions.append(PresenceSession(
            id=_id(s, "id", f"{where}.id"), name=_name(s, "name", f"{where}.name"),
            agent=_agent(s, f"{where}.agent"), project=project,
            project_key=None if key is None else _project_key(key, f"{where}.projectKey"),
            kind=kind, state=state,
        ))
    return PresenceEnvelope(at=_time(d, "at"), sessions=tuple(sessions))


# --- the checks -----------------------------------------------------------------------------


def _object(body: bytes, limit: int) -> dict[str, Any]:
    if not isinstance(body, bytes | bytearray):
        raise EnvelopeError(f"body: expected bytes, got {_type(body)}")
    if len(body) > limit:
        raise EnvelopeError(f"body: {len(body)} bytes, more than the {limit} a machine takes")
    try:
        value = jsonlimit.loads(body, MAX_DEPTH)
    except jsonlimit.TooDeep:
        raise EnvelopeError(f"body: JSON nested deeper than {MAX_DEPTH} levels") from None
    except UnicodeDecodeError:
        raise EnvelopeError("body: not UTF-8") from None
    except ValueError:
        raise EnvelopeError("body: not JSON") from None
    if not isinstance(value, dict):
        raise EnvelopeError(f"body: expected a JSON object, got {_type(value)}")
    v = value.get("v")
    if v != VERSION or isinstance(v, bool):
        raise EnvelopeError(f"v: expected {VERSION}, got {json.dumps(v)[:20]} (a newer agent-bridge?)")
    return value


def _field(d: dict[str, Any], key: str, kind: type, where: str = "") -> Any:
    return _named(d, key, kind, f"{where}.{key}" if where else key)


def _id(d: dict[str, Any], key: str, name: str | None = None) -> str:
    value: str = _named(d, key, str, name or key)
    if not ID.match(value):
        raise EnvelopeError(f"{name or key}: expected an id (letters, digits, '.', '_', ':', '-'), "
                            f"got {value[:40]!r}")
    return value


def _opt_id(d: dict[str, Any], key: str) -> str | None:
    return None if d.get(key) is None else _id(d, key)


def _named(d: dict[str, Any], key: str, kind: type, name: str) -> Any:
    if key not in d:
        raise EnvelopeError(f"{name}: missing")
    value = d[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise EnvelopeError(f"{name}: expected {_KIND_NAMES.get(kind, kind.__name__)}, got {_type(value)}")
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise EnvelopeError(f"{name}: not valid text (a lone surrogate)") from None
    return value


_KIND_NAMES = {str: "a string", int: "an integer", dict: "an object", list: "an array"}


def _name(d: dict[str, Any], key: str, name: str) -> str:
    value = _named(d, key, str, name)
    if not domain.AGENT_NAME.match(value) and not (1 <= len(value) <= 80 and value.isprintable()):
        raise EnvelopeError(f"{name}: expected a session name, got {value[:40]!r}")
    return str(value)


def _agent(d: dict[str, Any], name: str) -> str:
    value = _named(d, "agent", str, name)
    if not domain.AGENT_NAME.match(value):
        raise EnvelopeError(f"{name}: expected a short agent name (e.g. claude, codex), got {value[:40]!r}")
    return str(value)


def _author_of(d: dict[str, Any], key: str) -> Author:
    a = _field(d, key, dict)
    return Author(id=_id(a, "id", f"{key}.id"), name=_name(a, "name", f"{key}.name"),
                  agent=_agent(a, f"{key}.agent"))


def _int(d: dict[str, Any], key: str, low: int, high: int) -> int:
    value = _field(d, key, int)
    if not low <= value <= high:
        raise EnvelopeError(f"{key}: expected {low}..{high}, got {value}")
    return int(value)


def _time(d: dict[str, Any], key: str) -> int:
    return _int(d, key, 0, TIME_MAX)


def _project_key(value: object, name: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > 500 or not PROJECT_KEY.match(value):
        raise EnvelopeError(f"{name}: expected a project key like github.com/org/repo")
    return value


def _checked(normalize: Any, value: object) -> Any:
    try:
        return normalize(value)
    except domain.InputError as e:
        raise EnvelopeError(str(e)) from None


def _type(value: object) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string",
            list: "an array", dict: "an object"}.get(type(value), type(value).__name__)
