"""The store's side of federation (SPEC §10): what other machines sent, applied idempotently, and
the outbox of what goes to them, each write one transaction with what it stands for.

    queue_remote_message     a send to `name@machine`: the message, its receipt row, its outbox row
    apply_remote_message     a message from another machine: stored by id (a repeat a no-op), and
                             a receipt row for its sender queued either way
    queue_receipt_updates    remote messages shown or acknowledged here since: their receipts queued
    apply_remote_receipt     a receipt for a message sent from here: monotonic, ends its outbox row
    queue_team_decisions     this machine's decisions and retractions (scope all, or a project with
                             a git origin) not yet queued for the team
    apply_remote_decision    a decision or retraction of another machine, by id, with its receipt
                             queued back and, for a retraction, the notices a local one gives
    apply_decision_receipt   another machine stored a decision of ours: its row ends with the last
    record_presence          a machine's sessions, as it announced them
    outbox_rows / outbox_item / mark_relayed / mark_unconfirmed / drop   the outbox, for
                             core.federation.Outbox and the task that publishes

Who sent something is the machine named by the subject (`from_machine`), never the body. Another
machine's session is a session record with `machine` set and id `<its id>@<machine>`; a remote
project decision is recorded with the scope `{"project": "git:<project key>"}` (a folder no local
session has: `project_lookup` matches it to the folders with that key). Times are epoch ms.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Sequence

from agent_bridge.common import domain
from agent_bridge.common.domain import SessionView
from agent_bridge.common.rows import Author, Message
from agent_bridge.core import envelopes as env
from agent_bridge.core import federation as fed
from agent_bridge.store import federation_queries as fq
from agent_bridge.store import queries
from agent_bridge.store.base import StoreBase
from agent_bridge.store.decisions import Decisions, Recipient
from agent_bridge.store.ids import new_id
from agent_bridge.store.messages import Stored

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

    def mark_relayed(self, kind: str, row_id: str, at: int) -> bool:
        """The hub acknowledged the row (a message: relayed, not delivered). True when that ends
        it: a decision no machine is left to confirm (none of the team heard yet, or all said
        stored already): its row is deleted."""
        with self.conn:
            self.conn.execute(
                "UPDATE outbox SET relayed_at = ?, attempts = attempts + 1 WHERE kind = ? AND id = ?",
                (at, kind, row_id),
            )
            if kind == fed.MSG:
                self.conn.execute("UPDATE messages SET relayed_at = ? WHERE id = ?", (at, row_id))
                return False
            if kind == fed.DEC and not self._awaited(row_id):
                self._drop(kind, row_id)
                return True
        return False

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

    def apply_decision_receipt(self, from_machine: str, receipt: env.ReceiptEnvelope, now: int) -> bool:
        """`from_machine` stored a decision or retraction recorded here: counted once; True when
        that was the last machine awaited, and the record's outbox row is deleted (one
        transaction). A receipt for a record whose row is gone, or another's, changes nothing."""
        with self.conn:
            self._heard(from_machine, now)
            if not self.conn.execute(
                "SELECT 1 FROM outbox WHERE kind = ? AND id = ?", (fed.DEC, receipt.message_id)
            ).fetchone():
                return False
            self.conn.execute(
                "INSERT INTO team_receipts(record_id, machine, at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                (receipt.message_id, from_machine, receipt.at),
            )
            if self._awaited(receipt.message_id):
                return False
            self._drop(fed.DEC, receipt.message_id)
        return True

    def _awaited(self, record_id: str) -> int:
        """How many machines of the team heard here have not said they stored `record_id`."""
        row = self.conn.execute(
            "SELECT count(*) FROM machines m WHERE NOT EXISTS "
            "(SELECT 1 FROM team_receipts t WHERE t.record_id = ? AND t.machine = m.name)",
            (record_id,),
        ).fetchone()
        return 0 if row is None else int(row[0])

    def _drop(self, kind: str, row_id: str) -> None:
        self.conn.execute("DELETE FROM outbox WHERE kind = ? AND id = ?", (kind, row_id))
        if kind == fed.DEC:
            self.conn.execute("DELETE FROM team_receipts WHERE record_id = ?", (row_id,))

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
        self.conn.execute(
            "INSERT INTO machines(name, heard_at) VALUES (?1, ?2) "
            "ON CONFLICT(name) DO UPDATE SET heard_at = max(heard_at, ?2)",
            (machine, now),
        )

    def _cursor(self, name: str) -> int:
        row = self.conn.execute("SELECT seq FROM federation_cursors WHERE name = ?", (name,)).fetchone()
        return 0 if row is None else int(row[0])

    def _set_cursor(self, name: str, seq: int) -> None:
        self.conn.execute(
            "INSERT INTO federation_cursors(name, seq) VALUES (?1, ?2) "
            "ON CONFLICT(name) DO UPDATE SET seq = ?2",
            (name, seq),
        )


