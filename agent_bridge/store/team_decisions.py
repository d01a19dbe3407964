"""The store's side of federation (SPEC §10) for decisions: this machine's decisions and retractions
queued for the team, another machine's applied with its receipt queued back, and the presence of
the other machines, a newcomer owed what it has not confirmed (store.federation has the whole
picture)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from agent_bridge.common import domain
from agent_bridge.common.domain import SessionView
from agent_bridge.core import envelopes as env
from agent_bridge.core import federation as fed
from agent_bridge.store import federation_queries as fq
from agent_bridge.store import queries
from agent_bridge.store.decisions import Decisions, Recipient
from agent_bridge.store.team_records import KEY_PREFIX, Applied, TeamRecords, remote_peer_id


class TeamDecisions(TeamRecords, Decisions):
    """The team's decisions and retractions (queued for the others, applied from them) and
    the other machines' presence."""

    # --- decisions ------------------------------------------------------------------------------

    def queue_team_decisions(self, now: int, project_key: Callable[[str], str | None]) -> int:
        """This machine's decisions and retractions not yet put in the outbox for the team, in
        recording order: scope all, or a project whose folder has a project key (`project_key`
        of the folder); sessions scopes and folders without an origin stay here. One transaction."""
        with self.conn:
            queued = self._queue_new("decisions", lambda i: self._decision_body(i, project_key), now)
            queued += self._queue_new("retractions", lambda i: self._retraction_body(i, project_key), now)
        return queued

    def _queue_new(self, cursor: str, body_of: Callable[[str], bytes | None], now: int) -> int:
        """The records of this machine in `cursor`'s table ("decisions", "retractions") past the
        cursor, each with a body put in the outbox; the cursor moved past them. An unchanged
        cursor is not written: a look that found nothing changes no row, so it pokes no commit feed."""
        table = "decisions" if cursor == "decisions" else "decision_retractions"
        after = last = self._cursor(cursor)
        queued = 0
        for seq, record_id in self.conn.execute(
            f"SELECT seq, id FROM {table} WHERE seq > ? AND machine IS NULL ORDER BY seq", (after,)
        ).fetchall():
            assert isinstance(seq, int)
            last = seq
            body = body_of(str(record_id))
            if body is not None:
                self._queue_out(fed.DEC, str(record_id), None, body, now)
                queued += 1
        if last != after:
            self._set_cursor(cursor, last)
        return queued

    def _decision_body(self, decision_id: str, project_key: Callable[[str], str | None]) -> bytes | None:
        """The envelope of a decision recorded here, or None when it stays here (a sessions
        scope, or a folder without a project key)."""
        d = queries.decision_by_id(self.conn, decision_id)
        assert d is not None
        kind = domain.scope_kind(d.scope)
        key = None
        if kind == "project":
            assert isinstance(d.scope, dict)
            key = project_key(d.scope["project"])
            if key is None:
                return None
        elif kind != "all":
            return None
        return env.encode(env.DecisionEnvelope(
            id=d.id, topic=d.topic, text=d.text, project_key=key,
            author=env.Author(d.author.id or "cli", d.author.name or "cli", d.author.agent or "cli"),
            created_at=d.created_at, supersedes=d.supersedes, source_message_id=d.source_message_id,
        ))

    def _retraction_body(self, retraction_id: str, project_key: Callable[[str], str | None]) -> bytes | None:
        """The envelope of a retraction recorded here, or None when its decision stays here."""
        r = queries.retraction_by_id(self.conn, retraction_id)
        assert r is not None
        row = self.conn.execute("SELECT scope FROM decisions WHERE id = ?", (r.retracts,)).fetchone()
        assert row is not None
        scope = domain.scope_from_json(str(row[0]))
        if domain.scope_kind(scope) == "sessions":
            return None
        if isinstance(scope, dict) and project_key(scope["project"]) is None:
            return None
        return env.encode(env.RetractionEnvelope(
            id=r.id, topic=r.topic, retracts=r.retracts, reason=r.reason,
            author=env.Author(r.author.id or "cli", r.author.name or "cli", r.author.agent or "cli"),
            created_at=r.created_at,
        ))

    def _owe_newcomer(
        self, machine: str, alone: bool, now: int, project_key: Callable[[str], str | None]
    ) -> list[tuple[fed.OutboxRow, fed.TeamCount]]:
        """`machine` was heard for the first time (or again after it was forgotten), inside the
        caller's transaction. Every decision and retraction of ours already put out for the team
        that it has not said it stored is owed to it: its row queued again (the same envelope)
        if it had ended, else kept (`alone`: no other machine was heard, so the row was owed to
        nobody and its bound starts now). A row it confirmed before it was heard may end now.
        Each with the team's count, for core.federation.Outbox.owed."""
        held = {row.id for row in fq.outbox_rows(self.conn) if row.kind == fed.DEC}
        owed: list[str] = []
        for table, cursor, body_of in (
            ("decisions", "decisions", self._decision_body),
            ("decision_retractions", "retractions", self._retraction_body),
        ):
            for (record_id,) in self.conn.execute(
                f"SELECT r.id FROM {table} r WHERE r.machine IS NULL AND r.seq <= ? AND NOT EXISTS "
                "(SELECT 1 FROM team_receipts t WHERE t.record_id = r.id AND t.machine = ?) ORDER BY r.seq",
                (self._cursor(cursor), machine),
            ).fetchall():
                record_id = str(record_id)
                if record_id in held:
                    if alone:
                        self.conn.execute(
                            "UPDATE outbox SET queued_at = ?, unconfirmed_at = NULL "
                            "WHERE kind = ? AND id = ?",
                            (now, fed.DEC, record_id),
                        )
                    owed.append(record_id)
                    continue
                body = body_of(record_id, project_key)
                if body is not None:
                    self._queue_out(fed.DEC, record_id, None, body, now)
                    owed.append(record_id)
        counts = {record_id: self._team_count(record_id) for record_id in held | set(owed)}
        ended = [record_id for record_id in sorted(held - set(owed)) if counts[record_id].awaited == 0]
        rows = {row.id: row for row in fq.outbox_rows(self.conn) if row.kind == fed.DEC}
        return [(rows[record_id], counts[record_id]) for record_id in owed + ended]

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

    def record_presence(
        self,
        machine: str,
        presence: env.PresenceEnvelope,
        heard_at: int,
        project_key: Callable[[str], str | None] = lambda folder: None,
    ) -> list[tuple[fed.OutboxRow, fed.TeamCount]]:
        """A machine's sessions as it announced them: each one's record here made or updated, and
        its sessions it no longer announces shown offline. A machine heard for the first time
        (or again after it was forgotten) becomes a member of the team here and is owed every
        decision and retraction of ours it has not confirmed (`project_key` of a folder, as for
        queue_team_decisions): their outbox rows are returned with the team's count (and those of
        rows it had confirmed before it was heard, which may end now). One transaction."""
        with self.conn:
            known = {str(r[0]) for r in self.conn.execute("SELECT name FROM machines")}
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
            owed = [] if machine in known else self._owe_newcomer(machine, not known, heard_at, project_key)
        return owed
