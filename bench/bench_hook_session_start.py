"""hook_session_start: wall time of `agent-bridge hook session-start` with 10,000 decisions (SPEC §9).

The hook runs as the hosts run it: the installed `agent-bridge` script, the host's JSON on stdin,
its note read from a bridge.db holding 10,000 current decisions over 50 projects (the worst
case for the note: every one of them is a current revision to look through). Two situations,
each measured: no broker running (the hook leaves its identity report in the home folder), and a
broker running (the hook reports the identity over the socket).

Baseline, interleaved run for run: `python -c "import apsw, json"` with the same interpreter.
Target: hook wall time ≤ 2× the baseline (medians) in both situations; `value` is the slower
one. The hook must not import trio, mcp, quart or hypercorn (checked with -X importtime).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c  # noqa: E402
from bench_decisions_query import build  # noqa: E402

TARGET_RATIO = 2.0
HEAVY = ("trio", "mcp", "quart", "quart_trio", "hypercorn")
BASELINE = [c.PYTHON, "-c", "import apsw, json"]


def run(cmd: list[str], env: dict[str, str], stdin: bytes, cwd: Path) -> tuple[int, bytes, bytes]:
    start = time.perf_counter_ns()
    proc = subprocess.run(cmd, env=env, input=stdin, capture_output=True, cwd=cwd, timeout=60)
    elapsed = time.perf_counter_ns() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd} exited {proc.returncode}: {proc.stderr.decode(errors='replace')}")
    return elapsed, proc.stdout, proc.stderr


def heavy_imports(env: dict[str, str], stdin: bytes, cwd: Path) -> list[str]:
    return heavy_imports_of([*c.CLI, "hook", "session-start", "--agent", "claude"], env, stdin, cwd)


def heavy_imports_of(cmd: list[str], env: dict[str, str], stdin: bytes, cwd: Path) -> list[str]:
    """The heavy packages (HEAVY) that `cmd` imports, seen with -X importtime."""
    _, _, err = run(cmd, {**env, "PYTHONPROFILEIMPORTTIME": "1"}, stdin, cwd)
    found = set()
    for line in err.decode(errors="replace").splitlines():
        if line.startswith("import time:") and "|" in line:
            module = line.rsplit("|", 1)[1].strip()
            if module.split(".")[0] in HEAVY:
                found.add(module.split(".")[0])
    return sorted(found)


def main() -> None:
    args = c.parse_args(__doc__ or "")
    decisions, runs = (200, 3) if args.quick else (10_000, 25)
    with c.temp_home() as home:
        home.mkdir(parents=True, mode=0o700)
        folders = build(home / "bridge.db", decisions, decisions, 50)
        cwd = home.parent
        env = c.bench_env(home)
        stdin = json.dumps({
            "session_id": "bench-hook-session", "cwd": folders[7], "hook_event_name": "SessionStart",
            "source": "startup", "transcript_path": None,
        }).encode()
        hook = [*c.CLI, "hook", "session-start", "--agent", "claude"]

        _, out, _ = run(hook, env, stdin, cwd)
        note = json.loads(out)["hookSpecificOutput"]["additionalContext"]
        assert "decisions" in note, note
        heavy = heavy_imports(env, stdin, cwd)

        times: dict[str, list[int]] = {"down": [], "up": []}
        base: list[int] = []
        for situation in ("down", "up"):
            broker = c.BrokerProcess(home, env) if situation == "up" else None
            if broker is not None:
                broker.start()
            try:
                run(hook, env, stdin, cwd)  # warm the file cache for this situation
                for _ in range(runs):
                    times[situation].append(run(hook, env, stdin, cwd)[0])
                    base.append(run(BASELINE, env, b"", cwd)[0])
            finally:
                if broker is not None:
                    broker.stop()
        c.log(f"hook_session_start: {decisions} decisions, {runs} runs per situation")
    down, up, baseline = c.median(times["down"]), c.median(times["up"]), c.median(base)
    value = max(down, up)
    both = times["down"] + times["up"]
    c.report(
        "hook_session_start",
        value=c.ms(value),
        unit="ms (wall time, median of the slower situation)",
        baseline=c.ms(baseline),
        target=f"ratio <= {TARGET_RATIO:g} (hook / python -c 'import apsw, json'), no "
               f"trio/mcp/quart/hypercorn import",
        ok=value / baseline <= TARGET_RATIO and not heavy,
        n=len(both),
        p50=c.ms(c.percentile(both, 50)),
        p99=c.ms(c.percentile(both, 99)),
        quick=args.quick,
        details={
            "decisions": decisions,
            "broker_down_ms": c.ms(down),
            "broker_up_ms": c.ms(up),
            "broker_down_ratio": down / baseline,
            "broker_up_ratio": up / baseline,
            "heavy_imports": ",".join(heavy) or "none",
            "note_bytes": len(note.encode()),
        },
    )


if __name__ == "__main__":
    main()
