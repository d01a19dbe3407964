"""Every benchmark runs with --quick (tiny sizes) and prints its one JSON line in the agreed shape.

Only the shape is checked, never the numbers: timing belongs to `nox -s bench`, not to tests.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
SCRIPTS = sorted(p.name for p in BENCH.glob("bench_*.py"))
EXPECTED = {
    "bench_context_cost.py",
    "bench_cpu_per_pair.py",
    "bench_decide_fanout.py",
    "bench_decisions_query.py",
    "bench_hook_post_tool_use.py",
    "bench_reach.py",
    "bench_hook_session_start.py",
    "bench_mcp_tool_call.py",
    "bench_message_throughput.py",
    "bench_reconnect_storm.py",
    "bench_session_footprint.py",
}
FIELDS = {"bench", "value", "unit", "baseline", "ratio", "target", "ok", "n", "p50", "p99"}


def test_every_benchmark_of_the_issue_is_there():
    assert EXPECTED <= set(SCRIPTS)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_quick_run_prints_one_json_line(script: str, tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_BRIDGE_")}
    env["AGENT_BRIDGE_BENCH_RESULTS"] = str(results)
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), "--quick"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout
    line = json.loads(lines[0])

    assert FIELDS <= set(line), sorted(FIELDS - set(line))
    assert line["bench"] == script.removeprefix("bench_").removesuffix(".py")
    assert isinstance(line["unit"], str) and line["unit"]
    assert isinstance(line["target"], str) and line["target"]
    assert isinstance(line["ok"], bool)
    assert isinstance(line["n"], int) and not isinstance(line["n"], bool) and line["n"] >= 1
    for key in ("value", "baseline", "ratio", "p50", "p99"):
        assert _number(line[key]), (key, line[key])
    assert line["baseline"] > 0
    assert line["ratio"] == pytest.approx(line["value"] / line["baseline"], rel=1e-2)
    assert line["quick"] is True

    assert results.read_text(encoding="utf-8").splitlines() == lines  # appended, same line
