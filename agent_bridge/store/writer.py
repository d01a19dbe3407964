"""The broker's store: the only writer of bridge.db (SPEC §7).

Every method is synchronous and is one transaction. The broker calls them on a worker thread
(`broker.storage.StoreRunner`), never on the Trio event loop.

`Store` is one object composed of one class per concern, each in its own module:
store.peers (sessions and their identity), store.messages (messages and receipts),
store.decisions (decisions and retractions), store.questions (owner questions), store.jobs
(jobs and their events), store.federation (other machines and the outbox) and
store.forgetting, all built on store.base (the connection and the delivery taps); opening, the
version check and backups are in store.opening. A concern builds on the ones it needs (decisions
on messages, both on peers), so its methods call theirs inside their own transaction.

Classes composed by inheritance rather than per-concern objects the store holds: the writer
stays one object with one method per intention (`store.send_messages(...)`), so the broker,
the StoreRunner (which calls methods by reference on its thread) and the tests do not change,
and a transaction that crosses concerns (a decision's fan-out closes taps and writes
messages; forgetting drops identity) keeps calling plain methods on one connection, with no
forwarding layer of some 45 methods. A new concern is a new class in its own module, added
to `Store`'s bases.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import apsw

from agent_bridge.store.federation import Federation
from agent_bridge.store.forgetting import Forgetting
from agent_bridge.store.jobs import JobRecords
from agent_bridge.store.migration import migrate, user_version
from agent_bridge.store.opening import apply_bestpractice, backup_database, backup_path, check_version


class Store(Forgetting, JobRecords, Federation):
    """The only writer of bridge.db: every concern's methods on one connection."""

    @classmethod
    def open(
        cls,
        path: Path,
        log: Callable[[str], None] = lambda line: None,
        *,
        fault: Callable[[str], None] = lambda point: None,
    ) -> Store:
        """Open (creating if needed) and migrate to the current version, backing up first.

        `fault`: the broker's test-only crash points (common.faults); a no-op otherwise."""
        apply_bestpractice()
        existed = path.exists()
        if existed:
            check_version(path)  # before the connection below writes (journal mode, optimize)
        conn = apsw.Connection(str(path))
        try:
            conn.execute("PRAGMA synchronous = NORMAL")  # WAL: durable across process crashes
            # A transaction opened inside another (APSW's `with conn` within a method's own) is a
            # savepoint, and SQLite keeps a savepoint's undo pages in a temporary file by default:
            # opened, written and closed around a commit. In memory they cost a copy.
            conn.execute("PRAGMA temp_store = MEMORY")

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
