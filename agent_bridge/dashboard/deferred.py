"""The broker's dashboard (SPEC §6): listening, with `dashboard.url` published, before the broker
says it is ready; Quart and Hypercorn imported only once the dashboard is wanted.

Those imports are 150-230 ms of CPU, about a third of a broker's start, and a restarted broker's
sessions wait for its broker.json. Listening first keeps what SPEC §2 promises: the URL in
broker.json and dashboard.url answers, and a port in use still refuses `up`. A browser that
connects before the server is up waits in the listen backlog until it is.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import trio

from agent_bridge.dashboard import port as ports
from agent_bridge.dashboard.waits import first_of

if TYPE_CHECKING:
    from agent_bridge.dashboard.state import Hub
    from agent_bridge.store.feed import ChangeFeed

SERVER = "agent_bridge.dashboard.server"  # Quart and Hypercorn


async def serve_dashboard(
    home: Path,
    *,
    live: Callable[[], Collection[str]],
    changes: ChangeFeed | None,
    port: int | None,
    hub: Hub,
    settled: trio.Event,
    importing: trio.CapacityLimiter,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen on loopback and publish dashboard.url (`port.listen`; DashboardError before
    `started`), report the base URL, then serve (`server.serve_listening`) from the moment a
    connection waits to be accepted or `settled` is set (the broker's sessions stopped joining),
    whichever comes first, until cancelled. The server is imported on a thread, under
    `importing` (one import at a time: two threads importing packages that import each other
    can deadlock), so the event loop keeps serving the sessions meanwhile."""
    listening = ports.listen(home, port)
    try:
        task_status.started(listening.base_url)
        await first_of(settled.wait, partial(trio.lowlevel.wait_readable, listening.sock))
        server: ModuleType = await trio.to_thread.run_sync(
            importlib.import_module, SERVER, limiter=importing, abandon_on_cancel=True
        )
        await server.serve_listening(listening, home, live=live, changes=changes, hub=hub)
    finally:
        listening.close()
