"""The store's delivery tap (store.writer.DeliveryTap): what `send_messages` committed for a
session since its delivery task read the database, so the task pushes it without reading it
back. Only a shortcut: these tests hold the store to "the tap plus the cursor never skip or
repeat a committed message", on a real SQLite file."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_bridge.domain import SessionView
from agent_bridge.store import queries
from agent_bridge.store.writer import TAP_LIMIT, DeliveryTap, Outgoing, Recipient, Store


@pytest.fixture
def store(tmp_path: Path):
    store = Store.open(tmp_path / "bridge.db")
    yield store
    store.close()


def _peer(store: Store, name: str, hsid: str | None = None) -> SessionView:
    peer = store.create_peer(agent="codex", name=name, project="/w", kind="interactive", host_session_id=hsid, now=1)
    return SessionView(peer["id"], peer["name"], "/w", hsid)


def _send(store: Store, sender: SessionView, to: SessionView, *texts: str) -> list[dict]:
    return store.send_messages(sender.id, [Outgoing(to.id, t, 1, None) for t in texts], now=5)


class Delivery:
    """A delivery task's reading side, as daemon.connection.deliver runs it: read from the
    cursor while the tap is closed, drain the tap while it is open."""

    def __init__(self, store: Store, session: SessionView, limit: int = 200) -> None:
        self.store, self.session, self.limit = store, session, limit
        self.tap = DeliveryTap()
        self.cursor = 0
        self.seen: list[str] = []

    def step(self) -> None:
        if self.tap.open and self.tap.peer_id == self.session.id:
            batch = self.tap.take()
        else:
            rows = self.store.unacked(self.session.id, after_seq=self.cursor, limit=self.limit, tap=self.tap)
            batch = [(m.pop("_seq"), m) for m in rows]
        for seq, message in batch:
            if seq > self.cursor:
                self.cursor = seq
                self.seen.append(message["text"])


def _texts_in_db(store: Store, peer: SessionView) -> list[str]:
    return [m["text"] for m in queries.unacked_messages(store.conn, peer.id, current_schema=True)]


def test_a_read_that_reaches_the_end_opens_the_tap_and_sends_feed_it(store):
    a, b = _peer(store, "a"), _peer(store, "b")
    _send(store, a, b, "before")
    d = Delivery(store, b)
    d.step()
    assert d.seen == ["before"] and d.tap.open
    sent = _send(store, a, b, "one", "two")
    assert [m["text"] for _, m in d.tap.messages] == ["one", "two"]
    # what the tap holds is exactly what the database holds, field for field
    from_db = {m["id"]: m for m in queries.unacked_messages(store.conn, b.id, current_schema=True)}
    for seq, message in d.tap.messages:
        row = dict(from_db[message["id"]])
        assert row.pop("_seq") == seq and row.pop("_acked") is False
        assert row == message
    assert [m["id"] for _, m in d.tap.messages] == [m["id"] for m in sent]
    d.step()
    assert d.seen == ["before", "one", "two"] == _texts_in_db(store, b)


def test_a_read_that_fills_its_batch_leaves_the_tap_closed(store):
    a, b = _peer(store, "a"), _peer(store, "b")
    _send(store, a, b, *[f"m{i}" for i in range(5)])
    d = Delivery(store, b, limit=3)
    d.step()
    assert d.seen == ["m0", "m1", "m2"] and not d.tap.open
    _send(store, a, b, "late")
    assert not d.tap.messages
    d.step()
    assert d.seen == ["m0", "m1", "m2", "m3", "m4", "late"] and not d.tap.open  # a full batch again
    d.step()
    assert d.tap.open  # an empty read reached the end


def test_sends_to_other_sessions_do_not_reach_the_tap(store):
    a, b, c = _peer(store, "a"), _peer(store, "b"), _peer(store, "c")
    d = Delivery(store, b)
    d.step()
    _send(store, a, c, "for c")
    assert not d.tap.messages


def test_a_decision_closes_the_tap_and_nothing_is_skipped(store):
    """A fan-out writes receipts the tap does not hold: the session reads from its cursor,
    and a send committed after the decision comes after it, once."""
    a, b = _peer(store, "a", "ha"), _peer(store, "b", "hb")
    d = Delivery(store, b)
    d.step()
    _send(store, a, b, "first")
    store.record_decision(
        author=a, author_agent="codex", topic="db", text="PostgreSQL", scope="all",
        source_message_id=None, recipients=[Recipient(b, "hb")], now=6,
    )
    assert not d.tap.open
    _send(store, a, b, "after")
    d.step()
    assert d.seen == ["first", "Pinned owner decision for all sessions: db: PostgreSQL", "after"]
    assert d.seen == _texts_in_db(store, b)


def test_a_catch_up_closes_the_tap(store):
    a, b = _peer(store, "a", "ha"), _peer(store, "b", "hb")
    store.record_decision(
        author=a, author_agent="codex", topic="ui", text="dark", scope="all",
        source_message_id=None, recipients=[], now=2,
    )
    d = Delivery(store, b)
    d.step()
    assert d.tap.open
    assert store.catch_up(b, now=3) == 1
    assert not d.tap.open
    d.step()
    assert d.seen == ["Pinned owner decision for all sessions: ui: dark"]


def test_overflow_closes_the_tap_and_the_cursor_reads_the_rest(store):
    a, b = _peer(store, "a"), _peer(store, "b")
    d = Delivery(store, b)
    d.step()
    texts = [f"m{i}" for i in range(TAP_LIMIT + 5)]
    _send(store, a, b, *texts)
    assert not d.tap.open
    while len(d.seen) < len(texts):
        before = len(d.seen)
        d.step()
        assert len(d.seen) > before
    assert d.seen == texts


def test_absorbing_an_earlier_record_closes_both_taps(store):
    a, b, old = _peer(store, "a"), _peer(store, "b"), _peer(store, "old")
    _send(store, a, old, "waiting for old")
    d_b, d_old = Delivery(store, b), Delivery(store, old)
    d_b.step()
    d_old.step()
    assert d_b.tap.open and d_old.tap.open
    store.absorb_peer(old.id, b.id)
    assert not d_b.tap.open and not d_old.tap.open
    # a replay (cursor reset) after the merge, as the broker does: the moved message comes back
    d_b.cursor = 0
    d_b.step()
    assert "waiting for old" in d_b.seen


def test_a_tap_follows_its_session_to_another_record(store):
    """The delivery task reads for the session's new record: its tap leaves the old one."""
    a, b, c = _peer(store, "a"), _peer(store, "b"), _peer(store, "c")
    d = Delivery(store, b)
    d.step()
    d.session = c
    d.step()
    assert d.tap.peer_id == c.id and store.taps.get(b.id) is None
    _send(store, a, b, "to the old record")
    _send(store, a, c, "to the new record")
    assert [m["text"] for _, m in d.tap.messages] == ["to the new record"]


