"""The rows the process passes around: sessions, messages, receipts, decisions, retractions,
owner questions.

Read from bridge.db by `store.queries` and the writer, handed between the store, the broker,
the dashboard and the hooks as these small immutable tuples, and turned into the SPEC's JSON
objects (§2, §4, §5) only where JSON is written: each row's `to_json()`.

NamedTuples, not dataclasses: they are built for every message on the delivery path, and the
SessionStart hook imports this module at every session start, where importing `dataclasses`
(and with it `inspect`) costs milliseconds (SPEC §9). Standard library and the domain rules only.
"""

from __future__ import annotations

import functools
from json.encoder import encode_basestring
from typing import Any, NamedTuple

from agent_bridge.common import domain
from agent_bridge.common.domain import Scope, SessionView

JSON = dict[str, Any]


class Author(NamedTuple):
    """Who sent a message or recorded a decision, under the name it had then. Null fields: a
    sender whose record is gone."""

    id: str | None
    name: str | None
    agent: str | None

    def to_json(self) -> JSON:
        out: JSON = {"id": self.id, "name": self.name, "agent": self.agent}
        if self.id and "@" in self.id:  # another machine's session: its record's id is `<id>@<machine>`
            out["machine"] = self.id.rsplit("@", 1)[1]
        return out


class Peer(NamedTuple):
    """A session record (the peers table, SPEC §3)."""

    id: str
    name: str
    agent: str
    project: str
    host_session_id: str | None
    kind: str
    created_at: int
    last_seen_at: int

    @property
    def is_job(self) -> bool:
        return self.kind == "job"

    def view(self) -> SessionView:
        return SessionView(
            id=self.id,
            name=self.name,
            project=self.project,
            host_session_id=self.host_session_id,
            kind=self.kind,
        )

    def public(self) -> JSON:
        """The `whoami` object; `peers` adds `connected`."""
        return {
            "id": self.id,
            "name": self.name,
            "agent": self.agent,
            "project": self.project,
            "hostSessionId": self.host_session_id,
            "kind": self.kind,
        }

    def to_json(self) -> JSON:
        """The public object and when the record was created and last seen (the dashboard)."""
        return {**self.public(), "createdAt": self.created_at, "lastSeenAt": self.last_seen_at}


class Decision(NamedTuple):
    """One revision of a pinned owner decision (SPEC §4.1)."""

    id: str
    topic: str
    text: str
    scope: Scope
    author: Author
    created_at: int
    source_message_id: str | None
    supersedes: str | None
    current: bool

    @classmethod
    def from_row(cls, values: tuple[Any, ...], scope: Scope | None = None) -> Decision:
        """A row of `store.queries.DECISION_COLUMNS` (its first value, the seq, is skipped);
        `scope`: the row's stored scope already parsed, if the caller has it."""
        (_, did, topic, text, scope_json, author_id, author_name, author_agent, created, source, supersedes,
         current) = values
        return cls(
            did,
            topic,
            text,
            scope if scope is not None else domain.scope_from_json(scope_json),
            Author(author_id, author_name, author_agent),
            created,
            source,
            supersedes,
            bool(current),
        )

    @property
    def machine(self) -> str | None:
        """The machine that recorded it (None: this one): another machine's author record is
        `<its id>@<machine>` (SPEC §10), as `author.machine` in the JSON says."""
        author_id = self.author.id
        return author_id.rsplit("@", 1)[1] if author_id and "@" in author_id else None

    def line(self, limit: int | None = None) -> str:
        """`topic: text` on one line (domain.topic_line), and `(recorded on MACHINE)` when
        another machine of the team recorded it (SPEC §10)."""
        line = domain.topic_line(self.topic, self.text, limit)
        machine = self.machine
        return line if machine is None else f"{line} (recorded on {machine})"

    def to_json(self) -> JSON:
        """The decision object: exactly these fields, nullable ones null (SPEC §4.1, §6)."""
        return {
            "id": self.id,
            "topic": self.topic,
            "text": self.text,
            "scope": self.scope,
            "author": self.author.to_json(),
            "createdAt": self.created_at,
            "sourceMessageId": self.source_message_id,
            "supersedes": self.supersedes,
            "current": self.current,
        }


