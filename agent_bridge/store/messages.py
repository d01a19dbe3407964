"""The store's messages and receipts: sending, reading a session's queue (feeding its delivery
tap), recording what was offered to a host and what its agent acknowledged.

Every method is one transaction (or a read); see store.writer.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import NamedTuple

from agent_bridge.common.domain import BROADCAST, InputError
from agent_bridge.common.rows import Author, Message, Queued, SentReceipt
from agent_bridge.store import queries, search
from agent_bridge.store.ids import new_id
from agent_bridge.store.peers import CLI_AUTHOR, Peers
from agent_bridge.store.schema import UNACKED_RECEIPTS
from agent_bridge.store.tap import DeliveryTap


class Outgoing(NamedTuple):
    """One message a session sends, validated by the broker (domain rules)."""

    to_id: str
    text: str
    hop: int
    reply_to: str | None


class Send(NamedTuple):
    """One `send`: its copies (one; or one per session for `*`), the caller's `message_id` for
    it (None: none given) and the address it was sent to (`to` as given)."""

    copies: tuple[Outgoing, ...]
    key: str | None = None
    address: str = ""


class Stored(NamedTuple):
    """What a send stored, as pushed; `duplicate`: its message_id had stored them before;
    `outgoing`: for a new message to another machine, that machine and the body its outbox row
    holds (published at once, without reading the row back)."""

    messages: list[Message]
    duplicate: bool = False
    outgoing: tuple[str, bytes] | None = None


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
        """Messages from one session, each a send of its own with no message_id (`send`)."""
        done = self.send(from_id, [Send((o,)) for o in outgoing], now, fault=fault)
        return [m for s in done if isinstance(s, Stored) for m in s.messages]

    def send(
        self,
        from_id: str,
        sends: Sequence[Send],
        now: int,
        *,
        fault: Callable[[str], None] = lambda point: None,
    ) -> list[Stored | InputError]:
        """Sends of one session, in order, in one transaction (a pipelining sender's sends that
        arrived together share a commit). Returns each as stored and pushed; a send whose
        message_id stored one before returns that (`stored_send`), checked again here, where
        no other send with the same id can come between the check and the insert."""
        results: list[Stored | InputError] = []
        written = []
        with self.conn:
            # Addresses resolved before this transaction may name a record merged meanwhile.
            to_ids = {o.to_id for s in sends for o in s.copies}
            if from_id == CLI_AUTHOR.id or CLI_AUTHOR.id in to_ids:
                self._ensure_cli_peer(now)  # the owner sends, or is sent to
            records = {i: self._record_named(i) for i in {from_id, *to_ids}}
            from_id, from_name, from_agent = records[from_id]
            sender = Author(from_id, from_name, from_agent)
            names = {r[0]: r[1:] for r in records.values()}
            for send in sends:
                if send.key is not None:
                    before = self.stored_send(from_id, send.key, send.copies[0].text, send.address)
                    if before is not None:
                        results.append(before)
                        continue
                messages = []
                for o in send.copies:
                    to_id = records[o.to_id][0]
                    # A send to one address takes its message_id as the message's id.
                    message_id = send.key if send.key is not None and send.address != BROADCAST else new_id()
                    self.conn.execute(
                        "INSERT INTO messages(id, from_peer, to_peer, body, hop, reply_to, created_at, "
                        "send_id, send_to) VALUES (?,?,?,?,?,?,?,?,?)",
                        (message_id, from_id, to_id, o.text, o.hop, o.reply_to, now, send.key,
                         send.address if send.key is not None else None),
                    )
                    self.conn.execute(
                        "INSERT INTO receipts(message_id, peer_id) VALUES (?, ?)", (message_id, to_id)
                    )
                    seq = self.conn.last_insert_rowid()
                    message = Message(
                        message_id, sender, to_id, names.get(to_id, (None,))[0], o.text, o.hop, o.reply_to,
                        "message", now,
                    )
                    written.append((to_id, seq, message))
                    messages.append(message)
                    fault("send:before-commit")
                results.append(Stored(messages))
        self._hand_to_taps(written, fault)  # once committed: what a tap is handed is durable
        return results

    def _hand_to_taps(self, written: list[tuple[str, int, Message]], fault: Callable[[str], None]) -> None:
        """Committed messages to their recipients' delivery taps (store.tap)."""
        for to_id, seq, message in written:
            fault("send:after-commit")
            tap = self.taps.get(to_id)
            if tap is not None and not tap.append(seq, message):
                self._close_tap(to_id)  # full, or its connection ended: drop it

    def stored_send(self, from_id: str, key: str, text: str, address: str) -> Stored | InputError | None:
        """What a send with message_id `key` by session `from_id` stored before, as a duplicate
        (None: nothing). The same id with another text or recipient is an error, as is an id
        another message already has."""
        rows = self.conn.execute(
            "SELECT m.id, m.body, m.send_to, m.to_peer, p.name, p.host_session_id FROM messages m "
            "LEFT JOIN peers p ON p.id = m.to_peer WHERE m.send_id = ?1 AND m.from_peer IN "
            "(SELECT ?2 UNION SELECT old_id FROM peer_merges WHERE into_id = ?2) ORDER BY m.rowid",
            (key, self.resolve_peer(from_id)),
        ).fetchall()
        if not rows:
            if address != BROADCAST and self.message_exists(key):
                return InputError(f"message_id: {key} is already another message's id; choose a new uuid")
            return None
        _, body, sent_to, to_id, to_name, to_host = rows[0]
        same_to = address == sent_to or (
            sent_to != BROADCAST and address != BROADCAST and address in (to_id, to_name, to_host)
        )
        if body != text or not same_to:
            what = "another text" if body != text else f"to {sent_to!r}, not {address!r}"
            return InputError(
                f"message_id: {key} was already used for a message with {what}; use a new uuid for a new "
                "message (sending the same one again returns it)"
            )
        return Stored(queries.messages_by_id(self.conn, [str(r[0]) for r in rows]), duplicate=True)

    def index_messages(self, limit: int) -> int:
        """Index for search up to `limit` of the messages the index has not reached yet, oldest
        first (schema V_INDEX_LATER; search.UNINDEXED); returns how many it indexed. The
        broker's indexer calls it a moment after commits; a search does not wait for it."""
        with self.conn:
            self.conn.execute(
                f"INSERT INTO messages_fts(rowid, body) {search.UNINDEXED} LIMIT ?", (limit,)
            )
            done = int(self.conn.changes())
        return done

    def request_wakes(self, message_ids: Sequence[str], now: int) -> None:
        """The bridge set out to wake these messages' recipient (inside the caller's transaction)."""
        self.conn.executemany(
            "INSERT INTO wakes(message_id, requested_at) VALUES (?, ?)", [(m, now) for m in message_ids]
        )

    def sent(self, peer_id: str, ids: Sequence[str] | None, limit: int) -> list[SentReceipt]:
        """The session's own messages with their receipts (`sent`): those `ids` name (message
        ids or the message_id of a send), else the `limit` newest."""
        return queries.sent_messages(self.conn, self.resolve_peer(peer_id), ids, limit)

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

    def active_unacked_of(self, peer_ids: Sequence[str], hop_limit: int) -> dict[str, list[str]]:
        """For each of these sessions that has some, the ids of its unacknowledged active
        messages (below `hop_limit`, no decision notice), oldest first: one query for all the
        wake waiters at once (broker.feeds.waiters), by the index of unacknowledged receipts
        (UNACKED_RECEIPTS)."""
        rows = self.conn.execute(
            f"SELECT r.peer_id, m.id FROM receipts r {UNACKED_RECEIPTS} "
            "JOIN messages m ON m.id = r.message_id "
            "WHERE r.peer_id IN (SELECT value FROM json_each(?)) AND r.acked_at IS NULL AND m.hop < ? "
            "AND NOT EXISTS (SELECT 1 FROM decision_deliveries dd WHERE dd.message_id = m.id) "
            "ORDER BY r.rowid",
            (json.dumps(list(peer_ids)), hop_limit),
        )
        found: dict[str, list[str]] = {}
        for peer_id, message_id in rows:
            found.setdefault(str(peer_id), []).append(str(message_id))
        return found

    def host_sessions_waiting(self, hop_limit: int) -> set[str]:
        """The host session ids of every session with an unacknowledged message below
        `hop_limit`: what the PostToolUse hook would find with `reader.active_waiting` (the
        broker keeps a file per one, broker.feeds.postbox). One look per session with a host session
        id, by the index of its unacknowledged receipts (UNACKED_RECEIPTS)."""
        rows = self.conn.execute(
            "SELECT p.host_session_id FROM peers p WHERE p.host_session_id IS NOT NULL AND EXISTS ("
            f"SELECT 1 FROM receipts r {UNACKED_RECEIPTS} JOIN messages m ON m.id = r.message_id "
            "WHERE r.peer_id = p.id AND r.acked_at IS NULL AND m.hop < ?)",
            (hop_limit,),
        )
        return {str(hsid) for (hsid,) in rows if hsid}

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

    def offer(
        self,
        peer_id: str,
        message_ids: Sequence[str],
        now: int,
        *,
        shown: Sequence[str] = (),
        wake: bool = False,
    ) -> list[str]:
        """Record that these messages are about to be shown to the session's host, or may have
        been (SPEC §3: written before the bytes that carry them; receipts.offered_at), and that
        the ones in `shown` were (their bytes reached the host, an acknowledgement that never
        came: receipts.delivered_at). With `wake`, the offer is a waiter's, setting out to wake
        the session: a wake request for each. Returns the ones offered or shown before and not
        acknowledged since: shown again, they are repeats."""
        ids = json.dumps(list(message_ids))
        with self.conn:
            before = [
                r[0]
                for r in self.conn.execute(
                    "SELECT message_id FROM receipts "
                    "WHERE peer_id = ? AND message_id IN (SELECT value FROM json_each(?)) "
                    "AND (offered_at IS NOT NULL OR delivered_at IS NOT NULL) AND acked_at IS NULL",
                    (peer_id, ids),
                )
            ]
            self.conn.execute(
                "UPDATE receipts SET offered_at = ? "
                "WHERE peer_id = ? AND message_id IN (SELECT value FROM json_each(?)) "
                "AND offered_at IS NULL",
                (now, peer_id, ids),
            )
            if shown:
                self.conn.execute(
                    "UPDATE receipts SET delivered_at = ? "
                    "WHERE peer_id = ? AND message_id IN (SELECT value FROM json_each(?)) "
                    "AND delivered_at IS NULL",
                    (now, peer_id, json.dumps(list(shown))),
                )
            if wake:
                self.request_wakes(message_ids, now)
        return before

    def ack(
        self,
        peer_id: str,
        message_ids: Sequence[str],
        now: int,
        *,
        fault: Callable[[str], None] = lambda point: None,
    ) -> int:
        """Acknowledge messages shown to the session's agent (written to its host, SPEC §3): shown
        now, unless known to be shown before. Returns how many were newly acked."""
        # The ids as one JSON array, each statement run once for all of them (as `offer`): a
        # statement per id cost the batch's Python most of the transaction (docs/performance.md,
        # stop 70).
        with self.conn:
            acked = self.conn.execute(
                "UPDATE receipts SET acked_at = ?1, delivered_at = coalesce(delivered_at, ?1) "
                "WHERE peer_id = ?2 AND message_id IN (SELECT value FROM json_each(?3)) "
                "AND acked_at IS NULL RETURNING message_id",
                (now, peer_id, json.dumps(list(message_ids))),
            ).fetchall()
            # The message's own copy (versions 1 and 2 define it; the bridge reads the receipt).
            if acked:
                self.conn.execute(
                    "UPDATE messages SET acked_at = ?1 WHERE id IN (SELECT value FROM json_each(?2)) "
                    "AND acked_at IS NULL",
                    (now, json.dumps([message_id for (message_id,) in acked])),
                )
            count = len(acked)
            fault("ack:before-commit")
        fault("ack:after-commit")
        return count
