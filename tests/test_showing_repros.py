"""The four ways main a6f431d broke SPEC §3's promise ("lost: never; shown twice: only in the
kill window, and marked"), each replayed through real processes (issue 21)."""

from __future__ import annotations

import json
import pytest
import trio

from tests.conftest import BrokerProcess, run_cli, wait_for
from tests.test_delivery import RawHost, receipts

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("crossing", ["with-the-call", "after-the-result"])
async def test_a_cancel_earlier_in_the_session_never_lets_a_broker_kill_acknowledge_what_was_not_shown(
    env, home, crossing
):
    """A cancelled `inbox` early in a session, then a message that reached the host only as a
    log notification, then kill -9 of the broker: the message is still unacknowledged and the
    next `inbox` shows it."""
    broker = BrokerProcess(env, home).start()
    a = b = None
    try:
        with trio.fail_after(120):
            a = await RawHost.start(env, "--project", "/w/repro-a")
            b = await RawHost.start(env, "--project", "/w/repro-b")
            to_b = (await b.tool("whoami"))["name"]
            first = (await a.tool("send", to=to_b, text="first"))["message"]

            async def waiting() -> bool:
                return [m["id"] for m in await b.tool("inbox", peek=True, wait_seconds=1)] == [first["id"]]

            await wait_for(waiting, what="the first message in B's inbox")
            cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 0}}
            if crossing == "with-the-call":
                cancel["params"]["requestId"] = cancelled = b.next_id()
                await b.send({"jsonrpc": "2.0", "id": cancelled, "method": "tools/call", "params": b.call_tool("inbox")},
                             cancel)
            else:
                cancel["params"]["requestId"] = cancelled = await b.request("tools/call", b.call_tool("inbox"))
                await b.response(cancelled)
                await b.send(cancel)
            await b.response(await b.request("ping", {}))
            shown = await b.tool("inbox")
            assert [m["id"] for m in shown] == [first["id"]]

            second = (await a.tool("send", to=to_b, text="second"))["message"]

            async def announced() -> bool:
                await b.response(await b.request("ping", {}))
                return any(second["id"] in json.dumps(n) or "second" in json.dumps(n) for n in b.notifications)

            await wait_for(announced, what="the log notification for the second message")
            broker.kill()
            await a.tool("whoami")  # the next calls start a broker again
            await b.tool("whoami")
            assert receipts(home, [second["id"]])[second["id"]][1] is None, "acknowledged, never shown"
            assert [m["id"] for m in await b.tool("inbox")] == [second["id"]]
    finally:
        for host in (a, b):
            if host is not None:
                await host.close()
        broker.kill()
        run_cli(env, "down")  # the broker the relays started
