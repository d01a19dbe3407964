"""message_throughput: one sender, one receiver, durable, end to end through the broker (SPEC §9).

A real broker process (`agent-bridge up`) and two sessions connected through the IPC client
library. The sender keeps WINDOW sends in flight (an agent host issuing tool calls in
parallel; answers carry request ids, so a client need not wait for one before the next); the
receiver takes each push as it arrives and acknowledges what it holds in one `ack` request. A
message counts once its acknowledgement is answered: send → delivered → acknowledged. Rate =
messages / (first send → last acknowledgement), per round; the value is the median round.

Baseline, in alternating rounds of the same size and window: a raw Unix-socket echo loop in
Python (blocking sockets, frames of the same size, server in its own process). Target
(issue 16, above SPEC §9's 3,000): ≥ 10,000 messages/s; the ratio to the echo loop is
reported. p50/p99: per-message latency from send to acknowledged, in ms.

Each round also runs one send at a time (each `send` answered, so committed, before the
next), against a one-at-a-time echo loop: `details.one_at_a_time_rate`, its latencies and its
ratio to that echo loop. Target: `details.one_at_a_time_p50` ≤ 0.4 ms, send → delivered →
acknowledged. That reading is bound by latency (two processes taking turns, two commits per
message), not by what the broker can carry. Its floor on this stack, in the same rounds:
`details.one_at_a_time_floor_p50`, the same clients against FLOOR_SERVER (Trio, the store's two
transactions, the framing, nothing else), and `details.one_at_a_time_floor_ratio`; and
`details.one_at_a_time_framing_p50`, the same server storing nothing (Trio, the framing and the
clients alone).

And one send at a time again with the receiver acknowledging as the MCP server does since the
acknowledgement rule (SPEC §3): `offer` (posted without waiting: the broker notes that the
messages are about to be shown), then `ack` once they are written: `details.one_at_a_time_offer_ack_rate`, and its cost
against the plain one-at-a-time reading of the same rounds, `details.offer_ack_cost` (target:
at most 0.10, i.e. 10 %).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c  # noqa: E402

TARGET_RATE = 10_000.0  # messages/s, 16 sends in flight
TARGET_ONE_P50_MS = 0.4  # one send at a time: send → delivered → acknowledged, p50
WINDOW = 16  # sends in flight
TEXT = "status: build green on main, 42 tests added; next I take the migration review. " * 2

ECHO_SERVER = r"""
import os, socket, sys
path = sys.argv[1]
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(path)
srv.listen(1)
print("ready", flush=True)
conn, _ = srv.accept()
while True:
    data = conn.recv(65536)
    if not data:
        break
    conn.sendall(data)
"""

# The floors of the one-at-a-time reading on this stack: a Trio server that does only what every
# message needs (the store's own two transactions, Store.send_messages and Store.ack, on the
# real schema, and the protocol's framing) and nothing of the broker (identity, routing checks,
# a delivery task, offers): the message is pushed from the sender's request itself. Given "-"
# for a database, it stores nothing: the framing, Trio and the clients alone.
FLOOR_SERVER = r"""
import sys, time, trio
from pathlib import Path
from agent_bridge.ipc import protocol
from agent_bridge.ipc.stream import FramedStream
from agent_bridge.rows import Author, Message
from agent_bridge.store.ids import new_id
from agent_bridge.store.messages import Outgoing
from agent_bridge.store.writer import Store

store = None if sys.argv[2] == "-" else Store.open(Path(sys.argv[2]))
connected = {}
peers = {}


def create_peer(agent, name, project, now):
    if store is not None:
        return store.create_peer(agent=agent, name=name, project=project, kind="interactive",
                                 host_session_id=None, now=now)
    peers[name] = Author(new_id(), name, agent)
    return peers[name]


def send(me, to_id, to_name, text, now):
    if store is not None:
        (message,) = store.send_messages(me.id, [Outgoing(to_id, text, 1, None)], now)
        return message
    return Message(new_id(), Author(me.id, me.name, me.agent), to_id, to_name, text, 1, None, "message", now)


async def serve(stream):
    conn = FramedStream(stream)
    me = None
    while (frame := await conn.receive()) is not None:
        request_id, op, args = protocol.parse_request(frame)
        now = time.time_ns() // 1_000_000
        if op == "hello":
            me = create_peer(args["agent"], args["project"].rsplit("/", 1)[-1], args["project"], now)
            connected[me.name] = (me.id, conn)
            await conn.send(protocol.ok(request_id, {"session": {"id": me.id, "name": me.name}}))
        elif op == "send":
            to_id, to_conn = connected[args["to"]]
            message = send(me, to_id, args["to"], args["text"], now)
            await to_conn.send(protocol.push("message", message=message.to_json()))
            await conn.send(protocol.ok(request_id, {"message": message.to_json()}))
        elif op == "ack":
            acked = len(args["ids"]) if store is None else store.ack(me.id, args["ids"], now)
            await conn.send(protocol.ok(request_id, {"acked": acked}))
        else:  # offer, ping: nothing to store
            await conn.send(protocol.ok(request_id, None))


