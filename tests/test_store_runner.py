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
from agent_bridge.broker.storage import (
    CHECKPOINT_PAGES,
    SHORT_IDS,
    SHORT_ROWS,
    SHORT_TEXT,
    StoreCalls,
    StoreRunner,
)
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
        a = await calls.create_peer(
            agent="codex", name="a", project="/w", kind="interactive", host_session_id=None, now=1
        )
        b = await calls.create_peer(
            agent="codex", name="b", project="/w", kind="interactive", host_session_id=None, now=1
        )
        with vfs.lock:
            vfs.main_writers.clear()
        text = "x" * 3000  # a page of its own for each message: the WAL grows fast
        for i in range(CHECKPOINT_PAGES // 2):
            (sent,) = await calls.send(a.id, [Send((Outgoing(b.id, text, 1, None),))], now=i)  # on the loop
            await calls.ack(b.id, [sent.messages[0].id], i)
            await calls.touch_peers([a.id], i)  # on the store's thread

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
        a = await calls.create_peer(
            agent="codex", name="a", project="/w", kind="interactive", host_session_id=None, now=1
        )
        b = await calls.create_peer(
            agent="codex", name="b", project="/w", kind="interactive", host_session_id=None, now=1
        )
        first = _wal_restarts(wal)
        for i in range(6000):  # ~10 pages each (two commits)
            (sent,) = await calls.send(a.id, [Send((Outgoing(b.id, "x" * 200, 1, None),))], now=i)
            await calls.ack(b.id, [sent.messages[0].id], i)
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


async def test_a_send_commits_on_the_event_loop_when_the_store_thread_is_idle_else_behind_its_jobs(
    tmp_path: Path, vfs: RecordingVFS
) -> None:
    """Idle, the store's thread would cost a send two thread hand-overs: the send commits on
    the loop. Busy, the send waits its turn behind the job already there, on that thread."""
    runner = StoreRunner(Store.open(tmp_path / "bridge.db"))
    calls = StoreCalls(runner)
    release = threading.Event()
    holding = threading.Event()
    try:
        a = await calls.create_peer(
            agent="codex", name="a", project="/w", kind="interactive", host_session_id=None, now=1
        )
        b = await calls.create_peer(
            agent="codex", name="b", project="/w", kind="interactive", host_session_id=None, now=1
        )
        with vfs.lock:
            vfs.wal_writers.clear()
        await calls.send(a.id, [Send((Outgoing(b.id, "idle", 1, None),))], now=2)
        with vfs.lock:
            assert vfs.wal_writers == [threading.current_thread().name]
            vfs.wal_writers.clear()

        def slow_job() -> None:  # a job on the store's thread that commits once released
            holding.set()
            release.wait(30)
            runner.store.touch_peers([a.id], 3)

        sent: list[Message] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(runner.run, slow_job)
            await wait_for(lambda: _true(holding.is_set()), what="the slow job to start")

            async def send() -> None:
                (done,) = await calls.send(a.id, [Send((Outgoing(b.id, "busy", 1, None),))], now=4)
                sent.extend(done.messages)

            nursery.start_soon(send)
            await trio.testing.wait_all_tasks_blocked()
            assert not sent  # queued behind the job, not run beside it on the loop
            release.set()
        assert [m.text for m in sent] == ["busy"]
        with vfs.lock:
            assert vfs.wal_writers == ["agent-bridge store"]  # the job's commit, then the send's, there
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
        a = await calls.create_peer(
            agent="codex", name="a", project="/w", kind="interactive", host_session_id=None, now=1
        )
        b = await calls.create_peer(
            agent="codex", name="b", project="/w", kind="interactive", host_session_id=None, now=1
        )
        for batch in ([Send((Outgoing(b.id, f"m{i}", 1, None),)) for i in range(SHORT_ROWS + 1)],
                      [Send((Outgoing(b.id, "x" * (SHORT_TEXT // 2 + 1), 1, None),)) for _ in range(2)]):
            with vfs.lock:
                vfs.wal_writers.clear()
            sent = await calls.send(a.id, batch, now=2)
            assert len(sent) == len(batch)
            with vfs.lock:
                assert vfs.wal_writers == ["agent-bridge store"]
    finally:
        await runner.run(runner.close_store)
        runner.stop()


async def test_an_acknowledgement_of_up_to_short_ids_messages_commits_on_the_loop(
    tmp_path: Path, vfs: RecordingVFS
) -> None:
    """A receiver of a stream of pipelined sends holds more than SHORT_ROWS messages at a time:
    its acknowledgement of them all (SHORT_IDS, as costly as a batch of SHORT_ROWS sends) commits
    on the idle loop; one more message, and it goes to the thread."""
    runner = StoreRunner(Store.open(tmp_path / "bridge.db"))
    calls = StoreCalls(runner)
    try:
        a, b, _ = await _two_sessions_and_a_third(calls)
        assert SHORT_IDS > SHORT_ROWS
        ids = []
        for _ in range(SHORT_IDS + 2):
            (done,) = await calls.send(a, [Send((Outgoing(b, "hello", 1, None),))], now=2)
            ids.append(done.messages[0].id)
        with vfs.lock:
            vfs.wal_writers.clear()
        assert await calls.ack(b, ids[:SHORT_IDS], 3) == SHORT_IDS
        with vfs.lock:
            assert vfs.wal_writers == [threading.current_thread().name]
            vfs.wal_writers.clear()
        assert await calls.ack(b, ids[1:], 3) == 2  # SHORT_IDS + 1 ids, two of them new
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


async def test_sends_that_find_the_thread_busy_commit_in_the_order_they_came(tmp_path: Path) -> None:
    """The MCP side carries out a host's sends, written together, in tasks of their own, and a
    host expects them stored in the order it wrote them (tests/test_mcp_sends.py). Sends of
    several tasks that find the store's thread busy with one of the broker's passes commit in
    the order they were handed over. Stop 59 let such sends wait the pass out and then commit on
    the loop in the order Trio woke them, and CI stored a host's fourth send first; the scene
    here runs eight times, so a wake-up order that is not the arrival order shows."""
    runner = StoreRunner(Store.open(tmp_path / "bridge.db"))
    calls = StoreCalls(runner)
    try:
        a, b, _ = await _two_sessions_and_a_third(calls)
        for scene in range(8):
            release, holding = threading.Event(), threading.Event()

            def a_pass(holding: threading.Event = holding, release: threading.Event = release) -> None:
                holding.set()
                release.wait(30)

            texts = [f"{scene}-{n}" for n in range(4)]
            async with trio.open_nursery() as nursery:
                nursery.start_soon(runner.run_unseen, a_pass)  # the search index's batch
                await wait_for(lambda h=holding: _true(h.is_set()), what="the pass to start")
                for text in texts:  # one task each, handed over one after another
                    nursery.start_soon(calls.send, a, [Send((Outgoing(b, text, 1, None),))], 2)
                    await trio.testing.wait_all_tasks_blocked()
                release.set()
            stored = [m.text for m in await calls.unacked(b, limit=1000)]
            assert stored[-4:] == texts, scene
    finally:
        await runner.run(runner.close_store)
        runner.stop()
