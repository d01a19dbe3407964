"""A sender's receipts (SPEC §3 "Conversations agents can rely on") in the store and the domain
rules, on real SQLite files: the upgrade to schema V_WAKES from every earlier version, what
`offer`, `ack` and the wake requests record, the safe-retry rules of `send`, and the rules
`sent` reads with (receipt_state, wake_state), whose states never move back."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import apsw
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_bridge.common import domain
from agent_bridge.common.domain import InputError
from agent_bridge.store import queries, reader
from agent_bridge.store.messages import Outgoing, Send, Stored
from agent_bridge.store.schema import CURRENT_VERSION, STEPS, V_LEAN_ACKS, V_WAKES
from agent_bridge.store.writer import Store

WAKES_VERSION = STEPS.index(V_WAKES) + 1


def build_at(path: Path, version: int) -> None:
    """A database at schema `version` (0: empty) with two sessions and three messages: one
    acknowledged, one offered to the host and not acknowledged (its receipt's delivered_at set:
    before V_WAKES, the offer), one never offered."""
    conn = apsw.Connection(str(path))
    for step in STEPS[:version]:
        conn.execute(step)
    if version >= 1:
        conn.execute(
            "INSERT INTO peers(id, name, agent, project, kind, created_at, last_seen_at) VALUES "
            "('p1','claude-app','claude','/w/app','interactive',1,1),('p2','codex-app','codex','/w/app','interactive',1,1)"
        )
        conn.execute(
            "INSERT INTO messages(id, from_peer, to_peer, body, hop, reply_to, created_at, acked_at) VALUES "
            "('m1','p1','p2','read',1,NULL,10,12),('m2','p1','p2','offered',1,NULL,11,NULL),"
            "('m3','p1','p2','waiting',1,'m1',13,NULL)"
        )
    if version >= 2:
        # V2 made one receipt per message from messages.acked_at; these are as a v2+ broker left them
        conn.execute("DELETE FROM receipts")
        conn.execute(
            "INSERT INTO receipts(message_id, peer_id, delivered_at, acked_at) VALUES "
            "('m1','p2',11,12),('m2','p2',20,NULL),('m3','p2',NULL,NULL)"
        )
    conn.close()


@pytest.mark.parametrize("old", range(WAKES_VERSION))
def test_the_upgrade_to_wake_records_keeps_every_receipt_and_moves_offers_apart(
    tmp_path: Path, old: int
) -> None:
    db = tmp_path / "bridge.db"
    build_at(db, old)
    store = Store.open(db)
    try:
        assert store.version() == CURRENT_VERSION
        if old == 0:
            assert store.sent("p1", None, 20) == []
            return
        receipts = {
            r[0]: r[1:]
            for r in store.conn.execute("SELECT message_id, offered_at, delivered_at, acked_at FROM receipts")
        }
        offered_m2 = 20 if old >= 2 else None  # v1 kept no offers
        assert receipts == {
            "m1": (11 if old >= 2 else None, 12, 12),  # acknowledged: shown by then
            "m2": (offered_m2, None, None),  # offered is not shown
            "m3": (None, None, None),
        }
        # still delivered, the offered one marked as a repeat
        repeats = [("m2", offered_m2 is not None), ("m3", False)]
        assert [(m.id, m.repeat) for m in store.unacked("p2")] == repeats
        assert [(r.message.id, r.state, r.replies) for r in store.sent("p1", None, 20)] == [
            ("m3", "queued", ()), ("m2", "queued", ()), ("m1", "acknowledged", ("m3",))
        ]
        assert store.conn.execute("SELECT count(*) FROM wakes").fetchone()[0] == 0
    finally:
        store.close()


def test_the_upgrade_to_lean_acknowledgements_keeps_every_receipt(tmp_path: Path) -> None:
    """V_LEAN_ACKS changes indexes only: what was acknowledged stays so, in the receipt and in
    the message's own copy (SPEC §7's versions 1 and 2), and a new acknowledgement writes both."""
    db = tmp_path / "bridge.db"
    build_at(db, STEPS.index(V_LEAN_ACKS))
    store = Store.open(db)
    try:
        assert store.version() == CURRENT_VERSION
        indexes = {r[0] for r in store.conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert {"messages_to", "receipts_unacked", "receipts_peer"} <= indexes
        assert not {"messages_to_unacked", "receipts_peer_unacked"} & indexes
        assert [(m.id, m.repeat) for m in store.unacked("p2")] == [("m2", True), ("m3", False)]
        assert [(r.message.id, r.state) for r in store.sent("p1", None, 20)] == [
            ("m3", "queued"), ("m2", "shown"), ("m1", "acknowledged")  # build_at: m2 written to the host
        ]
        assert store.ack("p2", ["m3", "m1"], now=30) == 1  # m1 was acknowledged before
        assert [m.id for m in store.unacked("p2")] == ["m2"]
        copies = dict(store.conn.execute("SELECT id, acked_at FROM messages"))
        assert copies == {"m1": 12, "m2": None, "m3": 30}
    finally:
        store.close()


_ACK_IDS = ["m1", "m2", "m3", "m4", "nope", 'quote"d', "back\\slash", "é"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(_ACK_IDS), max_size=12))
def test_an_acknowledgement_records_each_of_the_session_s_unacknowledged_receipts_once(
    tmp_path_factory: pytest.TempPathFactory, ids: list[str]
) -> None:
    """`ack` takes the ids as one set: repeats count once, ids the session has no receipt for
    (unknown, or another session's) and receipts acknowledged before are left alone, and the
    message's own copy (SPEC §7's versions 1 and 2) is written for exactly the ones it counts.
    Ids are text the client chose: quotes and backslashes are ids like any other."""
    db = tmp_path_factory.mktemp("ack") / "bridge.db"
    build_at(db, CURRENT_VERSION)  # p2's m1 acknowledged at 12; m2 and m3 not
    conn = apsw.Connection(str(db))
    conn.execute(
        "INSERT INTO messages(id, from_peer, to_peer, body, hop, created_at) VALUES "
        "('m4','p2','p1','to p1',1,14),('quote\"d','p1','p2','odd id',1,15),"
        "('back\\slash','p1','p2','odd',1,16);"
        "INSERT INTO receipts(message_id, peer_id) VALUES ('m4','p1'),('quote\"d','p2'),('back\\slash','p2')"
    )
    conn.close()
    store = Store.open(db)
    try:
        waiting = {"m2", "m3", 'quote"d', "back\\slash"}  # p2's unacknowledged receipts
        assert store.ack("p2", ids, now=40) == len(waiting & set(ids))
        receipts = dict(store.conn.execute("SELECT message_id, acked_at FROM receipts"))
        copies = dict(store.conn.execute("SELECT id, acked_at FROM messages"))
        for mid in waiting:
            assert receipts[mid] == copies[mid] == (40 if mid in ids else None)
        assert receipts["m1"] == copies["m1"] == 12  # acknowledged before: kept
        assert receipts["m4"] is None and copies["m4"] is None  # p1's, not p2's
        assert store.ack("p2", ids, now=50) == 0  # the same again: nothing new
    finally:
        store.close()


def _wal_pages_by_tree(store: Store, path: Path, change: Callable[[], object]) -> set[str]:
    """The b-trees (tables, indexes) whose pages `change`'s commit wrote to the WAL."""
    store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the WAL starts over: only this commit
    change()
    size = store.conn.execute("PRAGMA page_size").fetchone()[0]
    wal = (path.parent / (path.name + "-wal")).read_bytes()
    frames = range(32, len(wal), 24 + size)  # a 32-byte header; each frame: 24 bytes, then the page
    pages = {int.from_bytes(wal[f:f + 4], "big") for f in frames}
    owners = dict(store.conn.execute("SELECT pageno, name FROM dbstat"))
    return {owners[p] for p in pages}