async def main():
    sock = trio.socket.socket(trio.socket.AF_UNIX)
    await sock.bind(sys.argv[1])
    sock.listen()
    print("ready", flush=True)
    await trio.serve_listeners(serve, [trio.SocketListener(sock)])


trio.run(main)
"""


class FloorServer:
    """FLOOR_SERVER in its own process, with its own database in `folder` (`store`), or none."""

    def __init__(self, folder: Path, *, store: bool) -> None:
        name = "floor" if store else "framing"
        self.path = str(folder / f"{name}.sock")
        database = str(folder / f"{name}.db") if store else "-"
        self.proc = subprocess.Popen([c.PYTHON, "-c", FLOOR_SERVER, self.path, database], stdout=subprocess.PIPE)
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == b"ready"

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)


class EchoLoop:
    """A raw Unix-socket echo server in its own process, and a blocking client loop."""

    def __init__(self, folder: Path, frame: bytes) -> None:
        path = str(folder / "echo.sock")
        self.proc = subprocess.Popen([c.PYTHON, "-c", ECHO_SERVER, path], stdout=subprocess.PIPE)
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == b"ready"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.frame = frame

    def round(self, count: int, window: int = 1) -> float:
        """`count` frames echoed, at most `window` in flight; returns messages per second."""
        sock, frame, size = self.sock, self.frame, len(self.frame)
        start = time.perf_counter()
        sent = min(window, count)
        sock.sendall(frame * sent)
        pending = 0  # bytes of echoed frames received
        done = 0
        while done < count:
            pending += len(sock.recv(65536))
            finished, pending = divmod(pending, size)
            done += finished
            more = min(finished, count - sent)
            if more:
                sock.sendall(frame * more)
                sent += more
        return count / (time.perf_counter() - start)

    def close(self) -> None:
        self.sock.close()
        self.proc.wait(timeout=10)


async def drive(  # noqa: C901  one benchmark scenario; its receiver and rounds are closures over its state, which mccabe counts into it
    socket_path: str, floors: dict[str, str], rounds: int, per_round: int, warmup: int, echo: EchoLoop
) -> dict:
    import trio

    from agent_bridge.ipc.client import open_bridge_client

    acked_at: dict[str, int] = {}
    progress = trio.Event()
    offer_first = False  # the receiver records an offer before it acknowledges (the MCP server's way)

    async def receiver(path: str, task_status=trio.TASK_STATUS_IGNORED) -> None:
        nonlocal progress
        async with open_bridge_client(path, c.hello("/bench/receiver", 1)) as (client, pushes):
            task_status.started(client)
            async for frame in pushes:
                ids = [frame["message"]["id"]] if frame.get("push") == "message" else []
                while True:  # everything already here goes into the same ack
                    try:
                        more = pushes.receive_nowait()
                    except trio.WouldBlock:
                        break
                    if more.get("push") == "message":
                        ids.append(more["message"]["id"])
                if ids:
                    if offer_first:  # posted, not awaited: as the MCP server does before it writes
                        await client.post("offer", ids=ids)
                    await client.request("ack", ids=ids)
                    now = time.perf_counter_ns()
                    for i in ids:
                        acked_at[i] = now
                    progress.set()
                    progress = trio.Event()

    async def bridge_round(sender, to: str, window: int) -> tuple[float, dict[str, int]]:
        """`per_round` messages, at most `window` sends in flight; (messages/s, send times)."""
        sent_at: dict[str, int] = {}
        start = time.perf_counter_ns()

        async def one(slots: trio.Semaphore) -> None:
            try:
                t = time.perf_counter_ns()
                answer = await sender.request("send", to=to, text=TEXT)
                sent_at[answer["message"]["id"]] = t
            finally:
                slots.release()

        if window == 1:
            for _ in range(per_round):
                t = time.perf_counter_ns()
                answer = await sender.request("send", to=to, text=TEXT)
                sent_at[answer["message"]["id"]] = t
        else:
            slots = trio.Semaphore(window)
            async with trio.open_nursery() as senders:
                for _ in range(per_round):
                    await slots.acquire()
                    senders.start_soon(one, slots)
        with trio.fail_after(60):
            while not all(m in acked_at for m in sent_at):
                await progress.wait()
        elapsed = max(acked_at[m] for m in sent_at) - start
        return per_round / (elapsed / 1e9), sent_at

    rates: list[float] = []
    one_at_a_time: list[float] = []
    echo_rates: list[float] = []
    echo_one: list[float] = []
    latencies: list[int] = []
    latencies_one: list[int] = []
    offer_one: list[float] = []
    latencies_offer: list[int] = []
    latencies_floor: dict[str, list[int]] = {name: [] for name in floors}
    async with trio.open_nursery() as nursery, AsyncExitStack() as floor_clients:
        receiving = await nursery.start(receiver, socket_path)
        to = receiving.hello["session"]["name"]
        floor_ends = {}  # floor -> (its sender, the receiver's name there)
        for name, path in floors.items():
            floor_to = (await nursery.start(receiver, path)).hello["session"]["name"]
            floor_sender, _ = await floor_clients.enter_async_context(
                open_bridge_client(path, c.hello("/bench/sender", 2))
            )
            floor_ends[name] = (floor_sender, floor_to)
        async with open_bridge_client(socket_path, c.hello("/bench/sender", 2)) as (sender, _pushes):
            for r in range(warmup + rounds):  # interleaved: an echo round after every bridge round
                rate, sent_at = await bridge_round(sender, to, WINDOW)
                echo_rate = echo.round(per_round, WINDOW)
                one_rate, sent_one = await bridge_round(sender, to, 1)
                sent_floor = {name: (await bridge_round(*ends, 1))[1] for name, ends in floor_ends.items()}
                echo_one_rate = echo.round(per_round, 1)
                offer_first = True
                offer_rate, sent_offer = await bridge_round(sender, to, 1)
                offer_first = False
                if r >= warmup:
                    rates.append(rate)
                    echo_rates.append(echo_rate)
                    one_at_a_time.append(one_rate)
                    echo_one.append(echo_one_rate)
                    latencies.extend(acked_at[m] - t for m, t in sent_at.items())
                    latencies_one.extend(acked_at[m] - t for m, t in sent_one.items())
                    offer_one.append(offer_rate)
                    latencies_offer.extend(acked_at[m] - t for m, t in sent_offer.items())
                    for name, floor_sent in sent_floor.items():
                        latencies_floor[name].extend(acked_at[m] - t for m, t in floor_sent.items())
        nursery.cancel_scope.cancel()
    return {
        "rates": rates, "echo": echo_rates, "latencies": latencies,
        "one": one_at_a_time, "echo_one": echo_one, "latencies_one": latencies_one,
        "offer_one": offer_one, "latencies_offer": latencies_offer, "latencies_floor": latencies_floor,
    }


def main() -> None:
    args = c.parse_args(__doc__ or "")
    rounds, per_round, warmup = (2, 50, 1) if args.quick else (10, 1000, 1)
    import trio

    from agent_bridge.ipc import protocol

    frame = protocol.encode(protocol.request(1, "send", to="claude-receiver", text=TEXT))
    with c.temp_home() as home:
        env = c.bench_env(home)
        echo = EchoLoop(home.parent, frame)
        floors = {"floor": FloorServer(home.parent, store=True), "framing": FloorServer(home.parent, store=False)}
        try:
            with c.BrokerProcess(home, env) as broker:
                record = broker.wait_ready()
                c.log(f"message_throughput: {rounds} rounds of {per_round} messages")
                paths = {name: floor.path for name, floor in floors.items()}
                out = trio.run(drive, record["socket"], paths, rounds, per_round, warmup, echo)
        finally:
            echo.close()
            for floor in floors.values():
                floor.close()
    value = c.median(out["rates"])
    base = c.median(out["echo"])
    one_p50 = c.ms(c.percentile(out["latencies_one"], 50))
    offer_ack_cost = 1 - c.median(out["offer_one"]) / c.median(out["one"])
    c.report(
        "message_throughput",
        value=value,
        unit=f"messages/s (send → delivered → acknowledged, {WINDOW} sends in flight)",
        baseline=base,
        target=(
            f"value >= {TARGET_RATE:g} messages/s and details.one_at_a_time_p50 <= {TARGET_ONE_P50_MS:g} ms "
            "(ratios to raw Unix-socket echo loops reported)"
        ),
        ok=value >= TARGET_RATE and one_p50 <= TARGET_ONE_P50_MS,
        n=len(out["latencies"]),
        p50=c.ms(c.percentile(out["latencies"], 50)),
        p99=c.ms(c.percentile(out["latencies"], 99)),
        quick=args.quick,
        details={
            "rounds": rounds,
            "per_round": per_round,
            "window": WINDOW,
            "rate_min": min(out["rates"]),
            "rate_max": max(out["rates"]),
            "one_at_a_time_rate": c.median(out["one"]),
            "one_at_a_time_echo_rate": c.median(out["echo_one"]),
            "one_at_a_time_echo_ratio": c.median(out["one"]) / c.median(out["echo_one"]),
            "one_at_a_time_p50": one_p50,
            "one_at_a_time_p99": c.ms(c.percentile(out["latencies_one"], 99)),
            "one_at_a_time_floor_p50": c.ms(c.percentile(out["latencies_floor"]["floor"], 50)),
            "one_at_a_time_floor_ratio": one_p50 / c.ms(c.percentile(out["latencies_floor"]["floor"], 50)),
            "one_at_a_time_framing_p50": c.ms(c.percentile(out["latencies_floor"]["framing"], 50)),
            "one_at_a_time_offer_ack_rate": c.median(out["offer_one"]),
            "one_at_a_time_offer_ack_p50": c.ms(c.percentile(out["latencies_offer"], 50)),
            "offer_ack_cost": offer_ack_cost,
            "latency_unit": "ms",
        },
    )


if __name__ == "__main__":
    main()
