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

from tests.conftest import run_cli
from tests.test_delivery import RawHost

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
                while not trace.exists() or '\\"ok\\":' not in trace.read_text(errors="replace"):
                    await trio.to_thread.run_sync(lambda: run_cli(env, "status", "--json"))
                    await trio.sleep(0.05)
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