class Retraction(NamedTuple):
    """A topic's current decision withdrawn (`agent-bridge retract`)."""

    id: str
    topic: str
    retracts: str
    reason: str | None
    author: Author
    created_at: int

    def to_json(self) -> JSON:
        return {
            "id": self.id,
            "topic": self.topic,
            "retracts": self.retracts,
            "reason": self.reason,
            "author": self.author.to_json(),
            "createdAt": self.created_at,
        }


class Question(NamedTuple):
    """A question for the human owner and what became of it (SPEC §4.6). `id` is the id of the
    bridge message (kind question) that carries it; `asked_by`: the first asker, then each
    session that joined, under the names they had then."""

    id: str
    question: str
    topic: str | None
    options: tuple[str, ...]
    scope: Scope
    asked_by: tuple[Author, ...]
    created_at: int
    state: str  # "open", "answered", "declined" or "withdrawn" (every asker withdrew it)
    decision_id: str | None = None
    reason: str | None = None
    context: str | None = None  # what the first asker already knew
    recommended: int | None = None  # the index of the option the first asker recommended

    @property
    def open(self) -> bool:
        return self.state == "open"

    def to_json(self) -> JSON:
        """The question object: exactly these fields, nullable ones null (SPEC §4.6); and
        `context` and `recommended` where the asker gave them (richer questions)."""
        out: JSON = {
            "id": self.id,
            "question": self.question,
            "topic": self.topic,
            "options": list(self.options),
            "scope": self.scope,
            "askedBy": [a.to_json() for a in self.asked_by],
            "createdAt": self.created_at,
            "state": self.state,
            "decisionId": self.decision_id,
            "reason": self.reason,
        }
        if self.context is not None:
            out["context"] = self.context
        if self.recommended is not None:
            out["recommended"] = self.recommended
        return out


class Message(NamedTuple):
    """A bridge message as one recipient gets it (SPEC §5 `inbox`): `kind` is "message",
    "decision" (a decision notice, carrying `decision`), "retraction" (carrying `retraction`)
    or "answer" (the owner answered or declined a question the recipient asked, carrying
    `question`), or "job" (the end of a run of a job the recipient delegated, SPEC §4.7);
    `repeat`: offered to the host before and not acknowledged since (SPEC §3)."""

    id: str
    sender: Author
    to_id: str
    to_name: str | None
    text: str
    hop: int
    reply_to: str | None
    kind: str
    created_at: int
    decision: Decision | None = None
    retraction: Retraction | None = None
    repeat: bool = False
    question: Question | None = None

    def to_json(self) -> JSON:
        out: JSON = {
            "id": self.id,
            "from": self.sender.to_json(),
            "to": {"id": self.to_id, "name": self.to_name},
            "text": self.text,
            "hop": self.hop,
            "replyTo": self.reply_to,
            "kind": self.kind,
            "createdAt": self.created_at,
        }
        if self.decision is not None:
            out["decision"] = self.decision.to_json()
        if self.retraction is not None:
            out["retraction"] = self.retraction.to_json()
        if self.question is not None:
            out["question"] = self.question.to_json()
        if self.repeat:
            out["repeat"] = True
        return out

    def to_json_text(self, spaced: bool = False) -> str | None:
        """`to_json()` as JSON text, the very text the standard library's encoder writes for it
        (ensure_ascii off; `spaced`: json.dumps's default separators, a tool's text; else the
        wire's compact ones), or None for a message this does not write (a notice, a repeat, a
        sender of another machine): the caller encodes `to_json()` itself.

        Written from a template with each string escaped once in C, and remembered for the
        last MEMO messages: a message on its way is written twice (its `send` answer and its
        push), and the encoder's walk through the object cost the broker's loop a quarter of
        its instructions per message (docs/performance.md, stop 57)."""
        sender = self.sender
        if (
            self.decision is not None or self.retraction is not None or self.question is not None
            or self.repeat or type(self.hop) is not int or type(self.created_at) is not int
            or (sender.id and "@" in sender.id)
        ):
            return None
        try:
            return (_message_text if len(self.text) <= MEMO_TEXT else _message_text.__wrapped__)(self, spaced)
        except TypeError:  # a field that is neither text nor null (encode_basestring takes a str)
            return None


