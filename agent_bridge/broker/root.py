"""The broker's supervision tree, readable top-down from `run_broker`.

root nursery                    lives as long as the store
 ├─ watch_signals               SIGINT / SIGTERM set `stop`
 ├─ serve_store                 the only writer of bridge.db (migrated before it reports started)
 └─ serving nursery             inside the store's lifetime, as Hypercorn nests its workers;
     │                          the store's commit feed (store/feed.py) made first, for its followers
     ├─ Supervisor.run          the jobs (SPEC §4.7): one task per running job watches its
     │                          process group; adopts the jobs a killed broker left running
     ├─ Waiters.run             the wake waiters: one pass per store commit wakes those whose
     │                          session has an active message waiting
     ├─ Pending.run             the hooks' post box, kept current after store commits
     ├─ Indexer.run             the messages' search index, brought up to the store after commits
     ├─ serve_alerts            the owner's desktop notifications (unless `alerts = false`): after
     │                          store commits, a new question, a job's end, a message to the owner
     ├─ serve_federation        with [federation] in config.toml (SPEC §10): the hub connection on
     │                          an asyncio thread of its own, the outbox published after commits,
     │                          one pull per kind from this machine's consumers, presence
     ├─ serve_unix              the IPC listener (serve_pipe on Windows: ipc_listener); its nursery
     │                          holds one task per connection, and each session connection holds
     │                          its delivery task
     ├─ serve_dashboard         listening on loopback before the broker is ready; the Quart-Trio
     │                          app on Hypercorn once a browser connects or sessions settle
     └─ _settle, _preload_mcp   after ready: sessions stopped joining; the MCP side imported then
`stop` (a signal, or a `shutdown` request from `agent-bridge down`) first interrupts the running
jobs (their ends recorded), then cancels the serving nursery: the connected sessions' last-seen
times are written (one transaction), connections close and the dashboard drains within its grace
period, all while the store is still open;
only then is the root cancelled and the store checkpointed and closed. A `stop` during a slow
start (a migration, its backup) ends the start once the step in progress is done.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from agent_bridge.broker.alerts.desktop import Desktop
from agent_bridge.broker.alerts.task import serve_alerts
from agent_bridge.broker.feeds import indexer, waiters
from agent_bridge.broker.feeds import postbox as pending
from agent_bridge.broker.jobs.supervisor import Supervisor
from agent_bridge.broker.routing import handle_connection
from agent_bridge.broker.state import Broker
from agent_bridge.broker.storage import serve_store
from agent_bridge.common import paths
from agent_bridge.common.config import Settings
from agent_bridge.common.faults import fault_injector
from agent_bridge.dashboard.deferred import serve_dashboard
from agent_bridge.ipc.listener import serve_unix
from agent_bridge.ipc.pipe import serve_pipe
from agent_bridge.store.feed import ChangeFeed

if TYPE_CHECKING:
    from agent_bridge.federation.settings import FederationSettings

log = logging.getLogger("agent_bridge.broker")
MCP_HOST = "agent_bridge.broker.mcp.host"


async def watch_signals(
    stop: trio.Event, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        task_status.started()
        async for signum in signals:
            log.info("received %s; shutting down", signal.Signals(signum).name)
            stop.set()


def ipc_listener(platform: str = sys.platform) -> Callable[..., Awaitable[None]]:
    """The listener for this platform; both are `serve_x(address, handler, *, task_status)`."""
    return serve_pipe if platform == "win32" else serve_unix


async def run_broker(
    home: Path,
    settings: Settings,
    *,
    web_port: int | None = None,
    on_ready: Callable[[dict[str, Any]], None] = lambda record: None,
    federation: FederationSettings | None = None,
) -> None:
    stop = trio.Event()
    record_path = home / paths.BROKER_JSON
    try:
        async with trio.open_nursery() as root:
            await root.start(watch_signals, stop)
            with trio.CancelScope() as starting:
                root.start_soon(_cancel_on, stop, starting)  # Ctrl-C while migrating: stop starting
                fault = fault_injector()  # tests only: AGENT_BRIDGE_FAULT (common/faults.py)
                store = await root.start(
                    partial(serve_store, paths.db_path(home), lambda line: log.info("%s", line), fault=fault)
                )
                broker = Broker(store, settings, home, stop, fault=fault)
                await broker.ingest_reports()
            if not stop.is_set():
                await _serve(broker, home, settings, web_port, stop, on_ready, federation)
            log.info("stopping")
            root.cancel_scope.cancel()  # the store closes last, after everything that writes to it
    finally:
        current = paths.read_broker_json(home)
        if current is not None and current.get("pid") == os.getpid():
            record_path.unlink(missing_ok=True)
        log.info("broker stopped")


async def _cancel_on(stop: trio.Event, scope: trio.CancelScope) -> None:
    await stop.wait()
    scope.cancel()


async def _close_sessions_on(stop: trio.Event, broker: Broker, scope: trio.CancelScope) -> None:
    """At `stop`: every connected session's last-seen time in one transaction (a write per
    connection would keep 200 sessions' broker busy for most of a second), then close them."""
    await stop.wait()
    try:
        if broker.jobs is not None:
            interrupted = await broker.jobs.shut_down()
            if interrupted:
                log.info("interrupted %d running job(s); `job continue` resumes them", interrupted)
        await broker.record_last_seen()
    finally:
        scope.cancel()


