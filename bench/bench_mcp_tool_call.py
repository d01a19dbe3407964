"""mcp_tool_call: round trip of a `decisions` call through a real `agent-bridge mcp` process.

The number users feel (SPEC §9; no target yet): the official MCP client drives `agent-bridge mcp`
over stdio, as Claude Code or Codex would, against a real broker holding 200 current decisions
of this project; each call is `decisions` with no arguments (this project's decisions).

Baseline, interleaved call for call: the same `decisions` request sent straight to the broker
through the IPC client library (no MCP process, no JSON-RPC), so the ratio is what the MCP layer
and its extra process hop cost.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c  # noqa: E402

PROJECT = "/bench/mcp-project"


async def drive(socket_path: str, env: dict[str, str], calls: int, decisions: int, warmup: int) -> dict:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    from agent_bridge.ipc.client import open_bridge_client

    params = StdioServerParameters(
        command=c.CLI[0], args=[*c.CLI[1:], "mcp", "--agent", "claude", "--project", PROJECT], env=env
    )
    mcp_ns: list[int] = []
    ipc_ns: list[int] = []
    async with open_bridge_client(socket_path, c.hello(PROJECT, 1)) as (direct, _pushes):
        for i in range(decisions):
            await direct.request("decide", topic=f"topic {i}", text=f"Decision number {i}: keep it simple and written down.")
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            for i in range(warmup + calls):
                start = time.perf_counter_ns()
                result = await session.call_tool("decisions", {})
                elapsed = time.perf_counter_ns() - start
                assert not result.is_error, result.content[0].text
                start = time.perf_counter_ns()
                await direct.request("decisions")
                direct_elapsed = time.perf_counter_ns() - start
                if i >= warmup:
                    mcp_ns.append(elapsed)
                    ipc_ns.append(direct_elapsed)
    return {"mcp": mcp_ns, "ipc": ipc_ns}


def main() -> None:
    args = c.parse_args(__doc__ or "")
    calls, decisions, warmup = (5, 5, 1) if args.quick else (300, 200, 20)
    import trio

    with c.temp_home() as home:
        env = c.bench_env(home)
        with c.BrokerProcess(home, env) as broker:
            record = broker.wait_ready()
            c.log(f"mcp_tool_call: {calls} calls")
            out = trio.run(drive, record["socket"], env, calls, decisions, warmup)
    value = c.ms(c.median(out["mcp"]))
    c.report(
        "mcp_tool_call",
        value=value,
        unit="ms (decisions tool round trip through agent-bridge mcp, median)",
        baseline=c.ms(c.median(out["ipc"])),
        target="none yet: reported (p50/p99 are what users feel)",
        ok=True,
        n=len(out["mcp"]),
        p50=value,
        p99=c.ms(c.percentile(out["mcp"], 99)),
        quick=args.quick,
        details={
            "decisions": decisions,
            "ipc_p50_ms": c.ms(c.percentile(out["ipc"], 50)),
            "ipc_p99_ms": c.ms(c.percentile(out["ipc"], 99)),
        },
    )


if __name__ == "__main__":
    main()
