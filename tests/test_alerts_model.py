"""The alerts machine (core/alerts.py, SPEC §4.6 "The owner is told") with a mock clock: what
alerts, once; the reminder once after 15 minutes for a question still open, none for one answered;
bursts counted; texts cut to 200 characters on one line. No I/O: snapshots are built here."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_bridge.common.rows import JOB, MESSAGE, QUESTION, Cursor, Event, OpenQuestion, Snapshot
from agent_bridge.core.alerts import BURST, QUIET_MS, REMIND_AFTER_MS, TEXT_MAX, AlertMachine, one_line

T0 = 1_800_000_000_000  # epoch ms: the broker's start
MINUTE = 60_000


def question(seq: int, at: int, text: str = "Which database?", who: str = "claude-app") -> Event:
    return Event(QUESTION, f"q{seq}", seq, at, who, text)


def opened(*events: Event) -> tuple[OpenQuestion, ...]:
    return tuple(OpenQuestion(e.key, e.at, e.who, e.text) for e in events)


def snap(cursor: Cursor, events: tuple[Event, ...] = (),
         open_questions: tuple[OpenQuestion, ...] = ()) -> Snapshot:
    return Snapshot(cursor, events, open_questions)


def started(first: Snapshot | None = None, now: int = T0) -> AlertMachine:
    machine = AlertMachine()
    machine.start(first or snap(Cursor()), now)
    return machine


def test_a_new_question_alerts_once_and_is_reminded_once_after_15_minutes_while_open() -> None:
    m = started()
    q = question(1, T0 + 1000, "Which database should the app use?")
    [alert] = m.feed(snap(Cursor(1, 0, 0), (q,), opened(q)), T0 + 1000)
    assert alert.kind == QUESTION and not alert.reminder
    assert alert.title == "agent-bridge: question from claude-app"
    assert alert.body == "Which database should the app use?"
    # the same rows read again (another commit, nothing new): nothing
    assert m.feed(snap(Cursor(1, 0, 0), (q,), opened(q)), T0 + 2000) == []
    assert m.next_due() == q.at + REMIND_AFTER_MS
    # one millisecond early: nothing; due: the reminder; after: never again
    assert m.feed(snap(Cursor(1, 0, 0), (), opened(q)), q.at + REMIND_AFTER_MS - 1) == []
    [reminder] = m.feed(snap(Cursor(1, 0, 0), (), opened(q)), q.at + REMIND_AFTER_MS)
    assert reminder.reminder and reminder.key == "q1"
    assert reminder.title == "agent-bridge: question still open after 15 min"
    assert reminder.body == "claude-app: Which database should the app use?"
    assert m.next_due() is None
    assert m.feed(snap(Cursor(1, 0, 0), (), opened(q)), q.at + 10 * REMIND_AFTER_MS) == []


def test_a_question_answered_before_its_reminder_is_not_reminded() -> None:
    m = started()
    q = question(1, T0)
    assert len(m.feed(snap(Cursor(1, 0, 0), (q,), opened(q)), T0)) == 1
    assert m.feed(snap(Cursor(1, 0, 0), (), ()), T0 + 5 * MINUTE) == []  # answered: no longer open
    assert m.next_due() is None
    assert m.feed(snap(Cursor(1, 0, 0), (), ()), T0 + 20 * MINUTE) == []


def test_a_question_answered_before_it_was_read_alerts_nothing() -> None:
    m = started()
    q = question(1, T0)
    assert m.feed(snap(Cursor(1, 0, 0), (q,), ()), T0) == []
    assert m.next_due() is None


def test_a_job_end_and_a_message_to_the_owner_alert_once() -> None:
    m = started()
    job = Event(JOB, "j1:1", 7, T0, "codex-job-1a2b3c4d", "Review the diff", "finished")
    msg = Event(MESSAGE, "m1", 12, T0, "codex-app", "The migration is done;\n\x1b[31mplease look")
    alerts = m.feed(snap(Cursor(0, 7, 12), (job, msg)), T0)
    assert [(a.kind, a.title, a.body) for a in alerts] == [
        (JOB, "agent-bridge: job codex-job-1a2b3c4d finished", "Review the diff"),
        (MESSAGE, "agent-bridge: message from codex-app", "The migration is done; [31mplease look"),
    ]
    assert m.feed(snap(Cursor(0, 7, 12), (job, msg)), T0 + 1) == []


def test_what_the_database_held_at_start_never_alerts_and_only_future_reminders_are_kept() -> None:
    old = question(1, T0 - 20 * MINUTE)  # past due at start: reminded by an earlier broker, or never
    recent = question(2, T0 - 5 * MINUTE)
    m = started(snap(Cursor(2, 4, 9), (), opened(old, recent)))
    assert m.feed(snap(Cursor(2, 4, 9), (old, recent), opened(old, recent)), T0) == []
    assert m.next_due() == recent.at + REMIND_AFTER_MS
    [reminder] = m.feed(snap(Cursor(2, 4, 9), (), opened(old, recent)), recent.at + REMIND_AFTER_MS)
    assert reminder.key == "q2"


def test_more_than_a_burst_of_one_kind_is_one_counting_alert() -> None:
    m = started()
    messages = tuple(Event(MESSAGE, f"m{i}", i, T0, "codex-app", f"note {i}") for i in range(1, 51))
    job = Event(JOB, "j1:1", 1, T0, "codex-job-1a2b3c4d", "Review", "failed")
    alerts = m.feed(snap(Cursor(0, 1, 50), (*messages, job)), T0)
    assert [(a.kind, a.title) for a in alerts] == [
        (JOB, "agent-bridge: job codex-job-1a2b3c4d failed"),
        (MESSAGE, "agent-bridge: 50 messages for you"),
    ]
    assert alerts[1].keys == tuple(e.key for e in messages)
    # the next messages wait out the quiet time, then come as they are (no more than a burst)
    few = tuple(Event(MESSAGE, f"m{i}", i, T0, "codex-app", f"note {i}") for i in range(51, 51 + BURST))
    assert m.feed(snap(Cursor(0, 1, 50 + BURST), few), T0 + 1) == []
    assert m.next_due() == T0 + QUIET_MS
    again = m.feed(snap(Cursor(0, 1, 50 + BURST)), T0 + QUIET_MS)
    assert [a.body for a in again] == [f"note {i}" for i in range(51, 51 + BURST)]
    assert m.next_due() is None


def test_an_agent_that_writes_to_the_owner_every_second_makes_an_alert_per_quiet_time() -> None:
    m = started()
    alerts = []
    for i in range(1, 61):
        msg = Event(MESSAGE, f"m{i}", i, T0 + i * 1000, "codex-app", f"note {i}")
        alerts += m.feed(snap(Cursor(0, 0, i), (msg,)), T0 + i * 1000)
    alerts += m.feed(snap(Cursor(0, 0, 60)), T0 + 60_000 + QUIET_MS)  # what the last quiet time held
    assert len(alerts) <= 60 // (QUIET_MS // 1000) + 1
    assert sorted(k for a in alerts for k in a.keys) == sorted(f"m{i}" for i in range(1, 61))  # each once


def test_a_question_held_in_a_quiet_time_and_answered_meanwhile_alerts_nothing() -> None:
    m = started()
    first, second = question(1, T0), question(2, T0 + 1000)
    assert len(m.feed(snap(Cursor(1, 0, 0), (first,), opened(first)), T0)) == 1
    assert m.feed(snap(Cursor(2, 0, 0), (second,), opened(first, second)), T0 + 1000) == []  # held
    assert m.feed(snap(Cursor(2, 0, 0), (), opened(first)), T0 + QUIET_MS) == []  # answered meanwhile
    assert m.next_due() == first.at + REMIND_AFTER_MS


def test_texts_are_one_line_and_never_longer_than_200_characters() -> None:
    m = started()
    q = question(1, T0, "x" * 1000, who="n" * 40)
    [alert] = m.feed(snap(Cursor(1, 0, 0), (q,), opened(q)), T0)
    assert len(alert.body) == TEXT_MAX and alert.body.endswith("…")
    [reminder] = m.feed(snap(Cursor(1, 0, 0), (), opened(q)), T0 + REMIND_AFTER_MS)
    assert len(reminder.body) <= TEXT_MAX + 60 + 2 and reminder.body.count("x") < TEXT_MAX
    assert one_line("a\u202eb\n\tc") == "a b c"


def test_feeding_before_start_is_a_programming_error() -> None:
    with pytest.raises(RuntimeError):
        AlertMachine().feed(snap(Cursor()), T0)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["ask", "answer", "tick", "reread"]), st.integers(0, 20 * MINUTE)),
                max_size=40))
def test_against_a_model_each_question_alerts_once_and_is_reminded_at_most_once(steps) -> None:
    """Random asks, answers, clock steps and rereads of the same rows: each question alerts exactly
    once when read open, a reminder comes only for a question open at its due time, at most once,
    and never early."""
    m = started()
    now, seq = T0, 0
    asked: dict[str, int] = {}  # open question -> asked at
    answered: set[str] = set()
    events: list[Event] = []
    told: dict[str, int] = {}
    reminded: dict[str, int] = {}
    for action, step in steps:
        now += step
        if action == "ask":
            seq += 1
            q = question(seq, now)
            asked[q.key] = now
            events.append(q)
        elif action == "answer" and asked:
            key = sorted(asked)[step % len(asked)]
            del asked[key]
            answered.add(key)
        cursor = Cursor(seq, 0, 0)
        window = tuple(events[-5:] if action == "reread" else events)
        open_now = tuple(OpenQuestion(k, at, "claude-app", "Which database?") for k, at in asked.items())
        for alert in m.feed(snap(cursor, window, open_now), now):
            for key in alert.keys:
                assert key in asked  # only questions open now
                if alert.reminder:
                    assert now >= asked[key] + REMIND_AFTER_MS
                    reminded[key] = reminded.get(key, 0) + 1
                else:
                    told[key] = told.get(key, 0) + 1
        events = [e for e in events if e.key in asked or e.key not in told]
    now += QUIET_MS  # whatever a quiet time held comes out now
    open_now = tuple(OpenQuestion(k, at, "claude-app", "Which database?") for k, at in asked.items())
    for alert in m.feed(snap(Cursor(seq, 0, 0), (), open_now), now):
        counts = reminded if alert.reminder else told
        for key in alert.keys:
            counts[key] = counts.get(key, 0) + 1
    assert set(asked) <= set(told)  # every question still open was told of
    assert all(n == 1 for n in told.values())
    assert all(n == 1 for n in reminded.values())
    # every question still open and past due by the end was reminded
    for key, at in asked.items():
        if now >= at + REMIND_AFTER_MS:
            assert reminded.get(key) == 1
