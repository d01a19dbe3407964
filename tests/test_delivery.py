"""The acknowledgement rule (SPEC §3, "What 'shown' means") through real processes: a message
is acknowledged only once the bytes carrying it are in the host's pipe; a cancelled call, a
killed MCP server or a broker outage loses nothing, and what is shown twice is marked.

The host here is written from the MCP specification (JSON-RPC 2.0 lines over the server's real
stdin/stdout), not the SDK's client, which hides the cancel race: it sends `tools/call` and
`notifications/cancelled` exactly as a host does when the user presses Esc."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from typing import Any

import pytest
import trio

from agent_bridge.common import paths
from agent_bridge.ipc.client import open_bridge_client
from agent_bridge.store import reader
from tests.conftest import BrokerProcess, wait_for

pytestmark = pytest.mark.slow

PROTOCOL = "2025-06-18"
# The 2026 protocol's envelope, in every request of a host that speaks it (Claude Code 2.1.332
# with a broker running: tests/hosts/test_health_checks.py)
MODERN_META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
               "io.modelcontextprotocol/clientInfo": {"name": "claude-code", "version": "2.1.332"},
               "io.modelcontextprotocol/clientCapabilities": {}}


class RawHost:
    """One `agent-bridge mcp` process and a host that speaks JSON-RPC to it by hand."""

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self._buffer = b""
        self._ids = iter(range(1, 1 << 30))
        self.responses: dict[Any, dict[str, Any]] = {}
        self.notifications: list[dict[str, Any]] = []
        self.lines: list[dict[str, Any]] = []  # everything the server wrote, in order (a second answer too)

    @classmethod
    async def start(cls, env: dict[str, str], *args: str, capabilities: dict[str, Any] | None = None,
                    keep_stderr: bool = False) -> RawHost:
        """`keep_stderr`: the server's stderr is a pipe the test reads (else discarded)."""
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "agent_bridge", "mcp", *args],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if keep_stderr else subprocess.DEVNULL,
        )
        host = cls(proc)
        try:
            rid = await host.request("initialize", {
                "protocolVersion": PROTOCOL, "capabilities": capabilities or {},
                "clientInfo": {"name": "raw-test-host", "version": "1"},
            })
            await host.response(rid)
            await host.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        except BaseException:
            with trio.CancelScope(shield=True):
                await host.kill()
            raise
        return host

    @classmethod
    async def start_modern(cls, env: dict[str, str], *args: str,
                           meta: dict[str, Any] = MODERN_META) -> RawHost:
        """A host of the 2026 protocol: no handshake, its `server/discover` probe answered;
        `meta`, the envelope it puts in every request's `_meta`, the probe's too."""
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "agent_bridge", "mcp", *args],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )
        host = cls(proc)
        try:
            probe = await host.request("server/discover", {"_meta": meta})
            assert "result" in await host.answer(probe), host.lines
        except BaseException:
            with trio.CancelScope(shield=True):
                await host.kill()
            raise
        return host

    async def send(self, *messages: dict[str, Any]) -> None:
        """Write messages to the server's stdin in one write (one line each)."""
        assert self.proc.stdin is not None
        await self.proc.stdin.send_all(b"".join(json.dumps(m).encode() + b"\n" for m in messages))

    def next_id(self) -> int:
        return next(self._ids)

    async def request(self, method: str, params: dict[str, Any]) -> int:
        rid = self.next_id()
        await self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        return rid

    def call_tool(self, name: str, **arguments: Any) -> dict[str, Any]:
        return {"name": name, "arguments": arguments}

    async def _read_one(self) -> bool:
        """Read one more line from the server; False at end of stream."""
        assert self.proc.stdout is not None
        while b"\n" not in self._buffer:
            data = await self.proc.stdout.receive_some(65536)
            if not data:
                return False
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        message = json.loads(line)
        self.lines.append(message)
        if "id" in message and ("result" in message or "error" in message):
            self.responses[message["id"]] = message
        else:
            self.notifications.append(message)
        return True

    def call_request(self, name: str, **arguments: Any) -> Any:
        """Send `tools/call`; its request id (the answer is read with `answer`)."""
        return self.request("tools/call", self.call_tool(name, **arguments))

    def answers(self, rid: Any) -> list[dict[str, Any]]:
        """Every answer to request `rid` read so far: one, unless the server answered twice."""
        return [m for m in self.lines if m.get("id") == rid and ("result" in m or "error" in m)]

    async def answer(self, rid: int) -> dict[str, Any]:
        """The first answer to `rid`, result or error, as the server wrote it."""
        while not self.answers(rid):
            if not await self._read_one():
                raise EOFError(f"the server closed stdout before answering {rid}")
        return self.answers(rid)[0]

    async def end(self) -> int:
        """Close stdin, read everything the server still writes, wait for it to exit."""
        assert self.proc.stdin is not None
        await self.proc.stdin.aclose()
        while await self._read_one():
            pass
        return await self.proc.wait()

    async def response(self, rid: int) -> dict[str, Any]:
        while rid not in self.responses:
            if not await self._read_one():
                raise EOFError(f"the server closed stdout before answering {rid}")
        message = self.responses[rid]
        assert "result" in message, message
        return message["result"]

    async def tool(self, name: str, **arguments: Any) -> Any:
        result = await self.response(await self.request("tools/call", self.call_tool(name, **arguments)))
        assert not result.get("isError"), result
        return json.loads(result["content"][0]["text"])

    async def drain(self) -> None:
        """Everything the server wrote before it went away (a pipe keeps what was written)."""
        try:
            while await self._read_one():
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError, ValueError):
            pass

    def inbox_items(self) -> list[dict[str, Any]]:
        """Every message shown through an `inbox` result this host received."""
        items: list[dict[str, Any]] = []
        for message in self.responses.values():
            result = message.get("result") or {}
            content = result.get("content") or []
            if result.get("isError") or not content:
                continue
            try:
                data = json.loads(content[0]["text"])
            except ValueError:
                continue
            if isinstance(data, list):
                items.extend(m for m in data if isinstance(m, dict) and "hop" in m)
        return items

    async def kill(self) -> None:
        self.proc.kill()
        await self.proc.wait()

    async def close(self) -> None:
        if self.proc.returncode is None:
            assert self.proc.stdin is not None
            await self.proc.stdin.aclose()
            with trio.move_on_after(30):
                await self.proc.wait()
            if self.proc.returncode is None:
                await self.kill()


