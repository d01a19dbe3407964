"""The store's sessions and their identity: session records, resume secrets, the host-instance
map, merging a pending record into an earlier one, and the command line's author record.

Every method is one transaction (or a read); see store.writer.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable

from agent_bridge.common import domain
from agent_bridge.common.domain import SessionView
from agent_bridge.common.rows import Peer
from agent_bridge.store import queries
from agent_bridge.store.base import StoreBase
from agent_bridge.store.ids import new_id, now_ms

# The author of `agent-bridge decide/send/retract`: a job record, never listed, never addressed.
CLI_AUTHOR = SessionView(id=queries.CLI_ID, name=domain.CLI_AGENT, project="", kind="job")


class Peers(StoreBase):
    """Session records and what identifies a connection as one of them."""

    # --- sessions -----------------------------------------------------------------

    def create_peer(
        self, *, agent: str, name: str, project: str, kind: str, host_session_id: str | None, now: int
    ) -> Peer:
        peer_id = new_id()
        with self.conn:
            self.conn.execute(
                "INSERT INTO peers(id, name, agent, project, kind, created_at, last_seen_at, "
                "host_session_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (peer_id, name, agent, project, kind, now, now, host_session_id),
            )
        return self._peer(peer_id)

    def _peer(self, peer_id: str) -> Peer:
        """A record this transaction just wrote."""
        peer = self.get_peer(peer_id)
        assert peer is not None
        return peer

    def get_peer(self, peer_id: str) -> Peer | None:
        row = self.conn.execute(
            "SELECT id, name, agent, project, host_session_id, kind, created_at, last_seen_at "
            "FROM peers WHERE id = ?",
            (peer_id,),
        ).fetchone()
        return Peer(*row) if row else None

    def peer_by_host_session(self, host_session_id: str) -> Peer | None:
        return queries.peer_by_host_session(self.conn, host_session_id)

    # The columns update_peer may set, named as Peer's fields (which are the columns' names).
    _UPDATABLE = frozenset({"name", "project", "host_session_id", "kind", "agent", "last_seen_at"})

    def update_peer(self, /, peer_id: str, **fields: str | int | None) -> Peer:
        unknown = set(fields) - self._UPDATABLE
        if unknown:
            raise ValueError(f"update_peer: not an updatable column: {sorted(unknown)}")
        sets = ", ".join(f"{k} = ?" for k in fields)
        with self.conn:
            if sets:
                self.conn.execute(f"UPDATE peers SET {sets} WHERE id = ?", (*fields.values(), peer_id))
        return self._peer(peer_id)

    def touch_peers(self, peer_ids: Iterable[str], now: int) -> None:
        with self.conn:
            self.conn.executemany(
                "UPDATE peers SET last_seen_at = ? WHERE id = ?", [(now, p) for p in peer_ids]
            )

    def list_peers(self) -> list[Peer]:
        return queries.list_peers(self.conn)

    def find_peers_by_address(self, address: str) -> list[Peer]:
        """Sessions an address names (id, name or host session id), most recently seen first."""
        rows = self.conn.execute(
            "SELECT id, name, agent, project, host_session_id, kind, created_at, last_seen_at FROM peers "
            f"WHERE (id = ?1 OR name = ?1 OR host_session_id = ?1) AND {queries.LISTED_PEERS} "
            "ORDER BY last_seen_at DESC, rowid DESC",
            (address,),
        )
        return [Peer(*r) for r in rows]

    def absorb_peer(self, old_id: str, into_id: str) -> None:
        """A pending connection turned out to be an earlier session: move what it holds."""
        self._close_tap(old_id)
        self._close_tap(into_id)
        with self.conn:
            self.conn.execute(
                "UPDATE receipts SET peer_id = ? WHERE peer_id = ? AND acked_at IS NULL "
                "AND message_id NOT IN (SELECT message_id FROM receipts WHERE peer_id = ?)",
                (into_id, old_id, into_id),
            )
            rows = self.conn.execute(
                "SELECT decision_id, message_id, created_at FROM decision_deliveries WHERE host_key = ?",
                (f"peer:{old_id}",),
            ).fetchall()
            target = self.get_peer(into_id)
            key = (target.host_session_id if target is not None else None) or f"peer:{into_id}"
            self.conn.executemany(
                "INSERT OR IGNORE INTO decision_deliveries"
                "(decision_id, host_key, peer_id, message_id, created_at) VALUES (?, ?, ?, ?, ?)",
                [(d, key, into_id, m, c) for d, m, c in rows],
            )
            # Whatever resolved an address to the old record before this commit reaches the
            # session through the merge map (resolve_peer), not a dead record.
            self.conn.execute(
                "INSERT OR REPLACE INTO peer_merges(old_id, into_id, merged_at) VALUES (?, ?, ?)",
                (old_id, into_id, now_ms()),
            )
            self.conn.execute("UPDATE peer_merges SET into_id = ? WHERE into_id = ?", (into_id, old_id))
            self.conn.execute("DELETE FROM peer_merges WHERE old_id = into_id")
            # The connection keeps its resume secret and its host instance: they now name this record.
            self.conn.execute(
                "INSERT OR REPLACE INTO session_secrets(peer_id, secret_hash) "
                "SELECT ?, secret_hash FROM session_secrets WHERE peer_id = ?",
                (into_id, old_id),
            )
            self.conn.execute(
                "INSERT OR IGNORE INTO instance_sessions(pid, start_time, peer_id, seen_at) "
                "SELECT pid, start_time, ?, seen_at FROM instance_sessions WHERE peer_id = ?",
                (into_id, old_id),
            )
            self._delete_if_unreferenced(old_id)

    def _referenced(self, peer_id: str) -> bool:
        """Whether another row names this session record (so deleting it would break a reference)."""
        row = self.conn.execute(
            "SELECT EXISTS(SELECT 1 FROM messages WHERE from_peer = ?1 OR to_peer = ?1) "
            "OR EXISTS(SELECT 1 FROM receipts WHERE peer_id = ?1) "
            "OR EXISTS(SELECT 1 FROM decisions WHERE author_id = ?1) "
            "OR EXISTS(SELECT 1 FROM decision_deliveries WHERE peer_id = ?1) "
            "OR EXISTS(SELECT 1 FROM decision_retractions WHERE author_id = ?1) "
            "OR EXISTS(SELECT 1 FROM retraction_notices WHERE peer_id = ?1) "
            "OR EXISTS(SELECT 1 FROM question_askers WHERE peer_id = ?1) "
            "OR EXISTS(SELECT 1 FROM question_notices WHERE peer_id = ?1)",
            (peer_id,),
        ).fetchone()
        return row is None or bool(row[0])

    def _delete_if_unreferenced(self, peer_id: str) -> bool:
        """Delete a session record that nothing else names (inside the caller's transaction)."""
        if self._referenced(peer_id):
            return False
        self._drop_identity(peer_id)
        self.conn.execute("DELETE FROM peers WHERE id = ?", (peer_id,))
        return True

    def _drop_identity(self, peer_id: str) -> None:
        """What lets a connection become this session again: its resume secret, the host
        instances that ran it, merged records leading to it (inside the caller's transaction)."""
        self.conn.execute("DELETE FROM session_secrets WHERE peer_id = ?", (peer_id,))
        self.conn.execute("DELETE FROM instance_sessions WHERE peer_id = ?", (peer_id,))
        self.conn.execute("DELETE FROM peer_merges WHERE into_id = ?", (peer_id,))

    def resolve_peer(self, peer_id: str) -> str:
        """The record a session id leads to now: itself, or the record it was merged into."""
        row = self.conn.execute("SELECT into_id FROM peer_merges WHERE old_id = ?", (peer_id,)).fetchone()
        return peer_id if row is None else str(row[0])

    # --- resume -------------------------------------------------------------------

    def set_secret(self, peer_id: str, secret_hash: str) -> None:
        with self.conn:
            self.conn.execute(
                "INSERT OR REPLACE INTO session_secrets(peer_id, secret_hash) VALUES (?, ?)",
                (peer_id, secret_hash),
            )

    def peer_with_secret(self, peer_id: str, secret_hash: str) -> Peer | None:
        """The session `peer_id` leads to (following a merge), if `secret_hash` is its secret's."""
        current = self.resolve_peer(peer_id)
        row = self.conn.execute(
            "SELECT secret_hash FROM session_secrets WHERE peer_id = ?", (current,)
        ).fetchone()
        if row is None or not hmac.compare_digest(str(row[0]), secret_hash):
            return None
        return self.get_peer(current)

    def record_instance_session(self, pid: int, start_time: int, peer_id: str, now: int) -> None:
        with self.conn:
            self.conn.execute(
                "INSERT INTO instance_sessions(pid, start_time, peer_id, seen_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(pid, start_time, peer_id) DO UPDATE SET seen_at = excluded.seen_at",
                (pid, start_time, peer_id, now),
            )

    def instance_sessions(
        self, pid: int, start_time: int, *, agent: str, project: str, kind: str
    ) -> list[str]:
        """The sessions without a host session id that host instance (pid, start_time) ran for
        this agent, project and kind, most recently seen first. (One with a host session id
        is found by that id; another project is another session.)"""
        rows = self.conn.execute(
            "SELECT i.peer_id FROM instance_sessions i JOIN peers p ON p.id = i.peer_id "
            "WHERE i.pid = ? AND i.start_time = ? AND p.host_session_id IS NULL "
            f"AND {queries.listed_peers('p')} AND p.agent = ? AND p.project = ? AND p.kind = ? "
            "ORDER BY i.seen_at DESC",
            (pid, start_time, agent, project, kind),
        )
        return [r[0] for r in rows]

    def session_addresses_taken(self, name: str, *, excluding: str | None = None) -> bool:
        """Whether `name` is another session's id or host session id."""
        row = self.conn.execute(
            "SELECT 1 FROM peers WHERE (id = ?1 OR host_session_id = ?1) AND id IS NOT ?2 AND "
            f"{queries.LISTED_PEERS} LIMIT 1",
            (name, excluding),
        ).fetchone()
        return row is not None

    def adopt_host_key(self, peer_id: str, host_session_id: str) -> None:
        """Deliveries recorded while the session's host identity was unknown count for it now."""
        with self.conn:
            self.conn.execute(
                "INSERT OR IGNORE INTO decision_deliveries"
                "(decision_id, host_key, peer_id, message_id, created_at) "
                "SELECT decision_id, ?, peer_id, message_id, created_at FROM decision_deliveries "
                "WHERE host_key = ?",
                (host_session_id, f"peer:{peer_id}"),
            )

    # --- host map -----------------------------------------------------------------

    def record_host_instance(
        self, pid: int, start_time: int, host_session_id: str, agent: str | None, now: int, *, exclusive: bool
    ) -> None:
        """Remember that host process (pid, start_time) runs `host_session_id`.

        `exclusive`: the host runs one session at a time (Claude Code), so a new id (after
        `/clear`) replaces the old ones; Codex may run several threads in one process.
        """
        with self.conn:
            if exclusive:
                self.conn.execute(
                    "DELETE FROM host_instances WHERE pid = ? AND start_time = ? AND host_session_id != ?",
                    (pid, start_time, host_session_id),
                )
            self.conn.execute(
                "INSERT INTO host_instances(pid, start_time, host_session_id, agent, seen_at) "
                "VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT(pid, start_time, host_session_id) DO UPDATE SET seen_at = excluded.seen_at",
                (pid, start_time, host_session_id, agent, now),
            )

    def host_sessions_for(self, pid: int, start_time: int) -> list[str]:
        rows = self.conn.execute(
            "SELECT host_session_id FROM host_instances WHERE pid = ? AND start_time = ? "
            "ORDER BY seen_at DESC",
            (pid, start_time),
        )
        return [r[0] for r in rows]

    # --- the command line's author ----------------------------------------------------

    def _ensure_cli_peer(self, now: int) -> None:
        """The author record of `agent-bridge decide/send/retract` (messages and decisions
        reference their author's row). A job, never listed, never addressed."""
        self.conn.execute(
            "INSERT OR IGNORE INTO peers(id, name, agent, project, kind, created_at, last_seen_at) "
            "VALUES (?, ?, ?, '', 'job', ?, ?)",
            (CLI_AUTHOR.id, CLI_AUTHOR.name, domain.CLI_AGENT, now, now),
        )
