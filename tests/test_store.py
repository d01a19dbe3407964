"""bridge.db: pinned v1/v2 schemas, upgrades with backups, append-only decisions, atomicity."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import apsw
import pytest

from agent_bridge.common.domain import SessionView
from agent_bridge.store import queries, reader
from agent_bridge.store.decisions import Recipient
from agent_bridge.store.migration import SchemaTooNew
from agent_bridge.store.schema import CURRENT_VERSION, V1, V2
from agent_bridge.store.writer import Store

# The pinned DDL, exactly as SPEC §7 prints it (not imported from the code under test).
SPEC_V1 = """
CREATE TABLE peers (
  id TEXT PRIMARY KEY, name TEXT NOT NULL, agent TEXT NOT NULL, project TEXT NOT NULL,
  kind TEXT NOT NULL DEFAULT 'interactive' CHECK (kind IN ('interactive','job')),
  created_at INTEGER NOT NULL, last_seen_at INTEGER NOT NULL);
CREATE TABLE messages (
  id TEXT PRIMARY KEY, from_peer TEXT REFERENCES peers(id), to_peer TEXT NOT NULL REFERENCES peers(id),
  body TEXT NOT NULL, hop INTEGER NOT NULL DEFAULT 1, reply_to TEXT,
  created_at INTEGER NOT NULL, acked_at INTEGER);
CREATE INDEX messages_to_unacked ON messages(to_peer, acked_at);
PRAGMA user_version = 1;
"""
SPEC_V2 = """
ALTER TABLE peers ADD COLUMN host_session_id TEXT;
CREATE INDEX peers_host_session ON peers(host_session_id);
CREATE TABLE receipts (
  message_id TEXT NOT NULL REFERENCES messages(id), peer_id TEXT NOT NULL REFERENCES peers(id),
  delivered_at INTEGER, acked_at INTEGER, PRIMARY KEY (message_id, peer_id));
