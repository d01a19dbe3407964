"""What the owner is alerted of (SPEC §4.6 "The owner is told"), with no I/O: the broker's alerts
task (broker/alerts/task.py) reads what bridge.db holds after each commit, feeds it here as a
`Snapshot` with the time, and sends the `Alert`s it gets back as desktop notifications.

Rules:
- each new open question, each run of a job that ended and each message to the owner (`cli`)
  alerts once: the machine keeps a cursor per kind (the rows' sequence numbers), and only rows
  past it are new; the cursor starts at what the database held when the broker started, so a
  restart alerts nothing again;
- a question answered before it was read alerts nothing;
- more than BURST of one kind at once are one alert that counts them, and after an alert of a
  kind the next ones of that kind wait QUIET_MS and then come together: an agent that sends the
  owner fifty messages in a row makes a notification or two, not fifty;
- a question still open REMIND_AFTER_MS after it was asked alerts once more, once; one answered
  (or declined, or withdrawn) meanwhile does not. Questions already open when the broker started
  get their reminder if it is still to come; one already past due is not reminded again;
- an alert's texts are one line each, and never more than TEXT_MAX characters of what an agent
  wrote (the question, the message, the job's title).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import NamedTuple

from agent_bridge.common.rows import ALERT_KINDS as KINDS
from agent_bridge.common.rows import JOB, MESSAGE, QUESTION, Cursor, Event, OpenQuestion, Snapshot

REMIND_AFTER_MS = 15 * 60 * 1000  # SPEC §4.6: a question still open 15 minutes later alerts once more
TEXT_MAX = 200  # characters of an agent's text an alert carries (SPEC §4.6)
NAME_MAX = 60  # characters of a session's or job's name in a title
BURST = 3  # more of one kind at once become one counting alert
QUIET_MS = 10_000  # after an alert of a kind, newer ones of that kind wait this long, then alert together
HELD_MAX = 100  # events of a kind held for the next alert; more are only counted

_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f\u200e\u200f\u061c\u202a-\u202e\u2066-\u2069\s]+")


def one_line(text: str, limit: int = TEXT_MAX) -> str:
    """`text` on one line (controls and runs of white space become one space), cut at `limit`
    characters with …."""
    flat = _CONTROLS.sub(" ", text).strip()
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class Alert(NamedTuple):
    kind: str
    title: str
    body: str
    key: str  # what it is about (a question's id, a job run, a message id; "" for a count)
    reminder: bool = False
    keys: tuple[str, ...] = ()  # every event it covers (a count covers several)


@dataclass
class AlertMachine:
    """Alerts from snapshots; `start` once with the first, then `feed` each later one."""

    remind_after_ms: int = REMIND_AFTER_MS
    quiet_ms: int = QUIET_MS
    cursor: Cursor | None = None
    reminders: dict[str, int] = field(default_factory=dict)  # open question id -> when it is due (ms)
    held: dict[str, list[Event]] = field(default_factory=dict)  # kind -> new, not yet alerted
    dropped: dict[str, int] = field(default_factory=dict)  # kind -> held beyond HELD_MAX: counted only
    quiet_until: dict[str, int] = field(default_factory=dict)  # kind -> its next alert not before (ms)

    def start(self, first: Snapshot, now: int) -> None:
        """The broker started: what the database holds was told before (or while no broker
        ran); only the reminders still to come are kept."""
        self.cursor = first.cursor
        for q in first.open_questions:
            due = q.at + self.remind_after_ms
            if due > now:
                self.reminders[q.id] = due

    def feed(self, snapshot: Snapshot, now: int) -> list[Alert]:
        """The alerts for what is new since the last snapshot (held while its kind is quiet),
        and the reminders due by `now`."""
        if self.cursor is None:
            raise RuntimeError("AlertMachine.feed before start")
        before = self.cursor
        self.cursor = before.advanced(snapshot.cursor)
        open_now = {q.id: q for q in snapshot.open_questions}
        for e in snapshot.events:
            if e.seq <= before[KINDS.index(e.kind)]:
                continue  # read before: considered already
            if e.kind == QUESTION:
                if e.key not in open_now:
                    continue  # answered before anyone was told: nothing to do
                self.reminders[e.key] = e.at + self.remind_after_ms
            held = self.held.setdefault(e.kind, [])
            if len(held) < HELD_MAX:
                held.append(e)
            else:
                self.dropped[e.kind] = self.dropped.get(e.kind, 0) + 1
        alerts: list[Alert] = []
        for kind in KINDS:
            events = self.held.get(kind, [])
            if kind == QUESTION:
                events = [e for e in events if e.key in open_now]  # answered while held: nothing
            if not events or now < self.quiet_until.get(kind, 0):
                self.held[kind] = events
                continue
            n = len(events) + self.dropped.pop(kind, 0)
            alerts += [_count(kind, n, events)] if n > BURST else [_alert(e) for e in events]
            self.held[kind] = []
            self.quiet_until[kind] = now + self.quiet_ms
        for qid, due in sorted(self.reminders.items(), key=lambda item: item[1]):
            q = open_now.get(qid)
            if q is None:
                del self.reminders[qid]  # answered, declined or withdrawn: no reminder
            elif due <= now:
                del self.reminders[qid]
                alerts.append(self._reminder(q))
        return alerts

    def next_due(self) -> int | None:
        """When a snapshot should be fed next (epoch ms) though nothing was committed: the next
        reminder, or the end of a quiet time with alerts held. None: only after a commit."""
        times = list(self.reminders.values())
        times += [self.quiet_until.get(kind, 0) for kind, held in self.held.items() if held]
        return min(times, default=None)

    def _reminder(self, q: OpenQuestion) -> Alert:
        minutes = round(self.remind_after_ms / 60_000)
        return Alert(
            QUESTION,
            f"agent-bridge: question still open after {minutes} min",
            f"{one_line(q.who, NAME_MAX)}: {one_line(q.text)}",
            q.id,
            reminder=True,
            keys=(q.id,),
        )


def _alert(e: Event) -> Alert:
    who = one_line(e.who, NAME_MAX)
    if e.kind == QUESTION:
        title = f"agent-bridge: question from {who}"
    elif e.kind == JOB:
        title = f"agent-bridge: job {who} {e.state}"
    else:
        title = f"agent-bridge: message from {who}"
    return Alert(e.kind, title, one_line(e.text), e.key, keys=(e.key,))


_COUNTED = {
    QUESTION: ("{n} new questions for you", "agent-bridge questions lists them"),
    JOB: ("{n} jobs ended", "agent-bridge jobs --all lists them"),
    MESSAGE: ("{n} messages for you", "the dashboard shows them"),
}


def _count(kind: str, n: int, events: list[Event]) -> Alert:
    title, body = _COUNTED[kind]
    return Alert(kind, "agent-bridge: " + title.format(n=n), body, "", keys=tuple(e.key for e in events))
