"""The store inside the broker's nursery: one writing connection, driven from one worker
thread at a time, so SQLite never blocks the Trio loop and is never shared across threads
concurrently."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import apsw
import trio

from agent_bridge.store.writer import Store

T = TypeVar("T")


class StoreRunner:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._limiter = trio.CapacityLimiter(1)

    async def run(self, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run one store method (one transaction) on the worker thread.

        Not abandoned on cancellation: a transaction that started runs to its end.
        """
        return await trio.to_thread.run_sync(functools.partial(method, *args, **kwargs), limiter=self._limiter)


async def serve_store(
    db: Path,
    log: Callable[[str], None],
    *,
    fault: Callable[[str], None] = lambda point: None,
    task_status: trio.TaskStatus[StoreRunner] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Open and migrate the database, report the runner as started, hold it until cancelled,
    then checkpoint and close. `fault`: test-only crash points (daemon.faults)."""
    store = await trio.to_thread.run_sync(functools.partial(Store.open, db, log, fault=fault))
    runner = StoreRunner(store)
    try:
        task_status.started(runner)
        await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            try:
                await runner.run(store.close)
            except (OSError, apsw.Error) as exc:  # committed data is in the WAL: the next open recovers it
                log(f"could not checkpoint {db.name} on shutdown ({exc}); the next start recovers it from the WAL")
