"""The post box the PostToolUse hook looks at first: `<home>/pending/<digest>`, one empty file per
host session that has an unacknowledged message below the hop maximum (what the hook would find
in bridge.db with `reader.active_waiting`), and `<home>/pending/ready` once a broker keeps them.

The hook runs after every tool call of every session, and a look at one file costs next to nothing
where opening bridge.db costs a SQLite library (SPEC §9: the hook with nothing waiting). So the
broker keeps the files current: after each store commit one pass asks the store, in one query,
which host sessions have such a message, and adds and removes files to match (at most one pass
per GAP). A send adds its recipients' files before it answers (`add`), so a message its sender
saw sent is in the post box. A file that is there without a message only costs that hook its full
look; one missing (a commit the pass has not reached yet: an owner's answer, a job's end) leaves
the message to the next hook, at the next tool call or the Stop.

Without the commit feed (a broker with no dashboard) the pass runs every POLL seconds.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from agent_bridge.common import paths
from agent_bridge.store.feed import ChangeFeed, Following

log = logging.getLogger("agent_bridge.broker")

POLL = 0.5  # seconds between passes when no commit feed runs
GAP = 0.2  # seconds at least between two passes: under a stream of commits, five queries a second
DIGESTS_KEPT = 4096  # host sessions whose file name `add` remembers (then it starts over)


def changes(present: set[str], wanted: set[str]) -> tuple[set[str], set[str]]:
    """(files to add, files to remove), by digest."""
    return wanted - present, present - wanted


class Pending:
    """The post box of one home folder, and the pass that keeps it current."""

    def __init__(self, home: Path, find: Callable[[], Awaitable[set[str]]],
                 feed: Callable[[], ChangeFeed | None]) -> None:
        self.folder = home / paths.PENDING_DIR
        self.find = find  # host session ids with a message a hook may hand over (one query)
        self.feed = feed  # the store's commit feed, or None
        self.present: set[str] = set()  # digests whose file this broker knows is there
        self.passes = 0
        self._lock = trio.Lock()  # one pass at a time: the background one or a send's
        self._digests: dict[str, str] = {}  # host session id -> its file's name

    async def run(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Make the post box current (the files a previous broker left are checked too), say
        `ready`, then follow the commits. Lives in the serving nursery."""
        await trio.to_thread.run_sync(self._start)
        await self.settle()
        await trio.to_thread.run_sync(self._ready)
        task_status.started()
        with Following(self.feed(), POLL) as commits:
            await commits.passes(self.settle, GAP, "post box: could not bring it up to date", log)

    async def settle(self) -> None:
        """One pass: ask the store, then add and remove files to match."""
        async with self._lock:
            self.passes += 1
            wanted = {paths.host_session_digest(h) for h in await self.find()}
            add, remove = changes(self.present, wanted)
            if add or remove:
                await trio.to_thread.run_sync(self._apply, add, remove)

    async def add(self, host_session_ids: set[str]) -> None:
        """Files for these host sessions, now (a send's recipients, a job's parent): the next
        pass removes any that has nothing waiting after all. With no pass under way and every
        file there, nothing to do and nothing to wait for (the common case: a send to a session
        with a message waiting already). Called once the message is committed: a file that
        cannot be written is logged and left to the next pass, never an error for the request
        whose message is stored (its sender would send it again)."""
        if self.has_all(host_session_ids):
            return  # no pass can remove one before this send is answered: one would start after
        digests = {self._digest(h) for h in host_session_ids}
        async with self._lock:
            add = digests - self.present
            if add:
                try:
                    await trio.to_thread.run_sync(self._apply, add, set())
                except OSError as exc:
                    log.warning("post box: could not add a file (the next pass tries again): %s", exc)

    def has_all(self, host_session_ids: set[str]) -> bool:
        """Whether `add` of these would do nothing: no pass under way and every file there (the
        common case: a send to a session with a message waiting already). Checked before `add`
        without a trip through the scheduler."""
        return not self._lock.locked() and all(self._digest(h) in self.present for h in host_session_ids)

    def _digest(self, host_session_id: str) -> str:
        """paths.host_session_digest, remembered (a SHA-256 per recipient of every send)."""
        digest = self._digests.get(host_session_id)
        if digest is None:
            if len(self._digests) >= DIGESTS_KEPT:
                self._digests.clear()
            digest = self._digests[host_session_id] = paths.host_session_digest(host_session_id)
        return digest

    def _start(self) -> None:
        self.folder.mkdir(mode=0o700, exist_ok=True)
        (self.folder / paths.PENDING_READY).unlink(missing_ok=True)  # until this broker's first pass
        self.present = {entry.name for entry in os.scandir(self.folder) if entry.name != paths.PENDING_READY}

    def _ready(self) -> None:
        (self.folder / paths.PENDING_READY).touch(mode=0o600)

    def _apply(self, add: set[str], remove: set[str]) -> None:
        for digest in add:
            (self.folder / digest).touch(mode=0o600)
            self.present.add(digest)
        for digest in remove:
            (self.folder / digest).unlink(missing_ok=True)
            self.present.discard(digest)


def for_broker(broker: Any) -> Pending:
    """The broker's post box (`broker`: broker.state.Broker)."""
    from agent_bridge.common import domain

    async def find() -> set[str]:
        found: set[str] = await broker.db.host_sessions_waiting(domain.HOP_MAX)
        return found

    return Pending(broker.home, find, lambda: broker.changes)
