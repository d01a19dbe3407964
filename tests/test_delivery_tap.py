"""The store's delivery tap (store.tap.DeliveryTap) and the delivery task's reading side
(broker.delivery.Backlog, which `deliver` runs): what `send_messages` committed for a
session since its delivery task read the database, pushed without reading it back. Only a
shortcut: these tests hold the real Backlog, over a real StoreRunner thread and a real SQLite
file, to "the tap plus the cursor never skip or repeat a committed message"."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from agent_bridge.broker.delivery import Backlog
from agent_bridge.broker.storage import StoreCalls, StoreRunner
from agent_bridge.common.domain import SessionView
from agent_bridge.common.rows import Author, Message
from agent_bridge.store import queries
from agent_bridge.store.decisions import Recipient
from agent_bridge.store.messages import Outgoing
from agent_bridge.store.tap import TAP_LIMIT, DeliveryTap
from agent_bridge.store.writer import Store


@pytest.fixture
async def store(tmp_path: Path):
    runner = StoreRunner(Store.open(tmp_path / "bridge.db"))
    yield Calls(runner)
    await runner.run(runner.store.close)
    runner.stop()


class Calls(StoreCalls):
    """The broker's facade, plus what these tests read or write directly, on the store thread."""

    async def peer(self, name: str, hsid: str | None = None) -> SessionView:
        peer = await self.create_peer(
            agent="codex", name=name, project="/w", kind="interactive", host_session_id=hsid, now=1
        )
        return SessionView(peer.id, peer.name, "/w", hsid)

    async def send(self, sender: SessionView, to: SessionView, *texts: str) -> list[dict]:
        outgoing = [Outgoing(to.id, t, 1, None) for t in texts]
        return await self.runner.run(Store.send_messages, self.runner.store, sender.id, outgoing, 5)

    async def rows_in_db(self, peer: SessionView) -> list[dict]:
        return [q.message for q in await self.queued_in_db(peer)]

    async def queued_in_db(self, peer: SessionView) -> list[queries.Queued]:
        return await self.runner.run(
            queries.unacked_messages, self.runner.store.conn, peer.id, current_schema=True
        )

    async def texts_in_db(self, peer: SessionView) -> list[str]:
        return [m.text for m in await self.rows_in_db(peer)]

    @property
    def taps(self) -> dict[str, DeliveryTap]:
        return self.runner.store.taps


class Delivery:
    """A delivery task's reads, by the real Backlog; `seen`: the texts it would push."""

    def __init__(self, store: Calls, session: SessionView, limit: int = 200) -> None:
        self.backlog = Backlog(store, limit)
        self.tap = self.backlog.tap
        self.session = session
        self.seen: list[str] = []

    async def step(self) -> None:
        batch, _ = await self.backlog.read(self.session.id)
        self.seen.extend(m.text for m in self.backlog.advance(batch))


def held(tap: DeliveryTap, peer: SessionView) -> list[tuple[int, dict]]:
    """What the tap holds for `peer`, left in place (taken, then put back)."""
    taken = tap.take(peer.id) or []
    for seq, message in taken:
        tap.append(seq, message)
    return taken


async def test_a_read_that_reaches_the_end_opens_the_tap_and_sends_feed_it(store):
    a, b = await store.peer("a"), await store.peer("b")
    await store.send(a, b, "before")
    d = Delivery(store, b)
    await d.step()
    assert d.seen == ["before"] and d.tap.open
    sent = await store.send(a, b, "one", "two")
    assert [m.text for _, m in held(d.tap, b)] == ["one", "two"]
    # what the tap holds is exactly what the database holds, field for field
    from_db = {q.message.id: q for q in await store.queued_in_db(b)}
    for seq, message in held(d.tap, b):
        assert from_db[message.id] == (seq, message)
    assert [m.id for _, m in held(d.tap, b)] == [m.id for m in sent]
    await d.step()
    assert d.seen == ["before", "one", "two"] == await store.texts_in_db(b)


async def test_a_read_that_fills_its_batch_leaves_the_tap_closed(store):
    a, b = await store.peer("a"), await store.peer("b")
    await store.send(a, b, *[f"m{i}" for i in range(5)])
    d = Delivery(store, b, limit=3)
    await d.step()
    assert d.seen == ["m0", "m1", "m2"] and not d.tap.open
    await store.send(a, b, "late")
    assert d.tap.take(b.id) is None
    await d.step()
    assert d.seen == ["m0", "m1", "m2", "m3", "m4", "late"] and not d.tap.open  # a full batch again
    await d.step()
    assert d.tap.open  # an empty read reached the end


async def test_sends_to_other_sessions_do_not_reach_the_tap(store):
    a, b, c = await store.peer("a"), await store.peer("b"), await store.peer("c")
    d = Delivery(store, b)
    await d.step()
    await store.send(a, c, "for c")
    assert d.tap.take(b.id) == []


async def test_a_decision_closes_the_tap_and_nothing_is_skipped(store):
    """A fan-out writes receipts the tap does not hold: the session reads from its cursor,
    and a send committed after the decision comes after it, once."""
    a, b = await store.peer("a", "ha"), await store.peer("b", "hb")
    d = Delivery(store, b)
    await d.step()
    await store.send(a, b, "first")
    await store.record_decision(
        author=a, author_agent="codex", topic="db", text="PostgreSQL", scope="all",
        source_message_id=None, recipients=[Recipient(b, "hb")], now=6,
    )
    assert not d.tap.open
    await store.send(a, b, "after")
    await d.step()
    assert d.seen == ["first", "Pinned owner decision for all sessions: db: PostgreSQL", "after"]
    assert d.seen == await store.texts_in_db(b)


