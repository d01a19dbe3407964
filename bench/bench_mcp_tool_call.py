"""mcp_tool_call: tool calls through real `agent-bridge mcp` processes, as a host makes them.

The number users feel (SPEC §9): a `send` + `inbox` pair. Two sessions, each a real
`agent-bridge mcp` spoken to over its real stdio with raw JSON-RPC (no client library in the
measurement): A calls `send` to B, then B calls `inbox` (waiting up to a second for the
delivery), and the pair's time is from A's request to B's answer; the pairs run back to back,
as the baseline's do. Also reported, in a loop of its own: a `decisions` call against 200
current decisions of the project.

Baseline, the broker's floor for the same pair: the `send` request straight to the broker
through the IPC client library, until the receiving IPC session has the push (no MCP, no
JSON-RPC, no stdio process). Target (issue 16): pair p50 <= 1.5 ms.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c  # noqa: E402

PROJECT = "/bench/mcp-project"
TARGET_MS = 1.5


def through_mcp(env: dict[str, str], pairs: int, decisions: int, warmup: int) -> dict[str, list[int]]:
    a, b = c.McpSession(env, "bench-a", PROJECT), c.McpSession(env, "bench-b", PROJECT)
    try:
        for i in range(decisions):
            a.tool(
                "decide", topic=f"topic {i}", text=f"Decision number {i}: keep it simple and written down."
            )
        b.tool("inbox")  # the decision notices
        # The pairs back to back, as the IPC baseline's are (through_ipc): each side measured
        # in the same rhythm. The `decisions` calls, 9 ms each, once ran between the pairs here
        # and not there, so every relay pair started cold against a warm baseline.
        pair_ns, decisions_ns = [], []
        for i in range(warmup + pairs):
            start = time.perf_counter_ns()
            a.tool("send", to="bench-b", text=f"message {i}")
            got: list = []
            while not got:
                got = b.tool("inbox", wait_seconds=1)  # type: ignore[assignment]
            elapsed = time.perf_counter_ns() - start
            if i >= warmup:
                pair_ns.append(elapsed)
        for i in range(warmup + decisions):
            start = time.perf_counter_ns()
            a.tool("decisions")
            if i >= warmup:
                decisions_ns.append(time.perf_counter_ns() - start)
        return {"pair": pair_ns, "decisions": decisions_ns}
    finally:
        a.close()
        b.close()


async def through_ipc(socket_path: str, pairs: int, warmup: int) -> list[int]:
    from agent_bridge.ipc.client import open_bridge_client

    out = []
    async with open_bridge_client(socket_path, c.hello(PROJECT, 1)) as (tx, _), \
            open_bridge_client(socket_path, c.hello(PROJECT, 2)) as (rx, pushes):
        to = rx.hello["session"]["id"]  # type: ignore[index]
        for i in range(warmup + pairs):
            start = time.perf_counter_ns()
            await tx.request("send", to=to, text=f"message {i}")
            async for frame in pushes:
                if frame.get("push") == "message":
                    break
            elapsed = time.perf_counter_ns() - start
            await rx.post("ack", ids=[frame["message"]["id"]])
            if i >= warmup:
                out.append(elapsed)
    return out


def main() -> None:
    args = c.parse_args(__doc__ or "", options=c.protocol_option)
    c.protocol = args.protocol
    pairs, decisions, warmup = (5, 5, 1) if args.quick else (300, 200, 20)
    import trio

    with c.temp_home() as home:
        env = c.bench_env(home)
        with c.BrokerProcess(home, env) as broker:
            record = broker.wait_ready()
            c.log(f"mcp_tool_call: {pairs} send + inbox pairs")
            mcp = through_mcp(env, pairs, decisions, warmup)
            ipc = trio.run(through_ipc, record["socket"], pairs, warmup)
    value = c.ms(c.median(mcp["pair"]))
    c.report(
        "mcp_tool_call",
        value=value,
        unit="ms (send + inbox pair through two agent-bridge mcp sessions, median)",
        baseline=c.ms(c.median(ipc)),
        target=f"send + inbox pair p50 <= {TARGET_MS:g} ms",
        ok=value <= TARGET_MS,
        n=len(mcp["pair"]),
        p50=value,
        p99=c.ms(c.percentile(mcp["pair"], 99)),
        quick=args.quick,
        details={
            "protocol": args.protocol,
            "decisions": decisions,
            "decisions_p50_ms": c.ms(c.percentile(mcp["decisions"], 50)),
            "decisions_p99_ms": c.ms(c.percentile(mcp["decisions"], 99)),
            "ipc_pair_p50_ms": c.ms(c.percentile(ipc, 50)),
            "ipc_pair_p99_ms": c.ms(c.percentile(ipc, 99)),
        },
    )


if __name__ == "__main__":
    main()