def test_an_acknowledgement_moves_no_index_entry_but_the_queue_s(tmp_path: Path) -> None:
    """The acknowledgement of a few messages changes their receipts' and messages' rows and
    takes them out of the index of the unacknowledged ones: no page of another index
    (V_LEAN_ACKS; before, both indexes on acked_at moved an entry each)."""
    db = tmp_path / "bridge.db"
    store = Store.open(db)
    try:
        a, b = two(store)
        stored = store.send(a, [Send((Outgoing(b, f"note {i}", 1, None),)) for i in range(4)], now=5)
        ids = [m.id for s in stored if isinstance(s, Stored) for m in s.messages]
        trees = _wal_pages_by_tree(store, db, lambda: store.ack(b, ids, now=6))
        assert trees == {"receipts", "receipts_unacked", "messages"}, trees
        assert [m.id for m in store.unacked(b)] == []
    finally:
        store.close()


def _plans(conn: apsw.Connection, read: Callable[[], object]) -> tuple[object, list[str]]:
    """What `read` returned, and the query plan of each statement it ran on `conn`."""
    executed: list[tuple[str, tuple[object, ...]]] = []

    def trace(cursor: apsw.Cursor, sql: str, bindings: object) -> bool:
        executed.append((sql, tuple(bindings or ())))  # type: ignore[arg-type]
        return True

    conn.exec_trace = trace
    try:
        result = read()
    finally:
        conn.exec_trace = None
    plans = [" | ".join(row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, bindings))
             for sql, bindings in executed]
    return result, plans


