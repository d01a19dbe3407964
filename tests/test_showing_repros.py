"""The four ways main a6f431d broke SPEC §3's promise ("lost: never; shown twice: only in the
kill window, and marked"), each replayed through real processes (issue 21)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio

from agent_bridge.ipc.client import open_bridge_client
from tests.conftest import BrokerProcess, run_cli, wait_for
from tests.test_delivery import RawHost, hello, receipts, socket_of

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
                await b.send(
                    {
                        "jsonrpc": "2.0",
                        "id": cancelled,
                        "method": "tools/call",
                        "params": b.call_tool("inbox"),
                    },
                    cancel,
                )
            else:
                cancel["params"]["requestId"] = cancelled = await b.request(
                    "tools/call", b.call_tool("inbox")
                )
                await b.response(cancelled)
                await b.send(cancel)
            await b.response(await b.request("ping", {}))
            shown = await b.tool("inbox")
            assert [m["id"] for m in shown] == [first["id"]]

            second = (await a.tool("send", to=to_b, text="second"))["message"]

            async def announced() -> bool:
                await b.response(await b.request("ping", {}))
                return any(
                    second["id"] in json.dumps(n) or "second" in json.dumps(n) for n in b.notifications
                )

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


def occupy_pid(pid: int) -> subprocess.Popen[bytes] | None:
    """An unrelated process running as `pid` (the kernel reuses a pid: made to happen now, as
    root, through ns_last_pid); None where that cannot be done."""
    try:
        for _ in range(200):
            with open("/proc/sys/kernel/ns_last_pid", "w") as f:
                f.write(str(pid - 1))
            proc = subprocess.Popen(["sleep", "600"])
            if proc.pid == pid:
                return proc
            proc.kill()
            proc.wait()
    except OSError:
        pass
    return None


async def shown_in_an_outage(
    env, home, count: int, *, kill_relay: bool = True, reuse_pid: bool = False
) -> None:
    """`count` messages wait for a session; the broker is killed, and cannot be restarted by the
    session (its relay's environment makes any broker it starts refuse); the agent reads them
    all (the relay shows what it holds, keeping the acknowledgements in its ledger). Then
    either the relay is killed -9 (with `reuse_pid`, its pid then goes to an unrelated process)
    and the broker and a new relay for the same host session come back, or the broker comes
    back to the same relay. Nothing may be shown unmarked twice."""
    broker = BrokerProcess(env, home).start()
    rx_env = {**env, "AGENT_BRIDGE_HOP_LIMIT": "0"}
    args = ("--project", "/w/ledger", "--host-session-id", "hs-ledger")
    shown: list[dict[str, Any]] = []
    squatter = None
    try:
        with trio.fail_after(300):
            rx = await RawHost.start(rx_env, *args)
            try:
                async with open_bridge_client(socket_of(home), hello("hs-ledger-tx")) as (tx, _):
                    ids = [(await tx.request("send", to="hs-ledger", text=f"note {i}"))["message"]["id"]
                           for i in range(count)]

                async def all_here() -> bool:
                    return len(await rx.tool("inbox", peek=True, wait_seconds=1)) == min(count, 10_000)

                await wait_for(all_here, timeout=120, what="the messages in the receiver's inbox")
                broker.kill()
                while len(shown) < count:
                    page = await rx.tool("inbox")
                    assert page, "the relay stopped showing what it holds"
                    shown.extend(page)
                assert sorted(m["id"] for m in shown) == sorted(ids)
            finally:
                if kill_relay:
                    await rx.kill()
            if reuse_pid:
                squatter = occupy_pid(rx.proc.pid)
                if squatter is None:
                    pytest.skip("this machine does not let a test hand a pid to a new process")
            broker.start()
            if kill_relay:
                rx = await RawHost.start(env, *args)
            else:  # the relay joins the broker again by itself (until then its tools say why not)

                async def joined() -> bool:
                    answer = await rx.response(await rx.request("tools/call", rx.call_tool("whoami")))
                    return not answer.get("isError")

                await wait_for(joined, what="the relay connected to the broker again")
            try:
                async with open_bridge_client(socket_of(home), hello("hs-ledger-tx")) as (tx, _):
                    sentinel = (await tx.request("send", to="hs-ledger", text="sentinel"))["message"]["id"]
                seen: list[dict[str, Any]] = []

                async def sentinel_seen() -> bool:
                    seen.extend(await rx.tool("inbox", wait_seconds=1))
                    return any(m["id"] == sentinel for m in seen)

                await wait_for(sentinel_seen, timeout=120, what="the sentinel (delivery is oldest first)")
                shown.extend(m for m in seen if m["id"] != sentinel)
            finally:
                await rx.close()
    finally:
        broker.kill()
        if squatter is not None:
            squatter.kill()
            squatter.wait()
    unmarked = [m["id"] for m in shown if not m.get("repeat")]
    assert len(unmarked) == len(set(unmarked)) == count, (
        f"{len(unmarked) - len(set(unmarked))} message(s) shown unmarked twice")


async def test_a_ledger_whose_writers_pid_was_reused_is_still_applied(env, home):
    """Repro 2: the ledger names its writer by pid and start time; an unrelated process that
    got the pid since does not keep it from being applied."""
    await shown_in_an_outage(env, home, 5, reuse_pid=True)


@pytest.mark.parametrize("then", ["the-broker-comes-back", "the-relay-is-killed"])
async def test_every_id_shown_in_an_outage_is_kept_past_ten_thousand(env, home, then):
    """Repro 3: 10,050 messages shown in two `inbox` calls while the broker is down: every
    acknowledgement and offer is kept (the hello and the ledger kept 10,000), so none comes
    back unmarked."""
    await shown_in_an_outage(env, home, 10_050, kill_relay=then == "the-relay-is-killed")


def stray_files(folder: Path) -> list[str]:
    """Files a ledger folder may hold that agent-bridge did not write."""
    folder.mkdir(mode=0o700, parents=True)
    (folder / "x.²³.json").write_text("{}")  # str.isdigit() says yes, int() says no
    (folder / "x.99999999999999999999.json").write_text("{}")  # past what os.kill takes
    (folder / "y.99999999999999999999-1.json").write_text("{}")
    os.mkfifo(folder / "peer.12345-1.json")  # a ledger's name, but a FIFO: reading it waits forever
    os.symlink("/dev/zero", folder / "peer.12346-1.json")  # endless
    (folder / "peer.12347-1.json").write_text("not json")
    (folder / "peer.12348-1.json").write_text("[" * 200_000 + "]" * 200_000)  # deeper than the parser goes
    (folder / "peer.12349-1.json").write_text(json.dumps({"peerId": 5, "offered": [], "acked": []}))
    return sorted(os.listdir(folder))


async def test_stray_files_in_the_ledger_folder_block_no_session(env, home):
    """Repro 4: files in `<home>/acks` the code did not write are moved aside with one log line
    each; sessions connect and the Stop hook works as if they were not there."""
    strays = stray_files(home / "acks")
    broker = BrokerProcess(env, home).start()
    try:
        with trio.fail_after(120):
            rx = await RawHost.start(env, "--project", "/w/strays", "--host-session-id", "hs-strays")
            try:
                assert (await rx.tool("whoami"))["hostSessionId"] == "hs-strays"
            finally:
                await rx.close()
        assert os.listdir(home / "acks") == []
        assert sorted(os.listdir(home / "acks.ignored")) == strays
        log = (home / "broker.log").read_text(encoding="utf-8")
        for name in strays:
            assert sum(f"moved {name!r}" in line for line in log.splitlines()) == 1, name
        assert "Traceback" not in log
    finally:
        broker.stop()

