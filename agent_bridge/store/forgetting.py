"""The store's forgetting: dropping sessions the owner (or a health check) no longer wants, and
finding the ones not seen for a while. What decisions still reference stays as a tombstone.

Every method is one transaction (or a read); see store.writer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from agent_bridge.common.rows import Forgotten
from agent_bridge.store import queries
from agent_bridge.store.peers import CLI_AUTHOR, Peers


class Forgetting(Peers):
    """Forgetting session records, and finding the ones not seen for a while."""

    def forget_unused_peer(self, peer_id: str) -> bool:
        """A session that never became anyone (a health check: no host identity, no tool
        call) leaves nothing behind, unless something was already sent to it."""
        with self.conn:
            forgotten = self._delete_if_unreferenced(peer_id)
        return forgotten

    def forget_peers(
        self, peer_ids: Sequence[str], now: int, *, fault: Callable[[str], None] = lambda point: None
    ) -> list[Forgotten]:
        """Forget sessions (the caller checked none is connected): what was queued to each is
        returned, then dropped with it. One transaction.

        Pinned decisions and their deliveries are append-only history: a session they (or
        messages it sent) still reference stays as a tombstone, unlisted, unaddressable, its host
        session id cleared; any other session's row is deleted."""
        out = []
        with self.conn:
            for peer_id in peer_ids:
                peer = self.get_peer(peer_id)
                if peer is None or peer_id == CLI_AUTHOR.id:
                    continue
                queued = [
                    q.message
                    for q in queries.unacked_messages(
                        self.conn, peer_id, limit=1_000_000, current_schema=True
                    )
                ]
                self._close_tap(peer_id)
                self.conn.execute("DELETE FROM receipts WHERE peer_id = ?", (peer_id,))
                # Messages to it that nothing else holds: no receipt left, no notice or decision naming them.
                self.conn.execute(
                    "DELETE FROM messages WHERE to_peer = ?1 "
                    "AND NOT EXISTS (SELECT 1 FROM receipts r WHERE r.message_id = messages.id) "
                    "AND NOT EXISTS (SELECT 1 FROM decision_deliveries dd WHERE dd.message_id = messages.id) "
                    "AND NOT EXISTS (SELECT 1 FROM retraction_notices rn WHERE rn.message_id = messages.id) "
                    "AND NOT EXISTS (SELECT 1 FROM question_notices qn WHERE qn.message_id = messages.id) "
                    "AND NOT EXISTS (SELECT 1 FROM decisions d WHERE d.source_message_id = messages.id)",
                    (peer_id,),
                )
                if peer.host_session_id:
                    self.conn.execute(
                        "DELETE FROM host_instances WHERE host_session_id = ?", (peer.host_session_id,)
                    )
                if queries.has_table(self.conn, "outbox"):
                    # another machine's session (SPEC §10): its messages waiting to be published go too
                    self.conn.execute(
                        "DELETE FROM outbox WHERE kind = 'msg' AND NOT EXISTS (SELECT 1 FROM messages m "
                        "WHERE m.id = outbox.id AND m.to_peer != ?)", (peer_id,))
                self._drop_identity(peer_id)
                if self._referenced(peer_id):
                    self.conn.execute(
                        "UPDATE peers SET host_session_id = NULL, forgotten_at = ? WHERE id = ?",
                        (now, peer_id),
                    )
                else:
                    self.conn.execute("DELETE FROM peers WHERE id = ?", (peer_id,))
                out.append(Forgotten(peer, queued))
            fault("forget:before-commit")
        return out

    def forget_remote(self, now: int, after: int) -> list[str]:
        """Forget what the team stopped saying (SPEC §10): another machine's session not announced
        for `after` ms (gone there, or its machine silent that long) is forgotten as a local one
        is (`forget_peers`: unlisted, unaddressable, what was queued to it dropped, outbox rows
        included, a tombstone where history names it), and a machine silent that long is no
        longer listed nor awaited for a decision's receipt. Announced again, a session is listed
        again (record_presence). Returns the forgotten `name@machine` addresses and machines.
        One transaction, only when there is something to forget."""
        if not queries.has_column(self.conn, "peers", "machine"):
            return []
        cutoff = now - after
        gone = self.conn.execute(
            "SELECT id, name, machine FROM peers WHERE machine IS NOT NULL AND forgotten_at IS NULL "
            "AND project != '' AND last_seen_at < ?",
            (cutoff,),
        ).fetchall()
        silent = [str(r[0]) for r in self.conn.execute(
            "SELECT name FROM machines WHERE heard_at < ?", (cutoff,))]
        if not gone and not silent:
            return []
        with self.conn:
            self.forget_peers([str(r[0]) for r in gone], now)
            self.conn.execute("DELETE FROM machines WHERE heard_at < ?", (cutoff,))
        return [f"{name}@{machine}" for _, name, machine in gone] + [f"machine {m}" for m in silent]

    def sessions_last_seen_before(self, cutoff: int) -> list[str]:
        """Listed sessions last seen before `cutoff` (epoch ms), oldest first."""
        rows = self.conn.execute(
            f"SELECT id FROM peers WHERE last_seen_at < ? AND {queries.LISTED_PEERS} "
            "ORDER BY last_seen_at, rowid",
            (cutoff,),
        )
        return [r[0] for r in rows]
