"""bridge.db version 4: retractions and forgotten sessions, at the store level (SPEC §2, §7)."""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest

from agent_bridge.common import domain
from agent_bridge.common.domain import SessionView
from agent_bridge.store import queries, reader
from agent_bridge.store.decisions import Recipient
from agent_bridge.store.peers import CLI_AUTHOR
from agent_bridge.store.schema import V1, V2, V3
from agent_bridge.store.writer import Store
from tests.shapes import DECISION_FIELDS


def build_v3(path: Path) -> None:
    """A version-3 database as the previous release left it, with data in every table:
    two sessions, an unacknowledged message, two revisions of `db`, one of `camera`, and the
    deliveries of the current ones."""
    conn = apsw.Connection(str(path))
    conn.execute("PRAGMA foreign_keys = ON")
    for step in (V1, V2, V3):
        with conn:
            conn.execute(step)
    conn.execute(
        "INSERT INTO peers(id, name, agent, project, kind, created_at, last_seen_at, host_session_id) VALUES "
        "('p1','claude-app','claude','/w/app','interactive',1,1,'host-1'),"
        "('p2','codex-app','codex','/w/app','interactive',1,5,'host-2')"
    )
    conn.execute("INSERT INTO messages VALUES ('m1','p1','p2','hello from v3',1,NULL,10,NULL)")
    conn.execute("INSERT INTO receipts(message_id, peer_id) VALUES ('m1','p2')")
    for seq, (did, topic, text, scope, kind, project, sup) in enumerate(
        [
            ("d1", "db", "MySQL", '{"project":"/w/app"}', "project", "/w/app", None),
            ("d2", "db", "PostgreSQL 16", '{"project":"/w/app"}', "project", "/w/app", "d1"),
            ("d3", "camera", "hold to look", '"all"', "all", None, None),
        ],
        start=1,
    ):
        conn.execute(
            "INSERT INTO decisions(id, topic, text, text_key, scope, scope_kind, scope_project, author_id, "
            "author_name, author_agent, created_at, source_message_id, supersedes) "
            "VALUES (?,?,?,?,?,?,?,'p1','claude-app','claude',?,NULL,?)",
            (did, topic, text, text.lower(), scope, kind, project, 100 + seq, sup),
        )
    conn.execute("INSERT INTO messages VALUES ('n2','p1','p2','decision notice',100,NULL,102,NULL)")
    conn.execute("INSERT INTO receipts(message_id, peer_id) VALUES ('n2','p2')")
    conn.execute("INSERT INTO decision_deliveries VALUES ('d2','host-2','p2','n2',102)")
    conn.close()


def test_v3_upgrades_to_v4_with_a_backup_and_keeps_everything(tmp_path):
    db = tmp_path / "bridge.db"
    build_v3(db)
    lines: list[str] = []
    store = Store.open(db, lines.append)
    try:
        assert store.version() >= 4
        (backup,) = tmp_path.glob("bridge.db.v3-*.bak")
        assert any("backed up" in line and backup.name in line for line in lines)
        old = apsw.Connection(str(backup), flags=apsw.SQLITE_OPEN_READONLY)
        assert old.execute("PRAGMA user_version").fetchone()[0] == 3
        assert old.execute("SELECT count(*) FROM decisions").fetchone()[0] == 3
        old.close()
        # Nothing lost: every revision, current flags, the waiting messages (the notice still a decision).
        assert [(d.id, d.current) for d in store.decisions(history=True)] == [
            ("d3", True), ("d2", True), ("d1", False)
        ]
        waiting = store.unacked("p2")
        assert [(m.id, m.kind) for m in waiting] == [("m1", "message"), ("n2", "decision")]
        assert {p.id for p in store.list_peers()} == {"p1", "p2"}
        # ... and the new tables work on the upgraded data.
        retraction, notified = store.retract(
            topic="db", reason="moved to SQLite", author=CLI_AUTHOR, author_agent="cli", connected=[], now=200
        )
        assert retraction.retracts == "d2" and notified == [("p2", "codex-app")]  # it had been sent d2
        assert [d.id for d in store.decisions()] == ["d3"]
    finally:
        store.close()


def _setup(tmp_path: Path) -> tuple[Store, SessionView, SessionView, SessionView]:
    store = Store.open(tmp_path / "bridge.db")
    views = []
    for agent, project, host, kind in (
        ("claude", "/w/app", "h-a", "interactive"),
        ("codex", "/w/app", "h-b", "interactive"),
        ("codex", "/w/other", "h-c", "interactive"),
    ):
        p = store.create_peer(
            agent=agent, name=f"{agent}-{host}", project=project, kind=kind, host_session_id=host, now=1
        )
        views.append(SessionView(p.id, p.name, project, host, kind))
    return store, views[0], views[1], views[2]


def _decide(store: Store, author: SessionView, topic: str, text: str, scope: domain.Scope, recipients=()):
    decision, _ = store.record_decision(
        author=author, author_agent="claude", topic=topic, text=text, scope=scope, source_message_id=None,
        recipients=[Recipient(r, r.host_session_id or f"peer:{r.id}") for r in recipients], now=10,
    )
    return decision


