"""The store inside the broker's nursery: one writing connection, driven from one dedicated
worker thread and never used by two threads at once. Long or unbounded work (queries over
every decision, migrations, checkpoints and their fsyncs) always runs on that thread; the short
transactions of the message path run on the Trio loop itself while the thread has nothing to
do (StoreRunner.run_short). Checkpoints run on a thread and a connection of their own
(Checkpointer), so that no commit waits for one."""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

import apsw
import outcome  # trio's own dependency: trio.lowlevel.reschedule takes an outcome
import trio

from agent_bridge.store.messages import Send
from agent_bridge.store.writer import Store

T = TypeVar("T")
P = ParamSpec("P")


class _Job:
    __slots__ = ("fn", "task", "token", "started", "cancelled", "seen")

    def __init__(self, method: Callable[..., Any], args: Any, kwargs: Any, *, seen: bool = True) -> None:
        self.fn = functools.partial(method, *args, **kwargs)
        self.seen = seen  # its commit pokes the commit feed (`on_change`) when it changed rows
        self.task = trio.lowlevel.current_task()
        self.token = trio.lowlevel.current_trio_token()
        self.started = False
        self.cancelled = False


# Pages in the WAL after which a commit asks for a checkpoint: four times SQLite's own default
# (16 MB of 4 KiB pages). Each round ends with the store's thread copying the rest while the
# loop's commits queue behind it (catch_up below), and each copy syncs twice; at 1,000 pages a
# stream of sends met that about ten times a second (docs/performance.md, stop 56).
CHECKPOINT_PAGES = 4000
# A passive checkpoint copies what the WAL held when it started; commits meanwhile add more.
# Passes in a row while more than CATCH_UP_PAGES are left; the rest is the writer's (below).
CHECKPOINT_PASSES = 3
CATCH_UP_PAGES = 64
CHECKPOINTER_STOP_TIMEOUT = 30.0  # seconds a closing store waits for a checkpoint in progress


class Checkpointer:
    """Copies the WAL back into bridge.db (a passive checkpoint, what SQLite's automatic one
    does) on a thread and a connection of its own, each time a commit leaves more than
    CHECKPOINT_PAGES in the WAL.

    The writing connection never does that copy: with it, one commit in every ~70 messages
    waited 5-30 ms for the copy and its two fsyncs, and every request behind it too. WAL
    lets a checkpoint run beside the writer, so here nothing waits for it. It changes no
    rows (the store stays the only writer of the data); opened right after the store, it
    finds the query statistics that `bestpractice` refreshes at open already fresh.

    But a checkpoint beside a writer that keeps committing never copies the frames committed
    during it, and SQLite starts the WAL over only once every frame is copied: the WAL grew
    without end under steady traffic (400 MB after 10,000 messages, every commit slower for
    it). So once its passes leave little, it sets `catch_up_wanted`, and the store's thread
    copies that rest on the writing connection before its next job (StoreRunner), where no
    commit can run beside it; that job's commit then starts the WAL over.
    """

    def __init__(self, path: Path) -> None:
        self._conn = apsw.Connection(str(path))
        self._wanted = threading.Event()
        self._stopping = False
        self._in_wal = 0  # frames in the WAL after the writer's last commit (its WAL hook)
        # Set here, cleared by the store's thread once it copied the rest: a plain flag, read
        # by the event loop in StoreRunner.run_short.
        self.catch_up_wanted = False
        self._thread = threading.Thread(target=self._work, name="agent-bridge checkpoint", daemon=True)
        self._thread.start()

    def watch(self, writer: apsw.Connection) -> None:
        """Take over the writer's checkpoints: its WAL hook replaces SQLite's automatic one."""

        def on_commit(conn: apsw.Connection, name: str, pages: int) -> int:
            self._in_wal = pages
            if pages >= CHECKPOINT_PAGES:
                self._wanted.set()
            return apsw.SQLITE_OK

        writer.set_wal_hook(on_commit)

    def _work(self) -> None:
        try:
            while True:
                self._wanted.wait()
                self._wanted.clear()
                if self._stopping:
                    return
                if self.catch_up_wanted:
                    continue  # the writer's next job finishes this round and starts the WAL over
                try:
                    for _ in range(CHECKPOINT_PASSES):
                        _, copied = self._conn.wal_checkpoint()  # as the WAL stood when it began
                        if self._in_wal - copied <= CATCH_UP_PAGES:
                            break
                except apsw.Error:
                    continue  # busy or failing: the next commit past the threshold asks again
                if copied < self._in_wal:  # committed meanwhile
                    self.catch_up_wanted = True
        finally:
            self._conn.close()

    def catch_up(self, writer: apsw.Connection) -> None:
        """Copy what the last passes left (on the store's thread, with the writing connection,
        while no commit runs): the next write starts the WAL over."""
        try:
            writer.wal_checkpoint()
        except apsw.Error:
            pass  # asked again by a later commit past the threshold
        finally:
            self.catch_up_wanted = False

    def stop(self, *, wait: bool = True) -> None:
        """End the thread once a checkpoint in progress is done; `wait` for that (before the
        store closes)."""
        self._stopping = True
        self._wanted.set()
        if wait:
            self._thread.join(CHECKPOINTER_STOP_TIMEOUT)


