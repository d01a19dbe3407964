"""The broker's store runner (broker.storage): where its SQLite work runs.

Real SQLite files through a VFS that records which thread writes which file: a commit writes
the WAL, and in WAL mode the database file itself is written only by checkpoints, so the
writers of each say who committed and who checkpointed."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import apsw
import pytest
import trio

from agent_bridge.broker import storage
from agent_bridge.broker.storage import CHECKPOINT_PAGES, SHORT_ROWS, SHORT_TEXT, StoreCalls, StoreRunner
from agent_bridge.common.rows import Message
from agent_bridge.store.messages import Outgoing, Send
from agent_bridge.store.tap import DeliveryTap
from agent_bridge.store.writer import Store
from tests.conftest import wait_for

BASE = "unix"


class RecordingVFS(apsw.VFS):
    """The platform's own VFS, noting the name of each thread that writes the database file
    and, in order, of each that writes its WAL (not the -shm)."""

    def __init__(self, name: str = "recording") -> None:
        self.name = name
        self.lock = threading.Lock()
        self.main_writers: set[str] = set()
        self.main_writes: Counter[str] = Counter()  # writes to the database file, per thread
        self.wal_writers: list[str] = []
        super().__init__(name, BASE, makedefault=True)

    def xOpen(self, name, flags):  # noqa: N802 - the VFS method name
        return RecordingFile(self, name, flags)


class RecordingFile(apsw.VFSFile):
    def __init__(self, vfs: RecordingVFS, name, flags) -> None:
        self._vfs = vfs
        filename = name.filename() if isinstance(name, apsw.URIFilename) else name
        self._main = bool(filename) and filename.endswith(".db")
        self._wal = bool(filename) and filename.endswith(".db-wal")
        super().__init__(BASE, name, flags)

    def xWrite(self, data, offset):  # noqa: N802
        with self._vfs.lock:
            if self._main:
                self._vfs.main_writers.add(threading.current_thread().name)
                self._vfs.main_writes[threading.current_thread().name] += 1
            elif self._wal and (
                not self._vfs.wal_writers or self._vfs.wal_writers[-1] != threading.current_thread().name
            ):
                self._vfs.wal_writers.append(threading.current_thread().name)
        return super().xWrite(data, offset)


@pytest.fixture
def vfs():
    recording = RecordingVFS()
    try:
        yield recording
    finally:
        recording.unregister()


async def test_commits_never_checkpoint_a_thread_of_its_own_does(tmp_path: Path, vfs: RecordingVFS) -> None:
    """A commit that leaves the WAL past the threshold returns without copying it back into
    the database (the copy and its fsyncs cost 5-30 ms): sends on the event loop and jobs
    on the store's thread alike. The checkpointer's thread copies it; the store's thread
    copies at most the few pages committed while it did (before a job, never in a commit)."""
    runner = StoreRunner(Store.open(tmp_path / "bridge.db"))
    calls = StoreCalls(runner)
    try:
        a, b, _ = await _two_sessions_and_a_third(calls)
        with vfs.lock:
            vfs.main_writers.clear()
        text = "x" * 3000  # a page of its own for each message: the WAL grows fast
        for i in range(CHECKPOINT_PAGES // 2):
            (sent,) = await calls.send(a, [Send((Outgoing(b, text, 1, None),))], now=i)  # on the loop
            await calls.ack(b, [sent.messages[0].id], i)
            await calls.touch_peers([a], i)  # on the store's thread

        async def checkpointed() -> bool:
            with vfs.lock:
                return bool(vfs.main_writers)

        await wait_for(checkpointed, what="a checkpoint")
        with vfs.lock:
            assert vfs.main_writers <= {"agent-bridge checkpoint", "agent-bridge store"}  # never the loop
            assert vfs.main_writes["agent-bridge checkpoint"] > vfs.main_writes["agent-bridge store"]
    finally:
        await runner.run(runner.close_store)
        runner.stop()


async def test_the_wal_starts_over_under_steady_traffic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint beside a writer that keeps committing leaves the frames committed during
    it, and SQLite starts the WAL over only once every frame is in the database: without the
    store's thread copying that rest, the WAL never started over and grew by every commit
    (400 MB after 10,000 messages through a broker). Sends and acks back to back, as a busy
    broker makes them, until the WAL has started over three times (its header's checkpoint
    sequence number, SQLite's file format, counts the restarts)."""
    monkeypatch.setattr(storage, "CHECKPOINT_PAGES", 50)  # a few hundred checkpoints' worth of traffic
    runner = StoreRunner(Store.open(tmp_path / "bridge.db"))
    calls = StoreCalls(runner)
    wal = tmp_path / "bridge.db-wal"
    try:
        a, b, _ = await _two_sessions_and_a_third(calls)
        first = _wal_restarts(wal)
        for i in range(6000):  # ~10 pages each (two commits)
            (sent,) = await calls.send(a, [Send((Outgoing(b, "x" * 200, 1, None),))], now=i)
            await calls.ack(b, [sent.messages[0].id], i)
            if _wal_restarts(wal) >= first + 3:
                break
        else:
            pages = wal.stat().st_size // 4096
            raise AssertionError(
                f"the WAL started over {_wal_restarts(wal) - first} times in 6,000 messages; {pages} pages"
            )
    finally:
        await runner.run(runner.close_store)
        runner.stop()


