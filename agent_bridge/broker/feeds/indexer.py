"""The search index, kept a moment behind the store: messages are indexed after their commit, in
batches (schema V_INDEX_LATER, Store.index_messages), not inside every send's transaction, where
the index's segment written at each commit doubled the cost of a send. A search looks through what
the index has not reached yet as well (store.search.UNINDEXED), so this task only keeps that rest
short: after commits, at most one pass per GAP, each indexing everything new in batches of BATCH
on the store's thread. The first pass, at the broker's start, indexes what a previous broker left.
Its commits do not move the commit feed (StoreRunner.run_unseen): what any reader sees, search
results included, is the same before and after them, so nobody following the feed (the post
box, the waiters, the dashboard's live stream, this task) has anything to look at again.

Without the commit feed (a broker with no dashboard) the pass runs every POLL seconds.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from agent_bridge.store.feed import ChangeFeed, Following

log = logging.getLogger("agent_bridge.broker")

GAP = 0.2  # seconds at least between two passes: under a stream of sends, one batch per GAP
POLL = 0.5  # seconds between passes when no commit feed runs
BATCH = 500  # messages indexed in one transaction (a few ms on the store's thread)


class Indexer:
    """The pass that brings the messages' search index up to the store."""

    def __init__(self, index: Callable[[int], Awaitable[int]], feed: Callable[[], ChangeFeed | None]) -> None:
        self.index = index  # index up to n messages not indexed yet; how many it did (one transaction)
        self.feed = feed  # the store's commit feed, or None
        self.indexed = 0  # messages indexed by this broker

    async def run(self) -> None:
        """Index what is new after each burst of commits. Lives in the serving nursery."""
        with Following(self.feed(), POLL) as commits:
            await commits.passes(self.catch_up, GAP, "search index: could not index new messages", log)

    async def catch_up(self) -> None:
        """Index everything not indexed yet, BATCH at a time."""
        while True:
            done = await self.index(BATCH)
            self.indexed += done
            if done < BATCH:
                return


def for_broker(broker: Any) -> Indexer:
    """The broker's indexer (`broker`: broker.state.Broker)."""
    return Indexer(broker.db.index_messages, lambda: broker.changes)
