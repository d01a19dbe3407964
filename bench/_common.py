"""What every benchmark shares: `--quick`, percentiles, the one JSON line, a throw-away home
and a real broker process.

Each benchmark prints exactly one JSON line (SPEC §9):

    {"bench": name, "value": number, "unit": "...", "baseline": number, "ratio": value/baseline,
     "target": "<the rule>", "ok": bool, "n": samples, "p50": ..., "p99": ..., "details": {...}}

and appends it to `bench/results.jsonl` (git-ignored; `AGENT_BRIDGE_BENCH_RESULTS` points it
elsewhere, as the smoke test does). Baselines are measured in the same run, interleaved with the
measured runs, so the noise of a busy 2-core machine hits both alike.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from itertools import count
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
RESULTS = BENCH_DIR / "results.jsonl"
PYTHON = sys.executable
SCRIPT = Path(sys.executable).with_name("agent-bridge")  # the console script, as hosts run it
CLI = [str(SCRIPT)] if SCRIPT.exists() else [PYTHON, "-m", "agent_bridge"]
READY_TIMEOUT = 30.0
# After it answers, a broker loads its sessions' MCP side on a thread: broker.root._preload_mcp,
# SETTLE_QUIET (1 s) after the last session joined, about 0.75 s of CPU (so does 8cd758e's), and
# since stop 69 its dashboard's Quart and Hypercorn then too (dashboard/deferred.py), 0.2 s more.
# Rounds that begin at once share the CPU with that load for their first seconds, and a bench's
# median round moved with where it fell (docs/performance.md, stop 59). BrokerProcess.wait_settled.
SETTLE_FIRST = 1.5  # seconds after ready: past SETTLE_QUIET, so the load has begun
SETTLE_SPELL = 0.5  # seconds the broker must then spend with next to no CPU
SETTLE_CPU = 0.01  # ...at most this many seconds of CPU in that spell
SETTLE_TIMEOUT = 30.0


def parse_args(
    description: str,
    argv: Sequence[str] | None = None,
    options: Callable[[argparse.ArgumentParser], None] | None = None,
) -> argparse.Namespace:
    """--quick, and the bench's own `options` if it has any."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes: checks the benchmark runs, not its numbers"
    )
    if options is not None:
        options(parser)
    args = parser.parse_args(argv)
    ensure_bytecode()
    return args


