"""SPEC §8 under load: 200 sessions through the IPC client and 20 real MCP server processes
exchange messages in repeated rounds against one broker. No errors, every message delivered
once and in order per recipient (the order the broker committed them, oldest first), and the
broker's memory does not keep growing from round to round."""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest
import trio

from agent_bridge.ipc.client import BridgeClient, open_bridge_client
from tests.conftest import load_dashboard, mcp_session, wait_for
from tests.reliability.harness import rows, vm_rss_kib

pytestmark = pytest.mark.slow

IPC_SESSIONS = 200
MCP_SESSIONS = 20
ROUNDS = 7
PER_ROUND = 5  # messages each IPC session sends its neighbour per round
MCP_PER_ROUND = 2  # messages each MCP session sends its neighbour per round
PADDING = "." * 1000  # ~1 MB of message text per round: a per-message leak shows within a few rounds
WARM_ROUNDS = 2  # caches and pools fill during the first rounds (SQLite's page cache is ~2 MB)
RSS_SLACK_KIB = 6 * 1024  # generous next to the cache sizes; a leak of the messages is 1 MB+ a round


async def hold(cm: AbstractAsyncContextManager, out: dict, key: Any, stop: trio.Event,
               task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Enter `cm` in its own task, publish what it yields, keep it open until `stop`."""
    async with cm as value:
        out[key] = value
        task_status.started()
        await stop.wait()


class IpcPeer:
    def __init__(self, index: int, client: BridgeClient, pushes) -> None:
        self.index = index
        self.client = client
        self.pushes = pushes
        self.id = client.hello["session"]["id"]
        self.received: list[tuple[str, str]] = []  # (message id, text), in push order
        self.arrived = trio.Event()

    async def receive(self) -> None:
        async for push in self.pushes:
            if push.get("push") != "message":
                continue
            m = push["message"]
            self.received.append((m["id"], m["text"].removesuffix(PADDING)))
            await self.client.request("ack", ids=[m["id"]])
            self.arrived.set()
            self.arrived = trio.Event()


async def test_200_ipc_sessions_and_20_mcp_servers(broker, env, home):  # noqa: C901  one scenario; its workers are closures over its state, which mccabe counts into it
    sock_path = broker.status()["socket"]
    stop = trio.Event()
    rss: list[int] = []
    with trio.fail_after(240):
        async with trio.open_nursery() as nursery:
            # --- connect everything, concurrently ------------------------------------------
            ipc: dict[int, tuple[BridgeClient, Any]] = {}
            mcp: dict[int, Any] = {}
            async with trio.open_nursery() as connecting:
                for j in range(MCP_SESSIONS):
                    connecting.start_soon(nursery.start, hold, mcp_session(
                        env, "--agent", "codex", "--name", f"mcp-{j}", "--project", "/w/load-mcp",
                        "--host-session-id", f"load-mcp-{j}-{uuid.uuid4()}"), mcp, j, stop)
                for i in range(IPC_SESSIONS):
                    hello = {"agent": "codex", "project": "/w/load", "name": f"ipc-{i}",
                             "hostSessionId": f"load-ipc-{i}-{uuid.uuid4()}"}
                    connecting.start_soon(
                        nursery.start, hold, open_bridge_client(sock_path, hello), ipc, i, stop
                    )
            peers = [IpcPeer(i, *ipc[i]) for i in range(IPC_SESSIONS)]
            for p in peers:
                nursery.start_soon(p.receive)

            async def all_connected() -> bool:  # an MCP server connects to the broker on its own time
                return (await peers[0].client.request("status"))["sessions"] == IPC_SESSIONS + MCP_SESSIONS

            await wait_for(all_connected, timeout=60, what="every session connected")
            await load_dashboard(broker)  # not within the rounds, where it would read as growth
            mcp_names = {
                j: json.loads((await mcp[j].call_tool("whoami", {})).content[0].text)["name"] for j in mcp
            }
            assert sorted(mcp_names.values()) == sorted(f"mcp-{j}" for j in range(MCP_SESSIONS))
            mcp_seen: dict[int, list[dict[str, Any]]] = defaultdict(list)

            async def ipc_sender(p: IpcPeer, rnd: int) -> None:
                to = peers[(p.index + 1) % IPC_SESSIONS].id
                for k in range(PER_ROUND):
                    await p.client.request("send", to=to, text=f"{rnd}:{p.index}:{k}{PADDING}")

            async def mcp_worker(j: int, rnd: int) -> None:
                session = mcp[j]
                for k in range(MCP_PER_ROUND):
                    result = await session.call_tool(
                        "send", {"to": f"mcp-{(j + 1) % MCP_SESSIONS}", "text": f"{rnd}:{j}:{k}"}
                    )
                    assert not result.is_error, result.content[0].text
                want = (rnd + 1) * MCP_PER_ROUND
                while len(mcp_seen[j]) < want:
                    result = await session.call_tool("inbox", {"wait_seconds": 2})
                    assert not result.is_error, result.content[0].text
                    mcp_seen[j].extend(json.loads(result.content[0].text))

            async def status_poller(done: trio.Event) -> None:
                while not done.is_set():  # the CLI and doctor ask for status at any time
                    assert (await peers[0].client.request("status"))[
                        "sessions"
                    ] == IPC_SESSIONS + MCP_SESSIONS
                    await trio.sleep(0.01)

            # --- the rounds ------------------------------------------------------------------
            for rnd in range(ROUNDS):
                done = trio.Event()
                async with trio.open_nursery() as work:
                    work.start_soon(status_poller, done)
                    async with trio.open_nursery() as senders:
                        for p in peers:
                            senders.start_soon(ipc_sender, p, rnd)
                        for j in range(MCP_SESSIONS):
                            senders.start_soon(mcp_worker, j, rnd)

                    async def all_in(rnd: int = rnd) -> bool:
                        return all(len(p.received) >= (rnd + 1) * PER_ROUND for p in peers)

                    await wait_for(all_in, timeout=120, interval=0.05, what=f"round {rnd} delivered")

                    async def all_acked() -> bool:
                        return rows(home, "SELECT count(*) FROM receipts WHERE acked_at IS NULL")[0][0] == 0

                    await wait_for(all_acked, timeout=60, interval=0.1, what=f"round {rnd} acknowledged")
                    done.set()
                rss.append(vm_rss_kib(broker.pid))
            stop.set()  # every session closes its connection; the receivers end with them

    # --- every message once, in commit order per recipient -----------------------------------
    for p in peers:
        sender = (p.index - 1) % IPC_SESSIONS
        texts = [t for _, t in p.received]
        assert texts == [f"{r}:{sender}:{k}" for r in range(ROUNDS) for k in range(PER_ROUND)], p.index
        committed = [
            r[0]
            for r in rows(
                home,
                "SELECT m.id FROM messages m JOIN receipts r ON r.message_id = m.id "
                "WHERE r.peer_id = ? ORDER BY m.rowid",
                (p.id,),
            )
        ]
        assert [i for i, _ in p.received] == committed
    for j, seen in mcp_seen.items():
        sender = (j - 1) % MCP_SESSIONS
        assert [m["text"] for m in seen] == [
            f"{r}:{sender}:{k}" for r in range(ROUNDS) for k in range(MCP_PER_ROUND)
        ]
        assert len({m["id"] for m in seen}) == len(seen)
    assert broker.status()["pid"] == broker.pid

    # --- no growth from round to round, once the first rounds warmed caches and pools up ---------
    print(f"\nbroker VmRSS after each round (KiB): {rss}")
    assert rss[-1] - rss[WARM_ROUNDS - 1] <= RSS_SLACK_KIB, f"broker memory grows round after round: {rss}"