async def _serve(
    broker: Broker,
    home: Path,
    settings: Settings,
    web_port: int | None,
    stop: trio.Event,
    on_ready: Callable[[dict[str, Any]], None],
    federation: FederationSettings | None = None,
) -> None:
    """The IPC listener, the dashboard and the commit feed's followers (the federation among
    them when config.toml has [federation]), until `stop`; the store outlives this."""
    settled = trio.Event()  # set once sessions stopped joining after the start (_settle)
    importing = trio.CapacityLimiter(1)  # the heavy imports on threads, one at a time
    async with trio.open_nursery() as serving:
        _commit_feed(broker)
        serving.start_soon(_close_sessions_on, stop, broker, serving.cancel_scope)
        broker.jobs = Supervisor(broker, serving)
        await serving.start(broker.jobs.run)
        # The state folder, checked by ensure_home, may hold the socket as it is; a folder
        # elsewhere is checked by the listener (serve_unix: prepare_socket_path).
        listen = partial(ipc_listener(), state_folder=home)
        broker.socket_path = await serving.start(
            listen, paths.socket_path(home), partial(handle_connection, broker)
        )
        broker.web_url = await serving.start(  # the live stream follows the broker's commit feed
            partial(serve_dashboard, home, live=broker.connected_ids, changes=broker.changes, port=web_port,
                    hub=lambda: None if broker.federation is None else broker.federation.status(),
                    settled=settled, importing=importing)
        )
        broker.waiters = waiters.for_broker(broker)
        serving.start_soon(broker.waiters.run)
        broker.pending = pending.for_broker(broker)
        await serving.start(broker.pending.run)
        serving.start_soon(indexer.for_broker(broker).run)
        if settings.alerts:
            desktop = Desktop()
            await serving.start(serve_alerts, paths.db_path(home), lambda: broker.changes, desktop.show)
        else:
            log.info("alerts: off (alerts = false in config.toml)")
        if federation is not None:  # nats-py, on an asyncio loop of its own thread: this broker only
            from agent_bridge.broker.federation import serve_federation

            await serving.start(serve_federation, broker, federation)
            log.info("federation: machine %s of team %s, hub %s", federation.machine, federation.team,
                     federation.url)
        record = {
            "pid": os.getpid(),
            "socket": broker.socket_path,
            "web": broker.web_url,
            "startedAt": broker.started_at,
            "home": str(home),
            "hopLimit": settings.hop_limit,
        }
        paths.write_private(home / paths.BROKER_JSON, json.dumps(record))
        log.info("broker ready: socket %s, dashboard %s", broker.socket_path, broker.web_url)
        on_ready(record)
        serving.start_soon(_settle, broker, settled)
        serving.start_soon(_preload_mcp, settled, importing)


SETTLE_QUIET = 1.0  # seconds without a session joining: the sessions have settled
SETTLE_WAIT_MAX = 10  # ...waited at most this many times


async def _settle(broker: Broker, settled: trio.Event) -> None:
    """Set `settled` once sessions stop joining after the start (at most ~10 s after it): right
    after a restart, the sessions reconnecting get the CPU before the imports that can wait."""
    for _ in range(SETTLE_WAIT_MAX):
        joined = len(broker.sessions)
        await trio.sleep(SETTLE_QUIET)
        if len(broker.sessions) == joined:
            break
    settled.set()


async def _preload_mcp(settled: trio.Event, importing: trio.CapacityLimiter) -> None:
    """Import the sessions' MCP side (the MCP SDK, pydantic: half a second of CPU) on a thread,
    once sessions have settled. Imported at the first session's connection instead, on the
    event loop, it held that session's `tools/list` and every other session up for that long
    (a relay that connects first imports it itself, as before)."""
    await settled.wait()
    if MCP_HOST in sys.modules:
        return
    try:
        await trio.to_thread.run_sync(
            importlib.import_module, MCP_HOST, limiter=importing, abandon_on_cancel=True
        )
    except Exception as exc:  # noqa: BLE001 - the first session imports it again and says why
        log.warning("could not load the MCP side ahead of the first session: %s", exc)


def _commit_feed(broker: Broker) -> ChangeFeed:
    """The store's commit feed, one for the broker: the store pokes it after each commit that
    changed rows, and every task that acts on commits follows it (store/feed.py)."""
    changes = ChangeFeed()
    changes.bind()
    broker.store.on_change = changes.poke
    broker.changes = changes
    return changes
