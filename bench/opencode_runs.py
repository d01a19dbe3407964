"""Back-to-back `opencode run`s with the bridge installed (the real opencode, offline against the
tests' scripted chat model), each calling an agent-bridge tool: how long each run waited before
its first model request, how long it took, and what it left behind (opencode lock folders in
`~/.local/state/opencode/locks/`, processes of the world). A reproduction for the stale opencode
lock (docs/reach.md), not a benchmark: no baseline, nothing compared.

    python bench/opencode_runs.py [RUNS] [--no-tool]

Prints one line per run and a summary; a run whose first request came STALL_S after its start
counts as a stall.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.hosts import clis  # noqa: E402
from tests.hosts.conftest import GATE_STEP, plan  # noqa: E402
from tests.hosts.test_opencode import OFFLINE_ENV, open_opencode_world  # noqa: E402

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


def main() -> None:
    runs = int(next((a for a in sys.argv[1:] if a.isdigit()), "10"))
    task = plan() if "--no-tool" in sys.argv else plan(("whoami", {}))
    busy = "--busy" in sys.argv  # as bench_reach's opencode_busy: a message sent while held at a gate
    stalls = 0
    late_runs = 0
    sent: set[str] = set()
    with open_opencode_world(clis.ensure()) as oc:
        bridge_pids = set(oc.world.leftovers())  # the broker and what it runs
        if "--unseeded" in sys.argv:  # as before tests.hosts.test_opencode.seed_installed
            folder = oc.config.parent
            shutil.rmtree(folder / "node_modules")
            (folder / "package.json").unlink()
            (folder / "package-lock.json").unlink()
        for i in range(runs):
            before = len(oc.model.requests)
            started = time.monotonic()
            gate = f"runs-{i}"
            prompt = plan(("whoami", {}), GATE_STEP(gate), ("peers", {}), ("whoami", {})) if busy else task
            w = oc.world
            args = [str(w.host_bin / "opencode"), "run", "--format", "json", "--log-level",
                    os.environ.get("OPENCODE_RUNS_LOG_LEVEL", "INFO"), prompt]
            run = w._start(args, {**w.base_env(), **OFFLINE_ENV}, None, w.root / f"opencode-{i}.err")
            first = None
            seen: dict[str, float] = {}  # what was there (a lock folder, a process) -> since
            trace: list[str] = []
            ended = None
            late = 0
            while True:
                now = time.monotonic() - started
                if ended is None and run.proc.poll() is not None:
                    ended = now
                    trace.append(f"{now:.2f} opencode exited")
                if first is None and len(oc.model.requests) > before:
                    first = now
                    trace.append(f"{now:.2f} first request")
                if busy and gate not in sent and oc.model.gate(gate)[0].is_set():
                    with oc.model.lock:
                        held = str(oc.model.session_of(oc.model.requests[-1]))
                    oc.world.bridge("send", held, f"busy {i}")
                    oc.model.open_gate(gate)
                    sent.add(gate)
                    trace.append(f"{now:.2f} sent, gate opened")
                there = set(locks(oc.world.home)) | set(names([p for p in oc.world.leftovers()
                                                                 if p not in bridge_pids]))
                for gone in [k for k in seen if k not in there]:
                    trace.append(f"{now:.2f} - {gone[:100]} (from {seen.pop(gone):.2f})")
                for new in there - seen.keys():
                    seen[new] = now
                    if first is not None and ".lock" in new.split(" ")[0]:  # taken again, after the start
                        late += 1
                    trace.append(f"{now:.2f} + {new[:100]}")
                if ended is not None and (not seen or now > ended + 10):
                    break
                time.sleep(0.02)
            if "--trace" in sys.argv:
                print("\n".join("    " + t for t in trace), flush=True)
            run.wait()
            if first is None and len(oc.model.requests) > before:
                first = ended
            left = [p for p in oc.world.leftovers() if p not in bridge_pids]
            stalled = first is None or first >= STALL_S
            stalls += stalled
            late_runs += late > 0
            print(json.dumps({"run": i, "first_request_s": round(first or -1, 2), "run_s": round(ended, 2),
                              "stalled": stalled, "late_locks": late, "locks": locks(oc.world.home), "left": names(left)}),
                  flush=True)
            time.sleep(float(os.environ.get("OPENCODE_RUNS_PAUSE", "0")))
        log = oc.world.home / ".local" / "share" / "opencode" / "log" / "opencode.log"
        installs = log.read_text(encoding="utf-8", errors="replace").count("dependency install")
    print(json.dumps({"runs": runs, "stalls": stalls, "runs_with_late_lock": late_runs, "install_attempts_logged": installs, "load": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