def _wal_restarts(wal: Path) -> int:
    """The WAL header's checkpoint sequence number (bytes 12-15, big-endian): +1 each time a
    writer starts the WAL over (https://sqlite.org/fileformat2.html#walformat)."""
    with wal.open("rb") as f:
        return int.from_bytes(f.read(32)[12:16], "big")


async def test_a_send_commits_on_the_event_loop_when_the_store_thread_is_idle(
    tmp_path: Path, vfs: RecordingVFS
) -> None:
    """Idle, the store's thread would cost a send two thread hand-overs: the send commits on
    the loop."""
    runner = StoreRunner(Store.open(tmp_path / "bridge.db"))
    calls = StoreCalls(runner)
    try:
        a, b, _ = await _two_sessions_and_a_third(calls)
        with vfs.lock:
            vfs.wal_writers.clear()
        await calls.send(a, [Send((Outgoing(b, "idle", 1, None),))], now=2)
        with vfs.lock:
            assert vfs.wal_writers == [threading.current_thread().name]
    finally:
        await runner.run(runner.close_store)
        runner.stop()


@pytest.mark.parametrize(
    ("holding_job", "writers"),
    [
        # a job of a session's request (a read of its queue): the send queues behind it, on the
        # thread (waiting there cost the relay path 9 %, stop 58)
        ("run", ["agent-bridge store"]),
        # one of the broker's own passes, a batch of the search index or the post box's look:
        # the send waits until it is done, then commits on the loop
        ("run_unseen", ["agent-bridge store", "loop"]),
        ("run_background", ["agent-bridge store", "loop"]),
    ],
)
async def test_a_send_finding_the_store_thread_busy_queues_behind_a_request_and_waits_out_a_pass(
    tmp_path: Path, vfs: RecordingVFS, holding_job: str, writers: list[str]
) -> None:
    """Never beside the job on the thread, and after its commit: where the send commits depends
    on whose job holds the thread."""
    runner = StoreRunner(Store.open(tmp_path / "bridge.db"))
    calls = StoreCalls(runner)
    release = threading.Event()
    holding = threading.Event()
    loop = threading.current_thread().name
    try:
        a, b, _ = await _two_sessions_and_a_third(calls)

        def slow_job() -> None:  # a job on the store's thread that commits once released
            holding.set()
            release.wait(30)
            runner.store.touch_peers([a], 3)

        sent: list[Message] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(getattr(runner, holding_job), slow_job)
            await wait_for(lambda: _true(holding.is_set()), what="the slow job to start")
            with vfs.lock:
                vfs.wal_writers.clear()

            async def send() -> None:
                (done,) = await calls.send(a, [Send((Outgoing(b, "busy", 1, None),))], now=4)
                sent.extend(done.messages)

            nursery.start_soon(send)
            await trio.testing.wait_all_tasks_blocked()
            assert not sent  # not run beside the job on the loop
            release.set()
        assert [m.text for m in sent] == ["busy"]
        with vfs.lock:  # the job's commit, then the send's
            assert vfs.wal_writers == [loop if w == "loop" else w for w in writers]
    finally:
        release.set()
        await runner.run(runner.close_store)
        runner.stop()


async def test_a_send_waiting_out_an_index_batch_queues_behind_a_request_handed_over_meanwhile(
    tmp_path: Path, vfs: RecordingVFS
) -> None:
    """While a send waits for an index batch, a session's request hands the thread a job: the
    send then queues behind that job, on the thread, as it would have without the batch, and
    is answered after it."""
    runner = StoreRunner(Store.open(tmp_path / "bridge.db"))
    calls = StoreCalls(runner)
    batch_go, request_go = threading.Event(), threading.Event()
    batch_holding = threading.Event()
    order: list[str] = []
    try:
        a, b, _ = await _two_sessions_and_a_third(calls)

        def batch() -> None:
            batch_holding.set()
            batch_go.wait(30)
            order.append("batch")

        def request() -> None:
            request_go.wait(30)
            runner.store.touch_peers([a], 3)
            order.append("request")

        async def send() -> None:
            await calls.send(a, [Send((Outgoing(b, "mine", 1, None),))], now=4)
            order.append("send")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(runner.run_unseen, batch)
            await wait_for(lambda: _true(batch_holding.is_set()), what="the batch to start")
            nursery.start_soon(send)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(runner.run, request)  # handed over while the send waits
            await trio.testing.wait_all_tasks_blocked()
            with vfs.lock:
                vfs.wal_writers.clear()
            batch_go.set()
            await wait_for(lambda: _true(order == ["batch"]), what="the batch to end")
            await trio.testing.wait_all_tasks_blocked()
            assert order == ["batch"]  # the send waits behind the request now
            request_go.set()
        assert order == ["batch", "request", "send"]
        assert runner._requests_out == 0  # the request counted out again: later sends may wait out passes
        with vfs.lock:  # the request's commit and then the send's, both on the thread
            assert vfs.wal_writers == ["agent-bridge store"], vfs.wal_writers
    finally:
        batch_go.set()
        request_go.set()
        await runner.run(runner.close_store)
        runner.stop()


