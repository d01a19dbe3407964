"""`agent-bridge mcp` as a relay (agent_bridge.relay.main): a standard-library process that pumps the
host's JSON-RPC lines to the broker, which serves MCP itself (broker.mcp.host). Real processes,
real stdio spoken by hand, a real broker killed with SIGKILL."""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from agent_bridge.broker.mcp import bridge, static
from agent_bridge.common import domain, ledger, tools
from agent_bridge.relay import main as relay
from tests.conftest import BrokerProcess, run_cli, wait_for
from tests.reliability.harness import (
    KILLED,
    start_faulty_broker,
    stop_any_broker,
    wait_killed,
    wait_new_broker,
)
from tests.test_delivery import PROTOCOL, RawHost, receipts

pytestmark = pytest.mark.slow

HEAVY = ("trio", "mcp", "mcp_types", "pydantic", "pydantic_core", "anyio", "tomlkit")


async def test_a_broker_killed_mid_call_answers_every_request_exactly_once(env, home):
    """The broker dies (SIGKILL, its own fault point) while the relay has two calls in flight:
    an `inbox` long poll and the `send` being committed. The relay starts a new broker, replays
    the host's `initialize` to it (its answer goes nowhere), resends the poll, which the new
    broker answers when a message arrives, and answers the `send` with the "may or may not"
    error. Every request is answered exactly once, and the relay answers only the host's ids."""
    broker = start_faulty_broker(env, home, "send:before-commit@1")
    try:
        with trio.fail_after(120):
            host = await RawHost.start(
                env, "--project", "/w/relay-kill", "--host-session-id", "hs-relay-kill"
            )
            me = await host.tool("whoami")
            poll = await host.call_request("inbox", wait_seconds=60)
            sent = await host.call_request("send", to=me["name"], text="during the crash")
            assert await wait_killed(broker) == KILLED
            await wait_new_broker(home, broker.pid)
            failed = (await host.answer(sent))["result"]
            assert (
                failed["isError"] and "may or may not have been recorded" in failed["content"][0]["text"]
            ), failed
            # The poll now waits in the new broker: a message wakes it.
            done = await trio.to_thread.run_sync(
                lambda: run_cli(env, "send", me["name"], "after the crash", "--json")
            )
            assert done.returncode == 0, done.stderr
            shown = json.loads((await host.answer(poll))["result"]["content"][0]["text"])
            assert [m["text"] for m in shown] == ["after the crash"]
            # the new broker serves this session: initialized, same record
            assert await host.tool("whoami") == me
            assert await host.end() == 0
    finally:
        broker.kill()
        stop_any_broker(env)
    answered = [m["id"] for m in host.lines if "result" in m or "error" in m]
    assert len(answered) == len(set(answered)), f"a request was answered twice: {answered}"
    assert all(isinstance(rid, int) for rid in answered), (
        f"an answer to a request the host never sent: {answered}"
    )
    assert sorted(answered) == list(range(1, max(answered) + 1))  # and every one was answered


async def test_the_relay_process_never_imports_trio_the_sdk_or_pydantic(broker, env, tmp_path):
    """A real `agent-bridge mcp` serving a host through a real broker, then with no broker:
    its own imports (`python -X importtime`) hold none of the heavy packages."""
    stderr = tmp_path / "imports.txt"
    # Once the broker is stopped the relay would start one of its own, left running after the
    # test: an invalid hop limit in its environment makes any broker it starts refuse to run.
    relay_env = {**env, "AGENT_BRIDGE_HOP_LIMIT": "0"}
    with open(stderr, "wb") as errors, trio.fail_after(60):  # noqa: ASYNC230 - before anything runs
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-X", "importtime", "-m", "agent_bridge", "mcp", "--project", "/w/light"],
            env=relay_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors,
        )
        host = RawHost(proc)
        await host.answer(
            await host.request(
                "initialize",
                {
                    "protocolVersion": PROTOCOL,
                    "capabilities": {},
                    "clientInfo": {"name": "relay-test", "version": "1"},
                },
            )
        )
        await host.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        await host.answer(await host.request("tools/list", {}))
        me = await host.tool("whoami")
        await host.tool("send", to=me["name"], text="to myself")
        await host.tool("inbox")
        await trio.to_thread.run_sync(broker.stop)
        await host.answer(await host.request("tools/list", {}))  # answered by the relay alone
        await host.answer(await host.request("ping", {}))
        assert await host.end() == 0
    imported = {line.split("|")[-1].strip().split(".")[0] for line in stderr.read_text().splitlines()
                if line.startswith("import time:") and "|" in line}
    assert "agent_bridge" in imported, "no import listing: the check would pass for nothing"
    assert not imported & set(HEAVY), sorted(imported & set(HEAVY))