class StoreRunner:
    """Runs store methods (each one transaction) one at a time, in order, on its own thread.

    Jobs wait in a queue that the worker drains back to back: a delivery read queued behind a
    send runs as soon as the send is done, without a round trip through the event loop per job
    as `trio.to_thread.run_sync` with a `CapacityLimiter(1)` made (that round trip was most of
    the broker's time per message: bench/bench_message_throughput.py).

    A job's caller gets its answer only after the job's transaction committed, so an answer
    never claims more than the database holds. The reverse is not promised: a crash can fall
    between a commit and its answer (for a job, and for others committed just before it); the
    MCP server reports such a request as one that may or may not have been recorded
    (tests/reliability/test_crash.py).
    """

    def __init__(self, store: Store | None = None) -> None:
        self.store: Store = store  # type: ignore[assignment]  # set by serve_store once opened
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()  # guards a job's started/cancelled flags and `_pending`
        # Jobs handed to the thread and not finished: only while it is 0 may the loop use the
        # connection itself (run_short). Raised by the loop, lowered by the thread, under the lock.
        self._pending = 0
        self.checkpointer: Checkpointer | None = None
        if store is not None:
            self.watch_wal()
        self._thread = threading.Thread(target=self._work, name="agent-bridge store", daemon=True)
        # Called on the worker thread after a job that changed rows has committed (the
        # dashboard's live stream: dashboard.changes.ChangeFeed.poke). Must be cheap and thread-safe.
        self.on_change: Callable[[], None] | None = None
        self._thread.start()

    async def run(self, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run one store method (one transaction) on the worker thread and return its result.

        Cancellation is honoured while the job waits in the queue; a transaction that started
        runs to its end (the caller sees the cancellation at its next checkpoint).
        """
        result: T = await self._run(_Job(method, args, kwargs))
        return result

    async def run_unseen(self, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`run`, for a job whose rows nobody follows: its commit does not poke the commit feed
        (the search index brought up to the store: what any reader sees stays the same)."""
        result: T = await self._run(_Job(method, args, kwargs, seen=False))
        return result

    async def _run(self, job: _Job) -> Any:
        def abort(raise_cancel: Any) -> trio.lowlevel.Abort:
            with self._lock:
                if job.started:
                    return trio.lowlevel.Abort.FAILED
                job.cancelled = True
            return trio.lowlevel.Abort.SUCCEEDED

        with self._lock:
            self._pending += 1
        self._jobs.put(job)
        return await trio.lowlevel.wait_task_rescheduled(abort)

    async def run_short(self, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a short store method (one small transaction: a few sends or acknowledgements,
        SHORT_ROWS, SHORT_IDS) on the event loop when the store's thread is idle, else queued
        behind its jobs like `run`.

        Why on the loop: handing a transaction of ~50 us to the thread and back costs two
        thread wake-ups and two handovers of the GIL, more than the transaction itself, and on
        a busy machine every wake-up can wait for a CPU (bench/bench_message_throughput.py).
        What could block the loop for long stays off it: such a commit never checkpoints (the
        Checkpointer does, beside it), and with synchronous=NORMAL in WAL mode a commit writes
        to the WAL without an fsync. Same guarantees as `run`: in order with every other job
        (only while none is queued or running; tasks' sends are stored in the order they came,
        which a host's sends written together rely on), the answer after the commit;
        cancellation is honoured before the transaction starts.
        """
        if not self._loop_may_write():
            return await self.run(method, *args, **kwargs)
        await trio.lowlevel.checkpoint_if_cancelled()  # a cancel point, never a schedule point
        before = self._changes() if self.on_change is not None else None
        try:
            return method(*args, **kwargs)
        finally:
            if before is not None and self.on_change is not None and self._changes() not in (before, None):
                self.on_change()

    def _loop_may_write(self) -> bool:
        """Whether the loop may use the connection itself now: the store is open, the thread has
        nothing queued or running, and no checkpoint's rest waits for the thread."""
        return not (
            self._pending
            or self.store is None
            or (self.checkpointer is not None and self.checkpointer.catch_up_wanted)
        )

    def watch_wal(self) -> None:
        """Hand the store's checkpoints to a Checkpointer (once the store is open). If its
        connection cannot be opened, SQLite's automatic checkpoint stays in place."""
        try:
            checkpointer = Checkpointer(self.store.path)
        except apsw.Error:
            return
        checkpointer.watch(self.store.conn)
        self.checkpointer = checkpointer

    def close_store(self) -> None:
        """Stop the checkpointer, then checkpoint and close the store (a job: on the thread)."""
        if self.checkpointer is not None:
            self.checkpointer.stop()
        self.store.close()

    def stop(self) -> None:
        """Let the worker thread end once the jobs queued before this one are done."""
        if self.checkpointer is not None:
            self.checkpointer.stop(wait=False)
        self._jobs.put(None)

    def _changes(self) -> int | None:
        """Rows changed so far by the writing connection; None before it opens or once closed."""
        store = self.store
        if store is None:
            return None
        try:
            return int(store.conn.total_changes())
        except apsw.Error:
            return None

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            with self._lock:
                if job.cancelled:
                    self._pending -= 1
                    continue
                job.started = True
            if self.checkpointer is not None and self.checkpointer.catch_up_wanted:
                self.checkpointer.catch_up(self.store.conn)
            before = self._changes() if self.on_change is not None and job.seen else None
            result = outcome.capture(job.fn)
            if before is not None and self.on_change is not None and self._changes() not in (before, None):
                self.on_change()
            with self._lock:
                self._pending -= 1
            try:
                job.token.run_sync_soon(trio.lowlevel.reschedule, job.task, result)
            except trio.RunFinishedError:
                pass  # the event loop is gone; nobody waits for this answer


# What the event loop may commit itself (StoreRunner.run_short): a few rows, a little text.
SHORT_ROWS = 16
SHORT_TEXT = 65_536  # characters of message text in one send batch
# Messages in one acknowledgement or offer: 48 cost about what a batch of SHORT_ROWS sends does
# (~350 us each, in process). At 16 the acknowledgements of a receiver holding more than that (a
# stream of pipelined sends, answered before their pushes go out) went to the thread, and every
# short job after them queued there too, one in ten of the loop's (docs/performance.md, stop 60).
SHORT_IDS = 48


def _always(*args: Any, **kwargs: Any) -> bool:
    return True


def _few_ids(peer_id: str, message_ids: Sequence[str], *args: Any, **kwargs: Any) -> bool:
    return len(message_ids) <= SHORT_IDS


def _few_sends(from_id: str, sends: Sequence[Send], *args: Any, **kwargs: Any) -> bool:
    copies = [o for s in sends for o in s.copies]
    return len(copies) <= SHORT_ROWS and sum(len(o.text) for o in copies) <= SHORT_TEXT


def _short_remote_send(from_id: str, to_peer_id: str, text: str, *args: Any, **kwargs: Any) -> bool:
    return len(text) <= SHORT_TEXT


def _short_remote_message(from_machine: str, message: Any, *args: Any, **kwargs: Any) -> bool:
    return len(message.text) <= SHORT_TEXT


class _OnStoreThread(Generic[P, T]):
    """A Store method as an async method of StoreCalls: awaited, it runs on the store's thread."""

    def __init__(
        self, method: Callable[Concatenate[Store, P], T], *, short: Callable[P, bool] | None = None,
        seen: bool = True,
    ) -> None:
        self._method = method
        # Given the call's arguments, whether it is one small transaction, which may run on the
        # loop (StoreRunner.run_short); None: always on the store's thread.
        self._short = short
        self._seen = seen  # False: its commits do not poke the commit feed (StoreRunner.run_unseen)

    def __get__(self, calls: StoreCalls, owner: type | None = None) -> Callable[P, Awaitable[T]]:
        runner, method, short = calls.runner, self._method, self._short
        if not self._seen:
            async def unseen(*args: P.args, **kwargs: P.kwargs) -> T:
                return await runner.run_unseen(method, runner.store, *args, **kwargs)

            return unseen

        async def call(*args: P.args, **kwargs: P.kwargs) -> T:
            if short is not None and short(*args, **kwargs):
                return await runner.run_short(method, runner.store, *args, **kwargs)
            return await runner.run(method, runner.store, *args, **kwargs)

        return call


class StoreCalls:
    """The broker's view of the Store: `await db.send(...)` runs `Store.send`
    on the runner's thread, with the Store's own signature and result type. A Store method the
    broker starts using gets one line here."""

    def __init__(self, runner: StoreRunner) -> None:
        self.runner = runner

    @property
    def schema_version(self) -> int:
        """Read once at open: never the connection, which the worker thread owns."""
        return self.runner.store.schema_version

    absorb_peer = _OnStoreThread(Store.absorb_peer)
    ack = _OnStoreThread(Store.ack, short=_few_ids)
    active_unacked_of = _OnStoreThread(Store.active_unacked_of)
    adopt_host_key = _OnStoreThread(Store.adopt_host_key)
    answer_question = _OnStoreThread(Store.answer_question)
    # federation (SPEC §10): the broker's federation task, `send` to name@machine, `peers`; the
    # calls on a remote message's path, one small transaction each, may run on the loop (short)
    apply_remote_decision = _OnStoreThread(Store.apply_remote_decision)
    apply_remote_message = _OnStoreThread(Store.apply_remote_message, short=_short_remote_message)
    apply_remote_receipt = _OnStoreThread(Store.apply_remote_receipt, short=_always)
    apply_decision_receipt = _OnStoreThread(Store.apply_decision_receipt)
    drop_outbox_row = _OnStoreThread(Store.drop, short=_always)
    machines = _OnStoreThread(Store.machines)
    mark_relayed = _OnStoreThread(Store.mark_relayed, short=_always)
    mark_unconfirmed = _OnStoreThread(Store.mark_unconfirmed)
    outbox_item = _OnStoreThread(Store.outbox_item, short=_always)
    outbox_rows = _OnStoreThread(Store.outbox_rows)
    outbox_stats = _OnStoreThread(Store.outbox_stats)
    queue_receipt_updates = _OnStoreThread(Store.queue_receipt_updates)
    queue_remote_message = _OnStoreThread(Store.queue_remote_message, short=_short_remote_send)
    queue_team_decisions = _OnStoreThread(Store.queue_team_decisions)
    record_presence = _OnStoreThread(Store.record_presence)
    remote_marks = _OnStoreThread(Store.remote_marks)
    remote_session = _OnStoreThread(Store.remote_session, short=_always)
    remote_sessions = _OnStoreThread(Store.remote_sessions)
    ask_question = _OnStoreThread(Store.ask_question)
    catch_up = _OnStoreThread(Store.catch_up)
    create_peer = _OnStoreThread(Store.create_peer)
    decisions = _OnStoreThread(Store.decisions)
    decline_question = _OnStoreThread(Store.decline_question)
    end_job_run = _OnStoreThread(Store.end_job_run)
    find_jobs = _OnStoreThread(Store.find_jobs)
    find_peers_by_address = _OnStoreThread(Store.find_peers_by_address, short=_always)
    forget_peers = _OnStoreThread(Store.forget_peers)
    forget_remote = _OnStoreThread(Store.forget_remote)
    host_sessions_waiting = _OnStoreThread(Store.host_sessions_waiting)
    # Unseen: a search finds the same before and after it (broker.feeds.indexer)
    index_messages = _OnStoreThread(Store.index_messages, seen=False)
    forget_unused_peer = _OnStoreThread(Store.forget_unused_peer)
    get_peer = _OnStoreThread(Store.get_peer)
    host_sessions_for = _OnStoreThread(Store.host_sessions_for)
    instance_sessions = _OnStoreThread(Store.instance_sessions)
    job = _OnStoreThread(Store.job)
    job_event = _OnStoreThread(Store.job_event)
    job_note = _OnStoreThread(Store.job_note)
    jobs = _OnStoreThread(Store.jobs)
    list_peers = _OnStoreThread(Store.list_peers)
    message_hop = _OnStoreThread(Store.message_hop, short=_always)
    offer = _OnStoreThread(Store.offer, short=_few_ids)
    peer_by_host_session = _OnStoreThread(Store.peer_by_host_session)
    peer_with_secret = _OnStoreThread(Store.peer_with_secret)
    queued = _OnStoreThread(Store.queued)
    question = _OnStoreThread(Store.question)
    decision = _OnStoreThread(Store.decision)
    withdraw_question = _OnStoreThread(Store.withdraw_question)
    question_ids_starting = _OnStoreThread(Store.question_ids_starting)
    record_decision = _OnStoreThread(Store.record_decision)
    record_job = _OnStoreThread(Store.record_job)
    record_host_instance = _OnStoreThread(Store.record_host_instance)
    record_instance_session = _OnStoreThread(Store.record_instance_session)
    resolve_peer = _OnStoreThread(Store.resolve_peer)
    retract = _OnStoreThread(Store.retract)
    retractions = _OnStoreThread(Store.retractions)
    send = _OnStoreThread(Store.send, short=_few_sends)
    sent = _OnStoreThread(Store.sent)
    stored_send = _OnStoreThread(Store.stored_send, short=_always)
    session_addresses_taken = _OnStoreThread(Store.session_addresses_taken)
    sessions_last_seen_before = _OnStoreThread(Store.sessions_last_seen_before)
    set_secret = _OnStoreThread(Store.set_secret)
    touch_peers = _OnStoreThread(Store.touch_peers)
    unacked = _OnStoreThread(Store.unacked)
    update_peer = _OnStoreThread(Store.update_peer)


async def serve_store(
    db: Path,
    log: Callable[[str], None],
    *,
    fault: Callable[[str], None] = lambda point: None,
    task_status: trio.TaskStatus[StoreRunner] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Open and migrate the database, report the runner as started, hold it until cancelled,
    then checkpoint and close. `fault`: test-only crash points (common.faults)."""
    runner = StoreRunner()
    try:
        runner.store = await runner.run(Store.open, db, log, fault=fault)
        await runner.run(runner.watch_wal)
        task_status.started(runner)
        await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            try:
                if runner.store is not None:
                    await runner.run(runner.close_store)
            except (OSError, apsw.Error) as exc:  # committed data is in the WAL: the next open recovers it
                log(
                    f"could not checkpoint {db.name} on shutdown ({exc}); the next start recovers it from "
                    f"the WAL"
                )
        runner.stop()