async def test_a_short_job_cancelled_while_it_waits_for_the_thread_never_runs(tmp_path: Path) -> None:
    """Cancelled while it waits out an index batch, a send stores nothing, and the thread's next idle
    spell lets later short jobs through as before."""
    runner = StoreRunner(Store.open(tmp_path / "bridge.db"))
    calls = StoreCalls(runner)
    release = threading.Event()
    holding = threading.Event()
    try:
        a, b, _ = await _two_sessions_and_a_third(calls)

        def slow_job() -> None:
            holding.set()
            release.wait(30)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(runner.run_unseen, slow_job)  # an index batch
            await wait_for(lambda: _true(holding.is_set()), what="the slow job to start")
            with trio.CancelScope() as scope:
                nursery.start_soon(_cancel_when_blocked, scope)
                await calls.send(a, [Send((Outgoing(b, "cancelled", 1, None),))], now=2)
            assert scope.cancelled_caught
            release.set()
        await calls.send(a, [Send((Outgoing(b, "after", 1, None),))], now=3)
        assert [m.text for m in await calls.unacked(b)] == ["after"]
    finally:
        release.set()
        await runner.run(runner.close_store)
        runner.stop()


async def test_a_short_job_waits_no_longer_than_its_place_in_the_queue(
    tmp_path: Path, vfs: RecordingVFS
) -> None:
    """A send that found the thread busy with an index batch waits for the jobs handed to it
    before, not for the thread to be free: a batch handed over meanwhile keeps the thread, and
    the send then queues behind it, on the thread, instead of waiting on for an idle spell that
    a stream of batches could put off for ever."""
    runner = StoreRunner(Store.open(tmp_path / "bridge.db"))
    calls = StoreCalls(runner)
    first_go, second_go = threading.Event(), threading.Event()
    first_holding, second_holding = threading.Event(), threading.Event()
    try:
        a, b, _ = await _two_sessions_and_a_third(calls)

        def job(holding: threading.Event, go: threading.Event) -> None:
            holding.set()
            go.wait(30)
            runner.store.touch_peers([a], 3)

        sent: list[Message] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(runner.run_unseen, job, first_holding, first_go)  # index batches
            await wait_for(lambda: _true(first_holding.is_set()), what="the first job to start")

            async def send() -> None:
                (done,) = await calls.send(a, [Send((Outgoing(b, "mine", 1, None),))], now=4)
                sent.extend(done.messages)

            nursery.start_soon(send)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(runner.run_unseen, job, second_holding, second_go)  # after the send
            await trio.testing.wait_all_tasks_blocked()
            with vfs.lock:
                vfs.wal_writers.clear()
            first_go.set()
            await wait_for(lambda: _true(second_holding.is_set()), what="the second job to start")
            await trio.testing.wait_all_tasks_blocked()
            assert not sent  # behind the second job now
            second_go.set()
        assert [m.text for m in sent] == ["mine"]
        with vfs.lock:  # both jobs' commits and then the send's, all on the thread
            assert vfs.wal_writers == ["agent-bridge store"], vfs.wal_writers
    finally:
        first_go.set()
        second_go.set()
        await runner.run(runner.close_store)
        runner.stop()


async def _cancel_when_blocked(scope: trio.CancelScope) -> None:
    await trio.testing.wait_all_tasks_blocked()
    scope.cancel()


