"""Reads of jobs (SPEC §4.7) on any connection, the writer's or a read-only one: a job with its
current state (its last event) and the times and facts gathered from its events."""

from __future__ import annotations

from typing import Any

import apsw

from agent_bridge.common.rows import Author, JobRow
from agent_bridge.store.queries import has_table

ENDED = ("finished", "failed", "cancelled", "interrupted")

_SELECT = """
SELECT j.id, j.name, j.peer_id, j.parent_id, pp.name, pp.agent, j.agent, j.title, j.task, j.access,
       j.project, j.cwd, j.worktree, j.branch, j.model, j.depth, j.timeout_ms, j.created_at,
       last.state, last.run,
       (SELECT e.thread FROM job_events e WHERE e.job_id = j.id AND e.thread IS NOT NULL
        ORDER BY e.seq DESC LIMIT 1),
       (SELECT min(e.at) FROM job_events e WHERE e.job_id = j.id AND e.state = 'running'),
       CASE WHEN last.state IN ('finished','failed','cancelled','interrupted') THEN last.at END,
       (SELECT e.last_step FROM job_events e WHERE e.job_id = j.id AND e.last_step IS NOT NULL
        ORDER BY e.seq DESC LIMIT 1),
       (SELECT e.answer FROM job_events e WHERE e.job_id = j.id AND e.answer IS NOT NULL
        ORDER BY e.seq DESC LIMIT 1),
       (SELECT e.pid FROM job_events e WHERE e.job_id = j.id AND e.run = last.run AND e.pid IS NOT NULL
        ORDER BY e.seq DESC LIMIT 1),
       (SELECT e.pid_start FROM job_events e WHERE e.job_id = j.id AND e.run = last.run
        AND e.pid_start IS NOT NULL ORDER BY e.seq DESC LIMIT 1),
       (SELECT e.prompt FROM job_events e WHERE e.job_id = j.id AND e.run = last.run AND e.prompt IS NOT NULL
        ORDER BY e.seq DESC LIMIT 1)
FROM jobs j
JOIN job_events last ON last.seq = (SELECT max(seq) FROM job_events WHERE job_id = j.id)
LEFT JOIN peers pp ON pp.id = j.parent_id
"""


def _row(values: tuple[Any, ...]) -> JobRow:
    (jid, name, peer_id, parent_id, parent_name, parent_agent, *rest) = values
    return JobRow(jid, name, peer_id, Author(parent_id, parent_name, parent_agent), *rest)


def job(conn: apsw.Connection, job_id: str) -> JobRow | None:
    if not has_table(conn, "jobs"):
        return None
    row = conn.execute(_SELECT + "WHERE j.id = ?", (job_id,)).fetchone()
    return None if row is None else _row(row)


def find(conn: apsw.Connection, address: str) -> list[JobRow]:
    """Jobs whose id, name or id prefix (8 characters or more) is `address`."""
    if not has_table(conn, "jobs"):
        return []
    cursor = conn.execute(
        _SELECT + "WHERE j.id = ?1 OR j.name = ?1 OR (length(?1) >= 8 AND j.id LIKE ?1 || '%') "
        "ORDER BY j.created_at", (address,))
    return [_row(r) for r in cursor]


def jobs(conn: apsw.Connection, *, every: bool = False, parent_id: str | None = None) -> list[JobRow]:
    """Jobs oldest first: those not ended (all with `every`), or a parent's."""
    if not has_table(conn, "jobs"):
        return []
    where, args = [], []
    if not every:
        where.append("last.state NOT IN ('finished','failed','cancelled','interrupted')")
    if parent_id is not None:
        where.append("j.parent_id = ?")
        args.append(parent_id)
    clause = ("WHERE " + " AND ".join(where) + " ") if where else ""
    return [_row(r) for r in conn.execute(_SELECT + clause + "ORDER BY j.created_at, j.id", args)]


def job_of_message(conn: apsw.Connection, message_id: str) -> str | None:
    """The job whose answer message this is, if it is one."""
    if not has_table(conn, "job_events"):
        return None
    row = conn.execute("SELECT job_id FROM job_events WHERE message_id = ?", (message_id,)).fetchone()
    return None if row is None else str(row[0])
