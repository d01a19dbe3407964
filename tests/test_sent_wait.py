"""`sent(wait_seconds)` waits on the store's commits and on the moment a requested wake turns
unconfirmed, never by looking again and again (SPEC §3 "Receipts for the sender"). The broker's
handler's waiting part (`ops_messages.until_changed`) on a real store and a real change feed, on
Trio's autojump clock: the broker's clock (`now_ms`) follows it, so 20 s pass in no time, and the
test sees exactly when the call returns. The whole tool runs through MCP in
tests/test_conversations.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from agent_bridge.broker.ops import messages as ops_messages
from agent_bridge.common import domain
from agent_bridge.store.feed import ChangeFeed
from agent_bridge.store.messages import Outgoing
from agent_bridge.store.writer import Store

EPOCH = 1_800_000_000_000  # the broker's clock at trio time 0


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    store = Store.open(tmp_path / "bridge.db")
    a = store.create_peer(agent="claude", name="a", project="/w", kind="interactive", host_session_id=None,
                          now=1)
    b = store.create_peer(agent="codex", name="b", project="/w", kind="interactive", host_session_id="hs",
                          now=1)
    (message,) = store.send_messages(a.id, [Outgoing(b.id, "hi", 1, None)], now=EPOCH)
    feed = ChangeFeed()

    async def sent(peer_id: str, ids: list[str] | None, limit: int) -> Any:
        return store.sent(peer_id, ids, limit)  # on the loop: this test has no store thread

    # the broker's clock, as Trio's (the autojump clock, from 0)
    monkeypatch.setattr(ops_messages, "now_ms", lambda: EPOCH + int(trio.current_time() * 1000))
    broker = SimpleNamespace(changes=feed, db=SimpleNamespace(sent=sent))
    yield SimpleNamespace(store=store, broker=broker, feed=feed, a=a.id, b=b.id, mid=message.id)
    store.close()


async def wait(world: Any, seconds: float) -> tuple[float, list[Any]]:
    found = world.store.sent(world.a, [world.mid], 20)
    start = trio.current_time()
    caller = SimpleNamespace(id=world.a)
    out = await ops_messages.until_changed(world.broker, caller, found, world.feed.version, seconds)
    return trio.current_time() - start, out


async def test_it_returns_when_a_requested_wake_turns_unconfirmed(world: Any, autojump_clock: Any) -> None:
    world.store.offer(world.b, [world.mid], now=EPOCH + 1_000, wake=True)  # requested at 1 s
    took, (r,) = await wait(world, 50)
    assert took == pytest.approx(21, abs=0.01)  # not a moment before: no polling, no early wake-up
    assert r.woken(EPOCH + 21_000) == domain.UNCONFIRMED


async def test_it_returns_at_the_first_commit_that_changes_a_message(world: Any, autojump_clock: Any) -> None:
    async def acknowledge_later() -> None:
        await trio.sleep(7)
        world.feed.notify()  # a commit that changes nothing of it: it goes on waiting
        await trio.sleep(1)
        world.store.ack(world.b, [world.mid], now=EPOCH + 8_000)
        world.feed.notify()  # what the store does after each commit

    async with trio.open_nursery() as nursery:
        nursery.start_soon(acknowledge_later)
        took, (r,) = await wait(world, 50)
    assert took == pytest.approx(8, abs=0.01) and r.state == domain.ACKNOWLEDGED


async def test_nothing_changes_it_returns_when_the_time_is_up(world: Any, autojump_clock: Any) -> None:
    took, (r,) = await wait(world, 12.5)
    assert took == pytest.approx(12.5, abs=0.01) and r.state == domain.QUEUED