def test_a_later_tap_for_the_same_record_replaces_the_earlier(store):
    a, b = _peer(store, "a"), _peer(store, "b")
    first, second = Delivery(store, b), Delivery(store, b)
    first.step()
    second.step()
    assert second.tap.open and not first.tap.open
    _send(store, a, b, "x")
    assert not first.tap.messages and len(second.tap.messages) == 1


def test_the_delivery_read_is_one_index_range_in_order(store):
    """The read behind every delivery must not sort or scan the session's whole backlog."""
    a, b = _peer(store, "a"), _peer(store, "b")
    _send(store, a, b, "x")
    executed: list[tuple[str, tuple]] = []

    def trace(cursor, sql, bindings):
        executed.append((sql, tuple(bindings or ())))
        return True

    store.conn.exec_trace = trace
    store.unacked(b.id, after_seq=0, limit=10)
    store.conn.exec_trace = None
    (sql, bindings), = executed
    plan = " | ".join(row[3] for row in store.conn.execute("EXPLAIN QUERY PLAN " + sql, bindings))
    assert "receipts_peer_unacked (peer_id=? AND acked_at=? AND rowid>?)" in plan, plan
    assert "TEMP B-TREE" not in plan, plan


def test_a_tap_whose_connection_ended_holds_nothing_and_is_dropped(store):
    a, b = _peer(store, "a"), _peer(store, "b")
    d = Delivery(store, b)
    d.step()
    _send(store, a, b, "pushed before the end")
    d.tap.open = False  # what the delivery task does when its connection ends
    d.tap.messages.clear()
    _send(store, a, b, "after the end")
    assert b.id not in store.taps and not d.tap.messages
    assert _texts_in_db(store, b) == ["pushed before the end", "after the end"]
