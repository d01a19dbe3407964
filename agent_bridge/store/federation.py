"""The store's side of federation (SPEC §10): what other machines sent, applied idempotently, and
the outbox of what goes to them, each write one transaction with what it stands for.

    queue_remote_message     a send to `name@machine`: the message, its receipt row, its outbox row
    apply_remote_message     a message from another machine: stored by id; a repeat stores nothing
                             and queues the receipt it has now (its sender did not hear the last)
    queue_receipt_updates    remote messages stored, shown or acknowledged here since the last
                             look: for each, the receipt of the highest state it reached
    apply_remote_receipt     a receipt for a message sent from here: monotonic, ends its outbox row
    queue_team_decisions     this machine's decisions and retractions (scope all, or a project with
                             a git origin) not yet queued for the team
    apply_remote_decision    a decision or retraction of another machine, by id, with its receipt
                             queued back and, for a retraction, the notices a local one gives
    apply_decision_receipt   another machine stored a decision of ours: counted (`TeamCount`), kept
    record_presence          a machine's sessions, as it announced them; a machine heard for the
                             first time (or again after it was forgotten) is owed every decision and
                             retraction of ours it has not confirmed (queued for it, one transaction)
    outbox_rows / outbox_item / mark_relayed / mark_unconfirmed / drop   the outbox, for
                             core.federation.Outbox and the task that publishes

The team's machines are those whose presence was read here (`machines`, until forgotten); a
message, a receipt or a decision from a machine refreshes when it was heard, and only its
presence makes it a member. core.federation.Outbox decides what a decision's `TeamCount` means.

Who sent something is the machine named by the subject (`from_machine`), never the body. Another
machine's session is a session record with `machine` set and id `<its id>@<machine>`; a remote
project decision is recorded with the scope `{"project": "git:<project key>"}` (a folder no local
session has: `project_lookup` matches it to the folders with that key). Times are epoch ms.
"""

from __future__ import annotations

from agent_bridge.common import domain
from agent_bridge.common.rows import Author, Message
from agent_bridge.core import envelopes as env
from agent_bridge.core import federation as fed
from agent_bridge.store import queries
from agent_bridge.store.ids import new_id
from agent_bridge.store.messages import Stored
from agent_bridge.store.team_decisions import TeamDecisions
from agent_bridge.store.team_records import KEY_PREFIX, Applied, TeamRecords, remote_peer_id

__all__ = ["KEY_PREFIX", "Applied", "Federation", "TeamDecisions", "TeamRecords", "remote_peer_id"]