def test_reads_of_the_unacknowledged_receipts_take_their_index_not_the_session_s_history(
    tmp_path: Path,
) -> None:
    """The post box's pass, the wake waiters' read and the PostToolUse hook's look range over a
    session's unacknowledged receipts (receipts_unacked), not over every receipt it ever had
    (receipts_peer), which SQLite's planner took for them without the index named: a cost that
    grew with the session's history, five times a second under a stream of sends."""
    db = tmp_path / "bridge.db"
    store = Store.open(db)
    try:
        a, b = two(store)
        stored = store.send(a, [Send((Outgoing(b, f"old {i}", 1, None),)) for i in range(40)], now=5)
        store.ack(b, [m.id for s in stored if isinstance(s, Stored) for m in s.messages], now=6)
        waiting = store.send(a, [Send((Outgoing(b, "waiting", 1, None),))], now=7)
        waiting_id = [m.id for s in waiting if isinstance(s, Stored) for m in s.messages]

        found, plans = _plans(store.conn, lambda: store.host_sessions_waiting(domain.HOP_MAX))
        assert found == {"hs-b"}
        found_of, plans_of = _plans(store.conn, lambda: store.active_unacked_of([a, b], domain.HOP_MAX))
        assert found_of == {b: waiting_id}
        with reader.reading(db) as conn:
            assert conn is not None
            look, plans_look = _plans(conn, lambda: reader.active_waiting(conn, "hs-b"))
            assert look is True and reader.active_waiting(conn, "hs-a") is False
        for plan in (*plans, *plans_of, *plans_look):
            assert "receipts_unacked (peer_id=?)" in plan and "receipts_peer" not in plan, plan
    finally:
        store.close()


def test_the_hook_s_look_reads_a_database_from_before_the_unacknowledged_index(tmp_path: Path) -> None:
    """Before V_LEAN_ACKS the index of a session's unacknowledged receipts had another name; the
    PostToolUse hook still finds what waits there (the broker upgrades the file at its start)."""
    db = tmp_path / "bridge.db"
    build_at(db, STEPS.index(V_LEAN_ACKS))
    conn = apsw.Connection(str(db))
    conn.execute("UPDATE peers SET host_session_id = 'hs-2' WHERE id = 'p2'")
    conn.close()
    with reader.reading(db) as read:
        assert read is not None
        assert reader.active_waiting(read, "hs-2") is True
        assert reader.active_waiting(read, "hs-1") is False


