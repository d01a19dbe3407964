"""The wake waiters answered together (broker.feeds.waiters, issue 33 "Waiters at scale"): one query
per store commit for all of them, and only the waiters whose session got an active message
wake. On the broker's own commit feed, with Trio's mock clock (no wall-clock waits); then end to
end: a real broker, 30 real `wait_active` requests and one `agent-bridge send`."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from agent_bridge.broker.feeds.waiters import Waiters
from agent_bridge.store.feed import ChangeFeed
from tests.conftest import run_cli


class Store:
    """What the waiters ask: which sessions have an active message; every ask counted."""

    def __init__(self) -> None:
        self.active: set[str] = set()
        self.queries: list[list[str]] = []

    async def find(self, sessions: Sequence[str]) -> set[str]:
        self.queries.append(list(sessions))
        await trio.lowlevel.checkpoint()
        return self.active & set(sessions)


async def test_one_commit_is_one_query_and_wakes_only_the_session_it_concerns(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store, feed = Store(), ChangeFeed()
    waiters = Waiters(store.find, lambda: feed)
    woke: dict[str, bool] = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiters.run)

        async def wait(session: str) -> None:
            woke[session] = await waiters.wait(session, 50)

        for n in range(50):
            nursery.start_soon(wait, f"s{n}")
        await trio.testing.wait_all_tasks_blocked()
        assert waiters.held() == 50 and woke == {}
        looks, passes = len(store.queries), waiters.passes  # each waiter's own first look, one pass
        assert looks == 50 + passes
        # one commit that gives s7 an active message
        store.active.add("s7")
        feed.notify()
        await trio.testing.wait_all_tasks_blocked()
        assert woke == {"s7": True}
        assert waiters.passes == passes + 1 and len(store.queries) == looks + 1
        assert waiters.held() == 49
        # a commit that concerns nobody waiting wakes nobody, for one query
        store.active.add("someone-else")
        feed.notify()
        await trio.testing.wait_all_tasks_blocked()
        assert woke == {"s7": True} and len(store.queries) == looks + 2
        # the rest time out, answered False, and leave nothing behind
        await trio.sleep(51)
        assert len(woke) == 50 and sum(woke.values()) == 1 and waiters.held() == 0
        nursery.cancel_scope.cancel()


async def test_a_message_already_waiting_answers_at_once_and_a_commit_during_the_look_is_not_missed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store, feed = Store(), ChangeFeed()
    waiters = Waiters(store.find, lambda: feed)
    store.active.add("ready")
    assert await waiters.wait("ready", 10) is True and waiters.held() == 0

    class Racing(Store):
        """A commit lands while the waiter looks for itself (after its read)."""

        async def find(self, sessions: Sequence[str]) -> set[str]:
            found = await super().find(sessions)
            if len(self.queries) == 1:
                self.active.add("late")
                feed.notify()
            return found

    racing = Racing()
    waiters = Waiters(racing.find, lambda: feed)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiters.run)
        with trio.fail_after(5):  # mock time: fails only if it never wakes
            assert await waiters.wait("late", 30) is True
        nursery.cancel_scope.cancel()


def broker_status(env: dict[str, str]) -> dict[str, Any]:
    done = run_cli(env, "status", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.slow
def test_one_send_wakes_exactly_one_of_thirty_real_waiters(env: dict[str, str], home: Path) -> None:
    from agent_bridge.common import paths
    from agent_bridge.ipc import blocking
    from agent_bridge.store.writer import Store as Writer

    sessions = [f"hs-wait-{n}" for n in range(30)]
    paths.ensure_home(home)
    store = Writer.open(home / "bridge.db")  # sessions the bridge knows by their host session ids
    for n, hsid in enumerate(sessions):
        store.create_peer(agent="claude", name=f"claude-wait-{n}", project="/w/wait", kind="interactive",
                          host_session_id=hsid, now=1)
    store.close()
    run_cli(env, "up", "--detach")
    try:
        answers: dict[str, Any] = {}

        ended: dict[str, str] = {}  # the waits the broker's stop ended

        def wait(hsid: str) -> None:
            try:
                answers[hsid] = blocking.call(home, "wait_active", timeout=70, hostSessionId=hsid,
                                              timeoutMs=60_000)
            except (OSError, blocking.BrokerUnavailable) as exc:
                ended[hsid] = type(exc).__name__

        threads = [threading.Thread(target=wait, args=(h,), daemon=True) for h in sessions]
        for t in threads:
            t.start()
        deadline = 0
        while broker_status(env)["waiters"] < 30:  # the broker answers status as it holds them
            deadline += 1
            assert deadline < 600, broker_status(env)
        before = broker_status(env)["waiterPasses"]
        sent = run_cli(env, "send", "hs-wait-7", "wake up")
        assert sent.returncode == 0, sent.stderr
        threads[7].join(timeout=30)
        assert answers == {"hs-wait-7": {"active": True}}
        after = broker_status(env)
        assert after["waiters"] == 29 and after["waiterPasses"] - before <= 2  # the send's commits
    finally:
        run_cli(env, "down")
    for t in threads:
        t.join(timeout=30)
    assert len(ended) == 29 and not any(t.is_alive() for t in threads)  # the stop ended the others


@pytest.mark.slow
def test_forgetting_a_session_removes_its_waiter_files_but_not_a_live_waiters(
    env: dict[str, str], home: Path
) -> None:
    """A session that never had a waiter (`claude -p`) leaves its busy/idle mark in
    <home>/waiters/; `forget` ends it for good, and its files go. A session whose waiter still
    holds its lock keeps them: its host runs, and the waiter removes them when that ends."""
    from agent_bridge.common import marks, paths
    from agent_bridge.store.writer import Store as Writer

    paths.ensure_home(home)
    store = Writer.open(home / "bridge.db")
    for n, hsid in enumerate(("hs-done", "hs-held", "hs-kept")):
        store.create_peer(agent="claude", name=f"claude-f{n}", project="/w/forget", kind="interactive",
                          host_session_id=hsid, now=1)
    store.close()
    (home / marks.WAITERS_DIR).mkdir(mode=0o700, exist_ok=True)
    for hsid in ("hs-done", "hs-held", "hs-kept"):
        marks.mark_path(home, hsid).write_text("idle - -", encoding="utf-8")
    marks.lock_path(home, "hs-done").write_text("")  # a lock file a waiter left, nobody holds it
    held = marks.hold_lock(home, "hs-held")  # a waiter that still waits (this process holds it)
    assert held is not None
    run_cli(env, "up", "--detach")
    try:
        done = run_cli(env, "forget", "hs-done", "hs-held")
        assert done.returncode == 0, done.stderr
    finally:
        run_cli(env, "down")
        os.close(held)
    assert not marks.mark_path(home, "hs-done").exists() and not marks.lock_path(home, "hs-done").exists()
    assert marks.mark_path(home, "hs-held").exists() and marks.lock_path(home, "hs-held").exists()
    assert marks.mark_path(home, "hs-kept").exists()  # not forgotten: its mark stays
