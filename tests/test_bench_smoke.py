"""Every benchmark runs with --quick (tiny sizes) and prints its one JSON line in the agreed shape.

Only the shape is checked, never the numbers: timing belongs to `nox -s bench`, not to tests.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

# serial: the benchmarks load the machine on purpose, and the tests beside them would skew them;
# nox runs these in its second pass, with nothing else of the suite running.
pytestmark = pytest.mark.serial

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
SCRIPTS = sorted(p.name for p in BENCH.glob("bench_*.py"))
EXPECTED = {
    "bench_context_cost.py",
    "bench_cpu_per_pair.py",
    "bench_decide_fanout.py",
    "bench_decisions_query.py",
    "bench_federation.py",
    "bench_hook_post_tool_use.py",
    "bench_job_start.py",
    "bench_reach.py",
    "bench_hook_session_start.py",
    "bench_mcp_tool_call.py",
    "bench_message_throughput.py",
    "bench_reconnect_storm.py",
    "bench_search.py",
    "bench_session_footprint.py",
    "bench_waiters.py",
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


@pytest.mark.slow
def test_the_floor_relay_carries_the_pairs_of_cpu_per_pair(tmp_path: Path) -> None:
    """`--floor`: the sessions through bench/_floor_relay.py, whose every pair must go through
    (a `send` shown by the other session's `inbox`), or the floor it reads is of nothing."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_BRIDGE_")}
    env["AGENT_BRIDGE_BENCH_RESULTS"] = str(tmp_path / "results.jsonl")
    proc = subprocess.run(
        [sys.executable, str(BENCH / "bench_cpu_per_pair.py"), "--quick", "--floor"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    line = json.loads(proc.stdout)
    assert line["details"]["floor"] is True and line["n"] == line["details"]["pairs"]


@pytest.mark.slow
def test_message_throughput_through_a_host_of_the_2026_protocol(tmp_path: Path) -> None:
    """`--protocol 2026`: the relays' host probes with `server/discover` and puts the envelope in
    every request, as Claude Code 2.1.332 does with a broker running; a round ends only once
    every message sent is shown, so a line at all means the path carried them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_BRIDGE_")}
    env["AGENT_BRIDGE_BENCH_RESULTS"] = str(tmp_path / "results.jsonl")
    proc = subprocess.run(
        [sys.executable, str(BENCH / "bench_message_throughput.py"), "--quick", "--protocol", "2026"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    line = json.loads(proc.stdout)
    assert line["details"]["protocol"] == "2026" and line["value"] > 0, line


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="CPU per process is read from Linux's /proc")
def test_message_throughput_reports_the_cpu_of_each_process_per_message(tmp_path: Path) -> None:
    """The CPU per message of each process of both paths over their windowed rounds: the broker
    and this process (its clients) for the broker alone; the broker, this process (the host) and
    the two relays for the relay path; `all` their sum. Values are only ever >= 0 here: --quick
    rounds are shorter than the counters' tick."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_BRIDGE_")}
    env["AGENT_BRIDGE_BENCH_RESULTS"] = str(tmp_path / "results.jsonl")
    proc = subprocess.run(
        [sys.executable, str(BENCH / "bench_message_throughput.py"), "--quick"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    details = json.loads(proc.stdout)["details"]
    for key, roles in (("broker_only_cpu_us", {"broker", "clients"}),
                       ("relay_cpu_us", {"broker", "host", "relays"})):
        cpu = details[key]
        assert set(cpu) == roles | {"all"}, (key, cpu)
        assert all(_number(v) and v >= 0 for v in cpu.values()), (key, cpu)
        assert cpu["all"] == pytest.approx(sum(cpu[role] for role in roles), abs=0.2), (key, cpu)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="CPU per process is read from Linux's /proc")
def test_the_cpu_meter_counts_what_a_process_spent_in_its_counted_rounds() -> None:
    """bench_message_throughput's CpuMeter reads a process's CPU (from /proc) over the rounds it
    counts, per message, and nothing over the rounds it does not count."""
    meter = _bench_module("bench_message_throughput").CpuMeter({"bench": [os.getpid()]})

    def burn(seconds: float) -> None:  # CPU time, not wall time: what the meter reads
        start = time.process_time()
        while time.process_time() - start < seconds:
            pass

    with meter.round(100, counted=False):
        burn(0.05)
    assert meter.per_message() is None
    with meter.round(100, counted=True):
        burn(0.2)  # 2,000 µs a message; /proc counts in ticks of 10 ms
    cpu = meter.per_message()
    assert cpu is not None and set(cpu) == {"bench", "all"}
    assert 1_500 <= cpu["bench"] == cpu["all"], cpu


def _bench_module(name: str):
    """bench/<name>.py, loaded as a module (the benches are scripts, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _line(value: float, unit: str, **details: float) -> dict:
    return {"value": value, "unit": unit, "details": {"rounds": 3, **details}}


def test_compare_judges_the_median_in_the_direction_of_its_unit() -> None:
    judge = _bench_module("compare").judge
    scripts = {"base": "base:bench/bench_x.py", "current": "current:bench/bench_x.py"}
    slower = judge("x", {"base": [_line(1.0, "ms"), _line(1.2, "ms"), _line(0.9, "ms")],
                         "current": [_line(1.06, "ms"), _line(1.02, "ms"), _line(5.0, "ms")]}, scripts)
    assert (slower["base"], slower["current"], slower["better"]) == (1.0, 1.06, "lower")
    assert slower["ok"] is False  # 6 % slower: beyond the 5 % of noise
    within = judge("x", {"base": [_line(1.0, "ms")], "current": [_line(1.04, "ms")]}, scripts)
    assert within["ok"] is True
    rate = judge("x", {"base": [_line(100.0, "messages/s")], "current": [_line(90.0, "messages/s")]}, scripts)
    assert (rate["better"], rate["ok"]) == ("higher", False)
    assert judge("x", {"base": [_line(100.0, "messages/s")], "current": [_line(120.0, "messages/s")]},
                 scripts)["ok"] is True


def test_compare_falls_back_to_a_reading_both_lines_carry() -> None:
    judge = _bench_module("compare").judge
    scripts = {
        "base": "base:bench/bench_message_throughput.py",
        "current": "current:bench/bench_message_throughput.py",
    }
    old = _line(10_000.0, "messages/s broker-only", one_at_a_time_p50=0.6)
    new = _line(2_500.0, "messages/s through relays", broker_only_rate=9_000.0, one_at_a_time_p50=0.5)
    line = judge("message_throughput", {"base": [old], "current": [new]}, scripts)
    assert (line["metric"], line["base"], line["current"], line["ok"]) == (
        "details.broker_only_rate",
        10_000,
        9_000,
        False,
    )
    assert line["details"] == {"one_at_a_time_p50": [0.6, 0.5]}  # settings (rounds) left out
    assert line["current_value"]["median"] == 2_500.0
    unknown = judge("other", {"base": [old], "current": [new]}, scripts)
    assert unknown["ok"] is None and "different things" in unknown["note"]


def test_compare_reports_the_numbers_inside_an_object_of_details_by_their_path() -> None:
    """The CPU a message by process (bench_message_throughput's `broker_only_cpu_us`) is an
    object: its numbers are compared like any other detail, by path; a key only one side
    carries, a setting the same on both, and text are left out."""
    judge = _bench_module("compare").judge
    scripts = {"base": "current:bench/bench_x.py", "current": "current:bench/bench_x.py"}

    def line(rate: float, broker: float, clients: float, **more: object) -> dict:
        cpu = {"broker": broker, "clients": clients, "all": broker + clients, **more}
        return {"value": rate, "unit": "messages/s", "details": {"rounds": 3, "cpu_us": cpu, "host": "x"}}

    out = judge("x", {"base": [line(100.0, 120.0, 80.0), line(110.0, 110.0, 90.0, relays=5.0)],
                      "current": [line(105.0, 100.0, 70.0), line(95.0, 104.0, 66.0)]}, scripts)
    assert out["details"] == {
        "cpu_us.all": [200.0, 170.0], "cpu_us.broker": [115.0, 102.0], "cpu_us.clients": [85.0, 68.0],
    }


def _run_compare(tmp_path: Path, *args: str) -> tuple[list[dict], str]:
    if subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_BRIDGE_")}
    proc = subprocess.run(
        [sys.executable, str(BENCH / "compare.py"), "--base", "HEAD", "--rounds", "1", "--quick", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode in (0, 1), proc.stderr  # 1: worse beyond noise, which tiny runs may well be
    return [json.loads(text) for text in proc.stdout.splitlines()], proc.stderr


@pytest.mark.slow
def test_compare_runs_this_trees_script_for_both_trees(tmp_path: Path) -> None:
    lines, stderr = _run_compare(tmp_path, "mcp_tool_call", "message_throughput:--broker-only")
    tool_call, broker_only = lines
    assert tool_call["bench"] == "mcp_tool_call"
    assert tool_call["scripts"] == {
        "base": "current:bench/bench_mcp_tool_call.py",
        "current": "current:bench/bench_mcp_tool_call.py",
    }
    assert isinstance(tool_call["ok"], bool) and _number(tool_call["ratio"])
    assert tool_call["better"] == "lower"
    # The flags after the colon reach the script: its broker-only value and unit, on both sides.
    assert broker_only["bench"] == "message_throughput:--broker-only"
    assert broker_only["scripts"]["base"] == "current:bench/bench_message_throughput.py --broker-only"
    assert broker_only["metric"] == "value" and broker_only["better"] == "higher"
    assert broker_only["unit"].startswith("messages/s (send → delivered → acknowledged")
    assert _number(broker_only["ratio"]) and "relay_one_at_a_time_p50" not in broker_only["details"]
    assert f"a relay imports {REPO / 'agent_bridge' / '__init__.py'}" in stderr
    # and the base's relay, the temporary worktree's copy
    assert re.search(r"base \(\w+\): a relay imports /\S+/abcmp-\w+/tree/agent_bridge/__init__\.py", stderr)


@pytest.mark.slow
def test_compare_runs_each_trees_own_script_when_asked(tmp_path: Path) -> None:
    (line,), _ = _run_compare(tmp_path, "--scripts", "own", "mcp_tool_call")
    assert line["scripts"] == {
        "base": "base:bench/bench_mcp_tool_call.py",
        "current": "current:bench/bench_mcp_tool_call.py",
    }
    assert isinstance(line["ok"], bool) and _number(line["ratio"])


@pytest.mark.slow
def test_instructions_counts_each_tree_s_broker_per_message(tmp_path: Path) -> None:
    """bench/instructions.py against this tree itself, one short run a side: each reading is a
    count per message from callgrind's dump of the broker's threads (noxfile installs valgrind).
    The tool checks its base out as a git worktree: the suite runs from a clone, as CI does."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_BRIDGE_")}
    proc = subprocess.run(
        [sys.executable, str(BENCH / "instructions.py"), "--base", "HEAD", "--runs", "1", "--rounds", "1",
         "--per-round", "40", "--settle", "2"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = json.loads(proc.stdout.splitlines()[-1])
    assert line["bench"] == "instructions:broker" and line["better"] == "lower"
    for key in ("loop", "all"):
        reading = line[key]
        # a message costs the loop tens of thousands of instructions at least; the whole process more
        assert reading["base"] > 10_000 and reading["current"] > 10_000, line
        assert _number(reading["ratio"])
    assert line["all"]["current"] >= line["loop"]["current"]
    threads = line["threads"]["current"][0]
    assert len(threads) >= 2 and threads[0] == line["loop"]["current"]  # the loop is the first thread
