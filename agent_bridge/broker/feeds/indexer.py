"""The search index, kept a moment behind the store: messages are indexed after their commit, in
batches (schema V_INDEX_LATER, Store.index_messages), not inside every send's transaction, where
the index's segment written at each commit doubled the cost of a send. A search looks through what
the index has not reached yet as well (store.search.UNINDEXED), so this task only keeps that rest
short: after commits, at most one pass per GAP, each indexing everything new in batches of BATCH
on the store's thread. The first pass, at the broker's start, indexes what a previous broker left.
Its commits do not move the commit feed (StoreRunner.run_unseen): what any reader sees, search
results included, is the same before and after them, so nobody following the feed (the post
box, the waiters, the dashboard's live stream, this task) has anything to look at again.

A pass after the first waits for a quiet moment: QUIET seconds with no commit, or MAX_WAIT at
most. While a batch runs on the store's thread, the sends and acknowledgements that come meanwhile
queue behind it there instead of committing on the loop; under a steady stream of sends that cost
the broker 5 % of its rate (docs/performance.md). Waiting moves that work to the pauses that
sessions leave, and under a stream with none, bounds what the index has not reached (and what a
search looks through besides it) to MAX_WAIT of it.

Without the commit feed (a broker with no dashboard) the pass runs every POLL seconds.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from agent_bridge.store.feed import ChangeFeed, Following

log = logging.getLogger("agent_bridge.broker")

GAP = 0.2  # seconds at least between two passes: under a stream of sends, one batch per GAP
POLL = 0.5  # seconds between passes when no commit feed runs
BATCH = 500  # messages indexed in one transaction (a few ms on the store's thread)
QUIET = 0.02  # seconds with no commit before a pass
MAX_WAIT = 1.0  # seconds a pass waits for those at most


class Indexer:
    """The pass that brings the messages' search index up to the store."""

    def __init__(self, index: Callable[[int], Awaitable[int]], feed: Callable[[], ChangeFeed | None]) -> None:
        self.index = index  # index up to n messages not indexed yet; how many it did (one transaction)
        self.feed = feed  # the store's commit feed, or None
        self.indexed = 0  # messages indexed by this broker
        self.started = False  # the first pass began

    async def run(self) -> None:
        """Index what is new after each burst of commits. Lives in the serving nursery."""
        with Following(self.feed(), POLL) as commits:

            async def one_pass() -> None:
                if self.started:  # the first pass indexes what a previous broker left, at once
                    await quiet(commits)
                self.started = True
                await self.catch_up()

            await commits.passes(one_pass, GAP, "search index: could not index new messages", log)

    async def catch_up(self) -> None:
        """Index everything not indexed yet, BATCH at a time."""
        while True:
            done = await self.index(BATCH)
            self.indexed += done
            if done < BATCH:
                return


async def quiet(commits: Following) -> None:
    """Until QUIET seconds went by with no commit, or MAX_WAIT in all (at once with no feed).
    Sleeps, not a wake per commit: under a stream of sends, the loop is woken QUIET apart."""
    if commits.feed is None:
        return
    give_up = trio.current_time() + MAX_WAIT
    while trio.current_time() < give_up:
        seen = commits.seen()
        await trio.sleep(QUIET)
        if commits.seen() == seen:
            return


def for_broker(broker: Any) -> Indexer:
    """The broker's indexer (`broker`: broker.state.Broker)."""
    return Indexer(broker.db.index_messages, lambda: broker.changes)
