"""Read-only access to bridge.db for the dashboard, the hooks and CLI reads.

Never writes, never migrates, never needs the broker. A missing database reads as empty.
Light: apsw only (the hooks import this at every session start).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import apsw

from agent_bridge.store.migration import SchemaTooNew, user_version
from agent_bridge.store.schema import CURRENT_VERSION, UNACKED_RECEIPTS

BUSY_TIMEOUT_MS = 2000  # a reader waits this long for the writer's checkpoint to finish


def open_readonly(path: Path | str, *, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> apsw.Connection | None:
    """A read-only connection to `path`, or None if there is no database yet.

    Raises SchemaTooNew for a database newer than this code: readers must not guess at a
    future schema's meaning.
    """
    path = Path(path)
    if not path.exists():
        return None
    conn = None
    try:
        conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
        conn.set_busy_timeout(busy_timeout_ms)
        version = user_version(conn)
    except (apsw.CantOpenError, apsw.ReadOnlyError):
        if conn is not None:
            conn.close()
        # A WAL database whose -shm file is missing and whose folder we cannot write to
        # (the broker is down and checkpointed): read the main file as it stands.
        uri = path.absolute().as_uri() + "?mode=ro&immutable=1"
        conn = apsw.Connection(uri, flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI)
        version = user_version(conn)
    except BaseException:
        if conn is not None:
            conn.close()  # not a database, say: closed now, not whenever the error is collected
        raise
    if version > CURRENT_VERSION:
        conn.close()
        raise SchemaTooNew(version)
    return conn


@contextmanager
def reading(path: Path | str, *, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> Iterator[apsw.Connection | None]:
    """`with reading(db) as conn:` one consistent snapshot (a read transaction) or None.

    `busy_timeout_ms`: how long to wait for a lock (a hook waits less than the dashboard).
    """
    conn = open_readonly(path, busy_timeout_ms=busy_timeout_ms)
    if conn is None:
        yield None
        return
    try:
        conn.execute("BEGIN")
        try:
            yield conn
        finally:
            conn.execute("COMMIT")
    finally:
        conn.close()


HOP_MAX = 100  # domain.HOP_MAX, the hop of every decision notice (tests/test_domain checks they agree)


def active_waiting(conn: apsw.Connection, host_session_id: str, hop_limit: int = HOP_MAX) -> bool:
    """Whether a session known by this host session id has an unacknowledged message with
    hop < `hop_limit` (decision notifications carry the maximum hop, so they never count).

    The PostToolUse hook asks this after every tool call before it contacts the broker, so it
    is one indexed lookup (peers_host_session, receipts_unacked named as schema.UNACKED_RECEIPTS
    says, the messages key). A database from before V_LEAN_ACKS has that index under another
    name, the only one the planner can take; one from before receipts (version < 2) has
    nothing to hand over that way: False.
    """
    for indexed in (UNACKED_RECEIPTS, ""):
        try:
            sql = _ACTIVE_WAITING.format(indexed=indexed)
            row = conn.execute(sql, (host_session_id, hop_limit)).fetchone()
        except apsw.SQLError:  # no such index, table or column: an old schema the broker has not upgraded
            continue
        return row is not None
    return False


_ACTIVE_WAITING = (
    "SELECT 1 FROM peers p JOIN receipts r {indexed} ON r.peer_id = p.id AND r.acked_at IS NULL "
    "JOIN messages m ON m.id = r.message_id WHERE p.host_session_id = ? AND m.hop < ? LIMIT 1"
)