async def test_a_cancelled_job_that_leaves_the_thread_idle_lets_the_waiting_short_jobs_go(
    tmp_path: Path,
) -> None:
    """The thread ends its busy spell on a job cancelled while it was queued (it never runs):
    the short job waiting for the thread must hear of it, or it would wait for the next job.
    Whether the waiter looks before or after the thread drops that job is a race, so the count
    it waits on is checked too: every job handed to the thread is counted done, the dropped one
    included (without that, a waiter that looked first sleeps until some other job ends)."""
    runner = StoreRunner(Store.open(tmp_path / "bridge.db"))
    calls = StoreCalls(runner)
    release = threading.Event()
    holding = threading.Event()
    ran: list[str] = []
    try:
        a, b, _ = await _two_sessions_and_a_third(calls)

        def slow_job() -> None:
            holding.set()
            release.wait(30)
            ran.append("slow")

        def queued_job() -> None:
            ran.append("queued")

        sent: list[Message] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(runner.run_unseen, slow_job)  # an index batch
            await wait_for(lambda: _true(holding.is_set()), what="the slow job to start")
            queued = trio.CancelScope()

            async def run_queued() -> None:
                with queued:
                    await runner.run_unseen(queued_job)

            nursery.start_soon(run_queued)

            async def send() -> None:
                (done,) = await calls.send(a, [Send((Outgoing(b, "waiting", 1, None),))], now=2)
                sent.extend(done.messages)

            nursery.start_soon(send)
            await trio.testing.wait_all_tasks_blocked()
            queued.cancel()  # still in the queue behind the slow job: taken out
            await trio.testing.wait_all_tasks_blocked()
            release.set()
            await wait_for(lambda: _true(bool(sent)), what="the waiting send")
        assert ran == ["slow"] and [m.text for m in sent] == ["waiting"]
        await wait_for(lambda: _true(runner._finished == runner._submitted), what="every job counted done")
    finally:
        release.set()
        await runner.run(runner.close_store)
        runner.stop()


async def _true(value: bool) -> bool:
    return value


async def test_a_large_send_batch_commits_on_the_store_thread(tmp_path: Path, vfs: RecordingVFS) -> None:
    """Only a small transaction may hold up the event loop: a batch of many sends (a
    pipelining client) or of long texts commits on the store's thread even when it is idle."""
    runner = StoreRunner(Store.open(tmp_path / "bridge.db"))
    calls = StoreCalls(runner)
    try:
        a, b, _ = await _two_sessions_and_a_third(calls)
        for batch in ([Send((Outgoing(b, f"m{i}", 1, None),)) for i in range(SHORT_ROWS + 1)],
                      [Send((Outgoing(b, "x" * (SHORT_TEXT // 2 + 1), 1, None),)) for _ in range(2)]):
            with vfs.lock:
                vfs.wal_writers.clear()
            sent = await calls.send(a, batch, now=2)
            assert len(sent) == len(batch)
            with vfs.lock:
                assert vfs.wal_writers == ["agent-bridge store"]
    finally:
        await runner.run(runner.close_store)
        runner.stop()


async def _two_sessions_and_a_third(calls: StoreCalls) -> tuple[str, str, str]:
    ids = []
    for name in ("a", "b", "c"):
        peer = await calls.create_peer(
            agent="codex", name=name, project="/w", kind="interactive", host_session_id=None, now=1
        )
        ids.append(peer.id)
    return ids[0], ids[1], ids[2]


async def test_a_sent_message_reaches_its_delivery_tap_only_once_committed(tmp_path: Path) -> None:
    """What a send hands its recipient's delivery task (store.tap) must be durable first: the
    tap is handed the message after its commit, which a second connection sees at that moment."""
    runner = StoreRunner(Store.open(tmp_path / "bridge.db"))
    calls = StoreCalls(runner)
    seen_then: list[int] = []
    try:
        a, b, c = await _two_sessions_and_a_third(calls)
        reader = apsw.Connection(str(tmp_path / "bridge.db"), flags=apsw.SQLITE_OPEN_READONLY)

        class Watching(DeliveryTap):
            def append(self, seq: int, message: Message) -> bool:
                (count,) = reader.execute(
                    "SELECT count(*) FROM messages WHERE id = ?", (message.id,)
                ).fetchone()
                seen_then.append(count)
                return super().append(seq, message)

        await calls.queued(b, tap=Watching())  # b's delivery task reads, then follows its tap
        async with trio.open_nursery() as nursery:
            for sender in (a, c):
                sends = [Send((Outgoing(b, f"to b from {sender}", 1, None),))]
                nursery.start_soon(calls.send, sender, sends, 4)
        assert seen_then == [1, 1]
        reader.close()
    finally:
        await runner.run(runner.close_store)
        runner.stop()


def test_the_broker_s_own_passes_are_the_jobs_a_short_job_waits_out() -> None:
    """Which store calls a send waits out rather than queueing behind: the search index's
    batches and the post box's look, the passes the broker makes after commits; no call a
    session's request makes."""
    runner = StoreRunner()
    try:
        calls = StoreCalls(runner)
        passes = {
            name for name in dir(StoreCalls)
            if isinstance(StoreCalls.__dict__.get(name), storage._OnStoreThread)
            and getattr(calls, name).__name__ in ("unseen", "background")
        }
        assert passes == {"index_messages", "host_sessions_waiting"}
    finally:
        runner.stop()