class MessageJSON(dict[str, Any]):
    """A message's `to_json()` object that keeps its row, so that what writes it can take the
    row's own text (Message.to_json_text, `text`). Read-only, so the two never differ: a
    changed copy (`dict(m, repeat=True)`) is a plain dict, written by the encoder."""

    __slots__ = ("row",)

    def __init__(self, row: Message) -> None:
        super().__init__(row.to_json())
        self.row = row

    def text(self, spaced: bool = False) -> str | None:
        return self.row.to_json_text(spaced)

    def _read_only(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a message's JSON is read-only: change a copy (dict(message, ...))")

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = __ior__ = _read_only


# Messages whose text _message_text remembers (more than the sends of a batch in flight, whose
# pushes follow their answers), and the longest text it keeps: at most a few MB held.
MEMO = 256
MEMO_TEXT = 4096

# Message.to_json()'s object, compact; its keys are fixed, its values filled in as JSON.
_MESSAGE = (
    '{"id":%s,"from":{"id":%s,"name":%s,"agent":%s},"to":{"id":%s,"name":%s},"text":%s,'
    '"hop":%d,"replyTo":%s,"kind":%s,"createdAt":%d}'
)
# The same with json.dumps's default separators (only the template's own text has '":' and ',"').
_MESSAGE_SPACED = _MESSAGE.replace('":', '": ').replace(',"', ', "')


def _string(value: str | None) -> str:
    return "null" if value is None else encode_basestring(value)


@functools.lru_cache(maxsize=MEMO)
def _message_text(m: Message, spaced: bool) -> str:
    sender = m.sender
    return (_MESSAGE_SPACED if spaced else _MESSAGE) % (
        _string(m.id), _string(sender.id), _string(sender.name), _string(sender.agent), _string(m.to_id),
        _string(m.to_name), _string(m.text), m.hop, _string(m.reply_to), _string(m.kind), m.created_at,
    )


class Queued(NamedTuple):
    """An unacknowledged receipt, as a delivery task pushes it: the receipt's rowid (the order
    of delivery, the task's cursor) and the message."""

    seq: int
    message: Message


class Receipt(NamedTuple):
    """One recipient's copy of a message as the dashboard lists it: the receipt's rowid, the
    message, and whether the recipient acknowledged it."""

    seq: int
    message: Message
    acked: bool = False

    def to_json(self) -> JSON:
        """The message with `acked` (the dashboard's recent messages)."""
        return {**self.message.to_json(), "acked": self.acked}


SENT_TEXT_MAX = 120  # characters of a message's text in its sender's receipts (the sender has it all)


class SentReceipt(NamedTuple):
    """A message as its sender follows it (SPEC §3 "Receipts for the sender", the `sent` tool):
    the message, when it was shown (its bytes reached the host: the receipt's delivered_at)
    and acknowledged, when wakes were requested for it, and the ids of the replies to it."""

    message: Message
    shown_at: int | None
    acked_at: int | None
    wakes: tuple[int, ...] = ()
    replies: tuple[str, ...] = ()
    send_id: str | None = None  # the message_id its send was given (a `*` send's copies share it)

    @property
    def state(self) -> str:
        return domain.receipt_state(self.shown_at, self.acked_at)

    def woken(self, now: int) -> str | None:
        return domain.wake_state(self.wakes, self.shown_at, self.acked_at, now)

    def to_json(self, now: int) -> JSON:
        """`now`: the time `woken` is judged at (a wake turns unconfirmed as time passes)."""
        m = self.message
        text = m.text if len(m.text) <= SENT_TEXT_MAX else m.text[: SENT_TEXT_MAX - 1] + "…"
        return {
            "id": m.id,
            "to": {"id": m.to_id, "name": m.to_name},
            "kind": m.kind,
            "text": text,
            "replyTo": m.reply_to,
            "createdAt": m.created_at,
            **self.receipt_json(now),
            "replies": list(self.replies),
        }

    def receipt_json(self, now: int) -> JSON:
        """The receipt alone (the dashboard's recent messages carry it): state, times, woken."""
        return {
            "state": self.state,
            # An acknowledged message was shown by then at the latest (a receipt of an older
            # schema may lack the time it was shown).
            "shownAt": self.shown_at if self.shown_at is not None else self.acked_at,
            "acknowledgedAt": self.acked_at,
            "woken": self.woken(now),
        }


class Forgotten(NamedTuple):
    """A session `agent-bridge forget` removed, and what was still queued to it."""

    peer: Peer
    dropped: list[Message]

    def to_json(self) -> JSON:
        return {
            "session": self.peer.public(),
            "lastSeen": self.peer.last_seen_at,
            "dropped": [m.to_json() for m in self.dropped],
        }


class JobRow(NamedTuple):
    """A job (SPEC §4.7) as its record and its last events say: `state` is the last event's;
    `pid`/`pid_start` the running process (for adoption); `run` the run the state belongs to."""

    id: str
    name: str
    peer_id: str
    parent: Author
    agent: str
    title: str
    task: str
    access: str
    project: str
    cwd: str
    worktree: str | None
    branch: str | None
    model: str | None
    depth: int
    timeout_ms: int
    created_at: int
    state: str
    run: int
    thread: str | None
    started_at: int | None
    ended_at: int | None
    last_step: str | None
    answer: str | None
    pid: int | None
    pid_start: int | None
    prompt: str | None  # the message of a queued `continue`

    def to_json(self) -> JSON:
        return {
            "id": self.id, "name": self.name, "agent": self.agent, "title": self.title,
            "access": self.access, "worktree": self.worktree, "branch": self.branch,
            "state": self.state, "parent": self.parent.to_json(), "thread": self.thread,
            "startedAt": self.started_at, "endedAt": self.ended_at, "lastStep": self.last_step,
            "answer": self.answer,
        }


# --- what the owner's alerts read (SPEC §4.6 "The owner is told"; core.alerts, store.alert_queries) ---

QUESTION, JOB, MESSAGE = "question", "job", "message"
ALERT_KINDS = (QUESTION, JOB, MESSAGE)


class Cursor(NamedTuple):
    """The newest row of each kind already considered: questions.seq, job_events.seq, the
    rowid of messages."""

    question: int = 0
    job_event: int = 0
    message: int = 0

    def advanced(self, other: Cursor) -> Cursor:
        return Cursor(*(max(a, b) for a, b in zip(self, other, strict=True)))


class Event(NamedTuple):
    """A row that may alert, as read: its kind, its sequence number within its kind, and what
    the alert says about it."""

    kind: str  # QUESTION, JOB or MESSAGE
    key: str  # the question's id, "<job id>:<run>", the message's id
    seq: int
    at: int  # epoch ms: when it was asked, ended, sent
    who: str  # the asker, the job's name, the sender
    text: str  # the question, the job's title, the message
    state: str | None = None  # a job's end: finished, failed, cancelled, interrupted


class OpenQuestion(NamedTuple):
    id: str
    at: int  # epoch ms it was asked
    who: str
    text: str


class Snapshot(NamedTuple):
    """What bridge.db held at one moment: the newest row of each kind, the rows past the
    cursor it was read from, and the questions open now."""

    cursor: Cursor
    events: tuple[Event, ...]
    open_questions: tuple[OpenQuestion, ...]
