"""The store's messages and receipts: sending, reading a session's queue (feeding its delivery
tap), recording what was offered to a host and what its agent acknowledged.

Every method is one transaction (or a read); see store.writer.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import NamedTuple

from agent_bridge.rows import Author, Message, Queued
from agent_bridge.store import queries
from agent_bridge.store.ids import new_id
from agent_bridge.store.peers import CLI_AUTHOR, Peers
from agent_bridge.store.tap import DeliveryTap


class Outgoing(NamedTuple):
    """One message a session sends, validated by the broker (domain rules)."""

    to_id: str
    text: str
    hop: int
    reply_to: str | None


class Messages(Peers):
    """Messages between sessions, their receipts and the delivery taps they feed."""

    def message_hop(self, message_id: str) -> int | None:
        row = self.conn.execute("SELECT hop FROM messages WHERE id = ?", (message_id,)).fetchone()
        return None if row is None else int(row[0])

    def message_exists(self, message_id: str) -> bool:
        return self.conn.execute("SELECT 1 FROM messages WHERE id = ?", (message_id,)).fetchone() is not None

    def send_messages(
        self,
        from_id: str,
        outgoing: Sequence[Outgoing],
        now: int,
        *,
        fault: Callable[[str], None] = lambda point: None,
    ) -> list[Message]:
        """Messages from one session, in order, in one transaction (a pipelining sender's
        sends that arrived together share a commit). Returns them as they are pushed."""
        written = []
        with self.conn:
            if from_id == CLI_AUTHOR.id:
                self._ensure_cli_peer(now)
            # Addresses resolved before this transaction may name a record merged meanwhile.
            records = {i: self._record_named(i) for i in {from_id, *(o.to_id for o in outgoing)}}
            from_id, from_name, from_agent = records[from_id]
            sender = Author(from_id, from_name, from_agent)
            outgoing = [
                o if records[o.to_id][0] == o.to_id else o._replace(to_id=records[o.to_id][0])
                for o in outgoing
            ]
            names = {r[0]: r[1:] for r in records.values()}
            for o in outgoing:
                message_id = new_id()
                self.conn.execute(
                    "INSERT INTO messages(id, from_peer, to_peer, body, hop, reply_to, created_at) "
                    "VALUES (?,?,?,?,?,?,?)",
                    (message_id, from_id, o.to_id, o.text, o.hop, o.reply_to, now),
                )
                self.conn.execute(
                    "INSERT INTO receipts(message_id, peer_id) VALUES (?, ?)", (message_id, o.to_id)
                )
                seq = self.conn.last_insert_rowid()
                message = Message(
                    message_id,
                    sender,
                    o.to_id,
                    names.get(o.to_id, (None,))[0],
                    o.text,
                    o.hop,
                    o.reply_to,
                    "message",
                    now,
                )
                written.append((o.to_id, seq, message))
                fault("send:before-commit")
        out = []
        for to_id, seq, message in written:
            fault("send:after-commit")
            tap = self.taps.get(to_id)
            if tap is not None and not tap.append(seq, message):
                self._close_tap(to_id)  # full, or its connection ended: drop it
            out.append(message)
        return out

    def _record_named(self, peer_id: str) -> tuple[str, str | None, str | None]:
        """(the record `peer_id` leads to now (resolve_peer), its name, its agent): one statement
        on the send path, where it runs for the sender and each recipient."""
        row = self.conn.execute(
            "SELECT r.id, p.name, p.agent "
            "FROM (SELECT coalesce((SELECT into_id FROM peer_merges WHERE old_id = ?1), ?1) AS id) r "
            "LEFT JOIN peers p ON p.id = r.id",
            (peer_id,),
        ).fetchone()
        assert row is not None  # the subquery always yields one row
        return str(row[0]), row[1], row[2]

    def unacked(self, peer_id: str, *, limit: int = 200) -> list[Message]:
        """The session's unacknowledged messages, oldest first."""
        return [q.message for q in self.queued(peer_id, limit=limit)]

    def queued(
        self, peer_id: str, *, after_seq: int = 0, limit: int = 200, tap: DeliveryTap | None = None
    ) -> list[Queued]:
        """The session's unacknowledged receipts after the receipt `after_seq`, oldest first.

        With `tap`, the delivery task's: closed, then reopened for `peer_id` when this read
        reached the end, so it collects exactly the messages committed after this read."""
        rows = queries.unacked_messages(
            self.conn, peer_id, after_seq=after_seq, limit=limit, current_schema=True
        )
        if tap is not None:
            if tap.peer_id is not None:
                self._close_tap(tap.peer_id, only=tap)
            tap.close()
            if len(rows) < limit:
                tap.reopen(peer_id)
                previous = self.taps.get(peer_id)
                if previous is not None:
                    previous.close()
                self.taps[peer_id] = tap
        return rows

    def offer(self, peer_id: str, message_ids: Sequence[str], now: int) -> list[str]:
        """Record that these messages are about to be shown to the session's host (SPEC §3:
        written before the bytes that carry them). Returns the ones offered before and not
        acknowledged since: shown again, they are repeats."""
        ids = json.dumps(list(message_ids))
        with self.conn:
            before = [
                r[0]
                for r in self.conn.execute(
                    "SELECT message_id FROM receipts "
                    "WHERE peer_id = ? AND message_id IN (SELECT value FROM json_each(?)) "
                    "AND delivered_at IS NOT NULL AND acked_at IS NULL",
                    (peer_id, ids),
                )
            ]
            self.conn.execute(
                "UPDATE receipts SET delivered_at = ? "
                "WHERE peer_id = ? AND message_id IN (SELECT value FROM json_each(?)) "
                "AND delivered_at IS NULL",
                (now, peer_id, ids),
            )
        return before

    def ack(
        self,
        peer_id: str,
        message_ids: Sequence[str],
        now: int,
        *,
        fault: Callable[[str], None] = lambda point: None,
    ) -> int:
        """Acknowledge messages shown to the session's agent. Returns how many were newly acked."""
        count = 0
        with self.conn:
            for message_id in message_ids:
                self.conn.execute(
                    "UPDATE receipts SET acked_at = ?, delivered_at = coalesce(delivered_at, ?) "
                    "WHERE peer_id = ? AND message_id = ? AND acked_at IS NULL",
                    (now, now, peer_id, message_id),
                )
                changed = self.conn.changes()
                if changed:
                    self.conn.execute(
                        "UPDATE messages SET acked_at = ? WHERE id = ? AND acked_at IS NULL",
                        (now, message_id),
                    )
                count += changed
            fault("ack:before-commit")
        fault("ack:after-commit")
        return count
