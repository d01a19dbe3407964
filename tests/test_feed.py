"""The store's commit feed and its followers (store/feed.py): one way to follow it, for the
dashboard, the wake waiters, the post box, the alerts and the waits of `sent` and `ask_owner`."""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing

from agent_bridge.store.feed import ChangeFeed, Following


async def test_a_follower_counts_as_a_listener_while_it_follows() -> None:
    feed = ChangeFeed()
    assert feed.listeners == 0
    with Following(feed, 1.0):
        with Following(feed, 1.0):
            assert feed.listeners == 2
        assert feed.listeners == 1
    assert feed.listeners == 0


async def test_a_commit_during_the_read_is_not_missed() -> None:
    feed = ChangeFeed()
    with trio.fail_after(5), Following(feed, 1.0) as commits:
        seen = commits.seen()
        feed.notify()  # committed while the follower read
        await commits.beyond(seen)  # returns at once
        assert commits.seen() == seen + 1


async def test_beyond_waits_for_the_next_commit(autojump_clock: trio.testing.MockClock) -> None:
    feed = ChangeFeed()
    woke: list[float] = []

    async def follow() -> None:
        with Following(feed, 1.0) as commits:
            await commits.beyond(commits.seen())
            woke.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(follow)
        await trio.sleep(30)
        assert woke == []  # no commit, no wake: a feed is never polled
        feed.notify()
    assert woke == [30]


async def test_beyond_gives_up_after_within(autojump_clock: trio.testing.MockClock) -> None:
    with Following(ChangeFeed(), 1.0) as commits:
        start = trio.current_time()
        await commits.beyond(commits.seen(), within=7)
        assert trio.current_time() - start == 7


async def test_without_a_feed_it_looks_again_every_poll(autojump_clock: trio.testing.MockClock) -> None:
    with Following(None, 0.5) as commits:
        start = trio.current_time()
        await commits.beyond(commits.seen())
        assert trio.current_time() - start == 0.5
        await commits.beyond(commits.seen(), within=0.1)  # a deadline sooner than the poll
        assert trio.current_time() - start == pytest.approx(0.6)


async def test_passes_run_after_each_burst_of_commits_gap_apart_and_a_failed_one_again_after_poll(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The paced loop of the post box and the search indexer (Following.passes): a pass at the
    start, one after a burst of commits (not one per commit) no sooner than `gap` after the last,
    none without a commit; a pass that raises is logged and run again `poll` seconds later."""
    feed = ChangeFeed()
    runs: list[float] = []
    fail = [True]

    async def one_pass() -> None:
        runs.append(trio.current_time())
        if fail[0]:
            fail[0] = False
            raise OSError("disk full")

    async with trio.open_nursery() as nursery:
        following = Following(feed, 1.0)
        with following:
            nursery.start_soon(following.passes, one_pass, 0.2, "the pass failed", logging.getLogger("t"))
            await trio.sleep(0.01)
            assert runs == [0.0]  # the first pass, failed
            await trio.sleep(1.0)
            assert runs == [0.0, 1.0]  # again after poll, with no commit
            for _ in range(5):
                feed.notify()
            await trio.sleep(5.0)
            assert runs == [0.0, 1.0, 1.2]  # one pass for the burst, gap after the last pass
            await trio.sleep(10.0)
            assert len(runs) == 3  # nothing without a commit
            nursery.cancel_scope.cancel()
    assert any("the pass failed: disk full" in r.getMessage() for r in caplog.records)
