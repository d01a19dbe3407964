"""The store's pinned decisions and their retractions: recording a revision with its
notifications, catching a session up on what applies to it, withdrawing a topic.

Every method is one transaction (or a read); see store.writer.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from agent_bridge.common import domain
from agent_bridge.common.domain import Scope, SessionView
from agent_bridge.common.rows import Decision, Retraction
from agent_bridge.store import queries
from agent_bridge.store.ids import new_id
from agent_bridge.store.messages import Messages
from agent_bridge.store.peers import CLI_AUTHOR


@dataclass(frozen=True)
class Recipient:
    """A connected, non-job session in scope of a decision, with the key its receipt is kept under."""

    session: SessionView
    host_key: str


def host_key(session: SessionView) -> str:
    return session.host_session_id or f"peer:{session.id}"


class Decisions(Messages):
    """Pinned decisions, their notifications and deliveries, and retractions."""

    def record_decision(
        self,
        *,
        author: SessionView,
        author_agent: str,
        topic: str,
        text: str,
        scope: Scope,
        source_message_id: str | None,
        recipients: Sequence[Recipient],
        now: int,
        fault: Callable[[str], None] = lambda point: None,
    ) -> tuple[Decision, list[str]]:
        """One revision, its notifications, their receipts and deliveries: one transaction."""
        decision_id = new_id()
        kind = domain.scope_kind(scope)
        project = scope["project"] if isinstance(scope, dict) and kind == "project" else None
        with self.conn:
            if author.id == CLI_AUTHOR.id:
                self._ensure_cli_peer(now)
            author_id = self.resolve_peer(author.id)
            recipients = self._resolve_recipients(recipients)
            if source_message_id is not None and not self.message_exists(source_message_id):
                source_message_id = None
            # The topic's last revision: the current one, or the retracted one a new decide restarts.
            # Latest by (createdAt, id), the order every machine of a team agrees on (SPEC §10).
            last = self.conn.execute(
                "SELECT id FROM decisions WHERE topic = ? ORDER BY created_at DESC, id DESC LIMIT 1", (topic,)
            ).fetchone()
            supersedes = last[0] if last else None
            created_at = self._after_newest(topic, now)
            self.conn.execute(
                "INSERT INTO decisions(id, topic, text, text_key, scope, scope_kind, scope_project, "
                "author_id, author_name, author_agent, created_at, source_message_id, supersedes) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    decision_id,
                    topic,
                    text,
                    domain.search_key(text),
                    domain.scope_to_json(scope),
                    kind,
                    project,
                    author_id,
                    author.name,
                    author_agent,
                    created_at,
                    source_message_id,
                    supersedes,
                ),
            )
            decision = queries.decision_by_id(self.conn, decision_id)
            assert decision is not None
            fault("decide:after-decision")
            self._queue_notifications(decision, author_id, recipients, now, fault)
            fault("decide:before-commit")
        fault("decide:after-commit")
        assert decision is not None
        return decision, sorted(r.session.name for r in recipients)

    def _after_newest(self, topic: str, now: int) -> int:
        """The createdAt of a revision (or retraction) recorded here now: `now`, or just past the
        topic's newest one when that is not older (the same millisecond, or another machine's
        clock ahead of ours), so what is recorded here is the topic's latest by (createdAt, id)."""
        row = self.conn.execute(
            "SELECT max(t) FROM (SELECT max(created_at) AS t FROM decisions WHERE topic = ?1 "
            "UNION ALL SELECT max(created_at) FROM decision_retractions WHERE topic = ?1)",
            (topic,),
        ).fetchone()
        newest = row[0] if row else None
        return now if newest is None or newest < now else int(newest) + 1

    def _resolve_recipients(self, recipients: Sequence[Recipient]) -> list[Recipient]:
        """Recipients chosen before the transaction, each as the record it is now: one that was
        merged into an earlier session counts under that session's id and host key."""
        out: dict[str, Recipient] = {}
        for r in recipients:
            current = self.resolve_peer(r.session.id)
            if current != r.session.id:
                peer = self.get_peer(current)
                if peer is None:
                    continue
                view = peer.view()
                r = Recipient(view, host_key(view))
            out.setdefault(r.session.id, r)
        return list(out.values())

    def _queue_notifications(
        self,
        decision: Decision,
        from_id: str,
        recipients: Sequence[Recipient],
        now: int,
        fault: Callable[[str], None] = lambda point: None,
    ) -> list[str]:
        body = notification_text(decision)
        queued = []
        for i, recipient in enumerate(recipients):
            self._close_tap(recipient.session.id)  # its delivery task reads these from the database
            message_id = new_id()
            self.conn.execute(
                "INSERT INTO messages(id, from_peer, to_peer, body, hop, reply_to, created_at) "
                "VALUES (?,?,?,?,?,?,?)",
                (message_id, from_id, recipient.session.id, body, domain.DECISION_HOP, None, now),
            )
            self.conn.execute(
                "INSERT INTO receipts(message_id, peer_id) VALUES (?, ?)", (message_id, recipient.session.id)
            )
            self.conn.execute(
                "INSERT INTO decision_deliveries(decision_id, host_key, peer_id, message_id, created_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (decision.id, recipient.host_key, recipient.session.id, message_id, now),
            )
            queued.append(message_id)
            if i == 0:
                fault("decide:mid-fanout")
        return queued

    def catch_up(
        self, session: SessionView, now: int, *, only: Collection[str] | None = None,
        key_of: Callable[[str], str | None] = lambda folder: None,
    ) -> int:
        """Queue every current decision applicable to `session` that its host session has not
        received yet (SPEC §4.4). Only for a session whose host identity is known, except with
        `only`: those decisions (recorded while the session was tentative), under its key.
        `key_of(folder)`: a folder's project key, asked only when another machine's project
        decision is among the missing ones (SPEC §10: it applies to folders with that key)."""
        if session.kind == "job" or (only is None and not session.host_session_id):
            return 0
        key = host_key(session)
        with self.conn:
            current = queries.query_decisions(self.conn)
            received = {
                r[0]
                for r in self.conn.execute(
                    "SELECT decision_id FROM decision_deliveries WHERE host_key = ?", (key,)
                )
            }
            candidates = [d for d in current if d.id not in received and (only is None or d.id in only)]
            project_key = None
            if any(isinstance(d.scope, dict) and str(d.scope.get("project", "")).startswith(
                    domain.KEYED_PROJECT) for d in candidates):
                project_key = key_of(session.project)
            missing = [d for d in candidates if domain.scope_applies(d.scope, session, project_key)]
            for decision in reversed(missing):  # oldest first, so the inbox reads in recording order
                author_id = decision.author.id
                assert author_id is not None  # decisions.author_id is NOT NULL
                self._queue_notifications(decision, author_id, [Recipient(session, key)], now)
        return len(missing)

    def decisions(
        self,
        /,
        *,
        needle: str | None = None,
        lookup: Scope | None = None,
        caller_addresses: Iterable[str] = (),
        history: bool = False,
        topic: str | None = None,
        project_key: str | None = None,
    ) -> list[Decision]:
        return queries.query_decisions(
            self.conn,
            needle=needle,
            lookup=lookup,
            caller_addresses=caller_addresses,
            history=history,
            topic=topic,
            project_key=project_key,
        )

    def retractions(self, topics: Sequence[str]) -> list[Retraction]:
        """The retraction records of these topics, newest first."""
        found = [r for topic in topics for r in queries.retractions(self.conn, topic=topic)]
        return sorted(found, key=lambda r: r.created_at, reverse=True)

    # --- retract ----------------------------------------------------------------------

    def retract(
        self, *, topic: str, reason: str | None, author: SessionView, author_agent: str,
        connected: Sequence[SessionView], now: int, fault: Callable[[str], None] = lambda point: None,
        key_of: Callable[[str], str | None] = lambda folder: None,
    ) -> tuple[Retraction, list[tuple[str, str]]]:
        """Withdraw the topic's current decision: one appended retraction record, and one
        passive notice for each session in the retracted revision's scope (connected,
        non-job) or that was sent that revision. One transaction. `key_of`: a folder's project
        key, asked when the revision is another machine's project decision (SPEC §10).

        Returns (the retraction, [(session id, name) notified]). InputError when the topic has
        no current decision."""
        with self.conn:
            if author.id == CLI_AUTHOR.id:
                self._ensure_cli_peer(now)
            current = queries.query_decisions(self.conn, topic=topic)
            if not current:
                retracted = queries.retractions(self.conn, topic=topic)
                if retracted:
                    raise domain.InputError(f"topic: {topic!r} has no current decision (already retracted)")
                raise domain.InputError(f"topic: no decision has been recorded for {topic!r}")
            decision = current[0]
            retraction_id = new_id()
            self.conn.execute(
                "INSERT INTO decision_retractions(id, topic, retracts, reason, author_id, author_name, "
                "author_agent, created_at) VALUES (?,?,?,?,?,?,?,?)",
                (retraction_id, topic, decision.id, reason, author.id, author.name, author_agent,
                 self._after_newest(topic, now)),
            )
            targets = self._retraction_targets(decision, connected, key_of)
            fault("retract:after-record")
            self._queue_retraction_notices(decision, retraction_id, author.id, reason, targets, now, fault)
            retraction = queries.retraction_by_id(self.conn, retraction_id)
            fault("retract:before-commit")
        assert retraction is not None
        return retraction, sorted(targets.items(), key=lambda item: item[1])

    def _retraction_targets(
        self, decision: Decision, connected: Sequence[SessionView], key_of: Callable[[str], str | None]
    ) -> dict[str, str]:
        """{session id: name} a retraction of `decision` notifies: the connected non-job sessions
        in its scope, and every listed session that was sent that revision."""
        keyed = isinstance(decision.scope, dict) and str(decision.scope.get("project", "")).startswith(
            domain.KEYED_PROJECT)
        targets: dict[str, str] = {}
        for session in connected:
            key = key_of(session.project) if keyed else None
            if session.kind != "job" and domain.scope_applies(decision.scope, session, key):
                targets[session.id] = session.name
        for peer_id, name in self.conn.execute(
            "SELECT p.id, p.name FROM decision_deliveries dd JOIN peers p ON p.id = dd.peer_id "
            f"WHERE dd.decision_id = ? AND p.kind != 'job' AND {queries.listed_peers('p')}",
            (decision.id,),
        ):
            targets.setdefault(peer_id, name)
        return targets

    def _queue_retraction_notices(
        self, decision: Decision, retraction_id: str, author_id: str, reason: str | None,
        targets: dict[str, str], now: int, fault: Callable[[str], None] = lambda point: None,
    ) -> None:
        body = retraction_text(decision, reason)
        for i, peer_id in enumerate(targets):
            if i == 1:
                fault("retract:mid-notices")
            self._close_tap(peer_id)  # its delivery task reads this from the database
            message_id = new_id()
            self.conn.execute(
                "INSERT INTO messages(id, from_peer, to_peer, body, hop, reply_to, created_at) "
                "VALUES (?,?,?,?,?,?,?)",
                (message_id, author_id, peer_id, body, domain.DECISION_HOP, None, now),
            )
            self.conn.execute(
                "INSERT INTO receipts(message_id, peer_id) VALUES (?, ?)", (message_id, peer_id)
            )
            self.conn.execute(
                "INSERT INTO retraction_notices(message_id, retraction_id, peer_id) VALUES (?, ?, ?)",
                (message_id, retraction_id, peer_id),
            )


def retraction_text(decision: Decision, reason: str | None) -> str:
    line = f"Pinned owner decision retracted: {decision.line()} no longer applies"
    return line + (f". Reason: {reason}" if reason else ".")


def notification_text(decision: Decision) -> str:
    scope = decision.scope
    where = "all sessions" if scope == "all" else domain.scope_to_json(scope)
    return f"Pinned owner decision for {where}: {decision.line()}"
