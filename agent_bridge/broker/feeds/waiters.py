"""The wake waiters' `wait_active` requests (SPEC §3 "Reach", idle), answered together: after
each store commit one pass asks the store, in one query, which of the waiting sessions now have
an unacknowledged active message, and wakes only their waiters. With 200 idle sessions each
holding a waiter, a `send` costs one query and wakes one waiter (it used to wake all 200, each
querying for itself).

A waiter first looks for itself (a message may wait already), then joins the pass. A commit
between its look and its joining is not missed: it looks again while the commit counter moved
during its look, and the pass notes the counter before it reads. Without the commit feed (a
broker with no dashboard) the pass runs every WAIT_POLL seconds instead.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

import trio

from agent_bridge.broker.state import Broker
from agent_bridge.store.feed import ChangeFeed, Following

log = logging.getLogger("agent_bridge.broker")

WAIT_POLL = 0.5  # seconds between passes when no commit feed runs


class Waiters:
    """Sessions' waiters, by session id, and the pass that wakes them."""

    def __init__(self, find: Callable[[Sequence[str]], Awaitable[set[str]]],
                 feed: Callable[[], ChangeFeed | None]) -> None:
        self.find = find  # which of these sessions have an active message waiting (one query)
        self.feed = feed  # the store's commit feed, or None
        self.waiting: dict[str, set[trio.Event]] = {}
        self.passes = 0  # passes run (each one query)
        self._someone = trio.Event()  # set when a waiter joins an empty pass

    def held(self) -> int:
        return sum(len(events) for events in self.waiting.values())

    async def run(self) -> None:
        """Run the passes while anyone waits; sleep otherwise. Lives in the serving nursery."""
        while True:
            await self._someone.wait()
            with Following(self.feed(), WAIT_POLL) as commits:
                while self.waiting:
                    seen = commits.seen()
                    try:
                        await self._pass()
                    except Exception as exc:  # noqa: BLE001 - a store that cannot answer now: look again
                        log.warning("wake waiters: could not look for active messages: %s", exc)
                        await trio.sleep(WAIT_POLL)
                        continue
                    await commits.beyond(seen)
            self._someone = trio.Event()

    async def _pass(self) -> None:
        sessions = list(self.waiting)
        if not sessions:
            return
        self.passes += 1
        for session in await self.find(sessions):
            for event in self.waiting.get(session, ()):
                event.set()

    async def wait(self, session: str, seconds: float) -> bool:
        """Whether an active message waits for `session` now or comes within `seconds`."""
        feed = self.feed()
        with Following(feed, WAIT_POLL) as commits, trio.move_on_after(seconds):
            while True:
                seen = commits.seen()
                if session in await self.find([session]):
                    return True
                if feed is None or commits.seen() == seen:
                    break  # no commit during the look: the pass sees every later one
            event = trio.Event()
            self.waiting.setdefault(session, set()).add(event)
            self._someone.set()
            try:
                await event.wait()
                return True
            finally:
                events = self.waiting.get(session)
                if events is not None:
                    events.discard(event)
                    if not events:
                        del self.waiting[session]
        return False


def for_broker(broker: Broker) -> Waiters:
    """The broker's waiters: a session counts when it has an active message its connected MCP
    server is not showing right now (that one acknowledges it; a hook must not show it again)."""

    async def find(sessions: Sequence[str]) -> set[str]:
        found = await broker.db.active_unacked_of(sessions, broker.settings.hop_limit)
        return {s for s, ids in found.items() if set(ids) - broker.registry.showing_now(s)}

    return Waiters(find, lambda: broker.changes)
