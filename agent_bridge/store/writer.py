"""The broker's store: the only writer of bridge.db (SPEC §7).

Every method is synchronous and is one transaction. The broker calls them on a worker thread
(`daemon.storage.StoreRunner`), never on the Trio event loop.
"""

from __future__ import annotations

import hmac
import json
import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import apsw
import apsw.bestpractice

from agent_bridge import domain, paths
from agent_bridge.domain import Scope, SessionView
from agent_bridge.rows import Author, Decision, Forgotten, Message, Peer, Queued, Retraction
from agent_bridge.store import queries
from agent_bridge.store.schema import CURRENT_VERSION, SchemaError, SchemaTooNew, migrate, user_version

_bestpractice_applied = False


def apply_bestpractice() -> None:
    """WAL, busy timeout, foreign keys, no double-quoted strings… on every new connection."""
    global _bestpractice_applied
    if not _bestpractice_applied:
        apsw.bestpractice.apply(apsw.bestpractice.recommended)
        _bestpractice_applied = True


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# Ids name rows; they are not secrets (session secrets come from `secrets`). Time-ordered
# (UUID version 7): a new row's id sorts after the ids before it, so a batch of inserts lands
# on the last pages of the primary-key indexes (messages, receipts) instead of one page per
# message spread over the whole index, which every commit then wrote to the WAL again and
# every checkpoint copied. The random part comes from a generator seeded from the OS:
# `uuid.uuid4()` asks the kernel for 16 bytes at every call.
_ids = random.Random(os.urandom(32))
if hasattr(os, "register_at_fork"):  # a forked child must not repeat its parent's ids
    os.register_at_fork(after_in_child=lambda: _ids.seed(os.urandom(32)))


def new_id() -> str:
    """A UUID version 7 (RFC 9562: Unix milliseconds, then 74 random bits), as text."""
    n = time.time_ns() // 1_000_000 << 80 | 0x7 << 76 | _ids.getrandbits(12) << 64 | 0b10 << 62 | _ids.getrandbits(62)
    h = f"{n:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class Outgoing(NamedTuple):
    """One message a session sends, validated by the broker (domain rules)."""

    to_id: str
    text: str
    hop: int
    reply_to: str | None


@dataclass(frozen=True)
class Recipient:
    """A connected, non-job session in scope of a decision, with the key its receipt is kept under."""

    session: SessionView
    host_key: str


def host_key(session: SessionView) -> str:
    return session.host_session_id or f"peer:{session.id}"


def backup_path(db: Path, old_version: int) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    return paths.free_path(db.parent, f"{db.name}.v{old_version}-{stamp}", ".bak")


def check_version(path: Path) -> int:
    """The schema version of the database at `path`, read through a read-only connection, so
    that a database this code must refuse is refused before anything writes to it: opening it
    for writing switches it to WAL and runs `pragma optimize`. Raises SchemaTooNew, or
    SchemaError for a file that is not a SQLite database."""
    try:
        conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    except apsw.CantOpenError as exc:
        raise OSError(f"cannot open {path}: {exc}") from None
    try:
        found = user_version(conn)
    except apsw.NotADBError:
        raise SchemaError(
            f"{path} is not a SQLite database; move it aside (or point AGENT_BRIDGE_HOME elsewhere) "
            "and start again"
        ) from None
    finally:
        conn.close()
    if found > CURRENT_VERSION:
        raise SchemaTooNew(found)
    return found


TAP_LIMIT = 1000  # messages a tap holds before it closes and its session reads the database


class DeliveryTap:
    """The messages `send_messages` committed for one connected session since its delivery task
    last read its unacknowledged messages, in commit order, as (receipt seq, message) pairs.

    It spares that task reading back a row the store has just written. Only a shortcut: the
    database stays the truth. The store's thread opens it (at a read that reached the end of
    the session's messages) and appends to it; the delivery task drains it and closes it when
    it needs to read again. Anything else that changes the session's receipts (a decision's
    fan-out, a catch-up, absorbing another record) closes it, as does overflow: the delivery
    task then reads the database from its cursor, so nothing is skipped.

    Two threads use it (the store's and the event loop's), so every look and change holds its
    lock: `take` checks and drains in one step, never a check the other thread can overtake.
    """

    __slots__ = ("_lock", "_messages", "_open", "_peer_id")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._messages: deque[Queued] = deque()
        self._open = False
        self._peer_id: str | None = None

    @property
    def peer_id(self) -> str | None:
        """The record this tap was last opened for (it may have closed since)."""
        with self._lock:
            return self._peer_id

    @property
    def open(self) -> bool:
        with self._lock:
            return self._open

    def take(self, peer_id: str) -> list[Queued] | None:
        """Everything collected for `peer_id`, drained; None if the tap is closed or collects
        for another record (then the database must be read)."""
        with self._lock:
            if not self._open or self._peer_id != peer_id:
                return None
            out = list(self._messages)
            self._messages.clear()
            return out

    def close(self) -> None:
        with self._lock:
            self._open = False
            self._messages.clear()

    def reopen(self, peer_id: str) -> None:
        with self._lock:
            self._peer_id, self._open = peer_id, True
            self._messages.clear()

    def append(self, seq: int, message: Message) -> bool:
        """Collect one committed message; False (and closed) when closed or full."""
        with self._lock:
            if self._open and len(self._messages) < TAP_LIMIT:
                self._messages.append(Queued(seq, message))
                return True
            self._open = False
            self._messages.clear()
            return False