def test_the_shipped_static_answers_are_what_the_server_answers():
    """`initialize`, `tools/list` and the error shapes the relay answers with no broker are
    generated from the real server (`python -m agent_bridge.broker.mcp.static`), never copied."""
    assert relay.STATIC.read_text(encoding="utf-8") == static.static_text(), (
        "agent_bridge/relay/mcp_static.json is stale: run python -m agent_bridge.broker.mcp.static"
    )


async def test_with_no_broker_the_relay_answers_what_needs_none_and_says_why_for_tools(env, home):
    """A broker that cannot start: `initialize`, `tools/list` and `ping` are answered as the real
    server answers them; a tool call gets the start failure as a tool error."""
    from tests.test_refusals import newer_database

    newer_database(home)
    with trio.fail_after(120):
        host = await RawHost.start(env, "--agent", "codex", "--project", "/w/alone")
        listed = (await host.answer(await host.request("tools/list", {})))["result"]
        assert listed == json.loads(relay.STATIC.read_text())["tools/list"]
        assert {t["name"] for t in listed["tools"]} == set(tools.TOOLS)
        assert (await host.answer(await host.request("ping", {})))["result"] == {}
        failed = (await host.answer(await host.call_request("whoami")))["result"]
        assert failed["isError"] and "schema version 99" in failed["content"][0]["text"], failed
        initialized = host.answers(1)[0]["result"]
        assert initialized["serverInfo"]["name"] == "agent-bridge" and "claude/channel" not in str(
            initialized
        )
        assert await host.end() == 0


async def test_stdin_closed_ends_the_relay_and_acknowledges_only_what_was_written(broker, env, home):
    """The host closes stdin: the relay exits 0, the inbox result it wrote is acknowledged, and
    the message that arrived after it, never written, is not."""
    with trio.fail_after(60):
        host = await RawHost.start(env, "--project", "/w/relay-eof", "--host-session-id", "hs-relay-eof")
        me = await host.tool("whoami")
        first = (await trio.to_thread.run_sync(lambda: run_cli(env, "send", me["name"], "shown", "--json")))
        first_id = json.loads(first.stdout)["message"]["id"]

        async def arrived() -> bool:
            return bool(await host.tool("inbox", peek=True, wait_seconds=1))

        await wait_for(arrived, what="the first message in the inbox")
        assert [m["id"] for m in await host.tool("inbox")] == [first_id]
        second = await trio.to_thread.run_sync(
            lambda: run_cli(env, "send", me["name"], "never shown", "--json")
        )
        second_id = json.loads(second.stdout)["message"]["id"]

        async def second_held() -> bool:
            return [m["id"] for m in await host.tool("inbox", peek=True, wait_seconds=1)] == [second_id]

        await wait_for(second_held, what="the second message in the inbox")
        assert await host.end() == 0

        async def recorded() -> bool:
            return receipts(home, [first_id])[first_id][1] is not None

        await wait_for(recorded, what="the written result's acknowledgement")
    assert receipts(home, [second_id])[second_id][1] is None


async def test_a_host_leaving_during_a_waiting_inbox_ends_the_relay_at_once_and_shows_nothing(
    broker, env, home
):
    """Issue 35 "Exit promptly": the host closes stdin while an `inbox(wait_seconds: 30)` waits.
    Nobody reads that answer now: the relay cancels the call as the host would have, so it
    does not wait ANSWERS_AT_EXIT for it, and a message that arrives later is neither shown
    nor acknowledged."""
    with trio.fail_after(60):
        host = await RawHost.start(env, "--project", "/w/relay-leave", "--host-session-id", "hs-leave")
        me = await host.tool("whoami")
        waiting = await host.call_request("inbox", wait_seconds=30)
        await host.tool("peers")  # answered after the inbox call was forwarded: it waits in the broker
        assert host.proc.stdin is not None
        await host.proc.stdin.aclose()
        started = time.monotonic()
        await host.drain()  # what the relay still writes, until it closes stdout
        assert await host.proc.wait() == 0
        took = time.monotonic() - started
        assert took < relay.ANSWERS_AT_EXIT, took  # before, it waited that long for the inbox
        assert host.answers(waiting) == []  # its answer never came: nobody was to read it
        later = await trio.to_thread.run_sync(lambda: run_cli(env, "send", me["name"], "later", "--json"))
        later_id = json.loads(later.stdout)["message"]["id"]
    assert receipts(home, [later_id])[later_id][1] is None  # not acknowledged for a wait that ended


