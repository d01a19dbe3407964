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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
RESULTS = BENCH_DIR / "results.jsonl"
PYTHON = sys.executable
SCRIPT = Path(sys.executable).with_name("agent-bridge")  # the console script, as hosts run it
CLI = [str(SCRIPT)] if SCRIPT.exists() else [PYTHON, "-m", "agent_bridge"]
READY_TIMEOUT = 30.0


def parse_args(description: str, argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the benchmark runs, not its numbers")
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
            self.command, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> dict[str, Any]:
        """Poll until the broker answers `ping` on the socket its broker.json names."""
        from agent_bridge import paths
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