@pytest.fixture
def store(tmp_path: Path):
    s = Store.open(tmp_path / "bridge.db")
    yield s
    s.close()


def two(store: Store) -> tuple[str, str]:
    a = store.create_peer(agent="claude", name="a", project="/w", kind="interactive", host_session_id=None,
                          now=1)
    b = store.create_peer(agent="codex", name="b", project="/w", kind="interactive", host_session_id="hs-b",
                          now=1)
    return a.id, b.id


def state_of(store: Store, sender: str, mid: str, now: int = 10**13) -> tuple[str, int | None, str | None]:
    (r,) = store.sent(sender, [mid], 20)
    j = r.to_json(now)
    return j["state"], j["shownAt"], j["woken"]


def test_shown_is_the_write_not_the_offer(store: Store) -> None:
    a, b = two(store)
    (mid,) = [m.id for m in store.send_messages(a, [Outgoing(b, "hi", 1, None)], now=100)]
    assert state_of(store, a, mid) == ("queued", None, None)
    store.offer(b, [mid], now=110)  # a Stop hook fetched it: it may or may not be written
    assert state_of(store, a, mid) == ("queued", None, None)
    assert [m.repeat for m in store.unacked(b)] == [True]  # shown again, it is marked
    store.offer(b, [], now=120, shown=[mid])  # a connection ended after its write, before the ack
    assert state_of(store, a, mid) == ("shown", 120, None)
    store.ack(b, [mid], now=130)
    assert state_of(store, a, mid) == ("acknowledged", 120, None)  # shown when it was first written


def test_a_wake_request_is_recorded_with_the_offer_and_judged_by_the_receipt(store: Store) -> None:
    a, b = two(store)
    (mid,) = [m.id for m in store.send_messages(a, [Outgoing(b, "hi", 1, None)], now=100)]
    store.offer(b, [mid], now=1_000, wake=True)
    assert state_of(store, a, mid, now=1_000) == ("queued", None, "requested")
    assert state_of(store, a, mid, now=21_000) == ("queued", None, "unconfirmed")
    store.ack(b, [mid], now=21_500)  # shown, but too late for that wake
    assert state_of(store, a, mid, now=21_500)[2] == "unconfirmed"
    with pytest.raises(apsw.ConstraintError):
        store.conn.execute("DELETE FROM wakes")  # append-only
    with pytest.raises(apsw.ConstraintError):
        store.conn.execute("UPDATE wakes SET requested_at = 0")


def test_safe_retry_in_the_store(store: Store) -> None:
    a, b = two(store)
    key = str(uuid.uuid4())
    send = Send((Outgoing(b, "once", 1, None),), key, "b")
    (first,) = store.send(a, [send, send], now=100)[:1]  # the same id twice in one batch: stored once
    assert isinstance(first, Stored) and not first.duplicate and first.messages[0].id == key
    (again,) = store.send(a, [Send((Outgoing(b, "once", 1, None),), key, "hs-b")], now=101)
    assert isinstance(again, Stored) and again.duplicate and again.messages == first.messages
    assert store.conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 1
    (other,) = store.send(a, [Send((Outgoing(b, "twice", 1, None),), key, "b")], now=102)
    assert isinstance(other, InputError) and "another text" in str(other)
    (taken,) = store.send(b, [Send((Outgoing(a, "once", 1, None),), key, "a")], now=103)
    assert isinstance(taken, InputError) and "already another message's id" in str(taken)
    assert store.conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 1


def test_a_retry_after_the_sender_was_merged_into_an_earlier_record_is_a_duplicate(store: Store) -> None:
    """A pending connection sends, then turns out to be an earlier session (its record merged
    into that one): its retry, now sent as the earlier record, finds what it sent."""
    a, b = two(store)
    pending = store.create_peer(agent="claude", name="a-2", project="/w", kind="interactive",
                                host_session_id=None, now=2)
    key = str(uuid.uuid4())
    store.send(pending.id, [Send((Outgoing(b, "before the merge", 1, None),), key, "b")], now=100)
    store.absorb_peer(pending.id, a)
    (again,) = store.send(a, [Send((Outgoing(b, "before the merge", 1, None),), key, "b")], now=101)
    assert isinstance(again, Stored) and again.duplicate
    assert [r.message.id for r in store.sent(a, None, 20)] == [key]  # its own, merged record's included


