"""The store's side of federation (SPEC §10), the part every other part stands on: the reads of what
this machine knows of its team and the outbox's marks (store.federation has the whole picture)."""

from __future__ import annotations

import enum

from agent_bridge.core import envelopes as env
from agent_bridge.core import federation as fed
from agent_bridge.store import federation_queries as fq
from agent_bridge.store.base import StoreBase

KEY_PREFIX = fq.KEY_PREFIX


class Applied(enum.Enum):
    NEW = "new"  # stored now
    REPEAT = "repeat"  # stored before: a no-op (answered again where it has an answer)
    WAITING = "waiting"  # needs something not here yet (a retraction before its decision): no ack


def remote_peer_id(machine: str, remote_id: str) -> str:
    return f"{remote_id}@{machine}"


class TeamRecords(StoreBase):
    """The reads of what this machine knows of its team (for the federation task, `peers`,
    `send`, `sent` and `federation status`) and the outbox's marks, each one transaction."""

    # --- reads for the broker (its federation task, `peers`, `send`, `federation status`) --------

    def remote_sessions(self, now: int) -> list[fq.RemoteSession]:
        return fq.remote_sessions(self.conn, now)

    def remote_session(self, name: str, machine: str, now: int) -> fq.RemoteSession | None:
        """The session `name@machine` addresses: an announced one, else one known only as the
        sender of a message or the author of a decision here (a reply reaches it all the same)."""
        found = fq.remote_session(self.conn, name, machine, now)
        if found is not None:
            return found
        row = self.conn.execute(
            "SELECT id, remote_id, name, agent, project, project_key, kind, remote_state FROM peers "
            "WHERE machine = ? AND (name = ? OR remote_id = ?) AND forgotten_at IS NULL "
            "ORDER BY last_seen_at DESC LIMIT 1",
            (machine, name, name),
        ).fetchone()
        if row is None:
            return None
        pid, rid, pname, agent, project, key, kind, said = row
        heard = self.conn.execute("SELECT heard_at FROM machines WHERE name = ?", (machine,)).fetchone()
        heard_at = None if heard is None else heard[0]
        return fq.RemoteSession(pid, rid, pname, agent, project, key, kind, machine,
                                fed.session_state(said, heard_at, now), heard_at)

    def remote_marks(self, message_ids: list[str]) -> dict[str, fq.RemoteMarks]:
        return fq.remote_marks(self.conn, message_ids)

    def machines(self) -> list[fq.Machine]:
        return fq.machines(self.conn)

    def outbox_stats(self) -> fq.OutboxStats:
        return fq.outbox_stats(self.conn)

    def outbox_rows(self) -> list[fed.OutboxRow]:
        """Every row, for core.federation.Outbox.restore."""
        return fq.outbox_rows(self.conn)

    def outbox_item(self, kind: str, row_id: str) -> tuple[str | None, bytes] | None:
        """(destination machine or None for the team, body) of a row to publish; None: done."""
        row = self.conn.execute(
            "SELECT machine, body FROM outbox WHERE kind = ? AND id = ?", (kind, row_id)
        ).fetchone()
        return None if row is None else (row[0], bytes(row[1]))

    def mark_relayed(self, kind: str, row_id: str, at: int) -> fed.TeamCount | None:
        """The hub acknowledged the row (a message: relayed, not delivered). For a decision or
        retraction whose row is still there: the team's count (core.federation.Outbox.counted
        says whether that ends it); never ended here, at a PubAck."""
        with self.conn:
            self.conn.execute(
                "UPDATE outbox SET relayed_at = ?, attempts = attempts + 1 WHERE kind = ? AND id = ?",
                (at, kind, row_id),
            )
            if kind == fed.MSG:
                self.conn.execute("UPDATE messages SET relayed_at = ? WHERE id = ?", (at, row_id))
            count = self._team_count(row_id) if kind == fed.DEC and self.conn.changes() else None
        return count

    def mark_unconfirmed(self, message_id: str, at: int, kind: str = fed.MSG) -> None:
        """Not confirmed within the bound: `sent` shows the message unconfirmed until a receipt
        comes; a decision's row is marked (`federation status` counts them)."""
        with self.conn:
            if kind == fed.MSG:
                self.conn.execute(
                    "UPDATE messages SET unconfirmed_at = ? WHERE id = ? AND stored_at IS NULL",
                    (at, message_id),
                )
            self.conn.execute(
                "UPDATE outbox SET unconfirmed_at = ? WHERE kind = ? AND id = ?", (at, kind, message_id)
            )

    def drop(self, kind: str, row_id: str) -> None:
        with self.conn:
            self._drop(kind, row_id)

    def apply_decision_receipt(
        self, from_machine: str, receipt: env.ReceiptEnvelope, now: int
    ) -> fed.TeamCount | None:
        """`from_machine` stored a decision or retraction recorded here: kept once (also after
        the record's row ended: a machine heard again later is owed only what it has not
        confirmed). The team's count while the record's row is there (core.federation.Outbox.
        counted says whether that ends it), else None. Another's record changes nothing."""
        with self.conn:
            self._heard(from_machine, now)
            if not self._ours(receipt.message_id):
                return None
            self.conn.execute(
                "INSERT INTO team_receipts(record_id, machine, at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                (receipt.message_id, from_machine, receipt.at),
            )
            held = self.conn.execute(
                "SELECT 1 FROM outbox WHERE kind = ? AND id = ?", (fed.DEC, receipt.message_id)
            ).fetchone()
        return self._team_count(receipt.message_id) if held else None

    def _ours(self, record_id: str) -> bool:
        """A decision or retraction recorded on this machine."""
        return any(
            self.conn.execute(f"SELECT 1 FROM {t} WHERE id = ? AND machine IS NULL", (record_id,)).fetchone()
            for t in ("decisions", "decision_retractions")
        )

    def _team_count(self, record_id: str) -> fed.TeamCount:
        """The machines of the team heard here, and how many of them have not said they stored
        `record_id`."""
        row = self.conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE NOT EXISTS "
            "(SELECT 1 FROM team_receipts t WHERE t.record_id = ? AND t.machine = m.name)) FROM machines m",
            (record_id,),
        ).fetchone()
        assert row is not None
        return fed.TeamCount(heard=int(row[0]), awaited=int(row[1]))

    def _drop(self, kind: str, row_id: str) -> None:
        self.conn.execute("DELETE FROM outbox WHERE kind = ? AND id = ?", (kind, row_id))

    # --- inside ---------------------------------------------------------------------------------

    def _queue_out(self, kind: str, row_id: str, machine: str | None, body: bytes, now: int) -> None:
        self.conn.execute(
            "INSERT INTO outbox(kind, id, machine, body, queued_at) VALUES (?,?,?,?,?) "
            "ON CONFLICT(kind, id) DO NOTHING",
            (kind, row_id, machine, body, now),
        )

    def _queue_receipt(self, message_id: str, machine: str, rank: int, now: int) -> None:
        state = fed.RECEIPTS[rank - 1]
        body = env.encode(env.ReceiptEnvelope(message_id, state, now))
        self._queue_out(fed.RCPT, f"{message_id}/{state}", machine, body, now)

    def _receipt_rank(self, message_id: str, to_peer: str) -> int:
        row = self.conn.execute(
            "SELECT delivered_at, acked_at FROM receipts WHERE message_id = ? AND peer_id = ?",
            (message_id, to_peer),
        ).fetchone()
        if row is None or row[1] is not None:
            return fed.receipt_rank(fed.ACKNOWLEDGED if row is not None else fed.STORED)
        return fed.receipt_rank(fed.SHOWN if row[0] is not None else fed.STORED)

    def _ensure_remote_peer(self, machine: str, author: env.Author, now: int) -> str:
        """The record of another machine's session (an author or sender), made when presence has
        not announced it (a job that ended, that machine's `cli`): listed by nobody here."""
        peer_id = remote_peer_id(machine, author.id)
        self.conn.execute(
            "INSERT INTO peers(id, name, agent, project, kind, created_at, last_seen_at, machine, remote_id, "
            "remote_state) VALUES (?, ?, ?, '', 'interactive', ?, ?, ?, ?, 'offline') "
            "ON CONFLICT(id) DO NOTHING",
            (peer_id, author.name, author.agent, now, now, machine, author.id),
        )
        return peer_id

    def _has(self, table: str, row_id: str) -> bool:
        return self.conn.execute(f"SELECT 1 FROM {table} WHERE id = ?", (row_id,)).fetchone() is not None

    def _heard(self, machine: str, now: int) -> None:
        """Something came from `machine`: when it was last heard, if it is a member (its presence
        read; record_presence makes it one)."""
        self.conn.execute("UPDATE machines SET heard_at = max(heard_at, ?) WHERE name = ?", (now, machine))

    def _cursor(self, name: str) -> int:
        row = self.conn.execute("SELECT seq FROM federation_cursors WHERE name = ?", (name,)).fetchone()
        return 0 if row is None else int(row[0])

    def _set_cursor(self, name: str, seq: int) -> None:
        self.conn.execute(
            "INSERT INTO federation_cursors(name, seq) VALUES (?1, ?2) "
            "ON CONFLICT(name) DO UPDATE SET seq = ?2",
            (name, seq),
        )
