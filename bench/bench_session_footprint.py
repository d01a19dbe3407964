"""session_footprint: what one agent session's `agent-bridge mcp` costs its machine.

Spawn → `initialize` → `tools/list` answered, one session at a time, as a host starts its MCP
server (raw JSON-RPC over the process's real stdio, against a running broker), and the resident
memory of each of 20 sessions open at once, one second after they answered (plus the broker's,
and the total of every bridge process).

Baselines, measured in the same run: `python3 -c pass` (spawn to exit) for the time, an idle
`python3` (one second after it started, reading stdin) for the memory; both ratios reported.
Targets (issue 16): spawn → tools/list p50 ≤ 150 ms, RSS per session ≤ 25 MB.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c  # noqa: E402

from agent_bridge.common.tools import TOOLS  # noqa: E402 - the tree measured (compare.py's PYTHONPATH)

PROJECT = "/bench/footprint"
TARGET_MS, TARGET_MB = 150.0, 25.0
SETTLE = 1.0  # seconds between a session's answer and reading its RSS, as the issue measured


def request(rid: int, method: str, params: dict | None = None) -> bytes:
    message: dict = {"jsonrpc": "2.0", "id": rid, "method": method}
    if params is not None:
        message["params"] = params
    return (json.dumps(message) + "\n").encode()


INITIALIZE = request(0, "initialize", {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}})
INITIALIZED = b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n'


def answer(proc: subprocess.Popen[bytes], rid: int) -> dict:
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"agent-bridge mcp closed stdout before answering {rid}")
        message = json.loads(line)
        if message.get("id") == rid:
            return message


def open_session(env: dict[str, str], index: int) -> subprocess.Popen[bytes]:
    """Spawn a session and drive it to its `tools/list` answer."""
    proc = subprocess.Popen(
        [*c.CLI, "mcp", "--agent", "claude", "--project", PROJECT, "--host-session-id", f"footprint-{index}"],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )
    assert proc.stdin is not None
    proc.stdin.write(INITIALIZE)
    proc.stdin.flush()
    answer(proc, 0)
    proc.stdin.write(INITIALIZED + request(1, "tools/list"))
    proc.stdin.flush()
    tools = answer(proc, 1)["result"]["tools"]
    assert len(tools) == len(TOOLS), tools
    return proc


def close(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def spawn_ns(env: dict[str, str], index: int) -> int:
    start = time.perf_counter_ns()
    proc = open_session(env, index)
    elapsed = time.perf_counter_ns() - start
    close(proc)
    return elapsed


def python_pass_ns() -> int:
    start = time.perf_counter_ns()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter_ns() - start


def idle_python_mb() -> float:
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    time.sleep(SETTLE)
    rss = c.rss_mb(proc.pid)
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait()
    return rss


def main() -> None:
    args = c.parse_args(__doc__ or "")
    spawns, warmup, crowd = (3, 1, 3) if args.quick else (30, 3, 20)
    c.ensure_bytecode()
    with c.temp_home() as home:
        env = c.bench_env(home)
        with c.BrokerProcess(home, env) as broker:
            c.log(f"session_footprint: {spawns} spawns, then {crowd} sessions at once")
            times, floor = [], []
            for i in range(warmup + spawns):  # interleaved with the baseline, spawn for spawn
                elapsed = spawn_ns(env, i)
                base = python_pass_ns()
                if i >= warmup:
                    times.append(elapsed)
                    floor.append(base)
            procs = [open_session(env, 1000 + i) for i in range(crowd)]
            try:
                time.sleep(SETTLE)
                rss = [c.rss_mb(p.pid) for p in procs]
                broker_mb = broker.rss_mb()
            finally:
                for p in procs:
                    close(p)
            idle_mb = idle_python_mb()
    value = c.ms(c.median(times))
    per_session = c.median(rss)
    ok = value <= TARGET_MS and per_session <= TARGET_MB
    c.report(
        "session_footprint",
        value=value,
        unit="ms (spawn -> initialize -> tools/list answered, median)",
        baseline=c.ms(c.median(floor)),
        target=f"spawn -> tools/list p50 <= {TARGET_MS:g} ms and RSS per session <= {TARGET_MB:g} MB",
        ok=ok,
        n=len(times),
        p50=value,
        p99=c.ms(c.percentile(times, 99)),
        quick=args.quick,
        details={
            "python_c_pass_p50_ms": c.ms(c.median(floor)),
            "rss_per_session_mb": per_session,
            "rss_per_session_max_mb": max(rss),
            "idle_python_rss_mb": idle_mb,
            "rss_ratio_to_idle_python": per_session / idle_mb if idle_mb else None,
            "sessions_at_once": crowd,
            "sessions_total_rss_mb": sum(rss),
            "broker_rss_mb": broker_mb,
            "all_bridge_processes_rss_mb": sum(rss) + broker_mb,
        },
    )


if __name__ == "__main__":
    main()
