"""Waiting for the first of several things, for the dashboard's live stream and for the broker's
dashboard waiting to be wanted. Trio only: the broker imports it before Quart."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio


async def first_of(*waits: Callable[[], Awaitable[object]]) -> None:
    """Return as soon as any of `waits` returns (the others are cancelled)."""
    async with trio.open_nursery() as nursery:

        async def wait_then_end(wait: Callable[[], Awaitable[object]]) -> None:
            await wait()
            nursery.cancel_scope.cancel()

        for wait in waits:
            nursery.start_soon(wait_then_end, wait)
