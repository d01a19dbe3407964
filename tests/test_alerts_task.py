"""The broker's alerts task (broker/alerts/task.py) on a real bridge.db, with Trio's mock clock standing in
for the 15 minutes: it alerts after a commit, wakes by itself when a reminder is due and shows it
then (not before), reminds nobody of a question answered meanwhile, and a database it cannot read
makes one log line while the task goes on. `show` is the test's: the desktop side is proved on a
real D-Bus in tests/test_alerts_desktop.py."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

import pytest
import trio

from agent_bridge.broker.alerts.task import read_snapshot, serve_alerts
from agent_bridge.core.alerts import REMIND_AFTER_MS
from agent_bridge.store.feed import ChangeFeed
from agent_bridge.store.writer import Store
from tests.test_questions_store import _ask, _sessions

T0 = 1_800_000_000_000


class Shown:
    def __init__(self) -> None:
        self.alerts: list[tuple[int, str, str]] = []  # (virtual ms, title, body)
        self.changed = trio.Event()

    async def show(self, title: str, body: str) -> bool:
        self.alerts.append((int(trio.current_time() * 1000), title, body))
        self.changed.set()
        self.changed = trio.Event()
        return True

    async def count(self, n: int) -> None:
        while len(self.alerts) < n:
            await self.changed.wait()


def alerts_task(db: Path, feed: ChangeFeed, shown: Shown) -> partial:
    return partial(serve_alerts, db, lambda: feed, shown.show, clock=clock, read=on_the_loop(db))


def on_the_loop(db: Path):
    """Snapshots read on the Trio loop: a worker thread would let the mock clock jump while it
    reads (every task would look blocked)."""

    async def read(since):
        return read_snapshot(db, since)

    return read


def clock() -> int:
    return T0 + int(trio.current_time() * 1000)


async def test_a_question_alerts_after_its_commit_and_is_reminded_after_15_minutes_of_mock_time(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    db = tmp_path / "bridge.db"
    store = Store.open(db)
    try:
        asker = _sessions(store)[0]
        feed, shown = ChangeFeed(), Shown()
        feed.bind()
        with trio.fail_after(3 * 3600):  # mock seconds
            async with trio.open_nursery() as nursery:
                await nursery.start(alerts_task(db, feed, shown))
                assert feed.listeners == 1
                q, _ = _ask(store, asker, question="Which database?", now=clock())
                asked_at = int(trio.current_time() * 1000)
                feed.notify()
                await shown.count(1)
                assert shown.alerts[0][1:] == ("agent-bridge: question from claude-app", "Which database?")
                assert shown.alerts[0][0] - asked_at < 5_000

                # a second question, declined five minutes later: never reminded
                other, _ = _ask(store, asker, question="May I drop the table?", topic="table", now=clock())
                feed.notify()
                await trio.sleep(300)
                store.decline_question(question_id=other.id, reason="no", now=clock())
                feed.notify()

                await shown.count(3)  # the second question, then the first one's reminder, no commit
                assert shown.alerts[1][1] == "agent-bridge: question from claude-app"
                at, title, body = shown.alerts[2]
                assert title == "agent-bridge: question still open after 15 min"
                assert body == "claude-app: Which database?"
                assert asked_at + REMIND_AFTER_MS <= at < asked_at + REMIND_AFTER_MS + 5_000
                await trio.sleep(3600)  # an hour more: nothing else
                assert len(shown.alerts) == 3
                nursery.cancel_scope.cancel()
        assert feed.listeners == 0
    finally:
        store.close()


async def test_a_database_it_cannot_read_is_one_log_line_and_the_task_goes_on(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "bridge.db"
    db.write_bytes(b"not a database" * 100)
    feed, shown = ChangeFeed(), Shown()
    feed.bind()
    with caplog.at_level(logging.INFO, logger="agent_bridge.broker"), trio.fail_after(3600):
        async with trio.open_nursery() as nursery:
            await nursery.start(alerts_task(db, feed, shown))
            await trio.sleep(60)  # thirty tries
            lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("alerts:")]
            assert len(lines) == 1 and "could not read bridge.db" in lines[0]
            db.unlink()
            store = Store.open(db)
            try:
                await trio.sleep(10)  # read again: it works now, and the task starts
                asker = _sessions(store)[0]
                _ask(store, asker, question="Which queue?", now=clock())
                feed.notify()
                await shown.count(1)
            finally:
                store.close()
            nursery.cancel_scope.cancel()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("alerts:")]
    assert lines[1:] == ["alerts: bridge.db can be read again"]