def ensure_bytecode() -> None:
    """Compile agent_bridge's bytecode, as an installed package has it.

    With PYTHONDONTWRITEBYTECODE set (it is, on some machines) or an editable install, a module
    edited since its .pyc was written is compiled again at every import of every process: the
    hook would be timed compiling its own source (~10 ms), which no installed copy does.
    """
    import compileall
    import importlib.util

    spec = importlib.util.find_spec("agent_bridge")
    if spec is None or not spec.submodule_search_locations:
        return
    for folder in spec.submodule_search_locations:
        compileall.compile_dir(folder, quiet=2)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks."""
    if not values:
        return math.nan
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    k = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo))


def median(values: Sequence[float]) -> float:
    return percentile(values, 50)


def ms(ns: float) -> float:
    return ns / 1e6


def report(
    bench: str,
    *,
    value: float,
    unit: str,
    baseline: float,
    target: str,
    ok: bool,
    n: int,
    p50: float,
    p99: float,
    quick: bool,
    details: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Print the benchmark's one JSON line and append it to the results file."""
    line = {
        "bench": bench,
        "value": _round(value),
        "unit": unit,
        "baseline": _round(baseline),
        "ratio": _round(value / baseline) if baseline else None,
        "target": target,
        "ok": bool(ok),
        "n": int(n),
        "p50": _round(p50),
        "p99": _round(p99),
        "details": {k: _round(v) for k, v in (details or {}).items()},
        "quick": quick,
        "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    text = json.dumps(line, ensure_ascii=False)
    results = Path(os.environ.get("AGENT_BRIDGE_BENCH_RESULTS") or RESULTS)
    with open(results, "a", encoding="utf-8") as f:
        f.write(text + "\n")
    print(text, flush=True)
    return line


def _round(value: Any) -> Any:
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return None
        return round(value, 4 if abs(value) < 10 else 2)
    return value


def log(message: str) -> None:
    """Progress for people, on stderr (stdout carries only the JSON line)."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


# --- a private home and a real broker ---------------------------------------------------


@contextmanager
def temp_home() -> Iterator[Path]:
    """A fresh state folder with a short path (the socket path must fit sun_path)."""
    folder = Path(tempfile.mkdtemp(prefix="abb-"))
    try:
        yield folder / "home"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def bench_env(home: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for key in ("AGENT_BRIDGE_HOST_SESSION_ID", "CLAUDE_CODE_SESSION_ID", "AGENT_BRIDGE_HOP_LIMIT",
                "AGENT_BRIDGE_HOST_PID", "AGENT_BRIDGE_FAULT"):
        env.pop(key, None)
    env["AGENT_BRIDGE_HOME"] = str(home)
    env["AGENT_BRIDGE_WEB_PORT"] = "0"
    env.update(extra)
    return env


class BrokerProcess:
    """`agent-bridge up` in the foreground as a child process (or another launcher command)."""

    def __init__(self, home: Path, env: dict[str, str], command: Sequence[str] | None = None) -> None:
        self.home = home
        self.env = env
        self.command = list(command) if command else [*CLI, "up"]
        self.proc: subprocess.Popen[bytes] | None = None

    def spawn(self) -> None:
        self.proc = subprocess.Popen(
            self.command,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> dict[str, Any]:
        """Poll until the broker answers `ping` on the socket its broker.json names."""
        from agent_bridge.common import paths
        from agent_bridge.ipc import blocking

        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise RuntimeError(f"broker exited with {self.proc.returncode}: {err}")
            record = paths.read_broker_json(self.home)
            if record and record.get("pid") == self.proc.pid:
                try:
                    if blocking.call(self.home, "ping", timeout=1.0) == "pong":
                        return record
                except (blocking.BrokerUnavailable, OSError):
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError("broker did not become ready")
            time.sleep(0.005)

    def wait_settled(self, timeout: float = SETTLE_TIMEOUT) -> None:
        """Until the broker has done the work it does once after its start (the load above):
        SETTLE_FIRST, then a spell of SETTLE_SPELL with at most SETTLE_CPU of the process's CPU
        (/proc; where there is none, a fixed pause). For a bench that measures a broker at work
        rather than one starting."""
        assert self.proc is not None
        pid = self.proc.pid
        time.sleep(SETTLE_FIRST)
        if not Path(f"/proc/{pid}/stat").exists():
            time.sleep(4 * SETTLE_SPELL)
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            before = cpu_seconds(pid)
            time.sleep(SETTLE_SPELL)
            if cpu_seconds(pid) - before <= SETTLE_CPU:
                return
        raise RuntimeError(f"the broker did not settle within {timeout:g} s of its start")

    def start(self) -> dict[str, Any]:
        self.spawn()
        return self.wait_ready()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM (graceful: checkpoint, broker.json removed) and wait."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def rss_mb(self) -> float:
        return rss_mb(self.pid)

    def __enter__(self) -> BrokerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def rss_mb(pid: int) -> float:
    """Resident set size of a process in MiB (Linux /proc), NaN where unknown."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return math.nan


def hello(project: str, index: int, *, agent: str = "claude", kind: str = "interactive") -> dict[str, Any]:
    """A session's hello, with an explicit host session id (an identified session)."""
    return {"agent": agent, "project": project, "kind": kind, "hostSessionId": f"bench-host-{index}"}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far, all its threads (Linux /proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- sessions through the relay, as hosts run them -----------------------------------------

INITIALIZE = {
    "protocolVersion": "2025-06-18",
    "capabilities": {},
    "clientInfo": {"name": "bench", "version": "1"},
}
INITIALIZED = b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n'


# The 2026 protocol's envelope, on every request of a host that speaks it (no handshake: a
# `server/discover` probe first), as Claude Code 2.1.332 writes it to a running broker's server
# (tests/hosts/test_health_checks.py)
MODERN_META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
               "io.modelcontextprotocol/clientInfo": {"name": "claude-code", "version": "2.1.332"},
               "io.modelcontextprotocol/clientCapabilities": {}}

FLOOR_RELAY = BENCH_DIR / "_floor_relay.py"
floor = False  # set by a bench's --floor (floor_option): sessions through FLOOR_RELAY, not the relay
protocol = "2025"  # set by a bench's --protocol (protocol_option): what its relay sessions' host speaks


def floor_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--floor", action="store_true", help=(
        "sessions through bench/_floor_relay.py (a process that only moves frames) instead of "
        "`agent-bridge mcp`: the floor of the relay path, a reading, never a result to compare"))


def protocol_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--protocol", choices=("2025", "2026"), default="2025", help=(
        "what the relays' host speaks: 2025, the handshake (`initialize`, as Codex and hosts "
        "with no broker running yet); 2026, a `server/discover` probe, then the envelope in every "
        "request's `_meta` (Claude Code 2.1.332 with a broker running)"))