class Federation(TeamDecisions):
    """Messages, receipts, decisions and presence of other machines, and the outbox."""

    # --- sending to another machine ------------------------------------------------------------

    def queue_remote_message(
        self,
        from_id: str,
        to_peer_id: str,
        text: str,
        hop: int,
        reply_to: str | None,
        now: int,
        *,
        key: str | None = None,
        address: str = "",
    ) -> Stored:
        """A send to a session of another machine (`to_peer_id`: its record here): the message,
        its receipt row and its outbox row, one transaction. A send whose message_id stored one
        before returns that (a duplicate). InputError for a recipient that is not remote."""
        with self.conn:
            if key is not None:
                before = self.stored_send(from_id, key, text, address)
                if isinstance(before, domain.InputError):
                    raise before
                if before is not None:
                    return before
            target = self.conn.execute(
                "SELECT machine, remote_id, name FROM peers WHERE id = ? AND machine IS NOT NULL",
                (to_peer_id,),
            ).fetchone()
            if target is None:
                raise domain.InputError(f"to: {to_peer_id!r} is not a session of another machine")
            machine, remote_id, to_name = target
            if from_id == "cli":
                self._ensure_cli_peer(now)
            from_id, from_name, from_agent = self._record_named(from_id)
            sender = Author(from_id, from_name, from_agent)
            message_id = key if key is not None else new_id()
            self.conn.execute(
                "INSERT INTO messages(id, from_peer, to_peer, body, hop, reply_to, created_at, send_id, "
                "send_to) VALUES (?,?,?,?,?,?,?,?,?)",
                (message_id, from_id, to_peer_id, text, hop, reply_to, now, key,
                 address if key is not None else None),
            )
            self.conn.execute(
                "INSERT INTO receipts(message_id, peer_id) VALUES (?, ?)", (message_id, to_peer_id)
            )
            body = env.encode(env.MessageEnvelope(
                id=message_id, sender=env.Author(from_id, from_name or "", from_agent or ""),
                to_id=remote_id, to_name=to_name, text=text, hop=hop, reply_to=reply_to,
                created_at=now, send_id=key,
            ))
            self._queue_out(fed.MSG, message_id, machine, body, now)
        message = Message(message_id, sender, to_peer_id, to_name, text, hop, reply_to, "message", now)
        return Stored([message], outgoing=(machine, body))

    # --- what another machine sent -------------------------------------------------------------

    def apply_remote_message(self, from_machine: str, message: env.MessageEnvelope, now: int) -> Applied:
        """A message from `from_machine` to a session here: stored once by its id; a repeat stores
        nothing and queues the receipt it has now (its sender did not hear the last one). A new
        one's receipt is queued by the outbox's next look (`queue_receipt_updates`), off the
        message's path, and only the highest state it reached by then: a message shown and
        acknowledged before that look sends one receipt, not three. InputError (nothing stored)
        for a recipient that is not a session here."""
        with self.conn:
            row = self.conn.execute(
                "SELECT machine, to_peer FROM messages WHERE id = ?", (message.id,)
            ).fetchone()
            if row is not None:
                if row[0] != from_machine:
                    raise domain.InputError(f"id: {message.id} is another machine's message here")
                self._queue_receipt(message.id, from_machine, self._receipt_rank(message.id, row[1]), now)
                return Applied.REPEAT
            to = self.conn.execute(
                f"SELECT id FROM peers WHERE id = ? AND {queries.LISTED_PEERS}", (message.to_id,)
            ).fetchone()
            if to is None:
                raise domain.InputError(f"to: no session {message.to_id} ({message.to_name}) on this machine")
            to_id = str(to[0])
            sender = self._ensure_remote_peer(from_machine, message.sender, now)
            self.conn.execute(
                "INSERT INTO messages(id, from_peer, to_peer, body, hop, reply_to, created_at, machine, "
                "reported) VALUES (?,?,?,?,?,?,?,?,0)",
                (message.id, sender, to_id, message.text, message.hop, message.reply_to,
                 message.created_at, from_machine),
            )
            self.conn.execute("INSERT INTO receipts(message_id, peer_id) VALUES (?, ?)", (message.id, to_id))
            seq = self.conn.last_insert_rowid()
            self._heard(from_machine, now)
        tap = self.taps.get(to_id)  # committed: its delivery task takes it as a local send's, no read back
        if tap is not None:
            stored = queries.messages_by_id(self.conn, [message.id])
            if not stored or not tap.append(seq, stored[0]):
                self._close_tap(to_id)
        return Applied.NEW

    def queue_receipt_updates(self, now: int) -> int:
        """Receipts for messages from other machines that were stored, shown or acknowledged here
        since the last call: one outbox row each, for the highest state reached, with `reported`
        moved on, one transaction."""
        with self.conn:
            rows = self.conn.execute(
                "SELECT m.id, m.machine, m.reported, r.delivered_at, r.acked_at FROM messages m "
                "JOIN receipts r ON r.message_id = m.id AND r.peer_id = m.to_peer "
                "WHERE m.machine IS NOT NULL AND m.reported < 3 AND (m.reported < 1 "
                "OR r.acked_at IS NOT NULL OR (r.delivered_at IS NOT NULL AND m.reported < 2))"
            ).fetchall()
            for message_id, machine, reported, shown, acked in rows:
                rank = fed.receipt_rank(
                    fed.ACKNOWLEDGED if acked is not None else fed.SHOWN if shown is not None else fed.STORED)
                if rank > int(reported or 0):
                    self._queue_receipt(str(message_id), str(machine), rank, now)
                    self.conn.execute("UPDATE messages SET reported = ? WHERE id = ?", (rank, message_id))
        return len(rows)

    def apply_remote_receipt(self, from_machine: str, receipt: env.ReceiptEnvelope, now: int) -> bool:
        """A receipt from `from_machine` for a message sent from here to one of its sessions
        (another machine's receipt is ignored). Monotonic: a receipt never takes one back. Ends
        the message's outbox row and clears an unconfirmed mark. True when it changed something."""
        with self.conn:
            row = self.conn.execute(
                "SELECT m.to_peer, m.stored_at, m.unconfirmed_at, r.delivered_at, r.acked_at FROM messages m "
                "JOIN peers p ON p.id = m.to_peer "
                "JOIN receipts r ON r.message_id = m.id AND r.peer_id = m.to_peer "
                "WHERE m.id = ? AND m.machine IS NULL AND p.machine = ?",
                (receipt.message_id, from_machine),
            ).fetchone()
            if row is None:
                return False
            to_peer, stored_at, unconfirmed_at, shown_at, acked_at = row
            rank = fed.receipt_rank(receipt.state)
            changed = stored_at is None or unconfirmed_at is not None
            self.conn.execute(
                "UPDATE messages SET stored_at = coalesce(stored_at, ?), unconfirmed_at = NULL WHERE id = ?",
                (receipt.at, receipt.message_id),
            )
            if rank >= fed.receipt_rank(fed.SHOWN) and shown_at is None:
                changed = True
                self.conn.execute(
                    "UPDATE receipts SET delivered_at = ? WHERE message_id = ? AND peer_id = ?",
                    (receipt.at, receipt.message_id, to_peer),
                )
            if rank >= fed.receipt_rank(fed.ACKNOWLEDGED) and acked_at is None:
                changed = True
                self.conn.execute(
                    "UPDATE receipts SET acked_at = ? WHERE message_id = ? AND peer_id = ?",
                    (receipt.at, receipt.message_id, to_peer),
                )
            self.conn.execute("DELETE FROM outbox WHERE kind = ? AND id = ?", (fed.MSG, receipt.message_id))
            self._heard(from_machine, now)
        return changed
