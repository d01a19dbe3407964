"""What tells the dashboard's live stream (`GET /api/events`) that bridge.db changed.

One `ChangeFeed` (store/feed.py) per dashboard: a version number that grows on every change and
wakes the streams waiting on it. Who feeds it depends on who runs the dashboard:

- inside the broker, the dashboard shares the broker's feed, which the store's worker thread
  pokes after each job that changed rows (`StoreRunner.on_change`), so a decide shows up as
  soon as it is committed;
- standalone (`agent-bridge dashboard` with no broker) nothing in this process writes, so
  `watch_database` asks SQLite's `data_version` on a read-only connection, twice a second, and
  only while a stream is open. A broker started later, or any other writer, is seen the same way.

Reads stay read-only either way: the feed carries no data, the page fetches it again.
"""

from __future__ import annotations

from pathlib import Path

import apsw
import trio

from agent_bridge.store import reader
from agent_bridge.store.feed import ChangeFeed
from agent_bridge.store.migration import SchemaError

POLL_INTERVAL = 0.5  # seconds between data_version checks (standalone); well within the 2 s a page may lag


async def watch_database(
    db: Path,
    feed: ChangeFeed,
    *,
    interval: float = POLL_INTERVAL,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Notify `feed` whenever bridge.db changes, until no stream listens any more. Started
    once the first state is read: a change made after `start` returns is always seen.

    `data_version` changes when another connection commits; one read-only connection is kept
    open between checks (a fresh one would always read the same value). A database that
    appears, disappears or is replaced counts as a change too.
    """
    watcher = _Watcher(db)
    try:
        last = await trio.to_thread.run_sync(watcher.stamp)
        task_status.started()
        while feed.listeners:
            await trio.sleep(interval)
            stamp = await trio.to_thread.run_sync(watcher.stamp)
            if stamp != last:
                last = stamp
                feed.notify()
    finally:
        watcher.close()  # a close without I/O of note: no thread hop needed in a finally


class _Watcher:
    """The read-only connection `watch_database` checks; used from worker threads, one at a time."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self.conn: apsw.Connection | None = None
        self.inode: int | None = None

    def stamp(self) -> tuple[int | None, int | None]:
        """(the file's inode, its data_version), None where unknown."""
        try:
            inode = self.db.stat().st_ino
        except OSError:
            self.close()
            return None, None
        if inode != self.inode:
            self.close()
            self.inode = inode
        try:
            if self.conn is None:
                self.conn = reader.open_readonly(self.db)
            if self.conn is None:
                return inode, None
            # The pragma, not Connection.data_version(): that file control reports the value of
            # the last transaction, and no transaction runs here between checks.
            row = self.conn.execute("PRAGMA data_version").fetchone()
            return inode, None if row is None else int(row[0])
        except (SchemaError, apsw.Error):
            self.close()
            self.inode = inode
            return inode, None

    def close(self) -> None:
        if self.conn is not None:
            conn, self.conn = self.conn, None
            conn.close()
        self.inode = None