# serial: it pauses the broker (SIGSTOP) within CANCEL_GRACE of a result, a window that other
# processes on two cores can make it miss. (The failure CI of 2026-12-05 met here, no ledger
# written, was the relay's: see the test below.)
@pytest.mark.serial
@pytest.mark.parametrize("cancelled", [False, True], ids=["read", "cancelled"])
@pytest.mark.parametrize("leaving", ["stdin closed", "SIGTERM"])
async def test_a_host_leaving_while_the_broker_cannot_confirm_leaves_what_it_was_shown_in_the_ledger(
    broker, env, home, leaving, cancelled
):
    """The host reads an inbox result, then leaves (closes stdin; or ends the relay with
    SIGTERM, as hosts do) while the broker is paused (SIGSTOP), so it cannot confirm the
    acknowledgement: not within ACK_FLUSH_AT_EXIT, not at all before a signal. The relay exits
    anyway, and leaves what it showed in the ledger (agent_bridge.common.ledger) as a process gone:
    once the broker runs again, the next session of that host is not shown the message again.

    Unless the host cancelled that request after the result was written (the cancel crossed
    it, so the host ignored it): then nothing is acknowledged, and the next session is shown
    the message again, marked as a repeat."""
    with trio.fail_after(60):
        host = await RawHost.start(
            env, "--project", "/w/relay-slow-exit", "--host-session-id", "hs-relay-slow"
        )
        me = await host.tool("whoami")

        async def arrived() -> bool:
            return bool(await host.tool("inbox", peek=True, wait_seconds=1))

        for _ in range(5):  # paused within CANCEL_GRACE of the result: almost always the first time
            sent = await trio.to_thread.run_sync(
                lambda: run_cli(env, "send", me["name"], "shown at the end", "--json")
            )
            mid = json.loads(sent.stdout)["message"]["id"]
            await wait_for(arrived, what="the message in the inbox")
            rid = await host.call_request("inbox")
            shown = json.loads((await host.answer(rid))["result"]["content"][0]["text"])
            assert [m["id"] for m in shown] == [mid]
            os.kill(broker.pid, signal.SIGSTOP)
            if receipts(home, [mid])[mid][1] is None:
                break
            os.kill(broker.pid, signal.SIGCONT)  # it recorded the acknowledgement first: again
        else:
            pytest.fail("the broker recorded every acknowledgement before it could be paused")
        try:
            if cancelled:
                await host.send(
                    {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": rid}}
                )
            if leaving == "SIGTERM":
                host.proc.send_signal(signal.SIGTERM)
                assert await host.proc.wait() == 0
            else:
                assert await host.end() == 0
            left = [json.loads(f.read_text()) for f in (home / ledger.FOLDER).glob("*.json")]
            # Cancelled: not acknowledged, though it may be kept as offered (maybe read: a repeat).
            assert [mid in record["acked"] for record in left] == (
                [False] * len(left) if cancelled else [True]
            ), left
        finally:
            os.kill(broker.pid, signal.SIGCONT)
        again = await RawHost.start(
            env, "--project", "/w/relay-slow-exit", "--host-session-id", "hs-relay-slow"
        )
        assert await again.tool("whoami") == me
        if cancelled:  # (a repeat if this broker never heard of the cancel; told, it takes the offer back)
            assert receipts(home, [mid])[mid][1] is None
            assert [m["id"] for m in await again.tool("inbox")] == [mid]
        else:
            assert await again.tool("inbox") == []
            assert receipts(home, [mid])[mid][1] is not None
        assert not list((home / ledger.FOLDER).glob("*.json"))  # applied and removed
        assert await again.end() == 0


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_a_signal_between_writing_a_result_and_noting_it_shown_keeps_it_in_the_ledger(
    broker, env, home, signum
):
    """The host reads an inbox result and ends the relay with a signal before the relay has
    noted the message shown: the relay stops itself right after the write
    (AGENT_BRIDGE_FAULT=relay:after-write/stop), the broker is paused so it cannot confirm,
    the signal is sent and the relay let go on. Its handler runs on the thread that wrote,
    inside that block: it leaves once the message is noted, so the ledger keeps it
    acknowledged and the next session is not shown it again. (Run there at once, it found
    nothing noted and kept nothing: the message came back as a repeat of one the host read.
    CI of 2026-12-05 met it in the test above, when the relay was slow after a write.)"""
    with trio.fail_after(60):
        project = ("--project", "/w/relay-signal-mid-write", "--host-session-id", "hs-mid-write")
        host = await RawHost.start({**env, "AGENT_BRIDGE_FAULT": "relay:after-write/stop"}, *project)
        async with ended_at_last(host):
            me = await host.tool("whoami")
            sent = await trio.to_thread.run_sync(run_cli, env, "send", me["name"], "read, gone", "--json")
            mid = json.loads(sent.stdout)["message"]["id"]
            rid = await host.call_request("inbox", wait_seconds=10)
            shown = json.loads((await host.answer(rid))["result"]["content"][0]["text"])
            assert [m["id"] for m in shown] == [mid]
            await stopped_at_fault(host)
            os.kill(broker.pid, signal.SIGSTOP)
            try:
                host.proc.send_signal(signum)
                os.kill(host.proc.pid, signal.SIGCONT)
                assert await host.proc.wait() == 0
                left = [json.loads(f.read_text()) for f in (home / ledger.FOLDER).glob("*.json")]
                assert [mid in record["acked"] for record in left] == [True], left
                assert receipts(home, [mid])[mid][1] is None  # the broker never heard of it
            finally:
                os.kill(broker.pid, signal.SIGCONT)
        again = await RawHost.start(env, *project)
        assert await again.tool("whoami") == me
        assert await again.tool("inbox") == []
        assert receipts(home, [mid])[mid][1] is not None
        assert not list((home / ledger.FOLDER).glob("*.json"))  # applied and removed
        assert await again.end() == 0


async def test_a_signal_between_showing_held_messages_and_noting_it_keeps_them_in_the_ledger(env, home):
    """The same with no broker: the relay shows what it holds (the broker was killed, and any
    broker this relay starts refuses it), and SIGTERM comes between the write and the noting.
    The ledger keeps the message acknowledged, and the broker that comes back does not show
    it again."""
    broker = BrokerProcess(env, home).start()
    project = ("--project", "/w/relay-signal-alone", "--host-session-id", "hs-signal-alone")
    try:
        with trio.fail_after(60):
            alone_env = {**env, "AGENT_BRIDGE_HOP_LIMIT": "0", "AGENT_BRIDGE_FAULT": "relay:after-write/stop"}
            host = await RawHost.start(alone_env, *project)
            async with ended_at_last(host):
                me = await host.tool("whoami")
                sent = await trio.to_thread.run_sync(run_cli, env, "send", me["name"], "held, read", "--json")
                mid = json.loads(sent.stdout)["message"]["id"]

                async def held() -> bool:
                    return bool(await host.tool("inbox", peek=True, wait_seconds=1))

                await wait_for(held, what="the message held by the relay")
                broker.kill()
                rid = await host.call_request("inbox")
                shown = json.loads((await host.answer(rid))["result"]["content"][0]["text"])
                assert [m["id"] for m in shown] == [mid]
                await stopped_at_fault(host)
                host.proc.send_signal(signal.SIGTERM)
                os.kill(host.proc.pid, signal.SIGCONT)
                assert await host.proc.wait() == 0
            left = [json.loads(f.read_text()) for f in (home / ledger.FOLDER).glob("*.json")]
            assert [mid in record["acked"] for record in left] == [True], left
            broker.start()
            again = await RawHost.start(env, *project)
            assert await again.tool("whoami") == me
            assert await again.tool("inbox") == []
            assert receipts(home, [mid])[mid][1] is not None
            assert await again.end() == 0
    finally:
        broker.stop()


async def test_a_signal_while_the_host_no_longer_reads_a_long_result_ends_the_relay(broker, env, home):
    """The host stops reading its output and asks for an inbox result longer than the pipe
    holds, then ends the relay with SIGTERM while the write waits. The handler, which waits
    for a line that is being written to be noted, does not wait for this one (it would never
    end): the relay exits, and keeps nothing of the messages acknowledged, since they were not
    written whole. The next session is shown them again."""
    with trio.fail_after(60):
        project = ("--project", "/w/relay-unread-result", "--host-session-id", "hs-unread-result")
        host = await RawHost.start(env, *project)
        async with ended_at_last(host):
            me = await host.tool("whoami")
            # No log line per arrival (each carries the text, and they would fill the pipe first).
            await host.response(await host.request("logging/setLevel", {"level": "error"}))
            assert host.proc.stdout is not None
            room = fcntl.fcntl(host.proc.stdout.fileno(), fcntl.F_GETPIPE_SZ)
            ids = []
            for n in range(room // domain.MESSAGE_TEXT_MAX + 2):  # more than the pipe takes, in one result
                text = f"{n}: " + "x" * (domain.MESSAGE_TEXT_MAX - 10)
                sent = await trio.to_thread.run_sync(run_cli, env, "send", me["name"], text, "--json")
                ids.append(json.loads(sent.stdout)["message"]["id"])
            await host.call_request("inbox")  # its answer is never read

            async def writing() -> bool:
                # (pipe_write, or anon_pipe_write on newer kernels: where its main thread waits)
                wchan = await trio.Path(f"/proc/{host.proc.pid}/wchan").read_text()
                return wchan.endswith("pipe_write")

            await wait_for(writing, what="the relay's write of the result waiting for the host")
            host.proc.send_signal(signal.SIGTERM)
            assert await host.proc.wait() == 0
        left = [json.loads(f.read_text()) for f in (home / ledger.FOLDER).glob("*.json")]
        assert not [mid for record in left for mid in record["acked"] if mid in ids], left
        assert all(acked is None for _, acked in receipts(home, ids).values())
        again = await RawHost.start(env, *project)
        assert await again.tool("whoami") == me
        assert [m["id"] for m in await again.tool("inbox")] == ids
        assert await again.end() == 0


async def stopped_at_fault(host: RawHost) -> None:
    """Until the relay stopped itself at its fault point (it is this process's child: waitid
    reports the stop, and leaves it reportable)."""
    flags = os.WSTOPPED | os.WNOWAIT
    await trio.to_thread.run_sync(os.waitid, os.P_PID, host.proc.pid, flags, abandon_on_cancel=True)


@asynccontextmanager
async def ended_at_last(host: RawHost) -> AsyncIterator[None]:
    """The relay let go on and killed if the test ends before it did."""
    try:
        yield
    finally:
        if host.proc.returncode is None:
            with trio.CancelScope(shield=True):
                os.kill(host.proc.pid, signal.SIGCONT)
                await host.kill()


def _signals_held(pid: int) -> set[int]:
    """The signals process `pid` holds (blocks), from /proc."""
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("SigBlk:"))
    mask = int(line.split()[1], 16)
    return {n for n in range(1, 65) if mask & (1 << (n - 1))}


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


async def test_a_broker_started_by_a_relay_stops_on_sigterm(env, home):
    """The relay's threads hold SIGINT and SIGTERM (its main thread alone takes them), and a
    child inherits what its thread holds: the broker a relay starts takes them again, so
    `agent-bridge down` and a user's `kill` stop it."""
    try:
        with trio.fail_after(60):
            host = await RawHost.start(
                env, "--project", "/w/relay-starts", "--host-session-id", "hs-relay-starts"
            )
            await host.tool("whoami")  # answered by the broker this relay started
            pid = json.loads((home / "broker.json").read_text())["pid"]
            assert not _signals_held(pid) & {signal.SIGTERM, signal.SIGINT}
            os.kill(pid, signal.SIGTERM)

            async def gone() -> bool:
                return _gone(pid)

            await wait_for(gone, what="the broker's exit on SIGTERM")
            await host.kill()
    finally:
        stop_any_broker(env)


def _policies(pid: int) -> dict[int, int]:
    """Each thread's scheduling policy (sched(7)), by thread id (the main thread's is `pid`)."""
    tids = [int(task.name) for task in Path(f"/proc/{pid}/task").iterdir()]
    return {tid: os.sched_getscheduler(tid) for tid in tids}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_BATCH is Linux's")
async def test_the_relay_s_pump_runs_batched_and_the_broker_it_starts_does_not(env, home):
    """The relay's pump thread (its main thread: every frame passes through it) runs at
    SCHED_BATCH, so a broker's push wakes it without preempting the broker mid-write
    (relay.pump.batched); its other threads, and the broker it starts from one of them, keep the
    normal policy."""
    try:
        with trio.fail_after(60):
            host = await RawHost.start(
                env, "--project", "/w/relay-batch", "--host-session-id", "hs-relay-batch"
            )
            await host.tool("whoami")  # answered by the broker this relay started
            relay_pid = host.proc.pid
            relay_threads = _policies(relay_pid)
            broker_threads = _policies(json.loads((home / "broker.json").read_text())["pid"])
            await host.kill()
    finally:
        stop_any_broker(env)
    assert relay_threads.pop(relay_pid) == os.SCHED_BATCH
    assert len(relay_threads) >= 2 and set(relay_threads.values()) == {os.SCHED_OTHER}, relay_threads
    assert set(broker_threads.values()) == {os.SCHED_OTHER}, broker_threads


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_a_signal_ends_the_relay_at_once_and_acknowledges_nothing_unwritten(broker, env, home, signum):
    """SIGTERM or SIGINT (hosts send both) while a message waits unshown: the relay exits 0 at
    once, and the message stays unacknowledged for the next incarnation."""
    with trio.fail_after(60):
        host = await RawHost.start(env, "--project", "/w/relay-sig", "--host-session-id", "hs-relay-sig")
        me = await host.tool("whoami")
        sent = await trio.to_thread.run_sync(lambda: run_cli(env, "send", me["name"], "pending", "--json"))
        mid = json.loads(sent.stdout)["message"]["id"]

        async def held() -> bool:
            return bool(await host.tool("inbox", peek=True, wait_seconds=1))

        await wait_for(held, what="the message in the inbox")
        host.proc.send_signal(signum)
        assert await host.proc.wait() == 0
    assert receipts(home, [mid])[mid][1] is None


async def test_text_with_unicode_line_separators_crosses_the_relay_whole(broker, env):
    """U+2028, U+2029 and U+0085 are line breaks to `str.splitlines` but text inside a JSON-RPC
    line: a message holding them comes back whole, and the session goes on."""
    text = "one\u2028two\u2029three\u0085four\x1cfive"
    with trio.fail_after(60):
        host = await RawHost.start(env, "--project", "/w/relay-seps")
        me = await host.tool("whoami")
        await host.tool("send", to=me["name"], text=text)

        async def arrived() -> list[dict[str, Any]] | None:
            return await host.tool("inbox", wait_seconds=1) or None

        shown = await wait_for(arrived, what="the message back")
        assert [m["text"] for m in shown] == [text]
        assert await host.tool("whoami") == me
        assert await host.end() == 0


async def test_a_request_on_a_relay_connection_is_answered_and_the_session_goes_on(broker, home):
    """After `mcp`, the connection carries relay frames: a request frame there gets an error
    naming the problem (not silence), and the host's next line is still served."""
    from agent_bridge.common import paths
    from agent_bridge.ipc import protocol
    from agent_bridge.ipc.stream import FramedStream

    record = paths.read_broker_json(home)
    assert record is not None
    with trio.fail_after(30):
        relay_conn = FramedStream(await trio.open_unix_socket(record["socket"]))
        await relay_conn.send(protocol.request(1, "mcp", agent="codex", project="/w/relay-stray"))
        hello = await relay_conn.receive()
        assert hello is not None and hello["ok"], hello
        await relay_conn.send({"v": 1, "id": 5, "op": "whoami"})
        refused = await relay_conn.receive()
        assert refused is not None and refused["id"] == 5 and refused["error"]["code"] == "bad_request", (
            refused
        )
        await relay_conn.send(
            {"v": 1, "relay": "line", "line": json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"})}
        )
        while True:
            frame = await relay_conn.receive()
            assert frame is not None, "the broker closed the relay connection"
            if frame.get("push") == "line" and json.loads(frame["line"]).get("id") == 1:
                break
        await relay_conn.aclose()


JSON_RPC_IDS = st.integers(min_value=-(2**53), max_value=2**53) | st.text(max_size=12)


@given(JSON_RPC_IDS, st.sampled_from(["result", "error"]), st.booleans())
def test_the_relay_reads_an_answers_id_from_its_head_as_the_whole_line_would_say(rid, kind, sdk_shape):
    """`answer_key` reads the id of an answer shaped as the SDK and mcp_fast write it from the
    line's head; any line, of that shape or not, gets the key a full parse gives."""
    from agent_bridge.core import showing

    body = {"content": [{"text": '{"id": 99, "method": "x"}', "type": "text"}], "isError": False}
    fields = {"jsonrpc": "2.0", "id": rid, kind: body if kind == "result" else {"code": -1, "message": "m"}}
    if not sdk_shape:  # another order, spaces: the slow path
        fields = dict(reversed(list(fields.items())))
    line = json.dumps(fields, ensure_ascii=False, separators=(",", ":") if sdk_shape else None)
    assert bool(relay.ANSWER_HEAD.match(line)) is sdk_shape
    assert relay.Relay.answer_key(line) == showing.key(rid)


@pytest.mark.parametrize("line", [
    '{"jsonrpc":"2.0","id":1,"method":"ping"}',  # the broker asking the host: not an answer
    '{"jsonrpc":"2.0","method":"notifications/message","params":{}}',
    '{"jsonrpc":"2.0","id":007,"result":{}}',  # not JSON
    '{"jsonrpc":"2.0","id":"\\x","result":{}}',  # not JSON either
])
def test_a_line_that_answers_nothing_has_no_answer_key(line):
    assert relay.Relay.answer_key(line) is None


class JoinsWhileAnsweringInitialize(relay.Relay):
    """A relay whose broker joins at the moment it writes its own answer to the host's
    `initialize` (no broker had answered yet): the interleaving a slow first connection allows,
    made certain. The joining is the relay's own `join` and `serve_link`, on a real broker."""

    socket_path = ""

    def write_out(self, line: str) -> None:
        if self.link is None and '"protocolVersion"' in line:
            link = self.join(self.socket_path)
            threading.Thread(target=self.serve_link, args=(link,), daemon=True).start()
        super().write_out(line)


def host_lines(fd: int, until: Any, timeout: float = 30) -> list[dict[str, Any]]:
    """The JSON lines written to `fd` until one satisfies `until` (a failure after `timeout`)."""
    seen: list[dict[str, Any]] = []
    buffer = b""
    deadline = time.monotonic() + timeout
    while True:
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            seen.append(json.loads(line))
            if until(seen[-1]):
                return seen
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"not written in {timeout}s; written: {seen}"
        if select.select([fd], [], [], remaining)[0]:
            buffer += os.read(fd, 65536)


def test_a_broker_joining_while_the_relay_answers_initialize_is_handed_that_initialize(broker, env, home):
    """The relay answered `initialize` itself; a broker that joins before the relay noted so
    must still get the host's `initialize` (its capabilities: here the channel), not only the
    lines after it."""
    from agent_bridge.common import paths

    record = paths.read_broker_json(home)
    assert record is not None
    read_end, write_end = os.pipe()
    options = relay.Options(agent="claude", project="/w/join-race", kind="interactive", name=None,
                            host_session_id=None, claude_session_id=None, host=None, chain=[], home=home)
    joining = JoinsWhileAnsweringInitialize(options, write_end)
    joining.socket_path = record["socket"]
    joining.on_host_line(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": PROTOCOL, "capabilities": {"experimental": {bridge.CHANNEL_CAPABILITY: {}}},
        "clientInfo": {"name": "raw", "version": "1"}}}))
    host_lines(read_end, lambda m: m.get("id") == 1)
    assert joining.link is not None
    joining.on_host_line('{"jsonrpc":"2.0","method":"notifications/initialized"}')
    joining.on_host_line('{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"whoami","arguments":{}}}')
    me = json.loads(host_lines(read_end, lambda m: m.get("id") == 2)[-1]["result"]["content"][0]["text"])
    assert run_cli(env, "send", me["name"], "by the channel").returncode == 0
    host_lines(read_end, lambda m: m.get("method") == "notifications/claude/channel"
               and "by the channel" in json.dumps(m))

