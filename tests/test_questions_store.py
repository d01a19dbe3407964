"""bridge.db version 6: owner questions at the store level (SPEC §4.6, §7)."""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest

from agent_bridge.common.domain import SessionView
from agent_bridge.store import queries, question_queries, reader
from agent_bridge.store.decisions import Recipient
from agent_bridge.store.peers import CLI_AUTHOR
from agent_bridge.store.schema import CURRENT_VERSION, V4, V5
from agent_bridge.store.writer import Store
from tests.test_owner_store import build_v3
from tests.test_store import build_v0, build_v1, build_v2


def build_v4(path: Path) -> None:
    """Version 3's data, upgraded by the pinned step 4, plus a retraction of `camera` and its notice."""
    build_v3(path)
    conn = apsw.Connection(str(path))
    with conn:
        conn.execute(V4)
    conn.execute(
        "INSERT INTO decision_retractions(id, topic, retracts, reason, author_id, author_name, author_agent, "
        "created_at) VALUES ('r1','camera','d3','changed our minds','p1','claude-app','claude',150)"
    )
    conn.execute("INSERT INTO messages VALUES ('n3','p1','p2','camera retracted',100,NULL,150,NULL)")
    conn.execute("INSERT INTO receipts(message_id, peer_id) VALUES ('n3','p2')")
    conn.execute("INSERT INTO retraction_notices VALUES ('n3','r1','p2')")
    conn.close()


def build_v5(path: Path) -> None:
    """Version 4's data, upgraded by step 5, plus a resume secret and a host instance's session."""
    build_v4(path)
    conn = apsw.Connection(str(path))
    with conn:
        conn.execute(V5)
    conn.execute("INSERT INTO session_secrets VALUES ('p1','hash-1')")
    conn.execute("INSERT INTO instance_sessions VALUES (42, 4242, 'p1', 160)")
    conn.close()


def _count(conn: apsw.Connection, table: str) -> int:
    return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


@pytest.mark.parametrize(
    ("builder", "old"),
    [(build_v0, 0), (build_v1, 1), (build_v2, 2), (build_v3, 3), (build_v4, 4), (build_v5, 5)],
)
def test_every_earlier_version_upgrades_to_6_keeping_its_data(tmp_path, builder, old):
    db = tmp_path / "bridge.db"
    builder(db)
    lines: list[str] = []
    store = Store.open(db, lines.append)
    try:
        assert store.version() == CURRENT_VERSION
        (backup,) = tmp_path.glob(f"bridge.db.v{old}-*.bak")
        assert any("backed up" in line and backup.name in line for line in lines)
        before = apsw.Connection(str(backup), flags=apsw.SQLITE_OPEN_READONLY)
        tables = [r[0] for r in before.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                                 "AND name NOT LIKE 'sqlite_%'")]
        for table in tables:  # nothing lost: every row of every earlier table is still there
            assert _count(store.conn, table) == _count(before, table), table
        before.close()
        if old >= 1:
            waiting = [m.id for m in store.unacked("p2")]
            assert waiting[0] == "m1"
        if old >= 3:
            assert [m.kind for m in store.unacked("p2")][-1] == ("retraction" if old >= 4 else "decision")
        if old >= 5:
            resumed = store.peer_with_secret("p1", "hash-1")
            assert resumed is not None and resumed.id == "p1"
        assert question_queries.list_questions(store.conn, include_closed=True) == []
        # ... and questions work on the upgraded data.
        asker = store.create_peer(agent="codex", name="codex-job", project="/w/app", kind="job",
                                  host_session_id=None, now=300)
        view = SessionView(asker.id, asker.name, "/w/app", None, "job")
        q, current = store.ask_question(
            asker=view,
            asker_agent="codex",
            question="Which queue?",
            topic="queue",
            options=["redis", "sqs"],
            scope={"project": "/w/app"},
            caller_addresses=view.addresses,
            now=301,
        )
        assert current is None and q is not None and q.state == "open"
        answered, decision, _, told = store.answer_question(
            question_id=q.id, author=CLI_AUTHOR, topic="queue", text="redis", scope={"project": "/w/app"},
            recipients=[], now=302)
        assert answered.state == "answered" and decision.source_message_id == q.id
        assert told == [(asker.id, "codex-job")]
    finally:
        store.close()


def _sessions(store: Store) -> list[SessionView]:
    views = []
    for agent, name, project, host, kind in (
        ("claude", "claude-app", "/w/app", "h-a", "interactive"),
        ("codex", "codex-app", "/w/app", "h-b", "job"),
        ("codex", "codex-other", "/w/other", "h-c", "interactive"),
    ):
        p = store.create_peer(agent=agent, name=name, project=project, kind=kind, host_session_id=host, now=1)
        views.append(SessionView(p.id, p.name, project, host, kind))
    return views


