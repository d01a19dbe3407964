"""The store's commit feed: a version number that grows with every commit that changed rows, and
the tasks that follow it.

The broker keeps one `ChangeFeed` (broker.root), poked by the store's worker thread after each
job that changed rows (`StoreRunner.on_change`); every task that acts on commits follows that
one feed: the dashboard's live stream, the wake waiters, the post box, the owner's alerts, a
`sent` or `ask_owner` that waits. Each follows it the same way (`Following`): counted as a
listener while it follows (the store pokes the feed only while someone listens), it notes the
version before it reads and waits for the version to move past it, so a commit made during its
read is never missed. A standalone dashboard feeds its own from SQLite's `data_version`
(dashboard/changes.py). The feed carries no data: a follower reads again.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import NoReturn

import trio


class ChangeFeed:
    """A change counter that streams wait on. Lives on one Trio loop; `poke` is its only entry
    from other threads."""

    def __init__(self) -> None:
        self.version = 0
        self.listeners = 0  # open streams; the store pokes only while someone listens
        # set for the tasks waiting in wait_beyond; made only when one waits, so a commit that
        # nobody waits for (the followers pausing between passes) costs a counter increment
        self._changed: trio.Event | None = None
        self._token: trio.lowlevel.TrioToken | None = None  # the loop `poke` reaches; set by `bind`
        self._loop_thread: int | None = None  # the thread that runs that loop
        self._poke_pending = False

    def bind(self) -> None:
        """Attach the feed to the running Trio loop, so other threads can `poke` it."""
        self._token = trio.lowlevel.current_trio_token()
        self._loop_thread = threading.get_ident()

    def notify(self) -> None:
        """Something changed (call on the feed's loop)."""
        self.version += 1
        changed = self._changed
        if changed is not None:
            self._changed = None
            changed.set()

    def poke(self) -> None:
        """`notify` from any thread (the store's worker). Coalesced: while one wake-up is on its
        way to the loop, further pokes add nothing, and a change committed before that wake-up
        runs is covered by it. On the loop's own thread (a commit the loop made itself,
        broker.storage.StoreRunner.run_short), `notify` at once: handing it to the loop through
        `run_sync_soon` would wake the loop's wake-up socket and run one more batch of the loop for
        every commit (a fifth of the broker's work per message, bench_message_throughput)."""
        token = self._token
        if token is None or not self.listeners:
            return
        if threading.get_ident() == self._loop_thread:
            self.notify()
            return
        if self._poke_pending:
            return
        self._poke_pending = True
        try:
            token.run_sync_soon(self._fire)
        except trio.RunFinishedError:
            pass  # the loop is gone, and so is everyone who listened

    def _fire(self) -> None:
        self._poke_pending = False
        self.notify()

    async def wait_beyond(self, seen: int) -> int:
        """Return the version once it differs from `seen`."""
        while self.version == seen:
            if self._changed is None:
                self._changed = trio.Event()
            await self._changed.wait()
        return self.version


class Following:
    """One task following `feed` from `with` to its end; where there is no feed (a store without
    one, in tests), it looks again every `poll` seconds instead."""

    def __init__(self, feed: ChangeFeed | None, poll: float) -> None:
        self.feed = feed
        self.poll = poll

    def __enter__(self) -> Following:
        if self.feed is not None:
            self.feed.listeners += 1  # the store pokes the feed only while someone listens
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.feed is not None:
            self.feed.listeners -= 1

    def seen(self) -> int:
        """The version now: note it before a read, then wait beyond it."""
        return 0 if self.feed is None else self.feed.version

    async def passes(self, one_pass: Callable[[], Awaitable[object]], gap: float, what: str,
                     log: logging.Logger) -> NoReturn:
        """Run `one_pass` now and again after each burst of commits, at least `gap` seconds
        apart (with no feed, every `poll` seconds). A pass that fails is logged with `what` and
        tried again `poll` seconds later: the next pass repairs what it left."""
        while True:
            seen = self.seen()
            try:
                await one_pass()
            except Exception as exc:  # noqa: BLE001 - a store or folder that fails now: look again
                log.warning("%s: %s", what, exc)
                await trio.sleep(self.poll)
                continue
            if self.feed is not None:
                await trio.sleep(gap)
            await self.beyond(seen)

    async def beyond(self, seen: int, within: float = math.inf) -> None:
        """Return once a commit came after `seen` (at once if one did already), or after
        `within` seconds; with no feed, after `poll` seconds (or `within`, if sooner)."""
        if self.feed is None:
            await trio.sleep(min(self.poll, within))
            return
        with trio.move_on_after(within):
            await self.feed.wait_beyond(seen)
