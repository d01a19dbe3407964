"""Back-to-back `opencode run`s with the bridge installed (the real opencode, offline against the
tests' scripted chat model), each calling an agent-bridge tool: how long each run waited before
its first model request, how long it took, and what it left behind (opencode lock folders in
`~/.local/state/opencode/locks/`, processes of the world). A reproduction for the stale opencode
lock (docs/reach.md), not a benchmark: no baseline, nothing compared.

    python bench/opencode_runs.py [RUNS] [--busy | --no-tool] [--trace] [--unseeded]

--busy: each run as bench_reach's opencode_busy rows (a message sent while it is held at a gate
between tool calls); --trace: what appeared and went, with times from the run's start;
--unseeded: without tests.hosts.test_opencode.seed_installed (opencode then tries to install
`@opencode-ai/plugin` at every start and as each run ends, under its `npm-install` lock). Prints
one line per run and a summary; a run whose first request came STALL_S or more after its start
counts as a stall.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.hosts import clis  # noqa: E402
from tests.hosts.conftest import GATE_STEP, plan  # noqa: E402
from tests.hosts.test_opencode import OFFLINE_ENV, OpencodeWorld, open_opencode_world  # noqa: E402

STALL_S = 30.0


def locks(home: Path) -> list[str]:
    folder = home / ".local" / "state" / "opencode" / "locks"
    found = []
    for entry in sorted(folder.iterdir()) if folder.is_dir() else ():
        meta = entry / "meta.json"
        text = meta.read_text(encoding="utf-8", errors="replace") if meta.exists() else ""
        found.append(f"{entry.name} {text.strip()[:160]}")
    return found


def names(pids: list[int]) -> list[str]:
    found = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                found.append(f"{pid}:" + f.read().replace(b"\0", b" ").decode(errors="replace")[:90])
        except OSError:
            pass
    return found


def one_run(oc: OpencodeWorld, i: int, prompt: str, busy: bool, bridge_pids: set[int]) -> dict[str, Any]:
    """One `opencode run`, watched every 20 ms until it and what it started are gone."""
    w = oc.world
    before = len(oc.model.requests)
    args = [str(w.host_bin / "opencode"), "run", "--format", "json", prompt]
    started = time.monotonic()
    run = w._start(args, {**w.base_env(), **OFFLINE_ENV}, None, w.root / f"opencode-{i}.err")
    first = ended = None
    now = 0.0
    seen: dict[str, float] = {}  # what is there (a lock folder, a process) -> since when
    trace: list[str] = []
    late = 0  # lock folders that appeared after the first model request (the run's end)
    while ended is None or (seen and now < ended + 10):
        now = time.monotonic() - started
        if ended is None and run.proc.poll() is not None:
            ended = now
            trace.append(f"{now:.2f} opencode exited")
        if first is None and len(oc.model.requests) > before:
            first = now
            trace.append(f"{now:.2f} first request")
        gate = f"runs-{i}"
        if busy and not oc.model.gate(gate)[1].is_set() and oc.model.gate(gate)[0].is_set():
            with oc.model.lock:
                held = str(oc.model.session_of(oc.model.requests[-1]))
            w.bridge("send", held, f"busy {i}")
            oc.model.open_gate(gate)
            trace.append(f"{now:.2f} sent, gate opened")
        there = set(locks(w.home)) | set(names([p for p in w.leftovers() if p not in bridge_pids]))
        for gone in [k for k in seen if k not in there]:
            trace.append(f"{now:.2f} - {gone[:100]} (from {seen.pop(gone):.2f})")
        for new in there - seen.keys():
            seen[new] = now
            late += first is not None and new.split(" ")[0].endswith(".lock")
            trace.append(f"{now:.2f} + {new[:100]}")
        time.sleep(0.02)
    if "--trace" in sys.argv:
        print("\n".join("    " + t for t in trace), flush=True)
    run.wait()
    left = names([p for p in w.leftovers() if p not in bridge_pids])
    return {"run": i, "first_request_s": round(first or -1, 2), "run_s": round(ended or -1, 2),
            "stalled": first is None or first >= STALL_S, "late_locks": late, "locks": locks(w.home),
            "left": left}


def main() -> None:
    runs = int(next((a for a in sys.argv[1:] if a.isdigit()), "10"))
    busy = "--busy" in sys.argv  # as bench_reach's opencode_busy: a message sent while held at a gate
    results = []
    with open_opencode_world(clis.ensure()) as oc:
        bridge_pids = set(oc.world.leftovers())  # the broker and what it runs
        if "--unseeded" in sys.argv:  # as before tests.hosts.test_opencode.seed_installed
            folder = oc.config.parent
            shutil.rmtree(folder / "node_modules")
            (folder / "package.json").unlink()
            (folder / "package-lock.json").unlink()
        for i in range(runs):
            gated = plan(("whoami", {}), GATE_STEP(f"runs-{i}"), ("peers", {}), ("whoami", {}))
            prompt = gated if busy else plan() if "--no-tool" in sys.argv else plan(("whoami", {}))
            results.append(one_run(oc, i, prompt, busy, bridge_pids))
            print(json.dumps(results[-1]), flush=True)
        log = oc.world.home / ".local" / "share" / "opencode" / "log" / "opencode.log"
        installs = log.read_text(encoding="utf-8", errors="replace").count("dependency install")
    print(json.dumps({"runs": runs, "stalls": sum(r["stalled"] for r in results),
                      "runs_with_late_lock": sum(r["late_locks"] > 0 for r in results),
                      "install_attempts_logged": installs, "load": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
