"""A same-run A/B of benchmarks: another revision (the base) against this tree (the current).

    python bench/compare.py --base REV [--rounds N] [--scripts current|own] [bench[:--flag...] ...]

Checks REV out into a temporary `git worktree` (removed afterwards) and runs each named bench
(default: DEFAULT_BENCHES) N rounds for each tree, alternating (base, current, then current,
base, ...: a machine getting slower or faster during the run hits both alike). Every run is a
child process with `PYTHONPATH=<tree>`, so it and what it spawns through the venv's console
script (`agent-bridge up`, `agent-bridge mcp`) import that tree's agent_bridge; a relay spawned
under each tree is asked once which one it imported (`PYTHONVERBOSE`), and a mismatch stops the
comparison. A bench name may carry flags for its script after a colon:
`message_throughput:--broker-only`.

Which script measures: with `--scripts current` (the default) this tree's script runs for both
trees, so both are measured in the same scenario; the benches import what moved with a
fallback for older trees. With `--scripts own` each tree runs its own script where it has one:
the readings of each tree's own bench, which may be different scenarios (message_throughput's
broker-only rounds ran alone before a6f431d's successor added relays beside them). A script only
the current tree has runs for both.

Prints one JSON line per bench:

    {"bench": name, "scripts": {"base": ..., "current": ...}, "metric": "value" or "details.<key>",
     "unit": ..., "better": "higher" or "lower", "base": median, "current": median,
     "ratio": current / base, "ok": bool, "runs": {"base": [...], "current": [...]},
     "details": {key: [base median, current median], ...}}

`ok`: the current tree is not worse beyond noise: its median within NOISE of the base's, or
better. A rate (a unit in "/s") is better higher, anything else (ms, µs) lower. `details` holds
the medians of every numeric detail both trees' lines carry, for reading, not judged; a number
inside an object of details by its path (`broker_only_cpu_us.broker`: the broker's CPU a message,
steadier on a shared machine than the rate beside it). Where the
two scripts' `value`s measure different things (different units) the comparison falls back to
a reading both lines carry (SAME_READING), or says `"ok": null` when there is none. The exit
status is 1 when a bench is worse. Progress goes to stderr, and the benches' own result lines to
a temporary file, not to bench/results.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CURRENT = Path(__file__).resolve().parent.parent
DEFAULT_BENCHES = ("mcp_tool_call", "message_throughput", "message_throughput:--broker-only", "cpu_per_pair")
NOISE = 0.05  # a median within 5 % of the base's counts as no change
# When a bench's value changed meaning between the trees: the reading the base's value was, as
# the current line reports it. message_throughput's value was the broker-only rate until the
# relay path became its headline.
SAME_READING = {"message_throughput": "details.broker_only_rate"}
RUN_TIMEOUT = 900  # seconds one bench run may take
PROBE_TIMEOUT = 20.0  # seconds a relay may take to import agent_bridge


def log(message: str) -> None:
    print(f"[compare] {message}", file=sys.stderr, flush=True)


@contextmanager
def worktree(rev: str) -> Iterator[Path]:
    """REV checked out (detached) in a temporary worktree, removed when the block ends."""
    folder = Path(tempfile.mkdtemp(prefix="abcmp-")) / "tree"
    subprocess.run(
        ["git", "-C", str(CURRENT), "worktree", "add", "--detach", "--quiet", str(folder), rev], check=True
    )
    try:
        yield folder
    finally:
        subprocess.run(["git", "-C", str(CURRENT), "worktree", "remove", "--force", str(folder)], check=False)
        shutil.rmtree(folder.parent, ignore_errors=True)


def interpreter(scratch: Path) -> Path:
    """This venv seen through a folder of its own (`pyvenv.cfg` and `lib` shared, a `bin` with
    `python` and an `agent-bridge` of its own), whose console script runs `python -m agent_bridge`:
    the venv's own script names the current tree's entry point (`agent_bridge.cli.main:main`),
    which a tree from before the regrouping does not have. Both trees run through the same kind
    of script, so the comparison stays even."""
    venv = Path(sys.prefix)
    view = scratch / "venv"
    python = view / "bin" / "python"
    if python.exists():
        return python
    (view / "bin").mkdir(parents=True)
    shutil.copy(venv / "pyvenv.cfg", view / "pyvenv.cfg")
    (view / "lib").symlink_to(venv / "lib")
    python.symlink_to(Path(sys.executable).absolute())
    script = view / "bin" / "agent-bridge"
    script.write_text(f"#!{python}\nimport runpy\nrunpy.run_module('agent_bridge', run_name='__main__', "
                      "alter_sys=True)\n", encoding="utf-8")
    script.chmod(0o755)
    server = venv / "bin" / "nats-server"  # the pinned hub binary bench_federation starts, beside python
    if server.exists():
        (view / "bin" / "nats-server").symlink_to(server)
    return python


def run_env(tree: Path, home: Path, results: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_BRIDGE_")}
    env["PYTHONPATH"] = str(tree)
    env["AGENT_BRIDGE_HOME"] = str(home)  # the benches make their own; this keeps strays out of ~
    env["AGENT_BRIDGE_BENCH_RESULTS"] = str(results)
    return env


def imported_by_relay(tree: Path, scratch: Path) -> Path:
    """The agent_bridge package an `agent-bridge mcp` spawned under PYTHONPATH=tree imports.

    The relay runs with PYTHONVERBOSE, which names each module's file on stderr as it is
    imported; it is killed as soon as agent_bridge's appears (long before it would start a
    broker of its own, which a relay does after RESTART_AFTER seconds without one).
    """
    command = [str(interpreter(scratch / "probe").with_name("agent-bridge"))]
    env = run_env(tree, scratch / "probe-home", scratch / "probe.jsonl")
    env["PYTHONVERBOSE"] = "1"
    proc = subprocess.Popen(
        [*command, "mcp", "--agent", "claude", "--project", "/compare/probe", "--name", "probe"],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    found = None
    deadline = time.monotonic() + PROBE_TIMEOUT
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            match = re.search(r"(?:code object from|matches) '?(\S+?/agent_bridge/__init__\.py)", line)
            if match:
                found = Path(match.group(1)).resolve()
                break
            if time.monotonic() > deadline:
                break
    finally:
        proc.kill()
        proc.wait()
    if found is None:
        raise SystemExit(f"compare: could not tell which agent_bridge a relay under {tree} imports")
    return found


def run_bench(script: Path, tree: Path, scratch: Path, extra: list[str]) -> dict[str, Any]:
    results = scratch / "results.jsonl"
    proc = subprocess.run(
        [str(interpreter(scratch)), str(script), *extra], cwd=tree,
        env=run_env(tree, scratch / "home", results),
        capture_output=True, text=True, timeout=RUN_TIMEOUT,
    )
    if proc.returncode != 0:
        raise SystemExit(f"compare: {script} under {tree} failed ({proc.returncode}):\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def reading(line: dict[str, Any], key: str) -> float | None:
    """A number a bench's line carries: `value`, or `details.<key>`, where `<key>` may name a
    number inside an object of details (`details.broker_only_cpu_us.broker`)."""
    if not key.startswith("details."):
        value = line.get(key)
    else:
        value = line["details"]
        for part in key.removeprefix("details.").split("."):
            value = value.get(part) if isinstance(value, dict) else None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def detail_keys(details: dict[str, Any]) -> set[str]:
    """The keys of a line's details, with an object's numbers by their path (`cpu.broker`): the
    CPU each process spends a message, which the machine's load moves less than a rate."""
    keys = set()
    for key, value in details.items():
        if isinstance(value, dict):
            keys |= {f"{key}.{inner}" for inner in detail_keys(value)}
        else:
            keys.add(key)
    return keys