INSERT INTO receipts(message_id, peer_id, acked_at) SELECT id, to_peer, acked_at FROM messages;
PRAGMA user_version = 2;
"""


def _norm(sql: str) -> str:
    return " ".join(sql.split())


def test_code_pins_the_spec_ddl_verbatim():
    assert _norm(V1) == _norm(SPEC_V1)
    assert _norm(V2) == _norm(SPEC_V2)


def build_v1(path: Path) -> None:
    conn = apsw.Connection(str(path))
    conn.execute(SPEC_V1)
    conn.execute(
        "INSERT INTO peers VALUES ('p1','claude-app','claude','/w/app','interactive',1,1),"
        "('p2','codex-app','codex','/w/app','interactive',1,1)"
    )
    conn.execute(
        "INSERT INTO messages VALUES ('m1','p1','p2','hello',1,NULL,10,NULL),"
        "('m2','p2','p1','acked already',2,'m1',11,12)"
    )
    conn.close()


def build_v2(path: Path) -> None:
    build_v1(path)
    conn = apsw.Connection(str(path))
    conn.execute(SPEC_V2)
    conn.execute("UPDATE peers SET host_session_id = 'host-1' WHERE id = 'p2'")
    conn.execute("INSERT INTO messages VALUES ('m3','p1','p2','v2 message',1,NULL,13,NULL)")
    conn.execute("INSERT INTO receipts(message_id, peer_id) VALUES ('m3','p2')")
    conn.close()


def build_v0(path: Path) -> None:
    apsw.Connection(str(path)).close()  # an empty database: user_version 0, no tables


@pytest.mark.parametrize(("builder", "old"), [(build_v0, 0), (build_v1, 1), (build_v2, 2)])
def test_upgrade_keeps_everything_and_leaves_a_readable_backup(tmp_path, builder, old):
    db = tmp_path / "bridge.db"
    builder(db)
    lines: list[str] = []
    store = Store.open(db, lines.append)
    try:
        assert store.version() == CURRENT_VERSION
        backups = list(tmp_path.glob(f"bridge.db.v{old}-*.bak"))
        assert len(backups) == 1, list(tmp_path.iterdir())
        assert any("backed up" in line and backups[0].name in line for line in lines)
        backup = apsw.Connection(str(backups[0]), flags=apsw.SQLITE_OPEN_READONLY)
        assert backup.execute("PRAGMA user_version").fetchone()[0] == old
        if old >= 1:
            # nothing lost, and unacknowledged v1/v2 messages are still waiting for delivery
            assert backup.execute("SELECT count(*) FROM messages").fetchone()[0] == store.conn.execute(
                "SELECT count(*) FROM messages"
            ).fetchone()[0]
            waiting = [m.id for m in store.unacked("p2")]
            assert waiting == (["m1"] if old == 1 else ["m1", "m3"])
            assert [m.text for m in store.unacked("p2")][0] == "hello"
            assert store.unacked("p1") == []  # m2 was acked in v1
            peers = {p.id: p for p in store.list_peers()}
            assert set(peers) == {"p1", "p2"}
            if old == 2:
                assert peers["p2"].host_session_id == "host-1"
        backup.close()
        assert store.decisions() == []
    finally:
        store.close()


def test_fresh_database_needs_no_backup(tmp_path):
    store = Store.open(tmp_path / "bridge.db")
    store.close()
    assert not list(tmp_path.glob("*.bak"))


def test_failed_upgrade_leaves_the_original_untouched(tmp_path):
    db = tmp_path / "bridge.db"
    build_v1(db)
    # A v1 database that cannot take step 3 (a table of that name already exists).
    conn = apsw.Connection(str(db))
    conn.execute("CREATE TABLE decision_heads (x)")
    conn.close()
    with pytest.raises(apsw.SQLError):
        Store.open(db)
    conn = apsw.Connection(str(db))
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'receipts'").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 2
    conn.close()


def test_newer_database_is_refused_by_writer_and_readers(tmp_path):
    db = tmp_path / "bridge.db"
    conn = apsw.Connection(str(db))
    conn.execute(f"PRAGMA user_version = {CURRENT_VERSION + 1}")
    conn.close()
    with pytest.raises(SchemaTooNew, match="newer than this agent-bridge"):
        Store.open(db)
    with pytest.raises(SchemaTooNew):
        reader.open_readonly(db)
    conn = apsw.Connection(str(db))
    assert conn.execute("PRAGMA user_version").fetchone()[0] == CURRENT_VERSION + 1
    conn.close()


def test_missing_database_reads_as_empty(tmp_path):
    with reader.reading(tmp_path / "nothing.db") as conn:
        assert conn is None
    assert not (tmp_path / "nothing.db").exists()


def test_reader_never_migrates(tmp_path):
    db = tmp_path / "bridge.db"
    build_v1(db)
    with reader.reading(db) as conn:
        assert conn is not None
        assert queries.query_decisions(conn) == []
        assert sorted(p.id for p in queries.list_peers(conn)) == ["p1", "p2"]
        with pytest.raises(apsw.ReadOnlyError):
            conn.execute("CREATE TABLE x (y)")
    conn = apsw.Connection(str(db))
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    conn.close()


def _store_with_decision(tmp_path: Path) -> tuple[Store, SessionView]:
    store = Store.open(tmp_path / "bridge.db")
    peer = store.create_peer(
        agent="claude", name="claude-x", project="/x", kind="interactive", host_session_id="h", now=1
    )
    author = SessionView(peer.id, peer.name, "/x", "h")
    store.record_decision(
        author=author, author_agent="claude", topic="db", text="PostgreSQL", scope="all",
        source_message_id=None, recipients=[Recipient(author, "h")], now=2,
    )
    return store, author


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE decisions SET text = 'MySQL'",
        "DELETE FROM decisions",
        "UPDATE decision_deliveries SET host_key = 'x'",
        "DELETE FROM decision_deliveries",
    ],
)
def test_decisions_are_append_only_in_the_schema(tmp_path, statement):
    store, _ = _store_with_decision(tmp_path)
    try:
        with pytest.raises(apsw.ConstraintError, match="append-only"):
            store.conn.execute(statement)
        assert [d.text for d in store.decisions(history=True)] == ["PostgreSQL"]
    finally:
        store.close()


def test_same_millisecond_revisions_keep_recording_order(tmp_path):
    store, author = _store_with_decision(tmp_path)
    try:
        for text in ("one", "two", "three"):
            store.record_decision(
                author=author, author_agent="claude", topic="db", text=text, scope="all",
                source_message_id=None, recipients=[], now=2,
            )
        history = store.decisions(history=True)
        assert [d.text for d in history] == ["three", "two", "one", "PostgreSQL"]
        assert [d.current for d in history] == [True, False, False, False]
        assert [d.supersedes for d in history[:-1]] == [d.id for d in history[1:]]
    finally:
        store.close()


def test_a_decide_that_dies_mid_transaction_leaves_nothing(tmp_path):
    """A process killed by SIGKILL in the middle of a fan-out: all or nothing."""
    db = tmp_path / "bridge.db"
    store = Store.open(db)
    ids = [
        store.create_peer(
            agent="claude", name=f"s{i}", project="/x", kind="interactive", host_session_id=f"h{i}", now=1
        ).id
        for i in range(5)
    ]
    store.close()
    script = textwrap.dedent(
        f"""
        import os, signal
        from pathlib import Path
        from agent_bridge.common.domain import SessionView
        from agent_bridge.store.decisions import Recipient
        from agent_bridge.store.writer import Store
        store = Store.open(Path({str(db)!r}))
        views = [SessionView(i, "s" + str(n), "/x", "h" + str(n)) for n, i in enumerate({ids!r})]
        def fault(point):
            if point == "decide:mid-fanout":
                os.kill(os.getpid(), signal.SIGKILL)
        store.record_decision(author=views[0], author_agent="claude", topic="db", text="PostgreSQL",
            scope={{"project": "/x"}}, source_message_id=None,
            recipients=[Recipient(v, v.host_session_id) for v in views], now=5, fault=fault)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -9, proc.stderr
    store = Store.open(db)
    try:
        counts = [
            store.conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            for table in ("decisions", "messages", "receipts", "decision_deliveries")
        ]
        assert counts == [0, 0, 0, 0]
    finally:
        store.close()


