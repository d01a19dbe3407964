"""The dashboard's live stream (`GET /api/events`): server-sent events that say "something
changed", so the page fetches again instead of polling. It carries no data of its own;
`dashboard.changes` explains what feeds it.

Each client address holds at most STREAMS_PER_CLIENT streams; every stream ends when the
dashboard stops taking requests (`closing`), so none holds the shutdown until its deadline.
Standalone (no broker), bridge.db is watched only while a stream is open.
"""

from __future__ import annotations

import json
import logging
import weakref
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path

import trio
from quart import Response, request
from quart_trio import QuartTrio

from agent_bridge.dashboard.changes import watch_database
from agent_bridge.dashboard.state import error
from agent_bridge.dashboard.waits import first_of
from agent_bridge.store.feed import ChangeFeed

STREAMS_PER_CLIENT = 4  # live streams one client address may hold; a browser allows 6 connections per host
HEARTBEAT = 15.0  # seconds between keep-alive comments on an idle stream (finds clients that left)
CHANGE_GAP = 0.5  # at least this long between two change events: a busy broker commits thousands a second
RETRY_MS = 2000  # what the stream asks EventSource to wait before reconnecting
log = logging.getLogger("agent_bridge.dashboard")


class LiveStreams:
    """The change feed, how it is fed (the broker's commits, or a watcher of bridge.db), the
    event that ends the streams, and the streams open now."""

    def __init__(
        self, app: QuartTrio, db: Path, *, mode: str, changes: ChangeFeed | None, closing: trio.Event | None
    ) -> None:
        self.app = app
        self.mode = mode
        self.feed = changes if changes is not None else ChangeFeed()
        self.watcher = _DatabaseWatcher(db, self.feed) if changes is None else None
        self.stopping = closing if closing is not None else trio.Event()
        self.streams: weakref.WeakSet[_EventStream] = weakref.WeakSet()

    async def body(self, stream: _EventStream) -> AsyncIterator[bytes]:
        """The stream's bytes: `hello`, then a change event or a keep-alive comment, until it stops."""
        feed, watcher, stopping = self.feed, self.watcher, self.stopping
        feed.listeners += 1
        try:
            if watcher is not None and not await watcher.ensure_running(self.app):
                return  # no way to see changes: the page falls back to polling
            seen = feed.version
            hello = json.dumps({"version": seen, "mode": self.mode})
            yield f"retry: {RETRY_MS}\nevent: hello\ndata: {hello}\n\n".encode()
            while not stopping.is_set():
                with trio.move_on_after(HEARTBEAT):
                    await first_of(partial(feed.wait_beyond, seen), stopping.wait)
                if stopping.is_set() or (watcher is not None and watcher.failed):
                    return
                if feed.version == seen:
                    yield b": keep-alive\n\n"
                    continue
                seen = feed.version
                yield f"event: change\ndata: {json.dumps({'version': seen})}\n\n".encode()
                with trio.move_on_after(CHANGE_GAP):
                    await stopping.wait()
        finally:
            feed.listeners -= 1
            stream.closed = True


def register(app: QuartTrio, live: LiveStreams) -> None:
    """GET /api/events: the live stream."""

    @app.get("/api/events")
    async def events() -> Response:
        """Server-sent events: `hello` once, then `change` whenever bridge.db changed (at most
        one per CHANGE_GAP), and a keep-alive comment when idle. The stream ends when the
        dashboard stops; a restarted one has a new token, so a reconnect gets 403."""
        client = request.remote_addr or "?"
        if sum(1 for s in live.streams if s.client == client and not s.closed) >= STREAMS_PER_CLIENT:
            return error(
                429,
                f"too many live streams from this client (at most {STREAMS_PER_CLIENT}); "
                "the page polls instead",
            )
        stream = _EventStream(client, live.body)
        live.streams.add(stream)
        response = Response(stream, content_type="text/event-stream; charset=utf-8")
        response.timeout = None  # Quart's RESPONSE_TIMEOUT would cut the stream after a minute
        return response


class _EventStream:
    """One live stream's body. Counted against its client's limit until it is closed, or until
    it is dropped unstarted (a client gone before the body began: `streams` holds it weakly)."""

    def __init__(self, client: str, run: Callable[[_EventStream], AsyncIterator[bytes]]) -> None:
        self.client = client
        self.closed = False
        self._run = run
        self._body: AsyncIterator[bytes] | None = None  # made on first use: no cycle keeps an unstarted one

    def __aiter__(self) -> _EventStream:
        return self

    async def __anext__(self) -> bytes:
        if self.closed:
            raise StopAsyncIteration
        if self._body is None:
            self._body = self._run(self)
        return await self._body.__anext__()

    async def aclose(self) -> None:
        self.closed = True
        if self._body is not None:
            await self._body.aclose()  # type: ignore[attr-defined]


class _DatabaseWatcher:
    """Standalone: runs `watch_database` in the app's nursery while any stream listens."""

    def __init__(self, db: Path, feed: ChangeFeed) -> None:
        self.db = db
        self.feed = feed
        self.running = False
        self.failed = False  # the watcher died: streams end, so their pages poll instead

    async def ensure_running(self, app: QuartTrio) -> bool:
        """Start watching unless it runs already; returns once the watcher read its first state.
        False when it cannot watch."""
        if not self.running:
            self.running, self.failed = True, False
            try:
                await app.nursery.start(self._watch)
            except RuntimeError:  # it failed before it started (and logged why)
                return False
        return not self.failed

    async def _watch(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            await watch_database(self.db, self.feed, task_status=task_status)
        except Exception:  # a background task logs its failure instead of ending the dashboard
            log.exception("watching %s for the live stream failed; pages fall back to polling", self.db)
            self.failed = True
            self.feed.notify()  # wake the streams, so they see it and end
        finally:
            self.running = False