def _ask(store: Store, who: SessionView, question: str = "Which database?", topic: str | None = "db",
         options: tuple[str, ...] = ("PostgreSQL", "SQLite"), scope=None, now: int = 10):
    scope = {"project": who.project} if scope is None else scope
    return store.ask_question(asker=who, asker_agent=who.name.split("-")[0], question=question, topic=topic,
                              options=list(options), scope=scope, caller_addresses=who.addresses, now=now)


def test_a_question_is_a_message_to_the_owner_and_a_second_asker_joins_it(tmp_path):
    store = Store.open(tmp_path / "bridge.db")
    try:
        a, b, c = _sessions(store)
        q, current = _ask(store, a)
        assert current is None and q is not None
        row = store.conn.execute(
            "SELECT from_peer, to_peer, body, hop FROM messages WHERE id = ?", (q.id,)
        ).fetchone()
        assert row == (a.id, "cli", "Which database?", 1)  # the question's id is its message's id
        assert not store.conn.execute("SELECT 1 FROM receipts WHERE message_id = ?", (q.id,)).fetchall()
        assert q.to_json() == {
            "id": q.id,
            "question": "Which database?",
            "topic": "db",
            "options": ["PostgreSQL", "SQLite"],
            "scope": {"project": "/w/app"},
            "askedBy": [{"id": a.id, "name": "claude-app", "agent": "claude"}],
            "createdAt": 10,
            "state": "open",
            "decisionId": None,
            "reason": None,
        }
        joined, _ = _ask(store, b, question="db: postgres or sqlite?", options=("x",), now=11)
        assert joined is not None and joined.id == q.id
        assert [x.name for x in joined.asked_by] == ["claude-app", "codex-app"]
        assert joined.question == "Which database?" and joined.options == ("PostgreSQL", "SQLite")
        again, _ = _ask(store, a, now=12)  # asking twice adds nobody
        assert again is not None and [x.name for x in again.asked_by] == ["claude-app", "codex-app"]
        other, _ = _ask(store, c)  # another scope: another question
        assert other is not None and other.id != q.id
        untopical, _ = _ask(store, a, question="May I delete build/?", topic=None, options=())
        same, _ = _ask(
            store, b, question="May I delete build/?", topic=None, options=(), scope={"project": "/w/app"}
        )
        assert untopical is not None and same is not None and same.id == untopical.id
        assert [x.id for x in question_queries.list_questions(store.conn)] == [q.id, other.id, untopical.id]
        assert question_queries.open_count(store.conn) == 3
    finally:
        store.close()


def test_a_topic_decided_in_scope_records_no_question(tmp_path):
    store = Store.open(tmp_path / "bridge.db")
    try:
        a, b, c = _sessions(store)
        decision, _ = store.record_decision(
            author=CLI_AUTHOR,
            author_agent="cli",
            topic="db",
            text="PostgreSQL",
            scope={"project": "/w/app"},
            source_message_id=None,
            recipients=[],
            now=5,
        )
        q, current = _ask(store, a)
        assert q is None and current == decision
        assert question_queries.list_questions(store.conn, include_closed=True) == []
        q, current = _ask(store, c)  # decided for /w/app, not for /w/other
        assert current is None and q is not None
        q, current = _ask(store, a, scope="all")  # a project's decision does not answer for all sessions
        assert current is None and q is not None
    finally:
        store.close()


def test_an_answer_is_a_pinned_decision_and_one_active_message_per_asker(tmp_path):
    store = Store.open(tmp_path / "bridge.db")
    try:
        a, b, c = _sessions(store)
        q, _ = _ask(store, a)
        _ask(store, b)
        assert q is not None
        answered, decision, delivered, told = store.answer_question(
            question_id=q.id, author=CLI_AUTHOR, topic="db", text="PostgreSQL", scope={"project": "/w/app"},
            recipients=[Recipient(a, "h-a")], now=20)
        assert (decision.topic, decision.text, decision.author.id, decision.source_message_id) == (
            "db", "PostgreSQL", "cli", q.id)
        assert decision.current and delivered == ["claude-app"]
        assert (
            answered.state == "answered" and answered.decision_id == decision.id and answered.reason is None
        )
        assert told == [(a.id, "claude-app"), (b.id, "codex-app")]
        a_got = store.unacked(a.id)
        assert [m.kind for m in a_got] == ["decision", "answer"]  # the notice, then the answer
        answer = a_got[1]
        assert answer.hop == 1 and answer.sender.id == "cli" and answer.reply_to == q.id
        assert q.id in answer.text and decision.id in answer.text and "db: PostgreSQL" in answer.text
        assert answer.to_json()["question"]["state"] == "answered"
        assert [m.kind for m in store.unacked(b.id)] == ["answer"]  # a job: no notice, but its answer
        with pytest.raises(ValueError, match="already answered"):
            store.decline_question(question_id=q.id, reason="no", now=21)
        with pytest.raises(ValueError, match="no question has id"):
            store.decline_question(question_id="nope", reason="no", now=21)
    finally:
        store.close()


