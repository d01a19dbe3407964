"""What the owner's alerts read (SPEC §4.6 "The owner is told", core/alerts.py): the newest row of
each kind, the rows past a cursor (new questions, runs of jobs that ended, messages to the
owner), and the questions open now. On any connection; run inside one read transaction
(`reader.reading`) so that the cursor and the rows agree. A database from before questions or
jobs existed answers with none of them."""

from __future__ import annotations

import apsw

from agent_bridge.common.rows import JOB, MESSAGE, QUESTION, Cursor, Event, OpenQuestion, Snapshot
from agent_bridge.store.job_queries import ENDED
from agent_bridge.store.queries import CLI_ID, has_table, question_sql

ROWS_MAX = 100  # rows of one kind read in one snapshot; the machine counts more than a few as one alert

_FIRST_ASKER = "(SELECT a.name FROM question_askers a WHERE a.question_id = q.id ORDER BY a.seq LIMIT 1)"


def snapshot(conn: apsw.Connection, since: Cursor | None) -> Snapshot:
    """The newest rows and, past `since` (None: the first snapshot, no rows), the rows that may
    alert, oldest first."""
    questions, jobs = has_table(conn, "questions"), has_table(conn, "job_events")
    cursor = Cursor(
        _max(conn, "SELECT max(seq) FROM questions") if questions else 0,
        _max(conn, "SELECT max(seq) FROM job_events") if jobs else 0,
        _max(conn, "SELECT max(rowid) FROM messages"),
    )
    events: list[Event] = []
    if since is not None:
        if questions:
            events += [
                Event(QUESTION, qid, seq, at, who or "an agent", text)
                for seq, qid, at, who, text in conn.execute(
                    f"SELECT q.seq, q.id, q.created_at, {_FIRST_ASKER}, q.question FROM questions q "
                    "WHERE q.seq > ? AND q.seq <= ? ORDER BY q.seq LIMIT ?",
                    (since.question, cursor.question, ROWS_MAX))
            ]
        if jobs:
            ended = ",".join(f"'{s}'" for s in ENDED)
            events += [
                Event(JOB, f"{job_id}:{run}", seq, at, name, title, state)
                for seq, job_id, run, at, name, title, state in conn.execute(
                    "SELECT e.seq, e.job_id, e.run, e.at, j.name, j.title, e.state FROM job_events e "
                    f"JOIN jobs j ON j.id = e.job_id WHERE e.seq > ? AND e.seq <= ? AND e.state IN ({ended}) "
                    "ORDER BY e.seq LIMIT ?",
                    (since.job_event, cursor.job_event, ROWS_MAX))
            ]
        not_a_question = "AND m.id NOT IN (SELECT id FROM questions) " if questions else ""
        events += [
            Event(MESSAGE, mid, seq, at, who or "an agent", text)
            for seq, mid, at, who, text in conn.execute(
                "SELECT m.rowid, m.id, m.created_at, p.name, m.body FROM messages m "
                "LEFT JOIN peers p ON p.id = m.from_peer "
                f"WHERE m.to_peer = ? AND m.rowid > ? AND m.rowid <= ? {not_a_question}"
                "ORDER BY m.rowid LIMIT ?",
                (CLI_ID, since.message, cursor.message, ROWS_MAX))
        ]
    return Snapshot(cursor, tuple(events), open_questions(conn) if questions else ())


def open_questions(conn: apsw.Connection) -> tuple[OpenQuestion, ...]:
    """Questions neither answered, declined nor withdrawn (the open term of this schema)."""
    ends = "LEFT JOIN question_ends e ON e.question_id = q.id " if has_table(conn, "question_ends") else ""
    return tuple(
        OpenQuestion(qid, at, who or "an agent", text)
        for qid, at, who, text in conn.execute(
            f"SELECT q.id, q.created_at, {_FIRST_ASKER}, q.question FROM questions q "
            f"LEFT JOIN question_outcomes o ON o.question_id = q.id {ends}"
            f"WHERE {question_sql(conn)[1]} ORDER BY q.seq")
    )


def _max(conn: apsw.Connection, sql: str) -> int:
    row = conn.execute(sql).fetchone()
    return 0 if row is None or row[0] is None else int(row[0])
