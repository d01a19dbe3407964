"""Forgetting and merging session records reads what names them through indexes, never whole
tables (schema V_REFERENCES).

The store deletes two kinds of rows: session records (forgetting one, a health check's record
at its end, merging a pending record into an earlier one) and the messages a forgotten session
held. SQLite checks every foreign key on such a delete by looking up the rows that name the
deleted one, and the store asks the same before it deletes. Without an index each look reads
its whole table, on the store's thread: with 100,000 decisions, forgetting a session with 200
queued messages took 4.3 s (docs/performance.md). The work is counted here in SQLite's virtual
machine steps (a progress handler), not in time.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import apsw
import pytest

from agent_bridge.common.rows import Forgotten
from agent_bridge.store.ids import new_id
from agent_bridge.store.messages import Outgoing
from agent_bridge.store.schema import STEPS, V_REFERENCES
from agent_bridge.store.writer import Store

DELETED = ("peers", "messages")  # the parents the store deletes rows of (store/forgetting.py, store/peers.py)


def test_every_column_naming_a_row_the_store_deletes_is_looked_up_by_an_index(tmp_path: Path) -> None:
    """Each foreign key to a session record or a message, as the schema declares it, is found
    through an index: the look SQLite makes for it on a delete is a SEARCH, never a SCAN."""
    store = Store.open(tmp_path / "bridge.db")
    try:
        tables = [
            name for (name,) in store.conn.execute(
                "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
                "AND sql NOT LIKE 'CREATE VIRTUAL%'"
            )
        ]
        looks = []
        for table in tables:
            for fk in store.conn.execute(f"PRAGMA foreign_key_list({table})").fetchall():
                parent, column = fk[2], fk[3]
                if parent in DELETED:
                    plan = " | ".join(
                        str(row[3]) for row in store.conn.execute(
                            f"EXPLAIN QUERY PLAN SELECT 1 FROM {table} WHERE {column} = ?", ("x",)
                        )
                    )
                    looks.append((f"{table}.{column}", plan))
    finally:
        store.close()
    assert len(looks) >= 10  # the schema's references were found
    scans = [(column, plan) for column, plan in looks if "SCAN" in plan or "INDEX" not in plan]
    assert scans == []


def _steps(store: Store, work: Callable[[], object]) -> int:
    """SQLite virtual machine steps `work` took on the store's connection (in tens)."""
    count = 0

    def tick() -> bool:
        nonlocal count
        count += 1
        return False  # go on

    store.conn.set_progress_handler(tick, 10)
    try:
        work()
    finally:
        store.conn.set_progress_handler(None)
    return count


def _store_with_decisions(path: Path, decisions: int) -> tuple[Store, str]:
    """A store whose owner-side session `author` pinned `decisions` revisions and retracted a
    tenth of them (the other rows that name a session)."""
    store = Store.open(path)
    author = store.create_peer(
        agent="claude", name="author", project="/w/a", kind="interactive", host_session_id=None, now=1
    )
    ids = [new_id() for _ in range(decisions)]
    with store.conn:
        store.conn.executemany(
            "INSERT INTO decisions(id, topic, text, text_key, scope, scope_kind, scope_project, author_id, "
            "author_name, author_agent, created_at, source_message_id, supersedes) "
            "VALUES (?,?,'use it','use it','\"all\"','all',NULL,?,'author','claude',?,NULL,NULL)",
            [(d, f"topic-{i}", author.id, 10 + i) for i, d in enumerate(ids)],
        )
        store.conn.executemany(
            "INSERT INTO decision_retractions(id, topic, retracts, reason, author_id, author_name, "
            "author_agent, created_at) VALUES (?,?,?,NULL,?,'author','claude',?)",
            [(new_id(), f"topic-{i}", d, author.id, 10 + decisions + i) for i, d in enumerate(ids[::10])],
        )
    return store, author.id


def _forgetting(path: Path, decisions: int, forget: str) -> int:
    """Steps that forgetting a session took in a store with `decisions` decisions."""
    store, author = _store_with_decisions(path, decisions)
    try:
        gone = store.create_peer(
            agent="codex", name="gone", project="/w/b", kind="interactive", host_session_id=None, now=2
        )
        if forget == "a health check's record":
            steps = _steps(store, lambda: store.forget_unused_peer(gone.id))
        else:
            store.send_messages(author, [Outgoing(gone.id, f"m{i}", 1, None) for i in range(50)], now=3)
            forgotten: list[Forgotten] = []
            steps = _steps(store, lambda: forgotten.extend(store.forget_peers([gone.id], now=4)))
            assert [(f.peer.id, len(f.dropped)) for f in forgotten] == [(gone.id, 50)]
        assert store.get_peer(gone.id) is None
    finally:
        store.close()
    return steps


@pytest.mark.parametrize("forget", ["a health check's record", "a session with queued messages"])
def test_forgetting_does_not_read_the_decisions(tmp_path: Path, forget: str) -> None:
    """The same forgetting costs about the same with 20 decisions in the store as with 2,000:
    it never reads through them (before V_REFERENCES: once for the record, once for each of its
    messages)."""
    few = _forgetting(tmp_path / "few.db", 20, forget)
    many = _forgetting(tmp_path / "many.db", 2_000, forget)
    assert few > 0
    assert many < 1.5 * few, f"{few * 10} steps with 20 decisions, {many * 10} with 2,000"


def test_an_upgraded_database_gets_the_indexes(tmp_path: Path) -> None:
    """A database of the version before (14) is upgraded to carry them."""
    db = tmp_path / "bridge.db"
    conn = apsw.Connection(str(db))
    conn.execute("PRAGMA foreign_keys = ON")
    for step in STEPS[: STEPS.index(V_REFERENCES)]:
        with conn:
            conn.execute(step)
    conn.close()
    store = Store.open(db)
    try:
        indexes = store.conn.execute("SELECT name FROM sqlite_schema WHERE type = 'index'").fetchall()
    finally:
        store.close()
    added = {"decisions_author", "decisions_source", "decision_retractions_author", "peer_merges_into"}
    assert added <= {name for (name,) in indexes}
