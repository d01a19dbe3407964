"""The messages' search index brought up to the store after commits (broker.feeds.indexer, schema
V_INDEX_LATER), on a real bridge.db and the broker's commit feed, with Trio's mock clock: the first
pass indexes what was left unindexed, a commit brings one more pass, which indexes everything new
in batches, and nothing runs without commits. A pass waits for a quiet moment (QUIET with no
commit), and under a stream of commits with none, no longer than MAX_WAIT."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import trio
import trio.testing

from agent_bridge.broker.feeds import indexer
from agent_bridge.store.feed import ChangeFeed
from agent_bridge.store.messages import Outgoing
from agent_bridge.store.search import UNINDEXED
from agent_bridge.store.writer import Store


async def test_new_messages_are_indexed_after_commits_in_batches(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(indexer, "BATCH", 2)
    store = Store.open(tmp_path / "bridge.db")
    a, b = (store.create_peer(agent="claude", name=n, project="/w", kind="interactive", host_session_id=None,
                              now=1) for n in ("a", "b"))
    calls: list[int] = []

    async def index(limit: int) -> int:
        calls.append(limit)
        await trio.lowlevel.checkpoint()
        return store.index_messages(limit)

    def unindexed() -> int:
        return len(store.conn.execute(UNINDEXED).fetchall())

    left = [Outgoing(b.id, f"left by a previous broker {i}", 1, None) for i in range(3)]
    store.send_messages(a.id, left, 2)
    feed = ChangeFeed()
    task = indexer.Indexer(index, lambda: feed)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(task.run)
            await trio.testing.wait_all_tasks_blocked()  # the first pass waits for no quiet moment
            assert unindexed() == 0 and task.indexed == 3 and len(calls) == 2  # 2 + 1
            await trio.sleep(10)
            assert len(calls) == 2  # no commit, no pass
            store.send_messages(a.id, [Outgoing(b.id, f"new {i}", 1, None) for i in range(5)], 3)
            feed.notify()
            await trio.testing.wait_all_tasks_blocked()
            assert unindexed() == 5 and len(calls) == 2  # waiting for QUIET with no commit
            await trio.sleep(2 * indexer.QUIET)
            assert unindexed() == 0 and task.indexed == 8 and len(calls) == 5  # 2 + 2 + 1
            nursery.cancel_scope.cancel()
    finally:
        store.close()


async def test_under_a_stream_of_commits_a_pass_waits_for_a_quiet_moment_up_to_max_wait(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Commits every QUIET/2 (never a quiet moment) for 4 MAX_WAIT: a pass each MAX_WAIT, not
    each GAP, and what is not indexed never grows past MAX_WAIT and GAP of the stream. Once
    the stream stops, a quiet moment later everything is indexed."""
    store = Store.open(tmp_path / "bridge.db")
    a, b = (store.create_peer(agent="claude", name=n, project="/w", kind="interactive", host_session_id=None,
                              now=1) for n in ("a", "b"))
    passes: list[float] = []

    async def index(limit: int) -> int:
        passes.append(trio.current_time())
        await trio.lowlevel.checkpoint()
        return store.index_messages(limit)

    def unindexed() -> int:
        return len(store.conn.execute(UNINDEXED).fetchall())

    feed = ChangeFeed()
    task = indexer.Indexer(index, lambda: feed)
    step = indexer.QUIET / 2
    most = 0
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(task.run)
            await trio.sleep(2 * indexer.QUIET)
            assert len(passes) == 1  # the first pass, at the start: nothing to index
            started = trio.current_time()
            while trio.current_time() < started + 4 * indexer.MAX_WAIT:
                store.send_messages(a.id, [Outgoing(b.id, "one more", 1, None)], 2)
                feed.notify()
                most = max(most, unindexed())
                await trio.sleep(step)
            during = passes[1:]
            assert 3 <= len(during) <= 4, during  # one each MAX_WAIT (and GAP) of it; by GAP alone, 20
            assert all(later - earlier >= indexer.MAX_WAIT for earlier, later in itertools.pairwise(during))
            assert most <= (indexer.MAX_WAIT + indexer.GAP) / step + 2, most
            await trio.sleep(2 * indexer.QUIET)
            assert unindexed() == 0
            nursery.cancel_scope.cancel()
    finally:
        store.close()