def test_ids_are_time_ordered_uuids_and_a_forked_child_draws_its_own() -> None:
    """Row ids are UUIDs (SPEC §4: "uuid `id`") of version 7 (RFC 9562): Unix milliseconds
    first, so a later id sorts after an earlier one (inserts land at the end of the key
    indexes), never repeated, and a forked process does not replay its parent's."""
    import itertools
    import os
    import sys
    import time
    import uuid

    from agent_bridge.store.ids import new_id

    before = time.time_ns() // 1_000_000
    ids = [new_id() for _ in range(20_000)]
    after = time.time_ns() // 1_000_000
    assert len(set(ids)) == len(ids)
    for text in ids:
        parsed = uuid.UUID(text)
        assert str(parsed) == text and parsed.version == 7 and parsed.variant == uuid.RFC_4122
        assert before <= parsed.int >> 80 <= after
    # An id drawn in a later millisecond sorts after the one before it, as text (as the indexes
    # compare them); within one millisecond the order is random.
    later = [(a, b) for a, b in itertools.pairwise(ids) if uuid.UUID(a).int >> 80 != uuid.UUID(b).int >> 80]
    assert later and all(a < b for a, b in later)
    if sys.platform == "win32":
        return
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        os.write(write, new_id().encode())
        os._exit(0)
    os.close(write)
    mine = new_id()
    os.waitpid(child, 0)
    with os.fdopen(read, "rb") as pipe:
        theirs = pipe.read().decode()
    assert uuid.UUID(theirs).version == 7 and theirs[14:] != mine[14:]  # the random part differs
