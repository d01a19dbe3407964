"""Federation (SPEC §10 "Performance"): two real brokers with their own homes and a real
nats-server (the printed hub config), on loopback.

    python bench/bench_federation.py [--quick]

- `value`: `send` on machine a to `bob@b` → the message pushed to bob's session on machine b,
  p50 in ms (through the broker's IPC protocol, one message at a time). The baseline, measured
  in the same run and interleaved with it: the same pair between two sessions of machine a (the
  local path) plus twice a bare nats-py publish → fetch → ack round trip on the same hub. The
  target: the remote p50 at most that sum. (SPEC §10 names the local *relay* pair; the broker
  pair is the stricter bound, the relays adding the same cost to both sides.)
- `presence_cpu_pct`: machine a's broker, its CPU over PRESENCE_WINDOW seconds with machine b
  announcing 200 connected sessions (no traffic): at most 2 % of one core.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _common as c  # noqa: E402

from tests.conftest import wait_for  # noqa: E402
from tests.federation.conftest import TEAM, Hub, make_machines  # noqa: E402

PRESENCE_SESSIONS = 200
PRESENCE_WINDOW = 10.0  # seconds of machine a's CPU measured with b's sessions announced
TEXT = "x" * 200
BARE_EVERY = 10  # bare nats-py round trips measured together, between the brokers' rounds


async def bare_round_trips(hub: Hub, n: int, out: list[float]) -> None:
    """On the asyncio thread: nats-py alone, machine c publishing to machine d, which pulls and
    acks (two machines no broker uses, on the same hub): publish (PubAck) → fetch → ack_sync."""
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig

    from agent_bridge.federation import identity, subjects

    def connect(m: str) -> Any:
        seed = identity.read_seed(hub.machines[m].home / "machine.nk")
        return nats.connect(hub.url, nkeys_seed_str=seed, inbox_prefix=subjects.inbox_prefix(m))

    sender, receiver = await connect("c"), await connect("d")
    try:
        name = subjects.consumer("d", "msg")
        sub = await receiver.jetstream().pull_subscribe(
            subjects.consumer_filter(TEAM, "d", "msg"), durable=name, stream=subjects.stream(TEAM),
            config=ConsumerConfig(name=name, durable_name=name, ack_policy=AckPolicy.EXPLICIT),
        )
        js, subject = sender.jetstream(), subjects.msg(TEAM, "c", "d")
        for _ in range(n):
            start = time.perf_counter_ns()
            await js.publish(subject, TEXT.encode(), headers={"Nats-Msg-Id": str(uuid.uuid4())})
            (msg,) = await sub.fetch(1, timeout=5)
            await msg.ack_sync()
            out.append((time.perf_counter_ns() - start) / 1e6)
    finally:
        await sender.close()
        await receiver.close()


async def next_message(pushes: Any) -> dict[str, Any]:
    async for frame in pushes:
        if frame.get("push") == "message":
            return frame["message"]  # type: ignore[no-any-return]
    raise RuntimeError("the session's connection closed")


async def one_pair(sender: Any, pushes: Any, receiver: Any, to: str) -> float:
    start = time.perf_counter_ns()
    await sender.request("send", to=to, text=TEXT)
    message = await next_message(pushes)
    elapsed = (time.perf_counter_ns() - start) / 1e6
    await receiver.request("ack", ids=[message["id"]])
    return elapsed


async def measure(hub: Hub, rounds: int, presence_window: float) -> dict[str, Any]:
    from agent_bridge.federation.loop import open_asyncio_bridge
    from agent_bridge.ipc.client import open_bridge_client

    a, b = hub.machines["a"], hub.machines["b"]
    brokers = []
    for m in (a, b):
        m.settings(hub)
        broker = c.BrokerProcess(m.home, c.bench_env(m.home))
        await trio.to_thread.run_sync(broker.start)
        brokers.append(broker)
    try:
        sock_a = json.loads((a.home / "broker.json").read_text())["socket"]
        sock_b = json.loads((b.home / "broker.json").read_text())["socket"]
        async with open_bridge_client(sock_a, c.hello("/bench/a", 1)) as (alice, _), \
                open_bridge_client(sock_a, c.hello("/bench/a", 2)) as (local, local_pushes), \
                open_bridge_client(sock_b, c.hello("/bench/b", 3)) as (bob, bob_pushes):
            bob_name = (await bob.request("whoami"))["name"]
            local_name = (await local.request("whoami"))["name"]

            async def listed() -> bool:
                peers = await alice.request("peers")
                return any(p["name"] == f"{bob_name}@b" and p["connected"] for p in peers)

            await wait_for(listed, timeout=60, what=f"{bob_name}@b in a's peers")
            remote: list[float] = []
            here: list[float] = []
            bare: list[float] = []
            async with open_asyncio_bridge() as bridge:
                for i in range(rounds + 3):  # three warm-up rounds
                    r = await one_pair(alice, bob_pushes, bob, f"{bob_name}@b")
                    h = await one_pair(alice, local_pushes, local, local_name)
                    if i >= 3:
                        remote.append(r)
                        here.append(h)
                    if i % BARE_EVERY == 0:  # interleaved: BARE_EVERY bare round trips on one connection
                        await bridge.call(bare_round_trips, hub, BARE_EVERY, bare)
        # presence: b announces 200 sessions; a's broker reads and records them, idle otherwise
        async with trio.open_nursery() as nursery:
            ready = trio.Semaphore(0)

            async def hold(i: int) -> None:
                async with open_bridge_client(sock_b, c.hello("/bench/b-many", 100 + i)):
                    ready.release()
                    await trio.sleep_forever()

            for i in range(PRESENCE_SESSIONS):
                nursery.start_soon(hold, i)
            for _ in range(PRESENCE_SESSIONS):
                await ready.acquire()

            async def all_listed() -> bool:
                from agent_bridge.ipc import blocking

                status = await trio.to_thread.run_sync(lambda: blocking.call(a.home, "status", timeout=5.0))
                return bool(status.get("federation", {}).get("connected"))

            await wait_for(all_listed, timeout=60, what="a connected")
            await trio.sleep(3)  # b's next announcement and a's read of it (every 2 s) are in
            before = c.cpu_seconds(brokers[0].pid)
            await trio.sleep(presence_window)
            cpu = (c.cpu_seconds(brokers[0].pid) - before) / presence_window * 100
            nursery.cancel_scope.cancel()
    finally:
        for broker in brokers:
            broker.stop()
    return {"remote": remote, "here": here, "bare": bare, "presence_cpu_pct": cpu}


def main() -> None:
    args = c.parse_args(__doc__ or "")
    rounds = 10 if args.quick else 200
    window = 2.0 if args.quick else PRESENCE_WINDOW
    with tempfile.TemporaryDirectory(prefix="abf-") as d:
        folder = Path(d)

        async def run() -> dict[str, Any]:
            hub = Hub(folder, make_machines(folder, ("a", "b", "c", "d")), TEAM)
            await hub.start()
            try:
                return await measure(hub, rounds, window)
            finally:
                await hub.kill()

        got = trio.run(run)
    remote, here, bare = got["remote"], got["here"], got["bare"]
    remote_p50, here_p50, bare_p50 = c.median(remote), c.median(here), c.median(bare)
    baseline = here_p50 + 2 * bare_p50
    cpu = got["presence_cpu_pct"]
    c.report(
        "federation",
        value=remote_p50,
        unit="ms (send on a -> pushed to a session on b, p50)",
        baseline=baseline,
        target="<= the local pair + 2x a bare nats-py publish/fetch/ack (same run); "
        f"{PRESENCE_SESSIONS} remote sessions' presence <= 2% of a core",
        ok=remote_p50 <= baseline and cpu <= 2.0,
        n=len(remote),
        p50=remote_p50,
        p99=c.percentile(remote, 99),
        quick=args.quick,
        details={
            "local_pair_p50_ms": here_p50,
            "bare_nats_rtt_p50_ms": bare_p50,
            "remote_p99_ms": c.percentile(remote, 99),
            "presence_sessions": PRESENCE_SESSIONS,
            "presence_cpu_pct": cpu,
        },
    )


if __name__ == "__main__":
    main()
