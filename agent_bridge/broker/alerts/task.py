"""The owner's desktop alerts (SPEC §4.6 "The owner is told"): one task in the broker's serving
nursery, started unless `alerts = false` in config.toml. After store commits it reads what may
alert from bridge.db on a read-only connection (store.alert_queries, on a worker thread), asks
the alerts machine (core.alerts) what to say, and shows that as desktop notifications
(broker.alerts.desktop). It also wakes when the machine's next reminder is due.

It follows commits like the wake waiters (broker.feeds.waiters): through the store's commit feed,
counted as a listener, or every POLL seconds without one. Reads are at least GAP apart, so a
burst of commits costs one read, and their alerts arrive together (one counting alert for many
of a kind). A read that fails is logged and tried again; nothing here can stop the broker.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from agent_bridge.common.rows import Cursor, Snapshot
from agent_bridge.core.alerts import AlertMachine
from agent_bridge.store import alert_queries, reader
from agent_bridge.store.feed import ChangeFeed, Following
from agent_bridge.store.ids import now_ms

log = logging.getLogger("agent_bridge.broker")

GAP = 1.0  # seconds at least between two reads: alerts need no millisecond latency
POLL = 2.0  # seconds between reads when no commit feed runs (a broker with no dashboard)


def read_snapshot(db: Path, since: Cursor | None) -> Snapshot:
    with reader.reading(db) as conn:
        if conn is None:
            return Snapshot(since or Cursor(), (), ())
        return alert_queries.snapshot(conn, since)


class _Reads:
    """The snapshots; a failure is logged once until a read works again."""

    def __init__(self, read: Callable[[Cursor | None], Awaitable[Snapshot]]) -> None:
        self.read = read
        self.failing = False

    async def snapshot(self, since: Cursor | None) -> Snapshot | None:
        try:
            snapshot = await self.read(since)
        except Exception as exc:  # noqa: BLE001 - the broker goes on; alerts wait for a read that works
            if not self.failing:
                log.warning("alerts: could not read bridge.db (%s); trying again after each change", exc)
            self.failing = True
            return None
        if self.failing:
            log.info("alerts: bridge.db can be read again")
            self.failing = False
        return snapshot


async def serve_alerts(
    db: Path,
    feed: Callable[[], ChangeFeed | None],
    show: Callable[[str, str], Awaitable[bool]],
    *,
    clock: Callable[[], int] = now_ms,
    read: Callable[[Cursor | None], Awaitable[Snapshot]] | None = None,
    task_status: trio.TaskStatus[AlertMachine] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Alert the owner until cancelled. Started once the first snapshot is read: whatever is
    committed after `start` returns is new. `read`: how a snapshot is read (by default
    `read_snapshot` on a worker thread; a test with a mock clock reads on the loop)."""

    async def on_a_thread(since: Cursor | None) -> Snapshot:
        return await trio.to_thread.run_sync(read_snapshot, db, since)

    machine, reads = AlertMachine(), _Reads(read or on_a_thread)
    first = await reads.snapshot(None)
    task_status.started(machine)
    while first is None:  # the broker does not wait for this: alerts start once bridge.db reads
        await trio.sleep(POLL)
        first = await reads.snapshot(None)
    machine.start(first, clock())
    with Following(feed(), POLL) as commits:
        while True:
            seen = commits.seen()
            snapshot = await reads.snapshot(machine.cursor)
            for alert in machine.feed(snapshot, clock()) if snapshot is not None else ():
                try:
                    await show(alert.title, alert.body)
                except Exception as exc:  # noqa: BLE001 - one lost alert, never a broker down
                    log.warning("alerts: could not show an alert: %s", exc)
            due = machine.next_due()
            await commits.beyond(seen, math.inf if due is None else max(0.0, (due - clock()) / 1000))
            await trio.sleep(GAP)