def rows(home, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with reader.reading(home / "bridge.db") as conn:
        return list(conn.execute(sql, args))


def receipts(home, message_ids: list[str]) -> dict[str, tuple[Any, Any]]:
    """message id -> (delivered_at, acked_at)."""
    marks = ",".join("?" * len(message_ids))
    found = rows(
        home,
        f"SELECT message_id, delivered_at, acked_at FROM receipts WHERE message_id IN ({marks})",
        *message_ids,
    )
    return {m: (d, a) for m, d, a in found}


def socket_of(home) -> str:
    record = paths.read_broker_json(home)
    assert record is not None
    return record["socket"]


def hello(hsid: str, project: str = "/w/delivery") -> dict[str, Any]:
    return {"agent": "claude", "project": project, "hostSessionId": hsid}


async def test_a_cancelled_inbox_acknowledges_nothing(broker, env, home):
    """`tools/call inbox` then `notifications/cancelled` right behind it, in one write (the user
    pressed Esc): whether the server saw the cancel before or after it wrote the result,
    nothing is acknowledged and the next `inbox` returns the message."""
    with trio.fail_after(90):
        rx = await RawHost.start(env, "--project", "/w/cancel", "--host-session-id", "hs-cancel")
        try:
            async with open_bridge_client(socket_of(home), hello("hs-cancel-tx")) as (tx, _):
                sent = (await tx.request("send", to="hs-cancel", text="the build is red"))["message"]

            async def pending() -> bool:
                return [m["id"] for m in await rx.tool("inbox", peek=True, wait_seconds=1)] == [sent["id"]]

            await wait_for(pending, what="the message in the receiver's inbox")

            cancelled = rx.next_id()
            await rx.send(
                {"jsonrpc": "2.0", "id": cancelled, "method": "tools/call", "params": rx.call_tool("inbox")},
                {"jsonrpc": "2.0", "method": "notifications/cancelled",
                 "params": {"requestId": cancelled, "reason": "user pressed Esc"}},
            )
            # A request after the cancel: once it is answered, the server has read the cancel.
            await rx.response(await rx.request("ping", {}))
            assert [m["id"] for m in await rx.tool("inbox", peek=True)] == [sent["id"]]  # still not shown
            await rx.tool("whoami")  # through the broker: whatever the server sent it before is done
            assert receipts(home, [sent["id"]])[sent["id"]][1] is None  # nothing acknowledged

            again = await rx.tool("inbox")
            assert [m["id"] for m in again] == [sent["id"]]

            async def acked() -> bool:
                return receipts(home, [sent["id"]])[sent["id"]][1] is not None

            await wait_for(acked, what="the message acknowledged once its inbox result was written")
        finally:
            await rx.close()


@pytest.mark.parametrize("named", ["as-sent", "as-a-string"])
async def test_a_cancel_that_crossed_the_written_result_acknowledges_nothing(broker, env, home, named):
    """The host cancels a call whose result the server had already written (the two crossed
    in the pipes; the host ignores that result): the messages are offered again, not
    acknowledged. A cancel naming request 7 as "7" is the same cancel (the SDK correlates
    the two, SPEC §3)."""
    with trio.fail_after(90):
        rx = await RawHost.start(env, "--project", "/w/crossed", "--host-session-id", "hs-crossed")
        try:
            async with open_bridge_client(socket_of(home), hello("hs-crossed-tx")) as (tx, _):
                sent = (await tx.request("send", to="hs-crossed", text="deploy is blocked"))["message"]

            async def pending() -> bool:
                return [m["id"] for m in await rx.tool("inbox", peek=True, wait_seconds=1)] == [sent["id"]]

            await wait_for(pending, what="the message in the receiver's inbox")
            rid = await rx.request("tools/call", rx.call_tool("inbox"))
            assert sent["id"] in json.dumps(await rx.response(rid))
            await rx.send({"jsonrpc": "2.0", "method": "notifications/cancelled",
                           "params": {"requestId": str(rid) if named == "as-a-string" else rid,
                                      "reason": "user pressed Esc"}})
            await rx.response(await rx.request("ping", {}))
            again = await rx.tool("inbox", peek=True)
            assert [(m["id"], m.get("repeat")) for m in again] == [(sent["id"], True)]
            await rx.tool("whoami")
            assert receipts(home, [sent["id"]])[sent["id"]][1] is None
        finally:
            await rx.close()


async def test_broker_down_then_the_server_dies_shows_nothing_unmarked_twice(env, home):
    """The broker goes down; the agent reads its inbox (the acknowledgements cannot reach the
    broker); the MCP server is killed; the broker comes back and the host starts a new MCP
    server for the same host session. Nothing is shown unmarked a second time."""
    broker = BrokerProcess(env, home).start()
    # The receiver must not restart the broker by itself: an invalid hop limit in its
    # environment makes any broker it starts refuse to run.
    rx_env = {**env, "AGENT_BRIDGE_HOP_LIMIT": "0"}
    args = ("--project", "/w/outage", "--host-session-id", "hs-outage")
    shown: list[dict[str, Any]] = []
    try:
        with trio.fail_after(120):
            rx = await RawHost.start(rx_env, *args)
            try:
                async with open_bridge_client(socket_of(home), hello("hs-outage-tx")) as (tx, _):
                    ids = [(await tx.request("send", to="hs-outage", text=f"note {i}"))["message"]["id"]
                           for i in range(5)]

                async def all_here() -> bool:
                    return len(await rx.tool("inbox", peek=True, wait_seconds=1)) == 5

                await wait_for(all_here, what="five messages in the receiver's inbox")
                broker.kill()
                shown.extend(await rx.tool("inbox"))
                assert sorted(m["id"] for m in shown) == sorted(ids)
            finally:
                await rx.kill()
            # the broker was down
            assert {m for m, (_, acked) in receipts(home, ids).items() if acked} == set()

            broker.start()
            rx = await RawHost.start(env, *args)
            try:
                async with open_bridge_client(socket_of(home), hello("hs-outage-tx")) as (tx, _):
                    sentinel = (await tx.request("send", to="hs-outage", text="sentinel"))["message"]["id"]
                seen: list[dict[str, Any]] = []

                async def sentinel_seen() -> bool:
                    seen.extend(await rx.tool("inbox", wait_seconds=1))
                    return any(m["id"] == sentinel for m in seen)

                await wait_for(sentinel_seen, what="the sentinel (delivery is oldest first)")
                shown.extend(m for m in seen if m["id"] != sentinel)
            finally:
                await rx.close()
    finally:
        broker.kill()
    unmarked = [m["id"] for m in shown if not m.get("repeat")]
    assert sorted(unmarked) == sorted(ids), "a message was shown unmarked twice (or never)"


@pytest.mark.parametrize("kills", [15])
async def test_kill_9_of_the_receiving_server_loses_nothing(broker, env, home, kills):
    """A sender streams messages while the receiving MCP server is killed with SIGKILL again
    and again, at random points of its `inbox` calls, and restarted by its host with the same
    host session id. Every acknowledged send is shown to some incarnation: lost 0; whatever is
    shown more than once is marked as a repeat from its second showing on."""
    args = ("--project", "/w/kill", "--host-session-id", "hs-kill")
    sent: list[str] = []
    shown: list[dict[str, Any]] = []
    rng = random.Random(11)
    stop_sending = trio.Event()

    async def sender() -> None:
        async with open_bridge_client(socket_of(home), hello("hs-kill-tx")) as (tx, _):
            i = 0
            while not stop_sending.is_set():
                answer = await tx.request("send", to="hs-kill", text=f"stream {i}")
                sent.append(answer["message"]["id"])  # acknowledged: the broker committed it
                i += 1
                await trio.sleep(0.002)

    async def reader_loop(rx: RawHost) -> None:
        while True:  # back to back, so the server is always somewhere in an inbox call
            rid = await rx.request("tools/call", rx.call_tool("inbox", wait_seconds=0.05))
            await rx.response(rid)

    with trio.fail_after(240):
        async with trio.open_nursery() as nursery:
            for k in range(kills):
                rx = await RawHost.start(env, *args)
                try:
                    if k == 0:
                        nursery.start_soon(sender)  # the receiver's session exists now
                    with trio.move_on_after(rng.uniform(0.05, 0.4)):
                        await reader_loop(rx)
                finally:
                    with trio.CancelScope(shield=True):
                        await rx.kill()  # also when the test fails: no orphan starting a broker
                await rx.drain()  # what it wrote before dying was shown to the host
                shown.extend(dict(m, incarnation=k) for m in rx.inbox_items())
            stop_sending.set()
        assert len(sent) > 100

        rx = await RawHost.start(env, *args)
        try:
            with trio.move_on_after(30):  # then the count lost is reported below
                while not set(sent) <= {m["id"] for m in shown}:
                    shown.extend(await rx.tool("inbox", wait_seconds=0.5))
        finally:
            await rx.close()

    lost = set(sent) - {m["id"] for m in shown}
    assert len(lost) == 0, f"{len(lost)} of {len(sent)} acknowledged sends never shown"
    first: set[str] = set()
    unmarked_repeats = []
    for m in shown:
        if m["id"] in first and not m.get("repeat"):
            unmarked_repeats.append(m["id"])
        first.add(m["id"])
    showings = {mid: [(m.get("incarnation", "last"), m.get("repeat")) for m in shown if m["id"] == mid]
                for mid in unmarked_repeats[:3]}
    assert unmarked_repeats == [], f"shown again unmarked (incarnation, repeat): {showings}"


async def test_send_says_whether_the_recipient_is_connected(broker, env, home):
    with trio.fail_after(60):
        async with open_bridge_client(socket_of(home), hello("hs-away", "/w/away")) as (away, _):
            seen = away.hello["session"]["name"]
        async with open_bridge_client(socket_of(home), hello("hs-here", "/w/here")) as (here, _):
            async with open_bridge_client(socket_of(home), hello("hs-sender", "/w/sender")) as (tx, _):
                live = await tx.request("send", to="hs-here", text="are you there?")
                assert live["recipientConnected"] is True and isinstance(live["recipientLastSeen"], int)
                offline = await tx.request("send", to=seen, text="read this later")
                assert offline["recipientConnected"] is False
                (last_seen,) = rows(home, "SELECT last_seen_at FROM peers WHERE host_session_id = 'hs-away'")[
                    0
                ]
                assert offline["recipientLastSeen"] == last_seen
            assert here.closed.is_set() is False


async def test_a_host_that_closes_the_pipe_before_the_result_acknowledges_nothing(broker, env, home):
    """The host sends `tools/call inbox` and closes its end of the server's stdout before the
    result is written (it went away mid-call): the result never reached it, so nothing is
    acknowledged and the next server for the same host session shows the message."""
    args = ("--project", "/w/closed", "--host-session-id", "hs-closed")
    with trio.fail_after(90):
        rx = await RawHost.start(env, *args)
        try:
            async with open_bridge_client(socket_of(home), hello("hs-closed-tx")) as (tx, _):
                sent = (await tx.request("send", to="hs-closed", text="the pipe will close"))["message"]

            async def pending() -> bool:
                return [m["id"] for m in await rx.tool("inbox", peek=True, wait_seconds=1)] == [sent["id"]]

            await wait_for(pending, what="the message in the receiver's inbox")
            assert rx.proc.stdout is not None
            await rx.proc.stdout.aclose()  # nothing the server writes from now on reaches the host
            await rx.request("tools/call", rx.call_tool("inbox"))
            await rx.proc.wait()  # its write to the host failed: it ends (stdin still open)
        finally:
            await rx.kill()
        assert receipts(home, [sent["id"]])[sent["id"]][1] is None  # never acknowledged

        again = await RawHost.start(env, *args)
        try:
            shown = await again.tool("inbox", wait_seconds=5)
            assert [m["id"] for m in shown] == [sent["id"]]
        finally:
            await again.close()
