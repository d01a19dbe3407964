"""Wake records (SPEC §3 "Reach": a wake is confirmed when its message is shown; §3
"Conversations": `woken` in `sent`): the idle-wake waiter hands a message over to wake its
session, and the broker records the request when the waiter fetches it; whether it was confirmed
is read from the receipt. The sender follows it through the `sent` tool of a real MCP session;
the recipient's host is a stand-in process (AGENT_BRIDGE_HOST_PID), as in test_wake.py, whose
waiter exits 2 with the message: Claude Code's asyncRewake, where that exit is the write that
shows it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trio

from agent_bridge.common import paths
from agent_bridge.ipc.client import open_bridge_client
from tests.conftest import call, mcp_session, wait_for
from tests.hooks.conftest import full_pipe
from tests.hooks.test_wake import finished, holders, host, start_waiter  # noqa: F401 - `host`: a fixture

pytestmark = pytest.mark.slow


def recipient(home: Path, project: Path, hsid: str) -> Any:
    record = paths.read_broker_json(home)
    assert record is not None
    hello = {"agent": "claude", "project": str(project), "hostSessionId": hsid}
    return open_bridge_client(record["socket"], hello)


async def test_a_wake_that_shows_the_message_is_confirmed(broker, env, home, project, host):  # noqa: F811
    with trio.fail_after(120):
        async with recipient(home, project, "hs-woken"), mcp_session(env, "--project", "/w/sender") as sender:
            waiter = start_waiter(home, project, "hs-woken", host)
            await wait_for(lambda: trio.to_thread.run_sync(holders, home), what="the waiter holds its lock")
            mid = (await call(sender, "send", to="hs-woken", text="the build is red"))["message"]["id"]
            code, _, err = await finished(waiter)
            assert code == 2 and mid in err.decode()
            (receipt,) = await call(sender, "sent", ids=[mid])
            assert (receipt["state"], receipt["woken"]) == ("acknowledged", "confirmed")


async def test_a_wake_whose_write_never_happened_stays_requested_until_the_message_is_shown(
    broker, env, home, project, host  # noqa: F811
):
    """The waiter fetched the message (the wake is requested) and was killed before its write:
    the message is not shown, and `sent` says so; shown later by another path within the 20 s,
    the wake counts as confirmed. (A request never followed by showing turns `unconfirmed` 20 s
    on: domain.wake_state, tests/test_receipts.py.)"""
    with trio.fail_after(120):
        read_end, write_end, _ = full_pipe()
        async with recipient(home, project, "hs-stuck") as (client, pushes), mcp_session(
            env, "--project", "/w/sender"
        ) as sender:
            waiter = start_waiter(home, project, "hs-stuck", host, stderr=write_end)
            os.close(write_end)
            try:
                await wait_for(
                    lambda: trio.to_thread.run_sync(holders, home), what="the waiter holds its lock"
                )
                mid = (await call(sender, "send", to="hs-stuck", text="are you there?"))["message"]["id"]

                async def requested() -> bool:
                    (r,) = await call(sender, "sent", ids=[mid])
                    return r["woken"] == "requested"

                await wait_for(requested, what="the waiter fetched the message")
                waiter.kill()
                waiter.wait(timeout=30)
            finally:
                if waiter.poll() is None:
                    waiter.kill()
                os.close(read_end)
            (receipt,) = await call(sender, "sent", ids=[mid])
            assert (receipt["state"], receipt["shownAt"], receipt["woken"]) == ("queued", None, "requested")
            # the recipient's own client shows it, then acknowledges it
            await client.request("offer", ids=[mid])
            await client.request("ack", ids=[mid])
            (receipt,) = await call(sender, "sent", ids=[mid])
            assert (receipt["state"], receipt["woken"]) == ("acknowledged", "confirmed")
            del pushes