def test_sent_lists_no_decision_or_retraction_notice(store: Store) -> None:
    from agent_bridge.store.decisions import Recipient

    a, b = two(store)
    view = store.get_peer(a).view()  # type: ignore[union-attr]
    target = store.get_peer(b).view()  # type: ignore[union-attr]
    store.record_decision(author=view, author_agent="claude", topic="db", text="PostgreSQL", scope="all",
                          source_message_id=None, recipients=[Recipient(target, "hs-b")], now=50)
    assert store.sent(a, None, 20) == []
    store.send_messages(a, [Outgoing(b, "a message", 1, None)], now=60)
    assert [r.message.text for r in store.sent(a, None, 20)] == ["a message"]


# --- the rules ---------------------------------------------------------------------------------


def test_message_ids_are_uuids_in_their_canonical_form() -> None:
    given = "0F8FAD5BD9CB469FA16570867728950E"
    assert domain.normalize_message_id(given) == "0f8fad5b-d9cb-469f-a165-70867728950e"
    assert domain.normalize_message_id(" 0f8fad5b-d9cb-469f-a165-70867728950e ") == (
        "0f8fad5b-d9cb-469f-a165-70867728950e"
    )
    for bad in ("msg-1", "", "0f8fad5b-d9cb-469f-a165-70867728950", None, 7, "g" * 32):
        with pytest.raises(InputError, match="message_id"):
            domain.normalize_message_id(bad)


def test_receipt_and_wake_states() -> None:
    assert domain.receipt_state(None, None) == "queued"
    assert domain.receipt_state(5, None) == "shown"
    assert domain.receipt_state(5, 6) == domain.receipt_state(None, 6) == "acknowledged"
    wake = domain.wake_state
    assert wake([], None, None, 0) is None
    assert wake([1_000], None, None, 20_999) == "requested"
    assert wake([1_000], None, None, 21_000) == "unconfirmed"
    assert wake([1_000], 21_000, None, 10**9) == "confirmed"  # shown 20 s after: still in time
    assert wake([1_000], 21_001, 21_001, 10**9) == "unconfirmed"
    assert wake([1_000], 500, 1_500, 10**9) == "confirmed"  # shown before, acknowledged after the wake
    assert wake([1_000, 30_000], 35_000, None, 10**9) == "confirmed"  # a later wake worked


RANK = {state: i for i, state in enumerate(domain.WAKE_STATES)}


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["wake", "show", "ack", "time"]), st.integers(0, 30_000)),
                max_size=12))
def test_neither_state_ever_moves_back(events: list[tuple[str, int]]) -> None:
    """Facts are only added as time passes (a wake requested, the message shown, acknowledged);
    `sent`'s receipt state and its wake state only move forward."""
    now, wakes, shown, acked = 0, [], None, None
    last = (0, 0)
    for what, step in events:
        now += step
        if what == "wake" and acked is None:
            wakes.append(now)
        elif what == "show" and shown is None:
            shown = now
        elif what == "ack" and acked is None:
            acked = now
        state = domain.RECEIPT_STATES.index(domain.receipt_state(shown, acked))
        woken = RANK[domain.wake_state(wakes, shown, acked, now)]
        assert state >= last[0] and woken >= last[1], (events, state, woken, last)
        last = (state, woken)


def test_sent_rows_of_an_older_database_are_none(tmp_path: Path) -> None:
    """A reader on a database the broker has not upgraded yet (no wake records): nothing."""
    db = tmp_path / "bridge.db"
    build_at(db, WAKES_VERSION - 1)
    conn = apsw.Connection(str(db))
    try:
        assert queries.sent_messages(conn, "p1", None) == []
    finally:
        conn.close()
