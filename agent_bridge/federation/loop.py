"""An asyncio event loop on its own thread, owned by one Trio task (STYLE 16).

nats-py speaks only asyncio. Rather than change asyncio for the whole process (trio-asyncio does, and
broke this), the broker runs one asyncio loop in one thread it owns, exactly as the store's worker
thread: `open_asyncio_bridge()` starts the thread and yields an `AsyncioBridge` once the loop runs, and
the thread is gone when the context exits.

    async with open_asyncio_bridge() as bridge:
        pub_ack = await bridge.call(js.publish, subject, body)

`call` crosses into the loop thread with `loop.call_soon_threadsafe` and comes back with the Trio token.
Cancelling the Trio side cancels the asyncio task and waits (shielded, at most CANCEL_GRACE) until it has
really ended, so nothing keeps running on the loop for a call its caller gave up on. (Not
`asyncio.run_coroutine_threadsafe`: its future reports "cancelled" at once, before the coroutine has
run its cleanup, and never at all for one cancelled before it started.) An exception raised on the
asyncio side is raised by `call` as it is. Nothing outside this module touches the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Generic, TypeVar

import trio

T = TypeVar("T")

# How long a cancelled call, and the loop's own shutdown, may take to finish on the asyncio side
# before the Trio side stops waiting: nats-py's close() takes about 1 ms, a cancelled request less.
CANCEL_GRACE = 5.0
THREAD_NAME = "agent-bridge-asyncio"


class BridgeClosed(RuntimeError):
    """A call after the bridge's context has exited (or while it exits)."""


class AsyncioCancelled(RuntimeError):
    """The asyncio side cancelled a call the Trio side did not cancel (the loop shutting down)."""


class AsyncioBridge:
    """Calls into one asyncio loop running on another thread (made by open_asyncio_bridge)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, token: trio.lowlevel.TrioToken) -> None:
        self._loop = loop
        self._token = token
        self._closed = False
        self.thread: threading.Thread | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def to_trio(self, fn: Callable[[], None]) -> None:
        """From the asyncio thread: run `fn()` soon on the Trio thread (dropped once Trio has ended)."""
        try:
            self._token.run_sync_soon(fn)
        except trio.RunFinishedError:
            pass

    async def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run `await fn(*args)` on the asyncio loop and return (or raise) what it does."""
        return await self.submit(fn, *args).result()

    def submit(self, fn: Callable[..., Awaitable[T]], *args: Any) -> Submitted[T]:
        """Start `await fn(*args)` on the asyncio loop now, without waiting: its caller goes on
        (a send's answer) while the loop's thread wakes. Await `result()` once, always: it
        returns or raises what `call` would, and a Trio cancellation there cancels the call."""
        if self._closed:
            raise BridgeClosed("the asyncio loop is stopped")
        return Submitted(self._loop, self._token, fn, args)


class Submitted(Generic[T]):
    """A call started on the asyncio loop (AsyncioBridge.submit), its outcome to await."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, token: trio.lowlevel.TrioToken,
        fn: Callable[..., Awaitable[T]], args: tuple[Any, ...],
    ) -> None:
        self._loop = loop
        done = self._done = trio.Event()
        box: dict[str, Any] = {}
        self._box = box

        def finished(task: asyncio.Task[T]) -> None:  # on the asyncio thread
            box["task_done"] = task
            try:
                token.run_sync_soon(done.set)
            except trio.RunFinishedError:  # the Trio run is gone: nobody waits any more
                pass

        def start() -> None:  # on the asyncio thread
            task = loop.create_task(_awaited(fn, args))
            box["task"] = task
            task.add_done_callback(finished)

        try:
            loop.call_soon_threadsafe(start)
        except RuntimeError:  # the loop was closed under us
            raise BridgeClosed("the asyncio loop is stopped") from None

    async def result(self) -> T:
        done, box = self._done, self._box
        try:
            await done.wait()
        except trio.Cancelled:
            # call_soon_threadsafe runs callbacks in order: `start` has run before `cancel` does
            with contextlib.suppress(RuntimeError):  # a closed loop has ended the task already
                self._loop.call_soon_threadsafe(lambda: box["task"].cancel())
            with trio.move_on_after(CANCEL_GRACE) as scope:
                scope.shield = True
                await done.wait()
            raise
        task: asyncio.Task[T] = box["task_done"]
        if task.cancelled():
            raise AsyncioCancelled("the call was cancelled on the asyncio side (the loop is stopping)")
        return task.result()  # raises what the coroutine raised


async def _awaited(fn: Callable[..., Awaitable[T]], args: tuple[Any, ...]) -> T:
    return await fn(*args)


@asynccontextmanager
async def open_asyncio_bridge() -> AsyncIterator[AsyncioBridge]:
    """Start an asyncio loop on a thread of its own; yield the bridge once it runs; on exit cancel
    what still runs there, stop the loop and join the thread (shielded, at most CANCEL_GRACE)."""
    token = trio.lowlevel.current_trio_token()
    running = trio.Event()
    holder: dict[str, Any] = {}

    async def main() -> None:  # the loop thread's only top-level coroutine
        holder["loop"] = asyncio.get_running_loop()
        holder["stop"] = stop = asyncio.Event()
        token.run_sync_soon(running.set)
        await stop.wait()

    def run() -> None:
        try:
            asyncio.run(main())  # on return: leftover tasks cancelled, async generators closed, loop closed
        except BaseException as exc:  # reported to the Trio side, which re-raises it
            holder["error"] = exc
        finally:
            try:
                token.run_sync_soon(running.set)  # in case it failed before it ran
            except trio.RunFinishedError:
                pass

    thread = threading.Thread(target=run, name=THREAD_NAME, daemon=True)
    thread.start()
    try:
        await running.wait()
    except trio.Cancelled:
        await _stop(holder, thread)
        raise
    if "error" in holder:
        raise holder["error"]
    bridge = AsyncioBridge(holder["loop"], token)
    bridge.thread = thread
    try:
        yield bridge
    finally:
        bridge._closed = True
        await _stop(holder, thread)


async def _stop(holder: dict[str, Any], thread: threading.Thread) -> None:
    loop: asyncio.AbstractEventLoop | None = holder.get("loop")
    if loop is not None:
        try:
            loop.call_soon_threadsafe(holder["stop"].set)
        except RuntimeError:  # already closed
            pass
    with trio.move_on_after(CANCEL_GRACE) as scope:
        scope.shield = True
        await trio.to_thread.run_sync(thread.join, abandon_on_cancel=True)
