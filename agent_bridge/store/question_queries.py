"""Read queries over the owner's questions (SPEC §4.6), shared by the writer (broker), the
read-only readers (`agent-bridge questions`, the dashboard, the UserPromptSubmit hook) and the
tests. A database from before version 6 has no questions: every lookup answers empty.

Light: apsw, the rows and `store.queries` only (the hook imports this at every prompt).
"""

from __future__ import annotations

import apsw

from agent_bridge.common.rows import Question
from agent_bridge.store.queries import has_table, question_from_row, question_sql


def list_questions(conn: apsw.Connection, *, include_closed: bool = False) -> list[Question]:
    """Open questions (every question with `include_closed`), oldest first."""
    if not has_table(conn, "questions"):
        return []
    select, is_open = question_sql(conn)
    where = "" if include_closed else f"WHERE {is_open} "
    return [question_from_row(v) for v in conn.execute(select + where + "ORDER BY q.seq")]


def open_count(conn: apsw.Connection) -> int:
    if not has_table(conn, "questions"):
        return 0
    ends = has_table(conn, "question_ends")
    row = conn.execute(
        "SELECT count(*) FROM questions q LEFT JOIN question_outcomes o ON o.question_id = q.id "
        + ("LEFT JOIN question_ends e ON e.question_id = q.id " if ends else "")
        + f"WHERE {question_sql(conn)[1]}"
    ).fetchone()
    return 0 if row is None else int(row[0])


def ids_starting(conn: apsw.Connection, prefix: str, limit: int = 10) -> list[str]:
    """The ids of questions whose id starts with `prefix` (the owner may type a unique start)."""
    if not has_table(conn, "questions"):
        return []
    pattern = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    rows = conn.execute(
        "SELECT id FROM questions WHERE id LIKE ? ESCAPE '\\' ORDER BY seq LIMIT ?", (pattern, limit)
    )
    return [r[0] for r in rows]


def find_open(conn: apsw.Connection, *, topic: str | None, scope_json: str, question: str) -> Question | None:
    """The open question a new one with this topic and scope joins: the same topic and scope;
    a question without a topic joins only one with the same text and scope and no topic."""
    select, is_open = question_sql(conn)
    if topic is not None:
        row = conn.execute(
            select + f"WHERE q.topic = ? AND q.scope = ? AND {is_open} ORDER BY q.seq LIMIT 1",
            (topic, scope_json),
        ).fetchone()
    else:
        row = conn.execute(
            select + f"WHERE q.topic IS NULL AND q.question = ? AND q.scope = ? AND {is_open} "
            "ORDER BY q.seq LIMIT 1",
            (question, scope_json),
        ).fetchone()
    return None if row is None else question_from_row(row)