async def test_a_catch_up_closes_the_tap(store):
    a, b = await store.peer("a", "ha"), await store.peer("b", "hb")
    await store.record_decision(
        author=a, author_agent="codex", topic="ui", text="dark", scope="all",
        source_message_id=None, recipients=[], now=2,
    )
    d = Delivery(store, b)
    await d.step()
    assert d.tap.open
    assert await store.catch_up(b, now=3) == 1
    assert not d.tap.open
    await d.step()
    assert d.seen == ["Pinned owner decision for all sessions: ui: dark"]


async def test_overflow_closes_the_tap_and_the_cursor_reads_the_rest(store):
    a, b = await store.peer("a"), await store.peer("b")
    d = Delivery(store, b)
    await d.step()
    texts = [f"m{i}" for i in range(TAP_LIMIT + 5)]
    await store.send(a, b, *texts)
    assert not d.tap.open
    while len(d.seen) < len(texts):
        before = len(d.seen)
        await d.step()
        assert len(d.seen) > before
    assert d.seen == texts


async def test_absorbing_an_earlier_record_closes_both_taps(store):
    a, b, old = await store.peer("a"), await store.peer("b"), await store.peer("old")
    await store.send(a, old, "waiting for old")
    d_b, d_old = Delivery(store, b), Delivery(store, old)
    await d_b.step()
    await d_old.step()
    assert d_b.tap.open and d_old.tap.open
    await store.absorb_peer(old.id, b.id)
    assert not d_b.tap.open and not d_old.tap.open
    # a replay (cursor reset) after the merge, as the broker does: the moved message comes back
    d_b.backlog.restart()
    await d_b.step()
    assert "waiting for old" in d_b.seen


async def test_a_tap_follows_its_session_to_another_record(store):
    """The delivery task reads for the session's new record: its tap leaves the old one."""
    a, b, c = await store.peer("a"), await store.peer("b"), await store.peer("c")
    d = Delivery(store, b)
    await d.step()
    d.session = c
    await d.step()
    assert d.tap.peer_id == c.id and store.taps.get(b.id) is None
    await store.send(a, b, "to the old record")
    await store.send(a, c, "to the new record")
    assert [m.text for _, m in held(d.tap, c)] == ["to the new record"]


async def test_a_later_tap_for_the_same_record_replaces_the_earlier(store):
    a, b = await store.peer("a"), await store.peer("b")
    first, second = Delivery(store, b), Delivery(store, b)
    await first.step()
    await second.step()
    assert second.tap.open and not first.tap.open
    await store.send(a, b, "x")
    assert first.tap.take(b.id) is None and len(held(second.tap, b)) == 1


async def test_the_delivery_read_is_one_index_range_in_order(store):
    """The read behind every delivery must not sort or scan the session's whole backlog."""
    a, b = await store.peer("a"), await store.peer("b")
    await store.send(a, b, "x")
    executed: list[tuple[str, tuple]] = []

    def trace(cursor, sql, bindings):
        executed.append((sql, tuple(bindings or ())))
        return True

    def traced_read() -> str:
        conn = store.runner.store.conn
        conn.exec_trace = trace
        store.runner.store.queued(b.id, after_seq=0, limit=10)
        conn.exec_trace = None
        (sql, bindings), = executed
        return " | ".join(row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, bindings))

    plan = await store.runner.run(traced_read)
    assert "receipts_unacked (peer_id=? AND rowid>?)" in plan, plan
    assert "TEMP B-TREE" not in plan, plan


async def test_a_tap_whose_connection_ended_holds_nothing_and_is_dropped(store):
    a, b = await store.peer("a"), await store.peer("b")
    d = Delivery(store, b)
    await d.step()
    await store.send(a, b, "pushed before the end")
    d.backlog.close()  # what the delivery task does when its connection ends
    await store.send(a, b, "after the end")
    assert b.id not in store.taps and d.tap.take(b.id) is None
    assert await store.texts_in_db(b) == ["pushed before the end", "after the end"]


def test_a_take_racing_the_store_thread_is_all_or_nothing():
    """The store's thread appends to the tap (and clears it when full) while the event loop
    drains it: a take never fails half-way and never returns a torn batch. Run with a thread
    switch forced every microsecond, where a check-then-popleft loses the race."""
    tap = DeliveryTap()
    tap.reopen("p")
    stop = threading.Event()
    failures: list[BaseException] = []

    def store_thread() -> None:
        seq = 0
        try:
            while not stop.is_set():
                seq += 1
                if not tap.append(seq, _message(str(seq))):  # full: closed and cleared; a new read reopens it
                    tap.reopen("p")
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failures.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    thread = threading.Thread(target=store_thread)
    thread.start()
    try:
        last, batches = 0, 0
        while batches < 5_000:
            batch = tap.take("p")
            if not batch:
                continue
            batches += 1
            seqs = [seq for seq, _ in batch]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "a torn batch"
            assert seqs[0] > last, "a message taken twice"
            assert all(message.id == str(seq) for seq, message in batch)
            last = seqs[-1]
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
    assert not failures


def _message(message_id: str) -> Message:
    return Message(message_id, Author("a", "a", "claude"), "p", "p", "x", 1, None, "message", 0)
