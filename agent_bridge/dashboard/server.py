"""Serving the dashboard (SPEC §2, §6) with Hypercorn: on a socket `port.listen` opened (bound on
loopback, this start's token, `dashboard.url` published), until cancelled.

`serve_listening` is what the broker runs once the dashboard is wanted (dashboard/deferred.py);
`serve_dashboard` opens and serves at once; `run_dashboard` is the same for `agent-bridge
dashboard`, which also needs the tokenized URL and may run on a home it cannot write to.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Collection
from pathlib import Path

import h11
import hypercorn.protocol.h11
import hypercorn.trio
import hypercorn.trio.tcp_server
import trio
from hypercorn.config import Config, Sockets

from agent_bridge.dashboard import auth
from agent_bridge.dashboard.app import create_app
from agent_bridge.dashboard.port import Listening, listen
from agent_bridge.dashboard.state import Hub
from agent_bridge.store.feed import ChangeFeed

GRACEFUL_TIMEOUT = 2.0  # seconds open requests get to finish once the dashboard is told to stop
SHUTDOWN_MARGIN = 1.0  # on top of that, for Hypercorn's own lifespan shutdown
LOGGER = "agent_bridge.dashboard"  # Hypercorn's error log; no access log: request lines carry ?t=<token>
# Open dashboard connections at once. A person needs a handful (a few tabs, each holding one
# long-lived /api/events stream besides its short requests); past this, a new connection is
# closed as soon as it is accepted, so that nobody, token or not, can hold the broker's file
# descriptors (its IPC listener shares them).
MAX_CONNECTIONS = 64
# seconds a connection with no request in flight stays open (a silent or slow client)
KEEP_ALIVE_TIMEOUT = 5.0

Live = Callable[[], Collection[str]]


async def serve_dashboard(
    home: Path,
    *,
    live: Live | None = None,
    changes: ChangeFeed | None = None,
    port: int | None = None,
    hub: Hub | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the dashboard of `home` until cancelled; `task_status.started(base_url)` once it
    listens and `<home>/dashboard.url` holds this start's tokenized URL.

    `live` returns the ids of the sessions connected right now (None: nothing is, standalone).
    `changes`: the broker's feed of store commits for the live stream (None: the dashboard
    watches bridge.db itself, as standalone). `hub`: the broker's hub connection (SPEC §10),
    None without federation.
    `port`: this port (0 = any free port); None = `AGENT_BRIDGE_WEB_PORT`, else 7878 falling back
    to a free port when taken. Raises DashboardError (before `started`) for a bad port setting,
    a port in use, or a home that cannot take `dashboard.url`.
    """
    await _run(home, live=live, changes=changes, port=port, require_url_file=True, hub=hub,
               started=lambda listening: task_status.started(listening.base_url))


async def run_dashboard(
    home: Path,
    *,
    live: Live | None = None,
    port: int | None = None,
    require_url_file: bool = True,
    task_status: trio.TaskStatus[Listening] = trio.TASK_STATUS_IGNORED,
) -> None:
    """`serve_dashboard`, reporting its `Listening` (with the tokenized URL). With
    `require_url_file=False` a home that cannot take `dashboard.url` (read-only) is reported
    in `Listening.publish_error` instead of raised."""
    await _run(home, live=live, changes=None, port=port, require_url_file=require_url_file,
               started=task_status.started)


async def _run(
    home: Path,
    *,
    live: Live | None,
    changes: ChangeFeed | None,
    port: int | None,
    require_url_file: bool,
    started: Callable[[Listening], None],
    hub: Hub | None = None,
) -> None:
    listening = listen(home, port, require_url_file=require_url_file)
    try:
        await serve_listening(listening, home, live=live, changes=changes, hub=hub,
                              started=lambda: started(listening))
    finally:
        listening.close()


async def serve_listening(
    listening: Listening,
    home: Path,
    *,
    live: Live | None,
    changes: ChangeFeed | None,
    hub: Hub | None = None,
    started: Callable[[], None] = lambda: None,
) -> None:
    """Serve the app on a socket `port.listen` opened, until cancelled: then stop taking requests
    and give the open ones GRACEFUL_TIMEOUT. `started()` once Hypercorn serves. The caller closes
    `listening`."""
    stop = trio.Event()  # also ends the live streams, so they never hold a shutdown
    app = create_app(home, port=listening.port, token=listening.token, live=live, changes=changes,
                     closing=stop, hub=hub)
    # Hypercorn runs shielded from the start: a cancel from outside becomes `stop` (a graceful
    # shutdown) within the deadline the finally below puts on `drain`. Cancelled from outside
    # while it starts, Hypercorn (0.18) fails in its own shutdown: its lifespan task is gone, and
    # telling it to shut down raises ClosedResourceError. Started with start_soon and an event,
    # not nursery.start, which waits for a task started under a cancelled scope to exit.
    drain = trio.CancelScope(shield=True)
    serving = _Started()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_serve_until, drain, app, _config(listening.sock), stop, serving)
        try:
            await serving.event.wait()
            started()
            await trio.sleep_forever()
        finally:
            # Cancelled or failed: stop taking requests, give open ones a deadline.
            stop.set()
            drain.deadline = trio.current_time() + GRACEFUL_TIMEOUT + SHUTDOWN_MARGIN


