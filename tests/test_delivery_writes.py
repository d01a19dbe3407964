"""How many writes a delivery costs the relay: the broker's "held" push of a message and the
log line announcing its arrival reach the relay in one write (one wake-up of its reading
thread), seen in the system calls of the real broker process (strace)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import trio

from tests.conftest import run_cli, wait_for
from tests.test_delivery import MODERN_META, RawHost

pytestmark = pytest.mark.slow

WRITES = "sendto,sendmsg,write,writev"


def writes_to_relays(trace: Path) -> list[str]:
    """The write calls in an strace log whose data carries a bridge push (escaped JSON)."""
    return [line for line in trace.read_text(errors="replace").splitlines() if '\\"push\\":' in line]


async def test_a_message_held_and_its_arrival_announced_reach_the_relay_in_one_write(broker, env, tmp_path):
    strace = shutil.which("strace")
    assert strace is not None, "strace (Debian's strace) is needed to see the broker's writes"
    with trio.fail_after(60):
        host = await RawHost.start(env, "--project", "/w/one-write", "--host-session-id", "hs-one-write")
        try:
            me = await host.tool("whoami")
            trace = tmp_path / "broker.strace"
            tracer = subprocess.Popen(  # noqa: ASYNC220 - started once, stopped in `finally`
                [strace, "-f", "-qq", "-s", "65536", "-e", f"trace={WRITES}", "-e", "signal=none",
                 "-o", str(trace), "-p", str(broker.pid)],
                stderr=subprocess.PIPE, text=True,
            )
            try:
                # strace has attached once the broker's next write shows in its log: a status
                # request makes one.
                async def attached() -> bool:
                    await trio.to_thread.run_sync(lambda: run_cli(env, "status", "--json"))
                    return trace.exists() and '\\"ok\\":' in trace.read_text(errors="replace")

                await wait_for(attached, what="strace attached to the broker")
                sent = await trio.to_thread.run_sync(
                    lambda: run_cli(env, "send", me["name"], "one write for this", "--json"))
                mid = json.loads(sent.stdout)["message"]["id"]
                shown = await host.tool("inbox", wait_seconds=10)
                assert [m["id"] for m in shown] == [mid]
            finally:
                tracer.terminate()
                tracer.wait(timeout=10)
        finally:
            await host.end()
    pushes = writes_to_relays(trace)
    held = [line for line in pushes if re.search(r'\\"push\\":\\"held\\"', line) and mid in line]
    assert len(held) == 1, pushes
    # the same write carries the arrival's log line (notifications/message) for this message
    _, _, after = held[0].partition("notifications/message")
    assert "one write for this" in after, held[0]


@pytest.mark.parametrize("capabilities", [{}, {"experimental": {"claude/channel": {}}}],
                         ids=["plain", "declaring-channels"])
async def test_a_host_of_the_2026_protocol_is_shown_an_arrival_by_inbox_alone(broker, env, capabilities):
    """MCP 2026-07-28 (which Claude Code 2.1.332 speaks once the broker answers its
    `server/discover` probe) sends `notifications/message` only on the stream of a request that
    opted in (SEP-2577): an arrival is not announced with one (a host of the handshake era still
    gets it: the test above). Such a connection gets no channel messages either (Claude Code
    drops them there), so an arrival is never shown as one, even to a host whose envelope
    declares `claude/channel`: it waits in the inbox, and `inbox` shows it."""
    meta = {**MODERN_META, "io.modelcontextprotocol/clientCapabilities": capabilities}
    with trio.fail_after(60):
        host = await RawHost.start_modern(env, "--project", "/w/modern", "--host-session-id", "hs-modern",
                                          meta=meta)
        try:
            rid = await host.request("tools/call", {"name": "whoami", "arguments": {}, "_meta": meta})
            me = json.loads((await host.answer(rid))["result"]["content"][0]["text"])
            sent = await trio.to_thread.run_sync(
                lambda: run_cli(env, "send", me["name"], "shown by inbox alone", "--json"))
            mid = json.loads(sent.stdout)["message"]["id"]
            rid = await host.request("tools/call", {"name": "inbox", "arguments": {"wait_seconds": 10},
                                                    "_meta": meta})
            shown = json.loads((await host.answer(rid))["result"]["content"][0]["text"])
            assert [m["id"] for m in shown] == [mid], host.lines
            # one more request answered: a line sent after the inbox result would be read by now
            rid = await host.request("tools/call", {"name": "whoami", "arguments": {}, "_meta": meta})
            await host.answer(rid)
        finally:
            await host.end()
    announced = {"notifications/message", "notifications/claude/channel"}
    assert [m for m in host.lines if m.get("method") in announced] == []


async def test_a_message_waiting_before_the_host_initialized_is_announced_once_it_did(broker, env):
    """A handshake-era host gets the arrival's log line for a message that waited in its inbox
    before it initialized (the session's earlier process saw it not), as for one that arrives
    after."""
    args = ("--project", "/w/announced-late", "--host-session-id", "hs-announced-late")
    with trio.fail_after(60):
        first = await RawHost.start(env, *args)
        me = await first.tool("whoami")
        assert await first.end() == 0
        await trio.to_thread.run_sync(lambda: run_cli(env, "send", me["name"], "waited for you", "--json"))
        again = await RawHost.start(env, *args)
        try:
            while not any(m.get("method") == "notifications/message" and "waited for you" in json.dumps(m)
                          for m in again.notifications):
                assert await again._read_one(), again.lines
        finally:
            await again.end()
