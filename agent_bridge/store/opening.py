"""Opening bridge.db for writing: SQLite's recommended settings, the version check that refuses a
newer database before anything writes to it, and the backup taken before an upgrade."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import apsw
import apsw.bestpractice

from agent_bridge.common import paths
from agent_bridge.store.migration import SchemaError, SchemaTooNew, user_version
from agent_bridge.store.schema import CURRENT_VERSION

_bestpractice_applied = False


def apply_bestpractice() -> None:
    """WAL, busy timeout, foreign keys, no double-quoted strings… on every new connection."""
    global _bestpractice_applied
    if not _bestpractice_applied:
        apsw.bestpractice.apply(apsw.bestpractice.recommended)
        _bestpractice_applied = True


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


def backup_database(
    conn: apsw.Connection, target: Path, *, fault: Callable[[str], None] = lambda point: None
) -> None:
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
