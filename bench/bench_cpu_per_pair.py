"""cpu_per_pair: CPU time a `send` + `inbox` pair costs the processes that carry it.

Wall times on a shared 2-core machine move with whatever else runs; the CPU a process spends on
one pair moves much less, so this is the number to compare two versions of the code by
(bench/compare.py). Two sessions, each a real `agent-bridge mcp` relay spoken to over its stdio
with raw JSON-RPC, one pair at a time as in bench_mcp_tool_call: A calls `send` to B, then B
calls `inbox` until it shows the message. Per round, the broker's and the two relays' user +
system CPU seconds (/proc/<pid>/stat, all threads) before and after PAIRS pairs, read once the
last acknowledgement is recorded (the broker records an `inbox` result's acknowledgement after
a short grace, SPEC §3, so that work is counted too). value: broker + relays µs per pair, the
median round; `details.broker_us_per_pair` and `details.relays_us_per_pair` split it.

Baseline, in alternating rounds: the broker's CPU per pair on the broker-only path (two
sessions through the IPC client library: `send`, the push, `ack`). p50/p99: over the rounds.
No target: this is a reading for comparisons, `ok` is always true. `--floor`: the sessions go
through bench/_floor_relay.py, a process that only moves frames, instead of the relay: what any
relay of this shape would cost (details say `floor`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c  # noqa: E402

PROJECT = "/bench/cpu-project"
SETTLE = 0.6  # seconds for the last acknowledgements to be recorded (the grace is about 0.25 s)


def relay_pairs(a: c.McpSession, b: c.McpSession, pairs: int) -> None:
    for i in range(pairs):
        a.tool("send", to="bench-b", text=f"message {i}")
        got: list = []
        while not got:
            got = b.tool("inbox", wait_seconds=1)


async def ipc_pairs(socket_path: str, pairs: int) -> None:
    from agent_bridge.ipc.client import open_bridge_client

    async with open_bridge_client(socket_path, c.hello(PROJECT, 1)) as (tx, _), \
            open_bridge_client(socket_path, c.hello(PROJECT, 2)) as (rx, pushes):
        to = rx.hello["session"]["id"]  # type: ignore[index]
        for i in range(pairs):
            await tx.request("send", to=to, text=f"message {i}")
            async for frame in pushes:
                if frame.get("push") == "message":
                    break
            await rx.request("ack", ids=[frame["message"]["id"]])


def cpu(pids: list[int]) -> list[float]:
    return [c.cpu_seconds(pid) for pid in pids]


def main() -> None:
    def options(parser: argparse.ArgumentParser) -> None:
        c.floor_option(parser)
        c.protocol_option(parser)

    args = c.parse_args(__doc__ or "", options=options)
    c.floor, c.protocol = args.floor, args.protocol
    rounds, pairs, warmup = (1, 100, 10) if args.quick else (5, 500, 50)
    import trio

    relay_us: list[float] = []
    broker_us: list[float] = []
    wall_ms: list[float] = []
    ipc_us: list[float] = []
    with c.temp_home() as home:
        env = c.bench_env(home)
        with c.BrokerProcess(home, env) as broker:
            record = broker.wait_ready()
            c.log(f"cpu_per_pair: {rounds} rounds of {pairs} send + inbox pairs")
            a, b = c.McpSession(env, "bench-a", PROJECT), c.McpSession(env, "bench-b", PROJECT)
            try:
                relay_pairs(a, b, warmup)
                trio.run(ipc_pairs, record["socket"], warmup)
                for _ in range(rounds):
                    time.sleep(SETTLE)
                    before = cpu([broker.pid, a.proc.pid, b.proc.pid])
                    start = time.perf_counter()
                    relay_pairs(a, b, pairs)
                    wall = time.perf_counter() - start
                    time.sleep(SETTLE)
                    after = cpu([broker.pid, a.proc.pid, b.proc.pid])
                    used = [(x - y) / pairs * 1e6 for x, y in zip(after, before, strict=True)]
                    broker_us.append(used[0])
                    relay_us.append(used[1] + used[2])
                    wall_ms.append(wall / pairs * 1e3)

                    (before_ipc,) = cpu([broker.pid])
                    trio.run(ipc_pairs, record["socket"], pairs)
                    time.sleep(SETTLE)
                    (after_ipc,) = cpu([broker.pid])
                    ipc_us.append((after_ipc - before_ipc) / pairs * 1e6)
            finally:
                a.close()
                b.close()
    totals = [x + y for x, y in zip(broker_us, relay_us, strict=True)]
    c.report(
        "cpu_per_pair",
        value=c.median(totals),
        unit="µs of CPU per send + inbox pair through two agent-bridge mcp relays (broker + relays, median "
             "round)",
        baseline=c.median(ipc_us),
        target="none: a reading for same-run comparisons (bench/compare.py); baseline: broker CPU per pair, "
               "broker-only",
        ok=True,
        n=rounds * pairs,
        p50=c.median(totals),
        p99=c.percentile(totals, 99),
        quick=args.quick,
        details={
            "rounds": rounds,
            "pairs": pairs,
            "broker_us_per_pair": c.median(broker_us),
            "relays_us_per_pair": c.median(relay_us),
            "broker_only_us_per_pair": c.median(ipc_us),
            "wall_ms_per_pair": c.median(wall_ms),
            "clock_tick_us": 1e6 / os.sysconf("SC_CLK_TCK"),
            **({"floor": True} if args.floor else {}),
            "protocol": args.protocol,
        },
    )


if __name__ == "__main__":
    main()
