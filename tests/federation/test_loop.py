"""federation/loop.py without NATS: calls cross, exceptions cross, cancellation crosses and waits for the
asyncio side to end, and the thread is gone when the context exits."""

from __future__ import annotations

import asyncio
import threading

import pytest
import trio

from agent_bridge.federation.loop import THREAD_NAME, AsyncioBridge, BridgeClosed, open_asyncio_bridge


def loop_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


async def test_a_call_runs_on_the_loop_thread_and_returns_its_value() -> None:
    with trio.fail_after(10):
        async with open_asyncio_bridge() as bridge:

            async def where(x: int) -> tuple[str, int, bool]:
                await asyncio.sleep(0)
                return threading.current_thread().name, x * 2, asyncio.get_running_loop() is bridge.loop

            assert await bridge.call(where, 21) == (THREAD_NAME, 42, True)
            # many at once, from several Trio tasks
            results: list[int] = []

            async def one(i: int) -> None:
                results.append((await bridge.call(where, i))[1])

            async with trio.open_nursery() as nursery:
                for i in range(50):
                    nursery.start_soon(one, i)
            assert sorted(results) == [i * 2 for i in range(50)]


async def test_an_exception_crosses_as_it_is() -> None:
    class Boom(Exception):
        pass

    async def fail() -> None:
        await asyncio.sleep(0)
        raise Boom("from asyncio")

    with trio.fail_after(10):
        async with open_asyncio_bridge() as bridge:
            with pytest.raises(Boom, match="from asyncio"):
                await bridge.call(fail)
            assert await bridge.call(asyncio.sleep, 0, "still works") == "still works"


async def test_trio_cancellation_cancels_the_asyncio_task_and_waits_for_its_end() -> None:
    seen: list[str] = []

    async def slow() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            seen.append("cancelled")
            await asyncio.sleep(0.05)  # cleanup that itself awaits: the Trio side waits for it
            seen.append("cleaned up")
            raise

    with trio.fail_after(10):
        async with open_asyncio_bridge() as bridge:
            with trio.move_on_after(0.2) as scope:
                await bridge.call(slow)
            assert scope.cancelled_caught
            assert seen == ["cancelled", "cleaned up"]
            # nothing of it is left on the loop
            assert await bridge.call(_other_tasks) == 0


async def _other_tasks() -> int:
    me = asyncio.current_task()
    return sum(
        1 for t in asyncio.all_tasks() if t is not me and not t.get_coro().__qualname__.endswith("main")
    )


async def test_the_thread_is_gone_after_the_context_and_calls_are_refused() -> None:
    with trio.fail_after(10):
        async with open_asyncio_bridge() as bridge:
            assert len(loop_threads()) == 1
            kept: AsyncioBridge = bridge
            thread = bridge.thread
        assert thread is not None and not thread.is_alive()
        assert loop_threads() == []
        with pytest.raises(BridgeClosed):
            await kept.call(asyncio.sleep, 0)


async def test_exiting_with_a_call_still_running_cancels_it_on_the_loop() -> None:
    ended = threading.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            ended.set()

    with trio.fail_after(10):
        with trio.move_on_after(0.1):
            async with open_asyncio_bridge() as bridge:
                await bridge.call(forever)
        assert ended.is_set()
        assert loop_threads() == []