def relay_command(name: str, project: str) -> list[str]:
    """`agent-bridge mcp` for a session `name` (also its host session id) in `project`."""
    head = [PYTHON, str(FLOOR_RELAY)] if floor else CLI
    return [*head, "mcp", "--agent", "claude", "--project", project, "--name", name,
            "--host-session-id", name]


def tool_result(result: dict[str, Any]) -> Any:
    """A `tools/call` result's JSON payload; a tool error is a failed benchmark."""
    assert not result.get("isError"), result
    return json.loads(result["content"][0]["text"])


class McpSession:
    """One `agent-bridge mcp` process, spoken to by hand over its stdio (raw JSON-RPC, one call
    at a time, blocking: no client library in the measurement)."""

    def __init__(self, env: dict[str, str], name: str, project: str) -> None:
        self.proc = subprocess.Popen(
            relay_command(name, project), env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.ids = count(1)
        self.meta: dict[str, Any] | None = None  # the `_meta` of every tool call (the 2026 envelope)
        if protocol == "2026":
            self.call("server/discover", {"_meta": MODERN_META})
            self.meta = MODERN_META
        else:
            self.call("initialize", INITIALIZE)
            self.write(INITIALIZED)

    def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        rid = next(self.ids)
        self.write(
            (json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}) + "\n").encode()
        )
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("agent-bridge mcp closed stdout")
            message = json.loads(line)
            if message.get("id") == rid:
                return message["result"]  # type: ignore[no-any-return]

    def tool(self, name: str, **arguments: object) -> Any:
        params: dict[str, Any] = {"name": name, "arguments": arguments}
        if self.meta is not None:
            params["_meta"] = self.meta
        return tool_result(self.call("tools/call", params))

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


class Relay:
    """One `agent-bridge mcp` process spoken to over its stdio with raw JSON-RPC from Trio, calls
    overlapping as a host's parallel tool calls do (answers are matched by request id)."""

    def __init__(self, process: Any) -> None:
        import trio

        self.process = process
        self.ids = count(1)
        self.answers: dict[int, dict[str, Any]] = {}
        self.arrived = trio.Event()  # set (and replaced) whenever answers arrive
        self.writing = trio.Lock()  # one writer at a time on the relay's stdin
        self.meta: dict[str, Any] | None = None  # the `_meta` of every tool call (the 2026 envelope)

    async def _read(self) -> None:
        import trio

        rest = b""
        while chunk := await self.process.stdout.receive_some(1 << 16):
            *lines, rest = (rest + chunk).split(b"\n")
            for line in lines:
                message = json.loads(line)
                if "id" in message:
                    self.answers[message["id"]] = message
            self.arrived.set()
            self.arrived = trio.Event()
        raise RuntimeError("agent-bridge mcp closed stdout")

    async def write(self, data: bytes) -> None:
        async with self.writing:
            await self.process.stdin.send_all(data)

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        rid = next(self.ids)
        await self.write(
            (json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}) + "\n").encode()
        )
        while rid not in self.answers:
            await self.arrived.wait()
        return self.answers.pop(rid)["result"]  # type: ignore[no-any-return]

    async def tool(self, name: str, **arguments: object) -> Any:
        params: dict[str, Any] = {"name": name, "arguments": arguments}
        if self.meta is not None:
            params["_meta"] = self.meta
        return tool_result(await self.call("tools/call", params))


@asynccontextmanager
async def open_relay(env: dict[str, str], name: str, project: str) -> AsyncIterator[Relay]:
    """A started and initialized `agent-bridge mcp` session (or one probed, for a host of the
    2026 protocol: `protocol`); leaving the block closes its stdin (the host leaving) and waits
    for it to exit."""
    import trio

    process = await trio.lowlevel.open_process(
        relay_command(name, project), env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        async with trio.open_nursery() as nursery:
            relay = Relay(process)
            nursery.start_soon(relay._read)
            if protocol == "2026":
                await relay.call("server/discover", {"_meta": MODERN_META})
                relay.meta = MODERN_META
            else:
                await relay.call("initialize", INITIALIZE)
                await relay.write(INITIALIZED)
            yield relay
            nursery.cancel_scope.cancel()
    finally:
        with trio.move_on_after(10) as waiting:
            waiting.shield = True
            await process.stdin.aclose()
            await process.wait()
        if waiting.cancelled_caught:
            process.kill()