class TeamDecisions(TeamRecords, Decisions):
    """The team's decisions and retractions (queued for the others, applied from them) and
    the other machines' presence."""

    # --- decisions ------------------------------------------------------------------------------

    def queue_team_decisions(self, now: int, project_key: Callable[[str], str | None]) -> int:
        """This machine's decisions and retractions not yet put in the outbox for the team, in
        recording order: scope all, or a project whose folder has a project key (`project_key`
        of the folder); sessions scopes and folders without an origin stay here. One transaction."""
        queued = 0
        with self.conn:
            after = self._cursor("decisions")
            last = after
            for seq, decision_id in self.conn.execute(
                "SELECT seq, id FROM decisions WHERE seq > ? AND machine IS NULL ORDER BY seq", (after,)
            ).fetchall():
                assert isinstance(seq, int)
                last = seq
                d = queries.decision_by_id(self.conn, str(decision_id))
                assert d is not None
                kind = domain.scope_kind(d.scope)
                key = None
                if kind == "project":
                    assert isinstance(d.scope, dict)
                    key = project_key(d.scope["project"])
                    if key is None:
                        continue
                elif kind != "all":
                    continue
                body = env.encode(env.DecisionEnvelope(
                    id=d.id, topic=d.topic, text=d.text, project_key=key,
                    author=env.Author(d.author.id or "cli", d.author.name or "cli", d.author.agent or "cli"),
                    created_at=d.created_at, supersedes=d.supersedes, source_message_id=d.source_message_id,
                ))
                self._queue_out(fed.DEC, d.id, None, body, now)
                queued += 1
            self._set_cursor("decisions", last)
            after = self._cursor("retractions")
            last = after
            for seq, retraction_id, scope in self.conn.execute(
                "SELECT r.seq, r.id, d.scope FROM decision_retractions r "
                "JOIN decisions d ON d.id = r.retracts "
                "WHERE r.seq > ? AND r.machine IS NULL ORDER BY r.seq",
                (after,),
            ).fetchall():
                assert isinstance(seq, int)
                last = seq
                s = domain.scope_from_json(str(scope))
                if domain.scope_kind(s) == "sessions":
                    continue
                if isinstance(s, dict) and project_key(s["project"]) is None:
                    continue
                r = queries.retraction_by_id(self.conn, str(retraction_id))
                assert r is not None
                body = env.encode(env.RetractionEnvelope(
                    id=r.id, topic=r.topic, retracts=r.retracts, reason=r.reason,
                    author=env.Author(r.author.id or "cli", r.author.name or "cli", r.author.agent or "cli"),
                    created_at=r.created_at,
                ))
                self._queue_out(fed.DEC, r.id, None, body, now)
                queued += 1
            self._set_cursor("retractions", last)
        return queued

    def apply_remote_decision(
        self,
        from_machine: str,
        record: env.DecisionEnvelope | env.RetractionEnvelope,
        now: int,
        recipients: Sequence[Recipient] = (),
        connected: Sequence[SessionView] = (),
        key_of: Callable[[str], str | None] = lambda folder: None,
    ) -> Applied:
        """A decision or retraction recorded on `from_machine`: applied once by its id; the
        topic's current revision is its latest by (createdAt, id) (the schema's triggers), so the
        order revisions arrive in does not matter. A decision that became current is queued to
        `recipients` (the connected sessions in its scope, chosen by the caller) as a passive
        notice. A retraction that withdrew the topic's current revision gives the sessions a
        local retraction would (`connected` in its scope, by `key_of` for a project key, and
        those sent the revision) the same notice. A retraction of a revision not here yet is
        WAITING: nothing stored, not acked."""
        with self.conn:
            if isinstance(record, env.RetractionEnvelope):
                if self._has("decision_retractions", record.id):
                    self._queue_stored(record.id, from_machine, now)
                    return Applied.REPEAT
                if not self._has("decisions", record.retracts):
                    return Applied.WAITING
                author = self._ensure_remote_peer(from_machine, record.author, now)
                before = queries.query_decisions(self.conn, topic=record.topic)
                self.conn.execute(
                    "INSERT INTO decision_retractions(id, topic, retracts, reason, author_id, author_name, "
                    "author_agent, created_at, machine) VALUES (?,?,?,?,?,?,?,?,?)",
                    (record.id, record.topic, record.retracts, record.reason, author, record.author.name,
                     record.author.agent, record.created_at, from_machine),
                )
                withdrawn = [d for d in before if d.id == record.retracts]
                if withdrawn and not queries.query_decisions(self.conn, topic=record.topic):
                    targets = self._retraction_targets(withdrawn[0], connected, key_of)
                    self._queue_retraction_notices(
                        withdrawn[0], record.id, author, record.reason, targets, now)
                self._queue_stored(record.id, from_machine, now)
                self._heard(from_machine, now)
                return Applied.NEW
            if self._has("decisions", record.id):
                self._queue_stored(record.id, from_machine, now)
                return Applied.REPEAT
            author = self._ensure_remote_peer(from_machine, record.author, now)
            scope: domain.Scope = (
                domain.ALL if record.project_key is None else {"project": KEY_PREFIX + record.project_key}
            )
            supersedes = record.supersedes
            if supersedes is not None and not self._has("decisions", supersedes):
                supersedes = None
            source = record.source_message_id
            if source is not None and not self.message_exists(source):
                source = None
            self.conn.execute(
                "INSERT INTO decisions(id, topic, text, text_key, scope, scope_kind, scope_project, "
                "author_id, author_name, author_agent, created_at, source_message_id, supersedes, machine) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (record.id, record.topic, record.text, domain.search_key(record.text),
                 domain.scope_to_json(scope), domain.scope_kind(scope),
                 None if scope == domain.ALL else KEY_PREFIX + str(record.project_key),
                 author, record.author.name, record.author.agent, record.created_at, source, supersedes,
                 from_machine),
            )
            decision = queries.decision_by_id(self.conn, record.id)
            assert decision is not None
            if decision.current and recipients:
                self._queue_notifications(decision, author, self._resolve_recipients(recipients), now)
            self._queue_stored(record.id, from_machine, now)
            self._heard(from_machine, now)
        return Applied.NEW

    def _queue_stored(self, record_id: str, machine: str, now: int) -> None:
        """The end-to-end receipt of a decision or retraction of `machine`'s, stored here (again:
        a repeat means it did not hear the last one), in the transaction that stored it."""
        body = env.encode(env.ReceiptEnvelope(record_id, fed.STORED, now, kind=fed.DEC))
        self._queue_out(fed.RCPT, f"{record_id}/{fed.DEC}", machine, body, now)

    # --- presence -------------------------------------------------------------------------------

    def record_presence(self, machine: str, presence: env.PresenceEnvelope, heard_at: int) -> None:
        """A machine's sessions as it announced them: each one's record here made or updated, and
        its sessions it no longer announces shown offline. One transaction."""
        with self.conn:
            seen = []
            for s in presence.sessions:
                peer_id = remote_peer_id(machine, s.id)
                seen.append(peer_id)
                self.conn.execute(
                    "INSERT INTO peers(id, name, agent, project, kind, created_at, last_seen_at, machine, "
                    "remote_id, remote_state, project_key) VALUES (?1,?2,?3,?4,?5,?6,?6,?7,?8,?9,?10) "
                    "ON CONFLICT(id) DO UPDATE SET name = ?2, agent = ?3, project = ?4, kind = ?5, "
                    "last_seen_at = ?6, remote_state = ?9, project_key = ?10, forgotten_at = NULL",
                    (peer_id, s.name, s.agent, s.project, s.kind, heard_at, machine, s.id, s.state,
                     s.project_key),
                )
            self.conn.execute(
                "UPDATE peers SET remote_state = 'offline' WHERE machine = ? AND remote_state != 'offline' "
                "AND id NOT IN (SELECT value FROM json_each(?))",
                (machine, json.dumps(seen)),
            )
            self.conn.execute(
                "INSERT INTO machines(name, heard_at, presence_at) VALUES (?1, ?2, ?2) "
                "ON CONFLICT(name) DO UPDATE SET heard_at = max(heard_at, ?2), presence_at = ?2",
                (machine, heard_at),
            )


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
        nothing. Either way a receipt row goes back (a repeat means its sender did not hear the
        last one). InputError (nothing stored) for a recipient that is not a session here."""
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
                "reported) VALUES (?,?,?,?,?,?,?,?,?)",
                (message.id, sender, to_id, message.text, message.hop, message.reply_to,
                 message.created_at, from_machine, fed.receipt_rank(fed.STORED)),
            )
            self.conn.execute("INSERT INTO receipts(message_id, peer_id) VALUES (?, ?)", (message.id, to_id))
            seq = self.conn.last_insert_rowid()
            self._queue_receipt(message.id, from_machine, fed.receipt_rank(fed.STORED), now)
            self._heard(from_machine, now)
        tap = self.taps.get(to_id)  # committed: its delivery task takes it as a local send's, no read back
        if tap is not None:
            stored = queries.messages_by_id(self.conn, [message.id])
            if not stored or not tap.append(seq, stored[0]):
                self._close_tap(to_id)
        return Applied.NEW

    def queue_receipt_updates(self, now: int) -> int:
        """Receipts for messages from other machines that were shown or acknowledged here since
        the last call: one outbox row each, with `reported` moved on, one transaction."""
        with self.conn:
            rows = self.conn.execute(
                "SELECT m.id, m.machine, m.reported, r.delivered_at, r.acked_at FROM messages m "
                "JOIN receipts r ON r.message_id = m.id AND r.peer_id = m.to_peer "
                "WHERE m.machine IS NOT NULL AND m.reported < 3 "
                "AND (r.acked_at IS NOT NULL OR (r.delivered_at IS NOT NULL AND m.reported < 2))"
            ).fetchall()
            for message_id, machine, reported, _shown, acked in rows:
                rank = fed.receipt_rank(fed.ACKNOWLEDGED if acked is not None else fed.SHOWN)
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
