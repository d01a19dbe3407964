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


class Commits:
    """Counts the writing connection's commits (SQLite's commit hook: a savepoint released
    inside a transaction is not one)."""

    def __init__(self, store: Store) -> None:
        self.count = 0
        store.conn.set_commit_hook(self._one)

    def _one(self) -> bool:
        self.count += 1
        return False  # let it commit


async def _two_sessions_and_a_third(calls: StoreCalls) -> tuple[str, str, str]:
    ids = []
    for name in ("a", "b", "c"):
        peer = await calls.create_peer(
            agent="codex", name=name, project="/w", kind="interactive", host_session_id=None, now=1
        )
        ids.append(peer.id)
    return ids[0], ids[1], ids[2]


async def test_the_sends_and_acknowledgements_of_one_turn_share_one_commit(tmp_path: Path) -> None:
    """Group commit: sends of two sessions and another's acknowledgement, called together (as
    three connections' requests read in one turn of the loop), are one transaction; each caller
    gets its own answer. After GROUP_PROBE calls alone in a row (one message at a time), calls
    run at once, each its own commit, until one of every GROUP_PROBE looks for others again: a
    burst is one commit by then, and so is every burst after it."""
    runner = StoreRunner(Store.open(tmp_path / "bridge.db"))
    calls = StoreCalls(runner)
    try:
        a, b, c = await _two_sessions_and_a_third(calls)
        commits = Commits(runner.store)
        await calls.send(c, [Send((Outgoing(b, "alone", 1, None),))], now=3)
        assert commits.count == 1  # the counter counts

        async def burst(n: int) -> tuple[int, dict[str, object]]:
            (first,) = await calls.send(a, [Send((Outgoing(b, f"to ack {n}", 1, None),))], now=4)
            before, results = commits.count, {}

            async def send(sender: str, text: str) -> None:
                (stored,) = await calls.send(sender, [Send((Outgoing(b, text, 1, None),))], now=4)
                results[text] = [m.text for m in stored.messages]

            async def ack() -> None:
                results["ack"] = await calls.ack(b, [first.messages[0].id], now=4)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(send, a, f"from a {n}")
                nursery.start_soon(send, c, f"from c {n}")
                nursery.start_soon(ack)
            return commits.count - before, results

        assert (await burst(0))[0] == 1
        for n in range(storage.GROUP_PROBE):  # one message at a time: nothing joins
            await calls.send(a, [Send((Outgoing(b, f"one at a time {n}", 1, None),))], now=5)
        counts = [(await burst(n))[0] for n in range(1, storage.GROUP_PROBE + 2)]
        assert counts[0] == 3 and 1 in counts, counts  # at once, then a probe finds a group again
        last, results = await burst(99)
        assert last == 1
        assert results == {"from a 99": ["from a 99"], "from c 99": ["from c 99"], "ack": 1}
        unacked = {m.text for m in await calls.unacked(b)}
        assert {"alone", "from a 99", "from c 99"} <= unacked and "to ack 99" not in unacked
    finally:
        await runner.run(runner.close_store)
        runner.stop()


async def test_a_call_that_fails_in_a_group_undoes_only_its_own_rows(tmp_path: Path) -> None:
    """Each call of a group is a savepoint: a send to a session that does not exist fails for
    its caller alone, and the others of its turn are stored."""
    runner = StoreRunner(Store.open(tmp_path / "bridge.db"))
    calls = StoreCalls(runner)
    try:
        a, b, c = await _two_sessions_and_a_third(calls)
        outcomes: dict[str, object] = {}

        async def send(sender: str, to: str, text: str) -> None:
            try:
                (stored,) = await calls.send(sender, [Send((Outgoing(to, text, 1, None),))], now=4)
                outcomes[text] = "stored"
            except apsw.Error as exc:
                outcomes[text] = type(exc).__name__

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send, a, b, "good one")
            nursery.start_soon(send, c, "no-such-session", "bad one")
            nursery.start_soon(send, c, b, "good two")
        assert outcomes["good one"] == outcomes["good two"] == "stored"
        assert outcomes["bad one"] != "stored"
        assert sorted(m.text for m in await calls.unacked(b)) == ["good one", "good two"]
        assert runner.store.conn.execute(
            "SELECT count(*) FROM messages WHERE body = 'bad one'"
        ).fetchone() == (0,)
    finally:
        await runner.run(runner.close_store)
        runner.stop()