def test_a_decline_tells_the_askers_why(tmp_path):
    store = Store.open(tmp_path / "bridge.db")
    try:
        a, b, c = _sessions(store)
        q, _ = _ask(store, c, question="May I delete build/?", topic=None, options=())
        assert q is not None
        declined, told = store.decline_question(question_id=q.id, reason="decide it yourself", now=30)
        assert (
            declined.state == "declined"
            and declined.reason == "decide it yourself"
            and declined.decision_id is None
        )
        assert told == [(c.id, "codex-other")]
        (m,) = store.unacked(c.id)
        assert m.kind == "answer" and "declined" in m.text and "decide it yourself" in m.text
        assert store.decisions() == []
        assert question_queries.list_questions(store.conn) == []
        assert [x.state for x in question_queries.list_questions(store.conn, include_closed=True)] == [
            "declined"
        ]
        with pytest.raises(ValueError, match="already declined"):
            store.answer_question(question_id=q.id, author=CLI_AUTHOR, topic="x", text="y", scope="all",
                                  recipients=[], now=31)
    finally:
        store.close()


@pytest.mark.parametrize("statement", [
    "UPDATE questions SET question = 'x'", "DELETE FROM questions",
    "UPDATE question_askers SET name = 'x'", "DELETE FROM question_askers",
    "UPDATE question_outcomes SET reason = 'x'", "DELETE FROM question_outcomes",
])
def test_questions_are_append_only_in_the_schema(tmp_path, statement):
    store = Store.open(tmp_path / "bridge.db")
    try:
        a, _, _ = _sessions(store)
        q, _ = _ask(store, a)
        assert q is not None
        store.decline_question(question_id=q.id, reason="later", now=5)
        with pytest.raises(apsw.ConstraintError, match="append-only"):
            store.conn.execute(statement)
    finally:
        store.close()


def test_an_answer_that_fails_mid_transaction_leaves_nothing(tmp_path):
    store = Store.open(tmp_path / "bridge.db")
    try:
        a, b, _ = _sessions(store)
        q, _ = _ask(store, a)
        assert q is not None

        def fault(point: str) -> None:
            if point == "answer:after-outcome":
                raise RuntimeError("crash")

        with pytest.raises(RuntimeError):
            store.answer_question(
                question_id=q.id,
                author=CLI_AUTHOR,
                topic="db",
                text="PostgreSQL",
                scope={"project": "/w/app"},
                recipients=[Recipient(a, "h-a")],
                now=20,
                fault=fault,
            )
        assert store.decisions(history=True) == [] and store.unacked(a.id) == []
        assert _count(store.conn, "question_outcomes") == 0
        assert queries.question_by_id(store.conn, q.id).state == "open"  # type: ignore[union-attr]
    finally:
        store.close()


def test_a_forgotten_asker_stays_in_history_and_is_not_told(tmp_path):
    store = Store.open(tmp_path / "bridge.db")
    try:
        a, b, _ = _sessions(store)
        q, _ = _ask(store, a)
        _ask(store, b)
        assert q is not None
        store.forget_peers([b.id], now=15)
        assert [p.id for p in store.list_peers()].count(b.id) == 0
        answered, _, _, told = store.answer_question(
            question_id=q.id, author=CLI_AUTHOR, topic="db", text="x", scope="all", recipients=[], now=20
        )
        assert told == [(a.id, "claude-app")]
        assert [x.name for x in answered.asked_by] == ["claude-app", "codex-app"]
    finally:
        store.close()


def test_readers_of_an_older_database_see_no_questions(tmp_path):
    db = tmp_path / "bridge.db"
    build_v5(db)
    with reader.reading(db) as conn:
        assert conn is not None
        assert question_queries.list_questions(conn, include_closed=True) == []
        assert question_queries.open_count(conn) == 0
        assert queries.question_by_id(conn, "x") is None
        assert [q.message.kind for q in queries.unacked_messages(conn, "p2")] == [
            "message",
            "decision",
            "retraction",
        ]
