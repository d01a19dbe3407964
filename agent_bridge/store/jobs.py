"""The store's jobs (SPEC §4.7): a job and its session recorded together, its events appended,
and a run's end recorded with the one answer message to its parent, in one transaction.

A concern of the one writer (`store.writer.Store` is built on it); every method is one
transaction. The answer message is an ordinary active message from the job's session to its
parent, so every delivery path carries it and it waits durably when the parent is gone; its
`job_events.message_id` marks it as a job's (its kind `job`).
"""

from __future__ import annotations

from agent_bridge.common.rows import JobRow
from agent_bridge.store import job_queries
from agent_bridge.store.ids import new_id
from agent_bridge.store.queries import LISTED_PEERS
from agent_bridge.store.questions import Questions

JOB_HOP = 1  # a job's answer: a new, active message
ANSWER_MAX = 8000  # characters of the answer kept in the store and in the message


class JobRecords(Questions):
    """Jobs, their sessions and their events."""

    def job(self, job_id: str) -> JobRow | None:
        return job_queries.job(self.conn, job_id)

    def jobs(self, *, every: bool = False) -> list[JobRow]:
        return job_queries.jobs(self.conn, every=every)

    def find_jobs(self, address: str) -> list[JobRow]:
        return job_queries.find(self.conn, address)

    def job_note(self, project: str, addresses: frozenset[str]) -> list[str]:
        """The pinned decisions a job in `project` starts with (as the SessionStart note shows
        them): one `topic: text` line each, newest first, and a last line when there are more."""
        from agent_bridge.common import domain
        from agent_bridge.common.projectkey import project_key
        from agent_bridge.store.queries import has_keyed_decisions, note_decisions

        key = project_key(project) if has_keyed_decisions(self.conn) else None
        shown, total = note_decisions(self.conn, project, caller_addresses=set(addresses),
                                      limit=domain.NOTE_TOPICS, project_key=key)
        lines = [d.line(domain.NOTE_TEXT_MAX) for d in shown]
        if total > len(shown):
            lines.append(f"{total - len(shown)} more; the `decisions` tool lists them.")
        return lines

    def record_job(
        self, *, job_id: str, name: str, parent_id: str, agent: str, title: str, task: str, access: str,
        project: str, cwd: str, worktree: str | None, branch: str | None, model: str | None, depth: int,
        timeout_ms: int, now: int,
    ) -> JobRow:
        """A new job, queued, with its bridge session (kind job, named as the job, its host
        session id the job's id, so the job's MCP server finds it)."""
        with self.conn:
            peer_id = new_id()
            self.conn.execute(
                "INSERT INTO peers(id, name, agent, project, kind, created_at, last_seen_at, "
                "host_session_id) VALUES (?, ?, ?, ?, 'job', ?, ?, ?)",
                (peer_id, name, agent, project, now, now, job_id),
            )
            self.conn.execute(
                "INSERT INTO jobs(id, name, peer_id, parent_id, agent, title, task, access, project, cwd, "
                "worktree, branch, model, depth, timeout_ms, created_at) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (job_id, name, peer_id, self.resolve_peer(parent_id), agent, title, task, access, project,
                 cwd, worktree, branch, model, depth, timeout_ms, now),
            )
            self._event(job_id, 1, "queued", now)
            row = job_queries.job(self.conn, job_id)
        assert row is not None
        return row

    def job_event(
        self, job_id: str, run: int, state: str, now: int, *, pid: int | None = None,
        pid_start: int | None = None, thread: str | None = None, last_step: str | None = None,
        prompt: str | None = None,
    ) -> None:
        """One event of a job that does not end a run: queued again (`continue`, with its
        message), started (with its process), or progress (its thread, its last step)."""
        with self.conn:
            self._event(job_id, run, state, now, pid=pid, pid_start=pid_start, thread=thread,
                        last_step=last_step, prompt=prompt)

    def end_job_run(
        self, job_id: str, run: int, state: str, now: int, *, body: str, answer: str | None,
        thread: str | None, last_step: str | None,
    ) -> str | None:
        """A run ended in `state`: its event, and one active message (kind job) from the job's
        session to its parent carrying `body`. Returns the message id (None when the parent's
        record is gone: nobody to tell). Nothing is written twice: a run that already ended
        returns None."""
        with self.conn:
            row = job_queries.job(self.conn, job_id)
            if row is None or (row.run == run and row.state in job_queries.ENDED):
                return None
            parent_of = self.resolve_peer(row.parent.id or "")
            parent = self.conn.execute(f"SELECT id FROM peers WHERE id = ? AND {LISTED_PEERS}",
                                       (parent_of,)).fetchone()
            message_id = None
            if parent is not None:
                parent_id = str(parent[0])
                self._close_tap(parent_id)  # its delivery task reads this from the database
                message_id = new_id()
                self.conn.execute(
                    "INSERT INTO messages(id, from_peer, to_peer, body, hop, reply_to, created_at) "
                    "VALUES (?,?,?,?,?,?,?)",
                    (message_id, row.peer_id, parent_id, body, JOB_HOP, None, now),
                )
                self.conn.execute("INSERT INTO receipts(message_id, peer_id) VALUES (?, ?)",
                                  (message_id, parent_id))
            self._event(job_id, run, state, now, thread=thread, last_step=last_step,
                        answer=None if answer is None else answer[:ANSWER_MAX], message_id=message_id)
        return message_id

    def _event(
        self, job_id: str, run: int, state: str, now: int, *, pid: int | None = None,
        pid_start: int | None = None, thread: str | None = None, last_step: str | None = None,
        answer: str | None = None, prompt: str | None = None, message_id: str | None = None,
    ) -> None:
        self.conn.execute(
            "INSERT INTO job_events(job_id, run, state, at, pid, pid_start, thread, last_step, answer, "
            "prompt, message_id) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (job_id, run, state, now, pid, pid_start, thread, last_step, answer, prompt, message_id),
        )