class _Started:
    """What Hypercorn reports `started` to: an event its caller waits on."""

    def __init__(self) -> None:
        self.event = trio.Event()

    def started(self, value: object = None) -> None:
        self.event.set()


async def _serve_until(
    drain: trio.CancelScope, app: object, config: Config, stop: trio.Event, serving: _Started
) -> None:
    """Hypercorn inside `drain`, until `stop`."""
    with drain:
        await hypercorn.trio.serve(app, config, shutdown_trigger=stop.wait, task_status=serving)  # type: ignore[arg-type]


class _BoundConfig(Config):
    """Hypercorn config serving a socket we bound ourselves: we know the port (for the Host
    guard and the URL) before serving, and choose the fallback. Carries the connection slots
    of this dashboard (`_PolicedTCPServer`)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.connection_slots = trio.CapacityLimiter(MAX_CONNECTIONS)

    def create_sockets(self) -> Sockets:
        return Sockets(secure_sockets=[], insecure_sockets=[self._sock], quic_sockets=[])


class _PolicedTCPServer(hypercorn.trio.tcp_server.TCPServer):
    """Hypercorn's per-connection server with two changes, for our dashboards only:

    - at most MAX_CONNECTIONS at once; one over the cap is closed right away;
    - closing a connection sends the FIN even from a cancelled scope. Hypercorn (0.18) closes a
      connection after a `Connection: close` response from the request's task, whose scope is
      already cancelled by then: `send_eof` raises Cancelled before shutting the socket down and
      `aclose` is never reached, so the connection stayed open as long as the client kept it.

    Installed by `_police_connections`; tests/reliability/test_local_surface.py fails if a
    Hypercorn upgrade moves what this relies on.
    """

    async def run(self) -> None:
        slots = getattr(self.config, "connection_slots", None)
        if slots is None:  # not one of ours
            return await super().run()
        try:
            slots.acquire_nowait()
        except trio.WouldBlock:
            with trio.CancelScope(shield=True):
                await self.stream.aclose()
            return None
        try:
            return await super().run()
        finally:
            slots.release()

    async def _close(self) -> None:
        with trio.CancelScope(shield=True):  # no await in it can block: shutdown(2) and close(2)
            await super()._close()


class _HardenedH11Protocol(hypercorn.protocol.h11.H11Protocol):
    """Hypercorn's HTTP/1.1 protocol, whose own error answers (400 for a malformed request, 431
    for oversized headers: the app never sees those requests) carry our security headers too."""

    async def _send_error_response(self, status_code: int) -> None:
        if not isinstance(self.config, _BoundConfig):  # not one of ours
            return await super()._send_error_response(status_code)
        headers = [(b"content-length", b"0"), (b"connection", b"close")]
        headers += [
            (name.lower().encode("ascii"), value.encode("ascii"))
            for name, value in auth.SECURITY_HEADERS.items()
        ]
        headers += self.config.response_headers("h11")
        await self._send_h11_event(h11.Response(status_code=status_code, headers=headers))
        await self._send_h11_event(h11.EndOfMessage())
        return None


def _police_connections() -> None:
    """Make Hypercorn's trio worker build `_PolicedTCPServer`s and its connections speak
    `_HardenedH11Protocol` (both are named at call time)."""
    import hypercorn.protocol
    import hypercorn.trio.run

    if (
        not hasattr(hypercorn.trio.run, "TCPServer")
        or not hasattr(hypercorn.trio.tcp_server.TCPServer, "_close")
        or not hasattr(hypercorn.protocol, "H11Protocol")
        or not hasattr(hypercorn.protocol.h11.H11Protocol, "_send_error_response")
    ):
        raise RuntimeError("hypercorn no longer builds its connections as dashboard/server.py expects")
    hypercorn.trio.run.TCPServer = _PolicedTCPServer  # type: ignore[misc, unused-ignore]
    hypercorn.protocol.H11Protocol = _HardenedH11Protocol  # type: ignore[misc, unused-ignore]


def _config(sock: socket.socket) -> Config:
    _police_connections()
    config = _BoundConfig(sock)
    config.keep_alive_timeout = KEEP_ALIVE_TIMEOUT
    config.graceful_timeout = GRACEFUL_TIMEOUT
    config.accesslog = None
    config.errorlog = logging.getLogger(LOGGER)
    config.include_server_header = False
    return config