async def test_a_grouped_message_reaches_its_delivery_tap_only_once_committed(tmp_path: Path) -> None:
    """What a send hands its recipient's delivery task (store.tap) must be durable first: with
    several sends in one transaction, the taps are handed the messages after its commit, which
    a second connection sees at that moment."""
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


async def test_a_group_formed_while_the_thread_is_busy_commits_once_there(
    tmp_path: Path, vfs: RecordingVFS
) -> None:
    """If the store's thread has work when the group is complete, the whole group is one job
    behind it there: still one commit, never the loop and the thread on the connection at once."""
    runner = StoreRunner(Store.open(tmp_path / "bridge.db"))
    calls = StoreCalls(runner)
    release = threading.Event()
    holding = threading.Event()
    try:
        a, b, c = await _two_sessions_and_a_third(calls)
        commits = Commits(runner.store)

        def slow_job() -> None:
            holding.set()
            release.wait(30)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(runner.run, slow_job)
            await wait_for(lambda: _true(holding.is_set()), what="the slow job to start")
            with vfs.lock:
                vfs.wal_writers.clear()
            for sender in (a, c):
                nursery.start_soon(calls.send, sender, [Send((Outgoing(b, f"from {sender}", 1, None),))], 4)
            await trio.testing.wait_all_tasks_blocked()
            release.set()
        assert commits.count == 1
        with vfs.lock:
            assert vfs.wal_writers == ["agent-bridge store"]
        assert len(await calls.unacked(b)) == 2
    finally:
        release.set()
        await runner.run(runner.close_store)
        runner.stop()


async def test_a_group_of_many_calls_commits_once_on_the_store_thread(
    tmp_path: Path, vfs: RecordingVFS
) -> None:
    """However many calls join one turn, the loop holds no long transaction: a group of more
    than GROUP_ON_LOOP calls is one commit on the store's thread."""
    runner = StoreRunner(Store.open(tmp_path / "bridge.db"))
    calls = StoreCalls(runner)
    try:
        a, b, c = await _two_sessions_and_a_third(calls)
        commits = Commits(runner.store)
        with vfs.lock:
            vfs.wal_writers.clear()
        async with trio.open_nursery() as nursery:
            for n in range(storage.GROUP_ON_LOOP + 1):
                nursery.start_soon(calls.send, a, [Send((Outgoing(b, f"many {n}", 1, None),))], 4)
        assert commits.count == 1
        with vfs.lock:
            assert vfs.wal_writers == ["agent-bridge store"]
        assert len(await calls.unacked(b)) == storage.GROUP_ON_LOOP + 1
    finally:
        await runner.run(runner.close_store)
        runner.stop()


def test_a_group_commit_keeps_its_savepoints_in_memory(tmp_path: Path) -> None:
    """Each call of a group commit is a savepoint of one transaction (Store.one_commit), and
    SQLite keeps a savepoint's undo pages in a temporary file once they pass 64 KiB unless
    temp_store is MEMORY: a file opened, written and closed around commits on the send path.
    Watched through a VFS that passes every open on to the default one: the writer opens none."""
    opened: list[int] = []

    class Watching(apsw.VFS):
        def __init__(self) -> None:
            super().__init__("watching-temp-files", "", makedefault=True)

        def xOpen(self, name: object, flags: list[int]) -> apsw.VFSFile:  # noqa: N802 - APSW's name
            opened.append(flags[0])
            return super().xOpen(name, flags)  # type: ignore[arg-type]

    vfs = Watching()
    try:
        store = Store.open(tmp_path / "bridge.db")
        a, b = (store.create_peer(agent="claude", name=n, project="/p", kind="interactive",
                                  host_session_id=None, now=1) for n in ("a", "b"))
        opened.clear()
        acked: list[str] = []
        for _ in range(100):  # the savepoints' pages pass 64 KiB in about one commit in two
            with store.one_commit():
                sent = store.send_messages(a.id, [Outgoing(b.id, "x" * 300, 1, None)] * 16, 2)
                store.ack(b.id, acked, 3)
            acked = [m.id for m in sent]
        store.close()
    finally:
        vfs.unregister()
    subjournal = int(apsw.mapping_open_flags["SQLITE_OPEN_SUBJOURNAL"])
    assert not [f for f in opened if f & subjournal]