def judge(bench: str, runs: dict[str, list[dict[str, Any]]], scripts: dict[str, str]) -> dict[str, Any]:
    """The one JSON line for a bench: medians of both trees, their ratio, and `ok`."""
    base_unit, unit = runs["base"][0]["unit"], runs["current"][0]["unit"]
    metric = {"base": "value", "current": "value"}
    if base_unit != unit:
        metric["current"] = SAME_READING.get(bench, "")
        unit = base_unit
    values = {side: [reading(line, metric[side]) for line in lines] for side, lines in runs.items()}
    shared = sorted(set.intersection(*(detail_keys(lines[0]["details"]) for lines in runs.values())))
    details = {}
    for key in shared:
        both = [[reading(line, f"details.{key}") for line in runs[side]] for side in ("base", "current")]
        if any(v is None for side in both for v in side):
            continue
        if (
            all(isinstance(v, int) for side in both for v in side)
            and len({v for side in both for v in side}) == 1
        ):
            continue  # a setting (rounds, sizes), the same on both sides, not a reading
        details[key] = [round(statistics.median(side), 4) for side in both]  # type: ignore[type-var]
    out: dict[str, Any] = {"bench": bench, "scripts": scripts, "metric": metric["current"], "unit": unit}
    if any(v is None for side in values.values() for v in side):
        out.update(
            ok=None,
            note=f"the two scripts' values measure different things ({base_unit!r}, {unit!r}) "
            "and no reading both carry is known",
        )
        out["runs"] = {side: [line["value"] for line in lines] for side, lines in runs.items()}
        return out
    higher = "/s" in unit
    base = statistics.median(values["base"])  # type: ignore[type-var]
    current = statistics.median(values["current"])  # type: ignore[type-var]
    ratio = current / base if base else float("nan")
    ok = ratio >= 1 - NOISE if higher else ratio <= 1 + NOISE
    out.update(
        better="higher" if higher else "lower", base=round(base, 4), current=round(current, 4),
        ratio=round(ratio, 4), ok=ok, runs={side: [round(v, 4) for v in vs] for side, vs in values.items()},  # type: ignore[arg-type]
        details=details,
    )
    if metric["current"] != "value":
        out["current_value"] = {
            "unit": runs["current"][0]["unit"],
            "median": round(statistics.median(line["value"] for line in runs["current"]), 4),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--base", required=True, help="the revision to compare against (anything git rev-parse takes)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="runs of each bench per tree (default 3)")
    parser.add_argument(
        "--quick", action="store_true", help="pass --quick to the benches (checks the tool, not the code)"
    )
    parser.add_argument(
        "--scripts", choices=("current", "own"), default="current",
        help="current: this tree's bench script for both trees (the default); own: each tree's own",
    )
    parser.add_argument(
        "benches", nargs="*", default=list(DEFAULT_BENCHES),
        help="names without bench_ and .py, each with its script's flags after colons",
    )
    args = parser.parse_args(argv)
    quick = ["--quick"] if args.quick else []
    for spec in args.benches:
        name = spec.split(":")[0]
        if not (CURRENT / "bench" / f"bench_{name}.py").exists():
            parser.error(f"no bench/bench_{name}.py in {CURRENT}")
    base_rev = subprocess.run(["git", "-C", str(CURRENT), "rev-parse", "--short", args.base],
                              check=True, capture_output=True, text=True).stdout.strip()
    failed = False
    with worktree(args.base) as base_tree, tempfile.TemporaryDirectory(prefix="abcmp-") as scratch_dir:
        scratch = Path(scratch_dir)
        trees = {"base": base_tree, "current": CURRENT}
        for side, tree in trees.items():
            package = imported_by_relay(tree, scratch)
            if not package.is_relative_to(tree.resolve()):
                raise SystemExit(f"compare: a relay under PYTHONPATH={tree} imported {package}")
            log(f"{side} ({base_rev if side == 'base' else 'working tree'}): a relay imports {package}")
        for spec in args.benches:
            bench, *flags = spec.split(":")
            extra = [*quick, *flags]
            name = f"bench/bench_{bench}.py"
            own = args.scripts == "own" and (base_tree / name).exists()
            scripts = {side: (tree if own else CURRENT) / name for side, tree in trees.items()}
            labels = {side: f"{side if own else 'current'}:{name}{''.join(' ' + f for f in flags)}"
                      for side in trees}
            runs: dict[str, list[dict[str, Any]]] = {"base": [], "current": []}
            for r in range(args.rounds):
                order = ("base", "current") if r % 2 == 0 else ("current", "base")
                for side in order:
                    log(f"{bench} round {r + 1}/{args.rounds}: {side} ({labels[side]})")
                    runs[side].append(run_bench(scripts[side], trees[side], scratch, extra))
            line = judge(spec, runs, labels)
            line["base_rev"] = base_rev
            failed |= line["ok"] is False
            print(json.dumps(line, ensure_ascii=False), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