def test_retraction_is_appended_and_removes_the_topic_from_every_current_read(tmp_path):
    store, a, b, c = _setup(tmp_path)
    try:
        first = _decide(store, a, "db", "MySQL", {"project": "/w/app"})
        second = _decide(store, a, "db", "PostgreSQL", {"project": "/w/app"}, recipients=[a])
        _decide(store, a, "camera", "hold", "all")
        retraction, notified = store.retract(
            topic="db",
            reason="wrong project",
            author=CLI_AUTHOR,
            author_agent="cli",
            connected=[a, b, c],
            now=50,
        )
        # In scope and connected (a, b), or sent the revision (a): one notice each; c is elsewhere.
        assert sorted(name for _, name in notified) == sorted([a.name, b.name])
        assert retraction.topic == "db" and retraction.retracts == second.id
        assert retraction.reason == "wrong project" and retraction.created_at == 50
        assert retraction.author.to_json() == {"id": "cli", "name": "cli", "agent": "cli"}

        assert [d.topic for d in store.decisions()] == ["camera"]
        history = store.decisions(history=True, topic="db")
        assert [d.id for d in history] == [second.id, first.id]
        assert all(d.current is False for d in history)
        assert set(history[0].to_json()) == DECISION_FIELDS
        shown, total = queries.note_decisions(store.conn, "/w/app", limit=5)
        assert [d.topic for d in shown] == ["camera"] and total == 1
        assert queries.retractions(store.conn, topic="db") == [retraction]

        notices = [m for m in store.unacked(b.id) if m.kind == "retraction"]
        assert len(notices) == 1 and notices[0].hop == domain.DECISION_HOP
        assert notices[0].retraction == retraction and notices[0].sender.id == "cli"
        assert "PostgreSQL" in notices[0].text and "wrong project" in notices[0].text
        assert not [m for m in store.unacked(c.id) if m.kind == "retraction"]

        with pytest.raises(domain.InputError, match="already retracted"):
            store.retract(
                topic="db", reason=None, author=CLI_AUTHOR, author_agent="cli", connected=[], now=60
            )
        with pytest.raises(domain.InputError, match="no decision has been recorded"):
            store.retract(
                topic="nope", reason=None, author=CLI_AUTHOR, author_agent="cli", connected=[], now=60
            )
        for sql in ("UPDATE decision_retractions SET reason = 'x'", "DELETE FROM decision_retractions"):
            with pytest.raises(apsw.ConstraintError, match="append-only"):
                store.conn.execute(sql)

        again = _decide(store, a, "db", "SQLite", "all")
        assert again.supersedes == second.id and again.current is True
        assert [d.current for d in store.decisions(history=True, topic="db")] == [True, False, False]
    finally:
        store.close()


def test_forget_reports_and_drops_what_was_queued_and_keeps_decision_history(tmp_path):
    store, a, b, c = _setup(tmp_path)
    try:
        # b authored it; a was sent it
        decision = _decide(store, b, "db", "PostgreSQL", "all", recipients=[a, b])
        store.send_messages(c.id, [store_outgoing(a.id, "for a")], now=20)
        store.send_messages(a.id, [store_outgoing(c.id, "for c")], now=21)
        (item_a,) = store.forget_peers([a.id], now=30)
        assert item_a.peer.id == a.id
        assert sorted(m.kind for m in item_a.dropped) == ["decision", "message"]
        assert {m.text for m in item_a.dropped if m.kind == "message"} == {"for a"}
        # dropped with it: no receipt left; the message only it had is gone, the notice stays with its
        # delivery row
        assert (
            store.conn.execute("SELECT count(*) FROM receipts WHERE peer_id = ?", (a.id,)).fetchone()[0] == 0
        )
        assert store.conn.execute("SELECT count(*) FROM messages WHERE body = 'for a'").fetchone()[0] == 0
        assert store.conn.execute("SELECT count(*) FROM decision_deliveries").fetchone()[0] == 2
        # unlisted, unaddressable; its decision history intact; what it sent still reaches c
        assert a.id not in {p.id for p in store.list_peers()}
        assert store.find_peers_by_address(a.name) == [] and store.find_peers_by_address("h-a") == []
        assert store.peer_by_host_session("h-a") is None
        assert [d.id for d in store.decisions(history=True)] == [decision.id]
        assert [m.text for m in store.unacked(c.id)] == ["for c"]
        assert [m.sender.name for m in store.unacked(c.id)] == [a.name]  # the tombstone keeps its name

        # b recorded a decision: a tombstone; c's row is referenced by its own message to a (deleted),
        # so it goes
        store.forget_peers([b.id], now=31)
        assert store.conn.execute("SELECT forgotten_at FROM peers WHERE id = ?", (b.id,)).fetchone() == (31,)
        assert store.decisions()[0].author.id == b.id
        fresh = store.create_peer(
            agent="x", name="x-y", project="/y", kind="interactive", host_session_id=None, now=1
        )
        store.forget_peers([fresh.id], now=32)
        assert store.get_peer(fresh.id) is None  # nothing references it: deleted outright
        assert store.sessions_last_seen_before(10**15) == [c.id]
    finally:
        store.close()


def store_outgoing(to_id: str, text: str):
    from agent_bridge.store.messages import Outgoing

    return Outgoing(to_id, text, 1, None)


def test_reader_of_a_v4_database_sees_retractions_and_no_cli_or_forgotten_sessions(tmp_path):
    store, a, b, c = _setup(tmp_path)
    try:
        _decide(store, a, "db", "PostgreSQL", "all")
        store.send_messages(CLI_AUTHOR.id, [store_outgoing(b.id, "from the command line")], now=40)
        store.retract(topic="db", reason=None, author=CLI_AUTHOR, author_agent="cli", connected=[], now=41)
        store.forget_peers([a.id], now=42)
    finally:
        store.close()
    with reader.reading(tmp_path / "bridge.db") as conn:
        assert conn is not None
        assert {p.id for p in queries.list_peers(conn)} == {b.id, c.id}  # not a (forgotten), not cli
        assert queries.query_decisions(conn) == []
        assert [r.reason for r in queries.retractions(conn)] == [None]
        assert queries.unacked_counts(conn)[b.id] == 1
        assert [r.message.sender.id for r in queries.recent_messages(conn)] == ["cli"]