class Store:
    def __init__(self, conn: apsw.Connection, path: Path) -> None:
        self.conn = conn
        self.path = path
        self.taps: dict[str, DeliveryTap] = {}  # peer id -> its delivery task's tap
        # Known once migrated; read without touching the connection, which belongs to the
        # store's worker thread (the event loop asking it directly raced with that thread).
        self.schema_version = user_version(conn)

    @classmethod
    def open(
        cls,
        path: Path,
        log: Callable[[str], None] = lambda line: None,
        *,
        fault: Callable[[str], None] = lambda point: None,
    ) -> Store:
        """Open (creating if needed) and migrate to the current version, backing up first.

        `fault`: the broker's test-only crash points (daemon.faults); a no-op otherwise."""
        apply_bestpractice()
        existed = path.exists()
        if existed:
            check_version(path)  # before the connection below writes (journal mode, optimize)
        conn = apsw.Connection(str(path))
        try:
            conn.execute("PRAGMA synchronous = NORMAL")  # WAL: durable across process crashes

            def before_upgrade(old: int) -> None:
                if not existed:
                    return
                target = backup_path(path, old)
                backup_database(conn, target, fault=fault)
                log(f"schema upgrade from version {old}: backed up {path.name} to {target}")
                fault("upgrade:after-backup")

            old, new = migrate(conn, before_upgrade=before_upgrade, fault=fault)
            if old != new:
                log(f"schema upgraded from version {old} to {new}")
        except BaseException:
            conn.close()
            raise
        return cls(conn, path)

    def close(self) -> None:
        try:
            self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            self.conn.close()

    def version(self) -> int:
        return user_version(self.conn)

    # --- sessions -----------------------------------------------------------------

    def create_peer(
        self, *, agent: str, name: str, project: str, kind: str, host_session_id: str | None, now: int
    ) -> Peer:
        peer_id = new_id()
        with self.conn:
            self.conn.execute(
                "INSERT INTO peers(id, name, agent, project, kind, created_at, last_seen_at, host_session_id) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
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
            "SELECT id, name, agent, project, host_session_id, kind, created_at, last_seen_at FROM peers WHERE id = ?",
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
            self.conn.executemany("UPDATE peers SET last_seen_at = ? WHERE id = ?", [(now, p) for p in peer_ids])

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
                "INSERT OR IGNORE INTO decision_deliveries(decision_id, host_key, peer_id, message_id, created_at) "
                "VALUES (?, ?, ?, ?, ?)",
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
            "OR EXISTS(SELECT 1 FROM retraction_notices WHERE peer_id = ?1)",
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

    def forget_unused_peer(self, peer_id: str) -> bool:
        """A session that never became anyone (a health check: no host identity, no tool
        call) leaves nothing behind, unless something was already sent to it."""
        with self.conn:
            forgotten = self._delete_if_unreferenced(peer_id)
        return forgotten

    def resolve_peer(self, peer_id: str) -> str:
        """The record a session id leads to now: itself, or the record it was merged into."""
        row = self.conn.execute("SELECT into_id FROM peer_merges WHERE old_id = ?", (peer_id,)).fetchone()
        return peer_id if row is None else str(row[0])

    # --- resume -------------------------------------------------------------------

    def set_secret(self, peer_id: str, secret_hash: str) -> None:
        with self.conn:
            self.conn.execute(
                "INSERT OR REPLACE INTO session_secrets(peer_id, secret_hash) VALUES (?, ?)", (peer_id, secret_hash)
            )

    def peer_with_secret(self, peer_id: str, secret_hash: str) -> Peer | None:
        """The session `peer_id` leads to (following a merge), if `secret_hash` is its secret's."""
        current = self.resolve_peer(peer_id)
        row = self.conn.execute("SELECT secret_hash FROM session_secrets WHERE peer_id = ?", (current,)).fetchone()
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

    def instance_sessions(self, pid: int, start_time: int, *, agent: str, project: str, kind: str) -> list[str]:
        """The sessions without a host session id that host instance (pid, start_time) ran for
        this agent, project and kind, most recently seen first. (One with a host session id
        is found by that id; another project is another session.)"""
        rows = self.conn.execute(
            "SELECT i.peer_id FROM instance_sessions i JOIN peers p ON p.id = i.peer_id "
            f"WHERE i.pid = ? AND i.start_time = ? AND p.host_session_id IS NULL AND {queries.listed_peers('p')} "
            "AND p.agent = ? AND p.project = ? AND p.kind = ? ORDER BY i.seen_at DESC",
            (pid, start_time, agent, project, kind),
        )
        return [r[0] for r in rows]

    def session_addresses_taken(self, name: str, *, excluding: str | None = None) -> bool:
        """Whether `name` is another session's id or host session id."""
        row = self.conn.execute(
            f"SELECT 1 FROM peers WHERE (id = ?1 OR host_session_id = ?1) AND id IS NOT ?2 AND {queries.LISTED_PEERS} "
            "LIMIT 1",
            (name, excluding),
        ).fetchone()
        return row is not None

    def adopt_host_key(self, peer_id: str, host_session_id: str) -> None:
        """Deliveries recorded while the session's host identity was unknown count for it now."""
        with self.conn:
            self.conn.execute(
                "INSERT OR IGNORE INTO decision_deliveries(decision_id, host_key, peer_id, message_id, created_at) "
                "SELECT decision_id, ?, peer_id, message_id, created_at FROM decision_deliveries WHERE host_key = ?",
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
                "INSERT INTO host_instances(pid, start_time, host_session_id, agent, seen_at) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT(pid, start_time, host_session_id) DO UPDATE SET seen_at = excluded.seen_at",
                (pid, start_time, host_session_id, agent, now),
            )

    def host_sessions_for(self, pid: int, start_time: int) -> list[str]:
        rows = self.conn.execute(
            "SELECT host_session_id FROM host_instances WHERE pid = ? AND start_time = ? ORDER BY seen_at DESC",
            (pid, start_time),
        )
        return [r[0] for r in rows]

    # --- messages -----------------------------------------------------------------

    def message_hop(self, message_id: str) -> int | None:
        row = self.conn.execute("SELECT hop FROM messages WHERE id = ?", (message_id,)).fetchone()
        return None if row is None else int(row[0])

    def message_exists(self, message_id: str) -> bool:
        return self.conn.execute("SELECT 1 FROM messages WHERE id = ?", (message_id,)).fetchone() is not None

    def send_messages(
        self, from_id: str, outgoing: Sequence[Outgoing], now: int, *, fault: Callable[[str], None] = lambda point: None
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
            outgoing = [o._replace(to_id=records[o.to_id][0]) for o in outgoing]
            names = {r[0]: r[1:] for r in records.values()}
            for o in outgoing:
                message_id = new_id()
                self.conn.execute(
                    "INSERT INTO messages(id, from_peer, to_peer, body, hop, reply_to, created_at) "
                    "VALUES (?,?,?,?,?,?,?)",
                    (message_id, from_id, o.to_id, o.text, o.hop, o.reply_to, now),
                )
                self.conn.execute("INSERT INTO receipts(message_id, peer_id) VALUES (?, ?)", (message_id, o.to_id))
                seq = self.conn.last_insert_rowid()
                message = Message(
                    message_id, sender, o.to_id, names.get(o.to_id, (None,))[0], o.text, o.hop, o.reply_to, "message", now
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
            "SELECT r.id, p.name, p.agent FROM (SELECT coalesce((SELECT into_id FROM peer_merges WHERE old_id = ?1), ?1) "
            "AS id) r LEFT JOIN peers p ON p.id = r.id",
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
        rows = queries.unacked_messages(self.conn, peer_id, after_seq=after_seq, limit=limit, current_schema=True)
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

    def _close_tap(self, peer_id: str, only: DeliveryTap | None = None) -> None:
        tap = self.taps.get(peer_id)
        if tap is not None and (only is None or tap is only):
            del self.taps[peer_id]
            tap.close()

    def offer(self, peer_id: str, message_ids: Sequence[str], now: int) -> list[str]:
        """Record that these messages are about to be shown to the session's host (SPEC §3:
        written before the bytes that carry them). Returns the ones offered before and not
        acknowledged since: shown again, they are repeats."""
        ids = json.dumps(list(message_ids))
        with self.conn:
            before = [
                r[0]
                for r in self.conn.execute(
                    "SELECT message_id FROM receipts WHERE peer_id = ? AND message_id IN (SELECT value FROM json_each(?)) "
                    "AND delivered_at IS NOT NULL AND acked_at IS NULL",
                    (peer_id, ids),
                )
            ]
            self.conn.execute(
                "UPDATE receipts SET delivered_at = ? WHERE peer_id = ? AND message_id IN (SELECT value FROM json_each(?)) "
                "AND delivered_at IS NULL",
                (now, peer_id, ids),
            )
        return before

    def ack(
        self, peer_id: str, message_ids: Sequence[str], now: int, *, fault: Callable[[str], None] = lambda point: None
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
                        "UPDATE messages SET acked_at = ? WHERE id = ? AND acked_at IS NULL", (now, message_id)
                    )
                count += changed
            fault("ack:before-commit")
        fault("ack:after-commit")
        return count

    # --- decisions ----------------------------------------------------------------

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
            last = self.conn.execute(
                "SELECT id FROM decisions WHERE topic = ? ORDER BY seq DESC LIMIT 1", (topic,)
            ).fetchone()
            supersedes = last[0] if last else None
            self.conn.execute(
                "INSERT INTO decisions(id, topic, text, text_key, scope, scope_kind, scope_project, author_id, "
                "author_name, author_agent, created_at, source_message_id, supersedes) "
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
                    now,
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
                "INSERT INTO messages(id, from_peer, to_peer, body, hop, reply_to, created_at) VALUES (?,?,?,?,?,?,?)",
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

    def catch_up(self, session: SessionView, now: int, *, only: Collection[str] | None = None) -> int:
        """Queue every current decision applicable to `session` that its host session has not
        received yet (SPEC §4.4). Only for a session whose host identity is known, except with
        `only`: those decisions (recorded while the session was tentative), under its key."""
        if session.kind == "job" or (only is None and not session.host_session_id):
            return 0
        key = host_key(session)
        with self.conn:
            current = queries.query_decisions(self.conn)
            received = {
                r[0]
                for r in self.conn.execute("SELECT decision_id FROM decision_deliveries WHERE host_key = ?", (key,))
            }
            missing = [
                d
                for d in current
                if d.id not in received
                and (only is None or d.id in only)
                and domain.scope_applies(d.scope, session)
            ]
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
    ) -> list[Decision]:
        return queries.query_decisions(
            self.conn, needle=needle, lookup=lookup, caller_addresses=caller_addresses, history=history, topic=topic
        )

    def retractions(self, topics: Sequence[str]) -> list[Retraction]:
        """The retraction records of these topics, newest first."""
        found = [r for topic in topics for r in queries.retractions(self.conn, topic=topic)]
        return sorted(found, key=lambda r: r.created_at, reverse=True)

    # --- the owner's controls: the command line, retract, forget ----------------------

    def _ensure_cli_peer(self, now: int) -> None:
        """The author record of `agent-bridge decide/send/retract` (messages and decisions
        reference their author's row). A job, never listed, never addressed."""
        self.conn.execute(
            "INSERT OR IGNORE INTO peers(id, name, agent, project, kind, created_at, last_seen_at) "
            "VALUES (?, ?, ?, '', 'job', ?, ?)",
            (CLI_AUTHOR.id, CLI_AUTHOR.name, domain.CLI_AGENT, now, now),
        )

    def retract(
        self, *, topic: str, reason: str | None, author: SessionView, author_agent: str,
        connected: Sequence[SessionView], now: int, fault: Callable[[str], None] = lambda point: None,
    ) -> tuple[Retraction, list[tuple[str, str]]]:
        """Withdraw the topic's current decision: one appended retraction record, and one
        passive notice for each session in the retracted revision's scope (connected,
        non-job) or that was sent that revision. One transaction.

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
                "INSERT INTO decision_retractions(id, topic, retracts, reason, author_id, author_name, author_agent, "
                "created_at) VALUES (?,?,?,?,?,?,?,?)",
                (retraction_id, topic, decision.id, reason, author.id, author.name, author_agent, now),
            )
            targets: dict[str, str] = {}
            for session in connected:
                if session.kind != "job" and domain.scope_applies(decision.scope, session):
                    targets[session.id] = session.name
            for peer_id, name in self.conn.execute(
                "SELECT p.id, p.name FROM decision_deliveries dd JOIN peers p ON p.id = dd.peer_id "
                f"WHERE dd.decision_id = ? AND p.kind != 'job' AND {queries.listed_peers('p')}",
                (decision.id,),
            ):
                targets.setdefault(peer_id, name)
            fault("retract:after-record")
            body = retraction_text(decision, reason)
            for i, peer_id in enumerate(targets):
                if i == 1:
                    fault("retract:mid-notices")
                self._close_tap(peer_id)  # its delivery task reads this from the database
                message_id = new_id()
                self.conn.execute(
                    "INSERT INTO messages(id, from_peer, to_peer, body, hop, reply_to, created_at) "
                    "VALUES (?,?,?,?,?,?,?)",
                    (message_id, author.id, peer_id, body, domain.DECISION_HOP, None, now),
                )
                self.conn.execute("INSERT INTO receipts(message_id, peer_id) VALUES (?, ?)", (message_id, peer_id))
                self.conn.execute(
                    "INSERT INTO retraction_notices(message_id, retraction_id, peer_id) VALUES (?, ?, ?)",
                    (message_id, retraction_id, peer_id),
                )
            retraction = queries.retraction_by_id(self.conn, retraction_id)
            fault("retract:before-commit")
        assert retraction is not None
        return retraction, sorted(targets.items(), key=lambda item: item[1])

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
                queued = [q.message for q in queries.unacked_messages(self.conn, peer_id, limit=1_000_000, current_schema=True)]
                self._close_tap(peer_id)
                self.conn.execute("DELETE FROM receipts WHERE peer_id = ?", (peer_id,))
                # Messages to it that nothing else holds: no receipt left, no notice or decision naming them.
                self.conn.execute(
                    "DELETE FROM messages WHERE to_peer = ?1 "
                    "AND NOT EXISTS (SELECT 1 FROM receipts r WHERE r.message_id = messages.id) "
                    "AND NOT EXISTS (SELECT 1 FROM decision_deliveries dd WHERE dd.message_id = messages.id) "
                    "AND NOT EXISTS (SELECT 1 FROM retraction_notices rn WHERE rn.message_id = messages.id) "
                    "AND NOT EXISTS (SELECT 1 FROM decisions d WHERE d.source_message_id = messages.id)",
                    (peer_id,),
                )
                if peer.host_session_id:
                    self.conn.execute(
                        "DELETE FROM host_instances WHERE host_session_id = ?", (peer.host_session_id,)
                    )
                self._drop_identity(peer_id)
                if self._referenced(peer_id):
                    self.conn.execute(
                        "UPDATE peers SET host_session_id = NULL, forgotten_at = ? WHERE id = ?", (now, peer_id)
                    )
                else:
                    self.conn.execute("DELETE FROM peers WHERE id = ?", (peer_id,))
                out.append(Forgotten(peer, queued))
            fault("forget:before-commit")
        return out

    def sessions_last_seen_before(self, cutoff: int) -> list[str]:
        """Listed sessions last seen before `cutoff` (epoch ms), oldest first."""
        rows = self.conn.execute(
            f"SELECT id FROM peers WHERE last_seen_at < ? AND {queries.LISTED_PEERS} ORDER BY last_seen_at, rowid",
            (cutoff,),
        )
        return [r[0] for r in rows]


CLI_AUTHOR = SessionView(id=queries.CLI_ID, name=domain.CLI_AGENT, project="", kind="job")


def retraction_text(decision: Decision, reason: str | None) -> str:
    line = f"Pinned owner decision retracted: {decision.line()} no longer applies"
    return line + (f". Reason: {reason}" if reason else ".")


def notification_text(decision: Decision) -> str:
    scope = decision.scope
    where = "all sessions" if scope == "all" else domain.scope_to_json(scope)
    return f"Pinned owner decision for {where}: {decision.line()}"


def backup_database(conn: apsw.Connection, target: Path, *, fault: Callable[[str], None] = lambda point: None) -> None:
    """Copy a live database with SQLite's online backup API.

    Written under a temporary name and renamed into place once complete, so a `.bak` file that
    exists is always a whole database (a crash mid-copy leaves only a `.partial` file)."""
    partial = target.with_name(target.name + ".partial")
    partial.unlink(missing_ok=True)
    dest = apsw.Connection(str(partial))
    try:
        with dest.backup("main", conn, "main") as backup:
            while not backup.done:
                backup.step(1024)
    finally:
        dest.close()
    fault("upgrade:backup-copied")
    os.replace(partial, target)
